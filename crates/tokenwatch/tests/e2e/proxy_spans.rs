// The proxy's own spans end to end: the real OpenAI Python client through the proxy inside a
// caller's trace, the span exported over OTLP (HTTP and gRPC) to a second tokenwatch, and the
// upstream's server span nesting under it in `GET /api/v1/traces/{id}`.

use crate::common;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use common::*;
use http_body_util::BodyExt;
use prost::Message;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokenwatch::sources::otlp::proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use tokenwatch::sources::otlp::proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use tokenwatch::sources::otlp::proto::tonic::resource::v1::Resource;
use tokenwatch::sources::otlp::proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

const TRACE_ID: &str = "5b8efff798038103d269b633813fc60c";
const CALLER_SPAN: &str = "eee19b7ec3c1b174";

/// An upstream in front of the simulator that remembers the `traceparent` each request carried
/// (the simulator does not keep it), as a runtime that starts its server span from it would.
#[derive(Clone)]
struct Relay {
    to: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

async fn relay(State(r): State<Relay>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    if let Some(tp) = parts
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
    {
        r.seen.lock().unwrap().push(tp.to_string());
    }
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let mut b = http::Request::builder().method(parts.method).uri(format!(
        "http://{}{}",
        r.to,
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    ));
    for (k, v) in parts
        .headers
        .iter()
        .filter(|(k, _)| *k != http::header::HOST)
    {
        b = b.header(k, v);
    }
    let resp = client()
        .request(b.body(http_body_util::Full::new(body)).unwrap())
        .await
        .expect("the simulator answers");
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, Body::new(body))
}

