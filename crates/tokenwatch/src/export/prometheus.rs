// `/metrics`: request histograms named and labelled after the OpenTelemetry GenAI conventions,
// request counters, the normalised signals read from the board at scrape time, and tokenwatch's own
// health (`tokenwatch_*`), via prometheus-client.

use crate::pipeline::RecordSink;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use tokenwatch_core::model::RequestRecord;
use tokenwatch_core::signals::{SharedSignals, SignalPoint, names};

/// Buckets recommended by the GenAI conventions for `gen_ai.server.time_to_first_token`.
const TTFT_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// Buckets recommended for `gen_ai.server.time_per_output_token`.
const TPOT_BUCKETS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
/// Buckets recommended for `gen_ai.server.request.duration` and `gen_ai.client.operation.duration`.
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// Buckets recommended for `gen_ai.client.token.usage` (powers of 4).
pub const TOKEN_USAGE_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
const STORE_WRITE_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// `export.prometheus` in the configuration.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PrometheusExportConfig {
    /// Add `tenant` to the request series. Off by default: tenants can be many, and per-tenant
    /// latency is served by the API (`by=tenant`) from sketches instead.
    pub tenant_label: bool,
}

/// `gen_ai.operation.name` of a request, from its endpoint: the client's path for proxied
/// requests, the span's route or operation for received spans. Unknown paths are chats.
pub fn operation_name(endpoint: &str) -> &'static str {
    const WELL_KNOWN: [&str; 9] = [
        "chat",
        "text_completion",
        "generate_content",
        "embeddings",
        "retrieval",
        "execute_tool",
        "create_agent",
        "invoke_agent",
        "invoke_workflow",
    ];
    if let Some(op) = WELL_KNOWN.iter().find(|op| **op == endpoint) {
        return op;
    }
    let path = endpoint
        .split('?')
        .next()
        .unwrap_or("")
        .trim_end_matches('/');
    if path.ends_with("/chat/completions") || path.ends_with("/api/chat") {
        "chat"
    } else if path.ends_with("/completions")
        || path.ends_with("/generate")
        || path.ends_with("/generate_stream")
    {
        "text_completion"
    } else if path.ends_with("/embeddings") || path.ends_with("/embed") {
        "embeddings"
    } else {
        "chat"
    }
}

/// `gen_ai.provider.name` of a route's runtime: the conventions' well-known value where one
/// exists (older `gen_ai.system` spellings included), else the runtime's own name. A route
/// without a runtime speaks the OpenAI API (Anthropic's on `/v1/messages`).
pub fn provider_name(runtime: &str, endpoint: &str) -> String {
    let known = match runtime.to_ascii_lowercase().as_str() {
        "" if endpoint == "/v1/messages" => "anthropic",
        "" | "openai" => "openai",
        "anthropic" => "anthropic",
        "azure_openai" | "azure-openai" | "az.ai.openai" | "azure.ai.openai" => "azure.ai.openai",
        "az.ai.inference" | "azure.ai.inference" => "azure.ai.inference",
        "bedrock" | "aws_bedrock" | "aws.bedrock" => "aws.bedrock",
        "gemini" | "gcp.gemini" => "gcp.gemini",
        "vertex_ai" | "vertexai" | "gcp.vertex_ai" => "gcp.vertex_ai",
        "gcp.gen_ai" => "gcp.gen_ai",
        "mistral" | "mistral_ai" | "mistralai" => "mistral_ai",
        "xai" | "x_ai" => "x_ai",
        "watsonx" | "ibm.watsonx.ai" => "ibm.watsonx.ai",
        "cohere" => "cohere",
        "deepseek" => "deepseek",
        "groq" => "groq",
        "perplexity" => "perplexity",
        _ => return runtime.to_string(),
    };
    known.to_string()
}

/// Labels of the request series: the GenAI conventions' attributes (dots as underscores) and
/// tokenwatch's own. `tenant` is written only when `export.prometheus.tenant_label` is on.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RequestLabels {
    pub gen_ai_operation_name: &'static str,
    pub gen_ai_provider_name: String,
    pub gen_ai_request_model: String,
    /// The model the response named; the request's model when it named none.
    pub gen_ai_response_model: String,
    pub instance: String,
    pub ab_group: String,
    pub model_version: String,
    pub tenant: Option<String>,
}

