// Experiment detectors of spec section 4: A/B regression of arm B against arm A with traffic-split
// deviation, and prompt-version decay against each version's own recent baseline.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

use crate::text::pct;
use crate::{Finding, ParamError, Validate, check};

/// One arm's numbers over the comparison window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmStats {
    pub requests: u64,
    pub p99_s: f64,
    /// Quality score (higher is better), when judged.
    pub quality: Option<f64>,
    /// Toxicity rate or score (lower is better), when judged.
    pub toxicity: Option<f64>,
}

/// p99: B > A × (1 + p99_increase); quality: relative drop (A − B)/A > quality_drop; toxicity:
/// absolute rise B − A > toxicity_rise; split: |share_B − target| > split_tolerance (fraction).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AbRegressionParams {
    pub p99_increase: f64,
    pub quality_drop: f64,
    pub toxicity_rise: f64,
    pub split_tolerance: f64,
    /// Requests each arm needs (a P99 from fewer is too noisy for a 5% comparison).
    pub min_requests: u64,
}

impl Default for AbRegressionParams {
    fn default() -> Self {
        AbRegressionParams {
            p99_increase: 0.05,
            quality_drop: 0.05,
            toxicity_rise: 0.02,
            split_tolerance: 0.03,
            min_requests: 200,
        }
    }
}

impl Validate for AbRegressionParams {
    fn validate(&self) -> Result<(), ParamError> {
        for (n, v) in [
            ("p99_increase", self.p99_increase),
            ("quality_drop", self.quality_drop),
            ("toxicity_rise", self.toxicity_rise),
            ("split_tolerance", self.split_tolerance),
        ] {
            check(v.is_finite() && v > 0.0, n, "must be > 0")?;
        }
        Ok(())
    }
}

/// Fires when any of the four conditions holds. Evidence says which (`latency_regression`,
/// `quality_regression`, `toxicity_regression`, `split_deviation`) and `rollback_condition` =
/// a regression AND a split deviation (spec section 6's canary rollback needs it 2 windows in a
/// row). Score = the largest of (observed / threshold) over the conditions that hold.
pub fn ab_regression(
    a: &ArmStats,
    b: &ArmStats,
    target_share_b: f64,
    p: &AbRegressionParams,
) -> Option<Finding> {
    if a.requests < p.min_requests.max(1)
        || b.requests < p.min_requests.max(1)
        || !(0.0..=1.0).contains(&target_share_b)
    {
        return None;
    }
    let mut score: f64 = 0.0;
    let mut why = Vec::new();
    let mut f = Finding::new(0.0, "");
    let latency = a.p99_s.is_finite() && b.p99_s.is_finite() && a.p99_s > 0.0 && {
        let rise = b.p99_s / a.p99_s - 1.0;
        f = f
            .with("p99_a_s", a.p99_s)
            .with("p99_b_s", b.p99_s)
            .with("p99_change", rise);
        rise > p.p99_increase && {
            score = score.max(rise / p.p99_increase);
            why.push(format!(
                "P99 {:+.0}% ({:.3} s → {:.3} s)",
                rise * 100.0,
                a.p99_s,
                b.p99_s
            ));
            true
        }
    };
    let quality = match (a.quality, b.quality) {
        (Some(qa), Some(qb)) if qa.is_finite() && qb.is_finite() && qa > 0.0 => {
            let drop = (qa - qb) / qa;
            f = f
                .with("quality_a", qa)
                .with("quality_b", qb)
                .with("quality_drop", drop);
            drop > p.quality_drop && {
                score = score.max(drop / p.quality_drop);
                why.push(format!(
                    "quality {:.3} → {qb:.3} ({:+.1}%)",
                    qa,
                    -drop * 100.0
                ));
                true
            }
        }
        _ => false,
    };
    let toxicity = match (a.toxicity, b.toxicity) {
        (Some(ta), Some(tb)) if ta.is_finite() && tb.is_finite() => {
            let rise = tb - ta;
            f = f
                .with("toxicity_a", ta)
                .with("toxicity_b", tb)
                .with("toxicity_rise", rise);
            rise > p.toxicity_rise && {
                score = score.max(rise / p.toxicity_rise);
                why.push(format!("toxicity {ta:.3} → {tb:.3}"));
                true
            }
        }
        _ => false,
    };
    let share_b = b.requests as f64 / (a.requests + b.requests) as f64;
    let deviation = share_b - target_share_b;
    let split = deviation.abs() > p.split_tolerance;
    if split {
        score = score.max(deviation.abs() / p.split_tolerance);
        why.push(format!(
            "B gets {} of traffic instead of {}",
            pct(share_b),
            pct(target_share_b)
        ));
    }
    let regression = latency || quality || toxicity;
    if !regression && !split {
        return None;
    }
    let advice = if regression && split {
        "the canary both regresses and is off its traffic split: shift its weight to 0 if this holds for another window"
    } else if regression {
        "arm B regresses against A: hold the rollout and compare sample outputs"
    } else {
        "the router is not honouring the configured split: check the proxy's weights and sticky sessions"
    };
    f.score = score;
    f.summary = format!(
        "A/B: {} ({} vs {} requests) — {advice}",
        why.join(", "),
        b.requests,
        a.requests
    );
    Some(
        f.with("requests_a", a.requests)
            .with("requests_b", b.requests)
            .with("share_b", share_b)
            .with("target_share_b", target_share_b)
            .with("split_deviation_points", deviation * 100.0)
            .with("latency_regression", latency)
            .with("quality_regression", quality)
            .with("toxicity_regression", toxicity)
            .with("split_deviation", split)
            .with("rollback_condition", regression && split),
    )
}

