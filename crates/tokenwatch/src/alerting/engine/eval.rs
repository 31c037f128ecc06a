// One rule's evaluation: reads its inputs (record windows, signal histories, spans), runs the
// tokenwatch-detect detector, and returns the anomaly events found (none = condition absent).

use super::inputs::{self, Inputs, Rec, quantile, values};
use crate::alerting::rules::{DetectorKind, Rule};
use std::collections::{BTreeMap, HashMap};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::signals::{SignalBoard, names};
use tokenwatch_detect as det;

/// Fewest requests in a window before a windowed detector without its own minimum may fire.
pub const MIN_WINDOW_SAMPLES: usize = 20;

/// What one evaluation sees.
pub struct EvalCtx<'a> {
    pub inputs: &'a Inputs,
    pub board: &'a SignalBoard,
    /// Records ingested since the previous evaluation (per-request detectors).
    pub new_records: &'a [Rec],
    /// Recent spans: (root trace id, reports CUDA OOM).
    pub spans: &'a [(String, bool)],
    /// Models whose semantic drift is ongoing (for the joint grade of per-request anomalies).
    pub semantic_drift_models: &'a std::collections::BTreeSet<String>,
    pub now: i64,
}

/// Per-rule detector state (stateful detectors, periodic detectors' last result).
#[derive(Default)]
pub struct RuleState {
    /// Output length outliers: per-model detectors and pending annotations (`length.rs`).
    length: super::length::LengthState,
    kl: HashMap<String, det::KlDrift>,
    decay: HashMap<String, det::PromptVersionDecay>,
    last_period_ms: Option<i64>,
    held: Vec<AnomalyEvent>,
    /// Semantic drift, drift vote and cache pollution (`quality.rs`).
    quality: super::quality::QualityState,
    /// Latency and error-burst series: episodes and frozen baselines (`latency.rs`, `burst.rs`).
    series: super::latency::SeriesState,
}

impl RuleState {
    /// Per-request annotations made since the last call (the engine stores them).
    pub fn take_annotations(&mut self) -> Vec<tokenwatch_store::AnnotationRow> {
        self.length.take_annotations()
    }
}

/// An event of a model-level detector: labelled by `model_id` alone.
fn model_event(
    f: det::Finding,
    detector: &str,
    signal: &str,
    model: &str,
    now: i64,
) -> AnomalyEvent {
    f.into_event(detector, signal, labels(&[("model_id", model)]), now)
}

