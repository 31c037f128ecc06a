// Sequential change detection with a stated false-alarm budget: Page's CUSUM on the
// log-likelihood ratio of a Bernoulli rate (a failed request, a request slower than a bound),
// the threshold that spends a budget of one false page per period, and the delay an optimal
// test needs for a given shift — the yardstick detection delays are measured against.
//
// Written here rather than taken from a crate: the statistic is a few lines of arithmetic on
// counts, and no maintained Rust crate offers a CUSUM over binned (scraped) counts with
// overdispersion scaling.

use serde::{Deserialize, Serialize};

use crate::{ParamError, Validate, check};

/// Parameters of `replica_shift`: per-replica (and per-model) sequential tests on the counts a
/// serving runtime's own metrics report each scrape (spec section 4's statistical hygiene made
/// explicit: a false-alarm budget instead of a window, a minimum and a `for`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicaShiftParams {
    /// The false-alarm budget: at most one false page per model per this many days of steady
    /// healthy traffic. The CUSUM threshold is ln(mean samples between false alarms), split over
    /// every test of the model (Bonferroni).
    pub false_page_days: f64,
    /// Which tests run: `errors` (the failed share), `latency` (slow shares of `signals`).
    pub tests: Vec<String>,
    /// Latency histograms tested (normalised signals of the scrape mapping). TTFT and ITL by
    /// default: E2E follows the output lengths callers ask for more than the server's speed.
    pub signals: Vec<String>,
    /// The model's own latency tests count a request as slow beyond `tail_multiple` × each of
    /// these quantiles of the model's distribution over the last `anchor_s`. The anchor moves
    /// with the load, so a swing that slows every request alike is not a shift.
    pub tail_quantiles: Vec<f64>,
    pub tail_multiple: f64,
    /// A replica's own latency tests count a request as slow beyond `own_multiple` × this
    /// quantile of the replica's own recent distribution (the last `anchor_s` and the scrape
    /// itself): its tail measured against its body. A replica drifting somewhat slower or faster
    /// than its peers, or a load ramp that moves every request, leaves that share alone — a
    /// share beyond a bound set by the peers moves many-fold with a 20 % drift — while a fault
    /// that slows some of its requests many times moves it. The median: a fault on fewer than
    /// half of the requests barely moves it. Its peers' shares of the same measure are the
    /// replica's second reference (it must be worse than its peers and than itself).
    pub own_quantile: f64,
    pub own_multiple: f64,
    /// A replica's location test (part of `latency`): every `location_step_s` (a slot), the
    /// log of its median over its peers' median of the same slot, against the usual value and
    /// spread of that log ratio in its clean baseline slots; a Gaussian CUSUM designed for a
    /// median `location_ratio` × its usual ratio (and at least `location_min_sigmas` of its
    /// spread) sees a replica that slows every request alike, which the tail test (its own
    /// median moves) does not. A slot counts with at least `location_min_count` observations a
    /// minute (pro rata) on each side; a slot short of them (a replica at under a request a
    /// second) is pooled with the slots after it, up to `location_max_pool_s`, and the pool
    /// counts as one sample. The test runs once the baseline holds `location_min_minutes`
    /// minutes of such samples. No single sample pages, nor one minute's.
    pub location_ratio: f64,
    pub location_min_sigmas: f64,
    pub location_min_count: f64,
    pub location_min_minutes: usize,
    pub location_step_s: f64,
    pub location_max_pool_s: f64,
    /// When the model's own test alarms while no replica's does, the replica that carries at
    /// least this share of the alarm's excess events (slow or failed requests beyond what the
    /// reference rate expects, since the change point), at a rate whose lower confidence bound
    /// lies beyond the upper bound of its peers' rate (both at `attribute_z` standard errors),
    /// is named as where the shift lies (decided once, so the alert keeps one label set).
    pub attribute_share: f64,
    pub attribute_z: f64,
    /// While one replica carries that share but its rate is not yet clear of its peers', the
    /// model's alarm waits up to this long for the evidence to decide (or for the replica's own
    /// alarm) before it pages as the whole model's. A spread alarm does not wait.
    pub attribute_wait_s: f64,
    /// How recent the anchor's distribution is …
    pub anchor_s: f64,
    /// … and the fewest observations it needs.
    pub min_anchor: f64,
    /// The shift each test is designed for: the reference rate × `ratio` …
    pub ratio: f64,
    /// … or + `min_shift`, whichever is larger (a rate near 0 still needs a real shift).
    pub min_shift: f64,
    /// Floor of the reference rate of slow requests (bucket bounds hide the far tail).
    pub min_tail_rate: f64,
    /// Floor of the reference error rate (a fleet without errors still has a first one).
    pub min_error_rate: f64,
    /// An instance's own reference: its counts over this period, alarmed periods left out …
    pub baseline_s: f64,
    /// … ending this long before now, so a fault not yet alarmed is not learnt as normal …
    pub baseline_guard_s: f64,
    /// … and without the minutes since a test's evidence began to rise, once it holds this
    /// share of its alarm threshold: a small fault that needs longer than the guard to build its
    /// case is not learnt as normal meanwhile (healthy evidence rarely climbs half way: e^(h/2)).
    pub suspect_level: f64,
    /// Overdispersion compares the minutes within blocks of this length (slow swings between
    /// blocks are the anchor's and the baseline's business, not clumping).
    pub block_s: f64,
    /// Fewest reference observations before a test may run …
    pub min_reference: f64,
    /// … spread over at least this long (a few minutes of a new replica are not its normal, and
    /// a baseline shorter than a load swing has seen only part of it).
    pub min_baseline_s: f64,
    /// The reference rate is its upper confidence bound at this many standard errors.
    pub reference_z: f64,
    /// An alarm ends once the reverse test (back to the reference rate) gathers this many nats.
    pub recovery_nats: f64,
    /// A shift alarmed this long is the new normal: the instance's own reference re-learns it.
    pub max_hold_s: f64,
}

