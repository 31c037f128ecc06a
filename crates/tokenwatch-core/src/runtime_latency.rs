// Runtime latency windows: per (model, instance), what the scrapes of each minute of the last
// hour added to the runtime's own histograms (TTFT, ITL, e2e, queue, …) and request / token /
// error counters, answering percentiles — each with the bucket it lies in, the only error bound
// a histogram gives — and rates over 1m/5m/1h, merged across instances or per instance.
// Also answers any span of whole minutes (before/after a marker) and keeps, per line, the running
// totals since it was first scraped, which `/metrics` re-exports as histograms and counters.
// Fed with the scrape's `ScrapeCounts` (deltas, resets already handled) by `SignalBoard`.

use crate::counts::ScrapeCounts;
use crate::histogram::{BucketQuantile, CumulativeHistogram};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One slot per minute (wall clock, aligned on the minute).
pub const MINUTE_MS: i64 = 60_000;
/// Minutes kept per (model, instance): one hour.
pub const KEEP_MINUTES: i64 = 60;
/// The percentiles every answer has, by name.
pub const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99)];
/// (model, instance) lines kept at most; further ones are refused (counted in `refused`). A line
/// of vLLM's full histogram set is about 4 KB a minute, 240 KB for the hour: 2048 lines ≈ 500 MB
/// at most, a hundred replicas ≈ 24 MB.
const DEFAULT_MAX_LINES: usize = 2048;

/// What the scrapes of one (model, instance) added during one minute.
#[derive(Debug, Clone, Default, PartialEq)]
struct MinuteCounts {
    start_ms: i64,
    /// Scrape intervals ending in this minute, summed: the time its counts cover.
    covered_ms: i64,
    finished: Option<f64>,
    failed: Option<f64>,
    prompt_tokens: Option<f64>,
    output_tokens: Option<f64>,
    histograms: BTreeMap<String, CumulativeHistogram>,
}

impl MinuteCounts {
    fn add(&mut self, c: &ScrapeCounts) {
        self.covered_ms += c.interval_ms.max(0);
        add_to(&mut self.finished, c.finished);
        add_to(&mut self.failed, c.failed);
        add_to(&mut self.prompt_tokens, c.prompt_tokens);
        add_to(&mut self.output_tokens, c.output_tokens);
        for (signal, h) in &c.latency {
            match self.histograms.get_mut(signal) {
                // A bucket layout that changed within the minute (a runtime upgrade): the new
                // layout's observations are kept, the minute's earlier ones of that signal dropped.
                Some(kept) => {
                    if !kept.add(h) {
                        *kept = h.clone();
                    }
                }
                None => {
                    self.histograms.insert(signal.clone(), h.clone());
                }
            }
        }
    }

    /// Requests finished in the minute: the finished counter, else one TTFT observation each.
    fn requests(&self) -> Option<f64> {
        self.finished
            .or_else(|| self.histograms.get("ttft").map(|h| h.count))
    }
}

fn add_to(total: &mut Option<f64>, v: Option<f64>) {
    if let Some(v) = v.filter(|v| v.is_finite()) {
        *total = Some(total.unwrap_or(0.0) + v);
    }
}

#[derive(Debug, Default)]
struct InstanceLine {
    runtime: String,
    /// Oldest first, one per minute that had a scrape.
    minutes: VecDeque<MinuteCounts>,
    /// Everything counted since the line was first scraped (a bucket layout change starts the
    /// signal's histogram afresh, as a runtime restart would).
    total: MinuteCounts,
}

/// The running totals of one (model, instance) since tokenwatch first scraped it: cumulative
/// histograms and counters, as a Prometheus exposition would carry them.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeTotals {
    pub model_id: String,
    pub instance: String,
    pub runtime: String,
    pub finished: Option<f64>,
    pub failed: Option<f64>,
    pub prompt_tokens: Option<f64>,
    pub output_tokens: Option<f64>,
    /// Signal (`ttft`, `itl`, `e2e`, `queue`, …) → cumulative histogram.
    pub histograms: BTreeMap<String, CumulativeHistogram>,
}

