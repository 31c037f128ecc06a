// Output length outliers (spec section 4): each response is tested on a robust log scale against
// the model's recent responses (an annotation, not an alert); the model-level alert tests whether
// the share of outliers — longer, shorter, or truncated at the request's own token limit — in a
// window is significantly above the model's (or instance's) baseline.

use crate::robust::median_split_sigma;
use crate::{Finding, ParamError, Validate, check};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

#[path = "length_share.rs"]
mod share;
use share::{CLASSES, Class, Counts, share_test};

/// Per request: |ln(1+L) − median| > `sigmas` × σ over the last `reference_size` responses of
/// the model that are older than the window under test, σ = 1.4826·MAD of that side of the
/// median (lengths are skewed even on a log scale, and capped at max_tokens). Per model (and per
/// instance): the outlier share of the window vs. the baseline share of the `baseline_ms`
/// before it, one-sided binomial test at `alpha`. A third class, "truncated" (the response
/// stopped at its request's token limit, e.g. finish_reason "length"), is tested the same way
/// but never annotated: a blow-up capped at each request's varying max_tokens is no outlier in
/// absolute length, only in how many responses hit their limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LengthOutlierParams {
    /// Responses in the reference (the spec's "last 100 responses of that model").
    #[serde(alias = "window")]
    pub reference_size: usize,
    /// Responses whose truncation the reference also remembers: the truncated share's baseline
    /// until the model has a tested history older than the window (right after start).
    /// Truncation is common, so its rate needs far more responses than the tail's median does.
    pub truncated_reference_size: usize,
    /// Fewest reference responses before a response is tested at all.
    pub min_reference: usize,
    /// k of |ln L − median| > k · σ.
    pub sigmas: f64,
    /// Floor on the robust σ of ln L (≈ a relative spread): a reference where every answer hit
    /// max_tokens must not turn a one-token difference into an outlier.
    pub min_sigma_fraction: f64,
    /// Tested responses a window (and the baseline) needs before the share test may fire.
    pub min_samples: usize,
    /// A second, short window tested beside the rule's window (ms; 0: none), so that a blow-up
    /// is found before it fills the long window. Each window and direction is tested at
    /// alpha / (number of tests).
    pub short_window_ms: i64,
    /// How far back the baseline outlier rate reaches, before the window under test (ms).
    pub baseline_ms: i64,
    /// The baseline rate is never taken below this (healthy long tails do produce outliers).
    pub min_baseline_rate: f64,
    /// The same floor for the truncated share: a model whose answers are (almost) never cut off
    /// must not page on a handful that are.
    pub truncated_min_baseline_rate: f64,
    /// The effect size of the truncated share, as an odds ratio against the baseline rate:
    /// truncation is common (10–60 % in many workloads) and moves with every drift of the
    /// lengths against fixed limits, so it must change by much more than a ratio of rates does
    /// for tail outliers; odds also stay reachable for a baseline above 50 %.
    pub truncated_min_odds_ratio: f64,
    /// The baseline rate used is its Wilson upper bound at this normal quantile, so a short
    /// baseline is not mistaken for a precise one.
    pub baseline_z: f64,
    /// One-sided significance of the binomial tests (over all three classes and both windows).
    pub alpha: f64,
    /// The window's share must also be at least this many times the baseline rate (effect size:
    /// real traffic is over-dispersed, so significance alone is not enough).
    pub min_ratio: f64,
    /// The reference stops learning while a share test is significant, for at most this long
    /// (ms): a change that lasts longer becomes the new normal (the KS drift rule reports it).
    pub max_freeze_ms: i64,
}

impl Default for LengthOutlierParams {
    fn default() -> Self {
        LengthOutlierParams {
            reference_size: 100,
            truncated_reference_size: 1000,
            min_reference: 50,
            sigmas: 3.0,
            min_sigma_fraction: 0.05,
            min_samples: 50,
            short_window_ms: 15_000,
            baseline_ms: 600_000,
            min_baseline_rate: 0.02,
            truncated_min_baseline_rate: 0.05,
            truncated_min_odds_ratio: 6.0,
            baseline_z: 1.645,
            alpha: 1e-4,
            min_ratio: 2.0,
            max_freeze_ms: 1_800_000,
        }
    }
}

