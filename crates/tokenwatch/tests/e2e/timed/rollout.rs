// Zero-downtime rollout end to end (issue 28, item 4): a real load balancer (Debian's HAProxy)
// in front of two `role: proxy` replicas that ship to one `role: aggregator`, the simulator as
// their upstream. Long streams flow through HAProxy the whole time while each replica in turn
// gets SIGTERM, drains and is started again on the same ports — what a Kubernetes RollingUpdate
// with readiness on /readyz does. HAProxy health-checks /readyz (503 once draining begins), so
// it stops sending before the replica stops accepting. Every client stream must complete whole
// and the aggregator must hold every stream's record, once.

use crate::common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const MODEL: &str = "sim-llama-8b";
const SALT: &str = "replicas-share-this-salt";
/// The header HAProxy adds to each answer: the name of the replica that served it.
const SERVED_BY: &str = "x-served-by";

/// Debian's `haproxy` (scripts/test.sh installs it); the test fails without it.
fn haproxy_bin() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("haproxy"))
            .find(|p| p.exists())
    });
    on_path
        .or_else(|| Some(PathBuf::from("/usr/sbin/haproxy")).filter(|p| p.exists()))
        .expect("haproxy is not installed — run the README's test command (scripts/test.sh), which installs Debian's `haproxy` package")
}

/// A running HAProxy (foreground, `-db`), killed when dropped.
struct HaProxy {
    child: Child,
    log: PathBuf,
    frontend: SocketAddr,
    stats: SocketAddr,
}

impl HaProxy {
    /// HAProxy balancing `frontend` over `servers` (name, proxy address, API address): each
    /// server health-checked on its API port's /readyz every 200 ms, out after one failed
    /// check, back after two good ones; connect failures retried on the other server
    /// (`option redispatch`); timeouts far above one stream's gaps.
    fn start(dir: &Path, servers: &[(String, SocketAddr, SocketAddr)]) -> HaProxy {
        // HAProxy cannot report a port it picked: its listeners are chosen here.
        let (frontend, stats) = (free_addr(), free_addr());
        let mut cfg = format!(
            "global\n  maxconn 2000\n\
             defaults\n  mode http\n  timeout connect 1s\n  timeout client 10m\n  timeout server 10m\n  \
             timeout check 1s\n  retries 3\n  option redispatch\n\
             frontend llm\n  bind {frontend}\n  default_backend replicas\n\
             backend replicas\n  balance leastconn\n  option httpchk\n  http-check send meth GET uri /readyz\n  \
             http-check expect status 200\n  default-server inter 200ms fall 1 rise 2\n  \
             http-response set-header {SERVED_BY} %s\n"
        );
        for (name, proxy, api) in servers {
            cfg.push_str(&format!(
                "  server {name} {proxy} check port {}\n",
                api.port()
            ));
        }
        cfg.push_str(&format!(
            "listen stats\n  bind {stats}\n  stats enable\n  stats uri /stats\n"
        ));
        let file = dir.join("haproxy.cfg");
        std::fs::write(&file, &cfg).unwrap();
        let bin = haproxy_bin();
        let check = Command::new(&bin)
            .arg("-c")
            .arg("-f")
            .arg(&file)
            .output()
            .expect("haproxy -c");
        assert!(
            check.status.success(),
            "haproxy refused its configuration:\n{}{}\n{cfg}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let log = dir.join("haproxy.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&bin)
            .arg("-db")
            .arg("-f")
            .arg(&file)
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("starting haproxy");
        HaProxy {
            child,
            log,
            frontend,
            stats,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// HAProxy's statistics (`/stats;csv`): each row (`pxname/svname`) as column → value.
    async fn stats(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        self.try_stats()
            .await
            .unwrap_or_else(|e| panic!("HAProxy stats: {e}\n{}", self.log()))
    }

    async fn try_stats(&self) -> Result<BTreeMap<String, BTreeMap<String, String>>, String> {
        let r = send(
            "GET",
            &format!("http://{}/stats;csv", self.stats),
            None,
            &[],
        )
        .await?;
        let mut lines = r.body.lines();
        let header: Vec<String> = lines
            .next()
            .unwrap_or("")
            .trim_start_matches("# ")
            .split(',')
            .map(String::from)
            .collect();
        Ok(lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let row: BTreeMap<String, String> = header
                    .iter()
                    .cloned()
                    .zip(l.split(',').map(String::from))
                    .collect();
                (format!("{}/{}", row["pxname"], row["svname"]), row)
            })
            .collect())
    }

