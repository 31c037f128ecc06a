// Latency detectors of spec section 4: P99 spike against a reference period that ends before
// the window under test, absolute P99 threshold, the context-aware threshold that scales with
// prompt length and KV-cache use, and the tail quantiles and peer comparison they share.

use serde::{Deserialize, Serialize};

use crate::text::duration_s;
use crate::{Finding, ParamError, Validate, check};

/// The spec's latency quantile.
pub const P99: f64 = 0.99;

/// The quantile a window of `n` samples can estimate with at least `min_tail` samples above
/// it: min(q, 1 − min_tail / n). A quarter of a model's traffic (one instance of four) gets a
/// lower quantile (P95 at 200 requests with 10 in the tail), not a P99 that one slow request
/// moves. None when the window is too small for any tail of that size.
pub fn effective_quantile(q: f64, n: usize, min_tail: u64) -> Option<f64> {
    if n == 0 || !q.is_finite() {
        return None;
    }
    let floor = 1.0 - min_tail as f64 / n as f64;
    (floor > 0.0).then(|| q.min(floor))
}

/// Nearest-rank quantile of ascending values (None when empty).
pub fn sorted_quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() || !q.is_finite() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// One instance's tail latency against the same quantile of its peers (the other instances of
/// its model, same window).
#[derive(Debug, Clone, PartialEq)]
pub struct PeerComparison {
    /// The quantile compared (the lowest effective quantile of the instance and its peers).
    pub quantile: f64,
    pub value: f64,
    /// Median of the peers' values at that quantile.
    pub peer_median: f64,
    pub peers: usize,
    /// value / peer_median.
    pub ratio: f64,
}

impl PeerComparison {
    /// Adds the comparison to a finding's evidence.
    pub fn annotate(&self, f: Finding) -> Finding {
        f.with("peer_quantile", self.quantile)
            .with("peer_median_s", self.peer_median)
            .with("peers", self.peers as u64)
            .with("peer_ratio", self.ratio)
    }
}

/// Compares ascending `own` with each ascending peer window holding at least `min_samples`
/// values; None without such a peer or when the peers' median is not positive.
pub fn compare_with_peers(
    own: &[f64],
    peers: &[&[f64]],
    min_samples: u64,
    min_tail: u64,
) -> Option<PeerComparison> {
    let min = min_samples.max(1) as usize;
    if own.len() < min {
        return None;
    }
    let usable: Vec<&[f64]> = peers.iter().copied().filter(|p| p.len() >= min).collect();
    if usable.is_empty() {
        return None;
    }
    let mut q = effective_quantile(P99, own.len(), min_tail)?;
    for p in &usable {
        q = q.min(effective_quantile(P99, p.len(), min_tail)?);
    }
    let value = sorted_quantile(own, q)?;
    let mut vals: Vec<f64> = usable
        .iter()
        .filter_map(|p| sorted_quantile(p, q))
        .collect();
    vals.sort_by(f64::total_cmp);
    let m = vals.len();
    let peer_median = if m % 2 == 1 {
        vals[m / 2]
    } else {
        (vals[m / 2 - 1] + vals[m / 2]) / 2.0
    };
    if !(peer_median > 0.0 && value.is_finite()) {
        return None;
    }
    Some(PeerComparison {
        quantile: q,
        value,
        peer_median,
        peers: m,
        ratio: value / peer_median,
    })
}

/// Latency spike: the tail quantile (P99, lowered to keep `min_tail_samples` above it) of the
/// current window > `ratio` × the same quantile of a reference period. The reference is the
/// `baseline_windows` windows before the current one, frozen at the onset of a spike while it
/// lasts (at most `max_hold_s`), so neither the window under test nor an ongoing anomaly is in
/// its own baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LatencySpikeParams {
    pub ratio: f64,
    /// Requests each window needs before a tail quantile means anything (at ~90 req/min a
    /// per-minute P99 is nearly the maximum).
    pub min_samples: u64,
    /// Requests that must lie above the compared quantile in the current window.
    pub min_tail_samples: u64,
    /// Length of the reference period, in windows, ending where the current window starts.
    pub baseline_windows: u32,
    /// An instance alerts only when its tail is also this many times its peers' median.
    pub peer_ratio: f64,
    /// A spike that lasts longer than this becomes the new normal: the baseline re-learns.
    pub max_hold_s: f64,
    /// The fast path (`latency_exceedance`): its short window, in seconds (0: off).
    pub fast_window_s: f64,
    /// The reference quantiles whose `ratio` × marks a request as slow on the fast path (each
    /// tested; a heavy prompt-length tail puts P95 far above a typical request, so a slowdown of
    /// typical requests shows against a lower quantile first).
    pub fast_quantiles: Vec<f64>,
    /// Fewest slow requests the short window needs.
    pub fast_min_slow: u64,
    /// One-sided significance of the fast path's binomial test.
    pub fast_alpha: f64,
}

