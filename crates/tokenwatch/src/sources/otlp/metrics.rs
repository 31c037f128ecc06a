// Metrics in: GenAI histograms (time to first token, time per output token, durations, token
// usage) become the same percentile and rate signals the scraper yields; a few runtime gauges too.

use super::attrs::{as_str, value_of};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, HistogramDataPoint, NumberDataPoint, metric::Data, number_data_point,
};
use std::collections::BTreeMap;
use std::collections::hash_map::{DefaultHasher, HashMap};
use std::hash::{Hash, Hasher};
use tokenwatch_core::histogram::CumulativeHistogram;
use tokenwatch_core::signals::{SignalPoint, names};

/// Percentiles published for each latency histogram.
const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99)];
/// Series whose previous cumulative reading is kept (older ones are forgotten first).
const DEFAULT_MAX_SERIES: usize = 50_000;

/// What a histogram metric means to tokenwatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Latency percentiles under this signal prefix (`ttft`, `itl`, `e2e`); `requests_per_second`
    /// from the count as well when `rate` is set.
    Latency { prefix: &'static str, rate: bool },
    /// Tokens per request, split by `gen_ai.token.type`: token rates.
    TokenUsage,
}

fn histogram_kind(name: &str) -> Option<Kind> {
    Some(match name {
        "gen_ai.server.time_to_first_token" => Kind::Latency { prefix: "ttft", rate: false },
        "gen_ai.server.time_per_output_token" => Kind::Latency { prefix: "itl", rate: false },
        "gen_ai.server.request.duration" => Kind::Latency { prefix: "e2e", rate: true },
        "gen_ai.client.operation.duration" => Kind::Latency { prefix: "e2e", rate: true },
        "gen_ai.client.token.usage" | "gen_ai.server.token.usage" => Kind::TokenUsage,
        _ => return None,
    })
}

/// Runtime gauges sometimes exported over OTLP, and the signal each one is.
fn gauge_signal(name: &str) -> Option<&'static str> {
    Some(match name {
        "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => names::KV_CACHE_USAGE,
        "vllm:num_requests_running" => names::REQUESTS_RUNNING,
        "vllm:num_requests_waiting" => names::REQUESTS_WAITING,
        _ => return None,
    })
}

/// What one export request of metrics turns into.
#[derive(Debug, Default)]
pub struct MetricsBatch {
    pub points: Vec<SignalPoint>,
    pub accepted: u64,
    /// Data points refused (unsupported type or malformed buckets).
    pub rejected: u64,
    /// Of those, refused for their type (exponential histograms, summaries).
    pub unsupported: u64,
    pub first_error: Option<String>,
}

impl MetricsBatch {
    fn reject(&mut self, n: usize, unsupported: bool, why: impl FnOnce() -> String) {
        if n == 0 {
            return;
        }
        self.rejected += n as u64;
        if unsupported {
            self.unsupported += n as u64;
        }
        if self.first_error.is_none() {
            self.first_error = Some(why());
        }
    }
}

struct Previous {
    hist: CumulativeHistogram,
    start_unix_nano: u64,
    time_unix_nano: u64,
}

/// Turns metric exports into signal points, remembering each cumulative series' last reading
/// so percentiles and rates describe the interval between two exports.
pub struct MetricsMapper {
    previous: HashMap<u64, Previous>,
    max_series: usize,
}

impl Default for MetricsMapper {
    fn default() -> Self {
        MetricsMapper::new(DEFAULT_MAX_SERIES)
    }
}

/// Who a data point belongs to.
struct Owner {
    model_id: String,
    runtime: String,
    instance: String,
}

fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(as_str).map(|s| s.into_owned())
}

fn owner(res: &[KeyValue], point: &[KeyValue]) -> Owner {
    let get = |attrs: &[KeyValue], k: &str| text(attrs.iter().find(|kv| kv.key == k).and_then(value_of));
    let model_id = get(point, "gen_ai.response.model")
        .or_else(|| get(point, "gen_ai.request.model"))
        .unwrap_or_else(|| "unknown".into());
    let runtime = get(point, "gen_ai.provider.name")
        .or_else(|| get(point, "gen_ai.system"))
        .or_else(|| get(res, "service.name"))
        .unwrap_or_else(|| "otlp".into());
    let instance = match (get(point, "server.address"), get(point, "server.port")) {
        (Some(a), Some(p)) => format!("{a}:{p}"),
        (Some(a), None) => a,
        _ => get(res, "service.instance.id").unwrap_or_default(),
    };
    Owner { model_id, runtime, instance }
}

