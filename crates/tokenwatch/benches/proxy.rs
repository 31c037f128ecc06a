// Proxy overhead benchmark (spec 12): one run drives the same streaming workload directly against
// an in-process vLLM-shaped upstream and through the real `tokenwatch run` proxy, and reports both.

// Run: `cargo bench -p tokenwatch --bench proxy`. Knobs (environment variables, defaults in brackets):
//   TW_BENCH_RATES [500,2000]   open loop: target streaming requests/s, one direct + one proxied run each
//   TW_BENCH_CONCURRENCY [50,200,1000]  closed loop: streams kept open at once, one direct + one proxied run each
//   TW_BENCH_CLOSED_FIRST_MS [20], TW_BENCH_CLOSED_GAP_MS [20]  closed-loop pacing (a model at 50 tokens/s)
//   TW_BENCH_CONFIG [none]      a tokenwatch.yaml passed to `tokenwatch run --config`
//   TW_BENCH_UI_POLL [1]        poll tokenwatch's API as the UI does (1/s) during every run (0 = off)
//   TW_BENCH_SECS [10]          measured seconds per run (after TW_BENCH_WARMUP_SECS [1] of warm-up)
//   TW_BENCH_CHUNKS [32]        content chunks per stream
//   TW_BENCH_FIRST_MS [2]       upstream delay before the first content chunk
//   TW_BENCH_GAP_MS [1]         upstream delay between content chunks
//   TW_BENCH_HOLD_STREAMS [1000] streams held open through the proxy for the memory measurement
//   TW_BENCH_MAX_INFLIGHT [2000] streams open at once; a send due beyond it is skipped and counted
//   TW_BENCH_CLIENT_THREADS [2], TW_BENCH_UPSTREAM_THREADS [2]  tokio workers of the load client / upstream
//                               (one thread is descheduled whenever tokenwatch runs, and its delays would be
//                               charged to the proxy: +20 ms TTFT p99 at 50 streams with 1, +0.7 ms with 2)
//   TW_BENCH_OUT [<workspace>/target/bench-proxy.md]
//   TW_BENCH_BIN [this build's tokenwatch]  the tokenwatch binary to run (an older build, for before/after)
//   TW_BENCH_PIN [none]         `bench_cpus:tokenwatch_cpus` (taskset lists, e.g. 0:1): load generator and
//                               tokenwatch on separate CPUs
//   TW_BENCH_REFERENCE [none]   `nginx`: every run's load also goes through nginx (needs `nginx` on PATH or at
//                               /usr/sbin/nginx: `apt-get install nginx-light`), the floor of any proxy hop here
//
// What is measured, all client-side: TTFT = request sent → first content-bearing chunk read; gap =
// every interval between consecutive content chunks read; delivery = upstream wrote a content chunk →
// client read it (the upstream stamps each token with its send time; client and upstream share this
// process's clock), which isolates the per-chunk cost of the hop from the upstream's timer jitter.

#[path = "proxy/closed.rs"]
mod closed;
#[path = "proxy/reference.rs"]
mod reference;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tokenwatch");
const MODEL: &str = "bench-model";
const HOLD_HEADER: &str = "x-bench-hold-ms";
/// Per-request pacing (µs before the first content chunk, between chunks), overriding the
/// upstream's TW_BENCH_FIRST_MS / TW_BENCH_GAP_MS: the closed-loop runs pace like a real model.
const FIRST_HEADER: &str = "x-bench-first-us";
const GAP_HEADER: &str = "x-bench-gap-us";
/// The pacing the client asks for now (µs; 0 = the upstream's default).
static PACE_US: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
const REQUEST_BODY: &str = r#"{"model":"bench-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":32,"messages":[{"role":"user","content":"Say something."}]}"#;

// ---------------------------------------------------------------- settings

