// Alert-latency benchmark (spec 12: anomalous data → firing alert ≤ 1 s plus `for`): the GPU-leak
// and latency-spike faults of one simulator, seen by tokenwatch and, in the same run, by Prometheus
// (scrape and evaluation every 15 s) with the rules `tokenwatch rules export` writes; both send to
// one Alertmanager. Per fault instance it records when the anomalous data reached tokenwatch, when
// each pipeline fired, and when Alertmanager listed each alert.
//
// Run: `cargo bench -p tokenwatch --bench alert_latency` (~4 min). Needs /usr/bin/prometheus and
// /usr/bin/prometheus-alertmanager (Debian packages). Knobs (environment, defaults in brackets):
// TW_BENCH_INSTANCES [3] faulty models per scenario, TW_BENCH_RPS [8] requests/s per model,
// TW_BENCH_WARMUP_SECS [125] clean traffic before the first fault (two 1-minute windows),
// TW_BENCH_STAGGER_SECS [7] between fault onsets, TW_BENCH_WAIT_SECS [100] after the last onset,
// TW_BENCH_PROM_INTERVAL [15] Prometheus scrape/evaluation interval (s), TW_BENCH_OUT
// [target/bench-alert-latency.md].

#[path = "alert_latency/procs.rs"]
mod procs;
#[path = "alert_latency/report.rs"]
mod report;

use procs::{Proc, Relay, client, free_addr, get_json, http, now_ms, start_hook, wait_ready};
use report::{Instance, Kind};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// The rules under test, in tokenwatch's configuration; Prometheus gets their export.
fn tokenwatch_config(
    relay: std::net::SocketAddr,
    am: std::net::SocketAddr,
    hook: std::net::SocketAddr,
) -> String {
    format!(
        r#"scrape:
  interval: 1s
  targets:
    - url: http://{relay}/tw/metrics
alerting:
  rules:
    - name: bench_ttft_spike
      detector: latency_spike
      signal: ttft
      window: 1m
      params: {{ratio: 2.5, min_samples: 50}}
      severity: critical
      summary: "TTFT P99 spike on {{{{ labels.model_id }}}}"
    - name: bench_gpu_leak
      detector: gpu_memory_leak
      window: 1m
      group_by: [model_id, instance, device_id]
      severity: critical
      summary: "GPU memory leak on {{{{ labels.device_id }}}}"
  delivery:
    alertmanagers: [http://{am}]
    webhooks: [{{url: "http://{hook}/hook"}}]
"#
    )
}

/// First sighting of each (pipeline, rule family, instance) in a poller.
type Seen = Arc<Mutex<BTreeMap<(String, String), (i64, i64)>>>;

fn note(seen: &Seen, who: &str, key: &str, at: i64, own: i64) {
    seen.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((who.to_string(), key.to_string()))
        .or_insert((at, own));
}

fn family(alertname: &str) -> Option<&'static str> {
    if alertname.starts_with("bench_ttft_spike") {
        Some("spike")
    } else if alertname.starts_with("bench_gpu_leak") {
        Some("leak")
    } else {
        None
    }
}

