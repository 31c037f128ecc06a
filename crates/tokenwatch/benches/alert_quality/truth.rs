// Ground truth for the yardstick: every replica's own /metrics, read by the bench itself every
// few seconds (independently of tokenwatch), and from it the optimal CUSUM's detection delay for
// each fault — the best any test of the same statistic could do at the same false-alarm budget
// (issue 27, item 3): h / KL per sample for the error rate, for the share of a replica's TTFT or
// ITL beyond 6 × its healthy median, for its per-slot median against its peers', and for GPU
// memory growth. The faulted window is what the replica really served, not what was planned.

use super::procs::{client, http, now_ms};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokenwatch_core::exposition::{self, Format, MetricFamily};
use tokenwatch_core::histogram::CumulativeHistogram;
use tokenwatch_detect::GpuLeakParams;
use tokenwatch_detect::sequential::{self as seq, ReplicaShiftParams};

/// What one replica's /metrics said at one moment (cumulative since it started).
#[derive(Debug, Clone)]
pub struct Snap {
    pub at_ms: i64,
    /// Finished requests (every finished_reason but abort) and those that failed.
    pub finished: f64,
    pub errors: f64,
    pub ttft: Option<CumulativeHistogram>,
    pub itl: Option<CumulativeHistogram>,
    /// GPU framebuffer used (MiB), summed over the replica's GPUs.
    pub gpu_mib: Option<f64>,
}

/// Per instance name, its snapshots in time order.
pub type Record = BTreeMap<String, Vec<Snap>>;
pub type Shared = Arc<Mutex<Record>>;

fn histogram(f: &MetricFamily<'_>) -> Option<CumulativeHistogram> {
    let mut buckets: BTreeMap<u64, f64> = BTreeMap::new();
    for s in f.samples_with_suffix("_bucket") {
        let le = match s.label("le")?.trim() {
            "+Inf" | "Inf" => f64::INFINITY,
            v => v.parse::<f64>().ok()?,
        };
        // Sorted by bound: non-negative f64s order as their bits do.
        *buckets.entry(le.to_bits()).or_default() += s.value;
    }
    if buckets.is_empty() {
        return None;
    }
    let sum = f.samples_with_suffix("_sum").map(|s| s.value).sum();
    let count = f.samples_with_suffix("_count").map(|s| s.value).sum();
    Some(CumulativeHistogram {
        bounds: buckets.keys().map(|b| f64::from_bits(*b)).collect(),
        cumulative: buckets.values().copied().collect(),
        sum,
        count,
    })
}

/// One replica's exposition as a snapshot; None when it does not parse.
pub fn snapshot(text: &str, at_ms: i64) -> Option<Snap> {
    let families = exposition::parse(text, Format::PrometheusText).ok()?;
    let mut snap = Snap {
        at_ms,
        finished: 0.0,
        errors: 0.0,
        ttft: None,
        itl: None,
        gpu_mib: None,
    };
    for f in &families {
        match f.name {
            "vllm:request_success" | "vllm:request_success_total" => {
                // The family is named with or without `_total` depending on the format.
                for s in f.samples.iter().filter(|s| s.name.ends_with("_total")) {
                    match s.label("finished_reason") {
                        Some("abort") => {}
                        Some("error") => {
                            snap.errors += s.value;
                            snap.finished += s.value;
                        }
                        _ => snap.finished += s.value,
                    }
                }
            }
            "vllm:time_to_first_token_seconds" => snap.ttft = histogram(f),
            "vllm:inter_token_latency_seconds" => snap.itl = histogram(f),
            "DCGM_FI_DEV_FB_USED" => {
                let used: f64 = f.samples.iter().map(|s| s.value).sum();
                snap.gpu_mib = Some(snap.gpu_mib.unwrap_or(0.0) + used);
            }
            _ => {}
        }
    }
    Some(snap)
}

