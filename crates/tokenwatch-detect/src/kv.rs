// KV-cache pressure (usage over 90% with preemptions or a growing queue) and triple-signal
// health (GPU utilisation, prefix-cache hit rate, speculative acceptance) of spec section 4.

use serde::{Deserialize, Serialize};

use crate::stats::{linear_fit, trailing_segment};
use crate::text::pct;
use crate::{Finding, ParamError, Series, Validate, check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvPressureParams {
    /// KV-cache usage as a fraction (vLLM's `kv_cache_usage_perc` is already 0..1).
    pub usage_threshold: f64,
    /// The last `min_points` usage samples must all be over the threshold (sustained), and
    /// the queue trend is fitted over at least this many samples.
    pub min_points: usize,
}

impl Default for KvPressureParams {
    fn default() -> Self {
        KvPressureParams {
            usage_threshold: 0.9,
            min_points: 3,
        }
    }
}

impl Validate for KvPressureParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.usage_threshold > 0.0 && self.usage_threshold <= 1.0,
            "usage_threshold",
            "must be a fraction in (0, 1]",
        )?;
        check(self.min_points >= 2, "min_points", "must be ≥ 2")
    }
}

/// Fires when KV usage stayed over the threshold for the last `min_points` samples and either
/// preemptions happen (mean of the recent preemption rates > 0; negative rates, i.e. counter
/// resets, are ignored) or the waiting queue is growing (positive fitted slope over the last ≤ 10
/// contiguous samples and last > first). Score = usage / threshold × (1 + 0.25 × (symptoms − 1)).
pub fn kv_cache_pressure(
    kv_usage: Series,
    preemptions_per_s: Series,
    waiting: Series,
    p: &KvPressureParams,
) -> Option<Finding> {
    let n = p.min_points.max(2);
    let kv = trailing_segment(kv_usage);
    if kv.len() < n {
        return None;
    }
    let recent = &kv[kv.len() - n..];
    if !recent.iter().all(|(_, v)| *v > p.usage_threshold) {
        return None;
    }
    let usage = kv[kv.len() - 1].1;

    let rates: Vec<f64> = trailing_segment(preemptions_per_s)
        .iter()
        .rev()
        .take(n)
        .map(|(_, v)| *v)
        .filter(|v| *v >= 0.0)
        .collect();
    let preempt_rate = (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64);
    let preempting = preempt_rate.is_some_and(|r| r > 0.0);

    let q = trailing_segment(waiting);
    let q = &q[q.len().saturating_sub(n.max(10))..];
    let queue_rising = q.len() >= n && {
        let pts: Vec<(f64, f64)> = q
            .iter()
            .map(|(t, v)| ((t - q[0].0) as f64 / 1000.0, *v))
            .collect();
        linear_fit(&pts).is_some_and(|f| f.slope > 0.0) && q[q.len() - 1].1 > q[0].1
    };
    if !preempting && !queue_rising {
        return None;
    }
    let symptoms = u32::from(preempting) + u32::from(queue_rising);
    let score = usage / p.usage_threshold * (1.0 + 0.25 * f64::from(symptoms - 1));

    let mut why = Vec::new();
    if preempting {
        why.push(format!("{:.2} preemptions/s", preempt_rate.unwrap_or(0.0)));
    }
    if queue_rising {
        why.push(format!(
            "the queue growing from {:.0} to {:.0} waiting requests",
            q[0].1,
            q[q.len() - 1].1
        ));
    }
    let summary = format!(
        "KV cache is {} full (over {} for the last {n} samples) with {} — requests are evicted and \
         re-queued; add capacity, lower max_num_seqs, or look for leaked KV blocks",
        pct(usage),
        pct(p.usage_threshold),
        why.join(" and ")
    );
    let mut f = Finding::new(score, summary)
        .with("kv_cache_usage", usage)
        .with("usage_threshold", p.usage_threshold)
        .with("preempting", preempting)
        .with("queue_rising", queue_rising)
        .with("window_start_unix_ms", recent[0].0)
        .with("window_end_unix_ms", recent[n - 1].0);
    if let Some(r) = preempt_rate {
        f = f.with("preemptions_per_s", r);
    }
    if queue_rising {
        f = f
            .with("waiting_first", q[0].1)
            .with("waiting_last", q[q.len() - 1].1);
    }
    Some(f)
}