impl Default for LatencySpikeParams {
    fn default() -> Self {
        LatencySpikeParams {
            ratio: 2.5,
            min_samples: 50,
            min_tail_samples: 10,
            baseline_windows: 5,
            peer_ratio: 2.0,
            max_hold_s: 900.0,
            fast_window_s: 10.0,
            fast_quantiles: vec![0.8, 0.9, 0.95],
            fast_min_slow: 3,
            fast_alpha: 1e-3,
        }
    }
}

impl Validate for LatencySpikeParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.ratio.is_finite() && self.ratio > 1.0,
            "ratio",
            "must be a number > 1",
        )?;
        check_tail(self.min_samples, self.min_tail_samples, self.peer_ratio)?;
        check(
            (1..=60).contains(&self.baseline_windows),
            "baseline_windows",
            "must be between 1 and 60",
        )?;
        check(
            self.max_hold_s.is_finite() && self.max_hold_s > 0.0,
            "max_hold_s",
            "must be > 0",
        )?;
        check(
            self.fast_window_s.is_finite() && self.fast_window_s >= 0.0,
            "fast_window_s",
            "must be ≥ 0 (0 turns the fast path off)",
        )?;
        check(
            !self.fast_quantiles.is_empty()
                && self.fast_quantiles.len() <= 8
                && self.fast_quantiles.iter().all(|q| *q > 0.5 && *q < 1.0),
            "fast_quantiles",
            "must list 1 to 8 quantiles, each in (0.5, 1)",
        )?;
        check(self.fast_min_slow >= 1, "fast_min_slow", "must be ≥ 1")?;
        check(
            self.fast_alpha > 0.0 && self.fast_alpha < 0.5,
            "fast_alpha",
            "must be in (0, 0.5)",
        )
    }
}

/// The reference share of slow requests is never taken below this (a reference that happens to
/// hold none above the line must not make two slow requests significant).
const FAST_MIN_BASE_RATE: f64 = 0.005;

/// The fast path tests the share above `ratio` × each reference quantile and above twice that:
/// a ten-fold slowdown is far rarer in the reference's own tail at the second line, so fewer
/// slow requests make it significant (`fast_alpha` is split over every line tested).
const FAST_LINES: [f64; 2] = [1.0, 2.0];

/// The latency spike's fast path: over a short window (seconds, `fast_window_s`), the share of
/// requests slower than `ratio` × a reference quantile q of `fast_quantiles` (the "slow" line,
/// and twice it). It holds when that share is above 1 − q — the window's q-quantile is over
/// `ratio` × the reference's, the spike's own condition at that quantile — with at least
/// `fast_min_slow` slow requests, and is significant against the reference's own share above
/// the line (its Wilson upper bound, one-sided binomial, `fast_alpha` over all lines). A third
/// of the requests ten times slower shows within a handful of requests, while the full window's
/// P99 needs tens of seconds to move. `current` need not be sorted; `baseline` is ascending with
/// at least `min_samples` values.
pub fn latency_exceedance(
    current: &[f64],
    baseline: &[f64],
    p: &LatencySpikeParams,
) -> Option<Finding> {
    if p.fast_window_s <= 0.0 || (baseline.len() as u64) < p.min_samples.max(1) {
        return None;
    }
    let n = current.len() as u64;
    let alpha = p.fast_alpha / (FAST_LINES.len() * p.fast_quantiles.len().max(1)) as f64;
    let (q, reference, line, slow, base_slow, p_value) = p
        .fast_quantiles
        .iter()
        .filter_map(|q| Some((*q, sorted_quantile(baseline, *q)?)))
        .flat_map(|(q, reference)| FAST_LINES.iter().map(move |m| (q, reference, m)))
        .filter_map(|(q, reference, m)| {
            let line = m * p.ratio * reference;
            if !(line.is_finite() && line > 0.0) {
                return None;
            }
            let slow = current.iter().filter(|v| **v > line).count() as u64;
            if slow < p.fast_min_slow || (slow as f64) <= (1.0 - q) * n as f64 {
                return None;
            }
            let base_slow = (baseline.len() - baseline.partition_point(|v| *v <= line)) as u64;
            let rate = crate::robust::wilson_upper(base_slow, baseline.len() as u64, 1.645)?
                .max(FAST_MIN_BASE_RATE);
            let p_value = crate::robust::binomial_sf(slow, n, rate);
            (p_value < alpha).then_some((q, reference, line, slow, base_slow, p_value))
        })
        .min_by(|a, b| a.5.total_cmp(&b.5))?;
    let share = slow as f64 / n as f64;
    let base_share = base_slow as f64 / baseline.len() as f64;
    let summary = format!(
        "{slow} of the last {n} requests ({:.0}%, {:.0} s) took over {} — {:.1}× the reference \
         period's P{} — against {:.1}% of the reference (p = {p_value:.1e}) — check queue \
         depth, preemptions and KV-cache usage",
        share * 100.0,
        p.fast_window_s,
        duration_s(line),
        line / reference,
        pct_label(q),
        base_share * 100.0,
    );
    Some(
        Finding::new(share / (1.0 - q), summary)
            .with("fast_path", true)
            .with("slow_line_s", line)
            .with("slow_line_ratio", line / reference)
            .with("slow_requests", slow)
            .with("current_samples", n)
            .with("slow_share", share)
            .with("previous_slow_share", base_share)
            .with("previous_samples", baseline.len() as u64)
            .with("quantile", q)
            .with("p_value", p_value)
            .with("fast_window_s", p.fast_window_s)
            .with("ratio_threshold", p.ratio),
    )
}