impl Validate for LengthOutlierParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(self.reference_size >= 5, "reference_size", "must be ≥ 5")?;
        check(
            self.truncated_reference_size >= self.reference_size,
            "truncated_reference_size",
            "must be ≥ reference_size",
        )?;
        check(
            self.min_reference >= 5 && self.min_reference <= self.reference_size,
            "min_reference",
            "must be in [5, reference_size]",
        )?;
        check(
            self.sigmas.is_finite() && self.sigmas > 0.0,
            "sigmas",
            "must be > 0",
        )?;
        check(
            self.min_sigma_fraction.is_finite() && self.min_sigma_fraction >= 0.0,
            "min_sigma_fraction",
            "must be ≥ 0",
        )?;
        check(self.min_samples >= 1, "min_samples", "must be ≥ 1")?;
        check(self.short_window_ms >= 0, "short_window_ms", "must be ≥ 0")?;
        check(
            self.baseline_ms >= 1_000,
            "baseline_ms",
            "must be ≥ 1000 (1 s)",
        )?;
        check(
            self.min_baseline_rate > 0.0 && self.min_baseline_rate < 1.0,
            "min_baseline_rate",
            "must be in (0, 1)",
        )?;
        check(
            self.truncated_min_baseline_rate > 0.0 && self.truncated_min_baseline_rate < 1.0,
            "truncated_min_baseline_rate",
            "must be in (0, 1)",
        )?;
        check(
            self.truncated_min_odds_ratio.is_finite() && self.truncated_min_odds_ratio >= 1.0,
            "truncated_min_odds_ratio",
            "must be ≥ 1",
        )?;
        check(
            self.baseline_z.is_finite() && self.baseline_z >= 0.0,
            "baseline_z",
            "must be ≥ 0",
        )?;
        check(
            self.alpha > 0.0 && self.alpha < 0.5,
            "alpha",
            "must be in (0, 0.5)",
        )?;
        check(
            self.min_ratio.is_finite() && self.min_ratio >= 1.0,
            "min_ratio",
            "must be ≥ 1",
        )?;
        check(self.max_freeze_ms >= 0, "max_freeze_ms", "must be ≥ 0")
    }
}

/// Counts of one time bucket of one scope (the model, or one of its instances).
#[derive(Debug, Clone)]
struct Bucket {
    start: i64,
    tested: u64,
    longer: u64,
    shorter: u64,
    truncated: u64,
    /// Inside a window that tested significant: never part of a later baseline.
    flagged: bool,
}

#[derive(Debug, Clone, Default)]
struct Scope {
    buckets: VecDeque<Bucket>,
    /// Since when a share test of this scope has been significant, and the baseline it had
    /// then (kept while frozen, so the baseline does not learn the fault either).
    flagged_since: Option<(i64, Counts)>,
}

/// One model's output-length state. Keep one per model; `observe` each response, `evaluate`
/// on every engine step.
#[derive(Debug, Clone)]
pub struct LengthOutlier {
    p: LengthOutlierParams,
    window_ms: i64,
    bucket_ms: i64,
    /// (at, ln(1+L), truncated) of responses still inside the window under test.
    pending: VecDeque<(i64, f64, bool)>,
    /// ln(1+L) of the last `reference_size` responses older than the window.
    reference: VecDeque<f64>,
    /// Whether each of the last `truncated_reference_size` such responses was truncated.
    truncation: VecDeque<bool>,
    /// (median, σ below, σ above; floored) of `reference`, recomputed when it changes, and
    /// how many reference responses are themselves outliers by it (the baseline until the
    /// model has a tested history older than the window: right after start).
    stats: Option<((f64, f64, f64), Counts)>,
    /// "" is the whole model, other keys its instances.
    scopes: BTreeMap<String, Scope>,
    /// Responses that ended at or before this never join the reference: one window past the
    /// last time a share test was significant (within `max_freeze_ms` of its onset). A blow-up
    /// is then not absorbed while it is tested, nor from the responses still in the window.
    quarantine_until: i64,
}

impl LengthOutlier {
    /// `window_ms`: the window under test (the rule's `window`).
    pub fn new(p: LengthOutlierParams, window_ms: i64) -> Self {
        let window_ms = window_ms.max(1_000);
        LengthOutlier {
            bucket_ms: (window_ms / 24).max(250),
            window_ms,
            pending: VecDeque::new(),
            reference: VecDeque::with_capacity(p.reference_size),
            truncation: VecDeque::with_capacity(p.truncated_reference_size),
            stats: None,
            scopes: BTreeMap::new(),
            quarantine_until: i64::MIN,
            p,
        }
    }

