// Closed-loop load for the proxy bench: N streams kept open at once (each worker sends its next
// request as soon as the previous stream ends), and a poller that reads the API as the UI does.

use super::{
    HttpClient, RunResult, Settings, Stats, cpu_ticks, get_text, one_stream, spawn_mem_sampler,
};
use http::Uri;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TICKS_PER_S: f64 = super::TICKS_PER_S;

/// `concurrency` workers stream back to back for warm-up + measured seconds; a stream counts
/// when it started inside the measured window.
pub async fn closed_loop(
    c: &HttpClient,
    uri: Uri,
    s: &Settings,
    concurrency: usize,
    tw_pid: Option<u32>,
) -> RunResult {
    let stats = Arc::new(Mutex::new(Stats::default()));
    let inflight = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started_total = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let measure_from = t0 + Duration::from_secs_f64(s.warmup_secs);
    let measure_to = measure_from + Duration::from_secs_f64(s.secs);
    let mut workers = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        let (c, uri, stats, inflight, started_total) = (
            c.clone(),
            uri.clone(),
            stats.clone(),
            inflight.clone(),
            started_total.clone(),
        );
        let chunks = s.chunks;
        // Spread the first sends over 100 ms so the run does not open with a connect storm.
        let offset = Duration::from_micros((i as u64 * 100_000) / concurrency.max(1) as u64);
        workers.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            loop {
                let began = Instant::now();
                if began >= measure_to {
                    return;
                }
                let measured = began >= measure_from;
                if measured {
                    started_total.fetch_add(1, Ordering::Relaxed);
                }
                inflight.fetch_add(1, Ordering::Relaxed);
                let r = one_stream(&c, &uri, None, None).await;
                inflight.fetch_sub(1, Ordering::Relaxed);
                let failed = r.is_err();
                if measured {
                    stats.lock().unwrap().add(r, chunks);
                }
                if failed {
                    // A refused connection must not turn into a busy loop.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu0 = (
        tw_pid.map(|p| cpu_ticks(&p.to_string())).unwrap_or(0),
        cpu_ticks("self"),
    );
    let sampler = tw_pid.map(|pid| spawn_mem_sampler(pid, inflight.clone(), stop.clone()));
    tokio::time::sleep_until(measure_to.into()).await;
    let cpu1 = (
        tw_pid.map(|p| cpu_ticks(&p.to_string())).unwrap_or(0),
        cpu_ticks("self"),
    );
    stop.store(true, Ordering::Relaxed);
    let mem = match sampler {
        Some(h) => h.await.ok(),
        None => None,
    };
    for w in workers {
        let _ = w.await;
    }
    let mut stats = Arc::try_unwrap(stats)
        .ok()
        .expect("all workers joined")
        .into_inner()
        .unwrap();
    stats.sort();
    RunResult {
        label: format!("{concurrency} concurrent streams (closed loop)"),
        issued: started_total.load(Ordering::Relaxed) as u64,
        issue_window_s: s.secs,
        lag_p99_ms: f64::NAN,
        stats,
        mem,
        cpu_tw_s: tw_pid.map(|_| cpu1.0.saturating_sub(cpu0.0) as f64 / TICKS_PER_S),
        cpu_self_s: cpu1.1.saturating_sub(cpu0.1) as f64 / TICKS_PER_S,
        kept_bytes: None,
    }
}

/// What a browser on the overview page asks for each second; the counts of answers go into the
/// report so a broken poller is visible.
pub struct UiPoller {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, u64)>,
}

impl UiPoller {
    pub fn start(c: &HttpClient, api: std::net::SocketAddr) -> UiPoller {
        let stop = Arc::new(AtomicBool::new(false));
        let (c, flag) = (c.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let paths = [
                "/api/v1/fleet",
                "/api/v1/alerts",
                "/api/v1/requests?limit=50",
                "/api/v1/gpus",
                "/metrics",
            ];
            let (mut ok, mut failed) = (0u64, 0u64);
            while !flag.load(Ordering::Relaxed) {
                for p in paths {
                    match get_text(&c, &format!("http://{api}{p}")).await {
                        Ok((200, _)) => ok += 1,
                        _ => failed += 1,
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            (ok, failed)
        });
        UiPoller { stop, task }
    }

    /// Stop polling; (answers 200, other answers or failures).
    pub async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or((0, 0))
    }
}
