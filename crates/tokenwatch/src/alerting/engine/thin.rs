// Thinning of what the alert engine keeps per model beyond its record budget: samples younger than
// a dense span are all kept, older ones as a uniform sample (by a hash of their id), so windows keep their span.

/// Highest thinning level: a sample of level ≥ k is kept 1 time in 2^k.
pub const MAX_LEVEL: u8 = 24;
const LEVELS: usize = MAX_LEVEL as usize + 1;

/// Shortest dense span the schedule narrows to; past it, the per-model cap evicts the oldest.
pub const MIN_DENSE_MS: i64 = 2_000;

/// The id of a kept sample: its push sequence and its source (0 a record, 1 an early first token).
pub fn sample_id(seq: u64, src: u64) -> u64 {
    seq << 1 | src
}

/// The thinning level of a sample: P(level ≥ k) = 2^-k, from a hash of its id (splitmix64's
/// finalizer), so that every reader keeps or skips the same samples.
pub fn level(id: u64) -> u8 {
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z.trailing_zeros().min(u32::from(MAX_LEVEL)) as u8
}

/// Whether the sample `id` is read at thinning level `lvl` (every sample at level 0; the hash
/// is not computed there, so unthinned reads cost nothing more).
pub fn read_at(id: u64, lvl: u8) -> bool {
    lvl == 0 || level(id) >= lvl
}

/// How far a model's kept samples were thinned: every sample known at or before `applied[k]`
/// that is kept has level ≥ k (so `applied` never rises with k). A window reaching back past a
/// cut reads only the samples of that cut's level, everywhere in it: a uniform sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cuts {
    applied: [i64; LEVELS],
}

impl Default for Cuts {
    fn default() -> Cuts {
        Cuts {
            applied: [i64::MIN; LEVELS],
        }
    }
}

impl Cuts {
    /// The level the samples of a window `(from, …]` are read at: 0 (all of them) unless it
    /// reaches back past a cut.
    pub fn window_level(&self, from: i64) -> u8 {
        (1..LEVELS)
            .rev()
            .find(|&k| self.applied[k] > from)
            .map_or(0, |k| k as u8)
    }

    /// The level a sample known at `at` needs to be kept.
    pub fn required(&self, at: i64) -> u8 {
        (1..LEVELS)
            .rev()
            .find(|&k| self.applied[k] >= at)
            .map_or(0, |k| k as u8)
    }

    /// Whether the sample `id` known at `at` is kept.
    pub fn keeps(&self, at: i64, id: u64) -> bool {
        read_at(id, self.required(at))
    }

    /// Whether nothing was thinned.
    pub fn is_dense(&self) -> bool {
        self.applied[1] == i64::MIN
    }

    /// Whether `self` thins anything `before` did not: some cut moved.
    pub fn moved_since(&self, before: &Cuts) -> bool {
        self.applied != before.applied
    }

    /// Whether a cut moved since `before` across a span `[min_at, max_at]` of samples.
    pub fn moved_across(&self, before: &Cuts, min_at: i64, max_at: i64) -> bool {
        (1..LEVELS).any(|k| {
            let (now, was) = (self.applied[k], before.applied[k]);
            now > was && now >= min_at && was < max_at
        })
    }

    /// Samples known at or before `cut` are thinned to level ≥ k.
    fn raise(&mut self, k: usize, cut: i64) {
        for a in &mut self.applied[1..=k] {
            *a = (*a).max(cut);
        }
    }
}

/// A model's thinning schedule: the samples known within the dense span of now are all kept;
/// beyond it each doubling of age halves what is kept (level k from dense × 2^(k-1) on). Kept
/// samples then come to about rate × dense × (1 + log2(retention / dense) / 2); the dense span
/// narrows while the model keeps more than its budget and widens again below half of it.
#[derive(Debug, Clone, Default)]
pub struct Schedule {
    /// None: no thinning (the budget holds the whole retention).
    dense_ms: Option<i64>,
    cuts: Cuts,
}

impl Schedule {
    pub fn cuts(&self) -> &Cuts {
        &self.cuts
    }

    /// The dense span now (None: nothing is thinned).
    pub fn dense_ms(&self) -> Option<i64> {
        self.dense_ms
    }

