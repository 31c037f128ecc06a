// Actions of spec section 6: the eviction ranking (when GPU memory is nearly full and latency
// jumps, rank the instances serving a model by 0.4 memory + 0.3 P99 + 0.3 queued, min–max
// normalised, worst first) and the autoscaling recommendation (`ScalingState`).

use serde::{Deserialize, Serialize};

use crate::{ParamError, Validate, check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceLoad {
    pub instance: String,
    /// GPU memory used / total, 0..1.
    pub memory_ratio: f64,
    pub p99_s: f64,
    pub queued: f64,
}

/// When to attach an eviction ranking: memory ≥ `memory_ratio` and latency up by ≥ `latency_jump_s`;
/// and the ranking's weights and window (the trigger's and a GPU-memory alert's ranking alike).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvictionParams {
    pub memory_ratio: f64,
    pub latency_jump_s: f64,
    pub weights: EvictionWeights,
    /// Seconds of each instance's requests the ranking reads its P99 TTFT from.
    pub window_s: f64,
}

/// Weights of the eviction ranking (normalised memory use, P99 latency, queued requests).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvictionWeights {
    pub memory: f64,
    pub p99: f64,
    pub queued: f64,
}

impl Default for EvictionWeights {
    fn default() -> Self {
        EvictionWeights {
            memory: 0.4,
            p99: 0.3,
            queued: 0.3,
        }
    }
}

impl Default for EvictionParams {
    fn default() -> Self {
        EvictionParams {
            memory_ratio: 0.92,
            latency_jump_s: 0.3,
            weights: EvictionWeights::default(),
            window_s: 60.0,
        }
    }
}

impl Validate for EvictionParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            (0.0..=1.0).contains(&self.memory_ratio),
            "memory_ratio",
            "must be a fraction in [0, 1]",
        )?;
        check(
            self.latency_jump_s.is_finite() && self.latency_jump_s >= 0.0,
            "latency_jump_s",
            "must be ≥ 0",
        )?;
        check(
            self.window_s.is_finite() && (1.0..=86_400.0).contains(&self.window_s),
            "window_s",
            "must be between 1 and 86400 seconds",
        )?;
        let w = &self.weights;
        check(
            [w.memory, w.p99, w.queued]
                .iter()
                .all(|x| x.is_finite() && *x >= 0.0)
                && w.memory + w.p99 + w.queued > 0.0,
            "weights",
            "must be ≥ 0 and not all 0",
        )
    }
}

/// Spec section 6's trigger; NaN inputs never trigger.
pub fn eviction_triggered(memory_ratio: f64, latency_jump_s: f64, p: &EvictionParams) -> bool {
    memory_ratio >= p.memory_ratio && latency_jump_s >= p.latency_jump_s
}

/// Min–max normalisation to [0, 1]; a constant column (or a single instance) is all 0, and a
/// non-finite value counts 0 (unknown is not blamed).
fn normalise(xs: &[f64]) -> Vec<f64> {
    let finite = xs.iter().copied().filter(|x| x.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    xs.iter()
        .map(|x| {
            if x.is_finite() && hi > lo {
                (x - lo) / (hi - lo)
            } else {
                0.0
            }
        })
        .collect()
}

/// Every instance once, with its score in [0, 1], worst (highest) first; ties keep input order.
pub fn eviction_ranking(instances: &[InstanceLoad]) -> Vec<(String, f64)> {
    eviction_ranking_weighted(instances, &EvictionWeights::default())
}

/// `eviction_ranking` with configured weights (scaled to sum to 1).
pub fn eviction_ranking_weighted(
    instances: &[InstanceLoad],
    w: &EvictionWeights,
) -> Vec<(String, f64)> {
    let sum = w.memory + w.p99 + w.queued;
    let (wm, wp, wq) = if sum > 0.0 && sum.is_finite() {
        (w.memory / sum, w.p99 / sum, w.queued / sum)
    } else {
        (0.4, 0.3, 0.3)
    };
    let mem = normalise(&instances.iter().map(|i| i.memory_ratio).collect::<Vec<_>>());
    let p99 = normalise(&instances.iter().map(|i| i.p99_s).collect::<Vec<_>>());
    let queued = normalise(&instances.iter().map(|i| i.queued).collect::<Vec<_>>());
    let mut ranked: Vec<(String, f64)> = instances
        .iter()
        .enumerate()
        .map(|(k, i)| {
            (
                i.instance.clone(),
                wm * mem[k] + wp * p99[k] + wq * queued[k],
            )
        })
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked
}

/// Weights of the scaling score: GPU memory use, TTFT against its SLO, throughput.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ScalingWeights {
    pub memory: f64,
    pub ttft: f64,
    pub throughput: f64,
}