/// (a) utilisation > `util_min` and hit rate < `hit_rate_max` and acceptance < `acceptance_max`,
/// or (b) hit rate < `critical_hit_rate_max` and acceptance < `critical_acceptance_max`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TripleSignalParams {
    pub util_min: f64,
    pub hit_rate_max: f64,
    pub acceptance_max: f64,
    pub critical_hit_rate_max: f64,
    pub critical_acceptance_max: f64,
}

impl Default for TripleSignalParams {
    fn default() -> Self {
        TripleSignalParams {
            util_min: 0.9,
            hit_rate_max: 0.85,
            acceptance_max: 0.7,
            critical_hit_rate_max: 0.7,
            critical_acceptance_max: 0.6,
        }
    }
}

impl Validate for TripleSignalParams {
    fn validate(&self) -> Result<(), ParamError> {
        for (name, v) in [
            ("util_min", self.util_min),
            ("hit_rate_max", self.hit_rate_max),
            ("acceptance_max", self.acceptance_max),
            ("critical_hit_rate_max", self.critical_hit_rate_max),
            ("critical_acceptance_max", self.critical_acceptance_max),
        ] {
            check(
                (0.0..=1.0).contains(&v),
                name,
                "must be a fraction in [0, 1]",
            )?;
        }
        Ok(())
    }
}

