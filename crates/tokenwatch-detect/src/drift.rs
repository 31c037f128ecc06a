// Distribution drift of spec section 4: two-sample KS on numeric windows, KL divergence on
// categorical outputs (for N consecutive evaluations), and the adaptive weighted drift vote.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use crate::stats::{ks_two_sample, median};
use crate::{Finding, ParamError, Validate, check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KsDriftParams {
    pub alpha: f64,
    /// Finite values each window needs.
    pub min_samples: usize,
    /// The KS statistic D (largest gap between the two CDFs) must also reach this: with
    /// thousands of requests per window, p < alpha alone flags shifts of a percent or two
    /// that healthy traffic makes all day (slow drift, load swings).
    pub min_statistic: f64,
}

impl Default for KsDriftParams {
    fn default() -> Self {
        KsDriftParams {
            alpha: 0.01,
            min_samples: 30,
            min_statistic: 0.1,
        }
    }
}

impl Validate for KsDriftParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.alpha > 0.0 && self.alpha < 1.0,
            "alpha",
            "must be in (0, 1)",
        )?;
        check(self.min_samples >= 2, "min_samples", "must be ≥ 2")?;
        check(
            (0.0..1.0).contains(&self.min_statistic),
            "min_statistic",
            "must be in [0, 1)",
        )
    }
}

/// Two-sample KS test, asymptotic p-value (Kolmogorov distribution at D·√(nm/(n+m))), and
/// D ≥ `min_statistic`. Non-finite
/// values are dropped (and counted in the evidence). Score = ln p / ln alpha: 1.0 at p = alpha,
/// 3.0 at p = alpha³ (p floored at 1e-300).
pub fn ks_drift(reference: &[f64], current: &[f64], p: &KsDriftParams) -> Option<Finding> {
    let r: Vec<f64> = reference
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    let c: Vec<f64> = current.iter().copied().filter(|x| x.is_finite()).collect();
    if r.len() < p.min_samples.max(2)
        || c.len() < p.min_samples.max(2)
        || !(p.alpha > 0.0 && p.alpha < 1.0)
    {
        return None;
    }
    let (d, pv) = ks_two_sample(&r, &c)?;
    if pv >= p.alpha || d < p.min_statistic {
        return None;
    }
    let (mr, mc) = (median(&r)?, median(&c)?);
    let dropped = reference.len() - r.len() + current.len() - c.len();
    let summary = format!(
        "the current window's distribution differs from the reference (KS D = {d:.2}, p = {pv:.1e} < {}; median \
         {mr:.4} → {mc:.4} over {} vs {} values) — find what changed in traffic or in the model and decide \
         whether the baseline should move",
        p.alpha,
        c.len(),
        r.len()
    );
    Some(
        Finding::new(pv.max(1e-300).ln() / p.alpha.ln(), summary)
            .with("statistic", d)
            .with("p_value", pv)
            .with("alpha", p.alpha)
            .with("reference_samples", r.len())
            .with("current_samples", c.len())
            .with("reference_median", mr)
            .with("current_median", mc)
            .with("dropped_non_finite", dropped),
    )
}

/// KL(current ‖ baseline) in nats over the union of categories, after additive smoothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KlDriftParams {
    pub threshold: f64,
    pub consecutive: usize,
    /// Probability mass added to every category before renormalising (so a category unseen in
    /// the baseline gives a large but finite divergence).
    pub smoothing: f64,
    /// The maps are counts: each side needs at least this total. Set 0 to pass shares.
    pub min_count: f64,
}

impl Default for KlDriftParams {
    fn default() -> Self {
        KlDriftParams {
            threshold: 0.08,
            consecutive: 3,
            smoothing: 1e-3,
            min_count: 30.0,
        }
    }
}

impl Validate for KlDriftParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.threshold.is_finite() && self.threshold > 0.0,
            "threshold",
            "must be > 0",
        )?;
        check(self.consecutive >= 1, "consecutive", "must be ≥ 1")?;
        check(
            self.smoothing.is_finite() && self.smoothing > 0.0,
            "smoothing",
            "must be > 0",
        )?;
        check(
            self.min_count.is_finite() && self.min_count >= 0.0,
            "min_count",
            "must be ≥ 0",
        )
    }
}