impl RequestLabels {
    pub fn of(r: &RequestRecord, with_tenant: bool) -> RequestLabels {
        let l = &r.labels;
        let response_model = if r.span.response_model.is_empty() {
            &l.model_id
        } else {
            &r.span.response_model
        };
        RequestLabels {
            gen_ai_operation_name: operation_name(&r.endpoint),
            gen_ai_provider_name: provider_name(&l.runtime, &r.endpoint),
            gen_ai_request_model: l.model_id.clone(),
            gen_ai_response_model: response_model.clone(),
            instance: l.instance.clone(),
            ab_group: l.ab_group.clone(),
            model_version: l.model_version.clone(),
            tenant: with_tenant.then(|| l.tenant.clone()),
        }
    }
}

fn label(encoder: &mut LabelSetEncoder, key: &str, value: &str) -> Result<(), std::fmt::Error> {
    (key, value).encode(encoder.encode_label())
}

impl EncodeLabelSet for RequestLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        label(encoder, "gen_ai_operation_name", self.gen_ai_operation_name)?;
        label(encoder, "gen_ai_provider_name", &self.gen_ai_provider_name)?;
        label(encoder, "gen_ai_request_model", &self.gen_ai_request_model)?;
        label(
            encoder,
            "gen_ai_response_model",
            &self.gen_ai_response_model,
        )?;
        label(encoder, "instance", &self.instance)?;
        label(encoder, "ab_group", &self.ab_group)?;
        label(encoder, "model_version", &self.model_version)?;
        if let Some(t) = &self.tenant {
            label(encoder, "tenant", t)?;
        }
        Ok(())
    }
}

/// The request labels plus `error_type`, which (as `error.type` in the conventions) is there
/// only when the request failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct OutcomeLabels {
    pub request: RequestLabels,
    pub error_type: Option<String>,
}

impl OutcomeLabels {
    pub fn of(r: &RequestRecord, request: RequestLabels) -> OutcomeLabels {
        let error_type = match r.error_class {
            Some(c) => Some(c.name().to_string()),
            // The conventions' fallback for a failure without a class: the status code.
            None if r.status >= 400 => Some(r.status.to_string()),
            None => None,
        };
        OutcomeLabels {
            request,
            error_type,
        }
    }
}

impl EncodeLabelSet for OutcomeLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.request.encode(encoder)?;
        if let Some(e) = &self.error_type {
            label(encoder, "error_type", e)?;
        }
        Ok(())
    }
}

/// The request labels plus `gen_ai_token_type` (`input` or `output`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct TokenLabels {
    pub request: RequestLabels,
    pub gen_ai_token_type: &'static str,
}

impl EncodeLabelSet for TokenLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.request.encode(encoder)?;
        label(encoder, "gen_ai_token_type", self.gen_ai_token_type)
    }
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
fn token_usage_hist() -> Histogram {
    Histogram::new(TOKEN_USAGE_BUCKETS)
}

