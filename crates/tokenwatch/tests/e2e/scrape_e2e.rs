// Scrape source end to end: the real vLLM and dcgm-exporter samples served over HTTP, the
// simulator scraped with --scrape, and bad targets (garbage, hanging, refused) beside a good one.

use crate::common;

use common::*;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The real vLLM sample advanced by `n` steps: +100·n on every counter, and 10·n observations
/// of 0.08–0.1 s added to every histogram (so every bucket with le ≥ 0.1 grows by 10·n).
fn vllm_at(text: &str, n: usize) -> String {
    let n = n as f64;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let bump = if line.starts_with('#') || !line.starts_with("vllm:") {
            0.0
        } else if let Some((series, _)) = line.rsplit_once(' ') {
            let name = series.split('{').next().unwrap_or("");
            if name.ends_with("_created") {
                0.0
            } else if name.ends_with("_bucket") {
                let le = series
                    .split("le=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("0");
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(0.0)
                };
                if le >= 0.1 { 10.0 * n } else { 0.0 }
            } else if name.ends_with("_count") {
                10.0 * n
            } else if name.ends_with("_sum") {
                0.9 * n
            } else if name.ends_with("_total") {
                100.0 * n
            } else {
                0.0
            }
        } else {
            0.0
        };
        if bump != 0.0 {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let v: f64 = value.parse().unwrap();
            out.push_str(&format!("{series} {:?}\n", v + bump));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[derive(Clone)]
enum Behaviour {
    /// Body for the n-th request.
    Bodies(Arc<dyn Fn(usize) -> String + Send + Sync>),
    /// Accept and read the request, never answer.
    Hang,
}

/// A tiny HTTP/1.1 server on 127.0.0.1 counting the requests it got.
struct FakeTarget {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeTarget {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeTarget {
    async fn start(behaviour: Behaviour) -> FakeTarget {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let n = h.fetch_add(1, Ordering::SeqCst);
                let behaviour = behaviour.clone();
                held.push(tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => got.extend_from_slice(&buf[..k]),
                        }
                    }
                    match behaviour {
                        Behaviour::Hang => tokio::time::sleep(Duration::from_secs(3600)).await,
                        Behaviour::Bodies(f) => {
                            let body = f(n);
                            let head = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                body.len()
                            );
                            let _ = sock.write_all(head.as_bytes()).await;
                            let _ = sock.write_all(body.as_bytes()).await;
                            let _ = sock.shutdown().await;
                        }
                    }
                }));
            }
        });
        FakeTarget { addr, hits, task }
    }

    fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }
}

fn vllm_target_behaviour() -> Behaviour {
    let text = fixture("vllm-cpu-metrics.txt");
    Behaviour::Bodies(Arc::new(move |n| vllm_at(&text, n)))
}

/// `tokenwatch run` in collector-only mode (no --upstream), scraping every second, with
/// `yaml`'s lines added to its `scrape:` section, on ports it picks: (process, API address).
async fn start_collector(dir: &Path, yaml: &str, scrape: &[String]) -> (Proc, SocketAddr) {
    let cfg = dir.join("tokenwatch.yaml");
    std::fs::write(&cfg, format!("scrape:\n  interval: 1s\n{yaml}")).unwrap();
    let data = dir.join("data").to_string_lossy().into_owned();
    let c = cfg.to_string_lossy().into_owned();
    let mut args: Vec<&str> = vec![
        "run",
        "--config",
        &c,
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &data,
        "--otlp-grpc-listen",
        "127.0.0.1:0",
        "--otlp-http-listen",
        "127.0.0.1:0",
    ];
    for s in scrape {
        args.push("--scrape");
        args.push(s);
    }
    let tw = Proc::start("tokenwatch", &args, dir);
    let api = tw.listening().await["api"];
    wait_ready(&format!("http://{api}/readyz"), &tw).await;
    (tw, api)
}

async fn json(url: &str) -> Value {
    get(url).await.json()
}

fn signal<'a>(signals: &'a Value, name: &str) -> Option<&'a Value> {
    signals["signals"]
        .as_array()?
        .iter()
        .find(|s| s["signal"] == name)
}