/// Read every replica's /metrics every `every` until `stop`.
pub fn spawn(
    sims: Vec<(String, SocketAddr)>,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Shared {
    let shared: Shared = Default::default();
    let out = shared.clone();
    tokio::spawn(async move {
        let c = client();
        loop {
            for (name, addr) in &sims {
                let url = format!("http://{addr}/metrics");
                if let Ok((200, body)) = http(&c, "GET", &url, None).await
                    && let Some(s) = snapshot(&body, now_ms())
                {
                    let mut rec = out.lock().unwrap_or_else(|p| p.into_inner());
                    rec.entry(name.clone()).or_default().push(s);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.wait_for(|v| *v) => return,
            }
        }
    });
    shared
}

pub fn copy(s: &Shared) -> Record {
    s.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The snapshot taken last at or before `t` (the first one when none is).
fn at(snaps: &[Snap], t: i64) -> Option<&Snap> {
    let i = snaps.partition_point(|s| s.at_ms <= t);
    snaps.get(i.saturating_sub(1))
}

/// What a replica served between `from` and `to` (ms): finished, failed, TTFT and ITL.
struct Window {
    seconds: f64,
    finished: f64,
    errors: f64,
    ttft: Option<CumulativeHistogram>,
    itl: Option<CumulativeHistogram>,
}

fn window(snaps: &[Snap], from: i64, to: i64) -> Option<Window> {
    let (a, b) = (at(snaps, from)?, at(snaps, to)?);
    if b.at_ms <= a.at_ms {
        return None;
    }
    let delta = |x: &Option<CumulativeHistogram>, y: &Option<CumulativeHistogram>| match (x, y) {
        (Some(x), Some(y)) => Some(y.delta_since(x)),
        _ => None,
    };
    Some(Window {
        seconds: (b.at_ms - a.at_ms) as f64 / 1000.0,
        finished: (b.finished - a.finished).max(0.0),
        errors: (b.errors - a.errors).max(0.0),
        ttft: delta(&a.ttft, &b.ttft),
        itl: delta(&a.itl, &b.itl),
    })
}

/// Share of observations beyond `t`.
fn share_above(h: &CumulativeHistogram, t: f64) -> Option<f64> {
    let n = *h.cumulative.last()?;
    (n > 0.0).then(|| h.count_above(t).unwrap_or(0.0) / n)
}

/// The optimal Bernoulli CUSUM's delay (s): `rate` trials a second, `p0` → `p1`.
fn bernoulli_bound(period_s: f64, rate: f64, p0: f64, p1: f64) -> f64 {
    let p0 = p0.max(1e-4);
    if rate <= 0.0 || p1 <= p0 {
        return f64::INFINITY;
    }
    let h = seq::cusum_threshold(period_s, rate, 1);
    seq::optimal_delay_samples(h, p1, p0) / rate
}

/// The fault's yardstick (seconds from its start), before adding a scrape interval: the best of
/// the optimal tests of every statistic that sees it on `instance` (peers: the model's other
/// replicas). Healthy reference: the 30 minutes before the fault (as much as there is).
pub fn bound_s(
    rec: &Record,
    instance: &str,
    peers: &[String],
    start_ms: i64,
    end_ms: i64,
    scrape_s: f64,
) -> f64 {
    let Some(snaps) = rec.get(instance) else {
        return f64::INFINITY;
    };
    let period_s = ReplicaShiftParams::default().false_page_days * 86_400.0;
    let healthy_from = start_ms - 30 * 60_000;
    let (Some(h), Some(f)) = (
        window(snaps, healthy_from, start_ms),
        window(snaps, start_ms, end_ms),
    ) else {
        return f64::INFINITY;
    };
    let mut best = f64::INFINITY;
    let rate = f.finished / f.seconds.max(1e-9);
    // Errors.
    if h.finished > 0.0 && f.finished > 0.0 {
        best = best.min(bernoulli_bound(
            period_s,
            rate,
            h.errors / h.finished,
            f.errors / f.finished,
        ));
    }
    // Tails: share beyond 6 × the healthy median (ITL per request, as the detector counts it).
    let multiple = ReplicaShiftParams::default().own_multiple;
    for (hh, fh) in [(&h.ttft, &f.ttft), (&h.itl, &f.itl)] {
        let (Some(hh), Some(fh)) = (hh, fh) else {
            continue;
        };
        let Some(median) = hh.quantile(0.5) else {
            continue;
        };
        let t = multiple * median.value;
        if let (Some(p0), Some(p1)) = (share_above(hh, t), share_above(fh, t)) {
            best = best.min(bernoulli_bound(period_s, rate, p0, p1));
        }
    }
    // Location: each slot's log(median / peers' median) (the detector's slot length), the 30
    // healthy minutes' slots against the faulted ones.
    let step_s = ReplicaShiftParams::default().location_step_s;
    let step_ms = (step_s * 1000.0) as i64;
    for pick in [|s: &Snap| s.ttft.clone(), |s: &Snap| s.itl.clone()] {
        let slot_ratio = |m0: i64| -> Option<f64> {
            let own = |snaps: &[Snap]| -> Option<CumulativeHistogram> {
                let (a, b) = (at(snaps, m0)?, at(snaps, m0 + step_ms)?);
                Some(pick(b)?.delta_since(&pick(a)?))
            };
            let mine = own(snaps)?.quantile(0.5)?.value;
            let mut merged: Option<CumulativeHistogram> = None;
            for p in peers {
                if let Some(h) = rec.get(p).and_then(|s| own(s)) {
                    match merged.as_mut() {
                        Some(m) => {
                            m.add(&h);
                        }
                        None => merged = Some(h),
                    }
                }
            }
            let theirs = merged?.quantile(0.5)?.value;
            (mine > 0.0 && theirs > 0.0).then(|| (mine / theirs).ln())
        };
        let healthy: Vec<f64> = (0..30 * 60_000 / step_ms)
            .map(|k| start_ms - (k + 1) * step_ms)
            .filter(|m| *m >= snaps[0].at_ms)
            .filter_map(slot_ratio)
            .collect();
        let faulted: Vec<f64> = (0..)
            .map(|k| start_ms + k * step_ms)
            .take_while(|m| m + step_ms <= end_ms)
            .filter_map(slot_ratio)
            .collect();
        if let (Some((mu, sd)), Some(shifted)) = (
            seq::mean_sd(&healthy),
            (!faulted.is_empty()).then(|| faulted.iter().sum::<f64>() / faulted.len() as f64),
        ) {
            // The detector's floor on the spread (MIN_LOG_RATIO_SPREAD).
            let delta = (shifted - mu) / sd.max(0.02);
            best = best.min(seq::location_delay_s(delta, step_s, period_s));
        }
    }
    // GPU memory: growth per scrape interval against its healthy spread (at least 8 MiB, the
    // leak test's floor).
    let mib = |s: &&Snap| s.gpu_mib;
    let healthy_mem: Vec<(i64, f64)> = snaps
        .iter()
        .filter(|s| s.at_ms >= healthy_from && s.at_ms <= start_ms)
        .filter_map(|s| Some((s.at_ms, mib(&s)?)))
        .collect();
    let fault_mem: Vec<(i64, f64)> = snaps
        .iter()
        .filter(|s| s.at_ms >= start_ms && s.at_ms <= end_ms)
        .filter_map(|s| Some((s.at_ms, mib(&s)?)))
        .collect();
    if let (Some(first), Some(last)) = (fault_mem.first(), fault_mem.last())
        && last.0 > first.0
    {
        let growth_mib_s = (last.1 - first.1) / ((last.0 - first.0) as f64 / 1000.0);
        let steps: Vec<f64> = healthy_mem
            .windows(2)
            .map(|w| (w[1].1 - w[0].1) / ((w[1].0 - w[0].0) as f64 / 1000.0) * scrape_s)
            .collect();
        let sigma_mib = seq::mean_sd(&steps).map_or(0.0, |(_, sd)| sd).max(8.0);
        if growth_mib_s > 0.0 {
            const MIB: f64 = 1024.0 * 1024.0;
            best = best.min(tokenwatch_detect::leak::leak_bound_s(
                growth_mib_s * MIB,
                sigma_mib * MIB,
                scrape_s,
                &GpuLeakParams::default(),
            ));
        }
    }
    best
}

/// Requests per second `instance` finished between `from` and `to` (ms).
pub fn served_per_s(rec: &Record, instance: &str, from: i64, to: i64) -> f64 {
    rec.get(instance)
        .and_then(|s| window(s, from, to))
        .map_or(0.0, |w| w.finished / w.seconds.max(1e-9))
}
