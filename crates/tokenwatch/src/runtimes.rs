// The threads tokenwatch runs on: the proxy's own tokio runtime (nothing else is scheduled
// there), and the analysis runtime whose threads run at a lower CPU priority than serving.

use serde::Deserialize;
use std::time::Duration;
use tokio::runtime::Runtime;

/// `runtime:` in the configuration.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker threads of the proxy's runtime; 0 = one per CPU.
    pub proxy_threads: usize,
    /// Niceness added to the analysis threads (alert evaluation, roll-ups, the timeline sampler,
    /// the pipeline's aggregation and store writes): 0–19, 0 = same priority as the proxy.
    /// On a busy machine the scheduler then gives a forwarded byte the CPU before analysis.
    pub analysis_niceness: i32,
    /// Linux: run the analysis threads under SCHED_IDLE instead (niceness then has no effect):
    /// a proxy thread that wakes takes the CPU from them at once, rather than after their
    /// slice. For a proxy that shares its CPUs with analysis and wants the flattest tail; on a
    /// host whose CPUs other work keeps busy, analysis (and so alerting) then gets almost none.
    pub analysis_idle: bool,
    /// Linux 6.12+ (EEVDF): the scheduler slice the proxy's threads ask for, in µs (100–100,000;
    /// 0 = the kernel's default, a few ms). A woken thread with a shorter slice than the running
    /// one preempts it at once, so a forwarded chunk does not wait out an analysis thread's
    /// slice on a shared CPU; unlike SCHED_IDLE, analysis keeps the share its niceness gives it.
    pub proxy_slice_us: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            proxy_threads: 0,
            analysis_niceness: 10,
            analysis_idle: false,
            proxy_slice_us: 100,
        }
    }
}

impl RuntimeConfig {
    /// The slice the proxy's threads ask for; `None` leaves the kernel's default.
    pub fn proxy_slice(&self) -> Result<Option<Duration>, String> {
        if self.proxy_slice_us == 0 {
            return Ok(None);
        }
        let slice = Duration::from_micros(self.proxy_slice_us);
        let (min, max) = (tokenwatch_sched::MIN_SLICE, tokenwatch_sched::MAX_SLICE);
        if !(min..=max).contains(&slice) {
            return Err(format!(
                "must be 0 (the kernel's default) or {}–{} µs, got {}",
                min.as_micros(),
                max.as_micros(),
                self.proxy_slice_us
            ));
        }
        Ok(Some(slice))
    }

    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0..=19).contains(&self.analysis_niceness) {
            return Err((
                "runtime.analysis_niceness",
                format!("must be 0–19, got {}", self.analysis_niceness),
            ));
        }
        if let Err(e) = self.proxy_slice() {
            return Err(("runtime.proxy_slice_us", e));
        }
        if self.proxy_threads > 1024 {
            return Err((
                "runtime.proxy_threads",
                format!("must be at most 1024, got {}", self.proxy_threads),
            ));
        }
        Ok(())
    }
}

/// The proxy's runtime: its listener, connections, upstream client and timers live here, so a
/// long evaluation or a store write on another runtime never delays a forwarded chunk.
pub fn proxy_runtime(cfg: &RuntimeConfig) -> std::io::Result<Runtime> {
    let threads = if cfg.proxy_threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        cfg.proxy_threads
    };
    let slice = cfg.proxy_slice().ok().flatten();
    let told = std::sync::Once::new();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("tw-proxy")
        .on_thread_start(move || {
            if let Some(slice) = slice {
                set_current_thread_slice(slice, &told);
            }
        })
        .enable_all()
        .build()
}

/// The analysis runtime: one worker (evaluation is sequential) plus its blocking pool, all at
/// the analysis priority (`analysis_priority`).
pub fn analysis_runtime(cfg: &RuntimeConfig) -> std::io::Result<Runtime> {
    let priority = analysis_priority(cfg);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("tw-analysis")
        .on_thread_start(move || lower_current_thread_priority(priority))
        .enable_all()
        .build()
}

/// The priority every analysis thread lowers itself to when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AnalysisPriority {
    /// Absolute niceness (the default, 0, is the serving threads' own).
    pub niceness: i32,
    /// SCHED_IDLE (`runtime.analysis_idle`), in place of the niceness.
    pub idle: bool,
}

/// The analysis threads' priority under `cfg`, relative to the calling (serving) thread.
pub fn analysis_priority(cfg: &RuntimeConfig) -> AnalysisPriority {
    AnalysisPriority {
        niceness: analysis_niceness_target(cfg.analysis_niceness),
        idle: cfg.analysis_idle,
    }
}

/// Lower the calling thread to `priority`. Lowering needs no privilege; a failure is logged and
/// the thread keeps running at its priority.
pub fn lower_current_thread_priority(priority: AnalysisPriority) {
    if priority.idle {
        set_current_thread_idle();
    } else {
        set_current_thread_niceness(priority.niceness);
    }
}

/// Ask for `slice` on the calling proxy thread. A kernel without slices per thread (before 6.12)
/// or one that refuses leaves the default; `told` logs that once, not for every thread.
fn set_current_thread_slice(slice: Duration, told: &std::sync::Once) {
    match tokenwatch_sched::set_current_thread_slice(slice) {
        Ok(()) => told.call_once(|| tracing::debug!(?slice, "proxy threads run with a short scheduler slice")),
        Err(e) => told.call_once(|| {
            tracing::info!(error = %e, "proxy threads keep the kernel's scheduler slice (runtime.proxy_slice_us)")
        }),
    }
}