/// Event labels from (name, value) pairs, leaving out empty values.
pub(super) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn evaluate(rule: &Rule, st: &mut RuleState, cx: &EvalCtx) -> Vec<AnomalyEvent> {
    let now = cx.now;
    let w = rule.window_ms;
    let mut out = Vec::new();
    let det_name = rule.detector.as_str();
    match &rule.kind {
        DetectorKind::LatencySpike(p) => {
            out.extend(super::latency::spike(rule, p, &mut st.series, cx));
        }
        DetectorKind::AbsoluteLatency(p) => out.extend(super::latency::absolute(rule, p, cx)),
        DetectorKind::ContextAware(p) => out.extend(super::latency::context(rule, p, cx)),
        DetectorKind::GpuLeak(p) => {
            for s in inputs::signal_series(cx.board, names::GPU_MEMORY_USED_BYTES, now - w) {
                let util = inputs::history(
                    cx.board,
                    &s.model,
                    names::GPU_UTILIZATION,
                    &s.instance,
                    &s.device,
                    now - w,
                );
                let total = inputs::history(
                    cx.board,
                    &s.model,
                    names::GPU_MEMORY_TOTAL_BYTES,
                    &s.instance,
                    &s.device,
                    now - w,
                )
                .last()
                .map(|(_, v)| *v)
                .unwrap_or(0.0);
                if let Some(f) = det::gpu_memory_leak(&s.history, &util, total, p) {
                    let l = labels(&[
                        ("model_id", &s.model),
                        ("instance", &s.instance),
                        ("device_id", &s.device),
                    ]);
                    out.push(f.into_event(det_name, names::GPU_MEMORY_USED_BYTES, l, now));
                }
            }
        }
        DetectorKind::KvPressure(p) => {
            for s in inputs::signal_series(cx.board, names::KV_CACHE_USAGE, now - w) {
                let pre = inputs::history(
                    cx.board,
                    &s.model,
                    names::PREEMPTIONS_PER_SECOND,
                    &s.instance,
                    &s.device,
                    now - w,
                );
                let wait = inputs::history(
                    cx.board,
                    &s.model,
                    names::REQUESTS_WAITING,
                    &s.instance,
                    &s.device,
                    now - w,
                );
                if let Some(f) = det::kv_cache_pressure(&s.history, &pre, &wait, p) {
                    let l = labels(&[("model_id", &s.model), ("instance", &s.instance)]);
                    out.push(f.into_event(det_name, names::KV_CACHE_USAGE, l, now));
                }
            }
        }
        DetectorKind::LengthOutlier(p) => {
            out.extend(super::length::evaluate(det_name, p, w, &mut st.length, cx));
        }
        DetectorKind::KsDrift(p) => {
            for m in cx.inputs.models() {
                let cur = values(cx.inputs.window(&m, now - w, now), &rule.signal);
                let reference = values(cx.inputs.window(&m, now - 7 * w, now - w), &rule.signal);
                if let Some(f) = det::ks_drift(&reference, &cur, p) {
                    out.push(model_event(f, det_name, &rule.signal, &m, now));
                }
            }
        }
        DetectorKind::KlDrift(p) => {
            if periodic(st, now, w) {
                let mut held = Vec::new();
                for m in cx.inputs.models() {
                    let dist = |from: i64, to: i64| -> BTreeMap<String, f64> {
                        let mut d = BTreeMap::new();
                        for r in cx
                            .inputs
                            .window(&m, from, to)
                            .filter(|r| r.ok && !r.finish_reason.is_empty())
                        {
                            *d.entry(r.finish_reason.clone()).or_insert(0.0) += 1.0;
                        }
                        d
                    };
                    let (base, cur) = (dist(now - 7 * w, now - w), dist(now - w, now));
                    if base.values().sum::<f64>() < MIN_WINDOW_SAMPLES as f64
                        || cur.values().sum::<f64>() < MIN_WINDOW_SAMPLES as f64
                    {
                        continue;
                    }
                    let d = st
                        .kl
                        .entry(m.clone())
                        .or_insert_with(|| det::KlDrift::new(p.clone()));
                    if let Some(f) = d.evaluate(&base, &cur) {
                        held.push(model_event(f, det_name, "finish_reason", &m, now));
                    }
                }
                st.held = held;
            }
            out.extend(st.held.iter().cloned());
        }
        DetectorKind::SemanticDrift(p) => {
            out.extend(super::quality::semantic_drift(rule, p, &mut st.quality, cx));
        }
        DetectorKind::DriftVote(p) => {
            out.extend(super::quality::drift_vote(rule, p, &mut st.quality, cx));
        }
        DetectorKind::CachePollution(p) => {
            out.extend(super::quality::cache_pollution(
                rule,
                p,
                &mut st.quality,
                cx,
            ));
        }
        DetectorKind::SloBurn(p) => {
            for m in cx.inputs.models() {
                let bw = det::BurnWindows {
                    h1: cx.inputs.counts(&m, now, 3_600_000),
                    m5: cx.inputs.counts(&m, now, 300_000),
                    h6: cx.inputs.counts(&m, now, 6 * 3_600_000),
                    m30: cx.inputs.counts(&m, now, 1_800_000),
                };
                if let Some(f) = det::slo_burn(&bw, p) {
                    out.push(model_event(f, det_name, "success_ratio", &m, now));
                }
            }
        }
        DetectorKind::ErrorBurst(p) => {
            out.extend(super::burst::error_burst(rule, p, &mut st.series, cx));
        }
        DetectorKind::BatchJitter(p) => {
            for m in cx.inputs.models() {
                let (mut lat, mut batch) = (Vec::new(), Vec::new());
                let mut running: HashMap<String, Vec<(i64, f64)>> = HashMap::new();
                for r in cx.inputs.window(&m, now - w, now).filter(|r| r.ok) {
                    let Some(itl) = r.itl else { continue };
                    let h = running.entry(r.instance.clone()).or_insert_with(|| {
                        inputs::history(
                            cx.board,
                            &m,
                            names::REQUESTS_RUNNING,
                            &r.instance,
                            "",
                            now - 2 * w,
                        )
                    });
                    let Some((_, b)) = h.iter().min_by_key(|(t, _)| (t - r.at_ms).abs()) else {
                        continue;
                    };
                    lat.push(itl);
                    batch.push(*b);
                }
                if let Some(f) = det::batch_jitter(&lat, &batch, p) {
                    out.push(model_event(f, det_name, "itl_seconds", &m, now));
                }
            }
        }
        DetectorKind::TripleSignal(p) => {
            for s in inputs::signal_series(cx.board, names::PREFIX_CACHE_HIT_RATE, now - w) {
                let Some((_, hit)) = s.history.last().copied() else {
                    continue;
                };
                let util = inputs::latest(
                    cx.board,
                    &s.model,
                    names::GPU_UTILIZATION,
                    Some(&s.instance),
                )
                .or_else(|| inputs::latest(cx.board, &s.model, names::GPU_UTILIZATION, None));
                let acc = inputs::latest(
                    cx.board,
                    &s.model,
                    names::SPEC_DECODE_ACCEPTANCE_RATE,
                    Some(&s.instance),
                );
                let (Some(util), Some(acc)) = (util, acc) else {
                    continue;
                };
                if let Some(f) = det::triple_signal_health(util, hit, acc, p) {
                    let l = labels(&[("model_id", &s.model), ("instance", &s.instance)]);
                    out.push(f.into_event(det_name, names::PREFIX_CACHE_HIT_RATE, l, now));
                }
            }
        }
        DetectorKind::AbRegression(p, share_b) => {
            for m in cx.inputs.models() {
                let win: Vec<&Rec> = cx.inputs.window(&m, now - w, now).collect();
                let mut groups: Vec<&str> = win
                    .iter()
                    .map(|r| r.ab_group.as_str())
                    .filter(|g| !g.is_empty())
                    .collect();
                groups.sort();
                groups.dedup();
                if groups.len() != 2 {
                    continue;
                }
                let arm = |g: &str| {
                    let rs: Vec<&Rec> = win.iter().copied().filter(|r| r.ab_group == g).collect();
                    let mut v = values(rs.iter().copied(), &rule.signal);
                    v.sort_by(f64::total_cmp);
                    let stats = det::ArmStats {
                        requests: rs.len() as u64,
                        p99_s: quantile(v.clone(), 0.99).unwrap_or(0.0),
                        quality: None,
                        toxicity: None,
                    };
                    (stats, v)
                };
                let ((a, va), (b, vb)) = (arm(groups[0]), arm(groups[1]));
                let tuned = ab_noise_floor(p, (&a, &va), (&b, &vb), *share_b);
                if let Some(f) = det::ab_regression(&a, &b, *share_b, &tuned) {
                    let f = f
                        .with("arm_a", groups[0])
                        .with("arm_b", groups[1])
                        .with("p99_increase_required", tuned.p99_increase)
                        .with("split_tolerance_points", tuned.split_tolerance * 100.0);
                    out.push(model_event(f, det_name, &rule.signal, &m, now));
                }
            }
        }
        DetectorKind::PromptDecay(p) => {
            if periodic(st, now, w) {
                let mut held = Vec::new();
                for m in cx.inputs.models() {
                    let mut per: BTreeMap<String, (u64, u64)> = BTreeMap::new();
                    for r in cx
                        .inputs
                        .window(&m, now - w, now)
                        .filter(|r| !r.prompt_version.is_empty())
                    {
                        let e = per.entry(r.prompt_version.clone()).or_default();
                        e.0 += u64::from(r.ok);
                        e.1 += 1;
                    }
                    let d = st
                        .decay
                        .entry(m.clone())
                        .or_insert_with(|| det::PromptVersionDecay::new(p.clone()));
                    for (v, (ok, n)) in per {
                        if (n as usize) < MIN_WINDOW_SAMPLES {
                            continue;
                        }
                        if let Some(f) = d.observe_period(&v, ok as f64 / n as f64) {
                            held.push(f.into_event(
                                det_name,
                                "success_ratio",
                                labels(&[("model_id", &m), ("prompt_version", &v)]),
                                now,
                            ));
                        }
                    }
                }
                st.held = held;
            }
            out.extend(st.held.iter().cloned());
        }
        DetectorKind::Topology(p) => {
            let mut seen = std::collections::HashSet::new();
            let mut gpus = Vec::new();
            for s in inputs::signal_series(cx.board, names::GPU_UTILIZATION, now - 30_000) {
                // Sustained: the lowest of the last `min_points` samples is what counts.
                let n = p.min_points.max(1);
                let (Some(bus), true) = (s.notes.get("pci_bus_id"), s.history.len() >= n) else {
                    continue;
                };
                let u = s.history[s.history.len() - n..]
                    .iter()
                    .map(|(_, v)| *v)
                    .fold(f64::INFINITY, f64::min);
                let id = if s.device.is_empty() {
                    bus.clone()
                } else {
                    s.device.clone()
                };
                if seen.insert(format!("{}/{id}", s.instance)) {
                    gpus.push(det::GpuUtilReading {
                        device_id: id,
                        pci_switch: format!("{}/{}", s.instance, det::pci_switch_of(bus)),
                        sm_utilization: u,
                    });
                }
            }
            for (switch, devices) in det::topology_convergence(&gpus, p.min_gpus, p.utilization) {
                let f = det::Finding::new(devices.len() as f64 / p.min_gpus.max(1) as f64, format!(
                    "{} GPUs behind PCIe switch {switch} are above {:.0}% utilisation; treat them as one saturated group",
                    devices.len(),
                    p.utilization * 100.0
                ))
                .with("devices", devices.clone());
                out.push(f.into_event(
                    det_name,
                    names::GPU_UTILIZATION,
                    labels(&[("pci_switch", &switch)]),
                    now,
                ));
            }
        }
        DetectorKind::CallChain(p) => {
            let traces = det::call_chain_convergence(cx.spans, p.min_spans);
            if !traces.is_empty() {
                let f = det::Finding::new(1.0, format!(
                    "{} trace(s) with at least {} spans reporting CUDA out-of-memory: one failure spreading along the call chain",
                    traces.len(),
                    p.min_spans
                ))
                .with("trace_ids", traces);
                out.push(f.into_event(det_name, "span_status", BTreeMap::new(), now));
            }
        }
        DetectorKind::Threshold(p) => {
            for s in inputs::signal_series(cx.board, &rule.signal, now - w) {
                let Some((_, v)) = s.history.last().copied() else {
                    continue;
                };
                let hit = match p.op.as_str() {
                    ">" => v > p.value,
                    ">=" => v >= p.value,
                    "<" => v < p.value,
                    _ => v <= p.value,
                };
                if hit {
                    let score = if p.value != 0.0 {
                        (v / p.value).abs()
                    } else {
                        1.0
                    };
                    let f = det::Finding::new(
                        score,
                        format!("{} is {v} ({} {})", rule.signal, p.op, p.value),
                    )
                    .with("value", v)
                    .with("threshold", p.value);
                    let l = labels(&[
                        ("model_id", &s.model),
                        ("instance", &s.instance),
                        ("device_id", &s.device),
                    ]);
                    out.push(f.into_event(det_name, &rule.signal, l, now));
                }
            }
        }
    }
    out
}

