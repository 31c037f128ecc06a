// The fleet timeline: every 5 s, each model's latency percentiles, rates, error ratio (trailing
// minute) and latest KV-cache / queue / GPU-memory signals, kept an hour in memory for the UI and `top`.
// Latency, rates and errors come from the proxy/OTLP records, or — for a model no record holds —
// from the runtime's own scraped histograms and counters (`FigureSource::Runtime`). The phases
// inside the runtime come from its histograms whoever else sees the model: prefill and decode
// time always (no record measures them), queue time where no record carries one (the proxy has
// it only from an upstream's `x-queue-time` header).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use tokenwatch_core::aggregate::Aggregator;
use tokenwatch_core::model::{ContextBucket, GroupLabel, LatencyMetric};
use tokenwatch_core::runtime_latency::RuntimeQuery;
use tokenwatch_core::signals::{SignalBoard, names};
use tokenwatch_core::sketch::LatencySketch;
use tokenwatch_core::window::Window;

/// One timeline point every `STEP_MS`.
pub const STEP_MS: i64 = 5_000;
/// Points kept per model: one hour.
pub const KEEP_POINTS: usize = 720;
/// Models tracked at most; further models are counted in `Timeline::skipped_models`.
pub const MAX_MODELS: usize = 500;
/// A signal older than this is not sampled onto the timeline (its source went quiet).
const SIGNAL_FRESH_MS: i64 = 30_000;

/// The values of one model at one moment; the index is `Column as usize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Column {
    TtftP50,
    TtftP90,
    TtftP99,
    ItlP50,
    ItlP90,
    ItlP99,
    E2eP50,
    E2eP90,
    E2eP99,
    RequestsPerS,
    PromptTokensPerS,
    OutputTokensPerS,
    ErrorRatio,
    KvCacheUsage,
    RequestsWaiting,
    RequestsRunning,
    GpuMemoryUsedBytes,
    GpuMemoryTotalBytes,
    QueueP50,
    QueueP90,
    QueueP99,
    PrefillP50,
    PrefillP90,
    PrefillP99,
    DecodeP50,
    DecodeP90,
    DecodeP99,
}

const COLUMNS: usize = 27;

impl Column {
    pub const ALL: [Column; COLUMNS] = [
        Column::TtftP50,
        Column::TtftP90,
        Column::TtftP99,
        Column::ItlP50,
        Column::ItlP90,
        Column::ItlP99,
        Column::E2eP50,
        Column::E2eP90,
        Column::E2eP99,
        Column::RequestsPerS,
        Column::PromptTokensPerS,
        Column::OutputTokensPerS,
        Column::ErrorRatio,
        Column::KvCacheUsage,
        Column::RequestsWaiting,
        Column::RequestsRunning,
        Column::GpuMemoryUsedBytes,
        Column::GpuMemoryTotalBytes,
        Column::QueueP50,
        Column::QueueP90,
        Column::QueueP99,
        Column::PrefillP50,
        Column::PrefillP90,
        Column::PrefillP99,
        Column::DecodeP50,
        Column::DecodeP90,
        Column::DecodeP99,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Column::TtftP50 => "ttft_p50_s",
            Column::TtftP90 => "ttft_p90_s",
            Column::TtftP99 => "ttft_p99_s",
            Column::ItlP50 => "itl_p50_s",
            Column::ItlP90 => "itl_p90_s",
            Column::ItlP99 => "itl_p99_s",
            Column::E2eP50 => "e2e_p50_s",
            Column::E2eP90 => "e2e_p90_s",
            Column::E2eP99 => "e2e_p99_s",
            Column::RequestsPerS => "requests_per_s",
            Column::PromptTokensPerS => "prompt_tokens_per_s",
            Column::OutputTokensPerS => "output_tokens_per_s",
            Column::ErrorRatio => "error_ratio",
            Column::KvCacheUsage => "kv_cache_usage",
            Column::RequestsWaiting => "requests_waiting",
            Column::RequestsRunning => "requests_running",
            Column::GpuMemoryUsedBytes => "gpu_memory_used_bytes",
            Column::GpuMemoryTotalBytes => "gpu_memory_total_bytes",
            Column::QueueP50 => "queue_p50_s",
            Column::QueueP90 => "queue_p90_s",
            Column::QueueP99 => "queue_p99_s",
            Column::PrefillP50 => "prefill_p50_s",
            Column::PrefillP90 => "prefill_p90_s",
            Column::PrefillP99 => "prefill_p99_s",
            Column::DecodeP50 => "decode_p50_s",
            Column::DecodeP90 => "decode_p90_s",
            Column::DecodeP99 => "decode_p99_s",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Column::RequestsPerS => "requests/s",
            Column::PromptTokensPerS | Column::OutputTokensPerS => "tokens/s",
            Column::ErrorRatio | Column::KvCacheUsage => "ratio",
            Column::RequestsWaiting | Column::RequestsRunning => "requests",
            Column::GpuMemoryUsedBytes | Column::GpuMemoryTotalBytes => "bytes",
            _ => "seconds",
        }
    }

    fn latency(metric: LatencyMetric) -> [Column; 3] {
        match metric {
            LatencyMetric::Ttft => [Column::TtftP50, Column::TtftP90, Column::TtftP99],
            LatencyMetric::Itl => [Column::ItlP50, Column::ItlP90, Column::ItlP99],
            LatencyMetric::E2e => [Column::E2eP50, Column::E2eP90, Column::E2eP99],
            LatencyMetric::Queue => [Column::QueueP50, Column::QueueP90, Column::QueueP99],
        }
    }
}

