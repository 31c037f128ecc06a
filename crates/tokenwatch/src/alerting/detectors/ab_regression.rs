// `ab_regression`: per model, the two A/B arms of the window compared (P99 rise, split off its
// target), with thresholds kept out of sampling noise at small sample sizes.

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::model_event;
use crate::alerting::engine::inputs::{Rec, quantile, values};
use crate::alerting::rules::{RuleError, RuleSpec};
use serde::Deserialize;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct AbParams {
    /// Share of traffic meant for arm B (0..1).
    pub target_share_b: f64,
    /// The evaluation score read as the arms' quality (higher is better); without any, the
    /// first quality score given in the window.
    pub quality_score: String,
    #[serde(flatten)]
    pub detect: serde_json::Map<String, serde_json::Value>,
}

impl Default for AbParams {
    fn default() -> Self {
        AbParams {
            target_share_b: 0.5,
            quality_score: crate::alerting::engine::scores::DEFAULT_QUALITY.to_string(),
            detect: Default::default(),
        }
    }
}

pub struct AbRegression {
    pub params: det::AbRegressionParams,
    pub target_share_b: f64,
    /// See `AbParams::quality_score`.
    pub quality_score: String,
}

impl Detector for AbRegression {
    fn name() -> &'static str {
        "ab_regression"
    }

    fn default_window_s() -> i64 {
        300
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let ab: AbParams = rule.params()?;
        if !(0.0..=1.0).contains(&ab.target_share_b) {
            return Err(rule.error("params.target_share_b", "must be between 0 and 1"));
        }
        let params = rule.validated_from(&serde_json::Value::Object(ab.detect))?;
        let signal = rule.signal(&["ttft", "e2e"], "ttft")?;
        let target_share_b = ab.target_share_b;
        if !crate::alerting::feedback::valid_score_name(&ab.quality_score) {
            return Err(rule.error(
                "params.quality_score",
                "must be a score name (a-z, 0-9, '_' and '.')",
            ));
        }
        Ok((
            AbRegression {
                params,
                target_share_b,
                quality_score: ab.quality_score,
            },
            signal,
        ))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, w) = (cx.now, rule.window_ms);
        let (p, share_b) = (&self.params, self.target_share_b);
        let mut out = Vec::new();
        for m in cx.inputs.models() {
            let win: Vec<&Rec> = cx.inputs.window(&m, now - w, now).collect();
            let mut groups: Vec<&str> = win
                .iter()
                .map(|r| r.ab_group.as_str())
                .filter(|g| !g.is_empty())
                .collect();
            groups.sort();
            groups.dedup();
            if groups.len() != 2 {
                continue;
            }
            let book = cx.inputs.scores();
            let quality_name = book.quality_name(&m, &self.quality_score, now - w, now);
            let mean = |name: &str, g: &str| {
                book.mean(&m, name, now - w, now, |s| s.ab_group == g)
                    .map(|(mean, _)| mean)
            };
            let arm = |g: &str| {
                let rs: Vec<&Rec> = win.iter().copied().filter(|r| r.ab_group == g).collect();
                let mut v = values(rs.iter().copied(), &rule.signal);
                v.sort_by(f64::total_cmp);
                let stats = det::ArmStats {
                    requests: rs.len() as u64,
                    p99_s: quantile(v.clone(), 0.99).unwrap_or(0.0),
                    quality: quality_name.as_deref().and_then(|q| mean(q, g)),
                    toxicity: mean(crate::alerting::engine::scores::TOXICITY, g),
                };
                (stats, v)
            };
            let ((a, va), (b, vb)) = (arm(groups[0]), arm(groups[1]));
            let tuned = ab_noise_floor(p, (&a, &va), (&b, &vb), share_b);
            if let Some(f) = det::ab_regression(&a, &b, share_b, &tuned) {
                let f = f
                    .with("arm_a", groups[0])
                    .with("arm_b", groups[1])
                    .with("quality_score", quality_name.as_deref().unwrap_or(""))
                    .with("p99_increase_required", tuned.p99_increase)
                    .with("split_tolerance_points", tuned.split_tolerance * 100.0);
                out.push(model_event(f, &rule.detector, &rule.signal, &m, now));
            }
        }
        out
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql(PER_REQUEST_LABELS))
    }
}

/// Why the A/B and prompt-version detectors have no PromQL form.
pub(super) const PER_REQUEST_LABELS: &str =
    "needs the A/B group / prompt version of each request, which the runtimes do not export";

/// Standard errors of the observed B share a split deviation must exceed (two-sided p ≈ 0.001).
const SPLIT_Z: f64 = 3.3;
/// z of each arm's P99 confidence bound (two-sided 99%).
const P99_Z: f64 = 2.58;

