// The audit log: the `audit:` configuration, the handle that queues entries off the request
// path (dropping and counting them when the queue is full), and the writer thread's lifecycle.

pub mod entry;
pub mod http;
pub mod refusals;
pub mod writer;

use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::Metrics;
use chrono::Utc;
pub use entry::{AuditEvent, Record, RequestEntry};
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use writer::Msg;

/// Entries queued for the writer at most; beyond, new ones are dropped and counted.
const QUEUE_CAPACITY: usize = 16_384;
/// At shutdown, how long the writer may wait for the API's last entries before it closes.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Write the audit log.
    pub enabled: bool,
    /// Day files older than this are deleted (at start and daily); at least `1d`.
    pub retention: HumanDuration,
    /// Where the day files go [default: `<data_dir>/audit`].
    pub dir: Option<PathBuf>,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            enabled: true,
            retention: HumanDuration(Duration::from_secs(30 * 86_400)),
            dir: None,
        }
    }
}

impl AuditConfig {
    /// The directory of the day files.
    pub fn dir(&self, data_dir: &std::path::Path) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| data_dir.join("audit"))
    }
}

/// Checks of the `audit:` section for `Config::validate`.
pub fn validate(audit: &AuditConfig) -> Result<(), (String, String)> {
    if audit.retention.0 < Duration::from_secs(86_400) {
        return Err((
            "audit.retention".into(),
            "must be at least 1d (the log is kept in one file per day)".into(),
        ));
    }
    Ok(())
}

struct Inner {
    tx: SyncSender<Msg>,
    dropped: Counter,
}

/// A cheap handle to queue audit records; the default one (audit log off) records nothing.
#[derive(Clone, Default)]
pub struct AuditLog(Option<Arc<Inner>>);

impl AuditLog {
    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Queue `record` without waiting: a full queue drops it and counts it.
    fn send(&self, record: Record) {
        let Some(inner) = &self.0 else { return };
        match inner.tx.try_send(Msg::Record(Box::new(record))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                inner.dropped.inc();
            }
        }
    }

    /// Record one API request (or refused attempt).
    pub fn request(&self, entry: RequestEntry) {
        self.send(Record::Request(entry));
    }

    /// Record a configuration change or admin action, stamped now.
    pub fn event(&self, event: AuditEvent) {
        self.send(Record::Event {
            ts: Utc::now(),
            event,
        });
    }

    /// Entries dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.0.as_ref().map_or(0, |i| i.dropped.get())
    }
}

/// For tests: a handle whose records stay in the returned queue.
#[cfg(test)]
pub(crate) fn test_log(capacity: usize) -> (AuditLog, std::sync::mpsc::Receiver<Msg>) {
    let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
    let inner = Inner {
        tx,
        dropped: Counter::default(),
    };
    (AuditLog(Some(Arc::new(inner))), rx)
}

/// Start the audit log of `audit` (its files under `data_dir` unless `audit.dir` says where):
/// create its directory, delete expired files, start the writer
/// thread and expose `tokenwatch_audit_dropped_total`. The returned task closes the writer
/// (flushing it) once `stop` is set. Off (`audit.enabled: false`): a handle that records nothing.
pub fn start(
    audit: &AuditConfig,
    data_dir: &std::path::Path,
    metrics: &Metrics,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<(AuditLog, Option<JoinHandle<()>>)> {
    if !audit.enabled {
        return Ok((AuditLog::default(), None));
    }
    let dir = audit.dir(data_dir);
    writer::create_dir(&dir)
        .map_err(|e| anyhow::anyhow!("audit.dir: cannot create {}: {e}", dir.display()))?;
    match writer::prune(&dir, audit.retention.0, Utc::now().date_naive()) {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(deleted = n, dir = %dir.display(), "audit: expired audit files deleted")
        }
        Err(e) => {
            anyhow::bail!("audit.dir: cannot list {}: {e}", dir.display());
        }
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_CAPACITY);
    let w = writer::Writer::new(dir.clone(), audit.retention.0);
    let thread = std::thread::Builder::new()
        .name("tw-audit".into())
        .spawn(move || w.run(rx))
        .map_err(|e| anyhow::anyhow!("starting the audit writer thread: {e}"))?;
    let inner = Arc::new(Inner {
        tx,
        dropped: Counter::default(),
    });
    metrics.register(
        "tokenwatch_audit_dropped",
        "Audit log entries dropped because the writer's queue was full",
        inner.dropped.clone(),
    );
    tracing::info!(dir = %dir.display(), retention = ?audit.retention.0, "audit: logging API requests");
    let closer = spawn_closer(thread, Arc::downgrade(&inner), stop);
    Ok((AuditLog(Some(inner)), Some(closer)))
}

/// Once `stop` is set: give the writer `CLOSE_GRACE` to end by itself (it does when the last
/// handle, held by the API's router, is gone), then tell it to close, and wait for its flush.
fn spawn_closer(
    thread: std::thread::JoinHandle<()>,
    inner: Weak<Inner>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
        let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
        while !thread.is_finished() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let tx = inner.upgrade().map(|i| i.tx.clone());
        let joined = tokio::task::spawn_blocking(move || {
            if let Some(tx) = tx {
                // The writer is draining, so this waits at most for a full queue to be written.
                let _ = tx.send(Msg::Close);
            }
            thread.join()
        })
        .await;
        if !matches!(joined, Ok(Ok(()))) {
            tracing::error!("audit: the writer thread failed; the last entries may be lost");
        }
    })
}
