// The detector as a pipeline sink: every record's versions go through `VersionDetector` on the
// pipeline thread; markers are written by a thread of their own so the pipeline never waits.

use super::VersionDetector;
use crate::pipeline::{RecordSink, SinkError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::Duration;
use tokenwatch_core::model::RequestRecord;
use tokenwatch_store::{MarkerRow, RecordQuery, Store, StoreError};

/// Marker batches waiting for the writer (markers are rare: a full queue means the store is down).
const QUEUE: usize = 256;
/// Stored records read at start to learn the live versions.
const SEED_RECORDS: usize = 2_000;
/// Tries per batch while the store refuses it (one once the sink is closing, so a store that is
/// down cannot hold the shutdown).
const ATTEMPTS: u32 = 5;

pub struct MarkerSink {
    detector: VersionDetector,
    tx: Option<SyncSender<Vec<MarkerRow>>>,
    writer: Option<std::thread::JoinHandle<()>>,
    closing: Arc<AtomicBool>,
}

impl MarkerSink {
    /// Learns the live versions from the newest stored records, then starts the writer thread.
    /// Blocking (it reads the store): call it off async threads.
    pub fn start(store: Arc<dyn Store>) -> Result<MarkerSink, StoreError> {
        let mut seed = store.query_records(&RecordQuery {
            limit: SEED_RECORDS,
            ..Default::default()
        })?;
        seed.reverse();
        let mut detector = VersionDetector::new();
        detector.seed(&seed);
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let closing = Arc::new(AtomicBool::new(false));
        let stop = closing.clone();
        let writer = std::thread::Builder::new()
            .name("tokenwatch-markers".into())
            .spawn(move || write_loop(store, rx, &stop))
            .map_err(|e| {
                StoreError::Config(format!("cannot start the marker writer thread: {e}"))
            })?;
        Ok(MarkerSink {
            detector,
            tx: Some(tx),
            writer: Some(writer),
            closing,
        })
    }
}

fn write_loop(store: Arc<dyn Store>, rx: Receiver<Vec<MarkerRow>>, closing: &AtomicBool) {
    for batch in rx {
        for attempt in 1..=ATTEMPTS {
            let last = attempt == ATTEMPTS || closing.load(Ordering::Relaxed);
            match store.insert_markers(&batch) {
                Ok(()) => {
                    for m in &batch {
                        tracing::info!(id = %m.id, kind = %m.kind, model = %m.model,
                            from = %m.from_version, to = %m.to_version, "version marker");
                    }
                    break;
                }
                Err(e) if last => {
                    tracing::error!(error = %e, markers = batch.len(), "markers not stored; dropped");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "storing markers failed; retrying");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }
}

impl RecordSink for MarkerSink {
    fn name(&self) -> &'static str {
        "markers"
    }

    fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError> {
        let found: Vec<MarkerRow> = batch
            .iter()
            .flat_map(|r| self.detector.observe_record(r))
            .collect();
        if found.is_empty() {
            return Ok(());
        }
        let Some(tx) = &self.tx else {
            return Ok(());
        };
        match tx.try_send(found) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(lost)) | Err(TrySendError::Disconnected(lost)) => {
                Err(SinkError::Failed {
                    sink: "markers",
                    message: format!(
                        "{} markers dropped: the marker writer is behind",
                        lost.len()
                    ),
                })
            }
        }
    }
}

impl Drop for MarkerSink {
    /// Closes the queue and waits for the writer to store what is queued (at shutdown, after
    /// the pipeline's last batch).
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        self.tx = None;
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwatch_store::{MarkerQuery, SqliteStore, StoreOptions};

    fn rec(version: &str, at: i64) -> RequestRecord {
        let mut r = RequestRecord {
            arrival_unix_ms: at,
            ..Default::default()
        };
        r.labels.model_id = "m".into();
        r.labels.model_version = version.into();
        r.span.span_id = "00f067aa0ba902b7".into();
        r
    }

    #[test]
    fn markers_reach_the_store_and_a_restart_remembers_the_live_version() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(dir.path(), StoreOptions::default()).unwrap());
        let v1: Vec<RequestRecord> = (0..60).map(|i| rec("v1", i)).collect();
        store.insert_records(&v1).unwrap();
        let mut sink = MarkerSink::start(store.clone()).unwrap();
        // The store already says v1 is live: more v1 is no change.
        sink.consume(&v1).unwrap();
        let v2: Vec<RequestRecord> = (100..160).map(|i| rec("v2", i)).collect();
        sink.consume(&v2).unwrap();
        drop(sink);
        let got = store.query_markers(&MarkerQuery::default()).unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (
                got[0].from_version.as_str(),
                got[0].to_version.as_str(),
                got[0].at_unix_ms
            ),
            ("v1", "v2", 100)
        );
        assert_eq!(got[0].source, "proxy");
    }
}
