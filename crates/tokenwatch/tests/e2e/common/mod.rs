// Helpers for integration tests: start the real `tokenwatch` binary on free loopback ports,
// talk HTTP to it, find the external tools the tests need (and fail loudly if missing).
#![allow(dead_code)]

pub mod alertmanager;
pub mod clickhouse;
pub mod metrics_target;
pub mod otlp;
pub mod prometheus;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tokenwatch");

/// Loopback port 0: the listener picks a free port itself, and the test reads what it bound
/// from the start line ([`Proc::listening`], [`Proc::sim_listening`]). Every listener of the
/// process under test is started this way unless its address must be known before it starts.
pub const ANY: &str = "127.0.0.1:0";

/// [`ANY`] as an address.
pub fn any_addr() -> SocketAddr {
    ANY.parse().unwrap()
}

/// A loopback address free now, for a child process to bind, for the few cases where the
/// address must be known before the process starts (otherwise use port 0, [`ANY`]): a peer's
/// address written into another process's configuration, a program that cannot report the
/// port it bound (Prometheus, Alertmanager, ClickHouse, HAProxy), a restart on the same port,
/// or an address nobody listens on. Ports come from below the
/// kernel's ephemeral range (32768–60999 on Linux): a port taken from `bind(:0)` and released
/// can be reused as the source port of any outgoing connection (a scrape, an HTTP client)
/// before the child binds it, which failed CI with "Address already in use". Ports below
/// that range are never handed out implicitly; a per-process counter from a pid-seeded start
/// keeps concurrent tests apart, and each candidate is checked by binding it.
pub fn free_addr() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(7919)) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port as u16)) {
            return l.local_addr().unwrap();
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN)
}

/// A child process killed (SIGKILL) when dropped, so no test leaves a server behind.
pub struct Proc {
    pub child: Child,
    pub name: String,
    log: PathBuf,
}

impl Proc {
    pub fn start(name: &str, args: &[&str], log_dir: &Path) -> Proc {
        Proc::start_with_env(name, args, log_dir, &[])
    }

    /// [`Proc::start`] with `env` set in the child's environment too.
    pub fn start_with_env(name: &str, args: &[&str], log_dir: &Path, env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(args).envs(env.iter().copied());
        Proc::start_command(name, cmd, log_dir)
    }

