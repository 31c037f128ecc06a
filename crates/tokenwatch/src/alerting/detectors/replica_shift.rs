// `replica_shift`: sequential tests (banks of Bernoulli CUSUMs spending a stated false-alarm
// budget) on what each serving instance's own metrics count every scrape — requests the server
// failed, requests slower than the anchor says they should be — and names the replica that is
// worse than its peers and than itself, or the model when all of it shifts. Works behind one
// Service and without the proxy: it reads scraped counts only (`tokenwatch_core::counts`).
//
// Two kinds of test per series (a replica, or the model as a whole):
// - errors: the failed share, against the series' clean baseline (and, for a replica, its
//   peers' over the same baseline);
// - latency: the share of observations beyond a multiple of a recent quantile of an anchor,
//   against the series' own clean baseline of that share. A replica's anchor is its own recent
//   median (its tail against its body: a replica drifting a little apart from its peers, or a
//   load ramp, leaves it alone), and its peers' shares of the same measure are a second
//   reference; the model's anchor is its own recent distribution. The anchor moves with the
//   load, so a swing that slows every request alike is no shift; a fault on some requests is.

use super::{BuiltinExport, Detector, EvalCtx, RuleInput};
use crate::alerting::engine::eval::labels;
use crate::alerting::rules::{RuleError, RuleSpec};
use std::collections::{BTreeMap, VecDeque};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::counts::ScrapeCounts;
use tokenwatch_core::histogram::CumulativeHistogram;
use tokenwatch_detect::sequential as seq;
use tokenwatch_detect::{self as det, Finding};

/// Counts are kept per minute: the references sum minutes, and overdispersion compares them.
const MINUTE_MS: i64 = 60_000;
/// Overdispersion assumed until enough clean minutes are seen to estimate it.
const DEFAULT_OVERDISPERSION: f64 = 2.0;
/// Largest overdispersion used (a test slowed beyond this is better off not counting).
const MAX_OVERDISPERSION: f64 = 20.0;
/// A location slot is read this long after it ends (the scrapes stamped in it, every series',
/// have been evaluated: they are stamped when they arrive).
const SETTLE_LAG_MS: i64 = 5_000;
/// Smallest spread (standard deviation) of a minute's log median ratio used: medians read from
/// histogram buckets are not exact.
const MIN_LOG_RATIO_SPREAD: f64 = 0.02;

pub struct ReplicaShift {
    pub params: det::ReplicaShiftParams,
    /// Last sequence read from the board's counts log.
    read_seq: u64,
    models: BTreeMap<String, ModelState>,
}

/// What one test counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    /// Requests the server failed.
    Errors,
    /// Observations beyond `tail_multiple` × the quantile with these bits of the model's recent
    /// distribution (the model's own tests).
    Beyond(u64),
    /// Observations beyond `own_multiple` × the quantile with these bits of the replica's own
    /// recent distribution (a replica's tests).
    OwnBeyond(u64),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct TestKey {
    /// The latency signal; empty for errors.
    signal: String,
    kind: Kind,
}

impl TestKey {
    fn errors() -> TestKey {
        TestKey {
            signal: String::new(),
            kind: Kind::Errors,
        }
    }

    /// The quantile of the anchor and the multiple of it beyond which a request is slow.
    fn bound(&self, p: &det::ReplicaShiftParams) -> Option<(f64, f64)> {
        match self.kind {
            Kind::Errors => None,
            Kind::Beyond(q) => Some((f64::from_bits(q), p.tail_multiple)),
            Kind::OwnBeyond(q) => Some((f64::from_bits(q), p.own_multiple)),
        }
    }

    /// "failed", "TTFT beyond 3 × the model's recent P90", "ITL beyond 6 × its own recent median".
    fn describe(&self, p: &det::ReplicaShiftParams) -> String {
        let Some((q, multiple)) = self.bound(p) else {
            return "failed".into();
        };
        let quantile = if q == 0.5 {
            "median".to_string()
        } else {
            format!("P{}", (q * 100.0).round())
        };
        let whose = match self.kind {
            Kind::OwnBeyond(_) => "its own",
            _ => "the model's",
        };
        format!(
            "{} beyond {multiple} × {whose} recent {quantile}",
            self.signal.to_uppercase()
        )
    }

    /// The evidence key: `errors`, `ttft_beyond_p90` (model), `ttft_beyond_own_p50` (replica).
    fn evidence_key(&self) -> String {
        let pct = |q: u64| (f64::from_bits(q) * 100.0).round();
        match self.kind {
            Kind::Errors => "errors".into(),
            Kind::Beyond(q) => format!("{}_beyond_p{}", self.signal, pct(q)),
            Kind::OwnBeyond(q) => format!("{}_beyond_own_p{}", self.signal, pct(q)),
        }
    }
}

/// Adds `h` to the histogram of `signal` in `into` (a changed bucket layout starts it again).
fn merge(into: &mut BTreeMap<String, CumulativeHistogram>, signal: &str, h: &CumulativeHistogram) {
    if !into.get_mut(signal).is_some_and(|acc| acc.add(h)) {
        into.insert(signal.to_string(), h.clone());
    }
}

/// A per-token histogram (ITL) counts as many trials as there were requests, its share of slow
/// observations kept: one slow request is not hundreds of independent ones.
fn per_request(n: f64, x: f64, requests: f64) -> (f64, f64) {
    if n > requests && requests > 0.0 {
        (requests, x * requests / n)
    } else {
        (n, x)
    }
}

/// One minute of one series' counts.
#[derive(Debug, Default)]
struct Minute {
    start: i64,
    /// Requests (finished, else TTFT observations), for the request rate.
    requests: f64,
    finished: f64,
    failed: f64,
    latency: BTreeMap<String, CumulativeHistogram>,
    /// (trials, events) of the latency tests, counted as the scrapes arrived (their threshold
    /// moves with the anchor).
    beyond: BTreeMap<TestKey, (f64, f64)>,
    /// Each test's Pearson residuals of the scrapes in it against the reference rate then:
    /// (sum of squared residuals, scrapes) — the overdispersion at the scale the CUSUMs see.
    pearson: BTreeMap<TestKey, (f64, f64)>,
    /// A test of the series was alarmed in it: left out of its own reference.
    alarmed: bool,
    /// The location test's slots of the minute (`location_step_s` each), in time order.
    slots: Vec<Slot>,
}

