// OTLP ingest benchmark (spec 12): spans per second on one core for batches of 512 realistic
// GenAI spans — protobuf decode alone (baseline) vs decode + GenAI mapping, in the same run.
//
// Run: `cargo bench -p tokenwatch --bench otlp` (add `--features mimalloc` for that allocator). Knobs: TW_BENCH_SECS [3] measured seconds per
// case, TW_BENCH_BATCH [512] spans per export request. Single thread; no I/O is measured.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, any_value::Value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span::Event};
use prost::Message;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokenwatch::capture::mask::{MaskConfig, Masker, default_verbatim_attributes};
use tokenwatch::capture::telemetry::{TelemetryText, Verbatim};
use tokenwatch::sources::otlp::genai::map_traces;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn kv(k: &str, v: Value) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}
fn s(v: &str) -> Value {
    Value::StringValue(v.into())
}

/// A GenAI client span as the OpenTelemetry GenAI instrumentations emit it.
fn genai_span(i: u64) -> Span {
    let model = [
        "llama-3.1-8b-instruct",
        "qwen2.5-7b-instruct",
        "mistral-7b-instruct",
    ][(i % 3) as usize];
    let start = 1_764_000_000_000_000_000 + i * 3_000_000;
    let mut trace_id = [0u8; 16];
    trace_id[..8].copy_from_slice(&(i / 4 + 1).to_be_bytes());
    trace_id[8..].copy_from_slice(&0x5eed_u64.to_be_bytes());
    Span {
        trace_id: trace_id.to_vec(),
        span_id: (i + 1).to_be_bytes().to_vec(),
        parent_span_id: (i / 4 + 1_000_000).to_be_bytes().to_vec(),
        name: format!("chat {model}"),
        kind: 3,
        start_time_unix_nano: start,
        end_time_unix_nano: start + 1_250_000_000 + i * 1000,
        attributes: vec![
            kv("gen_ai.operation.name", s("chat")),
            kv("gen_ai.provider.name", s("vllm")),
            kv("gen_ai.request.model", s(model)),
            kv("gen_ai.response.model", s(model)),
            kv("gen_ai.request.max_tokens", Value::IntValue(512)),
            kv("gen_ai.request.temperature", Value::DoubleValue(0.7)),
            kv("gen_ai.response.id", s(&format!("chatcmpl-{i:016x}"))),
            kv(
                "gen_ai.usage.input_tokens",
                Value::IntValue(300 + (i % 700) as i64),
            ),
            kv(
                "gen_ai.usage.output_tokens",
                Value::IntValue(50 + (i % 200) as i64),
            ),
            kv(
                "gen_ai.response.finish_reasons",
                Value::ArrayValue(ArrayValue {
                    values: vec![AnyValue {
                        value: Some(s("stop")),
                    }],
                }),
            ),
            kv(
                "gen_ai.response.time_to_first_chunk",
                Value::DoubleValue(0.08 + (i % 50) as f64 / 1000.0),
            ),
            kv("server.address", s("vllm-0.inference.svc")),
            kv("server.port", Value::IntValue(8000)),
            kv(
                "tokenwatch.ab_group",
                s(if i.is_multiple_of(2) { "a" } else { "b" }),
            ),
        ],
        events: vec![Event {
            time_unix_nano: start + 80_000_000,
            name: "gen_ai.content.completion".into(),
            ..Default::default()
        }],
        status: Some(Status {
            code: if i.is_multiple_of(50) { 2 } else { 0 },
            message: String::new(),
        }),
        ..Default::default()
    }
}

fn request(batch: usize) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", s("chat-frontend")),
                    kv("service.instance.id", s("chat-frontend-7f9c")),
                    kv("telemetry.sdk.name", s("opentelemetry")),
                    kv("telemetry.sdk.language", s("python")),
                    kv("tenant.id", s("acme")),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "opentelemetry.instrumentation.openai_v2".into(),
                    ..Default::default()
                }),
                spans: (0..batch as u64).map(genai_span).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Run `f` (one batch) repeatedly for `secs`; spans per second.
fn measure(name: &str, secs: f64, batch: usize, mut f: impl FnMut() -> usize) -> f64 {
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(300) {
        black_box(f());
    }
    let start = Instant::now();
    let mut batches = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        black_box(f());
        batches += 1;
    }
    let rate = (batches as f64 * batch as f64) / start.elapsed().as_secs_f64();
    println!(
        "{name:<52} {:>10.0} spans/s  ({:.2} µs/span)",
        rate,
        1e6 / rate
    );
    rate
}

fn main() {
    let secs: f64 = std::env::var("TW_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let batch: usize = std::env::var("TW_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let req = request(batch);
    let bytes = req.encode_to_vec();
    // Stored rows as the binary stores them by default: prompt attributes dropped, other free
    // text masked for personal data (`capture.mask.telemetry`); and with the masking off.
    let masker =
        Arc::new(Masker::new(&MaskConfig::default(), b"bench-key").expect("default masker"));
    let masking = TelemetryText::dropping()
        .masking_others(masker, Verbatim::new(&default_verbatim_attributes()));
    let unmasked = TelemetryText::dropping();
    let check = map_traces(&req, Some(&masking));
    assert_eq!(
        (check.records.len(), check.spans.len(), check.rejected),
        (batch, batch, 0)
    );
    println!(
        "OTLP ingest, one thread, batches of {batch} GenAI spans ({} bytes protobuf, {:.0} B/span)",
        bytes.len(),
        bytes.len() as f64 / batch as f64
    );
    let decode = measure("decode only (baseline)", secs, batch, || {
        ExportTraceServiceRequest::decode(&bytes[..])
            .map(|r| r.resource_spans.len())
            .unwrap_or(0)
    });
    let records = measure(
        "decode + GenAI mapping to request records",
        secs,
        batch,
        || {
            let r = ExportTraceServiceRequest::decode(&bytes[..]).unwrap_or_default();
            map_traces(&r, None).records.len()
        },
    );
    let unmasked_rows = measure(
        "decode + records + span rows, other text as sent",
        secs,
        batch,
        || {
            let r = ExportTraceServiceRequest::decode(&bytes[..]).unwrap_or_default();
            let b = map_traces(&r, Some(&unmasked));
            b.records.len() + b.spans.len()
        },
    );
    let full = measure(
        "decode + records + span rows, personal data masked",
        secs,
        batch,
        || {
            let r = ExportTraceServiceRequest::decode(&bytes[..]).unwrap_or_default();
            let b = map_traces(&r, Some(&masking));
            b.records.len() + b.spans.len()
        },
    );
    println!(
        "GenAI processing / decode-only throughput: records {:.2}, records+rows {:.2} \
         (rows unmasked {:.2}); masking / unmasked rows {:.2}",
        records / decode,
        full / decode,
        unmasked_rows / decode,
        full / unmasked_rows
    );
    println!("anchors: OpenTelemetry Collector ≈137k spans/s/core, Rotel ≈462k, target ≥500k");
}