/// The tail and peer parameters the three latency detectors share.
fn check_tail(min_samples: u64, min_tail_samples: u64, peer_ratio: f64) -> Result<(), ParamError> {
    check(min_tail_samples >= 1, "min_tail_samples", "must be ≥ 1")?;
    check(
        min_samples > min_tail_samples,
        "min_samples",
        "must be larger than min_tail_samples",
    )?;
    check(
        peer_ratio.is_finite() && peer_ratio > 1.0,
        "peer_ratio",
        "must be a number > 1",
    )
}

/// Score = (current / baseline) / ratio: 1.0 exactly at the threshold. `current` and
/// `baseline` are ascending.
pub fn latency_spike(current: &[f64], baseline: &[f64], p: &LatencySpikeParams) -> Option<Finding> {
    let min = p.min_samples.max(1) as usize;
    if current.len() < min || baseline.len() < min {
        return None;
    }
    let q = effective_quantile(P99, current.len(), p.min_tail_samples)?.min(effective_quantile(
        P99,
        baseline.len(),
        p.min_tail_samples,
    )?);
    let (c, b) = (sorted_quantile(current, q)?, sorted_quantile(baseline, q)?);
    if !(c.is_finite() && b.is_finite()) || b <= 0.0 {
        return None;
    }
    let observed = c / b;
    if observed <= p.ratio {
        return None;
    }
    let (cn, bn) = (current.len(), baseline.len());
    let summary = format!(
        "P{} latency jumped {observed:.1}× from {} (reference period) to {} (current window) \
         ({bn} and {cn} requests, threshold {:.1}×) — check queue depth, preemptions and \
         KV-cache usage",
        pct_label(q),
        duration_s(b),
        duration_s(c),
        p.ratio
    );
    Some(
        Finding::new(observed / p.ratio, summary)
            .with("current_p99_s", c)
            .with("previous_p99_s", b)
            .with("quantile", q)
            .with("current_samples", cn as u64)
            .with("previous_samples", bn as u64)
            .with("ratio", observed)
            .with("ratio_threshold", p.ratio),
    )
}

/// "99", "95", "97.5": a quantile as a percentile label.
pub fn pct_label(q: f64) -> String {
    let s = format!("{:.1}", q * 100.0);
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

/// Absolute latency: P99 TTFT > `threshold_s` (the quantile lowered on small windows so that
/// `min_tail_samples` requests lie above it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AbsoluteLatencyParams {
    pub threshold_s: f64,
    pub min_samples: u64,
    pub min_tail_samples: u64,
    /// An instance alerts only when its tail is also this many times its peers' median.
    pub peer_ratio: f64,
}

impl Default for AbsoluteLatencyParams {
    fn default() -> Self {
        AbsoluteLatencyParams {
            threshold_s: 2.0,
            min_samples: 20,
            min_tail_samples: 10,
            peer_ratio: 2.0,
        }
    }
}

impl Validate for AbsoluteLatencyParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.threshold_s.is_finite() && self.threshold_s > 0.0,
            "threshold_s",
            "must be > 0",
        )?;
        check_tail(self.min_samples, self.min_tail_samples, self.peer_ratio)
    }
}