/// SCHED_IDLE for the calling thread. The crate also resets the thread's niceness to 0, which an
/// unprivileged thread at a higher niceness may not do; that error is moot once the policy took.
#[cfg(target_os = "linux")]
fn set_current_thread_idle() {
    use thread_priority::unix::{
        NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
        thread_native_id, thread_schedule_policy,
    };
    let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
    let set = set_thread_priority_and_policy(
        thread_native_id(),
        thread_priority::ThreadPriority::Min,
        idle,
    );
    if thread_schedule_policy().ok() != Some(idle) {
        tracing::warn!(error = ?set.err(), "could not put an analysis thread under SCHED_IDLE");
    }
}

#[cfg(not(target_os = "linux"))]
fn set_current_thread_idle() {
    tracing::debug!("SCHED_IDLE is only set on Linux");
}

/// The absolute niceness analysis threads get: the calling (serving) thread's plus `niceness`.
/// Absolute, because a thread inherits its creator's niceness: adding again would compound.
fn analysis_niceness_target(niceness: i32) -> i32 {
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
/// other thread).
fn set_current_thread_niceness(target: i32) {
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
        let bad = RuntimeConfig {
            analysis_niceness: 25,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().0, "runtime.analysis_niceness");
        for us in [1, 99, 100_001] {
            let bad = RuntimeConfig {
                proxy_slice_us: us,
                ..Default::default()
            };
            let (key, why) = bad.validate().unwrap_err();
            assert_eq!(key, "runtime.proxy_slice_us");
            assert!(
                why.contains(&us.to_string()) && why.contains("100–100000"),
                "{why}"
            );
        }
        for us in [0, 100, 100_000] {
            assert!(
                RuntimeConfig {
                    proxy_slice_us: us,
                    ..Default::default()
                }
                .validate()
                .is_ok(),
                "{us}"
            );
        }
    }

    /// The proxy's workers and its blocking pool ask for the configured slice where the kernel
    /// keeps one (6.12+); the analysis runtime's threads keep the kernel's.
    #[cfg(target_os = "linux")]
    #[test]
    fn proxy_threads_get_the_configured_slice() {
        use std::time::Duration;
        let slice = || tokenwatch_sched::current_thread_slice().unwrap();
        let cfg = RuntimeConfig {
            proxy_slice_us: 700,
            ..Default::default()
        };
        let proxy = proxy_runtime(&cfg).unwrap();
        let worker =
            proxy.block_on(async move { tokio::spawn(async move { slice() }).await.unwrap() });
        let blocking =
            proxy.block_on(async move { tokio::task::spawn_blocking(slice).await.unwrap() });
        proxy.shutdown_background();
        let analysis = analysis_runtime(&cfg).unwrap();
        let other =
            analysis.block_on(async move { tokio::spawn(async move { slice() }).await.unwrap() });
        analysis.shutdown_background();
        let Some(default) = other else {
            // A kernel before 6.12 keeps no slice per thread: nothing was set anywhere.
            assert_eq!((worker, blocking), (None, None));
            return;
        };
        assert_eq!(worker, Some(Duration::from_micros(700)));
        assert_eq!(blocking, Some(Duration::from_micros(700)));
        assert_ne!(default, Duration::from_micros(700));
    }

    /// `runtime.analysis_idle`: every analysis thread, the runtime's workers and blocking pool
    /// as the pipeline's own threads, runs under SCHED_IDLE; the proxy's do not.
    #[cfg(target_os = "linux")]
    #[test]
    fn analysis_idle_puts_analysis_threads_under_sched_idle() {
        use thread_priority::unix::{
            NormalThreadSchedulePolicy, ThreadSchedulePolicy, thread_schedule_policy,
        };
        let idle = Ok(ThreadSchedulePolicy::Normal(
            NormalThreadSchedulePolicy::Idle,
        ));
        let cfg = RuntimeConfig {
            analysis_idle: true,
            ..Default::default()
        };
        let rt = analysis_runtime(&cfg).unwrap();
        let worker = rt.block_on(async {
            tokio::spawn(async { thread_schedule_policy() })
                .await
                .unwrap()
        });
        assert_eq!(worker, idle);
        let blocking = rt.block_on(async {
            tokio::task::spawn_blocking(thread_schedule_policy)
                .await
                .unwrap()
        });
        assert_eq!(blocking, idle);
        rt.shutdown_background();
        let priority = analysis_priority(&cfg);
        let own_thread = std::thread::spawn(move || {
            lower_current_thread_priority(priority);
            thread_schedule_policy()
        });
        assert_eq!(own_thread.join().unwrap(), idle);
        let proxy = proxy_runtime(&cfg).unwrap();
        let serving = proxy.block_on(async {
            tokio::spawn(async { thread_schedule_policy() })
                .await
                .unwrap()
        });
        assert_eq!(
            serving,
            Ok(ThreadSchedulePolicy::Normal(
                NormalThreadSchedulePolicy::Other
            ))
        );
        proxy.shutdown_background();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn analysis_threads_run_at_the_configured_niceness() {
        let rt = analysis_runtime(&RuntimeConfig {
            analysis_niceness: 7,
            ..Default::default()
        })
        .unwrap();
        let base = std::thread::spawn(|| {
            rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
        })
        .join()
        .unwrap();
        let inside = rt.block_on(async {
            tokio::spawn(async {
                rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
            })
            .await
            .unwrap()
        });
        assert_eq!(inside, (base + 7).min(19));
        let blocking = rt.block_on(async {
            tokio::task::spawn_blocking(|| {
                rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
            })
            .await
            .unwrap()
        });
        assert_eq!(blocking, (base + 7).min(19));
        rt.shutdown_background();
    }
}
