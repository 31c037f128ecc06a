// `ab_regression`: per model, the two A/B arms of the window compared (P99 rise, split off its
// target), with thresholds kept out of sampling noise at small sample sizes.

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::model_event;
use crate::alerting::engine::inputs::{Inputs, sorted_rank_quantile, values};
use crate::alerting::engine::record::{Label, Rec};
use crate::alerting::engine::windows::{LatencyWindows, Slot};
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
        if !tokenwatch_core::scores::valid_score_name(&ab.quality_score) {
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
        let mut lw = cx.latency_windows();
        for m in cx.inputs.models() {
            let Some(arms) = two_arms(&mut lw, cx.inputs, (&m, &rule.signal), now, w) else {
                continue;
            };
            let groups = [arms[0].arm.as_str(), arms[1].arm.as_str()];
            let book = cx.inputs.scores();
            let quality_name = book.quality_name(&m, &self.quality_score, now - w, now);
            let mean = |name: &str, g: &str| {
                book.mean(&m, name, now - w, now, |s| s.ab_group == g)
                    .map(|(mean, _)| mean)
            };
            let arm = |k: usize| {
                let (g, tail) = (groups[k], arms[k].tail);
                let stats = det::ArmStats {
                    requests: arms[k].requests,
                    p99_s: tail.p99_s,
                    quality: quality_name.as_deref().and_then(|q| mean(q, g)),
                    toxicity: mean(crate::alerting::engine::scores::TOXICITY, g),
                };
                (stats, tail)
            };
            let ((a, ta), (b, tb)) = (arm(0), arm(1));
            let tuned = ab_noise_floor(p, (&a, ta), (&b, tb), share_b);
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

/// One A/B arm of a model's window as the detector reads it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ArmSummary {
    pub arm: Label,
    /// Its records, successful or not.
    pub requests: u64,
    /// Of the signal's values of its successful records.
    pub tail: Tail,
}

/// The two A/B arms (non-empty groups) of `model`'s records in `(now - w, now]`, in order;
/// None unless there are exactly two. Read from the incremental arm windows (`LatencyWindows`:
/// what arrived and left since the last evaluation), from the kept records where they cannot
/// answer.
fn two_arms(
    lw: &mut LatencyWindows,
    inputs: &Inputs,
    series: (&str, &str),
    now: i64,
    w: i64,
) -> Option<[ArmSummary; 2]> {
    arms_incremental(lw, inputs, series, now, w)
        .unwrap_or_else(|| arms_from_records(inputs, series, now, w))
}

/// `two_arms` from the incremental windows; None when they cannot answer.
fn arms_incremental(
    lw: &mut LatencyWindows,
    inputs: &Inputs,
    series: (&str, &str),
    now: i64,
    w: i64,
) -> Option<Option<[ArmSummary; 2]>> {
    if !lw.sync_arms(inputs, series, w, now) {
        return None;
    }
    let range = (now - w, now);
    let Ok([(a, na), (b, nb)]) = <[_; 2]>::try_from(lw.arm_counts(series, now, range)?) else {
        return Some(None);
    };
    let mut arm = |arm: Label, n: usize| -> Option<ArmSummary> {
        let v = lw.arm_window(series, now, &arm, Slot::Current(w), range)?;
        Some(ArmSummary {
            tail: Tail::of(v),
            requests: n as u64,
            arm,
        })
    };
    Some(Some([arm(a, na)?, arm(b, nb)?]))
}

/// `two_arms` collected from the kept records of the window.
fn arms_from_records(
    inputs: &Inputs,
    (model, signal): (&str, &str),
    now: i64,
    w: i64,
) -> Option<[ArmSummary; 2]> {
    let win: Vec<&Rec> = inputs.window(model, now - w, now).collect();
    let mut groups: Vec<&Label> = win
        .iter()
        .map(|r| &r.ab_group)
        .filter(|g| !g.is_empty())
        .collect();
    groups.sort();
    groups.dedup();
    let [a, b] = <[&Label; 2]>::try_from(groups).ok()?;
    let arm = |g: &Label| {
        let rs: Vec<&Rec> = win.iter().copied().filter(|r| r.ab_group == *g).collect();
        let mut v = values(rs.iter().copied(), signal);
        v.sort_by(f64::total_cmp);
        ArmSummary {
            arm: g.clone(),
            requests: rs.len() as u64,
            tail: Tail::of(&v),
        }
    };
    Some([arm(a), arm(b)])
}

/// What the detector reads of an arm's sorted values: their P99 (nearest rank, 0 without any)
/// and its confidence bounds (`quantile_bound`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Tail {
    pub p99_s: f64,
    upper: Option<f64>,
    lower: Option<f64>,
}

