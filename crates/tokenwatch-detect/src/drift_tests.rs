// Tests of the drift detectors: KS p-values on deterministic pseudo-random samples, KL streaks
// and the adaptive weights of the drift vote.

use super::*;

/// Small LCG + Box–Muller: deterministic normal samples without a rand dependency.
struct Lcg(u64);

impl Lcg {
    fn uniform(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self, mean: f64, sd: f64) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        mean + sd * (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    fn sample(&mut self, n: usize, mean: f64, sd: f64) -> Vec<f64> {
        (0..n).map(|_| self.normal(mean, sd)).collect()
    }
}

#[test]
fn ks_identical_samples_have_p_one() {
    let a = Lcg(7).sample(200, 0.0, 1.0);
    let (d, p) = ks_two_sample(&a, &a).unwrap();
    assert_eq!(d, 0.0);
    assert!((p - 1.0).abs() < 1e-12);
    assert!(ks_drift(&a, &a, &KsDriftParams::default()).is_none());
}

#[test]
fn ks_shifted_normals_fire_with_tiny_p() {
    let mut g = Lcg(42);
    let a = g.sample(200, 0.0, 1.0);
    let b = g.sample(200, 1.0, 1.0);
    let f = ks_drift(&a, &b, &KsDriftParams::default()).unwrap();
    let p = f.evidence["p_value"].as_f64().unwrap();
    assert!(p < 1e-6, "{p}");
    assert!(f.score > 3.0, "{}", f.score);
    let d = f.evidence["statistic"].as_f64().unwrap();
    assert!(
        (0.25..0.55).contains(&d),
        "D for a 1σ shift is about 0.38: {d}"
    );
}

#[test]
fn ks_same_distribution_does_not_fire() {
    let mut fired = 0;
    for seed in 0..50 {
        let mut g = Lcg(1000 + seed);
        let (a, b) = (g.sample(200, 5.0, 2.0), g.sample(200, 5.0, 2.0));
        let (_, p) = ks_two_sample(&a, &b).unwrap();
        assert!((0.0..=1.0).contains(&p));
        fired += usize::from(ks_drift(&a, &b, &KsDriftParams::default()).is_some());
    }
    assert!(
        fired <= 2,
        "alpha 0.01 over 50 null trials fired {fired} times"
    );
}

#[test]
fn ks_needs_a_material_shift_on_big_windows() {
    // 25,000 vs 4,000 values (30 min vs 5 min at 14 req/s): a 5 % median drift is "significant"
    // at p < 0.01 but moves the CDF by only ~0.02; a 4× blow-up moves it by more than half.
    let mut g = Lcg(99);
    let reference = g.sample(25_000, 0.0, 0.8);
    let drifted = g.sample(4_000, 0.05, 0.8);
    let p = KsDriftParams::default();
    let (d, pv) = ks_two_sample(&reference, &drifted).unwrap();
    assert!(pv < 0.01 && d < p.min_statistic, "D {d}, p {pv}");
    assert!(ks_drift(&reference, &drifted, &p).is_none());
    let blown = g.sample(4_000, 4f64.ln(), 0.8);
    assert!(ks_drift(&reference, &blown, &p).is_some());
    let bad = KsDriftParams {
        min_statistic: 1.0,
        ..p
    };
    assert_eq!(bad.validate().unwrap_err().field, "min_statistic");
}

#[test]
fn ks_edges() {
    let p = KsDriftParams::default();
    let a = Lcg(1).sample(100, 0.0, 1.0);
    let b = Lcg(2).sample(100, 3.0, 1.0);
    assert!(
        ks_drift(&a, &b[..29], &p).is_none(),
        "too few current samples"
    );
    assert!(ks_drift(&[], &b, &p).is_none(), "empty");
    assert!(ks_drift(&[4.0; 50], &[4.0; 50], &p).is_none(), "constant");
    let mut nan = b.clone();
    nan.extend([f64::NAN, f64::INFINITY]);
    let f = ks_drift(&a, &nan, &p).unwrap();
    assert_eq!(f.evidence["dropped_non_finite"], 2);
    assert!(ks_drift(&a, &[f64::NAN; 100], &p).is_none());
}

fn counts(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn kl_needs_consecutive_divergent_evaluations() {
    let base = counts(&[("stop", 900.0), ("length", 90.0), ("error", 10.0)]);
    let shifted = counts(&[("stop", 500.0), ("length", 450.0), ("error", 50.0)]);
    let mut d = KlDrift::new(KlDriftParams::default());
    assert!(d.evaluate(&base, &shifted).is_none());
    assert!(d.evaluate(&base, &shifted).is_none());
    let f = d.evaluate(&base, &shifted).unwrap();
    assert!(f.score > 1.0 && f.evidence["consecutive_evaluations"] == 3);
    assert!(f.summary.contains("`stop` -40.0 points"), "{}", f.summary);
    // One calm evaluation resets the streak.
    assert!(d.evaluate(&base, &base).is_none());
    assert_eq!(d.streak(), 0);
    // Too little data neither counts nor resets.
    assert!(d.evaluate(&base, &counts(&[("stop", 3.0)])).is_none());
    assert_eq!(d.streak(), 0);
}

#[test]
fn kl_values_and_edges() {
    let base = counts(&[("a", 50.0), ("b", 50.0)]);
    assert!(kl_divergence(&base, &base, 1e-3, 30.0).unwrap() < 1e-12);
    // KL((0.9,0.1) ‖ (0.5,0.5)) = 0.9 ln 1.8 + 0.1 ln 0.2 ≈ 0.3681
    let cur = counts(&[("a", 90.0), ("b", 10.0)]);
    assert!((kl_divergence(&base, &cur, 1e-9, 30.0).unwrap() - 0.368_064).abs() < 1e-4);
    // A category unseen in the baseline is finite thanks to smoothing.
    let new = counts(&[("a", 50.0), ("c", 50.0)]);
    assert!(kl_divergence(&base, &new, 1e-3, 30.0).unwrap().is_finite());
    assert!(kl_divergence(&BTreeMap::new(), &cur, 1e-3, 0.0).is_none());
    assert!(kl_divergence(&base, &counts(&[("a", f64::NAN)]), 1e-3, 0.0).is_none());
    assert!(kl_divergence(&base, &counts(&[("a", -1.0), ("b", 5.0)]), 1e-3, 0.0).is_none());
}

#[test]
fn vote_uses_configured_weights_then_adapts() {
    let mut v = DriftVote::new(DriftVoteParams::default());
    let w = v.weights();
    assert!(
        (w[0] - 0.4).abs() < 1e-12 && (w[1] - 0.35).abs() < 1e-12 && (w[2] - 0.25).abs() < 1e-12
    );
    // KS alone (0.4 of 1.0) is under 0.5; KS + embedding (0.75) fires.
    assert!(v.vote(Some(true), Some(false), Some(false)).is_none());
    let f = v.vote(Some(true), Some(true), Some(false)).unwrap();
    assert!((f.score - 0.75 / 0.5).abs() < 1e-12);
    // Only one signal available: not enough to vote.
    assert!(v.vote(Some(true), None, None).is_none());
    // Two available: renormalised over them, KS 0.4 / (0.4 + 0.25) ≥ 0.5.
    assert!(v.vote(Some(true), None, Some(false)).is_some());
    assert!(v.vote(None, None, None).is_none());

    // KS raises many false alarms, embedding is always right.
    for _ in 0..20 {
        v.record_outcome(DriftSignal::Ks, true);
        v.record_outcome(DriftSignal::Embedding, false);
    }
    let w2 = v.weights();
    assert!(w2[0] < 0.1, "KS lost weight: {w2:?}");
    assert!(w2[1] > w[1], "embedding gained: {w2:?}");
    assert!((w2.iter().sum::<f64>() - 1.0).abs() < 1e-12, "normalised");
    assert!(w2.iter().all(|x| *x > 0.0));
    // Now KS alone against embedding cannot carry the vote.
    assert!(v.vote(Some(true), Some(false), Some(false)).is_none());
}