/// The phases inside the runtime its histograms time (`sources::scrape` tables): the signal and
/// its P50/P90/P99 columns. Prefill and decode come from no record; queue time from the records
/// where they carry it (`RequestRecord::queue_s`).
const RUNTIME_PHASES: [(&str, [Column; 3]); 3] = [
    (
        "queue",
        [Column::QueueP50, Column::QueueP90, Column::QueueP99],
    ),
    (
        "prefill",
        [Column::PrefillP50, Column::PrefillP90, Column::PrefillP99],
    ),
    (
        "decode",
        [Column::DecodeP50, Column::DecodeP90, Column::DecodeP99],
    ),
];

/// Where a model's latency, rate and error figures come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FigureSource {
    /// No figure (no record, no scraped counts in the window).
    #[default]
    None,
    /// Request records: the proxy's, or OTLP spans'.
    Proxy,
    /// The serving runtime's own histograms and counters, scraped (bucket error stated).
    Runtime,
}

impl FigureSource {
    pub fn name(self) -> Option<&'static str> {
        match self {
            FigureSource::None => None,
            FigureSource::Proxy => Some("proxy"),
            FigureSource::Runtime => Some("runtime"),
        }
    }
}

/// The columns that come from records or, failing them, from the runtime: the latency
/// percentiles, rates and error ratio (the first 13 of `Column::ALL`).
pub const FIGURE_COLUMNS: &[Column] = Column::ALL.split_at(13).0;

/// A context bucket and the latency metric (TTFT or E2E) whose P99 the timeline keeps for it.
pub type BucketKey = (ContextBucket, LatencyMetric);

/// A model's values at one moment, plus TTFT / E2E P99 per context bucket.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelSample {
    pub values: [Option<f64>; COLUMNS],
    pub by_bucket: BTreeMap<BucketKey, f64>,
    pub runtimes: BTreeSet<String>,
    pub instances: BTreeSet<String>,
    /// Where the `FIGURE_COLUMNS` values come from.
    pub figure_source: FigureSource,
    /// For runtime latency columns: the bucket (lower, upper; +Inf unbounded) the value lies in.
    pub bucket_bounds: BTreeMap<Column, (f64, f64)>,
    /// Where the figures come from records (the proxy's, client-felt) and the runtime reports
    /// the same model too: its own latency percentiles beside them, (value, bucket lower,
    /// bucket upper) per latency column.
    pub runtime_view: BTreeMap<Column, (f64, f64, f64)>,
}

impl ModelSample {
    pub fn get(&self, c: Column) -> Option<f64> {
        self.values[c as usize]
    }

    fn set(&mut self, c: Column, v: Option<f64>) {
        self.values[c as usize] = v.filter(|v| v.is_finite());
    }
}

