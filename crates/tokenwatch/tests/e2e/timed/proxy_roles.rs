// Proxy and analysis as separate roles (issue 28, items 2 and 3), end to end with the real
// binary on loopback: the same streams seen by one `role: all` proxy and by three `role: proxy`
// replicas shipping to one `role: aggregator` give the same counts, percentiles and alert; and a
// replica whose aggregator is killed (kill -9) keeps serving every stream at the same latency,
// buffers the records and delivers every one of them once the aggregator is back.

use crate::common;

use common::*;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const MODEL: &str = "sim-llama-8b";
const SALT: &str = "replicas-share-this-salt";

/// `tokenwatch run` named `name` (its log `name.log`), data in `dir/name`, with `args`.
fn run(dir: &Path, name: &str, args: &[String]) -> Proc {
    let data = dir.join(name).to_string_lossy().into_owned();
    let mut all: Vec<&str> = vec!["run", "--data-dir", &data];
    all.extend(args.iter().map(String::as_str));
    Proc::start(name, &all, dir)
}

fn s(a: impl ToString) -> String {
    a.to_string()
}

// The aggregator's OTLP address is named in the replicas' configuration (`aggregator.endpoint`),
// so it is chosen before the processes start (`free_addr`); so is the aggregator's API where a
// test restarts it on the same ports. Every other listener picks its own port (port 0) and is
// read back from the start line.

/// An aggregator (`role: aggregator`) with its API on `api` (port 0 or a fixed address),
/// receiving OTLP/HTTP on `otlp` and OTLP/gRPC on a port it picks; returns (process, API
/// address as bound).
async fn start_aggregator(
    dir: &Path,
    config: &Path,
    api: SocketAddr,
    otlp: SocketAddr,
) -> (Proc, SocketAddr) {
    start_aggregator_on(dir, config, api, otlp, any_addr()).await
}

/// An aggregator on `api` receiving OTLP/HTTP on `http` and OTLP/gRPC on `grpc`; returns
/// (process, API address as bound).
async fn start_aggregator_on(
    dir: &Path,
    config: &Path,
    api: SocketAddr,
    http: SocketAddr,
    grpc: SocketAddr,
) -> (Proc, SocketAddr) {
    let p = run(
        dir,
        "aggregator",
        &[
            s("-c"),
            s(config.display()),
            s("--role"),
            s("aggregator"),
            s("--listen"),
            s(api),
            s("--otlp-http-listen"),
            s(http),
            s("--otlp-grpc-listen"),
            s(grpc),
        ],
    );
    let api = p.listening().await["api"];
    (p, api)
}

/// A proxy replica (`role: proxy`) forwarding to `upstream`, shipping to `otlp`, its API and
/// proxy on ports it picks; returns (process, API address, proxy address) once bound.
async fn start_replica(
    dir: &Path,
    name: &str,
    config: &Path,
    upstream: &str,
    otlp: SocketAddr,
) -> (Proc, SocketAddr, SocketAddr) {
    let p = run(
        dir,
        name,
        &[
            s("-c"),
            s(config.display()),
            s("--role"),
            s("proxy"),
            s("--listen"),
            s(ANY),
            s("--proxy-listen"),
            s(ANY),
            s("--upstream"),
            s(upstream),
            s("--upstream-runtime"),
            s("sim"),
            s("--aggregator"),
            format!("http://{otlp}"),
        ],
    );
    let bound = p.listening().await;
    let (api, proxy) = (bound["api"], bound["proxy"]);
    (p, api, proxy)
}

/// What the client saw of one stream.
pub(crate) struct Seen {
    pub(crate) request_id: String,
    /// Time to the first content chunk and to the end, as the client measured them.
    pub(crate) ttft: Duration,
    pub(crate) total: Duration,
    /// Content chunks received.
    pub(crate) chunks: u32,
}

impl Seen {
    /// The client's time per chunk after the first (the simulator draws each answer's length,
    /// so the total alone is not comparable between requests).
    fn per_chunk(&self) -> Duration {
        (self.total - self.ttft) / self.chunks.saturating_sub(1).max(1)
    }
}