    /// Waits until HAProxy's health checks put `server` in `state` (`UP`, `DOWN`); returns how
    /// long that took, or fails after `within`.
    async fn wait_state(&self, server: &str, state: &str, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            // HAProxy may still be starting: no answer counts as no state yet.
            let now = match self.try_stats().await {
                Ok(s) => s
                    .get(&format!("replicas/{server}"))
                    .map(|r| r["status"].clone())
                    .unwrap_or_default(),
                Err(e) => e,
            };
            if now == state {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "HAProxy never saw {server} {state} within {within:?} (it says {now:?}); log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn s(a: impl ToString) -> String {
    a.to_string()
}

/// `tokenwatch run` named `name`, data in `dir/name`, with `args`.
fn run(dir: &Path, name: &str, args: &[String]) -> Proc {
    let data = dir.join(name).to_string_lossy().into_owned();
    let mut all: Vec<&str> = vec!["run", "--data-dir", &data];
    all.extend(args.iter().map(String::as_str));
    Proc::start(name, &all, dir)
}

/// A proxy replica: its ports and arguments stay the same across restarts.
struct Replica {
    name: String,
    api: SocketAddr,
    proxy: SocketAddr,
    args: Vec<String>,
    proc_: Proc,
}

impl Replica {
    fn start(
        dir: &Path,
        name: &str,
        config: &Path,
        upstream: SocketAddr,
        otlp: SocketAddr,
    ) -> Self {
        // Fixed ports: HAProxy's configuration names them, and each replica is started again
        // on the same ones.
        let (api, proxy) = (free_addr(), free_addr());
        let args = vec![
            s("-c"),
            s(config.display()),
            s("--role"),
            s("proxy"),
            s("--listen"),
            s(api),
            s("--proxy-listen"),
            s(proxy),
            s("--upstream"),
            format!("http://{upstream}"),
            s("--upstream-runtime"),
            s("sim"),
            s("--aggregator"),
            format!("http://{otlp}"),
        ];
        let proc_ = run(dir, name, &args);
        Replica {
            name: name.into(),
            api,
            proxy,
            args,
            proc_,
        }
    }
}

/// What a client saw of one stream.
struct Seen {
    started: Instant,
    ended: Instant,
    /// The request id (`x-request-id`) and the replica that served it (HAProxy's header).
    request_id: String,
    replica: String,
    ttft: Duration,
}

/// One streamed chat completion of exactly `tokens` tokens (the simulator's `length_blowup`
/// fault lifts every answer to the request's max_tokens) through `lb`: whole means 200,
/// content, a finish reason, the usage event counting every token, and `[DONE]`; anything else
/// is the error returned.
async fn stream(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
    lb: SocketAddr,
    tokens: u32,
    i: usize,
) -> Result<Seen, String> {
    use http_body_util::BodyExt;
    let body = serde_json::json!({
        "model": MODEL,
        "stream": true,
        "max_tokens": tokens,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": format!("long request {i}")}],
    })
    .to_string();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{lb}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer sk-client-{}", i % 4))
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let started = Instant::now();
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("stream {i}: no answer: {e}"))?;
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (request_id, replica) = (header("x-request-id"), header(SERVED_BY));
    let status = resp.status();
    let mut body = resp.into_body();
    let (mut text, mut ttft) = (String::new(), None);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            format!(
                "stream {i} via {replica}: cut after {} bytes: {e}",
                text.len()
            )
        })?;
        if let Some(data) = frame.data_ref() {
            text.push_str(&String::from_utf8_lossy(data));
            if ttft.is_none() && text.contains("\"content\"") {
                ttft = Some(started.elapsed());
            }
        }
    }
    let ended = Instant::now();
    if status != 200 {
        return Err(format!("stream {i} via {replica:?}: HTTP {status}: {text}"));
    }
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    // Token events: every delta with content but the role preamble (a token's text may be
    // empty, as vLLM sends some).
    let content = events
        .iter()
        .filter(|v| {
            let delta = &v["choices"][0]["delta"];
            delta["content"].is_string() && delta.get("role").is_none()
        })
        .count();
    let finished = events
        .iter()
        .any(|v| v["choices"][0]["finish_reason"].is_string());
    // The final usage event counts the tokens the server produced (a late decode step can
    // carry several in one chunk, so chunks are not tokens).
    let produced = events
        .iter()
        .find_map(|v| v["usage"]["completion_tokens"].as_u64())
        .unwrap_or(0);
    let whole = text.trim_end().ends_with("data: [DONE]")
        && content > 0
        && produced == u64::from(tokens)
        && finished;
    if !whole {
        return Err(format!(
            "stream {i} via {replica}: truncated: {content} content chunks, usage {produced} of {tokens} tokens, finish reason {finished}, last bytes {:?}",
            &text[text.len().saturating_sub(120)..]
        ));
    }
    if request_id.is_empty() || replica.is_empty() {
        return Err(format!(
            "stream {i}: no x-request-id ({request_id:?}) or {SERVED_BY} ({replica:?})"
        ));
    }
    Ok(Seen {
        started,
        ended,
        request_id,
        replica,
        ttft: ttft.unwrap_or(ended - started),
    })
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

