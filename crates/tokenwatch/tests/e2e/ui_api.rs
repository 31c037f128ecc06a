// The endpoints the web UI and `tokenwatch top` read, through the real binary: the fleet
// overview, one model's time series, request filters and one request's token timeline.

use crate::common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const MODEL: &str = "sim-model";

async fn json_of(url: &str) -> Value {
    let r = get(url).await;
    assert_eq!(r.status, 200, "{url}: {}", r.body);
    r.json()
}

async fn chat(proxy: std::net::SocketAddr, tenant: &str) -> String {
    let body = format!(
        r#"{{"model":"{MODEL}","stream":true,"stream_options":{{"include_usage":true}},"max_tokens":12,"messages":[{{"role":"user","content":"hello there"}}]}}"#
    );
    let r = send(
        "POST",
        &format!("http://{proxy}/v1/chat/completions"),
        Some(&body),
        &[("x-tenant-id", tenant)],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r.headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// Poll `url` until `ok` holds for its JSON, or fail with the last answer.
async fn wait_for(url: &str, within: Duration, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let v = json_of(url).await;
        if ok(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never matched within {within:?}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn fleet_timeseries_and_request_explorer_serve_real_data() {
    let stack = Stack::start(&["--model", MODEL, "--ttft-ms", "20", "--itl-ms", "2"], &[]).await;
    let api = stack.api;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(chat(stack.proxy, if i % 2 == 0 { "team-a" } else { "team-b" }).await);
    }

    // The fleet row has the proxy-measured numbers at once and sparkline points every 5 s.
    let fleet = wait_for(
        &format!("http://{api}/api/v1/fleet"),
        Duration::from_secs(20),
        |f| {
            f["models"][0]["sparklines"]["t"]
                .as_array()
                .is_some_and(|t| !t.is_empty())
        },
    )
    .await;
    let row = &fleet["models"][0];
    assert_eq!(row["model_id"], MODEL, "{fleet}");
    assert_eq!(fleet["window"], "1m");
    let ttft = row["ttft_p50_s"].as_f64().unwrap();
    assert!(
        (0.015..1.0).contains(&ttft),
        "TTFT p50 {ttft} s for a 20 ms simulator: {row}"
    );
    assert!(row["itl_p99_s"].as_f64().unwrap() > 0.0, "{row}");
    assert!(row["requests_per_s"].as_f64().unwrap() > 0.0, "{row}");
    assert!(row["output_tokens_per_s"].as_f64().unwrap() > 0.0, "{row}");
    assert_eq!(row["error_ratio"], 0.0, "{row}");
    assert_eq!(row["alerts_firing"], 0);
    assert_eq!(row["instances"].as_array().map(Vec::len), Some(1), "{row}");
    let spark_ttft = row["sparklines"]["ttft_p99_s"].as_array().unwrap();
    assert!(spark_ttft.iter().any(Value::is_f64), "{row}");

    // One model's charts: aligned columns with units, context buckets.
    let ts = json_of(&format!(
        "http://{api}/api/v1/timeseries?model={MODEL}&range=5m"
    ))
    .await;
    let n = ts["t"].as_array().unwrap().len();
    assert!(n >= 1, "{ts}");
    for col in [
        "ttft_p99_s",
        "itl_p50_s",
        "e2e_p90_s",
        "requests_per_s",
        "kv_cache_usage",
    ] {
        assert_eq!(
            ts["series"][col].as_array().map(Vec::len),
            Some(n),
            "{col}: {ts}"
        );
    }
    assert_eq!(ts["units"]["ttft_p99_s"], "seconds");
    assert_eq!(ts["units"]["requests_per_s"], "requests/s");
    assert!(
        ts["series"]["ttft_p99_s"]
            .as_array()
            .unwrap()
            .iter()
            .any(Value::is_f64),
        "{ts}"
    );
    assert!(
        ts["by_context_bucket"]["le512"]["ttft_p99_s"].is_array(),
        "{ts}"
    );

    // Bad or missing parameters say what is wrong.
    let r = get(&format!(
        "http://{api}/api/v1/timeseries?model={MODEL}&range=2d"
    ))
    .await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("5m, 15m, 1h"), "{}", r.body);
    let r = get(&format!("http://{api}/api/v1/timeseries")).await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("model"), "{}", r.body);
    let r = get(&format!("http://{api}/api/v1/timeseries?model=nope")).await;
    assert_eq!(r.status, 404, "{}", r.body);
    let r = get(&format!("http://{api}/api/v1/fleet?window=3m")).await;
    assert_eq!(r.status, 400, "{}", r.body);

    // The request explorer: filters and one request's token timeline.
    let team_a = wait_for(
        &format!("http://{api}/api/v1/requests?model={MODEL}&tenant=team-a&limit=100"),
        Duration::from_secs(10),
        |v| v["count"] == 10,
    )
    .await;
    assert!(
        team_a["requests"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["tenant"] == "team-a")
    );
    let ok = json_of(&format!("http://{api}/api/v1/requests?status=ok&limit=100")).await;
    assert_eq!(ok["count"], 20, "{ok}");
    let failed = json_of(&format!("http://{api}/api/v1/requests?status=error")).await;
    assert_eq!(failed["count"], 0);
    let slow = json_of(&format!("http://{api}/api/v1/requests?min_e2e_s=100")).await;
    assert_eq!(slow["count"], 0);
    let r = get(&format!("http://{api}/api/v1/requests?status=bogus")).await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("upstream_5xx"), "{}", r.body);

    let one = json_of(&format!("http://{api}/api/v1/requests/{}", ids[3])).await;
    assert_eq!(one["request_id"], ids[3].as_str());
    let chunks = one["chunk_offsets_us"].as_array().unwrap();
    assert!(chunks.len() >= 2, "{one}");
    let first_us = chunks[0].as_f64().unwrap();
    assert!(
        (one["first_token_s"].as_f64().unwrap() * 1e6 - first_us).abs() < 1.0,
        "{one}"
    );
    let r = get(&format!("http://{api}/api/v1/requests/no-such-request")).await;
    assert_eq!(r.status, 404);

    // The trace of a proxied request: the proxy's record and the proxy's own span.
    let trace_id = one["trace_id"].as_str().unwrap();
    let trace = json_of(&format!("http://{api}/api/v1/traces/{trace_id}")).await;
    assert_eq!(
        trace["requests"][0]["request_id"],
        ids[3].as_str(),
        "{trace}"
    );
    assert_eq!(trace["spans"].as_array().map(Vec::len), Some(1), "{trace}");
    assert_eq!(
        trace["spans"][0]["attributes"]["tokenwatch.request_id"],
        ids[3].as_str()
    );
    let r = get(&format!("http://{api}/api/v1/traces/not-a-trace")).await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("32 hexadecimal"), "{}", r.body);
    let r = get(&format!("http://{api}/api/v1/traces/{}", "0".repeat(32))).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn gpu_history_groups_device_series_and_processes() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let cfg_path = dir.path().join("tokenwatch.yaml");
    let config = format!(
        "gpu:\n  replay: {}\n  interval: 200ms\n  proc_root: {}\n  instance: node-a\n  device_models:\n    \"0\": leaky-model\n",
        fixtures.join("gpu-leak-replay.jsonl").display(),
        fixtures.join("gpu-leak-proc").display()
    );
    std::fs::write(&cfg_path, config).unwrap();
    let cfg = cfg_path.to_string_lossy().into_owned();
    let (_tw, api, _proxy) = run_tokenwatch(dir.path(), "http://127.0.0.1:9", &["-c", &cfg]).await;

    let hist = wait_for(
        &format!("http://{api}/api/v1/gpus/history?range=5m"),
        Duration::from_secs(20),
        |h| {
            h["devices"][0]["series"]
                .as_array()
                .and_then(|s| s.iter().find(|x| x["signal"] == "gpu_memory_used_bytes"))
                .is_some_and(|s| s["v"].as_array().is_some_and(|v| v.len() >= 3))
        },
    )
    .await;
    let devices = hist["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{hist}");
    let leaky = devices
        .iter()
        .find(|d| d["model_id"] == "leaky-model")
        .expect("the leaky GPU is attributed");
    assert_eq!(leaky["instance"], "node-a");
    let used = leaky["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["signal"] == "gpu_memory_used_bytes")
        .unwrap();
    assert_eq!(used["unit"], "bytes");
    assert_eq!(
        used["t"].as_array().unwrap().len(),
        used["v"].as_array().unwrap().len()
    );
    let procs = hist["processes"].as_array().unwrap();
    let p = procs
        .iter()
        .find(|p| p["pid"] == "4242")
        .unwrap_or_else(|| panic!("process 4242 missing: {hist}"));
    assert_eq!(p["device_id"], leaky["device_id"]);
    assert!(!p["used_bytes"].as_array().unwrap().is_empty());
    assert_eq!(p["notes"]["container_runtime"], "containerd");
    let r = get(&format!("http://{api}/api/v1/gpus/history?range=forever")).await;
    assert_eq!(r.status, 400, "{}", r.body);
}
