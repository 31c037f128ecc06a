// tokenwatch's telemetry registry, below every stage: each stage registers its own health
// metrics here (`Metrics::register`, `register_collector`) and the pipeline's, store's and
// listeners' counters live on it; the request series named and labelled after the OpenTelemetry
// GenAI conventions (`observe`) too. `/metrics` encodes it (`export::prometheus` adds the signal
// board's gauges and feeds it records). The request series' labels come from request bodies and
// spans, so they are bounded here (`SeriesBudget`): values cut at `export.prometheus.
// max_label_bytes`, and each family holds at most `max_series_per_family` label sets, the rest
// folded into one `__other__` series and counted in `tokenwatch_metrics_series_overflow_total`;
// a label set not observed for `export.prometheus.idle_series_after` leaves every family
// (`IdleSeries`), giving its place back — a retired model or replica does not hold the budget.

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::family::MetricConstructor;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use tokenwatch_core::model::ErrorClass;
use tokenwatch_core::model::RequestRecord;

/// Buckets recommended by the GenAI conventions for `gen_ai.server.time_to_first_token`.
const TTFT_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// Buckets recommended for `gen_ai.server.time_per_output_token`.
const TPOT_BUCKETS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
/// Buckets recommended for `gen_ai.server.request.duration` and `gen_ai.client.operation.duration`,
/// and for the client's `time_to_first_chunk` and `time_per_output_chunk`.
pub const DURATION_BUCKETS: [f64; 14] = [
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

impl RequestLabels {
    /// Every value that can come from input cut to `max_bytes` (see [`cap_label`]).
    fn capped(mut self, max_bytes: usize) -> RequestLabels {
        for v in [
            &mut self.gen_ai_provider_name,
            &mut self.gen_ai_request_model,
            &mut self.gen_ai_response_model,
            &mut self.instance,
            &mut self.ab_group,
            &mut self.model_version,
        ] {
            cap_label(v, max_bytes);
        }
        if let Some(t) = &mut self.tenant {
            cap_label(t, max_bytes);
        }
        self
    }

    /// The `other` series: every value that can come from input replaced by [`OTHER`]; the
    /// operation (one of a fixed few) is kept.
    fn folded(self) -> RequestLabels {
        RequestLabels {
            gen_ai_operation_name: self.gen_ai_operation_name,
            gen_ai_provider_name: OTHER.into(),
            gen_ai_request_model: OTHER.into(),
            gen_ai_response_model: OTHER.into(),
            instance: OTHER.into(),
            ab_group: OTHER.into(),
            model_version: OTHER.into(),
            tenant: self.tenant.map(|_| OTHER.into()),
        }
    }
}

/// The label value that stands for every label set over a family's budget, and for models no
/// upstream routes.
pub const OTHER: &str = "__other__";

/// What a cut label value ends with.
pub const CUT_MARKER: &str = "...";

/// Cut `value` to at most `max_bytes` bytes: over the limit, it keeps the longest prefix that ends
/// on a character boundary and leaves room for [`CUT_MARKER`], then the marker.
pub fn cap_label(value: &mut String, max_bytes: usize) {
    if value.len() <= max_bytes {
        return;
    }
    let mut end = max_bytes.saturating_sub(CUT_MARKER.len());
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value.truncate(end);
    value.push_str(CUT_MARKER);
}

pub(crate) fn label(
    encoder: &mut LabelSetEncoder,
    key: &str,
    value: &str,
) -> Result<(), std::fmt::Error> {
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

impl OutcomeLabels {
    fn folded(self) -> OutcomeLabels {
        OutcomeLabels {
            request: self.request.folded(),
            error_type: self.error_type,
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

impl TokenLabels {
    fn folded(self) -> TokenLabels {
        TokenLabels {
            request: self.request.folded(),
            gen_ai_token_type: self.gen_ai_token_type,
        }
    }
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
    /// `gen_ai.client.operation.time_to_first_chunk` and `time_per_output_chunk`: the streams
    /// as the proxy, the upstream's client, received them (one gap per chunk after the first).
    pub first_chunk: HistFamily<RequestLabels>,
    pub per_chunk: HistFamily<RequestLabels>,
    pub tokens: HistFamily<TokenLabels>,
    pub requests: Family<OutcomeLabels, Counter>,
    /// `tokenwatch_spend_usd_total`: what the priced requests cost (`pricing`), by the request
    /// labels (`tenant` with `export.prometheus.tenant_label`).
    pub spend: Family<RequestLabels, Counter<f64, AtomicU64>>,
    /// `export.prometheus.tenant_label`: request series carry `tenant`.
    tenant_label: AtomicBool,
    pub queue_depth: Gauge,
    pub queue_capacity: Gauge,
    /// `tokenwatch_telemetry_dropped_records_total{reason="queue_full"}`: fetched once, so the
    /// proxy's drop is one atomic add.
    pub dropped_records: Counter,
    /// The same, `reason="shutting_down"`: the pipeline had stopped accepting records.
    pub dropped_records_closed: Counter,
    /// The same, `reason="analysis_panic"`: in the pipeline thread's hands when it panicked.
    pub dropped_records_panic: Counter,
    /// `tokenwatch_analysis_panics_total{component}`: panics caught in an analysis stage (the
    /// stage went on; see `pipeline::supervise`).
    pub analysis_panics: Family<ComponentLabels, Counter>,
    pub pipeline_records: Counter,
    pub store_write_seconds: Histogram,
    pub store_records_written: Counter,
    pub store_write_errors: Counter,
    pub store_rollups_written: Counter,
    pub aggregator_series: Gauge,
    pub aggregator_refused_series: Gauge,
    /// Requests refused by a listener's limits (`crate::listen::limits`).
    pub rejected_requests: Family<RejectedLabels, Counter>,
    /// `export.prometheus.max_label_bytes`.
    max_label_bytes: AtomicUsize,
    /// `export.prometheus.max_series_per_family`.
    max_series_per_family: AtomicUsize,
    budgets: RequestBudgets,
    /// `export.prometheus.idle_series_after`: label sets leave the request families when idle.
    idle: IdleSeries,
}

/// Default `export.prometheus.max_label_bytes`.
pub const DEFAULT_MAX_LABEL_BYTES: usize = 128;
/// Default `export.prometheus.max_series_per_family`.
pub const DEFAULT_MAX_SERIES_PER_FAMILY: usize = 500;
/// The shortest label limit honoured: room for a few characters and the marker.
const MIN_LABEL_BYTES: usize = 16;

/// One request family's series budget: how many label sets it admitted, its overflow counter and
/// whether the overflow was logged.
struct SeriesBudget {
    family: &'static str,
    admitted: Mutex<usize>,
    overflow: Counter,
    warned: AtomicBool,
}

impl SeriesBudget {
    fn new(family: &'static str, overflow: &Family<FamilyLabels, Counter>) -> SeriesBudget {
        SeriesBudget {
            family,
            admitted: Mutex::new(0),
            overflow: overflow
                .get_or_create(&FamilyLabels {
                    family: family.into(),
                })
                .clone(),
            warned: AtomicBool::new(false),
        }
    }

    /// Feeds `f` the series of `labels` in `fam` when it exists or the budget (`max` label sets)
    /// has room for it (true), else the series of `fold(labels)` (created whatever the budget),
    /// counting the overflow and logging it the first time (false).
    fn with<L, M, C>(
        &self,
        fam: &Family<L, M, C>,
        max: usize,
        labels: L,
        fold: impl FnOnce(L) -> L,
        f: impl FnOnce(&M),
    ) -> bool
    where
        L: Clone + Hash + Eq,
        C: MetricConstructor<M>,
    {
        if let Some(m) = fam.get(&labels) {
            f(&m);
            return true;
        }
        let mut admitted = self.admitted.lock().unwrap_or_else(|p| p.into_inner());
        // Another observer may have created it while this one waited.
        if let Some(m) = fam.get(&labels) {
            f(&m);
            return true;
        }
        if *admitted < max {
            *admitted += 1;
            f(&fam.get_or_create(&labels));
            return true;
        }
        drop(admitted);
        self.overflow.inc();
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                family = self.family,
                max_series = max,
                "a request metric family reached export.prometheus.max_series_per_family; \
                 further label sets are folded into the __other__ series \
                 (tokenwatch_metrics_series_overflow_total counts them)"
            );
        }
        f(&fam.get_or_create(&fold(labels)));
        false
    }

    /// Removes `labels`' series from `fam` and gives its place in the budget back.
    fn remove<L, M, C>(&self, fam: &Family<L, M, C>, labels: &L)
    where
        L: Clone + Hash + Eq,
        C: MetricConstructor<M>,
    {
        let mut admitted = self.admitted.lock().unwrap_or_else(|p| p.into_inner());
        if fam.remove(labels) {
            *admitted = admitted.saturating_sub(1);
        }
    }
}

/// Default `export.prometheus.idle_series_after`: an hour.
pub const DEFAULT_IDLE_SERIES_AFTER_MS: i64 = 3_600_000;

/// When each request label set holding series of its own was last observed, and the error
/// types it was counted with (its outcome series), so that the label sets idle longer than
/// `export.prometheus.idle_series_after` are removed from every request family. Only label
/// sets some family admitted are remembered: at most the families' budgets.
struct IdleSeries {
    seen: Mutex<HashMap<RequestLabels, Seen>>,
    idle_after_ms: AtomicI64,
    last_sweep_ms: AtomicI64,
}

#[derive(Default)]
struct Seen {
    at_ms: i64,
    error_types: BTreeSet<Option<String>>,
}

impl IdleSeries {
    fn new() -> IdleSeries {
        IdleSeries {
            seen: Mutex::new(HashMap::new()),
            idle_after_ms: AtomicI64::new(DEFAULT_IDLE_SERIES_AFTER_MS),
            last_sweep_ms: AtomicI64::new(0),
        }
    }

    fn touch(&self, labels: &RequestLabels, error_type: &Option<String>, now_ms: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let s = match seen.get_mut(labels) {
            Some(s) => s,
            None => seen.entry(labels.clone()).or_default(),
        };
        s.at_ms = s.at_ms.max(now_ms);
        if !s.error_types.contains(error_type) {
            s.error_types.insert(error_type.clone());
        }
    }

    /// Whether a sweep is due: a tenth of the idle period since the last (at most a minute).
    fn due(&self, now_ms: i64) -> bool {
        let every = (self.idle_after_ms.load(Ordering::Relaxed) / 10).clamp(1, 60_000);
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        now_ms - last >= every
            && self
                .last_sweep_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Takes out the label sets not observed since `now_ms - idle_after`.
    fn take_idle(&self, now_ms: i64) -> Vec<(RequestLabels, Seen)> {
        let cutoff = now_ms - self.idle_after_ms.load(Ordering::Relaxed);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let idle: Vec<RequestLabels> = seen
            .iter()
            .filter(|(_, s)| s.at_ms < cutoff)
            .map(|(l, _)| l.clone())
            .collect();
        idle.into_iter()
            .filter_map(|l| seen.remove(&l).map(|s| (l, s)))
            .collect()
    }
}

/// The budgets of the request families, one each.
struct RequestBudgets {
    ttft: SeriesBudget,
    tpot: SeriesBudget,
    duration: SeriesBudget,
    operation_duration: SeriesBudget,
    first_chunk: SeriesBudget,
    per_chunk: SeriesBudget,
    tokens: SeriesBudget,
    requests: SeriesBudget,
    spend: SeriesBudget,
}

/// Labels of `tokenwatch_metrics_series_overflow`: the family's metric name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    pub family: String,
}

/// Labels of `tokenwatch_rejected_requests`: the listener (`api`, `proxy`, `otlp`) and why
/// (`headers_too_large`, `body_too_large`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectedLabels {
    pub listener: String,
    pub reason: String,
}

/// Labels of `tokenwatch_analysis_panics`: the analysis stage (`pipeline`, `alerting`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ComponentLabels {
    pub component: String,
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
        let first_chunk: HistFamily<RequestLabels> = Family::new_with_constructor(duration_hist);
        registry.register(
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            "Time from a streamed request's arrival to the first content-bearing chunk the proxy received",
            first_chunk.clone(),
        );
        let per_chunk: HistFamily<RequestLabels> = Family::new_with_constructor(duration_hist);
        registry.register(
            "gen_ai_client_operation_time_per_output_chunk_seconds",
            "Time between a streamed response's consecutive content-bearing chunks, one observation per chunk after the first",
            per_chunk.clone(),
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
        let spend = Family::<RequestLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "tokenwatch_spend_usd",
            "What requests cost in US dollars at the configured price table (pricing), with the request histograms' labels; requests of models it does not price are left out (tokenwatch_unpriced_requests_total counts them)",
            spend.clone(),
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
        let dropped_records_panic = dropped
            .get_or_create(&ReasonLabels {
                reason: "analysis_panic".into(),
            })
            .clone();
        registry.register(
            "tokenwatch_telemetry_dropped_records",
            "Records dropped on their way through the pipeline (requests were not affected), by reason: queue_full, shutting_down, analysis_panic (in the pipeline thread's hands when it panicked)",
            dropped,
        );
        let analysis_panics = Family::<ComponentLabels, Counter>::default();
        registry.register(
            "tokenwatch_analysis_panics",
            "Panics caught in an analysis stage (pipeline, alerting); the stage went on with its next batch and requests were not affected",
            analysis_panics.clone(),
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
            "Requests and connections refused under limits (headers or a body over their limits, \
             a request head not sent within limits.header_read_timeout, a listener holding \
             limits.max_connections; a foreign Host on a loopback listener, a write from another \
             origin or, on the API port, not in JSON), by listener and reason",
            rejected_requests.clone(),
        );
        let overflow = Family::<FamilyLabels, Counter>::default();
        registry.register(
            "tokenwatch_metrics_series_overflow",
            "Observations folded into a request family's __other__ series because the family held \
             export.prometheus.max_series_per_family label sets, by family",
            overflow.clone(),
        );
        let budgets = RequestBudgets {
            ttft: SeriesBudget::new("gen_ai_server_time_to_first_token_seconds", &overflow),
            tpot: SeriesBudget::new("gen_ai_server_time_per_output_token_seconds", &overflow),
            duration: SeriesBudget::new("gen_ai_server_request_duration_seconds", &overflow),
            operation_duration: SeriesBudget::new(
                "gen_ai_client_operation_duration_seconds",
                &overflow,
            ),
            first_chunk: SeriesBudget::new(
                "gen_ai_client_operation_time_to_first_chunk_seconds",
                &overflow,
            ),
            per_chunk: SeriesBudget::new(
                "gen_ai_client_operation_time_per_output_chunk_seconds",
                &overflow,
            ),
            tokens: SeriesBudget::new("gen_ai_client_token_usage", &overflow),
            requests: SeriesBudget::new("tokenwatch_requests", &overflow),
            spend: SeriesBudget::new("tokenwatch_spend_usd", &overflow),
        };
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
            first_chunk,
            per_chunk,
            tokens,
            requests,
            spend,
            tenant_label: AtomicBool::new(false),
            queue_depth,
            queue_capacity,
            dropped_records,
            dropped_records_closed,
            dropped_records_panic,
            analysis_panics,
            pipeline_records,
            store_write_seconds,
            store_records_written,
            store_write_errors,
            store_rollups_written,
            aggregator_series,
            aggregator_refused_series,
            rejected_requests,
            max_label_bytes: AtomicUsize::new(DEFAULT_MAX_LABEL_BYTES),
            max_series_per_family: AtomicUsize::new(DEFAULT_MAX_SERIES_PER_FAMILY),
            budgets,
            idle: IdleSeries::new(),
        }
    }

    /// `export.prometheus.idle_series_after`: a request label set not observed for this long
    /// leaves every request family (at least a second).
    pub fn set_idle_series_after(&self, after: std::time::Duration) {
        let ms = i64::try_from(after.as_millis())
            .unwrap_or(i64::MAX)
            .max(1000);
        self.idle.idle_after_ms.store(ms, Ordering::Relaxed);
    }

    /// Removes from every request family the label sets idle since `now_ms - idle_series_after`
    /// (their places in the budgets given back).
    fn sweep_idle(&self, now_ms: i64) {
        let b = &self.budgets;
        for (req, seen) in self.idle.take_idle(now_ms) {
            b.ttft.remove(&self.ttft, &req);
            b.tpot.remove(&self.tpot, &req);
            b.first_chunk.remove(&self.first_chunk, &req);
            b.per_chunk.remove(&self.per_chunk, &req);
            b.spend.remove(&self.spend, &req);
            for kind in ["input", "output"] {
                let t = TokenLabels {
                    request: req.clone(),
                    gen_ai_token_type: kind,
                };
                b.tokens.remove(&self.tokens, &t);
            }
            for error_type in seen.error_types {
                let o = OutcomeLabels {
                    request: req.clone(),
                    error_type,
                };
                b.duration.remove(&self.duration, &o);
                b.operation_duration.remove(&self.operation_duration, &o);
                b.requests.remove(&self.requests, &o);
            }
        }
    }

    /// `export.prometheus.max_label_bytes` and `max_series_per_family`: the bounds on the request
    /// series from now on (a label limit under 16 bytes counts as 16, a budget of 0 as 1).
    pub fn set_series_limits(&self, max_label_bytes: usize, max_series_per_family: usize) {
        self.max_label_bytes
            .store(max_label_bytes.max(MIN_LABEL_BYTES), Ordering::Relaxed);
        self.max_series_per_family
            .store(max_series_per_family.max(1), Ordering::Relaxed);
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

    /// Prometheus text exposition format 0.0.4 (idle request series swept out first).
    pub fn encode(&self) -> String {
        self.sweep_idle(tokenwatch_core::clock::now_unix_ms());
        let mut out = String::with_capacity(16 * 1024);
        let registry = self.registry.read().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
            tracing::error!(error = %e, "encoding /metrics failed");
        }
        out
    }

    pub const CONTENT_TYPE: &'static str =
        prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

    /// `export.prometheus.max_label_bytes` as set (for other families labelled from input).
    pub fn max_label_bytes(&self) -> usize {
        self.max_label_bytes.load(Ordering::Relaxed)
    }

    /// `export.prometheus.tenant_label`: whether request series carry `tenant` from now on.
    pub fn set_tenant_label(&self, on: bool) {
        self.tenant_label.store(on, Ordering::Relaxed);
    }

    /// Counts one finished request into the GenAI request series (the Prometheus exporter's
    /// record sink calls it for every record the pipeline carries), within the label limit and
    /// each family's series budget. A request for a model no upstream routes (`no_route`) is
    /// counted under the model [`OTHER`].
    pub fn observe(&self, r: &RequestRecord) {
        self.observe_at(r, tokenwatch_core::clock::now_unix_ms());
    }

    /// [`Metrics::observe`] at `now_ms` (the clock idle series are measured on).
    pub(crate) fn observe_at(&self, r: &RequestRecord, now_ms: i64) {
        // Idle label sets leave first, so that their places are free for this one.
        if self.idle.due(now_ms) {
            self.sweep_idle(now_ms);
        }
        let max_bytes = self.max_label_bytes.load(Ordering::Relaxed);
        let max = self.max_series_per_family.load(Ordering::Relaxed);
        let mut req =
            RequestLabels::of(r, self.tenant_label.load(Ordering::Relaxed)).capped(max_bytes);
        if r.error_class == Some(ErrorClass::NoRoute) {
            req.gen_ai_request_model = OTHER.into();
            req.gen_ai_response_model = OTHER.into();
        }
        let b = &self.budgets;
        // Whether any family holds this label set's own series (not folded into `__other__`).
        let mut kept = false;
        // The conventions observe first-token and per-token latency for successful responses only.
        if r.is_success() {
            if let Some(t) = r.first_token_s {
                kept |= b
                    .ttft
                    .with(&self.ttft, max, req.clone(), RequestLabels::folded, |h| {
                        h.observe(t)
                    });
            }
            if let Some(t) = r.time_per_output_token_s() {
                kept |= b
                    .tpot
                    .with(&self.tpot, max, req.clone(), RequestLabels::folded, |h| {
                        h.observe(t)
                    });
            }
        }
        // The client's chunk metrics: streamed calls only, whatever their outcome (a stream cut
        // after its first chunk still had one).
        if r.stream
            && let Some(t) = r.first_token_s
        {
            kept |= b.first_chunk.with(
                &self.first_chunk,
                max,
                req.clone(),
                RequestLabels::folded,
                |h| h.observe(t),
            );
            if r.chunk_offsets_us.len() > 1 {
                kept |= b.per_chunk.with(
                    &self.per_chunk,
                    max,
                    req.clone(),
                    RequestLabels::folded,
                    |h| r.gaps_s().for_each(|g| h.observe(g)),
                );
            }
        }
        for (kind, n) in [("input", r.prompt_tokens), ("output", r.output_tokens)] {
            if let Some(n) = n {
                let t = TokenLabels {
                    request: req.clone(),
                    gen_ai_token_type: kind,
                };
                kept |= b
                    .tokens
                    .with(&self.tokens, max, t, TokenLabels::folded, |h| {
                        h.observe(n as f64)
                    });
            }
        }
        if let Some(cost) = r.cost_usd {
            kept |= b
                .spend
                .with(&self.spend, max, req.clone(), RequestLabels::folded, |c| {
                    c.inc_by(cost);
                });
        }
        let req_seen = req.clone();
        let mut outcome = OutcomeLabels::of(r, req);
        if let Some(e) = &mut outcome.error_type {
            cap_label(e, max_bytes);
        }
        kept |= b.duration.with(
            &self.duration,
            max,
            outcome.clone(),
            OutcomeLabels::folded,
            |h| h.observe(r.end_s),
        );
        kept |= b.operation_duration.with(
            &self.operation_duration,
            max,
            outcome.clone(),
            OutcomeLabels::folded,
            |h| h.observe(r.end_s),
        );
        let error_type = outcome.error_type.clone();
        kept |= b
            .requests
            .with(&self.requests, max, outcome, OutcomeLabels::folded, |c| {
                c.inc();
            });
        if kept {
            self.idle.touch(&req_seen, &error_type, now_ms);
        }
    }
}