/// Every metric tokenwatch exposes, and the registry that encodes them.
pub struct Metrics {
    registry: std::sync::RwLock<Registry>,
    pub ttft: HistFamily<RequestLabels>,
    pub tpot: HistFamily<RequestLabels>,
    pub duration: HistFamily<OutcomeLabels>,
    pub operation_duration: HistFamily<OutcomeLabels>,
    pub tokens: HistFamily<TokenLabels>,
    pub requests: Family<OutcomeLabels, Counter>,
    /// `export.prometheus.tenant_label`: request series carry `tenant`.
    tenant_label: AtomicBool,
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
        let operation_duration: HistFamily<OutcomeLabels> =
            Family::new_with_constructor(duration_hist);
        registry.register(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from a successful request's arrival at the proxy to its first content-bearing chunk",
            ttft.clone(),
        );
        registry.register(
            "gen_ai_server_time_per_output_token_seconds",
            "Time per output token after the first, per successful streamed request",
            tpot.clone(),
        );
        registry.register(
            "gen_ai_server_request_duration_seconds",
            "Time from the request's arrival to the end of its response (error_type on failures)",
            duration.clone(),
        );
        registry.register(
            "gen_ai_client_operation_duration_seconds",
            "The whole call to the model as the proxy, the upstream's client, measured it (error_type on failures)",
            operation_duration.clone(),
        );
        let tokens: HistFamily<TokenLabels> = Family::new_with_constructor(token_usage_hist);
        registry.register(
            "gen_ai_client_token_usage",
            "Tokens per request, by gen_ai_token_type (input or output)",
            tokens.clone(),
        );
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "tokenwatch_requests",
            "Requests seen by tokenwatch, with the request histograms' labels (error_type on failures)",
            requests.clone(),
        );

        let queue_depth = Gauge::default();
        registry.register(
            "tokenwatch_telemetry_queue_depth",
            "Records waiting in the telemetry queue",
            queue_depth.clone(),
        );
        let queue_capacity = Gauge::default();
        registry.register(
            "tokenwatch_telemetry_queue_capacity",
            "Capacity of the telemetry queue",
            queue_capacity.clone(),
        );
        let dropped = Family::<ReasonLabels, Counter>::default();
        let dropped_records = dropped
            .get_or_create(&ReasonLabels {
                reason: "queue_full".into(),
            })
            .clone();
        let dropped_records_closed = dropped
            .get_or_create(&ReasonLabels {
                reason: "shutting_down".into(),
            })
            .clone();
        registry.register(
            "tokenwatch_telemetry_dropped_records",
            "Records dropped before the pipeline (requests were not affected), by reason: queue_full, shutting_down",
            dropped,
        );
        let pipeline_records = Counter::default();
        registry.register(
            "tokenwatch_pipeline_records",
            "Records processed by the pipeline",
            pipeline_records.clone(),
        );
        let store_write_seconds = Histogram::new(STORE_WRITE_BUCKETS);
        registry.register(
            "tokenwatch_store_write_duration_seconds",
            "Latency of one committed batch write to the store",
            store_write_seconds.clone(),
        );
        let store_records_written = Counter::default();
        registry.register(
            "tokenwatch_store_records_written",
            "Request records committed to the store",
            store_records_written.clone(),
        );
        let store_write_errors = Counter::default();
        registry.register(
            "tokenwatch_store_write_errors",
            "Failed store writes",
            store_write_errors.clone(),
        );
        let store_rollups_written = Counter::default();
        registry.register(
            "tokenwatch_store_rollups_written",
            "Per-minute sketch roll-ups committed to the store",
            store_rollups_written.clone(),
        );
        let aggregator_series = Gauge::default();
        registry.register(
            "tokenwatch_aggregator_series",
            "Series held in memory by the aggregator",
            aggregator_series.clone(),
        );
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
        registry.register(
            "tokenwatch_build_info",
            "tokenwatch version",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);

        Metrics {
            registry: std::sync::RwLock::new(registry),
            ttft,
            tpot,
            duration,
            operation_duration,
            tokens,
            requests,
            tenant_label: AtomicBool::new(false),
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
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
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

    pub const CONTENT_TYPE: &'static str =
        prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

    /// `export.prometheus.tenant_label`: whether request series carry `tenant` from now on.
    pub fn set_tenant_label(&self, on: bool) {
        self.tenant_label.store(on, Ordering::Relaxed);
    }

    /// Read the normalised signals from `board` at every encode (see [`SignalCollector`]).
    pub fn register_signals(&self, board: SharedSignals) {
        self.register_collector(Box::new(SignalCollector::new(board)));
    }

    fn observe(&self, r: &RequestRecord) {
        let req = RequestLabels::of(r, self.tenant_label.load(Ordering::Relaxed));
        // The conventions observe first-token and per-token latency for successful responses only.
        if r.is_success() {
            if let Some(t) = r.first_token_s {
                self.ttft.get_or_create(&req).observe(t);
            }
            if let Some(t) = r.time_per_output_token_s() {
                self.tpot.get_or_create(&req).observe(t);
            }
        }
        for (kind, n) in [("input", r.prompt_tokens), ("output", r.output_tokens)] {
            if let Some(n) = n {
                let t = TokenLabels {
                    request: req.clone(),
                    gen_ai_token_type: kind,
                };
                self.tokens.get_or_create(&t).observe(n as f64);
            }
        }
        let outcome = OutcomeLabels::of(r, req);
        self.duration.get_or_create(&outcome).observe(r.end_s);
        self.operation_duration
            .get_or_create(&outcome)
            .observe(r.end_s);
        self.requests.get_or_create(&outcome).inc();
    }
}

