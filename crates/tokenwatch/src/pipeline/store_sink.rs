// The store as a pipeline sink: request records committed per batch (timed and counted),
// per-minute roll-ups, and retention during maintenance.

use super::{RecordSink, SinkError};
use crate::export::prometheus::Metrics;
use std::sync::Arc;
use tokenwatch_core::aggregate::Rollup;
use tokenwatch_core::model::RequestRecord;
use tokenwatch_store::{RollupRow, Store};

pub struct StoreSink {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl StoreSink {
    pub fn new(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        StoreSink { store, metrics }
    }

    fn failed(&self, message: String) -> SinkError {
        self.metrics.store_write_errors.inc();
        SinkError::Failed { sink: "store", message }
    }
}

impl RecordSink for StoreSink {
    fn name(&self) -> &'static str {
        "store"
    }

    fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError> {
        let started = std::time::Instant::now();
        let result = self.store.insert_records(batch);
        self.metrics.store_write_seconds.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(()) => {
                self.metrics.store_records_written.inc_by(batch.len() as u64);
                Ok(())
            }
            Err(e) => Err(self.failed(e.to_string())),
        }
    }

    fn consume_rollups(&mut self, rollups: &[Rollup]) -> Result<(), SinkError> {
        let rows: Vec<RollupRow> = rollups
            .iter()
            .map(|r| RollupRow {
                labels: r.labels.clone(),
                bucket: r.bucket,
                metric: r.metric,
                minute_start_unix_ms: r.minute_start_unix_ms,
                count: r.sketch.count(),
                sketch: r.sketch.to_bytes(),
            })
            .collect();
        match self.store.insert_rollups(&rows) {
            Ok(()) => {
                self.metrics.store_rollups_written.inc_by(rows.len() as u64);
                Ok(())
            }
            Err(e) => Err(self.failed(e.to_string())),
        }
    }

    fn maintain(&mut self, now_unix_ms: i64) -> Result<(), SinkError> {
        match self.store.apply_retention(now_unix_ms) {
            Ok(report) => {
                tracing::debug!(?report, "retention applied");
                Ok(())
            }
            Err(e) => Err(self.failed(e.to_string())),
        }
    }
}
