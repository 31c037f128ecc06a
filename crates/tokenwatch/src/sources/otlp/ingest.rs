// The transport-independent core of the OTLP receiver: bounded in-flight exports, mapping,
// span/log queueing for the store writer, record queueing (all or "retry later"), signal
// updates and self-metrics.

use super::genai;
use super::logs;
use super::metrics::MetricsMapper;
use crate::capture::telemetry::TelemetryText;
use crate::kernel::queue::TelemetryQueue;
use crate::kernel::rows::StoreRows;
use crate::kernel::telemetry::Metrics;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::{Arc, Mutex};
use tokenwatch_core::alert::PostedInputs;
use tokenwatch_core::signals::SharedSignals;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Records queued per all-or-nothing reservation (at most the queue's capacity).
const QUEUE_CHUNK: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Grpc,
    Http,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Http => "http",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReceivedLabels {
    signal: &'static str,
    transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectedLabels {
    signal: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    transport: &'static str,
    outcome: &'static str,
}

/// The receiver's own metrics (`tokenwatch_otlp_*` in `/metrics`).
#[derive(Clone, Default)]
pub struct OtlpStats {
    received: Family<ReceivedLabels, Counter>,
    rejected: Family<RejectedLabels, Counter>,
    requests: Family<RequestLabels, Counter>,
    /// Proxy replicas' records received again and dropped (`shipped_dedup`).
    shipped_duplicates: Counter,
}

impl OtlpStats {
    pub fn register(&self, metrics: &Metrics) {
        metrics.register(
            "tokenwatch_otlp_shipped_duplicates",
            "Proxy replicas' request records (and first tokens) received again (a retry after a lost answer), or first tokens received after their record, dropped: each is counted once",
            self.shipped_duplicates.clone(),
        );
        metrics.register(
            "tokenwatch_otlp_received",
            "OTLP items accepted (spans, data points, log records)",
            self.received.clone(),
        );
        metrics.register(
            "tokenwatch_otlp_rejected",
            "OTLP items refused, by reason",
            self.rejected.clone(),
        );
        metrics.register(
            "tokenwatch_otlp_requests",
            "OTLP export requests, by transport and outcome",
            self.requests.clone(),
        );
    }

    pub fn request(&self, transport: Transport, outcome: &'static str) {
        self.requests
            .get_or_create(&RequestLabels {
                transport: transport.name(),
                outcome,
            })
            .inc();
    }

    fn received(&self, signal: &'static str, transport: Transport, n: u64) {
        if n > 0 {
            self.received
                .get_or_create(&ReceivedLabels {
                    signal,
                    transport: transport.name(),
                })
                .inc_by(n);
        }
    }

    fn rejected(&self, signal: &'static str, reason: &'static str, n: u64) {
        if n > 0 {
            self.rejected
                .get_or_create(&RejectedLabels { signal, reason })
                .inc_by(n);
        }
    }
}

/// What an accepted export answers: the items refused (partial success) and why.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    pub rejected: i64,
    pub message: String,
}

/// Why an export was refused as a whole.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// Retry later: HTTP 429 / gRPC RESOURCE_EXHAUSTED.
    #[error("{0}")]
    Busy(String),
    /// The export could not be processed (its worker failed): HTTP 503 / gRPC UNAVAILABLE.
    #[error("{0}")]
    Unavailable(String),
}

pub struct Ingest {
    queue: TelemetryQueue,
    /// Spans and log records reach the store through its writer thread (bounded queue).
    writer: StoreRows,
    signals: SharedSignals,
    /// Other ids of a model (`models.aliases`): metric points naming one go under its id.
    aliases: crate::kernel::models::SharedAliases,
    mapper: Mutex<MetricsMapper>,
    permits: Arc<Semaphore>,
    /// Prompt and completion text in spans and logs: dropped or masked before storage.
    text: TelemetryText,
    /// Stored spans are exported too (`export.otlp.include_received`).
    span_export: Option<crate::kernel::spans::SpanExport>,
    /// Stored log records are mined into templates too (`crate::logs`).
    log_feed: Option<crate::logs::LogFeed>,
    /// Scores sent as span attributes are stored here and handed to the alert engine.
    scores: Option<ScoreOutlet>,
    /// Proxy replicas' records received again (a retry after a lost answer) are dropped.
    shipped: super::shipped_dedup::ShippedDedup,
    /// When GenAI calls' response headers came back, from their HTTP client spans (OpenLIT's
    /// first-token time starts there).
    http_children: super::http_children::HttpChildren,
    pub stats: OtlpStats,
}