fn target<'a>(targets: &'a Value, url: &str) -> &'a Value {
    targets["targets"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["url"] == url))
        .unwrap_or_else(|| panic!("{url} not in {targets:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_and_dcgm_samples_become_signals() {
    let vllm = FakeTarget::start(vllm_target_behaviour()).await;
    let dcgm_text = fixture("dcgm-exporter.txt");
    let dcgm = FakeTarget::start(Behaviour::Bodies(Arc::new(move |_| dcgm_text.clone()))).await;
    let dir = tempfile::tempdir().unwrap();
    let (tw, api) = start_collector(dir.path(), "", &[vllm.url(), dcgm.url()]).await;

    let url = format!("http://{api}/api/v1/signals?model=tinyllama");
    let s = poll_json(&url, &tw, 15, |v| {
        signal(v, "ttft_p50_seconds").is_some() && signal(v, "prompt_tokens_per_second").is_some()
    })
    .await;
    let p50 = signal(&s, "ttft_p50_seconds").unwrap();
    let v = p50["value"].as_f64().unwrap();
    assert!(
        (v - 0.09).abs() < 1e-6,
        "10·n observations in (0.08, 0.1]: p50 = 0.09, got {p50:#}"
    );
    assert_eq!(p50["notes"]["bucket_lower"], "0.08");
    assert_eq!(p50["notes"]["bucket_upper"], "0.1");
    assert_eq!(p50["source"], "scrape:vllm");
    assert_eq!(p50["runtime"], "vllm");
    assert_eq!(p50["instance"], vllm.addr.to_string());
    for name in [
        "ttft_p99_seconds",
        "itl_p50_seconds",
        "e2e_p95_seconds",
        "queue_p90_seconds",
        "kv_cache_usage",
        "requests_running",
        "requests_waiting",
    ] {
        assert!(signal(&s, name).is_some(), "{name} missing: {s:#}");
    }
    let rate = signal(&s, "prompt_tokens_per_second").unwrap()["value"]
        .as_f64()
        .unwrap();
    assert!(
        (20.0..=400.0).contains(&rate),
        "100 tokens per ~1 s scrape, got {rate}"
    );
    let hit = signal(&s, "prefix_cache_hit_rate").unwrap()["value"]
        .as_f64()
        .unwrap();
    assert!(
        (hit - 1.0).abs() < 1e-9,
        "hits and queries both grow by 100 per step: {hit}"
    );

    // Device signals of the dcgm sample (no model: model_id "").
    let all = json(&format!("http://{api}/api/v1/signals")).await;
    let gpu = |name: &str| {
        all["signals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| {
                p["signal"] == name && p["device_id"] == "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"
            })
            .unwrap_or_else(|| panic!("{name} missing for the dcgm GPU: {all:#}"))
            .clone()
    };
    let total = gpu("gpu_memory_total_bytes");
    assert_eq!(
        total["value"].as_f64().unwrap(),
        (45459.0 + 608.0) * 1048576.0
    );
    assert_eq!(total["model_id"], "");
    assert_eq!(total["instance"], "gpu1-wl8sg");
    assert_eq!(total["source"], "scrape:dcgm");
    assert_eq!(gpu("gpu_memory_used_bytes")["value"].as_f64().unwrap(), 0.0);
    assert_eq!(gpu("gpu_memory_used_ratio")["value"].as_f64().unwrap(), 0.0);
    assert_eq!(
        gpu("gpu_temperature_celsius")["value"].as_f64().unwrap(),
        32.0
    );
    assert!((gpu("gpu_power_watts")["value"].as_f64().unwrap() - 35.686).abs() < 1e-9);
    assert_eq!(
        gpu("gpu_utilization")["notes"]["pci_bus_id"],
        "00000000:00:07.0"
    );

    let targets = json(&format!("http://{api}/api/v1/targets")).await;
    let t = target(&targets, &vllm.url());
    assert_eq!(
        (
            t["health"].as_str(),
            t["runtime"].as_str(),
            t["runtime_from"].as_str()
        ),
        (Some("up"), Some("vllm"), Some("detected"))
    );
    assert!(t["samples"].as_u64().unwrap() > 400, "{t:#}");
    assert_eq!(t["interval_s"].as_f64(), Some(1.0));
    assert!(t["last_scrape"].as_str().unwrap().ends_with('Z'));
    assert_eq!(target(&targets, &dcgm.url())["runtime"], "dcgm");

    let metrics = get(&format!("http://{api}/metrics")).await.body;
    let up = format!(
        "tokenwatch_scrape_up{{target=\"{}\",runtime=\"vllm\"}}",
        vllm.url()
    );
    assert_eq!(metric_value(&metrics, &up), Some(1.0), "{metrics}");
    let samples = format!(
        "tokenwatch_scrape_samples_scraped{{target=\"{}\"}}",
        dcgm.url()
    );
    assert!(
        metric_value(&metrics, &samples).unwrap_or(0.0) >= 20.0,
        "{metrics}"
    );
    assert!(
        metrics.contains("tokenwatch_scrape_duration_seconds{"),
        "{metrics}"
    );
    let ready = json(&format!("http://{api}/readyz")).await;
    assert!(ready.to_string().contains("collector-only"), "{ready}");
    promtool_check_metrics(&metrics);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_targets_do_not_disturb_a_good_one() {
    let good = FakeTarget::start(vllm_target_behaviour()).await;
    let garbage = FakeTarget::start(Behaviour::Bodies(Arc::new(|_| {
        "<html><body>{{ not metrics }}</body></html>\n".into()
    })))
    .await;
    let hang = FakeTarget::start(Behaviour::Hang).await;
    // An address nobody listens on: its scrapes are refused.
    let refused = free_addr();
    let dir = tempfile::tempdir().unwrap();
    // The bad targets come from a file_sd file, which is then edited while running.
    let sd: PathBuf = dir.path().join("targets.json");
    let group = |targets: &[String]| {
        format!(r#"[{{"targets": {targets:?}, "labels": {{"team": "infra"}}}}]"#)
    };
    std::fs::write(
        &sd,
        group(&[
            garbage.addr.to_string(),
            hang.addr.to_string(),
            refused.to_string(),
        ]),
    )
    .unwrap();
    let yaml = format!(
        "  timeout: 1s\n  file_sd_refresh: 200ms\n  file_sd: [{:?}]\n",
        sd.to_string_lossy()
    );
    let (tw, api) = start_collector(dir.path(), &yaml, &[good.url()]).await;

    let turl = format!("http://{api}/api/v1/targets");
    let (g, h, r) = (
        garbage.url(),
        hang.url(),
        format!("http://{refused}/metrics"),
    );
    let targets = poll_json(&turl, &tw, 15, |v| {
        v["targets"].as_array().is_some_and(|a| a.len() == 4)
            && [&g, &h, &r]
                .iter()
                .all(|u| target(v, u)["health"] == "down")
            && target(v, &good.url())["health"] == "up"
    })
    .await;
    let err = |u: &str| {
        target(&targets, u)["last_error"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(
        err(&g).contains("not Prometheus/OpenMetrics exposition"),
        "{targets:#}"
    );
    assert!(err(&h).contains("no complete answer within"), "{targets:#}");
    assert!(err(&r).contains("connection failed"), "{targets:#}");
    assert_eq!(target(&targets, &g)["labels"]["team"], "infra");
    assert!(targets["file_sd"][0]["last_error"].is_null(), "{targets:#}");

    // The good target keeps its one-second pace and fresh signals while the others fail.
    let before = good.hits.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = good.hits.load(Ordering::SeqCst);
    assert!(
        after - before >= 3,
        "good target scraped {} times in 4 s",
        after - before
    );
    let s = json(&format!("http://{api}/api/v1/signals?model=tinyllama")).await;
    let p = signal(&s, "prompt_tokens_per_second").unwrap_or_else(|| panic!("{s:#}"));
    let age = chrono::Utc::now().timestamp_millis() - p["timestamp_unix_ms"].as_i64().unwrap();
    assert!(age < 2500, "signal is {age} ms old");
    assert!(
        hang.hits.load(Ordering::SeqCst) >= 2,
        "the hanging target is retried"
    );

    let metrics = get(&format!("http://{api}/metrics")).await.body;
    let timeouts = format!("tokenwatch_scrape_failures_total{{target=\"{h}\",reason=\"timeout\"}}");
    assert!(
        metric_value(&metrics, &timeouts).unwrap_or(0.0) >= 1.0,
        "{metrics}"
    );
    let parse = format!("tokenwatch_scrape_failures_total{{target=\"{g}\",reason=\"parse\"}}");
    assert!(
        metric_value(&metrics, &parse).unwrap_or(0.0) >= 1.0,
        "{metrics}"
    );
    assert_eq!(
        metric_value(
            &metrics,
            &format!("tokenwatch_scrape_up{{target=\"{g}\",runtime=\"\"}}")
        ),
        Some(0.0),
        "{metrics}"
    );
    promtool_check_metrics(&metrics);

    // Edit the file: the hanging and refused targets leave, without a restart.
    std::fs::write(&sd, group(&[garbage.addr.to_string()])).unwrap();
    let targets = poll_json(&turl, &tw, 10, |v| {
        v["targets"].as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    target(&targets, &g);
    target(&targets, &good.url());
    let metrics = get(&format!("http://{api}/metrics")).await.body;
    assert!(
        !metrics.contains(&h),
        "removed target's series are gone: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_scraped_with_the_scrape_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, sim_addr) = start_sim(dir.path(), &["--ttft-ms", "40", "--itl-ms", "5"]).await;
    let scrape = format!("http://{sim_addr}/metrics");
    let (tw, api) = start_collector(dir.path(), "", std::slice::from_ref(&scrape)).await;
    let turl = format!("http://{api}/api/v1/targets");
    poll_json(&turl, &tw, 10, |v| target(v, &scrape)["health"] == "up").await;

    // Traffic through the simulator's OpenAI API while it is being scraped.
    let url = format!("http://{sim_addr}/v1/completions");
    let mut reqs = Vec::new();
    for i in 0..12 {
        let url = url.clone();
        reqs.push(tokio::spawn(async move {
            let body = format!(
                r#"{{"model":"sim-llama-8b","prompt":"hello number {i}","max_tokens":40}}"#
            );
            send("POST", &url, Some(&body), &[]).await.map(|r| r.status)
        }));
    }
    for r in reqs {
        assert_eq!(r.await.unwrap(), Ok(200));
    }

    let surl = format!("http://{api}/api/v1/signals?model=sim-llama-8b");
    let s = poll_json(&surl, &tw, 10, |v| signal(v, "ttft_p99_seconds").is_some()).await;
    for name in [
        "kv_cache_usage",
        "requests_running",
        "requests_waiting",
        "ttft_p50_seconds",
        "ttft_p90_seconds",
        "ttft_p95_seconds",
        "e2e_p50_seconds",
        "gpu_memory_used_bytes",
        "gpu_memory_total_bytes",
        "gpu_memory_used_ratio",
        "gpu_utilization",
    ] {
        assert!(signal(&s, name).is_some(), "{name} missing: {s:#}");
    }
    let p50 = signal(&s, "ttft_p50_seconds").unwrap();
    let v = p50["value"].as_f64().unwrap();
    assert!(v > 0.0 && v < 2.0, "{p50:#}");
    assert!(p50["notes"]["max_abs_error"].as_str().is_some(), "{p50:#}");
    let used = signal(&s, "gpu_memory_used_bytes").unwrap();
    assert_eq!(used["source"], "scrape:dcgm");
    assert!(
        !used["device_id"].as_str().unwrap_or("").is_empty(),
        "{used:#}"
    );
    assert!(
        used["value"].as_f64().unwrap() > 1e9,
        "weights alone are GiBs: {used:#}"
    );
    let kv = signal(&s, "kv_cache_usage").unwrap()["value"]
        .as_f64()
        .unwrap();
    assert!((0.0..=1.0).contains(&kv));
    drop(sim);
    drop(tw);
}

/// An http_sd endpoint on 127.0.0.1 (port 0): answers `GET /targets` with the groups set last,
/// as application/json, or 500 while `failing`.
struct SdEndpoint {
    addr: SocketAddr,
    groups: Arc<std::sync::Mutex<String>>,
    failing: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SdEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SdEndpoint {
    async fn start() -> SdEndpoint {
        use axum::http::{StatusCode, header};
        let groups = Arc::new(std::sync::Mutex::new("[]".to_string()));
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (g, f) = (groups.clone(), failing.clone());
        let app = axum::Router::new().route(
            "/targets",
            axum::routing::get(move || {
                let (g, f) = (g.clone(), f.clone());
                async move {
                    if f.load(Ordering::SeqCst) {
                        return (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(header::CONTENT_TYPE, "text/plain")],
                            "down".to_string(),
                        );
                    }
                    let body = g.lock().unwrap().clone();
                    (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "application/json")],
                        body,
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        SdEndpoint {
            addr,
            groups,
            failing,
            task,
        }
    }

    fn list(&self, targets: &[SocketAddr]) {
        let t: Vec<String> = targets.iter().map(|a| a.to_string()).collect();
        *self.groups.lock().unwrap() =
            format!(r#"[{{"targets": {t:?}, "labels": {{"team": "serving"}}}}]"#);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sd_targets_come_and_go_and_a_failing_endpoint_keeps_them() {
    let (a, b) = (
        FakeTarget::start(vllm_target_behaviour()).await,
        FakeTarget::start(vllm_target_behaviour()).await,
    );
    let sd = SdEndpoint::start().await;
    sd.list(&[a.addr]);
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "  http_sd: [\"http://{}/targets\"]\n  http_sd_refresh: 300ms\n",
        sd.addr
    );
    let (tw, api) = start_collector(dir.path(), &yaml, &[]).await;
    let turl = format!("http://{api}/api/v1/targets");

    // The endpoint's one target is scraped, with the group's labels and its origin.
    let targets = poll_json(&turl, &tw, 15, |v| {
        v["targets"].as_array().is_some_and(|t| t.len() == 1)
            && target(v, &a.url())["health"] == "up"
    })
    .await;
    assert_eq!(target(&targets, &a.url())["labels"]["team"], "serving");
    assert_eq!(
        target(&targets, &a.url())["origin"],
        format!("http_sd:http://{}/targets", sd.addr)
    );
    assert_eq!(targets["http_sd"][0]["targets"], 1, "{targets:#}");

    // A second one appears: scraped without a restart.
    sd.list(&[a.addr, b.addr]);
    poll_json(&turl, &tw, 10, |v| {
        v["targets"].as_array().is_some_and(|t| t.len() == 2)
            && target(v, &b.url())["health"] == "up"
    })
    .await;

    // The endpoint fails: both targets stay (as Prometheus keeps them), the failure is shown.
    sd.failing.store(true, Ordering::SeqCst);
    let targets = poll_json(&turl, &tw, 10, |v| {
        v["http_sd"][0]["last_error"].is_string()
    })
    .await;
    assert!(
        targets["http_sd"][0]["last_error"]
            .as_str()
            .unwrap()
            .contains("500"),
        "{targets:#}"
    );
    assert_eq!(
        targets["targets"].as_array().map(Vec::len),
        Some(2),
        "{targets:#}"
    );

    // Back, listing only b: a leaves, and its series with it.
    sd.list(&[b.addr]);
    sd.failing.store(false, Ordering::SeqCst);
    let targets = poll_json(&turl, &tw, 10, |v| {
        v["targets"].as_array().is_some_and(|t| t.len() == 1)
            && v["http_sd"][0]["last_error"].is_null()
    })
    .await;
    target(&targets, &b.url());
    let metrics = get(&format!("http://{api}/metrics")).await.body;
    assert!(
        !metrics.contains(&a.url()),
        "a's series are gone: {metrics}"
    );
}

/// A Prometheus that already discovers the fleet (file_sd, as Debian's runs it): tokenwatch
/// scrapes the targets of the one job it is told, follows Prometheus's rediscovery, and leaves
/// the other jobs alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_targets_a_prometheus_discovered_are_scraped_by_job() {
    let (a, b, other) = (
        FakeTarget::start(vllm_target_behaviour()).await,
        FakeTarget::start(vllm_target_behaviour()).await,
        FakeTarget::start(vllm_target_behaviour()).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let sd = dir.path().join("vllm.json");
    let list = |targets: &[SocketAddr]| {
        let t: Vec<String> = targets.iter().map(|a| a.to_string()).collect();
        std::fs::write(
            &sd,
            format!(r#"[{{"targets": {t:?}, "labels": {{"namespace": "serving"}}}}]"#),
        )
        .unwrap();
    };
    list(&[a.addr, b.addr]);
    let prom = common::prometheus::Prometheus::start(
        dir.path(),
        &format!(
            "global:\n  scrape_interval: 15s\nscrape_configs:\n\
             \x20 - job_name: vllm\n    file_sd_configs: [{{files: [{:?}], refresh_interval: 1s}}]\n\
             \x20 - job_name: node\n    static_configs: [{{targets: ['{}']}}]\n",
            sd.display(),
            other.addr
        ),
    )
    .await;
    let yaml = format!(
        "  http_sd_refresh: 300ms\n  prometheus_targets: [{{url: \"{}\", job: vllm}}]\n",
        prom.url
    );
    let (tw, api) = start_collector(dir.path(), &yaml, &[]).await;
    let turl = format!("http://{api}/api/v1/targets");

    // The job's two targets, with Prometheus's labels (namespace, instance), not the node job's.
    let targets = poll_json(&turl, &tw, 30, |v| {
        v["targets"].as_array().is_some_and(|t| t.len() == 2)
            && [&a, &b]
                .iter()
                .all(|x| target(v, &x.url())["health"] == "up")
    })
    .await;
    let ta = target(&targets, &a.url());
    assert_eq!(ta["labels"]["namespace"], "serving", "{targets:#}");
    assert_eq!(ta["instance"], a.addr.to_string(), "{targets:#}");
    assert_eq!(ta["origin"], format!("prometheus:{}", prom.url));
    assert_eq!(
        targets["prometheus_targets"][0]["targets"], 2,
        "{targets:#}"
    );
    assert!(
        !targets.to_string().contains(&other.addr.to_string()),
        "the node job's target is not scraped: {targets:#}"
    );

    // Prometheus rediscovers (the file lists b alone): tokenwatch follows.
    list(&[b.addr]);
    poll_json(&turl, &tw, 30, |v| {
        v["targets"].as_array().is_some_and(|t| t.len() == 1)
            && target(v, &b.url())["health"] == "up"
    })
    .await;
    drop(prom);
}