/// One slot of a minute as the location test reads it.
#[derive(Debug, Default)]
struct Slot {
    /// The latency histograms of the scrapes stamped in it.
    latency: BTreeMap<String, CumulativeHistogram>,
    /// The location test has read this slot …
    located: bool,
    /// … and found these logs of the replica's median over its peers' median, per signal, from
    /// this slot and the next `slots − 1` pooled with it (where one slot held too few).
    log_ratio: BTreeMap<String, (f64, usize)>,
}

/// Consecutive slots of one signal pooled until both the replica and its peers hold enough
/// observations for a median (a replica at under a request a second).
#[derive(Debug, Clone)]
struct Pool {
    start: i64,
    slots: usize,
    own: Option<CumulativeHistogram>,
    peers: Option<CumulativeHistogram>,
}

impl Pool {
    fn new(start: i64) -> Pool {
        Pool {
            start,
            slots: 0,
            own: None,
            peers: None,
        }
    }

    fn add(&mut self, own: Option<&CumulativeHistogram>, peers: Option<&CumulativeHistogram>) {
        let add = |into: &mut Option<CumulativeHistogram>, h: Option<&CumulativeHistogram>| {
            // A histogram of another layout (the runtime restarted with new buckets) starts
            // the pool's afresh, as `merge` does.
            if let Some(h) = h
                && !into.as_mut().is_some_and(|acc| acc.add(h))
            {
                *into = Some(h.clone());
            }
        };
        add(&mut self.own, own);
        add(&mut self.peers, peers);
        self.slots += 1;
    }
}

impl Minute {
    /// One scrape's counts, its latency tests' (trials, events), and whether the series is
    /// alarmed (the minute then stays out of its reference).
    fn add(&mut self, c: &ScrapeCounts, latency_trials: &[(TestKey, (f64, f64))], alarmed: bool) {
        self.finished += c.finished.unwrap_or(0.0);
        self.failed += c.failed.unwrap_or(0.0);
        self.requests += c.requests().unwrap_or(0.0);
        for (s, h) in &c.latency {
            merge(&mut self.latency, s, h);
        }
        self.count(latency_trials);
        self.alarmed |= alarmed;
    }

    /// Adds latency tests' (trials, events) of a scrape (errors are counted from `finished`
    /// and `failed`).
    fn count(&mut self, latency_trials: &[(TestKey, (f64, f64))]) {
        for (k, (n, x)) in latency_trials
            .iter()
            .filter(|(k, _)| k.kind != Kind::Errors)
        {
            let acc = self.beyond.entry(k.clone()).or_default();
            acc.0 += n;
            acc.1 += x;
        }
    }

    /// The location slot holding `at` (the minute has `60 / step` of them).
    fn slot(&mut self, at: i64, step_ms: i64) -> &mut Slot {
        let slots = (MINUTE_MS / step_ms.max(1)).max(1) as usize;
        if self.slots.len() < slots {
            self.slots.resize_with(slots, Slot::default);
        }
        let i = ((at - self.start).max(0) / step_ms.max(1)) as usize;
        &mut self.slots[i.min(slots - 1)]
    }

    /// (start, slot) of each location slot, in time order.
    fn slots(&self, step_ms: i64) -> impl Iterator<Item = (i64, &Slot)> {
        self.slots
            .iter()
            .enumerate()
            .map(move |(i, s)| (self.start + i as i64 * step_ms, s))
    }

    /// (trials, events) of a test in this minute.
    fn trials(&self, k: &TestKey) -> Option<(f64, f64)> {
        match k.kind {
            Kind::Errors => {
                (self.finished > 0.0).then_some((self.finished, self.failed.min(self.finished)))
            }
            Kind::Beyond(_) | Kind::OwnBeyond(_) => self.beyond.get(k).copied(),
        }
    }
}

/// A test's counts over a reference period: in all, per minute of each block, and the
/// scrapes' Pearson residuals.
#[derive(Debug, Default)]
struct Reference {
    n: f64,
    x: f64,
    blocks: Vec<Vec<(f64, f64)>>,
    pearson: (f64, f64),
    /// First and last minute it holds.
    span: Option<(i64, i64)>,
}

/// Fewest scrapes whose residuals estimate the per-scrape overdispersion.
const MIN_PEARSON_SCRAPES: f64 = 20.0;

impl Reference {
    fn add(&mut self, o: Reference) {
        self.n += o.n;
        self.x += o.x;
        self.blocks.extend(o.blocks);
        self.pearson.0 += o.pearson.0;
        self.pearson.1 += o.pearson.1;
        self.span = match (self.span, o.span) {
            (Some(a), Some(b)) => Some((a.0.min(b.0), a.1.max(b.1))),
            (a, b) => a.or(b),
        };
    }

    /// How much more its counts vary than a binomial's, at the larger of two scales: between
    /// minutes of a block, and between scrapes (batches fail or stall requests together).
    fn overdispersion(&self) -> Option<f64> {
        let minutes = seq::overdispersion(&self.blocks);
        let scrapes =
            (self.pearson.1 >= MIN_PEARSON_SCRAPES).then(|| self.pearson.0 / self.pearson.1);
        minutes
            .into_iter()
            .chain(scrapes)
            .reduce(f64::max)
            .map(|v| v.max(1.0))
    }