impl Default for ReplicaShiftParams {
    fn default() -> Self {
        ReplicaShiftParams {
            false_page_days: 30.0,
            tests: vec!["errors".into(), "latency".into()],
            signals: vec!["ttft".into(), "itl".into()],
            tail_quantiles: vec![0.9],
            tail_multiple: 3.0,
            own_quantile: 0.5,
            own_multiple: 6.0,
            location_ratio: 2.0,
            location_min_sigmas: 3.0,
            location_min_count: 50.0,
            location_min_minutes: 20,
            location_step_s: 30.0,
            location_max_pool_s: 300.0,
            attribute_share: 2.0 / 3.0,
            attribute_z: 3.0,
            attribute_wait_s: 30.0,
            ratio: 4.0,
            min_shift: 0.01,
            min_tail_rate: 0.002,
            min_error_rate: 0.001,
            baseline_s: 3600.0,
            baseline_guard_s: 300.0,
            suspect_level: 0.5,
            anchor_s: 120.0,
            min_anchor: 50.0,
            block_s: 300.0,
            min_reference: 200.0,
            min_baseline_s: 1800.0,
            reference_z: 2.0,
            recovery_nats: 3.0,
            max_hold_s: 1800.0,
        }
    }
}

impl Validate for ReplicaShiftParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.false_page_days.is_finite() && self.false_page_days >= 0.01,
            "false_page_days",
            "must be ≥ 0.01",
        )?;
        check(
            self.signals.iter().all(|s| !s.trim().is_empty()),
            "signals",
            "must not hold an empty name",
        )?;
        check(
            !self.tests.is_empty() && self.tests.iter().all(|t| t == "errors" || t == "latency"),
            "tests",
            "must name errors, latency or both",
        )?;
        check(
            !self.tail_quantiles.is_empty()
                && self.tail_quantiles.iter().all(|q| *q > 0.0 && *q < 1.0),
            "tail_quantiles",
            "must hold at least one quantile, each in (0, 1)",
        )?;
        check(
            self.tail_multiple.is_finite() && self.tail_multiple >= 1.0,
            "tail_multiple",
            "must be ≥ 1",
        )?;
        check(
            self.own_quantile > 0.0 && self.own_quantile < 1.0,
            "own_quantile",
            "must be in (0, 1)",
        )?;
        check(
            self.own_multiple.is_finite() && self.own_multiple >= 1.0,
            "own_multiple",
            "must be ≥ 1",
        )?;
        check(
            self.location_ratio.is_finite() && self.location_ratio > 1.0,
            "location_ratio",
            "must be > 1",
        )?;
        check(
            self.location_min_sigmas.is_finite() && self.location_min_sigmas > 0.0,
            "location_min_sigmas",
            "must be > 0",
        )?;
        check(
            self.location_min_count.is_finite() && self.location_min_count >= 1.0,
            "location_min_count",
            "must be ≥ 1",
        )?;
        check(
            self.location_min_minutes >= 2,
            "location_min_minutes",
            "must be ≥ 2",
        )?;
        check(
            [10.0, 15.0, 20.0, 30.0, 60.0].contains(&self.location_step_s),
            "location_step_s",
            "must be 10, 15, 20, 30 or 60 (a whole number of slots a minute)",
        )?;
        check(
            self.location_max_pool_s.is_finite()
                && self.location_max_pool_s >= self.location_step_s,
            "location_max_pool_s",
            "must be ≥ location_step_s",
        )?;
        check(
            self.attribute_share.is_finite()
                && self.attribute_share > 0.5
                && self.attribute_share <= 1.0,
            "attribute_share",
            "must be in (0.5, 1]",
        )?;
        check(
            self.attribute_z.is_finite() && self.attribute_z >= 0.0,
            "attribute_z",
            "must be ≥ 0",
        )?;
        check(
            self.attribute_wait_s.is_finite() && self.attribute_wait_s >= 0.0,
            "attribute_wait_s",
            "must be ≥ 0",
        )?;
        check(
            self.ratio.is_finite() && self.ratio > 1.0,
            "ratio",
            "must be > 1",
        )?;
        check(
            self.min_shift > 0.0 && self.min_shift < 0.5,
            "min_shift",
            "must be in (0, 0.5)",
        )?;
        check(
            self.min_tail_rate > 0.0 && self.min_tail_rate < 0.5,
            "min_tail_rate",
            "must be in (0, 0.5)",
        )?;
        check(
            self.min_error_rate > 0.0 && self.min_error_rate < 0.5,
            "min_error_rate",
            "must be in (0, 0.5)",
        )?;
        check(
            self.baseline_s.is_finite() && self.baseline_s >= 60.0,
            "baseline_s",
            "must be ≥ 60",
        )?;
        check(
            self.baseline_guard_s.is_finite()
                && self.baseline_guard_s >= 0.0
                && self.baseline_guard_s < self.baseline_s,
            "baseline_guard_s",
            "must be ≥ 0 and below baseline_s",
        )?;
        check(
            self.suspect_level.is_finite() && self.suspect_level > 0.0 && self.suspect_level <= 1.0,
            "suspect_level",
            "must be above 0 and at most 1",
        )?;
        check(
            self.anchor_s.is_finite() && self.anchor_s >= 10.0,
            "anchor_s",
            "must be ≥ 10",
        )?;
        check(
            self.min_anchor.is_finite() && self.min_anchor >= 1.0,
            "min_anchor",
            "must be ≥ 1",
        )?;
        check(
            self.block_s.is_finite() && self.block_s >= 60.0 && self.block_s <= self.baseline_s,
            "block_s",
            "must be between 60 and baseline_s",
        )?;
        check(
            self.min_reference.is_finite() && self.min_reference >= 1.0,
            "min_reference",
            "must be ≥ 1",
        )?;
        check(
            self.min_baseline_s.is_finite()
                && self.min_baseline_s >= 0.0
                && self.min_baseline_s <= self.baseline_s,
            "min_baseline_s",
            "must be between 0 and baseline_s",
        )?;
        check(
            self.reference_z.is_finite() && self.reference_z >= 0.0,
            "reference_z",
            "must be ≥ 0",
        )?;
        check(
            self.recovery_nats.is_finite() && self.recovery_nats > 0.0,
            "recovery_nats",
            "must be > 0",
        )?;
        check(
            self.max_hold_s.is_finite() && self.max_hold_s >= 60.0,
            "max_hold_s",
            "must be ≥ 60",
        )
    }
}