    /// Steer by `kept` against `budget` (the oldest kept sample known at `oldest_at`) and move
    /// the cuts to `now`.
    pub fn step(
        &mut self,
        now: i64,
        (kept, budget): (usize, usize),
        oldest_at: i64,
        retention: i64,
    ) {
        if kept > budget {
            let d = self
                .dense_ms
                .unwrap_or_else(|| now.saturating_sub(oldest_at) / 2);
            self.dense_ms = Some((d - d / 4).max(MIN_DENSE_MS));
        } else if kept < budget / 2
            && let Some(d) = self.dense_ms
        {
            let wider = d + d / 4 + 1;
            self.dense_ms = (wider < retention).then_some(wider);
        }
        if self.cuts.applied[1] < now.saturating_sub(retention) {
            // Every thinned sample aged out: what is kept now is whole.
            self.cuts = Cuts::default();
        }
        let Some(dense) = self.dense_ms else { return };
        for k in 1..LEVELS {
            let age = dense.saturating_mul(1 << (k - 1));
            if age >= retention {
                break;
            }
            self.cuts.raise(k, now - age);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_halve_from_one_to_the_next() {
        let n = 1u64 << 20;
        let mut at_least = [0u64; LEVELS];
        for id in 0..n {
            for count in at_least.iter_mut().take(level(id) as usize + 1) {
                *count += 1;
            }
        }
        for (k, count) in at_least.iter().enumerate().take(12) {
            let expect = (n >> k) as f64;
            let got = *count as f64;
            assert!(
                (got - expect).abs() < 5.0 * expect.sqrt() + 1.0,
                "level {k}: {got} of {expect}"
            );
        }
        // Records and early first tokens of one push sequence differ.
        assert_ne!(sample_id(7, 0), sample_id(7, 1));
    }

    #[test]
    fn a_window_reads_at_the_level_of_the_oldest_cut_it_reaches_past() {
        let mut c = Cuts::default();
        assert!(c.is_dense());
        assert_eq!(c.window_level(i64::MIN), 0);
        c.raise(1, 1_000);
        c.raise(3, 500);
        assert_eq!(c.window_level(1_000), 0);
        assert_eq!(c.window_level(999), 1);
        assert_eq!(c.window_level(499), 3);
        assert_eq!(c.required(1_001), 0);
        assert_eq!(c.required(1_000), 1);
        assert_eq!(c.required(500), 3);
        // Level 2 was implied by level 3.
        assert_eq!(c.required(400), 3);
        let thinned = (0..10_000u64).filter(|&id| !c.keeps(0, id)).count();
        assert!((8_300..9_200).contains(&thinned), "{thinned}");
        assert!((0..100u64).all(|id| c.keeps(2_000, id)));
    }

    #[test]
    fn the_schedule_holds_the_budget_and_the_span_at_a_steady_high_rate() {
        // 1,000 samples/s for 40 minutes, a budget of 60,000 and a retention of 35 minutes:
        // count what each step keeps by the cuts' expected share.
        let retention = 35 * 60_000;
        let mut s = Schedule::default();
        let rate = 1.0; // per ms
        let kept_at = |s: &Schedule, now: i64| -> f64 {
            (0..retention / 100)
                .map(|i| now - i * 100)
                .map(|at| 100.0 * rate / f64::from(1u32 << s.cuts().required(at)))
                .sum()
        };
        let mut now = 0;
        let mut worst: f64 = 0.0;
        while now < 40 * 60_000 {
            now += 250;
            let kept = kept_at(&s, now);
            worst = worst.max(if now > 10 * 60_000 { kept } else { 0.0 });
            s.step(now, (kept as usize, 60_000), 0, retention);
        }
        assert!(worst <= 66_000.0, "kept up to {worst}");
        let dense = s.dense_ms().unwrap();
        assert!((2_000..30_000).contains(&dense), "dense span {dense} ms");
        // The oldest minute of the retention is still read, at a uniform level.
        assert!(s.cuts().window_level(now - retention + 60_000) >= 6);
        assert_eq!(s.cuts().window_level(now - dense / 2), 0);
        // The rate falls to a trickle: the dense span widens until nothing is thinned, and the
        // cuts are forgotten once what they thinned has aged out.
        for _ in 0..2_000 {
            now += 250;
            s.step(now, (100, 60_000), now - 1_000, retention);
        }
        assert_eq!(s.dense_ms(), None);
        for _ in 0..(retention / 250 + 2) {
            now += 250;
            s.step(now, (100, 60_000), now - 1_000, retention);
        }
        assert!(s.cuts().is_dense());
    }
}