fn quantile(mut v: Vec<Duration>, q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// What one rolling restart of a replica looked like.
struct Restart {
    replica: String,
    term_at: Instant,
    /// SIGTERM → HAProxy marks it DOWN; → the process exited (drain done); → UP again.
    out_of_rotation: Duration,
    exited: Duration,
    back_in_rotation: Duration,
}

struct Outcome {
    streams: Vec<Seen>,
    restarts: Vec<Restart>,
    stored: usize,
    report: String,
}

/// The whole scenario: `workers` clients streaming `tokens`-token answers (50 ms apart) back to
/// back through HAProxy, each replica restarted in turn under that load; asserts 0 failed or
/// truncated streams and every record at the aggregator once, and returns the counts.
async fn rolling_restart_under_load(tokens: u32, workers: usize) -> Outcome {
    let itl_ms = 50u64;
    let stream_len = Duration::from_millis(itl_ms * u64::from(tokens));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_sim, sim) = start_sim(
        d,
        &[
            "--ttft-ms",
            "50",
            "--itl-ms",
            &itl_ms.to_string(),
            "--batch-slowdown",
            "0",
            "--fault",
            "length_blowup:factor=100",
        ],
    )
    .await;
    // The aggregator's OTLP address is in the replicas' configuration: chosen before they start.
    let agg_otlp = free_addr();
    let drain_timeout = stream_len * 2 + Duration::from_secs(30);
    let config = write_config(
        d,
        &format!(
            "proxy:\n  tenant_salt: {SALT}\naggregator:\n  endpoint: http://{agg_otlp}\n  buffer: {{flush_interval: 100ms}}\n  retry: {{max_backoff: 500ms}}\nshutdown:\n  delay: 2s\n  drain_timeout: {}s\n",
            drain_timeout.as_secs()
        ),
    );
    let aggregator = run(
        d,
        "aggregator",
        &[
            s("-c"),
            s(config.display()),
            s("--role"),
            s("aggregator"),
            s("--listen"),
            s(ANY),
            s("--otlp-http-listen"),
            s(agg_otlp),
            s("--otlp-grpc-listen"),
            s(ANY),
        ],
    );
    let agg_api = aggregator.listening().await["api"];
    let mut replicas: Vec<Replica> = ["a", "b"]
        .iter()
        .map(|n| Replica::start(d, &format!("replica-{n}"), &config, sim, agg_otlp))
        .collect();
    wait_ready(&format!("http://{agg_api}/readyz"), &aggregator).await;
    for r in &replicas {
        wait_ready(&format!("http://{}/readyz", r.api), &r.proc_).await;
    }
    let lb = HaProxy::start(
        d,
        &replicas
            .iter()
            .map(|r| (r.name.clone(), r.proxy, r.api))
            .collect::<Vec<_>>(),
    );
    for r in &replicas {
        lb.wait_state(&r.name, "UP", Duration::from_secs(10)).await;
    }

    // Load: `workers` clients, started a stream's length apart in all, so that streams are
    // mid-way on both replicas at any moment.
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let load: Vec<_> = (0..workers)
        .map(|w| {
            let stop = stop.clone();
            let frontend = lb.frontend;
            let offset = stream_len * w as u32 / workers as u32;
            tokio::spawn(async move {
                tokio::time::sleep(offset).await;
                let c = client();
                let mut out = Vec::new();
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    out.push(stream(&c, frontend, tokens, i).await);
                    i += workers;
                }
                out
            })
        })
        .collect();
    tokio::time::sleep(stream_len + Duration::from_secs(2)).await;

    // The rollout: one replica at a time, the next once HAProxy has the restarted one back.
    let mut restarts = Vec::new();
    for r in &mut replicas {
        let term_at = Instant::now();
        r.proc_.send_term();
        let out_of_rotation = lb.wait_state(&r.name, "DOWN", Duration::from_secs(2)).await;
        let status = r.proc_.wait_exit(drain_timeout + Duration::from_secs(15));
        let exited = term_at.elapsed();
        assert!(status.success(), "{} exited {status}", r.name);
        let log = r.proc_.log();
        assert!(
            !log.contains("cutting"),
            "{} cut streams while draining:\n{log}",
            r.name
        );
        r.proc_ = run(d, &r.name, &r.args);
        wait_ready(&format!("http://{}/readyz", r.api), &r.proc_).await;
        lb.wait_state(&r.name, "UP", Duration::from_secs(10)).await;
        restarts.push(Restart {
            replica: r.name.clone(),
            term_at,
            out_of_rotation,
            exited,
            back_in_rotation: term_at.elapsed(),
        });
    }
    // Streams on the restarted replicas, then the load ends (each client finishes its stream).
    tokio::time::sleep(stream_len + Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut results = Vec::new();
    for t in load {
        results.extend(t.await.unwrap());
    }
    let duration = t0.elapsed();
    let (streams, failures): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
    let streams: Vec<Seen> = streams.into_iter().filter_map(Result::ok).collect();
    let failures: Vec<String> = failures.into_iter().filter_map(Result::err).collect();
    assert!(
        failures.is_empty(),
        "{} of {} streams failed or were cut:\n{}\nHAProxy log:\n{}",
        failures.len(),
        failures.len() + streams.len(),
        failures.join("\n"),
        lb.log()
    );

    // Each restart drained streams that were in flight on that replica, and each replica
    // served streams again once back.
    let mut report = String::new();
    for (k, r) in restarts.iter().enumerate() {
        let drained = streams
            .iter()
            .filter(|s| s.replica == r.replica && s.started < r.term_at && s.ended > r.term_at)
            .count();
        let after_term = streams
            .iter()
            .filter(|s| s.replica == r.replica && s.started > r.term_at)
            .filter(|s| s.started < r.term_at + r.exited)
            .count();
        let back_at = r.term_at + r.back_in_rotation;
        let served_after = streams
            .iter()
            .filter(|s| s.replica == r.replica && s.started > back_at)
            .count();
        let other_during = streams
            .iter()
            .filter(|s| s.replica != r.replica)
            .filter(|s| s.started > r.term_at && s.started < back_at)
            .count();
        assert!(
            drained > 0,
            "no stream was in flight on {} at SIGTERM",
            r.replica
        );
        assert!(served_after > 0, "{} served nothing once back", r.replica);
        report.push_str(&format!(
            "restart {}: {}: out of HAProxy's rotation {:.0} ms after SIGTERM; {drained} streams in flight at SIGTERM drained to their end; {after_term} started on it during shutdown.delay; exited {:.1} s after SIGTERM; back in rotation at {:.1} s; meanwhile {other_during} streams started on the other replica; {served_after} served by it afterwards\n",
            k + 1,
            r.replica,
            r.out_of_rotation.as_secs_f64() * 1e3,
            r.exited.as_secs_f64(),
            r.back_in_rotation.as_secs_f64(),
        ));
    }

    // Every stream's record at the aggregator, once.
    let ids: BTreeSet<String> = streams.iter().map(|s| s.request_id.clone()).collect();
    assert_eq!(ids.len(), streams.len(), "request ids are unique");
    let want: Vec<String> = ids.iter().cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let stored = loop {
        let stored = stored_ids(agg_api).await;
        if stored == want {
            break stored;
        }
        if Instant::now() > deadline {
            let have: BTreeSet<&String> = stored.iter().collect();
            let missing = want.iter().filter(|i| !have.contains(i)).count();
            panic!(
                "the aggregator holds {} records for {} streams ({missing} missing, {} duplicates); replica logs:\n{}",
                stored.len(),
                want.len(),
                stored.len() - have.len(),
                replicas
                    .iter()
                    .map(|r| r.proc_.log_tail(20))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let st = lb.stats().await;
    let backend = &st["replicas/BACKEND"];
    let col = |k: &str| backend.get(k).cloned().unwrap_or_default();
    // Client-side times by when each stream started: before the first SIGTERM (the
    // baseline), while a replica was out, and after the rollout.
    let first_term = restarts[0].term_at;
    let phase = |name: &str, keep: &dyn Fn(&Seen) -> bool| {
        let v: Vec<&Seen> = streams.iter().filter(|s| keep(s)).collect();
        let ttft: Vec<Duration> = v.iter().map(|s| s.ttft).collect();
        let total: Vec<Duration> = v.iter().map(|s| s.ended - s.started).collect();
        format!(
            "| {name} | {} | {:.1} | {:.1} | {:.2} | {:.2} |\n",
            v.len(),
            quantile(ttft.clone(), 0.5).as_secs_f64() * 1e3,
            quantile(ttft, 1.0).as_secs_f64() * 1e3,
            quantile(total.clone(), 0.5).as_secs_f64(),
            quantile(total, 1.0).as_secs_f64(),
        )
    };
    let during = |s: &Seen| {
        restarts
            .iter()
            .any(|r| s.started >= r.term_at && s.started <= r.term_at + r.back_in_rotation)
    };
    report.push_str(&format!(
        "{} streams of {tokens} tokens (~{:.1} s each) from {workers} clients over {:.0} s: 0 failed, 0 truncated; {} records at the aggregator for {} streams (0 lost, 0 duplicated)\n\
         HAProxy backend: retries {}, redispatches {}, connection errors {}, response errors {}, 5xx {}\n\
         | streams started | streams | TTFT p50 ms | TTFT max ms | duration p50 s | duration max s |\n|---|---|---|---|---|---|\n",
        streams.len(),
        stream_len.as_secs_f64(),
        duration.as_secs_f64(),
        stored.len(),
        streams.len(),
        col("wretr"),
        col("wredis"),
        col("econ"),
        col("eresp"),
        col("hrsp_5xx"),
    ));
    report.push_str(&phase("before the first SIGTERM", &|s| {
        s.started < first_term
    }));
    report.push_str(&phase("while a replica was out", &during));
    report.push_str(&phase("between the restarts or after", &|s| {
        s.started >= first_term && !during(s)
    }));
    assert_eq!(col("hrsp_5xx"), "0", "{report}");

    for r in &mut replicas {
        assert!(r.proc_.terminate().success(), "{}", r.proc_.log_tail(20));
    }
    let mut aggregator = aggregator;
    assert!(aggregator.terminate().success());
    drop(lb);
    Outcome {
        stored: stored.len(),
        streams,
        restarts,
        report,
    }
}

/// The test command's version: 8-second streams, six clients, both replicas restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restart_behind_haproxy_cuts_no_stream_and_loses_no_record() {
    let out = rolling_restart_under_load(160, 6).await;
    println!("{}", out.report);
    assert_eq!(out.restarts.len(), 2);
    assert_eq!(out.stored, out.streams.len());
}

/// The target as a benchmark (`cargo test -p tokenwatch --test e2e
/// rollout::benchmark -- --ignored --nocapture`): streams of `TOKENWATCH_BENCH_STREAM_S`
/// seconds (default 30) from `TOKENWATCH_BENCH_CLIENTS` clients (default 20) through HAProxy
/// while both replicas are restarted in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: about three minutes"]
async fn benchmark_rolling_restart_with_30s_streams() {
    let env = |k: &str, d: u32| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let secs = env("TOKENWATCH_BENCH_STREAM_S", 30);
    let clients = env("TOKENWATCH_BENCH_CLIENTS", 20);
    let out = rolling_restart_under_load(secs * 20, clients as usize).await;
    println!("{}", out.report);
}