async fn start_relay(sim: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = axum::Router::new().fallback(relay).with_state(Relay {
        to: sim,
        seen: seen.clone(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

/// tokenwatch with a proxy in front of `upstream` and the configuration file `config`, every
/// listener on a port it picks, once ready: (process, API, proxy, OTLP/HTTP addresses).
async fn start_proxying(
    dir: &Path,
    upstream: &str,
    config: &Path,
) -> (Proc, SocketAddr, SocketAddr, SocketAddr) {
    let (d, c) = (
        dir.join("data").to_string_lossy().into_owned(),
        config.to_string_lossy().into_owned(),
    );
    let args = [
        "run",
        "-c",
        &c,
        "--listen",
        ANY,
        "--proxy-listen",
        ANY,
        "--upstream",
        upstream,
        "--upstream-runtime",
        "vllm",
        "--data-dir",
        &d,
        "--otlp-grpc-listen",
        ANY,
        "--otlp-http-listen",
        ANY,
    ];
    let tw = Proc::start("tokenwatch", &args, dir);
    let otlp_http = tw.listening().await["otlp_http"];
    let (api, proxy) = ready_on(&tw).await;
    (tw, api, proxy, otlp_http)
}

fn kv(key: &str, v: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn seconds(key: &str, v: f64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::DoubleValue(v)),
        }),
        ..Default::default()
    }
}

/// POST the upstream's server span (OTLP/HTTP protobuf), child of the span it was told about.
async fn post_server_span(otlp_http: SocketAddr, parent: &str, start_ns: u64) -> String {
    let span_id = "a1b2c3d4e5f60718";
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", "vllm")],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: hex::decode(TRACE_ID).unwrap(),
                    span_id: hex::decode(span_id).unwrap(),
                    parent_span_id: hex::decode(parent).unwrap(),
                    name: "llm_request".into(),
                    kind: 2,
                    start_time_unix_nano: start_ns,
                    end_time_unix_nano: start_ns + 20_000_000,
                    attributes: vec![
                        kv("vllm.request.id", "cmpl-1"),
                        // vLLM's own timings of the request, seconds.
                        seconds("gen_ai.latency.time_in_queue", 0.005),
                        seconds("gen_ai.latency.time_in_model_prefill", 0.004),
                        seconds("gen_ai.latency.time_in_model_decode", 0.008),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let body = bytes::Bytes::from(req.encode_to_vec());
    let r = http::Request::post(format!("http://{otlp_http}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(http_body_util::Full::new(body))
        .unwrap();
    let resp = client().request(r).await.unwrap();
    assert_eq!(resp.status(), 200, "the server span is accepted");
    span_id.to_string()
}

/// The spans of `TRACE_ID` at `api` once `want` of them are there (by span id); fails after 20 s.
async fn trace_spans(api: SocketAddr, want: &[&str], tw: &Proc) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(&format!("http://{api}/api/v1/traces/{TRACE_ID}")).await;
        if r.status == 200 {
            let spans = r.json()["spans"].as_array().cloned().unwrap_or_default();
            if want
                .iter()
                .all(|id| spans.iter().any(|s| s["span_id"] == *id))
            {
                return spans;
            }
        }
        assert!(
            Instant::now() < deadline,
            "spans {want:?} never arrived at {api}: {}\nlog:\n{}",
            r.body,
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn span<'a>(spans: &'a [serde_json::Value], id: &str) -> &'a serde_json::Value {
    spans
        .iter()
        .find(|s| s["span_id"] == id)
        .unwrap_or_else(|| panic!("span {id} in {spans:?}"))
}

async fn proxy_span_is_exported_and_parents_the_server_span(protocol: &str) {
    let dir = tempfile::tempdir().unwrap();
    // The receiving side: a second tokenwatch, collector only, with its OTLP receivers.
    let recv_dir = dir.path().join("receiver");
    std::fs::create_dir_all(&recv_dir).unwrap();
    let recv_cfg = recv_dir.join("tw.yaml");
    std::fs::write(&recv_cfg, "otlp:\n  enabled: true\n").unwrap();
    let (receiver, recv_api, recv_grpc, recv_http) =
        start_otlp_collector(&recv_dir, &recv_cfg).await;

    let (sim, sim_addr) = start_sim(
        dir.path(),
        &["--model", "m1", "--ttft-ms", "40", "--itl-ms", "2"],
    )
    .await;
    let (relay_addr, seen) = start_relay(sim_addr).await;

    // The proxying tokenwatch exports to the receiver; with gRPC the received spans go too.
    let endpoint = match protocol {
        "grpc" => format!("http://{recv_grpc}"),
        _ => format!("http://{recv_http}"),
    };
    let include_received = protocol == "grpc";
    let cfg = dir.path().join("tw.yaml");
    std::fs::write(
        &cfg,
        format!(
            "export:\n  otlp:\n    endpoint: {endpoint}\n    protocol: {protocol}\n    include_received: {include_received}\n    headers:\n      x-team: infra\n    queue:\n      flush_interval: 100ms\n"
        ),
    )
    .unwrap();
    let (tw, api, proxy, otlp_http) =
        start_proxying(dir.path(), &format!("http://{relay_addr}"), &cfg).await;

    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/traced_client.py");
    let base = format!("http://{proxy}/v1");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python())
            .args([script, &base, "m1", &traceparent])
            .output()
            .expect("running the OpenAI client")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "openai client failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        tw.log()
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (usage, prompt) = (
        result["usage"].as_u64().unwrap(),
        result["prompt"].as_u64().unwrap(),
    );
    assert!(
        usage > 0 && result["text_len"].as_u64().unwrap() > 0,
        "{result}"
    );

    // The upstream was called inside the caller's trace, with the proxy's span as its parent.
    let upstream_tp = seen
        .lock()
        .unwrap()
        .first()
        .cloned()
        .expect("the upstream saw a traceparent");
    let parts: Vec<&str> = upstream_tp.split('-').collect();
    assert_eq!(
        (parts.len(), parts[0], parts[1], parts[3]),
        (4, "00", TRACE_ID, "01"),
        "{upstream_tp}"
    );
    let proxy_span = parts[2].to_string();
    assert_eq!(proxy_span.len(), 16);
    assert_ne!(
        proxy_span, CALLER_SPAN,
        "the upstream's parent is the proxy's own span, not the caller's"
    );

    // The upstream's server span, posted to the proxying tokenwatch, nests under the proxy span.
    let record = stored_record(api, result["request_id"].as_str().unwrap(), &tw).await;
    let start_ns = record["arrival_unix_ms"].as_u64().unwrap() * 1_000_000 + 1_000_000;
    let server_span = post_server_span(otlp_http, &proxy_span, start_ns).await;
    let local = trace_spans(api, &[&proxy_span, &server_span], &tw).await;
    let ps = span(&local, &proxy_span);
    assert_eq!(
        ps["parent_span_id"], CALLER_SPAN,
        "the proxy span is the caller's span's child"
    );
    assert_eq!(
        span(&local, &server_span)["parent_span_id"],
        proxy_span.as_str()
    );
    let first = local
        .iter()
        .min_by_key(|s| s["start_unix_nano"].as_i64().unwrap())
        .unwrap();
    assert_eq!(
        first["span_id"],
        proxy_span.as_str(),
        "the waterfall starts at the proxy: {local:?}"
    );
    assert_eq!(
        (ps["kind"].as_i64(), ps["service_name"].as_str()),
        (Some(3), Some("tokenwatch"))
    );
    assert_eq!(ps["events_count"], 1, "the first token is an event");
    let end = ps["end_unix_nano"].as_i64().unwrap();
    assert!(end > ps["start_unix_nano"].as_i64().unwrap());

    // Self time per component: the proxy's (and the network's) around the server span, which
    // vLLM's own timings split into queue, prefill and decode, the rest engine time.
    let trace = get(&format!("http://{api}/api/v1/traces/{TRACE_ID}"))
        .await
        .json();
    let proxy_ms = (end - ps["start_unix_nano"].as_i64().unwrap()) as f64 / 1e6 - 20.0;
    assert_eq!(ps["component"], "proxy");
    assert!(
        (ps["self_ms"].as_f64().unwrap() - proxy_ms).abs() < 1e-6,
        "{ps}"
    );
    assert_eq!(span(&local, &server_span)["component"], "engine");
    let by: std::collections::HashMap<String, f64> = trace["components"]["by_component"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["component"].as_str().unwrap().to_string(),
                c["self_ms"].as_f64().unwrap(),
            )
        })
        .collect();
    let close = |c: &str, ms: f64| (by.get(c).copied().unwrap_or(-1.0) - ms).abs() < 1e-6;
    assert!(
        close("queue", 5.0)
            && close("prefill", 4.0)
            && close("decode", 8.0)
            && close("engine", 3.0),
        "{by:?}"
    );
    assert!(close("proxy", proxy_ms), "{by:?}");
    assert!(
        (trace["components"]["self_time_ms"].as_f64().unwrap() - (proxy_ms + 20.0)).abs() < 1e-6
    );

    // The proxy's span arrived at the receiving endpoint with its attributes and parentage.
    let mut want = vec![proxy_span.as_str()];
    if include_received {
        want.push(&server_span);
    }
    let remote = trace_spans(recv_api, &want, &receiver).await;
    let rs = span(&remote, &proxy_span);
    assert_eq!(rs["parent_span_id"], CALLER_SPAN);
    assert_eq!(
        (rs["name"].as_str(), rs["kind"].as_i64()),
        (Some("chat m1"), Some(3))
    );
    assert_eq!(rs["service_name"], "tokenwatch");
    assert_eq!(
        (rs["start_unix_nano"].as_i64(), rs["end_unix_nano"].as_i64()),
        (ps["start_unix_nano"].as_i64(), Some(end))
    );
    let a = &rs["attributes"];
    assert_eq!(a["gen_ai.operation.name"], "chat", "{a}");
    assert_eq!(a["gen_ai.provider.name"], "vllm");
    assert_eq!(a["gen_ai.request.model"], "m1");
    assert!(
        a["gen_ai.response.model"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{a}"
    );
    assert_eq!(a["gen_ai.request.stream"], true);
    assert_eq!(a["gen_ai.usage.input_tokens"].as_u64(), Some(prompt));
    assert_eq!(a["gen_ai.usage.output_tokens"].as_u64(), Some(usage));
    assert!(
        record["finish_reason"]
            .as_str()
            .is_some_and(|f| !f.is_empty()),
        "{record}"
    );
    assert_eq!(
        a["gen_ai.response.finish_reasons"],
        serde_json::json!([record["finish_reason"]]),
        "{a}"
    );
    let ttft = a["gen_ai.response.time_to_first_chunk"]
        .as_f64()
        .expect("time to first chunk");
    assert!(
        ttft >= 0.04 && ttft < (end - rs["start_unix_nano"].as_i64().unwrap()) as f64 / 1e9 + 0.001,
        "{ttft}"
    );
    assert_eq!(a["server.address"], "127.0.0.1");
    assert_eq!(
        a["server.port"].as_u64(),
        Some(u64::from(relay_addr.port()))
    );
    assert_eq!(a["http.response.status_code"], 200);
    assert!(a.get("error.type").is_none());
    assert_eq!(a["tokenwatch.request_id"], result["request_id"]);
    if include_received {
        let rserver = span(&remote, &server_span);
        assert_eq!(
            (
                rserver["parent_span_id"].as_str(),
                rserver["service_name"].as_str()
            ),
            (Some(proxy_span.as_str()), Some("vllm"))
        );
        assert_eq!(rserver["attributes"]["vllm.request.id"], "cmpl-1");
    } else {
        assert!(
            !remote.iter().any(|s| s["span_id"] == server_span.as_str()),
            "received spans stay unless include_received"
        );
    }

    // Sent counted (once the exporter has read the receiver's answer, which may come after the
    // receiver stored the span); nothing dropped.
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let metrics = get(&format!("http://{api}/metrics")).await.body;
        let sent = metric_value(&metrics, "tokenwatch_otlp_export_spans_total").unwrap_or(0.0);
        if sent >= 1.0 {
            break metrics;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for reason in ["queue_full", "rejected", "shutdown"] {
        let series = format!("tokenwatch_otlp_export_dropped_total{{reason=\"{reason}\"}}");
        assert_eq!(metric_value(&metrics, &series), Some(0.0), "{series}");
    }
    drop((sim, tw, receiver));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_span_over_otlp_http() {
    proxy_span_is_exported_and_parents_the_server_span("http").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_span_over_otlp_grpc_with_received_spans() {
    proxy_span_is_exported_and_parents_the_server_span("grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_caller_trace_the_proxy_span_is_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, sim_addr) = start_sim(
        dir.path(),
        &["--model", "m1", "--ttft-ms", "5", "--itl-ms", "1"],
    )
    .await;
    let (relay_addr, seen) = start_relay(sim_addr).await;
    let cfg = dir.path().join("tw.yaml");
    // A configured rule names the proxy's component.
    std::fs::write(
        &cfg,
        "traces:\n  components:\n    - component: gateway\n      service: tokenwatch\n",
    )
    .unwrap();
    let (tw, api, proxy, _) =
        start_proxying(dir.path(), &format!("http://{relay_addr}"), &cfg).await;
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
    let r = send(
        "POST",
        &format!("http://{proxy}/v1/chat/completions"),
        Some(body),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    let id = r.headers["x-request-id"].to_str().unwrap().to_string();
    let record = stored_record(api, &id, &tw).await;
    let trace_id = record["trace_id"].as_str().unwrap().to_string();
    let tp = seen
        .lock()
        .unwrap()
        .first()
        .cloned()
        .expect("the upstream saw a traceparent");
    assert!(tp.starts_with(&format!("00-{trace_id}-")), "{tp}");
    let proxy_span = tp.split('-').nth(2).unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let r = get(&format!("http://{api}/api/v1/traces/{trace_id}")).await;
        let spans = r.json()["spans"].as_array().cloned().unwrap_or_default();
        if !spans.is_empty() {
            break spans;
        }
        assert!(Instant::now() < deadline, "no span stored: {}", tw.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(spans[0]["span_id"], proxy_span.as_str());
    assert_eq!(
        spans[0]["parent_span_id"], "",
        "no caller trace: the proxy span is the root"
    );
    assert_eq!(
        spans[0]["events_count"], 0,
        "not streamed: no first-token event"
    );
    assert_eq!(spans[0]["attributes"]["gen_ai.request.stream"], false);
    assert_eq!(
        spans[0]["component"], "gateway",
        "traces.components applies"
    );
    drop((sim, tw));
}
