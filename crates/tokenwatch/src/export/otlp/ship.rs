// Shipping a proxy replica's request records to its aggregator (`role: proxy`, the
// `aggregator:` section): the pipeline sink that buffers them (bounded, in memory, never
// waiting), and the sender that turns each batch into the proxy's spans with the
// `tokenwatch.record.*` attributes and sends them over OTLP — to the aggregator's OTLP receiver
// or an OpenTelemetry Collector in between. First tokens go to the same endpoint ahead of their
// records (`kernel::shipped_first_token`), through a small queue and sender of their own, while
// the link keeps up: the aggregator's early-TTFT detection sees a slow first token while its
// stream still runs, and the records' buffer and counts stay the records' alone.

//! While the aggregator is away the records wait in the buffer, up to `buffer.capacity` (plus
//! the one batch being retried); beyond that the oldest are dropped and counted. Retries back off
//! from `retry.min_backoff` doubling to `retry.max_backoff`, so a returning aggregator gets the
//! buffer within `max_backoff`. Counters: `tokenwatch_ship_spans_total` (records the aggregator
//! accepted), `tokenwatch_ship_failures_total` (failed attempts),
//! `tokenwatch_ship_dropped_total{reason}` (`queue_full`: the oldest of a full buffer,
//! `rejected`: refused by the aggregator, `shutdown`: still buffered when the process stopped)
//! and the gauge `tokenwatch_ship_buffered_records`. First tokens: `tokenwatch_ship_first_tokens_*`
//! alike, with `reason="backlog"` for those not queued because a batch of records or more was
//! waiting (the aggregator slow or away: they would not be early, and their records carry the
//! same time).

use super::queue::SpanQueue;
use super::sender::{self, ExportMetrics, ExportNaming};
use super::{ExportSpan, OtlpExportConfig, OtlpExportConfigError, Protocol, prepare};
use crate::kernel::delivery::RetryPolicy;
use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::Metrics;
use crate::kernel::tls::UpstreamTlsConfig;
use crate::pipeline::proxy_span::SERVICE_NAME;
use crate::pipeline::{ProxySpanBuilder, RecordSink, SinkError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokenwatch_core::model::{FirstToken, RequestRecord};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The counters' names: `tokenwatch_ship_*`.
pub const SHIP: ExportNaming = ExportNaming {
    what: "record shipping to the aggregator",
    prefix: "tokenwatch_ship",
    items: "Request records (one span each)",
    receiver: "the aggregator",
    dropped_counter: "tokenwatch_ship_dropped_total",
};

/// The first tokens' counters: `tokenwatch_ship_first_tokens_*`.
pub const SHIP_FIRST_TOKENS: ExportNaming = ExportNaming {
    what: "first-token shipping to the aggregator",
    prefix: "tokenwatch_ship_first_tokens",
    items: "First tokens shipped ahead of their records (one span each)",
    receiver: "the aggregator",
    dropped_counter: "tokenwatch_ship_first_tokens_dropped_total",
};

/// `aggregator:` — where a proxy replica (`role: proxy`) ships its request records. Read by
/// `role: proxy` only (one file can serve every role).
///
/// ```yaml
/// aggregator:
///   endpoint: http://tokenwatch-aggregator:4318   # its OTLP/HTTP port (or a Collector's)
///   protocol: http                                # or grpc (then port 4317)
///   buffer: {capacity: 50000, max_batch: 512, flush_interval: 200ms}
///   retry: {min_backoff: 100ms, max_backoff: 2s}
/// ```
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AggregatorLinkConfig {
    /// Base URL of the aggregator's OTLP receiver (or of an OpenTelemetry Collector that
    /// forwards traces to it): `http://host:4318` for http (`/v1/traces` is appended),
    /// `http://host:4317` for grpc.
    pub endpoint: String,
    #[serde(default)]
    pub protocol: Protocol,
    /// Extra request headers (gRPC metadata), e.g. `Authorization: Bearer <ingest token>`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Per-attempt limit (connect, send and answer).
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    #[serde(default)]
    pub buffer: ShipBufferConfig,
    #[serde(default)]
    pub retry: ShipRetryConfig,
    /// For an `https://` endpoint over http: CA file trusted besides the system's roots, and
    /// the name checked.
    #[serde(default)]
    pub tls: Option<UpstreamTlsConfig>,
}

/// `aggregator.buffer`: the records waiting for the aggregator, in memory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShipBufferConfig {
    /// Records held while the aggregator is slow or away (about 1.5 KB each for a 256-token
    /// stream); when full, the oldest are dropped and counted in
    /// `tokenwatch_ship_dropped_total{reason="queue_full"}`. The default holds about 8 minutes
    /// of 100 requests/s.
    pub capacity: usize,
    /// Most records in one export request.
    pub max_batch: usize,
    /// Longest a record waits for its batch to fill before it is sent.
    pub flush_interval: HumanDuration,
}

