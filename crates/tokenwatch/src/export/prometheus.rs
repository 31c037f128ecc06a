// `/metrics`: request histograms named after the OpenTelemetry GenAI conventions, token and
// request counters, and tokenwatch's own health (`tokenwatch_*`), via prometheus-client.

use crate::pipeline::RecordSink;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokenwatch_core::model::RequestRecord;

/// Buckets recommended by the GenAI conventions for `gen_ai.server.time_to_first_token`.
const TTFT_BUCKETS: [f64; 16] =
    [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];
/// Buckets recommended for `gen_ai.server.time_per_output_token`.
const TPOT_BUCKETS: [f64; 13] = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5];
/// Buckets recommended for `gen_ai.server.request.duration`.
const DURATION_BUCKETS: [f64; 14] =
    [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
const STORE_WRITE_BUCKETS: [f64; 12] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// Labels of the request series. The tenant is left out on purpose: tenants can be many,
/// and per-tenant latency is served by the API (`by=tenant`) from sketches instead.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub model_id: String,
    pub runtime: String,
    pub instance: String,
    pub ab_group: String,
    pub model_version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub model_id: String,
    pub runtime: String,
    pub instance: String,
    pub error_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub model_id: String,
    pub runtime: String,
    pub instance: String,
    pub gen_ai_token_type: String,
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn ttft_hist() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}
fn tpot_hist() -> Histogram {
    Histogram::new(TPOT_BUCKETS)
}
fn duration_hist() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// Every metric tokenwatch exposes, and the registry that encodes them.
pub struct Metrics {
    registry: std::sync::RwLock<Registry>,
    pub ttft: HistFamily<RequestLabels>,
    pub tpot: HistFamily<RequestLabels>,
    pub duration: HistFamily<OutcomeLabels>,
    pub tokens: Family<TokenLabels, Counter>,
    pub requests: Family<OutcomeLabels, Counter>,
    pub queue_depth: Gauge,
    pub queue_capacity: Gauge,
    /// `tokenwatch_telemetry_dropped_records_total{reason="queue_full"}`: fetched once, so the
    /// proxy's drop is one atomic add.
    pub dropped_records: Counter,
    /// The same, `reason="shutting_down"`: the pipeline had stopped accepting records.
    pub dropped_records_closed: Counter,
    pub pipeline_records: Counter,
    pub store_write_seconds: Histogram,
    pub store_records_written: Counter,
    pub store_write_errors: Counter,
    pub store_rollups_written: Counter,
    pub aggregator_series: Gauge,
    pub aggregator_refused_series: Gauge,
    /// Requests refused by a listener's limits (`crate::listen::limits`).
    pub rejected_requests: Family<RejectedLabels, Counter>,
}

/// Labels of `tokenwatch_rejected_requests`: the listener (`api`, `proxy`, `otlp`) and why
/// (`headers_too_large`, `body_too_large`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectedLabels {
    pub listener: String,
    pub reason: String,
}

