// Metrics in: GenAI histograms (time to first token or chunk, time per output token or chunk,
// durations, token usage), explicit or exponential, become the same percentile and rate signals
// the scraper yields; a few runtime gauges too.

use super::attrs::{as_str, value_of};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, ExponentialHistogramDataPoint, HistogramDataPoint, NumberDataPoint,
    metric::Data, number_data_point,
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
/// Most buckets an exponential histogram point (or the difference of two) may span; the SDKs
/// keep 160 by default.
const MAX_EXP_BUCKETS: i64 = 4096;

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
        "gen_ai.server.time_to_first_token" => Kind::Latency {
            prefix: "ttft",
            rate: false,
        },
        "gen_ai.server.time_per_output_token" => Kind::Latency {
            prefix: "itl",
            rate: false,
        },
        "gen_ai.server.request.duration" => Kind::Latency {
            prefix: "e2e",
            rate: true,
        },
        "gen_ai.client.operation.duration" => Kind::Latency {
            prefix: "e2e",
            rate: true,
        },
        // The client's view of a stream: first chunk and each chunk after it.
        "gen_ai.client.operation.time_to_first_chunk" => Kind::Latency {
            prefix: "ttft",
            rate: false,
        },
        "gen_ai.client.operation.time_per_output_chunk" => Kind::Latency {
            prefix: "itl",
            rate: false,
        },
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
    /// Of those, refused for their type (summaries).
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

/// The last reading of a cumulative series, in the form its points come in.
enum Reading {
    Explicit(CumulativeHistogram),
    Exponential(ExpBuckets),
}

impl Reading {
    /// Observations since `before` (everything when there is none, or when it cannot be
    /// subtracted: another layout, a reset), as a cumulative histogram in seconds.
    fn window_since(&self, before: Option<&Reading>, unit_scale: f64) -> CumulativeHistogram {
        match (self, before) {
            (Reading::Explicit(now), Some(Reading::Explicit(b))) => now.delta_since(b),
            (Reading::Explicit(now), _) => now.clone(),
            (Reading::Exponential(now), Some(Reading::Exponential(b))) => now
                .delta_since(b)
                .as_ref()
                .unwrap_or(now)
                .to_cumulative(unit_scale),
            (Reading::Exponential(now), _) => now.to_cumulative(unit_scale),
        }
    }
}

struct Previous {
    reading: Reading,
    start_unix_nano: u64,
    time_unix_nano: u64,
}

/// The times and attributes of a histogram data point, whatever its bucket layout.
struct PointMeta<'a> {
    attributes: &'a [KeyValue],
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

/// One model, one id: the requested model names the point, as it names the span's record, the
/// proxy's and the runtime's series (the response's model, often a longer or dated spelling of
/// the same, only when no request model was sent).
fn owner(res: &[KeyValue], point: &[KeyValue]) -> Owner {
    let get =
        |attrs: &[KeyValue], k: &str| text(attrs.iter().find(|kv| kv.key == k).and_then(value_of));
    let model_id = get(point, "gen_ai.request.model")
        .or_else(|| get(point, "gen_ai.response.model"))
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
    Owner {
        model_id,
        runtime,
        instance,
    }
}

