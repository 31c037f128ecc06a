// The engine's input queue: `AlertSink` (a pipeline RecordSink that never blocks) puts records,
// output embeddings and prefix-cache accesses on it, and the posted-inputs port (`PostedInputs`,
// for the API's and OTLP's embeddings, feedback and scores) the rest; `drain` sorts them.

use super::inputs::Inputs;
use super::record::Rec;
use super::vectors::PrefixAccess;
use crate::pipeline::{RecordSink, SinkError};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokenwatch_core::alert::{PortFuture, PostedInputs};
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::embedding::EmbeddingDims;
pub use tokenwatch_core::embedding::EmbeddingInput;
use tokenwatch_core::model::{FirstToken, RequestRecord};
use tokio::sync::{Notify, mpsc};

/// What reaches the engine. Records are most of the queue, so they are not boxed (boxing would
/// add an allocation per record to save space only on the rarer variants).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Record(Rec),
    /// A request's first token while it still streams (`Inputs::add_first_token`).
    FirstToken(FirstToken),
    Embedding(EmbeddingInput),
    Prefix(PrefixAccess),
    Score(super::scores::ScoreInput),
}

/// How long an API post waits for room in the engine's queue before giving up on evaluation
/// (the embeddings are stored either way).
const FEED_WAIT: Duration = Duration::from_secs(5);

/// The engine's input queue, as handed to producers (the record sink, the embeddings API).
#[derive(Clone)]
pub struct EngineFeed {
    pub(crate) tx: mpsc::Sender<Input>,
    pub(crate) wake: Arc<Notify>,
    pub(crate) dropped: Arc<AtomicU64>,
    /// The embedding dimension of each model (shared with the API, which checks it first).
    pub(crate) dims: Arc<EmbeddingDims>,
}

impl EngineFeed {
    fn try_send(&self, i: Input) {
        if self.tx.try_send(i).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits for room in the queue for each input (an API caller may be slowed, never the
    /// proxy), dropping (counted) only after `FEED_WAIT`.
    async fn send_waiting(&self, inputs: impl IntoIterator<Item = Input>) {
        for i in inputs {
            if !matches!(self.tx.send_timeout(i, FEED_WAIT).await, Ok(())) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.wake.notify_one();
    }
}

impl PostedInputs for EngineFeed {
    fn dims(&self) -> Arc<EmbeddingDims> {
        self.dims.clone()
    }

    /// Posted embeddings, their dimensions already admitted.
    fn send_embeddings(&self, items: Vec<EmbeddingInput>) -> PortFuture<'_> {
        Box::pin(self.send_waiting(items.into_iter().map(Input::Embedding)))
    }

    fn send_scores(&self, items: Vec<super::scores::ScoreInput>) -> PortFuture<'_> {
        Box::pin(self.send_waiting(items.into_iter().map(Input::Score)))
    }
}

/// Forwards each batch to the engine through a bounded channel and wakes it; a full channel
/// drops inputs (counted), so the pipeline never waits on alerting.
pub struct AlertSink {
    pub(crate) feed: EngineFeed,
}

impl RecordSink for AlertSink {
    fn name(&self) -> &'static str {
        "alerting"
    }

    fn consume_first_tokens(&mut self, first: &[FirstToken]) -> Result<(), SinkError> {
        for f in first {
            self.feed.try_send(Input::FirstToken(f.clone()));
        }
        self.feed.wake.notify_one();
        Ok(())
    }

    fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError> {
        let now = now_unix_ms();
        for r in batch {
            let rec = Rec::from_record(r);
            let at_ms = rec.at_ms;
            self.feed.try_send(Input::Record(rec));
            let model = &r.labels.model_id;
            if !r.embedding.is_empty() {
                match self.feed.dims.admit(model, r.embedding.len(), now) {
                    Ok(()) => self.feed.try_send(Input::Embedding(EmbeddingInput {
                        model: model.clone(),
                        at_ms,
                        vector: r.embedding.as_slice().into(),
                    })),
                    Err(e) => {
                        tracing::debug!(request_id = %r.request_id, model = %model, "embedding not evaluated: it {e}");
                    }
                }
            }
            if let Some(key) = r.prefix_key {
                self.feed.try_send(Input::Prefix(PrefixAccess {
                    model: model.clone(),
                    tenant: r.labels.tenant.clone(),
                    key,
                    at_ms,
                }));
            }
        }
        self.feed.wake.notify_one();
        Ok(())
    }
}

/// Everything queued for the engine: records are returned (the per-request detectors look at
/// them), embeddings and prefix accesses go straight into `inputs`.
pub fn drain(rx: &mut mpsc::Receiver<Input>, inputs: &mut Inputs) -> Vec<Rec> {
    let mut records = Vec::new();
    while let Ok(i) = rx.try_recv() {
        match i {
            Input::Record(r) => records.push(r),
            Input::FirstToken(f) => inputs.add_first_token(&f),
            Input::Embedding(e) => inputs.add_embedding(e),
            Input::Prefix(p) => inputs.add_prefix(p),
            Input::Score(s) => inputs.add_score(s, now_unix_ms()),
        }
    }
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_routes_embeddings_and_prefix_accesses() {
        let (tx, mut rx) = mpsc::channel(16);
        let feed = EngineFeed {
            tx,
            wake: Arc::new(Notify::new()),
            dropped: Arc::new(AtomicU64::new(0)),
            dims: Arc::new(EmbeddingDims::default()),
        };
        let mut sink = AlertSink { feed: feed.clone() };
        let now = now_unix_ms();
        let mut r = RequestRecord {
            request_id: "r1".into(),
            arrival_unix_ms: now,
            embedding: vec![1.0, 0.0],
            prefix_key: Some(7),
            ..Default::default()
        };
        r.labels.model_id = "m".into();
        r.labels.tenant = "t".into();
        let mut wrong_dim = r.clone();
        wrong_dim.embedding = vec![1.0, 0.0, 0.0];
        wrong_dim.prefix_key = None;
        sink.consume(&[r, wrong_dim]).unwrap();
        let mut i = Inputs::new(60_000, 100);
        let recs = drain(&mut rx, &mut i);
        assert_eq!(recs.len(), 2);
        assert_eq!(i.embedding_models(), vec!["m".to_string()]);
        assert_eq!(
            i.embeddings("m").unwrap().count(now - 1, now + 1),
            1,
            "the 3-d one was not admitted"
        );
        let acc: Vec<_> = i.prefixes("m").unwrap().window(now - 1, now + 1).collect();
        assert_eq!(acc, vec![("t", 7, now)]);
        i.prune(now + 120_000);
        assert!(i.embedding_models().is_empty() && i.prefix_models().is_empty());
        assert_eq!(feed.dropped.load(Ordering::Relaxed), 0);
    }
}
