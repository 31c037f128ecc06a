// The reference proxy of the proxy bench (TW_BENCH_REFERENCE=nginx): an nginx child in front of the
// same upstream, its configuration, and the report table setting its added latency beside tokenwatch's.

use super::{
    ChildGuard, HttpClient, RunResult, achieved, child_pids, cpu_list, errors_text, free_addr, ms,
    one_stream, pinned_command, quantile_ms, ratio, signed_ms,
};
use http::Uri;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Connections one nginx worker may hold, client and upstream sides together: the bench opens up to
/// TW_BENCH_MAX_INFLIGHT [2000] streams, each one client and one upstream connection, and the idle
/// upstream pool keeps up to 2048 more.
const WORKER_CONNECTIONS: usize = 8192;

/// TW_BENCH_REFERENCE: whether every run's load also goes through the reference nginx.
pub fn wanted() -> bool {
    match std::env::var("TW_BENCH_REFERENCE")
        .unwrap_or_default()
        .trim()
    {
        "" | "none" | "off" | "0" => false,
        "nginx" => true,
        other => panic!(
            "TW_BENCH_REFERENCE={other:?}: the only reference proxy is `nginx` (or leave it unset)"
        ),
    }
}

/// nginx as a reverse proxy on 127.0.0.1, stopped (its workers with it) when dropped.
pub struct Nginx {
    pub uri: Uri,
    pub version: String,
    workers: usize,
    pinned: Option<String>,
    // Dropped in this order: the child (SIGKILL if `drop` could not stop it), then its directory.
    child: ChildGuard,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// Start nginx in front of `upstream` (on the CPUs of `pin`, a taskset list, as tokenwatch) and
    /// wait until it accepts connections; panics, with nginx's log, when it cannot.
    pub fn start(upstream: SocketAddr, pin: Option<&str>) -> Nginx {
        let bin = find_binary();
        let version = version(&bin);
        let dir = tempfile::Builder::new()
            .prefix("tw-bench-nginx")
            .tempdir()
            .expect("tempdir for nginx");
        let listen = free_addr();
        // One worker per CPU the proxy may use, as tokenwatch's proxy runtime has one thread per CPU.
        let workers = pin
            .map(|cpus| cpu_list(cpus).len().max(1))
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            });
        let conf = dir.path().join("nginx.conf");
        std::fs::write(
            &conf,
            render_config(dir.path(), listen, upstream, workers, running_as_root()),
        )
        .expect("write nginx.conf");
        let log = dir.path().join("error.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("create nginx log");
        let err = out.try_clone().expect("nginx log handle");
        // What nginx says before it has read `error_log` goes to stderr (Debian's build), so to `log` too.
        let child = pinned_command(bin.as_os_str(), pin)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut nginx = Nginx {
            uri: format!("http://{listen}/v1/chat/completions")
                .parse()
                .expect("nginx uri"),
            version,
            workers,
            pinned: pin.map(str::to_string),
            child: ChildGuard { child, log },
            _dir: dir,
        };
        nginx.wait_accepting(listen);
        nginx
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    fn wait_accepting(&mut self, listen: SocketAddr) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.child.try_wait() {
                panic!(
                    "nginx exited at start ({status}); its log:\n{}",
                    self.child.log_tail()
                );
            }
            if TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_ok() {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "nginx never accepted connections on {listen}; its log:\n{}",
                    self.child.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One stream through nginx must arrive whole before any run counts.
    pub async fn check_stream(&self, c: &HttpClient, chunks: usize) {
        match one_stream(c, &self.uri, None, None).await {
            Ok(sample) if sample.content == chunks => {}
            Ok(sample) => panic!(
                "{}: {} content chunks, expected {chunks}",
                self.uri, sample.content
            ),
            Err(e) => panic!("{}: {e}; nginx log:\n{}", self.uri, self.child.log_tail()),
        }
    }

    /// The report's sentence on what the reference is.
    pub fn describe(&self) -> String {
        let placement = match &self.pinned {
            Some(cpus) => format!("pinned to CPU(s) {cpus} as tokenwatch"),
            None => "sharing the CPUs as tokenwatch does".into(),
        };
        format!(
            "Reference proxy: after each run's direct and tokenwatch passes, the same load went through {} ({} worker processes, \
             one per CPU it may use, {placement}; `proxy_buffering off`, HTTP/1.1 keep-alive upstream pool of 2048, no access log). \
             What nginx adds is the floor of a proxy hop on this machine under this load; tokenwatch's excess over it is its own cost.\n",
            self.version, self.workers
        )
    }

    /// What nginx adds over the run's direct pass, beside what tokenwatch adds, and nginx's CPU.
    pub fn table(
        &self,
        out: &mut String,
        direct: &RunResult,
        tokenwatch: &RunResult,
        nginx: &RunResult,
    ) {
        let _ = writeln!(
            out,
            "Reference: {} on the same load, against the same direct run:\n",
            self.version
        );
        let _ = writeln!(
            out,
            "| metric | direct | nginx | added by nginx | added by tokenwatch | tokenwatch − nginx |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
        let rows: [(&str, f64); 6] = [
            ("TTFT p50 (ms)", 0.50),
            ("TTFT p99 (ms)", 0.99),
            ("TTFT p99.9 (ms)", 0.999),
            ("chunk delivery upstream→client p50 (ms)", 0.50),
            ("chunk delivery upstream→client p99 (ms)", 0.99),
            ("chunk delivery upstream→client p99.9 (ms)", 0.999),
        ];
        for (name, q) in rows {
            let pick = |r: &RunResult| quantile_ms(r, name, q);
            let (d, n, t) = (pick(direct), pick(nginx), pick(tokenwatch));
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} |",
                ms(d),
                ms(n),
                signed_ms(n - d),
                signed_ms(t - d),
                signed_ms(t - n)
            );
        }
        let (ad, an, at) = (achieved(direct), achieved(nginx), achieved(tokenwatch));
        let _ = writeln!(
            out,
            "| achieved ok streams/s (ratio to direct) | {ad:.0} | {an:.0} ({}) | | tokenwatch: {at:.0} ({}) | |",
            ratio(an, ad),
            ratio(at, ad)
        );
        let _ = writeln!(
            out,
            "| streams ok / scheduled | {} / {} | {} / {} | | | |",
            direct.stats.ok, direct.issued, nginx.stats.ok, nginx.issued
        );
        let _ = writeln!(
            out,
            "| errors | {} | {} | | | |",
            errors_text(&direct.stats),
            errors_text(&nginx.stats)
        );
        let cpu = |r: &RunResult| match r.cpu_tw_s {
            Some(s) => format!(
                "{:.2} ({:.0} µs)",
                s / r.issue_window_s,
                s / r.stats.ok.max(1) as f64 * 1e6
            ),
            None => "n/a".into(),
        };
        let _ = writeln!(
            out,
            "| CPU: the proxy, cores (µs CPU per stream) | — | {} | | tokenwatch: {} | |",
            cpu(nginx),
            cpu(tokenwatch)
        );
        let _ = writeln!(
            out,
            "| CPU: this process (client + upstream), cores | {:.2} | {:.2} | | | |",
            direct.cpu_self_s / direct.issue_window_s,
            nginx.cpu_self_s / nginx.issue_window_s
        );
        let _ = writeln!(out);
    }
}