/// What the minutes of a span added up to, every instance of the model merged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeSpan {
    /// Start of the first and of the last minute counted (None: no minute in the span).
    pub first_minute_ms: Option<i64>,
    pub last_minute_ms: Option<i64>,
    /// Requests finished and failed, where the runtimes report them.
    pub finished: Option<f64>,
    pub failed: Option<f64>,
    /// Signal → merged histogram (the first bucket layout met; others counted out).
    pub histograms: BTreeMap<String, CumulativeHistogram>,
    /// Signal → observations left out for another bucket layout.
    pub observations_left_out: BTreeMap<String, u64>,
    pub instances: BTreeSet<String>,
    pub runtimes: BTreeSet<String>,
}

/// How the answers of a runtime latency query are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeGroup {
    ModelId,
    Instance,
    Runtime,
}

impl RuntimeGroup {
    pub fn name(self) -> &'static str {
        match self {
            RuntimeGroup::ModelId => "model_id",
            RuntimeGroup::Instance => "instance",
            RuntimeGroup::Runtime => "runtime",
        }
    }
}

/// What to answer: one histogram signal (`ttft`, `itl`, `e2e`, `queue`, …) of one model (or of
/// every model) over the minutes overlapping the last `window_ms`.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeQuery<'a> {
    pub model: Option<&'a str>,
    pub signal: &'a str,
    pub window_ms: i64,
    pub by: Option<RuntimeGroup>,
}

/// One percentile: its name (`p50`…), the fraction, and the estimate with the bucket it lies in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RuntimeQuantile {
    pub name: &'static str,
    pub q: f64,
    pub estimate: BucketQuantile,
}

/// Observations of one signal merged over a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeSummary {
    pub count: u64,
    pub mean: Option<f64>,
    /// P50, P90, P95, P99 (empty without observations).
    pub quantiles: Vec<RuntimeQuantile>,
    pub instances: BTreeSet<String>,
    pub runtimes: BTreeSet<String>,
    /// Observations left out because their bucket layout differs from the merged one (an
    /// instance on another runtime version, say).
    pub observations_left_out: u64,
}

impl RuntimeSummary {
    pub fn quantile(&self, name: &str) -> Option<&BucketQuantile> {
        self.quantiles
            .iter()
            .find(|q| q.name == name)
            .map(|q| &q.estimate)
    }
}

/// A summary over the window and, when grouped, one per group (labels → summary).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeLatency {
    /// Start of the oldest minute the answer covers (None: no data).
    pub from_unix_ms: Option<i64>,
    pub total: RuntimeSummary,
    pub groups: Option<Vec<(BTreeMap<String, String>, RuntimeSummary)>>,
}

/// Rates of one model over a window, summed over its instances (each instance's count divided
/// by the time its scrapes covered).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RuntimeRates {
    pub requests_per_s: Option<f64>,
    pub prompt_tokens_per_s: Option<f64>,
    pub output_tokens_per_s: Option<f64>,
    /// Requests the server failed in the window.
    pub errors: Option<f64>,
    /// Failed / finished, where the runtime reports both.
    pub error_ratio: Option<f64>,
}

/// Merges histograms of one signal: the first layout met is kept, others are counted out.
#[derive(Debug, Default)]
struct Merge {
    histogram: Option<CumulativeHistogram>,
    left_out: f64,
    instances: BTreeSet<String>,
    runtimes: BTreeSet<String>,
}

impl Merge {
    fn add(&mut self, h: &CumulativeHistogram, instance: &str, runtime: &str) {
        self.instances.insert(instance.to_string());
        if !runtime.is_empty() {
            self.runtimes.insert(runtime.to_string());
        }
        match &mut self.histogram {
            None => self.histogram = Some(h.clone()),
            Some(merged) => {
                if !merged.add(h) {
                    self.left_out += h.count;
                }
            }
        }
    }

