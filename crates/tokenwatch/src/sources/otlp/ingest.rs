// The transport-independent core of the OTLP receiver: bounded in-flight exports, mapping,
// span/log storage, record queueing (all or "retry later"), signal updates and self-metrics.

use super::genai;
use super::logs;
use super::metrics::MetricsMapper;
use crate::capture::telemetry::TelemetryText;
use crate::export::prometheus::Metrics;
use crate::pipeline::TelemetryQueue;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::{Arc, Mutex};
use tokenwatch_core::signals::SharedSignals;
use tokenwatch_store::Store;
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
}

impl OtlpStats {
    pub fn register(&self, metrics: &Metrics) {
        metrics.register(
            "tokenwatch_otlp_received",
            "OTLP items accepted (spans, data points, log records)",
            self.received.clone(),
        );
        metrics.register("tokenwatch_otlp_rejected", "OTLP items refused, by reason", self.rejected.clone());
        metrics.register(
            "tokenwatch_otlp_requests",
            "OTLP export requests, by transport and outcome",
            self.requests.clone(),
        );
    }

    pub fn request(&self, transport: Transport, outcome: &'static str) {
        self.requests.get_or_create(&RequestLabels { transport: transport.name(), outcome }).inc();
    }

    fn received(&self, signal: &'static str, transport: Transport, n: u64) {
        if n > 0 {
            self.received.get_or_create(&ReceivedLabels { signal, transport: transport.name() }).inc_by(n);
        }
    }

    fn rejected(&self, signal: &'static str, reason: &'static str, n: u64) {
        if n > 0 {
            self.rejected.get_or_create(&RejectedLabels { signal, reason }).inc_by(n);
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
    /// The store failed: HTTP 503 / gRPC UNAVAILABLE.
    #[error("{0}")]
    Unavailable(String),
}

pub struct Ingest {
    queue: TelemetryQueue,
    store: Arc<dyn Store>,
    signals: SharedSignals,
    mapper: Mutex<MetricsMapper>,
    permits: Arc<Semaphore>,
    /// Prompt and completion text in spans and logs: dropped or masked before storage.
    text: TelemetryText,
    /// Stored spans are exported too (`export.otlp.include_received`).
    span_export: Option<crate::export::otlp::SpanExport>,
    /// Stored log records are mined into templates too (`crate::logs`).
    log_feed: Option<crate::logs::LogFeed>,
    pub stats: OtlpStats,
}

impl Ingest {
    /// `max_in_flight` exports are processed at once; more are told to retry later.
    pub fn new(
        queue: TelemetryQueue,
        store: Arc<dyn Store>,
        signals: SharedSignals,
        max_in_flight: usize,
        text: TelemetryText,
    ) -> Ingest {
        Ingest {
            queue,
            store,
            signals,
            text,
            span_export: None,
            log_feed: None,
            mapper: Mutex::new(MetricsMapper::default()),
            permits: Arc::new(Semaphore::new(max_in_flight.max(1))),
            stats: OtlpStats::default(),
        }
    }

    /// Export the spans stored from now on (`export.otlp.include_received`).
    pub fn with_span_export(mut self, export: Option<crate::export::otlp::SpanExport>) -> Ingest {
        self.span_export = export;
        self
    }

    /// Mine the log records received from now on into templates.
    pub fn with_log_feed(mut self, feed: Option<crate::logs::LogFeed>) -> Ingest {
        self.log_feed = feed;
        self
    }

    /// A slot for one export, or `Busy` when `max_in_flight` are already being processed.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, Refused> {
        self.permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Busy("too many OTLP exports in flight; retry later".into()))
    }

