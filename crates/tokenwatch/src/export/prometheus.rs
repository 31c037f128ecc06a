// `/metrics`: the telemetry registry (`kernel::telemetry::Metrics`: tokenwatch's own health and
// the GenAI request series) fed with every record the pipeline carries (`MetricsSink`), plus the
// normalised signals and the runtimes' own latency histograms and request / token counters (as
// scraped, under one name whatever the runtime) read from the board at scrape time, via
// prometheus-client.

use crate::pipeline::RecordSink;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::NoLabelSet;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tokenwatch_core::histogram::CumulativeHistogram;
use tokenwatch_core::model::RequestRecord;
use tokenwatch_core::runtime_latency::RuntimeTotals;
use tokenwatch_core::signals::{SharedSignals, SignalPoint, names};

pub use crate::kernel::telemetry::Metrics;
use crate::kernel::telemetry::label;

/// `export.prometheus` in the configuration.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrometheusExportConfig {
    /// Add `tenant` to the request series. Off by default: tenants can be many, and per-tenant
    /// latency is served by the API (`by=tenant`) from sketches instead.
    pub tenant_label: bool,
    /// Longest request-series label value in bytes (model, instance, tenant… come from requests
    /// and spans): a longer one is cut on a character boundary and ends with `...`, within the
    /// limit. Values under 16 count as 16.
    pub max_label_bytes: usize,
    /// Label sets each request family (`gen_ai_*`, `tokenwatch_requests`) holds; further ones are
    /// counted in one series whose input-derived labels read `__other__`, and in
    /// `tokenwatch_metrics_series_overflow_total{family}`.
    pub max_series_per_family: usize,
    /// A request label set (a model, replica, version…) not observed for this long leaves every
    /// request family, and its place in the budget is free for a new one: a retired model or a
    /// replaced pod stops showing and stops holding the budget. Its counters start from zero if
    /// it comes back (Prometheus reads that as a reset). At least 1 s.
    pub idle_series_after: crate::kernel::duration::HumanDuration,
}

impl Default for PrometheusExportConfig {
    fn default() -> Self {
        PrometheusExportConfig {
            tenant_label: false,
            max_label_bytes: crate::kernel::telemetry::DEFAULT_MAX_LABEL_BYTES,
            max_series_per_family: crate::kernel::telemetry::DEFAULT_MAX_SERIES_PER_FAMILY,
            idle_series_after: crate::kernel::duration::HumanDuration(
                std::time::Duration::from_millis(
                    crate::kernel::telemetry::DEFAULT_IDLE_SERIES_AFTER_MS as u64,
                ),
            ),
        }
    }
}