/// Normalised signals exported as gauges, and the help of each.
const EXPORTED_SIGNALS: [(&str, &str, &str); 14] = [
    (
        names::KV_CACHE_USAGE,
        "tokenwatch_kv_cache_usage_ratio",
        "Share of the runtime's KV cache in use (0..1), whatever runtime reported it",
    ),
    (
        names::PREFIX_CACHE_HIT_RATE,
        "tokenwatch_prefix_cache_hit_ratio",
        "Share of prompt tokens served from the runtime's prefix cache (0..1)",
    ),
    (
        names::REQUESTS_RUNNING,
        "tokenwatch_runtime_requests_running",
        "Requests the runtime is running (its batch)",
    ),
    (
        names::REQUESTS_WAITING,
        "tokenwatch_runtime_requests_waiting",
        "Requests waiting in the runtime's queue",
    ),
    (
        names::PREEMPTIONS_PER_SECOND,
        "tokenwatch_runtime_preemptions_per_second",
        "Sequences the runtime preempted per second (KV-cache pressure)",
    ),
    (
        names::GPU_MEMORY_USED_BYTES,
        "tokenwatch_gpu_memory_used_bytes",
        "GPU memory in use",
    ),
    (
        names::GPU_MEMORY_TOTAL_BYTES,
        "tokenwatch_gpu_memory_total_bytes",
        "GPU memory in all",
    ),
    (
        names::GPU_MEMORY_USED_RATIO,
        "tokenwatch_gpu_memory_used_ratio",
        "GPU memory used over total (0..1)",
    ),
    (
        names::GPU_UTILIZATION,
        "tokenwatch_gpu_utilization_ratio",
        "Share of time a kernel ran on the GPU (0..1)",
    ),
    // DCGM profiling fields (dcgm-exporter `DCGM_FI_PROF_*`).
    (
        names::GPU_SM_ACTIVE_RATIO,
        "tokenwatch_gpu_sm_active_ratio",
        "Share of time at least one warp was resident on an SM, mean over the SMs (0..1)",
    ),
    (
        names::GPU_SM_OCCUPANCY_RATIO,
        "tokenwatch_gpu_sm_occupancy_ratio",
        "Resident warps over the SMs' maximum (0..1)",
    ),
    (
        names::GPU_TENSOR_ACTIVE_RATIO,
        "tokenwatch_gpu_tensor_active_ratio",
        "Share of cycles the tensor (HMMA) pipe was active (0..1)",
    ),
    (
        names::GPU_DRAM_ACTIVE_RATIO,
        "tokenwatch_gpu_dram_active_ratio",
        "Share of cycles the device memory interface was active (0..1)",
    ),
    (
        names::GPU_GR_ENGINE_ACTIVE_RATIO,
        "tokenwatch_gpu_gr_engine_active_ratio",
        "Share of time the graphics engine was active (0..1)",
    ),
];

/// Labels of an exported signal: the model, runtime, instance and GPU it belongs to (each
/// left out when empty: device-level signals have no model, model-level ones no GPU).
struct SignalLabels<'a>(&'a SignalPoint);

impl EncodeLabelSet for SignalLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let p = self.0;
        for (key, value) in [
            ("model", &p.model_id),
            ("runtime", &p.runtime),
            ("instance", &p.instance),
            ("gpu", &p.device_id),
        ] {
            if !value.is_empty() {
                label(encoder, key, value)?;
            }
        }
        Ok(())
    }
}

/// The signal board's latest KV-cache, queue and GPU values as `tokenwatch_*` gauges, read
/// when `/metrics` is encoded (no copy to keep in sync; evicted series disappear with the board's).
#[derive(Debug)]
pub struct SignalCollector {
    board: SharedSignals,
}

impl SignalCollector {
    pub fn new(board: SharedSignals) -> SignalCollector {
        SignalCollector { board }
    }

