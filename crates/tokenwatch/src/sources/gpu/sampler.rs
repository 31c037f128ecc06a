// The GPU sampling loop: every interval, read the GPUs off the async runtime, attribute processes
// to containers, push signal points, keep the latest snapshot for the API, count reads and errors.

use super::cgroup;
use super::points::{PointContext, snapshot_points};
use super::reader::{GpuReader, GpuSnapshot};
use crate::kernel::telemetry::Metrics;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::signals::SharedSignals;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A failing read is logged at most this often (the count of the others is logged with it).
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// What `/api/v1/gpus` shows: whether the source runs, and its latest reading.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuState {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `nvml` or `replay`.
    pub backend: String,
    /// What is read (`NVML (driver …)`, `replay of …`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reader: String,
    pub interval_ms: u64,
    pub instance: String,
    pub reads: u64,
    pub read_errors: u64,
    pub last_error: Option<String>,
    pub updated_unix_ms: Option<i64>,
    #[serde(skip)]
    pub latest: Option<GpuSnapshot>,
    #[serde(skip)]
    pub device_models: BTreeMap<String, String>,
}

pub type SharedGpuState = Arc<RwLock<GpuState>>;

/// tokenwatch's own metrics about GPU reads.
#[derive(Clone, Default)]
pub struct GpuMetrics {
    pub reads: Counter,
    pub read_errors: Counter,
    pub devices: Gauge,
}

impl GpuMetrics {
    pub fn register(&self, metrics: &Metrics) {
        // Counters are registered without `_total`: the encoder adds it.
        metrics.register(
            "tokenwatch_gpu_reads",
            "GPU reads (NVML or replay) that succeeded",
            self.reads.clone(),
        );
        metrics.register(
            "tokenwatch_gpu_read_errors",
            "GPU reads that failed",
            self.read_errors.clone(),
        );
        metrics.register(
            "tokenwatch_gpu_devices",
            "GPUs seen by the latest read",
            self.devices.clone(),
        );
    }
}

pub struct Sampler {
    pub reader: Box<dyn GpuReader>,
    pub proc_root: PathBuf,
    pub instance: String,
    pub device_models: BTreeMap<String, String>,
    pub signals: SharedSignals,
    pub state: SharedGpuState,
    pub metrics: GpuMetrics,
    error_log: ErrorLog,
}

impl Sampler {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        reader: Box<dyn GpuReader>,
        proc_root: PathBuf,
        instance: String,
        device_models: BTreeMap<String, String>,
        signals: SharedSignals,
        state: SharedGpuState,
        metrics: GpuMetrics,
    ) -> Sampler {
        Sampler {
            reader,
            proc_root,
            instance,
            device_models,
            signals,
            state,
            metrics,
            error_log: ErrorLog::default(),
        }
    }

    /// One read: on success push its points and keep it as the latest; on failure count and log.
    pub fn sample_once(&mut self) {
        let result = self.reader.read();
        let now = now_unix_ms();
        let mut snap = match result {
            Ok(s) => s,
            Err(e) => {
                self.metrics.read_errors.inc();
                let msg = e.to_string();
                self.error_log.failed(&msg);
                let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
                st.read_errors += 1;
                st.last_error = Some(msg);
                return;
            }
        };
        self.error_log.succeeded();
        for p in snap.processes.iter_mut().filter(|p| p.container.is_none()) {
            p.container = cgroup::container_of(&self.proc_root, p.pid);
        }
        let ctx = PointContext {
            source: self.reader.backend(),
            instance: &self.instance,
            device_models: &self.device_models,
            timestamp_unix_ms: now,
        };
        let points = snapshot_points(&snap, &ctx);
        {
            let mut board = self.signals.write().unwrap_or_else(|p| p.into_inner());
            for p in points {
                board.update(p);
            }
        }
        self.metrics.reads.inc();
        self.metrics.devices.set(snap.devices.len() as i64);
        let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
        st.reads += 1;
        st.updated_unix_ms = Some(now);
        st.latest = Some(snap);
    }

    /// Sample every `interval` until shutdown; each read runs on the blocking pool.
    pub fn spawn(self, interval: Duration, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sampler = Some(self);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                let Some(mut s) = sampler.take() else { return };
                match tokio::task::spawn_blocking(move || {
                    s.sample_once();
                    s
                })
                .await
                {
                    Ok(s) => sampler = Some(s),
                    Err(e) => {
                        tracing::error!(error = %e, "GPU sampling stopped: a read panicked");
                        return;
                    }
                }
            }
        })
    }
}

