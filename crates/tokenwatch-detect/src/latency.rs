// Latency detectors of spec section 4: P99 spike against the previous window, absolute P99
// threshold, and the context-aware threshold that scales with prompt length and KV-cache use.

use serde::{Deserialize, Serialize};

use crate::text::duration_s;
use crate::{Finding, ParamError, Validate, check};

/// Latency spike: P99 of the current window > `ratio` × P99 of the previous window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LatencySpikeParams {
    pub ratio: f64,
    /// Requests each window needs before a P99 means anything (at ~90 req/min a per-minute
    /// P99 is nearly the maximum).
    pub min_samples: u64,
}

impl Default for LatencySpikeParams {
    fn default() -> Self {
        LatencySpikeParams {
            ratio: 2.5,
            min_samples: 50,
        }
    }
}

impl Validate for LatencySpikeParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.ratio.is_finite() && self.ratio > 1.0,
            "ratio",
            "must be a number > 1",
        )
    }
}

/// Score = (current / previous) / ratio: 1.0 exactly at the threshold.
pub fn latency_spike(
    current_p99: f64,
    current_n: u64,
    previous_p99: f64,
    previous_n: u64,
    p: &LatencySpikeParams,
) -> Option<Finding> {
    if current_n < p.min_samples.max(1) || previous_n < p.min_samples.max(1) {
        return None;
    }
    if !(current_p99.is_finite() && previous_p99.is_finite()) || previous_p99 <= 0.0 {
        return None;
    }
    let observed = current_p99 / previous_p99;
    if observed <= p.ratio {
        return None;
    }
    let summary = format!(
        "P99 latency jumped {observed:.1}× from {} to {} between the previous and the current window \
         ({previous_n} and {current_n} requests, threshold {:.1}×) — check queue depth, preemptions \
         and KV-cache usage on this instance",
        duration_s(previous_p99),
        duration_s(current_p99),
        p.ratio
    );
    Some(
        Finding::new(observed / p.ratio, summary)
            .with("current_p99_s", current_p99)
            .with("previous_p99_s", previous_p99)
            .with("current_samples", current_n)
            .with("previous_samples", previous_n)
            .with("ratio", observed)
            .with("ratio_threshold", p.ratio),
    )
}

/// Absolute latency: P99 TTFT > `threshold_s`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AbsoluteLatencyParams {
    pub threshold_s: f64,
    pub min_samples: u64,
}

impl Default for AbsoluteLatencyParams {
    fn default() -> Self {
        AbsoluteLatencyParams {
            threshold_s: 2.0,
            min_samples: 20,
        }
    }
}

impl Validate for AbsoluteLatencyParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.threshold_s.is_finite() && self.threshold_s > 0.0,
            "threshold_s",
            "must be > 0",
        )
    }
}

/// Score = p99 / threshold.
pub fn absolute_latency(p99_s: f64, n: u64, p: &AbsoluteLatencyParams) -> Option<Finding> {
    if n < p.min_samples.max(1)
        || !p99_s.is_finite()
        || p.threshold_s <= 0.0
        || p99_s <= p.threshold_s
    {
        return None;
    }
    let summary = format!(
        "P99 time to first token is {} over {n} requests, above the {} limit — run the health \
         check: queue depth, KV-cache usage and GPU state of this model's instances",
        duration_s(p99_s),
        duration_s(p.threshold_s)
    );
    Some(
        Finding::new(p99_s / p.threshold_s, summary)
            .with("p99_s", p99_s)
            .with("samples", n)
            .with("threshold_s", p.threshold_s),
    )
}

/// threshold = base_ms × (1 + per_prompt_token × prompt_tokens) × (kv_offset − kv_weight × kv_usage)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextThresholdParams {
    pub base_ms: f64,
    pub per_prompt_token: f64,
    pub kv_offset: f64,
    pub kv_weight: f64,
}

impl Default for ContextThresholdParams {
    fn default() -> Self {
        ContextThresholdParams {
            base_ms: 1200.0,
            per_prompt_token: 0.002,
            kv_offset: 1.5,
            kv_weight: 0.8,
        }
    }
}

impl Validate for ContextThresholdParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.base_ms.is_finite() && self.base_ms > 0.0,
            "base_ms",
            "must be > 0",
        )?;
        check(
            self.per_prompt_token.is_finite() && self.per_prompt_token >= 0.0,
            "per_prompt_token",
            "must be ≥ 0",
        )?;
        check(
            self.kv_offset.is_finite()
                && self.kv_weight.is_finite()
                && self.kv_offset - self.kv_weight > 0.0,
            "kv_offset",
            "kv_offset − kv_weight must be > 0 so the threshold stays positive at full KV cache",
        )
    }
}

/// The latency limit in seconds for a request with this prompt length at this KV-cache usage
/// (prompt tokens floored at 0, usage clamped to [0, 1]; NaN inputs count as 0).
pub fn context_threshold_s(prompt_tokens: f64, kv_usage: f64, p: &ContextThresholdParams) -> f64 {
    let tokens = if prompt_tokens.is_finite() {
        prompt_tokens.max(0.0)
    } else {
        0.0
    };
    let kv = if kv_usage.is_finite() {
        kv_usage.clamp(0.0, 1.0)
    } else {
        0.0
    };
    p.base_ms / 1000.0 * (1.0 + p.per_prompt_token * tokens) * (p.kv_offset - p.kv_weight * kv)
}