fn series_key(metric: &str, res: &[KeyValue], point: &[KeyValue]) -> u64 {
    let mut h = DefaultHasher::new();
    metric.hash(&mut h);
    for attrs in [res, point] {
        let mut pairs: Vec<(&str, String)> = attrs
            .iter()
            .map(|kv| (kv.key.as_str(), value_of(kv).map(|v| format!("{v:?}")).unwrap_or_default()))
            .collect();
        pairs.sort();
        pairs.hash(&mut h);
        0xffu8.hash(&mut h);
    }
    h.finish()
}

/// OTLP per-bucket counts and explicit bounds as a cumulative histogram ending in +Inf, in
/// seconds when the unit is milliseconds. Errors name what is malformed.
pub fn to_cumulative(p: &HistogramDataPoint, unit: &str) -> Result<CumulativeHistogram, String> {
    let scale = if unit == "ms" { 1e-3 } else { 1.0 };
    if p.bucket_counts.len() != p.explicit_bounds.len() + 1 {
        return Err(format!(
            "{} bucket counts for {} explicit bounds (want bounds + 1)",
            p.bucket_counts.len(),
            p.explicit_bounds.len()
        ));
    }
    if p.explicit_bounds.iter().any(|b| !b.is_finite()) || p.explicit_bounds.windows(2).any(|w| w[0] >= w[1]) {
        return Err("explicit bounds must be finite and strictly increasing".into());
    }
    let mut bounds: Vec<f64> = p.explicit_bounds.iter().map(|b| b * scale).collect();
    bounds.push(f64::INFINITY);
    let mut running = 0.0;
    let cumulative = p
        .bucket_counts
        .iter()
        .map(|c| {
            running += *c as f64;
            running
        })
        .collect();
    Ok(CumulativeHistogram { bounds, cumulative, sum: p.sum.unwrap_or(0.0) * scale, count: p.count as f64 })
}

impl MetricsMapper {
    pub fn new(max_series: usize) -> MetricsMapper {
        MetricsMapper { previous: HashMap::new(), max_series: max_series.max(1) }
    }

    /// Series whose last reading is remembered.
    pub fn series(&self) -> usize {
        self.previous.len()
    }

