// Aggregator: per-series (labels × context bucket) sliding latency sketches and request/token
// counters, fed by finished RequestRecords; answers window queries, hands out per-minute roll-ups.

use crate::model::{ContextBucket, GroupLabel, LatencyMetric, RequestRecord, SeriesLabels};
use crate::sketch::{LatencySketch, LatencySummary};
use crate::window::{AddOutcome, Ring, SlidingSketch, TIER_1M_MS, TIER_5M_MS, TIER_10S_MS, Window};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A series: its labels and the context-length bucket of its requests.
pub type SeriesKey = (SeriesLabels, ContextBucket);

/// A minute counts as complete for `drain_rollups` only once `now` is this far past its end,
/// so records that reach the aggregator a little late (batching, queues) still make it in.
pub const ROLLUP_GRACE_MS: i64 = 5_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregatorConfig {
    /// Series with no observation for longer than this are dropped by `evict_idle` (default 2 h).
    pub idle_series_after_ms: i64,
    /// Series held at most; observations that would create more are refused and counted.
    pub max_series: usize,
}

impl Default for AggregatorConfig {
    fn default() -> Self {
        AggregatorConfig {
            idle_series_after_ms: 2 * 3_600_000,
            max_series: 50_000,
        }
    }
}

/// Request and token counts over a span of time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub requests: u64,
    /// Requests that failed (`!RequestRecord::is_success()`).
    pub errors: u64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.requests = self.requests.saturating_add(o.requests);
        self.errors = self.errors.saturating_add(o.errors);
        self.prompt_tokens = self.prompt_tokens.saturating_add(o.prompt_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
    }
}

/// Counts in the same three tiers and with the same coverage as `SlidingSketch`
/// (see `Window::covered_range`).
#[derive(Debug, Clone)]
struct SlidingCounts {
    s10: Ring<Counts, 6>,
    m1: Ring<Counts, 5>,
    m5: Ring<Counts, 12>,
}

impl SlidingCounts {
    fn new() -> Self {
        SlidingCounts {
            s10: Ring::new(),
            m1: Ring::new(),
            m5: Ring::new(),
        }
    }

    fn add(&mut self, t: i64, c: &Counts) {
        if let Some(s) = self.s10.slot_mut(t.div_euclid(TIER_10S_MS)) {
            s.get_or_insert_with(Counts::default).add(c);
        }
        if let Some(s) = self.m1.slot_mut(t.div_euclid(TIER_1M_MS)) {
            s.get_or_insert_with(Counts::default).add(c);
        }
        if let Some(s) = self.m5.slot_mut(t.div_euclid(TIER_5M_MS)) {
            s.get_or_insert_with(Counts::default).add(c);
        }
    }

    fn window_into(&self, now: i64, w: Window, out: &mut Counts) {
        let c = now.div_euclid(w.slot_ms());
        for idx in c.saturating_sub(w.slots() - 1)..=c {
            let slot = match w {
                Window::M1 => self.s10.get(idx),
                Window::M5 => self.m1.get(idx),
                Window::H1 => self.m5.get(idx),
            };
            if let Some(s) = slot {
                out.add(s);
            }
        }
    }
}

#[derive(Debug, Clone)]
struct SeriesState {
    /// Indexed by `metric_index`.
    metrics: [SlidingSketch; 4],
    counts: SlidingCounts,
    last_seen_ms: i64,
}

fn metric_index(m: LatencyMetric) -> usize {
    match m {
        LatencyMetric::Ttft => 0,
        LatencyMetric::Itl => 1,
        LatencyMetric::E2e => 2,
        LatencyMetric::Queue => 3,
    }
}

/// A latency query over the in-memory windows.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyQuery {
    /// Only series of this `model_id`.
    pub model: Option<String>,
    pub metric: LatencyMetric,
    pub window: Window,
    /// One group per value of this label; `None` for a single group.
    pub by: Option<GroupLabel>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyGroup {
    /// `{by_name: value}` with `by`, empty without; plus `model_id` when the query names a model.
    pub labels: BTreeMap<String, String>,
    pub summary: LatencySummary,
}

