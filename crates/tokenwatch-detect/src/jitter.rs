// Batch jitter (spec sections 3 and 4): latency variation that batch size does not explain,
// std(lat)/mean(lat) × (1 − corr(batch_size, lat))², clamped to [0, 1].

use serde::{Deserialize, Serialize};

use crate::stats::{mean, pearson};
use crate::{Finding, ParamError, Validate, check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchJitterParams {
    pub max_score: f64,
    pub min_samples: usize,
    /// The window (in arrival order) is cut into this many consecutive parts and each must be
    /// over `max_score` too: one stalled request dominates std/mean of a whole window, but it
    /// sits in only one part.
    pub segments: usize,
}

impl Default for BatchJitterParams {
    fn default() -> Self {
        BatchJitterParams {
            max_score: 0.5,
            min_samples: 30,
            segments: 3,
        }
    }
}

impl Validate for BatchJitterParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.max_score > 0.0 && self.max_score < 1.0,
            "max_score",
            "must be in (0, 1)",
        )?;
        check(self.min_samples >= 2, "min_samples", "must be ≥ 2")?;
        check(
            self.segments >= 1 && self.segments * 2 <= self.min_samples,
            "segments",
            "must be in [1, min_samples / 2]",
        )
    }
}

fn pairs(latencies: &[f64], batch_sizes: &[f64]) -> (Vec<f64>, Vec<f64>) {
    latencies
        .iter()
        .zip(batch_sizes)
        .filter(|(l, b)| l.is_finite() && b.is_finite() && **l >= 0.0 && **b >= 0.0)
        .map(|(l, b)| (*l, *b))
        .unzip()
}

/// Population coefficient of variation of latency × (1 − Pearson corr)², clamped to [0, 1].
/// Pairs with a NaN/inf/negative value are dropped. None when the slices differ in length, fewer
/// than two pairs remain or mean latency is 0. Constant batch sizes: corr = 0 (no explanation).
pub fn batch_jitter_score(latencies: &[f64], batch_sizes: &[f64]) -> Option<f64> {
    if latencies.len() != batch_sizes.len() {
        return None;
    }
    let (lat, batch) = pairs(latencies, batch_sizes);
    if lat.len() < 2 {
        return None;
    }
    let m = mean(&lat)?;
    if m <= 0.0 {
        return None;
    }
    let var = lat.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / lat.len() as f64;
    let corr = pearson(&batch, &lat)?;
    let s = var.sqrt() / m * (1.0 - corr).powi(2);
    s.is_finite().then(|| s.clamp(0.0, 1.0))
}

