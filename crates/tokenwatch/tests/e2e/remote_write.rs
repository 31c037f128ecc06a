// Prometheus remote write against the real receivers — Prometheus (Debian `prometheus`, with
// --web.enable-remote-write-receiver) and VictoriaMetrics (Debian `victoria-metrics`).

use crate::common;

use common::{Stack, free_addr, get, metric_value, send};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A real remote-write receiver on `addr` with its own storage, answering PromQL at
/// `/api/v1/query`; killed when dropped.
struct Receiver {
    name: &'static str,
    child: Child,
    url: String,
    log: PathBuf,
}

/// The executable `name` on PATH; fails (never skips) naming the Debian package that
/// scripts/test.sh installs for it.
fn tool(name: &str, package: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| panic!("{name} is not installed — run the README's test command (scripts/test.sh), which installs Debian's `{package}` package"))
}

// Receivers listen on an address chosen before they start (`free_addr`): neither Prometheus nor
// VictoriaMetrics reports a port it picked.
impl Receiver {
    /// Prometheus accepting remote write at `/api/v1/write`.
    async fn prometheus(dir: &Path, addr: SocketAddr) -> Receiver {
        let cfg = dir.join("prometheus.yml");
        std::fs::write(&cfg, "global:\n  scrape_interval: 1m\n").unwrap();
        let args = [
            format!("--config.file={}", cfg.display()),
            format!("--storage.tsdb.path={}", dir.join("prom-data").display()),
            format!("--web.listen-address={addr}"),
            "--web.enable-remote-write-receiver".to_string(),
        ];
        Receiver::start("prometheus", "prometheus", &args, dir, addr, "/-/ready").await
    }

    /// Single-node VictoriaMetrics, which takes Prometheus remote write at `/api/v1/write`.
    /// `-search.latencyOffset=0s`: instant queries see samples as soon as they are
    /// searchable (by default they are evaluated 30 s in the past).
    async fn victoria_metrics(dir: &Path, addr: SocketAddr) -> Receiver {
        let args = [
            format!("-httpListenAddr={addr}"),
            format!("-storageDataPath={}", dir.join("vm-data").display()),
            "-retentionPeriod=1d".to_string(),
            "-search.latencyOffset=0s".to_string(),
            "-search.disableCache".to_string(),
        ];
        Receiver::start(
            "victoria-metrics",
            "victoria-metrics",
            &args,
            dir,
            addr,
            "/health",
        )
        .await
    }