impl Default for ShipBufferConfig {
    fn default() -> Self {
        ShipBufferConfig {
            capacity: 50_000,
            max_batch: 512,
            flush_interval: HumanDuration(Duration::from_millis(200)),
        }
    }
}

/// `aggregator.retry`: the backoff between attempts while the aggregator does not answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShipRetryConfig {
    /// The first wait after a failed attempt; doubled after each further failure.
    pub min_backoff: HumanDuration,
    /// The longest wait: a returning aggregator receives the buffer within this.
    pub max_backoff: HumanDuration,
}

impl Default for ShipRetryConfig {
    fn default() -> Self {
        ShipRetryConfig {
            min_backoff: HumanDuration(Duration::from_millis(100)),
            max_backoff: HumanDuration(Duration::from_secs(2)),
        }
    }
}

fn default_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}

impl AggregatorLinkConfig {
    /// An endpoint with every default.
    pub fn new(endpoint: impl Into<String>) -> AggregatorLinkConfig {
        AggregatorLinkConfig {
            endpoint: endpoint.into(),
            protocol: Protocol::Http,
            headers: BTreeMap::new(),
            timeout: default_timeout(),
            buffer: ShipBufferConfig::default(),
            retry: ShipRetryConfig::default(),
            tls: None,
        }
    }

    /// The same settings as an OTLP exporter's, to check and connect them alike.
    fn as_export(&self) -> OtlpExportConfig {
        OtlpExportConfig {
            endpoint: self.endpoint.clone(),
            protocol: self.protocol,
            headers: self.headers.clone(),
            include_received: false,
            timeout: self.timeout,
            queue: super::ExportQueueConfig {
                capacity: self.buffer.capacity,
                max_batch: self.buffer.max_batch,
                flush_interval: self.buffer.flush_interval,
            },
            tls: self.tls.clone(),
        }
    }
}

/// Check `aggregator` (URL, protocol, headers, buffer, retry, TLS); names the key at fault.
pub fn validate(cfg: &AggregatorLinkConfig) -> Result<(), OtlpExportConfigError> {
    prepare(&cfg.as_export(), "aggregator").map_err(|mut e| {
        // The queue is this section's `buffer`.
        if let Some(rest) = e.key.strip_prefix("aggregator.queue.") {
            e.key = format!("aggregator.buffer.{rest}");
        }
        e
    })?;
    let err = |key: &str, message: &str| OtlpExportConfigError {
        key: format!("aggregator.retry.{key}"),
        message: message.into(),
    };
    if cfg.retry.min_backoff.0.is_zero() {
        return Err(err("min_backoff", "must be greater than zero"));
    }
    if cfg.retry.max_backoff.0 < cfg.retry.min_backoff.0 {
        return Err(err("max_backoff", "must be at least min_backoff"));
    }
    Ok(())
}

/// The pipeline sink of `role: proxy`: every record goes into the ship buffer (never waits;
/// a full buffer drops its oldest, counted), every first token into its own queue while fewer
/// than one batch of records waits. Captured text is never shipped.
pub struct ShipSink {
    buffer: Arc<SpanQueue<RequestRecord>>,
    metrics: ExportMetrics,
    firsts: Arc<SpanQueue<FirstToken>>,
    first_metrics: ExportMetrics,
    max_batch: usize,
}

