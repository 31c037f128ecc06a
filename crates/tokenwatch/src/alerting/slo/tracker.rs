// SLO counting on the alert engine's thread: each record is a good or bad event of every SLO
// (per model / tenant series) in time buckets, and every half second the SLI, budget and burn
// windows of each series are computed once for the `slo_burn` detector, the API and `/metrics`.
// A model no request record names (collector-only: no proxy, no OTLP) is counted from what its
// runtime's scrapes add to its own histograms and counters instead.

use super::metrics::SloMetrics;
use super::{Objective, SloBook, SloConfig, SloLabel, SloStatus};
use crate::alerting::engine::record::{Label, Rec};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use tokenwatch_core::counts::ScrapeCounts;
use tokenwatch_detect as det;

/// Series kept at most (SLOs × models × tenants); records of further series are not counted.
pub const MAX_SERIES: usize = 10_000;
/// How often statuses are recomputed (the buckets are summed once per refresh).
const REFRESH_MS: i64 = 500;
/// A model a request record named this recently is counted from its records only: its
/// runtime's scraped counts would count the same requests twice.
const RECORDS_PREFERRED_MS: i64 = 10 * 60_000;

/// Events counted at once: one request (`total` 1), or what one scrape of a runtime added.
struct Event {
    at_ms: i64,
    bad: u64,
    total: u64,
    /// From the runtime's scraped counts (else from request records).
    runtime: bool,
}

/// One configured SLO, compiled.
#[derive(Debug, Clone)]
pub struct Slo {
    pub name: String,
    pub objective: Objective,
    pub threshold_s: Option<f64>,
    pub target: f64,
    pub window_ms: i64,
    pub by_model: bool,
    pub by_tenant: bool,
    pub lengths: det::BurnWindowLengths,
    /// Bucket width of the burn windows, and of the budget window.
    fine_ms: i64,
    coarse_ms: i64,
    /// The longest burn window (how long fine buckets are kept).
    longest_burn_ms: i64,
}

impl Slo {
    pub fn compile(c: &SloConfig) -> Slo {
        let ms = |d: crate::kernel::duration::HumanDuration| {
            d.0.as_millis().min(i64::MAX as u128) as i64
        };
        let w = &c.burn_windows;
        let [fl, fs, sl, ss] = [w.fast_long, w.fast_short, w.slow_long, w.slow_short].map(ms);
        let window_ms = ms(c.window).max(1000);
        // A tenth of the shortest window, 100 ms–10 s: 10 s buckets for the 5 min default.
        let fine_ms = (fs.min(ss) / 10).clamp(100, 10_000);
        // About 700 buckets over the budget window: 1 h buckets for 28 days.
        let coarse_ms = (window_ms / 672).clamp(fine_ms, 3_600_000);
        Slo {
            name: c.name.clone(),
            objective: c.objective,
            threshold_s: c.threshold_ms().map(|t| t / 1000.0),
            target: c.target(),
            window_ms,
            by_model: c.by.contains(&SloLabel::Model),
            by_tenant: c.by.contains(&SloLabel::Tenant),
            lengths: det::BurnWindowLengths {
                fast_long_s: fl as f64 / 1000.0,
                fast_short_s: fs as f64 / 1000.0,
                slow_long_s: sl as f64 / 1000.0,
                slow_short_s: ss as f64 / 1000.0,
            },
            fine_ms,
            coarse_ms,
            longest_burn_ms: fl.max(fs).max(sl).max(ss),
        }
    }

    /// The request as an event of this SLO: good (`Some(true)`), bad, or not counted (`None`).
    pub fn outcome(&self, r: &Rec) -> Option<bool> {
        let under = |v: Option<f64>| {
            let t = self.threshold_s?;
            if !r.ok {
                return None;
            }
            v.filter(|v| v.is_finite()).map(|v| v <= t)
        };
        match self.objective {
            Objective::Success => Some(!r.server_failure),
            Objective::TtftP95 => under(r.ttft),
            Objective::ItlP99 => under(r.itl),
            // Counted from posted verdicts instead (`observe_verdict`).
            Objective::GuardrailRate => None,
        }
    }

    pub fn error_budget(&self) -> f64 {
        1.0 - self.target
    }
}

/// (bucket start, bad, counted) per bucket of `width` ms, oldest first.
#[derive(Debug, Clone)]
struct Buckets {
    width: i64,
    keep: i64,
    q: VecDeque<(i64, u64, u64)>,
}