fn series_key(metric: &str, res: &[KeyValue], point: &[KeyValue]) -> u64 {
    let mut h = DefaultHasher::new();
    metric.hash(&mut h);
    for attrs in [res, point] {
        let mut pairs: Vec<(&str, String)> = attrs
            .iter()
            .map(|kv| {
                (
                    kv.key.as_str(),
                    value_of(kv).map(|v| format!("{v:?}")).unwrap_or_default(),
                )
            })
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
    if p.explicit_bounds.iter().any(|b| !b.is_finite())
        || p.explicit_bounds.windows(2).any(|w| w[0] >= w[1])
    {
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
    Ok(CumulativeHistogram {
        bounds,
        cumulative,
        sum: p.sum.unwrap_or(0.0) * scale,
        count: p.count as f64,
    })
}

/// An exponential histogram data point's buckets: bucket `i` holds observations in
/// (base^i, base^(i+1)], base = 2^(2^-scale). Negative observations (no latency or token count
/// is negative) are counted with the zero bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpBuckets {
    scale: i32,
    zero: u64,
    zero_threshold: f64,
    offset: i64,
    counts: Vec<u64>,
    sum: f64,
}

impl ExpBuckets {
    /// Check and take a data point's buckets. Errors name what is malformed.
    pub fn of(p: &ExponentialHistogramDataPoint) -> Result<ExpBuckets, String> {
        if !(-10..=20).contains(&p.scale) {
            return Err(format!("scale {} is outside -10..=20", p.scale));
        }
        if !p.zero_threshold.is_finite() || p.zero_threshold < 0.0 {
            return Err(format!(
                "zero_threshold {} is not a finite number >= 0",
                p.zero_threshold
            ));
        }
        let (offset, counts) = p
            .positive
            .as_ref()
            .map(|b| (b.offset, b.bucket_counts.as_slice()))
            .unwrap_or((0, &[]));
        if counts.len() as i64 > MAX_EXP_BUCKETS {
            return Err(format!(
                "{} positive buckets (at most {MAX_EXP_BUCKETS})",
                counts.len()
            ));
        }
        let negative = p.negative.as_ref().map(|b| {
            b.bucket_counts
                .iter()
                .fold(0u64, |a, c| a.saturating_add(*c))
        });
        let mut e = ExpBuckets {
            scale: p.scale,
            zero: p.zero_count.saturating_add(negative.unwrap_or(0)),
            zero_threshold: p.zero_threshold,
            offset: i64::from(offset),
            counts: counts.to_vec(),
            sum: p.sum.filter(|s| s.is_finite()).unwrap_or(0.0),
        };
        e.trim();
        if !e.counts.is_empty() {
            let (lower, upper) = (e.bound(e.offset), e.bound(e.end()));
            if lower <= 0.0 || !upper.is_finite() {
                return Err(format!(
                    "buckets {}..{} at scale {} fall outside the range of a double",
                    e.offset,
                    e.end(),
                    e.scale
                ));
            }
        }
        Ok(e)
    }

    /// Lower bound of bucket `index` (the upper bound of `index - 1`): 2^(index × 2^-scale).
    fn bound(&self, index: i64) -> f64 {
        (index as f64 * (-self.scale as f64).exp2()).exp2()
    }

    /// One past the last bucket's index.
    fn end(&self) -> i64 {
        self.offset + self.counts.len() as i64
    }

    /// Drop empty buckets at both ends.
    fn trim(&mut self) {
        let lead = self.counts.iter().take_while(|c| **c == 0).count();
        self.counts.drain(..lead);
        self.offset += lead as i64;
        while self.counts.last() == Some(&0) {
            self.counts.pop();
        }
    }

    /// The same observations at a coarser (or equal) scale: 2^(self.scale − scale) buckets merge
    /// into one.
    fn downscale(&self, scale: i32) -> ExpBuckets {
        let shift = (self.scale - scale).max(0) as u32;
        if shift == 0 {
            return self.clone();
        }
        if self.counts.is_empty() {
            return ExpBuckets {
                scale,
                ..self.clone()
            };
        }
        let offset = self.offset >> shift;
        let last = (self.end() - 1) >> shift;
        let mut counts = vec![0u64; (last - offset + 1) as usize];
        for (i, c) in self.counts.iter().enumerate() {
            let j = ((self.offset + i as i64) >> shift) - offset;
            counts[j as usize] = counts[j as usize].saturating_add(*c);
        }
        ExpBuckets {
            scale,
            offset,
            counts,
            ..self.clone()
        }
    }

    /// Observations since `earlier`, bucket by bucket (both brought to the coarser scale). None
    /// when a bucket went down (a reset) or the two readings span too many buckets together.
    fn delta_since(&self, earlier: &ExpBuckets) -> Option<ExpBuckets> {
        let scale = self.scale.min(earlier.scale);
        let (now, before) = (self.downscale(scale), earlier.downscale(scale));
        let zero = now.zero.checked_sub(before.zero)?;
        if before.counts.is_empty() {
            return Some(ExpBuckets {
                zero,
                sum: (now.sum - before.sum).max(0.0),
                ..now
            });
        }
        if now.counts.is_empty() {
            return None;
        }
        let (lo, hi) = (now.offset.min(before.offset), now.end().max(before.end()));
        if hi - lo > MAX_EXP_BUCKETS {
            return None;
        }
        let at = |e: &ExpBuckets, i: i64| {
            if i < e.offset || i >= e.end() {
                0
            } else {
                e.counts[(i - e.offset) as usize]
            }
        };
        let mut counts = Vec::with_capacity((hi - lo) as usize);
        for i in lo..hi {
            counts.push(at(&now, i).checked_sub(at(&before, i))?);
        }
        let mut d = ExpBuckets {
            scale,
            zero,
            zero_threshold: now.zero_threshold,
            offset: lo,
            counts,
            sum: (now.sum - before.sum).max(0.0),
        };
        d.trim();
        Some(d)
    }

    /// As a cumulative histogram ending in +Inf (the zero bucket first, then an empty bucket up
    /// to the first bound, so each exponential bucket keeps its own lower bound), values times
    /// `unit_scale`.
    pub fn to_cumulative(&self, unit_scale: f64) -> CumulativeHistogram {
        let mut bounds = Vec::with_capacity(self.counts.len() + 3);
        let mut cumulative = Vec::with_capacity(self.counts.len() + 3);
        let mut running = self.zero as f64;
        let first = (!self.counts.is_empty()).then(|| self.bound(self.offset) * unit_scale);
        let zero_bound = self.zero_threshold * unit_scale;
        if self.zero > 0 && first.is_none_or(|f| zero_bound < f) {
            bounds.push(zero_bound);
            cumulative.push(running);
        }
        if let Some(f) = first {
            bounds.push(f);
            cumulative.push(running);
        }
        for (i, c) in self.counts.iter().enumerate() {
            running += *c as f64;
            bounds.push(self.bound(self.offset + i as i64 + 1) * unit_scale);
            cumulative.push(running);
        }
        bounds.push(f64::INFINITY);
        cumulative.push(running);
        CumulativeHistogram {
            bounds,
            cumulative,
            sum: self.sum * unit_scale,
            count: running,
        }
    }
}

fn unit_scale(unit: &str) -> f64 {
    if unit == "ms" { 1e-3 } else { 1.0 }
}

impl MetricsMapper {
    pub fn new(max_series: usize) -> MetricsMapper {
        MetricsMapper {
            previous: HashMap::new(),
            max_series: max_series.max(1),
        }
    }

    /// Series whose last reading is remembered.
    pub fn series(&self) -> usize {
        self.previous.len()
    }

    pub fn map(&mut self, req: &ExportMetricsServiceRequest, now_unix_ms: i64) -> MetricsBatch {
        let mut out = MetricsBatch::default();
        for rm in &req.resource_metrics {
            let res = rm
                .resource
                .as_ref()
                .map(|r| r.attributes.as_slice())
                .unwrap_or(&[]);
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
                        Some(Data::ExponentialHistogram(e)) => {
                            let cumulative = e.aggregation_temporality != AggregationTemporality::Delta as i32;
                            for p in &e.data_points {
                                self.exponential_point(&m.name, &m.unit, cumulative, res, p, now_unix_ms, &mut out);
                            }
                        }
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
        let Some(signal) = gauge_signal(name) else {
            return;
        };
        for p in points {
            let value = match p.value {
                Some(number_data_point::Value::AsDouble(d)) => d,
                Some(number_data_point::Value::AsInt(i)) => i as f64,
                None => continue,
            };
            let o = owner(res, &p.attributes);
            out.points.push(point(
                &o,
                signal,
                value,
                stamp(p.time_unix_nano, now),
                BTreeMap::new(),
            ));
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
            Err(e) => {
                return out.reject(1, false, || {
                    format!("metric {name:?}: histogram point: {e}")
                });
            }
        };
        out.accepted += 1;
        let Some(kind) = histogram_kind(name) else {
            return;
        };
        let meta = PointMeta {
            attributes: &p.attributes,
            start_unix_nano: p.start_time_unix_nano,
            time_unix_nano: p.time_unix_nano,
        };
        let window = if cumulative {
            self.since_previous(name, res, &meta, Reading::Explicit(hist), unit_scale(unit))
        } else {
            Some((
                hist,
                p.time_unix_nano.saturating_sub(p.start_time_unix_nano),
            ))
        };
        if let Some((window, window_ns)) = window {
            emit(kind, name, res, &meta, &window, window_ns, now, out);
        }
    }

    /// An exponential histogram point: the same signals as an explicit one, its buckets brought
    /// to explicit bounds once the interval since the previous reading is known.
    #[allow(clippy::too_many_arguments)]
    fn exponential_point(
        &mut self,
        name: &str,
        unit: &str,
        cumulative: bool,
        res: &[KeyValue],
        p: &ExponentialHistogramDataPoint,
        now: i64,
        out: &mut MetricsBatch,
    ) {
        let buckets = match ExpBuckets::of(p) {
            Ok(b) => b,
            Err(e) => {
                return out.reject(1, false, || {
                    format!("metric {name:?}: exponential histogram point: {e}")
                });
            }
        };
        out.accepted += 1;
        let Some(kind) = histogram_kind(name) else {
            return;
        };
        let meta = PointMeta {
            attributes: &p.attributes,
            start_unix_nano: p.start_time_unix_nano,
            time_unix_nano: p.time_unix_nano,
        };
        let scale = unit_scale(unit);
        let window = if cumulative {
            self.since_previous(name, res, &meta, Reading::Exponential(buckets), scale)
        } else {
            Some((
                buckets.to_cumulative(scale),
                p.time_unix_nano.saturating_sub(p.start_time_unix_nano),
            ))
        };
        if let Some((window, window_ns)) = window {
            emit(kind, name, res, &meta, &window, window_ns, now, out);
        }
    }

    /// The interval a cumulative reading describes: since the series' previous reading of the
    /// same start, or since its start. None for a reading no newer than the one already used.
    /// The reading is remembered for the next one.
    fn since_previous(
        &mut self,
        name: &str,
        res: &[KeyValue],
        meta: &PointMeta<'_>,
        reading: Reading,
        unit_scale: f64,
    ) -> Option<(CumulativeHistogram, u64)> {
        let key = series_key(name, res, meta.attributes);
        let prev = self
            .previous
            .get(&key)
            .filter(|prev| prev.start_unix_nano == meta.start_unix_nano);
        let window = match prev {
            Some(prev) if meta.time_unix_nano > prev.time_unix_nano => (
                reading.window_since(Some(&prev.reading), unit_scale),
                meta.time_unix_nano - prev.time_unix_nano,
            ),
            Some(_) => return None,
            None => (
                reading.window_since(None, unit_scale),
                meta.time_unix_nano.saturating_sub(meta.start_unix_nano),
            ),
        };
        self.remember(
            key,
            Previous {
                reading,
                start_unix_nano: meta.start_unix_nano,
                time_unix_nano: meta.time_unix_nano,
            },
        );
        Some(window)
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

/// The signals of one histogram window: latency percentiles (and a request rate), or token rates.
#[allow(clippy::too_many_arguments)]
fn emit(
    kind: Kind,
    name: &str,
    res: &[KeyValue],
    meta: &PointMeta<'_>,
    window: &CumulativeHistogram,
    window_ns: u64,
    now: i64,
    out: &mut MetricsBatch,
) {
    let o = owner(res, meta.attributes);
    let ts = stamp(meta.time_unix_nano, now);
    let window_s = window_ns as f64 / 1e9;
    let observations = *window.cumulative.last().unwrap_or(&0.0);
    if observations <= 0.0 {
        return;
    }
    match kind {
        Kind::Latency { prefix, rate } => {
            for (qname, q) in QUANTILES {
                let Some(bq) = window.quantile(q) else {
                    continue;
                };
                let mut notes = BTreeMap::new();
                notes.insert(
                    "bucket_error_seconds".into(),
                    format!("{}", bq.max_abs_error()),
                );
                notes.insert(
                    "bucket".into(),
                    format!("{}..{}", bq.bucket_lower, bq.bucket_upper),
                );
                notes.insert("observations".into(), format!("{observations}"));
                notes.insert("window_seconds".into(), format!("{window_s:.3}"));
                notes.insert("metric".into(), name.to_string());
                out.points.push(point(
                    &o,
                    &names::latency_signal(prefix, qname),
                    bq.value,
                    ts,
                    notes,
                ));
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
            let token_type = meta
                .attributes
                .iter()
                .find(|kv| kv.key == "gen_ai.token.type")
                .and_then(value_of);
            let signal = match token_type.and_then(as_str).as_deref() {
                Some("input") => names::PROMPT_TOKENS_PER_SECOND,
                Some("output") => names::OUTPUT_TOKENS_PER_SECOND,
                _ => return,
            };
            if window_s > 0.0 {
                out.points.push(point(
                    &o,
                    signal,
                    window.sum / window_s,
                    ts,
                    BTreeMap::new(),
                ));
            }
        }
    }
}

fn stamp(time_unix_nano: u64, now_unix_ms: i64) -> i64 {
    if time_unix_nano == 0 {
        now_unix_ms
    } else {
        i64::try_from(time_unix_nano / 1_000_000).unwrap_or(now_unix_ms)
    }
}

fn point(
    o: &Owner,
    signal: &str,
    value: f64,
    ts: i64,
    notes: BTreeMap<String, String>,
) -> SignalPoint {
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
        ExponentialHistogram, Histogram, Metric, ResourceMetrics, ScopeMetrics, Summary,
        SummaryDataPoint, exponential_histogram_data_point::Buckets,
    };

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(Value::StringValue(v.into())),
            }),
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
            data: Some(Data::Histogram(Histogram {
                data_points: points,
                aggregation_temporality: temporality as i32,
            })),
            ..Default::default()
        };
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![metric],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn value(b: &MetricsBatch, signal: &str) -> Option<f64> {
        b.points
            .iter()
            .find(|p| p.signal == signal)
            .map(|p| p.value)
    }

    #[test]
    fn per_bucket_counts_become_cumulative_with_inf_last() {
        let h = to_cumulative(&hp(&[10, 50, 40, 0], 2, 40.0), "s").unwrap();
        assert_eq!(h.bounds, vec![0.1, 0.5, 1.0, f64::INFINITY]);
        assert_eq!(h.cumulative, vec![10.0, 60.0, 100.0, 100.0]);
        let ms = to_cumulative(&hp(&[1, 0, 0, 0], 2, 50.0), "ms").unwrap();
        assert_eq!(ms.bounds[0], 0.0001);
        assert!(
            to_cumulative(&hp(&[1, 2], 2, 0.0), "s")
                .unwrap_err()
                .contains("2 bucket counts for 3")
        );
    }

    #[test]
    fn cumulative_exports_give_percentiles_of_the_interval() {
        let mut m = MetricsMapper::default();
        let name = "gen_ai.server.time_to_first_token";
        let first = m.map(
            &req(
                name,
                AggregationTemporality::Cumulative,
                vec![hp(&[10, 50, 40, 0], 11_000_000_000, 40.0)],
            ),
            0,
        );
        let p50 = value(&first, "ttft_p50_seconds").unwrap();
        assert!((p50 - 0.42).abs() < 1e-9, "{p50}");
        assert_eq!(first.points[0].model_id, "m1");
        assert_eq!(first.points[0].source, "otlp");
        assert!(first.points[0].notes.contains_key("bucket_error_seconds"));
        // Next export: 100 more observations, all in the (0.5, 1] bucket.
        let second = m.map(
            &req(
                name,
                AggregationTemporality::Cumulative,
                vec![hp(&[10, 50, 140, 0], 21_000_000_000, 120.0)],
            ),
            0,
        );
        let p50 = value(&second, "ttft_p50_seconds").unwrap();
        assert!((p50 - 0.75).abs() < 1e-9, "{p50}");
        // Same reading again: nothing new.
        let again = m.map(
            &req(
                name,
                AggregationTemporality::Cumulative,
                vec![hp(&[10, 50, 140, 0], 21_000_000_000, 120.0)],
            ),
            0,
        );
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
        let b = m.map(
            &req(
                "gen_ai.client.token.usage",
                AggregationTemporality::Delta,
                vec![usage],
            ),
            0,
        );
        assert_eq!(value(&b, "output_tokens_per_second"), Some(500.0));
        let bad = m.map(
            &req(
                "gen_ai.server.time_to_first_token",
                AggregationTemporality::Delta,
                vec![hp(&[1], 2, 0.0)],
            ),
            0,
        );
        assert_eq!((bad.accepted, bad.rejected), (0, 1));
        let summary = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "x".into(),
                        data: Some(Data::Summary(Summary {
                            data_points: vec![SummaryDataPoint::default(); 2],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let b = m.map(&summary, 0);
        assert_eq!(b.rejected, 2);
        assert!(
            b.first_error
                .unwrap()
                .contains("summary points are not supported")
        );
    }

    fn ep(
        scale: i32,
        offset: i32,
        counts: &[u64],
        zero: u64,
        t: u64,
    ) -> ExponentialHistogramDataPoint {
        ExponentialHistogramDataPoint {
            attributes: vec![kv("gen_ai.request.model", "m1")],
            start_time_unix_nano: 1_000_000_000,
            time_unix_nano: t,
            count: counts.iter().sum::<u64>() + zero,
            sum: Some(1.0),
            scale,
            zero_count: zero,
            positive: Some(Buckets {
                offset,
                bucket_counts: counts.to_vec(),
            }),
            ..Default::default()
        }
    }

    fn exp_req(
        name: &str,
        unit: &str,
        temporality: AggregationTemporality,
        points: Vec<ExponentialHistogramDataPoint>,
    ) -> ExportMetricsServiceRequest {
        let metric = Metric {
            name: name.into(),
            unit: unit.into(),
            data: Some(Data::ExponentialHistogram(ExponentialHistogram {
                data_points: points,
                aggregation_temporality: temporality as i32,
            })),
            ..Default::default()
        };
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![metric],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn exponential_buckets_become_explicit_bounds() {
        // Scale 0: base 2; bucket -3 is (1/8, 1/4], -2 is (1/4, 1/2]. Empty end buckets dropped.
        let mut p = ep(0, -4, &[0, 10, 30, 0], 2, 2);
        p.negative = Some(Buckets {
            offset: 0,
            bucket_counts: vec![1],
        });
        let e = ExpBuckets::of(&p).unwrap();
        let h = e.to_cumulative(1.0);
        assert_eq!(h.bounds, vec![0.0, 0.125, 0.25, 0.5, f64::INFINITY]);
        assert_eq!(h.cumulative, vec![3.0, 3.0, 13.0, 43.0, 43.0]);
        assert_eq!(h.count, 43.0);
        let ms = e.to_cumulative(1e-3);
        assert_eq!(ms.bounds[2], 0.00025);
        // Without a zero bucket the first bound is the first bucket's lower bound.
        let h = ExpBuckets::of(&ep(1, 2, &[5], 0, 2))
            .unwrap()
            .to_cumulative(1.0);
        assert_eq!(h.bounds.len(), 3);
        assert!(
            (h.bounds[0] - 2.0).abs() < 1e-12 && (h.bounds[1] - 2f64.powf(1.5)).abs() < 1e-12,
            "{h:?}"
        );
        assert_eq!(h.cumulative, vec![0.0, 5.0, 5.0]);
        // Malformed points are refused with the reason.
        assert!(
            ExpBuckets::of(&ep(21, 0, &[1], 0, 2))
                .unwrap_err()
                .contains("scale 21")
        );
        assert!(
            ExpBuckets::of(&ep(20, i32::MAX - 2, &[1], 0, 2))
                .unwrap_err()
                .contains("outside the range")
        );
        let mut neg = ep(0, 0, &[1], 0, 2);
        neg.zero_threshold = -1.0;
        assert!(ExpBuckets::of(&neg).unwrap_err().contains("zero_threshold"));
    }

    #[test]
    fn client_chunk_metrics_as_exponential_histograms_give_ttft_and_itl() {
        let mut m = MetricsMapper::default();
        let b = m.map(
            &exp_req(
                "gen_ai.client.operation.time_to_first_chunk",
                "s",
                AggregationTemporality::Delta,
                vec![ep(0, -4, &[0, 10, 30, 0], 2, 11_000_000_000)],
            ),
            0,
        );
        assert_eq!((b.accepted, b.rejected), (1, 0));
        // Rank 21 of 42: 9 of the 30 in (0.25, 0.5].
        let p50 = value(&b, "ttft_p50_seconds").unwrap();
        assert!((p50 - 0.325).abs() < 1e-9, "{p50}");
        let note = &b
            .points
            .iter()
            .find(|p| p.signal == "ttft_p50_seconds")
            .unwrap()
            .notes;
        assert_eq!(
            note["metric"],
            "gen_ai.client.operation.time_to_first_chunk"
        );
        assert_eq!(b.points[0].model_id, "m1");
        assert!(value(&b, "requests_per_second").is_none());

        // Cumulative, and the SDK halved the scale between exports: the first reading is
        // brought to the coarser scale before it is subtracted.
        let name = "gen_ai.client.operation.time_per_output_chunk";
        let first = m.map(
            &exp_req(
                name,
                "ms",
                AggregationTemporality::Cumulative,
                vec![ep(1, 0, &[4, 6], 0, 11_000_000_000)],
            ),
            0,
        );
        assert!(value(&first, "itl_p50_seconds").unwrap() <= 0.002);
        // Scale 0: (1, 2] ms now holds the 10 earlier ones, (2, 4] ms 20 new ones.
        let second = m.map(
            &exp_req(
                name,
                "ms",
                AggregationTemporality::Cumulative,
                vec![ep(0, 0, &[10, 20], 0, 21_000_000_000)],
            ),
            0,
        );
        let p50 = value(&second, "itl_p50_seconds").unwrap();
        assert!((p50 - 0.003).abs() < 1e-12, "{p50}");
        assert_eq!(second.points[0].notes["window_seconds"], "10.000");
        assert_eq!(m.series(), 1);
        // A bucket went down: a reset, the reading alone is the window.
        let reset = m.map(
            &exp_req(
                name,
                "ms",
                AggregationTemporality::Cumulative,
                vec![ep(0, 0, &[1, 0], 0, 31_000_000_000)],
            ),
            0,
        );
        assert!(value(&reset, "itl_p50_seconds").unwrap() <= 0.002);
    }

    #[test]
    fn exponential_token_usage_gives_token_rates_and_bad_points_are_counted() {
        let mut m = MetricsMapper::default();
        let mut usage = ep(0, 6, &[3], 0, 3_000_000_000);
        usage.sum = Some(300.0);
        usage.attributes.push(kv("gen_ai.token.type", "input"));
        let mut bad = ep(-11, 0, &[1], 0, 3_000_000_000);
        bad.attributes.push(kv("gen_ai.token.type", "input"));
        let b = m.map(
            &exp_req(
                "gen_ai.client.token.usage",
                "{token}",
                AggregationTemporality::Delta,
                vec![usage, bad],
            ),
            0,
        );
        assert_eq!(value(&b, "prompt_tokens_per_second"), Some(150.0));
        assert_eq!((b.accepted, b.rejected, b.unsupported), (1, 1, 0));
        assert!(
            b.first_error
                .unwrap()
                .contains("exponential histogram point: scale -11")
        );
    }

    #[test]
    fn openai_v2_duration_and_token_usage_go_under_the_requested_model() {
        // What opentelemetry-instrumentation-openai-v2 2.4b0 (with opentelemetry-util-genai
        // 1.1b0) exports: cumulative explicit histograms on util-genai's bounds, each point
        // naming the requested and the responding model; 10 calls, 5 of 0.1–0.16 s, 5 of
        // 0.16–0.32 s, 12 prompt and 60 output tokens.
        let bounds = vec![0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64];
        let attrs = |token_type: Option<&str>| {
            let mut a = vec![
                kv("gen_ai.operation.name", "chat"),
                kv("gen_ai.request.model", "meta-llama/Llama-3.1-8B-Instruct"),
                kv("gen_ai.provider.name", "openai"),
                kv("gen_ai.response.model", "Llama-3.1-8B-Instruct"),
            ];
            a.extend(token_type.map(|t| kv("gen_ai.token.type", t)));
            a
        };
        let point =
            |counts: Vec<u64>, sum: f64, token_type: Option<&str>, b: &[f64]| HistogramDataPoint {
                attributes: attrs(token_type),
                start_time_unix_nano: 1_000_000_000,
                time_unix_nano: 11_000_000_000,
                count: counts.iter().sum(),
                sum: Some(sum),
                bucket_counts: counts,
                explicit_bounds: b.to_vec(),
                ..Default::default()
            };
        let token_bounds = [1.0, 4.0, 16.0, 64.0];
        let mut r = req(
            "gen_ai.client.operation.duration",
            AggregationTemporality::Cumulative,
            vec![point(vec![0, 0, 0, 0, 5, 5, 0, 0], 2.0, None, &bounds)],
        );
        let usage = Metric {
            name: "gen_ai.client.token.usage".into(),
            unit: "{token}".into(),
            data: Some(Data::Histogram(Histogram {
                data_points: vec![
                    point(vec![0, 0, 10, 0, 0], 120.0, Some("input"), &token_bounds),
                    point(vec![0, 0, 10, 0, 0], 60.0, Some("output"), &token_bounds),
                ],
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
            })),
            ..Default::default()
        };
        r.resource_metrics[0].scope_metrics[0].metrics.push(usage);
        let b = MetricsMapper::default().map(&r, 0);
        assert_eq!(b.rejected, 0, "{:?}", b.first_error);
        assert!(!b.points.is_empty());
        assert!(
            b.points
                .iter()
                .all(|p| p.model_id == "meta-llama/Llama-3.1-8B-Instruct" && p.runtime == "openai"),
            "{:?}",
            b.points
        );
        // The median call lies in (0.08, 0.16]: its top, rank 5 of the 5 there.
        let p50 = b
            .points
            .iter()
            .find(|p| p.signal == "e2e_p50_seconds")
            .unwrap();
        assert!((p50.value - 0.16).abs() < 1e-9, "{p50:?}");
        assert_eq!(p50.notes["metric"], "gen_ai.client.operation.duration");
        assert_eq!(p50.notes["observations"], "10");
        // 10 calls, 120 prompt and 60 output tokens over the 10 s since the series' start.
        assert_eq!(value(&b, "requests_per_second"), Some(1.0));
        assert_eq!(value(&b, "prompt_tokens_per_second"), Some(12.0));
        assert_eq!(value(&b, "output_tokens_per_second"), Some(6.0));
        // A point naming only the response's model goes under that one.
        let mut only = req(
            "gen_ai.client.operation.duration",
            AggregationTemporality::Cumulative,
            vec![point(vec![0, 0, 0, 0, 5, 5, 0, 0], 2.0, None, &bounds)],
        );
        if let Some(Data::Histogram(h)) =
            &mut only.resource_metrics[0].scope_metrics[0].metrics[0].data
        {
            h.data_points[0]
                .attributes
                .retain(|kv| kv.key != "gen_ai.request.model");
        }
        let b = MetricsMapper::default().map(&only, 0);
        assert!(
            b.points
                .iter()
                .all(|p| p.model_id == "Llama-3.1-8B-Instruct")
        );
    }
}