impl ReplicaShiftParams {
    /// Whether the `errors` / `latency` tests run.
    pub fn runs(&self, test: &str) -> bool {
        self.tests.iter().any(|t| t == test)
    }

    /// The location test's slot length (ms) …
    pub fn location_step_ms(&self) -> i64 {
        (self.location_step_s * 1000.0) as i64
    }

    /// … the most slots one pooled sample spans …
    pub fn location_max_pool_slots(&self) -> usize {
        ((self.location_max_pool_s / self.location_step_s).floor() as usize).max(1)
    }

    /// … and how many slots a minute holds.
    pub fn location_slots_per_minute(&self) -> usize {
        ((60.0 / self.location_step_s).round() as usize).max(1)
    }

    /// The rate a test is designed to detect, from its reference rate `p0`.
    pub fn design(&self, p0: f64) -> f64 {
        (p0 * self.ratio).max(p0 + self.min_shift).min(0.99)
    }
}

/// The CUSUM threshold (nats) that spends a budget of one false alarm per `period_s` on a test
/// seeing `samples_per_s`, shared by `tests` tests: ln of the mean run length to false alarm each
/// test needs (Lorden: a log-likelihood-ratio CUSUM with threshold h runs ≥ e^h samples between
/// false alarms when the reference is right). At least ln(100).
pub fn cusum_threshold(period_s: f64, samples_per_s: f64, tests: usize) -> f64 {
    let arl = period_s * samples_per_s.max(0.0) * tests.max(1) as f64;
    arl.max(100.0).ln()
}

