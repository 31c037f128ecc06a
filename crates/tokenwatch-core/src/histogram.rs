// Quantiles from cumulative-bucket histograms (Prometheus/OTLP explicit buckets), computed
// over a window from bucket deltas, with counter resets handled and the bucket error stated.

/// Increase of a cumulative counter between two readings; a decrease means the counter was
/// reset (process restart), and the new reading is then the whole increase.
pub fn counter_delta(previous: f64, current: f64) -> f64 {
    if !previous.is_finite() || !current.is_finite() {
        return 0.0;
    }
    if current >= previous {
        current - previous
    } else {
        current.max(0.0)
    }
}

/// A cumulative histogram reading: upper bounds (ascending, the last may be +Inf) with the
/// cumulative count of observations ≤ each bound, plus sum and count.
#[derive(Debug, Clone, PartialEq)]
pub struct CumulativeHistogram {
    pub bounds: Vec<f64>,
    pub cumulative: Vec<f64>,
    pub sum: f64,
    pub count: f64,
}

/// A quantile estimated from buckets: the value (linear interpolation inside the bucket, as
/// PromQL's `histogram_quantile`) and the bucket it fell in, whose width bounds the error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketQuantile {
    pub value: f64,
    pub bucket_lower: f64,
    pub bucket_upper: f64,
}

impl BucketQuantile {
    /// Largest possible absolute error: the distance to the farther bucket edge.
    pub fn max_abs_error(&self) -> f64 {
        if self.bucket_upper.is_infinite() {
            return f64::INFINITY;
        }
        (self.value - self.bucket_lower).max(self.bucket_upper - self.value)
    }
}

impl CumulativeHistogram {
    /// A histogram of `per_bucket` observations in the buckets whose upper bounds are `bounds`
    /// (the last one +Inf), as a scrape's increase reads; the sum is not known (0).
    pub fn from_bucket_counts(bounds: &[f64], per_bucket: &[f64]) -> CumulativeHistogram {
        let cumulative: Vec<f64> = per_bucket
            .iter()
            .scan(0.0, |running, n| {
                *running += n;
                Some(*running)
            })
            .collect();
        let count = cumulative.last().copied().unwrap_or(0.0);
        CumulativeHistogram {
            bounds: bounds.to_vec(),
            cumulative,
            sum: 0.0,
            count,
        }
    }

    /// Observations between `earlier` and `self`, bucket by bucket. When the bucket layout
    /// changed, or any bucket went down (a reset), `self` alone is the window.
    pub fn delta_since(&self, earlier: &CumulativeHistogram) -> CumulativeHistogram {
        let same_layout = earlier.bounds == self.bounds;
        let reset = !same_layout
            || self.count < earlier.count
            || self
                .cumulative
                .iter()
                .zip(&earlier.cumulative)
                .any(|(now, before)| now < before);
        if reset {
            return self.clone();
        }
        CumulativeHistogram {
            bounds: self.bounds.clone(),
            cumulative: self
                .cumulative
                .iter()
                .zip(&earlier.cumulative)
                .map(|(a, b)| a - b)
                .collect(),
            sum: (self.sum - earlier.sum).max(0.0),
            count: self.count - earlier.count,
        }
    }

    /// Observations above `t`, interpolating linearly inside the bucket that holds it (as the
    /// quantiles do); None when empty or malformed. Above the largest finite bound: the +Inf
    /// bucket's count is taken as all above.
    pub fn count_above(&self, t: f64) -> Option<f64> {
        if self.bounds.len() != self.cumulative.len() || self.bounds.is_empty() || !t.is_finite() {
            return None;
        }
        let total = *self.cumulative.last()?;
        let idx = match self.bounds.iter().position(|b| *b >= t) {
            Some(i) => i,
            None => return Some(0.0),
        };
        let (lower, upper, below, in_bucket) = self.bucket(idx);
        let share_below_t = if upper.is_infinite() || upper <= lower {
            0.0
        } else {
            ((t - lower) / (upper - lower)).clamp(0.0, 1.0)
        };
        Some((total - below - in_bucket * share_below_t).max(0.0))
    }