/// Poll tokenwatch, Prometheus and Alertmanager until `stop`; note first sightings. Keys are the
/// model (spike) or GPU UUID (leak); the value is (seen at, the pipeline's own firing time).
fn pollers(tw: String, prom: String, am: String, stop: Arc<AtomicBool>, seen: Seen) {
    let (s1, st1) = (seen.clone(), stop.clone());
    tokio::spawn(async move {
        let c = client();
        while !st1.load(Ordering::Relaxed) {
            let v = get_json(&c, &format!("http://{tw}/api/v1/alerts?state=firing")).await;
            let at = now_ms();
            for a in v["alerts"].as_array().into_iter().flatten() {
                let key = match a["rule"].as_str() {
                    Some("bench_ttft_spike") => a["labels"]["model_id"].as_str(),
                    Some("bench_gpu_leak") => a["labels"]["device_id"].as_str(),
                    _ => None,
                };
                if let (Some(k), Some(f)) = (key, a["fired_at_unix_ms"].as_i64()) {
                    note(&s1, "tw", k, at, f);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (s2, st2) = (seen.clone(), stop.clone());
    tokio::spawn(async move {
        let c = client();
        while !st2.load(Ordering::Relaxed) {
            let v = get_json(&c, &format!("http://{prom}/api/v1/alerts")).await;
            let at = now_ms();
            for a in v["data"]["alerts"].as_array().into_iter().flatten() {
                let l = &a["labels"];
                let key = match family(l["alertname"].as_str().unwrap_or("")) {
                    Some("spike") => l["model_name"].as_str(),
                    Some(_) => l["UUID"].as_str(),
                    None => None,
                };
                let active =
                    chrono::DateTime::parse_from_rfc3339(a["activeAt"].as_str().unwrap_or(""))
                        .map(|t| t.timestamp_millis())
                        .unwrap_or(at);
                if let Some(k) = key.filter(|_| a["state"] == "firing") {
                    note(&s2, "prom", k, at, active);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    tokio::spawn(async move {
        let c = client();
        while !stop.load(Ordering::Relaxed) {
            let v = get_json(&c, &format!("http://{am}/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true")).await;
            let at = now_ms();
            for a in v.as_array().into_iter().flatten() {
                let l = &a["labels"];
                // tokenwatch labels model_id / device_id; Prometheus keeps the exporters' names.
                let (who, key) = if l["model_name"].is_string() || l["UUID"].is_string() {
                    ("am_prom", l["model_name"].as_str().or(l["UUID"].as_str()))
                } else {
                    ("am_tw", l["device_id"].as_str().or(l["model_id"].as_str()))
                };
                let key = match family(l["alertname"].as_str().unwrap_or("")) {
                    Some("spike") if who == "am_tw" => l["model_id"].as_str(),
                    Some(_) => key,
                    None => None,
                };
                if let Some(k) = key {
                    note(&seen, who, k, at, at);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// Paced open-loop streaming traffic to every model through the proxy until `stop`.
fn traffic(proxy: std::net::SocketAddr, models: Vec<String>, rps: f64, stop: Arc<AtomicBool>) {
    for (m, model) in models.into_iter().enumerate() {
        let stop = stop.clone();
        tokio::spawn(async move {
            let c = client();
            let permits = Arc::new(tokio::sync::Semaphore::new(64));
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rps));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Spread the models' ticks over one period.
            tokio::time::sleep(Duration::from_secs_f64(m as f64 * 0.013)).await;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                i += 1;
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    continue;
                };
                let (c, url) = (c.clone(), format!("http://{proxy}/v1/chat/completions"));
                let body = serde_json::json!({
                    "model": model, "stream": true,
                    "messages": [{"role": "user", "content": format!("request {i} to {model}: say something short")}],
                })
                .to_string();
                tokio::spawn(async move {
                    let _permit = permit;
                    let _ = http(&c, "POST", &url, Some(body)).await;
                });
            }
        });
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run());
}

async fn run() {
    let n: usize = env_or("TW_BENCH_INSTANCES", 3);
    let rps: f64 = env_or("TW_BENCH_RPS", 8.0);
    let warmup: u64 = env_or("TW_BENCH_WARMUP_SECS", 125);
    let stagger: u64 = env_or("TW_BENCH_STAGGER_SECS", 7);
    let wait: u64 = env_or("TW_BENCH_WAIT_SECS", 100);
    let prom_interval: u64 = env_or("TW_BENCH_PROM_INTERVAL", 15);
    let out = std::env::var_os("TW_BENCH_OUT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/bench-alert-latency.md")
        });
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let spikes: Vec<String> = (0..n).map(|i| format!("spike-{i}")).collect();
    let leaks: Vec<String> = (0..n).map(|i| format!("leak-{i}")).collect();
    let models: Vec<String> = spikes.iter().chain(leaks.iter()).cloned().collect();
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    // The simulator: one engine (and simulated GPU) per model, fast and short answers.
    let sim = free_addr();
    let sim_args: Vec<String> = [
        "sim",
        "--listen",
        &sim.to_string(),
        "--model",
        &models.join(","),
        "--ttft-ms",
        "40",
        "--itl-ms",
        "4",
        "--max-tokens",
        "24",
        "--kv-blocks",
        "24576",
        // An H200: the weights and the preallocated KV pool leave ~77 GiB for the leak to eat.
        "--gpu-memory-gib",
        "141",
        "--gpu-name",
        "NVIDIA H200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let sim_p = Proc::start("sim", procs::BIN, &sim_args, d);
    wait_ready(&format!("http://{sim}/v1/models"), &sim_p).await;
    let c = client();
    let (_, text) = http(&c, "GET", &format!("http://{sim}/metrics"), None)
        .await
        .expect("sim metrics");
    // GPU i serves model i (the simulator's order); leak alerts are keyed by GPU UUID.
    let uuids: Vec<String> = {
        let mut v: Vec<(u32, String)> = text
            .lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{"))
            .filter_map(|l| {
                let gpu = l.split("gpu=\"").nth(1)?.split('"').next()?.parse().ok()?;
                let uuid = l.split("UUID=\"").nth(1)?.split('"').next()?.to_string();
                Some((gpu, uuid))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, u)| u).collect()
    };
    assert_eq!(
        uuids.len(),
        models.len(),
        "one simulated GPU per model:\n{text}"
    );

    let relay = Relay::start(sim).await;
    let (hook, hook_log) = start_hook().await;
    let (am_p, am) = procs::start_alertmanager(d, Some(hook), &["alertname"]).await;
    let cfg = d.join("tokenwatch.yaml");
    std::fs::write(&cfg, tokenwatch_config(relay.addr, am, hook)).expect("write config");
    let rules = d.join("rules.yml");
    let export = std::process::Command::new(procs::BIN)
        .args(["rules", "export", "--format", "prometheus", "-c"])
        .arg(&cfg)
        .arg("-o")
        .arg(&rules)
        .output()
        .expect("run tokenwatch rules export");
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let (prom_p, prom) = procs::start_prometheus(d, relay.addr, am, &rules, prom_interval).await;
    let (api, proxy) = (free_addr(), free_addr());
    let tw_args: Vec<String> = [
        "run",
        "-c",
        &cfg.display().to_string(),
        "--listen",
        &api.to_string(),
        "--proxy-listen",
        &proxy.to_string(),
        "--upstream",
        &format!("http://{sim}"),
        "--upstream-runtime",
        "sim",
        "--data-dir",
        &d.join("data").display().to_string(),
        "--otlp-grpc-listen",
        &free_addr().to_string(),
        "--otlp-http-listen",
        &free_addr().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let tw_p = Proc::start("tokenwatch", procs::BIN, &tw_args, d);
    wait_ready(&format!("http://{api}/readyz"), &tw_p).await;
    eprintln!(
        "alert_latency: sim {sim}, tokenwatch {api}, Prometheus {prom}, Alertmanager {am}; warming up {warmup} s"
    );

    let stop = Arc::new(AtomicBool::new(false));
    traffic(proxy, models.clone(), rps, stop.clone());
    let seen: Seen = Default::default();
    pollers(
        api.to_string(),
        prom.to_string(),
        am.to_string(),
        stop.clone(),
        seen.clone(),
    );
    tokio::time::sleep(Duration::from_secs(warmup)).await;

    // Fault onsets, staggered so they fall at different phases of Prometheus's 15 s cycle.
    let mut instances = Vec::new();
    for i in 0..n {
        for (kind, model, spec) in [
            (
                Kind::Spike,
                &spikes[i],
                format!("latency_spike:factor=10,share=0.3,model={}", spikes[i]),
            ),
            (
                Kind::Leak,
                &leaks[i],
                format!("kv_leak:blocks=24,model={}", leaks[i]),
            ),
        ] {
            let (status, body) = http(
                &c,
                "POST",
                &format!("http://{sim}/admin/faults"),
                Some(serde_json::json!({"spec": spec}).to_string()),
            )
            .await
            .expect("enable fault");
            assert_eq!(status, 200, "{spec}: {body}");
            let gpu = models
                .iter()
                .position(|m| m == model)
                .map(|p| uuids[p].clone())
                .unwrap_or_default();
            instances.push(Instance::new(kind, model.clone(), gpu, now_ms()));
            tokio::time::sleep(Duration::from_millis(stagger * 500)).await;
        }
    }
    let deadline = now_ms() + wait as i64 * 1000;
    while now_ms() < deadline {
        let s = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if instances.iter().all(|i| {
            ["tw", "prom", "am_tw", "am_prom"]
                .iter()
                .all(|w| s.contains_key(&(w.to_string(), i.key().to_string())))
        }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // What tokenwatch saw: its own request records (spike) and the relay's log of its scrapes (leak).
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let hooks = hook_log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let tw_scrapes = relay.tw.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let prom_scrapes = relay.prom.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for inst in &mut instances {
        match inst.kind {
            Kind::Spike => {
                let v = get_json(
                    &c,
                    &format!(
                        "http://{api}/api/v1/requests?model={}&limit=10000",
                        inst.model
                    ),
                )
                .await;
                inst.onset_from_records(
                    v["requests"].as_array().map(Vec::as_slice).unwrap_or(&[]),
                    60_000,
                    2.5,
                    50,
                );
            }
            Kind::Leak => inst.onset_from_scrapes(&tw_scrapes, &prom_scrapes, 128.0, 5),
        }
        inst.fill(&seen, &hooks);
    }
    let load_end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let md = report::markdown(
        &instances,
        &report::RunInfo {
            rps,
            prom_interval,
            load: format!(
                "{} → {}",
                load_start
                    .split_whitespace()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" "),
                load_end
                    .split_whitespace()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            rules: std::fs::read_to_string(&rules).unwrap_or_default(),
        },
    );
    println!("{md}");
    if let Some(parent) = out.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&out, &md).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    eprintln!("alert_latency: written to {}", out.display());
    for p in [&tw_p, &prom_p, &am_p, &sim_p] {
        let log = p.log();
        if log.contains("panicked") {
            eprintln!("{} (pid {}) log:\n{log}", p.name, p.pid());
        }
    }
}
