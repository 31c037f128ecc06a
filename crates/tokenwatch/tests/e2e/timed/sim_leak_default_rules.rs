// The reproduction, end to end on shipped defaults: `tokenwatch sim --fault kv_leak`
// scraped and proxied by `tokenwatch run` with no alerting configuration, ~3 streaming req/s.

use crate::common;

use common::{alerts, get, run_tokenwatch, send, start_sim};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const MODEL: &str = "leaky";

/// Open-loop streaming load: one request every `period`, each on its own task (a slow or
/// queued stream never holds the next one back, as with real clients).
fn start_load(proxy: SocketAddr, period: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let url = format!("http://{proxy}/v1/chat/completions");
        let mut tick = tokio::time::interval(period);
        let mut inflight = tokio::task::JoinSet::new();
        for i in 0u64.. {
            tick.tick().await;
            let (url, body) = (
                url.clone(),
                json!({
                    "model": MODEL,
                    "stream": true,
                    "messages": [{"role": "user", "content": format!("request {i}: tell me about GPUs")}],
                })
                .to_string(),
            );
            inflight.spawn(async move {
                let _ = send("POST", &url, Some(&body), &[]).await;
            });
            while inflight.try_join_next().is_some() {}
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_leak_pages_on_default_rules_within_75s_at_3_rps() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim_proc, sim) = start_sim(dir.path(), &["--model", MODEL, "--fault", "kv_leak"]).await;
    let scrape = format!("http://{sim}/metrics");
    // No --config: default scrape interval (5 s), default rules, default detector parameters.
    let (tw, api, proxy) =
        run_tokenwatch(dir.path(), &format!("http://{sim}"), &["--scrape", &scrape]).await;

    let load = start_load(proxy, Duration::from_millis(333));
    let start = Instant::now();
    let leak = loop {
        let all = alerts(api).await;
        if let Some(a) = all
            .iter()
            .find(|a| a["rule"] == "gpu_memory_leak" && !a["fired_at_unix_ms"].is_null())
        {
            break a.clone();
        }
        if start.elapsed() > Duration::from_secs(75) {
            load.abort();
            let state = get(&format!("http://{sim}/admin/state")).await.body;
            panic!(
                "no gpu_memory_leak alert 75 s into the leak; alerts: {all:#?}\nsim state: {state}\n\
                 tokenwatch log tail:\n{}",
                tw.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let detected_after = start.elapsed();
    eprintln!("gpu_memory_leak fired {detected_after:?} after the load started");

    assert_eq!(leak["severity"], "critical", "{leak:#}");
    let labels = &leak["labels"];
    assert_eq!(labels["model_id"], MODEL, "{leak:#}");
    assert_eq!(labels["instance"], "sim-0", "the GPU's Hostname: {leak:#}");
    assert!(
        labels["device_id"]
            .as_str()
            .is_some_and(|d| d.starts_with("GPU-")),
        "{leak:#}"
    );
    let ev = &leak["last_event"]["evidence"];
    let growth = ev["growth_bytes_per_s"].as_f64().unwrap_or(0.0);
    assert!(
        growth > 25.0 * 1024.0 * 1024.0,
        "growth {growth} B/s: {leak:#}"
    );
    assert!(
        ev["time_to_exhaustion_s"].as_f64().is_some_and(|s| s > 0.0),
        "{leak:#}"
    );

    // The incident looks like the seed's: KV blocks run out, the starved engine's GPU idles
    // under 5 % while its memory keeps climbing.
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut used_before: Option<u64> = None;
    loop {
        let state = get(&format!("http://{sim}/admin/state")).await.json();
        let m = &state["models"][0];
        let usage = m["kv"]["usage"].as_f64().unwrap_or(0.0);
        let util = m["gpu"]["util_pct"].as_u64().unwrap_or(100);
        let used = m["gpu"]["memory_used_bytes"].as_u64().unwrap_or(0);
        assert_eq!(
            m["gpu"]["processes"][0]["used_memory_bytes"].as_u64(),
            Some(used),
            "per-process memory follows the device: {m:#}"
        );
        if usage >= 0.99 && util < 5 {
            match used_before {
                Some(before) if used > before => break,
                Some(_) => {}
                None => used_before = Some(used),
            }
        }
        assert!(
            Instant::now() < deadline,
            "engine never starved with memory climbing (kv usage {usage}, util {util} %, used {used}): {m:#}"
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    load.abort();
    let _ = load.await;
}

#[test]
fn sim_help_documents_each_fault_with_its_defaults() {
    let out = std::process::Command::new(common::BIN)
        .args(["sim", "--help"])
        .output()
        .expect("running tokenwatch sim --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for expect in [
        "kv_leak: ",
        "blocks=48",
        "mib_per_s=64",
        "latency_spike: ",
        "factor=10",
        "share=0.3",
        "length_blowup: ",
        "factor=4",
        "error_burst: ",
        "rate=0.3",
        "status=503",
        "stall: ",
        "seconds=5",
        "rate=0.2",
        "drift: ",
        "share=1",
        "duration_s=0",
        "model=NAME",
    ] {
        assert!(
            help.contains(expect),
            "`{expect}` missing from sim --help:\n{help}"
        );
    }
}
