// What an alert carries when it fires: the ranked root-cause chain over recent anomaly onsets,
// the per-request latency breakdown (latency symptoms) and the eviction ranking (GPU memory).

use super::inputs::{self, Inputs, quantile, values};
use super::record::Rec;
use crate::pipeline::trace_components::ComponentMap;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use tokenwatch_core::alert::{AnomalyEvent, CauseCandidate};
use tokenwatch_core::placement::SERVING_INSTANCE_LABEL;
use tokenwatch_core::signals::{SignalBoard, names};
use tokenwatch_detect as det;
use tokenwatch_store::{SpanQuery, SpanRow, Store};

/// A gap longer than this between two events of one (detector, labels) starts a new episode.
const EPISODE_GAP_MS: i64 = 60_000;
const MAX_ONSETS: usize = 5_000;
/// Requests averaged in the latency breakdown.
const SLOWEST: usize = 10;
/// Spans read per trace of the breakdown.
const TRACE_SPANS: usize = 2_000;

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
    let params = cause_params();
    let mut ranked = det::rank_causes(graph, effect, &candidates, &params);
    ranked.truncate(5);
    ranked
}

/// How a cause and its effect must agree. The model must; `instance` need not, since
/// device-level series name their instance after the exporter's host (DCGM `Hostname`) and
/// runtime series after the scrape target — but a GPU placed on a replica (`serving_instance`,
/// `tokenwatch_core::placement`) causes only that replica's symptoms.
pub fn cause_params() -> det::RootCauseParams {
    det::RootCauseParams {
        match_labels: vec!["model_id".into()],
        paired_labels: vec![(SERVING_INSTANCE_LABEL.into(), "instance".into())],
        ..det::RootCauseParams::default()
    }
}

/// The `SLOWEST` slowest successful requests with a first token, slowest first.
fn slowest<'a>(recs: &[&'a Rec]) -> Vec<&'a Rec> {
    let mut slow: Vec<&Rec> = recs
        .iter()
        .copied()
        .filter(|r| r.ok && r.ttft.is_some())
        .collect();
    slow.sort_by(|a, b| b.e2e.total_cmp(&a.e2e));
    slow.truncate(SLOWEST);
    slow
}

/// Estimated mean queue / prefill / decode / network-proxy seconds of the slowest requests of
/// `model`, from their records (`"source": "estimate"`).
pub fn latency_breakdown(recs: &[&Rec]) -> Option<(String, serde_json::Value)> {
    let slow = slowest(recs);
    if slow.is_empty() {
        return None;
    }
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
    let json = serde_json::json!({"source": "estimate", "queue_s": q, "prefill_s": pf, "decode_s": dc, "network_s": net, "requests": slow.len()});
    Some((text, json))
}

/// The trace ids (32 hex digits) of the requests `latency_breakdown` averages, slowest first.
pub fn slowest_traces(recs: &[&Rec]) -> Vec<String> {
    slowest(recs)
        .into_iter()
        .filter_map(|r| r.trace_id.hex())
        .collect()
}

/// The measured breakdown: mean self time per component (`ComponentMap`) over the stored traces
/// of the slowest requests (`"source": "traces"`). A trace counts when it holds at least two
/// spans (the proxy's alone says nothing the record does not); None when none does.
pub fn trace_breakdown(
    map: &ComponentMap,
    traces: &[Vec<SpanRow>],
) -> Option<(String, serde_json::Value)> {
    let measured: Vec<&Vec<SpanRow>> = traces.iter().filter(|t| t.len() >= 2).collect();
    if measured.is_empty() {
        return None;
    }
    let n = measured.len() as f64;
    let mut per: BTreeMap<String, f64> = BTreeMap::new();
    for spans in &measured {
        for c in map.attribute(spans).components {
            *per.entry(c.component).or_insert(0.0) += c.self_ms / 1e3;
        }
    }
    let total: f64 = per.values().sum::<f64>() / n;
    let mut comps: Vec<(String, f64)> = per.into_iter().map(|(c, s)| (c, s / n)).collect();
    comps.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let get = |name: &str| {
        comps
            .iter()
            .find(|(c, _)| c == name)
            .map_or(0.0, |(_, s)| *s)
    };
    let listed: Vec<String> = comps.iter().map(|(c, s)| format!("{c} {s:.3} s")).collect();
    let text = format!(
        "{} (mean self time per component over the traces of the {} slowest requests)",
        listed.join(", "),
        measured.len()
    );
    let components: Vec<serde_json::Value> = comps
        .iter()
        .map(|(c, s)| {
            serde_json::json!({
                "component": c,
                "self_s": s,
                "share": if total > 0.0 { s / total } else { 0.0 },
            })
        })
        .collect();
    let json = serde_json::json!({
        "source": "traces",
        "queue_s": get("queue"),
        "prefill_s": get("prefill"),
        "decode_s": get("decode"),
        "network_s": get("proxy"),
        "requests": measured.len(),
        "components": components,
    });
    Some((text, json))
}