    /// `cmd` (another program: `setpriv` running an installed tokenwatch as its user) with its
    /// output in `log_dir/NAME.log`, killed when dropped.
    pub fn start_command(name: &str, mut cmd: Command, log_dir: &Path) -> Proc {
        let log = log_dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("create log file");
        let err = out.try_clone().unwrap();
        let child = cmd
            .env("TOKENWATCH_LOG", "info")
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        Proc {
            child,
            name: name.into(),
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The addresses tokenwatch bound, by listener name (`api`, `proxy`, `otlp_grpc`,
    /// `otlp_http`), from its start line `tokenwatch running listening=api=ADDR proxy=ADDR …`:
    /// what port 0 picked. Waits up to 30 s for the line; fails with the log if it never comes.
    pub async fn listening(&self) -> std::collections::BTreeMap<String, SocketAddr> {
        self.logged_addresses("tokenwatch running", "listening=")
            .await
    }

    /// The addresses `tokenwatch demo` bound, by listener name (as [`Proc::listening`]), from
    /// the line `  listening:  api=ADDR proxy=ADDR …` it prints.
    pub async fn demo_listening(&self) -> std::collections::BTreeMap<String, SocketAddr> {
        self.logged_addresses("  listening:  ", "listening:").await
    }

    /// The simulator's bound address, from its line `simulator listening addr=ADDR …`.
    pub async fn sim_listening(&self) -> SocketAddr {
        self.logged_addresses("simulator listening", "").await["addr"]
    }

    /// The `name=ADDR` pairs after `marker` on the first log line holding `line`.
    async fn logged_addresses(
        &self,
        line: &str,
        marker: &str,
    ) -> std::collections::BTreeMap<String, SocketAddr> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log();
            if let Some(l) = log.lines().find(|l| l.contains(line)) {
                let rest = l.split_once(marker).map_or(l, |(_, r)| r);
                return rest
                    .split_whitespace()
                    .filter_map(|pair| {
                        let (name, addr) = pair.split_once('=')?;
                        Some((name.to_string(), addr.parse().ok()?))
                    })
                    .collect();
            }
            assert!(
                Instant::now() < deadline,
                "{} never logged {line:?}; log:\n{log}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last `n` lines of the log (for failure messages).
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.send_term();
        self.wait_exit(Duration::from_secs(15))
    }

    /// SIGTERM, without waiting.
    pub fn send_term(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
    }

    /// Waits for the process to exit, up to `within` (then kills it and fails the test).
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            if Instant::now() > deadline {
                self.kill9();
                panic!(
                    "{} did not stop within {within:?} of SIGTERM; log:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

pub async fn send(
    method: &str,
    url: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    if body.is_some() {
        b = b.header("content-type", "application/json");
    }
    let req = b
        .body(Full::new(Bytes::from(body.unwrap_or("").to_string())))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), client().request(req))
        .await
        .map_err(|_| format!("{url}: timed out"))?
        .map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{url}: body: {e}"))?
        .to_bytes();
    Ok(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// Run `n` jobs on `clients` concurrent tasks; `job(i)` is one request. Returns how many jobs'
/// requests got an answer (any status).
pub async fn concurrently<F, Fut>(n: usize, clients: usize, job: F) -> usize
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let job = std::sync::Arc::new(job);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (job, next) = (job.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut answered = 0;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return answered;
                }
                answered += usize::from(job(i).await);
            }
        }));
    }
    let mut answered = 0;
    for t in tasks {
        answered += t.await.unwrap();
    }
    answered
}

/// A short chat request body naming `model` (two tokens asked for).
pub fn short_chat(model: &str) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    })
    .to_string()
}

pub async fn get(url: &str) -> Reply {
    send("GET", url, None, &[])
        .await
        .unwrap_or_else(|e| panic!("GET {e}"))
}

/// POSTs `body` (sent as JSON) to `url`; fails the test when no answer comes.
pub async fn post(url: &str, body: &str) -> Reply {
    send("POST", url, Some(body), &[])
        .await
        .unwrap_or_else(|e| panic!("POST {e}"))
}

/// A batch endpoint's partial-success answer (`/api/v1/feedback`, `/scores`, `/embeddings`):
/// asserts 200 and the `accepted` and `rejected` counts; returns the body.
pub fn assert_partial(r: &Reply, accepted: u64, rejected: u64) -> serde_json::Value {
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (v["accepted"].as_u64(), v["rejected"].as_u64()),
        (Some(accepted), Some(rejected)),
        "{v:#}"
    );
    v
}

/// Wall-clock time in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Wall-clock time in Unix nanoseconds.
pub fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Poll until `url` answers 200 or the deadline passes.
pub async fn wait_ready(url: &str, proc_: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Reply { status: 200, .. }) = send("GET", url, None, &[]).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{url} never became ready; {} log:\n{}",
        proc_.name,
        proc_.log()
    );
}