impl Tail {
    /// Of values sorted by `f64::total_cmp`.
    pub(super) fn of(sorted: &[f64]) -> Tail {
        Tail {
            p99_s: sorted_rank_quantile(sorted, 0.99).unwrap_or(0.0),
            upper: quantile_bound(sorted, 0.99, true),
            lower: quantile_bound(sorted, 0.99, false),
        }
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
    (a, a_tail): (&det::ArmStats, Tail),
    (b, b_tail): (&det::ArmStats, Tail),
    target_share_b: f64,
) -> det::AbRegressionParams {
    let mut t = p.clone();
    let n = (a.requests + b.requests) as f64;
    if n > 0.0 {
        let se = (target_share_b * (1.0 - target_share_b) / n).sqrt();
        t.split_tolerance = p.split_tolerance.max(SPLIT_Z * se);
    }
    if let (Some(a_hi), Some(b_lo)) = (a_tail.upper, b_tail.lower)
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

    fn arm(v: &[f64], requests: u64) -> (det::ArmStats, Tail) {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let stats = det::ArmStats {
            requests,
            p99_s: crate::alerting::engine::inputs::quantile(s.clone(), 0.99).unwrap_or(0.0),
            quality: None,
            toxicity: None,
        };
        (stats, Tail::of(&s))
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
        let t = ab_noise_floor(&p, (&a, va), (&b, vb), 0.5);
        assert!(t.split_tolerance > 0.12, "{}", t.split_tolerance);
        assert!(det::ab_regression(&a, &b, 0.5, &t).is_none());
        // B twice as slow, and a 75/25 split: both still found.
        let (b2, vb2) = arm(&lat(0.13, 66, 3), 66);
        let t = ab_noise_floor(&p, (&a, va), (&b2, vb2), 0.5);
        let f = det::ab_regression(&a, &b2, 0.5, &t).expect("a real regression");
        assert_eq!(f.evidence["latency_regression"], true);
        let (b3, vb3) = arm(&lat(0.062, 25, 4), 25);
        let (a3, va3) = arm(&lat(0.062, 75, 5), 75);
        let p3 = det::AbRegressionParams {
            min_requests: 20,
            ..Default::default()
        };
        let t = ab_noise_floor(&p3, (&a3, va3), (&b3, vb3), 0.5);
        let f = det::ab_regression(&a3, &b3, 0.5, &t).expect("a real split deviation");
        assert_eq!(f.evidence["split_deviation"], true);
    }

    #[test]
    fn large_windows_keep_the_spec_thresholds() {
        let p = det::AbRegressionParams::default();
        let (a, va) = arm(&vec![0.1; 20_000], 20_000);
        let (b, vb) = arm(&vec![0.1; 20_000], 20_000);
        let t = ab_noise_floor(&p, (&a, va), (&b, vb), 0.5);
        assert_eq!(t.split_tolerance, p.split_tolerance);
        assert!((t.p99_increase - p.p99_increase).abs() < 1e-9);
        assert_eq!(quantile_bound(&[], 0.99, true), None);
        assert_eq!(quantile_bound(&[1.0, 2.0, 3.0], 0.99, false), Some(2.0));
        assert_eq!(quantile_bound(&[1.0, 2.0, 3.0], 0.99, true), Some(3.0));
    }
}

#[cfg(test)]
mod incremental_tests {
    // The arms read from the incremental windows against a fresh collection from the kept
    // records after every step of random traffic (evictions, arms and models coming and going,
    // the clock going back, the window changing).
    use super::*;
    use proptest::prelude::*;

    const MODELS: &[&str] = &["m1", "m2"];
    const ARMS: &[&str] = &["", "a", "b", "c"];

    #[derive(Debug, Clone)]
    enum Op {
        Request {
            model: usize,
            arm: usize,
            late: i64,
            value: u8,
            ok: bool,
            ttft: bool,
        },
        Tick(i64),
        Back(i64),
        Check(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            10 => (0..MODELS.len(), prop_oneof![4 => 1..3usize, 1 => 0..ARMS.len()],
                   prop_oneof![4 => 0..300i64, 1 => 0..20_000i64], 0..8u8,
                   prop::bool::weighted(0.85), prop::bool::weighted(0.9))
                .prop_map(|(model, arm, late, value, ok, ttft)| Op::Request {
                    model, arm, late, value, ok, ttft
                }),
            3 => prop_oneof![6 => 0..1_500i64, 1 => 0..120_000i64].prop_map(Op::Tick),
            1 => (0..4_000i64).prop_map(Op::Back),
            4 => prop_oneof![4 => Just(10_000i64), 1 => Just(4_000i64), 1 => Just(30_000i64)]
                .prop_map(Op::Check),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn incremental_arms_equal_a_fresh_collection_after_every_step(
            ops in prop::collection::vec(op(), 1..200),
            cap in prop_oneof![Just(15usize), Just(100_000usize)],
        ) {
            let mut inputs = Inputs::new(60_000, cap);
            let mut lw = LatencyWindows::default();
            let mut now = 1_700_000_000_000i64;
            for op in ops.iter().chain([&Op::Check(10_000)]) {
                match *op {
                    Op::Request { model, arm, late, value, ok, ttft } => inputs.ingest(Rec {
                        model: MODELS[model].into(),
                        ab_group: ARMS[arm].into(),
                        at_ms: now - late,
                        ttft: ttft.then_some(0.05 * f64::from(value)),
                        e2e: 0.3 * f64::from(value % 5),
                        ok,
                        ..Rec::default()
                    }),
                    Op::Tick(ms) => {
                        now += ms;
                        inputs.prune(now);
                    }
                    Op::Back(ms) => now -= ms,
                    Op::Check(w) => {
                        for m in MODELS {
                            for signal in ["ttft", "e2e"] {
                                let series = (*m, signal);
                                let fresh = arms_from_records(&inputs, series, now, w);
                                let got = arms_incremental(&mut lw, &inputs, series, now, w);
                                if inputs.kept_seq(m).is_none() {
                                    prop_assert!(got.is_none() && fresh.is_none());
                                } else {
                                    let want = Some(fresh.clone());
                                    prop_assert_eq!(&got, &want, "{:?} at {} w {}", series, now, w);
                                }
                                let both = two_arms(&mut lw, &inputs, series, now, w);
                                prop_assert_eq!(both, fresh);
                            }
                        }
                    }
                }
            }
        }
    }
}
