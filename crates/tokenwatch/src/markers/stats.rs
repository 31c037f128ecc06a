// Estimates with 95 % confidence intervals for before/after comparisons: distribution-free
// (order-statistic) intervals for quantiles — of raw values, or of a runtime's bucket histogram,
// widened to the buckets — Wilson intervals for rates, normal ones for means.

use serde::Serialize;

/// z of a two-sided 95 % interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// A point estimate, its 95 % interval and the sample it came from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
    pub n: u64,
}

/// Which way is good for a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
    /// Neither (tokens per request): a separation is reported as `changed`.
    Neither,
}

/// The `p` quantile (0..1) of `xs` with a distribution-free interval: the order statistics at
/// ranks n·p ∓ z·√(n·p·(1−p)) (normal approximation of the binomial count below the quantile).
/// None for fewer than 2 finite values.
pub fn quantile_ci(xs: &[f64], p: f64) -> Option<Estimate> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let last = v.len() - 1;
    let at = |rank: f64| v[(rank.max(0.0) as usize).min(last)];
    let half = Z95 * (n * p * (1.0 - p)).sqrt();
    Some(Estimate {
        value: at((p * n).ceil() - 1.0),
        lo: at((n * p - half).floor() - 1.0),
        hi: at((n * p + half).ceil() - 1.0),
        n: v.len() as u64,
    })
}

/// The `p` quantile of a bucket histogram (a runtime's own, `CumulativeHistogram`) with the
/// interval of [`quantile_ci`] taken to the buckets: from the lower bound of the bucket holding
/// rank n·p − z·√(n·p·(1−p)) to the upper bound of the one holding rank n·p + z·√(…) — sampling
/// and bucket error together. `hi` is +∞ where that rank falls in the +Inf bucket. Also the
/// bucket the estimate lies in. None for fewer than 2 observations.
pub fn histogram_quantile_ci(
    h: &tokenwatch_core::histogram::CumulativeHistogram,
    p: f64,
) -> Option<(Estimate, tokenwatch_core::histogram::BucketQuantile)> {
    let n = h.count;
    if !n.is_finite() || n < 2.0 {
        return None;
    }
    let at = h.quantile(p)?;
    let half = Z95 * (n * p * (1.0 - p)).sqrt();
    let lo = h.quantile(((n * p - half) / n).clamp(0.0, 1.0))?;
    let hi = h.quantile(((n * p + half) / n).clamp(0.0, 1.0))?;
    Some((
        Estimate {
            value: at.value,
            lo: lo.bucket_lower.min(at.value),
            hi: hi.bucket_upper.max(at.value),
            n: n.round() as u64,
        },
        at,
    ))
}

/// The rate k/n with its Wilson score interval. None when n is 0.
pub fn wilson(k: u64, n: u64) -> Option<Estimate> {
    let (kf, nf) = (k.min(n) as f64, n as f64);
    let (lo, hi) = tokenwatch_detect::sequential::wilson_interval(kf, nf, Z95)?;
    Some(Estimate {
        value: kf / nf,
        // Exact at the ends (0 of n, n of n), where rounding would leave a hair off 0 or 1.
        lo: if kf == 0.0 { 0.0 } else { lo },
        hi: if kf == nf { 1.0 } else { hi },
        n,
    })
}

/// The mean with a normal interval (mean ± z·s/√n). None for fewer than 2 finite values.
pub fn mean_ci(xs: &[f64]) -> Option<Estimate> {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let half = Z95 * (var / n).sqrt();
    Some(Estimate {
        value: mean,
        lo: mean - half,
        hi: mean + half,
        n: v.len() as u64,
    })
}

/// `better`, `worse` or `changed` (for [`Better::Neither`]) when the intervals do not overlap;
/// `no_change` when they do; `insufficient_data` when a side has no estimate.
pub fn verdict(
    before: Option<&Estimate>,
    after: Option<&Estimate>,
    better: Better,
) -> &'static str {
    let (Some(b), Some(a)) = (before, after) else {
        return "insufficient_data";
    };
    let up = a.lo > b.hi;
    let down = a.hi < b.lo;
    match (up, down, better) {
        (false, false, _) => "no_change",
        (_, _, Better::Neither) => "changed",
        (true, _, Better::Higher) | (_, true, Better::Lower) => "better",
        _ => "worse",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interval_brackets_the_estimate_and_narrows_with_n() {
        let small: Vec<f64> = (1..=20).map(f64::from).collect();
        let big: Vec<f64> = (1..=2000).map(|i| f64::from(i) / 100.0).collect();
        let s = quantile_ci(&small, 0.5).unwrap();
        let b = quantile_ci(&big, 0.5).unwrap();
        assert_eq!(s.value, 10.0);
        assert!(s.lo <= s.value && s.value <= s.hi && s.lo < s.hi, "{s:?}");
        // Width relative to the range shrinks as the sample grows.
        assert!((b.hi - b.lo) / 20.0 < (s.hi - s.lo) / 20.0, "{s:?} {b:?}");
        // Known ranks for n = 20, p = 0.5: 10 ∓ 4.38 → order statistics 5 and 15.
        assert_eq!((s.lo, s.hi), (5.0, 15.0));
        let p95 = quantile_ci(&big, 0.95).unwrap();
        assert!((p95.value - 19.0).abs() < 0.01 && p95.hi <= 20.0 && p95.lo < p95.value);
        assert!(quantile_ci(&[1.0], 0.5).is_none());
        assert!(quantile_ci(&[f64::NAN, 1.0], 0.5).is_none());
    }

    #[test]
    fn wilson_matches_the_textbook_value() {
        // 10 of 100: Wilson 95 % interval ≈ [0.0552, 0.1744].
        let e = wilson(10, 100).unwrap();
        assert!(
            (e.lo - 0.0552).abs() < 1e-3 && (e.hi - 0.1744).abs() < 1e-3,
            "{e:?}"
        );
        let zero = wilson(0, 50).unwrap();
        assert_eq!(zero.lo, 0.0);
        assert!(zero.hi > 0.05 && zero.hi < 0.08, "{zero:?}");
        assert!(wilson(0, 0).is_none());
    }

    #[test]
    fn mean_interval_and_verdicts() {
        let e = mean_ci(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(e.value, 2.5);
        assert!((e.hi - e.value - Z95 * (5.0f64 / 3.0 / 4.0).sqrt()).abs() < 1e-12);
        let lo = Estimate {
            value: 1.0,
            lo: 0.9,
            hi: 1.1,
            n: 10,
        };
        let hi = Estimate {
            value: 2.0,
            lo: 1.9,
            hi: 2.1,
            n: 10,
        };
        let near = Estimate {
            value: 1.05,
            lo: 0.95,
            hi: 1.15,
            n: 10,
        };
        assert_eq!(verdict(Some(&lo), Some(&hi), Better::Lower), "worse");
        assert_eq!(verdict(Some(&lo), Some(&hi), Better::Higher), "better");
        assert_eq!(verdict(Some(&hi), Some(&lo), Better::Lower), "better");
        assert_eq!(verdict(Some(&lo), Some(&near), Better::Lower), "no_change");
        assert_eq!(verdict(Some(&lo), Some(&hi), Better::Neither), "changed");
        assert_eq!(verdict(None, Some(&hi), Better::Lower), "insufficient_data");
    }
}
