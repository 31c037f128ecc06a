// The quality detectors' inputs through the real binary: embeddings posted to the API and sent
// as an OTLP span attribute (semantic drift, drift vote), and the proxy's prefix-cache keys
// (cache pollution), with short windows so each test takes seconds.

use crate::common;

use common::otlp::{attr, numbered_chat_span, span_id, str_attr};
use common::{ANY, Proc, Reply, assert_partial, get, now_ms, ready_on, send, start_sim};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The tests share the machine's cores: one at a time, so none's windows are starved.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const CONFIG: &str = r#"
alerting:
  resolve_after: 60s
  overrides:
    semantic_drift: {window: 10s, for: 0s, params: {min_samples: 20}}
    drift_vote: {window: 10s, for: 0s, params: {min_samples: 20}}
    cache_pollution: {window: 30s, for: 0s, params: {cold_after_ms: 3000}}
    output_length_outlier: {enabled: false}
"#;

const DIMS: usize = 384;

/// A 384-dimension vector near axis `axis`, with deterministic jitter from `i`.
fn vector(axis: usize, i: usize) -> Vec<f64> {
    (0..DIMS)
        .map(|d| {
            let jitter = ((d * 31 + i * 17) % 13) as f64 / 100.0;
            if d == axis { 1.0 } else { jitter }
        })
        .collect()
}

struct Tw {
    proc_: Proc,
    api: SocketAddr,
    otlp_http: SocketAddr,
    proxy: SocketAddr,
    _dir: tempfile::TempDir,
    _sim: Option<Proc>,
}

impl Tw {
    /// tokenwatch with the test configuration; with a simulator upstream when `sim` is true.
    async fn start(sim: bool) -> Tw {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("tokenwatch.yaml");
        std::fs::write(&cfg, CONFIG).unwrap();
        let c = cfg.display().to_string();
        let (sim_proc, upstream) = if sim {
            let (p, addr) = start_sim(dir.path(), &["--ttft-ms", "2", "--itl-ms", "1"]).await;
            (Some(p), format!("http://{addr}"))
        } else {
            (None, String::new())
        };
        let data = dir.path().join("data").to_string_lossy().into_owned();
        // Every listener on a port it picks; without a simulator there is no proxy.
        let mut args = vec![
            "run",
            "--config",
            &c,
            "--listen",
            ANY,
            "--data-dir",
            &data,
            "--otlp-http-listen",
            ANY,
            "--otlp-grpc-listen",
            ANY,
        ];
        if sim {
            args.extend([
                "--proxy-listen",
                ANY,
                "--upstream",
                &upstream,
                "--upstream-runtime",
                "sim",
            ]);
        }
        let proc_ = Proc::start("tokenwatch", &args, dir.path());
        let otlp_http = proc_.listening().await["otlp_http"];
        let (api, proxy) = ready_on(&proc_).await;
        Tw {
            proc_,
            api,
            otlp_http,
            proxy,
            _dir: dir,
            _sim: sim_proc,
        }
    }

    async fn post_embeddings(&self, body: &str) -> Reply {
        common::post(&format!("http://{}/api/v1/embeddings", self.api), body).await
    }