impl Default for ScalingWeights {
    fn default() -> Self {
        ScalingWeights {
            memory: 0.3,
            ttft: 0.4,
            throughput: 0.3,
        }
    }
}

/// The autoscaling recommendation of spec section 6.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ScalingParams {
    pub weights: ScalingWeights,
    /// Mean prompt tokens from which a workload is long-context: memory (with KV-cache use)
    /// then weighs 0.1 more and throughput 0.1 less.
    pub long_context_tokens: f64,
    /// Periods of history a baseline (mean, spread, P95) is taken over …
    pub baseline_periods: usize,
    /// … and how many it needs before a signal can be over its limit.
    pub min_baseline: usize,
    /// Below these a signal is never over its limit (idle noise): memory used ratio, TTFT / SLO.
    pub memory_floor: f64,
    pub ttft_floor: f64,
    /// A signal is over its limit when above its baseline's P95 by at least this many spreads
    /// (one noisy period above a short baseline's maximum is not load).
    pub z_limit: f64,
    /// A period is calm when the score is under this and no signal is over its limit.
    pub calm_score: f64,
    /// Consecutive calm periods before one step down.
    pub calm_periods: u32,
    /// Seconds since the last change before a step down.
    pub cooldown_s: f64,
    pub min_replicas: u32,
    pub max_replicas: u32,
}

impl Default for ScalingParams {
    fn default() -> Self {
        ScalingParams {
            weights: ScalingWeights::default(),
            long_context_tokens: 2048.0,
            baseline_periods: 60,
            min_baseline: 10,
            memory_floor: 0.5,
            ttft_floor: 0.25,
            z_limit: 3.0,
            calm_score: 0.4,
            calm_periods: 3,
            cooldown_s: 60.0,
            min_replicas: 1,
            max_replicas: 16,
        }
    }
}

impl Validate for ScalingParams {
    fn validate(&self) -> Result<(), ParamError> {
        let w = &self.weights;
        check(
            [w.memory, w.ttft, w.throughput]
                .iter()
                .all(|x| x.is_finite() && *x >= 0.0)
                && w.memory + w.ttft + w.throughput > 0.0,
            "weights",
            "must be ≥ 0 and not all 0",
        )?;
        check(
            self.baseline_periods >= 2 && self.min_baseline >= 2,
            "baseline_periods",
            "baseline_periods and min_baseline must be ≥ 2",
        )?;
        check(
            self.min_baseline <= self.baseline_periods,
            "min_baseline",
            "must be ≤ baseline_periods",
        )?;
        check(
            self.z_limit.is_finite() && self.z_limit >= 0.0,
            "z_limit",
            "must be ≥ 0",
        )?;
        check(
            self.calm_score > 0.0 && self.calm_score < 1.0,
            "calm_score",
            "must be within (0, 1)",
        )?;
        check(self.calm_periods >= 1, "calm_periods", "must be ≥ 1")?;
        check(
            self.cooldown_s.is_finite() && self.cooldown_s >= 0.0,
            "cooldown_s",
            "must be ≥ 0",
        )?;
        check(self.min_replicas >= 1, "min_replicas", "must be ≥ 1")?;
        check(
            self.max_replicas >= self.min_replicas,
            "max_replicas",
            "must be ≥ min_replicas",
        )
    }
}