/// How far above `threshold / samples` a sample's cap sits (see `sample_cap`).
pub const SAMPLE_CAP_SLACK: f64 = 0.02;

/// The most one sample may add to a CUSUM whose alarm must rest on at least `samples` samples:
/// `threshold / samples`, a hair above it so that `samples` full samples do reach the threshold
/// however their sum rounds, and when the threshold moves a little between samples (it follows
/// the request rate). Exactly half, two capped samples of a large fault could fall a rounding
/// short, and the alarm waited for a third scrape.
pub fn sample_cap(threshold: f64, samples: u32) -> f64 {
    threshold / f64::from(samples.max(1)) * (1.0 + SAMPLE_CAP_SLACK)
}

/// Log-likelihood ratio of a standardised observation `z` under a mean shift of `d` standard
/// deviations against none (Gaussian): d·z − d²/2.
pub fn gaussian_llr(z: f64, d: f64) -> f64 {
    d * z - d * d / 2.0
}

/// Mean and sample standard deviation (n − 1) of finite values; None under two values or when
/// one is not finite.
pub fn mean_sd(xs: &[f64]) -> Option<(f64, f64)> {
    let mean = crate::stats::mean(xs)?;
    if xs.len() < 2 {
        return None;
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64;
    Some((mean, var.sqrt()))
}

/// The optimal delay (seconds) of a test that reads one observation every `step_s` — a slot's
/// median against its peers' — for a Gaussian mean shift of `delta_sigmas` standard deviations
/// of that observation, at a budget of one false alarm per `period_s`: h / (δ²/2) slots (the
/// CUSUM's first-order delay, KL δ²/2 nats a slot), and never under one slot, since no test of a
/// slot's statistic decides before that slot's evidence is in. Infinite when there is no shift.
pub fn location_delay_s(delta_sigmas: f64, step_s: f64, period_s: f64) -> f64 {
    if delta_sigmas.is_nan() || delta_sigmas <= 0.0 || step_s.is_nan() || step_s <= 0.0 {
        return f64::INFINITY;
    }
    let h = cusum_threshold(period_s, 1.0 / step_s, 1);
    step_s * (h / (delta_sigmas * delta_sigmas / 2.0)).max(1.0)
}

/// Kullback–Leibler divergence of Bernoulli(`p`) from Bernoulli(`q`), in nats.
pub fn bernoulli_kl(p: f64, q: f64) -> f64 {
    let term = |a: f64, b: f64| if a <= 0.0 { 0.0 } else { a * (a / b).ln() };
    term(p, q) + term(1.0 - p, 1.0 - q)
}

/// Log-likelihood ratio of `x` events in `n` trials at rate `p1` against `p0`.
pub fn bernoulli_llr(n: f64, x: f64, p0: f64, p1: f64) -> f64 {
    x * (p1 / p0).ln() + (n - x).max(0.0) * ((1.0 - p1) / (1.0 - p0)).ln()
}

/// The delay (in samples) of the optimal test of the shift from `p0` to `p_true` at threshold `h`:
/// h / KL(p_true ‖ p0) — the first-order CUSUM delay, which no test at the same false-alarm rate
/// beats asymptotically (Lorden, Moustakides). Infinite when there is no shift.
pub fn optimal_delay_samples(h: f64, p_true: f64, p0: f64) -> f64 {
    let kl = bernoulli_kl(p_true, p0);
    if kl > 0.0 { h / kl } else { f64::INFINITY }
}

/// Wilson's score interval of a rate from `x` events in `n` trials at `z` standard errors (it
/// stays inside [0, 1] for small counts): (lower, upper).
/// The Wilson score interval (lower, upper) of a rate from `x` events in `n` trials at `z`
/// standard errors: the one used wherever a rate's confidence bound is needed. None without
/// trials.
pub fn wilson_interval(x: f64, n: f64, z: f64) -> Option<(f64, f64)> {
    if n <= 0.0 {
        return None;
    }
    let p = (x / n).clamp(0.0, 1.0);
    let z2 = z * z;
    let centre = p + z2 / (2.0 * n);
    let spread = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    let scale = 1.0 + z2 / n;
    Some((
        ((centre - spread) / scale).max(0.0),
        ((centre + spread) / scale).min(1.0),
    ))
}

/// The upper confidence bound of a rate from `x` events in `n` trials, `z` standard errors up.
pub fn rate_upper(x: f64, n: f64, z: f64) -> Option<f64> {
    wilson_interval(x, n, z).map(|(_, upper)| upper)
}

/// The lower confidence bound of a rate from `x` events in `n` trials, `z` standard errors down.
pub fn rate_lower(x: f64, n: f64, z: f64) -> Option<f64> {
    wilson_interval(x, n, z).map(|(lower, _)| lower)
}

/// Overdispersion of grouped counts: Pearson's χ² of each group against the rate of its block,
/// over the degrees of freedom left, at least 1. Requests of one batch are slow or fast together;
/// dividing the log-likelihood ratio by this keeps the false-alarm budget when counts vary more
/// than a binomial does. Comparing within blocks leaves slow swings (load) to the reference.
/// None with fewer than 4 degrees of freedom.
pub fn overdispersion(blocks: &[Vec<(f64, f64)>]) -> Option<f64> {
    let (mut chi2, mut dof) = (0.0, 0usize);
    for groups in blocks {
        let groups: Vec<&(f64, f64)> = groups.iter().filter(|(n, _)| *n >= 5.0).collect();
        if groups.len() < 2 {
            continue;
        }
        let (n, x) = groups
            .iter()
            .fold((0.0, 0.0), |(a, b), (n, x)| (a + n, b + x));
        let p = (x / n).clamp(1e-4, 1.0 - 1e-4);
        chi2 += groups
            .iter()
            .map(|(n, x)| (x - n * p).powi(2) / (n * p * (1.0 - p)))
            .sum::<f64>();
        dof += groups.len() - 1;
    }
    (dof >= 4).then(|| (chi2 / dof as f64).max(1.0))
}

/// Shifts a bank of CUSUMs is designed for: the smallest shift × 2^j, j < `DESIGNS`.
pub const DESIGNS: usize = 6;

/// A bank of CUSUMs for one rate, designed for a geometric grid of shifts (the smallest one,
/// then ×2, ×4 … up to 99 %), so a large shift is caught at nearly its own optimal delay and a
/// small one still accumulates. The bank alarms when any CUSUM reaches the threshold; each runs
/// against `h + ln(DESIGNS)` (Bonferroni), so the bank spends the same false-alarm budget as one
/// CUSUM at `h`. An alarm lasts until the reverse test — the reference rate against the
/// smallest designed shift: back nearer the reference than any shift worth an alarm — gathers
/// the recovery level; then the bank starts again. Not against the alarmed design: that is
/// often far above the fault's rate (a 14 % error rate alarms a 32 % design), and against it a
/// handful of successes in a row, common at 86 %, read as recovery — the alarm, and its alert,
/// ended every minute or so while the fault went on. One sample adds at most half the
/// threshold: an alarm always rests on at least two.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CusumBank {
    /// Evidence for each design (nats), each held below 1.5 × its threshold.
    pub s: [f64; DESIGNS],
    /// When each design's evidence last left zero: the change point it estimates.
    pub since: [i64; DESIGNS],
    /// The design (shifted rate) that alarmed and its change point, while alarmed.
    pub alarmed_at: Option<f64>,
    pub changed_at: Option<i64>,
    /// Evidence for the reference rate since the alarm (nats).
    pub back: f64,
}