/// Standard errors of the observed B share a split deviation must exceed (two-sided p ≈ 0.001).
const SPLIT_Z: f64 = 3.3;
/// z of each arm's P99 confidence bound (two-sided 99%).
const P99_Z: f64 = 2.58;

/// Spec 4's statistical hygiene for A/B: thresholds never sit inside sampling noise. The split
/// tolerance is at least `SPLIT_Z` binomial standard errors of the share at this sample size, and
/// a P99 rise counts only when B's P99 lower bound clears A's upper bound by the configured
/// margin (distribution-free order-statistic bounds). Large windows keep the spec's thresholds.
fn ab_noise_floor(
    p: &det::AbRegressionParams,
    (a, a_sorted): (&det::ArmStats, &[f64]),
    (b, b_sorted): (&det::ArmStats, &[f64]),
    target_share_b: f64,
) -> det::AbRegressionParams {
    let mut t = p.clone();
    let n = (a.requests + b.requests) as f64;
    if n > 0.0 {
        let se = (target_share_b * (1.0 - target_share_b) / n).sqrt();
        t.split_tolerance = p.split_tolerance.max(SPLIT_Z * se);
    }
    let bounds = (
        quantile_bound(a_sorted, 0.99, true),
        quantile_bound(b_sorted, 0.99, false),
    );
    if let (Some(a_hi), Some(b_lo)) = bounds
        && a.p99_s > 0.0
        && b_lo > 0.0
    {
        let need = (1.0 + p.p99_increase) * (a_hi / a.p99_s) * (b.p99_s / b_lo) - 1.0;
        t.p99_increase = p.p99_increase.max(need);
    }
    t
}