    /// The reference rate: the upper confidence bound over the whole period, once it holds
    /// enough observations over a long enough span. Its standard error is a binomial's widened
    /// by the counts' overdispersion `phi` (clumped counts say less about the rate: a short
    /// baseline of bursty traffic is not read as a low rate).
    fn rate(&self, p: &det::ReplicaShiftParams, phi: f64) -> Option<f64> {
        let (first, last) = self.span?;
        let covered_ms = last + MINUTE_MS - first;
        if self.n < p.min_reference || covered_ms < (p.min_baseline_s * 1000.0) as i64 {
            return None;
        }
        seq::rate_upper(self.x, self.n, p.reference_z * phi.max(1.0).sqrt())
    }
}

/// A test's CUSUMs and what they last compared, for the alert's evidence.
#[derive(Debug, Default, Clone)]
struct Shift {
    cusum: seq::CusumBank,
    reference: f64,
    own: Option<f64>,
    peers: Option<f64>,
    design: f64,
    threshold: f64,
    overdispersion: f64,
}

/// What a replica's clean samples of one signal give its location test.
#[derive(Debug, Clone, Copy)]
struct LocationBaseline {
    /// Mean and spread of the log median ratio …
    mean: f64,
    sigma: f64,
    /// … and the slots a sample usually spans.
    slots: usize,
}

/// A replica's location test of one signal: a Gaussian CUSUM on the minutes' log median ratio
/// against its peers, and what it last compared, for the alert's evidence.
#[derive(Debug, Default, Clone)]
struct Location {
    /// The CUSUM statistic (nats) …
    s: f64,
    /// … the slot its run began (the change point when it alarms) …
    since: i64,
    /// … and whether it crossed the threshold (until it falls back to 0).
    alarmed: bool,
    /// The last slot's median ratio, the usual one, the spread of its log, the designed
    /// shift (standard deviations) and the threshold.
    ratio: f64,
    usual: f64,
    sigma: f64,
    design: f64,
    threshold: f64,
}

impl Location {
    /// One sample's log ratio `r` (its first slot began at `start`; it spans `slots`) against
    /// the baseline's mean `mu` and spread `sigma`.
    fn update(
        &mut self,
        (start, slots): (i64, usize),
        r: f64,
        base: LocationBaseline,
        h: f64,
        p: &Params,
    ) {
        let (mu, sigma) = (base.mean, base.sigma);
        let design = (p.location_ratio.ln() / sigma).max(p.location_min_sigmas);
        let z = (r - mu) / sigma;
        if self.s <= 0.0 {
            self.since = start;
        }
        // One slot adds at most about a third of the threshold, a pooled sample of two slots or
        // more a half: no single sample (one stalled batch), nor one bad minute, pages.
        let samples = if slots >= 2 { 2 } else { 3 };
        let llr = seq::gaussian_llr(z, design).min(seq::sample_cap(h, samples));
        self.s = (self.s + llr).clamp(0.0, 1.5 * h);
        self.alarmed = if self.alarmed {
            self.s > 0.0
        } else {
            self.s >= h
        };
        self.ratio = r.exp();
        self.usual = mu.exp();
        self.sigma = sigma;
        self.design = design;
        self.threshold = h;
    }
}

type Params = det::ReplicaShiftParams;

/// A series: an instance, or the model as a whole (all its instances' counts).
#[derive(Debug, Default)]
struct Series {
    minutes: VecDeque<Minute>,
    tests: BTreeMap<TestKey, Shift>,
    /// A replica's location tests, per signal …
    location: BTreeMap<String, Location>,
    /// … and the slots each is pooling.
    pools: BTreeMap<String, Pool>,
    alarmed_since: Option<i64>,
    last_seen: i64,
}

impl Series {
    fn minute(&mut self, at: i64) -> &mut Minute {
        let start = at - at.rem_euclid(MINUTE_MS);
        if self.minutes.back().is_none_or(|m| m.start < start) {
            self.minutes.push_back(Minute {
                start,
                ..Minute::default()
            });
        }
        self.minutes.back_mut().expect("just pushed")
    }

    /// The location slot that begins at `start`.
    fn slot_at(&self, start: i64, step_ms: i64) -> Option<&Slot> {
        let m = self
            .minutes
            .iter()
            .find(|m| m.start <= start && start < m.start + MINUTE_MS)?;
        m.slots(step_ms)
            .find(|(at, _)| *at == start)
            .map(|(_, slot)| slot)
    }

    /// The minute holding `at`, if kept.
    fn minute_holding(&mut self, at: i64) -> Option<&mut Minute> {
        self.minutes
            .iter_mut()
            .find(|m| m.start <= at && at < m.start + MINUTE_MS)
    }

    /// Drops the minutes before `before`, and the histograms of those before `anchor_from`
    /// (only anchors read them; the references keep their counts).
    fn prune(&mut self, before: i64, anchor_from: i64) {
        while self.minutes.front().is_some_and(|m| m.start < before) {
            self.minutes.pop_front();
        }
        for m in self
            .minutes
            .iter_mut()
            .take_while(|m| m.start < anchor_from)
        {
            m.latency.clear();
            m.slots.iter_mut().for_each(|s| s.latency.clear());
        }
    }

    /// The counts of `k` over minutes starting in `[from, to)`, clean ones only when `clean`,
    /// grouped in blocks of `block_ms`.
    fn reference(&self, k: &TestKey, from: i64, to: i64, clean: bool, block_ms: i64) -> Reference {
        let mut r = Reference::default();
        let mut blocks: BTreeMap<i64, Vec<(f64, f64)>> = BTreeMap::new();
        for m in self
            .minutes
            .iter()
            .filter(|m| m.start >= from && m.start < to)
        {
            if clean && m.alarmed {
                continue;
            }
            if let Some(&(sq, scrapes)) = m.pearson.get(k) {
                r.pearson.0 += sq;
                r.pearson.1 += scrapes;
            }
            if let Some((n, x)) = m.trials(k) {
                r.n += n;
                r.x += x;
                r.span = Some((r.span.map_or(m.start, |s| s.0), m.start));
                blocks
                    .entry((m.start - from) / block_ms.max(1))
                    .or_default()
                    .push((n, x));
            }
        }
        r.blocks = blocks.into_values().collect();
        r
    }

