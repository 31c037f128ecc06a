// Robust and counting statistics for heavy-tailed per-request data: median and scaled MAD (also
// per side, for skewed or capped data), the one-sided binomial tail and the Wilson upper bound.

/// 1.4826 × MAD estimates σ of a normal distribution.
pub const MAD_TO_SIGMA: f64 = 1.4826;

/// Median and robust σ (1.4826 × median absolute deviation) of finite values; None when empty
/// or when a value is not finite.
pub fn median_mad_sigma(xs: &[f64]) -> Option<(f64, f64)> {
    if xs.is_empty() || !xs.iter().all(|x| x.is_finite()) {
        return None;
    }
    let mut v = xs.to_vec();
    let med = median_in_place(&mut v);
    for x in v.iter_mut() {
        *x = (*x - med).abs();
    }
    let mad = median_in_place(&mut v);
    Some((med, MAD_TO_SIGMA * mad))
}

/// Median and a robust σ for each side: 1.4826 × the median distance from the median of the
/// values strictly below it (and, separately, strictly above it; 0 for an empty side). A cap
/// (many answers at max_tokens) or a long upper tail then cannot narrow or widen the other
/// side. None when empty or not finite.
pub fn median_split_sigma(xs: &[f64]) -> Option<SplitSpread> {
    if xs.is_empty() || !xs.iter().all(|x| x.is_finite()) {
        return None;
    }
    let mut v = xs.to_vec();
    let med = median_in_place(&mut v);
    let (mut lo, mut hi): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    for &x in &v {
        if x < med {
            lo.push(med - x);
        } else if x > med {
            hi.push(x - med);
        }
    }
    let side = |d: &mut Vec<f64>| {
        if d.is_empty() {
            0.0
        } else {
            MAD_TO_SIGMA * median_in_place(d)
        }
    };
    Some(SplitSpread {
        median: med,
        below: side(&mut lo),
        above: side(&mut hi),
    })
}

/// See [`median_split_sigma`]. For symmetric data both sides estimate σ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplitSpread {
    pub median: f64,
    pub below: f64,
    pub above: f64,
}

