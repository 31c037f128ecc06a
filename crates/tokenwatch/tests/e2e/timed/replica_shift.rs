// replica_shift end to end (the default `replica_latency` rule), collector-only (no proxy: the
// fleet most teams run first): two simulator replicas serve one model, clients call each directly
// (as behind a Kubernetes Service), tokenwatch only scrapes their vLLM-style /metrics. A latency
// fault on a tenth of one replica's requests must raise an alert naming that replica — and
// nothing before it, nothing on its peer.

use crate::common;

use common::{ANY, Proc, alerts, chat_traffic, ready_on, send, start_sim};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const MODEL: &str = "sim-llama-8b";

/// The rule's defaults, but for a test that cannot wait the production warm-up: the baseline
/// may end at the current minute (no 5-minute guard) and needs 100 reference requests over a
/// minute (not 200 over 10).
const CONFIG: &str = "scrape:
  interval: 2s
alerting:
  overrides:
    replica_errors:
      params: {tests: [errors], baseline_guard_s: 0, min_reference: 100, min_baseline_s: 60}
    replica_latency:
      params: {tests: [latency], baseline_guard_s: 0, min_reference: 100, min_baseline_s: 60}
";

fn replica_alerts(all: &[Value]) -> Vec<&Value> {
    all.iter()
        .filter(|a| a["rule"] == "replica_latency" || a["rule"] == "replica_errors")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_tenth_of_one_replicas_requests_is_alerted_naming_that_replica_without_a_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let sim_args = |name: &'static str, seed: &'static str| {
        vec![
            "--model",
            MODEL,
            "--instance-name",
            name,
            "--seed",
            seed,
            "--max-tokens",
            "16",
            "--itl-ms",
            "5",
            "--ttft-ms",
            "40",
        ]
    };
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&da).unwrap();
    std::fs::create_dir_all(&db).unwrap();
    let (_a, a) = start_sim(&da, &sim_args("replica-a", "1")).await;
    let (_b, b) = start_sim(&db, &sim_args("replica-b", "2")).await;
    let cfg = dir.path().join("tw.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let (c, d) = (
        cfg.to_string_lossy().into_owned(),
        dir.path().join("data").to_string_lossy().into_owned(),
    );
    let (ma, mb) = (format!("http://{a}/metrics"), format!("http://{b}/metrics"));
    let tw = Proc::start(
        "tokenwatch",
        &[
            "run",
            "-c",
            &c,
            "--listen",
            ANY,
            "--data-dir",
            &d,
            "--no-otlp",
            "--scrape",
            &ma,
            "--scrape",
            &mb,
        ],
        dir.path(),
    );
    let (api, _) = ready_on(&tw).await;

    // Clients call each replica directly: no proxy sees a request.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut workers = chat_traffic(a, MODEL, 2, stop.clone(), done.clone());
    workers.extend(chat_traffic(b, MODEL, 2, stop.clone(), done.clone()));

    // Warm-up: a full minute of both replicas before the current one (the reference), then a
    // little more; nothing may fire on healthy traffic.
    let warm = Instant::now();
    let minute_ms = 60_000u128;
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    let first_full_minute_end = (now_ms() / minute_ms + 2) * minute_ms;
    while now_ms() < first_full_minute_end + 15_000 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let fired = replica_alerts(&alerts(api).await)
            .into_iter()
            .cloned()
            .collect::<Vec<_>>();
        assert!(
            fired.is_empty(),
            "replica_shift fired on healthy traffic: {fired:#?}"
        );
    }
    assert!(
        done.load(Ordering::Relaxed) > 400,
        "too little traffic in the warm-up ({} requests in {:?})",
        done.load(Ordering::Relaxed),
        warm.elapsed()
    );

    // ×8 TTFT and ITL on 10 % of replica A's requests.
    let r = send(
        "POST",
        &format!("http://{a}/admin/faults"),
        Some(&json!({"spec": "latency_spike:factor=8,share=0.1"}).to_string()),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let injected = Instant::now();
    let alert = loop {
        let all = alerts(api).await;
        let fired: Vec<&Value> = replica_alerts(&all)
            .into_iter()
            .filter(|a| !a["fired_at_unix_ms"].is_null())
            .collect();
        if let Some(f) = fired.first() {
            break (*f).clone();
        }
        assert!(
            injected.elapsed() < Duration::from_secs(120),
            "no replica_shift alert 120 s after the fault; alerts: {all:#?}\nlog:\n{}",
            tw.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let delay = injected.elapsed();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    let labels = &alert["labels"];
    assert_eq!(labels["model_id"], MODEL, "{alert:#}");
    assert_eq!(
        labels["instance"],
        a.to_string(),
        "names the slow replica: {alert:#}"
    );
    let summary = alert["annotations"]["summary"].as_str().unwrap_or_default();
    // The replica's own alarm ("Replica A of …"), or the model's alarm attributed to it
    // ("…, concentrated on replica A"): either names A.
    assert!(
        summary.contains(&format!("Replica {a}"))
            || summary.contains(&format!("concentrated on replica {a}")),
        "{summary}"
    );
    assert!(summary.contains("beyond"), "says what is slow: {summary}");
    assert_eq!(alert["rule"], "replica_latency", "{alert:#}");
    // A page: the replica's own tail against its body is quiet on healthy traffic.
    assert_eq!(alert["severity"], "critical", "{alert:#}");
    // Its peer was not named.
    let all = alerts(api).await;
    let on_b: Vec<&Value> = replica_alerts(&all)
        .into_iter()
        .filter(|x| x["labels"]["instance"] == b.to_string())
        .collect();
    assert!(on_b.is_empty(), "the healthy replica was named: {on_b:#?}");
    eprintln!("replica_latency fired {delay:?} after the fault: {summary}");
}