    /// The latency histograms of the minutes starting at or after `from`, merged.
    fn recent_latency(&self, from: i64) -> BTreeMap<String, CumulativeHistogram> {
        let mut out = BTreeMap::new();
        for m in self.minutes.iter().filter(|m| m.start >= from) {
            for (s, h) in &m.latency {
                merge(&mut out, s, h);
            }
        }
        out
    }

    /// Requests per second over the kept minutes (the current one included).
    fn request_rate(&self, now: i64) -> f64 {
        let Some(first) = self.minutes.front() else {
            return 0.0;
        };
        let n: f64 = self.minutes.iter().map(|m| m.requests).sum();
        n / ((now - first.start) as f64 / 1000.0).max(1.0)
    }

    /// A test's (trials, events) over the minutes from the one holding `from` on.
    fn trials_since(&self, k: &TestKey, from: i64) -> (f64, f64) {
        let from = from - from.rem_euclid(MINUTE_MS);
        self.minutes
            .iter()
            .filter(|m| m.start >= from)
            .filter_map(|m| m.trials(k))
            .fold((0.0, 0.0), |(a, b), (n, x)| (a + n, b + x))
    }

    fn alarmed(&self) -> bool {
        self.tests.values().any(|t| t.cusum.alarmed()) || self.location.values().any(|l| l.alarmed)
    }

    /// The mean and spread of a signal's log median ratio over the samples of the clean minutes
    /// starting in `[from, to)`, once they span `location_min_minutes` minutes' worth of slots,
    /// and the slots a sample usually spans (its median). The spread is the larger of the
    /// standard deviation and the scaled median absolute deviation, and at least
    /// `MIN_LOG_RATIO_SPREAD`.
    fn location_baseline(
        &self,
        signal: &str,
        from: i64,
        to: i64,
        p: &Params,
    ) -> Option<LocationBaseline> {
        let samples: Vec<(f64, usize)> = self
            .minutes
            .iter()
            .filter(|m| m.start >= from && m.start < to && !m.alarmed)
            .flat_map(|m| m.slots.iter())
            .filter_map(|s| s.log_ratio.get(signal).copied())
            .collect();
        let slots: usize = samples.iter().map(|(_, n)| n).sum();
        if slots < p.location_min_minutes * p.location_slots_per_minute() {
            return None;
        }
        let v: Vec<f64> = samples.iter().map(|(r, _)| *r).collect();
        let (mean, sd) = seq::mean_sd(&v)?;
        let (_, mad_sigma) = det::robust::median_mad_sigma(&v)?;
        let mut spans: Vec<usize> = samples.iter().map(|(_, n)| *n).collect();
        spans.sort_unstable();
        Some(LocationBaseline {
            mean,
            sigma: sd.max(mad_sigma).max(MIN_LOG_RATIO_SPREAD),
            slots: spans[spans.len() / 2],
        })
    }

    /// Leaves the minutes from the one holding `since` (an alarm's estimated change point) on
    /// out of the series' reference.
    fn exclude_since(&mut self, since: i64) {
        let from = since - since.rem_euclid(MINUTE_MS);
        self.minutes
            .iter_mut()
            .filter(|m| m.start >= from)
            .for_each(|m| m.alarmed = true);
    }

    /// Start (or end) the alarm's clock; true when the alarm is young enough to keep its
    /// minutes out of the reference (`max_hold_s`).
    fn hold(&mut self, now: i64, max_hold_ms: i64) -> bool {
        self.alarmed_since = match (self.alarmed(), self.alarmed_since) {
            (true, None) => Some(now),
            (true, since) => since,
            (false, _) => None,
        };
        self.alarmed_since.is_some_and(|t| now - t <= max_hold_ms)
    }
}

#[derive(Debug, Default)]
struct ModelState {
    instances: BTreeMap<String, Series>,
    whole: Series,
    /// Where the model's own alarm lies, decided once: Some(Some(replica)) when one replica
    /// carries it, Some(None) when it is spread; None while the model is quiet or undecided.
    attributed: Option<Option<String>>,
    /// Since when the model's alarm has waited for its attribution to decide.
    undecided_since: Option<i64>,
}

/// Where a model's alarm lies, as far as its evidence tells yet.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    /// One replica carries it, its rate clear of its peers'.
    Replica(String),
    /// No replica carries the share, or the tests disagree: the model as a whole.
    Spread,
    /// One replica carries the share but its rate is not yet clear of its peers'.
    Undecided,
}

impl ModelState {
    /// Where the model's alarmed tests lie: for each alarmed test, the events beyond what its
    /// reference rate expects since its change point, counted from the scrapes of each replica;
    /// one replica must carry `attribute_share` of them (in every alarmed test) at a rate whose
    /// lower confidence bound lies beyond the upper bound of its peers' (both at `attribute_z`
    /// standard errors). It carrying the share without the bounds apart is undecided.
    fn place(&self, p: &Params) -> Place {
        let mut named: Option<String> = None;
        let mut undecided = false;
        for (k, t) in self.whole.tests.iter().filter(|(_, t)| t.cusum.alarmed()) {
            let from = t.cusum.changed_at.unwrap_or(i64::MIN / 2);
            let counts: Vec<(&String, f64, f64)> = self
                .instances
                .iter()
                .map(|(i, s)| {
                    let (n, x) = s.trials_since(k, from);
                    (i, n, x)
                })
                .collect();
            let excess = |n: f64, x: f64| (x - n * t.reference).max(0.0);
            let total: f64 = counts.iter().map(|(_, n, x)| excess(*n, *x)).sum();
            let Some((top, n, x)) = counts
                .iter()
                .max_by(|a, b| excess(a.1, a.2).total_cmp(&excess(b.1, b.2)))
            else {
                return Place::Spread;
            };
            if total <= 0.0 || excess(*n, *x) < p.attribute_share * total {
                return Place::Spread;
            }
            if named.as_ref().is_some_and(|m| m != *top) {
                return Place::Spread;
            }
            named = Some((*top).clone());
            let (rest_n, rest_x) = counts
                .iter()
                .filter(|(i, _, _)| i != top)
                .fold((0.0, 0.0), |(a, b), (_, n, x)| (a + n, b + x));
            let apart = seq::rate_upper(rest_x, rest_n, p.attribute_z)
                .zip(seq::rate_lower(*x, *n, p.attribute_z))
                .is_some_and(|(rest_upper, top_lower)| top_lower > rest_upper);
            undecided |= !apart;
        }
        match named {
            Some(_) if undecided => Place::Undecided,
            Some(i) => Place::Replica(i),
            None => Place::Spread,
        }
    }