/// Logs the first failure, then at most one line per `ERROR_LOG_EVERY`, and the recovery.
#[derive(Default)]
struct ErrorLog {
    last_logged: Option<Instant>,
    suppressed: u64,
    failing: bool,
}

impl ErrorLog {
    fn failed(&mut self, msg: &str) {
        self.failing = true;
        let due = self
            .last_logged
            .is_none_or(|t| t.elapsed() >= ERROR_LOG_EVERY);
        if due {
            tracing::warn!(error = %msg, suppressed = self.suppressed, "GPU read failed; retrying every interval");
            self.last_logged = Some(Instant::now());
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
    }

    fn succeeded(&mut self) {
        if self.failing {
            tracing::info!(suppressed = self.suppressed, "GPU reads recovered");
            self.failing = false;
            self.suppressed = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gpu::reader::{DeviceReading, GpuError, ProcessReading};
    use tokenwatch_core::signals::{SignalBoard, names};

    /// Fails on the reads listed, otherwise returns one device whose memory grows per read.
    struct Flaky {
        n: u64,
        fail_on: Vec<u64>,
    }

    impl GpuReader for Flaky {
        fn read(&mut self) -> Result<GpuSnapshot, GpuError> {
            self.n += 1;
            if self.fail_on.contains(&self.n) {
                return Err(GpuError::Read(format!("read {} failed", self.n)));
            }
            Ok(GpuSnapshot {
                devices: vec![DeviceReading {
                    index: 0,
                    uuid: "GPU-x".into(),
                    name: "fake".into(),
                    pci_bus_id: String::new(),
                    memory_used_bytes: self.n * 10,
                    memory_total_bytes: 1000,
                    utilization: Some(0.01),
                    temperature_c: None,
                    power_w: None,
                }],
                processes: vec![ProcessReading {
                    pid: 7,
                    device_uuid: "GPU-x".into(),
                    used_memory_bytes: 5,
                    container: None,
                }],
            })
        }
        fn describe(&self) -> String {
            "flaky".into()
        }
        fn backend(&self) -> &'static str {
            "replay"
        }
    }

    #[test]
    fn errors_are_counted_not_fatal_and_processes_get_containers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("7")).unwrap();
        let id = "ab".repeat(32);
        std::fs::write(
            dir.path().join("7/cgroup"),
            format!("0::/system.slice/docker-{id}.scope\n"),
        )
        .unwrap();
        let signals: SharedSignals = Arc::new(RwLock::new(SignalBoard::default()));
        let state: SharedGpuState = Arc::default();
        let metrics = GpuMetrics::default();
        let reader = Box::new(Flaky {
            n: 0,
            fail_on: vec![2],
        });
        let mut s = Sampler::new(
            reader,
            dir.path().into(),
            "h".into(),
            BTreeMap::new(),
            signals.clone(),
            state.clone(),
            metrics.clone(),
        );
        for _ in 0..3 {
            s.sample_once();
        }
        assert_eq!(
            (
                metrics.reads.get(),
                metrics.read_errors.get(),
                metrics.devices.get()
            ),
            (2, 1, 1)
        );
        let st = state.read().unwrap();
        assert_eq!((st.reads, st.read_errors), (2, 1));
        assert_eq!(st.last_error.as_deref(), Some("read 2 failed"));
        let latest = st.latest.as_ref().unwrap();
        assert_eq!(
            latest.processes[0]
                .container
                .as_ref()
                .unwrap()
                .container_id
                .as_deref(),
            Some(id.as_str())
        );
        let board = signals.read().unwrap();
        let history = board.history("", names::GPU_MEMORY_USED_BYTES, "h", "GPU-x");
        assert_eq!(
            history.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
            vec![10.0, 30.0]
        );
        let p = board
            .latest(None)
            .into_iter()
            .find(|p| p.device_id == "GPU-x/7")
            .unwrap();
        assert_eq!(p.notes["container_id"], id);
    }
}