/// Read the normalised signals from `board` at every encode of `metrics` (see [`SignalCollector`]).
pub fn register_signals(metrics: &Metrics, board: SharedSignals) {
    metrics.register_collector(Box::new(SignalCollector::new(board)));
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

/// The runtimes' latency histograms (scrape signal → exported name, help), whichever runtime
/// reported them (vLLM, SGLang, TGI, Triton…): the observations tokenwatch's scrapes counted since
/// it first scraped the instance, in the runtime's own buckets.
const RUNTIME_HISTOGRAMS: [(&str, &str, &str); 8] = [
    (
        "ttft",
        "tokenwatch_runtime_time_to_first_token_seconds",
        "Time to first token as the serving runtime measured it (its own histogram, scraped)",
    ),
    (
        "itl",
        "tokenwatch_runtime_inter_token_latency_seconds",
        "Inter-token latency as the serving runtime measured it (its own histogram, scraped)",
    ),
    (
        "tpot",
        "tokenwatch_runtime_time_per_output_token_seconds",
        "Time per output token as the serving runtime measured it (its own histogram, scraped)",
    ),
    (
        "e2e",
        "tokenwatch_runtime_request_duration_seconds",
        "End-to-end request latency as the serving runtime measured it (its own histogram, scraped)",
    ),
    (
        "queue",
        "tokenwatch_runtime_queue_time_seconds",
        "Time requests waited in the runtime's queue (its own histogram, scraped)",
    ),
    (
        "prefill",
        "tokenwatch_runtime_prefill_time_seconds",
        "Prefill time in the runtime (its own histogram, scraped)",
    ),
    (
        "decode",
        "tokenwatch_runtime_decode_time_seconds",
        "Decode time in the runtime (its own histogram, scraped)",
    ),
    (
        "inference",
        "tokenwatch_runtime_inference_time_seconds",
        "Inference time in the runtime (its own histogram, scraped)",
    ),
];

/// The runtimes' request and token counters (exported name without `_total`, help, value).
type TotalOf = fn(&RuntimeTotals) -> Option<f64>;
const RUNTIME_COUNTERS: [(&str, &str, TotalOf); 4] = [
    (
        "tokenwatch_runtime_requests_finished",
        "Requests the runtime finished, failed ones included (its own counters, scraped)",
        |t| t.finished,
    ),
    (
        "tokenwatch_runtime_requests_failed",
        "Requests the runtime failed (vLLM finished_reason=\"error\", TGI request failures…)",
        |t| t.failed,
    ),
    (
        "tokenwatch_runtime_prompt_tokens",
        "Prompt tokens the runtime processed (its own counters, scraped)",
        |t| t.prompt_tokens,
    ),
    (
        "tokenwatch_runtime_output_tokens",
        "Output tokens the runtime generated (its own counters, scraped)",
        |t| t.output_tokens,
    ),
];

/// Encodes the labels of `pairs` whose value is not empty.
fn present_labels(
    encoder: &mut LabelSetEncoder,
    pairs: &[(&str, &str)],
) -> Result<(), std::fmt::Error> {
    for (key, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        label(encoder, key, value)?;
    }
    Ok(())
}

/// Labels of a runtime series: model, runtime and instance (each left out when empty).
struct RuntimeLabels<'a>(&'a RuntimeTotals);

impl EncodeLabelSet for RuntimeLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let t = self.0;
        present_labels(
            encoder,
            &[
                ("model", &t.model_id),
                ("runtime", &t.runtime),
                ("instance", &t.instance),
            ],
        )
    }
}

/// A cumulative histogram's buckets as prometheus-client takes them: (upper bound, count in the
/// bucket alone), whole observations.
fn per_bucket(h: &CumulativeHistogram) -> Vec<(f64, u64)> {
    let whole = |v: f64| {
        if v.is_finite() && v > 0.0 {
            v.round() as u64
        } else {
            0
        }
    };
    let mut below = 0u64;
    h.bounds
        .iter()
        .zip(&h.cumulative)
        .map(|(bound, cumulative)| {
            let c = whole(*cumulative).max(below);
            let n = c - below;
            below = c;
            (*bound, n)
        })
        .collect()
}

/// Labels of an exported signal: the model, runtime, instance and GPU it belongs to (each
/// left out when empty: device-level signals have no model, model-level ones no GPU).
struct SignalLabels<'a>(&'a SignalPoint);