fn median_in_place(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// P(X ≥ k) for X ~ Binomial(n, p): the one-sided p-value of seeing `k` or more successes
/// (`statrs`: the regularised incomplete beta function, accurate far into the tail).
pub fn binomial_sf(k: u64, n: u64, p: f64) -> f64 {
    use statrs::distribution::{Binomial, DiscreteCDF};
    if k == 0 {
        return 1.0;
    }
    if k > n || p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    // sf(x) is P(X > x).
    Binomial::new(p, n).map_or(f64::NAN, |b| b.sf(k - 1).clamp(0.0, 1.0))
}

/// P(X ≥ k) for X ~ Poisson(λ): the one-sided p-value of seeing `k` or more events where `λ`
/// are expected (`statrs`: the regularised incomplete gamma function).
pub fn poisson_sf(k: u64, lambda: f64) -> f64 {
    use statrs::distribution::{DiscreteCDF, Poisson};
    if k == 0 {
        return 1.0;
    }
    if lambda.is_nan() || lambda <= 0.0 {
        return 0.0;
    }
    // sf(x) is P(X > x).
    Poisson::new(lambda).map_or(f64::NAN, |d| d.sf(k - 1).clamp(0.0, 1.0))
}

/// Wilson score upper bound of a rate from `k` of `n` at normal quantile `z` (one-sided); the
/// one Wilson interval is `sequential::wilson_interval`. None without observations.
pub fn wilson_upper(k: u64, n: u64, z: f64) -> Option<f64> {
    crate::sequential::rate_upper(k.min(n) as f64, n as f64, z)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn exact_sf(k: u64, n: u64, p: f64) -> f64 {
        // Direct summation with binomial coefficients in f64 (small n only).
        let mut c = 1.0f64;
        let mut total = 0.0;
        for i in 0..=n {
            if i > 0 {
                c = c * (n - i + 1) as f64 / i as f64;
            }
            if i >= k {
                total += c * p.powi(i as i32) * (1.0 - p).powi((n - i) as i32);
            }
        }
        total
    }

    #[test]
    fn binomial_tail_matches_direct_sums_and_known_values() {
        for &(k, n, p) in &[
            (0, 10, 0.3),
            (3, 10, 0.3),
            (7, 10, 0.3),
            (10, 10, 0.3),
            (1, 40, 0.01),
            (5, 40, 0.01),
            (20, 60, 0.5),
        ] {
            let (a, b) = (binomial_sf(k, n, p), exact_sf(k, n, p));
            assert!(
                (a - b).abs() <= 1e-10 + 1e-9 * b,
                "k={k} n={n} p={p}: {a} vs {b}"
            );
        }
        // 33 of 1680 at p = 1 %: expected 16.8, a 3.7σ excess; far tail of a big n.
        let p = binomial_sf(33, 1680, 0.01);
        assert!(p > 1e-5 && p < 1e-3, "{p}");
        assert!(binomial_sf(400, 1680, 0.01) < 1e-200);
        assert_eq!(binomial_sf(11, 10, 0.5), 0.0);
        assert_eq!(binomial_sf(1, 10, 0.0), 0.0);
    }

    #[test]
    fn median_mad_and_wilson_known_values() {
        let (m, s) = median_mad_sigma(&[1.0, 2.0, 3.0, 4.0, 100.0]).unwrap();
        assert_eq!(m, 3.0);
        assert!((s - MAD_TO_SIGMA).abs() < 1e-12, "{s}");
        assert!(median_mad_sigma(&[]).is_none());
        assert!(median_mad_sigma(&[1.0, f64::NAN]).is_none());
        assert!(wilson_upper(0, 0, 1.645).is_none());
        let u = wilson_upper(10, 1000, 1.645).unwrap();
        assert!(u > 0.01 && u < 0.02, "{u}");
        assert!(wilson_upper(0, 100, 1.645).unwrap() > 0.0);
        let sp = median_split_sigma(&[1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 4.0, 10.0]).unwrap();
        assert_eq!(
            (sp.median, sp.below, sp.above),
            (3.0, 1.5 * MAD_TO_SIGMA, 4.0 * MAD_TO_SIGMA)
        );
        let flat = median_split_sigma(&[7.0; 9]).unwrap();
        assert_eq!((flat.below, flat.above), (0.0, 0.0));
        // Half the values at a cap: the side below keeps its spread.
        let capped: Vec<f64> = (0..100)
            .map(|i| if i < 50 { f64::from(i) } else { 50.0 })
            .collect();
        let sp = median_split_sigma(&capped).unwrap();
        assert!(sp.above < 1.0 && sp.below > 20.0, "{sp:?}");
    }

    proptest! {
        /// Median/MAD: a few wild values (under a quarter of the sample) move neither far; both
        /// shift and scale exactly with the data.
        #[test]
        fn robust_stats_resist_outliers_and_are_equivariant(
            base in prop::collection::vec(-50.0f64..50.0, 40..200),
            wild in prop::collection::vec(1e6f64..1e9, 0..9),
            shift in -1e3f64..1e3,
            scale in 0.01f64..100.0,
        ) {
            let (m0, s0) = median_mad_sigma(&base).unwrap();
            let mut mixed = base.clone();
            mixed.extend(wild.iter().copied().take(base.len() / 4));
            let (m1, s1) = median_mad_sigma(&mixed).unwrap();
            let (lo, hi) = base.iter().fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
            prop_assert!(m1 >= lo && m1 <= hi, "median left the clean data's range: {m1}");
            prop_assert!(s1 <= (hi - lo) * MAD_TO_SIGMA + 1e-9, "MAD blew up: {s1} vs {s0}");
            let moved: Vec<f64> = base.iter().map(|x| x * scale + shift).collect();
            let (m2, s2) = median_mad_sigma(&moved).unwrap();
            prop_assert!((m2 - (m0 * scale + shift)).abs() < 1e-6 * (1.0 + m2.abs()));
            prop_assert!((s2 - s0 * scale).abs() < 1e-6 * (1.0 + s2));
            // Split sides: the mirror image swaps them; a symmetric sample has equal sides; wild
            // values above the median leave the side below it within the clean data's range.
            let sp = median_split_sigma(&base).unwrap();
            let mirrored: Vec<f64> = base.iter().map(|x| -x).collect();
            let sm = median_split_sigma(&mirrored).unwrap();
            prop_assert!((sp.below - sm.above).abs() < 1e-9 && (sp.above - sm.below).abs() < 1e-9);
            let mut sym = base.clone();
            sym.extend(mirrored.iter().copied());
            let ss = median_split_sigma(&sym).unwrap();
            prop_assert!((ss.below - ss.above).abs() < 1e-9, "{ss:?}");
            let sx = median_split_sigma(&mixed).unwrap();
            prop_assert!(sx.below <= (hi - lo) * MAD_TO_SIGMA + 1e-9);
        }

        /// The binomial tail is a probability, falls as k rises and rises with p.
        #[test]
        fn binomial_tail_is_monotone(n in 1u64..3000, kf in 0.0f64..1.0, p in 0.001f64..0.5) {
            let k = (kf * n as f64) as u64;
            let (a, b) = (binomial_sf(k, n, p), binomial_sf(k + 1, n, p));
            prop_assert!((0.0..=1.0).contains(&a) && b <= a + 1e-12, "k={k} n={n} p={p}: {a} then {b}");
            prop_assert!(binomial_sf(k, n, (p * 1.5).min(0.99)) + 1e-12 >= a);
        }
    }
}
