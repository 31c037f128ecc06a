// Delivery of queued spans to the OTLP endpoint: batches taken when full or after the flush
// interval, sent over HTTP/protobuf or gRPC, retried with backoff, counted when given up.

use super::convert::{ExportSpan, request_of};
use super::queue::SpanQueue;
use super::{Prepared, Protocol};
use crate::kernel::delivery::{
    self, Attempt, Deliver, Delivered, Endpoint, HttpClient, LAST_ATTEMPT, stopped,
};
use crate::kernel::telemetry::Metrics;
use bytes::Bytes;
use http_body_util::Full;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::transport::Channel;

pub use crate::kernel::delivery::{MAX_BACKOFF, MIN_BACKOFF};

/// Why spans were dropped (`reason` of `tokenwatch_otlp_export_dropped_total`).
pub const DROP_REASONS: [&str; 3] = ["queue_full", "rejected", "shutdown"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// What one exporter's counters are called, and what the logs call it.
#[derive(Debug, Clone, Copy)]
pub struct ExportNaming {
    /// The deliverer in the logs ("OTLP export").
    pub what: &'static str,
    /// `{prefix}_spans_total`, `{prefix}_failures_total`, `{prefix}_dropped_total{reason}`.
    pub prefix: &'static str,
    /// The exported items in help texts ("Spans").
    pub items: &'static str,
    /// The receiver in help texts ("the OTLP trace endpoint").
    pub receiver: &'static str,
    /// The full name of the drop counter, for the logs.
    pub dropped_counter: &'static str,
}

/// `export.otlp`: `tokenwatch_otlp_export_*`.
pub const OTLP_EXPORT: ExportNaming = ExportNaming {
    what: "OTLP export",
    prefix: "tokenwatch_otlp_export",
    items: "Spans",
    receiver: "the OTLP trace endpoint",
    dropped_counter: "tokenwatch_otlp_export_dropped_total",
};

/// The exporter's counters in `/metrics` (`tokenwatch_otlp_export_*` for `export.otlp`).
#[derive(Clone, Default)]
pub struct ExportMetrics {
    spans: Counter,
    failures: Counter,
    dropped: Family<ReasonLabels, Counter>,
}

impl ExportMetrics {
    /// Register `export.otlp`'s counters (`tokenwatch_otlp_export_*`).
    pub fn register(metrics: &Metrics) -> ExportMetrics {
        ExportMetrics::register_as(metrics, &OTLP_EXPORT)
    }

    /// Register the counters named by `n` (once per registry; the encoder adds `_total`),
    /// every drop reason visible at zero.
    pub fn register_as(metrics: &Metrics, n: &ExportNaming) -> ExportMetrics {
        let m = ExportMetrics::default();
        metrics.register(
            &format!("{}_spans", n.prefix),
            &format!("{} {} accepted", n.items, n.receiver),
            m.spans.clone(),
        );
        metrics.register(
            &format!("{}_failures", n.prefix),
            &format!(
                "Attempts to send to {} that failed (connection errors, timeouts, refusals)",
                n.receiver
            ),
            m.failures.clone(),
        );
        metrics.register(
            &format!("{}_dropped", n.prefix),
            &format!(
                "{} given up: the oldest of a full queue (queue_full), refused by {} (rejected), or still queued at shutdown (shutdown)",
                n.items, n.receiver
            ),
            m.dropped.clone(),
        );
        for reason in DROP_REASONS {
            let _ = m.dropped.get_or_create(&ReasonLabels { reason });
        }
        m
    }

    pub fn drop_spans(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.dropped
                .get_or_create(&ReasonLabels { reason })
                .inc_by(n);
        }
    }

    pub fn dropped(&self, reason: &'static str) -> u64 {
        self.dropped.get_or_create(&ReasonLabels { reason }).get()
    }

    pub fn sent(&self) -> u64 {
        self.spans.get()
    }

    pub fn failures(&self) -> u64 {
        self.failures.get()
    }
}

/// How requests reach the endpoint.
pub(super) enum Transport {
    Http {
        /// Boxed: hyper's client is large beside the gRPC variant.
        client: Box<HttpClient>,
        uri: http::Uri,
        headers: http::HeaderMap,
    },
    Grpc {
        client: TraceServiceClient<Channel>,
        metadata: tonic::metadata::MetadataMap,
    },
}