#[derive(Clone, Debug)]
struct Settings {
    rates: Vec<u32>,
    concurrency: Vec<usize>,
    /// Pacing of the closed-loop runs: first content chunk, then one per gap.
    closed_first: Duration,
    closed_gap: Duration,
    ui_poll: bool,
    secs: f64,
    warmup_secs: f64,
    chunks: usize,
    first: Duration,
    gap: Duration,
    hold_streams: usize,
    max_inflight: usize,
    client_threads: usize,
    upstream_threads: usize,
    /// TW_BENCH_PIN=`bench_cpus:tokenwatch_cpus` (taskset lists, e.g. `0:1`): the bench's client and
    /// upstream on some CPUs, tokenwatch on others, so the added latency is the proxy's own path
    /// rather than a wait for a CPU the load generator holds (both layouts are worth a number).
    pin: Option<(String, String)>,
    /// TW_BENCH_REFERENCE=nginx: the same load through nginx after each tokenwatch run.
    reference: bool,
    out: std::path::PathBuf,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

impl Settings {
    fn from_env() -> Settings {
        let rates = std::env::var("TW_BENCH_RATES")
            .unwrap_or_else(|_| "500,2000".into())
            .split(',')
            .filter(|r| !r.trim().is_empty())
            .map(|r| {
                r.trim()
                    .parse::<u32>()
                    .unwrap_or_else(|_| panic!("TW_BENCH_RATES: {r:?} is not a number"))
            })
            .collect();
        let out = std::env::var_os("TW_BENCH_OUT")
            .map(Into::into)
            .unwrap_or_else(|| {
                let target = std::env::var_os("CARGO_TARGET_DIR")
                    .map(std::path::PathBuf::from)
                    .unwrap_or_else(|| {
                        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
                    });
                target.join("bench-proxy.md")
            });
        let concurrency = std::env::var("TW_BENCH_CONCURRENCY")
            .unwrap_or_else(|_| "50,200,1000".into())
            .split(',')
            .filter(|c| !c.trim().is_empty())
            .map(|c| {
                c.trim()
                    .parse::<usize>()
                    .unwrap_or_else(|_| panic!("TW_BENCH_CONCURRENCY: {c:?} is not a number"))
            })
            .collect();
        Settings {
            rates,
            concurrency,
            closed_first: Duration::from_micros(
                (env_or("TW_BENCH_CLOSED_FIRST_MS", 20.0) * 1000.0) as u64,
            ),
            closed_gap: Duration::from_micros(
                (env_or("TW_BENCH_CLOSED_GAP_MS", 20.0) * 1000.0) as u64,
            ),
            ui_poll: env_or("TW_BENCH_UI_POLL", 1u8) != 0,
            secs: env_or("TW_BENCH_SECS", 10.0),
            warmup_secs: env_or("TW_BENCH_WARMUP_SECS", 1.0),
            chunks: env_or("TW_BENCH_CHUNKS", 32),
            first: Duration::from_micros((env_or("TW_BENCH_FIRST_MS", 2.0) * 1000.0) as u64),
            gap: Duration::from_micros((env_or("TW_BENCH_GAP_MS", 1.0) * 1000.0) as u64),
            hold_streams: env_or("TW_BENCH_HOLD_STREAMS", 1000),
            max_inflight: env_or("TW_BENCH_MAX_INFLIGHT", 2000),
            client_threads: env_or("TW_BENCH_CLIENT_THREADS", 2),
            upstream_threads: env_or("TW_BENCH_UPSTREAM_THREADS", 2),
            pin: std::env::var("TW_BENCH_PIN")
                .ok()
                .filter(|p| !p.trim().is_empty())
                .map(|p| match p.split_once(':') {
                    Some((bench, tw)) if !bench.is_empty() && !tw.is_empty() => {
                        (bench.trim().to_string(), tw.trim().to_string())
                    }
                    _ => {
                        panic!("TW_BENCH_PIN={p:?}: expected bench_cpus:tokenwatch_cpus, e.g. 0:1")
                    }
                }),
            reference: reference::wanted(),
            out,
        }
    }
}

/// One clock for the upstream's token stamps and the client's reads (same process).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

fn runtime(threads: usize, name: &str) -> tokio::runtime::Runtime {
    let mut b = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    b.enable_all()
        .thread_name(name)
        .build()
        .expect("tokio runtime")
}

// ---------------------------------------------------------------- upstream

/// A vLLM-shaped chat-completion event stream: role-only chunk at once, `k` content chunks (the
/// first after `first`, then one every `gap`, on absolute deadlines), a finish chunk, a usage
/// chunk and `[DONE]`. Each timed chunk is its own HTTP chunk (hyper flushes when we are pending).
struct SseBody {
    id: u64,
    created: u64,
    k: usize,
    next: usize,
    t0: tokio::time::Instant,
    first: Duration,
    gap: Duration,
    hold: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl SseBody {
    fn due(&self, content_index: usize) -> tokio::time::Instant {
        let mut d = self.t0 + self.first + self.gap * content_index as u32;
        if content_index >= 1 {
            d += self.hold;
        }
        d
    }

    fn event(&self, n: usize) -> Bytes {
        let (id, created) = (self.id, self.created);
        let head = format!(
            r#"data: {{"id":"chatcmpl-{id:016x}","object":"chat.completion.chunk","created":{created},"model":"{MODEL}","#
        );
        let s = if n == 0 {
            format!(
                r#"{head}"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}}"#
            )
        } else if n <= self.k {
            let stamp = now_ns();
            format!(
                r#"{head}"choices":[{{"index":0,"delta":{{"content":"{stamp}"}},"logprobs":null,"finish_reason":null}}]}}"#
            )
        } else if n == self.k + 1 {
            format!(
                r#"{head}"choices":[{{"index":0,"delta":{{"content":""}},"logprobs":null,"finish_reason":"length","stop_reason":null}}]}}"#
            )
        } else if n == self.k + 2 {
            let k = self.k;
            format!(
                r#"{head}"choices":[],"usage":{{"prompt_tokens":12,"total_tokens":{},"completion_tokens":{k}}}}}"#,
                k + 12
            )
        } else {
            "data: [DONE]".to_string()
        };
        let mut s = s;
        s.push_str("\n\n");
        Bytes::from(s)
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.next > this.k + 3 {
            return Poll::Ready(None);
        }
        if (1..=this.k).contains(&this.next) {
            let due = this.due(this.next - 1);
            if tokio::time::Instant::now() < due {
                if this.sleep.deadline() != due {
                    this.sleep.as_mut().reset(due);
                }
                if this.sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        }
        let frame = this.event(this.next);
        this.next += 1;
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.next > self.k + 3
    }
}

#[derive(Clone)]
struct UpstreamCfg {
    k: usize,
    first: Duration,
    gap: Duration,
}

type UpBody = Either<SseBody, Full<Bytes>>;

async fn upstream_handle(
    req: Request<Incoming>,
    cfg: Arc<UpstreamCfg>,
    seq: Arc<AtomicUsize>,
) -> Result<Response<UpBody>, Infallible> {
    let ok_path = req.method() == http::Method::POST && req.uri().path() == "/v1/chat/completions";
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let hold = header(HOLD_HEADER)
        .map(Duration::from_millis)
        .unwrap_or_default();
    let first = header(FIRST_HEADER)
        .map(Duration::from_micros)
        .unwrap_or(cfg.first);
    let gap = header(GAP_HEADER)
        .map(Duration::from_micros)
        .unwrap_or(cfg.gap);
    // Read the request body so the connection stays reusable.
    let _ = req.into_body().collect().await;
    if !ok_path {
        let mut r = Response::new(Either::Right(Full::new(Bytes::from_static(
            b"{\"error\":\"not found\"}",
        ))));
        *r.status_mut() = StatusCode::NOT_FOUND;
        return Ok(r);
    }
    let t0 = tokio::time::Instant::now();
    let body = SseBody {
        id: seq.fetch_add(1, Ordering::Relaxed) as u64,
        created: 1_700_000_000,
        k: cfg.k,
        next: 0,
        t0,
        first,
        gap,
        hold,
        sleep: Box::pin(tokio::time::sleep_until(t0 + first)),
    };
    let mut r = Response::new(Either::Left(body));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    r.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    Ok(r)
}

async fn upstream_serve(listener: tokio::net::TcpListener, cfg: Arc<UpstreamCfg>) {
    let seq = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (cfg, seq) = (cfg.clone(), seq.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| upstream_handle(req, cfg.clone(), seq.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Start the upstream on its own thread and runtime; returns its address.
fn start_upstream(s: &Settings) -> SocketAddr {
    let std_listener = StdListener::bind("127.0.0.1:0").expect("bind upstream");
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let cfg = Arc::new(UpstreamCfg {
        k: s.chunks,
        first: s.first,
        gap: s.gap,
    });
    let threads = s.upstream_threads;
    std::thread::Builder::new()
        .name("bench-upstream".into())
        .spawn(move || {
            let rt = runtime(threads, "bench-upstream");
            rt.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(std_listener).expect("upstream listener");
                upstream_serve(listener, cfg).await;
            });
        })
        .unwrap();
    addr
}

// ---------------------------------------------------------------- the tokenwatch child

/// A child process (`tokenwatch run`, the reference nginx), killed (SIGKILL) and reaped when dropped,
/// panics included.
struct ChildGuard {
    child: Child,
    log: std::path::PathBuf,
}

impl ChildGuard {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> SocketAddr {
    let l = StdListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap()
}

fn start_tokenwatch(
    upstream: SocketAddr,
    data_dir: &std::path::Path,
    pin: Option<&str>,
) -> (ChildGuard, SocketAddr, SocketAddr) {
    let api = free_addr();
    let proxy = free_addr();
    let log = data_dir.join("tokenwatch.log");
    let out = std::fs::File::create(&log).expect("create log file");
    let err = out.try_clone().unwrap();
    // TW_BENCH_BIN runs another build (an older release, for a before/after comparison).
    let bin = std::env::var_os("TW_BENCH_BIN").unwrap_or_else(|| BIN.into());
    let child = pinned_command(&bin, pin)
        .args([
            "run",
            "--listen",
            &api.to_string(),
            "--proxy-listen",
            &proxy.to_string(),
            "--upstream",
            &format!("http://{upstream}"),
            "--upstream-runtime",
            "vllm",
            // Only the proxy is under test; fixed default OTLP ports would also collide with
            // other tokenwatch processes on the box.
            "--no-otlp",
            "--data-dir",
        ])
        .arg(data_dir.join("data"))
        .args(
            std::env::var_os("TW_BENCH_CONFIG")
                .map(|c| vec!["--config".into(), c])
                .unwrap_or_default(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", std::path::Path::new(&bin).display()));
    (ChildGuard { child, log }, api, proxy)
}

/// A command running `bin`, on the CPUs of `pin` (a taskset list) when set: `taskset` execs it in
/// place (same pid), and every thread or process it starts inherits the CPUs.
fn pinned_command(bin: &std::ffi::OsStr, pin: Option<&str>) -> Command {
    match pin {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpus]).arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

/// The CPUs of a taskset list such as `1` or `0-1,3` (TW_BENCH_PIN); panics on anything else.
fn cpu_list(cpus: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in cpus.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        match (lo.trim().parse::<usize>(), hi.trim().parse::<usize>()) {
            (Ok(lo), Ok(hi)) if hi >= lo => out.extend(lo..=hi),
            _ => panic!("TW_BENCH_PIN: {cpus:?} is not a CPU list"),
        }
    }
    out
}

/// Restrict this process (and every thread it starts afterwards) to the CPUs of a taskset list
/// such as `0` or `0-1,3`.
#[cfg(target_os = "linux")]
fn pin_this_process(cpus: &str) {
    let mut set = rustix::thread::CpuSet::new();
    for cpu in cpu_list(cpus) {
        set.set(cpu);
    }
    rustix::thread::sched_setaffinity(None, &set)
        .unwrap_or_else(|e| panic!("TW_BENCH_PIN: pinning the bench to {cpus}: {e}"));
}

#[cfg(not(target_os = "linux"))]
fn pin_this_process(_cpus: &str) {
    panic!("TW_BENCH_PIN is only supported on Linux");
}

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn rss_kib(pid: u32) -> u64 {
    proc_status_kib(pid, "VmRSS:").unwrap_or(0)
}

/// utime + stime of a process, in clock ticks (USER_HZ, 100 on Linux); for a numbered process, plus
/// those of its live children (nginx's workers; tokenwatch has none). `self`, the bench, counts
/// alone: its children are the proxies under test.
fn cpu_ticks(pid: &str) -> u64 {
    let children: u64 = if pid == "self" {
        0
    } else {
        child_pids(pid)
            .iter()
            .map(|c| own_cpu_ticks(&c.to_string()))
            .sum()
    };
    own_cpu_ticks(pid) + children
}

fn own_cpu_ticks(pid: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

/// The live processes whose parent is `pid`, from `/proc/<pid>/stat` (field 4, ppid).
fn child_pids(pid: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let text = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            text.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                == Some(pid)
        })
        .collect()
}

const TICKS_PER_S: f64 = 100.0;

static FIRST_CONNECT_ERROR: OnceLock<String> = OnceLock::new();

fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn open_files_limit() -> String {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .map(|l| l.split_whitespace().nth(3).unwrap_or("?").to_string())
        })
        .unwrap_or_else(|| "?".into())
}

// ---------------------------------------------------------------- client

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(300))
        .pool_max_idle_per_host(2048)
        .build(c)
}

async fn get_text(c: &HttpClient, url: &str) -> Result<(u16, String), String> {
    let req = Request::get(url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[derive(Default)]
struct StreamSample {
    ttft_ns: Option<u64>,
    gaps_ns: Vec<u64>,
    delivery_ns: Vec<u64>,
    content: usize,
    done: bool,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One streaming request; light SSE parsing: events split on a blank line, content read from
/// `"content":"<stamp>"`.
async fn one_stream(
    c: &HttpClient,
    uri: &Uri,
    hold_ms: Option<u64>,
    opened: Option<&AtomicUsize>,
) -> Result<StreamSample, &'static str> {
    let mut b = Request::post(uri.clone()).header(http::header::CONTENT_TYPE, "application/json");
    if let Some(ms) = hold_ms {
        b = b.header(HOLD_HEADER, ms.to_string());
    }
    for (name, pace) in [(FIRST_HEADER, &PACE_US[0]), (GAP_HEADER, &PACE_US[1])] {
        let us = pace.load(Ordering::Relaxed);
        if us > 0 {
            b = b.header(name, us.to_string());
        }
    }
    let req = b
        .body(Full::new(Bytes::from_static(REQUEST_BODY.as_bytes())))
        .map_err(|_| "build")?;
    let t0 = Instant::now();
    let resp = match tokio::time::timeout(Duration::from_secs(30), c.request(req)).await {
        Err(_) => return Err("timeout (headers)"),
        Ok(Err(e)) if e.is_connect() => {
            let _ = FIRST_CONNECT_ERROR.set(format!("{e:?}"));
            return Err("connect");
        }
        Ok(Err(_)) => return Err("request"),
        Ok(Ok(r)) => r,
    };
    if resp.status() != StatusCode::OK {
        return Err(if resp.status().is_server_error() {
            "status 5xx"
        } else {
            "status other"
        });
    }
    let mut body = resp.into_body();
    let mut s = StreamSample {
        gaps_ns: Vec::with_capacity(64),
        delivery_ns: Vec::with_capacity(64),
        ..Default::default()
    };
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut last: Option<Instant> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err("timeout (body)"),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err("body error"),
            Ok(Some(Ok(f))) => f,
        };
        let at = Instant::now();
        let at_ns = at.duration_since(epoch()).as_nanos() as u64;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        let mut start = 0;
        while let Some(end) = find(&buf[start..], b"\n\n") {
            let ev = &buf[start..start + end];
            start += end + 2;
            if ev.starts_with(b"data: [DONE]") {
                s.done = true;
                continue;
            }
            let Some(i) = find(ev, b"\"content\":\"") else {
                continue;
            };
            let rest = &ev[i + 11..];
            if rest.first() == Some(&b'"') {
                continue; // empty content: role-only or finish chunk
            }
            let digits = rest
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            s.content += 1;
            match last {
                None => {
                    s.ttft_ns = Some(at.duration_since(t0).as_nanos() as u64);
                    if let Some(o) = opened {
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Some(prev) => s.gaps_ns.push(at.duration_since(prev).as_nanos() as u64),
            }
            s.delivery_ns.push(at_ns.saturating_sub(digits));
            last = Some(at);
        }
        buf.drain(..start);
    }
    if !s.done {
        return Err("no [DONE]");
    }
    Ok(s)
}

#[derive(Default)]
struct Stats {
    ttft: Vec<u64>,
    gaps: Vec<u64>,
    delivery: Vec<u64>,
    ok: u64,
    short_streams: u64,
    errors: BTreeMap<&'static str, u64>,
    last_done: Option<Instant>,
}

impl Stats {
    fn add(&mut self, r: Result<StreamSample, &'static str>, chunks: usize) {
        match r {
            Ok(sample) => {
                self.ok += 1;
                if sample.content != chunks {
                    self.short_streams += 1;
                }
                self.ttft.extend(sample.ttft_ns);
                self.gaps.extend_from_slice(&sample.gaps_ns);
                self.delivery.extend_from_slice(&sample.delivery_ns);
                self.last_done = Some(Instant::now());
            }
            Err(e) => *self.errors.entry(e).or_default() += 1,
        }
    }

    fn sort(&mut self) {
        self.ttft.sort_unstable();
        self.gaps.sort_unstable();
        self.delivery.sort_unstable();
    }
}

struct RunResult {
    /// The run's heading, e.g. "500 streaming requests/s (open loop)".
    label: String,
    issued: u64,
    issue_window_s: f64,
    stats: Stats,
    lag_p99_ms: f64,
    /// (rss KiB before, max rss KiB during, open streams when max was seen, mean open streams)
    mem: Option<(u64, u64, usize, f64)>,
    /// CPU seconds used by tokenwatch / by this process during the measured window.
    cpu_tw_s: Option<f64>,
    cpu_self_s: f64,
    /// tokenwatch's `tokenwatch_alerting_kept_bytes` right after the run (the alert engine's
    /// records and window samples, which grow with the request rate up to the per-model cap).
    kept_bytes: Option<f64>,
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx] as f64 / 1e6
}

/// Open-loop load: request i is sent at start + i/rate whatever the earlier ones are doing.
async fn load(c: &HttpClient, uri: Uri, s: &Settings, rate: u32, tw_pid: Option<u32>) -> RunResult {
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let warm_n = (s.warmup_secs * f64::from(rate)).round() as u64;
    let total = warm_n + (s.secs * f64::from(rate)).round() as u64;
    let stats = Arc::new(Mutex::new(Stats::default()));
    let inflight = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::with_capacity(total as usize);
    let mut lags: Vec<u64> = Vec::with_capacity(total as usize);
    let start = tokio::time::Instant::now();
    let mut measured_start = None;
    let mut cpu0 = (0u64, 0u64);
    let mut sampler = None;
    for i in 0..total {
        let due = start + interval * i as u32;
        tokio::time::sleep_until(due).await;
        let measured = i >= warm_n;
        if i == warm_n {
            measured_start = Some(Instant::now());
            cpu0 = (
                tw_pid.map(|p| cpu_ticks(&p.to_string())).unwrap_or(0),
                cpu_ticks("self"),
            );
            if let Some(pid) = tw_pid {
                sampler = Some(spawn_mem_sampler(pid, inflight.clone(), stop.clone()));
            }
        }
        if measured {
            lags.push(
                tokio::time::Instant::now()
                    .saturating_duration_since(due)
                    .as_nanos() as u64,
            );
        }
        if inflight.load(Ordering::Relaxed) >= s.max_inflight {
            if measured {
                *stats
                    .lock()
                    .unwrap()
                    .errors
                    .entry("skipped: client at max in-flight")
                    .or_default() += 1;
            }
            continue;
        }
        let (c, uri, stats, inflight) = (c.clone(), uri.clone(), stats.clone(), inflight.clone());
        let k = s.chunks;
        inflight.fetch_add(1, Ordering::Relaxed);
        handles.push(tokio::spawn(async move {
            let r = one_stream(&c, &uri, None, None).await;
            inflight.fetch_sub(1, Ordering::Relaxed);
            if !measured {
                return;
            }
            stats.lock().unwrap().add(r, k);
        }));
    }
    let issue_end = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let cpu1_at_issue_end = (
        tw_pid.map(|p| cpu_ticks(&p.to_string())).unwrap_or(0),
        cpu_ticks("self"),
    );
    let mem = match sampler {
        Some(h) => h.await.ok(),
        None => None,
    };
    for h in handles {
        let _ = h.await;
    }
    let measured_start = measured_start.unwrap_or(issue_end);
    let issue_window_s = issue_end.duration_since(measured_start).as_secs_f64();
    let cpu_tw_s = tw_pid.map(|_| cpu1_at_issue_end.0.saturating_sub(cpu0.0) as f64 / TICKS_PER_S);
    let cpu_self_s = cpu1_at_issue_end.1.saturating_sub(cpu0.1) as f64 / TICKS_PER_S;
    let mut stats = Arc::try_unwrap(stats)
        .ok()
        .expect("all tasks joined")
        .into_inner()
        .unwrap();
    stats.sort();
    lags.sort_unstable();
    RunResult {
        label: format!("{rate} streaming requests/s (open loop, target)"),
        issued: total - warm_n,
        issue_window_s,
        lag_p99_ms: pct(&lags, 0.99),
        stats,
        mem,
        cpu_tw_s,
        cpu_self_s,
        kept_bytes: None,
    }
}

/// Sample tokenwatch's RSS every 100 ms until `stop`: (before, max, open streams at max, mean open).
fn spawn_mem_sampler(
    pid: u32,
    inflight: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64, usize, f64)> {
    let before = rss_kib(pid);
    tokio::spawn(async move {
        let (mut max_rss, mut open_at_max, mut sum_open, mut n) = (before, 0usize, 0f64, 0u32);
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let rss = rss_kib(pid);
            let open = inflight.load(Ordering::Relaxed);
            sum_open += open as f64;
            n += 1;
            if rss > max_rss {
                max_rss = rss;
                open_at_max = open;
            }
        }
        (before, max_rss, open_at_max, sum_open / f64::from(n.max(1)))
    })
}

/// Hold `n` streams open through the proxy (the upstream pauses after the first content chunk)
/// and read tokenwatch's RSS while they are all open.
async fn hold_phase(c: &HttpClient, uri: &Uri, n: usize, pid: u32) -> (u64, u64, usize) {
    let before = rss_kib(pid);
    let opened = Arc::new(AtomicUsize::new(0));
    let hold_ms = 3000 + (n as u64) * 3;
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let (c, uri, opened) = (c.clone(), uri.clone(), opened.clone());
        handles.push(tokio::spawn(async move {
            one_stream(&c, &uri, Some(hold_ms), Some(&opened))
                .await
                .is_ok()
        }));
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_millis(hold_ms - 500);
    while opened.load(Ordering::Relaxed) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let during = rss_kib(pid);
    let open = opened.load(Ordering::Relaxed);
    for h in handles {
        let _ = h.await;
    }
    (before, during, open)
}

fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix(name)
            && (rest.starts_with(' ') || rest.starts_with('{'))
        {
            let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// The alert engine's kept bytes as tokenwatch reports them on `/metrics`.
async fn kept_bytes(c: &HttpClient, api: SocketAddr) -> Option<f64> {
    let (_, text) = get_text(c, &format!("http://{api}/metrics")).await.ok()?;
    metric_sum(&text, "tokenwatch_alerting_kept_bytes")
}

// ---------------------------------------------------------------- report

fn ms(v: f64) -> String {
    if v.is_nan() {
        "n/a".into()
    } else {
        format!("{v:.3}")
    }
}

fn signed_ms(v: f64) -> String {
    if v.is_nan() {
        "n/a".into()
    } else {
        format!("{v:+.3}")
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_nan() || b.is_nan() || b == 0.0 {
        "n/a".into()
    } else {
        format!("{:.3}", a / b)
    }
}

fn errors_text(st: &Stats) -> String {
    let mut parts: Vec<String> = st.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    if st.short_streams > 0 {
        parts.push(format!("short streams: {}", st.short_streams));
    }
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join(", ")
    }
}

fn achieved(r: &RunResult) -> f64 {
    r.stats.ok as f64 / r.issue_window_s.max(1e-9)
}

/// Quantile `q` (ms) of the series a report row names: TTFT, inter-chunk gaps or chunk delivery.
fn quantile_ms(r: &RunResult, row: &str, q: f64) -> f64 {
    let v = if row.starts_with("TTFT") {
        &r.stats.ttft
    } else if row.starts_with("inter") {
        &r.stats.gaps
    } else {
        &r.stats.delivery
    };
    pct(v, q)
}

fn compare_table(out: &mut String, d: &RunResult, p: &RunResult) {
    let _ = writeln!(out, "### {}\n", d.label);
    let _ = writeln!(
        out,
        "| metric | direct | proxied | added (proxied − direct) | ratio proxied/direct | spec target (added) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---|");
    let rows: [(&str, f64, &str); 9] = [
        ("TTFT p50 (ms)", 0.50, ""),
        ("TTFT p99 (ms)", 0.99, "≤ 0.300 ms (issue 10: ≤ 1 ms)"),
        ("TTFT p99.9 (ms)", 0.999, ""),
        ("inter-chunk gap p50 (ms)", 0.50, ""),
        ("inter-chunk gap p99 (ms)", 0.99, "≤ 0.100 ms"),
        ("inter-chunk gap p99.9 (ms)", 0.999, ""),
        ("chunk delivery upstream→client p50 (ms)", 0.50, ""),
        (
            "chunk delivery upstream→client p99 (ms)",
            0.99,
            "≤ 0.100 ms (issue 10: ≤ 0.3 ms)",
        ),
        ("chunk delivery upstream→client p99.9 (ms)", 0.999, ""),
    ];
    for (name, q, target) in rows {
        let (a, b) = (quantile_ms(d, name, q), quantile_ms(p, name, q));
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {target} |",
            ms(a),
            ms(b),
            signed_ms(b - a),
            ratio(b, a)
        );
    }
    let (ad, ap) = (achieved(d), achieved(p));
    let _ = writeln!(
        out,
        "| achieved ok streams/s | {ad:.0} | {ap:.0} | | {} | ≥ 0.99× direct |",
        ratio(ap, ad)
    );
    let _ = writeln!(
        out,
        "| streams ok / scheduled | {} / {} | {} / {} | | | |",
        d.stats.ok, d.issued, p.stats.ok, p.issued
    );
    let _ = writeln!(
        out,
        "| errors | {} | {} | | | |",
        errors_text(&d.stats),
        errors_text(&p.stats)
    );
    let _ = writeln!(
        out,
        "| content chunks timed | {} | {} | | | |",
        d.stats.delivery.len(),
        p.stats.delivery.len()
    );
    let _ = writeln!(
        out,
        "| client send lag behind schedule p99 (ms) | {} | {} | | | |",
        ms(d.lag_p99_ms),
        ms(p.lag_p99_ms)
    );
    let _ = writeln!(
        out,
        "| CPU: this process (client + upstream), cores | {:.2} | {:.2} | | | |",
        d.cpu_self_s / d.issue_window_s,
        p.cpu_self_s / p.issue_window_s
    );
    if let Some(cpu) = p.cpu_tw_s {
        let per_req_us = cpu / p.stats.ok.max(1) as f64 * 1e6;
        let _ = writeln!(
            out,
            "| CPU: tokenwatch, cores (µs CPU per stream) | — | {:.2} ({per_req_us:.0} µs) | | | 2 cores |",
            cpu / p.issue_window_s
        );
    }
    if let Some((before, max, open_at_max, mean_open)) = p.mem {
        // An upper bound: RSS also grows with the pipeline, the store and the sketches.
        let per = if mean_open >= 1.0 {
            (max.saturating_sub(before)) as f64 / mean_open
        } else {
            f64::NAN
        };
        let _ = writeln!(
            out,
            "| tokenwatch RSS before → max during load (KiB); open streams at max, mean | — | {before} → {max}; {open_at_max}, {mean_open:.1} | | | |"
        );
        let _ = writeln!(
            out,
            "| RSS growth during load ÷ mean open streams (KiB, upper bound) | — | {} | | | ≤ 16 KiB |",
            if per.is_nan() {
                "n/a".into()
            } else {
                format!("{per:.1}")
            }
        );
    }
    if let Some(kept) = p.kept_bytes {
        let _ = writeln!(
            out,
            "| alert engine's kept records and window samples after the run (MiB, `tokenwatch_alerting_kept_bytes`) | — | {:.1} | | | |",
            kept / 1048576.0
        );
    }
    let _ = writeln!(out);
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kib| format!("{:.1} GiB RAM", kib as f64 / 1048576.0))
        .unwrap_or_default();
    format!("{cpus} CPUs available ({model}), {mem}, no GPU used")
}