/// Request and token counts of one group over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CountsGroup {
    /// As in `LatencyGroup`.
    pub labels: BTreeMap<String, String>,
    pub counts: Counts,
    /// Milliseconds of the past the window covered (`Window::covered_ms`): rate = count / it.
    pub covered_ms: i64,
}

impl CountsGroup {
    /// `n` per second over the covered span (0 when the span is empty).
    pub fn per_second(&self, n: u64) -> f64 {
        if self.covered_ms <= 0 {
            0.0
        } else {
            n as f64 * 1000.0 / self.covered_ms as f64
        }
    }
}

/// One completed minute of one series and metric, for the store.
#[derive(Debug, Clone)]
pub struct Rollup {
    pub labels: SeriesLabels,
    pub bucket: ContextBucket,
    pub metric: LatencyMetric,
    pub minute_start_unix_ms: i64,
    pub sketch: LatencySketch,
}

/// The aggregation stage: owns every live series. Not thread-safe by itself (wrap in a lock).
#[derive(Debug)]
pub struct Aggregator {
    cfg: AggregatorConfig,
    series: HashMap<SeriesKey, SeriesState>,
    refused: u64,
    rejected_values: u64,
    missed_rollup_values: u64,
}

impl Aggregator {
    pub fn new(cfg: AggregatorConfig) -> Self {
        Aggregator {
            cfg,
            series: HashMap::new(),
            refused: 0,
            rejected_values: 0,
            missed_rollup_values: 0,
        }
    }

    /// When a record's values are placed in time: `arrival_unix_ms + end_s` (when the request
    /// finished); the arrival alone when `end_s` is not a finite, non-negative number.
    pub fn timestamp_of(rec: &RequestRecord) -> i64 {
        if rec.end_s.is_finite() && rec.end_s >= 0.0 {
            // `as` saturates for huge values.
            rec.arrival_unix_ms
                .saturating_add((rec.end_s * 1000.0).round() as i64)
        } else {
            rec.arrival_unix_ms
        }
    }

    /// Feeds one finished request: `first_token_s` → TTFT, every inter-chunk gap
    /// (`RequestRecord::gaps_s`) → ITL, `end_s` → E2E, `queue_s` → queue; one request (an error
    /// when `!is_success()`) and its prompt/output tokens to the counters. All at
    /// `timestamp_of(rec)`. A record of a new series is refused (and counted) at `max_series`.
    pub fn observe(&mut self, rec: &RequestRecord) {
        let t = Self::timestamp_of(rec);
        let key = (rec.labels.clone(), rec.context_bucket());
        let len = self.series.len();
        let state = match self.series.get_mut(&key) {
            Some(s) => s,
            None => {
                if len >= self.cfg.max_series {
                    self.refused = self.refused.saturating_add(1);
                    return;
                }
                self.series.entry(key).or_insert_with(|| SeriesState {
                    metrics: std::array::from_fn(|_| SlidingSketch::new()),
                    counts: SlidingCounts::new(),
                    last_seen_ms: t,
                })
            }
        };
        state.last_seen_ms = state.last_seen_ms.max(t);
        let mut outcomes = [0u64; 2]; // rejected, missed roll-up
        let mut note = |o: AddOutcome| match o {
            AddOutcome::Rejected => outcomes[0] += 1,
            AddOutcome::MissedRollup => outcomes[1] += 1,
            AddOutcome::Recorded => {}
        };
        let [ttft, itl, e2e, queue] = &mut state.metrics;
        if let Some(v) = rec.first_token_s {
            note(ttft.add(t, v));
        }
        for g in rec.gaps_s() {
            note(itl.add(t, g));
        }
        note(e2e.add(t, rec.end_s));
        if let Some(v) = rec.queue_s {
            note(queue.add(t, v));
        }
        let counts = Counts {
            requests: 1,
            errors: u64::from(!rec.is_success()),
            prompt_tokens: rec.prompt_tokens.unwrap_or(0),
            output_tokens: rec.output_tokens.unwrap_or(0),
        };
        state.counts.add(t, &counts);
        self.rejected_values = self.rejected_values.saturating_add(outcomes[0]);
        self.missed_rollup_values = self.missed_rollup_values.saturating_add(outcomes[1]);
    }