/// Score = tail quantile / threshold; `window` is ascending.
pub fn absolute_latency(window: &[f64], p: &AbsoluteLatencyParams) -> Option<Finding> {
    let n = window.len();
    if n < p.min_samples.max(1) as usize || p.threshold_s <= 0.0 {
        return None;
    }
    let q = effective_quantile(P99, n, p.min_tail_samples)?;
    let v = sorted_quantile(window, q)?;
    if !v.is_finite() || v <= p.threshold_s {
        return None;
    }
    let summary = format!(
        "P{} time to first token is {} over {n} requests, above the {} limit — run the health \
         check: queue depth, KV-cache usage and GPU state",
        pct_label(q),
        duration_s(v),
        duration_s(p.threshold_s)
    );
    Some(
        Finding::new(v / p.threshold_s, summary)
            .with("p99_s", v)
            .with("quantile", q)
            .with("samples", n as u64)
            .with("threshold_s", p.threshold_s),
    )
}

/// threshold = base_ms × (1 + per_prompt_token × prompt_tokens) × (kv_offset − kv_weight × kv_usage)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextThresholdParams {
    pub base_ms: f64,
    pub per_prompt_token: f64,
    pub kv_offset: f64,
    pub kv_weight: f64,
    /// Requests a window needs before its tail is compared.
    pub min_samples: u64,
    /// Requests that must lie above the compared quantile (P99, lowered on small windows).
    pub min_tail_samples: u64,
    /// An instance alerts only when its tail is also this many times its peers' median.
    pub peer_ratio: f64,
}

impl Default for ContextThresholdParams {
    fn default() -> Self {
        ContextThresholdParams {
            base_ms: 1200.0,
            per_prompt_token: 0.002,
            kv_offset: 1.5,
            kv_weight: 0.8,
            min_samples: 20,
            min_tail_samples: 10,
            peer_ratio: 2.0,
        }
    }
}

impl Validate for ContextThresholdParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.base_ms.is_finite() && self.base_ms > 0.0,
            "base_ms",
            "must be > 0",
        )?;
        check(
            self.per_prompt_token.is_finite() && self.per_prompt_token >= 0.0,
            "per_prompt_token",
            "must be ≥ 0",
        )?;
        check(
            self.kv_offset.is_finite()
                && self.kv_weight.is_finite()
                && self.kv_offset - self.kv_weight > 0.0,
            "kv_offset",
            "kv_offset − kv_weight must be > 0 so the threshold stays positive at full KV cache",
        )?;
        check_tail(self.min_samples, self.min_tail_samples, self.peer_ratio)
    }
}

/// The latency limit in seconds for a request with this prompt length at this KV-cache usage
/// (prompt tokens floored at 0, usage clamped to [0, 1]; NaN inputs count as 0).
pub fn context_threshold_s(prompt_tokens: f64, kv_usage: f64, p: &ContextThresholdParams) -> f64 {
    let tokens = if prompt_tokens.is_finite() {
        prompt_tokens.max(0.0)
    } else {
        0.0
    };
    let kv = if kv_usage.is_finite() {
        kv_usage.clamp(0.0, 1.0)
    } else {
        0.0
    };
    p.base_ms / 1000.0 * (1.0 + p.per_prompt_token * tokens) * (p.kv_offset - p.kv_weight * kv)
}

/// Score = latency / threshold. None when any input is not finite or the threshold is ≤ 0.
/// `kv_usage` None: no KV-cache usage is known (none scraped); the limit is then the one for an
/// empty cache — the most lenient, so a missing reading never makes the rule stricter — and the
/// finding says so instead of claiming 0 % usage.
pub fn context_aware_threshold(
    latency_s: f64,
    prompt_tokens: f64,
    kv_usage: Option<f64>,
    p: &ContextThresholdParams,
) -> Option<Finding> {
    if !(latency_s.is_finite() && prompt_tokens.is_finite() && kv_usage.is_none_or(f64::is_finite))
    {
        return None;
    }
    let limit = context_threshold_s(prompt_tokens, kv_usage.unwrap_or(0.0), p);
    if !(limit.is_finite() && limit > 0.0) || latency_s <= limit {
        return None;
    }
    let kv_text = match kv_usage {
        Some(kv) => format!("at {:.0}% KV-cache usage", kv.clamp(0.0, 1.0) * 100.0),
        None => {
            "with no KV-cache usage scraped (the limit assumes an empty cache, its most lenient)"
                .to_string()
        }
    };
    let summary = format!(
        "latency {} exceeds the {} expected for a {prompt_tokens:.0}-token prompt {kv_text} — the \
         slowdown is not explained by context length; check this instance's queue and GPU",
        duration_s(latency_s),
        duration_s(limit),
    );
    let f = Finding::new(latency_s / limit, summary)
        .with("latency_s", latency_s)
        .with("threshold_s", limit)
        .with("prompt_tokens", prompt_tokens);
    Some(match kv_usage {
        Some(kv) => f.with("kv_cache_usage", kv),
        None => f,
    })
}

#[cfg(test)]
#[path = "latency_tests.rs"]
mod tests;