    fn summary(self) -> RuntimeSummary {
        let quantiles = self.histogram.as_ref().map_or_else(Vec::new, |h| {
            QUANTILES
                .iter()
                .filter_map(|(name, q)| {
                    h.quantile(*q).map(|estimate| RuntimeQuantile {
                        name,
                        q: *q,
                        estimate,
                    })
                })
                .collect()
        });
        RuntimeSummary {
            count: self.histogram.as_ref().map_or(0, |h| count_of(h.count)),
            mean: self.histogram.as_ref().and_then(CumulativeHistogram::mean),
            quantiles,
            instances: self.instances,
            runtimes: self.runtimes,
            observations_left_out: count_of(self.left_out),
        }
    }
}

fn count_of(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v.round() as u64
    } else {
        0
    }
}

/// Every (model, instance)'s last hour of scraped minutes.
#[derive(Debug)]
pub struct RuntimeWindows {
    lines: BTreeMap<(String, String), InstanceLine>,
    max_lines: usize,
    refused: u64,
    /// The newest minute lines were last pruned at (pruned once per minute).
    pruned_at_minute: i64,
}

impl Default for RuntimeWindows {
    fn default() -> Self {
        RuntimeWindows::new(DEFAULT_MAX_LINES)
    }
}

impl RuntimeWindows {
    pub fn new(max_lines: usize) -> RuntimeWindows {
        RuntimeWindows {
            lines: BTreeMap::new(),
            max_lines: max_lines.max(1),
            refused: 0,
            pruned_at_minute: i64::MIN,
        }
    }

    /// Add what one scrape of one (model, instance) counted to the minute it ended in.
    /// Counts without a model are not kept (no query could name them).
    pub fn record(&mut self, c: &ScrapeCounts) {
        if c.model_id.is_empty() || c.is_empty() {
            return;
        }
        let minute = c.at_unix_ms.div_euclid(MINUTE_MS) * MINUTE_MS;
        if minute > self.pruned_at_minute {
            self.pruned_at_minute = minute;
            self.prune(minute);
        }
        let key = (c.model_id.clone(), c.instance.clone());
        if !self.lines.contains_key(&key) && self.lines.len() >= self.max_lines {
            self.refused += 1;
            return;
        }
        let line = self.lines.entry(key).or_default();
        line.runtime.clone_from(&c.runtime);
        let slot = match line.minutes.iter().rposition(|m| m.start_ms <= minute) {
            Some(i) if line.minutes[i].start_ms == minute => i,
            // Out of order (or the first): a new minute in its place.
            found => {
                let at = found.map_or(0, |i| i + 1);
                line.minutes.insert(
                    at,
                    MinuteCounts {
                        start_ms: minute,
                        ..MinuteCounts::default()
                    },
                );
                at
            }
        };
        line.minutes[slot].add(c);
        line.total.add(c);
        let horizon = minute - KEEP_MINUTES * MINUTE_MS;
        while line.minutes.front().is_some_and(|m| m.start_ms <= horizon) {
            line.minutes.pop_front();
        }
    }

    /// Drop minutes older than an hour before `minute`, and lines left without any.
    fn prune(&mut self, minute: i64) {
        let horizon = minute - KEEP_MINUTES * MINUTE_MS;
        self.lines.retain(|_, line| {
            while line.minutes.front().is_some_and(|m| m.start_ms <= horizon) {
                line.minutes.pop_front();
            }
            !line.minutes.is_empty()
        });
    }

    /// (model, instance) appearances refused because `max_lines` were kept.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The minutes of every line of `model` (or of every model) that overlap the last
    /// `window_ms` before `now_ms`, with the line's key and runtime.
    fn minutes_in(
        &self,
        model: Option<&str>,
        window_ms: i64,
        now_ms: i64,
    ) -> impl Iterator<Item = (&(String, String), &str, &MinuteCounts)> {
        let from = now_ms - window_ms.max(0);
        self.lines
            .iter()
            .filter(move |((m, _), _)| model.is_none_or(|want| m == want))
            .flat_map(move |(key, line)| {
                line.minutes
                    .iter()
                    .filter(move |m| m.start_ms + MINUTE_MS > from && m.start_ms <= now_ms)
                    .map(move |m| (key, line.runtime.as_str(), m))
            })
    }