    /// Responses in the reference now.
    pub fn reference_len(&self) -> usize {
        self.reference.len()
    }

    /// Tests one response of `instance` (may be empty) that ended at `at_ms` against the
    /// reference, counts it toward the share tests and keeps it for the reference. `truncated`:
    /// it stopped at its request's token limit (counted, never annotated on its own). Returns
    /// the per-request annotation when its length is an outlier. Non-finite or negative
    /// lengths are ignored.
    pub fn observe(
        &mut self,
        at_ms: i64,
        instance: &str,
        output_tokens: f64,
        truncated: bool,
    ) -> Option<Finding> {
        if !output_tokens.is_finite() || output_tokens < 0.0 {
            return None;
        }
        self.promote(at_ms);
        let x = output_tokens.ln_1p();
        let verdict = self.test(x);
        self.pending.push_back((at_ms, x, truncated));
        let (dev, outlier) = verdict?;
        let class = Class {
            longer: outlier && dev > 0.0,
            shorter: outlier && dev <= 0.0,
            truncated,
        };
        let bucket_ms = self.bucket_ms;
        self.count("", at_ms, bucket_ms, class);
        if !instance.is_empty() {
            self.count(instance, at_ms, bucket_ms, class);
        }
        outlier.then(|| self.annotation(dev, output_tokens))
    }

    /// Moves responses that left the window under test into the reference (dropping those of
    /// a quarantined period) and trims it to `reference_size`.
    fn promote(&mut self, now: i64) {
        let mut changed = false;
        while let Some(&(t, x, truncated)) = self.pending.front() {
            if t > now - self.window_ms {
                break;
            }
            self.pending.pop_front();
            if t > self.quarantine_until {
                self.reference.push_back(x);
                self.truncation.push_back(truncated);
                changed = true;
            }
        }
        while self.reference.len() > self.p.reference_size {
            self.reference.pop_front();
        }
        while self.truncation.len() > self.p.truncated_reference_size {
            self.truncation.pop_front();
        }
        if changed {
            self.stats = None;
        }
    }

    /// None: not tested (reference too small); else (ln deviation from the median, outlier?).
    fn test(&mut self, x: f64) -> Option<(f64, bool)> {
        let ((med, below, above), _) = self.reference_stats()?;
        let dev = x - med;
        let sigma = if dev < 0.0 { below } else { above };
        Some((dev, sigma > 0.0 && dev.abs() > self.p.sigmas * sigma))
    }

    /// The reference's (median, σ below, σ above) and its own outlier counts; None while it
    /// holds fewer than `min_reference` responses.
    fn reference_stats(&mut self) -> Option<((f64, f64, f64), Counts)> {
        if self.reference.len() < self.p.min_reference {
            return None;
        }
        if self.stats.is_none() {
            let v: Vec<f64> = self.reference.iter().copied().collect();
            let sp = median_split_sigma(&v)?;
            let floor = self.p.min_sigma_fraction;
            let (below, above) = (sp.below.max(floor), sp.above.max(floor));
            let k = self.p.sigmas;
            let own = Counts {
                tested: v.len() as u64,
                longer: v.iter().filter(|x| **x - sp.median > k * above).count() as u64,
                shorter: v.iter().filter(|x| sp.median - **x > k * below).count() as u64,
                truncated: self.truncation.iter().filter(|t| **t).count() as u64,
                truncated_of: self.truncation.len() as u64,
            };
            self.stats = Some(((sp.median, below, above), own));
        }
        self.stats
    }

    /// The per-request annotation of an outlier `dev` away from the reference median.
    fn annotation(&self, dev: f64, tokens: f64) -> Finding {
        let ((med, below, above), _) = self.stats.unwrap_or(((0.0, 1.0, 1.0), Counts::default()));
        let sigma = if dev < 0.0 { below } else { above };
        let median_tokens = med.exp_m1();
        let (direction, advice) = if dev > 0.0 {
            (
                "longer",
                "check for a runaway generation (missing stop token, repetition loop, prompt injection)",
            )
        } else {
            (
                "shorter",
                "check for a truncated or refused answer (error, safety filter, max_tokens)",
            )
        };
        let summary = format!(
            "a response of {tokens:.0} tokens is {:.1}σ {direction} (log scale) than the median {median_tokens:.0} \
             of the model's previous {} responses — {advice}",
            dev.abs() / sigma,
            self.reference.len()
        );
        Finding::new(dev.abs() / (self.p.sigmas * sigma), summary)
            .with("value", tokens)
            .with("output_tokens", tokens)
            .with("median", median_tokens)
            .with("log_deviation", dev)
            .with("log_sigma", sigma)
            .with("deviation_sigmas", dev.abs() / sigma)
            .with("sigmas_threshold", self.p.sigmas)
            .with("reference_samples", self.reference.len())
    }

