// Error burst (fast burn, beside the multi-window SLO burn): the serving-side error ratio of a
// short window far above the SLO's budget and significant against the usual error rate.

use serde::{Deserialize, Serialize};

use crate::robust::binomial_sf;
use crate::text::pct;
use crate::{Finding, ParamError, Validate, check};

/// Fires when, over the short window (the rule's `window`, grown up to `max_window_s` until it
/// holds `min_requests`), at least `min_errors` requests failed, the error ratio is at least
/// `burn_rate` × the error budget (40 × 0.5 % = 20 % by default), and that many errors are
/// improbable (p ≤ `alpha`, one-sided binomial) at the reference rate: the larger of the budget
/// and the series' usual rate (its baseline, frozen while a burst lasts, and for an instance
/// its peers' rate in the same window).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ErrorBurstParams {
    /// Good-request objective of the SLO (as `slo_burn`): the budget is 1 − objective.
    pub objective: f64,
    /// Burn rate of the short window that pages at once.
    pub burn_rate: f64,
    pub min_requests: u64,
    pub min_errors: u64,
    /// The short window grows up to this until it holds `min_requests`.
    pub max_window_s: f64,
    /// Reference period of the usual error rate, ending where the short window starts.
    pub baseline_s: f64,
    /// Significance of the error count against the reference rate.
    pub alpha: f64,
    /// A burst lasting longer than this leaves the page to `slo_burn`: the baseline re-learns.
    pub max_hold_s: f64,
}

impl Default for ErrorBurstParams {
    fn default() -> Self {
        ErrorBurstParams {
            objective: 0.995,
            burn_rate: 40.0,
            min_requests: 20,
            min_errors: 5,
            max_window_s: 60.0,
            baseline_s: 600.0,
            alpha: 1e-6,
            max_hold_s: 900.0,
        }
    }
}

impl ErrorBurstParams {
    pub fn budget(&self) -> f64 {
        1.0 - self.objective
    }

    /// The error ratio that pages: burn_rate × budget.
    pub fn threshold_ratio(&self) -> f64 {
        self.burn_rate * self.budget()
    }
}

impl Validate for ErrorBurstParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.objective > 0.0 && self.objective < 1.0,
            "objective",
            "must be in (0, 1)",
        )?;
        check(
            self.burn_rate.is_finite() && self.burn_rate > 1.0 && self.threshold_ratio() <= 1.0,
            "burn_rate",
            "must be > 1 with burn_rate × (1 − objective) ≤ 1",
        )?;
        check(self.min_requests >= 1, "min_requests", "must be ≥ 1")?;
        check(
            self.min_errors >= 1 && self.min_errors <= self.min_requests,
            "min_errors",
            "must be between 1 and min_requests",
        )?;
        check(
            self.max_window_s.is_finite() && self.max_window_s >= 1.0,
            "max_window_s",
            "must be ≥ 1",
        )?;
        check(
            self.baseline_s.is_finite() && self.baseline_s >= 1.0,
            "baseline_s",
            "must be ≥ 1",
        )?;
        check(
            self.alpha > 0.0 && self.alpha < 0.5,
            "alpha",
            "must be in (0, 0.5)",
        )?;
        check(
            self.max_hold_s.is_finite() && self.max_hold_s > 0.0,
            "max_hold_s",
            "must be > 0",
        )
    }
}

/// `errors` of `total` requests failed over `window_s`; `usual` is the series' usual error
/// ratio where known. Score = error ratio / threshold ratio.
pub fn error_burst(
    errors: u64,
    total: u64,
    window_s: f64,
    usual: Option<f64>,
    p: &ErrorBurstParams,
) -> Option<Finding> {
    if total < p.min_requests.max(1) || errors < p.min_errors.max(1) || errors > total {
        return None;
    }
    let ratio = errors as f64 / total as f64;
    let threshold = p.threshold_ratio();
    if !(ratio >= threshold && threshold > 0.0) {
        return None;
    }
    let budget = p.budget();
    let reference = usual
        .filter(|u| u.is_finite())
        .map_or(budget, |u| u.clamp(budget, 1.0));
    let p_value = binomial_sf(errors, total, reference);
    if p_value > p.alpha {
        return None;
    }
    let summary = format!(
        "{} of requests failed over the last {window_s:.0} s ({errors} of {total}): {:.0}× the \
         {} error budget, against a usual {} — page: find the failing component now",
        pct(ratio),
        ratio / budget,
        pct(budget),
        pct(reference),
    );
    Some(
        Finding::new(ratio / threshold, summary)
            .with("errors", errors)
            .with("requests", total)
            .with("window_s", window_s)
            .with("error_ratio", ratio)
            .with("threshold_ratio", threshold)
            .with("burn_rate", ratio / budget)
            .with("reference_ratio", reference)
            .with("p_value", p_value),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_above_the_threshold_and_significant_fires() {
        let p = ErrorBurstParams::default();
        assert!((p.threshold_ratio() - 0.2).abs() < 1e-12);
        let f = error_burst(15, 60, 5.0, Some(0.002), &p).expect("25 % of 60");
        assert!((f.score - 1.25).abs() < 1e-9, "{}", f.score);
        assert!((f.evidence["burn_rate"].as_f64().unwrap() - 50.0).abs() < 1e-9);
        let reference = f.evidence["reference_ratio"].as_f64().unwrap();
        assert!(
            (reference - 0.005).abs() < 1e-12,
            "floored at the budget: {reference}"
        );
        assert!(f.evidence["p_value"].as_f64().unwrap() < 1e-12);
        assert!(f.summary.contains("15 of 60"), "{}", f.summary);
    }

    #[test]
    fn small_counts_usual_error_rates_and_low_ratios_do_not() {
        let p = ErrorBurstParams::default();
        assert!(
            error_burst(4, 20, 5.0, None, &p).is_none(),
            "4 errors < min_errors"
        );
        assert!(
            error_burst(5, 19, 5.0, None, &p).is_none(),
            "19 requests < min_requests"
        );
        assert!(error_burst(11, 60, 5.0, None, &p).is_none(), "18 % < 20 %");
        // A model that usually fails 10 % of requests: 6 of 25 is not a burst.
        assert!(error_burst(6, 25, 5.0, Some(0.10), &p).is_none());
        // … 15 of 25 is.
        assert!(error_burst(15, 25, 5.0, Some(0.10), &p).is_some());
        assert!(error_burst(30, 20, 5.0, None, &p).is_none(), "bad > total");
        assert!(
            error_burst(6, 25, 5.0, Some(f64::NAN), &p).is_some(),
            "NaN usual → budget"
        );
    }

    #[test]
    fn parameters_validate() {
        let p = ErrorBurstParams::default();
        for bad in [
            ErrorBurstParams {
                objective: 1.0,
                ..p.clone()
            },
            ErrorBurstParams {
                burn_rate: 300.0,
                ..p.clone()
            },
            ErrorBurstParams {
                min_errors: 0,
                ..p.clone()
            },
            ErrorBurstParams {
                min_errors: 30,
                ..p.clone()
            },
            ErrorBurstParams {
                alpha: 0.0,
                ..p.clone()
            },
            ErrorBurstParams {
                max_window_s: 0.5,
                ..p.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