    async fn alerts(&self) -> Vec<Value> {
        let r = get(&format!("http://{}/api/v1/alerts", self.api)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["alerts"].as_array().cloned().unwrap_or_default()
    }

    /// Polls until an alert of `rule` with `label` = `value` has fired.
    async fn wait_fired(&self, rule: &str, label: &str, value: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let all = self.alerts().await;
            if let Some(a) = all.iter().find(|a| {
                a["rule"] == rule && a["labels"][label] == value && !a["fired_at_unix_ms"].is_null()
            }) {
                return a.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no {rule} alert for {label}={value} within {within:?}; alerts: {all:#?}\nlog tail:\n{}",
                tail(&self.proc_.log())
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn item(request_id: &str, model: &str, v: Vec<f64>, ts: Option<i64>) -> Value {
    let mut it = json!({"request_id": request_id, "model_id": model, "embedding": v});
    if let Some(t) = ts {
        it["timestamp_unix_ms"] = json!(t);
    }
    it
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posted_embeddings_raise_semantic_drift_and_bad_items_are_named() {
    let _serial = SERIAL.lock().await;
    let tw = Tw::start(false).await;
    let now = now_ms();
    let mut items = Vec::new();
    // 40 reference embeddings 60–15 s ago for both models; then the current window: "api-drift"
    // moves to another axis, "api-steady" stays.
    for i in 0..40 {
        let ts = Some(now - 60_000 + i as i64 * 1_100);
        items.push(item(&format!("d-ref-{i}"), "api-drift", vector(0, i), ts));
        items.push(item(&format!("s-ref-{i}"), "api-steady", vector(0, i), ts));
    }
    for i in 0..30 {
        items.push(item(&format!("d-cur-{i}"), "api-drift", vector(1, i), None));
        items.push(item(
            &format!("s-cur-{i}"),
            "api-steady",
            vector(0, i + 40),
            None,
        ));
    }
    let r = tw
        .post_embeddings(&json!({ "items": items }).to_string())
        .await;
    assert_partial(&r, 140, 0);

    let a = tw
        .wait_fired(
            "semantic_drift",
            "model_id",
            "api-drift",
            Duration::from_secs(15),
        )
        .await;
    let ev = &a["last_event"]["evidence"];
    assert!(ev["cosine"].as_f64().unwrap() < 0.85, "{a:#}");
    assert_eq!(ev["dimensions"], DIMS, "{a:#}");
    assert!(ev["current_samples"].as_u64().unwrap() >= 20, "{a:#}");
    assert!(ev["baseline_samples"].as_u64().unwrap() >= 20, "{a:#}");
    assert!(
        a["annotations"]["summary"]
            .as_str()
            .unwrap()
            .contains("api-drift"),
        "{a:#}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let steady: Vec<Value> = tw
        .alerts()
        .await
        .into_iter()
        .filter(|a| a["labels"]["model_id"] == "api-steady")
        .collect();
    assert!(
        steady.is_empty(),
        "a steady model raised alerts: {steady:#?}"
    );

    // A mixed batch: the good items are accepted, each bad one is named by index and field.
    let mixed = json!({"items": [
        item("ok-1", "api-steady", vector(0, 1), None),
        {"request_id": "bad-1", "model_id": "api-steady", "embedding": [1.0, "x"]},
        item("bad-2", "api-steady", vector(0, 2)[..10].to_vec(), None),
        {"request_id": "bad-3", "embedding": [1.0]},
        item("bad-4", "api-other", vec![0.0; 8], None),
        item("bad-5", "api-other", vec![1.0, 1e39], None),
        item("bad-6", "api-other", vec![1.0], Some(now + 3_600_000)),
        item("ok-2", "api-other", vec![1.0, 2.0], None),
    ]});
    let r = tw.post_embeddings(&mixed.to_string()).await;
    let v = assert_partial(&r, 2, 6);
    let fields: Vec<&str> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "items[1].embedding[1]",
            "items[2].embedding",
            "items[3].model_id",
            "items[4].embedding",
            "items[5].embedding[1]",
            "items[6].timestamp_unix_ms"
        ],
        "{v:#}"
    );
    let dim_msg = v["errors"][1]["message"].as_str().unwrap();
    assert!(
        dim_msg.contains("10 dimensions") && dim_msg.contains("384"),
        "{dim_msg}"
    );
    assert_eq!(v["errors"][0]["index"], 1);

    // Nothing acceptable: 400 with the same per-item errors; malformed bodies: 400; too many
    // items: 400; too large: 413.
    let r = tw
        .post_embeddings(&json!({"items": [{"request_id": "x"}]}).to_string())
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["errors"][0]["field"], "items[0].model_id");
    let r = tw.post_embeddings("{\"items\": [").await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{}",
        r.body
    );
    let r = tw
        .post_embeddings(&json!({"embeddings": []}).to_string())
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    let many: Vec<Value> = (0..257)
        .map(|i| item(&format!("m{i}"), "api-other", vec![1.0, 2.0], None))
        .collect();
    let r = tw
        .post_embeddings(&json!({ "items": many }).to_string())
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("1 to 256"), "{}", r.body);
    let huge = format!("{{\"items\": [\"{}\"]}}", "x".repeat(17 << 20));
    let r = tw.post_embeddings(&huge).await;
    assert_eq!(r.status, 413, "{}", r.body);
}

/// OTLP/JSON spans of `model`: start `ago_ms` before now, 1 s long, with output tokens and the
/// embedding and prefix-hash attributes.
fn span(i: usize, model: &str, ago_ms: i64, output_tokens: u64, axis: usize) -> Value {
    let doubles: Vec<Value> = vector(axis, i)
        .into_iter()
        .map(|d| json!({"doubleValue": d}))
        .collect();
    let prefix_hash = format!("{:x}", 0xfeed0000u64 + (i % 3) as u64);
    let mut span = numbered_chat_span(i, model, ago_ms, output_tokens);
    span["attributes"].as_array_mut().unwrap().extend([
        attr(
            "tokenwatch.output.embedding",
            json!({"arrayValue": {"values": doubles}}),
        ),
        str_attr("tokenwatch.prompt.prefix_hash", &prefix_hash),
    ]);
    span
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_span_embeddings_reach_the_record_and_the_drift_vote() {
    let _serial = SERIAL.lock().await;
    let tw = Tw::start(false).await;
    let model = "otlp-model";
    let mut spans = Vec::new();
    // Reference 60–15 s ago: ~100 output tokens on one axis; the last seconds: ~400 on another.
    for i in 0..40 {
        spans.push(span(
            i,
            model,
            60_000 - i as i64 * 1_100,
            95 + (i % 10) as u64,
            0,
        ));
    }
    for i in 40..70 {
        spans.push(span(i, model, 0, 395 + (i % 10) as u64, 1));
    }
    let r = common::otlp::post_otlp_spans(tw.otlp_http, "rag-app", spans).await;
    assert!(!r.body.contains("ignored"), "{}", r.body);

    let a = tw
        .wait_fired("drift_vote", "model_id", model, Duration::from_secs(15))
        .await;
    let ev = &a["last_event"]["evidence"];
    assert_eq!(
        (ev["ks"].as_bool(), ev["embedding"].as_bool()),
        (Some(true), Some(true)),
        "{a:#}"
    );
    assert!(ev["feedback"].is_null(), "{a:#}");
    assert!(ev["ks_p_value"].as_f64().unwrap() < 0.01, "{a:#}");
    assert!(ev["embedding_cosine"].as_f64().unwrap() < 0.85, "{a:#}");
    tw.wait_fired("semantic_drift", "model_id", model, Duration::from_secs(5))
        .await;

    // The record carries the embedding and the prefix key. The engine and the store writer
    // get each batch at the same time: the alert can fire before the rows are written.
    let url = format!("http://{}/api/v1/requests?model={model}&limit=100", tw.api);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let v = loop {
        let v = get(&url).await.json();
        if v["requests"].as_array().map_or(0, |r| r.len()) >= 70
            || std::time::Instant::now() > deadline
        {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let recs = v["requests"].as_array().unwrap();
    assert_eq!(recs.len(), 70, "{v:#}");
    let r0 = recs
        .iter()
        .find(|r| r["request_id"] == span_id(41))
        .unwrap();
    let emb: Vec<f64> = r0["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(emb.len(), DIMS);
    assert_eq!(emb[1], 1.0);
    assert!((emb[2] - vector(1, 41)[2]).abs() < 1e-6, "{}", emb[2]);
    assert_eq!(r0["prefix_key"], format!("{:016x}", 0xfeed0000u64 + 41 % 3));
}

async fn chat(proxy: SocketAddr, tenant: &str, prompt: String) {
    let body = json!({
        "model": "sim-llama-8b",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": prompt}],
    })
    .to_string();
    let url = format!("http://{proxy}/v1/chat/completions");
    let r = send("POST", &url, Some(&body), &[("x-tenant-id", tenant)])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_prompt_prefixes_raise_cache_pollution_for_the_polluting_tenant_only() {
    let _serial = SERIAL.lock().await;
    let tw = Tw::start(true).await;
    // "noisy": 30 one-off prompts (a request id at the start defeats any prefix cache), then a
    // hot system prompt taking 90% of the accesses. "steady": three templates used evenly.
    let mut jobs: Vec<(&str, String)> = Vec::new();
    for i in 0..30 {
        jobs.push((
            "noisy",
            format!("req-{i}-{} summarise the ticket", now_ms()),
        ));
    }
    for _ in 0..270 {
        jobs.push((
            "noisy",
            "You are the support bot. Ticket follows.".to_string(),
        ));
    }
    for i in 0..150 {
        jobs.push((
            "steady",
            format!("Template {} — classify the sentiment of the review.", i % 3),
        ));
    }
    let jobs = Arc::new(tokio::sync::Mutex::new(jobs.into_iter()));
    let proxy = tw.proxy;
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let jobs = jobs.clone();
            tokio::spawn(async move {
                loop {
                    let next = jobs.lock().await.next();
                    let Some((tenant, prompt)) = next else { return };
                    chat(proxy, tenant, prompt).await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let a = tw
        .wait_fired(
            "cache_pollution",
            "tenant",
            "noisy",
            Duration::from_secs(20),
        )
        .await;
    let ev = &a["last_event"]["evidence"];
    assert!(ev["entropy"].as_f64().unwrap() < 0.3, "{a:#}");
    assert!(ev["cold_ratio"].as_f64().unwrap() > 0.4, "{a:#}");
    assert_eq!(ev["distinct_keys"], 31, "{a:#}");
    assert_eq!(a["labels"]["model_id"], "sim-llama-8b");
    let steady: Vec<Value> = tw
        .alerts()
        .await
        .into_iter()
        .filter(|a| a["rule"] == "cache_pollution" && a["labels"]["tenant"] == "steady")
        .collect();
    assert!(
        steady.is_empty(),
        "the steady tenant raised cache pollution: {steady:#?}"
    );

    // Records carry the key (same template, same key) and never the prompt text.
    let v = get(&format!("http://{}/api/v1/requests?limit=1000", tw.api))
        .await
        .json();
    let recs = v["requests"].as_array().unwrap();
    let keys = |tenant: &str| -> std::collections::BTreeSet<String> {
        recs.iter()
            .filter(|r| r["tenant"] == tenant)
            .map(|r| r["prefix_key"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(keys("steady").len(), 3);
    assert_eq!(keys("noisy").len(), 31);
    assert!(
        !v.to_string().contains("support bot"),
        "prompt text was stored"
    );
}
