// OTLP trace export (`export.otlp`): the proxy's own spans, and optionally the spans received
// over OTLP, sent batched to any OTLP endpoint over gRPC or HTTP/protobuf.

//! Spans enter a bounded in-memory queue ([`SpanSink::push`], never waits: the pipeline thread
//! pushes the proxy's spans, the OTLP receiver the received ones when `include_received` is on).
//! A full queue drops its oldest spans. One sender task, on the analysis runtime (never the
//! proxy's), takes up to `queue.max_batch` spans once the batch is full or `queue.flush_interval`
//! after the first one waits, groups them by service into one `ExportTraceServiceRequest` and
//! sends it: `http` POSTs `{endpoint}/v1/traces` (`Content-Type: application/x-protobuf`), `grpc`
//! calls `TraceService/Export`, both with the configured headers. Connection errors, timeouts,
//! HTTP 429/502/503/504 and the retryable gRPC codes are retried with backoff (100 ms doubling to
//! 30 s) for as long as it takes, spans meanwhile queueing; any other refusal drops the batch.
//! At shutdown what is queued gets one last attempt. Counters:
//! `tokenwatch_otlp_export_spans_total` (accepted), `tokenwatch_otlp_export_failures_total`
//! (failed attempts) and `tokenwatch_otlp_export_dropped_total{reason}` (`queue_full`,
//! `rejected`, `shutdown`).

mod convert;
mod queue;
mod sender;
pub mod ship;
#[cfg(test)]
mod tests;

pub use convert::{ExportSpan, request_of, span_of_row};
pub use queue::SpanQueue;
pub use sender::{DROP_REASONS, ExportMetrics, ExportNaming, MAX_BACKOFF, MIN_BACKOFF};

use crate::kernel::duration::HumanDuration;
pub use crate::kernel::spans::{SpanExport, SpanSink};
use crate::kernel::telemetry::Metrics;
use crate::kernel::tls::UpstreamTls;
use crate::kernel::tls::UpstreamTlsConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokenwatch_store::SpanRow;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Headers the transport sets itself.
const PROTOCOL_HEADERS: [&str; 4] = ["content-type", "content-length", "host", "te"];

/// `export.otlp.protocol`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// OTLP/gRPC (`TraceService/Export`), usually port 4317.
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`POST /v1/traces`), usually port 4318.
    #[default]
    Http,
}

/// `export.otlp`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpExportConfig {
    /// Base URL of the receiver, e.g. `http://collector:4318` (http) or `http://collector:4317`
    /// (grpc). For http, `/v1/traces` is appended.
    pub endpoint: String,
    #[serde(default)]
    pub protocol: Protocol,
    /// Extra request headers (gRPC metadata), e.g. `Authorization`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Also export the spans received over OTLP (after capture's masking), not only the proxy's.
    #[serde(default)]
    pub include_received: bool,
    /// Per-attempt limit (connect, send and answer).
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    #[serde(default)]
    pub queue: ExportQueueConfig,
    /// For an `https://` endpoint over http: CA file trusted besides the system's roots, and
    /// the name checked.
    #[serde(default)]
    pub tls: Option<UpstreamTlsConfig>,
}

/// `export.otlp.queue`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportQueueConfig {
    /// Spans waiting to be sent; when full the oldest are dropped and counted.
    pub capacity: usize,
    /// Most spans in one export request.
    pub max_batch: usize,
    /// Longest a span waits for its batch to fill before it is sent.
    pub flush_interval: HumanDuration,
}

impl Default for ExportQueueConfig {
    fn default() -> Self {
        ExportQueueConfig {
            capacity: 8192,
            max_batch: 512,
            flush_interval: HumanDuration(Duration::from_secs(1)),
        }
    }
}

fn default_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

impl OtlpExportConfig {
    /// An endpoint with every default.
    pub fn new(endpoint: impl Into<String>, protocol: Protocol) -> OtlpExportConfig {
        OtlpExportConfig {
            endpoint: endpoint.into(),
            protocol,
            headers: BTreeMap::new(),
            include_received: false,
            timeout: default_timeout(),
            queue: ExportQueueConfig::default(),
            tls: None,
        }
    }
}

