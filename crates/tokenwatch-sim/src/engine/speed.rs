// Slow per-engine speed drift (`--speed-drift`, `--speed-drift-period`): a smooth, seeded
// factor around 1 that multiplies the base TTFT and the decode step time.

use std::f64::consts::TAU;

/// Ratio of the second (faster) sinusoid's period to the main period.
const SECOND_PERIOD_RATIO: f64 = 0.37;
/// Weights of the two sinusoids; they add up to 1, so the factor stays within 1 ± amplitude.
const MAIN_WEIGHT: f64 = 0.7;
const SECOND_WEIGHT: f64 = 0.3;

/// Speed factor over time: `1 + a·(0.7·sin(2πt/P + φ1) + 0.3·sin(2πt/(0.37·P) + φ2))`,
/// with the phases φ1, φ2 derived from the engine's seed (engines with different seeds drift
/// differently). A factor above 1 means slower.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeedDrift {
    amplitude: f64,
    period_s: f64,
    phase_main: f64,
    phase_second: f64,
}

impl SpeedDrift {
    /// `amplitude` is a fraction in [0, 1) and `period_s` > 0 (the arguments are validated
    /// where they are parsed); an amplitude of 0 switches the drift off.
    pub fn new(amplitude: f64, period_s: f64, seed: u64) -> SpeedDrift {
        let mut state = seed ^ 0x5EED_D21F_7000_0000;
        let phase_main = TAU * unit(splitmix64(&mut state));
        let phase_second = TAU * unit(splitmix64(&mut state));
        SpeedDrift {
            amplitude,
            period_s,
            phase_main,
            phase_second,
        }
    }

    /// Whether the factor can differ from 1.
    pub fn is_on(&self) -> bool {
        self.amplitude > 0.0 && self.period_s > 0.0
    }

    /// The factor `t_s` seconds after the engine started; exactly 1 when the drift is off.
    pub fn factor(&self, t_s: f64) -> f64 {
        if !self.is_on() {
            return 1.0;
        }
        let main = (TAU * t_s / self.period_s + self.phase_main).sin();
        let second = (TAU * t_s / (SECOND_PERIOD_RATIO * self.period_s) + self.phase_second).sin();
        1.0 + self.amplitude * (MAIN_WEIGHT * main + SECOND_WEIGHT * second)
    }
}

/// One step of SplitMix64: a well-mixed 64-bit value from a counter-like state.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A value in [0, 1) from the top 53 bits.
fn unit(v: u64) -> f64 {
    (v >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(d: &SpeedDrift, period_s: f64) -> Vec<f64> {
        (0..=1000)
            .map(|i| d.factor(period_s * f64::from(i) / 1000.0))
            .collect()
    }

    #[test]
    fn stays_within_amplitude_and_varies_over_a_period() {
        for seed in [0, 1, 42, 7_000_123, u64::MAX] {
            let d = SpeedDrift::new(0.2, 600.0, seed);
            let f = samples(&d, 600.0);
            let (lo, hi) = f
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
            assert!(lo >= 0.8 - 1e-12 && hi <= 1.2 + 1e-12, "{seed}: {lo}..{hi}");
            // The main sinusoid swings ±0.14 over a period, the second at most ±0.06 against it.
            assert!(hi - lo > 0.15, "{seed}: only {lo}..{hi}");
        }
    }

    #[test]
    fn is_smooth() {
        // Slow drift: over one second of a 600 s period the factor moves by well under 1 %.
        let d = SpeedDrift::new(0.2, 600.0, 9);
        let f = samples(&d, 600.0); // 0.6 s apart
        let worst = f
            .windows(2)
            .map(|w| (w[1] - w[0]).abs())
            .fold(0.0, f64::max);
        assert!(worst < 0.005, "step {worst}");
    }

    #[test]
    fn zero_amplitude_is_exactly_one() {
        let d = SpeedDrift::new(0.0, 600.0, 42);
        assert!(!d.is_on());
        assert!(samples(&d, 3600.0).iter().all(|v| *v == 1.0));
    }

    #[test]
    fn seeds_drift_differently() {
        let a = samples(&SpeedDrift::new(0.2, 600.0, 1), 600.0);
        let b = samples(&SpeedDrift::new(0.2, 600.0, 2), 600.0);
        let most = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(most > 0.05, "seeds 1 and 2 drift alike (max gap {most})");
        // The same seed gives the same drift.
        assert_eq!(a, samples(&SpeedDrift::new(0.2, 600.0, 1), 600.0));
    }

    #[test]
    fn period_scales_time() {
        let slow = SpeedDrift::new(0.3, 600.0, 5);
        let fast = SpeedDrift::new(0.3, 60.0, 5);
        for i in 0..50 {
            let t = f64::from(i) * 7.3;
            assert!((slow.factor(t * 10.0) - fast.factor(t)).abs() < 1e-9);
        }
    }
}