/// Every model's sample now: latency and counts over `window` from the aggregator, the latest
/// fresh signals from the board. One pass over the aggregator per metric.
pub fn sample_fleet(
    agg: &Aggregator,
    board: &SignalBoard,
    window: Window,
    now_ms: i64,
) -> BTreeMap<String, ModelSample> {
    let mut out: BTreeMap<String, ModelSample> = BTreeMap::new();
    for metric in [LatencyMetric::Ttft, LatencyMetric::Itl, LatencyMetric::E2e] {
        let mut per_model: BTreeMap<String, LatencySketch> = BTreeMap::new();
        for ((model, bucket), sketch) in agg.sketches_by_model_and_bucket(metric, window, now_ms) {
            let sample = out.entry(model.clone()).or_default();
            if let Some(p99) = sketch
                .quantile(0.99)
                .filter(|_| metric != LatencyMetric::Itl)
            {
                sample.by_bucket.insert((bucket, metric), p99);
            }
            per_model.entry(model).or_default().merge(&sketch);
        }
        for (model, sketch) in per_model {
            let sample = out.entry(model).or_default();
            for (col, q) in Column::latency(metric).into_iter().zip([0.5, 0.9, 0.99]) {
                sample.set(col, sketch.quantile(q));
            }
        }
    }
    // Queue time where the records carry it (the upstream's `x-queue-time` header).
    let mut queue: BTreeMap<String, LatencySketch> = BTreeMap::new();
    for ((model, _), sketch) in
        agg.sketches_by_model_and_bucket(LatencyMetric::Queue, window, now_ms)
    {
        queue.entry(model).or_default().merge(&sketch);
    }
    for (model, sketch) in queue {
        let sample = out.entry(model).or_default();
        for (col, q) in Column::latency(LatencyMetric::Queue)
            .into_iter()
            .zip([0.5, 0.9, 0.99])
        {
            sample.set(col, sketch.quantile(q));
        }
    }
    for g in agg.counts(None, window, Some(GroupLabel::ModelId), now_ms) {
        let Some(model) = g.labels.get(GroupLabel::ModelId.name()) else {
            continue;
        };
        let sample = out.entry(model.clone()).or_default();
        let c = g.counts;
        sample.set(Column::RequestsPerS, Some(g.per_second(c.requests)));
        sample.set(
            Column::PromptTokensPerS,
            Some(g.per_second(c.prompt_tokens)),
        );
        sample.set(
            Column::OutputTokensPerS,
            Some(g.per_second(c.output_tokens)),
        );
        let ratio = (c.requests > 0).then(|| c.errors as f64 / c.requests as f64);
        sample.set(Column::ErrorRatio, ratio);
    }
    for sample in out.values_mut() {
        if FIGURE_COLUMNS.iter().any(|c| sample.get(*c).is_some()) {
            sample.figure_source = FigureSource::Proxy;
        }
    }
    sample_runtime(board, window, now_ms, &mut out);
    for (model, runtimes, instances) in agg.label_values_by_model() {
        let sample = out.entry(model).or_default();
        sample.runtimes.extend(runtimes);
        sample.instances.extend(instances);
    }
    sample_signals(board, now_ms, &mut out);
    out
}