/// One streamed chat completion of `tokens` tokens through `proxy`; asserts it completed (200,
/// every token, `[DONE]`).
async fn stream(proxy: SocketAddr, tokens: u32, i: usize) -> Seen {
    use http_body_util::BodyExt;
    let body = serde_json::json!({
        "model": MODEL,
        "stream": true,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": format!("request {i}")}],
    })
    .to_string();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{proxy}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer sk-client-{}", i % 3))
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let start = Instant::now();
    let resp = client().request(req).await.expect("the proxy answers");
    assert_eq!(resp.status(), 200);
    let request_id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("x-request-id")
        .to_string();
    let mut body = resp.into_body();
    let (mut text, mut ttft) = (String::new(), None);
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the stream is not cut");
        if let Some(data) = frame.data_ref() {
            text.push_str(&String::from_utf8_lossy(data));
            if ttft.is_none() && text.contains("\"content\"") {
                ttft = Some(start.elapsed());
            }
        }
    }
    let total = start.elapsed();
    // Complete: content, a finish reason, then `[DONE]` (the simulator draws each answer's
    // length, up to `tokens`).
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("every event is whole JSON"))
        .collect();
    // Token events: every delta with content but the role preamble. A token's text may be
    // empty (the simulator, like vLLM, sends some empty chunks), so a one-token answer can
    // carry no text at all.
    let content = events
        .iter()
        .filter(|v| {
            let delta = &v["choices"][0]["delta"];
            delta["content"].is_string() && delta.get("role").is_none()
        })
        .count();
    assert!(text.trim_end().ends_with("data: [DONE]"), "cut: {text}");
    assert!((1..=tokens as usize).contains(&content), "{text}");
    assert!(
        events
            .iter()
            .any(|v| v["choices"][0]["finish_reason"].is_string()),
        "no finish reason: {text}"
    );
    Seen {
        request_id,
        ttft: ttft.unwrap_or(total),
        total,
        chunks: content as u32,
    }
}