/// Where scores of span attributes go: the store, and the engine's port while alerting runs.
struct ScoreOutlet {
    store: Arc<dyn tokenwatch_store::Store>,
    feed: Option<Arc<dyn PostedInputs>>,
}

impl Ingest {
    /// `max_in_flight` exports are processed at once; more are told to retry later.
    pub fn new(
        queue: TelemetryQueue,
        writer: StoreRows,
        signals: SharedSignals,
        max_in_flight: usize,
        text: TelemetryText,
    ) -> Ingest {
        Ingest {
            queue,
            writer,
            signals,
            aliases: Default::default(),
            text,
            span_export: None,
            log_feed: None,
            scores: None,
            shipped: super::shipped_dedup::ShippedDedup::new(0),
            http_children: Default::default(),
            mapper: Mutex::new(MetricsMapper::default()),
            permits: Arc::new(Semaphore::new(max_in_flight.max(1))),
            stats: OtlpStats::default(),
        }
    }

    /// Resolve the model ids of received metric points through `aliases` (records are resolved
    /// by the pipeline).
    pub fn with_model_aliases(mut self, aliases: crate::kernel::models::SharedAliases) -> Ingest {
        self.aliases = aliases;
        self
    }

    /// Export the spans stored from now on (`export.otlp.include_received`).
    pub fn with_span_export(mut self, export: Option<crate::kernel::spans::SpanExport>) -> Ingest {
        self.span_export = export;
        self
    }

    /// Remember the last `capacity` shipped records' span ids and drop one received again.
    pub fn with_shipped_dedup(mut self, capacity: usize) -> Ingest {
        self.shipped = super::shipped_dedup::ShippedDedup::new(capacity);
        self
    }

    /// Mine the log records received from now on into templates.
    pub fn with_log_feed(mut self, feed: Option<crate::logs::LogFeed>) -> Ingest {
        self.log_feed = feed;
        self
    }

    /// Store the scores of span attributes in `store` and feed them to the engine behind `feed`.
    pub fn with_scores(
        mut self,
        store: Arc<dyn tokenwatch_store::Store>,
        feed: Option<Arc<dyn PostedInputs>>,
    ) -> Ingest {
        self.scores = Some(ScoreOutlet { store, feed });
        self
    }