/// A configuration error with the key it is about, e.g. `export.otlp.endpoint`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct OtlpExportConfigError {
    pub key: String,
    pub message: String,
}

/// The configuration, checked and turned into what sending needs.
pub(crate) struct Prepared {
    /// The URL requests go to (http: with `/v1/traces`), for logs.
    pub label: String,
    pub uri: http::Uri,
    pub headers: http::HeaderMap,
    pub tls: Option<UpstreamTls>,
}

/// Check `cfg` (the section at `section`, e.g. `export.otlp`) and turn it into what sending needs.
fn prepare(cfg: &OtlpExportConfig, section: &str) -> Result<Prepared, OtlpExportConfigError> {
    let key = |k: &str| format!("{section}.{k}");
    let err = |k: String, message: String| OtlpExportConfigError { key: k, message };
    let base = cfg.endpoint.trim().trim_end_matches('/');
    let parsed: http::Uri = base
        .parse()
        .map_err(|e| err(key("endpoint"), format!("{base:?} is not a URL: {e}")))?;
    let https = match parsed.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            return Err(err(
                key("endpoint"),
                format!("{base:?}: expected an http:// or https:// URL"),
            ));
        }
    };
    let authority = parsed
        .authority()
        .ok_or_else(|| err(key("endpoint"), format!("{base:?}: missing host")))?;
    if authority.host().is_empty() || authority.as_str().contains('@') {
        return Err(err(
            key("endpoint"),
            format!(
                "{base:?}: expected a host[:port] without user info (put credentials in headers)"
            ),
        ));
    }
    if parsed.query().is_some() {
        return Err(err(
            key("endpoint"),
            format!("{base:?}: a query string is not allowed"),
        ));
    }
    let url = match cfg.protocol {
        Protocol::Http => format!("{base}/v1/traces"),
        Protocol::Grpc => {
            if parsed.path() != "/" && !parsed.path().is_empty() {
                return Err(err(
                    key("endpoint"),
                    format!(
                        "{base:?}: an OTLP/gRPC endpoint is a scheme and host[:port] only, without a path"
                    ),
                ));
            }
            if https {
                return Err(err(
                    key("endpoint"),
                    format!(
                        "{base:?}: OTLP/gRPC over TLS is not supported; use protocol: http for an https:// endpoint"
                    ),
                ));
            }
            base.to_string()
        }
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e| err(key("endpoint"), format!("{url:?} is not a URL: {e}")))?;

    let mut headers = http::HeaderMap::new();
    for (name, value) in &cfg.headers {
        let at = key(&format!("headers.{name}"));
        let n = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| err(at.clone(), format!("invalid header name: {e}")))?;
        if PROTOCOL_HEADERS.contains(&n.as_str()) || n.as_str().starts_with("grpc-") {
            return Err(err(
                at,
                "set by tokenwatch (OTLP transport); cannot be configured".into(),
            ));
        }
        let v = http::HeaderValue::from_str(value)
            .map_err(|e| err(at.clone(), format!("invalid header value: {e}")))?;
        if cfg.protocol == Protocol::Grpc && v.to_str().is_err() {
            return Err(err(
                at,
                "gRPC metadata values must be printable ASCII".into(),
            ));
        }
        headers.insert(n, v);
    }
    if cfg.protocol == Protocol::Http {
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-protobuf"),
        );
        headers.insert(
            http::header::USER_AGENT,
            http::HeaderValue::from_static(concat!("tokenwatch/", env!("CARGO_PKG_VERSION"))),
        );
    }
    if cfg.timeout.0.is_zero() {
        return Err(err(key("timeout"), "must be greater than zero".into()));
    }
    if cfg.queue.capacity == 0 {
        return Err(err(key("queue.capacity"), "must be at least 1".into()));
    }
    if cfg.queue.max_batch == 0 {
        return Err(err(key("queue.max_batch"), "must be at least 1".into()));
    }
    if cfg.queue.flush_interval.0.is_zero() {
        return Err(err(
            key("queue.flush_interval"),
            "must be greater than zero".into(),
        ));
    }
    let tls = match (&cfg.tls, https, cfg.protocol) {
        (Some(_), false, _) | (Some(_), _, Protocol::Grpc) => {
            return Err(err(
                key("tls"),
                format!("{base:?}: tls applies to https:// endpoints over http only"),
            ));
        }
        (tls, true, Protocol::Http) => Some(UpstreamTls::new(tls.as_ref()).map_err(|e| {
            let k = match e.key() {
                "" => key("tls"),
                sub => key(&format!("tls.{sub}")),
            };
            err(k, e.to_string())
        })?),
        _ => None,
    };
    Ok(Prepared {
        label: url,
        uri,
        headers,
        tls,
    })
}