    /// The labels of one answer group: `model_id` when the query names a model, plus
    /// `{by: value}` with `by` (also used by the API for groups merged from stored roll-ups).
    pub fn group_labels(
        model: Option<&str>,
        by: Option<GroupLabel>,
        value: Option<&str>,
    ) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::new();
        if let Some(m) = model {
            labels.insert(GroupLabel::ModelId.name().to_string(), m.to_string());
        }
        if let (Some(by), Some(v)) = (by, value) {
            labels.insert(by.name().to_string(), v.to_string());
        }
        labels
    }

    /// Visits every series matching `model`, keyed by its `by` value ("" without `by`).
    fn fold_groups<T: Default>(
        &self,
        model: Option<&str>,
        by: Option<GroupLabel>,
        mut f: impl FnMut(&SeriesState, &mut T),
    ) -> BTreeMap<String, T> {
        let mut groups: BTreeMap<String, T> = BTreeMap::new();
        for ((labels, bucket), state) in &self.series {
            if model.is_some_and(|m| labels.model_id != m) {
                continue;
            }
            let value = by.map_or("", |b| b.value_of(labels, *bucket));
            if !groups.contains_key(value) {
                groups.insert(value.to_string(), T::default());
            }
            if let Some(acc) = groups.get_mut(value) {
                f(state, acc);
            }
        }
        groups
    }

    /// Latency of `q.metric` over `q.window` (see `Window::covered_range`) for the series of
    /// `q.model` (all models when `None`). Without `by`: exactly one group, empty labels (plus
    /// `model_id` when a model is given), count 0 and `None` quantiles when there is no data.
    /// With `by`: one group per distinct value of that label among the values in the window,
    /// sorted by value; groups with no value in the window are left out (so the answer does not
    /// depend on when idle series are evicted).
    pub fn query(&self, q: &LatencyQuery, now_unix_ms: i64) -> Vec<LatencyGroup> {
        let m = metric_index(q.metric);
        let model = q.model.as_deref();
        let groups = self.fold_groups(model, q.by, |state, acc: &mut LatencySketch| {
            if let Some(s) = state.metrics.get(m) {
                s.window_into(now_unix_ms, q.window, acc);
            }
        });
        match q.by {
            None => {
                let summary = groups
                    .get("")
                    .map_or_else(|| LatencySketch::new().summary(), |s| s.summary());
                vec![LatencyGroup {
                    labels: Self::group_labels(model, None, None),
                    summary,
                }]
            }
            Some(by) => groups
                .into_iter()
                .filter(|(_, s)| !s.is_empty())
                .map(|(v, s)| LatencyGroup {
                    labels: Self::group_labels(model, Some(by), Some(&v)),
                    summary: s.summary(),
                })
                .collect(),
        }
    }

    /// Each model with its runtimes and instances among the live series, in one pass.
    pub fn label_values_by_model(&self) -> Vec<(String, BTreeSet<String>, BTreeSet<String>)> {
        let mut out: BTreeMap<&str, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
        for (labels, _) in self.series.keys() {
            let e = out.entry(labels.model_id.as_str()).or_default();
            if !labels.runtime.is_empty() && !e.0.contains(&labels.runtime) {
                e.0.insert(labels.runtime.clone());
            }
            if !labels.instance.is_empty() && !e.1.contains(&labels.instance) {
                e.1.insert(labels.instance.clone());
            }
        }
        out.into_iter()
            .map(|(m, (r, i))| (m.to_string(), r, i))
            .collect()
    }

    /// Every model's `metric` sketch over `window`, split by context bucket, in one pass over the
    /// series (the fleet timeline samples all models at once). Empty sketches are left out.
    pub fn sketches_by_model_and_bucket(
        &self,
        metric: LatencyMetric,
        window: Window,
        now_unix_ms: i64,
    ) -> BTreeMap<(String, ContextBucket), LatencySketch> {
        let m = metric_index(metric);
        let mut out: BTreeMap<(String, ContextBucket), LatencySketch> = BTreeMap::new();
        for ((labels, bucket), state) in &self.series {
            let Some(s) = state.metrics.get(m) else {
                continue;
            };
            let mut acc = LatencySketch::new();
            s.window_into(now_unix_ms, window, &mut acc);
            if acc.is_empty() {
                continue;
            }
            out.entry((labels.model_id.clone(), *bucket))
                .or_default()
                .merge(&acc);
        }
        out
    }

    /// Request and token counts over `window`, grouped like `query` (without `by`: one group,
    /// zeros when empty; with `by`: groups with no request in the window are left out).
    pub fn counts(
        &self,
        model: Option<&str>,
        window: Window,
        by: Option<GroupLabel>,
        now_unix_ms: i64,
    ) -> Vec<CountsGroup> {
        let groups = self.fold_groups(model, by, |state, acc: &mut Counts| {
            state.counts.window_into(now_unix_ms, window, acc);
        });
        let covered_ms = window.covered_ms(now_unix_ms);
        match by {
            None => {
                let counts = groups.get("").copied().unwrap_or_default();
                vec![CountsGroup {
                    labels: Self::group_labels(model, None, None),
                    counts,
                    covered_ms,
                }]
            }
            Some(by) => groups
                .into_iter()
                .filter(|(_, c)| c.requests > 0)
                .map(|(v, counts)| CountsGroup {
                    labels: Self::group_labels(model, Some(by), Some(&v)),
                    counts,
                    covered_ms,
                })
                .collect(),
        }
    }

    /// Completed minutes not yet handed out, for every series and metric (non-empty ones only),
    /// sorted by (minute, labels, bucket, metric). A minute is complete once
    /// `now_unix_ms >= minute end + ROLLUP_GRACE_MS`; each is handed out exactly once (values
    /// arriving for it afterwards are counted in `missed_rollup_values`). Call at least every
    /// ~4 minutes: the 1-minute ring holds 5 minutes.
    pub fn drain_rollups(&mut self, now_unix_ms: i64) -> Vec<Rollup> {
        let cutoff = now_unix_ms.saturating_sub(ROLLUP_GRACE_MS);
        let mut out = Vec::new();
        for ((labels, bucket), state) in &mut self.series {
            for metric in LatencyMetric::ALL {
                let Some(s) = state.metrics.get_mut(metric_index(metric)) else {
                    continue;
                };
                for (minute, sketch) in s.take_completed_minutes(cutoff) {
                    out.push(Rollup {
                        labels: labels.clone(),
                        bucket: *bucket,
                        metric,
                        minute_start_unix_ms: minute,
                        sketch,
                    });
                }
            }
        }
        out.sort_by(|a, b| {
            (a.minute_start_unix_ms, &a.labels, a.bucket, a.metric).cmp(&(
                b.minute_start_unix_ms,
                &b.labels,
                b.bucket,
                b.metric,
            ))
        });
        out
    }

    /// Drops series whose newest observation is more than `idle_series_after_ms` before
    /// `now_unix_ms`; returns how many. Also freezes the past slots of the others
    /// (`SlidingSketch::compact`), so call it periodically (the pipeline's maintenance tick). Also freezes the past slots of the others
    /// (`SlidingSketch::compact`), so call it periodically (the pipeline's maintenance tick).
    pub fn evict_idle(&mut self, now_unix_ms: i64) -> usize {
        let before = self.series.len();
        let idle = self.cfg.idle_series_after_ms;
        self.series.retain(|_, s| {
            let keep = now_unix_ms.saturating_sub(s.last_seen_ms) <= idle;
            if keep {
                s.metrics.iter_mut().for_each(|m| m.compact(now_unix_ms));
            }
            keep
        });
        before - self.series.len()
    }

    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// Records refused because they would have created a series beyond `max_series`
    /// (counted per record, not per distinct series).
    pub fn refused_series(&self) -> u64 {
        self.refused
    }

    /// Latency values skipped as invalid (NaN, infinite, negative, above `sketch::MAX_VALUE`).
    pub fn rejected_values(&self) -> u64 {
        self.rejected_values
    }

    /// Values recorded in the windows but too late for their minute's roll-up.
    pub fn missed_rollup_values(&self) -> u64 {
        self.missed_rollup_values
    }

    /// Approximate memory held by the series (map entries, keys and sketch bins).
    pub fn approx_memory_bytes(&self) -> usize {
        let per_entry = std::mem::size_of::<(SeriesKey, SeriesState)>() + 8;
        self.series
            .iter()
            .map(|((l, _), s)| {
                let strings = l.model_id.capacity()
                    + l.runtime.capacity()
                    + l.instance.capacity()
                    + l.tenant.capacity()
                    + l.ab_group.capacity()
                    + l.model_version.capacity();
                per_entry
                    + strings
                    + s.metrics
                        .iter()
                        .map(SlidingSketch::heap_bytes)
                        .sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ErrorClass;

    const S: i64 = 1000;
    const MIN: i64 = 60 * S;
    const BASE: i64 = 28_333_333 * MIN; // minute-aligned, year 2023

    fn rec(model: &str, tenant: &str, finish_ms: i64, e2e: f64) -> RequestRecord {
        RequestRecord {
            labels: SeriesLabels {
                model_id: model.into(),
                runtime: "sim".into(),
                tenant: tenant.into(),
                ..Default::default()
            },
            arrival_unix_ms: finish_ms - (e2e * 1000.0).round() as i64,
            end_s: e2e,
            first_token_s: Some(e2e / 4.0),
            queue_s: Some(0.01),
            chunk_offsets_us: vec![100_000, 150_000, 250_000],
            prompt_tokens: Some(100),
            output_tokens: Some(20),
            status: 200,
            ..Default::default()
        }
    }

    fn q(
        model: Option<&str>,
        metric: LatencyMetric,
        window: Window,
        by: Option<GroupLabel>,
    ) -> LatencyQuery {
        LatencyQuery {
            model: model.map(String::from),
            metric,
            window,
            by,
        }
    }

    fn agg() -> Aggregator {
        Aggregator::new(AggregatorConfig::default())
    }

    #[test]
    fn sketches_by_model_and_bucket_splits_and_matches_per_model_query() {
        let mut a = agg();
        let now = BASE + 30 * S;
        for i in 0..10 {
            a.observe(&rec("m1", "t1", now - i * S, 1.0 + i as f64 / 10.0));
            a.observe(&rec("m2", "t2", now - i * S, 5.0));
        }
        let mut long = rec("m1", "t1", now, 9.0);
        long.prompt_tokens = Some(3000);
        a.observe(&long);
        let split = a.sketches_by_model_and_bucket(LatencyMetric::E2e, Window::M1, now);
        let keys: Vec<_> = split.keys().cloned().collect();
        assert_eq!(
            keys,
            vec![
                ("m1".to_string(), ContextBucket::Le512),
                ("m1".to_string(), ContextBucket::Le4096),
                ("m2".to_string(), ContextBucket::Le512)
            ]
        );
        let mut m1 = LatencySketch::new();
        for ((m, _), s) in &split {
            if m == "m1" {
                m1.merge(s);
            }
        }
        let direct = a.query(&q(Some("m1"), LatencyMetric::E2e, Window::M1, None), now);
        assert_eq!(m1.summary(), direct[0].summary);
        assert_eq!(m1.count(), 11);
        assert!(
            a.sketches_by_model_and_bucket(LatencyMetric::E2e, Window::M1, now + 3 * MIN)
                .is_empty()
        );
    }

    #[test]
    fn observe_feeds_every_metric_at_finish_time() {
        let mut a = agg();
        let r = rec("m", "t", BASE + 30 * S, 2.0);
        assert_eq!(Aggregator::timestamp_of(&r), BASE + 30 * S);
        a.observe(&r);
        let now = BASE + 31 * S;
        let get = |m| {
            a.query(&q(None, m, Window::M1, None), now)
                .remove(0)
                .summary
        };
        assert_eq!(get(LatencyMetric::E2e).count, 1);
        assert_eq!(
            get(LatencyMetric::E2e).p50,
            Some(2.0),
            "single value: clamped to exact"
        );
        assert_eq!(get(LatencyMetric::Ttft).p50, Some(0.5));
        let itl = get(LatencyMetric::Itl);
        assert_eq!(itl.count, 2);
        assert!((itl.mean.unwrap() - 0.075).abs() < 1e-12);
        assert_eq!(get(LatencyMetric::Queue).count, 1);
        // The arrival was 2 s before the finish; the values sit at the finish.
        assert_eq!(
            a.query(
                &q(None, LatencyMetric::E2e, Window::M1, None),
                BASE + 30 * S + 60 * S + 1
            )[0]
            .summary
            .count,
            0
        );
    }

    #[test]
    fn window_boundaries_61s_old() {
        let mut a = agg();
        let t = BASE + 7_777;
        a.observe(&rec("m", "t", t, 1.0));
        let now = t + 61 * S;
        let count = |w| {
            a.query(&q(Some("m"), LatencyMetric::E2e, w, None), now)[0]
                .summary
                .count
        };
        assert_eq!(count(Window::M1), 0);
        assert_eq!(count(Window::M5), 1);
        assert_eq!(count(Window::H1), 1);
    }

    #[test]
    fn empty_queries() {
        let a = agg();
        let got = a.query(&q(None, LatencyMetric::Ttft, Window::M5, None), BASE);
        assert_eq!(got.len(), 1);
        assert!(got[0].labels.is_empty());
        assert_eq!(got[0].summary.count, 0);
        assert!(got[0].summary.p95.is_none() && got[0].summary.mean.is_none());
        let got = a.query(&q(Some("x"), LatencyMetric::Ttft, Window::M5, None), BASE);
        assert_eq!(
            got[0].labels,
            BTreeMap::from([("model_id".into(), "x".into())])
        );
        assert!(
            a.query(
                &q(
                    None,
                    LatencyMetric::Ttft,
                    Window::M5,
                    Some(GroupLabel::Tenant)
                ),
                BASE
            )
            .is_empty()
        );
        let json = serde_json::to_value(&got[0]).unwrap();
        assert_eq!(json["summary"]["p99"], serde_json::Value::Null);
    }

    #[test]
    fn group_by_label_sorted_with_model_filter() {
        let mut a = agg();
        let t = BASE + 10 * S;
        for (tenant, v, n) in [("zeta", 0.3, 3), ("acme", 0.1, 2), ("mid", 0.2, 1)] {
            for _ in 0..n {
                a.observe(&rec("m", tenant, t, v));
            }
        }
        a.observe(&rec("other", "acme", t, 9.0));
        a.observe(&rec("m", "old", t - 10 * MIN, 5.0)); // out of the 5m window
        let got = a.query(
            &q(
                Some("m"),
                LatencyMetric::E2e,
                Window::M5,
                Some(GroupLabel::Tenant),
            ),
            t,
        );
        let tenants: Vec<&str> = got.iter().map(|g| g.labels["tenant"].as_str()).collect();
        assert_eq!(tenants, ["acme", "mid", "zeta"]);
        assert_eq!(
            got.iter().map(|g| g.summary.count).collect::<Vec<_>>(),
            [2, 1, 3]
        );
        assert!(
            got.iter()
                .all(|g| g.labels["model_id"] == "m" && g.labels.len() == 2)
        );
        assert_eq!(got[0].summary.p50, Some(0.1));
        // All models, no grouping: one group, everything in the window merged.
        let all = a.query(&q(None, LatencyMetric::E2e, Window::M5, None), t);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].summary.count, 7);
        assert!(all[0].labels.is_empty());
        // By model across models; by context bucket.
        let by_model = a.query(
            &q(
                None,
                LatencyMetric::E2e,
                Window::M5,
                Some(GroupLabel::ModelId),
            ),
            t,
        );
        assert_eq!(
            by_model
                .iter()
                .map(|g| g.labels["model_id"].as_str())
                .collect::<Vec<_>>(),
            ["m", "other"]
        );
        let mut long = rec("m", "acme", t, 0.4);
        long.prompt_tokens = Some(3000);
        a.observe(&long);
        let by_bucket = a.query(
            &q(
                Some("m"),
                LatencyMetric::E2e,
                Window::M1,
                Some(GroupLabel::ContextBucket),
            ),
            t,
        );
        let buckets: Vec<(&str, u64)> = by_bucket
            .iter()
            .map(|g| (g.labels["context_bucket"].as_str(), g.summary.count))
            .collect();
        assert_eq!(buckets, [("le4096", 1), ("le512", 6)]);
    }

    #[test]
    fn rollups_are_emitted_once_after_the_grace() {
        let mut a = agg();
        a.observe(&rec("m", "t", BASE + 10 * S, 1.0));
        a.observe(&rec("m", "u", BASE + 20 * S, 1.0));
        a.observe(&rec("m", "t", BASE + MIN + 1, 1.0));
        assert!(a.drain_rollups(BASE + MIN).is_empty());
        assert!(a.drain_rollups(BASE + MIN + ROLLUP_GRACE_MS - 1).is_empty());
        let got = a.drain_rollups(BASE + MIN + ROLLUP_GRACE_MS);
        // 2 series × 4 metrics, minute BASE only.
        assert_eq!(got.len(), 8);
        assert!(got.iter().all(|r| r.minute_start_unix_ms == BASE));
        let ttft: Vec<_> = got
            .iter()
            .filter(|r| r.metric == LatencyMetric::Ttft)
            .collect();
        assert_eq!(ttft.len(), 2);
        assert_eq!(
            (
                ttft[0].labels.tenant.as_str(),
                ttft[1].labels.tenant.as_str()
            ),
            ("t", "u")
        );
        assert_eq!(ttft[0].bucket, ContextBucket::Le512);
        let itl = got.iter().find(|r| r.metric == LatencyMetric::Itl).unwrap();
        assert_eq!(itl.sketch.count(), 2);
        assert!(a.drain_rollups(BASE + MIN + ROLLUP_GRACE_MS).is_empty());
        // Late record for the handed-out minute: not emitted again, counted.
        a.observe(&rec("m", "t", BASE + 30 * S, 1.0));
        assert_eq!(a.missed_rollup_values(), 5);
        let got = a.drain_rollups(BASE + 3 * MIN);
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(|r| r.minute_start_unix_ms == BASE + MIN));
        assert!(a.drain_rollups(BASE + 10 * MIN).is_empty());
    }

    #[test]
    fn eviction_of_idle_series() {
        let mut a = Aggregator::new(AggregatorConfig {
            idle_series_after_ms: 10 * MIN,
            max_series: 10,
        });
        a.observe(&rec("m", "old", BASE, 1.0));
        a.observe(&rec("m", "new", BASE + 5 * MIN, 1.0));
        assert_eq!(a.series_count(), 2);
        assert_eq!(
            a.evict_idle(BASE + 10 * MIN),
            0,
            "exactly the idle limit is kept"
        );
        assert_eq!(a.evict_idle(BASE + 10 * MIN + 1), 1);
        assert_eq!(a.series_count(), 1);
        assert_eq!(a.evict_idle(BASE + 16 * MIN), 1);
        assert_eq!(a.series_count(), 0);
        assert!(a.approx_memory_bytes() == 0);
    }

    #[test]
    fn max_series_refuses_new_series_only() {
        let mut a = Aggregator::new(AggregatorConfig {
            idle_series_after_ms: MIN,
            max_series: 2,
        });
        a.observe(&rec("m", "a", BASE, 1.0));
        a.observe(&rec("m", "b", BASE, 1.0));
        a.observe(&rec("m", "c", BASE, 1.0));
        a.observe(&rec("m", "c", BASE, 1.0));
        a.observe(&rec("m", "a", BASE, 1.0));
        assert_eq!(a.series_count(), 2);
        assert_eq!(a.refused_series(), 2);
        let all = a.query(&q(None, LatencyMetric::E2e, Window::M1, None), BASE);
        assert_eq!(all[0].summary.count, 3);
        assert!(a.approx_memory_bytes() > 0);
    }

    #[test]
    fn counters_follow_the_windows() {
        let mut a = agg();
        let t = BASE + 10 * S;
        for i in 0..10 {
            let mut r = rec("m", if i % 2 == 0 { "a" } else { "b" }, t, 0.5);
            if i == 3 {
                r.status = 502;
                r.error_class = Some(ErrorClass::Upstream5xx);
            }
            a.observe(&r);
        }
        let old = rec("m", "a", t - 2 * MIN, 0.5);
        a.observe(&old);
        let c = a.counts(Some("m"), Window::M1, None, t);
        assert_eq!(c.len(), 1);
        assert_eq!(
            c[0].counts,
            Counts {
                requests: 10,
                errors: 1,
                prompt_tokens: 1000,
                output_tokens: 200
            }
        );
        assert_eq!(c[0].covered_ms, 50 * S);
        assert!((c[0].per_second(c[0].counts.requests) - 0.2).abs() < 1e-12);
        assert_eq!(
            a.counts(Some("m"), Window::M5, None, t)[0].counts.requests,
            11
        );
        let by = a.counts(None, Window::M1, Some(GroupLabel::Tenant), t);
        assert_eq!(
            by.iter()
                .map(|g| (g.labels["tenant"].as_str(), g.counts.requests))
                .collect::<Vec<_>>(),
            [("a", 5), ("b", 5)]
        );
        assert_eq!(by[1].counts.errors, 1);
        let later = a.counts(None, Window::M1, None, t + 2 * MIN);
        assert_eq!(later[0].counts, Counts::default());
        assert!(
            a.counts(None, Window::M1, Some(GroupLabel::Tenant), t + 2 * MIN)
                .is_empty()
        );
    }

    #[test]
    fn hostile_records_do_not_panic() {
        let mut a = agg();
        for (arrival, end) in [
            (i64::MAX, 1e300),
            (i64::MIN, f64::NAN),
            (0, -1.0),
            (i64::MAX, f64::INFINITY),
        ] {
            let mut r = rec("m", "t", 0, 1.0);
            r.arrival_unix_ms = arrival;
            r.end_s = end;
            r.first_token_s = Some(f64::NEG_INFINITY);
            r.queue_s = Some(f64::NAN);
            r.chunk_offsets_us = vec![u32::MAX, 0, u32::MAX];
            a.observe(&r);
            for w in Window::ALL {
                let _ = a.query(
                    &q(None, LatencyMetric::Itl, w, Some(GroupLabel::Instance)),
                    arrival,
                );
                let _ = a.counts(None, w, None, arrival);
            }
            let _ = a.drain_rollups(arrival);
            let _ = a.evict_idle(arrival);
        }
        assert!(a.rejected_values() > 0);
    }

    /// Memory and speed on realistic traffic; `cargo test -p tokenwatch-core --release --
    /// --ignored --nocapture memory_and_speed`.
    #[test]
    #[ignore]
    fn memory_and_speed_report() {
        let mut a = agg();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let series = 20;
        let n = 36_000usize; // 10 req/s for an hour
        let started = std::time::Instant::now();
        for i in 0..n {
            let t = BASE + (i as i64) * 100;
            let mut r = rec("m", &format!("tenant{}", i % series), t, 1.0 + 3.0 * rnd());
            r.first_token_s = Some(0.05 + 0.6 * rnd() * rnd());
            let mut off = 0u32;
            r.chunk_offsets_us = (0..50)
                .map(|_| {
                    off += (5_000.0 + 60_000.0 * rnd() * rnd()) as u32;
                    off
                })
                .collect();
            a.observe(&r);
            if i % 100 == 0 {
                let _ = a.drain_rollups(t);
            }
        }
        let el = started.elapsed();
        let hot = a.approx_memory_bytes() / a.series_count();
        let _ = a.evict_idle(BASE + n as i64 * 100 + 10 * S); // compacts
        println!("before compact ~{hot} bytes/series");
        println!(
            "observe: {:.2} µs/record (50 gaps each); {} series; ~{} bytes/series",
            el.as_secs_f64() * 1e6 / n as f64,
            a.series_count(),
            a.approx_memory_bytes() / a.series_count()
        );
        let now = BASE + n as i64 * 100;
        let started = std::time::Instant::now();
        for _ in 0..100 {
            let _ = a.query(
                &q(
                    None,
                    LatencyMetric::Itl,
                    Window::H1,
                    Some(GroupLabel::Tenant),
                ),
                now,
            );
        }
        println!(
            "query 1h by tenant over {series} series: {:.1} µs",
            started.elapsed().as_secs_f64() * 1e4
        );
        let s = a
            .query(&q(None, LatencyMetric::Itl, Window::H1, None), now)
            .remove(0);
        let one = a.drain_rollups(now + 10 * MIN);
        let bytes: usize = one.iter().map(|r| r.sketch.to_bytes().len()).sum();
        println!(
            "summary {:?}; roll-up encoding {} bytes avg",
            s.summary,
            bytes / one.len().max(1)
        );
    }
}
