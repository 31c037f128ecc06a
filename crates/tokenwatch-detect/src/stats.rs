// Numeric helpers shared by the detectors: finite filtering, mean/median, Pearson
// correlation, least-squares line fit, contiguous trailing segments and the two-sample KS test.

/// Intervals longer than this many times the median sampling interval are a gap.
pub(crate) const GAP_FACTOR: f64 = 3.0;

pub(crate) fn mean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || !xs.iter().all(|x| x.is_finite()) {
        return None;
    }
    Some(xs.iter().sum::<f64>() / xs.len() as f64)
}

pub(crate) fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || !xs.iter().all(|x| x.is_finite()) {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Pearson correlation; None when lengths differ, under two points, or non-finite; 0 when
/// either side is constant (nothing to correlate with).
pub(crate) fn pearson(xs: &[f64], ys: &[f64]) -> Option<f64> {
    if xs.len() != ys.len() || xs.len() < 2 {
        return None;
    }
    let (mx, my) = (mean(xs)?, mean(ys)?);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
        syy += (y - my) * (y - my);
    }
    if sxx <= 0.0 || syy <= 0.0 {
        return Some(0.0);
    }
    Some((sxy / (sxx.sqrt() * syy.sqrt())).clamp(-1.0, 1.0))
}

/// Least-squares line y = intercept + slope·x with its coefficient of determination.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearFit {
    pub slope: f64,
    pub intercept: f64,
    /// R² in [0, 1]; 1.0 when y is exactly linear, 0.0 when y is constant.
    pub r2: f64,
}

/// Fits a line through the points; None under two points, non-finite values or constant x.
pub fn linear_fit(points: &[(f64, f64)]) -> Option<LinearFit> {
    if points.len() < 2 || !points.iter().all(|(x, y)| x.is_finite() && y.is_finite()) {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in points {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
        syy += (y - my) * (y - my);
    }
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = if syy <= 0.0 {
        0.0
    } else {
        ((sxy * sxy) / (sxx * syy)).clamp(0.0, 1.0)
    };
    Some(LinearFit {
        slope,
        intercept: my - slope * mx,
        r2,
    })
}

/// The longest suffix of `series` with finite values, strictly ascending time and no gap
/// (an interval over `GAP_FACTOR` × the median interval of the whole series).
pub(crate) fn trailing_segment(series: &[(i64, f64)]) -> &[(i64, f64)] {
    let mut intervals: Vec<f64> = series
        .windows(2)
        .map(|w| (w[1].0 - w[0].0) as f64)
        .filter(|d| *d > 0.0)
        .collect();
    intervals.sort_by(f64::total_cmp);
    let limit = intervals.get(intervals.len() / 2).map(|m| m * GAP_FACTOR);
    let mut start = series.len();
    while start > 0 {
        let (t, v) = series[start - 1];
        if !v.is_finite() {
            break;
        }
        if start < series.len() {
            let dt = (series[start].0 - t) as f64;
            if dt <= 0.0 || limit.is_some_and(|l| dt > l) {
                break;
            }
        }
        start -= 1;
    }
    &series[start..]
}

/// Survival function of the Kolmogorov distribution, P(K > x): the asymptotic p-value of a KS
/// statistic scaled by √n. Uses the Jacobi theta form for small x and the alternating series
/// 2 Σ (−1)^(k−1) e^(−2k²x²) otherwise; both converge in a few terms. Clamped to [0, 1].
pub fn kolmogorov_sf(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        return 1.0;
    }
    if x.is_infinite() {
        return 0.0;
    }
    let p = if x < 1.18 {
        let f = -std::f64::consts::PI.powi(2) / (8.0 * x * x);
        let mut sum = 0.0;
        for k in 1..=50u32 {
            let odd = f64::from(2 * k - 1);
            let term = (f * odd * odd).exp();
            sum += term;
            if term < 1e-17 * sum.max(1e-300) {
                break;
            }
        }
        1.0 - (2.0 * std::f64::consts::PI).sqrt() / x * sum
    } else {
        let mut sum = 0.0;
        for k in 1..=100u32 {
            let kf = f64::from(k);
            let term = (-2.0 * kf * kf * x * x).exp();
            sum += if k % 2 == 1 { term } else { -term };
            if term < 1e-17 {
                break;
            }
        }
        2.0 * sum
    };
    p.clamp(0.0, 1.0)
}