/// Spec 4's statistical hygiene for A/B: thresholds never sit inside sampling noise. The split
/// tolerance is at least `SPLIT_Z` binomial standard errors of the share at this sample size, and
/// a P99 rise counts only when B's P99 lower bound clears A's upper bound by the configured
/// margin (distribution-free order-statistic bounds). Large windows keep the spec's thresholds.
pub(super) fn ab_noise_floor(
    p: &det::AbRegressionParams,
    (a, a_sorted): (&det::ArmStats, &[f64]),
    (b, b_sorted): (&det::ArmStats, &[f64]),
    target_share_b: f64,
) -> det::AbRegressionParams {
    let mut t = p.clone();
    let n = (a.requests + b.requests) as f64;
    if n > 0.0 {
        let se = (target_share_b * (1.0 - target_share_b) / n).sqrt();
        t.split_tolerance = p.split_tolerance.max(SPLIT_Z * se);
    }
    let bounds = (
        quantile_bound(a_sorted, 0.99, true),
        quantile_bound(b_sorted, 0.99, false),
    );
    if let (Some(a_hi), Some(b_lo)) = bounds
        && a.p99_s > 0.0
        && b_lo > 0.0
    {
        let need = (1.0 + p.p99_increase) * (a_hi / a.p99_s) * (b.p99_s / b_lo) - 1.0;
        t.p99_increase = p.p99_increase.max(need);
    }
    t
}

/// Upper (or lower) confidence bound of quantile `q` of ascending `v`: the order statistic at
/// rank n·q ± z·√(n·q·(1−q)), clamped to the sample.
fn quantile_bound(v: &[f64], q: f64, upper: bool) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    let half = P99_Z * (n * q * (1.0 - q)).sqrt();
    let rank = if upper {
        (n * q + half).ceil()
    } else {
        (n * q - half).floor()
    };
    Some(v[(rank.max(1.0) as usize).clamp(1, v.len()) - 1])
}

#[cfg(test)]
mod ab_tests {
    use super::*;

    fn arm(v: &[f64], requests: u64) -> (det::ArmStats, Vec<f64>) {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let stats = det::ArmStats {
            requests,
            p99_s: quantile(s.clone(), 0.99).unwrap_or(0.0),
            quality: None,
            toxicity: None,
        };
        (stats, s)
    }

    /// Deterministic jittered latencies around `base` (±20%).
    fn lat(base: f64, n: usize, seed: u64) -> Vec<f64> {
        (0..n)
            .map(|i| {
                let x = ((i as u64 * 2_654_435_761 + seed * 40_503) % 1000) as f64 / 1000.0;
                base * (0.8 + 0.4 * x)
            })
            .collect()
    }

    #[test]
    fn noise_sized_split_and_p99_gaps_are_not_findings() {
        let p = det::AbRegressionParams {
            min_requests: 60,
            ..Default::default()
        };
        // 66 vs 75 requests (B at 46.8%) and P99s 4% apart: chance at this sample size.
        let (a, va) = arm(&lat(0.062, 75, 1), 75);
        let (b, vb) = arm(&lat(0.064, 66, 2), 66);
        let t = ab_noise_floor(&p, (&a, &va), (&b, &vb), 0.5);
        assert!(t.split_tolerance > 0.12, "{}", t.split_tolerance);
        assert!(det::ab_regression(&a, &b, 0.5, &t).is_none());
        // B twice as slow, and a 75/25 split: both still found.
        let (b2, vb2) = arm(&lat(0.13, 66, 3), 66);
        let t = ab_noise_floor(&p, (&a, &va), (&b2, &vb2), 0.5);
        let f = det::ab_regression(&a, &b2, 0.5, &t).expect("a real regression");
        assert_eq!(f.evidence["latency_regression"], true);
        let (b3, vb3) = arm(&lat(0.062, 25, 4), 25);
        let (a3, va3) = arm(&lat(0.062, 75, 5), 75);
        let p3 = det::AbRegressionParams {
            min_requests: 20,
            ..Default::default()
        };
        let t = ab_noise_floor(&p3, (&a3, &va3), (&b3, &vb3), 0.5);
        let f = det::ab_regression(&a3, &b3, 0.5, &t).expect("a real split deviation");
        assert_eq!(f.evidence["split_deviation"], true);
    }

    #[test]
    fn large_windows_keep_the_spec_thresholds() {
        let p = det::AbRegressionParams::default();
        let (a, va) = arm(&vec![0.1; 20_000], 20_000);
        let (b, vb) = arm(&vec![0.1; 20_000], 20_000);
        let t = ab_noise_floor(&p, (&a, &va), (&b, &vb), 0.5);
        assert_eq!(t.split_tolerance, p.split_tolerance);
        assert!((t.p99_increase - p.p99_increase).abs() < 1e-9);
        assert_eq!(quantile_bound(&[], 0.99, true), None);
        assert_eq!(quantile_bound(&[1.0, 2.0, 3.0], 0.99, false), Some(2.0));
        assert_eq!(quantile_bound(&[1.0, 2.0, 3.0], 0.99, true), Some(3.0));
    }
}