impl Transport {
    pub(super) fn new(
        protocol: Protocol,
        p: &Prepared,
        timeout: Duration,
    ) -> Result<Transport, String> {
        match protocol {
            Protocol::Http => {
                let client = HttpClient::new(p.tls.as_ref(), timeout);
                Ok(Transport::Http {
                    client: Box::new(client),
                    uri: p.uri.clone(),
                    headers: p.headers.clone(),
                })
            }
            Protocol::Grpc => {
                let endpoint = tonic::transport::Endpoint::from_shared(p.uri.to_string())
                    .map_err(|e| format!("{}: {e}", p.label))?
                    .connect_timeout(timeout)
                    .tcp_nodelay(true);
                let client = TraceServiceClient::new(endpoint.connect_lazy());
                Ok(Transport::Grpc {
                    client,
                    metadata: tonic::metadata::MetadataMap::from_headers(p.headers.clone()),
                })
            }
        }
    }
}

pub(super) struct Sender {
    label: String,
    transport: Transport,
    timeout: Duration,
    metrics: ExportMetrics,
    /// Backoff and state-change logging (shared with remote write).
    endpoint: Endpoint,
}

impl Sender {
    pub(super) fn new(
        label: String,
        transport: Transport,
        timeout: Duration,
        metrics: ExportMetrics,
    ) -> Sender {
        Sender::named(label, transport, timeout, metrics, &OTLP_EXPORT)
    }

    /// As `new`, logging as `naming.what`.
    pub(super) fn named(
        label: String,
        transport: Transport,
        timeout: Duration,
        metrics: ExportMetrics,
        naming: &ExportNaming,
    ) -> Sender {
        Sender {
            endpoint: Endpoint::new(naming.what, label.clone(), naming.dropped_counter),
            label,
            transport,
            timeout,
            metrics,
        }
    }

    /// The same sender, retrying by `policy` instead of the exporters' default.
    pub(super) fn with_retry(mut self, policy: delivery::RetryPolicy) -> Sender {
        self.endpoint = self.endpoint.with_policy(policy);
        self
    }

    /// Send batches until `stop`; then one last attempt for each batch still queued.
    pub(super) async fn run(
        self,
        queue: Arc<SpanQueue>,
        max_batch: usize,
        flush: Duration,
        stop: watch::Receiver<bool>,
    ) {
        self.run_converting(queue, |spans| (spans, 0), max_batch, flush, stop)
            .await
    }

    /// As `run`, for a queue of items each batch is turned into spans by `to_spans` when it is
    /// taken (returning the spans and how many items could not become one: counted `rejected`).
    pub(super) async fn run_converting<T>(
        self,
        queue: Arc<SpanQueue<T>>,
        to_spans: impl Fn(Vec<T>) -> (Vec<ExportSpan>, u64),
        max_batch: usize,
        flush: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let take = |max: usize| {
            let (spans, unconvertible) = to_spans(queue.take(max));
            self.metrics.drop_spans("rejected", unconvertible);
            spans
        };
        'running: loop {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => break 'running,
                _ = queue.non_empty() => {}
            }
            let deadline = tokio::time::Instant::now() + flush;
            while queue.len() < max_batch {
                tokio::select! {
                    biased;
                    _ = stopped(&mut stop) => break 'running,
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = queue.pushed() => {}
                }
            }
            let batch = take(max_batch);
            if batch.is_empty() {
                continue;
            }
            if !self.deliver(batch, &mut stop).await {
                break;
            }
        }
        // Shutdown: one short attempt per batch left; the first failure gives up on the rest.
        while !queue.is_empty() {
            let batch = take(max_batch);
            if batch.is_empty() {
                continue;
            }
            let n = batch.len() as u64;
            let req = request_of(batch);
            match self.attempt(&req, self.timeout.min(LAST_ATTEMPT)).await {
                Attempt::Sent(refused) => self.accepted(n, refused),
                Attempt::Rejected(_) => {
                    self.metrics.failures.inc();
                    self.metrics.drop_spans("rejected", n);
                }
                Attempt::Retry(why) => {
                    self.metrics.failures.inc();
                    let left = n + queue.take(usize::MAX).len() as u64;
                    self.metrics.drop_spans("shutdown", left);
                    tracing::warn!(endpoint = %self.label, error = %why, spans = left, "{}: spans dropped at shutdown", self.endpoint.what());
                }
            }
        }
    }

    fn accepted(&self, n: u64, refused: u64) {
        let refused = refused.min(n);
        self.metrics.spans.inc_by(n - refused);
        self.metrics.drop_spans("rejected", refused);
    }

    /// Send `batch`, retrying with backoff; false once shutdown was requested (the batch then
    /// had one last attempt).
    async fn deliver(&self, batch: Vec<ExportSpan>, stop: &mut watch::Receiver<bool>) -> bool {
        let n = batch.len() as u64;
        let req = request_of(batch);
        let (delivered, go_on) = delivery::deliver(self, &req, self.timeout, stop).await;
        match delivered {
            Delivered::Sent(refused) => self.accepted(n, refused),
            Delivered::Rejected => self.metrics.drop_spans("rejected", n),
            Delivered::GaveUp => self.metrics.drop_spans("shutdown", n),
        }
        go_on
    }
}

