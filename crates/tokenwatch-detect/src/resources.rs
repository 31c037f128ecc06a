// GPU memory leak detector (spec section 4): stepwise growth or a sustained linear climb while
// idle, with growth rate and time to exhaustion. KV pressure, triple-signal and jitter live next door.

use serde::{Deserialize, Serialize};

pub use crate::jitter::*;
pub use crate::kv::*;
use crate::stats::{linear_fit, mean, trailing_segment};
use crate::text::{bytes, duration_s, pct};
use crate::{Finding, ParamError, Series, Validate, check};

const MIB: f64 = 1024.0 * 1024.0;

/// Two rules, either fires: `consecutive` samples in a row each ≥ `step_bytes` above the one
/// before ("steps", regardless of utilisation), or a linear fit over ≥ `min_points` samples
/// with slope ≥ `min_slope_bytes_per_s` and R² ≥ `min_r2` while mean utilisation over the same
/// span is < `max_utilization` ("slope"; needs a utilisation series).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuLeakParams {
    pub step_bytes: f64,
    pub consecutive: usize,
    pub min_r2: f64,
    /// Fraction 0..1 (DCGM_FI_DEV_GPU_UTIL is a percentage: divide it by 100).
    pub max_utilization: f64,
    pub min_points: usize,
    pub min_slope_bytes_per_s: f64,
    /// The sequential rule (`crate::leak`), under load or idle: its false-page budget — one per
    /// GPU per this many days of healthy memory.
    pub false_page_days: f64,
    /// Memory is read in blocks of at least this many seconds (one scrape when longer): the
    /// growth of each block is one sample of the test.
    pub block_s: f64,
    /// A second, shorter block length tested beside `block_s` while readings come faster than
    /// `block_s` (the false-page budget split between the two): a fast leak pages after two or
    /// three of these instead of two or three long blocks. 0 turns it off.
    pub fast_block_s: f64,
    /// A paging run with one block holding more than this many times the growth of any other
    /// (and 1.5× the design) is a step of memory (an adapter loaded), not a leak's steady climb:
    /// it must page without that block.
    pub step_ratio: f64,
    /// The growth per block the test is designed for: `shift_sigmas` × the GPU's healthy block
    /// noise (robust spread of its blocks' growth around none over `baseline_s`, at least
    /// `noise_floor_bytes`), and at least `design_bytes_per_s` over the block — growth under
    /// half of it (load ramping up the batch) takes the test down, not up.
    pub shift_sigmas: f64,
    pub design_bytes_per_s: f64,
    pub noise_floor_bytes: f64,
    /// The blocks of the last `test_s` seconds are tested against those of the `baseline_s`
    /// before; the test also needs memory above the baseline's highest reading (+2σ), so load
    /// that swings within what the GPU has held before never pages.
    pub test_s: f64,
    pub baseline_s: f64,
    pub min_baseline_blocks: usize,
    /// A drop of more than this is a restart (the process let go of its memory): the test
    /// starts afresh after it. Load moving the batch up and down frees less.
    pub release_bytes: f64,
}

impl Default for GpuLeakParams {
    fn default() -> Self {
        GpuLeakParams {
            step_bytes: 128.0 * MIB,
            consecutive: 5,
            min_r2: 0.9,
            max_utilization: 0.05,
            min_points: 10,
            min_slope_bytes_per_s: MIB,
            false_page_days: 30.0,
            block_s: 10.0,
            fast_block_s: 3.0,
            step_ratio: 3.0,
            shift_sigmas: 3.0,
            design_bytes_per_s: 8.0 * MIB,
            noise_floor_bytes: 8.0 * MIB,
            test_s: 120.0,
            baseline_s: 3600.0,
            min_baseline_blocks: 12,
            release_bytes: 2.0 * 1024.0 * MIB,
        }
    }
}

