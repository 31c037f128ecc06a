// The threads tokenwatch runs on: the proxy's own tokio runtime (nothing else is scheduled
// there), and the analysis runtime whose threads run at a lower CPU priority than serving.

use serde::Deserialize;
use tokio::runtime::Runtime;

/// `runtime:` in the configuration.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker threads of the proxy's runtime; 0 = one per CPU.
    pub proxy_threads: usize,
    /// Niceness added to the analysis threads (alert evaluation, roll-ups, the timeline sampler,
    /// the pipeline's aggregation and store writes): 0–19, 0 = same priority as the proxy.
    /// On a busy machine the scheduler then gives a forwarded byte the CPU before analysis.
    pub analysis_niceness: i32,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig { proxy_threads: 0, analysis_niceness: 10 }
    }
}

impl RuntimeConfig {
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0..=19).contains(&self.analysis_niceness) {
            return Err(("runtime.analysis_niceness", format!("must be 0–19, got {}", self.analysis_niceness)));
        }
        if self.proxy_threads > 1024 {
            return Err(("runtime.proxy_threads", format!("must be at most 1024, got {}", self.proxy_threads)));
        }
        Ok(())
    }
}

/// The proxy's runtime: its listener, connections, upstream client and timers live here, so a
/// long evaluation or a store write on another runtime never delays a forwarded chunk.
pub fn proxy_runtime(cfg: &RuntimeConfig) -> std::io::Result<Runtime> {
    let threads = if cfg.proxy_threads == 0 {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    } else {
        cfg.proxy_threads
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("tw-proxy")
        .enable_all()
        .build()
}

/// The analysis runtime: one worker (evaluation is sequential) plus its blocking pool, all at
/// `analysis_niceness` above the calling thread's.
pub fn analysis_runtime(cfg: &RuntimeConfig) -> std::io::Result<Runtime> {
    let target = analysis_niceness_target(cfg.analysis_niceness);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("tw-analysis")
        .on_thread_start(move || set_current_thread_niceness(target))
        .enable_all()
        .build()
}

/// The absolute niceness analysis threads get: the calling (serving) thread's plus `niceness`.
/// Absolute, because a thread inherits its creator's niceness: adding again would compound.
pub fn analysis_niceness_target(niceness: i32) -> i32 {
    (current_thread_niceness() + niceness.max(0)).min(19)
}

#[cfg(target_os = "linux")]
fn current_thread_niceness() -> i32 {
    rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap_or(0)
}

#[cfg(not(target_os = "linux"))]
fn current_thread_niceness() -> i32 {
    0
}

/// Set the calling thread's niceness (Linux schedules threads individually, so this touches no
/// other thread). Lowering priority needs no privilege; a failure is logged and the thread
/// keeps running at its priority.
pub fn set_current_thread_niceness(target: i32) {
    if current_thread_niceness() == target {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), target) {
        tracing::warn!(error = %e, target, "could not lower an analysis thread's priority");
    }
    #[cfg(not(target_os = "linux"))]
    tracing::debug!(target, "per-thread priority is only set on Linux");
}

/// Stop a runtime from async code without blocking the caller's worker: its remaining tasks
/// get `grace` to finish on a blocking thread.
pub async fn shut_down(rt: Runtime, grace: std::time::Duration) {
    let _ = tokio::task::spawn_blocking(move || rt.shutdown_timeout(grace)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_niceness_names_its_key() {
        assert!(RuntimeConfig::default().validate().is_ok());
        let bad = RuntimeConfig { analysis_niceness: 25, ..Default::default() };
        assert_eq!(bad.validate().unwrap_err().0, "runtime.analysis_niceness");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn analysis_threads_run_at_the_configured_niceness() {
        let rt = analysis_runtime(&RuntimeConfig { proxy_threads: 0, analysis_niceness: 7 }).unwrap();
        let base = std::thread::spawn(|| rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap())
            .join()
            .unwrap();
        let inside = rt.block_on(async {
            tokio::spawn(async { rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap() })
                .await
                .unwrap()
        });
        assert_eq!(inside, (base + 7).min(19));
        let blocking = rt.block_on(async {
            tokio::task::spawn_blocking(|| rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap())
                .await
                .unwrap()
        });
        assert_eq!(blocking, (base + 7).min(19));
        rt.shutdown_background();
    }
}