/// Measured breakdowns found off the engine's thread, by alert id, for the engine to take at
/// its next evaluation: (alert id, text, JSON).
#[derive(Clone, Default)]
pub struct TraceBreakdowns(Arc<std::sync::Mutex<Vec<(String, String, String)>>>);

impl TraceBreakdowns {
    /// Alerts waiting at most; past it the oldest are dropped (their estimate stays).
    const CAPACITY: usize = 256;

    fn push(&self, entry: (String, String, String)) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= Self::CAPACITY {
            q.remove(0);
        }
        q.push(entry);
    }

    pub fn take(&self) -> Vec<(String, String, String)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Put each measured breakdown (alert id, text, JSON) on its alert among `tracked`, replacing
/// the estimate; alerts no longer tracked are skipped. Returns the fingerprints changed.
pub fn apply_breakdowns(
    found: Vec<(String, String, String)>,
    tracked: &mut HashMap<String, super::lifecycle::Tracked>,
) -> Vec<String> {
    let mut changed = Vec::new();
    for (id, text, json) in found {
        if let Some((fp, t)) = tracked.iter_mut().find(|(_, t)| t.alert.id == id) {
            t.alert.annotations.insert("latency_breakdown".into(), text);
            t.alert
                .annotations
                .insert("latency_breakdown_json".into(), json);
            changed.push(fp.clone());
        }
    }
    changed
}