    /// Decides where the model's alarm lies, once (`attributed`): at once when the evidence
    /// tells, else after `attribute_wait_s`. False while it waits (the alarm is not paged yet).
    fn attribute(&mut self, now: i64, p: &Params) -> bool {
        if self.attributed.is_some() {
            return true;
        }
        let place = self.place(p);
        self.decide(place, now, p)
    }

    /// `attribute` once the evidence's `place` is read.
    fn decide(&mut self, place: Place, now: i64, p: &Params) -> bool {
        let since = *self.undecided_since.get_or_insert(now);
        self.attributed = match place {
            Place::Replica(i) => Some(Some(i)),
            Place::Spread => Some(None),
            Place::Undecided if (now - since) as f64 >= p.attribute_wait_s * 1000.0 => Some(None),
            Place::Undecided => None,
        };
        self.attributed.is_some()
    }
}

/// Every test of a replica (`replica`), or of the model as a whole.
fn keys(p: &det::ReplicaShiftParams, replica: bool) -> Vec<TestKey> {
    let mut keys = Vec::new();
    if p.runs("errors") {
        keys.push(TestKey::errors());
    }
    let signals: &[String] = if p.runs("latency") { &p.signals } else { &[] };
    for s in signals {
        let kinds: Vec<Kind> = if replica {
            vec![Kind::OwnBeyond(p.own_quantile.to_bits())]
        } else {
            p.tail_quantiles
                .iter()
                .map(|q| Kind::Beyond(q.to_bits()))
                .collect()
        };
        keys.extend(kinds.into_iter().map(|kind| TestKey {
            signal: s.clone(),
            kind,
        }));
    }
    keys
}

/// (trials, events) of a test in one scrape's counts: failed requests, or observations beyond
/// the test's multiple × the anchor's quantile (None without an anchor of `min_anchor`
/// observations).
fn trials_of(
    c: &ScrapeCounts,
    k: &TestKey,
    anchor: &BTreeMap<String, CumulativeHistogram>,
    p: &det::ReplicaShiftParams,
) -> Option<(f64, f64)> {
    match k.bound(p) {
        None => {
            let n = c.finished?;
            (n > 0.0).then(|| (n, c.failed.unwrap_or(0.0).min(n)))
        }
        Some((q, multiple)) => {
            let a = anchor.get(&k.signal)?;
            if a.count < p.min_anchor {
                return None;
            }
            let t = a.quantile(q)?.value * multiple;
            let h = c.histogram(&k.signal)?;
            let (n, x) = (h.cumulative.last().copied()?, h.count_above(t)?);
            let requests = c.requests().unwrap_or(n);
            (n > 0.0).then(|| per_request(n, x, requests))
        }
    }
}

/// The budget's share of one test and the CUSUM parameters it runs with.
struct Budget {
    period_s: f64,
    tests: usize,
}

/// One scrape's (trials, events) into one test of a series: the reference rate is the larger
/// of its own and its peers' (a replica's); the smallest shift is designed from it.
#[allow(clippy::too_many_arguments)]
fn test(
    series: &mut Series,
    k: &TestKey,
    (n, x): (f64, f64),
    own: Reference,
    peers: Option<Reference>,
    budget: &Budget,
    now: i64,
    p: &det::ReplicaShiftParams,
) {
    let latency = k.kind != Kind::Errors;
    // Its own minutes tell how clumped its counts are; a new instance borrows its peers'.
    let own_phi = own.overdispersion();
    let peers_phi = peers.as_ref().and_then(Reference::overdispersion);
    let phi = own_phi
        .or(peers_phi)
        .unwrap_or(DEFAULT_OVERDISPERSION)
        .min(MAX_OVERDISPERSION);
    let own_rate = own.rate(p, phi);
    let peer_rate = peers
        .as_ref()
        .and_then(|r| r.rate(p, peers_phi.unwrap_or(phi).min(MAX_OVERDISPERSION)));
    let Some(reference) = own_rate.into_iter().chain(peer_rate).reduce(f64::max) else {
        return;
    };
    let floor = if latency {
        p.min_tail_rate
    } else {
        p.min_error_rate
    };
    let p0 = reference.max(floor);
    if p0 >= 0.5 {
        return;
    }
    let p1 = p.design(p0);
    if n > 0.0 {
        let residual = (x - n * p0).powi(2) / (n * p0 * (1.0 - p0));
        let acc = series.minute(now).pearson.entry(k.clone()).or_default();
        acc.0 += residual;
        acc.1 += 1.0;
    }
    let h = seq::cusum_threshold(
        budget.period_s,
        series.request_rate(now).max(0.01),
        budget.tests,
    );
    let t = series.tests.entry(k.clone()).or_default();
    let was = t.cusum.alarmed();
    t.cusum.update(now, n, x, p0, p1, phi, h, p.recovery_nats);
    t.reference = p0;
    t.own = own_rate;
    t.peers = peer_rate;
    t.design = p1;
    t.threshold = h;
    t.overdispersion = phi;
    // The counts since the change point the alarm estimates stay out of the reference too; so
    // do those of evidence half-way to an alarm (`suspect_level`), before the guard runs out.
    if let (false, Some(since)) = (was, t.cusum.changed_at) {
        series.exclude_since(since);
    } else if let Some(since) = t.cusum.rising_since(h, p.suspect_level) {
        series.exclude_since(since);
    }
}

