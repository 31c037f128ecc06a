// When a log template is an anomaly: its class (CUDA OOM, NCCL timeout, preemption) from its
// text, and the rate test — the last minute's count against the template's own baseline rate.

use serde::Serialize;

/// Root-cause node names of template anomalies (the detector of their `AnomalyEvent`s).
pub use tokenwatch_detect::rootcause::{
    LOG_CUDA_OOM, LOG_ERROR, LOG_NCCL_TIMEOUT, LOG_PREEMPTION, LOG_WARNING,
};

/// What a template is about, from keywords of its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateClass {
    CudaOom,
    NcclTimeout,
    Preemption,
    Other,
}

impl TemplateClass {
    pub fn of(text: &str) -> TemplateClass {
        let lower = text.to_ascii_lowercase();
        if lower.contains("cuda out of memory")
            || lower.contains("outofmemoryerror")
            || lower.contains("cuda error: out of memory")
        {
            TemplateClass::CudaOom
        } else if lower.contains("nccl")
            && (lower.contains("timeout") || lower.contains("timed out"))
        {
            TemplateClass::NcclTimeout
        } else if lower.contains("preempt") {
            TemplateClass::Preemption
        } else {
            TemplateClass::Other
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TemplateClass::CudaOom => "cuda_oom",
            TemplateClass::NcclTimeout => "nccl_timeout",
            TemplateClass::Preemption => "preemption",
            TemplateClass::Other => "other",
        }
    }

    /// The detector name its anomalies carry; None: an unclassified template below warning
    /// level never raises anything.
    pub fn detector(self, error_level: bool, warning_level: bool) -> Option<&'static str> {
        match self {
            TemplateClass::CudaOom => Some(LOG_CUDA_OOM),
            TemplateClass::NcclTimeout => Some(LOG_NCCL_TIMEOUT),
            TemplateClass::Preemption => Some(LOG_PREEMPTION),
            TemplateClass::Other if error_level => Some(LOG_ERROR),
            TemplateClass::Other if warning_level => Some(LOG_WARNING),
            TemplateClass::Other => None,
        }
    }
}

// P(X ≥ k) for X ~ Poisson(λ): `tokenwatch_detect::robust`, on `statrs`.
use tokenwatch_detect::robust::poisson_sf;

/// The rate test's thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateTestParams {
    /// One-sided p-value below which the recent count is a jump.
    pub alpha: f64,
    /// Fewest lines in the recent window for a jump.
    pub min_count: u64,
    /// The recent count must also be at least this many times the expected one.
    pub min_ratio: f64,
    /// Baseline history needed before a template's rate can jump, in ms.
    pub min_baseline_ms: i64,
}

/// The outcome of one rate test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RateJump {
    pub recent_count: u64,
    pub recent_ms: i64,
    pub baseline_count: u64,
    pub baseline_ms: i64,
    /// Lines expected in the recent window at the baseline rate.
    pub expected: f64,
    pub p_value: f64,
}