/// Read the stored `traces` (at most `SLOWEST`, one lookup by trace id each) and, when they
/// hold spans, leave the measured breakdown of alert `alert_id` in `out`. Runs on the blocking
/// pool of the current runtime (inline without one), never on the engine's thread.
pub fn measure_from_traces(
    store: Arc<dyn Store>,
    map: Arc<ComponentMap>,
    alert_id: String,
    mut traces: Vec<String>,
    out: TraceBreakdowns,
) {
    traces.truncate(SLOWEST);
    if traces.is_empty() {
        return;
    }
    let work = move || {
        let mut found = Vec::with_capacity(traces.len());
        for t in traces {
            let q = SpanQuery {
                trace_id: Some(t),
                limit: TRACE_SPANS,
                ..SpanQuery::default()
            };
            match store.query_spans(&q) {
                Ok(spans) => found.push(spans),
                Err(e) => {
                    tracing::debug!(error = %e, "reading a trace for the latency breakdown failed; the estimate stays");
                    return;
                }
            }
        }
        if let Some((text, json)) = trace_breakdown(&map, &found) {
            out.push((alert_id, text, json.to_string()));
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn_blocking(work);
        }
        Err(_) => work(),
    }
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
        assert!(
            h.models_with_ongoing("semantic_drift", 10_000 + EPISODE_GAP_MS + 1)
                .is_empty(),
            "over"
        );
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

    const MS: i64 = 1_000_000;

    /// A proxied request's trace: the proxy's span over vLLM's `llm_request` with its own
    /// queue/prefill/decode timings (seconds).
    fn request_trace(trace: &str, e2e_ms: i64) -> Vec<SpanRow> {
        vec![
            SpanRow {
                trace_id: trace.into(),
                span_id: "p".into(),
                name: "chat m".into(),
                service_name: crate::pipeline::proxy_span::SERVICE_NAME.into(),
                start_unix_nano: 0,
                end_unix_nano: e2e_ms * MS,
                attributes_json: r#"{"tokenwatch.request_id":"r"}"#.into(),
                ..SpanRow::default()
            },
            SpanRow {
                trace_id: trace.into(),
                span_id: "e".into(),
                parent_span_id: "p".into(),
                name: "llm_request".into(),
                service_name: "vllm".into(),
                start_unix_nano: 10 * MS,
                end_unix_nano: (e2e_ms - 10) * MS,
                attributes_json: r#"{"gen_ai.latency.time_in_queue":0.1,"gen_ai.latency.time_in_model_prefill":0.2,"gen_ai.latency.time_in_model_decode":0.5}"#.into(),
                ..SpanRow::default()
            },
        ]
    }

    #[test]
    fn stored_traces_of_the_slowest_requests_measure_the_breakdown() {
        let trace = |n: u128| format!("{n:032x}");
        let recs: Vec<Rec> = (1..=12u128)
            .map(|n| Rec {
                model: "m".into(),
                ttft: Some(0.3),
                e2e: n as f64,
                ok: true,
                trace_id: crate::alerting::engine::record::TraceKey::parse(&trace(n)),
                ..Rec::default()
            })
            .collect();
        let refs: Vec<&Rec> = recs.iter().collect();
        let ids = slowest_traces(&refs);
        assert_eq!(ids.len(), SLOWEST);
        assert_eq!(ids[0], trace(12), "slowest first");
        assert!(!ids.contains(&trace(2)), "only the slowest");
        assert_eq!(
            crate::alerting::engine::record::TraceKey::parse("not a trace id").hex(),
            None
        );
        assert_eq!(
            crate::alerting::engine::record::TraceKey::parse(&"0".repeat(32)).hex(),
            None
        );

        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(tokenwatch_store::SqliteStore::open(dir.path(), Default::default()).unwrap());
        // Two of the slowest have their traces stored; one has only the proxy's span.
        let mut spans = request_trace(&trace(12), 1_000);
        spans.extend(request_trace(&trace(11), 1_000));
        spans.push(request_trace(&trace(10), 1_000).remove(0));
        store.insert_spans(&spans).unwrap();
        let out = TraceBreakdowns::default();
        let map = Arc::new(ComponentMap::default());
        // No runtime here: the lookup runs inline.
        measure_from_traces(store.clone(), map.clone(), "a-1".into(), ids, out.clone());
        let got = out.take();
        assert_eq!(got.len(), 1);
        let (id, text, json) = &got[0];
        assert_eq!(id, "a-1");
        let json: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(json["source"], "traces");
        assert_eq!(json["requests"], 2, "the proxy-only trace does not count");
        let close = |k: &str, v: f64| (json[k].as_f64().unwrap() - v).abs() < 1e-9;
        assert!(
            close("queue_s", 0.1) && close("prefill_s", 0.2) && close("decode_s", 0.5),
            "{json}"
        );
        assert!(close("network_s", 0.02), "the proxy's own time: {json}");
        assert!(text.starts_with("decode 0.500 s"), "{text}");
        assert!(out.take().is_empty(), "taken once");

        // The alert, still tracked, takes the measured breakdown in place of its estimate.
        let mut tracked = HashMap::new();
        let alert = tokenwatch_core::alert::Alert {
            id: "a-1".into(),
            fingerprint: "fp".into(),
            rule: "latency_spike".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::from([("latency_breakdown_json".to_string(), "{}".to_string())]),
            severity: tokenwatch_core::alert::Severity::Critical,
            grade: None,
            state: tokenwatch_core::alert::AlertState::Firing,
            active_at_unix_ms: 0,
            fired_at_unix_ms: Some(0),
            resolved_at_unix_ms: None,
            last_event: None,
            root_cause: Vec::new(),
            incident_id: None,
            snapshot: None,
        };
        tracked.insert(
            "fp".to_string(),
            super::super::lifecycle::Tracked {
                alert,
                rule_index: 0,
                last_true_ms: 0,
                clean_evaluations: 0,
            },
        );
        let found = vec![
            got[0].clone(),
            ("gone".to_string(), "x".to_string(), "{}".to_string()),
        ];
        assert_eq!(apply_breakdowns(found, &mut tracked), ["fp"]);
        let a = &tracked["fp"].alert;
        assert_eq!(a.annotations["latency_breakdown"], *text);
        assert!(a.annotations["latency_breakdown_json"].contains("\"source\":\"traces\""));

        // Traces without spans beyond the proxy's: the estimate stays.
        measure_from_traces(
            store,
            map,
            "a-2".into(),
            vec![trace(10), trace(9)],
            out.clone(),
        );
        assert!(out.take().is_empty());
        let (_, estimate) = latency_breakdown(&refs).unwrap();
        assert_eq!(estimate["source"], "estimate");
    }
}