impl Buckets {
    fn new(width: i64, keep: i64) -> Buckets {
        Buckets {
            width: width.max(1),
            keep,
            q: VecDeque::new(),
        }
    }

    /// `total` events at `at`, `bad` of them bad.
    fn add(&mut self, at: i64, bad: u64, total: u64) {
        let start = at - at.rem_euclid(self.width);
        match self.q.back_mut() {
            // Out of order (a long request finishing late) counts in the newest bucket.
            Some(last) if last.0 >= start => {
                last.1 += bad;
                last.2 += total;
            }
            _ => self.q.push_back((start, bad, total)),
        }
    }

    /// (bad, counted) of the buckets overlapping the last `span` ms.
    fn sum(&self, now: i64, span: i64) -> (u64, u64) {
        self.q
            .iter()
            .rev()
            .take_while(|(t, _, _)| t + self.width > now - span)
            .fold((0, 0), |(b, n), (_, bad, tot)| (b + bad, n + tot))
    }

    fn prune(&mut self, now: i64) {
        while self
            .q
            .front()
            .is_some_and(|(t, _, _)| t + self.width <= now - self.keep)
        {
            self.q.pop_front();
        }
    }
}

#[derive(Debug, Clone)]
struct Series {
    fine: Buckets,
    coarse: Buckets,
    /// What was counted in it: request records, the runtime's scraped counts.
    from_records: bool,
    from_runtime: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    slo: usize,
    model: Label,
    tenant: Label,
}

/// Every SLO's series, their latest statuses, and where they are published.
#[derive(Default)]
pub struct SloTracker {
    slos: Vec<Slo>,
    series: HashMap<Key, Series>,
    statuses: Vec<SloStatus>,
    last_refresh: Option<i64>,
    book: Option<Arc<SloBook>>,
    metrics: Option<SloMetrics>,
    /// Records of series beyond `MAX_SERIES` (not counted).
    pub overflow: u64,
    /// When a request record last named each model (see `RECORDS_PREFERRED_MS`).
    recorded: HashMap<Label, i64>,
}

impl SloTracker {
    pub fn new(configs: &[SloConfig]) -> SloTracker {
        SloTracker {
            slos: configs.iter().map(Slo::compile).collect(),
            ..SloTracker::default()
        }
    }

    /// Publish statuses to `book` and `metrics` at each refresh.
    pub fn publishing(mut self, book: Arc<SloBook>, metrics: Option<SloMetrics>) -> Self {
        self.book = Some(book);
        self.metrics = metrics;
        self
    }

    pub fn slos(&self) -> &[Slo] {
        &self.slos
    }

    /// Count `configs` from now on (a configuration reload): an SLO whose settings are the same
    /// as before, by name, keeps its series and their counts; the others start empty.
    pub fn reconfigure(&mut self, configs: &[SloConfig], now: i64) {
        let next: Vec<Slo> = configs.iter().map(Slo::compile).collect();
        let moved: Vec<Option<usize>> = self
            .slos
            .iter()
            .map(|old| {
                next.iter()
                    .position(|n| n.name == old.name && format!("{n:?}") == format!("{old:?}"))
            })
            .collect();
        let series = std::mem::take(&mut self.series);
        self.series = series
            .into_iter()
            .filter_map(|(k, s)| {
                let slo = moved.get(k.slo).copied().flatten()?;
                Some((Key { slo, ..k }, s))
            })
            .collect();
        self.slos = next;
        self.statuses.clear();
        self.last_refresh = None;
        // `prune` publishes nothing without SLOs: say here that there are none any more.
        if self.slos.is_empty() {
            if let Some(m) = &self.metrics {
                m.set(&self.statuses);
            }
            if let Some(b) = &self.book {
                b.publish(now, Vec::new());
            }
        }
    }

    /// Count `r` in every SLO it is an event of.
    pub fn observe(&mut self, r: &Rec, tenant: &Label) {
        if self.slos.is_empty() {
            return;
        }
        match self.recorded.get_mut(&r.model) {
            Some(t) => *t = (*t).max(r.at_ms),
            None => {
                self.recorded.insert(r.model.clone(), r.at_ms);
            }
        }
        for i in 0..self.slos.len() {
            if let Some(good) = self.slos[i].outcome(r) {
                let event = Event {
                    at_ms: r.at_ms,
                    bad: u64::from(!good),
                    total: 1,
                    runtime: false,
                };
                self.count(i, &r.model, tenant, event);
            }
        }
    }

