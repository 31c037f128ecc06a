// The real OpenTelemetry Python SDK exports GenAI spans and metrics to a collector-only
// `tokenwatch run` over gRPC and over HTTP/protobuf; records, latency, signals and spans appear,
// from an OpenInference LLM span and exponential client chunk histograms too.

use crate::common;

use common::{ANY, Proc, get, python, wait_ready};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tokenwatch_store::{SpanQuery, SqliteStore, Store, StoreOptions};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/otel_export.py");
const SPANS: usize = 4;

struct Collector {
    tw: Proc,
    api: SocketAddr,
    grpc: SocketAddr,
    http: SocketAddr,
    dir: tempfile::TempDir,
}

/// `tokenwatch run` without an upstream: collector-only, API and OTLP on ports it picks.
async fn start_collector() -> Collector {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").to_string_lossy().into_owned();
    let args = [
        "run",
        "--listen",
        ANY,
        "--data-dir",
        &data,
        "--otlp-grpc-listen",
        ANY,
        "--otlp-http-listen",
        ANY,
    ];
    let tw = Proc::start("tokenwatch", &args, dir.path());
    let bound = tw.listening().await;
    let (api, grpc, http) = (bound["api"], bound["otlp_grpc"], bound["otlp_http"]);
    wait_ready(&format!("http://{api}/readyz"), &tw).await;
    Collector {
        tw,
        api,
        grpc,
        http,
        dir,
    }
}

/// Run the exporter script; returns what it reports having sent.
fn export(transport: &str, endpoint: &str, model: &str) -> serde_json::Value {
    let out = std::process::Command::new(python())
        .args([
            SCRIPT,
            "--transport",
            transport,
            "--endpoint",
            endpoint,
            "--model",
            model,
            "--spans",
            &SPANS.to_string(),
        ])
        .output()
        .expect("running the OpenTelemetry exporter script");
    script_json("exporter script", &out)
}

/// What a script reported on its last line of output (JSON); fails with its output otherwise.
fn script_json(what: &str, out: &std::process::Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{what}: output not JSON ({e}): {stdout}"))
}