impl Deliver for Sender {
    type Batch = ExportTraceServiceRequest;
    /// Spans the endpoint refused in an accepted request (partial success).
    type Receipt = u64;

    fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn failed(&self) {
        self.metrics.failures.inc();
    }

    async fn attempt(&self, req: &ExportTraceServiceRequest, timeout: Duration) -> Attempt<u64> {
        match &self.transport {
            Transport::Http {
                client,
                uri,
                headers,
            } => {
                let mut r = http::Request::new(Full::new(Bytes::from(req.encode_to_vec())));
                *r.method_mut() = http::Method::POST;
                *r.uri_mut() = uri.clone();
                *r.headers_mut() = headers.clone();
                match client.exchange(r, timeout, 64 * 1024).await {
                    Err(e) => Attempt::Retry(e),
                    Ok((status, body)) if status.is_success() => {
                        let refused = ExportTraceServiceResponse::decode(body)
                            .ok()
                            .and_then(|r| r.partial_success)
                            .map(|p| u64::try_from(p.rejected_spans).unwrap_or(0))
                            .unwrap_or(0);
                        Attempt::Sent(refused)
                    }
                    Ok((status, body)) => {
                        let text = String::from_utf8_lossy(&body[..body.len().min(512)])
                            .trim()
                            .to_string();
                        let why = format!("answered {status}: {text}");
                        match status.as_u16() {
                            429 | 502 | 503 | 504 => Attempt::Retry(why),
                            _ => Attempt::Rejected(why),
                        }
                    }
                }
            }
            Transport::Grpc { client, metadata } => {
                let mut request = tonic::Request::new(req.clone());
                *request.metadata_mut() = metadata.clone();
                request.set_timeout(timeout);
                let mut client = client.clone();
                match tokio::time::timeout(timeout, client.export(request)).await {
                    Err(_) => Attempt::Retry(format!("no answer within {timeout:?}")),
                    Ok(Ok(resp)) => {
                        let refused = resp
                            .into_inner()
                            .partial_success
                            .map(|p| u64::try_from(p.rejected_spans).unwrap_or(0))
                            .unwrap_or(0);
                        Attempt::Sent(refused)
                    }
                    Ok(Err(status)) => {
                        use tonic::Code;
                        let why = format!("gRPC {:?}: {}", status.code(), status.message());
                        match status.code() {
                            Code::Cancelled
                            | Code::DeadlineExceeded
                            | Code::Aborted
                            | Code::OutOfRange
                            | Code::Unavailable
                            | Code::DataLoss
                            | Code::ResourceExhausted => Attempt::Retry(why),
                            _ => Attempt::Rejected(why),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::delivery::conformance;

    #[tokio::test]
    async fn otlp_http_export_passes_the_deliverers_conformance_checks() {
        let (url, script) = conformance::endpoint().await;
        let metrics = ExportMetrics::register(&Metrics::new());
        let transport = Transport::Http {
            client: Box::new(HttpClient::new(None, Duration::from_secs(2))),
            uri: format!("{url}/v1/traces").parse().unwrap(),
            headers: http::HeaderMap::new(),
        };
        let sender = Sender::new(url, transport, Duration::from_secs(2), metrics.clone());
        let batch = ExportTraceServiceRequest::default();
        conformance::check(&sender, &script, &batch, || metrics.failures.get()).await;
    }
}