/// A quantile read by linear interpolation inside its bucket `[lower, upper]`, placed at the
/// same rank geometrically instead: latency is closer to uniform in its log than in itself
/// across a bucket as wide as 2.5 × (vLLM's 0.1–0.25 s), so a shift of the distribution moves
/// the estimate about as much as it moves the quantile. Unchanged where `lower` is 0 or the
/// bucket is open.
fn geometric_within_bucket(value: f64, lower: f64, upper: f64) -> f64 {
    if lower <= 0.0 || !upper.is_finite() || upper <= lower {
        return value;
    }
    let frac = ((value - lower) / (upper - lower)).clamp(0.0, 1.0);
    lower * (upper / lower).powf(frac)
}

/// A replica's location tests over its slots settled by `now` and not yet read: each slot's
/// histograms, and its peers' merged ones of the same slot, join the signal's pool; once both
/// sides of the pool hold enough observations, the log of its median ratio is one sample of the
/// signal's CUSUM against the replica's clean baseline samples. At the usual rates a pool is
/// one slot; the threshold spends the false-alarm budget at the rate samples usually come.
fn locate(
    st: &mut ModelState,
    instance: &str,
    now: i64,
    baseline: (i64, i64),
    budget: &Budget,
    p: &Params,
) {
    if !p.runs("latency") || st.instances.len() < 2 {
        return;
    }
    let Some(inst) = st.instances.get(instance) else {
        return;
    };
    let step_ms = p.location_step_ms();
    let due: Vec<i64> = inst
        .minutes
        .iter()
        .flat_map(|m| m.slots(step_ms))
        .filter(|(start, s)| !s.located && start + step_ms + SETTLE_LAG_MS <= now)
        .map(|(start, _)| start)
        .collect();
    if due.is_empty() {
        return;
    }
    // Each slot's histograms, the replica's and its peers' merged, per signal.
    type Sides = (Option<CumulativeHistogram>, Option<CumulativeHistogram>);
    let mut slots: Vec<(i64, BTreeMap<String, Sides>)> = Vec::new();
    for &start in &due {
        let mine = inst.slot_at(start, step_ms);
        let mut peers: BTreeMap<String, CumulativeHistogram> = BTreeMap::new();
        for (_, s) in st.instances.iter().filter(|(n, _)| n.as_str() != instance) {
            if let Some(slot) = s.slot_at(start, step_ms) {
                for (sig, hist) in &slot.latency {
                    merge(&mut peers, sig, hist);
                }
            }
        }
        let sides = p
            .signals
            .iter()
            .map(|sig| {
                let own = mine.and_then(|m| m.latency.get(sig)).cloned();
                (sig.clone(), (own, peers.remove(sig)))
            })
            .collect();
        slots.push((start, sides));
    }
    let Some(inst) = st.instances.get_mut(instance) else {
        return;
    };
    // A pool counts with `location_min_count` observations a minute's worth per slot on each
    // side.
    let min_count = p.location_min_count / p.location_slots_per_minute() as f64;
    let median = |h: Option<&CumulativeHistogram>| {
        h.filter(|h| h.count >= min_count)
            .and_then(|h| h.quantile(0.5))
            .map(|q| geometric_within_bucket(q.value, q.bucket_lower, q.bucket_upper))
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    for (start, sides) in slots {
        if let Some(m) = inst.minute_holding(start) {
            m.slot(start, step_ms).located = true;
        }
        for (sig, (own, peers)) in sides {
            let pool = inst
                .pools
                .entry(sig.clone())
                .or_insert_with(|| Pool::new(start));
            pool.add(own.as_ref(), peers.as_ref());
            let ratio = match (median(pool.own.as_ref()), median(pool.peers.as_ref())) {
                (Some(a), Some(b)) => Some((a / b).ln()),
                _ => None,
            };
            let (first, spans) = (pool.start, pool.slots);
            if ratio.is_some() || spans >= p.location_max_pool_slots() {
                // Read, or too sparse to read within the longest pool: the next slot starts a
                // new one.
                inst.pools.remove(&sig);
            }
            let Some(r) = ratio else {
                continue;
            };
            if let Some(m) = inst.minute_holding(first) {
                m.slot(first, step_ms)
                    .log_ratio
                    .insert(sig.clone(), (r, spans));
            }
            let Some(base) = inst.location_baseline(&sig, baseline.0, baseline.1, p) else {
                continue;
            };
            let sample_s = base.slots as f64 * p.location_step_s;
            let h = seq::cusum_threshold(budget.period_s, 1.0 / sample_s, budget.tests);
            let l = inst.location.entry(sig).or_default();
            let was = l.alarmed;
            l.update((first, spans), r, base, h, p);
            if !was && l.alarmed {
                // The minutes since the change point stay out of the baseline.
                let since = l.since;
                inst.exclude_since(since);
            }
        }
    }
}

impl ReplicaShift {
    fn observe(&mut self, c: &ScrapeCounts) {
        let p = &self.params;
        let now = c.at_unix_ms;
        let st = self.models.entry(c.model_id.clone()).or_default();
        let (replica_keys, model_keys) = (keys(p, true), keys(p, false));
        let location_tests = if p.runs("latency") && st.instances.len() > 1 {
            p.signals.len()
        } else {
            0
        };
        let budget = Budget {
            period_s: p.false_page_days * 86_400.0,
            tests: st.instances.len().max(1) * (replica_keys.len() + location_tests)
                + model_keys.len(),
        };
        let ms = |s: f64| (s * 1000.0) as i64;
        let current_minute = now - now.rem_euclid(MINUTE_MS);
        let baseline = (
            now - ms(p.baseline_s),
            current_minute - ms(p.baseline_guard_s),
        );
        let anchor_from = now - ms(p.anchor_s) - MINUTE_MS + 1;
        let block_ms = ms(p.block_s);
        let max_hold_ms = ms(p.max_hold_s);

        // The replica: errors, and latency against its own recent median, each against its own
        // clean baseline and its peers' (the same measure, over the same period).
        let mut peers: BTreeMap<&TestKey, Reference> = BTreeMap::new();
        for (_, s) in st.instances.iter().filter(|(n, _)| **n != c.instance) {
            for k in &replica_keys {
                let r = s.reference(k, baseline.0, baseline.1, true, block_ms);
                peers.entry(k).or_default().add(r);
            }
        }
        let inst = st.instances.entry(c.instance.clone()).or_default();
        inst.last_seen = now;
        let mut own_anchor = inst.recent_latency(anchor_from);
        for (sig, h) in &c.latency {
            merge(&mut own_anchor, sig, h);
        }
        let mut counted = Vec::new();
        for k in &replica_keys {
            let Some(trials) = trials_of(c, k, &own_anchor, p) else {
                continue;
            };
            let own = inst.reference(k, baseline.0, baseline.1, true, block_ms);
            test(inst, k, trials, own, peers.remove(k), &budget, now, p);
            counted.push((k.clone(), trials));
        }
        let hold = inst.hold(now, max_hold_ms);
        let minute = inst.minute(now);
        minute.add(c, &counted, hold);
        if p.runs("latency") {
            let slot = minute.slot(now, p.location_step_ms());
            for (sig, h) in c.latency.iter().filter(|(s, _)| p.signals.contains(s)) {
                merge(&mut slot.latency, sig, h);
            }
        }
        locate(st, &c.instance, now, baseline, &budget, p);

        // The model as a whole: latency against its own recent distribution.
        let replica_alarmed = st.instances.values().any(Series::alarmed);
        let replica_hold = st
            .instances
            .values()
            .any(|s| s.alarmed_since.is_some_and(|t| now - t <= max_hold_ms));
        let whole = &mut st.whole;
        whole.last_seen = now;
        let mut anchor = whole.recent_latency(anchor_from);
        for (sig, h) in &c.latency {
            merge(&mut anchor, sig, h);
        }
        let mut counted = Vec::new();
        for k in &model_keys {
            let Some(trials) = trials_of(c, k, &anchor, p) else {
                continue;
            };
            let own = whole.reference(k, baseline.0, baseline.1, true, block_ms);
            test(whole, k, trials, own, None, &budget, now, p);
            counted.push((k.clone(), trials));
        }
        // A shift a replica explains is that replica's alarm, not the model's: the model's
        // tests start again while a replica is alarmed (one alert per incident).
        if replica_alarmed {
            whole
                .tests
                .values_mut()
                .for_each(|t| t.cusum = seq::CusumBank::default());
        }
        let hold_whole = whole.hold(now, max_hold_ms) || replica_hold;
        whole.minute(now).add(c, &counted, hold_whole);
        // Each replica keeps its part of the model's counts: where a model alarm lies.
        if let Some(inst) = st.instances.get_mut(&c.instance) {
            inst.minute(now).count(&counted);
        }
    }

    fn prune(&mut self, now: i64) {
        let keep_from = now - (self.params.baseline_s * 1000.0) as i64 - MINUTE_MS;
        let anchor_from = now - (self.params.anchor_s * 1000.0) as i64 - 2 * MINUTE_MS;
        self.models.retain(|_, st| {
            st.instances.retain(|_, s| {
                s.prune(keep_from, anchor_from);
                s.last_seen >= keep_from
            });
            st.whole.prune(keep_from, anchor_from);
            st.whole.last_seen >= keep_from
        });
    }
}

/// The share a test counts since `from` (the alarm's change point; the current minute at least).
fn share_since(series: &Series, k: &TestKey, from: Option<i64>) -> Option<f64> {
    let last = series.minutes.back()?.start;
    let (n, x) = series.trials_since(k, from.map_or(last, |f| f.min(last)));
    (n > 0.0).then(|| x / n)
}

fn finding(series: &Series, at: &str, p: &det::ReplicaShiftParams) -> Option<Finding> {
    let alarmed: Vec<(&TestKey, &Shift)> = series
        .tests
        .iter()
        .filter(|(_, t)| t.cusum.alarmed())
        .collect();
    let located: Vec<(&String, &Location)> =
        series.location.iter().filter(|(_, l)| l.alarmed).collect();
    if alarmed.is_empty() && located.is_empty() {
        return None;
    }
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    let mut parts = Vec::new();
    let mut f = Finding::new(1.0, "");
    for (sig, l) in &located {
        parts.push(format!(
            "{} median {:.2}× its peers' (usually {:.2}×)",
            sig.to_uppercase(),
            l.ratio,
            l.usual
        ));
        f.score = f.score.max(l.s / l.threshold);
        f = f
            .with(&format!("{sig}_median_ratio"), l.ratio)
            .with(&format!("{sig}_median_ratio_usual"), l.usual)
            .with(&format!("{sig}_median_log_sigma"), l.sigma)
            .with(&format!("{sig}_median_design_sigmas"), l.design)
            .with(&format!("{sig}_median_evidence"), l.s / l.threshold)
            .with(&format!("{sig}_median_threshold_nats"), l.threshold);
    }
    for (k, t) in &alarmed {
        let seen = share_since(series, k, t.cusum.changed_at).unwrap_or(f64::NAN);
        let against = match (t.own, t.peers) {
            (Some(o), Some(pe)) => format!("its own usual {} and its peers' {}", pct(o), pct(pe)),
            (Some(o), None) => format!("its usual {}", pct(o)),
            (None, Some(pe)) => format!("its peers' {}", pct(pe)),
            (None, None) => pct(t.reference),
        };
        parts.push(format!(
            "{} of requests {} (against {against})",
            pct(seen),
            k.describe(p)
        ));
        f.score = f.score.max(t.cusum.level(t.threshold));
        let key = k.evidence_key();
        f = f
            .with(&format!("{key}_share"), seen)
            .with(&format!("{key}_reference"), t.reference)
            .with(
                &format!("{key}_shift"),
                t.cusum.alarmed_at.unwrap_or(t.design),
            )
            .with(&format!("{key}_evidence"), t.cusum.level(t.threshold))
            .with(&format!("{key}_threshold_nats"), t.threshold)
            .with(&format!("{key}_overdispersion"), t.overdispersion);
    }
    f.summary = format!("{at}: {}", parts.join("; "));
    Some(f)
}

impl Detector for ReplicaShift {
    fn name() -> &'static str {
        det::names::REPLICA_SHIFT
    }

    /// Unused: the tests are sequential; their memory is the baseline and peer periods.
    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params: det::ReplicaShiftParams = rule.validated()?;
        let signal = rule.signal(&["scraped_counts"], "scraped_counts")?;
        Ok((
            ReplicaShift {
                params,
                read_seq: 0,
                models: BTreeMap::new(),
            },
            signal,
        ))
    }

    fn builtin_export() -> Option<BuiltinExport> {
        None
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let log = cx.board.counts();
        let skipped = log.skipped(self.read_seq);
        if skipped > 0 {
            tracing::warn!(
                skipped,
                "replica_shift: scraped counts dropped before they were read"
            );
        }
        let after = std::mem::replace(&mut self.read_seq, log.last_seq());
        for (_, c) in log.since(after) {
            self.observe(c);
        }
        self.prune(cx.now);
        let p = &self.params;
        let mut out = Vec::new();
        for (model, st) in self.models.iter_mut() {
            let mut any = false;
            for (instance, s) in &st.instances {
                let at = format!("Replica {instance} of {model}");
                if let Some(f) = finding(s, &at, p) {
                    any = true;
                    let l = labels(&[("model_id", model), ("instance", instance)]);
                    out.push(f.into_event(&rule.detector, &rule.signal, l, cx.now));
                }
            }
            // A model served by one instance: that instance is where to look.
            let only = (st.instances.len() == 1)
                .then(|| st.instances.keys().next().cloned())
                .flatten();
            let mut alarmed = !any && st.whole.alarmed();
            if !alarmed {
                st.attributed = None;
                st.undecided_since = None;
            } else if only.is_none() {
                alarmed = st.attribute(cx.now, p);
            }
            let on = st.attributed.clone().flatten();
            let at = match (&only, &on) {
                (Some(i), _) => format!("{model} (its one replica {i})"),
                (None, Some(i)) => format!("{model}, concentrated on replica {i}"),
                (None, None) => format!("{model} (all replicas)"),
            };
            if alarmed && let Some(f) = finding(&st.whole, &at, p) {
                let l = labels(&[
                    ("model_id", model),
                    ("instance", only.or(on).as_deref().unwrap_or("")),
                ]);
                out.push(f.into_event(&rule.detector, &rule.signal, l, cx.now));
            }
        }
        out
    }

    fn retention_ms(&self, _rule: &RuleSpec) -> i64 {
        0
    }
}