/// Relative drop (baseline − rate)/baseline > `drop` for `consecutive` periods; the baseline is
/// the mean of the version's last `baseline_periods` healthy periods (decayed periods excluded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PromptDecayParams {
    pub drop: f64,
    pub consecutive: usize,
    pub baseline_periods: usize,
    /// Healthy periods a version needs before it can be judged.
    pub min_baseline_periods: usize,
    /// Versions tracked at most; the least recently observed is forgotten first.
    pub max_versions: usize,
}

impl Default for PromptDecayParams {
    fn default() -> Self {
        PromptDecayParams {
            drop: 0.08,
            consecutive: 3,
            baseline_periods: 10,
            min_baseline_periods: 5,
            max_versions: 1024,
        }
    }
}

impl Validate for PromptDecayParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.drop > 0.0 && self.drop < 1.0,
            "drop",
            "must be in (0, 1)",
        )?;
        check(self.consecutive >= 1, "consecutive", "must be ≥ 1")?;
        check(
            self.min_baseline_periods >= 1 && self.min_baseline_periods <= self.baseline_periods,
            "min_baseline_periods",
            "must be in [1, baseline_periods]",
        )
    }
}

#[derive(Debug, Clone, Default)]
struct VersionState {
    healthy: VecDeque<f64>,
    streak: usize,
    last_seen: u64,
}

/// Per-version baselines and decay streaks.
#[derive(Debug, Clone)]
pub struct PromptVersionDecay {
    p: PromptDecayParams,
    versions: BTreeMap<String, VersionState>,
    clock: u64,
}

impl PromptVersionDecay {
    pub fn new(p: PromptDecayParams) -> Self {
        PromptVersionDecay {
            p,
            versions: BTreeMap::new(),
            clock: 0,
        }
    }

    /// One period's success rate (or quality score, higher is better) for `version`. Score =
    /// relative drop / drop. NaN/inf/negative rates are ignored.
    pub fn observe_period(&mut self, version: &str, success_rate: f64) -> Option<Finding> {
        if !success_rate.is_finite() || success_rate < 0.0 {
            return None;
        }
        self.clock += 1;
        if !self.versions.contains_key(version)
            && self.versions.len() >= self.p.max_versions.max(1)
            && let Some(oldest) = self
                .versions
                .iter()
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(k, _)| k.clone())
        {
            self.versions.remove(&oldest);
        }
        let keep = self.p.baseline_periods.max(1);
        let st = self.versions.entry(version.to_string()).or_default();
        st.last_seen = self.clock;
        let push = |st: &mut VersionState| {
            if st.healthy.len() >= keep {
                st.healthy.pop_front();
            }
            st.healthy.push_back(success_rate);
        };
        if st.healthy.len() < self.p.min_baseline_periods.max(1) {
            push(st);
            return None;
        }
        let baseline = st.healthy.iter().sum::<f64>() / st.healthy.len() as f64;
        if baseline <= 0.0 {
            push(st);
            return None;
        }
        let rel_drop = (baseline - success_rate) / baseline;
        if rel_drop <= self.p.drop {
            st.streak = 0;
            push(st);
            return None;
        }
        st.streak += 1;
        if st.streak < self.p.consecutive.max(1) {
            return None;
        }
        let summary = format!(
            "prompt version `{version}` succeeds {} of the time, {:.1}% below its own baseline of {} for {} periods \
             in a row — compare it with the previous version and consider rolling the prompt back",
            pct(success_rate),
            rel_drop * 100.0,
            pct(baseline),
            st.streak
        );
        Some(
            Finding::new(rel_drop / self.p.drop, summary)
                .with("version", version)
                .with("success_rate", success_rate)
                .with("baseline", baseline)
                .with("relative_drop", rel_drop)
                .with("drop_threshold", self.p.drop)
                .with("consecutive_periods", st.streak)
                .with("baseline_periods", st.healthy.len()),
        )
    }
}

#[cfg(test)]
#[path = "experiments_tests.rs"]
mod tests;