impl Validate for GpuLeakParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.step_bytes.is_finite() && self.step_bytes > 0.0,
            "step_bytes",
            "must be > 0",
        )?;
        check(self.consecutive >= 1, "consecutive", "must be ≥ 1")?;
        check(
            (0.0..=1.0).contains(&self.min_r2),
            "min_r2",
            "must be in [0, 1]",
        )?;
        check(
            (0.0..=1.0).contains(&self.max_utilization),
            "max_utilization",
            "must be a fraction in [0, 1]",
        )?;
        check(self.min_points >= 3, "min_points", "must be ≥ 3")?;
        check(
            self.min_slope_bytes_per_s.is_finite() && self.min_slope_bytes_per_s > 0.0,
            "min_slope_bytes_per_s",
            "must be > 0",
        )?;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        check(
            positive(self.false_page_days),
            "false_page_days",
            "must be > 0",
        )?;
        check(positive(self.block_s), "block_s", "must be > 0 seconds")?;
        check(
            self.fast_block_s.is_finite() && self.fast_block_s >= 0.0,
            "fast_block_s",
            "must be ≥ 0 seconds (0: off)",
        )?;
        check(self.step_ratio >= 1.0, "step_ratio", "must be ≥ 1")?;
        check(positive(self.shift_sigmas), "shift_sigmas", "must be > 0")?;
        check(
            positive(self.design_bytes_per_s),
            "design_bytes_per_s",
            "must be > 0",
        )?;
        check(
            positive(self.noise_floor_bytes),
            "noise_floor_bytes",
            "must be > 0",
        )?;
        check(
            positive(self.test_s) && self.test_s >= self.block_s,
            "test_s",
            "must be at least block_s",
        )?;
        check(
            positive(self.baseline_s),
            "baseline_s",
            "must be > 0 seconds",
        )?;
        check(
            self.release_bytes.is_finite() && self.release_bytes > 0.0,
            "release_bytes",
            "must be > 0",
        )?;
        check(
            self.min_baseline_blocks >= 3,
            "min_baseline_blocks",
            "must be ≥ 3",
        )
    }
}

