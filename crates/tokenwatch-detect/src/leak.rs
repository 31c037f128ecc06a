// The sequential GPU-leak test: a CUSUM on how much GPU memory grows per block of time, against
// the GPU's own healthy block-to-block noise, with a false-page budget (`GpuLeakParams`) — so a
// leak under load is paged in a few blocks instead of waiting for idle or large steps — and the
// optimal delay it is measured against (`leak_bound_s`).

use crate::resources::GpuLeakParams;
use crate::robust::{MAD_TO_SIGMA, median_mad_sigma};
use crate::sequential::cusum_threshold;
use crate::stats::{linear_fit, trailing_segment};
use crate::text::{bytes, duration_s};
use crate::{Finding, Series};

/// The 90th percentile of |x| for a normal x, in σ.
const Z_90_OF_ABS: f64 = 1.645;

/// Consecutive readings grouped into blocks spanning at least `block_ms` (one reading each when
/// readings are further apart): (time of the block's last reading, growth of the block's level
/// over the previous block's, time since the previous block's last reading, readings in the
/// block). A block's level is the median of its readings, so one reading caught in an
/// allocation burst moves little.
fn blocks(seg: &[(i64, f64)], block_ms: i64) -> Vec<Block> {
    let mut levels: Vec<(i64, f64, usize)> = Vec::new();
    let mut current: Vec<f64> = Vec::new();
    let mut started = None;
    let gap = gap(seg);
    for &(t, v) in seg {
        let t0 = *started.get_or_insert(t);
        current.push(v);
        if t - t0 + gap >= block_ms {
            current.sort_by(f64::total_cmp);
            levels.push((t, current[current.len() / 2], current.len()));
            current.clear();
            started = None;
        }
    }
    levels
        .windows(2)
        .map(|w| Block {
            end: w[1].0,
            growth: w[1].1 - w[0].1,
            length_ms: w[1].0 - w[0].0,
            readings: w[1].2,
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Block {
    end: i64,
    growth: f64,
    length_ms: i64,
    readings: usize,
}

/// The usual time between two readings (median), 0 with fewer than two.
fn gap(seg: &[(i64, f64)]) -> i64 {
    let mut d: Vec<i64> = seg.windows(2).map(|w| w[1].0 - w[0].0).collect();
    if d.is_empty() {
        return 0;
    }
    d.sort_unstable();
    d[d.len() / 2]
}

/// Nats one block adds: the Gaussian log-likelihood ratio of the design growth `mu` against
/// none, noise `sigma`, for the block's growth clipped to ±2·`mu` (one allocation burst is not
/// a trend), and at most `cap` (no single block pages).
fn block_llr(growth: f64, mu: f64, sigma: f64, cap: f64) -> f64 {
    let x = growth.clamp(-2.0 * mu, 2.0 * mu);
    (mu / (sigma * sigma) * (x - mu / 2.0)).min(cap)
}

/// The CUSUM threshold for blocks of `block_s` seconds, one false page per `false_page_days`.
fn threshold(block_s: f64, false_page_days: f64) -> f64 {
    cusum_threshold(false_page_days * 86_400.0, 1.0 / block_s.max(1e-3), 1)
}

/// The test at one block length that pages: its CUSUM, threshold and what the finding says.
struct Paging {
    s: f64,
    h: f64,
    sigma: f64,
    high: f64,
    /// The blocks since the estimated change.
    run: Vec<Block>,
    typical_block_s: f64,
    test_from: i64,
    baseline_start: i64,
}

/// The sequential leak test over `used` (GPU memory readings, oldest first, reaching back
/// `baseline_s` + `test_s`): the blocks of the last `test_s` seconds feed a CUSUM against the
/// growth noise of the blocks before them; it pages when the CUSUM is over its threshold and
/// memory is above the highest baseline reading by 2σ. Only the segment after the last
/// release (a drop of more than `release_bytes`: a restart) or gap counts.
///
/// Two block lengths run side by side when readings come faster than `block_s`: `block_s`,
/// where a slow leak adds up over long blocks, and `fast_block_s`, where a fast one shows in
/// a few short blocks (no block pages alone, so a test pages after two to three blocks); the
/// false-page budget is split between them.
pub fn gpu_memory_leak_sequential(
    used: Series,
    total_bytes: f64,
    p: &GpuLeakParams,
) -> Option<Finding> {
    let seg = trailing_segment(used);
    let start = seg
        .windows(2)
        .rposition(|w| w[0].1 - w[1].1 > p.release_bytes)
        .map_or(0, |i| i + 1);
    let seg = &seg[start..];
    let &(now, last) = seg.last()?;
    let ms = |s: f64| (s * 1000.0).round().max(1.0) as i64;
    let mut scales = vec![ms(p.block_s)];
    // With readings as far apart as a block, every block is one reading at both lengths.
    if p.fast_block_s > 0.0 && ms(p.fast_block_s) < ms(p.block_s) && gap(seg) < ms(p.block_s) {
        scales.push(ms(p.fast_block_s));
    }
    let days = p.false_page_days * scales.len() as f64;
    let found = scales
        .iter()
        .filter_map(|&block_ms| test_at(seg, block_ms, days, p))
        .max_by(|a, b| (a.s / a.h).total_cmp(&(b.s / b.h)))?;
    // The climb since the estimated change: the readings of the blocks that built the CUSUM.
    let change_at = found.run[0].end - found.run[0].length_ms;
    let span: Vec<(f64, f64)> = seg
        .iter()
        .filter(|(t, _)| *t >= change_at)
        .map(|(t, v)| ((t - change_at) as f64 / 1000.0, *v))
        .collect();
    let fit = linear_fit(&span)?;
    if fit.slope < p.min_slope_bytes_per_s {
        return None;
    }
    let Paging {
        s,
        h,
        sigma,
        high,
        ref run,
        typical_block_s,
        test_from,
        baseline_start,
    } = found;
    let growth = fit.slope;
    let tte = (total_bytes.is_finite() && total_bytes > 0.0)
        .then(|| ((total_bytes - last) / growth).max(0.0));
    let tte_text = match tte {
        Some(t) => format!("; at this rate it is exhausted in {}", duration_s(t)),
        None => String::new(),
    };
    let summary = format!(
        "GPU memory has grown {}/min for {} ({} above the most it held in the {} before), far \
         beyond its usual swing of ±{} per {}{tte_text} — look for a leak in the serving process \
         (KV blocks or tensors never freed) and plan a restart before it runs out",
        bytes(growth * 60.0),
        duration_s((now - change_at) as f64 / 1000.0),
        bytes(last - high),
        duration_s((test_from - baseline_start) as f64 / 1000.0),
        bytes(sigma),
        duration_s(typical_block_s),
    );
    Some(
        Finding::new(s / h, summary)
            .with("rule", "sequential")
            .with("growth_bytes_per_s", growth)
            .with("r2", fit.r2)
            .with("llr_nats", s)
            .with("threshold_nats", h)
            .with("noise_sigma_bytes", sigma)
            .with("block_s", typical_block_s)
            .with("baseline_high_bytes", high)
            .with("used_bytes", last)
            .with("total_bytes", total_bytes)
            .with("change_at_unix_ms", change_at)
            .with("window_start_unix_ms", change_at)
            .with("fit_bytes_at_window_start", fit.intercept)
            .with("window_end_unix_ms", now)
            .with("samples", span.len())
            .with(
                "block_growths_bytes",
                run.iter().map(|b| b.growth.round()).collect::<Vec<f64>>(),
            )
            .with(
                "time_to_exhaustion_s",
                tte.map_or(serde_json::Value::Null, serde_json::Value::from),
            ),
    )
}

/// The test at blocks of `block_ms`, with one false page per `false_page_days`: Some when it
/// pages.
fn test_at(
    seg: &[(i64, f64)],
    block_ms: i64,
    false_page_days: f64,
    p: &GpuLeakParams,
) -> Option<Paging> {
    let &(now, last) = seg.last()?;
    let all = blocks(seg, block_ms);
    let test_from = now - (p.test_s * 1000.0).round() as i64;
    let baseline_from = test_from - (p.baseline_s * 1000.0).round() as i64;
    let split = all.partition_point(|b| b.end <= test_from);
    let (baseline, test) = all.split_at(split);
    let baseline: Vec<&Block> = baseline.iter().filter(|b| b.end >= baseline_from).collect();
    if baseline.len() < p.min_baseline_blocks || test.is_empty() {
        return None;
    }
    // The spread of healthy growth around none (not around its median: a baseline taken on a
    // load ramp must not make the same ramp look like a leak), read from the median and from
    // the 90th percentile of its size, the larger — noise that grows with load (a busier batch
    // moves more memory) is not underestimated from a quiet baseline's middle.
    let mut sizes: Vec<f64> = baseline.iter().map(|b| b.growth.abs()).collect();
    let (median_abs, _) = median_mad_sigma(&sizes)?;
    sizes.sort_by(f64::total_cmp);
    let p90_abs = sizes[(sizes.len() * 9 / 10).min(sizes.len() - 1)];
    let sigma = (MAD_TO_SIGMA * median_abs)
        .max(p90_abs / Z_90_OF_ABS)
        .max(p.noise_floor_bytes);
    let baseline_start = baseline[0].end - baseline[0].length_ms;
    let high = seg
        .iter()
        .filter(|(t, _)| *t >= baseline_start && *t <= test_from)
        .map(|(_, v)| *v)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut lengths: Vec<i64> = test.iter().map(|b| b.length_ms).collect();
    lengths.sort_unstable();
    let typical_block_s = lengths[lengths.len() / 2] as f64 / 1000.0;
    let h = threshold(typical_block_s, false_page_days);
    let mu = |b: &Block| {
        (p.shift_sigmas * sigma).max(p.design_bytes_per_s * b.length_ms as f64 / 1000.0)
    };
    // The CUSUM over the test's blocks, one of them (a step) counted as no growth.
    let cusum = |step: Option<usize>| {
        let (mut s, mut run_start) = (0.0f64, 0usize);
        for (k, b) in test.iter().enumerate() {
            // No single block pages: a block of one reading adds at most half the threshold;
            // one of several at most a third, since a step of memory (an adapter loaded) that
            // falls inside a block can show in both it and the next one.
            let cap = crate::sequential::sample_cap(h, if b.readings > 1 { 3 } else { 2 });
            let growth = if step == Some(k) { 0.0 } else { b.growth };
            s = (s + block_llr(growth, mu(b), sigma, cap)).max(0.0);
            if s == 0.0 {
                run_start = k + 1;
            }
        }
        (s, run_start)
    };
    let (mut s, mut run_start) = cusum(None);
    if s < h || last <= high + 2.0 * sigma || run_start >= test.len() {
        return None;
    }
    // A leak spreads its growth over every block; a step of memory (an adapter loaded, a CUDA
    // graph captured) puts it in one. When one block of the run holds more than `step_ratio`×
    // any other's growth (and 1.5 μ), the run must page without it.
    let mut by_growth: Vec<usize> = (run_start..test.len()).collect();
    by_growth.sort_by(|&a, &b| test[b].growth.total_cmp(&test[a].growth));
    if let [top, second, ..] = by_growth[..] {
        let rest = test[second].growth.max(mu(&test[top]) / 2.0);
        if test[top].growth > p.step_ratio * rest {
            (s, run_start) = cusum(Some(top));
            if s < h || run_start >= test.len() {
                return None;
            }
        }
    }
    Some(Paging {
        s,
        h,
        sigma,
        high,
        run: test[run_start..].to_vec(),
        typical_block_s,
        test_from,
        baseline_start,
    })
}

/// The yardstick: the optimal CUSUM's delay (seconds) for a leak of `rate` bytes/s seen in
/// readings every `scrape_s` whose growth from one reading to the next has noise `sigma` bytes,
/// at the same false-page budget — ln(ARL₀) / KL readings, KL = (rate·scrape)² / 2σ², at least
/// one reading.
pub fn leak_bound_s(rate: f64, sigma: f64, scrape_s: f64, p: &GpuLeakParams) -> f64 {
    let h = threshold(scrape_s, p.false_page_days);
    let mu = rate * scrape_s;
    let kl = mu * mu / (2.0 * sigma * sigma).max(f64::MIN_POSITIVE);
    (h / kl).ceil().max(1.0) * scrape_s
}

#[cfg(test)]
#[path = "leak_tests.rs"]
mod tests;