/// Check `export.otlp` (URL, protocol, headers, queue, TLS); names the key at fault.
pub fn validate(cfg: Option<&OtlpExportConfig>) -> Result<(), OtlpExportConfigError> {
    match cfg {
        Some(c) => prepare(c, "export.otlp").map(|_| ()),
        None => Ok(()),
    }
}

/// The exporter's queue, as the stages see it through the kernel's span-export port
/// (`kernel::spans::SpanSink`): cheap to clone, never waits.
#[derive(Clone)]
pub struct SpanQueueHandle {
    queue: Arc<SpanQueue>,
    metrics: ExportMetrics,
    include_received: bool,
}

impl SpanSink for SpanQueueHandle {
    /// Queue `spans`; when the queue is full its oldest spans are dropped and counted.
    fn push(&self, spans: Vec<ExportSpan>) {
        let dropped = self.queue.push(spans);
        self.metrics.drop_spans("queue_full", dropped as u64);
    }

    /// Queue stored rows of received spans (when `include_received` is on; else nothing).
    fn push_received(&self, rows: &[SpanRow]) {
        if !self.include_received || rows.is_empty() {
            return;
        }
        self.push(rows.iter().filter_map(span_of_row).collect());
    }

    fn includes_received(&self) -> bool {
        self.include_received
    }
}

/// The running exporter: the handle spans are pushed to, and its sender task.
pub struct OtlpExporter {
    handle: SpanQueueHandle,
    close: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl OtlpExporter {
    /// The handle the stages push spans to (the kernel's span-export port).
    pub fn handle(&self) -> SpanExport {
        Arc::new(self.handle.clone())
    }

    /// Send what is still queued (one last attempt, bounded by the timeout and 2 s) and stop.
    /// Call after the pipeline has drained, so that the last records' spans are sent too.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.close.send(true);
        let abort = self.task.abort_handle();
        if tokio::time::timeout(grace, self.task).await.is_err() {
            abort.abort();
        }
    }
}

/// Start the sender task on the current runtime (the analysis runtime) and register the
/// `tokenwatch_otlp_export_*` counters (call once per `Metrics`). None when not configured.
pub fn start(
    cfg: Option<&OtlpExportConfig>,
    metrics: &Metrics,
) -> Result<Option<OtlpExporter>, OtlpExportConfigError> {
    let Some(cfg) = cfg else {
        return Ok(None);
    };
    let p = prepare(cfg, "export.otlp")?;
    let counters = ExportMetrics::register(metrics);
    let queue = Arc::new(SpanQueue::new(cfg.queue.capacity));
    let (close, closed) = watch::channel(false);
    let transport = sender::Transport::new(cfg.protocol, &p, cfg.timeout.0).map_err(|message| {
        OtlpExportConfigError {
            key: "export.otlp.endpoint".into(),
            message,
        }
    })?;
    tracing::info!(endpoint = %p.label, protocol = ?cfg.protocol, include_received = cfg.include_received, "OTLP trace export");
    let s = sender::Sender::new(p.label, transport, cfg.timeout.0, counters.clone());
    let task = tokio::spawn(s.run(
        queue.clone(),
        cfg.queue.max_batch,
        cfg.queue.flush_interval.0,
        closed,
    ));
    let handle = SpanQueueHandle {
        queue,
        metrics: counters,
        include_received: cfg.include_received,
    };
    Ok(Some(OtlpExporter {
        handle,
        close,
        task,
    }))
}
