// Output-quality detectors of spec section 4: output length outlier, semantic drift of embedding
// centroids, and the joint grading of per-request anomalies. Drift tests and cache pollution next door.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

pub use crate::cache::*;
pub use crate::drift::*;
use crate::stats::{median, std_dev};
use crate::{Finding, ParamError, Validate, check};

/// |L − median| > `sigmas` × σ over the last `window` responses of a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LengthOutlierParams {
    pub window: usize,
    pub sigmas: f64,
    pub min_samples: usize,
    /// σ is floored at this fraction of the median, so that a (nearly) constant window — e.g.
    /// every answer hitting max_tokens — does not turn a one-token difference into an outlier.
    pub min_sigma_fraction: f64,
}

impl Default for LengthOutlierParams {
    fn default() -> Self {
        LengthOutlierParams {
            window: 100,
            sigmas: 3.0,
            // The spec's "last 100 responses": with fewer, σ of a skewed (capped lognormal)
            // length distribution is too unstable — at 34 samples a response at max_tokens
            // came out 3.4σ long on a healthy model.
            min_samples: 100,
            min_sigma_fraction: 0.05,
        }
    }
}

impl Validate for LengthOutlierParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(self.window >= 2, "window", "must be ≥ 2")?;
        check(
            self.min_samples >= 2 && self.min_samples <= self.window,
            "min_samples",
            "must be in [2, window]",
        )?;
        check(
            self.sigmas.is_finite() && self.sigmas > 0.0,
            "sigmas",
            "must be > 0",
        )?;
        check(
            self.min_sigma_fraction.is_finite() && self.min_sigma_fraction >= 0.0,
            "min_sigma_fraction",
            "must be ≥ 0",
        )
    }
}

/// One model's recent output lengths. Keep one per model.
#[derive(Debug, Clone)]
pub struct LengthOutlier {
    p: LengthOutlierParams,
    recent: VecDeque<f64>,
}

impl LengthOutlier {
    pub fn new(p: LengthOutlierParams) -> Self {
        LengthOutlier {
            recent: VecDeque::with_capacity(p.window.max(1)),
            p,
        }
    }

    pub fn len(&self) -> usize {
        self.recent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }

    /// Tests `output_tokens` against the window as it was BEFORE this value, then adds it.
    /// NaN/inf/negative values are ignored (not tested, not added). Score = |L − median| / (sigmas × σ).
    pub fn observe(&mut self, output_tokens: f64) -> Option<Finding> {
        if !output_tokens.is_finite() || output_tokens < 0.0 {
            return None;
        }
        let finding = self.test(output_tokens);
        if self.recent.len() >= self.p.window.max(1) {
            self.recent.pop_front();
        }
        self.recent.push_back(output_tokens);
        finding
    }

    fn test(&self, l: f64) -> Option<Finding> {
        if self.recent.len() < self.p.min_samples.max(2) {
            return None;
        }
        let window: Vec<f64> = self.recent.iter().copied().collect();
        let med = median(&window)?;
        let sigma = std_dev(&window)?.max(self.p.min_sigma_fraction * med.abs());
        if sigma <= 0.0 {
            return None;
        }
        let dev = (l - med).abs();
        if dev <= self.p.sigmas * sigma {
            return None;
        }
        let direction = if l > med { "longer" } else { "shorter" };
        let advice = if l > med {
            "check for a runaway generation (missing stop token, repetition loop, prompt injection)"
        } else {
            "check for truncated or refused answers (errors, safety filter, max_tokens)"
        };
        let summary = format!(
            "a response of {l:.0} tokens is {:.1}σ {direction} than the median {med:.0} of the last {} responses — {advice}",
            dev / sigma,
            window.len()
        );
        Some(
            Finding::new(dev / (self.p.sigmas * sigma), summary)
                .with("output_tokens", l)
                .with("median", med)
                .with("sigma", sigma)
                .with("deviation_sigmas", dev / sigma)
                .with("sigmas_threshold", self.p.sigmas)
                .with("window_samples", window.len()),
        )
    }
}

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
            min_samples: 20,
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

