// One incident per cause across label sets, end to end and collector-only: two simulator
// replicas of one model, each exposing vLLM's metrics and dcgm-exporter's on separate endpoints
// (as a GPU host does), so a GPU's series are labelled by its host and device and carry no model,
// while the replica's are labelled by model and scrape target. The serving targets say which
// host they run on (`hostname` target label). A leak on replica A's GPU must page naming the
// model and the replica it hurts, and every alert about replica A — the leak and its symptoms
// — must be one incident (one Alertmanager group); nothing may be raised about replica B.

use crate::common;

use common::{Proc, alerts, chat_traffic, send, start_collector, start_sim, write_config};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const MODEL: &str = "sim-llama-8b";

/// The first fired `gpu_memory_leak` alert, polled every 500 ms; fails with `what`, the alerts
/// and the log's tail once `limit` has passed since `since`.
async fn fired_leak(
    api: SocketAddr,
    tw: &Proc,
    since: Instant,
    limit: Duration,
    what: &str,
) -> Value {
    loop {
        let all = alerts(api).await;
        if let Some(x) = fired(&all)
            .into_iter()
            .find(|x| x["rule"] == "gpu_memory_leak")
        {
            return x.clone();
        }
        assert!(
            since.elapsed() < limit,
            "{what}; alerts: {all:#?}\nlog:\n{}",
            tw.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn fired(all: &[Value]) -> Vec<&Value> {
    all.iter()
        .filter(|a| !a["fired_at_unix_ms"].is_null())
        .collect()
}

/// Whether an alert is about the replica at `addr` on GPU host `host`: its own instance, the
/// replica its GPU serves, or its GPU host.
fn about(a: &Value, addr: SocketAddr, host: &str) -> bool {
    let l = &a["labels"];
    let addr = addr.to_string();
    l["instance"] == addr.as_str()
        || l["serving_instance"] == addr.as_str()
        || l["instance"] == host
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gpu_leak_and_its_replicas_symptoms_are_one_incident_across_label_sets() {
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
    let (_a, a) = start_sim(&da, &sim_args("gpu-host-a", "1")).await;
    let (_b, b) = start_sim(&db, &sim_args("gpu-host-b", "2")).await;
    // vLLM's and dcgm-exporter's endpoints apart; the serving targets name their host.
    let config = format!(
        "scrape:
  interval: 2s
  targets:
    - {{url: 'http://{a}/vllm/metrics', labels: {{hostname: gpu-host-a}}}}
    - {{url: 'http://{a}/dcgm/metrics'}}
    - {{url: 'http://{b}/vllm/metrics', labels: {{hostname: gpu-host-b}}}}
    - {{url: 'http://{b}/dcgm/metrics'}}
"
    );
    let cfg = write_config(dir.path(), &config);
    let (tw, api) = start_collector(dir.path(), &["-c", &cfg.to_string_lossy()]).await;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut workers = chat_traffic(a, MODEL, 2, stop.clone(), done.clone());
    workers.extend(chat_traffic(b, MODEL, 2, stop.clone(), done.clone()));
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        done.load(Ordering::Relaxed) > 50,
        "too little traffic before the fault"
    );

    // Replica A's serving process stops freeing memory: KV blocks run out, its GPU's memory climbs.
    let r = send(
        "POST",
        &format!("http://{a}/admin/faults"),
        Some(&json!({"spec": "kv_leak:mib_per_s=128"}).to_string()),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let injected = Instant::now();
    let leak = fired_leak(
        api,
        &tw,
        injected,
        Duration::from_secs(90),
        "no gpu_memory_leak alert 90 s after the leak began",
    )
    .await;
    eprintln!(
        "gpu_memory_leak fired {:?} after the fault",
        injected.elapsed()
    );
    let labels = &leak["labels"];
    assert_eq!(labels["instance"], "gpu-host-a", "the GPU's host: {leak:#}");
    assert_eq!(
        labels["model_id"], MODEL,
        "the model its GPU serves, though no GPU series names one: {leak:#}"
    );
    assert_eq!(
        labels["serving_instance"],
        a.to_string(),
        "names the replica the GPU works for: {leak:#}"
    );
    let incident = leak["incident_id"]
        .as_str()
        .expect("an incident")
        .to_string();

    // Its symptoms on replica A follow (then 20 s more for others); each joins the leak's incident.
    let since_leak = Instant::now();
    let mut first_symptom: Option<Instant> = None;
    let symptoms = loop {
        let all = alerts(api).await;
        let on_a: Vec<Value> = fired(&all)
            .into_iter()
            .filter(|x| x["rule"] != "gpu_memory_leak" && about(x, a, "gpu-host-a"))
            .cloned()
            .collect();
        if !on_a.is_empty() {
            let t = *first_symptom.get_or_insert_with(Instant::now);
            if t.elapsed() > Duration::from_secs(20) {
                break on_a;
            }
        }
        assert!(
            since_leak.elapsed() < Duration::from_secs(90) || first_symptom.is_some(),
            "no symptom of the leak alerted on replica {a}; alerts: {all:#?}\nlog:\n{}",
            tw.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.abort();
    }
    let all = alerts(api).await;
    for x in fired(&all)
        .into_iter()
        .filter(|x| about(x, a, "gpu-host-a"))
    {
        assert_eq!(
            x["incident_id"].as_str(),
            Some(incident.as_str()),
            "an alert about replica A outside the leak's incident: {x:#}\nall: {all:#?}"
        );
    }
    let on_b: Vec<&Value> = fired(&all)
        .into_iter()
        .filter(|x| about(x, b, "gpu-host-b"))
        .collect();
    assert!(
        on_b.is_empty(),
        "the healthy replica was alerted: {on_b:#?}"
    );
    let names: Vec<&str> = symptoms.iter().filter_map(|x| x["rule"].as_str()).collect();
    eprintln!("one incident {incident}: gpu_memory_leak + {names:?}");
    // The symptoms' root cause is the leak, though their labels differ from its.
    let kv = symptoms
        .iter()
        .find(|x| x["rule"] == "kv_cache_pressure")
        .unwrap_or(&symptoms[0]);
    let causes = kv["root_cause"].as_array().cloned().unwrap_or_default();
    assert!(
        causes
            .first()
            .is_some_and(|c| c["detector"] == "gpu_memory_leak"),
        "the leak ranks first among the causes: {kv:#}"
    );
}

/// The slow leak (25 MiB/s, the spec's 11 GB in 7 minutes) on a replica under load:
/// neither 128 MiB steps nor an idle GPU, so only the sequential test can page it — within a
/// minute. Its baseline is shortened for the test (blocks of 5 s, 6 of them, a 60 s test
/// window), not its statistics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_leak_under_load_is_paged_within_a_minute_by_the_sequential_test() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, a) = start_sim(
        dir.path(),
        &[
            "--model",
            MODEL,
            "--instance-name",
            "gpu-host-a",
            "--max-tokens",
            "16",
            "--itl-ms",
            "5",
            "--ttft-ms",
            "40",
        ],
    )
    .await;
    let config = format!(
        "scrape:
  interval: 2s
  targets:
    - {{url: 'http://{a}/vllm/metrics', labels: {{hostname: gpu-host-a}}}}
    - {{url: 'http://{a}/dcgm/metrics'}}
alerting:
  overrides:
    gpu_memory_leak:
      params: {{block_s: 5, min_baseline_blocks: 6, test_s: 60}}
"
    );
    let cfg = write_config(dir.path(), &config);
    let (tw, api) = start_collector(dir.path(), &["-c", &cfg.to_string_lossy()]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    // One client (~8 req/s): the KV blocks its requests keep add ~16 MiB/s, so no 2-s reading
    // grows by the 128 MiB the steps rule looks for.
    let workers = chat_traffic(a, MODEL, 1, stop.clone(), done.clone());
    // Baseline: 30 s of blocks before the 60 s test window, and nothing raised meanwhile.
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs(100) {
        let all = alerts(api).await;
        let leak: Vec<&Value> = all
            .iter()
            .filter(|x| x["rule"] == "gpu_memory_leak")
            .collect();
        assert!(leak.is_empty(), "a leak alert on healthy memory: {leak:#?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let r = send(
        "POST",
        &format!("http://{a}/admin/faults"),
        Some(&json!({"spec": "kv_leak:blocks=1,mib_per_s=25"}).to_string()),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let injected = Instant::now();
    let leak = fired_leak(
        api,
        &tw,
        injected,
        Duration::from_secs(60),
        "no gpu_memory_leak alert 60 s into a 25 MiB/s leak",
    )
    .await;
    let delay = injected.elapsed();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.abort();
    }
    let ev = &leak["last_event"]["evidence"];
    assert_eq!(ev["rule"], "sequential", "{leak:#}");
    let growth = ev["growth_bytes_per_s"].as_f64().unwrap_or(0.0) / 1024.0 / 1024.0;
    // 25 MiB/s plus the KV block each finished request keeps (2 MiB each).
    assert!(growth > 20.0, "growth {growth} MiB/s: {leak:#}");
    assert_eq!(
        leak["labels"]["serving_instance"],
        a.to_string(),
        "{leak:#}"
    );
    eprintln!(
        "25 MiB/s leak paged after {delay:?}: {}",
        leak["last_event"]["summary"]
    );
}