/// The stored record of request `id` (`GET /api/v1/requests/{id}`), once the pipeline has
/// written it; fails with `tw`'s log after 20 s.
pub async fn stored_record(api: SocketAddr, id: &str, tw: &Proc) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(&format!("http://{api}/api/v1/requests/{id}")).await;
        if r.status == 200 {
            return r.json();
        }
        assert!(
            Instant::now() < deadline,
            "record {id} never stored ({}); log:\n{}",
            r.body,
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The version markers of `model` (`GET /api/v1/markers?model=`) once there are at least `want`;
/// fails after 30 s naming what there was and `log()` (the collector's log).
pub async fn wait_markers(
    api: SocketAddr,
    model: &str,
    want: usize,
    log: impl Fn() -> String,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = get(&format!("http://{api}/api/v1/markers?model={model}"))
            .await
            .json();
        let list = r["markers"].as_array().cloned().unwrap_or_default();
        if list.len() >= want {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "markers of {model}: {r}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls `url` (GET, its JSON) every 200 ms until `check` accepts it, or fails after `secs`
/// with the last answer and the tail of `tw`'s log.
pub async fn poll_json(
    url: &str,
    tw: &Proc,
    secs: u64,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = get(url).await.json();
        if check(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never matched; last answer:\n{v:#}\nlog:\n{}",
            tw.log_tail(60)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// POSTs the chat request `body` through the proxy with `headers`, asserts 200 and returns the
/// answer's text as the client received it (the deltas of a stream put together).
pub async fn chat_answer(
    proxy: SocketAddr,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> String {
    let stream = body["stream"].as_bool().unwrap_or(false);
    let r = send(
        "POST",
        &format!("http://{proxy}/v1/chat/completions"),
        Some(&body.to_string()),
        headers,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    if !stream {
        return r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
    }
    let mut text = String::new();
    for data in r.body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(data) {
            text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        }
    }
    text
}

/// Every file directly under `dir` (the database, its WAL), as bytes.
pub fn dir_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_file() {
            out.extend(std::fs::read(e.path()).unwrap());
        }
    }
    out
}

/// Whether `needle`'s bytes stand anywhere in `hay`.
pub fn bytes_contain(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Read one sample's value from Prometheus text (exact series text before the value).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.trim().split(' ').next()?.parse().ok())
    })
}

/// The sum of every sample of the metric `name` (any labels) in Prometheus text.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls the Prometheus text at `url` every 100 ms until the sum of the metric `name`'s samples
/// satisfies `check`; returns that sum, or fails after `secs` with the metric's lines and the
/// tail of `proc_`'s log.
pub async fn wait_metric_sum(
    url: &str,
    name: &str,
    secs: u64,
    proc_: &Proc,
    check: impl Fn(f64) -> bool,
) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = get(url).await.body;
        let v = metric_sum(&text, name);
        if check(v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{name} at {url} never matched within {secs} s (now {v}):\n{}\n{} log:\n{}",
            text.lines()
                .filter(|l| l.starts_with(name))
                .collect::<Vec<_>>()
                .join("\n"),
            proc_.name,
            proc_.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `tokenwatch sim` on a port it picks (port 0, read from its start line) with `args` after
/// `--listen`; waits until it serves `/v1/models` and returns (process, address).
pub async fn start_sim(dir: &Path, args: &[&str]) -> (Proc, SocketAddr) {
    let mut all = vec!["sim", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let sim = Proc::start("sim", &all, dir);
    let addr = sim.sim_listening().await;
    wait_ready(&format!("http://{addr}/v1/models"), &sim).await;
    (sim, addr)
}

/// A started simulator + tokenwatch pair on ports they picked (port 0, read from their start
/// lines; a restart binds the same ones again).
pub struct Stack {
    pub sim: Proc,
    pub tw: Proc,
    pub sim_addr: SocketAddr,
    pub api: SocketAddr,
    pub proxy: SocketAddr,
    pub dir: tempfile::TempDir,
    /// The extra tokenwatch arguments it was started with, used again by a restart.
    tw_extra: Vec<String>,
}

impl Stack {
    pub async fn start(sim_args: &[&str], tw_extra: &[&str]) -> Stack {
        Self::start_in(tempfile::tempdir().unwrap(), sim_args, tw_extra, false).await
    }

    /// [`Stack::start`] on ports below the kernel's ephemeral range ([`free_addr`]), for a test
    /// that restarts tokenwatch on the same ports: a port 0 picked is an ephemeral one, which an
    /// outgoing connection may take while tokenwatch is down.
    pub async fn start_restartable(sim_args: &[&str], tw_extra: &[&str]) -> Stack {
        Self::start_in(tempfile::tempdir().unwrap(), sim_args, tw_extra, true).await
    }

    /// [`Stack::start`] with `yaml` as tokenwatch's configuration (`-c`), written to `tw.yaml`
    /// in the stack's directory.
    pub async fn start_with_config(sim_args: &[&str], yaml: &str) -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_config(dir.path(), yaml);
        let cfg = cfg.to_string_lossy().into_owned();
        Self::start_in(dir, sim_args, &["-c", &cfg], false).await
    }

    async fn start_in(
        dir: tempfile::TempDir,
        sim_args: &[&str],
        tw_extra: &[&str],
        restartable: bool,
    ) -> Stack {
        let (sim, sim_addr) = start_sim(dir.path(), sim_args).await;
        let (api, proxy) = if restartable {
            (free_addr(), free_addr())
        } else {
            let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
            (any, any)
        };
        let tw = start_tokenwatch(
            dir.path(),
            api,
            proxy,
            &format!("http://{sim_addr}"),
            tw_extra,
        );
        let bound = tw.listening().await;
        let (api, proxy) = (bound["api"], bound["proxy"]);
        wait_ready(&format!("http://{api}/readyz"), &tw).await;
        Stack {
            sim,
            tw,
            sim_addr,
            api,
            proxy,
            dir,
            tw_extra: tw_extra.iter().map(|a| a.to_string()).collect(),
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Start tokenwatch again on the same ports and data directory, with the same arguments
    /// (a stack from [`Stack::start_restartable`]).
    pub fn restart_tokenwatch(&mut self) {
        let extra: Vec<&str> = self.tw_extra.iter().map(String::as_str).collect();
        self.tw = start_tokenwatch(
            self.dir.path(),
            self.api,
            self.proxy,
            &format!("http://{}", self.sim_addr),
            &extra,
        );
    }
}

/// `tokenwatch run` proxying `upstream` with its API on `api` and its proxy on `proxy` (either
/// may be port 0, [`ANY`]), OTLP on ports it picks, data under `dir/data` and `extra` arguments
/// after; returns at once (see [`run_tokenwatch`] for a started one on ports it picks).
pub fn start_tokenwatch(
    dir: &Path,
    api: SocketAddr,
    proxy: SocketAddr,
    upstream: &str,
    extra: &[&str],
) -> Proc {
    let data = dir.join("data");
    let (a, p) = (api.to_string(), proxy.to_string());
    // OTLP on ports it picks: a test that sends OTLP reads them from `listening()`.
    let (og, oh) = (ANY.to_string(), ANY.to_string());
    let data = data.to_string_lossy().into_owned();
    let mut args = vec![
        "run",
        "--listen",
        &a,
        "--proxy-listen",
        &p,
        "--upstream",
        upstream,
        "--upstream-runtime",
        "sim",
        "--data-dir",
        &data,
        "--otlp-grpc-listen",
        &og,
        "--otlp-http-listen",
        &oh,
    ];
    args.extend_from_slice(extra);
    Proc::start("tokenwatch", &args, dir)
}

/// [`start_tokenwatch`] on ports it picks (port 0, read from its start line), once ready;
/// returns (process, API address, proxy address).
pub async fn run_tokenwatch(
    dir: &Path,
    upstream: &str,
    extra: &[&str],
) -> (Proc, SocketAddr, SocketAddr) {
    let tw = start_tokenwatch(dir, any_addr(), any_addr(), upstream, extra);
    let (api, proxy) = ready_on(&tw).await;
    (tw, api, proxy)
}

/// The API and proxy addresses tokenwatch bound (from its start line), once `/readyz` answers
/// 200. A process without a proxy (collector-only) gives [`ANY`] for it: nothing listens there.
pub async fn ready_on(tw: &Proc) -> (SocketAddr, SocketAddr) {
    let bound = tw.listening().await;
    let api = bound["api"];
    wait_ready(&format!("http://{api}/readyz"), tw).await;
    (api, bound.get("proxy").copied().unwrap_or_else(any_addr))
}

/// `tokenwatch run -c config` on ports it picks (API, proxy, OTLP: port 0, read from its start
/// line), started in `dir`, once ready;
/// returns (process, API address, proxy address). For configurations that set their own
/// upstreams (no `--upstream`).
pub async fn run_with_config(dir: &Path, config: &Path) -> (Proc, SocketAddr, SocketAddr) {
    let any = "127.0.0.1:0";
    let tw = Proc::start(
        "tokenwatch",
        &[
            "run",
            "-c",
            &config.to_string_lossy(),
            "--listen",
            any,
            "--proxy-listen",
            any,
            "--otlp-grpc-listen",
            any,
            "--otlp-http-listen",
            any,
        ],
        dir,
    );
    let (api, proxy) = ready_on(&tw).await;
    (tw, api, proxy)
}

/// The alerts `GET /api/v1/alerts` lists (active, then recently resolved).
pub async fn alerts(api: SocketAddr) -> Vec<serde_json::Value> {
    let r = get(&format!("http://{api}/api/v1/alerts")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["alerts"].as_array().cloned().unwrap_or_default()
}

/// Writes `yaml` to `dir/tw.yaml`; returns the file's path.
pub fn write_config(dir: &Path, yaml: &str) -> PathBuf {
    let config = dir.join("tw.yaml");
    std::fs::write(&config, yaml).unwrap();
    config
}

/// Write `tokens` (the tokens file's text) to `dir/tokens` and a `dir/tw.yaml` that points
/// `auth.tokens_file` at it, re-read every 200 ms; returns (tokens file, config file).
pub fn write_auth_files(dir: &Path, tokens: &str) -> (PathBuf, PathBuf) {
    let tokens_file = dir.join("tokens");
    std::fs::write(&tokens_file, tokens).unwrap();
    let config = dir.join("tw.yaml");
    std::fs::write(
        &config,
        format!(
            "auth:\n  tokens_file: {}\n  reload_interval: 200ms\n",
            tokens_file.display()
        ),
    )
    .unwrap();
    (tokens_file, config)
}

/// Start a collector-only tokenwatch (API on a port it picks, no proxy, no OTLP) with its data
/// under `dir/data`, `extra` arguments appended (`-c FILE`, `--auth-tokens FILE` …), and wait
/// until it is ready; returns (process, API address).
pub async fn start_collector(dir: &Path, extra: &[&str]) -> (Proc, SocketAddr) {
    let tw = spawn_collector(dir, any_addr(), extra);
    let (api, _) = ready_on(&tw).await;
    (tw, api)
}

/// [`start_collector`] with its API on `api`, returning at once: for a test that restarts it
/// on the same port or must know the address before it starts.
pub fn spawn_collector(dir: &Path, api: SocketAddr, extra: &[&str]) -> Proc {
    let (a, d) = (
        api.to_string(),
        dir.join("data").to_string_lossy().into_owned(),
    );
    let mut args = vec!["run", "--listen", &a, "--no-otlp", "--data-dir", &d];
    args.extend_from_slice(extra);
    Proc::start("tokenwatch", &args, dir)
}

/// A collector with OTLP receivers: tokenwatch `run -c config` with its API, OTLP/gRPC and
/// OTLP/HTTP on ports it picks and data under `dir/data`; waits until ready and returns
/// (process, API address, OTLP/gRPC address, OTLP/HTTP address) as it bound them.
pub async fn start_otlp_collector(
    dir: &Path,
    config: &Path,
) -> (Proc, SocketAddr, SocketAddr, SocketAddr) {
    let c = config.to_string_lossy().into_owned();
    let d = dir.join("data").to_string_lossy().into_owned();
    let args = [
        "run",
        "-c",
        &c,
        "--listen",
        ANY,
        "--data-dir",
        &d,
        "--otlp-grpc-listen",
        ANY,
        "--otlp-http-listen",
        ANY,
    ];
    let tw = Proc::start("tokenwatch", &args, dir);
    let bound = tw.listening().await;
    wait_ready(&format!("http://{}/readyz", bound["api"]), &tw).await;
    (tw, bound["api"], bound["otlp_grpc"], bound["otlp_http"])
}

/// [`start_otlp_collector`] with `yaml` written to `dir/tw.yaml`; returns (process, API
/// address, OTLP/HTTP address).
pub async fn start_otlp_collector_with(dir: &Path, yaml: &str) -> (Proc, SocketAddr, SocketAddr) {
    let config = write_config(dir, yaml);
    let (tw, api, _grpc, http) = start_otlp_collector(dir, &config).await;
    (tw, api, http)
}

/// `tokenwatch demo` with its data under `dir/data`, every listener on a port it picks (port 0,
/// read from its `listening:` line) and `extra` arguments after; waits until ready and returns
/// (process, API address, OTLP/HTTP address).
pub async fn start_demo(dir: &Path, extra: &[&str]) -> (Proc, SocketAddr, SocketAddr) {
    let data = dir.join("data").display().to_string();
    let mut args = vec![
        "demo",
        "--listen",
        ANY,
        "--proxy-listen",
        ANY,
        "--otlp-grpc-listen",
        ANY,
        "--otlp-http-listen",
        ANY,
        "--data-dir",
        &data,
    ];
    args.extend_from_slice(extra);
    let demo = Proc::start("demo", &args, dir);
    let bound = demo.demo_listening().await;
    let (api, otlp_http) = (bound["api"], bound["otlp_http"]);
    wait_ready(&format!("http://{api}/readyz"), &demo).await;
    (demo, api, otlp_http)
}

/// [`start_demo`] with the `kv_leak` fault switched on `fault_after` (e.g. "0s") after start.
pub async fn start_demo_with_leak(dir: &Path, fault_after: &str) -> (Proc, SocketAddr, SocketAddr) {
    start_demo(dir, &["--fault", "kv_leak", "--fault-after", fault_after]).await
}

/// The Python interpreter of the test virtualenv holding the `openai` client.
pub fn python() -> PathBuf {
    let p = std::env::var_os("TOKENWATCH_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../.venv-test/bin/python"
            ))
        });
    assert!(
        p.exists(),
        "the test Python with the `openai` package is missing at {} — run the README's test command (scripts/test.sh), which installs it",
        p.display()
    );
    p
}

pub fn promtool() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("promtool"))
            .find(|p| p.exists())
    });
    found.expect("promtool is not installed — run the README's test command (scripts/test.sh), which installs Debian's `prometheus` package")
}

/// `promtool check metrics` accepts `text` (a `/metrics` scrape); fails with what it said.
pub fn promtool_check_metrics(text: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed ({:?}): {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Chat requests for `model` through the proxy from `workers` clients until `stop`; `done`
/// counts the answered ones. A failed send waits 50 ms before the next.
pub fn chat_traffic(
    proxy: SocketAddr,
    model: &'static str,
    workers: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    use std::sync::atomic::Ordering;
    (0..workers)
        .map(|w| {
            let (stop, done) = (stop.clone(), done.clone());
            tokio::spawn(async move {
                let url = format!("http://{proxy}/v1/chat/completions");
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let body = serde_json::json!({
                        "model": model,
                        "messages": [{"role": "user", "content": format!("client {w} request {i}")}],
                    })
                    .to_string();
                    if send("POST", &url, Some(&body), &[]).await.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect()
}