/// KL(current ‖ baseline) of two count maps; None when a side is empty, under `min_count`, or has
/// a negative/non-finite count.
pub fn kl_divergence(
    baseline: &BTreeMap<String, f64>,
    current: &BTreeMap<String, f64>,
    smoothing: f64,
    min_count: f64,
) -> Option<f64> {
    let ok = |m: &BTreeMap<String, f64>| m.values().all(|v| v.is_finite() && *v >= 0.0);
    if !ok(baseline) || !ok(current) {
        return None;
    }
    let (tb, tc) = (
        baseline.values().sum::<f64>(),
        current.values().sum::<f64>(),
    );
    if tb <= 0.0 || tc <= 0.0 || tb < min_count || tc < min_count {
        return None;
    }
    let keys: BTreeSet<&String> = baseline.keys().chain(current.keys()).collect();
    let k = keys.len() as f64;
    let eps = smoothing.max(1e-12);
    let share = |m: &BTreeMap<String, f64>, t: f64, key: &String| {
        (m.get(key).copied().unwrap_or(0.0) / t + eps) / (1.0 + k * eps)
    };
    let kl = keys
        .iter()
        .map(|key| {
            let (pc, pb) = (share(current, tc, key), share(baseline, tb, key));
            pc * (pc / pb).ln()
        })
        .sum::<f64>();
    Some(kl.max(0.0))
}

/// One categorical series' streak of divergent evaluations. Keep one per series.
#[derive(Debug, Clone)]
pub struct KlDrift {
    p: KlDriftParams,
    streak: usize,
}

impl KlDrift {
    pub fn new(p: KlDriftParams) -> Self {
        KlDrift { p, streak: 0 }
    }

    pub fn streak(&self) -> usize {
        self.streak
    }

    /// Fires on every evaluation once `consecutive` evaluations in a row were over the threshold;
    /// an evaluation without enough data neither counts nor breaks the streak. Score = KL / threshold.
    pub fn evaluate(
        &mut self,
        baseline: &BTreeMap<String, f64>,
        current: &BTreeMap<String, f64>,
    ) -> Option<Finding> {
        let kl = kl_divergence(baseline, current, self.p.smoothing, self.p.min_count)?;
        if kl <= self.p.threshold {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak < self.p.consecutive.max(1) {
            return None;
        }
        let tc = current.values().sum::<f64>();
        let tb = baseline.values().sum::<f64>();
        let top = current
            .iter()
            .map(|(k, v)| (k, v / tc - baseline.get(k).copied().unwrap_or(0.0) / tb))
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()));
        let moved = top.map_or(String::new(), |(k, d)| {
            format!("; largest change: `{k}` {:+.1} points", d * 100.0)
        });
        let summary = format!(
            "the output category mix diverged from the baseline (KL {kl:.3} > {} for {} evaluations in a row{moved}) — \
             check for a model, prompt or upstream data change",
            self.p.threshold, self.streak
        );
        Some(
            Finding::new(kl / self.p.threshold, summary)
                .with("kl_divergence", kl)
                .with("threshold", self.p.threshold)
                .with("consecutive_evaluations", self.streak)
                .with(
                    "categories",
                    baseline
                        .keys()
                        .chain(current.keys())
                        .collect::<BTreeSet<_>>()
                        .len(),
                )
                .with("current_total", tc)
                .with("baseline_total", tb),
        )
    }
}

/// The three drift signals of the vote, in the order of `DriftVote::weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftSignal {
    Ks,
    Embedding,
    Feedback,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriftVoteParams {
    pub w_ks: f64,
    pub w_embedding: f64,
    pub w_feedback: f64,
    /// Share of the available weight that must vote "drift".
    pub threshold: f64,
    /// Signals that must have an opinion (Some) before the vote may fire.
    pub min_signals: usize,
}

impl Default for DriftVoteParams {
    fn default() -> Self {
        DriftVoteParams {
            w_ks: 0.4,
            w_embedding: 0.35,
            w_feedback: 0.25,
            threshold: 0.5,
            min_signals: 2,
        }
    }
}