/// `n` streams, `workers` at a time, the i-th through `proxies[i % len]`.
pub(crate) async fn traffic(
    proxies: &[SocketAddr],
    n: usize,
    workers: usize,
    tokens: u32,
) -> Vec<Seen> {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (next, proxies) = (next.clone(), proxies.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= n {
                    return seen;
                }
                seen.push(stream(proxies[i % proxies.len()], tokens, i).await);
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// The request ids of the stored records of `MODEL` at `api`, sorted (a duplicate shows twice).
async fn stored_ids(api: SocketAddr) -> Vec<String> {
    let v = get(&format!(
        "http://{api}/api/v1/requests?model={MODEL}&limit=10000"
    ))
    .await
    .json();
    let mut ids: Vec<String> = v["requests"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["request_id"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

fn sorted(ids: &BTreeSet<String>) -> Vec<String> {
    ids.iter().cloned().collect()
}

/// The client's view with the aggregator away is the same as with it up, within noise: TTFT
/// P50/P95 and time per chunk P50 (a telemetry path that waited would add its timeout).
pub(crate) fn assert_fails_open(up: &[Seen], away: &[Seen], what: &str) -> String {
    let q = |v: &[Seen], f: fn(&Seen) -> Duration, q| quantile(v.iter().map(f).collect(), q);
    let report = format!(
        "client TTFT p50/p95: before {:?}/{:?}, {what} {:?}/{:?}; time per chunk p50: before {:?}, {what} {:?}",
        q(up, |s| s.ttft, 0.5),
        q(up, |s| s.ttft, 0.95),
        q(away, |s| s.ttft, 0.5),
        q(away, |s| s.ttft, 0.95),
        q(up, Seen::per_chunk, 0.5),
        q(away, Seen::per_chunk, 0.5),
    );
    let slack = Duration::from_millis(15);
    assert!(
        q(away, |s| s.ttft, 0.5) <= q(up, |s| s.ttft, 0.5) + slack,
        "{report}"
    );
    assert!(
        q(away, |s| s.ttft, 0.95) <= q(up, |s| s.ttft, 0.95) + slack,
        "{report}"
    );
    assert!(
        q(away, Seen::per_chunk, 0.5) <= q(up, Seen::per_chunk, 0.5) + Duration::from_millis(3),
        "{report}"
    );
    report
}

async fn latency(api: SocketAddr, metric: &str) -> serde_json::Value {
    get(&format!(
        "http://{api}/api/v1/latency?model={MODEL}&metric={metric}&window=5m"
    ))
    .await
    .json()
}

fn metric(text: &str, series: &str) -> f64 {
    metric_value(text, series).unwrap_or_else(|| panic!("{series} missing"))
}

pub(crate) fn quantile(mut v: Vec<Duration>, q: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_and_one_proxy_see_the_same_percentiles_and_alert() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(d, &["--ttft-ms", "120", "--itl-ms", "12"]).await;
    let agg_otlp = free_addr();
    // One file for every role, as one ConfigMap would be; the alert fires on every request.
    let config = write_config(
        d,
        &format!(
            "proxy:\n  tenant_salt: {SALT}\naggregator:\n  endpoint: http://{agg_otlp}\n  buffer: {{flush_interval: 50ms}}\n  retry: {{max_backoff: 500ms}}\nalerting:\n  evaluation_interval: 1s\n  overrides:\n    absolute_latency: {{for: 1s, window: 30s, group_by: [model_id], params: {{threshold_s: 0.1}}}}\n"
        ),
    );
    // The reference: one `role: all` process that sees every request (the replicas' upstream).
    let one = run(
        d,
        "one",
        &[
            s("-c"),
            s(config.display()),
            s("--listen"),
            s(ANY),
            s("--proxy-listen"),
            s(ANY),
            s("--upstream"),
            format!("http://{sim}"),
            s("--upstream-runtime"),
            s("sim"),
            s("--otlp-grpc-listen"),
            s(ANY),
            s("--otlp-http-listen"),
            s(ANY),
        ],
    );
    let bound = one.listening().await;
    let (one_api, one_proxy) = (bound["api"], bound["proxy"]);
    let (aggregator, agg_api) = start_aggregator(d, &config, any_addr(), agg_otlp).await;
    let mut replicas = Vec::new();
    for i in 0..3 {
        let (p, api, proxy) = start_replica(
            d,
            &format!("replica{i}"),
            &config,
            &format!("http://{one_proxy}"),
            agg_otlp,
        )
        .await;
        replicas.push((p, api, proxy));
    }
    wait_ready(&format!("http://{one_api}/readyz"), &one).await;
    wait_ready(&format!("http://{agg_api}/readyz"), &aggregator).await;
    for (p, api, _) in &replicas {
        wait_ready(&format!("http://{api}/readyz"), p).await;
        let r = get(&format!("http://{api}/api/v1/latency")).await;
        assert_eq!(r.status, 404, "a replica serves no analysis: {}", r.body);
    }

    let n = 60;
    let proxies: Vec<SocketAddr> = replicas.iter().map(|(_, _, p)| *p).collect();
    let seen = traffic(&proxies, n, 6, 16).await;
    assert_eq!(seen.len(), n);

    // Every record reaches both, and the aggregator names them as the replicas did.
    let client_ids: BTreeSet<String> = seen.iter().map(|s| s.request_id.clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (a, o) = (stored_ids(agg_api).await, stored_ids(one_api).await);
        if a == sorted(&client_ids) && o.len() == n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "aggregator has {} of the {n} records, the single proxy {}; aggregator log:\n{}",
            a.len(),
            o.len(),
            aggregator.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The same percentiles: each sketch is within 1% of the exact value of its rank, so two
    // sketches of the same values differ by at most 2%; the replicas stand one hop in front of
    // the single proxy, so their times also hold its forwarding and its jitter (a few
    // milliseconds at most on a loaded test machine).
    let mut table = String::new();
    for m in ["ttft", "itl", "e2e"] {
        let (one_l, agg_l) = (latency(one_api, m).await, latency(agg_api, m).await);
        assert_eq!(
            one_l["count"], agg_l["count"],
            "{m}: {one_l:#} vs {agg_l:#}"
        );
        for q in ["p50", "p90", "p95", "p99"] {
            let (x, y) = (one_l[q].as_f64().unwrap(), agg_l[q].as_f64().unwrap());
            // ITL gaps are differences: the hop's constant part cancels, its jitter does not
            // (the suite runs this beside other tests on two cores: a tail gap seen one hop
            // later was 1.1 ms longer once).
            let hop = if m == "itl" { 0.0015 } else { 0.005 };
            let allowed = 0.02 * x.max(y) + hop;
            table.push_str(&format!(
                "{m} {q}: one {:.2} ms, replicas→aggregator {:.2} ms\n",
                x * 1e3,
                y * 1e3
            ));
            assert!(
                (x - y).abs() <= allowed,
                "{m} {q}: one proxy {x}, replicas {y} (allowed ±{allowed})\n{table}"
            );
        }
    }
    println!("{table}");

    // Tokens and tenants: the replicas share the salt, so one API key is one tenant.
    let tenants = |api: SocketAddr| async move {
        let v = get(&format!(
            "http://{api}/api/v1/latency?model={MODEL}&metric=e2e&window=5m&by=tenant"
        ))
        .await
        .json();
        v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["summary"]["count"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(tenants(agg_api).await, vec![20, 20, 20]);

    // The same alert on both.
    let firing = |api: SocketAddr| async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let names: BTreeSet<String> = alerts(api)
                .await
                .iter()
                .filter(|a| a["state"] == "firing")
                .filter_map(|a| a["rule"].as_str().map(String::from))
                .collect();
            if names.contains("absolute_latency") || Instant::now() > deadline {
                return names;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let (one_alerts, agg_alerts) = (firing(one_api).await, firing(agg_api).await);
    assert!(
        one_alerts.contains("absolute_latency"),
        "single proxy: {one_alerts:?}"
    );
    assert!(
        agg_alerts.contains("absolute_latency"),
        "aggregator: {agg_alerts:?}"
    );

    for (mut p, api, _) in replicas {
        let m = get(&format!("http://{api}/metrics")).await.body;
        assert_eq!(
            metric(&m, "tokenwatch_ship_dropped_total{reason=\"queue_full\"}"),
            0.0
        );
        assert!(p.terminate().success(), "{}", p.log_tail(20));
    }
    let (mut one, mut aggregator) = (one, aggregator);
    assert!(one.terminate().success());
    assert!(aggregator.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_fails_open_while_its_aggregator_is_killed_and_delivers_after() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(d, &["--ttft-ms", "40", "--itl-ms", "10"]).await;
    // The aggregator is killed and comes back on the same ports.
    let (agg_api, agg_otlp) = (free_addr(), free_addr());
    let config = write_config(
        d,
        &format!(
            "proxy:\n  tenant_salt: {SALT}\naggregator:\n  endpoint: http://{agg_otlp}\n  timeout: 1s\n  buffer: {{flush_interval: 50ms}}\n  retry: {{max_backoff: 300ms}}\n"
        ),
    );
    let (mut aggregator, _) = start_aggregator(d, &config, agg_api, agg_otlp).await;
    let (replica, api, proxy) =
        start_replica(d, "replica", &config, &format!("http://{sim}"), agg_otlp).await;
    wait_ready(&format!("http://{agg_api}/readyz"), &aggregator).await;
    wait_ready(&format!("http://{api}/readyz"), &replica).await;

    // Phase 1, aggregator up: every record stored.
    let (n, workers, tokens) = (24, 4, 20);
    let up = traffic(&[proxy], n, workers, tokens).await;
    let mut ids: BTreeSet<String> = up.iter().map(|s| s.request_id.clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    while stored_ids(agg_api).await != sorted(&ids) {
        assert!(Instant::now() < deadline, "{}", aggregator.log_tail(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Phase 2, aggregator killed: every stream completes, as fast as before.
    aggregator.kill9();
    let down = traffic(&[proxy], n, workers, tokens).await;
    let m = get(&format!("http://{api}/metrics")).await.body;
    let buffered = metric(&m, "tokenwatch_ship_buffered_records");
    assert!(
        metric(&m, "tokenwatch_ship_failures_total") >= 1.0,
        "sends to the dead aggregator fail: {m}"
    );
    assert!(
        buffered + 512.0 >= n as f64 && buffered <= n as f64,
        "the replica buffers the records ({buffered})"
    );
    println!("{}", assert_fails_open(&up, &down, "killed"));

    // The aggregator returns (same ports, same data): the buffer arrives, nothing lost.
    let (aggregator, _) = start_aggregator(d, &config, agg_api, agg_otlp).await;
    wait_ready(&format!("http://{agg_api}/readyz"), &aggregator).await;
    ids.extend(down.iter().map(|s| s.request_id.clone()));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stored = stored_ids(agg_api).await;
        if stored == sorted(&ids) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} records at the aggregator; replica log:\n{}",
            stored.len(),
            ids.len(),
            replica.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let m = get(&format!("http://{api}/metrics")).await.body;
    for reason in ["queue_full", "rejected", "shutdown"] {
        let series = format!("tokenwatch_ship_dropped_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&m, &series), 0.0, "{series}");
    }
    assert_eq!(metric(&m, "tokenwatch_ship_buffered_records"), 0.0);
    assert!(metric(&m, "tokenwatch_ship_spans_total") >= (2 * n) as f64);
    let (mut replica, mut aggregator) = (replica, aggregator);
    assert!(replica.terminate().success());
    assert!(aggregator.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_counts_exactly_what_a_full_buffer_drops() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(d, &["--ttft-ms", "5", "--itl-ms", "2"]).await;
    // Nothing listens on the aggregator's address: every record waits, the buffer holds 5.
    let nowhere = free_addr();
    let config = write_config(
        d,
        &format!(
            "proxy:\n  tenant_salt: {SALT}\naggregator:\n  endpoint: http://{nowhere}\n  buffer: {{capacity: 5, max_batch: 2, flush_interval: 10ms}}\n"
        ),
    );
    let (replica, api, proxy) =
        start_replica(d, "replica", &config, &format!("http://{sim}"), nowhere).await;
    wait_ready(&format!("http://{api}/readyz"), &replica).await;
    let n = 20;
    let seen = traffic(&[proxy], n, 2, 4).await;
    assert_eq!(seen.len(), n);
    // Each record is in the buffer (5), in the batch being retried (1 or 2: the sender took
    // it when the first records came), or dropped — and counted.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = get(&format!("http://{api}/metrics")).await.body;
        let dropped = metric(&m, "tokenwatch_ship_dropped_total{reason=\"queue_full\"}");
        let buffered = metric(&m, "tokenwatch_ship_buffered_records");
        if buffered == 5.0 && dropped + buffered >= (n - 2) as f64 {
            assert!(
                [(n - 7) as f64, (n - 6) as f64].contains(&dropped),
                "dropped {dropped} of {n}:\n{m}"
            );
            assert_eq!(metric(&m, "tokenwatch_ship_spans_total"), 0.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dropped {dropped}, buffered {buffered}:\n{}",
            replica.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut replica = replica;
    assert!(replica.terminate().success());
    let log = replica.log();
    assert!(log.contains("dropped at shutdown"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_fails_open_while_its_aggregator_is_stalled_and_each_record_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(d, &["--ttft-ms", "40", "--itl-ms", "10"]).await;
    let agg_otlp = free_addr();
    // Attempts time out after 300 ms: a stalled aggregator receives each batch several times.
    let config = write_config(
        d,
        &format!(
            "proxy:\n  tenant_salt: {SALT}\naggregator:\n  endpoint: http://{agg_otlp}\n  timeout: 300ms\n  buffer: {{flush_interval: 50ms}}\n  retry: {{min_backoff: 50ms, max_backoff: 200ms}}\n"
        ),
    );
    let (aggregator, agg_api) = start_aggregator(d, &config, any_addr(), agg_otlp).await;
    let (replica, api, proxy) =
        start_replica(d, "replica", &config, &format!("http://{sim}"), agg_otlp).await;
    wait_ready(&format!("http://{agg_api}/readyz"), &aggregator).await;
    wait_ready(&format!("http://{api}/readyz"), &replica).await;

    let (n, workers, tokens) = (16, 4, 20);
    let up = traffic(&[proxy], n, workers, tokens).await;
    let mut ids: BTreeSet<String> = up.iter().map(|s| s.request_id.clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    while stored_ids(agg_api).await != sorted(&ids) {
        assert!(Instant::now() < deadline, "{}", aggregator.log_tail(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Stalled (SIGSTOP): it accepts connections but answers nothing.
    let signal = |sig: &str| {
        let pid = aggregator.child.id().to_string();
        assert!(
            std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP");
    let stalled = traffic(&[proxy], n, workers, tokens).await;
    // Attempts time out (300 ms each) while it is stalled: wait for two to be counted.
    let failures = wait_metric_sum(
        &format!("http://{api}/metrics"),
        "tokenwatch_ship_failures_total",
        15,
        &replica,
        |f| f >= 2.0,
    )
    .await;
    signal("-CONT");
    println!("{}", assert_fails_open(&up, &stalled, "stalled"));

    // Resumed: it reads every attempt it was sent; each record is stored once.
    ids.extend(stalled.iter().map(|s| s.request_id.clone()));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stored = stored_ids(agg_api).await;
        if stored == sorted(&ids) {
            break;
        }
        assert!(
            Instant::now() < deadline && stored.len() <= ids.len(),
            "stored {} for {} requests (a duplicate?); replica log:\n{}",
            stored.len(),
            ids.len(),
            replica.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Long enough for a late copy to have been stored, were it not dropped.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(stored_ids(agg_api).await, sorted(&ids));
    let am = get(&format!("http://{agg_api}/metrics")).await.body;
    println!(
        "attempts failed while stalled: {failures}; duplicates dropped by the aggregator: {}",
        metric(&am, "tokenwatch_otlp_shipped_duplicates_total")
    );
    let (mut replica, mut aggregator) = (replica, aggregator);
    assert!(replica.terminate().success());
    assert!(aggregator.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_ships_over_grpc_and_sends_what_it_holds_when_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(d, &["--ttft-ms", "20", "--itl-ms", "5"]).await;
    let agg_grpc = free_addr();
    // A long flush interval: the records are still buffered when the replica is stopped.
    let config = write_config(
        d,
        &format!(
            "proxy:\n  tenant_salt: {SALT}\naggregator:\n  endpoint: http://{agg_grpc}\n  protocol: grpc\n  buffer: {{flush_interval: 1m}}\nshutdown:\n  delay: 0s\n"
        ),
    );
    let (aggregator, agg_api) =
        start_aggregator_on(d, &config, any_addr(), any_addr(), agg_grpc).await;
    let (replica, api, proxy) =
        start_replica(d, "replica", &config, &format!("http://{sim}"), agg_grpc).await;
    wait_ready(&format!("http://{agg_api}/readyz"), &aggregator).await;
    wait_ready(&format!("http://{api}/readyz"), &replica).await;
    let seen = traffic(&[proxy], 12, 3, 10).await;
    let ids: BTreeSet<String> = seen.iter().map(|s| s.request_id.clone()).collect();
    let m = get(&format!("http://{api}/metrics")).await.body;
    assert_eq!(
        metric(&m, "tokenwatch_ship_spans_total"),
        0.0,
        "still buffered"
    );
    let mut replica = replica;
    assert!(replica.terminate().success(), "{}", replica.log_tail(20));
    let deadline = Instant::now() + Duration::from_secs(10);
    while stored_ids(agg_api).await != sorted(&ids) {
        assert!(
            Instant::now() < deadline,
            "the records buffered at shutdown never arrived; replica log:\n{}",
            replica.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut aggregator = aggregator;
    assert!(aggregator.terminate().success());
}

/// Streams from `workers` clients through `proxy`, back to back, until `stop`.
fn steady_load(
    proxy: SocketAddr,
    workers: usize,
    tokens: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<(Instant, Seen)>>> {
    (0..workers)
        .map(|w| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut i = w;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = Instant::now();
                    seen.push((started, stream(proxy, tokens, i).await));
                    i += workers;
                }
                seen
            })
        })
        .collect()
}

/// The target, as a benchmark (not part of the test command: `cargo test --test
/// proxy_roles -- --ignored`): a replica under continuous streaming load; the aggregator killed
/// (kill -9) for `TOKENWATCH_BENCH_OUTAGE_S` seconds (default 30), then started again. Prints
/// the client-side TTFT and time per chunk with the aggregator up, away and back, and checks
/// that every stream completed and every record arrived once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: about a minute and a half"]
async fn benchmark_aggregator_killed_under_load() {
    let outage: u64 = std::env::var("TOKENWATCH_BENCH_OUTAGE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(d, &["--ttft-ms", "40", "--itl-ms", "10"]).await;
    // The aggregator is killed and comes back on the same ports.
    let (agg_api, agg_otlp) = (free_addr(), free_addr());
    let config = write_config(
        d,
        &format!("proxy:\n  tenant_salt: {SALT}\naggregator:\n  endpoint: http://{agg_otlp}\n"),
    );
    let (mut aggregator, _) = start_aggregator(d, &config, agg_api, agg_otlp).await;
    let (replica, api, proxy) =
        start_replica(d, "replica", &config, &format!("http://{sim}"), agg_otlp).await;
    wait_ready(&format!("http://{agg_api}/readyz"), &aggregator).await;
    wait_ready(&format!("http://{api}/readyz"), &replica).await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t0 = Instant::now();
    let load = steady_load(proxy, 8, 30, stop.clone());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let killed_at = t0.elapsed();
    aggregator.kill9();
    tokio::time::sleep(Duration::from_secs(outage)).await;
    let mut m = get(&format!("http://{api}/metrics")).await.body;
    let buffered_at_return = metric(&m, "tokenwatch_ship_buffered_records");
    let back_at = t0.elapsed();
    let (aggregator, _) = start_aggregator(d, &config, agg_api, agg_otlp).await;
    wait_ready(&format!("http://{agg_api}/readyz"), &aggregator).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut all = Vec::new();
    for t in load {
        all.extend(t.await.unwrap());
    }
    let ids: BTreeSet<String> = all.iter().map(|(_, s)| s.request_id.clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let stored = loop {
        let stored = stored_ids(agg_api).await;
        if stored.len() >= ids.len() || Instant::now() > deadline {
            break stored;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    m = get(&format!("http://{api}/metrics")).await.body;
    let phase = |from: Duration, to: Duration| -> Vec<&Seen> {
        all.iter()
            .filter(|(at, _)| (from..to).contains(&at.duration_since(t0)))
            .map(|(_, s)| s)
            .collect()
    };
    let describe = |name: &str, v: Vec<&Seen>| {
        let ttft: Vec<Duration> = v.iter().map(|s| s.ttft).collect();
        let per: Vec<Duration> = v.iter().map(|s| s.per_chunk()).collect();
        format!(
            "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            v.len(),
            quantile(ttft.clone(), 0.5).as_secs_f64() * 1e3,
            quantile(ttft.clone(), 0.99).as_secs_f64() * 1e3,
            ttft.iter().max().unwrap().as_secs_f64() * 1e3,
            quantile(per.clone(), 0.5).as_secs_f64() * 1e3,
            quantile(per, 0.99).as_secs_f64() * 1e3,
        )
    };
    println!(
        "| phase | streams | TTFT p50 ms | TTFT p99 ms | TTFT max ms | per chunk p50 ms | per chunk p99 ms |\n|---|---|---|---|---|---|---|"
    );
    println!(
        "{}",
        describe("aggregator up", phase(Duration::ZERO, killed_at))
    );
    println!(
        "{}",
        describe("aggregator killed", phase(killed_at, back_at))
    );
    println!(
        "{}",
        describe("aggregator back", phase(back_at, Duration::MAX))
    );
    println!(
        "streams {} (all complete); records stored {} (distinct {}); buffered when it returned {buffered_at_return}; shipped {}; dropped {}/{}/{} (queue_full/rejected/shutdown); failed attempts {}",
        ids.len(),
        stored.len(),
        stored.iter().collect::<BTreeSet<_>>().len(),
        metric(&m, "tokenwatch_ship_spans_total"),
        metric(&m, "tokenwatch_ship_dropped_total{reason=\"queue_full\"}"),
        metric(&m, "tokenwatch_ship_dropped_total{reason=\"rejected\"}"),
        metric(&m, "tokenwatch_ship_dropped_total{reason=\"shutdown\"}"),
        metric(&m, "tokenwatch_ship_failures_total"),
    );
    // Records the aggregator had accepted but not yet written when it was killed are lost
    // with it (the replica cannot know); every other one arrives, once.
    let lost = ids.len() - stored.len().min(ids.len());
    println!("lost with the killed aggregator: {lost}");
    assert_eq!(stored.len(), stored.iter().collect::<BTreeSet<_>>().len());
    let (mut replica, mut aggregator) = (replica, aggregator);
    assert!(replica.terminate().success());
    assert!(aggregator.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_ships_with_its_ingest_token_to_an_aggregator_with_tokens_on() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(d, &["--ttft-ms", "10", "--itl-ms", "2"]).await;
    let (ingest, read) = (
        "0123456789abcdef0123456789abcdef",
        "fedcba9876543210fedcba9876543210",
    );
    let tokens = d.join("tokens");
    std::fs::write(
        &tokens,
        format!("ingest {ingest} proxies\nread {read} reader\n"),
    )
    .unwrap();
    let agg_otlp = free_addr();
    let agg_config = d.join("aggregator.yaml");
    std::fs::write(
        &agg_config,
        format!("auth:\n  tokens_file: {}\n", tokens.display()),
    )
    .unwrap();
    let replica_config = |token: &str| {
        let path = d.join(format!("replica-{}.yaml", &token[..4]));
        std::fs::write(
            &path,
            format!(
                "proxy:\n  tenant_salt: {SALT}\naggregator:\n  endpoint: http://{agg_otlp}\n  headers: {{Authorization: 'Bearer {token}'}}\n  buffer: {{flush_interval: 50ms}}\n"
            ),
        )
        .unwrap();
        path
    };
    let (aggregator, agg_api) = start_aggregator(d, &agg_config, any_addr(), agg_otlp).await;
    let (good, good_api, good_proxy) = start_replica(
        d,
        "replica-ingest",
        &replica_config(ingest),
        &format!("http://{sim}"),
        agg_otlp,
    )
    .await;
    // A read token may not ingest: that replica's records are refused, and counted.
    let (bad, bad_api, bad_proxy) = start_replica(
        d,
        "replica-read",
        &replica_config(read),
        &format!("http://{sim}"),
        agg_otlp,
    )
    .await;
    wait_ready(&format!("http://{agg_api}/readyz"), &aggregator).await;
    wait_ready(&format!("http://{good_api}/readyz"), &good).await;
    wait_ready(&format!("http://{bad_api}/readyz"), &bad).await;
    let shipped = traffic(&[good_proxy], 6, 2, 4).await;
    let refused = traffic(&[bad_proxy], 4, 2, 4).await;
    assert_eq!(
        refused.len(),
        4,
        "a refused record never touches the client"
    );
    let ids: BTreeSet<String> = shipped.iter().map(|s| s.request_id.clone()).collect();
    let auth = format!("Bearer {read}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = send(
            "GET",
            &format!("http://{agg_api}/api/v1/requests?model={MODEL}&limit=100"),
            None,
            &[("authorization", &auth)],
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        let mut stored: Vec<String> = r.json()["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["request_id"].as_str().unwrap().to_string())
            .collect();
        stored.sort();
        let m = get(&format!("http://{bad_api}/metrics")).await.body;
        let rejected = metric(&m, "tokenwatch_ship_dropped_total{reason=\"rejected\"}");
        if stored == sorted(&ids) && rejected == 4.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stored {stored:?}, refused {rejected}; aggregator log:\n{}",
            aggregator.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (mut good, mut bad, mut aggregator) = (good, bad, aggregator);
    assert!(good.terminate().success());
    assert!(bad.terminate().success());
    assert!(aggregator.terminate().success());
}