/// Mean of the unit-normalised vectors of dimension `dim`; vectors of another dimension, with
/// a non-finite component or zero length are skipped. Returns (centroid, vectors used).
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
    if nb < p.min_samples.max(1) || nc < p.min_samples.max(1) {
        return None;
    }
    let dot: f64 = b.iter().zip(&c).map(|(x, y)| x * y).sum();
    let (lb, lc) = (
        b.iter().map(|x| x * x).sum::<f64>().sqrt(),
        c.iter().map(|x| x * x).sum::<f64>().sqrt(),
    );
    if !(lb > 0.0 && lc > 0.0) {
        return None;
    }
    let cos = (dot / (lb * lc)).clamp(-1.0, 1.0);
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

    fn fill(d: &mut LengthOutlier, n: usize) {
        for i in 0..n {
            // 200 ± 20 tokens, deterministic.
            assert!(
                d.observe(200.0 + f64::from((i * 7 % 41) as u32) - 20.0)
                    .is_none()
            );
        }
    }

    #[test]
    fn length_outlier_positive_negative_and_window() {
        let mut d = LengthOutlier::new(LengthOutlierParams::default());
        fill(&mut d, 100);
        let f = d.observe(1500.0).unwrap();
        assert!(f.score > 5.0, "{}", f.score);
        assert!(f.summary.contains("longer"), "{}", f.summary);
        assert!(d.observe(210.0).is_none());
        assert_eq!(d.len(), 100, "window keeps the last 100");
        let mut fresh = LengthOutlier::new(LengthOutlierParams::default());
        fill(&mut fresh, 100);
        assert!(fresh.observe(5.0).unwrap().summary.contains("shorter"));
    }

    #[test]
    fn length_outlier_edges() {
        let mut d = LengthOutlier::new(LengthOutlierParams::default());
        fill(&mut d, 99);
        assert!(
            d.observe(5000.0).is_none(),
            "under min_samples: the 100th value is tested against 99"
        );
        let mut c = LengthOutlier::new(LengthOutlierParams::default());
        for _ in 0..100 {
            assert!(c.observe(256.0).is_none(), "constant series");
        }
        assert!(
            c.observe(260.0).is_none(),
            "tiny deviation from a constant window"
        );
        assert!(
            c.observe(1000.0).is_some(),
            "a blow-up from a constant window"
        );
        assert!(c.observe(f64::NAN).is_none());
        assert!(c.observe(-1.0).is_none());
        let mut z = LengthOutlier::new(LengthOutlierParams::default());
        for _ in 0..100 {
            z.observe(0.0);
        }
        assert!(z.observe(10.0).is_none(), "all-zero window has no spread");
    }

    fn emb(angle: f32, jitter: f32) -> Vec<f32> {
        vec![angle.cos() + jitter, angle.sin() - jitter, 0.1]
    }

    #[test]
    fn semantic_drift_on_rotated_centroid() {
        let p = SemanticDriftParams::default();
        let base: Vec<Vec<f32>> = (0..30).map(|i| emb(0.0, 0.01 * (i % 5) as f32)).collect();
        let same: Vec<Vec<f32>> = (0..30).map(|i| emb(0.05, 0.01 * (i % 3) as f32)).collect();
        let moved: Vec<Vec<f32>> = (0..30).map(|_| emb(1.2, 0.0)).collect();
        assert!(semantic_drift(&base, &same, &p).is_none());
        let f = semantic_drift(&base, &moved, &p).unwrap();
        assert!(f.score > 1.0 && f.evidence["cosine"].as_f64().unwrap() < 0.85);
        assert!(semantic_drift(&base, &moved[..10], &p).is_none(), "too few");
        assert!(semantic_drift(&[], &moved, &p).is_none(), "empty");
        let mut bad = moved.clone();
        for v in bad.iter_mut().take(15) {
            v[0] = f32::NAN;
        }
        assert!(
            semantic_drift(&base, &bad, &p).is_none(),
            "NaN vectors skipped → too few left"
        );
        let wrong_dim: Vec<Vec<f32>> = (0..30).map(|_| vec![1.0, 0.0]).collect();
        assert!(semantic_drift(&base, &wrong_dim, &p).is_none());
        assert!(semantic_drift(&base, &base, &p).is_none(), "identical");
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
