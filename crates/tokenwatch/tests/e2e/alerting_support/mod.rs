// Shared by the alerting end-to-end tests: a tokenwatch (optionally in front of a simulator) with
// a test configuration, alert polling, a webhook receiver, and streaming traffic with headers.
#![allow(dead_code)]

use crate::common::{
    Proc, any_addr, get, ready_on, send, start_otlp_collector, start_sim, start_tokenwatch,
};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const MODEL: &str = "sim-llama-8b";

/// Fast simulator settings: short outputs so windows fill in seconds.
pub const FAST: &[&str] = &["--itl-ms", "4", "--max-tokens", "24", "--ttft-ms", "40"];

/// A running tokenwatch (and its simulator, when it proxies one), killed when dropped.
pub struct Stack {
    pub sim_proc: Option<Proc>,
    pub tw: Proc,
    pub sim: Option<SocketAddr>,
    pub api: SocketAddr,
    pub proxy: SocketAddr,
    pub otlp_http: SocketAddr,
    pub dir: tempfile::TempDir,
}

impl Stack {
    /// The simulator with `sim_args`, tokenwatch proxying it with `config` (YAML), each on
    /// ports it picks.
    pub async fn with_sim(sim_args: &[&str], config: &str) -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let (sim_proc, sim) = start_sim(dir.path(), sim_args).await;
        let cfg = write_config(dir.path(), config);
        let tw = start_tokenwatch(
            dir.path(),
            any_addr(),
            any_addr(),
            &format!("http://{sim}"),
            &["--config", &cfg],
        );
        let bound = tw.listening().await;
        let (api, proxy) = ready_on(&tw).await;
        Stack {
            sim_proc: Some(sim_proc),
            tw,
            sim: Some(sim),
            api,
            proxy,
            otlp_http: bound["otlp_http"],
            dir,
        }
    }

    /// tokenwatch alone (no upstream): for GPU replays and OTLP input. Its `proxy` is port 0:
    /// a collector has none.
    pub async fn collector(config: &str) -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_config(dir.path(), config);
        let (tw, api, _grpc, http) = start_otlp_collector(dir.path(), Path::new(&cfg)).await;
        Stack {
            sim_proc: None,
            tw,
            sim: None,
            api,
            proxy: any_addr(),
            otlp_http: http,
            dir,
        }
    }

    pub async fn alerts(&self) -> Vec<Value> {
        let r = get(&format!("http://{}/api/v1/alerts", self.api)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["alerts"].as_array().cloned().unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let log = self.tw.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Poll until an alert of `rule` matching `pred` has fired; fails with the alerts and log.
    pub async fn wait_firing(
        &self,
        rule: &str,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let all = self.alerts().await;
            if let Some(a) = all
                .iter()
                .find(|a| a["rule"] == rule && !a["fired_at_unix_ms"].is_null() && pred(a))
            {
                return a.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no firing {rule} alert within {within:?}; alerts: {all:#?}\ntokenwatch log tail:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn write_config(dir: &Path, config: &str) -> String {
    let cfg = dir.join("tokenwatch.yaml");
    std::fs::write(&cfg, config).unwrap();
    cfg.display().to_string()
}

/// One request of the traffic: body text and headers.
pub struct Req {
    pub content: String,
    pub headers: Vec<(&'static str, String)>,
    /// `max_tokens` of the request (the simulator's default cap when `None`).
    pub max_tokens: Option<u32>,
}

/// Builds request `i` of worker `w` in the current phase.
pub type MakeReq = Arc<dyn Fn(u64, u64, u64) -> Req + Send + Sync>;

/// `workers` concurrent streaming clients until stopped; `phase` is read by the request builder.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    pub done: Arc<AtomicU64>,
    pub phase: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    pub fn start(proxy: SocketAddr, workers: u64, make: MakeReq) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let phase = Arc::new(AtomicU64::new(0));
        let url = format!("http://{proxy}/v1/chat/completions");
        let tasks = (0..workers)
            .map(|w| {
                let (stop, done, phase, url, make) = (
                    stop.clone(),
                    done.clone(),
                    phase.clone(),
                    url.clone(),
                    make.clone(),
                );
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let req = make(phase.load(Ordering::Relaxed), w, i);
                        let mut body = json!({
                            "model": MODEL,
                            "stream": true,
                            "messages": [{"role": "user", "content": req.content}],
                        });
                        if let Some(m) = req.max_tokens {
                            body["max_tokens"] = json!(m);
                        }
                        let body = body.to_string();
                        let headers: Vec<(&str, &str)> =
                            req.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                        if send("POST", &url, Some(&body), &headers).await.is_ok() {
                            done.fetch_add(1, Ordering::Relaxed);
                        } else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                })
            })
            .collect();
        Traffic {
            stop,
            done,
            phase,
            tasks,
        }
    }

    /// Plain chat requests, each with its own short prompt, from `workers` clients.
    pub fn plain(proxy: SocketAddr, workers: u64) -> Traffic {
        Traffic::start(
            proxy,
            workers,
            Arc::new(|_, w, i| Req {
                content: format!("worker {w} request {i}: say something short"),
                headers: Vec::new(),
                max_tokens: None,
            }),
        )
    }

    pub fn set_phase(&self, p: u64) {
        self.phase.store(p, Ordering::Relaxed);
    }

    pub async fn wait_requests(&self, n: u64, within: Duration) {
        let deadline = Instant::now() + within;
        while self.done.load(Ordering::Relaxed) < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} requests finished in {within:?}",
                self.done.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

/// `n` characters of prompt text that share no prefix-cache block with any other request
/// (the tag comes first), so every one is prefilled in full.
pub fn prompt(tag: &str, chars: usize) -> String {
    let mut s = format!("{tag} ");
    while s.len() < chars {
        s.push_str("lorem ipsum dolor sit amet ");
    }
    s.truncate(chars.max(tag.len()));
    s
}

/// A webhook endpoint recording every notification body it receives.
#[derive(Clone, Default)]
pub struct Hook {
    pub received: Arc<Mutex<Vec<Value>>>,
}

impl Hook {
    pub async fn serve() -> (Hook, String) {
        let hook = Hook::default();
        let h = hook.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |body: axum::body::Bytes| {
                let h = h.clone();
                async move {
                    let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    h.received.lock().unwrap().push(v);
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (hook, format!("http://{addr}/hook"))
    }

    /// Bodies about alerts of `rule` in `state` (`firing`, `resolved`), in arrival order.
    pub fn of(&self, rule: &str, state: &str) -> Vec<Value> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|b| b["alert"]["rule"] == rule && b["alert"]["state"] == state)
            .cloned()
            .collect()
    }

    /// Distinct alerts (by fingerprint) delivered as firing, with their rule names.
    pub fn firing(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .received
            .lock()
            .unwrap()
            .iter()
            .filter(|b| b["alert"]["state"] == "firing")
            .map(|b| {
                (
                    b["alert"]["fingerprint"].as_str().unwrap_or("").to_string(),
                    b["alert"]["rule"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}