    pub async fn traces(&self, req: ExportTraceServiceRequest, t: Transport) -> Result<Accepted, Refused> {
        let batch = genai::map_traces(&req, true);
        drop(req);
        let store = self.store.clone();
        let mut spans = batch.spans;
        let n_spans = spans.len();
        if n_spans > 0 {
            let text = self.text.clone();
            let export = self.span_export.clone();
            tokio::task::spawn_blocking(move || {
                for s in &mut spans {
                    s.attributes_json = text.attributes(std::mem::take(&mut s.attributes_json));
                }
                store.insert_spans(&spans)?;
                if let Some(export) = export {
                    export.push_received(&spans);
                }
                Ok::<_, tokenwatch_store::StoreError>(())
            })
                .await
                .map_err(|e| Refused::Unavailable(format!("storing spans: {e}")))?
                .map_err(|e| Refused::Unavailable(format!("storing spans: {e}")))?;
        }
        let mut records = batch.records;
        let mut dropped = 0u64;
        let mut first = true;
        let chunk = QUEUE_CHUNK.min(self.queue.capacity()).max(1);
        while !records.is_empty() {
            let rest = records.split_off(records.len().min(chunk));
            let n = records.len() as u64;
            if !self.queue.try_submit_all(std::mem::replace(&mut records, rest)) {
                if first {
                    self.stats.rejected("traces", "queue_full", batch.accepted);
                    return Err(Refused::Busy("the telemetry pipeline is full; retry later".into()));
                }
                dropped += n;
            }
            first = false;
        }
        self.stats.received("traces", t, batch.accepted);
        self.stats.rejected("traces", "invalid", batch.rejected);
        self.stats.rejected("traces", "queue_full", dropped);
        let mut message = batch.first_error.unwrap_or_default();
        if dropped > 0 {
            if !message.is_empty() {
                message.push_str("; ");
            }
            message.push_str(&format!("{dropped} GenAI request records dropped: the telemetry pipeline is full"));
        }
        Ok(Accepted { rejected: i64::try_from(batch.rejected + dropped).unwrap_or(i64::MAX), message })
    }

    pub fn metrics(&self, req: &ExportMetricsServiceRequest, t: Transport) -> Accepted {
        let batch = {
            let mut m = self.mapper.lock().unwrap_or_else(|p| p.into_inner());
            m.map(req, crate::pipeline::now_unix_ms())
        };
        if !batch.points.is_empty() {
            let mut board = self.signals.write().unwrap_or_else(|p| p.into_inner());
            for p in batch.points {
                board.update(p);
            }
        }
        self.stats.received("metrics", t, batch.accepted);
        self.stats.rejected("metrics", "unsupported", batch.unsupported);
        self.stats.rejected("metrics", "invalid", batch.rejected - batch.unsupported);
        Accepted {
            rejected: i64::try_from(batch.rejected).unwrap_or(i64::MAX),
            message: batch.first_error.unwrap_or_default(),
        }
    }

    pub async fn logs(&self, req: ExportLogsServiceRequest, t: Transport) -> Result<Accepted, Refused> {
        let batch = logs::map_logs(&req);
        drop(req);
        if !batch.rows.is_empty() {
            let store = self.store.clone();
            let mut rows = batch.rows;
            let text = self.text.clone();
            let feed = self.log_feed.clone();
            tokio::task::spawn_blocking(move || {
                for r in &mut rows {
                    r.body = text.log_body(&r.attributes_json, std::mem::take(&mut r.body));
                    r.attributes_json = text.attributes(std::mem::take(&mut r.attributes_json));
                }
                crate::sources::otlp::logs::feed_templates(feed.as_ref(), &rows);
                store.insert_logs(&rows)
            })
                .await
                .map_err(|e| Refused::Unavailable(format!("storing log records: {e}")))?
                .map_err(|e| Refused::Unavailable(format!("storing log records: {e}")))?;
        }
        self.stats.received("logs", t, batch.accepted);
        self.stats.rejected("logs", "invalid", batch.rejected);
        Ok(Accepted {
            rejected: i64::try_from(batch.rejected).unwrap_or(i64::MAX),
            message: batch.first_error.unwrap_or_default(),
        })
    }
}