/// Score = latency / threshold. None when any input is not finite or the threshold is ≤ 0.
pub fn context_aware_threshold(
    latency_s: f64,
    prompt_tokens: f64,
    kv_usage: f64,
    p: &ContextThresholdParams,
) -> Option<Finding> {
    if !(latency_s.is_finite() && prompt_tokens.is_finite() && kv_usage.is_finite()) {
        return None;
    }
    let limit = context_threshold_s(prompt_tokens, kv_usage, p);
    if !(limit.is_finite() && limit > 0.0) || latency_s <= limit {
        return None;
    }
    let summary = format!(
        "latency {} exceeds the {} expected for a {prompt_tokens:.0}-token prompt at {:.0}% KV-cache \
         usage — the slowdown is not explained by context length; check this instance's queue and GPU",
        duration_s(latency_s),
        duration_s(limit),
        kv_usage.clamp(0.0, 1.0) * 100.0
    );
    Some(
        Finding::new(latency_s / limit, summary)
            .with("latency_s", latency_s)
            .with("threshold_s", limit)
            .with("prompt_tokens", prompt_tokens)
            .with("kv_cache_usage", kv_usage),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spike_fires_on_a_clear_jump_with_enough_samples() {
        let f = latency_spike(1.5, 300, 0.4, 280, &LatencySpikeParams::default()).unwrap();
        assert!((f.score - 1.5).abs() < 1e-9, "{}", f.score);
        assert_eq!(f.evidence["ratio"], 3.75);
        assert!(f.summary.contains("3.8×"), "{}", f.summary);
    }

    #[test]
    fn spike_negative_and_edges() {
        let p = LatencySpikeParams::default();
        assert!(
            latency_spike(0.9, 300, 0.4, 300, &p).is_none(),
            "2.25× is under 2.5×"
        );
        assert!(latency_spike(0.4, 300, 0.4, 300, &p).is_none(), "constant");
        assert!(
            latency_spike(1.5, 49, 0.4, 300, &p).is_none(),
            "too few current samples"
        );
        assert!(
            latency_spike(1.5, 300, 0.4, 10, &p).is_none(),
            "too few previous samples"
        );
        assert!(
            latency_spike(1.5, 300, 0.0, 300, &p).is_none(),
            "zero baseline"
        );
        assert!(latency_spike(f64::NAN, 300, 0.4, 300, &p).is_none());
        assert!(latency_spike(f64::INFINITY, 300, 0.4, 300, &p).is_none());
        assert!(
            latency_spike(
                1.0,
                0,
                0.4,
                0,
                &LatencySpikeParams {
                    min_samples: 0,
                    ..p
                }
            )
            .is_none()
        );
    }

    #[test]
    fn absolute_latency_threshold() {
        let p = AbsoluteLatencyParams::default();
        let f = absolute_latency(3.0, 100, &p).unwrap();
        assert!((f.score - 1.5).abs() < 1e-12);
        assert!(absolute_latency(1.9, 100, &p).is_none());
        assert!(
            absolute_latency(2.0, 100, &p).is_none(),
            "at threshold is not above it"
        );
        assert!(absolute_latency(3.0, 19, &p).is_none());
        assert!(absolute_latency(f64::NAN, 100, &p).is_none());
    }

    #[test]
    fn context_threshold_formula() {
        let p = ContextThresholdParams::default();
        // 1.2 s × (1 + 0.002 × 1000) × (1.5 − 0.8 × 0.5) = 1.2 × 3 × 1.1 = 3.96 s
        assert!((context_threshold_s(1000.0, 0.5, &p) - 3.96).abs() < 1e-9);
        assert!((context_threshold_s(0.0, 0.0, &p) - 1.8).abs() < 1e-9);
        assert!(
            (context_threshold_s(-5.0, 7.0, &p) - 0.84).abs() < 1e-9,
            "clamped inputs"
        );
        let f = context_aware_threshold(5.0, 1000.0, 0.5, &p).unwrap();
        assert!((f.score - 5.0 / 3.96).abs() < 1e-9);
        assert!(context_aware_threshold(3.0, 1000.0, 0.5, &p).is_none());
        assert!(context_aware_threshold(f64::NAN, 1000.0, 0.5, &p).is_none());
        assert!(context_aware_threshold(5.0, f64::NAN, 0.5, &p).is_none());
        assert!(
            ContextThresholdParams {
                kv_offset: 0.5,
                ..p
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn params_deserialize_with_defaults_and_reject_unknown_fields() {
        let p: LatencySpikeParams = serde_json::from_str(r#"{"ratio": 3.0}"#).unwrap();
        assert_eq!(
            p,
            LatencySpikeParams {
                ratio: 3.0,
                min_samples: 50
            }
        );
        assert!(serde_json::from_str::<LatencySpikeParams>(r#"{"ratoi": 3.0}"#).is_err());
    }
}
