// Tail sampling of stored spans end to end: traces sent over OTLP/HTTP to the binary with
// `traces.sampling` on; error traces stay complete up to the root, ordinary wide ones thin out.

use crate::common;

use common::*;
use prost::Message;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokenwatch::sources::otlp::proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use tokenwatch::sources::otlp::proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use tokenwatch::sources::otlp::proto::tonic::resource::v1::Resource;
use tokenwatch::sources::otlp::proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

/// Leaves under the fan-out span of a wide trace.
const LEAVES: usize = 30;
/// Depth of the chain that ends in the error span.
const CHAIN: usize = 6;

fn trace_id(kind: u8, n: usize) -> String {
    format!("{kind:02x}{:030x}", n + 1)
}

fn span_id(trace: &str, k: usize) -> String {
    format!("{}{k:04x}", &trace[20..32])
}

/// One span of `trace`: the `k`-th, child of the `parent`-th (None: the root), `ms` long.
fn span(trace: &str, k: usize, parent: Option<usize>, name: &str, ms: u64, error: bool) -> Span {
    let start = 1_700_000_000_000_000_000u64 + (k as u64) * 1_000;
    Span {
        trace_id: hex::decode(trace).unwrap(),
        span_id: hex::decode(span_id(trace, k)).unwrap(),
        parent_span_id: parent
            .map(|p| hex::decode(span_id(trace, p)).unwrap())
            .unwrap_or_default(),
        name: name.into(),
        kind: 2,
        start_time_unix_nano: start,
        end_time_unix_nano: start + ms * 1_000_000,
        status: error.then(|| Status {
            code: 2,
            message: "CUDA out of memory".into(),
        }),
        ..Default::default()
    }
}

/// A wide trace: root → fan-out → `LEAVES` ordinary leaves, one of which starts a chain of
/// `CHAIN - 2` spans; with `error`, the chain's last span failed. The `warm`-th warm-up trace
/// spreads its durations (leaves 10–20 ms, chain spans 10–14 ms); the others stay below the
/// warm-up's P95 (leaves 10–14 ms, chain spans 10 ms), so only the error makes them critical.
fn wide_trace(trace: &str, error: bool, warm: Option<usize>) -> Vec<Span> {
    let (leaf_spread, chain_ms) = match warm {
        Some(n) => (11, 10 + (n % 5) as u64),
        None => (5, 10),
    };
    let mut spans = vec![
        span(trace, 0, None, "POST /v1/chat/completions", 200, false),
        span(trace, 1, Some(0), "retrieve", 50, false),
    ];
    for l in 0..LEAVES {
        let ms = 10 + (l % leaf_spread) as u64;
        spans.push(span(trace, 2 + l, Some(1), "vector.search", ms, false));
    }
    let mut parent = 2;
    for d in 3..=CHAIN {
        let k = LEAVES + d;
        let last = d == CHAIN;
        spans.push(span(
            trace,
            k,
            Some(parent),
            &format!("step{d}"),
            chain_ms,
            error && last,
        ));
        parent = k;
    }
    spans
}

/// Span ids from the error span up to the root of a `wide_trace`.
fn error_path(trace: &str) -> Vec<String> {
    let mut ids: Vec<String> = (3..=CHAIN).map(|d| span_id(trace, LEAVES + d)).collect();
    ids.extend([2, 1, 0].map(|k| span_id(trace, k)));
    ids
}

async fn post(otlp_http: SocketAddr, traces: Vec<Vec<Span>>) {
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(Value::StringValue("rag-api".into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: traces.into_iter().flatten().collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let r = http::Request::post(format!("http://{otlp_http}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            req.encode_to_vec(),
        )))
        .unwrap();
    let resp = client().request(r).await.unwrap();
    assert_eq!(resp.status(), 200, "the spans are accepted");
}

/// The stored spans of `trace` (empty while none is).
async fn stored(api: SocketAddr, trace: &str) -> Vec<serde_json::Value> {
    let r = get(&format!("http://{api}/api/v1/traces/{trace}")).await;
    if r.status != 200 {
        return Vec::new();
    }
    r.json()["spans"].as_array().cloned().unwrap_or_default()
}

/// Wait until the root of every trace in `traces` is stored (a trace's kept spans are
/// written together), then a little longer for the writer's last batch.
async fn until_decided(api: SocketAddr, traces: &[String], tw: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for t in traces {
        let root = span_id(t, 0);
        while !stored(api, t).await.iter().any(|s| s["span_id"] == *root) {
            assert!(
                Instant::now() < deadline,
                "trace {t} was never stored; log:\n{}",
                tw.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_traces_stay_complete_to_the_root_and_ordinary_wide_traces_are_thinned() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tw.yaml");
    std::fs::write(
        &cfg,
        "otlp:\n  enabled: true\ntraces:\n  sampling:\n    enabled: true\n    decision_delay: 300ms\n    warmup_spans: 20\n",
    )
    .unwrap();
    let (tw, api, _grpc, otlp_http) = start_otlp_collector(dir.path(), &cfg).await;

    // Warm-up: every component sees enough ordinary spans for its median and P95.
    let warm: Vec<String> = (0..30).map(|n| trace_id(0x01, n)).collect();
    let traces = warm
        .iter()
        .enumerate()
        .map(|(n, t)| wide_trace(t, false, Some(n)));
    post(otlp_http, traces.collect()).await;
    until_decided(api, &warm, &tw).await;

    let errors: Vec<String> = (0..5).map(|n| trace_id(0xe0, n)).collect();
    let ordinary: Vec<String> = (0..5).map(|n| trace_id(0x0a, n)).collect();
    let mut batch: Vec<Vec<Span>> = errors.iter().map(|t| wide_trace(t, true, None)).collect();
    batch.extend(ordinary.iter().map(|t| wide_trace(t, false, None)));
    post(otlp_http, batch).await;
    until_decided(api, &errors, &tw).await;
    until_decided(api, &ordinary, &tw).await;

    for t in &errors {
        let spans = stored(api, t).await;
        for id in error_path(t) {
            let s = spans
                .iter()
                .find(|s| s["span_id"] == *id)
                .unwrap_or_else(|| panic!("{id} of error trace {t} was dropped: {spans:#?}"));
            assert_eq!(s["attributes"]["tokenwatch.sampling.weight"], 1.0, "{s:#}");
        }
    }
    let sent = ordinary.len() * (2 + LEAVES + CHAIN - 2);
    let mut kept = 0;
    for t in &ordinary {
        let spans = stored(api, t).await;
        kept += spans.len();
        assert!(
            spans.iter().any(|s| s["span_id"] == *span_id(t, 1)),
            "the fan-out span of {t} is kept"
        );
        for s in spans.iter().filter(|s| s["name"] == "vector.search") {
            let w = s["attributes"]["tokenwatch.sampling.weight"]
                .as_f64()
                .unwrap();
            assert!(w > 1.0, "a sampled leaf carries its weight: {s:#}");
        }
    }
    assert!(
        kept * 2 < sent,
        "ordinary wide traces are thinned: {kept} of {sent} spans stored"
    );
    let metrics = get(&format!("http://{api}/metrics")).await.body;
    let dropped = metric_value(
        &metrics,
        "tokenwatch_spans_sampled_total{decision=\"dropped\"}",
    )
    .unwrap_or(0.0);
    assert!(dropped > 0.0, "{metrics}");
    assert_eq!(
        metric_value(
            &metrics,
            "tokenwatch_spans_sampled_total{decision=\"kept_overflow\"}"
        ),
        Some(0.0)
    );
}
