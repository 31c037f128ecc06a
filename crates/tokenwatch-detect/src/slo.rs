// SLO burn (spec section 4): multi-window, multi-burn-rate alerting on an error budget —
// 14.4× over 1 h and 5 min (fast, page), 6× over 6 h and 30 min (slow, ticket).

use serde::{Deserialize, Serialize};

use crate::text::{duration_s, pct};
use crate::{Finding, ParamError, Validate, check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloBurnParams {
    /// Good-request objective, e.g. 0.995: the error budget is 1 − objective.
    pub objective: f64,
    pub fast_burn: f64,
    pub slow_burn: f64,
    /// Requests a window needs before its burn rate counts.
    pub min_requests: u64,
    /// SLO period the budget is spread over (for "budget gone in …").
    pub period_days: f64,
}

impl Default for SloBurnParams {
    fn default() -> Self {
        SloBurnParams {
            objective: 0.995,
            fast_burn: 14.4,
            slow_burn: 6.0,
            min_requests: 30,
            period_days: 30.0,
        }
    }
}

impl Validate for SloBurnParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.objective > 0.0 && self.objective < 1.0,
            "objective",
            "must be in (0, 1)",
        )?;
        check(
            self.fast_burn.is_finite() && self.fast_burn > 0.0,
            "fast_burn",
            "must be > 0",
        )?;
        check(
            self.slow_burn.is_finite() && self.slow_burn > 0.0,
            "slow_burn",
            "must be > 0",
        )?;
        check(
            self.period_days.is_finite() && self.period_days > 0.0,
            "period_days",
            "must be > 0",
        )
    }
}

/// (bad, total) request counts per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BurnWindows {
    pub h1: (u64, u64),
    pub m5: (u64, u64),
    pub h6: (u64, u64),
    pub m30: (u64, u64),
}

/// Error rate / error budget; None under `min_requests` or when bad > total.
pub fn burn_rate(window: (u64, u64), p: &SloBurnParams) -> Option<f64> {
    let (bad, total) = window;
    let budget = 1.0 - p.objective;
    if total == 0 || total < p.min_requests || bad > total || !(budget > 0.0 && budget < 1.0) {
        return None;
    }
    Some(bad as f64 / total as f64 / budget)
}

/// The lengths of the four windows of `BurnWindows`, seconds (the SRE workbook's 1 h / 5 min
/// and 6 h / 30 min by default; SLOs may configure shorter ones).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BurnWindowLengths {
    pub fast_long_s: f64,
    pub fast_short_s: f64,
    pub slow_long_s: f64,
    pub slow_short_s: f64,
}

impl Default for BurnWindowLengths {
    fn default() -> Self {
        BurnWindowLengths {
            fast_long_s: 3600.0,
            fast_short_s: 300.0,
            slow_long_s: 21_600.0,
            slow_short_s: 1800.0,
        }
    }
}

impl BurnWindowLengths {
    /// The windows' names (`1h`, `5m`, `6h`, `30m` by default), in the order of `BurnWindows`.
    pub fn names(&self) -> [String; 4] {
        [
            self.fast_long_s,
            self.fast_short_s,
            self.slow_long_s,
            self.slow_short_s,
        ]
        .map(window_name)
    }
}