impl CusumBank {
    /// The designs for a reference rate `p0` and smallest shifted rate `p_min`.
    pub fn designs(p0: f64, p_min: f64) -> [f64; DESIGNS] {
        let mut d = [0.0; DESIGNS];
        let step = (p_min - p0).max(1e-6);
        for (j, v) in d.iter_mut().enumerate() {
            *v = (p0 + step * f64::from(1u32 << j)).min(0.99);
        }
        d
    }

    /// The threshold each CUSUM runs against for a bank threshold `h`.
    pub fn member_threshold(h: f64) -> f64 {
        h + (DESIGNS as f64).ln()
    }

    /// Adds `n` trials with `x` events seen at `at` against reference `p0` and smallest shift
    /// `p_min`, log-likelihood ratios divided by `overdispersion`; returns whether it is alarmed
    /// after.
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        at: i64,
        n: f64,
        x: f64,
        p0: f64,
        p_min: f64,
        overdispersion: f64,
        h: f64,
        recovery: f64,
    ) -> bool {
        if !(n.is_finite() && x.is_finite() && p0 > 0.0 && p0 < 1.0) || n <= 0.0 {
            return self.alarmed();
        }
        let phi = overdispersion.max(1.0);
        let hm = Self::member_threshold(h);
        let designs = Self::designs(p0, p_min);
        let mut best: Option<(f64, f64, i64)> = None;
        for ((s, since), p1) in self.s.iter_mut().zip(self.since.iter_mut()).zip(designs) {
            if *s <= 0.0 {
                *since = at;
            }
            // No single sample alarms: one scrape adds at most about half the threshold, so a clump
            // (a stalled batch, a failed one) needs another behind it to page.
            let full = bernoulli_llr(n, x, p0, p1) / phi;
            let raw = *s + full.min(sample_cap(hm, 2));
            // The design with the most evidence before the caps names the shift.
            if raw >= hm && best.is_none_or(|(v, _, _)| *s + full > v) {
                best = Some((*s + full, p1, *since));
            }
            *s = raw.clamp(0.0, 1.5 * hm);
        }
        match self.alarmed_at {
            Some(_) => {
                let p_back = designs[0].max(p0 * 1.0001);
                self.back = (self.back - bernoulli_llr(n, x, p0, p_back) / phi).max(0.0);
                if self.back >= recovery {
                    *self = CusumBank::default();
                }
            }
            None => {
                if let Some((_, p1, since)) = best {
                    self.alarmed_at = Some(p1);
                    self.changed_at = Some(since);
                    self.back = 0.0;
                }
            }
        }
        self.alarmed()
    }

    pub fn alarmed(&self) -> bool {
        self.alarmed_at.is_some()
    }

    /// The largest evidence of the bank over its member threshold (1 = at the threshold).
    pub fn level(&self, h: f64) -> f64 {
        self.s.iter().copied().fold(0.0, f64::max) / Self::member_threshold(h)
    }

    /// Where the run of the bank's strongest design began, once its evidence holds at least
    /// `level` of the member threshold for a bank threshold `h` (not yet alarmed: a fault may be
    /// building its case since then).
    pub fn rising_since(&self, h: f64, level: f64) -> Option<i64> {
        let (s, since) = self
            .s
            .iter()
            .zip(self.since)
            .max_by(|a, b| a.0.total_cmp(b.0))?;
        (*s > 0.0 && *s >= level * Self::member_threshold(h)).then_some(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_name_their_key() {
        assert!(ReplicaShiftParams::default().validate().is_ok());
        let p = ReplicaShiftParams {
            ratio: 1.0,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "ratio");
        let p = ReplicaShiftParams {
            tail_quantiles: vec![1.2],
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "tail_quantiles");
        let p = ReplicaShiftParams {
            location_ratio: 1.0,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "location_ratio");
        let p = ReplicaShiftParams {
            own_quantile: 1.0,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "own_quantile");
        let p = ReplicaShiftParams {
            location_min_minutes: 1,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "location_min_minutes");
        for step in [0.0, 25.0, 45.0, f64::NAN] {
            let p = ReplicaShiftParams {
                location_step_s: step,
                ..Default::default()
            };
            assert_eq!(p.validate().unwrap_err().field, "location_step_s");
        }
        let p = ReplicaShiftParams {
            attribute_share: 0.5,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "attribute_share");
        let p = ReplicaShiftParams {
            attribute_z: f64::NAN,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "attribute_z");
    }

    #[test]
    fn location_delay_counts_whole_slots_of_evidence_and_no_less_than_one() {
        let period = 30.0 * 86400.0;
        // One false alarm per 30 days at one observation a minute: h = ln 43,200 ≈ 10.67 nats.
        let h = (30.0f64 * 1440.0).ln();
        // δ = 2: KL 2 nats a minute, h / 2 ≈ 5.3 minutes.
        assert!((location_delay_s(2.0, 60.0, period) - 60.0 * h / 2.0).abs() < 1e-9);
        // Half-minute slots: twice the observations (h grows by ln 2), each slot's δ its own.
        let h30 = (30.0f64 * 2880.0).ln();
        assert!((location_delay_s(2.0, 30.0, period) - 30.0 * h30 / 2.0).abs() < 1e-9);
        // δ = 10: 50 nats a slot would decide in a fraction of it, but the slot must end first.
        assert_eq!(location_delay_s(10.0, 60.0, period), 60.0);
        assert_eq!(location_delay_s(10.0, 30.0, period), 30.0);
        assert_eq!(location_delay_s(0.0, 30.0, period), f64::INFINITY);
        assert_eq!(location_delay_s(-1.0, 30.0, period), f64::INFINITY);
        assert_eq!(location_delay_s(f64::NAN, 30.0, period), f64::INFINITY);
        assert_eq!(location_delay_s(2.0, 0.0, period), f64::INFINITY);
    }

    #[test]
    fn kl_llr_and_delay_agree_with_hand_computation() {
        // 10 % errors against a 0.5 % reference: 0.1 ln 20 + 0.9 ln(0.9 / 0.995).
        let kl = bernoulli_kl(0.1, 0.005);
        assert!((kl - (0.1 * 20f64.ln() + 0.9 * (0.9f64 / 0.995).ln())).abs() < 1e-12);
        assert_eq!(bernoulli_kl(0.3, 0.3), 0.0);
        // Gaussian: d·z − d²/2, zero at half the design.
        assert_eq!(gaussian_llr(1.5, 3.0), 0.0);
        assert!((gaussian_llr(3.0, 3.0) - 4.5).abs() < 1e-12);
        // Mean and sample standard deviation: (1 + 4 + 4 + 9) / 3 = 6 for 1, 3, 5, 7 around 4.
        let (m, sd) = mean_sd(&[1.0, 3.0, 5.0, 7.0]).unwrap();
        assert_eq!(m, 4.0);
        assert!((sd - (20.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_sd(&[1.0]), None);
        // The expected llr per sample under p1 is KL(p1 ‖ p0).
        let llr = bernoulli_llr(1000.0, 100.0, 0.005, 0.1);
        assert!((llr / 1000.0 - kl).abs() < 1e-12);
        // One false page per 30 days at 2 req/s: h = ln(5.18e6) ≈ 15.5 nats, ≈ 74 requests.
        let h = cusum_threshold(30.0 * 86400.0, 2.0, 1);
        assert!((h - (30.0f64 * 86400.0 * 2.0).ln()).abs() < 1e-12);
        let d = optimal_delay_samples(h, 0.1, 0.005);
        assert!((70.0..80.0).contains(&d), "{d}");
        assert!(optimal_delay_samples(h, 0.005, 0.005).is_infinite());
        assert_eq!(cusum_threshold(1.0, 0.0, 1), 100f64.ln());
    }

    #[test]
    fn wilson_upper_bound_is_above_the_rate_and_tightens_with_samples() {
        let small = rate_upper(1.0, 100.0, 2.0).unwrap();
        let large = rate_upper(100.0, 10_000.0, 2.0).unwrap();
        assert!(
            small > 0.01 && large > 0.01 && large < small,
            "{small} {large}"
        );
        assert!(rate_upper(0.0, 50.0, 2.0).unwrap() > 0.0);
        assert_eq!(rate_upper(3.0, 0.0, 2.0), None);
        assert_eq!(rate_upper(5.0, 10.0, 0.0), Some(0.5));
        // The lower bound mirrors it: below the rate, 0 without events, None without trials.
        let lower = rate_lower(30.0, 300.0, 3.0).unwrap();
        assert!(lower > 0.05 && lower < 0.1, "{lower}");
        assert_eq!(rate_lower(0.0, 50.0, 3.0), Some(0.0));
        assert_eq!(rate_lower(3.0, 0.0, 3.0), None);
    }

    #[test]
    fn overdispersion_is_one_for_binomial_counts_and_large_for_clumped_ones() {
        let even: Vec<(f64, f64)> = (0..20)
            .map(|i| (100.0, if i % 2 == 0 { 9.0 } else { 11.0 }))
            .collect();
        assert_eq!(overdispersion(std::slice::from_ref(&even)), Some(1.0));
        let clumped: Vec<(f64, f64)> = (0..20)
            .map(|i| (100.0, if i % 2 == 0 { 0.0 } else { 20.0 }))
            .collect();
        assert!(overdispersion(&[clumped]).unwrap() > 10.0);
        assert_eq!(overdispersion(&[even[..3].to_vec()]), None);
        // A slow swing between blocks is not overdispersion within them.
        let calm: Vec<(f64, f64)> = (0..10).map(|_| (100.0, 1.0)).collect();
        let busy: Vec<(f64, f64)> = (0..10).map(|_| (100.0, 10.0)).collect();
        assert_eq!(overdispersion(&[calm.clone(), busy.clone()]), Some(1.0));
        let pooled: Vec<(f64, f64)> = calm.into_iter().chain(busy).collect();
        assert!(overdispersion(&[pooled]).unwrap() > 3.0);
    }

    #[test]
    fn bank_alarms_on_small_and_large_shifts_holds_and_recovers_after_them() {
        let (p0, p_min, h) = (0.01, 0.03, 10.0);
        let designs = CusumBank::designs(p0, p_min);
        assert_eq!(designs[0], 0.03);
        assert!((designs[5] - 0.65).abs() < 1e-12, "{designs:?}");
        // Healthy: 1 % of 100 per step, never alarmed, evidence back to 0.
        let mut b = CusumBank::default();
        for _ in 0..1000 {
            assert!(!b.update(0, 100.0, 1.0, p0, p_min, 1.0, h, 3.0));
        }
        assert_eq!(b.level(h), 0.0);
        let steps_to_alarm = |x: f64| {
            let mut b = CusumBank::default();
            (1..100)
                .find(|_| b.update(0, 100.0, x, p0, p_min, 1.0, h, 3.0))
                .unwrap()
        };
        // A large shift is caught near its own optimal delay (h / KL per 100 trials), a small
        // one later, each far sooner than a single CUSUM designed for the other would.
        let large = steps_to_alarm(30.0) as f64;
        let optimal = optimal_delay_samples(h, 0.3, p0) / 100.0;
        assert!(
            large <= (2.0 * optimal).ceil() + 1.0,
            "{large} vs {optimal}"
        );
        let small = steps_to_alarm(4.0);
        assert!(small > large as usize && small < 40, "{small}");
        // Overdispersion slows it in proportion.
        let mut slow = CusumBank::default();
        let clumped = (1..100)
            .find(|_| slow.update(0, 100.0, 4.0, p0, p_min, 3.0, h, 3.0))
            .unwrap();
        assert!(clumped >= 2 * small, "{clumped} vs {small}");
        // Held while the shift lasts, released once healthy counts gather 3 nats.
        let mut b = CusumBank::default();
        let mut t = 0;
        while !b.update(t, 100.0, 30.0, p0, p_min, 1.0, h, 3.0) {
            t += 1;
        }
        assert_eq!(
            b.changed_at,
            Some(0),
            "the change point is where evidence left zero"
        );
        assert!(b.update(t, 100.0, 30.0, p0, p_min, 1.0, h, 3.0));
        let healthy = (1..50)
            .find(|_| !b.update(0, 100.0, 1.0, p0, p_min, 1.0, h, 3.0))
            .unwrap();
        // 3 nats for 1 % against the smallest shift (3 %): ≈ 0.92 nats per 100 trials.
        assert!(healthy <= 4, "{healthy}");
        assert_eq!(b, CusumBank::default());
    }

    #[test]
    fn an_alarm_on_single_trials_holds_through_runs_of_successes_and_ends_once_healthy() {
        // A replica at 1.4 req/s scraped every second sees one request at a time. A 14 % error
        // rate against a 1.3 % reference alarms a design near or above it; runs of successes
        // (six in a row at 86 %: 40 % of the time) are ordinary and must not end the alarm.
        let (p0, p_min, h) = (0.013, 0.05, 17.6);
        for seed in 1..=8 {
            let mut rng = crate::test_rng::Rng(seed);
            let mut trial = |rate: f64| f64::from(u8::from(rng.unit() < rate));
            let mut b = CusumBank::default();
            let mut t = 0;
            while !b.update(t, 1.0, trial(0.14), p0, p_min, 1.0, h, 3.0) {
                t += 1;
                assert!(t < 2000, "seed {seed}: never alarmed");
            }
            // Four hours of it at 1.4 req/s.
            for t in 0..20_000 {
                assert!(
                    b.update(t, 1.0, trial(0.14), p0, p_min, 1.0, h, 3.0),
                    "seed {seed}: the alarm ended {t} requests into a sustained fault"
                );
            }
            // Back at the reference rate: released within a few hundred requests.
            let released = (1..2000)
                .find(|t| !b.update(*t, 1.0, trial(p0), p0, p_min, 1.0, h, 3.0))
                .expect("never released");
            assert!(released < 400, "seed {seed}: {released}");
        }
    }

    #[test]
    fn rising_since_names_where_evidence_half_way_to_an_alarm_began() {
        let (p0, p_min, h) = (0.01, 0.03, 10.0);
        let mut b = CusumBank::default();
        // Healthy steps: no rising run.
        for t in 0..10 {
            b.update(t, 100.0, 1.0, p0, p_min, 1.0, h, 3.0);
        }
        assert_eq!(b.rising_since(h, 0.5), None);
        // A small shift from step 10: below half the threshold, nothing; from half on, the
        // step its run began, until the alarm.
        let mut t = 10;
        let mut seen = None;
        while !b.update(t, 100.0, 4.0, p0, p_min, 1.0, h, 3.0) {
            if b.level(h) < 0.5 {
                assert_eq!(b.rising_since(h, 0.5), None, "step {t}");
            } else {
                seen = b.rising_since(h, 0.5);
                assert_eq!(seen, Some(10), "step {t}");
            }
            t += 1;
        }
        assert_eq!(
            seen,
            Some(10),
            "the evidence passed half way before the alarm"
        );
    }

    #[test]
    fn capped_samples_reach_the_threshold_in_the_stated_number_and_not_fewer() {
        // Two (three) capped samples reach the threshold however the sum rounds; one (two)
        // never does.
        for h in [1.0, 7.3, 19.686_401, 31.17] {
            assert!(2.0 * sample_cap(h, 2) >= h && sample_cap(h, 2) < h);
            let third = sample_cap(h, 3);
            assert!(third + third + third >= h && third + third < h);
        }
    }
}