/// For every model with scraped counts in the window and no figure from records: latency
/// percentiles (with their bucket bounds), rates and error ratio from the runtime windows.
fn sample_runtime(
    board: &SignalBoard,
    window: Window,
    now_ms: i64,
    out: &mut BTreeMap<String, ModelSample>,
) {
    let windows = board.runtime_windows();
    let window_ms = window.duration_ms();
    for model in windows.models(window_ms, now_ms) {
        let sample = out.entry(model.clone()).or_default();
        // Seen by the proxy too: the runtime's percentiles go beside the client-felt ones.
        let beside = sample.figure_source == FigureSource::Proxy;
        for metric in [LatencyMetric::Ttft, LatencyMetric::Itl, LatencyMetric::E2e] {
            let answer = windows.latency(
                &RuntimeQuery {
                    model: Some(&model),
                    signal: super::latency::runtime_signal(metric),
                    window_ms,
                    by: None,
                },
                now_ms,
            );
            for (col, name) in Column::latency(metric)
                .into_iter()
                .zip(["p50", "p90", "p99"])
            {
                let Some(q) = answer.total.quantile(name) else {
                    continue;
                };
                if beside {
                    if q.value.is_finite() {
                        sample
                            .runtime_view
                            .insert(col, (q.value, q.bucket_lower, q.bucket_upper));
                    }
                } else {
                    sample.set(col, Some(q.value));
                    sample
                        .bucket_bounds
                        .insert(col, (q.bucket_lower, q.bucket_upper));
                }
            }
            sample.runtimes.extend(answer.total.runtimes);
            sample.instances.extend(answer.total.instances);
        }
        // The phases inside the runtime, whoever else sees the model; queue time only where no
        // record carries one.
        for (signal, cols) in RUNTIME_PHASES {
            if cols.iter().any(|c| sample.get(*c).is_some()) {
                continue;
            }
            let answer = windows.latency(
                &RuntimeQuery {
                    model: Some(&model),
                    signal,
                    window_ms,
                    by: None,
                },
                now_ms,
            );
            for (col, name) in cols.into_iter().zip(["p50", "p90", "p99"]) {
                if let Some(q) = answer.total.quantile(name) {
                    sample.set(col, Some(q.value));
                    sample
                        .bucket_bounds
                        .insert(col, (q.bucket_lower, q.bucket_upper));
                }
            }
        }
        if beside {
            continue;
        }
        if let Some(r) = windows.rates(&model, window_ms, now_ms) {
            sample.set(Column::RequestsPerS, r.requests_per_s);
            sample.set(Column::PromptTokensPerS, r.prompt_tokens_per_s);
            sample.set(Column::OutputTokensPerS, r.output_tokens_per_s);
            sample.set(Column::ErrorRatio, r.error_ratio);
        }
        if FIGURE_COLUMNS.iter().any(|c| sample.get(*c).is_some()) {
            sample.figure_source = FigureSource::Runtime;
        }
    }
}

/// Latest fresh signal values per model: KV cache as the fullest instance, queues summed over
/// instances, GPU memory summed over the model's devices.
fn sample_signals(board: &SignalBoard, now_ms: i64, out: &mut BTreeMap<String, ModelSample>) {
    let mut acc: BTreeMap<String, [Option<f64>; 5]> = BTreeMap::new();
    for p in board.latest(None) {
        if p.model_id.is_empty() || now_ms - p.timestamp_unix_ms > SIGNAL_FRESH_MS {
            continue;
        }
        let (slot, max) = match p.signal.as_str() {
            names::KV_CACHE_USAGE => (0, true),
            names::REQUESTS_WAITING => (1, false),
            names::REQUESTS_RUNNING => (2, false),
            names::GPU_MEMORY_USED_BYTES if !p.device_id.is_empty() => (3, false),
            names::GPU_MEMORY_TOTAL_BYTES if !p.device_id.is_empty() => (4, false),
            _ => continue,
        };
        let v = &mut acc.entry(p.model_id.clone()).or_default()[slot];
        *v = Some(match *v {
            None => p.value,
            Some(old) if max => old.max(p.value),
            Some(old) => old + p.value,
        });
        if !p.runtime.is_empty() || !p.instance.is_empty() {
            let sample = out.entry(p.model_id.clone()).or_default();
            if !p.runtime.is_empty() {
                sample.runtimes.insert(p.runtime.clone());
            }
            if !p.instance.is_empty() {
                sample.instances.insert(p.instance.clone());
            }
        }
    }
    let cols = [
        Column::KvCacheUsage,
        Column::RequestsWaiting,
        Column::RequestsRunning,
        Column::GpuMemoryUsedBytes,
        Column::GpuMemoryTotalBytes,
        Column::QueueP50,
        Column::QueueP90,
        Column::QueueP99,
        Column::PrefillP50,
        Column::PrefillP90,
        Column::PrefillP99,
        Column::DecodeP50,
        Column::DecodeP90,
        Column::DecodeP99,
    ];
    for (model, vals) in acc {
        let sample = out.entry(model).or_default();
        for (c, v) in cols.into_iter().zip(vals) {
            sample.set(c, v);
        }
    }
}

/// One model's line: aligned columns, `NaN` where there was no value.
#[derive(Debug, Default)]
struct ModelLine {
    t_ms: VecDeque<i64>,
    cols: Vec<VecDeque<f32>>,
    buckets: BTreeMap<BucketKey, VecDeque<f32>>,
    last_data_ms: i64,
}

