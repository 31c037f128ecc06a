// What an alert carries when it fires: the ranked root-cause chain over recent anomaly onsets,
// the per-request latency breakdown (latency symptoms) and the eviction ranking (GPU memory).

use super::inputs::{self, Inputs, Rec, quantile, values};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use tokenwatch_core::alert::{AnomalyEvent, CauseCandidate};
use tokenwatch_core::signals::{SignalBoard, names};
use tokenwatch_detect as det;

/// A gap longer than this between two events of one (detector, labels) starts a new episode.
const EPISODE_GAP_MS: i64 = 60_000;
const MAX_ONSETS: usize = 5_000;
/// Requests averaged in the latency breakdown.
const SLOWEST: usize = 10;

/// Recent anomalies, one onset event per episode, for root-cause ranking.
pub struct EventHistory {
    current: HashMap<(String, BTreeMap<String, String>), (AnomalyEvent, i64)>,
    past: VecDeque<AnomalyEvent>,
    lookback_ms: i64,
}

impl EventHistory {
    pub fn new(lookback_ms: i64) -> EventHistory {
        EventHistory {
            current: HashMap::new(),
            past: VecDeque::new(),
            lookback_ms,
        }
    }

    pub fn record(&mut self, e: &AnomalyEvent) {
        let key = (e.detector.clone(), e.labels.clone());
        match self.current.get_mut(&key) {
            Some((_, last)) if e.at_unix_ms - *last <= EPISODE_GAP_MS => {
                *last = (*last).max(e.at_unix_ms)
            }
            _ => {
                if let Some((old, _)) = self.current.insert(key, (e.clone(), e.at_unix_ms)) {
                    self.past.push_back(old);
                    if self.past.len() > MAX_ONSETS {
                        self.past.pop_front();
                    }
                }
            }
        }
    }

    pub fn prune(&mut self, now: i64) {
        let keep = self.lookback_ms;
        self.current.retain(|_, (_, last)| now - *last <= keep);
        self.past.retain(|e| now - e.at_unix_ms <= keep);
    }

    /// Models (`model_id` label) with an episode of `detector` still going on at `now`.
    pub fn models_with_ongoing(&self, detector: &str, now: i64) -> BTreeSet<String> {
        self.current
            .iter()
            .filter(|((d, _), (_, last))| d == detector && now - *last <= EPISODE_GAP_MS)
            .filter_map(|((_, labels), _)| labels.get("model_id").cloned())
            .collect()
    }

    /// Onsets of every episode still in the lookback.
    pub fn onsets(&self) -> Vec<AnomalyEvent> {
        self.past
            .iter()
            .cloned()
            .chain(self.current.values().map(|(e, _)| e.clone()))
            .collect()
    }
}

/// Events raised outside the rules (log-template anomalies, `crate::logs`), taken into the
/// history at the next evaluation so they rank as causes like any detector's. Bounded: the
/// oldest are dropped when the engine does not keep up (or alerting is off).
#[derive(Clone, Default)]
pub struct EventInbox(std::sync::Arc<std::sync::Mutex<VecDeque<AnomalyEvent>>>);

impl EventInbox {
    const CAPACITY: usize = 1_000;

    pub fn push(&self, e: AnomalyEvent) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= Self::CAPACITY {
            q.pop_front();
        }
        q.push_back(e);
    }

    pub fn take(&self) -> Vec<AnomalyEvent> {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        q.drain(..).collect()
    }
}

/// The evidence (template, example lines) of the log-template anomalies among `causes`, as a
/// JSON array, from their onset events in the history; None when no cause is one.
pub fn log_evidence(causes: &[CauseCandidate], history: &EventHistory) -> Option<String> {
    let onsets = history.onsets();
    let found: Vec<serde_json::Value> = causes
        .iter()
        .filter(|c| c.detector.starts_with("log_"))
        .filter_map(|c| {
            onsets
                .iter()
                .find(|e| e.detector == c.detector && e.labels == c.labels)
                .map(|e| serde_json::json!({"detector": e.detector, "labels": e.labels, "evidence": e.evidence}))
        })
        .collect();
    (!found.is_empty()).then(|| serde_json::Value::Array(found).to_string())
}

/// Rank the recent anomalies that could have caused `effect` (other detectors only).
pub fn root_cause(
    graph: &det::CausalGraph,
    effect: &AnomalyEvent,
    history: &EventHistory,
) -> Vec<CauseCandidate> {
    let candidates: Vec<AnomalyEvent> = history
        .onsets()
        .into_iter()
        .filter(|e| e.detector != effect.detector && e.at_unix_ms <= effect.at_unix_ms)
        .collect();
    // Only the model must agree: device-level series name their instance after the exporter's
    // host (DCGM `Hostname`), runtime series after the scrape target, so `instance` differs
    // between a GPU leak and the KV pressure it causes on the same server.
    let params = det::RootCauseParams {
        match_labels: vec!["model_id".into()],
        ..det::RootCauseParams::default()
    };
    let mut ranked = det::rank_causes(graph, effect, &candidates, &params);
    ranked.truncate(5);
    ranked
}

