// Root-cause ranking (spec section 5): a causal graph of detectors/signals with confidence and
// propagation delay, and the ranking of earlier anomalies by path confidence × time alignment.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use tokenwatch_core::alert::{AnomalyEvent, CauseCandidate};

use crate::names::*;
use crate::text::duration_s;
use crate::{ParamError, Validate, check};

/// cause → effect. Node names are detector names, or `signal:<name>` for a raw signal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CausalEdge {
    pub cause: String,
    pub effect: String,
    /// 0..1, how often this cause explains this effect.
    pub confidence: f64,
    /// Typical propagation delay.
    pub delay_ms: i64,
}

/// Log-template anomalies (`tokenwatch::logs`), by the class of their template: the runtime
/// printed a CUDA out-of-memory error, an NCCL timeout, preemption warnings, or another new or
/// jumping error / warning template.
pub const LOG_CUDA_OOM: &str = "log_cuda_oom";
pub const LOG_NCCL_TIMEOUT: &str = "log_nccl_timeout";
pub const LOG_PREEMPTION: &str = "log_preemption";
pub const LOG_ERROR: &str = "log_error";
pub const LOG_WARNING: &str = "log_warning";
/// A GPU reported an XID error (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS` changed to a new code,
/// or its XID count series grew; `tokenwatch::sources::scrape::xid`).
pub const GPU_XID_ERROR: &str = "gpu_xid_error";