impl Drop for Nginx {
    /// SIGTERM (fast shutdown: the master stops its workers, then exits); whatever is still there
    /// after 5 s is killed, workers included, so nothing outlives the bench.
    fn drop(&mut self) {
        let pid = self.pid().to_string();
        let workers = child_pids(&pid);
        let _ = Command::new("kill")
            .args(["-TERM", &pid])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for worker in workers {
            let _ = Command::new("kill")
                .args(["-KILL", &worker.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        // ChildGuard's drop kills and reaps the master.
    }
}

/// The reference's configuration: every path nginx writes inside `prefix`, streaming without
/// buffering both ways, pooled keep-alive connections to the upstream as tokenwatch has.
///
/// Master plus one worker per CPU: the parallelism of tokenwatch's proxy runtime (one tokio thread
/// per CPU), so on a 2-core box both proxies can run on both cores while the load generator and the
/// upstream share them. A single process (`master_process off`, a mode nginx documents for
/// development) would be one event loop on one core: a floor handicapped at 1,000 streams, not the
/// floor of a hop. `reuseport` gives each worker its own listening socket, which the kernel spreads
/// connections over evenly, as tokio spreads tokenwatch's connections over its threads. Keep-alive
/// limits are raised so neither side reconnects during a run, as neither side does with tokenwatch.
pub fn render_config(
    prefix: &Path,
    listen: SocketAddr,
    upstream: SocketAddr,
    workers: usize,
    as_root: bool,
) -> String {
    let p = |name: &str| format!("\"{}\"", prefix.join(name).display());
    // Started as root, nginx would run its workers as `nobody`, who cannot enter the 0700 tempdir.
    let user = if as_root { "user root;\n" } else { "" };
    format!(
        "# Rendered by the tokenwatch proxy bench (benches/proxy/reference.rs).
{user}daemon off;
master_process on;
worker_processes {workers};
worker_rlimit_nofile {rlimit};
pid {pid};
lock_file {lock};
error_log {log} warn;

events {{
    worker_connections {WORKER_CONNECTIONS};
}}

http {{
    access_log off;
    tcp_nodelay on;
    keepalive_timeout 300s;
    keepalive_requests 1000000;
    client_body_temp_path {body};
    proxy_temp_path {proxy};
    fastcgi_temp_path {fastcgi};
    uwsgi_temp_path {uwsgi};
    scgi_temp_path {scgi};

    upstream bench_upstream {{
        server {upstream};
        keepalive 2048;
        keepalive_timeout 300s;
        keepalive_requests 1000000;
    }}

    server {{
        listen {listen} reuseport backlog=4096;
        location / {{
            proxy_pass http://bench_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
",
        rlimit = 2 * WORKER_CONNECTIONS,
        pid = p("nginx.pid"),
        lock = p("nginx.lock"),
        log = p("error.log"),
        body = p("client_body_temp"),
        proxy = p("proxy_temp"),
        fastcgi = p("fastcgi_temp"),
        uwsgi = p("uwsgi_temp"),
        scgi = p("scgi_temp"),
    )
}

fn find_binary() -> PathBuf {
    let on_path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("nginx")).collect())
        .unwrap_or_default();
    on_path.into_iter().chain([PathBuf::from("/usr/sbin/nginx")]).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!(
            "TW_BENCH_REFERENCE=nginx: no nginx on PATH or at /usr/sbin/nginx. Install it (`apt-get install nginx-light` on \
             Debian/Ubuntu) or unset TW_BENCH_REFERENCE"
        )
    })
}

/// `nginx/1.22.1`, from `nginx -v` (which prints to stderr).
fn version(bin: &Path) -> String {
    let text = Command::new(bin)
        .arg("-v")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default();
    text.trim()
        .strip_prefix("nginx version: ")
        .map(str::to_string)
        .unwrap_or_else(|| "nginx".into())
}

/// Effective user id 0, from `/proc/self/status` (`Uid: real effective saved fs`).
fn running_as_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .is_some_and(|euid| euid == "0")
}