/// Labels of `tokenwatch_telemetry_dropped_records`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let ttft: HistFamily<RequestLabels> = Family::new_with_constructor(ttft_hist);
        let tpot: HistFamily<RequestLabels> = Family::new_with_constructor(tpot_hist);
        let duration: HistFamily<OutcomeLabels> = Family::new_with_constructor(duration_hist);
        registry.register(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from the request's arrival at the proxy to its first content-bearing chunk",
            ttft.clone(),
        );
        registry.register(
            "gen_ai_server_time_per_output_token_seconds",
            "Time per output token after the first, per streamed request",
            tpot.clone(),
        );
        registry.register(
            "gen_ai_server_request_duration_seconds",
            "Time from the request's arrival to the end of its response",
            duration.clone(),
        );
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register("gen_ai_server_token_usage", "Tokens processed, by type (input or output)", tokens.clone());
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register("tokenwatch_requests", "Requests seen by the proxy, by error type (empty when none)", requests.clone());

        let queue_depth = Gauge::default();
        registry.register("tokenwatch_telemetry_queue_depth", "Records waiting in the telemetry queue", queue_depth.clone());
        let queue_capacity = Gauge::default();
        registry.register("tokenwatch_telemetry_queue_capacity", "Capacity of the telemetry queue", queue_capacity.clone());
        let dropped = Family::<ReasonLabels, Counter>::default();
        let dropped_records = dropped.get_or_create(&ReasonLabels { reason: "queue_full".into() }).clone();
        let dropped_records_closed = dropped.get_or_create(&ReasonLabels { reason: "shutting_down".into() }).clone();
        registry.register(
            "tokenwatch_telemetry_dropped_records",
            "Records dropped before the pipeline (requests were not affected), by reason: queue_full, shutting_down",
            dropped,
        );
        let pipeline_records = Counter::default();
        registry.register("tokenwatch_pipeline_records", "Records processed by the pipeline", pipeline_records.clone());
        let store_write_seconds = Histogram::new(STORE_WRITE_BUCKETS);
        registry.register(
            "tokenwatch_store_write_duration_seconds",
            "Latency of one committed batch write to the store",
            store_write_seconds.clone(),
        );
        let store_records_written = Counter::default();
        registry.register("tokenwatch_store_records_written", "Request records committed to the store", store_records_written.clone());
        let store_write_errors = Counter::default();
        registry.register("tokenwatch_store_write_errors", "Failed store writes", store_write_errors.clone());
        let store_rollups_written = Counter::default();
        registry.register("tokenwatch_store_rollups_written", "Per-minute sketch roll-ups committed to the store", store_rollups_written.clone());
        let aggregator_series = Gauge::default();
        registry.register("tokenwatch_aggregator_series", "Series held in memory by the aggregator", aggregator_series.clone());
        let aggregator_refused_series = Gauge::default();
        registry.register(
            "tokenwatch_aggregator_refused_series",
            "New series refused because aggregation.max_series was reached",
            aggregator_refused_series.clone(),
        );
        let rejected_requests = Family::<RejectedLabels, Counter>::default();
        registry.register(
            "tokenwatch_rejected_requests",
            "Requests refused for headers or a body over their limits, by listener and reason",
            rejected_requests.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge<i64, std::sync::atomic::AtomicI64>>::default();
        registry.register("tokenwatch_build_info", "tokenwatch version", build_info.clone());
        build_info.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION").into() }).set(1);

        Metrics {
            registry: std::sync::RwLock::new(registry),
            ttft,
            tpot,
            duration,
            tokens,
            requests,
            queue_depth,
            queue_capacity,
            dropped_records,
            dropped_records_closed,
            pipeline_records,
            store_write_seconds,
            store_records_written,
            store_write_errors,
            store_rollups_written,
            aggregator_series,
            aggregator_refused_series,
            rejected_requests,
        }
    }

    /// Register a further metric (a source's own health, for example). Names must be unique.
    pub fn register(&self, name: &str, help: &str, metric: impl prometheus_client::registry::Metric) {
        let mut r = self.registry.write().unwrap_or_else(|p| p.into_inner());
        r.register(name, help, metric);
    }

    /// Register a collector that produces its metrics at encode time.
    pub fn register_collector(&self, collector: Box<dyn prometheus_client::collector::Collector>) {
        let mut r = self.registry.write().unwrap_or_else(|p| p.into_inner());
        r.register_collector(collector);
    }

    /// Prometheus text exposition format 0.0.4.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let registry = self.registry.read().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
            tracing::error!(error = %e, "encoding /metrics failed");
        }
        out
    }

    pub const CONTENT_TYPE: &'static str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

    fn observe(&self, r: &RequestRecord) {
        let l = &r.labels;
        let req = RequestLabels {
            model_id: l.model_id.clone(),
            runtime: l.runtime.clone(),
            instance: l.instance.clone(),
            ab_group: l.ab_group.clone(),
            model_version: l.model_version.clone(),
        };
        if let Some(t) = r.first_token_s {
            self.ttft.get_or_create(&req).observe(t);
        }
        if let Some(t) = r.time_per_output_token_s() {
            self.tpot.get_or_create(&req).observe(t);
        }
        let outcome = OutcomeLabels {
            model_id: l.model_id.clone(),
            runtime: l.runtime.clone(),
            instance: l.instance.clone(),
            error_type: r.error_class.map(|c| c.name().to_string()).unwrap_or_default(),
        };
        self.duration.get_or_create(&outcome).observe(r.end_s);
        self.requests.get_or_create(&outcome).inc();
        for (kind, n) in [("input", r.prompt_tokens), ("output", r.output_tokens)] {
            if let Some(n) = n {
                let t = TokenLabels {
                    model_id: l.model_id.clone(),
                    runtime: l.runtime.clone(),
                    instance: l.instance.clone(),
                    gen_ai_token_type: kind.to_string(),
                };
                self.tokens.get_or_create(&t).inc_by(n);
            }
        }
    }
}

/// Shared handle so the pipeline can feed the metrics while the API encodes them.
pub struct MetricsSink(pub std::sync::Arc<Metrics>);

impl RecordSink for MetricsSink {
    fn name(&self) -> &'static str {
        "prometheus"
    }

    fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), crate::pipeline::SinkError> {
        for r in batch {
            self.0.observe(r);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwatch_core::model::{ErrorClass, SeriesLabels};

    #[test]
    fn exposition_contains_genai_names_and_observations() {
        let m = std::sync::Arc::new(Metrics::new());
        let rec = RequestRecord {
            labels: SeriesLabels { model_id: "m1".into(), runtime: "vllm".into(), ..Default::default() },
            first_token_s: Some(0.2),
            end_s: 1.0,
            output_tokens: Some(10),
            prompt_tokens: Some(5),
            chunk_offsets_us: vec![200_000, 1_000_000],
            ..Default::default()
        };
        let mut failed = rec.clone();
        failed.error_class = Some(ErrorClass::UpstreamConnect);
        MetricsSink(m.clone()).consume(&[rec, failed]).unwrap();
        let text = m.encode();
        assert!(text.contains("# TYPE gen_ai_server_time_to_first_token_seconds histogram"), "{text}");
        assert!(text.contains("gen_ai_server_time_to_first_token_seconds_count{model_id=\"m1\""), "{text}");
        assert!(text.contains("gen_ai_server_token_usage_total{"), "{text}");
        assert!(text.contains("error_type=\"upstream_connect\""), "{text}");
        assert!(text.contains("tokenwatch_telemetry_dropped_records_total{reason=\"queue_full\"} 0"), "{text}");
        assert!(!text.contains("# EOF"));
    }
}
