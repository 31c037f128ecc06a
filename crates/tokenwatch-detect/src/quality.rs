// Output-quality detectors of spec section 4: semantic drift of embedding centroids and the joint
// grading of per-request anomalies. Length outliers, drift tests and cache pollution next door.

use serde::{Deserialize, Serialize};

pub use crate::cache::*;
pub use crate::drift::*;
pub use crate::length::*;
use crate::{Finding, ParamError, Validate, check};

/// Cosine similarity of the current window's embedding centroid to the baseline's < `min_cosine`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SemanticDriftParams {
    pub min_cosine: f64,
    pub min_samples: usize,
}

impl Default for SemanticDriftParams {
    fn default() -> Self {
        SemanticDriftParams {
            min_cosine: 0.85,
            // With fewer, the centroids of diverse outputs are too noisy even size-corrected.
            min_samples: 50,
        }
    }
}

impl Validate for SemanticDriftParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.min_cosine > -1.0 && self.min_cosine < 1.0,
            "min_cosine",
            "must be in (−1, 1)",
        )
    }
}

/// Sum of the unit-normalised vectors of dimension `dim`; vectors of another dimension, with
/// a non-finite component or zero length are skipped. Returns (sum, vectors used).
fn centroid(vectors: &[Vec<f32>], dim: usize) -> (Vec<f64>, usize) {
    let mut c = vec![0.0f64; dim];
    let mut used = 0;
    for v in vectors
        .iter()
        .filter(|v| v.len() == dim && v.iter().all(|x| x.is_finite()))
    {
        let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        if norm > 0.0 && norm.is_finite() {
            for (ci, x) in c.iter_mut().zip(v) {
                *ci += f64::from(*x) / norm;
            }
            used += 1;
        }
    }
    (c, used)
}

/// Score = (1 − cos) / (1 − min_cosine): 1.0 at the threshold. The dimension is the first
/// baseline vector's; unusable vectors are skipped and do not count towards `min_samples`.
///
/// The cosine is corrected for sample size: the mean of n unit vectors drawn around a true mean
/// μ has E|c|² = |μ|² + (1 − |μ|²)/n, so two small samples of the same diverse outputs have
/// centroids far less aligned than their distribution is. The norms are debiased,
/// |μ|² ≈ (n|c|² − 1)/(n − 1), and the cross product c_b·c_c (already unbiased for μ_b·μ_c)
/// is divided by them. Outputs too diverse to have a common direction give no verdict.
pub fn semantic_drift(
    baseline: &[Vec<f32>],
    current: &[Vec<f32>],
    p: &SemanticDriftParams,
) -> Option<Finding> {
    let dim = baseline.first()?.len();
    if dim == 0 {
        return None;
    }
    let (b, nb) = centroid(baseline, dim);
    let (c, nc) = centroid(current, dim);
    if nb < p.min_samples.max(2) || nc < p.min_samples.max(2) {
        return None;
    }
    let mean = |v: &[f64], n: usize| -> Vec<f64> { v.iter().map(|x| x / n as f64).collect() };
    let (b, c) = (mean(&b, nb), mean(&c, nc));
    let dot: f64 = b.iter().zip(&c).map(|(x, y)| x * y).sum();
    let debiased = |v: &[f64], n: usize| {
        let sq: f64 = v.iter().map(|x| x * x).sum();
        (n as f64 * sq - 1.0) / (n as f64 - 1.0)
    };
    let (lb, lc) = (debiased(&b, nb), debiased(&c, nc));
    if !(lb > 0.0 && lc > 0.0) {
        return None;
    }
    let cos = (dot / (lb * lc).sqrt()).clamp(-1.0, 1.0);
    if !cos.is_finite() || cos >= p.min_cosine {
        return None;
    }
    let summary = format!(
        "the meaning of this window's outputs moved away from the baseline (centroid cosine {cos:.3} < {:.2}, \
         {nc} vs {nb} responses) — check for a model, prompt or retrieval change and review sample outputs",
        p.min_cosine
    );
    Some(
        Finding::new((1.0 - cos) / (1.0 - p.min_cosine), summary)
            .with("cosine", cos)
            .with("min_cosine", p.min_cosine)
            .with("baseline_samples", nb)
            .with("current_samples", nc)
            .with("dimensions", dim),
    )
}

