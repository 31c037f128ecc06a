// Fixed-bucket histogram with vLLM's default bucket boundaries, rendered as
// cumulative Prometheus buckets.

/// vLLM `time_to_first_token` family.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM `inter_token_latency` family.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM `request_latency` family (e2e, queue, inference, prefill, decode).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM `request_tokens` family: the 1-2-5 series up to `max_model_len`.
pub fn token_buckets(max_model_len: u32) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1u64;
    'outer: loop {
        for m in [1u64, 2, 5] {
            let v = m * scale;
            if v > u64::from(max_model_len) {
                break 'outer;
            }
            out.push(v as f64);
        }
        scale *= 10;
    }
    out
}

/// Observations counted per bucket (non-cumulative) plus sum and count.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    /// (upper bound, cumulative count) pairs, without the +Inf bucket.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.bounds
            .iter()
            .zip(self.counts.iter())
            .scan(0u64, |acc, (b, c)| {
                *acc += c;
                Some((*b, *acc))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five_series() {
        assert_eq!(
            token_buckets(200),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0]
        );
        assert_eq!(token_buckets(8192).last(), Some(&5000.0));
    }

    #[test]
    fn cumulative_counts() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0] {
            h.observe(v);
        }
        let c: Vec<_> = h.cumulative().collect();
        assert_eq!(c, vec![(1.0, 2), (2.0, 3)]);
        assert_eq!((h.count(), h.sum()), (4, 6.0));
    }
}