    /// Scores of span attributes: stored (off the async workers) then given to the engine; a
    /// failed store write is logged (the spans and records are accepted either way).
    async fn keep_scores(&self, rows: Vec<tokenwatch_store::ScoreRow>) {
        let Some(ScoreOutlet { store, feed }) = &self.scores else {
            return;
        };
        if rows.is_empty() {
            return;
        }
        let inputs: Vec<tokenwatch_core::scores::ScoreInput> = rows
            .iter()
            .map(|r| tokenwatch_core::scores::ScoreInput {
                request_id: r.request_id.clone(),
                trace_id: r.trace_id.clone(),
                model: String::new(),
                at_ms: r.at_unix_ms,
                name: r.name.clone(),
                value: r.value,
            })
            .collect();
        let store = store.clone();
        match tokio::task::spawn_blocking(move || store.insert_scores(&rows)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "storing the scores of received spans failed"),
            Err(e) => tracing::warn!(error = %e, "storing the scores of received spans failed"),
        }
        if let Some(feed) = feed {
            feed.send_scores(inputs).await;
        }
    }

    /// A slot for one export, or `Busy` when `max_in_flight` are already being processed.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, Refused> {
        self.permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Busy("too many OTLP exports in flight; retry later".into()))
    }

    /// `traces` in a task of its own, run to its end even when the caller is cancelled (its
    /// client hung up, as a proxy replica does when an attempt times out): an export is then
    /// processed whole or not at all, so a copy of it sent again is rightly seen as a duplicate.
    pub async fn traces_to_the_end(
        self: &Arc<Self>,
        req: ExportTraceServiceRequest,
        t: Transport,
    ) -> Result<Accepted, Refused> {
        let ingest = self.clone();
        tokio::spawn(async move { ingest.traces(req, t).await })
            .await
            .unwrap_or_else(|e| Err(Refused::Unavailable(format!("processing spans: {e}"))))
    }

    /// One trace export: shipped records received before are dropped (and counted); the rest
    /// is accepted or refused ("retry later"). Only an accepted export's records stay
    /// remembered by the dedup: a refused one, or one cancelled half-way because its client hung
    /// up, is let in when sent again. Records are queued after the last await of
    /// `accept_traces`, so an export cancelled before its answer queued none of them.
    pub async fn traces(
        &self,
        mut req: ExportTraceServiceRequest,
        t: Transport,
    ) -> Result<Accepted, Refused> {
        let claimed = self.shipped.claim(&mut req);
        self.stats.shipped_duplicates.inc_by(claimed.duplicates);
        let result = self.accept_traces(req, t).await;
        if result.is_ok() {
            claimed.commit();
        }
        result
    }

    async fn accept_traces(
        &self,
        req: ExportTraceServiceRequest,
        t: Transport,
    ) -> Result<Accepted, Refused> {
        let batch = genai::map_traces_with(&req, Some(&self.text), &self.http_children);
        drop(req);
        let spans = batch.spans;
        let n_spans = spans.len();
        let mut dropped_spans = 0u64;
        if n_spans > 0 {
            let export = self.span_export.clone();
            let writer = self.writer.clone();
            // Copying the exported spans is CPU work over every attribute: off the async workers.
            let queued =
                tokio::task::spawn_blocking(move || queue_spans(spans, &writer, export.as_ref()))
                    .await
                    .map_err(|e| Refused::Unavailable(format!("processing spans: {e}")))?;
            if queued == 0 {
                self.stats.rejected("traces", "queue_full", batch.accepted);
                return Err(Refused::Busy(
                    "the store write queue is full; retry later".into(),
                ));
            }
            dropped_spans = (n_spans - queued) as u64;
        }
        self.keep_scores(batch.scores).await;
        let mut records = batch.records;
        // Replicas' first tokens, ahead of their records (`kernel::shipped_first_token`): those
        // whose record is in this export are not early and go; the rest reach the pipeline just
        // before the first chunk of records, and only if it finds room (a refused export is sent
        // again, its first tokens with it).
        let mut early = if batch.first_tokens.is_empty() {
            None
        } else {
            let ids: std::collections::HashSet<&str> =
                records.iter().map(|r| r.request_id.as_str()).collect();
            let early: Vec<_> = batch
                .first_tokens
                .into_iter()
                .filter(|f| !ids.contains(f.request_id.as_str()))
                .collect();
            Some(early)
        };
        let mut dropped = 0u64;
        let mut first = true;
        let chunk = QUEUE_CHUNK.min(self.queue.capacity()).max(1);
        while !records.is_empty() {
            let rest = records.split_off(records.len().min(chunk));
            let n = records.len() as u64;
            let records = std::mem::replace(&mut records, rest);
            let queued = match early.take() {
                Some(f) => self.queue.try_submit_all_after(f, records),
                None => self.queue.try_submit_all(records),
            };
            if !queued {
                if first {
                    self.stats.rejected("traces", "queue_full", batch.accepted);
                    return Err(Refused::Busy(
                        "the telemetry pipeline is full; retry later".into(),
                    ));
                }
                dropped += n;
            }
            first = false;
        }
        for f in early.into_iter().flatten() {
            self.queue.first_token(f);
        }
        self.stats.received("traces", t, batch.accepted);
        self.stats.rejected("traces", "invalid", batch.rejected);
        // A span counts as rejected once, whether its row or its GenAI record was dropped.
        let lost = (dropped + dropped_spans).min(batch.accepted);
        self.stats.rejected("traces", "queue_full", lost);
        let mut message = batch.first_error.unwrap_or_default();
        for (n, what) in [
            (
                dropped,
                "GenAI request records dropped: the telemetry pipeline is full",
            ),
            (
                dropped_spans,
                "spans dropped: the store write queue is full (store.write_queue_records)",
            ),
        ] {
            if n > 0 {
                if !message.is_empty() {
                    message.push_str("; ");
                }
                message.push_str(&format!("{n} {what}"));
            }
        }
        Ok(Accepted {
            rejected: i64::try_from(batch.rejected + lost).unwrap_or(i64::MAX),
            message,
        })
    }

    pub fn metrics(&self, req: &ExportMetricsServiceRequest, t: Transport) -> Accepted {
        let batch = {
            let mut m = self.mapper.lock().unwrap_or_else(|p| p.into_inner());
            m.map(req, tokenwatch_core::clock::now_unix_ms())
        };
        if !batch.points.is_empty() {
            let mut board = self.signals.write().unwrap_or_else(|p| p.into_inner());
            for mut p in batch.points {
                self.aliases.apply(&mut p.model_id);
                board.update(p);
            }
        }
        self.stats.received("metrics", t, batch.accepted);
        self.stats
            .rejected("metrics", "unsupported", batch.unsupported);
        self.stats
            .rejected("metrics", "invalid", batch.rejected - batch.unsupported);
        Accepted {
            rejected: i64::try_from(batch.rejected).unwrap_or(i64::MAX),
            message: batch.first_error.unwrap_or_default(),
        }
    }

    pub async fn logs(
        &self,
        req: ExportLogsServiceRequest,
        t: Transport,
    ) -> Result<Accepted, Refused> {
        let batch = logs::map_logs(&req, &self.text);
        drop(req);
        let rows = batch.rows;
        let n_rows = rows.len();
        let mut dropped = 0u64;
        if n_rows > 0 {
            let feed = self.log_feed.clone();
            let writer = self.writer.clone();
            let queued =
                tokio::task::spawn_blocking(move || queue_logs(rows, &writer, feed.as_ref()))
                    .await
                    .map_err(|e| Refused::Unavailable(format!("processing log records: {e}")))?;
            if queued == 0 {
                self.stats.rejected("logs", "queue_full", batch.accepted);
                return Err(Refused::Busy(
                    "the store write queue is full; retry later".into(),
                ));
            }
            dropped = (n_rows - queued) as u64;
        }
        self.stats.received("logs", t, batch.accepted);
        self.stats.rejected("logs", "invalid", batch.rejected);
        self.stats.rejected("logs", "queue_full", dropped);
        let mut message = batch.first_error.unwrap_or_default();
        if dropped > 0 {
            if !message.is_empty() {
                message.push_str("; ");
            }
            message.push_str(&format!(
                "{dropped} log records dropped: the store write queue is full (store.write_queue_records)"
            ));
        }
        Ok(Accepted {
            rejected: i64::try_from(batch.rejected + dropped).unwrap_or(i64::MAX),
            message,
        })
    }
}