/// Upper (or lower) confidence bound of quantile `q` of ascending `v`: the order statistic at
/// rank n·q ± z·√(n·q·(1−q)), clamped to the sample.
fn quantile_bound(v: &[f64], q: f64, upper: bool) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    let half = P99_Z * (n * q * (1.0 - q)).sqrt();
    let rank = if upper {
        (n * q + half).ceil()
    } else {
        (n * q - half).floor()
    };
    Some(v[(rank.max(1.0) as usize).clamp(1, v.len()) - 1])
}

/// True once per period (the first call, then every `period_ms`).
fn periodic(st: &mut RuleState, now: i64, period_ms: i64) -> bool {
    match st.last_period_ms {
        Some(t) if now - t < period_ms => false,
        _ => {
            st.last_period_ms = Some(now);
            true
        }
    }
}

#[cfg(test)]
mod ab_tests {
    use super::*;

    fn arm(v: &[f64], requests: u64) -> (det::ArmStats, Vec<f64>) {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let stats = det::ArmStats {
            requests,
            p99_s: quantile(s.clone(), 0.99).unwrap_or(0.0),
            quality: None,
            toxicity: None,
        };
        (stats, s)
    }

    /// Deterministic jittered latencies around `base` (±20%).
    fn lat(base: f64, n: usize, seed: u64) -> Vec<f64> {
        (0..n)
            .map(|i| {
                let x = ((i as u64 * 2_654_435_761 + seed * 40_503) % 1000) as f64 / 1000.0;
                base * (0.8 + 0.4 * x)
            })
            .collect()
    }

