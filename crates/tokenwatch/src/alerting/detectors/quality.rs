// Evaluation shared by the output-quality and cache detectors (`semantic_drift`, `drift_vote`,
// `cache_pollution`): semantic drift of embedding centroids, the adaptive drift vote (KS +
// embedding cosine + feedback) and per-tenant cache pollution, each run every tenth of its window.

use super::EvalCtx;
use crate::alerting::engine::eval::labels;
use crate::alerting::engine::inputs::values;
use crate::alerting::rules::RuleSpec;
use std::collections::{BTreeMap, HashMap};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

/// A compiled drift vote: the vote and the KS and embedding detectors it polls.
#[derive(Debug, Clone)]
pub struct DriftVoteRule {
    pub vote: det::DriftVoteParams,
    pub ks: det::KsDriftParams,
    pub embedding: det::SemanticDriftParams,
}

/// A signal voting "drift" this many evaluations in a row is a confirmed alarm; a shorter run
/// is a false alarm of that signal (what the drift vote's weights adapt to).
pub const CONFIRM_EVALUATIONS: u32 = 3;

/// Per-rule state: the periodic evaluation's last time and result, and each model's vote.
#[derive(Default)]
pub struct QualityState {
    last_ms: Option<i64>,
    held: Vec<AnomalyEvent>,
    votes: HashMap<String, VoteState>,
}

/// One model's drift vote with each signal's current run of "drift" opinions.
pub struct VoteState {
    pub vote: det::DriftVote,
    streak: [u32; 3],
}

const SIGNALS: [det::DriftSignal; 3] = [
    det::DriftSignal::Ks,
    det::DriftSignal::Embedding,
    det::DriftSignal::Feedback,
];

impl VoteState {
    pub fn new(p: det::DriftVoteParams) -> VoteState {
        VoteState {
            vote: det::DriftVote::new(p),
            streak: [0; 3],
        }
    }

    /// Learns from this evaluation's opinions (none = no opinion: neither counts nor breaks a run).
    pub fn learn(&mut self, opinions: [Option<bool>; 3]) {
        for ((signal, opinion), streak) in SIGNALS.into_iter().zip(opinions).zip(&mut self.streak) {
            match opinion {
                Some(true) => {
                    *streak += 1;
                    if *streak == CONFIRM_EVALUATIONS {
                        self.vote.record_outcome(signal, false);
                    }
                }
                Some(false) => {
                    if (1..CONFIRM_EVALUATIONS).contains(streak) {
                        self.vote.record_outcome(signal, true);
                    }
                    *streak = 0;
                }
                None => {}
            }
        }
    }
}

/// The windowed quality detectors run every tenth of their window (½ s to 30 s) and hold their
/// result in between.
fn due(st: &mut QualityState, now: i64, window_ms: i64) -> bool {
    let period = (window_ms / 10).clamp(500, 30_000);
    match st.last_ms {
        Some(t) if now - t < period && now >= t => false,
        _ => {
            st.last_ms = Some(now);
            true
        }
    }
}

/// Centroid of the last window's output embeddings vs the six windows before it.
pub fn semantic_drift(
    rule: &RuleSpec,
    p: &det::SemanticDriftParams,
    st: &mut QualityState,
    cx: &EvalCtx,
) -> Vec<AnomalyEvent> {
    let (now, w) = (cx.now, rule.window_ms);
    if due(st, now, w) {
        st.held = cx
            .inputs
            .embedding_models()
            .into_iter()
            .filter_map(|m| {
                let s = cx.inputs.embeddings(&m)?;
                let (base, cur) = (s.window(now - 7 * w, now - w), s.window(now - w, now));
                let f = det::semantic_drift(&base, &cur, p)?
                    .with("window_s", w as f64 / 1000.0)
                    .with("reference_window_s", 6.0 * w as f64 / 1000.0);
                Some(f.into_event(
                    &rule.detector,
                    &rule.signal,
                    labels(&[("model_id", &m)]),
                    now,
                ))
            })
            .collect();
    }
    st.held.clone()
}