    /// Percentiles of one signal over the window, merged across instances (and per group).
    pub fn latency(&self, q: &RuntimeQuery<'_>, now_ms: i64) -> RuntimeLatency {
        let mut total = Merge::default();
        let mut groups: BTreeMap<BTreeMap<String, String>, Merge> = BTreeMap::new();
        let mut from: Option<i64> = None;
        for ((model, instance), runtime, minute) in self.minutes_in(q.model, q.window_ms, now_ms) {
            let Some(h) = minute.histograms.get(q.signal) else {
                continue;
            };
            from = Some(from.map_or(minute.start_ms, |f| f.min(minute.start_ms)));
            total.add(h, instance, runtime);
            if let Some(by) = q.by {
                let mut labels = BTreeMap::new();
                if let Some(m) = q.model {
                    labels.insert("model_id".to_string(), m.to_string());
                }
                let value = match by {
                    RuntimeGroup::ModelId => model.as_str(),
                    RuntimeGroup::Instance => instance.as_str(),
                    RuntimeGroup::Runtime => runtime,
                };
                labels.insert(by.name().to_string(), value.to_string());
                groups.entry(labels).or_default().add(h, instance, runtime);
            }
        }
        RuntimeLatency {
            from_unix_ms: from,
            total: total.summary(),
            groups: q.by.map(|_| {
                groups
                    .into_iter()
                    .map(|(labels, m)| (labels, m.summary()))
                    .collect()
            }),
        }
    }

    /// Request, token and error rates of `model` over the window (None: no scrape counted any).
    pub fn rates(&self, model: &str, window_ms: i64, now_ms: i64) -> Option<RuntimeRates> {
        #[derive(Default)]
        struct PerInstance {
            covered_ms: i64,
            requests: Option<f64>,
            prompt: Option<f64>,
            output: Option<f64>,
            finished: Option<f64>,
            failed: Option<f64>,
        }
        let mut per: BTreeMap<&str, PerInstance> = BTreeMap::new();
        for ((_, instance), _, m) in self.minutes_in(Some(model), window_ms, now_ms) {
            let p = per.entry(instance.as_str()).or_default();
            p.covered_ms += m.covered_ms;
            add_to(&mut p.requests, m.requests());
            add_to(&mut p.prompt, m.prompt_tokens);
            add_to(&mut p.output, m.output_tokens);
            add_to(&mut p.finished, m.finished);
            add_to(&mut p.failed, m.failed);
        }
        if per.is_empty() {
            return None;
        }
        let mut out = RuntimeRates::default();
        let (mut finished, mut failed_of_finished) = (None, None);
        for p in per.values() {
            if p.covered_ms > 0 {
                let s = p.covered_ms as f64 / 1000.0;
                add_to(&mut out.requests_per_s, p.requests.map(|v| v / s));
                add_to(&mut out.prompt_tokens_per_s, p.prompt.map(|v| v / s));
                add_to(&mut out.output_tokens_per_s, p.output.map(|v| v / s));
            }
            add_to(&mut out.errors, p.failed);
            if let (Some(f), Some(e)) = (p.finished, p.failed) {
                add_to(&mut finished, Some(f));
                add_to(&mut failed_of_finished, Some(e));
            }
        }
        out.error_ratio = match (finished, failed_of_finished) {
            (Some(f), Some(e)) if f > 0.0 => Some(e / f),
            (Some(_), Some(_)) => Some(0.0),
            _ => None,
        };
        Some(out)
    }

