// Seeded per-request draws: output length (lognormal around a median) and the
// fault effects a request gets (latency spike, stall point, drift).

use std::time::Duration;

use rand::Rng;

use super::seq::Sequence;
use crate::fault::{BLOWUP_HARD_LIMIT, Effects};
use crate::metrics::FinishReason;

/// Spread of the lognormal output-length distribution (sigma of ln L).
const LENGTH_SIGMA: f64 = 0.6;

/// Standard normal draw (Box–Muller).
fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u1: f64 = rng.random::<f64>().max(1e-12);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Output length and finish reason.
///
/// Median ≈ min(120, cap/2); `length_blowup` multiplies it and lifts the default cap
/// (only the request's own max_tokens and the hard limit remain). `room` is what the
/// context window leaves after the prompt. `reasoning` tokens come before the drawn answer
/// and count towards the cap, so a small cap can end the output while it still reasons.
pub fn output_length<R: Rng + ?Sized>(
    rng: &mut R,
    request_max: Option<u32>,
    default_max: u32,
    room: u32,
    reasoning: u32,
    fx: &Effects,
) -> (u32, FinishReason) {
    let base_cap = request_max.unwrap_or(default_max).max(1);
    let cap = match fx.length_blowup {
        Some(_) => request_max.unwrap_or(BLOWUP_HARD_LIMIT),
        None => base_cap,
    }
    .min(room)
    .max(1);
    let median = f64::from((base_cap / 2).clamp(1, 120));
    let mut len = median * (LENGTH_SIGMA * standard_normal(rng)).exp();
    if let Some(factor) = fx.length_blowup {
        len *= factor;
    }
    let len = len.ceil().max(1.0) + f64::from(reasoning);
    if len >= f64::from(cap) {
        (cap, FinishReason::Length)
    } else {
        (len as u32, FinishReason::Stop)
    }
}

/// Apply per-request fault draws (latency spike, stall, drift) to a new sequence.
pub fn apply_request_faults<R: Rng + ?Sized>(rng: &mut R, seq: &mut Sequence, fx: &Effects) {
    if let Some((factor, _)) = fx
        .latency_spike
        .filter(|(_, share)| rng.random_bool(*share))
    {
        seq.slow = factor;
    }
    let stalls = |(_, rate): &(f64, f64)| seq.target >= 2 && rng.random_bool(*rate);
    if let Some((seconds, _)) = fx.stall.filter(stalls) {
        seq.stall_at = Some(rng.random_range(1..seq.target));
        seq.stall_for = Duration::from_secs_f64(seconds);
    }
    if let Some(share) = fx.drift {
        seq.drifted = rng.random_bool(share);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn lengths(fx: &Effects, req: Option<u32>) -> Vec<(u32, FinishReason)> {
        let mut rng = StdRng::seed_from_u64(1);
        (0..2000)
            .map(|_| output_length(&mut rng, req, 256, 8000, 0, fx))
            .collect()
    }

    fn median(v: &[(u32, FinishReason)]) -> u32 {
        let mut l: Vec<u32> = v.iter().map(|x| x.0).collect();
        l.sort_unstable();
        l[l.len() / 2]
    }

    #[test]
    fn median_near_120_and_capped() {
        let v = lengths(&Effects::default(), None);
        assert!((100..=140).contains(&median(&v)), "median {}", median(&v));
        assert!(v.iter().all(|(l, _)| *l <= 256));
        assert!(
            v.iter()
                .any(|(l, r)| *l == 256 && *r == FinishReason::Length)
        );
        let v = lengths(&Effects::default(), Some(10));
        assert!(v.iter().all(|(l, _)| *l <= 10));
        let capped = v.iter().filter(|(_, r)| *r == FinishReason::Length).count();
        assert!((100..600).contains(&capped), "capped {capped}"); // median 5 → ~12% reach 10
    }

    #[test]
    fn reasoning_comes_on_top_and_counts_towards_the_cap() {
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..200 {
            let (len, reason) = output_length(&mut rng, None, 256, 8000, 100, &Effects::default());
            assert!(len > 100 && len <= 256, "{len}");
            assert_eq!(reason == FinishReason::Length, len == 256);
            let (len, reason) =
                output_length(&mut rng, Some(40), 256, 8000, 100, &Effects::default());
            assert_eq!((len, reason), (40, FinishReason::Length));
        }
    }

    #[test]
    fn blowup_ignores_default_cap_only() {
        let fx = Effects {
            length_blowup: Some(4.0),
            ..Effects::default()
        };
        let v = lengths(&fx, None);
        assert!(median(&v) > 400, "median {}", median(&v));
        assert!(v.iter().all(|(l, _)| *l <= BLOWUP_HARD_LIMIT));
        let v = lengths(&fx, Some(50));
        assert!(v.iter().all(|(l, _)| *l <= 50));
    }
}