    async fn start(
        name: &'static str,
        package: &str,
        args: &[String],
        dir: &Path,
        addr: SocketAddr,
        ready_path: &str,
    ) -> Receiver {
        let bin = tool(name, package);
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&bin)
            .args(args)
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let rx = Receiver {
            name,
            child,
            url: format!("http://{addr}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = send("GET", &format!("{}{ready_path}", rx.url), None, &[]).await
                && r.status == 200
            {
                return rx;
            }
            assert!(
                Instant::now() < deadline,
                "{name} never became ready; log:\n{}",
                rx.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The result vector of an instant query.
    async fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let q: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", promql)
            .finish();
        let r = get(&format!("{}/api/v1/query?{q}", self.url)).await;
        assert_eq!(r.status, 200, "{promql}: {}", r.body);
        let v = r.json();
        assert_eq!(v["status"], "success", "{promql}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Poll `promql` until one of its series satisfies `ok`; returns that series.
    async fn wait_for(
        &self,
        promql: &str,
        ok: impl Fn(&serde_json::Value, f64) -> bool,
        tw_log: impl Fn() -> String,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(40);
        let mut last = Vec::new();
        while Instant::now() < deadline {
            last = self.query(promql).await;
            if let Some(s) = last.iter().find(|s| ok(s, value(s))) {
                return s.clone();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!(
            "{promql}: never as expected; last result {last:?}\n--- tokenwatch log ---\n{}\n--- {} log ---\n{}",
            tw_log(),
            self.name,
            self.log()
        );
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of an instant-vector element (`"value": [time, "1.5"]`).
fn value(series: &serde_json::Value) -> f64 {
    series["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Sum of the `/metrics` series of `name` whose line contains every one of `having`.
fn sum_of(text: &str, name: &str, having: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && having.iter().all(|h| l.contains(h)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const CHAT: &str =
    r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5}"#;

async fn chat(stack: &Stack, n: usize) -> Duration {
    let url = format!("http://{}/v1/chat/completions", stack.proxy);
    let mut slowest = Duration::ZERO;
    for _ in 0..n {
        let t = Instant::now();
        let r = send("POST", &url, Some(CHAT), &[]).await.unwrap();
        slowest = slowest.max(t.elapsed());
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body.contains("data: [DONE]"), "{}", r.body);
    }
    slowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_arrive_in_prometheus_queryable_with_their_labels() {
    let dir = tempfile::tempdir().unwrap();
    let prom = Receiver::prometheus(dir.path(), free_addr()).await;
    series_arrive_queryable_with_their_labels(&prom, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_arrive_in_victoria_metrics_queryable_with_their_labels() {
    let dir = tempfile::tempdir().unwrap();
    let vm = Receiver::victoria_metrics(dir.path(), free_addr()).await;
    series_arrive_queryable_with_their_labels(&vm, dir.path()).await;
}

/// tokenwatch remote-writes to `prom` (config file in `dir`, with an external label); after
/// three proxied requests the series are queryable there with their labels and values.
async fn series_arrive_queryable_with_their_labels(prom: &Receiver, dir: &Path) {
    let cfg = dir.join("tw.yaml");
    std::fs::write(
        &cfg,
        format!(
            "export:\n  remote_write:\n    - url: {}/api/v1/write\n      interval: 1s\n      external_labels: {{cluster: test}}\n",
            prom.url
        ),
    )
    .unwrap();
    let stack = Stack::start(
        &["--model", "m1", "--ttft-ms", "5", "--itl-ms", "1"],
        &["-c", cfg.to_str().unwrap()],
    )
    .await;
    chat(&stack, 3).await;
    let tw_log = || stack.tw.log();

    // The request counter: the series' own labels, those of the GenAI conventions (its
    // instance is the upstream; error_type only on failures; empty labels are left out, as
    // Prometheus and VictoriaMetrics do), plus job and the external label.
    let req = prom
        .wait_for(
            r#"tokenwatch_requests_total{job="tokenwatch",cluster="test",gen_ai_request_model="m1"}"#,
            |_, v| v == 3.0,
            tw_log,
        )
        .await;
    let m = &req["metric"];
    assert_eq!(m["gen_ai_provider_name"], "sim", "{req}");
    assert_eq!(m["gen_ai_operation_name"], "chat", "{req}");
    assert_eq!(m["instance"], stack.sim_addr.to_string(), "{req}");
    assert!(
        m.get("error_type").is_none() && m.get("tenant").is_none(),
        "{req}"
    );

    // A histogram: its +Inf bucket and count, and PromQL's histogram_quantile over the buckets.
    prom.wait_for(
        r#"gen_ai_server_time_to_first_token_seconds_bucket{job="tokenwatch",gen_ai_request_model="m1",le="+Inf"}"#,
        |_, v| v == 3.0,
        tw_log,
    )
    .await;
    prom.wait_for(
        r#"gen_ai_server_request_duration_seconds_count{job="tokenwatch",gen_ai_request_model="m1",cluster="test"}"#,
        |_, v| v == 3.0,
        tw_log,
    )
    .await;
    let q = prom
        .query(r#"histogram_quantile(0.5, sum by (le) (gen_ai_server_time_to_first_token_seconds_bucket{job="tokenwatch"}))"#)
        .await;
    assert!(
        q.len() == 1 && value(&q[0]) > 0.0 && value(&q[0]) <= 1.0,
        "median TTFT from the remote-written buckets (sim: 5 ms): {q:?}"
    );

    // Token counts (the token usage histogram's sum) equal what /metrics serves.
    let metrics = get(&format!("http://{}/metrics", stack.api)).await.body;
    let out_tokens = sum_of(
        &metrics,
        "gen_ai_client_token_usage_sum",
        &[
            "gen_ai_request_model=\"m1\"",
            "gen_ai_token_type=\"output\"",
        ],
    );
    assert!(out_tokens > 0.0, "{metrics}");
    prom.wait_for(
        r#"gen_ai_client_token_usage_sum{job="tokenwatch",gen_ai_request_model="m1",gen_ai_token_type="output"}"#,
        |_, v| v == out_tokens,
        tw_log,
    )
    .await;

    // tokenwatch's own remote-write counters, both in Prometheus and on /metrics.
    prom.wait_for(
        r#"tokenwatch_remote_write_samples_total{job="tokenwatch"}"#,
        |_, v| v > 0.0,
        tw_log,
    )
    .await;
    let url = format!("url=\"{}/api/v1/write\"", prom.url);
    let before = sum_of(&metrics, "tokenwatch_remote_write_samples_total", &[&url]);
    assert!(before > 0.0, "{metrics}");
    // Samples sent keep growing: the next write (every second) is counted.
    let deadline = Instant::now() + Duration::from_secs(10);
    let after_text = loop {
        let text = get(&format!("http://{}/metrics", stack.api)).await.body;
        let after = sum_of(&text, "tokenwatch_remote_write_samples_total", &[&url]);
        if after > before {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "samples sent did not grow in 10 s: {before} -> {after}\n{}",
            tw_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        sum_of(&after_text, "tokenwatch_remote_write_dropped_total", &[]),
        0.0,
        "{after_text}"
    );
    assert_eq!(
        sum_of(&after_text, "tokenwatch_remote_write_failures_total", &[]),
        0.0,
        "{after_text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_endpoint_is_retried_without_slowing_the_proxy_and_catches_up() {
    // tokenwatch writes to this address while nothing listens there; Prometheus comes up on it
    // later, so it is chosen before either starts.
    let prom_addr = free_addr();
    let write_url = format!("http://{prom_addr}/api/v1/write");
    let stack = Stack::start(
        &["--model", "m1", "--ttft-ms", "5", "--itl-ms", "1"],
        &["--remote-write", &write_url],
    )
    .await;
    let slowest = chat(&stack, 5).await;
    assert!(
        slowest < Duration::from_secs(2),
        "proxied requests are not held up by a dead remote-write endpoint: {slowest:?}"
    );
    let url = format!("url=\"{write_url}\"");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = get(&format!("http://{}/metrics", stack.api)).await.body;
        let failures = sum_of(&text, "tokenwatch_remote_write_failures_total", &[&url]);
        if failures >= 3.0 {
            assert_eq!(
                sum_of(&text, "tokenwatch_remote_write_samples_total", &[&url]),
                0.0,
                "{text}"
            );
            assert_eq!(
                sum_of(&text, "tokenwatch_remote_write_dropped_total", &[&url]),
                0.0,
                "{text}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "failed attempts are counted and retried: {failures}\n{text}\n{}",
            stack.tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        stack.tw.log().contains("remote write failed; retrying"),
        "{}",
        stack.tw.log()
    );

    // The endpoint comes up: the request being retried (the first snapshot) gets through.
    let dir = tempfile::tempdir().unwrap();
    let prom = Receiver::prometheus(dir.path(), prom_addr).await;
    let build = prom
        .wait_for(
            r#"tokenwatch_build_info{job="tokenwatch"}"#,
            |_, v| v == 1.0,
            || stack.tw.log(),
        )
        .await;
    assert_eq!(
        build["metric"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{build}"
    );
    let text = get(&format!("http://{}/metrics", stack.api)).await.body;
    assert!(
        sum_of(&text, "tokenwatch_remote_write_samples_total", &[&url]) > 0.0,
        "{text}"
    );
    assert_eq!(
        metric_value(
            &text,
            &format!("tokenwatch_remote_write_dropped_total{{{url},reason=\"queue_full\"}}")
        ),
        Some(0.0),
        "{text}"
    );
    assert!(
        stack.tw.log().contains("accepts requests again"),
        "{}",
        stack.tw.log()
    );
}
