// The store-rows port: where sources that receive spans and log records (the OTLP receiver) queue
// them for the store, without naming the store writer the pipeline runs. Both calls never wait:
// rows without room are dropped and counted, and each returns how many it took (the first ones).

use tokenwatch_store::{LogRow, SpanRow};

pub trait RowSink: Send + Sync {
    /// Queue spans; returns how many were queued (the first that many of `rows`).
    fn spans(&self, rows: Vec<SpanRow>) -> usize;
    /// Queue log records; returns how many were queued (the first that many of `rows`).
    fn logs(&self, rows: Vec<LogRow>) -> usize;
}

/// The handle sources hold: cheap to clone.
pub type StoreRows = std::sync::Arc<dyn RowSink>;
