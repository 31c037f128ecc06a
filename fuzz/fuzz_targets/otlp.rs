// Fuzz target: OTLP payload decoding (protobuf and OTLP/JSON, optionally gzip) through the full
// GenAI span, metric and log mapping. The first byte picks signal/encoding/gzip; the rest is the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenwatch::sources::otlp::codec::{self, Encoding};
use tokenwatch::sources::otlp::metrics::MetricsMapper;
use tokenwatch::sources::otlp::proto::tonic::collector::{logs::v1 as l, trace::v1 as t};
use tokenwatch::sources::otlp::{SignalKind, decode_and_map, genai, logs};

const LIMIT: usize = 1 << 20;

fn valid_json(text: &str) {
    assert!(serde_json::from_str::<serde_json::Value>(text).is_ok(), "stored attributes are not JSON: {text}");
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let kind = match selector & 3 {
        0 => SignalKind::Traces,
        1 => SignalKind::Metrics,
        _ => SignalKind::Logs,
    };
    let enc = if selector & 4 != 0 { Encoding::Json } else { Encoding::Protobuf };
    let gzip = selector & 8 != 0;
    let mut mapper = MetricsMapper::new(64);
    // Twice for metrics, so the cumulative (delta between exports) path runs as well.
    let rounds = if kind == SignalKind::Metrics { 2 } else { 1 };
    for _ in 0..rounds {
        if let Err(e) = decode_and_map(kind, enc, gzip, body, LIMIT, &mut mapper) {
            assert!(matches!(e.status(), 400 | 413), "{e}: status {}", e.status());
            assert!(!e.to_string().is_empty());
        }
    }
    // What is stored must be well-formed: attributes as JSON objects, ids as hex of the right length.
    if gzip {
        return;
    }
    match kind {
        SignalKind::Traces => {
            if let Ok(req) = codec::decode::<t::ExportTraceServiceRequest>(body, enc, "traces") {
                let b = genai::map_traces(&req, true);
                for s in &b.spans {
                    valid_json(&s.attributes_json);
                    assert_eq!((s.trace_id.len(), s.span_id.len()), (32, 16));
                }
                assert_eq!(b.accepted as usize, b.spans.len());
            }
        }
        SignalKind::Logs => {
            if let Ok(req) = codec::decode::<l::ExportLogsServiceRequest>(body, enc, "logs") {
                for r in &logs::map_logs(&req).rows {
                    valid_json(&r.attributes_json);
                }
            }
        }
        SignalKind::Metrics => {}
    }
});