/// `used_bytes` and `utilization` (fraction) are gauges sampled over time. Only the trailing
/// contiguous segment counts: it starts after the last gap (> 3× the median interval), NaN, or
/// release (a drop larger than `step_bytes`, e.g. a process restart).
///
/// Score: steps rule = (run / consecutive) × (mean step / step_bytes); slope rule = slope /
/// min_slope_bytes_per_s; the larger of those that hold. Both are 1.0 exactly at the threshold.
pub fn gpu_memory_leak(
    used_bytes: Series,
    utilization: Series,
    total_bytes: f64,
    p: &GpuLeakParams,
) -> Option<Finding> {
    let seg = trailing_segment(used_bytes);
    let start = seg
        .windows(2)
        .rposition(|w| w[0].1 - w[1].1 > p.step_bytes)
        .map_or(0, |i| i + 1);
    let seg = &seg[start..];
    if seg.len() < 2 {
        return None;
    }
    let run = seg
        .windows(2)
        .rev()
        .take_while(|w| w[1].1 - w[0].1 >= p.step_bytes)
        .count();
    let steps_rule = run >= p.consecutive.max(1);

    let to_points = |s: Series| -> Vec<(f64, f64)> {
        s.iter()
            .map(|(t, v)| ((t - s[0].0) as f64 / 1000.0, *v))
            .collect()
    };
    let (t_first, t_last) = (seg[0].0, seg[seg.len() - 1].0);
    let util: Vec<f64> = utilization
        .iter()
        .filter(|(t, v)| *t >= t_first && *t <= t_last && v.is_finite())
        .map(|(_, v)| *v)
        .collect();
    let util_mean = mean(&util);
    let util_max = util
        .iter()
        .copied()
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let seg_fit = if seg.len() >= p.min_points.max(3) {
        linear_fit(&to_points(seg))
    } else {
        None
    };
    let slope_rule = seg_fit
        .is_some_and(|f| f.slope >= p.min_slope_bytes_per_s && f.r2 >= p.min_r2)
        && util_mean.is_some_and(|u| u < p.max_utilization);
    if !steps_rule && !slope_rule {
        return None;
    }

    let run_seg = &seg[seg.len() - 1 - run..];
    let (rule, fit, span) = if steps_rule {
        ("steps", linear_fit(&to_points(run_seg))?, run_seg)
    } else {
        ("slope", seg_fit?, seg)
    };
    let growth = fit.slope;
    let mut score: f64 = 0.0;
    let mean_step = (run_seg[run_seg.len() - 1].1 - run_seg[0].1) / run.max(1) as f64;
    if steps_rule {
        score = (run as f64 / p.consecutive.max(1) as f64) * (mean_step / p.step_bytes);
    }
    if slope_rule {
        score = score.max(seg_fit.map_or(0.0, |f| f.slope) / p.min_slope_bytes_per_s);
    }
    let last = seg[seg.len() - 1].1;
    let tte = (total_bytes.is_finite() && total_bytes > 0.0 && growth > 0.0)
        .then(|| ((total_bytes - last) / growth).max(0.0));

    let growth_text = if steps_rule {
        format!(
            "GPU memory grew {} per sample for {run} samples in a row",
            bytes(mean_step)
        )
    } else {
        format!("GPU memory climbed steadily over {} samples", seg.len())
    };
    let util_text = match (util_mean, util_max) {
        (_, Some(x)) if x < p.max_utilization => {
            format!(" while utilisation stayed under {}", pct(p.max_utilization))
        }
        (Some(m), _) => format!(" while utilisation averaged {}", pct(m)),
        _ => String::new(),
    };
    let tte_text = match tte {
        Some(s) => format!("; at this rate it is exhausted in {}", duration_s(s)),
        None => String::new(),
    };
    let summary = format!(
        "{growth_text} ({}/min, R² {:.2}){util_text}{tte_text} — look for a leak in the serving process \
         (KV blocks or tensors never freed) and plan a restart before it runs out",
        bytes(growth * 60.0),
        fit.r2
    );
    let mut f = Finding::new(score, summary)
        .with("rule", rule)
        .with("steps_rule", steps_rule)
        .with("slope_rule", slope_rule)
        .with("growth_bytes_per_s", growth)
        .with("r2", fit.r2)
        .with("consecutive_steps", run)
        .with("mean_step_bytes", mean_step)
        .with("used_bytes", last)
        .with("total_bytes", total_bytes)
        .with("window_start_unix_ms", span[0].0)
        // The fitted line: this value at window_start, rising `growth_bytes_per_s` (for charts).
        .with("fit_bytes_at_window_start", fit.intercept)
        .with("window_end_unix_ms", t_last)
        .with("samples", span.len())
        .with(
            "time_to_exhaustion_s",
            tte.map_or(serde_json::Value::Null, serde_json::Value::from),
        );
    if let Some(m) = util_mean {
        f = f.with("utilization_mean", m);
    }
    if let Some(x) = util_max {
        f = f.with("utilization_max", x);
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = 1024.0 * MIB;

    fn series(values: &[f64], step_ms: i64) -> Vec<(i64, f64)> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| (1_000_000 + i as i64 * step_ms, *v))
            .collect()
    }

    fn idle(n: usize, step_ms: i64) -> Vec<(i64, f64)> {
        series(&vec![0.01; n], step_ms)
    }

    #[test]
    fn stepwise_leak_fires_with_rate_and_exhaustion() {
        // 20 GiB flat, then 7 steps of 256 MiB every 15 s.
        let mut v = vec![20.0 * GIB; 5];
        for i in 1..=7 {
            v.push(20.0 * GIB + f64::from(i) * 256.0 * MIB);
        }
        let used = series(&v, 15_000);
        // Under load (50%): the steps rule does not depend on utilisation.
        let busy = series(&vec![0.5; v.len()], 15_000);
        let f = gpu_memory_leak(&used, &busy, 80.0 * GIB, &GpuLeakParams::default()).unwrap();
        assert_eq!(f.evidence["rule"], "steps");
        assert_eq!(f.evidence["slope_rule"], false);
        assert_eq!(f.evidence["consecutive_steps"], 7);
        let rate = f.evidence["growth_bytes_per_s"].as_f64().unwrap();
        assert!((rate - 256.0 * MIB / 15.0).abs() < 1.0, "{rate}");
        let tte = f.evidence["time_to_exhaustion_s"].as_f64().unwrap();
        let expected = (80.0 * GIB - (20.0 * GIB + 7.0 * 256.0 * MIB)) / rate;
        assert!((tte - expected).abs() < 1.0);
        assert!((f.score - 7.0 / 5.0 * 2.0).abs() < 1e-9, "{}", f.score);
        assert!(
            f.summary.contains("256 MiB per sample for 7 samples"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("exhausted in"), "{}", f.summary);
    }

    #[test]
    fn slow_linear_leak_while_idle_fires_by_slope() {
        // +60 MiB every 10 s (6 MiB/s), small steps: only the slope rule can see it.
        let v: Vec<f64> = (0..20)
            .map(|i| 10.0 * GIB + f64::from(i) * 60.0 * MIB)
            .collect();
        let used = series(&v, 10_000);
        let f = gpu_memory_leak(
            &used,
            &idle(20, 10_000),
            40.0 * GIB,
            &GpuLeakParams::default(),
        )
        .unwrap();
        assert_eq!(f.evidence["rule"], "slope");
        assert!((f.score - 6.0).abs() < 1e-6, "{}", f.score);
        let at_start = f.evidence["fit_bytes_at_window_start"].as_f64().unwrap();
        assert!(
            (at_start - 10.0 * GIB).abs() < 1.0,
            "exact line: {at_start}"
        );
        // Same climb under load is ordinary growth, not a leak by the slope rule.
        let busy = series(&[0.7; 20], 10_000);
        assert!(gpu_memory_leak(&used, &busy, 40.0 * GIB, &GpuLeakParams::default()).is_none());
        // No utilisation series: the slope rule cannot be confirmed.
        assert!(gpu_memory_leak(&used, &[], 40.0 * GIB, &GpuLeakParams::default()).is_none());
    }

    use crate::test_rng::Rng;

    #[test]
    fn memory_swinging_with_batch_occupancy_never_fires() {
        // Two hours of 5 s samples (the default scrape) of a healthy engine whose memory follows
        // its batch: 16 MiB of activations per running sequence on top of weights and pool, a
        // 20-minute load swing from idle to the full batch of 32, heavy-tailed bursts that fill
        // the batch within one sample, allocator noise of ±20 MiB; utilisation = occupancy.
        // Evaluated like the engine does, on every sample's trailing 120 s window.
        let p = GpuLeakParams::default();
        let mut rng = Rng(7);
        let (mut used, mut util) = (Vec::new(), Vec::new());
        for i in 0..1440i64 {
            let t = i as f64 * 5.0;
            let swing = 0.5 - 0.5 * (std::f64::consts::TAU * t / 1200.0).cos();
            let burst = if rng.unit() < 0.05 {
                1.0 / rng.unit().max(0.05)
            } else {
                1.0
            };
            let running = (32.0 * swing * burst * (0.8 + 0.4 * rng.unit()))
                .round()
                .min(32.0);
            let noise = (rng.unit() - 0.5) * 40.0 * MIB;
            used.push((i * 5_000, 24.0 * GIB + running * 16.0 * MIB + noise));
            util.push((i * 5_000, running / 32.0));
        }
        // The detector's view at sample `end`: the trailing 120 s (the rule's default window).
        let at = |mem: &[(i64, f64)], end: usize| {
            let from = mem[end].0 - 120_000;
            let w = |s: &[(i64, f64)]| -> Vec<(i64, f64)> {
                s[..=end]
                    .iter()
                    .copied()
                    .filter(|(t, _)| *t >= from)
                    .collect()
            };
            gpu_memory_leak(&w(mem), &w(&util), 80.0 * GIB, &p)
        };
        let fired: Vec<(usize, String)> = (1..used.len())
            .filter_map(|end| at(&used, end).map(|f| (end, f.summary)))
            .collect();
        assert!(
            fired.is_empty(),
            "healthy swings fired: {:?}",
            &fired[..fired.len().min(3)]
        );
        // The same load with the simulator's kv_leak on top (≥ 64 MiB/s from t = 0) is caught
        // within a minute, bursts and all.
        let leaking: Vec<(i64, f64)> = used
            .iter()
            .map(|(t, v)| (*t, v + *t as f64 / 1000.0 * 64.0 * MIB))
            .collect();
        let first = (1..used.len())
            .find(|&end| at(&leaking, end).is_some())
            .expect("the leak is never caught");
        assert!(first <= 12, "caught only at sample {first}");
    }

    #[test]
    fn negatives_and_edges() {
        let p = GpuLeakParams::default();
        let flat = series(&[20.0 * GIB; 30], 10_000);
        assert!(
            gpu_memory_leak(&flat, &idle(30, 10_000), 80.0 * GIB, &p).is_none(),
            "constant"
        );
        assert!(gpu_memory_leak(&[], &[], 80.0 * GIB, &p).is_none(), "empty");
        let few = series(&[1.0 * GIB, 1.5 * GIB, 2.0 * GIB], 10_000);
        assert!(
            gpu_memory_leak(&few, &idle(3, 10_000), 80.0 * GIB, &p).is_none(),
            "too few samples"
        );
        // Noisy up-and-down usage under load.
        let noisy: Vec<f64> = (0..40)
            .map(|i| 20.0 * GIB + if i % 2 == 0 { 300.0 } else { -300.0 } * MIB)
            .collect();
        assert!(
            gpu_memory_leak(&series(&noisy, 5_000), &idle(40, 5_000), 80.0 * GIB, &p).is_none()
        );
        // A NaN, a gap or a release in the middle breaks the run: 3 steps after it are not enough.
        let mut v: Vec<f64> = (0..6).map(|i| f64::from(i) * 256.0 * MIB + GIB).collect();
        v[3] = f64::NAN;
        assert!(gpu_memory_leak(&series(&v, 10_000), &idle(6, 10_000), 80.0 * GIB, &p).is_none());
        let mut gapped: Vec<(i64, f64)> = (0..6)
            .map(|i| (i64::from(i) * 10_000, f64::from(i) * 256.0 * MIB))
            .collect();
        for s in gapped.iter_mut().skip(3) {
            s.0 += 600_000;
        }
        assert!(gpu_memory_leak(&gapped, &idle(6, 10_000), 80.0 * GIB, &p).is_none());
        let released = series(
            &[
                5.0 * GIB,
                5.3 * GIB,
                5.6 * GIB,
                1.0 * GIB,
                1.3 * GIB,
                1.6 * GIB,
                1.9 * GIB,
            ],
            10_000,
        );
        assert!(gpu_memory_leak(&released, &idle(7, 10_000), 80.0 * GIB, &p).is_none());
        // Unknown total: still reported, without a time to exhaustion.
        let v: Vec<f64> = (0..8).map(|i| f64::from(i) * 200.0 * MIB).collect();
        let f = gpu_memory_leak(&series(&v, 10_000), &[], f64::NAN, &p).unwrap();
        assert!(f.evidence["time_to_exhaustion_s"].is_null());
    }
}