// ---------------------------------------------------------------- main

fn main() {
    let s = Settings::from_env();
    if let Some((bench_cpus, _)) = &s.pin {
        pin_this_process(bench_cpus);
    }
    let _ = epoch();
    let load_at_start = load_avg();
    let machine_desc = machine();
    eprintln!("proxy bench: {s:?}");
    let upstream = start_upstream(&s);
    // Started first, so a missing nginx fails the bench before anything else runs.
    let reference = s
        .reference
        .then(|| reference::Nginx::start(upstream, s.pin.as_ref().map(|(_, tw)| tw.as_str())));
    let dir = tempfile::tempdir().expect("tempdir");
    let (tw, api, proxy) = start_tokenwatch(
        upstream,
        dir.path(),
        s.pin.as_ref().map(|(_, tw)| tw.as_str()),
    );
    let pid = tw.pid();
    let rt = runtime(s.client_threads, "bench-client");
    let report = rt.block_on(async {
        let c = client();
        // Wait for readiness.
        let ready_url = format!("http://{api}/readyz");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = get_text(&c, &ready_url).await {
                break;
            }
            if Instant::now() > deadline {
                panic!("tokenwatch never became ready at {ready_url}; log:\n{}", tw.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let direct_uri: Uri = format!("http://{upstream}/v1/chat/completions").parse().unwrap();
        let proxy_uri: Uri = format!("http://{proxy}/v1/chat/completions").parse().unwrap();

        // Sanity: one stream each way.
        for u in [&direct_uri, &proxy_uri] {
            let r = one_stream(&c, u, None, None).await;
            match r {
                Ok(sample) if sample.content == s.chunks => {}
                Ok(sample) => panic!("{u}: {} content chunks, expected {}", sample.content, s.chunks),
                Err(e) => panic!("{u}: {e}; tokenwatch log:\n{}", tw.log_tail()),
            }
        }
        if let Some(nginx) = &reference {
            nginx.check_stream(&c, s.chunks).await;
        }
        let rss_idle = rss_kib(pid);
        for _ in 0..20 {
            let _ = one_stream(&c, &proxy_uri, None, None).await;
        }

        // Memory per open stream: hold streams open through the proxy, twice (new connections,
        // then pooled ones).
        eprintln!("holding {} streams open (new connections)...", s.hold_streams);
        let hold1 = hold_phase(&c, &proxy_uri, s.hold_streams, pid).await;
        eprintln!("holding {} streams open (pooled connections)...", s.hold_streams);
        let hold2 = hold_phase(&c, &proxy_uri, s.hold_streams, pid).await;

        let poller = s.ui_poll.then(|| closed::UiPoller::start(&c, api));
        let mut runs = Vec::new();
        PACE_US[0].store(s.closed_first.as_micros() as u64, Ordering::Relaxed);
        PACE_US[1].store(s.closed_gap.as_micros() as u64, Ordering::Relaxed);
        for &n in &s.concurrency {
            eprintln!("{n} concurrent streams direct...");
            let d = closed::closed_loop(&c, direct_uri.clone(), &s, n, None).await;
            eprintln!("{n} concurrent streams through the proxy...");
            let mut p = closed::closed_loop(&c, proxy_uri.clone(), &s, n, Some(pid)).await;
            p.kept_bytes = kept_bytes(&c, api).await;
            let r = match &reference {
                Some(nginx) => {
                    eprintln!("{n} concurrent streams through the reference nginx...");
                    Some(closed::closed_loop(&c, nginx.uri.clone(), &s, n, Some(nginx.pid())).await)
                }
                None => None,
            };
            runs.push((d, p, r));
        }
        PACE_US[0].store(0, Ordering::Relaxed);
        PACE_US[1].store(0, Ordering::Relaxed);
        for &rate in &s.rates {
            eprintln!("{rate} req/s direct...");
            let d = load(&c, direct_uri.clone(), &s, rate, None).await;
            eprintln!("{rate} req/s through the proxy...");
            let mut p = load(&c, proxy_uri.clone(), &s, rate, Some(pid)).await;
            p.kept_bytes = kept_bytes(&c, api).await;
            let r = match &reference {
                Some(nginx) => {
                    eprintln!("{rate} req/s through the reference nginx...");
                    Some(load(&c, nginx.uri.clone(), &s, rate, Some(nginx.pid())).await)
                }
                None => None,
            };
            runs.push((d, p, r));
        }

        let polled = match poller {
            Some(p) => Some(p.finish().await),
            None => None,
        };
        // Let the pipeline flush, then read its counters.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let metrics = get_text(&c, &format!("http://{api}/metrics")).await.map(|(_, t)| t).unwrap_or_default();
        let sample_record = get_text(&c, &format!("http://{api}/api/v1/requests?model={MODEL}&limit=1")).await.map(|(_, t)| t).unwrap_or_default();
        let offsets_in_record = serde_json::from_str::<serde_json::Value>(&sample_record).ok().and_then(|v| {
            let rec = v.get("records").or_else(|| v.get("requests")).and_then(|r| r.get(0)).cloned().or_else(|| v.get(0).cloned())?;
            rec.get("chunk_offsets_us")?.as_array().map(|a| a.len())
        });
        let rss_end = rss_kib(pid);
        let vm_hwm = proc_status_kib(pid, "VmHWM:").unwrap_or(0);

        // ------------------------------------------------------------ report
        let mut out = String::new();
        let date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC");
        let reference_note = reference.as_ref().map(|n| format!(" (reference: {})", n.version)).unwrap_or_default();
        let _ = writeln!(out, "## Proxy overhead — {date}{reference_note}\n");
        let _ = writeln!(
            out,
            "Machine: {}. Load average (1/5/15 min) at start: {load_at_start}, at end: {}. Open-files limit: {}. \
             Command: `{}cargo bench -p tokenwatch --bench proxy`.\n",
            machine_desc,
            load_avg(),
            open_files_limit(),
            ["TW_BENCH_BIN", "TW_BENCH_CONFIG", "TW_BENCH_CONCURRENCY", "TW_BENCH_RATES", "TW_BENCH_SECS", "TW_BENCH_PIN", "TW_BENCH_REFERENCE"]
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v} ")))
                .collect::<String>()
        );
        let _ = writeln!(
            out,
            "Workload: streaming `POST /v1/chat/completions`, closed loop (N streams open at once, each sent as the previous ends; first content after {:?}, then one every {:?}, a model at that pace) and open loop (sent on schedule whatever the earlier ones do; paced as below), {} content chunks per stream (vLLM-shaped \
             SSE: role chunk, content chunks, finish chunk, usage chunk, `[DONE]`), first content after {:?}, then one \
             every {:?}; {} s measured per run after {} s warm-up; direct and proxied runs back to back against the \
             same in-process upstream. Client ({} thread) and upstream ({} thread) run in the bench process; \
             tokenwatch is the release binary (`tokenwatch run`, default config: full per-token recording, \
             SQLite store); {}.\n",
            s.closed_first,
            s.closed_gap,
            s.chunks,
            s.first,
            s.gap,
            s.secs,
            s.warmup_secs,
            s.client_threads,
            s.upstream_threads,
            match &s.pin {
                Some((bench, tw)) => format!("the bench process is pinned to CPU(s) {bench} and tokenwatch to CPU(s) {tw}"),
                None => "all share the same CPUs".into(),
            }
        );
        let _ = writeln!(
            out,
            "While every run went on, {}.\n",
            match polled {
                Some((ok, failed)) => format!(
                    "a poller read tokenwatch's API as the UI's overview does once a second (fleet, alerts, requests, GPUs, \
                     /metrics): {ok} answers 200, {failed} other; the alert engine evaluated its default rules and the \
                     timeline sampler ran, as in production"
                ),
                None => "nothing read tokenwatch's API (TW_BENCH_UI_POLL=0); the alert engine and the timeline sampler ran".into(),
            }
        );
        if let Some(nginx) = &reference {
            let _ = writeln!(out, "{}", nginx.describe());
        }
        for (d, p, r) in &runs {
            compare_table(&mut out, d, p);
            if let (Some(nginx), Some(r)) = (&reference, r) {
                nginx.table(&mut out, d, p, r);
            }
        }
        let _ = writeln!(out, "### Memory per open stream (tokenwatch RSS, `/proc/<pid>/status` VmRSS)\n");
        let _ = writeln!(out, "| phase | RSS before (KiB) | RSS with streams open (KiB) | open streams | KiB per open stream | spec target |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---|");
        for (name, (before, during, open)) in [("hold #1 (new connections both sides)", hold1), ("hold #2 (pooled connections)", hold2)] {
            let per = if open > 0 { format!("{:.1}", during.saturating_sub(before) as f64 / open as f64) } else { "n/a".into() };
            let _ = writeln!(out, "| {name} | {before} | {during} | {open} | {per} | ≤ 16 KiB |");
        }
        let _ = writeln!(out, "\nRSS idle after start: {rss_idle} KiB; at the end: {rss_end} KiB; peak (VmHWM): {vm_hwm} KiB.\n");
        let _ = writeln!(out, "### tokenwatch's own counters after the run (`/metrics`)\n");
        let _ = writeln!(out, "| counter | value |");
        let _ = writeln!(out, "|---|---:|");
        for name in [
            "tokenwatch_telemetry_dropped_records_total",
            "tokenwatch_store_records_written_total",
            "tokenwatch_store_write_errors_total",
            "tokenwatch_requests_total",
        ] {
            let v = metric_sum(&metrics, name).map(|v| format!("{v:.0}")).unwrap_or_else(|| "not found".into());
            let _ = writeln!(out, "| `{name}` | {v} |");
        }
        if let Some(e) = FIRST_CONNECT_ERROR.get() {
            let _ = writeln!(out, "\nFirst client connect error seen: `{e}`\n");
        }
        let proxied_total: u64 = runs.iter().map(|(_, p, _)| p.stats.ok + p.stats.errors.values().sum::<u64>()).sum();
        let _ = writeln!(
            out,
            "\nProxied streams scheduled in the measured windows: {proxied_total} (plus warm-up, sanity and hold streams). Newest stored record \
             has {} per-chunk arrival offsets (expected {}).\n",
            offsets_in_record.map(|n| n.to_string()).unwrap_or_else(|| "unknown".into()),
            s.chunks
        );
        out
    });
    drop(reference);
    drop(tw);
    drop(dir);
    print!("{report}");
    if let Some(parent) = s.out.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    match std::fs::write(&s.out, &report) {
        Ok(()) => eprintln!("wrote {}", s.out.display()),
        Err(e) => eprintln!("could not write {}: {e}", s.out.display()),
    }
    // The upstream thread runs forever; leave without waiting for it.
    std::process::exit(0);
}