    /// Every minute of `model` (or of every model) that starts in `[from_ms, to_ms)`, merged:
    /// the histograms bucket by bucket, the request counters summed.
    pub fn span(&self, model: Option<&str>, from_ms: i64, to_ms: i64) -> RuntimeSpan {
        let mut out = RuntimeSpan::default();
        let mut merges: BTreeMap<&str, Merge> = BTreeMap::new();
        let lines = self
            .lines
            .iter()
            .filter(|((m, _), _)| model.is_none_or(|want| m == want));
        for ((_, instance), line) in lines {
            for m in line
                .minutes
                .iter()
                .filter(|m| m.start_ms >= from_ms && m.start_ms < to_ms)
            {
                out.first_minute_ms = Some(
                    out.first_minute_ms
                        .map_or(m.start_ms, |f| f.min(m.start_ms)),
                );
                out.last_minute_ms =
                    Some(out.last_minute_ms.map_or(m.start_ms, |l| l.max(m.start_ms)));
                add_to(&mut out.finished, m.finished);
                add_to(&mut out.failed, m.failed);
                out.instances.insert(instance.clone());
                if !line.runtime.is_empty() {
                    out.runtimes.insert(line.runtime.clone());
                }
                for (signal, h) in &m.histograms {
                    merges
                        .entry(signal)
                        .or_default()
                        .add(h, instance, &line.runtime);
                }
            }
        }
        for (signal, merge) in merges {
            let left_out = count_of(merge.left_out);
            if left_out > 0 {
                out.observations_left_out
                    .insert(signal.to_string(), left_out);
            }
            if let Some(h) = merge.histogram {
                out.histograms.insert(signal.to_string(), h);
            }
        }
        out
    }

    /// Every line's running totals, ordered by (model, instance).
    pub fn totals(&self) -> Vec<RuntimeTotals> {
        self.lines
            .iter()
            .map(|((model, instance), line)| RuntimeTotals {
                model_id: model.clone(),
                instance: instance.clone(),
                runtime: line.runtime.clone(),
                finished: line.total.finished,
                failed: line.total.failed,
                prompt_tokens: line.total.prompt_tokens,
                output_tokens: line.total.output_tokens,
                histograms: line.total.histograms.clone(),
            })
            .collect()
    }