/// One period's inputs of a model; None: not known this period (left out, weights rescaled).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ScalingInputs {
    /// GPU memory used / total (the fullest device); with long context, the larger of it and
    /// KV-cache use.
    pub memory: Option<f64>,
    pub kv_cache: Option<f64>,
    /// P95 TTFT of the period / the TTFT SLO's threshold.
    pub ttft_ratio: Option<f64>,
    /// Output tokens per second of the period.
    pub throughput: Option<f64>,
    pub mean_prompt_tokens: Option<f64>,
}

/// One signal in a decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScalingSignal {
    pub value: Option<f64>,
    pub weight: f64,
    pub baseline_mean: Option<f64>,
    pub baseline_p95: Option<f64>,
    /// (value − baseline mean) / baseline spread, within ±6; 0 while the baseline fills.
    pub z: f64,
    /// logistic(z) in (0, 1).
    pub normalised: f64,
    /// Above its baseline's P95 (and its floor), or TTFT above its SLO.
    pub over_limit: bool,
    /// Above its baseline's mean.
    pub rising: bool,
}

/// What one period recommends.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScalingDecision {
    /// Σ weight × logistic(z) over the known signals, weights rescaled to 1; 0.5 = at baseline.
    pub score: f64,
    pub desired_replicas: u32,
    /// `up`, `down` or `hold`.
    pub action: &'static str,
    pub reason: String,
    pub calm_periods: u32,
    pub long_context: bool,
    pub memory: ScalingSignal,
    pub ttft: ScalingSignal,
    pub throughput: ScalingSignal,
}

/// A model's scaling state across periods.
#[derive(Debug, Clone, Default)]
pub struct ScalingState {
    history: [std::collections::VecDeque<f64>; 3],
    desired: Option<u32>,
    calm: u32,
    last_change_s: Option<f64>,
}