/// Queues the spans (their text already dropped or masked) for the store; the ones queued (the
/// first ones) are exported too. Returns how many were queued.
fn queue_spans(
    spans: Vec<tokenwatch_store::SpanRow>,
    writer: &StoreRows,
    export: Option<&crate::kernel::spans::SpanExport>,
) -> usize {
    match export {
        Some(export) => {
            let queued = writer.spans(spans.clone());
            export.push_received(&spans[..queued.min(spans.len())]);
            queued
        }
        None => writer.spans(spans),
    }
}

/// Queues the log records (their text already dropped or masked) for the store; the ones
/// queued (the first ones) are mined into templates too. Returns how many were queued.
fn queue_logs(
    rows: Vec<tokenwatch_store::LogRow>,
    writer: &StoreRows,
    feed: Option<&crate::logs::LogFeed>,
) -> usize {
    match feed {
        Some(_) => {
            let queued = writer.logs(rows.clone());
            logs::feed_templates(feed, &rows[..queued.min(rows.len())]);
            queued
        }
        None => writer.logs(rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{
        Pipeline, PipelineConfig, StoreWriter, StoreWriterConfig, StoreWriterThread,
    };
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use std::time::Duration;
    use tokenwatch_core::aggregate::{Aggregator, AggregatorConfig};
    use tokenwatch_store::{LogQuery, SqliteStore, Store};

    /// An ingest whose store writer has room for `queue_rows` rows, over a fresh SQLite store.
    fn ingest(
        dir: &std::path::Path,
        queue_rows: usize,
    ) -> (
        Ingest,
        Pipeline,
        StoreWriterThread,
        Arc<dyn Store>,
        Arc<Metrics>,
    ) {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir, Default::default()).unwrap());
        let metrics = Arc::new(Metrics::new());
        let cfg = StoreWriterConfig {
            queue_rows,
            batch_max: 100,
            priority: Default::default(),
            flush_interval: Duration::ZERO,
        };
        let (writer, thread) = StoreWriter::start(store.clone(), cfg, metrics.clone()).unwrap();
        let (pipeline, queue) = Pipeline::start(
            PipelineConfig {
                queue_capacity: 16,
                batch_max: 16,
                flush_interval: Duration::from_millis(20),
                maintenance_interval: Duration::from_secs(600),
                thread_priority: Default::default(),
                text_capture: None,
                model_aliases: Default::default(),
                model_admission: None,
                prices: Default::default(),
                record_identity: None,
                health: None,
            },
            Some(Arc::new(Mutex::new(Aggregator::new(
                AggregatorConfig::default(),
            )))),
            Vec::new(),
            metrics.clone(),
        );
        let signals: SharedSignals = Arc::new(std::sync::RwLock::new(
            tokenwatch_core::signals::SignalBoard::new(8, 8),
        ));
        let ingest = Ingest::new(
            queue,
            std::sync::Arc::new(writer),
            signals,
            4,
            TelemetryText::dropping(),
        );
        (ingest, pipeline, thread, store, metrics)
    }

    fn logs(n: usize) -> ExportLogsServiceRequest {
        let records = (0..n)
            .map(|i| LogRecord {
                time_unix_nano: 1_000 + i as u64,
                body: Some(AnyValue {
                    value: Some(Value::StringValue(format!("line {i}"))),
                }),
                ..Default::default()
            })
            .collect();
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: records,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn log_records_reach_the_store_through_the_writer_and_those_without_room_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let (ingest, pipeline, thread, store, metrics) = ingest(dir.path(), 3);
        // One call: 3 rows fit the empty queue, the other 2 are dropped and reported.
        let accepted = ingest.logs(logs(5), Transport::Http).await.unwrap();
        assert_eq!(accepted.rejected, 2, "{accepted:?}");
        assert!(
            accepted
                .message
                .contains("2 log records dropped: the store write queue is full"),
            "{accepted:?}"
        );
        drop(ingest);
        tokio::task::spawn_blocking(move || {
            pipeline.close_and_join();
            assert!(thread.finish(Duration::from_secs(5)));
        })
        .await
        .unwrap();
        let stored = store.query_logs(&LogQuery::default()).unwrap();
        let bodies: Vec<&str> = stored.iter().map(|r| r.body.as_str()).collect();
        assert_eq!(bodies, ["line 0", "line 1", "line 2"]);
        let text = metrics.encode();
        assert!(
            text.contains("tokenwatch_store_logs_dropped_total{reason=\"queue_full\"} 2"),
            "{text}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_export_with_no_room_at_all_is_told_to_retry_later() {
        let dir = tempfile::tempdir().unwrap();
        let (ingest, pipeline, thread, store, _metrics) = ingest(dir.path(), 0);
        match ingest.logs(logs(2), Transport::Grpc).await {
            Err(Refused::Busy(m)) => assert!(m.contains("store write queue is full"), "{m}"),
            other => panic!("expected Busy, got {other:?}"),
        }
        // Nothing to store: an empty export is accepted as before.
        let empty = ingest.logs(logs(0), Transport::Grpc).await.unwrap();
        assert_eq!(empty, Accepted::default());
        drop(ingest);
        tokio::task::spawn_blocking(move || {
            pipeline.close_and_join();
            assert!(thread.finish(Duration::from_secs(5)));
        })
        .await
        .unwrap();
        assert!(store.query_logs(&LogQuery::default()).unwrap().is_empty());
    }
}
