// The store as a pipeline sink: request records, per-minute roll-ups and retention handed to
// the store's writer thread (`store_writer`), so the pipeline never waits on the store.

use super::store_writer::StoreWriter;
use super::{RecordSink, SinkError};
use std::sync::Arc;
use tokenwatch_core::aggregate::Rollup;
use tokenwatch_core::model::RequestRecord;
use tokenwatch_store::RollupRow;

pub struct StoreSink {
    writer: StoreWriter,
}

impl StoreSink {
    pub fn new(writer: StoreWriter) -> Self {
        StoreSink { writer }
    }
}

impl RecordSink for StoreSink {
    fn name(&self) -> &'static str {
        "store"
    }

    /// Queues the batch; what finds no room, or fails to be written, is counted per record
    /// (`tokenwatch_store_records_dropped_total{reason}`).
    fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError> {
        self.writer.records(batch.to_vec());
        Ok(())
    }

    /// The pipeline's batch is queued as it is, shared: no copy of the records.
    fn consume_shared(&mut self, batch: &Arc<Vec<RequestRecord>>) -> Result<(), SinkError> {
        self.writer.records_shared(batch.clone());
        Ok(())
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
        self.writer.rollups(rows);
        Ok(())
    }

    fn maintain(&mut self, now_unix_ms: i64) -> Result<(), SinkError> {
        self.writer.retention(now_unix_ms);
        Ok(())
    }
}