    fn count(&mut self, scope: &str, at: i64, bucket_ms: i64, class: Class) {
        let s = self.scopes.entry(scope.to_string()).or_default();
        let start = at.div_euclid(bucket_ms) * bucket_ms;
        let flagged = s.flagged_since.is_some();
        // Mostly in order: search from the newest bucket.
        let pos = s.buckets.iter().rposition(|b| b.start <= start);
        let idx = match pos {
            Some(i) if s.buckets[i].start == start => i,
            Some(i) => {
                s.buckets.insert(
                    i + 1,
                    Bucket {
                        start,
                        tested: 0,
                        longer: 0,
                        shorter: 0,
                        truncated: 0,
                        flagged,
                    },
                );
                i + 1
            }
            None => {
                s.buckets.push_front(Bucket {
                    start,
                    tested: 0,
                    longer: 0,
                    shorter: 0,
                    truncated: 0,
                    flagged,
                });
                0
            }
        };
        let b = &mut s.buckets[idx];
        b.tested += 1;
        b.longer += u64::from(class.longer);
        b.shorter += u64::from(class.shorter);
        b.truncated += u64::from(class.truncated);
    }

    /// The share tests at `now`: one finding per scope whose window share of longer, shorter
    /// or truncated responses is significantly above its baseline; the key is "" for the whole model
    /// or the instance name.
    pub fn evaluate(&mut self, now: i64) -> Vec<(String, Finding)> {
        let (w, b, bucket_ms) = (self.window_ms, self.p.baseline_ms, self.bucket_ms);
        let own = self.reference_stats().map(|(_, c)| c);
        let own_min = self.p.min_reference as u64;
        let mut quarantine = self.quarantine_until;
        let mut out = Vec::new();
        for (key, s) in self.scopes.iter_mut() {
            while s
                .buckets
                .front()
                .is_some_and(|x| x.start + bucket_ms <= now - w - b)
            {
                s.buckets.pop_front();
            }
            let in_window = |x: &Bucket| x.start + bucket_ms > now - w;
            let short_w = self.p.short_window_ms;
            let (mut cur, mut short, mut base) =
                (Counts::default(), Counts::default(), Counts::default());
            for x in &s.buckets {
                if in_window(x) {
                    cur.add(x);
                    if x.start + bucket_ms > now - short_w {
                        short.add(x);
                    }
                } else if !x.flagged {
                    base.add(x);
                }
            }
            let min = self.p.min_samples as u64;
            if let Some((t, frozen)) = s.flagged_since
                && now - t < self.p.max_freeze_ms
            {
                base = frozen;
            } else if base.tested < min
                && let Some(c) = own
            {
                // No tested history before the window yet: the reference's own tail share,
                // whose small size the Wilson bound makes conservative.
                base = c;
            }
            let windows: &[(Counts, i64)] = if short_w > 0 && short_w < w {
                &[(cur, w), (short, short_w)]
            } else {
                &[(cur, w)]
            };
            let alpha = self.p.alpha / (CLASSES * windows.len()) as f64;
            let finding = windows
                .iter()
                .filter(|(c, _)| c.tested >= min && base.tested >= min.min(own_min))
                .filter_map(|(c, win)| share_test(&self.p, c, &base, *win, alpha))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, f)| f);
            match finding {
                Some(f) => {
                    if s.flagged_since.is_none() {
                        for x in s.buckets.iter_mut().filter(|x| in_window(x)) {
                            x.flagged = true;
                        }
                        s.flagged_since = Some((now, base));
                    }
                    if s.flagged_since
                        .is_some_and(|(t, _)| now - t < self.p.max_freeze_ms)
                    {
                        // Held for one more window: a fault that dips under the test for a
                        // moment does not slip into the reference.
                        quarantine = now + w;
                    }
                    out.push((key.clone(), f));
                }
                None => s.flagged_since = None,
            }
        }
        self.quarantine_until = quarantine;
        self.scopes.retain(|_, s| !s.buckets.is_empty());
        out
    }
}

#[cfg(test)]
#[path = "length_tests.rs"]
mod tests;
