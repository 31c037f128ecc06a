// Tests of the latency detectors: tail quantiles on small windows, spike against a reference
// period, peer comparison, absolute and context-aware thresholds.

use super::*;

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// `n` deterministic log-normal-ish values around `median` (σ ≈ 0.5 in log space).
fn lognormal(n: usize, median: f64, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            let mut z = 0.0;
            for _ in 0..4 {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                z += (x >> 11) as f64 / (1u64 << 53) as f64;
            }
            // Sum of 4 uniforms: mean 2, σ ≈ 0.577 → z-score.
            median * (0.5 * (z - 2.0) / 0.577).exp()
        })
        .collect()
}

#[test]
fn effective_quantile_keeps_a_tail_above_it() {
    assert_eq!(effective_quantile(0.99, 2000, 10), Some(0.99));
    assert!((effective_quantile(0.99, 200, 10).unwrap() - 0.95).abs() < 1e-12);
    assert_eq!(effective_quantile(0.99, 20, 10), Some(0.5));
    assert_eq!(effective_quantile(0.99, 10, 10), None);
    assert_eq!(effective_quantile(0.99, 0, 10), None);
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(sorted_quantile(&v, 0.99), Some(99.0));
    assert_eq!(sorted_quantile(&v, 0.95), Some(95.0));
    assert_eq!(sorted_quantile(&[], 0.5), None);
    assert_eq!(pct_label(0.99), "99");
    assert_eq!(pct_label(0.975), "97.5");
}

#[test]
fn spike_fires_on_a_clear_jump_with_enough_samples() {
    let p = LatencySpikeParams::default();
    let base = sorted(lognormal(1000, 0.2, 1));
    let cur = sorted(
        lognormal(200, 0.2, 2)
            .into_iter()
            .map(|x| x * 5.0)
            .collect(),
    );
    let f = latency_spike(&cur, &base, &p).expect("×5 is a spike");
    let ratio = f.evidence["ratio"].as_f64().unwrap();
    assert!(ratio > 4.0 && ratio < 6.5, "{ratio}");
    assert!((f.score - ratio / 2.5).abs() < 1e-9);
    // 200 requests: the P99 is lowered to P95 so 10 requests lie above it.
    assert!((f.evidence["quantile"].as_f64().unwrap() - 0.95).abs() < 1e-9);
    assert!(f.summary.contains("P95"), "{}", f.summary);
}