/// Whether `recent_count` lines in `recent_ms` jump against `baseline_count` lines in the
/// `baseline_ms` before. The baseline rate is (count + 1) / time: a template silent in its
/// baseline is expected at most once in it, not never, so a lone line is no jump.
pub fn rate_jump(
    recent_count: u64,
    recent_ms: i64,
    baseline_count: u64,
    baseline_ms: i64,
    p: &RateTestParams,
) -> Option<RateJump> {
    if recent_ms <= 0 || baseline_ms < p.min_baseline_ms.max(1) || recent_count < p.min_count {
        return None;
    }
    let expected = (baseline_count as f64 + 1.0) / baseline_ms as f64 * recent_ms as f64;
    if (recent_count as f64) < p.min_ratio * expected {
        return None;
    }
    let p_value = poisson_sf(recent_count, expected);
    (p_value < p.alpha).then_some(RateJump {
        recent_count,
        recent_ms,
        baseline_count,
        baseline_ms,
        expected,
        p_value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const P: RateTestParams = RateTestParams {
        alpha: 1e-6,
        min_count: 10,
        min_ratio: 3.0,
        min_baseline_ms: 300_000,
    };

    #[test]
    fn poisson_tail_matches_known_values() {
        // P(X ≥ 1 | λ) = 1 − e^−λ; P(X ≥ 3 | 1) = 1 − e^−1 (1 + 1 + 1/2).
        assert!((poisson_sf(1, 0.5) - (1.0 - (-0.5f64).exp())).abs() < 1e-12);
        let p3 = 1.0 - (-1.0f64).exp() * 2.5;
        assert!(
            (poisson_sf(3, 1.0) - p3).abs() < 1e-12,
            "{}",
            poisson_sf(3, 1.0)
        );
        assert_eq!(poisson_sf(0, 3.0), 1.0);
        assert!(poisson_sf(5, 10.0) > 0.95);
        // Far in the tail: P(X ≥ 100 | 10) ≈ 4.8e-63 (its first term, 10^100 e^-10 / 100!,
        // is 4.86e-63 and dominates).
        let far = poisson_sf(100, 10.0);
        let ln_100_factorial = 363.739_375_555_563_5;
        let first = (-10.0 + 100.0 * 10f64.ln() - ln_100_factorial).exp();
        assert!(far > first && far < first * 1.2, "{far:e} {first:e}");
    }

    #[test]
    fn a_burst_jumps_and_a_steady_rate_does_not() {
        // 20 lines a minute for 30 minutes, then 20 again: no jump.
        assert_eq!(rate_jump(20, 60_000, 600, 1_800_000, &P), None);
        // 200 in the last minute: a jump, with the expected count close to 20.
        let j = rate_jump(200, 60_000, 600, 1_800_000, &P).expect("jump");
        assert!(
            (j.expected - 601.0 / 30.0).abs() < 1e-9 && j.p_value < 1e-50,
            "{j:?}"
        );
        // A template silent in its baseline, a dozen lines now: a jump.
        assert!(rate_jump(12, 60_000, 0, 1_800_000, &P).is_some());
        // Too few lines, too short a baseline, or a rise below the ratio: none.
        assert_eq!(rate_jump(9, 60_000, 0, 1_800_000, &P), None);
        assert_eq!(rate_jump(200, 60_000, 10, 120_000, &P), None);
        assert_eq!(
            rate_jump(55, 60_000, 600, 1_800_000, &P),
            None,
            "2.7x with plenty of data"
        );
    }

    /// A steady Poisson stream at many rates, tested every 10 s for hours: never a jump.
    #[test]
    fn steady_streams_never_jump_over_many_tests() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for per_min in [0.2f64, 1.0, 5.0, 30.0, 300.0] {
            let per_bucket = per_min / 6.0;
            let mut buckets: Vec<u64> = Vec::new();
            for _ in 0..(6 * 60 * 6) {
                // Poisson by inversion (small means) or normal approximation (large ones).
                let n = if per_bucket < 30.0 {
                    let (mut k, mut p, l) = (0u64, 1.0f64, (-per_bucket).exp());
                    loop {
                        p *= rng.random::<f64>();
                        if p <= l {
                            break k;
                        }
                        k += 1;
                    }
                } else {
                    let z: f64 = (0..12).map(|_| rng.random::<f64>()).sum::<f64>() - 6.0;
                    (per_bucket + z * per_bucket.sqrt()).round().max(0.0) as u64
                };
                buckets.push(n);
                if buckets.len() > 360 {
                    let recent: u64 = buckets[buckets.len() - 6..].iter().sum();
                    let base: u64 = buckets[buckets.len() - 360..buckets.len() - 6].iter().sum();
                    assert_eq!(
                        rate_jump(recent, 60_000, base, 354 * 10_000, &P),
                        None,
                        "{per_min}/min"
                    );
                }
            }
        }
    }

    #[test]
    fn classes_come_from_keywords() {
        for (t, c) in [
            (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate <NUM> GiB.",
                TemplateClass::CudaOom,
            ),
            (
                "RuntimeError: CUDA error: out of memory",
                TemplateClass::CudaOom,
            ),
            (
                "[Rank <NUM>] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=<NUM>)",
                TemplateClass::NcclTimeout,
            ),
            (
                "NCCL communicator timed out after <DUR>",
                TemplateClass::NcclTimeout,
            ),
            (
                "Sequence group <ID> is preempted by PreemptionMode.RECOMPUTE mode",
                TemplateClass::Preemption,
            ),
            ("NCCL version <NUM>", TemplateClass::Other),
        ] {
            assert_eq!(TemplateClass::of(t), c, "{t}");
        }
        assert_eq!(TemplateClass::Other.detector(false, false), None);
        assert_eq!(TemplateClass::Other.detector(true, true), Some(LOG_ERROR));
        assert_eq!(
            TemplateClass::Preemption.detector(false, false),
            Some(LOG_PREEMPTION)
        );
    }
}