/// KS on the rule's per-request series, the embedding centroid cosine (same windows as the
/// two detectors) and the share of thumbs-down feedback (`scores::thumbs_down_drift`).
pub fn drift_vote(
    rule: &RuleSpec,
    cfg: &DriftVoteRule,
    st: &mut QualityState,
    cx: &EvalCtx,
) -> Vec<AnomalyEvent> {
    let (now, w) = (cx.now, rule.window_ms);
    if !due(st, now, w) {
        return st.held.clone();
    }
    let mut models = cx.inputs.models();
    models.extend(cx.inputs.embedding_models());
    models.extend(cx.inputs.scores().models().iter().map(|m| m.to_string()));
    models.sort();
    models.dedup();
    st.votes.retain(|m, _| models.binary_search(m).is_ok());
    let mut held = Vec::new();
    for m in models {
        let cur = values(cx.inputs.window(&m, now - w, now), &rule.signal);
        let reference = values(cx.inputs.window(&m, now - 7 * w, now - w), &rule.signal);
        let enough = |a: usize, b: usize, min: usize| a >= min.max(2) && b >= min.max(2);
        let ks_finding = det::ks_drift(&reference, &cur, &cfg.ks);
        let ks =
            enough(reference.len(), cur.len(), cfg.ks.min_samples).then_some(ks_finding.is_some());
        let (emb_finding, emb) = match cx.inputs.embeddings(&m) {
            Some(s) => {
                let (base, c) = (s.window(now - 7 * w, now - w), s.window(now - w, now));
                let f = det::semantic_drift(&base, &c, &cfg.embedding);
                let known = enough(base.len(), c.len(), cfg.embedding.min_samples);
                let drift = f.is_some();
                (f, known.then_some(drift))
            }
            None => (None, None),
        };
        // Share of thumbs-down, as many thumbs as the KS test wants samples.
        let book = cx.inputs.scores();
        let feedback = crate::alerting::engine::scores::thumbs_down_drift(
            crate::alerting::engine::scores::thumbs(book, &m, now - 7 * w, now - w),
            crate::alerting::engine::scores::thumbs(book, &m, now - w, now),
            cfg.ks.min_samples,
        );
        let fb = feedback.map(|(drift, ..)| drift);
        let vs = st
            .votes
            .entry(m.clone())
            .or_insert_with(|| VoteState::new(cfg.vote.clone()));
        vs.learn([ks, emb, fb]);
        let Some(mut f) = vs.vote.vote(ks, emb, fb) else {
            continue;
        };
        if let Some((_, reference, current)) = feedback {
            f = f
                .with("feedback_thumbs_down_reference", reference)
                .with("feedback_thumbs_down_current", current);
        }
        f = f
            .with("signal", rule.signal.clone())
            .with("window_s", w as f64 / 1000.0)
            .with("reference_window_s", 6.0 * w as f64 / 1000.0);
        if let Some(k) = &ks_finding {
            for key in ["p_value", "statistic", "reference_median", "current_median"] {
                if let Some(v) = k.evidence.get(key) {
                    f = f.with(&format!("ks_{key}"), v.clone());
                }
            }
        }
        if let Some(v) = emb_finding.as_ref().and_then(|e| e.evidence.get("cosine")) {
            f = f.with("embedding_cosine", v.clone());
        }
        held.push(f.into_event(
            &rule.detector,
            &rule.signal,
            labels(&[("model_id", &m)]),
            now,
        ));
    }
    st.held = held;
    st.held.clone()
}

/// Per (model, tenant): the prefix-key accesses of the rule's window (the lookback).
pub fn cache_pollution(
    rule: &RuleSpec,
    p: &det::CachePollutionParams,
    st: &mut QualityState,
    cx: &EvalCtx,
) -> Vec<AnomalyEvent> {
    let (now, w) = (cx.now, rule.window_ms);
    if !due(st, now, w) {
        return st.held.clone();
    }
    let mut held = Vec::new();
    for m in cx.inputs.prefix_models() {
        let Some(log) = cx.inputs.prefixes(&m) else {
            continue;
        };
        let mut per_tenant: BTreeMap<&str, Vec<(String, i64)>> = BTreeMap::new();
        for (tenant, key, at) in log.window(now - w, now) {
            per_tenant
                .entry(tenant)
                .or_default()
                .push((format!("{key:016x}"), at));
        }
        for (tenant, accesses) in per_tenant {
            if let Some(f) = det::cache_pollution(&accesses, now, p) {
                let f = f.with("window_s", w as f64 / 1000.0);
                let l = labels(&[("model_id", &m), ("tenant", tenant)]);
                held.push(f.into_event(&rule.detector, &rule.signal, l, now));
            }
        }
    }
    st.held = held;
    st.held.clone()
}

#[cfg(test)]
#[path = "quality_tests.rs"]
mod tests;