#[test]
fn spike_negative_and_edges() {
    let p = LatencySpikeParams::default();
    let base = sorted(lognormal(1000, 0.2, 3));
    let same = sorted(lognormal(200, 0.2, 4));
    assert!(
        latency_spike(&same, &base, &p).is_none(),
        "same distribution"
    );
    let doubled = sorted(same.iter().map(|x| x * 2.0).collect());
    assert!(
        latency_spike(&doubled, &base, &p).is_none(),
        "2× is under 2.5×"
    );
    // A few very slow single requests do not move a tail with 10 requests above it.
    let mut outliers = same.clone();
    for v in outliers.iter_mut().take(6) {
        *v *= 50.0;
    }
    let outliers = sorted(outliers);
    assert!(
        latency_spike(&outliers, &base, &p).is_none(),
        "6 slow requests"
    );
    let few = sorted(lognormal(49, 1.0, 5));
    assert!(
        latency_spike(&few, &base, &p).is_none(),
        "too few current samples"
    );
    assert!(
        latency_spike(&doubled, &few, &p).is_none(),
        "too few baseline samples"
    );
    let zeros = vec![0.0; 100];
    assert!(latency_spike(&same, &zeros, &p).is_none(), "zero baseline");
    let inf = sorted(vec![f64::INFINITY; 100]);
    assert!(latency_spike(&inf, &base, &p).is_none());
    for bad in [
        LatencySpikeParams {
            ratio: 1.0,
            ..p.clone()
        },
        LatencySpikeParams {
            min_samples: 10,
            ..p.clone()
        },
        LatencySpikeParams {
            baseline_windows: 0,
            ..p.clone()
        },
        LatencySpikeParams {
            peer_ratio: f64::NAN,
            ..p.clone()
        },
        LatencySpikeParams {
            max_hold_s: 0.0,
            ..p.clone()
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

#[test]
fn peers_compare_at_a_common_quantile() {
    let a = sorted(lognormal(200, 0.2, 6));
    let b = sorted(lognormal(400, 0.2, 7));
    let c = sorted(lognormal(300, 0.2, 8));
    let slow = sorted(
        lognormal(200, 0.2, 9)
            .into_iter()
            .map(|x| x * 4.0)
            .collect(),
    );
    let cmp = compare_with_peers(&slow, &[&a, &b, &c], 50, 10).unwrap();
    assert_eq!(cmp.peers, 3);
    assert!((cmp.quantile - 0.95).abs() < 1e-9, "{}", cmp.quantile);
    assert!(cmp.ratio > 3.0 && cmp.ratio < 5.5, "{}", cmp.ratio);
    let normal = compare_with_peers(&a, &[&b, &c, &slow], 50, 10).unwrap();
    assert!(
        normal.ratio < 1.5,
        "the median ignores one slow peer: {}",
        normal.ratio
    );
    let tiny = sorted(lognormal(20, 0.2, 10));
    assert!(
        compare_with_peers(&slow, &[&tiny], 50, 10).is_none(),
        "no usable peer"
    );
    assert!(
        compare_with_peers(&tiny, &[&a], 50, 10).is_none(),
        "own window too small"
    );
    let f = cmp.annotate(Finding::new(1.0, "x"));
    assert_eq!(f.evidence["peers"], 3);
}

#[test]
fn absolute_latency_threshold() {
    let p = AbsoluteLatencyParams::default();
    let v: Vec<f64> = (1..=100).map(|i| i as f64 * 0.03).collect();
    // 100 requests, 10 above the quantile: P90 = 2.7 s.
    let f = absolute_latency(&v, &p).unwrap();
    assert!((f.score - 2.7 / 2.0).abs() < 1e-9, "{}", f.score);
    assert!((f.evidence["quantile"].as_f64().unwrap() - 0.9).abs() < 1e-12);
    let fast: Vec<f64> = (1..=100).map(|i| i as f64 * 0.02).collect();
    assert!(absolute_latency(&fast, &p).is_none(), "P90 = 1.8 s");
    // Three slow requests in 100 are not a slow P99 at this size.
    let mut spiky = fast.clone();
    for v in spiky.iter_mut().rev().take(3) {
        *v = 9.0;
    }
    assert!(absolute_latency(&spiky, &p).is_none());
    assert!(absolute_latency(&v[..19], &p).is_none(), "too few samples");
    assert!(absolute_latency(&[f64::NAN; 30], &p).is_none());
    assert!(
        AbsoluteLatencyParams {
            min_samples: 5,
            ..p
        }
        .validate()
        .is_err()
    );
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
    let f = context_aware_threshold(5.0, 1000.0, Some(0.5), &p).unwrap();
    assert!((f.score - 5.0 / 3.96).abs() < 1e-9);
    assert!(f.summary.contains("at 50% KV-cache usage"), "{}", f.summary);
    assert!(context_aware_threshold(3.0, 1000.0, Some(0.5), &p).is_none());
    assert!(context_aware_threshold(f64::NAN, 1000.0, Some(0.5), &p).is_none());
    assert!(context_aware_threshold(5.0, f64::NAN, Some(0.5), &p).is_none());
    assert!(context_aware_threshold(5.0, 1000.0, Some(f64::NAN), &p).is_none());
    // No KV-cache usage scraped: the empty cache's (most lenient) limit, said as such — not
    // "0% KV-cache usage", and no usage among the finding's values.
    // 1.2 s × 3 × 1.5 = 5.4 s.
    assert!(context_aware_threshold(5.0, 1000.0, None, &p).is_none());
    let f = context_aware_threshold(6.0, 1000.0, None, &p).unwrap();
    assert!((f.score - 6.0 / 5.4).abs() < 1e-9);
    assert!(
        f.summary.contains("no KV-cache usage scraped") && !f.summary.contains("0%"),
        "{}",
        f.summary
    );
    assert!(
        ContextThresholdParams {
            kv_offset: 0.5,
            ..p.clone()
        }
        .validate()
        .is_err()
    );
    assert!(
        ContextThresholdParams {
            min_tail_samples: 0,
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
            ..LatencySpikeParams::default()
        }
    );
    assert_eq!(p.min_samples, 50);
    assert!(serde_json::from_str::<LatencySpikeParams>(r#"{"ratoi": 3.0}"#).is_err());
}

#[test]
fn the_fast_path_finds_a_slow_third_within_a_dozen_requests() {
    let p = LatencySpikeParams::default();
    let base = sorted(lognormal(300, 0.1, 1));
    // 15 requests in the short window, 5 of them ten times slower.
    let mut cur = lognormal(15, 0.1, 2);
    for v in cur.iter_mut().take(5) {
        *v *= 10.0;
    }
    let f = latency_exceedance(&cur, &base, &p).expect("a slow third is found");
    // (One of the five, drawn fast, stays under the line.)
    assert_eq!(f.evidence["slow_requests"], 4, "{f:?}");
    assert!(f.evidence["p_value"].as_f64().unwrap() < p.fast_alpha);
    assert!(f.summary.contains("4 of the last 15"), "{}", f.summary);
    // Healthy short windows, many draws: nothing.
    for seed in 10..400 {
        let cur = lognormal(15, 0.1, seed);
        assert!(latency_exceedance(&cur, &base, &p).is_none(), "seed {seed}");
    }
    // Four far beyond the line are enough against a reference without a tail there; two,
    // however slow, are not; nor a small reference, nor the path switched off.
    let mut few = lognormal(15, 0.1, 3);
    for v in few.iter_mut().take(4) {
        *v *= 50.0;
    }
    assert!(latency_exceedance(&few, &base, &p).is_some());
    few[2] /= 50.0;
    few[3] /= 50.0;
    assert!(latency_exceedance(&few, &base, &p).is_none());
    assert!(latency_exceedance(&cur, &base[..40], &p).is_none());
    let off = LatencySpikeParams {
        fast_window_s: 0.0,
        ..p.clone()
    };
    assert!(latency_exceedance(&cur, &base, &off).is_none());
    // A reference whose own tail reaches the line (heavy-tailed traffic) needs more.
    let mut heavy = base.clone();
    for v in heavy.iter_mut().rev().take(30) {
        *v *= 8.0;
    }
    let heavy = sorted(heavy);
    let mut four = lognormal(40, 0.1, 4);
    for v in four.iter_mut().take(5) {
        *v *= 10.0;
    }
    assert!(latency_exceedance(&four, &heavy, &p).is_none());
    assert!(latency_exceedance(&four, &base, &p).is_some());
}