/// Mean queue / prefill / decode / network-proxy seconds of the slowest requests of `model`.
pub fn latency_breakdown(recs: &[&Rec]) -> Option<(String, serde_json::Value)> {
    let mut slow: Vec<&Rec> = recs
        .iter()
        .copied()
        .filter(|r| r.ok && r.ttft.is_some())
        .collect();
    if slow.is_empty() {
        return None;
    }
    slow.sort_by(|a, b| b.e2e.total_cmp(&a.e2e));
    slow.truncate(SLOWEST);
    let n = slow.len() as f64;
    let (mut q, mut pf, mut dc, mut net) = (0.0, 0.0, 0.0, 0.0);
    for r in &slow {
        let ttft = r.ttft.unwrap_or(0.0);
        let queue = r.queue.unwrap_or(0.0).max(0.0);
        let network = r
            .headers
            .map(|h| (h - queue).max(0.0))
            .unwrap_or(0.0)
            .min(ttft);
        q += queue;
        net += network;
        pf += (ttft - queue - network).max(0.0);
        dc += (r.e2e - ttft).max(0.0);
    }
    let (q, pf, dc, net) = (q / n, pf / n, dc / n, net / n);
    let text = format!(
        "queue {q:.3} s, prefill {pf:.3} s, decode {dc:.3} s, network/proxy {net:.3} s (mean of the {} slowest requests)",
        slow.len()
    );
    let json = serde_json::json!({"queue_s": q, "prefill_s": pf, "decode_s": dc, "network_s": net, "requests": slow.len()});
    Some((text, json))
}

/// Eviction ranking (spec section 6) across the instances serving `model`; None with fewer than two.
pub fn eviction(
    board: &SignalBoard,
    inputs_: &Inputs,
    model: &str,
    now: i64,
    window_ms: i64,
) -> Option<Vec<(String, f64)>> {
    instance_loads(board, inputs_, model, now, window_ms).map(|l| det::eviction_ranking(&l))
}

/// What the eviction ranking weighs per instance of `model` (memory, P99 TTFT over the window,
/// queued requests); None with fewer than two instances reporting GPU memory.
pub fn instance_loads(
    board: &SignalBoard,
    inputs_: &Inputs,
    model: &str,
    now: i64,
    window_ms: i64,
) -> Option<Vec<det::InstanceLoad>> {
    let mut mem: BTreeMap<String, f64> = BTreeMap::new();
    for p in board
        .latest(Some(model))
        .into_iter()
        .filter(|p| p.signal == names::GPU_MEMORY_USED_RATIO)
    {
        let e = mem.entry(p.instance.clone()).or_insert(0.0);
        *e = e.max(p.value);
    }
    if mem.len() < 2 {
        return None;
    }
    let loads: Vec<det::InstanceLoad> = mem
        .into_iter()
        .map(|(instance, memory_ratio)| {
            let recs = inputs_
                .window(model, now - window_ms, now)
                .filter(|r| r.instance == instance);
            det::InstanceLoad {
                p99_s: quantile(values(recs, "ttft"), 0.99).unwrap_or(0.0),
                queued: inputs::latest(board, model, names::REQUESTS_WAITING, Some(&instance))
                    .unwrap_or(0.0),
                instance,
                memory_ratio,
            }
        })
        .collect();
    Some(loads)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(detector: &str, at: i64) -> AnomalyEvent {
        det::Finding::new(2.0, "x").into_event(
            detector,
            "s",
            BTreeMap::from([("model_id".into(), "m".into())]),
            at,
        )
    }

    #[test]
    fn history_keeps_one_onset_per_episode() {
        let mut h = EventHistory::new(600_000);
        for t in (0..30_000).step_by(250) {
            h.record(&ev("gpu_memory_leak", t));
        }
        assert_eq!(h.onsets().len(), 1);
        assert_eq!(h.onsets()[0].at_unix_ms, 0);
        h.record(&ev("gpu_memory_leak", 200_000));
        assert_eq!(h.onsets().len(), 2);
        h.prune(700_000);
        assert_eq!(h.onsets().len(), 1);
    }

    #[test]
    fn ongoing_episodes_name_their_models() {
        let mut h = EventHistory::new(600_000);
        h.record(&ev("semantic_drift", 10_000));
        h.record(&ev("gpu_memory_leak", 10_000));
        let m = h.models_with_ongoing("semantic_drift", 30_000);
        assert_eq!(m.into_iter().collect::<Vec<_>>(), ["m"]);
        assert!(h.models_with_ongoing("semantic_drift", 10_000 + EPISODE_GAP_MS + 1).is_empty(), "over");
        assert!(h.models_with_ongoing("ks_drift", 30_000).is_empty());
    }

    #[test]
    fn breakdown_averages_the_slowest() {
        let r = |e2e: f64| Rec {
            model: "m".into(),
            instance: "i".into(),
            ttft: Some(1.0),
            e2e,
            queue: Some(0.5),
            headers: Some(0.6),
            ok: true,
            ..Rec::default()
        };
        let recs = [r(3.0), r(2.0)];
        let refs: Vec<&Rec> = recs.iter().collect();
        let (text, json) = latency_breakdown(&refs).unwrap();
        assert!(text.contains("queue 0.500 s"), "{text}");
        assert!((json["decode_s"].as_f64().unwrap() - 1.5).abs() < 1e-9);
        assert!((json["network_s"].as_f64().unwrap() - 0.1).abs() < 1e-9);
        assert!((json["prefill_s"].as_f64().unwrap() - 0.4).abs() < 1e-9);
        assert!(latency_breakdown(&[]).is_none());
    }
}
