// The alert-latency bench's moving parts: child processes (simulator, tokenwatch, Prometheus,
// Alertmanager), the metrics relay both scrapers read through, the webhook receiver, HTTP helpers.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_tokenwatch");
pub const PROMETHEUS: &str = "/usr/bin/prometheus";
pub const ALERTMANAGER: &str = "/usr/bin/prometheus-alertmanager";

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr")
}

/// A child process, killed when dropped; its output goes to `<dir>/<name>.log`.
pub struct Proc {
    child: Child,
    pub name: String,
    log: PathBuf,
}

impl Proc {
    pub fn start(name: &str, program: &str, args: &[String], dir: &Path) -> Proc {
        assert!(
            Path::new(program).exists(),
            "{program} is missing — install Debian's `prometheus` and `prometheus-alertmanager` (scripts/test.sh does)"
        );
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        let child = Command::new(program)
            .args(args)
            .env("TOKENWATCH_LOG", "warn")
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e}"));
        Proc {
            child,
            name: name.into(),
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
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

/// One HTTP exchange: status and body text.
pub async fn http(
    c: &Client<HttpConnector, Full<Bytes>>,
    method: &str,
    url: &str,
    body: Option<String>,
) -> Result<(u16, String), String> {
    let mut b = http::Request::builder().method(method).uri(url);
    if body.is_some() {
        b = b.header("content-type", "application/json");
    }
    let req = b
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(20), c.request(req))
        .await
        .map_err(|_| format!("{url}: timed out"))?
        .map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

pub async fn get_json(c: &Client<HttpConnector, Full<Bytes>>, url: &str) -> serde_json::Value {
    match http(c, "GET", url, None).await {
        Ok((200, body)) => serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        _ => serde_json::Value::Null,
    }
}

/// Poll `url` until it answers 200.
pub async fn wait_ready(url: &str, p: &Proc) {
    let c = client();
    for _ in 0..300 {
        if let Ok((200, _)) = http(&c, "GET", url, None).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never became ready; {} log:\n{}", p.name, p.log());
}

/// Framebuffer used (MiB) per GPU UUID in a DCGM exposition.
pub fn fb_used_mib(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{"))
    {
        let uuid = line
            .split("UUID=\"")
            .nth(1)
            .and_then(|r| r.split('"').next());
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(u), Some(v)) = (uuid, value) {
            out.insert(u.to_string(), v);
        }
    }
    out
}

/// What one scraper was served: (time, framebuffer MiB per UUID) per scrape.
pub type ScrapeLog = Arc<Mutex<Vec<(i64, BTreeMap<String, f64>)>>>;

/// A pass-through of the simulator's `/metrics` at `/tw/metrics` (tokenwatch) and
/// `/prom/metrics` (Prometheus) that logs what each scraper received and when.
pub struct Relay {
    pub addr: SocketAddr,
    pub tw: ScrapeLog,
    pub prom: ScrapeLog,
}

impl Relay {
    pub async fn start(sim: SocketAddr) -> Relay {
        let (tw, prom): (ScrapeLog, ScrapeLog) = Default::default();
        let route = |log: ScrapeLog| {
            axum::routing::get(move || {
                let log = log.clone();
                async move {
                    let c = client();
                    let text = match http(&c, "GET", &format!("http://{sim}/metrics"), None).await {
                        Ok((200, t)) => t,
                        _ => return (axum::http::StatusCode::BAD_GATEWAY, String::new()),
                    };
                    let served = now_ms();
                    log.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((served, fb_used_mib(&text)));
                    (axum::http::StatusCode::OK, text)
                }
            })
        };
        let app = axum::Router::new()
            .route("/tw/metrics", route(tw.clone()))
            .route("/prom/metrics", route(prom.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Relay { addr, tw, prom }
    }
}

/// tokenwatch's direct webhook: arrival time and body of every notification.
pub type HookLog = Arc<Mutex<Vec<(i64, serde_json::Value)>>>;

pub async fn start_hook() -> (SocketAddr, HookLog) {
    let log: HookLog = Default::default();
    let l = log.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: Bytes| {
            let l = l.clone();
            async move {
                let at = now_ms();
                let v = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                l.lock().unwrap_or_else(|p| p.into_inner()).push((at, v));
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind hook");
    let addr = listener.local_addr().expect("hook addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, log)
}

/// Alertmanager grouping alerts by `group_by` (notifications routed to `hook`, or nowhere), ready.
pub async fn start_alertmanager(
    dir: &Path,
    hook: Option<SocketAddr>,
    group_by: &[&str],
) -> (Proc, SocketAddr) {
    let cfg = dir.join("alertmanager.yml");
    let receiver = match hook {
        Some(hook) => format!("    webhook_configs:\n      - url: 'http://{hook}/am'\n"),
        None => String::new(),
    };
    let group_by: Vec<String> = group_by.iter().map(|l| format!("'{l}'")).collect();
    std::fs::write(
        &cfg,
        format!(
            "route:\n  receiver: hook\n  group_by: [{}]\n  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n\
             receivers:\n  - name: hook\n{receiver}",
            group_by.join(", ")
        ),
    )
    .expect("write alertmanager.yml");
    let addr = free_addr();
    let args = vec![
        format!("--config.file={}", cfg.display()),
        format!("--storage.path={}", dir.join("am-data").display()),
        format!("--web.listen-address={addr}"),
        "--cluster.listen-address=".to_string(),
    ];
    let p = Proc::start("alertmanager", ALERTMANAGER, &args, dir);
    wait_ready(&format!("http://{addr}/-/ready"), &p).await;
    (p, addr)
}

/// Prometheus scraping the relay's `/prom/metrics` and evaluating `rules` every 15 s.
pub async fn start_prometheus(
    dir: &Path,
    relay: SocketAddr,
    am: SocketAddr,
    rules: &Path,
    interval_s: u64,
) -> (Proc, SocketAddr) {
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: {interval_s}s\n  evaluation_interval: {interval_s}s\n\
             rule_files: ['{}']\n\
             alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{am}']\n\
             scrape_configs:\n  - job_name: sim\n    metrics_path: /prom/metrics\n    static_configs:\n      - targets: ['{relay}']\n",
            rules.display()
        ),
    )
    .expect("write prometheus.yml");
    let addr = free_addr();
    let args = vec![
        format!("--config.file={}", cfg.display()),
        format!("--storage.tsdb.path={}", dir.join("prom-data").display()),
        format!("--web.listen-address={addr}"),
    ];
    let p = Proc::start("prometheus", PROMETHEUS, &args, dir);
    wait_ready(&format!("http://{addr}/-/ready"), &p).await;
    (p, addr)
}