impl RecordSink for ShipSink {
    fn name(&self) -> &'static str {
        "ship"
    }

    /// First tokens are worth sending only while they are early: with a batch of records or
    /// more waiting (the aggregator slow or away) they are dropped (counted `backlog`).
    fn consume_first_tokens(&mut self, first: &[FirstToken]) -> Result<(), SinkError> {
        if self.buffer.len() >= self.max_batch {
            self.first_metrics.drop_spans("backlog", first.len() as u64);
            return Ok(());
        }
        let dropped = self.firsts.push(first.to_vec());
        self.first_metrics.drop_spans("queue_full", dropped as u64);
        Ok(())
    }

    fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError> {
        let records = batch
            .iter()
            .map(|r| RequestRecord {
                text: None,
                ..r.clone()
            })
            .collect();
        let dropped = self.buffer.push(records);
        self.metrics.drop_spans("queue_full", dropped as u64);
        Ok(())
    }
}

/// The running shipper: its sink (for the pipeline), its stop and its sender tasks (records,
/// first tokens).
pub struct Shipper {
    sink: Option<ShipSink>,
    close: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Shipper {
    /// The pipeline sink feeding the buffer (once).
    pub fn take_sink(&mut self) -> Option<ShipSink> {
        self.sink.take()
    }

    /// Send what is still buffered (one last attempt per batch, bounded as export's) and stop.
    /// Call after the pipeline has drained.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.close.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

/// Start shipping on the current runtime (the analysis runtime, never the proxy's) and register
/// the `tokenwatch_ship_*` metrics. `builder` makes the spans (it knows the upstreams).
pub fn start(
    cfg: &AggregatorLinkConfig,
    builder: ProxySpanBuilder,
    metrics: &Metrics,
) -> Result<Shipper, OtlpExportConfigError> {
    validate(cfg)?;
    let export = cfg.as_export();
    let p = prepare(&export, "aggregator")?;
    let counters = ExportMetrics::register_as(metrics, &SHIP);
    let first_counters = ExportMetrics::register_as(metrics, &SHIP_FIRST_TOKENS);
    let depth = prometheus_client::metrics::gauge::Gauge::default();
    metrics.register(
        "tokenwatch_ship_buffered_records",
        "Request records waiting in the buffer for the aggregator (aggregator.buffer.capacity at most)",
        depth.clone(),
    );
    let buffer = Arc::new(SpanQueue::new(cfg.buffer.capacity).with_depth_gauge(depth));
    // At most a batch of first tokens waits: any more and they are not early any more.
    let firsts = Arc::new(SpanQueue::new(cfg.buffer.max_batch));
    let (close, closed) = watch::channel(false);
    let transport = |p: &super::Prepared| {
        sender::Transport::new(cfg.protocol, p, cfg.timeout.0).map_err(|message| {
            OtlpExportConfigError {
                key: "aggregator.endpoint".into(),
                message,
            }
        })
    };
    let (records_transport, first_transport) = (transport(&p)?, transport(&p)?);
    tracing::info!(endpoint = %p.label, protocol = ?cfg.protocol, capacity = cfg.buffer.capacity, "shipping request records to the aggregator");
    let policy = RetryPolicy {
        min_backoff: cfg.retry.min_backoff.0,
        max_backoff: cfg.retry.max_backoff.0,
        max_retries: None,
    };
    let first_sender = sender::Sender::named(
        p.label.clone(),
        first_transport,
        cfg.timeout.0,
        first_counters.clone(),
        &SHIP_FIRST_TOKENS,
    )
    .with_retry(policy);
    let first_task = tokio::spawn(first_sender.run_converting(
        firsts.clone(),
        |firsts: Vec<FirstToken>| {
            let n = firsts.len();
            let spans: Vec<ExportSpan> = firsts
                .iter()
                .filter_map(crate::kernel::shipped_first_token::span)
                .map(|span| ExportSpan {
                    service_name: SERVICE_NAME.into(),
                    span,
                })
                .collect();
            let unshippable = (n - spans.len()) as u64;
            (spans, unshippable)
        },
        cfg.buffer.max_batch,
        cfg.buffer.flush_interval.0,
        closed.clone(),
    ));
    let s = sender::Sender::named(
        p.label,
        records_transport,
        cfg.timeout.0,
        counters.clone(),
        &SHIP,
    )
    .with_retry(policy);
    let to_spans = move |records: Vec<RequestRecord>| {
        let n = records.len();
        let spans: Vec<ExportSpan> = records
            .iter()
            .filter_map(|r| builder.build_shipped(r))
            .map(|span| ExportSpan {
                service_name: SERVICE_NAME.into(),
                span,
            })
            .collect();
        let unshippable = (n - spans.len()) as u64;
        (spans, unshippable)
    };
    let task = tokio::spawn(s.run_converting(
        buffer.clone(),
        to_spans,
        cfg.buffer.max_batch,
        cfg.buffer.flush_interval.0,
        closed,
    ));
    Ok(Shipper {
        sink: Some(ShipSink {
            buffer,
            metrics: counters,
            firsts,
            first_metrics: first_counters,
            max_batch: cfg.buffer.max_batch,
        }),
        close,
        tasks: vec![task, first_task],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::shipped_record::CHUNK_OFFSETS_ATTR;
    use crate::pipeline::proxy_span::FIRST_TOKEN_EVENT;
    use crate::sources::otlp::genai::map_traces;
    use tokenwatch_core::aggregate::{Aggregator, AggregatorConfig, LatencyQuery};
    use tokenwatch_core::model::{ErrorClass, LatencyMetric, ProxySpan, SeriesLabels};

    fn upstreams() -> Vec<crate::config::UpstreamConfig> {
        let json =
            r#"[{"url": "https://gpu.example.com/v1", "instance": "gpu-b", "runtime": "vllm"}]"#;
        serde_json::from_str(json).unwrap()
    }

    /// A record as the proxy makes it: every field the aggregator reads set, none at a default.
    fn proxy_record(i: u32) -> RequestRecord {
        let mut r = RequestRecord {
            request_id: format!("req-{i}"),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            labels: SeriesLabels {
                model_id: "llama".into(),
                runtime: "vllm".into(),
                instance: "gpu-b".into(),
                tenant: "key-0123456789abcdef".into(),
                ab_group: "b".into(),
                model_version: "v2".into(),
            },
            prompt_version: "p7".into(),
            endpoint: "/v1/chat/completions".into(),
            stream: true,
            arrival_unix_ms: 1_700_000_000_123 + i64::from(i),
            upstream_headers_s: Some(0.0123),
            first_token_s: Some(0.087_654_321 + f64::from(i) * 1e-3),
            end_s: 1.234_567_891,
            queue_s: Some(0.004),
            chunk_offsets_us: (0..40).map(|k| 87_654 + k * (15_000 + i)).collect(),
            prompt_tokens: Some(700),
            output_tokens: Some(40),
            reasoning_tokens: Some(8),
            cached_input_tokens: Some(512),
            tokens_from_usage: false,
            finish_reason: "length".into(),
            status: 200,
            error_class: None,
            embedding: vec![0.25, -0.5, 0.125],
            prefix_key: Some(0xdead_beef),
            text: None,
            span: ProxySpan {
                span_id: "00f067aa0ba902b7".into(),
                parent_span_id: String::new(),
                response_model: "llama-3.1".into(),
            },
            ..Default::default()
        };
        r.summarize_gaps();
        r
    }

    /// What the aggregator makes of the shipped spans of `records`.
    fn received(records: &[RequestRecord]) -> Vec<RequestRecord> {
        let b = ProxySpanBuilder::new(&upstreams());
        let spans = records
            .iter()
            .map(|r| ExportSpan {
                service_name: SERVICE_NAME.into(),
                span: b.build_shipped(r).unwrap(),
            })
            .collect();
        let batch = map_traces(
            &super::super::request_of(spans),
            Some(&crate::capture::telemetry::TelemetryText::dropping()),
        );
        assert_eq!(batch.rejected, 0, "{:?}", batch.first_error);
        assert_eq!(batch.first_error, None);
        // The stored span rows keep the GenAI attributes, not the chunk times.
        for row in &batch.spans {
            assert!(!row.attributes_json.contains(CHUNK_OFFSETS_ATTR));
            assert!(row.attributes_json.contains("gen_ai.request.model"));
        }
        batch.records
    }

    #[test]
    fn the_aggregator_rebuilds_the_record_the_proxy_made() {
        let sent = proxy_record(0);
        let got = received(std::slice::from_ref(&sent)).remove(0);
        // What is not shipped: the proxy's span details (the span is stored as a span).
        let expected = RequestRecord {
            span: ProxySpan::default(),
            ..sent.clone()
        };
        assert_eq!(got, expected);

        let mut failed = proxy_record(1);
        failed.status = 200;
        failed.error_class = Some(ErrorClass::ClientCancelled);
        failed.first_token_s = None;
        failed.chunk_offsets_us.clear();
        failed.upstream_headers_s = None;
        failed.summarize_gaps();
        let got = received(std::slice::from_ref(&failed)).remove(0);
        assert_eq!((got.status, got.error_class), (200, failed.error_class));
        assert_eq!((got.first_token_s, got.upstream_headers_s), (None, None));
        assert!(got.chunk_offsets_us.is_empty());
        assert_eq!(FIRST_TOKEN_EVENT, "gen_ai.first_token");
    }

    #[test]
    fn a_shipped_first_token_reaches_the_aggregator_as_a_first_token_not_a_span() {
        let r = proxy_record(3);
        let f = FirstToken {
            request_id: r.request_id.clone(),
            model_id: r.labels.model_id.clone(),
            instance: r.labels.instance.clone(),
            arrival_unix_ms: r.arrival_unix_ms,
            first_token_s: r.first_token_s.unwrap(),
        };
        let b = ProxySpanBuilder::new(&upstreams());
        let spans = vec![
            ExportSpan {
                service_name: SERVICE_NAME.into(),
                span: crate::kernel::shipped_first_token::span(&f).unwrap(),
            },
            ExportSpan {
                service_name: SERVICE_NAME.into(),
                span: b.build_shipped(&r).unwrap(),
            },
        ];
        let batch = map_traces(
            &super::super::request_of(spans),
            Some(&crate::capture::telemetry::TelemetryText::dropping()),
        );
        assert_eq!((batch.accepted, batch.rejected), (2, 0));
        assert_eq!(batch.first_tokens, vec![f]);
        assert_eq!(batch.records.len(), 1);
        assert_eq!(
            batch.spans.len(),
            1,
            "the first token is not stored as a span"
        );
    }

    #[test]
    fn sketches_from_shipped_records_equal_the_proxys() {
        let sent: Vec<RequestRecord> = (0..50).map(proxy_record).collect();
        let got = received(&sent);
        let cfg = AggregatorConfig::default();
        let (mut here, mut there) = (Aggregator::new(cfg.clone()), Aggregator::new(cfg));
        sent.iter().for_each(|r| here.observe(r));
        got.iter().for_each(|r| there.observe(r));
        let now = 1_700_000_010_000;
        for metric in LatencyMetric::ALL {
            let q = LatencyQuery {
                model: Some("llama".into()),
                metric,
                window: tokenwatch_core::window::Window::M5,
                by: None,
            };
            assert_eq!(here.query(&q, now), there.query(&q, now), "{metric}");
        }
    }

    #[test]
    fn the_section_names_its_own_keys() {
        let mut c = AggregatorLinkConfig::new("http://agg:4318");
        assert!(validate(&c).is_ok());
        c.buffer.capacity = 0;
        assert_eq!(validate(&c).unwrap_err().key, "aggregator.buffer.capacity");
        c.buffer.capacity = 10;
        c.endpoint = "agg:4318".into();
        assert_eq!(validate(&c).unwrap_err().key, "aggregator.endpoint");
        c.endpoint = "http://agg:4318".into();
        c.retry.max_backoff = HumanDuration(Duration::from_millis(1));
        assert_eq!(
            validate(&c).unwrap_err().key,
            "aggregator.retry.max_backoff"
        );
    }
}