/// A window length as Prometheus writes durations: `1h`, `30m`, `10s`, `500ms`, `28d`.
pub fn window_name(s: f64) -> String {
    let ms = (s * 1000.0).round().max(0.0) as u64;
    for (unit, per) in [
        ("d", 86_400_000u64),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= per && ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// Which pair of windows may fire: a page (fast) or a ticket (slow) alert, or either.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum BurnCondition {
    #[default]
    Any,
    Fast,
    Slow,
}

/// Fires when (1 h AND 5 min ≥ fast_burn) OR (6 h AND 30 min ≥ slow_burn). Score = the smaller
/// burn of the firing pair / its threshold (the larger of the two conditions).
pub fn slo_burn(w: &BurnWindows, p: &SloBurnParams) -> Option<Finding> {
    slo_burn_over(w, p, &BurnWindowLengths::default(), BurnCondition::Any)
}

/// `slo_burn` over windows of the given lengths (evidence `burn_rate_<window name>`), only the
/// pair `which` allows.
pub fn slo_burn_over(
    w: &BurnWindows,
    p: &SloBurnParams,
    len: &BurnWindowLengths,
    which: BurnCondition,
) -> Option<Finding> {
    let [h1, m5, h6, m30] = [w.h1, w.m5, w.h6, w.m30].map(|x| burn_rate(x, p));
    let pair = |a: Option<f64>, b: Option<f64>, limit: f64| match (a, b) {
        (Some(a), Some(b)) if a >= limit && b >= limit => Some(a.min(b) / limit),
        _ => None,
    };
    let fast = pair(h1, m5, p.fast_burn).filter(|_| which != BurnCondition::Slow);
    let slow = pair(h6, m30, p.slow_burn).filter(|_| which != BurnCondition::Fast);
    let (condition, score, long, long_s) = match (fast, slow) {
        (Some(f), s) if s.is_none_or(|s| f >= s) => ("fast", f, w.h1, len.fast_long_s),
        (_, Some(s)) => ("slow", s, w.h6, len.slow_long_s),
        _ => return None,
    };
    let long_name = duration_s(long_s);
    let burn = if condition == "fast" { h1 } else { h6 }.unwrap_or(0.0);
    let short = if condition == "fast" { m5 } else { m30 }.unwrap_or(0.0);
    let budget = 1.0 - p.objective;
    let exhaust_s = p.period_days * 86_400.0 / burn.max(1e-12);
    let summary = format!(
        "{} of requests were bad over the last {long_name} ({} of {}), burning the {} error budget at {burn:.1}× \
         ({:.1}× in the short window); at this rate the {}-day budget is gone in {} — {}",
        pct(long.0 as f64 / long.1.max(1) as f64),
        long.0,
        long.1,
        pct(budget),
        short,
        p.period_days,
        duration_s(exhaust_s),
        if condition == "fast" {
            "page: find the failing component now"
        } else {
            "open a ticket: errors are eroding the budget"
        }
    );
    let num = |x: Option<f64>| x.map_or(serde_json::Value::Null, serde_json::Value::from);
    let names = len.names();
    let mut f = Finding::new(score, summary).with("condition", condition);
    for (name, rate) in names.iter().zip([h1, m5, h6, m30]) {
        f = f.with(&format!("burn_rate_{name}"), num(rate));
    }
    Some(
        f.with("fast_burn", p.fast_burn)
            .with("slow_burn", p.slow_burn)
            .with("objective", p.objective)
            .with("error_budget", budget)
            .with("budget_exhausted_in_s", exhaust_s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_burn_rates() {
        let p = SloBurnParams::default();
        // 0.5% errors = exactly the budget: burn 1.
        assert!((burn_rate((5, 1000), &p).unwrap() - 1.0).abs() < 1e-12);
        // 7.2% errors = 14.4× a 0.5% budget.
        assert!((burn_rate((72, 1000), &p).unwrap() - 14.4).abs() < 1e-9);
        assert_eq!(burn_rate((0, 1000), &p), Some(0.0));
        assert_eq!(burn_rate((1, 10), &p), None, "too few requests");
        assert_eq!(burn_rate((11, 10), &p), None, "bad > total");
        assert_eq!(burn_rate((0, 0), &p), None);
    }

    #[test]
    fn fast_burn_fires_and_needs_both_windows() {
        let p = SloBurnParams::default();
        let w = BurnWindows {
            h1: (800, 5000),
            m5: (100, 400),
            h6: (900, 30000),
            m30: (150, 2500),
        };
        let f = slo_burn(&w, &p).unwrap();
        assert_eq!(f.evidence["condition"], "fast");
        // 1 h: 16% / 0.5% = 32×; 5 min: 25% → 50×; score = 32 / 14.4.
        assert!((f.score - 32.0 / 14.4).abs() < 1e-9, "{}", f.score);
        assert!((f.evidence["burn_rate_5m"].as_f64().unwrap() - 50.0).abs() < 1e-9);
        // The burst is over: 5 min window clean → no fast burn (and the 6 h/30 min pair is under 6×).
        let recovered = BurnWindows {
            m5: (0, 400),
            m30: (10, 2500),
            ..w
        };
        assert!(slo_burn(&recovered, &p).is_none());
    }

    #[test]
    fn slow_burn_and_edges() {
        let p = SloBurnParams::default();
        // 4% errors (8×) over 6 h and 30 min, 1 h/5 min under 14.4×.
        let w = BurnWindows {
            h1: (40, 1000),
            m5: (4, 100),
            h6: (240, 6000),
            m30: (20, 500),
        };
        let f = slo_burn(&w, &p).unwrap();
        assert_eq!(f.evidence["condition"], "slow");
        assert!((f.score - 8.0 / 6.0).abs() < 1e-9);
        assert!(
            slo_burn(&BurnWindows::default(), &p).is_none(),
            "no traffic"
        );
        let clean = BurnWindows {
            h1: (2, 1000),
            m5: (0, 100),
            h6: (10, 6000),
            m30: (1, 500),
        };
        assert!(slo_burn(&clean, &p).is_none());
        let tiny = BurnWindows {
            h1: (5, 10),
            m5: (5, 10),
            h6: (5, 10),
            m30: (5, 10),
        };
        assert!(slo_burn(&tiny, &p).is_none(), "too few requests per window");
    }

    #[test]
    fn configured_windows_and_conditions() {
        let p = SloBurnParams::default();
        let len = BurnWindowLengths {
            fast_long_s: 10.0,
            fast_short_s: 2.0,
            slow_long_s: 60.0,
            slow_short_s: 0.5,
        };
        assert_eq!(len.names(), ["10s", "2s", "1m", "500ms"]);
        assert_eq!(
            BurnWindowLengths::default().names(),
            ["1h", "5m", "6h", "30m"]
        );
        assert_eq!(window_name(28.0 * 86_400.0), "28d");
        // Both pairs burn: the larger score (slow: 100 / 6 against 100 / 14.4) wins under Any,
        // each alone under its own condition.
        let w = BurnWindows {
            h1: (500, 1000),
            m5: (60, 100),
            h6: (500, 1000),
            m30: (60, 100),
        };
        let any = slo_burn_over(&w, &p, &len, BurnCondition::Any).unwrap();
        assert_eq!(any.evidence["condition"], "slow");
        let fast = slo_burn_over(&w, &p, &len, BurnCondition::Fast).unwrap();
        assert_eq!(fast.evidence["condition"], "fast");
        assert!((fast.score - 100.0 / 14.4).abs() < 1e-9);
        assert!((fast.evidence["burn_rate_10s"].as_f64().unwrap() - 100.0).abs() < 1e-9);
        assert!(fast.evidence.contains_key("burn_rate_500ms"));
        let slow = slo_burn_over(&w, &p, &len, BurnCondition::Slow).unwrap();
        assert_eq!(slow.evidence["condition"], "slow");
        assert!((slow.score - 100.0 / 6.0).abs() < 1e-9);
        // Only the slow pair burns: a fast-only rule stays quiet.
        let w = BurnWindows {
            h1: (40, 1000),
            m5: (4, 100),
            h6: (240, 6000),
            m30: (20, 500),
        };
        assert!(slo_burn_over(&w, &p, &len, BurnCondition::Fast).is_none());
        assert!(slo_burn_over(&w, &p, &len, BurnCondition::Slow).is_some());
    }
}