    /// Models with any scraped minute overlapping the window.
    pub fn models(&self, window_ms: i64, now_ms: i64) -> BTreeSet<String> {
        self.minutes_in(None, window_ms, now_ms)
            .map(|((m, _), _, _)| m.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_700_000_040_000; // a minute boundary

    /// Buckets 0.05, 0.1, 0.25, 0.5, +Inf holding `per_bucket` observations each (not cumulative).
    fn hist(per_bucket: [f64; 5]) -> CumulativeHistogram {
        let mut cumulative = Vec::new();
        let mut running = 0.0;
        for n in per_bucket {
            running += n;
            cumulative.push(running);
        }
        CumulativeHistogram {
            bounds: vec![0.05, 0.1, 0.25, 0.5, f64::INFINITY],
            cumulative,
            sum: 0.0,
            count: running,
        }
    }

    fn scrape(instance: &str, at: i64, ttft: CumulativeHistogram) -> ScrapeCounts {
        ScrapeCounts {
            model_id: "m".into(),
            instance: instance.into(),
            runtime: "vllm".into(),
            at_unix_ms: at,
            interval_ms: 10_000,
            finished: Some(ttft.count),
            failed: Some(0.0),
            prompt_tokens: Some(100.0),
            output_tokens: Some(ttft.count * 20.0),
            latency: vec![("ttft".into(), ttft)],
        }
    }

    fn ttft(window_ms: i64, by: Option<RuntimeGroup>) -> RuntimeQuery<'static> {
        RuntimeQuery {
            model: Some("m"),
            signal: "ttft",
            window_ms,
            by,
        }
    }

    fn assert_inside_buckets(s: &RuntimeSummary) {
        assert_eq!(s.quantiles.len(), 4, "{s:?}");
        for q in &s.quantiles {
            let e = q.estimate;
            assert!(
                e.bucket_lower <= e.value && e.value <= e.bucket_upper,
                "{}: {e:?}",
                q.name
            );
        }
    }

    #[test]
    fn instances_merge_bucket_by_bucket_and_group_by_instance() {
        let mut w = RuntimeWindows::default();
        w.record(&scrape("a", T0 + 5_000, hist([10.0, 0.0, 0.0, 0.0, 0.0])));
        w.record(&scrape("b", T0 + 6_000, hist([0.0, 0.0, 10.0, 0.0, 0.0])));
        let l = w.latency(&ttft(300_000, Some(RuntimeGroup::Instance)), T0 + 10_000);
        assert_eq!(l.total.count, 20);
        assert_eq!(l.from_unix_ms, Some(T0));
        // Half the observations at or below 0.05, half in (0.1, 0.25]: P50 is at the first's edge.
        let p50 = l.total.quantile("p50").unwrap();
        assert_eq!((p50.bucket_lower, p50.bucket_upper), (0.0, 0.05));
        let p90 = l.total.quantile("p90").unwrap();
        assert_eq!((p90.bucket_lower, p90.bucket_upper), (0.1, 0.25));
        assert_inside_buckets(&l.total);
        assert_eq!(
            l.total.instances,
            BTreeSet::from(["a".to_string(), "b".to_string()])
        );
        let groups = l.groups.unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].0["instance"], "a");
        assert_eq!(groups[0].0["model_id"], "m");
        assert_eq!(groups[0].1.count, 10);
        assert_eq!(groups[1].1.quantile("p99").unwrap().bucket_upper, 0.25);
    }

    #[test]
    fn another_bucket_layout_is_counted_out_not_mixed_in() {
        let mut w = RuntimeWindows::default();
        w.record(&scrape("a", T0 + 5_000, hist([10.0, 0.0, 0.0, 0.0, 0.0])));
        let other = CumulativeHistogram {
            bounds: vec![1.0, f64::INFINITY],
            cumulative: vec![7.0, 7.0],
            sum: 3.0,
            count: 7.0,
        };
        w.record(&scrape("b", T0 + 5_000, other));
        let l = w.latency(&ttft(60_000, None), T0 + 10_000);
        assert_eq!(l.total.count, 10);
        assert_eq!(l.total.observations_left_out, 7);
    }

    #[test]
    fn a_counter_reset_mid_window_counts_the_new_readings() {
        // Cumulative readings of one instance; it restarts between the 2nd and 3rd scrape.
        let readings = [
            hist([10.0, 0.0, 0.0, 0.0, 0.0]),
            hist([10.0, 5.0, 0.0, 0.0, 0.0]),
            hist([0.0, 0.0, 2.0, 0.0, 0.0]),
            hist([0.0, 0.0, 4.0, 0.0, 0.0]),
        ];
        let mut w = RuntimeWindows::default();
        for (i, pair) in readings.windows(2).enumerate() {
            let delta = pair[1].delta_since(&pair[0]);
            w.record(&scrape("a", T0 + 10_000 * (i as i64 + 1), delta));
        }
        let l = w.latency(&ttft(300_000, None), T0 + 40_000);
        // 5 in (0.05, 0.1] before the restart, then 2 and 2 more in (0.1, 0.25].
        assert_eq!(l.total.count, 9);
        let p99 = l.total.quantile("p99").unwrap();
        assert_eq!((p99.bucket_lower, p99.bucket_upper), (0.1, 0.25));
        let p50 = l.total.quantile("p50").unwrap();
        assert_eq!((p50.bucket_lower, p50.bucket_upper), (0.05, 0.1));
        assert_inside_buckets(&l.total);
    }

    #[test]
    fn windows_take_the_minutes_overlapping_them_and_an_hour_is_kept() {
        let mut w = RuntimeWindows::default();
        // One observation per minute for 70 minutes, the scrape 30 s into each minute.
        for minute in 0..70 {
            w.record(&scrape(
                "a",
                T0 + minute * MINUTE_MS + 30_000,
                hist([1.0, 0.0, 0.0, 0.0, 0.0]),
            ));
        }
        let now = T0 + 69 * MINUTE_MS + 45_000;
        let count = |window| w.latency(&ttft(window, None), now).total.count;
        assert_eq!(
            count(60_000),
            2,
            "this minute and the one before overlap 1m"
        );
        assert_eq!(count(300_000), 6);
        assert_eq!(count(3_600_000), 60, "the first 10 minutes are gone");
        let l = w.latency(&ttft(60_000, None), now);
        assert_eq!(l.from_unix_ms, Some(T0 + 68 * MINUTE_MS));
        // An hour after the last scrape, a new scrape of another line prunes the old one.
        w.record(&scrape(
            "b",
            T0 + 131 * MINUTE_MS,
            hist([1.0, 0.0, 0.0, 0.0, 0.0]),
        ));
        assert_eq!(w.lines.len(), 1);
    }

    #[test]
    fn out_of_order_scrapes_land_in_their_minute() {
        let mut w = RuntimeWindows::default();
        w.record(&scrape(
            "a",
            T0 + 2 * MINUTE_MS,
            hist([1.0, 0.0, 0.0, 0.0, 0.0]),
        ));
        w.record(&scrape("a", T0 + 10, hist([2.0, 0.0, 0.0, 0.0, 0.0])));
        w.record(&scrape("a", T0 + 20, hist([3.0, 0.0, 0.0, 0.0, 0.0])));
        let starts: Vec<i64> = w.lines[&("m".to_string(), "a".to_string())]
            .minutes
            .iter()
            .map(|m| m.start_ms)
            .collect();
        assert_eq!(starts, vec![T0, T0 + 2 * MINUTE_MS]);
        let now = T0 + 2 * MINUTE_MS + 1;
        assert_eq!(w.latency(&ttft(300_000, None), now).total.count, 6);
    }

    #[test]
    fn empty_windows_answer_nothing() {
        let mut w = RuntimeWindows::default();
        let l = w.latency(&ttft(300_000, Some(RuntimeGroup::Instance)), T0);
        assert_eq!(l.total.count, 0);
        assert!(l.total.quantiles.is_empty());
        assert_eq!(l.total.mean, None);
        assert_eq!(l.from_unix_ms, None);
        assert_eq!(l.groups, Some(vec![]));
        assert_eq!(w.rates("m", 300_000, T0), None);
        // A scrape without a model, or without counts, is not kept.
        let mut nameless = scrape("a", T0, hist([1.0, 0.0, 0.0, 0.0, 0.0]));
        nameless.model_id.clear();
        w.record(&nameless);
        assert!(w.models(3_600_000, T0).is_empty());
        // Data of another signal, or long ago, answers nothing either.
        w.record(&scrape("a", T0, hist([1.0, 0.0, 0.0, 0.0, 0.0])));
        let itl = RuntimeQuery {
            signal: "itl",
            ..ttft(300_000, None)
        };
        assert_eq!(w.latency(&itl, T0 + 1).total.count, 0);
        assert_eq!(
            w.latency(&ttft(300_000, None), T0 + 10 * MINUTE_MS)
                .total
                .count,
            0
        );
    }

    #[test]
    fn rates_sum_instances_over_the_time_their_scrapes_covered() {
        let mut w = RuntimeWindows::default();
        for i in 1..=3 {
            // 10 requests per 10 s scrape on a, 5 on b (one of them failed on b).
            w.record(&scrape(
                "a",
                T0 + i * 10_000,
                hist([10.0, 0.0, 0.0, 0.0, 0.0]),
            ));
            let mut b = scrape("b", T0 + i * 10_000, hist([5.0, 0.0, 0.0, 0.0, 0.0]));
            b.failed = Some(1.0);
            w.record(&b);
        }
        let r = w.rates("m", 60_000, T0 + 35_000).unwrap();
        assert!((r.requests_per_s.unwrap() - 1.5).abs() < 1e-9, "{r:?}");
        assert!((r.output_tokens_per_s.unwrap() - 30.0).abs() < 1e-9);
        assert!((r.prompt_tokens_per_s.unwrap() - 20.0).abs() < 1e-9);
        assert_eq!(r.errors, Some(3.0));
        assert!((r.error_ratio.unwrap() - 3.0 / 45.0).abs() < 1e-9);
        assert_eq!(
            w.models(60_000, T0 + 35_000),
            BTreeSet::from(["m".to_string()])
        );
    }

    #[test]
    fn spans_take_the_minutes_starting_in_them_and_totals_run_since_the_first_scrape() {
        let mut w = RuntimeWindows::default();
        // Minute 0: 8 fast first tokens on a; minute 1: 5 slow on a (one request failed), 3 on b.
        w.record(&scrape("a", T0 + 10_000, hist([4.0, 0.0, 0.0, 0.0, 0.0])));
        w.record(&scrape("a", T0 + 50_000, hist([4.0, 0.0, 0.0, 0.0, 0.0])));
        let mut slow = scrape(
            "a",
            T0 + MINUTE_MS + 10_000,
            hist([0.0, 0.0, 0.0, 5.0, 0.0]),
        );
        slow.failed = Some(1.0);
        w.record(&slow);
        w.record(&scrape(
            "b",
            T0 + MINUTE_MS + 20_000,
            hist([0.0, 0.0, 0.0, 3.0, 0.0]),
        ));
        let before = w.span(Some("m"), T0, T0 + MINUTE_MS);
        assert_eq!(before.histograms["ttft"].count, 8.0);
        assert_eq!(before.histograms["ttft"].cumulative[0], 8.0);
        assert_eq!(
            (before.first_minute_ms, before.last_minute_ms),
            (Some(T0), Some(T0))
        );
        assert_eq!((before.finished, before.failed), (Some(8.0), Some(0.0)));
        let after = w.span(Some("m"), T0 + MINUTE_MS, T0 + 2 * MINUTE_MS);
        assert_eq!(after.histograms["ttft"].count, 8.0);
        assert_eq!(after.histograms["ttft"].cumulative[2], 0.0, "none fast");
        assert_eq!((after.finished, after.failed), (Some(8.0), Some(1.0)));
        assert_eq!(
            after.instances,
            BTreeSet::from(["a".to_string(), "b".to_string()])
        );
        assert_eq!(after.runtimes, BTreeSet::from(["vllm".to_string()]));
        // A minute counts in a span only when it starts in it.
        assert_eq!(
            w.span(Some("m"), T0 + 1, T0 + 2 * MINUTE_MS).histograms["ttft"].count,
            8.0
        );
        assert!(
            w.span(Some("x"), T0, T0 + 2 * MINUTE_MS)
                .histograms
                .is_empty()
        );
        assert_eq!(
            w.span(None, T0, T0 + 2 * MINUTE_MS).histograms["ttft"].count,
            16.0
        );
        // Totals: every scrape of the line added up, cumulative as an exposition carries them.
        let totals = w.totals();
        assert_eq!(totals.len(), 2);
        let a = &totals[0];
        assert_eq!((a.instance.as_str(), a.runtime.as_str()), ("a", "vllm"));
        assert_eq!(
            a.histograms["ttft"].cumulative,
            vec![8.0, 8.0, 8.0, 13.0, 13.0]
        );
        assert_eq!(a.histograms["ttft"].count, 13.0);
        assert_eq!((a.finished, a.failed), (Some(13.0), Some(1.0)));
        assert_eq!(
            (a.prompt_tokens, a.output_tokens),
            (Some(300.0), Some(260.0))
        );
        assert_eq!(totals[1].histograms["ttft"].count, 3.0);
    }

    #[test]
    fn lines_beyond_the_limit_are_refused_and_counted() {
        let mut w = RuntimeWindows::new(1);
        w.record(&scrape("a", T0, hist([1.0, 0.0, 0.0, 0.0, 0.0])));
        w.record(&scrape("b", T0, hist([1.0, 0.0, 0.0, 0.0, 0.0])));
        w.record(&scrape("a", T0 + 1, hist([1.0, 0.0, 0.0, 0.0, 0.0])));
        assert_eq!(w.refused(), 1);
        let l = w.latency(&ttft(60_000, Some(RuntimeGroup::Instance)), T0 + 2);
        assert_eq!(l.total.count, 2);
        assert_eq!(l.groups.map(|g| g.len()), Some(1));
    }
}