/// Inputs are fractions; pass NaN for a signal that is not available (no speculative decoding:
/// no finding). Score = geometric mean of the margins of the rule that holds (util / util_min,
/// max / hit rate, max / acceptance, each capped at 10): 1.0 at the thresholds. Rule (b) wins.
pub fn triple_signal_health(
    gpu_util: f64,
    kv_hit_rate: f64,
    spec_acceptance: f64,
    p: &TripleSignalParams,
) -> Option<Finding> {
    if !(kv_hit_rate.is_finite() && spec_acceptance.is_finite()) {
        return None;
    }
    let margin = |limit: f64, v: f64| (limit / v.max(1e-9)).min(10.0);
    let (rule, score, advice) = if kv_hit_rate < p.critical_hit_rate_max
        && spec_acceptance < p.critical_acceptance_max
    {
        let s = (margin(p.critical_hit_rate_max, kv_hit_rate)
            * margin(p.critical_acceptance_max, spec_acceptance))
        .sqrt();
        (
            "low_reuse_low_acceptance",
            s,
            "the prefix cache and the draft model both stopped helping; check for a prompt-template change or cache pollution and the draft model's fit",
        )
    } else if gpu_util.is_finite()
        && gpu_util > p.util_min
        && kv_hit_rate < p.hit_rate_max
        && spec_acceptance < p.acceptance_max
    {
        let s = ((gpu_util / p.util_min)
            * margin(p.hit_rate_max, kv_hit_rate)
            * margin(p.acceptance_max, spec_acceptance))
        .cbrt();
        (
            "saturated_low_reuse",
            s,
            "the GPU is saturated doing work the caches should save; check prefix-cache reuse and speculative-decoding settings before adding capacity",
        )
    } else {
        return None;
    };
    let summary = format!(
        "GPU utilisation {}, prefix-cache hit rate {} and speculative acceptance {} — {advice}",
        if gpu_util.is_finite() {
            pct(gpu_util)
        } else {
            "unknown".to_string()
        },
        pct(kv_hit_rate),
        pct(spec_acceptance)
    );
    Some(
        Finding::new(score, summary)
            .with("rule", rule)
            .with("gpu_utilization", gpu_util)
            .with("kv_hit_rate", kv_hit_rate)
            .with("spec_acceptance", spec_acceptance),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(values: &[f64]) -> Vec<(i64, f64)> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as i64 * 5_000, *v))
            .collect()
    }

    #[test]
    fn kv_pressure_with_preemptions_and_growing_queue() {
        let p = KvPressureParams::default();
        let kv = s(&[0.7, 0.85, 0.93, 0.95, 0.97]);
        let f = kv_cache_pressure(
            &kv,
            &s(&[0.0, 0.0, 0.5, 1.0, 2.0]),
            &s(&[0.0, 2.0, 5.0, 9.0, 14.0]),
            &p,
        )
        .unwrap();
        assert!((f.score - 0.97 / 0.9 * 1.25).abs() < 1e-9, "{}", f.score);
        assert_eq!(f.evidence["preempting"], true);
        assert_eq!(f.evidence["queue_rising"], true);
        assert!(f.summary.contains("97.0% full"), "{}", f.summary);
        // Only a growing queue.
        let f = kv_cache_pressure(&kv, &s(&[0.0; 5]), &s(&[1.0, 2.0, 3.0, 5.0, 8.0]), &p).unwrap();
        assert!((f.score - 0.97 / 0.9).abs() < 1e-9);
    }

    #[test]
    fn kv_pressure_negatives_and_edges() {
        let p = KvPressureParams::default();
        let high = s(&[0.95; 6]);
        let calm = s(&[0.0; 6]);
        assert!(
            kv_cache_pressure(&high, &calm, &s(&[3.0; 6]), &p).is_none(),
            "full but no symptoms"
        );
        assert!(
            kv_cache_pressure(&s(&[0.5, 0.6, 0.95]), &s(&[1.0; 3]), &calm, &p).is_none(),
            "not sustained"
        );
        assert!(
            kv_cache_pressure(&s(&[0.95, 0.96]), &s(&[1.0; 2]), &calm, &p).is_none(),
            "too few samples"
        );
        assert!(kv_cache_pressure(&[], &[], &[], &p).is_none());
        assert!(
            kv_cache_pressure(&s(&[0.95, 0.95, f64::NAN]), &s(&[1.0; 3]), &calm, &p).is_none(),
            "NaN"
        );
        assert!(
            kv_cache_pressure(&high, &s(&[-5.0; 6]), &calm, &p).is_none(),
            "counter reset rates ignored"
        );
    }

    #[test]
    fn triple_signal_rules() {
        let p = TripleSignalParams::default();
        let f = triple_signal_health(0.95, 0.8, 0.65, &p).unwrap();
        assert_eq!(f.evidence["rule"], "saturated_low_reuse");
        assert!(f.score > 1.0);
        let f = triple_signal_health(0.2, 0.6, 0.5, &p).unwrap();
        assert_eq!(f.evidence["rule"], "low_reuse_low_acceptance");
        assert!(
            triple_signal_health(0.95, 0.9, 0.65, &p).is_none(),
            "hit rate fine"
        );
        assert!(
            triple_signal_health(0.5, 0.8, 0.65, &p).is_none(),
            "not saturated"
        );
        assert!(
            triple_signal_health(0.95, 0.8, f64::NAN, &p).is_none(),
            "no speculative decoding"
        );
        assert!(
            triple_signal_health(f64::NAN, 0.5, 0.4, &p).is_some(),
            "rule (b) needs no utilisation"
        );
        let at = triple_signal_health(0.9 + 1e-12, 0.85 - 1e-12, 0.7 - 1e-12, &p).unwrap();
        assert!((at.score - 1.0).abs() < 1e-6);
        let worse = triple_signal_health(
            1.0,
            0.5,
            0.65,
            &TripleSignalParams {
                critical_hit_rate_max: 0.0,
                ..p
            },
        )
        .unwrap();
        assert!(worse.score > at.score);
    }
}