/// Two-sample Kolmogorov–Smirnov test on finite values: (D, asymptotic two-sided p-value with
/// n_eff = n·m/(n+m)). None when either sample is empty or contains a non-finite value.
pub fn ks_two_sample(a: &[f64], b: &[f64]) -> Option<(f64, f64)> {
    if a.is_empty() || b.is_empty() || !a.iter().chain(b).all(|x| x.is_finite()) {
        return None;
    }
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (n, m) = (a.len() as f64, b.len() as f64);
    let (mut i, mut j, mut d) = (0usize, 0usize, 0.0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / n - j as f64 / m).abs());
    }
    let en = n * m / (n + m);
    Some((d, kolmogorov_sf(d * en.sqrt())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kolmogorov_known_values() {
        // Reference values of the Kolmogorov distribution's survival function.
        for (x, q) in [
            (0.5, 0.963_945_243_664_875_1),
            (1.0, 0.269_999_671_677_354_6),
            (1.36, 0.049_485_876_755_377_88),
            (2.0, 0.000_670_925_255_779_695_3),
        ] {
            assert!(
                (kolmogorov_sf(x) - q).abs() < 1e-9,
                "x={x}: {} vs {q}",
                kolmogorov_sf(x)
            );
        }
        // Both branches agree where they meet.
        assert!((kolmogorov_sf(1.179_999) - kolmogorov_sf(1.18)).abs() < 1e-6);
        assert_eq!(kolmogorov_sf(0.0), 1.0);
        assert_eq!(kolmogorov_sf(f64::NAN), 1.0);
        assert_eq!(kolmogorov_sf(f64::INFINITY), 0.0);
        assert!(kolmogorov_sf(0.05) > 0.999_999);
    }

    #[test]
    fn ks_statistic_on_known_samples() {
        let a: Vec<f64> = (0..10).map(f64::from).collect();
        let b: Vec<f64> = (5..15).map(f64::from).collect();
        let (d, _) = ks_two_sample(&a, &b).unwrap();
        assert!((d - 0.5).abs() < 1e-12);
        let (d, p) = ks_two_sample(&a, &a).unwrap();
        assert_eq!(d, 0.0);
        assert_eq!(p, 1.0);
        assert!(ks_two_sample(&[], &a).is_none());
        assert!(ks_two_sample(&[f64::NAN], &a).is_none());
    }

    #[test]
    fn line_fit_and_segments() {
        let pts: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 * f64::from(i) + 1.0))
            .collect();
        let f = linear_fit(&pts).unwrap();
        assert!((f.slope - 3.0).abs() < 1e-12 && (f.r2 - 1.0).abs() < 1e-12);
        assert!(linear_fit(&[(1.0, 1.0), (1.0, 2.0)]).is_none());
        let s = [
            (0, 1.0),
            (1000, 1.0),
            (2000, 1.0),
            (10_000, 1.0),
            (11_000, 1.0),
            (12_000, 2.0),
        ];
        assert_eq!(trailing_segment(&s).len(), 3);
        let s = [(0, 1.0), (1000, f64::NAN), (2000, 1.0), (3000, 1.0)];
        assert_eq!(trailing_segment(&s).len(), 2);
        assert!(trailing_segment(&[]).is_empty());
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(pearson(&[1.0, 2.0, 3.0], &[5.0, 5.0, 5.0]), Some(0.0));
    }
}
