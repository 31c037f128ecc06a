// The parameters of the output length outlier detector, their defaults and their validation
// (the per-request test, the share tests and the attribution to instances).

use crate::{ParamError, Validate, check};
use serde::{Deserialize, Serialize};

/// Per request: |ln(1+L) − median| > `sigmas` × σ over the last `reference_size` responses of
/// the model that are older than the window under test, σ = 1.4826·MAD of that side of the
/// median (lengths are skewed even on a log scale, and capped at max_tokens). Per model (and per
/// instance): the outlier share of the window vs. the baseline share of the `baseline_ms`
/// before it, one-sided binomial test at `alpha`. A third class, "truncated" (the response
/// stopped at its request's token limit, e.g. finish_reason "length"), is tested the same way
/// but never annotated: a blow-up capped at each request's varying max_tokens is no outlier in
/// absolute length, only in how many responses hit their limit. Each instance is also
/// compared with its peers in the same window (see `attribution_alpha`): the instances the
/// outliers concentrate on are named.
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
    /// One-sided significance of the attribution to an instance (over all classes and both
    /// windows, like `alpha`): its outlier share in the window against the share of the
    /// model's other instances in the same window, and against its own baseline — both must
    /// hold, each with the class's effect size (`min_ratio`, `truncated_min_odds_ratio`), and
    /// the other instances' share must itself be below that effect size against the model's
    /// baseline (a change on every instance is attributed to none). An attributed instance is
    /// a finding even before its window holds `min_samples` (a slow instance gets few requests
    /// from a pool).
    pub attribution_alpha: f64,
    /// Fewest outliers (of the class tested) an instance needs in the window to be attributed.
    pub attribution_min_outliers: u64,
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
            attribution_alpha: 1e-4,
            attribution_min_outliers: 8,
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
        check(self.max_freeze_ms >= 0, "max_freeze_ms", "must be ≥ 0")?;
        check(
            self.attribution_alpha > 0.0 && self.attribution_alpha < 0.5,
            "attribution_alpha",
            "must be in (0, 0.5)",
        )?;
        check(
            self.attribution_min_outliers >= 1,
            "attribution_min_outliers",
            "must be ≥ 1",
        )
    }
}