#[cfg(test)]
impl ReplicaShift {
    fn series(&self, model: &str, instance: Option<&str>) -> Option<&Series> {
        let st = self.models.get(model)?;
        match instance {
            Some(i) => st.instances.get(i),
            None => Some(&st.whole),
        }
    }

    /// The tests of a series (the model as a whole with None).
    fn test_keys(&self, model: &str, instance: Option<&str>) -> Vec<TestKey> {
        self.series(model, instance)
            .map(|s| s.tests.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// A test's (minute start, trials, events) in the series' kept minutes.
    fn minute_counts(
        &self,
        model: &str,
        instance: Option<&str>,
        k: &TestKey,
    ) -> Vec<(i64, f64, f64)> {
        self.series(model, instance)
            .map(|s| {
                s.minutes
                    .iter()
                    .filter_map(|m| m.trials(k).map(|(n, x)| (m.start, n, x)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A replica's (first slot's start, log median ratio against its peers, slots pooled) of
    /// `signal`.
    fn slot_log_ratios(&self, model: &str, instance: &str, signal: &str) -> Vec<(i64, f64, usize)> {
        let step_ms = self.params.location_step_ms();
        self.series(model, Some(instance))
            .map(|s| {
                s.minutes
                    .iter()
                    .flat_map(|m| m.slots(step_ms))
                    .filter_map(|(at, slot)| slot.log_ratio.get(signal).map(|(r, n)| (at, *r, *n)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every test's state, for diagnosing the scenario tests.
    fn dump(&self) -> String {
        let mut out = String::new();
        for (m, st) in &self.models {
            out += &format!("{m}\n");
            for (i, s) in st
                .instances
                .iter()
                .chain([(&"(all)".to_string(), &st.whole)])
            {
                for (k, t) in &s.tests {
                    let flagged: Vec<String> = s
                        .minutes
                        .iter()
                        .map(|m| {
                            format!(
                                "{}{}",
                                if m.alarmed { "A" } else { "." },
                                m.trials(k)
                                    .map(|(n, x)| format!("{x:.0}/{n:.0}"))
                                    .unwrap_or_default()
                            )
                        })
                        .collect();
                    out += &format!(
                        "    minutes {}\n",
                        flagged[flagged.len().saturating_sub(20)..].join(" ")
                    );
                    out += &format!(
                        "  {i} {} level={:.2} h={:.2} p0={:.4} own={:?} peers={:?} p1={:.4} phi={:.2} recent={:?}\n",
                        k.describe(&self.params),
                        t.cusum.level(t.threshold),
                        t.threshold,
                        t.reference,
                        t.own,
                        t.peers,
                        t.design,
                        t.overdispersion,
                        share_since(s, k, None)
                    );
                }
                for (sig, l) in &s.location {
                    out += &format!(
                        "  {i} location {sig} s={:.2} h={:.2} ratio={:.2} usual={:.2} sigma={:.3} design={:.2} pooling={:?}\n",
                        l.s,
                        l.threshold,
                        l.ratio,
                        l.usual,
                        l.sigma,
                        l.design,
                        s.pools.get(sig).map(|p| p.slots)
                    );
                }
            }
        }
        out
    }
}

#[cfg(test)]
#[path = "replica_shift_tests.rs"]
mod tests;