    /// Count what one scrape of a model's runtime added, for a model no request record named
    /// in the last `RECORDS_PREFERRED_MS`: `success` from its finished and failed requests,
    /// `ttft_p95` from its TTFT histogram (good: at or under the threshold, interpolated inside
    /// the bucket that holds it — the bucket is the error), `itl_p99` from its inter-token
    /// histogram, its share of slow tokens counted per request (the runtime does not keep each
    /// request's mean). Not split by tenant: the runtime does not know them.
    pub fn observe_scraped(&mut self, c: &ScrapeCounts) {
        if self.slos.is_empty() {
            return;
        }
        let model = Label::new(&c.model_id);
        if self
            .recorded
            .get(&model)
            .is_some_and(|t| c.at_unix_ms - t < RECORDS_PREFERRED_MS)
        {
            return;
        }
        let whole = |v: f64| v.max(0.0).round() as u64;
        for i in 0..self.slos.len() {
            let slo = &self.slos[i];
            let under = |signal: &str| -> Option<(f64, f64)> {
                let h = c.histogram(signal)?;
                let above = h.count_above(slo.threshold_s?)?;
                (h.count > 0.0).then_some((h.count, above.min(h.count)))
            };
            let counted = match slo.objective {
                Objective::Success => c.finished.map(|n| (n, c.failed.unwrap_or(0.0).min(n))),
                Objective::TtftP95 => under("ttft"),
                Objective::ItlP99 => under("itl").and_then(|(n, slow)| {
                    let requests = c.requests().filter(|r| *r > 0.0)?;
                    Some((requests, slow / n * requests))
                }),
                Objective::GuardrailRate => None,
            };
            let Some((total, bad)) = counted.filter(|(n, _)| *n > 0.0) else {
                continue;
            };
            let event = Event {
                at_ms: c.at_unix_ms,
                bad: whole(bad),
                total: whole(total),
                runtime: true,
            };
            self.count(i, &model, &Label::default(), event);
        }
    }

    /// A guardrail or hallucination verdict on a request of `model` for `tenant`: counted by
    /// the `guardrail_rate` SLOs, bad when flagged.
    pub fn observe_verdict(&mut self, model: &Label, tenant: &Label, at_ms: i64, flagged: bool) {
        for i in 0..self.slos.len() {
            if self.slos[i].objective == Objective::GuardrailRate {
                let event = Event {
                    at_ms,
                    bad: u64::from(flagged),
                    total: 1,
                    runtime: false,
                };
                self.count(i, model, tenant, event);
            }
        }
    }

    fn count(&mut self, i: usize, model: &Label, tenant: &Label, e: Event) {
        let s = &self.slos[i];
        {
            let key = Key {
                slo: i,
                model: if s.by_model {
                    model.clone()
                } else {
                    Label::default()
                },
                tenant: if s.by_tenant {
                    tenant.clone()
                } else {
                    Label::default()
                },
            };
            // One hash lookup per SLO (the key's labels are shared, not copied).
            let full = self.series.len() >= MAX_SERIES;
            let series = match self.series.entry(key) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(_) if full => {
                    self.overflow += 1;
                    return;
                }
                Entry::Vacant(e) => e.insert(Series {
                    fine: Buckets::new(s.fine_ms, s.longest_burn_ms),
                    coarse: Buckets::new(s.coarse_ms, s.window_ms),
                    from_records: false,
                    from_runtime: false,
                }),
            };
            series.fine.add(e.at_ms, e.bad, e.total);
            series.coarse.add(e.at_ms, e.bad, e.total);
            if e.runtime {
                series.from_runtime = true;
            } else {
                series.from_records = true;
            }
        }
    }

    /// Forget buckets older than their windows (and series left empty); recompute and publish
    /// the statuses when due.
    pub fn prune(&mut self, now: i64) {
        if self.slos.is_empty() || self.last_refresh.is_some_and(|t| now - t < REFRESH_MS) {
            return;
        }
        self.last_refresh = Some(now);
        for s in self.series.values_mut() {
            s.fine.prune(now);
            s.coarse.prune(now);
        }
        self.series.retain(|_, s| !s.coarse.q.is_empty());
        self.recorded.retain(|_, t| now - *t < RECORDS_PREFERRED_MS);
        self.statuses = self.compute(now);
        if let Some(m) = &self.metrics {
            m.set(&self.statuses);
        }
        if let Some(b) = &self.book {
            b.publish(now, self.statuses.clone());
        }
    }

    /// The statuses of the last refresh: every series, and one `no_data` entry for each SLO
    /// without any.
    pub fn statuses(&self) -> &[SloStatus] {
        &self.statuses
    }

    /// Models that have an SLO series.
    pub fn models(&self) -> impl Iterator<Item = &Label> {
        self.series.keys().map(|k| &k.model)
    }

    fn compute(&self, now: i64) -> Vec<SloStatus> {
        let mut keys: Vec<&Key> = self.series.keys().collect();
        keys.sort();
        let mut out = Vec::with_capacity(keys.len() + self.slos.len());
        for (i, slo) in self.slos.iter().enumerate() {
            let mine: Vec<&&Key> = keys.iter().filter(|k| k.slo == i).collect();
            if mine.is_empty() {
                out.push(status(slo, BTreeMap::new(), None, now));
            }
            for k in mine {
                let mut labels = BTreeMap::new();
                if slo.by_model {
                    labels.insert("model_id".to_string(), k.model.to_string());
                }
                if slo.by_tenant {
                    labels.insert("tenant".to_string(), k.tenant.to_string());
                }
                out.push(status(slo, labels, self.series.get(*k), now));
            }
        }
        out
    }
}