    /// The q-quantile (0 < q < 1). None when empty or malformed. When it falls in the +Inf
    /// bucket the largest finite bound is returned (as PromQL does) and the error is unbounded.
    pub fn quantile(&self, q: f64) -> Option<BucketQuantile> {
        if !(0.0..=1.0).contains(&q)
            || self.bounds.len() != self.cumulative.len()
            || self.bounds.is_empty()
        {
            return None;
        }
        let total = *self.cumulative.last()?;
        // Also refuses NaN totals.
        if total.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return None;
        }
        let rank = q * total;
        let idx = self.cumulative.iter().position(|c| *c >= rank)?;
        let (lower, upper, below, in_bucket) = self.bucket(idx);
        if upper.is_infinite() {
            return Some(BucketQuantile {
                value: lower,
                bucket_lower: lower,
                bucket_upper: upper,
            });
        }
        let value = if in_bucket > 0.0 {
            lower + (upper - lower) * ((rank - below) / in_bucket)
        } else {
            upper
        };
        Some(BucketQuantile {
            value,
            bucket_lower: lower,
            bucket_upper: upper,
        })
    }

    /// Bucket `idx` (a valid index): its lower and upper bound, the observations below it and
    /// in it.
    fn bucket(&self, idx: usize) -> (f64, f64, f64, f64) {
        let upper = self.bounds[idx];
        let lower = if idx == 0 {
            0.0_f64.min(upper)
        } else {
            self.bounds[idx - 1]
        };
        let below = if idx == 0 {
            0.0
        } else {
            self.cumulative[idx - 1]
        };
        (lower, upper, below, self.cumulative[idx] - below)
    }

    /// Adds `other`'s observations bucket by bucket (the sum of two windows); false, and nothing
    /// added, when the bucket layouts differ.
    pub fn add(&mut self, other: &CumulativeHistogram) -> bool {
        if self.bounds != other.bounds || self.cumulative.len() != other.cumulative.len() {
            return false;
        }
        for (a, b) in self.cumulative.iter_mut().zip(&other.cumulative) {
            *a += b;
        }
        self.sum += other.sum;
        self.count += other.count;
        true
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_bucket_counts_accumulates_the_buckets() {
        let h =
            CumulativeHistogram::from_bucket_counts(&[0.1, 0.5, f64::INFINITY], &[2.0, 3.0, 1.0]);
        assert_eq!(h.cumulative, vec![2.0, 5.0, 6.0]);
        assert_eq!(h.count, 6.0);
        assert_eq!(h.bounds, vec![0.1, 0.5, f64::INFINITY]);
        assert_eq!(CumulativeHistogram::from_bucket_counts(&[], &[]).count, 0.0);
    }

    #[test]
    fn add_sums_windows_of_one_layout_only() {
        let mut a = h(&[1.0, 2.0, 3.0, 4.0], 1.0);
        assert!(a.add(&h(&[0.0, 1.0, 1.0, 2.0], 0.5)));
        assert_eq!(
            (a.cumulative.clone(), a.sum, a.count),
            (vec![1.0, 3.0, 4.0, 6.0], 1.5, 6.0)
        );
        let other = CumulativeHistogram {
            bounds: vec![1.0, f64::INFINITY],
            cumulative: vec![1.0, 1.0],
            sum: 1.0,
            count: 1.0,
        };
        assert!(!a.add(&other));
        assert_eq!(a.count, 6.0, "nothing added");
    }

    #[test]
    fn count_above_interpolates_inside_the_bucket_like_the_quantiles() {
        let h = CumulativeHistogram {
            bounds: vec![1.0, 2.0, f64::INFINITY],
            cumulative: vec![10.0, 30.0, 40.0],
            sum: 0.0,
            count: 40.0,
        };
        assert_eq!(h.count_above(0.5), Some(35.0));
        assert_eq!(h.count_above(1.5), Some(20.0));
        assert_eq!(h.count_above(2.0), Some(10.0));
        assert_eq!(
            h.count_above(5.0),
            Some(10.0),
            "the +Inf bucket is all above"
        );
        // The quantile's value has the matching share above it.
        let q = h.quantile(0.75).unwrap().value;
        assert!((h.count_above(q).unwrap() - 10.0).abs() < 1e-9, "{q}");
        assert_eq!(h.count_above(f64::NAN), None);
    }

    fn h(cum: &[f64], sum: f64) -> CumulativeHistogram {
        CumulativeHistogram {
            bounds: vec![0.1, 0.5, 1.0, f64::INFINITY],
            cumulative: cum.to_vec(),
            sum,
            count: *cum.last().unwrap(),
        }
    }

    #[test]
    fn quantile_interpolates_like_promql() {
        let x = h(&[10.0, 60.0, 100.0, 100.0], 40.0);
        let p50 = x.quantile(0.5).unwrap();
        assert!((p50.value - 0.42).abs() < 1e-9, "{p50:?}");
        assert_eq!((p50.bucket_lower, p50.bucket_upper), (0.1, 0.5));
        assert!(p50.max_abs_error() <= 0.4);
        assert_eq!(x.quantile(1.0).unwrap().bucket_upper, 1.0);
        assert_eq!(x.mean(), Some(0.4));
    }

    #[test]
    fn inf_bucket_and_empty() {
        let x = h(&[0.0, 0.0, 0.0, 5.0], 50.0);
        let q = x.quantile(0.99).unwrap();
        assert_eq!(q.value, 1.0);
        assert!(q.max_abs_error().is_infinite());
        assert!(h(&[0.0, 0.0, 0.0, 0.0], 0.0).quantile(0.5).is_none());
    }

    #[test]
    fn deltas_and_resets() {
        let a = h(&[10.0, 20.0, 30.0, 30.0], 10.0);
        let b = h(&[10.0, 25.0, 40.0, 40.0], 16.0);
        let d = b.delta_since(&a);
        assert_eq!(d.cumulative, vec![0.0, 5.0, 10.0, 10.0]);
        assert_eq!(d.count, 10.0);
        let restarted = h(&[1.0, 1.0, 1.0, 1.0], 0.05);
        assert_eq!(restarted.delta_since(&b), restarted);
        assert_eq!(counter_delta(10.0, 15.0), 5.0);
        assert_eq!(counter_delta(10.0, 3.0), 3.0);
        assert_eq!(counter_delta(f64::NAN, 3.0), 0.0);
    }
}