    pub fn map(&mut self, req: &ExportMetricsServiceRequest, now_unix_ms: i64) -> MetricsBatch {
        let mut out = MetricsBatch::default();
        for rm in &req.resource_metrics {
            let res = rm.resource.as_ref().map(|r| r.attributes.as_slice()).unwrap_or(&[]);
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    match &m.data {
                        Some(Data::Histogram(h)) => {
                            let cumulative = h.aggregation_temporality != AggregationTemporality::Delta as i32;
                            for p in &h.data_points {
                                self.histogram_point(&m.name, &m.unit, cumulative, res, p, now_unix_ms, &mut out);
                            }
                        }
                        Some(Data::Gauge(g)) => self.number_points(&m.name, res, &g.data_points, now_unix_ms, &mut out),
                        Some(Data::Sum(s)) => self.number_points(&m.name, res, &s.data_points, now_unix_ms, &mut out),
                        Some(Data::ExponentialHistogram(e)) => out.reject(e.data_points.len(), true, || {
                            format!(
                                "metric {:?}: exponential histogram points are not supported (send explicit buckets)",
                                m.name
                            )
                        }),
                        Some(Data::Summary(s)) => out.reject(s.data_points.len(), true, || {
                            format!(
                                "metric {:?}: summary points are not supported (send explicit-bucket histograms)",
                                m.name
                            )
                        }),
                        None => {}
                    }
                }
            }
        }
        out
    }

    fn number_points(
        &self,
        name: &str,
        res: &[KeyValue],
        points: &[NumberDataPoint],
        now: i64,
        out: &mut MetricsBatch,
    ) {
        out.accepted += points.len() as u64;
        let Some(signal) = gauge_signal(name) else { return };
        for p in points {
            let value = match p.value {
                Some(number_data_point::Value::AsDouble(d)) => d,
                Some(number_data_point::Value::AsInt(i)) => i as f64,
                None => continue,
            };
            let o = owner(res, &p.attributes);
            out.points.push(point(&o, signal, value, stamp(p.time_unix_nano, now), BTreeMap::new()));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn histogram_point(
        &mut self,
        name: &str,
        unit: &str,
        cumulative: bool,
        res: &[KeyValue],
        p: &HistogramDataPoint,
        now: i64,
        out: &mut MetricsBatch,
    ) {
        let hist = match to_cumulative(p, unit) {
            Ok(h) => h,
            Err(e) => return out.reject(1, false, || format!("metric {name:?}: histogram point: {e}")),
        };
        out.accepted += 1;
        let Some(kind) = histogram_kind(name) else { return };
        let (window, window_ns) = if cumulative {
            let key = series_key(name, res, &p.attributes);
            let prev = self.previous.get(&key).filter(|prev| prev.start_unix_nano == p.start_time_unix_nano);
            let (w, ns) = match prev {
                Some(prev) if p.time_unix_nano > prev.time_unix_nano => {
                    (hist.delta_since(&prev.hist), p.time_unix_nano - prev.time_unix_nano)
                }
                Some(_) => return, // same or older reading than the one already used
                None => (hist.clone(), p.time_unix_nano.saturating_sub(p.start_time_unix_nano)),
            };
            self.remember(
                key,
                Previous { hist, start_unix_nano: p.start_time_unix_nano, time_unix_nano: p.time_unix_nano },
            );
            (w, ns)
        } else {
            (hist, p.time_unix_nano.saturating_sub(p.start_time_unix_nano))
        };
        let o = owner(res, &p.attributes);
        let ts = stamp(p.time_unix_nano, now);
        let window_s = window_ns as f64 / 1e9;
        let observations = *window.cumulative.last().unwrap_or(&0.0);
        if observations <= 0.0 {
            return;
        }
        match kind {
            Kind::Latency { prefix, rate } => {
                for (qname, q) in QUANTILES {
                    let Some(bq) = window.quantile(q) else { continue };
                    let mut notes = BTreeMap::new();
                    notes.insert("bucket_error_seconds".into(), format!("{}", bq.max_abs_error()));
                    notes.insert("bucket".into(), format!("{}..{}", bq.bucket_lower, bq.bucket_upper));
                    notes.insert("observations".into(), format!("{observations}"));
                    notes.insert("window_seconds".into(), format!("{window_s:.3}"));
                    notes.insert("metric".into(), name.to_string());
                    out.points.push(point(&o, &names::latency_signal(prefix, qname), bq.value, ts, notes));
                }
                if rate && window_s > 0.0 {
                    out.points.push(point(
                        &o,
                        names::REQUESTS_PER_SECOND,
                        observations / window_s,
                        ts,
                        BTreeMap::new(),
                    ));
                }
            }
            Kind::TokenUsage => {
                let token_type = p.attributes.iter().find(|kv| kv.key == "gen_ai.token.type").and_then(value_of);
                let signal = match token_type.and_then(as_str).as_deref() {
                    Some("input") => names::PROMPT_TOKENS_PER_SECOND,
                    Some("output") => names::OUTPUT_TOKENS_PER_SECOND,
                    _ => return,
                };
                if window_s > 0.0 {
                    out.points.push(point(&o, signal, window.sum / window_s, ts, BTreeMap::new()));
                }
            }
        }
    }

    fn remember(&mut self, key: u64, prev: Previous) {
        if self.previous.len() >= self.max_series && !self.previous.contains_key(&key) {
            // Forget the half not updated for the longest time; bounded memory over exactness.
            let mut times: Vec<u64> = self.previous.values().map(|p| p.time_unix_nano).collect();
            times.sort_unstable();
            let cutoff = times[times.len() / 2];
            self.previous.retain(|_, p| p.time_unix_nano > cutoff);
        }
        self.previous.insert(key, prev);
    }
}

fn stamp(time_unix_nano: u64, now_unix_ms: i64) -> i64 {
    if time_unix_nano == 0 { now_unix_ms } else { i64::try_from(time_unix_nano / 1_000_000).unwrap_or(now_unix_ms) }
}

fn point(o: &Owner, signal: &str, value: f64, ts: i64, notes: BTreeMap<String, String>) -> SignalPoint {
    SignalPoint {
        model_id: o.model_id.clone(),
        signal: signal.to_string(),
        value,
        source: "otlp".into(),
        runtime: o.runtime.clone(),
        instance: o.instance.clone(),
        device_id: String::new(),
        timestamp_unix_ms: ts,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::metrics::v1::{
        Histogram, Metric, ResourceMetrics, ScopeMetrics, Summary, SummaryDataPoint,
    };

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(Value::StringValue(v.into())) }),
            ..Default::default()
        }
    }

    fn hp(counts: &[u64], t: u64, sum: f64) -> HistogramDataPoint {
        HistogramDataPoint {
            attributes: vec![kv("gen_ai.request.model", "m1")],
            start_time_unix_nano: 1_000_000_000,
            time_unix_nano: t,
            count: counts.iter().sum(),
            sum: Some(sum),
            bucket_counts: counts.to_vec(),
            explicit_bounds: vec![0.1, 0.5, 1.0],
            ..Default::default()
        }
    }

    fn req(
        name: &str,
        temporality: AggregationTemporality,
        points: Vec<HistogramDataPoint>,
    ) -> ExportMetricsServiceRequest {
        let metric = Metric {
            name: name.into(),
            unit: "s".into(),
            data: Some(Data::Histogram(Histogram { data_points: points, aggregation_temporality: temporality as i32 })),
            ..Default::default()
        };
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics { metrics: vec![metric], ..Default::default() }],
                ..Default::default()
            }],
        }
    }

    fn value(b: &MetricsBatch, signal: &str) -> Option<f64> {
        b.points.iter().find(|p| p.signal == signal).map(|p| p.value)
    }

    #[test]
    fn per_bucket_counts_become_cumulative_with_inf_last() {
        let h = to_cumulative(&hp(&[10, 50, 40, 0], 2, 40.0), "s").unwrap();
        assert_eq!(h.bounds, vec![0.1, 0.5, 1.0, f64::INFINITY]);
        assert_eq!(h.cumulative, vec![10.0, 60.0, 100.0, 100.0]);
        let ms = to_cumulative(&hp(&[1, 0, 0, 0], 2, 50.0), "ms").unwrap();
        assert_eq!(ms.bounds[0], 0.0001);
        assert!(to_cumulative(&hp(&[1, 2], 2, 0.0), "s").unwrap_err().contains("2 bucket counts for 3"));
    }

    #[test]
    fn cumulative_exports_give_percentiles_of_the_interval() {
        let mut m = MetricsMapper::default();
        let name = "gen_ai.server.time_to_first_token";
        let first =
            m.map(&req(name, AggregationTemporality::Cumulative, vec![hp(&[10, 50, 40, 0], 11_000_000_000, 40.0)]), 0);
        let p50 = value(&first, "ttft_p50_seconds").unwrap();
        assert!((p50 - 0.42).abs() < 1e-9, "{p50}");
        assert_eq!(first.points[0].model_id, "m1");
        assert_eq!(first.points[0].source, "otlp");
        assert!(first.points[0].notes.contains_key("bucket_error_seconds"));
        // Next export: 100 more observations, all in the (0.5, 1] bucket.
        let second = m
            .map(&req(name, AggregationTemporality::Cumulative, vec![hp(&[10, 50, 140, 0], 21_000_000_000, 120.0)]), 0);
        let p50 = value(&second, "ttft_p50_seconds").unwrap();
        assert!((p50 - 0.75).abs() < 1e-9, "{p50}");
        // Same reading again: nothing new.
        let again = m
            .map(&req(name, AggregationTemporality::Cumulative, vec![hp(&[10, 50, 140, 0], 21_000_000_000, 120.0)]), 0);
        assert!(again.points.is_empty());
        assert_eq!(m.series(), 1);
    }

    #[test]
    fn delta_points_rates_and_rejections() {
        let mut m = MetricsMapper::default();
        let b = m.map(
            &req(
                "gen_ai.server.request.duration",
                AggregationTemporality::Delta,
                vec![hp(&[0, 0, 20, 0], 11_000_000_000, 15.0)],
            ),
            0,
        );
        assert_eq!(value(&b, "requests_per_second"), Some(2.0));
        assert!(value(&b, "e2e_p99_seconds").unwrap() <= 1.0);
        let mut usage = hp(&[5, 0, 0, 0], 3_000_000_000, 1000.0);
        usage.attributes.push(kv("gen_ai.token.type", "output"));
        let b = m.map(&req("gen_ai.client.token.usage", AggregationTemporality::Delta, vec![usage]), 0);
        assert_eq!(value(&b, "output_tokens_per_second"), Some(500.0));
        let bad =
            m.map(&req("gen_ai.server.time_to_first_token", AggregationTemporality::Delta, vec![hp(&[1], 2, 0.0)]), 0);
        assert_eq!((bad.accepted, bad.rejected), (0, 1));
        let summary = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "x".into(),
                        data: Some(Data::Summary(Summary { data_points: vec![SummaryDataPoint::default(); 2] })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let b = m.map(&summary, 0);
        assert_eq!(b.rejected, 2);
        assert!(b.first_error.unwrap().contains("summary points are not supported"));
    }
}