impl Validate for DriftVoteParams {
    fn validate(&self) -> Result<(), ParamError> {
        for (name, w) in [
            ("w_ks", self.w_ks),
            ("w_embedding", self.w_embedding),
            ("w_feedback", self.w_feedback),
        ] {
            check(w.is_finite() && w >= 0.0, name, "must be ≥ 0")?;
        }
        check(
            self.w_ks + self.w_embedding + self.w_feedback > 0.0,
            "w_ks",
            "weights must not all be 0",
        )?;
        check(
            self.threshold > 0.0 && self.threshold <= 1.0,
            "threshold",
            "must be in (0, 1]",
        )?;
        check(
            (1..=3).contains(&self.min_signals),
            "min_signals",
            "must be 1, 2 or 3",
        )
    }
}

/// Weighted vote with weights that adapt to each signal's observed false-alarm rate:
/// weight_i ∝ base_i × (1 − far_i), far_i = (false alarms + 1) / (outcomes + 2) (a Beta(1,1)
/// prior, so with no history the weights are the configured ones), floored at 0.02 × base_i and
/// normalised to sum 1.
#[derive(Debug, Clone)]
pub struct DriftVote {
    p: DriftVoteParams,
    outcomes: [u64; 3],
    false_alarms: [u64; 3],
}

impl DriftVote {
    pub fn new(p: DriftVoteParams) -> Self {
        DriftVote {
            p,
            outcomes: [0; 3],
            false_alarms: [0; 3],
        }
    }

    pub fn weights(&self) -> [f64; 3] {
        let base = [self.p.w_ks, self.p.w_embedding, self.p.w_feedback]
            .map(|w| if w.is_finite() { w.max(0.0) } else { 0.0 });
        let mut w = [0.0; 3];
        for i in 0..3 {
            let far = (self.false_alarms[i] as f64 + 1.0) / (self.outcomes[i] as f64 + 2.0);
            w[i] = base[i] * (1.0 - far).max(0.02);
        }
        let total: f64 = w.iter().sum();
        if total > 0.0 {
            w.map(|x| x / total)
        } else {
            [1.0 / 3.0; 3]
        }
    }

    /// After an alarm was reviewed: was this signal's "drift" vote a false alarm?
    pub fn record_outcome(&mut self, signal: DriftSignal, was_false_alarm: bool) {
        let i = signal as usize;
        self.outcomes[i] += 1;
        if was_false_alarm {
            self.false_alarms[i] += 1;
        }
    }

    /// None = this signal has no opinion now (weight renormalised over the others). Score = share
    /// of available weight voting drift / threshold.
    pub fn vote(
        &mut self,
        ks: Option<bool>,
        embedding: Option<bool>,
        feedback: Option<bool>,
    ) -> Option<Finding> {
        let votes = [ks, embedding, feedback];
        let w = self.weights();
        let available: f64 = votes
            .iter()
            .zip(w)
            .filter(|(v, _)| v.is_some())
            .map(|(_, w)| w)
            .sum();
        let count = votes.iter().filter(|v| v.is_some()).count();
        if count < self.p.min_signals.max(1) || available <= 0.0 {
            return None;
        }
        let yes: f64 = votes
            .iter()
            .zip(w)
            .filter(|(v, _)| **v == Some(true))
            .map(|(_, w)| w)
            .sum();
        let share = yes / available;
        if share < self.p.threshold {
            return None;
        }
        let names = ["KS", "embedding", "feedback"];
        let agreeing: Vec<&str> = votes
            .iter()
            .zip(names)
            .filter(|(v, _)| **v == Some(true))
            .map(|(_, n)| n)
            .collect();
        let summary = format!(
            "drift confirmed by {} ({:.0}% of the available vote weight, threshold {:.0}%) — the model's inputs or \
             outputs changed; review recent samples and decide whether to roll back or re-baseline",
            agreeing.join(" + "),
            share * 100.0,
            self.p.threshold * 100.0
        );
        let opt = |v: Option<bool>| v.map_or(serde_json::Value::Null, serde_json::Value::from);
        Some(
            Finding::new(share / self.p.threshold, summary)
                .with("vote_share", share)
                .with("threshold", self.p.threshold)
                .with("ks", opt(ks))
                .with("embedding", opt(embedding))
                .with("feedback", opt(feedback))
                .with("w_ks", w[0])
                .with("w_embedding", w[1])
                .with("w_feedback", w[2]),
        )
    }
}

#[cfg(test)]
#[path = "drift_tests.rs"]
mod tests;
