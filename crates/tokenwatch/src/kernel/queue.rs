// The telemetry queue's sending side, the port every source emits records through (the proxy,
// the OTLP receiver, the local embedder that sends them on): `submit` never waits; when the
// queue is full the record is dropped and counted, and the request it describes is unaffected.
// The pipeline (`crate::pipeline`) makes the queue and owns its receiving side.

use crate::kernel::raw_text::RawText;
use crate::kernel::telemetry::Metrics;
use std::sync::Arc;
use tokenwatch_core::model::{FirstToken, RequestRecord};
use tokio::sync::mpsc;

/// A record on its way to the pipeline, with the bytes kept for text capture when it is on
/// (turned into masked text on the pipeline thread, before any sink sees the record).
pub struct Queued {
    record: RequestRecord,
    raw: Option<Box<RawText>>,
}

/// The sources' side of the telemetry queue.
#[derive(Clone)]
pub struct TelemetryQueue {
    tx: mpsc::Sender<Queued>,
    /// First tokens, ahead of their records. One that finds the queue full is dropped
    /// uncounted: its record carries the same time, only later.
    first: mpsc::Sender<FirstToken>,
    metrics: Arc<Metrics>,
    /// `capture.embeddings`: records with response bytes pass the embedding thread first.
    embed: Option<Arc<dyn Detour>>,
}

/// A stage that records with their request's and response's bytes pass through before the
/// queue (the local embedder, `crate::embed`), which sends them on itself: it takes a record,
/// or hands it back (counted) when it has no room, and the queue sends it on without it.
pub trait Detour: Send + Sync {
    /// (The large error is the record itself, handed back by value: boxing it would cost an
    /// allocation per refusal.)
    #[allow(clippy::result_large_err)]
    fn offer(
        &self,
        record: RequestRecord,
        raw: Box<RawText>,
    ) -> Result<(), (RequestRecord, Box<RawText>)>;
}

impl Queued {
    /// The record and, with text capture on, its request's and response's bytes.
    pub fn into_parts(self) -> (RequestRecord, Option<Box<RawText>>) {
        (self.record, self.raw)
    }
}

impl TelemetryQueue {
    /// The sending side of a queue whose receivers the pipeline holds: records on `tx`, first
    /// tokens on `first`; drops counted in `metrics`.
    pub fn new(
        tx: mpsc::Sender<Queued>,
        first: mpsc::Sender<FirstToken>,
        metrics: Arc<Metrics>,
    ) -> TelemetryQueue {
        TelemetryQueue {
            tx,
            first,
            metrics,
            embed: None,
        }
    }

    pub fn submit(&self, record: RequestRecord) {
        self.submit_with_text(record, None);
    }

    /// `submit`, with the request's and response's bytes for text capture.
    pub fn submit_with_text(&self, record: RequestRecord, raw: Option<Box<RawText>>) {
        let (record, raw) = match (&self.embed, raw) {
            (Some(embed), Some(raw)) => match embed.offer(record, raw) {
                Ok(()) => return,
                Err((record, raw)) => (record, Some(raw)),
            },
            (_, raw) => (record, raw),
        };
        match self.tx.try_send(Queued { record, raw }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.metrics.dropped_records.inc();
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.metrics.dropped_records_closed.inc();
            }
        }
    }

    /// This queue with records that carry response bytes sent through the local embedder.
    pub fn with_embeddings(mut self, embed: impl Detour + 'static) -> TelemetryQueue {
        self.embed = Some(Arc::new(embed));
        self
    }

    /// Report a response's first token while it is still streaming; never waits.
    pub fn first_token(&self, first: FirstToken) {
        let _ = self.first.try_send(first);
    }

    /// The queue's capacity (`telemetry.queue_capacity`).
    pub fn capacity(&self) -> usize {
        self.tx.max_capacity()
    }

    /// `try_submit_all`, with `first` (first tokens of other requests, received with the
    /// records: a proxy replica's, `kernel::shipped_first_token`) sent just before the records
    /// and only when the records find room, so that the pipeline sees them first.
    pub fn try_submit_all_after(
        &self,
        first: Vec<FirstToken>,
        records: Vec<RequestRecord>,
    ) -> bool {
        if records.is_empty() {
            first.into_iter().for_each(|f| self.first_token(f));
            return true;
        }
        match self.tx.try_reserve_many(records.len()) {
            Ok(permits) => {
                first.into_iter().for_each(|f| self.first_token(f));
                for (permit, record) in permits.zip(records) {
                    permit.send(Queued { record, raw: None });
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Queue all of `records` or none of them (false, no drop counted) when the queue lacks
    /// room for all: for sources that can answer "retry later" (OTLP's 429).
    pub fn try_submit_all(&self, records: Vec<RequestRecord>) -> bool {
        if records.is_empty() {
            return true;
        }
        match self.tx.try_reserve_many(records.len()) {
            Ok(permits) => {
                for (permit, record) in permits.zip(records) {
                    permit.send(Queued { record, raw: None });
                }
                true
            }
            Err(_) => false,
        }
    }
}