fn edge(cause: &str, effect: &str, confidence: f64, delay_ms: i64) -> CausalEdge {
    CausalEdge {
        cause: cause.to_string(),
        effect: effect.to_string(),
        confidence,
        delay_ms,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CausalGraph {
    pub edges: Vec<CausalEdge>,
}

impl Default for CausalGraph {
    /// Spec section 5's chains. The leak chain's numbers are defaults of ours (a leak is seen by
    /// its detector minutes before the KV cache fills; pressure turns into queueing within
    /// seconds); the spec gives cache pollution (0.89, ~142 ms) and CPU contention (0.72, ~86 ms).
    /// "Preemptions/queueing" is part of the kv_cache_pressure detector's own condition.
    fn default() -> Self {
        CausalGraph {
            edges: vec![
                edge(GPU_MEMORY_LEAK, KV_CACHE_PRESSURE, 0.85, 300_000),
                edge(KV_CACHE_PRESSURE, LATENCY_SPIKE, 0.8, 30_000),
                edge(KV_CACHE_PRESSURE, ABSOLUTE_LATENCY, 0.75, 30_000),
                edge(KV_CACHE_PRESSURE, CONTEXT_AWARE_THRESHOLD, 0.7, 30_000),
                // A replica's own metrics shifting (slow or failing requests) follows the
                // same causes as the proxy's latency and error detectors.
                edge(KV_CACHE_PRESSURE, REPLICA_SHIFT, 0.8, 30_000),
                edge(GPU_MEMORY_LEAK, REPLICA_SHIFT, 0.6, 300_000),
                edge(CACHE_POLLUTION, LATENCY_SPIKE, 0.89, 142),
                edge(CACHE_POLLUTION, ABSOLUTE_LATENCY, 0.8, 142),
                edge("cpu_contention", "upstream_timeout", 0.72, 86),
                // Ours: a CUDA OOM or NCCL timeout fails the requests in flight within seconds;
                // preempted sequences are recomputed or swapped, which shows as latency.
                edge(LOG_CUDA_OOM, ERROR_BURST, 0.85, 5_000),
                edge(LOG_CUDA_OOM, SLO_BURN, 0.75, 30_000),
                edge(LOG_NCCL_TIMEOUT, ERROR_BURST, 0.75, 10_000),
                edge(LOG_NCCL_TIMEOUT, SLO_BURN, 0.65, 30_000),
                edge(LOG_PREEMPTION, LATENCY_SPIKE, 0.75, 10_000),
                edge(LOG_PREEMPTION, ABSOLUTE_LATENCY, 0.7, 10_000),
                edge(LOG_PREEMPTION, CONTEXT_AWARE_THRESHOLD, 0.65, 10_000),
                edge(LOG_ERROR, ERROR_BURST, 0.4, 5_000),
                edge(LOG_CUDA_OOM, REPLICA_SHIFT, 0.8, 5_000),
                edge(LOG_PREEMPTION, REPLICA_SHIFT, 0.7, 10_000),
                // Ours: an XID error (a fault, an ECC error, the GPU off the bus) ends or stalls
                // the CUDA work on that GPU: requests in flight fail within seconds, and those
                // retried or queued elsewhere wait longer.
                edge(GPU_XID_ERROR, ERROR_BURST, 0.8, 5_000),
                edge(GPU_XID_ERROR, SLO_BURN, 0.65, 30_000),
                edge(GPU_XID_ERROR, LATENCY_SPIKE, 0.6, 15_000),
                edge(GPU_XID_ERROR, ABSOLUTE_LATENCY, 0.55, 15_000),
                edge(GPU_XID_ERROR, REPLICA_SHIFT, 0.75, 5_000),
            ],
        }
    }
}

impl Validate for CausalGraph {
    fn validate(&self) -> Result<(), ParamError> {
        for e in &self.edges {
            check(
                !e.cause.is_empty() && !e.effect.is_empty() && e.cause != e.effect,
                "edges",
                "cause and effect must be different, non-empty names",
            )?;
            check(
                (0.0..=1.0).contains(&e.confidence),
                "confidence",
                "must be in [0, 1]",
            )?;
            check(e.delay_ms >= 0, "delay_ms", "must be ≥ 0")?;
        }
        Ok(())
    }
}

impl CausalGraph {
    /// Adds configured edges; an edge with the same cause and effect replaces the default.
    pub fn extend(&mut self, edges: impl IntoIterator<Item = CausalEdge>) {
        for e in edges {
            self.edges
                .retain(|x| !(x.cause == e.cause && x.effect == e.effect));
            self.edges.push(e);
        }
    }

    /// Every simple path from `cause` to `effect` of at most `max_len` edges:
    /// (node names, product of confidences, sum of delays).
    pub fn paths(&self, cause: &str, effect: &str, max_len: usize) -> Vec<(Vec<String>, f64, i64)> {
        let mut out = Vec::new();
        let mut path = vec![cause.to_string()];
        self.walk(&mut path, effect, 1.0, 0, max_len, &mut out);
        out
    }

    fn walk(
        &self,
        path: &mut Vec<String>,
        effect: &str,
        conf: f64,
        delay: i64,
        max_len: usize,
        out: &mut Vec<(Vec<String>, f64, i64)>,
    ) {
        if path.len() > max_len {
            return;
        }
        let Some(here) = path.last().cloned() else {
            return;
        };
        for e in self.edges.iter().filter(|e| e.cause == here) {
            if path.contains(&e.effect) {
                continue;
            }
            path.push(e.effect.clone());
            let (c, d) = (conf * e.confidence, delay.saturating_add(e.delay_ms.max(0)));
            if e.effect == effect {
                out.push((path.clone(), c, d));
            } else {
                self.walk(path, effect, c, d, max_len, out);
            }
            path.pop();
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RootCauseParams {
    /// A candidate counts when it was anomalous at most `delay_factor` × path delay + `slack_ms`
    /// before the effect (and not after it).
    pub delay_factor: f64,
    pub slack_ms: i64,
    /// Delays are compared on a scale of at least this much: detection itself works on
    /// windows (60 s by default), so a 142 ms edge cannot be timed more finely than that.
    pub min_delay_scale_ms: i64,
    pub max_path_len: usize,
    /// Labels that must agree when both events carry them (a leak on another instance is no cause).
    pub match_labels: Vec<String>,
    /// (label of one event, label of the other) that must agree when both carry them, either
    /// way round: a GPU's `serving_instance` (`tokenwatch_core::placement`) is the `instance` of
    /// its replica's own events.
    pub paired_labels: Vec<(String, String)>,
}

impl Default for RootCauseParams {
    fn default() -> Self {
        RootCauseParams {
            delay_factor: 3.0,
            slack_ms: 600_000,
            min_delay_scale_ms: 60_000,
            max_path_len: 5,
            match_labels: vec!["instance".to_string(), "model_id".to_string()],
            paired_labels: Vec::new(),
        }
    }
}

impl Validate for RootCauseParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.delay_factor.is_finite() && self.delay_factor >= 1.0,
            "delay_factor",
            "must be ≥ 1",
        )?;
        check(self.slack_ms >= 0, "slack_ms", "must be ≥ 0")?;
        check(
            self.min_delay_scale_ms > 0,
            "min_delay_scale_ms",
            "must be > 0",
        )
    }
}

/// How well an observed delay matches the expected one: 1 / (1 + r²) with
/// r = |observed − expected| / max(expected, min scale). 1.0 on time, 0.5 one scale off,
/// 0.2 two scales off; smooth, and heavy-tailed so a slow cause seen early still ranks.
pub fn alignment(observed_ms: i64, expected_ms: i64, min_scale_ms: i64) -> f64 {
    let scale = expected_ms.max(min_scale_ms).max(1) as f64;
    let r = (observed_ms as f64 - expected_ms as f64).abs() / scale;
    1.0 / (1.0 + r * r)
}

fn node_names(e: &AnomalyEvent) -> [String; 2] {
    [e.detector.clone(), format!("signal:{}", e.signal)]
}

fn labels_agree(a: &AnomalyEvent, b: &AnomalyEvent, p: &RootCauseParams) -> bool {
    let agree = |ka: &str, kb: &str| match (a.labels.get(ka), b.labels.get(kb)) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    };
    p.match_labels.iter().all(|k| agree(k, k))
        && p.paired_labels
            .iter()
            .all(|(x, y)| agree(x, y) && agree(y, x))
}

/// Ranks the candidates that could have caused `effect`: reachable in the graph, anomalous in
/// [effect − (delay_factor × path delay + slack), effect], labels agreeing. Each candidate takes
/// its best path; rank = path confidence × alignment. One entry per (detector, signal, labels),
/// the best; sorted by rank (desc), then the shorter observed delay, then input order.
pub fn rank_causes(
    graph: &CausalGraph,
    effect: &AnomalyEvent,
    candidates: &[AnomalyEvent],
    p: &RootCauseParams,
) -> Vec<CauseCandidate> {
    // (detector, signal, labels) → (input index, best candidate)
    type Key = (String, String, Vec<(String, String)>);
    let mut best: BTreeMap<Key, (usize, CauseCandidate)> = BTreeMap::new();
    for (idx, c) in candidates.iter().enumerate() {
        let observed = effect.at_unix_ms.saturating_sub(c.at_unix_ms);
        if observed < 0 || c == effect || !labels_agree(c, effect, p) {
            continue;
        }
        let mut choice: Option<CauseCandidate> = None;
        for from in node_names(c) {
            for to in node_names(effect) {
                for (path, conf, expected) in graph.paths(&from, &to, p.max_path_len.max(1)) {
                    let window = (expected as f64 * p.delay_factor) as i64 + p.slack_ms.max(0);
                    if observed > window {
                        continue;
                    }
                    let align = alignment(observed, expected, p.min_delay_scale_ms);
                    let rank = conf * align;
                    if choice.as_ref().is_some_and(|x| x.rank >= rank) {
                        continue;
                    }
                    let via = if path.len() > 2 {
                        format!(" via {}", path[1..path.len() - 1].join(" → "))
                    } else {
                        String::new()
                    };
                    let summary = format!(
                        "{} {} before {} (expected ~{}{via}, confidence {:.2}): {}",
                        c.detector,
                        duration_s(observed as f64 / 1000.0),
                        effect.detector,
                        duration_s(expected as f64 / 1000.0),
                        conf,
                        c.summary
                    );
                    choice = Some(CauseCandidate {
                        detector: c.detector.clone(),
                        signal: c.signal.clone(),
                        labels: c.labels.clone(),
                        confidence: conf,
                        expected_delay_ms: expected,
                        observed_delay_ms: observed,
                        alignment: align,
                        rank,
                        path,
                        summary,
                    });
                }
            }
        }
        if let Some(cand) = choice {
            let key = (
                cand.detector.clone(),
                cand.signal.clone(),
                cand.labels.clone().into_iter().collect(),
            );
            match best.get(&key) {
                Some((_, old)) if old.rank >= cand.rank => {}
                _ => {
                    best.insert(key, (idx, cand));
                }
            }
        }
    }
    let mut out: Vec<(usize, CauseCandidate)> = best.into_values().collect();
    out.sort_by(|(ia, a), (ib, b)| {
        b.rank
            .total_cmp(&a.rank)
            .then(a.observed_delay_ms.cmp(&b.observed_delay_ms))
            .then(ia.cmp(ib))
    });
    roots_first(out.into_iter().map(|(_, c)| c).collect())
}

/// Whether `upstream`'s chain to the effect runs through `mid` (an anomaly also observed) and
/// `upstream` was seen no later than `mid`: then `mid` is a link of `upstream`'s chain, not a
/// cause of its own.
fn explains(upstream: &CauseCandidate, mid: &CauseCandidate) -> bool {
    let inner = &upstream.path[1..upstream.path.len().saturating_sub(1).max(1)];
    let mid_nodes = [mid.detector.clone(), format!("signal:{}", mid.signal)];
    upstream.observed_delay_ms >= mid.observed_delay_ms
        && inner.iter().any(|n| mid_nodes.contains(n))
}

/// The first cause of an observed chain ranks first: a leak seen before the KV pressure it
/// causes, both before a latency spike, makes the leak the root cause even though the KV
/// pressure is the closer (and by its single edge, more confident) one. Candidates explained by
/// another one move behind every unexplained one, keeping their order otherwise; the root's
/// summary names the links observed in between.
fn roots_first(ranked: Vec<CauseCandidate>) -> Vec<CauseCandidate> {
    let explained: Vec<bool> = ranked
        .iter()
        .enumerate()
        .map(|(i, c)| {
            ranked
                .iter()
                .enumerate()
                .any(|(j, u)| j != i && explains(u, c))
        })
        .collect();
    let mut roots = Vec::new();
    let mut links = Vec::new();
    for (c, is_link) in ranked.iter().zip(&explained) {
        if *is_link {
            links.push(c.clone());
            continue;
        }
        let seen: Vec<&str> = ranked
            .iter()
            .filter(|m| explains(c, m))
            .map(|m| m.detector.as_str())
            .collect();
        let mut c = c.clone();
        if !seen.is_empty() {
            c.summary = format!(
                "root of an observed chain ({} seen in between) — {}",
                seen.join(", "),
                c.summary
            );
        }
        roots.push(c);
    }
    roots.extend(links);
    roots
}

#[cfg(test)]
#[path = "rootcause_tests.rs"]
mod tests;