    /// The latest point of every exported signal, grouped by signal in `EXPORTED_SIGNALS` order.
    fn points(&self) -> Vec<(usize, SignalPoint)> {
        let board = self.board.read().unwrap_or_else(|p| p.into_inner());
        // History since the end of time: none; only the latest points of the wanted series are cloned.
        let mut out: Vec<(usize, SignalPoint)> = board
            .series_where(i64::MAX, |p| {
                EXPORTED_SIGNALS.iter().any(|(s, _, _)| *s == p.signal)
            })
            .into_iter()
            .filter_map(|(p, _)| {
                EXPORTED_SIGNALS
                    .iter()
                    .position(|(s, _, _)| *s == p.signal)
                    .map(|i| (i, p))
            })
            .collect();
        drop(board);
        out.sort_by_key(|(i, _)| *i);
        out
    }
}

impl Collector for SignalCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let points = self.points();
        for group in points.chunk_by(|a, b| a.0 == b.0) {
            let (_, name, help) = EXPORTED_SIGNALS[group[0].0];
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (_, p) in group {
                let labels = SignalLabels(p);
                ConstGauge::new(p.value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
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
    use std::collections::BTreeMap;
    use tokenwatch_core::model::{ErrorClass, SeriesLabels};
    use tokenwatch_core::signals::SignalBoard;

    fn record() -> RequestRecord {
        RequestRecord {
            labels: SeriesLabels {
                model_id: "m1".into(),
                runtime: "vllm".into(),
                instance: "10.0.0.1:8000".into(),
                tenant: "acme".into(),
                ..Default::default()
            },
            endpoint: "/v1/chat/completions".into(),
            status: 200,
            first_token_s: Some(0.2),
            end_s: 1.0,
            output_tokens: Some(10),
            prompt_tokens: Some(300),
            chunk_offsets_us: vec![200_000, 1_000_000],
            ..Default::default()
        }
    }

    /// The samples of `name` (exact sample name) as (labels, value).
    fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let families = tokenwatch_core::exposition::parse(
            text,
            tokenwatch_core::exposition::Format::PrometheusText,
        )
        .expect("the exposition parses");
        families
            .iter()
            .flat_map(|f| f.samples.iter())
            .filter(|s| s.name == name)
            .map(|s| {
                (
                    s.labels
                        .iter()
                        .map(|l| (l.name.to_string(), l.value.to_string()))
                        .collect(),
                    s.value,
                )
            })
            .collect()
    }

    fn encode(records: &[RequestRecord], tenant: bool) -> String {
        let m = std::sync::Arc::new(Metrics::new());
        m.set_tenant_label(tenant);
        MetricsSink(m.clone()).consume(records).unwrap();
        m.encode()
    }

    #[test]
    fn request_series_carry_the_genai_attributes_and_no_tenant_by_default() {
        let mut resp = record();
        resp.span.response_model = "m1-2025-01-01".into();
        let text = encode(&[resp], false);
        assert!(
            text.contains("# TYPE gen_ai_server_time_to_first_token_seconds histogram"),
            "{text}"
        );
        let ttft = samples(&text, "gen_ai_server_time_to_first_token_seconds_count");
        assert_eq!(ttft.len(), 1, "{text}");
        let (labels, n) = &ttft[0];
        assert_eq!(*n, 1.0);
        let want: BTreeMap<String, String> = [
            ("gen_ai_operation_name", "chat"),
            ("gen_ai_provider_name", "vllm"),
            ("gen_ai_request_model", "m1"),
            ("gen_ai_response_model", "m1-2025-01-01"),
            ("instance", "10.0.0.1:8000"),
            ("ab_group", ""),
            ("model_version", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels, &want);
        assert!(!text.contains("tenant="), "{text}");
        // A successful request has no error_type at all.
        let ok = samples(&text, "gen_ai_server_request_duration_seconds_count");
        assert_eq!(ok.len(), 1);
        assert!(!ok[0].0.contains_key("error_type"), "{text}");
        assert_eq!(
            samples(&text, "gen_ai_client_operation_duration_seconds_count").len(),
            1
        );
        assert_eq!(samples(&text, "tokenwatch_requests_total")[0].0, want);
        assert!(!text.contains("gen_ai_server_token_usage"), "{text}");
        assert!(
            text.contains("tokenwatch_telemetry_dropped_records_total{reason=\"queue_full\"} 0"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn tenant_label_when_opted_in() {
        let text = encode(&[record()], true);
        for name in [
            "gen_ai_server_time_to_first_token_seconds_count",
            "gen_ai_server_request_duration_seconds_count",
            "gen_ai_client_token_usage_count",
            "tokenwatch_requests_total",
        ] {
            let s = samples(&text, name);
            assert!(!s.is_empty(), "{name}: {text}");
            assert!(
                s.iter()
                    .all(|(l, _)| l.get("tenant").map(String::as_str) == Some("acme")),
                "{name}: {text}"
            );
        }
    }

    #[test]
    fn failed_requests_get_error_type_and_no_first_token_observation() {
        // The stream failed after its first token: duration and tokens count, TTFT/TPOT do not.
        let mut failed = record();
        failed.error_class = Some(ErrorClass::UpstreamReset);
        failed.status = 200;
        let mut refused = record();
        refused.error_class = None;
        refused.status = 503;
        refused.first_token_s = None;
        let text = encode(&[failed, refused], false);
        assert!(
            samples(&text, "gen_ai_server_time_to_first_token_seconds_count").is_empty(),
            "{text}"
        );
        assert!(
            samples(&text, "gen_ai_server_time_per_output_token_seconds_count").is_empty(),
            "{text}"
        );
        let mut errors: Vec<String> =
            samples(&text, "gen_ai_server_request_duration_seconds_count")
                .into_iter()
                .map(|(l, _)| l.get("error_type").cloned().unwrap_or_default())
                .collect();
        errors.sort();
        assert_eq!(errors, ["503", "upstream_reset"]);
        let mut ok = record();
        ok.first_token_s = Some(0.3);
        let text = encode(&[ok], false);
        assert_eq!(
            samples(&text, "gen_ai_server_time_to_first_token_seconds_count")[0].1,
            1.0
        );
    }

    #[test]
    fn token_usage_is_a_histogram_with_the_conventions_buckets() {
        let text = encode(&[record()], false);
        assert!(
            text.contains("# TYPE gen_ai_client_token_usage histogram"),
            "{text}"
        );
        let buckets = samples(&text, "gen_ai_client_token_usage_bucket");
        let input: Vec<(String, f64)> = buckets
            .iter()
            .filter(|(l, _)| l["gen_ai_token_type"] == "input")
            .map(|(l, v)| (l["le"].clone(), *v))
            .collect();
        let bounds: Vec<f64> = input
            .iter()
            .filter_map(|(le, _)| le.parse().ok())
            .filter(|b: &f64| b.is_finite())
            .collect();
        assert_eq!(bounds, TOKEN_USAGE_BUCKETS.to_vec());
        assert_eq!(input.last().map(|(le, _)| le.as_str()), Some("+Inf"));
        // 300 input tokens: not in le=256, in le=1024.
        let at = |le: &str| {
            input
                .iter()
                .find(|(b, _)| b.parse::<f64>().ok() == le.parse::<f64>().ok())
                .unwrap()
                .1
        };
        assert_eq!((at("256"), at("1024")), (0.0, 1.0));
        let sums = samples(&text, "gen_ai_client_token_usage_sum");
        let sum_of = |t: &str| {
            sums.iter()
                .find(|(l, _)| l["gen_ai_token_type"] == t)
                .unwrap()
                .1
        };
        assert_eq!((sum_of("input"), sum_of("output")), (300.0, 10.0));
    }

    #[test]
    fn tenant_label_is_off_unless_configured() {
        let off = crate::config::Config::from_yaml("listen: 127.0.0.1:9999\n", "t.yaml").unwrap();
        assert!(!off.export.prometheus.tenant_label);
        let on = crate::config::Config::from_yaml(
            "export:\n  prometheus:\n    tenant_label: true\n",
            "t.yaml",
        )
        .unwrap();
        assert!(on.export.prometheus.tenant_label);
        assert!(
            crate::config::Config::from_yaml(
                "export:\n  prometheus:\n    tenants: true\n",
                "t.yaml"
            )
            .is_err()
        );
    }

    #[test]
    fn operation_and_provider_follow_the_conventions() {
        assert_eq!(operation_name("/v1/chat/completions"), "chat");
        assert_eq!(operation_name("/v1/completions"), "text_completion");
        assert_eq!(operation_name("/v1/embeddings"), "embeddings");
        assert_eq!(operation_name("/v1/messages"), "chat");
        assert_eq!(operation_name("/generate_stream"), "text_completion");
        assert_eq!(operation_name("embeddings"), "embeddings");
        assert_eq!(operation_name(""), "chat");
        assert_eq!(provider_name("vllm", "/v1/chat/completions"), "vllm");
        assert_eq!(provider_name("", "/v1/messages"), "anthropic");
        assert_eq!(provider_name("", "/v1/chat/completions"), "openai");
        assert_eq!(provider_name("bedrock", ""), "aws.bedrock");
        assert_eq!(provider_name("az.ai.openai", ""), "azure.ai.openai");
        assert_eq!(provider_name("xai", ""), "x_ai");
    }

    fn point(model: &str, signal: &str, value: f64, device: &str) -> SignalPoint {
        SignalPoint {
            model_id: model.into(),
            signal: signal.into(),
            value,
            source: "test".into(),
            runtime: if model.is_empty() {
                String::new()
            } else {
                "vllm".into()
            },
            instance: "10.0.0.1:8000".into(),
            device_id: device.into(),
            timestamp_unix_ms: 1,
            notes: BTreeMap::new(),
        }
    }

    #[test]
    fn signals_are_read_from_the_board_at_each_scrape() {
        let board: SharedSignals =
            std::sync::Arc::new(std::sync::RwLock::new(SignalBoard::new(4, 100)));
        let m = Metrics::new();
        m.register_signals(board.clone());
        assert!(
            !m.encode().contains("tokenwatch_kv_cache_usage_ratio"),
            "no family without points"
        );
        {
            let mut b = board.write().unwrap();
            b.update(point("m1", names::KV_CACHE_USAGE, 0.5, ""));
            b.update(point("m1", names::REQUESTS_WAITING, 3.0, ""));
            b.update(point("m1", names::REQUESTS_RUNNING, 8.0, ""));
            b.update(point("", names::GPU_MEMORY_USED_BYTES, 4e9, "GPU-0"));
            b.update(point("", names::GPU_MEMORY_TOTAL_BYTES, 8e9, "GPU-0"));
            b.update(point("m1", "ttft_p99_seconds", 0.4, ""));
        }
        let text = m.encode();
        let kv = samples(&text, "tokenwatch_kv_cache_usage_ratio");
        assert_eq!(kv.len(), 1, "{text}");
        assert_eq!(kv[0].1, 0.5);
        assert_eq!(kv[0].0["model"], "m1");
        assert_eq!(kv[0].0["instance"], "10.0.0.1:8000");
        assert!(!kv[0].0.contains_key("gpu"));
        assert_eq!(
            samples(&text, "tokenwatch_runtime_requests_waiting")[0].1,
            3.0
        );
        assert_eq!(
            samples(&text, "tokenwatch_runtime_requests_running")[0].1,
            8.0
        );
        let used = samples(&text, "tokenwatch_gpu_memory_used_bytes");
        assert_eq!((used[0].0["gpu"].as_str(), used[0].1), ("GPU-0", 4e9));
        assert!(!used[0].0.contains_key("model"));
        assert_eq!(
            samples(&text, "tokenwatch_gpu_memory_total_bytes")[0].1,
            8e9
        );
        assert!(
            !text.contains("ttft_p99"),
            "latency signals are served by the histograms"
        );
        // A later value shows at the next scrape; an evicted series is gone.
        board
            .write()
            .unwrap()
            .update(point("m1", names::KV_CACHE_USAGE, 0.75, ""));
        assert_eq!(
            samples(&m.encode(), "tokenwatch_kv_cache_usage_ratio")[0].1,
            0.75
        );
        board.write().unwrap().evict_older_than(10_000, 1);
        assert!(!m.encode().contains("tokenwatch_kv_cache_usage_ratio"));
    }
}