/// (bad / counted) / budget; None without requests.
fn burn(window: (u64, u64), budget: f64) -> Option<f64> {
    let (bad, total) = window;
    (total > 0 && budget > 0.0).then(|| bad as f64 / total as f64 / budget)
}

fn status(
    slo: &Slo,
    labels: BTreeMap<String, String>,
    series: Option<&Series>,
    now: i64,
) -> SloStatus {
    let ms = |s: f64| (s * 1000.0) as i64;
    let len = &slo.lengths;
    let spans = [
        len.fast_long_s,
        len.fast_short_s,
        len.slow_long_s,
        len.slow_short_s,
    ];
    let sums = spans.map(|s| series.map_or((0, 0), |x| x.fine.sum(now, ms(s))));
    let (bad, total) = series.map_or((0, 0), |x| x.coarse.sum(now, slo.window_ms));
    let budget = slo.error_budget();
    let err = (total > 0).then(|| bad as f64 / total as f64);
    let names = len.names();
    let burn_status = (0..4)
        .map(|j| super::BurnWindowStatus {
            window: names[j].clone(),
            pair: if j < 2 { "fast" } else { "slow" },
            bad: sums[j].0,
            total: sums[j].1,
            burn_rate: burn(sums[j], budget),
        })
        .collect();
    let note = match (total, slo.objective) {
        (0, Objective::GuardrailRate) => Some(
            "no request carries a guardrail or hallucination verdict yet: nothing to count"
                .to_string(),
        ),
        (0, _) => Some("no request counted in the window".to_string()),
        _ => None,
    };
    SloStatus {
        slo: slo.name.clone(),
        objective: slo.objective,
        threshold_ms: slo.threshold_s.map(|t| t * 1000.0),
        target: slo.target,
        window: det::window_name(slo.window_ms as f64 / 1000.0),
        by: [
            (slo.by_model, SloLabel::Model),
            (slo.by_tenant, SloLabel::Tenant),
        ]
        .into_iter()
        .filter_map(|(on, l)| on.then_some(l))
        .collect(),
        labels,
        status: if total == 0 { "no_data" } else { "ok" },
        counted_from: match series.map(|s| (s.from_records, s.from_runtime)) {
            Some((true, true)) => "requests and runtime",
            Some((false, true)) => "runtime",
            _ => "requests",
        },
        note,
        total,
        bad,
        sli: err.map(|e| 1.0 - e),
        error_budget: budget,
        budget_remaining: err.map(|e| 1.0 - e / budget),
        burn: burn_status,
        counts: det::BurnWindows {
            h1: sums[0],
            m5: sums[1],
            h6: sums[2],
            m30: sums[3],
        },
        lengths: *len,
        window_days: slo.window_ms as f64 / 86_400_000.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerting::slo::{BurnWindowsConfig, SloConfig};
    use crate::kernel::duration::HumanDuration;
    use std::time::Duration;

    fn rec(model: &str, at: i64, ttft: f64, ok: bool) -> Rec {
        Rec {
            model: model.into(),
            at_ms: at,
            ttft: Some(ttft),
            itl: Some(0.02),
            e2e: ttft + 1.0,
            ok,
            server_failure: !ok,
            ..Rec::default()
        }
    }

    fn short(objective: Objective) -> SloConfig {
        let s = |n| HumanDuration(Duration::from_secs(n));
        SloConfig {
            window: s(600),
            burn_windows: BurnWindowsConfig {
                fast_long: s(60),
                fast_short: s(10),
                slow_long: s(300),
                slow_short: s(30),
            },
            ..SloConfig::default_for(objective)
        }
    }

    /// One scrape of model `m`'s runtime at `at`: `n` requests, `failed` of them failed, TTFT
    /// observations split over vLLM's buckets around the 800 ms threshold.
    fn scraped(model: &str, at: i64, n: f64, failed: f64, ttft_counts: [f64; 3]) -> ScrapeCounts {
        use tokenwatch_core::histogram::CumulativeHistogram;
        // Buckets ≤ 0.5, ≤ 1.0 (0.8 lies in it: 60 % of its observations count as good), +Inf.
        let ttft =
            CumulativeHistogram::from_bucket_counts(&[0.5, 1.0, f64::INFINITY], &ttft_counts);
        ScrapeCounts {
            model_id: model.into(),
            instance: "10.0.0.1:8000".into(),
            runtime: "vllm".into(),
            at_unix_ms: at,
            interval_ms: 5_000,
            finished: Some(n),
            failed: Some(failed),
            prompt_tokens: None,
            output_tokens: None,
            latency: vec![("ttft".into(), ttft)],
        }
    }

    #[test]
    fn a_model_no_record_names_is_counted_from_its_runtimes_scrapes() {
        let mut t = SloTracker::new(&[short(Objective::TtftP95), short(Objective::Success)]);
        // 10 scrapes: 100 requests each, 2 failed; TTFT 90 under 0.5 s, 5 in 0.5–1.0 s, 3 above.
        for k in 0..10i64 {
            t.observe_scraped(&scraped("m", 5_000 * (k + 1), 100.0, 2.0, [90.0, 5.0, 3.0]));
        }
        t.prune(51_000);
        let st = t.statuses();
        let (ttft, success) = (&st[0], &st[1]);
        assert_eq!((success.total, success.bad), (1000, 20));
        assert_eq!(success.counted_from, "runtime");
        // Bad: 3 above 1.0 s and 40 % of the 5 in (0.5, 1.0] (0.8 s interpolated) = 5 a scrape.
        assert_eq!((ttft.total, ttft.bad), (980, 50));
        assert_eq!(ttft.counted_from, "runtime");
        assert_eq!(ttft.labels["model_id"], "m");
        assert!(ttft.burn.iter().all(|w| w.total > 0), "{:?}", ttft.burn);
    }

    #[test]
    fn a_model_with_request_records_is_not_counted_twice_from_its_runtime() {
        let mut t = SloTracker::new(&[short(Objective::Success)]);
        let none = Label::default();
        t.observe(&rec("m", 1_000, 0.3, true), &none);
        t.observe_scraped(&scraped("m", 5_000, 100.0, 50.0, [98.0, 0.0, 0.0]));
        // Another model, no record: counted from its runtime.
        t.observe_scraped(&scraped("other", 5_000, 100.0, 1.0, [99.0, 0.0, 0.0]));
        t.prune(6_000);
        let st = t.statuses();
        let m = st.iter().find(|s| s.labels["model_id"] == "m").unwrap();
        assert_eq!((m.total, m.bad, m.counted_from), (1, 0, "requests"));
        let other = st.iter().find(|s| s.labels["model_id"] == "other").unwrap();
        assert_eq!(
            (other.total, other.bad, other.counted_from),
            (100, 1, "runtime")
        );
        // Ten minutes without a record of "m": its runtime counts again.
        t.observe_scraped(&scraped(
            "m",
            1_000 + RECORDS_PREFERRED_MS,
            100.0,
            50.0,
            [50.0, 0.0, 0.0],
        ));
        t.prune(2_000 + RECORDS_PREFERRED_MS);
        let st = t.statuses();
        let m = st.iter().find(|s| s.labels["model_id"] == "m").unwrap();
        assert_eq!(m.counted_from, "requests and runtime");
    }

    #[test]
    fn request_based_sli_budget_and_burn() {
        let mut t = SloTracker::new(&[short(Objective::TtftP95), short(Objective::Success)]);
        let none = Label::default();
        // 200 requests over 100 s: every 10th slower than 800 ms, every 50th failed.
        for k in 0..200i64 {
            let slow = k % 10 == 0;
            let failed = k % 50 == 1;
            t.observe(
                &rec("m", 1_000 + k * 500, if slow { 1.2 } else { 0.3 }, !failed),
                &none,
            );
        }
        t.prune(101_000);
        let st = t.statuses();
        assert_eq!(st.len(), 2);
        let ttft = &st[0];
        assert_eq!((ttft.slo.as_str(), ttft.status), ("ttft_p95", "ok"));
        assert_eq!(ttft.labels["model_id"], "m");
        // Failed requests are not latency events: 196 counted, 20 of them slow.
        assert_eq!((ttft.bad, ttft.total), (20, 196));
        let err = 20.0 / 196.0;
        assert!((ttft.sli.unwrap() - (1.0 - err)).abs() < 1e-12);
        // 10.2 % slow against a 5 % budget: the budget is overspent (remaining < 0).
        assert!((ttft.budget_remaining.unwrap() - (1.0 - err / 0.05)).abs() < 1e-9);
        // Fast long window = 60 s (+ the partial bucket): burn = its slow share / 5 %.
        let w = &ttft.burn[0];
        assert_eq!((w.window.as_str(), w.pair), ("1m", "fast"));
        assert!((w.burn_rate.unwrap() - w.bad as f64 / w.total as f64 / 0.05).abs() < 1e-12);
        assert!(w.total >= 115 && w.total <= 125, "{w:?}");
        let success = &st[1];
        assert_eq!((success.bad, success.total), (4, 200));
        assert!((success.budget_remaining.unwrap() - (1.0 - 0.02 / 0.005)).abs() < 1e-9);
    }

    #[test]
    fn burn_windows_feed_the_detect_burn_logic() {
        let mut t = SloTracker::new(&[short(Objective::TtftP95)]);
        let none = Label::default();
        // 5 minutes healthy, then 40 s of every request slow.
        for k in 0..600i64 {
            t.observe(&rec("m", k * 500, 0.2, true), &none);
        }
        for k in 0..160i64 {
            t.observe(&rec("m", 300_000 + k * 250, 2.0, true), &none);
        }
        t.prune(340_000);
        let s = &t.statuses()[0];
        let p = det::SloBurnParams {
            objective: s.target,
            period_days: s.window_days,
            ..det::SloBurnParams::default()
        };
        let f = det::slo_burn_over(&s.counts, &p, &s.lengths, det::BurnCondition::Fast)
            .expect("fast burn");
        // 10 s all slow: 20×; 60 s: 160 slow of ~200: ~16× (both ≥ 14.4).
        let rate = |w: &str| f.evidence[&format!("burn_rate_{w}")].as_f64().unwrap();
        assert!((rate("10s") - 20.0).abs() < 1e-9, "{f:?}");
        assert!(rate("1m") >= 14.4 && rate("1m") < 20.0, "{f:?}");
        // The slow pair (5 min at ~4×, 30 s at 20×) is under 6×: no ticket yet.
        assert!(det::slo_burn_over(&s.counts, &p, &s.lengths, det::BurnCondition::Slow).is_none());
        // Healthy traffic: no burn.
        let mut h = SloTracker::new(&[short(Objective::TtftP95)]);
        for k in 0..600i64 {
            h.observe(
                &rec("m", k * 500, if k % 40 == 0 { 1.0 } else { 0.2 }, true),
                &none,
            );
        }
        h.prune(300_000);
        let s = &h.statuses()[0];
        let p = det::SloBurnParams {
            objective: s.target,
            ..det::SloBurnParams::default()
        };
        assert!(det::slo_burn_over(&s.counts, &p, &s.lengths, det::BurnCondition::Any).is_none());
        assert!(s.budget_remaining.unwrap() > 0.4, "{s:?}");
    }

    #[test]
    fn reconfigure_keeps_the_series_of_unchanged_slos() {
        let mut t = SloTracker::new(&[short(Objective::TtftP95), short(Objective::Success)]);
        let none = Label::default();
        for k in 0..10i64 {
            t.observe(
                &rec("m", 1_000 + k * 100, if k < 3 { 2.0 } else { 0.2 }, k != 0),
                &none,
            );
        }
        // Success is dropped, TTFT stays as it was (now first), a tighter success SLO is new.
        let mut strict = short(Objective::Success);
        strict.name = "success_strict".into();
        strict.window = HumanDuration(Duration::from_secs(300));
        t.reconfigure(&[strict, short(Objective::TtftP95)], 2_000);
        t.prune(2_000);
        let st = t.statuses();
        assert_eq!(st.len(), 2, "{st:#?}");
        assert_eq!(
            (st[0].slo.as_str(), st[0].status),
            ("success_strict", "no_data")
        );
        assert_eq!(
            (st[1].slo.as_str(), st[1].bad, st[1].total),
            ("ttft_p95", 2, 9)
        );
        t.reconfigure(&[], 3_000);
        t.prune(3_000);
        assert!(t.statuses().is_empty());
    }

    #[test]
    fn per_tenant_series_no_data_and_pruning() {
        let mut cfg = short(Objective::Success);
        cfg.by = vec![SloLabel::Model, SloLabel::Tenant];
        let mut t = SloTracker::new(&[cfg, short(Objective::GuardrailRate)]);
        t.observe(&rec("m", 1_000, 0.1, true), &Label::from("acme"));
        t.observe(&rec("m", 1_000, 0.1, false), &Label::from("globex"));
        t.prune(2_000);
        let st = t.statuses();
        assert_eq!(st.len(), 3, "{st:#?}");
        assert_eq!(st[0].labels["tenant"], "acme");
        assert_eq!((st[1].labels["tenant"].as_str(), st[1].bad), ("globex", 1));
        // The guardrail SLO has nothing to count: no SLI, no budget, and says why.
        let g = &st[2];
        assert_eq!((g.slo.as_str(), g.status), ("guardrail_rate", "no_data"));
        assert!(g.sli.is_none() && g.budget_remaining.is_none());
        assert!(g.note.as_deref().unwrap().contains("verdict"));
        // Refreshes are at most every REFRESH_MS; after the SLO window the series are gone.
        t.prune(2_100);
        assert_eq!(t.statuses().len(), 3);
        t.prune(700_000);
        assert_eq!(t.statuses().len(), 2);
        assert!(t.statuses().iter().all(|s| s.status == "no_data"));
    }

    #[test]
    fn guardrail_verdicts_are_counted_by_the_guardrail_slo_only() {
        let mut t = SloTracker::new(&[short(Objective::Success), short(Objective::GuardrailRate)]);
        let (m, none) = (Label::from("m"), Label::default());
        for k in 0..10i64 {
            t.observe_verdict(&m, &none, 1_000 + k * 100, k < 4);
        }
        t.prune(2_500);
        let st = t.statuses();
        assert_eq!(st.len(), 2, "{st:#?}");
        assert_eq!((st[0].slo.as_str(), st[0].status), ("success", "no_data"));
        let g = &st[1];
        assert_eq!((g.slo.as_str(), g.bad, g.total), ("guardrail_rate", 4, 10));
        assert!((g.sli.unwrap() - 0.6).abs() < 1e-9, "{g:?}");
        assert!(
            g.budget_remaining.unwrap() < 0.0,
            "40% flagged overspends a 3.5% budget"
        );
    }

    #[test]
    fn bucket_sizes_follow_the_windows() {
        let d = Slo::compile(&SloConfig::default_for(Objective::TtftP95));
        assert_eq!((d.fine_ms, d.coarse_ms), (10_000, 3_600_000));
        let s = Slo::compile(&short(Objective::TtftP95));
        assert_eq!(s.fine_ms, 1000);
        let mut b = Buckets::new(1000, 5000);
        b.add(10_500, 1, 1);
        b.add(9_000, 0, 1); // late: joins the newest bucket
        b.add(12_100, 0, 1);
        assert_eq!(b.sum(12_500, 1000), (0, 1));
        assert_eq!(b.sum(12_500, 3000), (1, 3));
        b.prune(16_000);
        assert_eq!(b.sum(16_000, 10_000), (0, 1));
    }
}