fn logistic(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Mean, spread and P95 of a baseline.
fn baseline(h: &std::collections::VecDeque<f64>) -> (f64, f64, f64) {
    let n = h.len() as f64;
    let mean = h.iter().sum::<f64>() / n;
    let var = h.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let mut v: Vec<f64> = h.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    let p95 = v[(((v.len() as f64) * 0.95).ceil() as usize).clamp(1, v.len()) - 1];
    (mean, var.sqrt(), p95)
}

impl ScalingState {
    /// The desired replica count so far (None before the first period).
    pub fn desired(&self) -> Option<u32> {
        self.desired
    }

    /// One period at `now_s`: score the inputs against their baselines (which they then join),
    /// and step the desired replicas (starting from `observed_replicas`) up when a signal is
    /// over its limit while the others rise or hold (none below its baseline: a flat GPU-memory
    /// series must not veto), down after `calm_periods` calm periods and the cooldown.
    pub fn step(
        &mut self,
        x: &ScalingInputs,
        observed_replicas: u32,
        now_s: f64,
        p: &ScalingParams,
    ) -> ScalingDecision {
        let long_context = x
            .mean_prompt_tokens
            .is_some_and(|t| t >= p.long_context_tokens);
        let mut w = p.weights;
        let memory = if long_context {
            w.memory += 0.1;
            w.throughput = (w.throughput - 0.1).max(0.0);
            match (x.memory, x.kv_cache) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            }
        } else {
            x.memory
        };
        let values = [memory, x.ttft_ratio, x.throughput].map(|v| v.filter(|v| v.is_finite()));
        let weights = [w.memory, w.ttft, w.throughput];
        // Spread floors: a flat baseline must not turn noise into a large z.
        let floors = [0.01, 0.02, 1.0];
        let mut signals: Vec<ScalingSignal> = Vec::with_capacity(3);
        for k in 0..3 {
            let h = &self.history[k];
            let ready = h.len() >= p.min_baseline;
            let (mean, spread, p95) = if h.is_empty() {
                (f64::NAN, f64::NAN, f64::NAN)
            } else {
                baseline(h)
            };
            let v = values[k];
            let z = match v {
                Some(v) if ready => {
                    ((v - mean) / spread.max(0.05 * mean.abs()).max(floors[k])).clamp(-6.0, 6.0)
                }
                _ => 0.0,
            };
            let floor = [p.memory_floor, p.ttft_floor, 0.0][k];
            let over_limit = v.is_some_and(|v| {
                (ready && v > p95 && v > floor && z >= p.z_limit) || (k == 1 && v >= 1.0)
            });
            signals.push(ScalingSignal {
                value: v,
                weight: if v.is_some() { weights[k] } else { 0.0 },
                baseline_mean: (!h.is_empty()).then_some(mean),
                baseline_p95: (!h.is_empty()).then_some(p95),
                z,
                normalised: logistic(z),
                over_limit,
                rising: ready && z > 0.0,
            });
        }
        for (k, v) in values.iter().enumerate() {
            if let Some(v) = v {
                let h = &mut self.history[k];
                h.push_back(*v);
                while h.len() > p.baseline_periods {
                    h.pop_front();
                }
            }
        }
        let total_w: f64 = signals.iter().map(|s| s.weight).sum();
        for s in &mut signals {
            s.weight = if total_w > 0.0 {
                s.weight / total_w
            } else {
                0.0
            };
        }
        let score = if total_w > 0.0 {
            signals.iter().map(|s| s.weight * s.normalised).sum()
        } else {
            0.5
        };
        let names = ["GPU memory", "TTFT", "throughput"];
        let known: Vec<usize> = (0..3).filter(|&k| signals[k].value.is_some()).collect();
        let trigger = known.iter().copied().find(|&k| {
            signals[k].over_limit
                && known
                    .iter()
                    .filter(|&&j| j != k)
                    .all(|&j| signals[j].z >= 0.0 || signals[j].over_limit)
        });
        let current = self
            .desired
            .unwrap_or(observed_replicas)
            .clamp(p.min_replicas, p.max_replicas);
        let calm = !signals.iter().any(|s| s.over_limit) && score < p.calm_score;
        let cooled = self.last_change_s.is_none_or(|t| now_s - t >= p.cooldown_s);
        let (action, desired, reason) = if let Some(k) = trigger {
            self.calm = 0;
            if current < p.max_replicas {
                self.last_change_s = Some(now_s);
                (
                    "up",
                    current + 1,
                    format!("{} over its limit while the other signals rise", names[k]),
                )
            } else {
                (
                    "hold",
                    current,
                    format!("{} over its limit, already at max_replicas", names[k]),
                )
            }
        } else if calm {
            self.calm += 1;
            if self.calm >= p.calm_periods && cooled && current > p.min_replicas {
                self.calm = 0;
                self.last_change_s = Some(now_s);
                (
                    "down",
                    current - 1,
                    format!("{} calm periods and the cooldown passed", p.calm_periods),
                )
            } else {
                (
                    "hold",
                    current,
                    format!("calm period {} of {}", self.calm, p.calm_periods),
                )
            }
        } else {
            self.calm = 0;
            ("hold", current, "load within its baseline".to_string())
        };
        self.desired = Some(desired);
        let mut it = signals.into_iter();
        let (m, t, th) = (it.next(), it.next(), it.next());
        let blank = || ScalingSignal {
            value: None,
            weight: 0.0,
            baseline_mean: None,
            baseline_p95: None,
            z: 0.0,
            normalised: 0.5,
            over_limit: false,
            rising: false,
        };
        ScalingDecision {
            score,
            desired_replicas: desired,
            action,
            reason,
            calm_periods: self.calm,
            long_context,
            memory: m.unwrap_or_else(blank),
            ttft: t.unwrap_or_else(blank),
            throughput: th.unwrap_or_else(blank),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inst(name: &str, mem: f64, p99: f64, queued: f64) -> InstanceLoad {
        InstanceLoad {
            instance: name.to_string(),
            memory_ratio: mem,
            p99_s: p99,
            queued,
        }
    }

    #[test]
    fn worst_instance_first() {
        let r = eviction_ranking(&[
            inst("a", 0.80, 0.5, 2.0),
            inst("b", 0.97, 1.5, 20.0),
            inst("c", 0.90, 0.5, 2.0),
        ]);
        assert_eq!(r[0], ("b".to_string(), 1.0));
        assert_eq!(r[1].0, "c");
        assert!((r[1].1 - 0.4 * (0.10 / 0.17)).abs() < 1e-12);
        assert_eq!(r[2], ("a".to_string(), 0.0));
    }

    #[test]
    fn ties_constant_nan_and_empty() {
        let r = eviction_ranking(&[
            inst("x", 0.9, 1.0, 3.0),
            inst("y", 0.9, 1.0, 3.0),
            inst("z", 0.9, 1.0, 3.0),
        ]);
        assert_eq!(
            r.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
            ["x", "y", "z"],
            "stable ties"
        );
        assert!(r.iter().all(|x| x.1 == 0.0));
        let r = eviction_ranking(&[inst("n", f64::NAN, 1.0, 1.0), inst("m", 0.95, 2.0, 1.0)]);
        assert_eq!(r[0].0, "m");
        assert!(eviction_ranking(&[]).is_empty());
        assert_eq!(
            eviction_ranking(&[inst("solo", 0.99, 9.0, 9.0)]),
            vec![("solo".to_string(), 0.0)]
        );
        assert!(eviction_triggered(0.95, 0.4, &EvictionParams::default()));
        assert!(!eviction_triggered(0.90, 0.4, &EvictionParams::default()));
        assert!(!eviction_triggered(
            f64::NAN,
            0.4,
            &EvictionParams::default()
        ));
    }

    proptest! {
        #[test]
        fn ranking_is_a_permutation_sorted_desc(rows in prop::collection::vec((0.0f64..1.0, 0.0f64..10.0, 0.0f64..100.0), 0..20)) {
            let inst: Vec<InstanceLoad> = rows.iter().enumerate().map(|(k, (m, p, q))| inst(&format!("i{k}"), *m, *p, *q)).collect();
            let r = eviction_ranking(&inst);
            let mut names: Vec<String> = r.iter().map(|x| x.0.clone()).collect();
            names.sort();
            let mut expected: Vec<String> = inst.iter().map(|i| i.instance.clone()).collect();
            expected.sort();
            prop_assert_eq!(names, expected);
            prop_assert!(r.windows(2).all(|w| w[0].1 >= w[1].1));
            prop_assert!(r.iter().all(|x| (0.0..=1.0 + 1e-12).contains(&x.1)));
        }
    }

    fn period(ttft: f64, tps: f64) -> ScalingInputs {
        ScalingInputs {
            ttft_ratio: Some(ttft),
            throughput: Some(tps),
            ..ScalingInputs::default()
        }
    }

    #[test]
    fn scales_up_under_rising_load_and_down_only_after_calm_and_cooldown() {
        let p = ScalingParams {
            cooldown_s: 10.0,
            ..ScalingParams::default()
        };
        let mut s = ScalingState::default();
        // Baseline: steady light load, small wobble.
        for k in 0..20 {
            let wobble = if k % 2 == 0 { 0.01 } else { -0.01 };
            let d = s.step(
                &period(0.3 + wobble, 100.0 + 10.0 * wobble),
                1,
                k as f64,
                &p,
            );
            assert_eq!((d.action, d.desired_replicas), ("hold", 1), "{k}: {d:?}");
        }
        // Load rises: TTFT and throughput above their baselines.
        let d = s.step(&period(0.6, 180.0), 1, 20.0, &p);
        assert_eq!((d.action, d.desired_replicas), ("up", 2), "{d:?}");
        assert!(
            d.score > 0.9 && d.ttft.over_limit && d.throughput.rising,
            "{d:?}"
        );
        assert!(
            (d.ttft.weight - 0.4 / 0.7).abs() < 1e-12,
            "memory unknown: weights rescaled"
        );
        // TTFT over its SLO counts as over its limit whatever the baseline.
        let d = s.step(&period(1.4, 260.0), 2, 21.0, &p);
        assert_eq!((d.action, d.desired_replicas), ("up", 3));
        // Load gone: calm, but down only after 3 calm periods and 10 s since the last change.
        let mut downs = Vec::new();
        for t in 22..60 {
            let d = s.step(&period(0.2, 50.0), 3, t as f64, &p);
            if d.action == "down" {
                downs.push((t, d.desired_replicas));
            }
            assert_ne!(d.action, "up");
        }
        // Calm from 22: the third calm period is 24, the cooldown since 21 ends at 31.
        assert_eq!(downs.first(), Some(&(31, 2)), "{downs:?}");
        // The next step needs its own cooldown (and calm periods) again.
        assert_eq!(downs.get(1), Some(&(41, 1)), "{downs:?}");
        assert_eq!(downs.len(), 2, "not below min_replicas: {downs:?}");
        assert!(downs.iter().all(|(_, r)| *r >= p.min_replicas));
    }

    #[test]
    fn noise_idle_and_bounds() {
        let p = ScalingParams {
            max_replicas: 2,
            cooldown_s: 0.0,
            ..ScalingParams::default()
        };
        let mut s = ScalingState::default();
        // Nothing known: score 0.5, hold at the observed count (within bounds).
        let d = s.step(&ScalingInputs::default(), 5, 0.0, &p);
        assert_eq!((d.score, d.desired_replicas, d.action), (0.5, 2, "hold"));
        // Idle TTFT noise under the floor never scales up.
        let mut s = ScalingState::default();
        for k in 0..30 {
            let d = s.step(&period(0.01 + 0.005 * (k % 3) as f64, 0.0), 1, k as f64, &p);
            assert_ne!(d.action, "up", "{k}: {d:?}");
        }
        // At max_replicas an overload holds.
        let mut s = ScalingState::default();
        for k in 0..10 {
            s.step(&period(0.3, 100.0), 2, k as f64, &p);
        }
        let d = s.step(&period(1.5, 300.0), 2, 10.0, &p);
        assert_eq!((d.action, d.desired_replicas), ("hold", 2), "{d:?}");
        // Long context: memory weighs more and reads the KV cache too.
        let d = s.step(
            &ScalingInputs {
                memory: Some(0.4),
                kv_cache: Some(0.9),
                mean_prompt_tokens: Some(4096.0),
                ..period(0.3, 100.0)
            },
            2,
            11.0,
            &p,
        );
        assert!(d.long_context && d.memory.value == Some(0.9));
        assert!((d.memory.weight - 0.4).abs() < 1e-12 && (d.throughput.weight - 0.2).abs() < 1e-12);
        assert!(ScalingParams::default().validate().is_ok());
        assert!(
            ScalingParams {
                max_replicas: 0,
                ..ScalingParams::default()
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn weighted_eviction_ranking() {
        let inst = [inst("a", 0.99, 0.1, 0.0), inst("b", 0.5, 2.0, 50.0)];
        assert_eq!(eviction_ranking(&inst)[0].0, "b");
        let mem_only = EvictionWeights {
            memory: 1.0,
            p99: 0.0,
            queued: 0.0,
        };
        assert_eq!(
            eviction_ranking_weighted(&inst, &mem_only),
            vec![("a".to_string(), 1.0), ("b".to_string(), 0.0)]
        );
        let bad = EvictionParams {
            weights: EvictionWeights {
                memory: 0.0,
                p99: 0.0,
                queued: 0.0,
            },
            ..EvictionParams::default()
        };
        assert!(bad.validate().is_err());
    }
}