/// Joint grade of a request's anomalies (spec section 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JointGrade {
    High,
    Medium,
    Normal,
}

impl JointGrade {
    pub fn name(self) -> &'static str {
        match self {
            JointGrade::High => "high",
            JointGrade::Medium => "medium",
            JointGrade::Normal => "normal",
        }
    }
}

/// Both → high, either one → medium, neither → normal.
pub fn joint_grade(semantic_drift: bool, length_outlier: bool) -> JointGrade {
    match (semantic_drift, length_outlier) {
        (true, true) => JointGrade::High,
        (true, false) | (false, true) => JointGrade::Medium,
        (false, false) => JointGrade::Normal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emb(angle: f32, jitter: f32) -> Vec<f32> {
        vec![angle.cos() + jitter, angle.sin() - jitter, 0.1]
    }

    #[test]
    fn semantic_drift_on_rotated_centroid() {
        let p = SemanticDriftParams::default();
        let base: Vec<Vec<f32>> = (0..60).map(|i| emb(0.0, 0.01 * (i % 5) as f32)).collect();
        let same: Vec<Vec<f32>> = (0..60).map(|i| emb(0.05, 0.01 * (i % 3) as f32)).collect();
        let moved: Vec<Vec<f32>> = (0..60).map(|_| emb(1.2, 0.0)).collect();
        assert!(semantic_drift(&base, &same, &p).is_none());
        let f = semantic_drift(&base, &moved, &p).unwrap();
        assert!(f.score > 1.0 && f.evidence["cosine"].as_f64().unwrap() < 0.85);
        assert!(semantic_drift(&base, &moved[..30], &p).is_none(), "too few");
        assert!(semantic_drift(&[], &moved, &p).is_none(), "empty");
        let mut bad = moved.clone();
        for v in bad.iter_mut().take(15) {
            v[0] = f32::NAN;
        }
        assert!(
            semantic_drift(&base, &bad, &p).is_none(),
            "NaN vectors skipped → too few left"
        );
        let wrong_dim: Vec<Vec<f32>> = (0..60).map(|_| vec![1.0, 0.0]).collect();
        assert!(semantic_drift(&base, &wrong_dim, &p).is_none());
        assert!(semantic_drift(&base, &base, &p).is_none(), "identical");
    }

    /// `n` unit-ish vectors in 64 dimensions: a common direction `axis` of weight `w` plus
    /// independent noise (diverse outputs of one kind), from a small deterministic generator.
    fn diverse(n: usize, axis: usize, w: f32, seed: u64) -> Vec<Vec<f32>> {
        let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let mut unit = move || {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        (0..n)
            .map(|_| {
                let mut v: Vec<f32> = (0..64).map(|_| unit()).collect();
                v[axis] += w;
                v
            })
            .collect()
    }

    #[test]
    fn small_samples_of_diverse_outputs_are_not_drift() {
        let p = SemanticDriftParams::default();
        let mut raw_below = 0;
        for seed in 0..40 {
            let (a, b) = (diverse(50, 0, 0.6, seed), diverse(50, 0, 0.6, 1_000 + seed));
            // The plain centroid cosine of two such samples is often under 0.85 …
            let (ca, _) = centroid(&a, 64);
            let (cb, _) = centroid(&b, 64);
            let dot: f64 = ca.iter().zip(&cb).map(|(x, y)| x * y).sum();
            let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
            raw_below += usize::from(dot / (norm(&ca) * norm(&cb)) < 0.85);
            // … the size-corrected one is not fooled.
            assert!(semantic_drift(&a, &b, &p).is_none(), "seed {seed}");
            // A different common direction is drift.
            let moved = diverse(50, 1, 0.6, 2_000 + seed);
            assert!(semantic_drift(&a, &moved, &p).is_some(), "seed {seed}");
        }
        assert!(
            raw_below > 10,
            "the uncorrected cosine was under 0.85 only {raw_below} of 40 times"
        );
    }

    #[test]
    fn joint_grades() {
        assert_eq!(joint_grade(true, true), JointGrade::High);
        assert_eq!(joint_grade(true, false), JointGrade::Medium);
        assert_eq!(joint_grade(false, true), JointGrade::Medium);
        assert_eq!(joint_grade(false, false), JointGrade::Normal);
        assert_eq!(JointGrade::High.name(), "high");
    }
}