/// Poll `url` until `ok` accepts its JSON, or fail with the last answer and the log.
async fn poll(url: &str, tw: &Proc, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = get(url).await.json();
        if ok(&v) {
            return v;
        }
        if Instant::now() > deadline {
            panic!("{url} never matched; last answer: {v}\nlog:\n{}", tw.log());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn check_model(c: &Collector, model: &str, sent: &serde_json::Value, transport: &str) {
    // Request records: one per GenAI span (the error span included), with token counts.
    let url = format!("http://{}/api/v1/requests?model={model}", c.api);
    let v = poll(&url, &c.tw, |v| v["count"] == SPANS + 1).await;
    let reqs = v["requests"].as_array().unwrap();
    let ok: Vec<_> = reqs.iter().filter(|r| r["status"] == 200).collect();
    assert_eq!(ok.len(), SPANS, "{v}");
    let mut inputs: Vec<u64> = ok
        .iter()
        .map(|r| r["prompt_tokens"].as_u64().unwrap())
        .collect();
    inputs.sort();
    assert_eq!(
        inputs,
        (0..SPANS as u64).map(|i| 100 + i).collect::<Vec<_>>()
    );
    for r in &ok {
        assert_eq!(r["trace_id"], sent["trace_id"]);
        assert_eq!(r["runtime"], "vllm");
        assert_eq!(r["instance"], "gpu-node-1:8000");
        assert_eq!(r["tenant"], "acme");
        assert_eq!(r["finish_reason"], "stop");
        assert!(r["output_tokens"].as_u64().unwrap() >= 20);
        assert!(
            sent["span_ids"]
                .as_array()
                .unwrap()
                .contains(&r["request_id"]),
            "{r}"
        );
    }
    let err = reqs
        .iter()
        .find(|r| r["status"] == 500)
        .expect("the error span's record");
    assert_eq!(err["error_class"], "upstream_5xx");
    assert_eq!(err["request_id"], sent["error_span_id"]);

    // Latency from the spans' time_to_first_chunk (0.05, 0.10, 0.15, 0.20 s).
    let url = format!("http://{}/api/v1/latency?model={model}&metric=ttft", c.api);
    let v = poll(&url, &c.tw, |v| v["count"] == SPANS).await;
    let p50 = v["p50"].as_f64().unwrap();
    assert!((0.09..=0.16).contains(&p50), "ttft p50 {p50}: {v}");

    // Signals from the histograms: the second cumulative export's interval (0.13..0.23 s).
    let url = format!("http://{}/api/v1/signals?model={model}", c.api);
    let v = poll(&url, &c.tw, |v| {
        v["signals"]
            .as_array()
            .is_some_and(|s| s.iter().any(|p| p["signal"] == "ttft_p99_seconds"))
    })
    .await;
    let signal = |name: &str| {
        v["signals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["signal"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}: {v}"))
    };
    for q in ["p50", "p90", "p95", "p99"] {
        let p = signal(&format!("ttft_{q}_seconds"));
        let x = p["value"].as_f64().unwrap();
        assert!((0.1..=0.3).contains(&x), "ttft_{q} {x}: {p}");
        assert_eq!(p["source"], "otlp");
        assert!(p["notes"]["bucket_error_seconds"].is_string(), "{p}");
    }
    assert!((signal("e2e_p50_seconds")["value"].as_f64().unwrap() - 1.5).abs() < 0.5);
    assert!(signal("itl_p50_seconds")["value"].as_f64().unwrap() <= 0.025);
    assert!(
        signal("prompt_tokens_per_second")["value"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        signal("output_tokens_per_second")["value"]
            .as_f64()
            .unwrap()
            > 0.0
    );

    // Every span stored with its ids intact (parent included), by trace id.
    let store = SqliteStore::open(&c.dir.path().join("data"), StoreOptions::default()).unwrap();
    let trace = sent["trace_id"].as_str().unwrap();
    let spans = store
        .query_spans(&SpanQuery {
            trace_id: Some(trace.into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(spans.len(), SPANS + 3, "{spans:?}");
    let parent = sent["parent_span_id"].as_str().unwrap();
    let root = spans
        .iter()
        .find(|s| s.span_id == parent)
        .expect("root span stored");
    assert_eq!(root.parent_span_id, "");
    assert!(
        spans
            .iter()
            .filter(|s| s.span_id != parent)
            .all(|s| s.parent_span_id == parent)
    );
    assert!(spans.iter().all(|s| s.service_name == "otel-test-app"));

    // The OpenInference LLM span: a record with its model, provider and token counts.
    let oi_model = format!("{model}-oi");
    let url = format!("http://{}/api/v1/requests?model={oi_model}", c.api);
    let v = poll(&url, &c.tw, |v| v["count"] == 1).await;
    let r = &v["requests"][0];
    assert_eq!(r["request_id"], sent["oi_span_id"], "{v}");
    assert_eq!(
        (r["prompt_tokens"].as_u64(), r["output_tokens"].as_u64()),
        (Some(7), Some(3)),
        "{v}"
    );
    assert_eq!(r["runtime"], "openai", "{v}");

    // The client chunk histograms (exponential buckets): TTFT and ITL of the second export's
    // interval (first chunks 0.3..0.35 s, 20 ms per chunk).
    let client = format!("{model}-client");
    let url = format!("http://{}/api/v1/signals?model={client}", c.api);
    let v = poll(&url, &c.tw, |v| {
        v["signals"].as_array().is_some_and(|s| {
            s.iter().any(|p| {
                p["signal"] == "ttft_p50_seconds" && p["value"].as_f64().is_some_and(|x| x > 0.28)
            }) && s.iter().any(|p| p["signal"] == "itl_p50_seconds")
        })
    })
    .await;
    let signal = |name: &str| {
        v["signals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["signal"] == name)
            .cloned()
            .unwrap()
    };
    let ttft = signal("ttft_p50_seconds");
    assert!(
        (0.28..=0.36).contains(&ttft["value"].as_f64().unwrap()),
        "{ttft}"
    );
    assert_eq!(
        ttft["notes"]["metric"], "gen_ai.client.operation.time_to_first_chunk",
        "{ttft}"
    );
    let itl = signal("itl_p50_seconds");
    assert!(
        (0.018..=0.022).contains(&itl["value"].as_f64().unwrap()),
        "{itl}"
    );

    // The received spans' records are on /metrics with the GenAI labels, the OpenInference one too.
    let metrics = get(&format!("http://{}/metrics", c.api)).await.body;
    let received =
        format!("tokenwatch_otlp_received_total{{signal=\"traces\",transport=\"{transport}\"}}");
    assert!(
        common::metric_value(&metrics, &received).is_some_and(|n| n >= (SPANS + 3) as f64),
        "{received} missing:\n{metrics}"
    );
    let oi_tokens = metrics
        .lines()
        .find(|l| {
            l.starts_with("gen_ai_client_token_usage_sum{")
                && l.contains(&format!("gen_ai_request_model=\"{oi_model}\""))
                && l.contains("gen_ai_provider_name=\"openai\"")
                && l.contains("gen_ai_token_type=\"input\"")
        })
        .unwrap_or_else(|| panic!("no token usage of {oi_model}:\n{metrics}"));
    assert_eq!(
        oi_tokens
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok()),
        Some(7.0),
        "{oi_tokens}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_exports_genai_spans_and_metrics_over_grpc_and_http() {
    let mut c = start_collector().await;
    let grpc_sent = export("grpc", &c.grpc.to_string(), "otel-grpc-model");
    check_model(&c, "otel-grpc-model", &grpc_sent, "grpc").await;
    let http_sent = export("http", &format!("http://{}", c.http), "otel-http-model");
    check_model(&c, "otel-http-model", &http_sent, "http").await;
    let status = c.tw.terminate();
    assert!(
        status.success(),
        "tokenwatch exited with {status}; log:\n{}",
        c.tw.log()
    );
    assert!(
        !Path::new(&c.dir.path().join("data"))
            .join("missing")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_partial_success_gzip_and_undecodable_bytes() {
    let mut c = start_collector().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/otlp_grpc_raw.py");
    let out = std::process::Command::new(python())
        .args([script, "--endpoint", &c.grpc.to_string()])
        .output()
        .expect("running the raw gRPC script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(v["rejected_spans"], 1, "{v}");
    assert!(
        v["error_message"]
            .as_str()
            .unwrap()
            .contains("trace_id must be 16 bytes"),
        "{v}"
    );
    assert_eq!(v["gzip_rejected_spans"], 1, "{v}");
    // tonic answers undecodable messages itself (INTERNAL, naming the decode failure).
    assert!(
        v["garbage"]["details"]
            .as_str()
            .unwrap()
            .contains("failed to decode Protobuf message"),
        "{v}"
    );
    let url = format!("http://{}/api/v1/requests?model=raw-grpc-gzip", c.api);
    let r = poll(&url, &c.tw, |v| v["count"] == 1).await;
    assert_eq!(r["requests"][0]["trace_id"], "ab".repeat(16));
    assert_eq!(get(&format!("http://{}/healthz", c.api)).await.status, 200);
    let status = c.tw.terminate();
    assert!(
        status.success(),
        "tokenwatch exited with {status}; log:\n{}",
        c.tw.log()
    );
}

const INSTRUMENTED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/instrumented_client.py"
);
const INSTRUMENTED_CALLS: usize = 10;

/// The instrumentations the test command installed, each in its own virtualenv (their
/// OpenTelemetry pins differ): `name=python,…` in TOKENWATCH_TEST_INSTRUMENTATIONS.
fn instrumentations() -> Vec<(String, String)> {
    let v = std::env::var("TOKENWATCH_TEST_INSTRUMENTATIONS").unwrap_or_else(|_| {
        panic!(
            "TOKENWATCH_TEST_INSTRUMENTATIONS is not set: run the README's test command \
             (scripts/test.sh), which installs the GenAI instrumentations from PyPI"
        )
    });
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (name, py) = s.split_once('=').expect("name=python");
            assert!(Path::new(py).exists(), "{name}: {py} is missing");
            (name.to_string(), py.to_string())
        })
        .collect()
}

/// Whether an instrumentation's spans say which calls streamed and when their first token came:
/// every one but openai-v2's. Its newest release (2.4b0, which imports only with
/// opentelemetry-util-genai 1.1b0) wraps a stream in a wrapper of its own that never calls
/// util-genai's per-chunk hook, so no `gen_ai.request.stream` and no time to first chunk reach
/// its spans or its metrics: a streamed call's span looks like any other. OpenLIT's clock starts
/// after the response's headers came back; tokenwatch adds that wait back from the HTTP client
/// span under its span (`sources::otlp::http_children`), so it reads as the others do.
fn reports_streams(kind: &str) -> bool {
    kind != "openai-v2"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instrumented_openai_apps_give_stream_flag_first_token_and_the_requested_model() {
    // The real OpenAI Python client, instrumented by each common GenAI instrumentation from
    // PyPI, calls the simulator (half the calls streamed); its spans reach a collector-only
    // tokenwatch over OTLP/HTTP. Every call must be a record with the requested model as its id
    // and its tokens, the right stream flag and, when streamed, a first-token time within 5 ms
    // of what the client measured at the median (issue 38) — as far as each instrumentation
    // reports them (`reports_streams`); openai-v2's metrics give the model's end-to-end
    // percentiles, request and token rates.
    let kinds = instrumentations();
    assert!(!kinds.is_empty(), "no instrumentation installed");
    let models: Vec<String> = kinds.iter().map(|(k, _)| format!("org/m-{k}")).collect();
    let c = start_collector().await;
    // The simulator holds a stream's headers until its first token, as the OpenAI API does:
    // an instrumentation whose clock starts at the headers (OpenLIT's) then misses the whole
    // time to first token unless tokenwatch adds the wait back.
    let (_sim, sim) = common::start_sim(
        c.dir.path(),
        &[
            "--model",
            &models.join(","),
            "--stream-headers-at-first-token",
        ],
    )
    .await;
    for ((kind, py), model) in kinds.iter().zip(&models) {
        let out = std::process::Command::new(py)
            .args([
                INSTRUMENTED,
                kind,
                &format!("http://{sim}/v1"),
                &format!("http://{}", c.http),
                model,
                &INSTRUMENTED_CALLS.to_string(),
            ])
            .output()
            .expect("running the instrumented client");
        let sent = script_json(&format!("{kind}: instrumented client"), &out);
        let url = format!(
            "http://{}/api/v1/requests?model={}",
            c.api,
            model.replace('/', "%2F")
        );
        let v = poll(&url, &c.tw, |v| v["count"] == INSTRUMENTED_CALLS).await;
        let records = v["requests"].as_array().unwrap();
        let mut shorts: Vec<f64> = Vec::new();
        for (i, call) in sent["calls"].as_array().unwrap().iter().enumerate() {
            let started = call["started_ms"].as_f64().unwrap();
            let r = records
                .iter()
                .min_by_key(|r| (r["arrival_unix_ms"].as_f64().unwrap() - started).abs() as i64)
                .unwrap();
            let what = format!("{kind} {} call {i}: {call} → {r}", sent["version"]);
            assert!(
                (r["arrival_unix_ms"].as_f64().unwrap() - started).abs() < 150.0,
                "no record near the call: {what}"
            );
            assert_eq!(r["model_id"], model.as_str(), "{what}");
            assert_eq!(r["status"], 200, "{what}");
            assert_eq!(r["output_tokens"], call["completion_tokens"], "{what}");
            if !reports_streams(kind) {
                // openai-v2 (2.4b0) puts no stream attribute, event or first-token time on
                // its spans: every call reads as not streamed, with no first token. Should a
                // release send them, this fails: then read them and check them as the others.
                assert_eq!(
                    (&r["stream"], &r["first_token_s"]),
                    (&false.into(), &serde_json::Value::Null),
                    "{what}"
                );
                continue;
            }
            assert_eq!(r["stream"], call["stream"], "{what}");
            if call["stream"] == true {
                let client = call["ttft_s"].as_f64().expect("client TTFT");
                let seen = r["first_token_s"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("no first token: {what}"));
                // The instrumentation sees a chunk before the client's loop does; on a busy
                // machine a descheduled interpreter widens that for one call, not for most.
                let short = client - seen;
                assert!(
                    (-0.005..=0.030).contains(&short),
                    "first token {seen:.4} s against the client's {client:.4} s: {what}"
                );
                shorts.push(short);
            } else {
                assert!(r["first_token_s"].is_null(), "{what}");
            }
        }
        if reports_streams(kind) {
            shorts.sort_by(f64::total_cmp);
            let median = shorts[shorts.len() / 2];
            eprintln!(
                "{kind} {}: first-token time short of the client's by {:.2} ms at the median \
                 (each call: {:?} ms)",
                sent["version"],
                median * 1000.0,
                shorts
                    .iter()
                    .map(|s| (s * 1e5).round() / 100.0)
                    .collect::<Vec<_>>()
            );
            assert!(
                median <= 0.005,
                "{kind}: the first-token time is {:.1} ms short of the client's at the median \
                 ({shorts:?})",
                median * 1000.0
            );
        } else {
            check_openai_v2_metrics(&c, model, &sent).await;
        }
    }
}

/// openai-v2's metrics, exported once after its calls: the model's end-to-end percentiles from
/// `gen_ai.client.operation.duration` (every call, streamed or not, up to its last chunk), its
/// request rate, and its token rates from `gen_ai.client.token.usage`, all under the requested
/// model; no time to first chunk (the package records none, see `reports_streams`).
async fn check_openai_v2_metrics(c: &Collector, model: &str, sent: &serde_json::Value) {
    let calls = sent["calls"].as_array().unwrap();
    let url = format!(
        "http://{}/api/v1/signals?model={}",
        c.api,
        model.replace('/', "%2F")
    );
    let v = poll(&url, &c.tw, |v| {
        let has = |name: &str| {
            v["signals"]
                .as_array()
                .is_some_and(|s| s.iter().any(|p| p["signal"] == name))
        };
        has("e2e_p50_seconds") && has("output_tokens_per_second") && has("prompt_tokens_per_second")
    })
    .await;
    let signal = |name: &str| {
        v["signals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["signal"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}: {v}"))
    };
    let p50 = signal("e2e_p50_seconds");
    assert_eq!(p50["source"], "otlp", "{p50}");
    assert_eq!(
        p50["notes"]["metric"], "gen_ai.client.operation.duration",
        "{p50}"
    );
    assert_eq!(
        p50["notes"]["observations"],
        calls.len().to_string(),
        "{p50}"
    );
    // The median call's duration lies in the P50's bucket (the instrumentation's clock runs
    // inside the client's: a little shorter).
    let mut e2e: Vec<f64> = calls.iter().map(|c| c["e2e_s"].as_f64().unwrap()).collect();
    e2e.sort_by(f64::total_cmp);
    let median = e2e[e2e.len() / 2 - 1];
    let (lower, upper) = p50["notes"]["bucket"]
        .as_str()
        .and_then(|b| b.split_once(".."))
        .map(|(l, u)| (l.parse::<f64>().unwrap(), u.parse::<f64>().unwrap()))
        .unwrap_or_else(|| panic!("no bucket: {p50}"));
    assert!(
        lower - 0.005 <= median && median <= upper + 0.005,
        "the median call took {median:.4} s, outside the P50's bucket ({lower}, {upper}]: {p50} \
         (calls {e2e:?})"
    );
    // Rates over the series' window: the calls' own token counts, exactly.
    let window: f64 = p50["notes"]["window_seconds"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    for (name, field) in [
        ("output_tokens_per_second", "completion_tokens"),
        ("prompt_tokens_per_second", "prompt_tokens"),
    ] {
        let told: u64 = calls.iter().map(|c| c[field].as_u64().unwrap()).sum();
        let got = signal(name)["value"].as_f64().unwrap() * window;
        assert!(
            (got - told as f64).abs() <= 0.002 * told as f64,
            "{name}: {got:.1} tokens over {window} s, the calls were told {told}: {v}"
        );
    }
    let rps = signal("requests_per_second")["value"].as_f64().unwrap() * window;
    assert!((rps - calls.len() as f64).abs() < 0.01, "{rps}: {v}");
    // No first-chunk time from this package: no TTFT signal for the model.
    assert!(
        !v["signals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["signal"] == "ttft_p50_seconds"),
        "{v}"
    );
}