impl EncodeLabelSet for SignalLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let p = self.0;
        present_labels(
            encoder,
            &[
                ("model", &p.model_id),
                ("runtime", &p.runtime),
                ("instance", &p.instance),
                ("gpu", &p.device_id),
            ],
        )
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
        let totals = {
            let board = self.board.read().unwrap_or_else(|p| p.into_inner());
            board.runtime_windows().totals()
        };
        for (signal, name, help) in RUNTIME_HISTOGRAMS {
            let lines: Vec<(&RuntimeTotals, &CumulativeHistogram)> = totals
                .iter()
                .filter_map(|t| t.histograms.get(signal).map(|h| (t, h)))
                .collect();
            if lines.is_empty() {
                continue;
            }
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (t, h) in lines {
                let buckets = per_bucket(h);
                let count = buckets.iter().map(|(_, n)| n).sum();
                family
                    .encode_family(&RuntimeLabels(t))?
                    .encode_histogram::<NoLabelSet>(h.sum.max(0.0), count, &buckets, None)?;
            }
        }
        for (name, help, value) in RUNTIME_COUNTERS {
            let lines: Vec<(&RuntimeTotals, f64)> = totals
                .iter()
                .filter_map(|t| value(t).filter(|v| v.is_finite()).map(|v| (t, v)))
                .collect();
            if lines.is_empty() {
                continue;
            }
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (t, v) in lines {
                ConstCounter::new(v.max(0.0)).encode(family.encode_family(&RuntimeLabels(t))?)?;
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
    use crate::kernel::telemetry::{
        DURATION_BUCKETS, TOKEN_USAGE_BUCKETS, operation_name, provider_name,
    };
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
            stream: true,
            status: 200,
            first_token_s: Some(0.2),
            end_s: 1.0,
            output_tokens: Some(10),
            prompt_tokens: Some(300),
            chunk_offsets_us: vec![200_000, 1_000_000],
            cost_usd: Some(0.25),
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

    fn with_model(model: &str) -> RequestRecord {
        let mut r = record();
        r.labels.model_id = model.into();
        r
    }

    fn overflow(text: &str, family: &str) -> f64 {
        samples(text, "tokenwatch_metrics_series_overflow_total")
            .into_iter()
            .find(|(l, _)| l.get("family").map(String::as_str) == Some(family))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no overflow counter for {family}: {text}"))
    }

    #[test]
    fn idle_label_sets_leave_every_family_and_free_their_place_in_the_budget() {
        let m = Metrics::new();
        m.set_series_limits(128, 6);
        m.set_idle_series_after(std::time::Duration::from_secs(3600));
        let now = tokenwatch_core::clock::now_unix_ms();
        let failed = |model: &str| {
            let mut r = with_model(model);
            r.status = 500;
            r.error_class = Some(tokenwatch_core::model::ErrorClass::Upstream5xx);
            (r.prompt_tokens, r.output_tokens, r.cost_usd) = (None, None, None);
            r
        };
        // m0 (a success and a failure) and m1 last seen two hours ago, m2 ten minutes ago.
        m.observe_at(&with_model("m0"), now - 7_200_000);
        m.observe_at(&failed("m0"), now - 7_200_000);
        m.observe_at(&with_model("m1"), now - 7_200_000);
        m.observe_at(&with_model("m2"), now - 600_000);
        let models = |text: &str, name: &str| -> Vec<String> {
            let mut v: Vec<String> = samples(text, name)
                .into_iter()
                .map(|(l, _)| l["gen_ai_request_model"].clone())
                .collect();
            v.sort();
            v
        };
        // A scrape sweeps them out of every family, the outcome series of m0's failure too.
        let text = m.encode();
        for family in [
            "tokenwatch_requests_total",
            "gen_ai_server_request_duration_seconds_count",
            "gen_ai_client_operation_duration_seconds_count",
            "gen_ai_server_time_to_first_token_seconds_count",
            "gen_ai_server_time_per_output_token_seconds_count",
            "gen_ai_client_operation_time_to_first_chunk_seconds_count",
            "gen_ai_client_operation_time_per_output_chunk_seconds_count",
            "tokenwatch_spend_usd_total",
        ] {
            assert_eq!(models(&text, family), ["m2"], "{family}: {text}");
        }
        assert_eq!(
            models(&text, "gen_ai_client_token_usage_count"),
            ["m2", "m2"],
            "{text}"
        );
        // Their places are free (six budgeted, m2 holds one): five new models get series of
        // their own, a sixth folds.
        for model in ["m3", "m4", "m5", "m6", "m7", "m8"] {
            m.observe_at(&with_model(model), now);
        }
        let text = m.encode();
        assert_eq!(
            models(&text, "tokenwatch_requests_total"),
            ["__other__", "m2", "m3", "m4", "m5", "m6", "m7"],
            "{text}"
        );
        assert_eq!(overflow(&text, "tokenwatch_requests"), 1.0, "{text}");
        // Observing goes on sweeping without a scrape: two hours on, only the newest is left
        // (with `__other__`), and a model that comes back starts from zero.
        m.observe_at(&with_model("m0"), now + 7_200_000);
        let text = m.encode();
        assert_eq!(
            models(&text, "tokenwatch_requests_total"),
            ["__other__", "m0"],
            "{text}"
        );
        let requests = samples(&text, "tokenwatch_requests_total");
        assert!(
            requests
                .iter()
                .any(|(l, v)| l["gen_ai_request_model"] == "m0" && *v == 1.0),
            "{text}"
        );
    }

    #[test]
    fn each_request_family_holds_its_budget_and_folds_the_rest_into_other() {
        let m = std::sync::Arc::new(Metrics::new());
        m.set_series_limits(128, 3);
        let mut sink = MetricsSink(m.clone());
        sink.consume(&[with_model("m0")]).unwrap();
        let text = m.encode();
        // Declared, at zero, before any overflow.
        assert_eq!(overflow(&text, "tokenwatch_requests"), 0.0, "{text}");
        let batch: Vec<RequestRecord> = (1..10).map(|i| with_model(&format!("m{i}"))).collect();
        sink.consume(&batch).unwrap();
        // An admitted label set keeps its own series after the budget filled.
        sink.consume(&[with_model("m0")]).unwrap();
        let text = m.encode();
        let requests = samples(&text, "tokenwatch_requests_total");
        let models: Vec<&str> = requests
            .iter()
            .map(|(l, _)| l["gen_ai_request_model"].as_str())
            .collect();
        assert_eq!(requests.len(), 4, "{text}");
        for want in ["m0", "m1", "m2", "__other__"] {
            assert!(models.contains(&want), "{want}: {text}");
        }
        let value = |model: &str| {
            requests
                .iter()
                .find(|(l, _)| l["gen_ai_request_model"] == model)
                .map(|(_, v)| *v)
        };
        assert_eq!(value("m0"), Some(2.0));
        assert_eq!(value("__other__"), Some(7.0));
        let (other, _) = requests
            .iter()
            .find(|(l, _)| l["gen_ai_request_model"] == "__other__")
            .unwrap();
        for key in ["gen_ai_response_model", "instance", "gen_ai_provider_name"] {
            assert_eq!(other[key], "__other__", "{key}: {text}");
        }
        assert_eq!(other["gen_ai_operation_name"], "chat");
        assert_eq!(overflow(&text, "tokenwatch_requests"), 7.0, "{text}");
        assert_eq!(overflow(&text, "tokenwatch_spend_usd"), 7.0, "{text}");
        let spend = samples(&text, "tokenwatch_spend_usd_total");
        assert_eq!(spend.len(), 4, "{text}");
        assert_eq!(
            spend.iter().map(|(_, v)| v).sum::<f64>(),
            11.0 * 0.25,
            "every request's cost is counted, folded or not: {text}"
        );
        assert_eq!(
            overflow(&text, "gen_ai_server_time_to_first_token_seconds"),
            7.0
        );
        // Input and output tokens are two label sets per request: m0 and m1's input fill it.
        assert_eq!(overflow(&text, "gen_ai_client_token_usage"), 17.0, "{text}");
        assert_eq!(samples(&text, "gen_ai_client_token_usage_count").len(), 5);
        assert_eq!(
            samples(&text, "gen_ai_server_time_to_first_token_seconds_count").len(),
            4
        );
    }

    #[test]
    fn long_label_values_are_cut_on_a_character_boundary() {
        let long = "é".repeat(5_000);
        let m = std::sync::Arc::new(Metrics::new());
        m.set_series_limits(64, 100);
        MetricsSink(m.clone())
            .consume(&[with_model(&long)])
            .unwrap();
        let text = m.encode();
        let s = samples(&text, "tokenwatch_requests_total");
        let model = &s[0].0["gen_ai_request_model"];
        assert!(model.len() <= 64, "{}", model.len());
        assert!(model.ends_with("..."), "{model}");
        assert_eq!(model.trim_end_matches("..."), "é".repeat(30));
        assert!(text.len() < 64 * 1024, "{}", text.len());

        let mut v = "abcdef".to_string();
        crate::kernel::telemetry::cap_label(&mut v, 16);
        assert_eq!(v, "abcdef");
        let mut v = "a".repeat(17);
        crate::kernel::telemetry::cap_label(&mut v, 16);
        assert_eq!(v, format!("{}...", "a".repeat(13)));
    }

    #[test]
    fn unrouted_models_are_counted_under_other() {
        let mut r = with_model("no-such-model");
        r.status = 404;
        r.error_class = Some(ErrorClass::NoRoute);
        r.first_token_s = None;
        let text = encode(&[r], false);
        let s = samples(&text, "tokenwatch_requests_total");
        assert_eq!(s.len(), 1, "{text}");
        assert_eq!(s[0].0["gen_ai_request_model"], "__other__");
        assert_eq!(s[0].0["error_type"], "no_route");
        assert!(!text.contains("no-such-model"), "{text}");
    }

    #[test]
    fn series_limits_default_and_parse() {
        let d = crate::config::Config::from_yaml("listen: 127.0.0.1:9999\n", "t.yaml").unwrap();
        assert_eq!(d.export.prometheus.max_label_bytes, 128);
        assert_eq!(d.export.prometheus.max_series_per_family, 500);
        let c = crate::config::Config::from_yaml(
            "export:\n  prometheus:\n    max_label_bytes: 64\n    max_series_per_family: 50\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(c.export.prometheus.max_label_bytes, 64);
        assert_eq!(c.export.prometheus.max_series_per_family, 50);
    }

    #[test]
    fn spend_sums_the_priced_requests_and_leaves_the_unpriced_out() {
        let mut cheap = record();
        cheap.cost_usd = Some(0.1);
        let mut unpriced = record();
        unpriced.cost_usd = None;
        let text = encode(&[record(), cheap.clone(), cheap, unpriced], false);
        let spend = samples(&text, "tokenwatch_spend_usd_total");
        assert_eq!(spend.len(), 1, "{text}");
        assert!((spend[0].1 - 0.45).abs() < 1e-12, "{text}");
        assert_eq!(spend[0].0["gen_ai_request_model"], "m1");
        assert!(!spend[0].0.contains_key("tenant"), "{text}");
        let none = encode(&[unpriced_only()], false);
        assert!(
            samples(&none, "tokenwatch_spend_usd_total").is_empty(),
            "{none}"
        );
    }

    fn unpriced_only() -> RequestRecord {
        RequestRecord {
            cost_usd: None,
            ..record()
        }
    }

    #[test]
    fn tenant_label_when_opted_in() {
        let text = encode(&[record()], true);
        for name in [
            "gen_ai_server_time_to_first_token_seconds_count",
            "gen_ai_server_request_duration_seconds_count",
            "gen_ai_client_token_usage_count",
            "tokenwatch_requests_total",
            "tokenwatch_spend_usd_total",
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
    fn streams_give_the_clients_chunk_histograms_with_the_conventions_buckets() {
        // A stream of four chunks (first at 0.2 s, then gaps of 0.05, 0.3 and 1.5 s), one cut
        // after two chunks, and a call that did not stream.
        let mut whole = record();
        whole.stream = true;
        whole.chunk_offsets_us = vec![200_000, 250_000, 550_000, 2_050_000];
        let mut cut = record();
        cut.stream = true;
        cut.error_class = Some(ErrorClass::UpstreamReset);
        cut.chunk_offsets_us = vec![200_000, 230_000];
        let mut unary = record();
        unary.stream = false;
        let text = encode(&[whole, cut, unary], false);
        for family in [
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            "gen_ai_client_operation_time_per_output_chunk_seconds",
        ] {
            assert!(
                text.contains(&format!("# TYPE {family} histogram")),
                "{text}"
            );
            let bounds: Vec<f64> = samples(&text, &format!("{family}_bucket"))
                .iter()
                .filter_map(|(l, _)| l["le"].parse().ok())
                .filter(|b: &f64| b.is_finite())
                .collect();
            assert_eq!(bounds, DURATION_BUCKETS.to_vec(), "{family}");
        }
        let one = |name: &str| {
            let v = samples(&text, name);
            assert_eq!(v.len(), 1, "{name}: {text}");
            v[0].1
        };
        // Both streams had a first chunk; the unary call is in neither family.
        assert_eq!(
            one("gen_ai_client_operation_time_to_first_chunk_seconds_count"),
            2.0
        );
        assert!(
            (one("gen_ai_client_operation_time_to_first_chunk_seconds_sum") - 0.4).abs() < 1e-9
        );
        // One observation per chunk after the first: 3 + 1.
        assert_eq!(
            one("gen_ai_client_operation_time_per_output_chunk_seconds_count"),
            4.0
        );
        assert!(
            (one("gen_ai_client_operation_time_per_output_chunk_seconds_sum") - 1.88).abs() < 1e-9
        );
        let le = |bound: &str| {
            samples(
                &text,
                "gen_ai_client_operation_time_per_output_chunk_seconds_bucket",
            )
            .into_iter()
            .find(|(l, _)| l["le"].parse::<f64>().ok() == bound.parse::<f64>().ok())
            .map(|(_, v)| v)
            .unwrap()
        };
        // 0.03 and 0.05 by 0.08; 0.3 by 0.32; 1.5 by 2.56.
        assert_eq!(
            (le("0.08"), le("0.32"), le("1.28"), le("2.56")),
            (2.0, 3.0, 3.0, 4.0)
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
        register_signals(&m, board.clone());
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

    #[test]
    fn the_runtimes_histograms_and_counters_are_exported_cumulative_under_one_name() {
        use tokenwatch_core::counts::ScrapeCounts;
        let board: SharedSignals =
            std::sync::Arc::new(std::sync::RwLock::new(SignalBoard::new(4, 100)));
        let m = Metrics::new();
        register_signals(&m, board.clone());
        assert!(
            !m.encode()
                .contains("tokenwatch_runtime_time_to_first_token")
        );
        let scrape = |at: i64, per_bucket: [f64; 3], failed: f64| ScrapeCounts {
            model_id: "m1".into(),
            instance: "10.0.0.1:8000".into(),
            runtime: "sglang".into(),
            at_unix_ms: at,
            interval_ms: 1_000,
            finished: Some(per_bucket.iter().sum()),
            failed: Some(failed),
            prompt_tokens: None,
            output_tokens: Some(50.0),
            latency: vec![(
                "ttft".into(),
                CumulativeHistogram {
                    sum: 0.5,
                    ..CumulativeHistogram::from_bucket_counts(
                        &[0.1, 0.5, f64::INFINITY],
                        &per_bucket,
                    )
                },
            )],
        };
        {
            let mut b = board.write().unwrap();
            b.record_counts(scrape(1_700_000_000_000, [3.0, 1.0, 0.0], 0.0));
            b.record_counts(scrape(1_700_000_001_000, [1.0, 2.0, 1.0], 1.0));
        }
        let text = m.encode();
        assert!(
            text.contains("# TYPE tokenwatch_runtime_time_to_first_token_seconds histogram"),
            "{text}"
        );
        let buckets: Vec<(String, f64)> = samples(
            &text,
            "tokenwatch_runtime_time_to_first_token_seconds_bucket",
        )
        .into_iter()
        .map(|(l, v)| {
            assert_eq!(
                (l["model"].as_str(), l["runtime"].as_str()),
                ("m1", "sglang")
            );
            (l["le"].clone(), v)
        })
        .collect();
        assert_eq!(
            buckets,
            [
                ("0.1".to_string(), 4.0),
                ("0.5".to_string(), 7.0),
                ("+Inf".to_string(), 8.0)
            ]
        );
        assert_eq!(
            samples(
                &text,
                "tokenwatch_runtime_time_to_first_token_seconds_count"
            )[0]
            .1,
            8.0
        );
        assert_eq!(
            samples(&text, "tokenwatch_runtime_time_to_first_token_seconds_sum")[0].1,
            1.0
        );
        assert_eq!(
            samples(&text, "tokenwatch_runtime_requests_finished_total")[0].1,
            8.0
        );
        assert_eq!(
            samples(&text, "tokenwatch_runtime_requests_failed_total")[0].1,
            1.0
        );
        assert_eq!(
            samples(&text, "tokenwatch_runtime_output_tokens_total")[0].1,
            100.0
        );
        assert!(
            samples(&text, "tokenwatch_runtime_prompt_tokens_total").is_empty(),
            "not reported, not exported"
        );
        assert!(!text.contains("tokenwatch_runtime_inter_token_latency"));
    }
}