/// Score = jitter / max_score.
pub fn batch_jitter(
    latencies: &[f64],
    batch_sizes: &[f64],
    p: &BatchJitterParams,
) -> Option<Finding> {
    if latencies.len() != batch_sizes.len() {
        return None;
    }
    let (lat, batch) = pairs(latencies, batch_sizes);
    if lat.len() < p.min_samples.max(2) {
        return None;
    }
    let jitter = batch_jitter_score(&lat, &batch)?;
    if jitter <= p.max_score {
        return None;
    }
    // Sustained across the window: every consecutive part is over the threshold on its own.
    let parts = p.segments.max(1);
    let size = lat.len().div_ceil(parts);
    let mut lowest = jitter;
    for (l, b) in lat.chunks(size).zip(batch.chunks(size)) {
        let part = batch_jitter_score(l, b).filter(|_| l.len() >= 2)?;
        if part <= p.max_score {
            return None;
        }
        lowest = lowest.min(part);
    }
    let corr = pearson(&batch, &lat).unwrap_or(0.0);
    let m = mean(&lat).unwrap_or(0.0);
    let summary = format!(
        "latency varies with a jitter score of {jitter:.2} over {} requests (mean {m:.3} s, correlation with batch \
         size {corr:.2}) — the variation is not explained by batch size; look for interference \
         (co-located jobs, CPU contention, thermal throttling) or scheduler stalls",
        lat.len()
    );
    Some(
        Finding::new(jitter / p.max_score, summary)
            .with("jitter_score", jitter)
            .with("threshold", p.max_score)
            .with("samples", lat.len())
            .with("mean_latency_s", m)
            .with("batch_latency_correlation", corr)
            .with("segments", parts)
            .with("lowest_segment_score", lowest),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_scores() {
        // Constant latency: no jitter.
        assert!(batch_jitter_score(&[0.2; 10], &[4.0; 10]).unwrap() < 1e-12);
        // Latency exactly proportional to batch size: fully explained.
        let b: Vec<f64> = (1..=20).map(f64::from).collect();
        let l: Vec<f64> = b.iter().map(|x| 0.01 * x).collect();
        assert!(batch_jitter_score(&l, &b).unwrap() < 1e-12);
        // Alternating 1 and 3 with constant batch size: CV = 0.5, corr = 0 → 0.5.
        let l: Vec<f64> = (0..20)
            .map(|i| if i % 2 == 0 { 1.0 } else { 3.0 })
            .collect();
        assert!((batch_jitter_score(&l, &[8.0; 20]).unwrap() - 0.5).abs() < 1e-12);
        // Anti-correlated: (1 − (−1))² = 4 amplifies, then clamped to 1.
        let b: Vec<f64> = l.iter().map(|x| 10.0 - x).collect();
        assert_eq!(batch_jitter_score(&l, &b), Some(1.0));
        assert_eq!(batch_jitter_score(&[], &[]), None);
        assert_eq!(batch_jitter_score(&[1.0], &[1.0]), None);
        assert_eq!(batch_jitter_score(&[1.0, 2.0], &[1.0]), None);
        assert_eq!(batch_jitter_score(&[0.0, 0.0], &[1.0, 2.0]), None);
        assert_eq!(
            batch_jitter_score(&[f64::NAN, 1.0, 3.0], &[1.0, 8.0, 8.0]),
            Some(0.5)
        );
    }

    #[test]
    fn detector_fires_above_threshold_only_with_enough_samples() {
        let p = BatchJitterParams::default();
        let l: Vec<f64> = (0..40)
            .map(|i| if i % 2 == 0 { 0.1 } else { 0.9 })
            .collect();
        let f = batch_jitter(&l, &[8.0; 40], &p).unwrap();
        assert!((f.score - 0.8 / 0.5).abs() < 1e-9, "{}", f.score);
        assert!(
            batch_jitter(&l[..20], &[8.0; 20], &p).is_none(),
            "too few samples"
        );
        assert!(
            batch_jitter(&[0.3; 40], &[8.0; 40], &p).is_none(),
            "constant"
        );
        let calm: Vec<f64> = (0..40).map(|i| 0.3 + 0.01 * f64::from(i % 3)).collect();
        assert!(batch_jitter(&calm, &[8.0; 40], &p).is_none());
    }

    #[test]
    fn one_stalled_request_is_not_jitter() {
        let p = BatchJitterParams::default();
        let mut l: Vec<f64> = (0..60).map(|i| 0.03 + 0.002 * f64::from(i % 5)).collect();
        l[40] = 1.5;
        let whole = batch_jitter_score(&l, &[8.0; 60]).unwrap();
        assert!(
            whole > p.max_score,
            "one stall dominates the whole window: {whole}"
        );
        assert!(
            batch_jitter(&l, &[8.0; 60], &p).is_none(),
            "but it sits in one part only"
        );
        let bad = BatchJitterParams { segments: 20, ..p };
        assert_eq!(bad.validate().unwrap_err().field, "segments");
    }

    proptest! {
        #[test]
        fn score_is_always_in_unit_interval(pairs in prop::collection::vec((-1e6f64..1e6, -1e3f64..1e3), 0..60)) {
            let (l, b): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
            if let Some(s) = batch_jitter_score(&l, &b) {
                prop_assert!((0.0..=1.0).contains(&s));
            }
        }
    }
}