    #[test]
    fn noise_sized_split_and_p99_gaps_are_not_findings() {
        let p = det::AbRegressionParams {
            min_requests: 60,
            ..Default::default()
        };
        // 66 vs 75 requests (B at 46.8%) and P99s 4% apart: chance at this sample size.
        let (a, va) = arm(&lat(0.062, 75, 1), 75);
        let (b, vb) = arm(&lat(0.064, 66, 2), 66);
        let t = ab_noise_floor(&p, (&a, &va), (&b, &vb), 0.5);
        assert!(t.split_tolerance > 0.12, "{}", t.split_tolerance);
        assert!(det::ab_regression(&a, &b, 0.5, &t).is_none());
        // B twice as slow, and a 75/25 split: both still found.
        let (b2, vb2) = arm(&lat(0.13, 66, 3), 66);
        let t = ab_noise_floor(&p, (&a, &va), (&b2, &vb2), 0.5);
        let f = det::ab_regression(&a, &b2, 0.5, &t).expect("a real regression");
        assert_eq!(f.evidence["latency_regression"], true);
        let (b3, vb3) = arm(&lat(0.062, 25, 4), 25);
        let (a3, va3) = arm(&lat(0.062, 75, 5), 75);
        let p3 = det::AbRegressionParams {
            min_requests: 20,
            ..Default::default()
        };
        let t = ab_noise_floor(&p3, (&a3, &va3), (&b3, &vb3), 0.5);
        let f = det::ab_regression(&a3, &b3, 0.5, &t).expect("a real split deviation");
        assert_eq!(f.evidence["split_deviation"], true);
    }

    #[test]
    fn large_windows_keep_the_spec_thresholds() {
        let p = det::AbRegressionParams::default();
        let (a, va) = arm(&vec![0.1; 20_000], 20_000);
        let (b, vb) = arm(&vec![0.1; 20_000], 20_000);
        let t = ab_noise_floor(&p, (&a, &va), (&b, &vb), 0.5);
        assert_eq!(t.split_tolerance, p.split_tolerance);
        assert!((t.p99_increase - p.p99_increase).abs() < 1e-9);
        assert_eq!(quantile_bound(&[], 0.99, true), None);
        assert_eq!(quantile_bound(&[1.0, 2.0, 3.0], 0.99, false), Some(2.0));
        assert_eq!(quantile_bound(&[1.0, 2.0, 3.0], 0.99, true), Some(3.0));
    }
}
