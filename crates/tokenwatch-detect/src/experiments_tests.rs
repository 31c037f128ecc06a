// Tests of the experiment detectors: A/B regressions and split deviation, prompt-version decay.

use super::*;

fn arm(requests: u64, p99_s: f64, quality: Option<f64>, toxicity: Option<f64>) -> ArmStats {
    ArmStats {
        requests,
        p99_s,
        quality,
        toxicity,
    }
}

#[test]
fn ab_latency_regression_and_split() {
    let p = AbRegressionParams::default();
    let a = arm(1800, 1.00, Some(0.9), Some(0.01));
    let b = arm(200, 1.20, Some(0.9), Some(0.01));
    let f = ab_regression(&a, &b, 0.1, &p).unwrap();
    assert_eq!(f.evidence["latency_regression"], true);
    assert_eq!(f.evidence["split_deviation"], false);
    assert_eq!(f.evidence["rollback_condition"], false);
    assert!((f.score - 0.2 / 0.05).abs() < 1e-9, "{}", f.score);
    // Same arms but B gets 10% instead of the 20% target: rollback condition.
    let f = ab_regression(&a, &b, 0.2, &p).unwrap();
    assert_eq!(f.evidence["rollback_condition"], true);
}

#[test]
fn ab_quality_toxicity_and_negatives() {
    let p = AbRegressionParams::default();
    let a = arm(500, 1.0, Some(0.80), Some(0.010));
    let q = ab_regression(&a, &arm(500, 1.0, Some(0.70), Some(0.010)), 0.5, &p).unwrap();
    assert_eq!(q.evidence["quality_regression"], true);
    let t = ab_regression(&a, &arm(500, 1.0, Some(0.80), Some(0.05)), 0.5, &p).unwrap();
    assert_eq!(t.evidence["toxicity_regression"], true);
    assert!(
        ab_regression(&a, &arm(500, 1.03, Some(0.79), Some(0.015)), 0.5, &p).is_none(),
        "within tolerance"
    );
    assert!(
        ab_regression(&a, &arm(50, 3.0, None, None), 0.1, &p).is_none(),
        "too few requests in B"
    );
    assert!(
        ab_regression(&a, &arm(500, f64::NAN, None, None), 0.5, &p).is_none(),
        "NaN p99, split fine"
    );
    assert!(
        ab_regression(&a, &a, 1.5, &p).is_none(),
        "invalid target share"
    );
    assert!(
        ab_regression(
            &arm(500, 0.0, None, None),
            &arm(500, 0.0, None, None),
            0.5,
            &p
        )
        .is_none()
    );
}

#[test]
fn prompt_decay_needs_three_consecutive_periods() {
    let mut d = PromptVersionDecay::new(PromptDecayParams::default());
    for r in [0.90, 0.91, 0.89, 0.90, 0.92, 0.90] {
        assert!(d.observe_period("v7", r).is_none());
    }
    assert!(d.observe_period("v7", 0.80).is_none());
    assert!(d.observe_period("v7", 0.79).is_none());
    let f = d.observe_period("v7", 0.78).unwrap();
    assert_eq!(f.evidence["consecutive_periods"], 3);
    assert!(
        (f.evidence["baseline"].as_f64().unwrap() - 0.903_333).abs() < 1e-4,
        "decayed periods excluded"
    );
    assert!(f.score > 1.0);
    // Another version is independent.
    assert!(d.observe_period("v8", 0.5).is_none());
    // Recovery resets the streak.
    assert!(d.observe_period("v7", 0.90).is_none());
    assert!(d.observe_period("v7", 0.70).is_none());
}

#[test]
fn prompt_decay_edges() {
    let mut d = PromptVersionDecay::new(PromptDecayParams::default());
    for _ in 0..20 {
        assert!(d.observe_period("flat", 0.9).is_none(), "constant");
    }
    assert!(d.observe_period("flat", f64::NAN).is_none());
    let mut young = PromptVersionDecay::new(PromptDecayParams::default());
    for r in [0.9, 0.9, 0.1, 0.1, 0.1] {
        assert!(
            young.observe_period("v1", r).is_none(),
            "baseline not established yet"
        );
    }
    let mut zero = PromptVersionDecay::new(PromptDecayParams::default());
    for _ in 0..10 {
        assert!(zero.observe_period("z", 0.0).is_none());
    }
    let mut capped = PromptVersionDecay::new(PromptDecayParams {
        max_versions: 2,
        ..Default::default()
    });
    for v in ["a", "b", "c"] {
        capped.observe_period(v, 0.9);
    }
    assert_eq!(capped.versions.len(), 2);
    assert!(
        !capped.versions.contains_key("a"),
        "least recently observed forgotten"
    );
}