impl ModelLine {
    fn push(&mut self, at_ms: i64, s: Option<&ModelSample>) {
        if self.cols.is_empty() {
            self.cols = vec![VecDeque::new(); COLUMNS];
        }
        if self.t_ms.len() == KEEP_POINTS {
            self.t_ms.pop_front();
            for c in self.cols.iter_mut().chain(self.buckets.values_mut()) {
                c.pop_front();
            }
        }
        let len = self.t_ms.len();
        self.t_ms.push_back(at_ms);
        for (i, col) in self.cols.iter_mut().enumerate() {
            col.push_back(s.and_then(|s| s.values[i]).map_or(f32::NAN, |v| v as f32));
        }
        if let Some(s) = s {
            for key in s.by_bucket.keys() {
                self.buckets
                    .entry(*key)
                    .or_insert_with(|| std::iter::repeat_n(f32::NAN, len).collect());
            }
            if s.values.iter().any(Option::is_some) {
                self.last_data_ms = at_ms;
            }
        }
        for (key, col) in &mut self.buckets {
            col.push_back(
                s.and_then(|s| s.by_bucket.get(key))
                    .map_or(f32::NAN, |v| *v as f32),
            );
        }
        self.buckets.retain(|_, c| c.iter().any(|v| !v.is_nan()));
    }
}

/// A slice of one model's line, ready for JSON (`None` for missing values).
#[derive(Debug, Clone, PartialEq)]
pub struct LineView {
    pub t_ms: Vec<i64>,
    pub columns: Vec<(Column, Vec<Option<f64>>)>,
    pub buckets: Vec<(BucketKey, Vec<Option<f64>>)>,
}

fn opt(v: f32) -> Option<f64> {
    (!v.is_nan()).then_some(f64::from(v))
}

/// Every model's line; written by the sampler task, read by the API.
#[derive(Debug, Default)]
pub struct Timeline {
    models: BTreeMap<String, ModelLine>,
    skipped_models: u64,
}

impl Timeline {
    /// Append one point for every tracked model (and new ones in `samples`); models without
    /// data for a whole hour are dropped.
    pub fn record(&mut self, at_ms: i64, samples: &BTreeMap<String, ModelSample>) {
        for model in samples.keys() {
            if !self.models.contains_key(model) {
                if self.models.len() >= MAX_MODELS {
                    self.skipped_models += 1;
                    continue;
                }
                self.models.insert(model.clone(), ModelLine::default());
            }
        }
        for (model, line) in &mut self.models {
            line.push(at_ms, samples.get(model));
        }
        let horizon = at_ms - STEP_MS * KEEP_POINTS as i64;
        self.models.retain(|_, l| l.last_data_ms > horizon);
    }

    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    /// Model appearances refused because `MAX_MODELS` were tracked.
    pub fn skipped_models(&self) -> u64 {
        self.skipped_models
    }

    /// The points of `model` at or after `since_ms`, or `None` for an unknown model.
    pub fn view(&self, model: &str, since_ms: i64, columns: &[Column]) -> Option<LineView> {
        let line = self.models.get(model)?;
        let start = line.t_ms.partition_point(|t| *t < since_ms);
        let slice = |c: &VecDeque<f32>| c.iter().skip(start).map(|v| opt(*v)).collect::<Vec<_>>();
        Some(LineView {
            t_ms: line.t_ms.iter().skip(start).copied().collect(),
            columns: columns
                .iter()
                .map(|c| (*c, slice(&line.cols[*c as usize])))
                .collect(),
            buckets: line
                .buckets
                .iter()
                .map(|(k, c)| (*k, slice(c)))
                .filter(|(_, v)| v.iter().any(Option::is_some))
                .collect(),
        })
    }
}

/// Sample the fleet every `STEP_MS` (on multiples of it) into `timeline` until shutdown.
pub fn spawn_sampler(
    aggregator: std::sync::Arc<std::sync::Mutex<Aggregator>>,
    signals: tokenwatch_core::signals::SharedSignals,
    timeline: std::sync::Arc<std::sync::RwLock<Timeline>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let now = tokenwatch_core::clock::now_unix_ms();
            let next = (now.div_euclid(STEP_MS) + 1) * STEP_MS;
            let wait = std::time::Duration::from_millis(u64::try_from(next - now).unwrap_or(0));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let samples = {
                let agg = aggregator.lock().unwrap_or_else(|p| p.into_inner());
                let board = signals.read().unwrap_or_else(|p| p.into_inner());
                sample_fleet(&agg, &board, Window::M1, next)
            };
            timeline
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .record(next, &samples);
        }
    })
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
