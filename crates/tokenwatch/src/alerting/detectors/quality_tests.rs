// Tests of the quality detectors' evaluation: semantic drift, the drift vote and
// its adaptive weights, and per-tenant cache pollution, on inputs whose answer is known.

use super::*;
use crate::alerting::detectors;
use crate::alerting::engine::inputs::{EmbeddingInput, Inputs, PrefixAccess};
use crate::alerting::engine::record::Rec;
use crate::alerting::rules::{AlertingConfig, Rule, compile};
use std::sync::Arc;
use tokenwatch_core::signals::SignalBoard;

const NOW: i64 = 1_000_000_000;
const W: i64 = 10_000;

fn rule(name: &str, overrides: &str) -> Rule {
    let cfg: AlertingConfig = serde_saphyr::from_str(&format!("overrides:\n{overrides}")).unwrap();
    compile(&cfg)
        .unwrap()
        .into_iter()
        .find(|r| r.name == name)
        .unwrap()
}

/// A unit-ish vector near axis `axis` (0 or 1) of 8 dimensions, jittered by `i`.
fn vector(axis: usize, i: usize) -> Arc<[f32]> {
    let mut v = vec![0.05f32; 8];
    v[axis] = 1.0;
    v[2 + i % 6] += 0.1;
    v.into()
}

fn embed(inputs: &mut Inputs, model: &str, axis: usize, n: usize, from: i64, to: i64) {
    for i in 0..n {
        let at_ms = from + (to - from) * i as i64 / n as i64;
        inputs.add_embedding(EmbeddingInput {
            model: model.into(),
            at_ms,
            vector: vector(axis, i),
        });
    }
}

fn rec(model: &str, at_ms: i64, output_tokens: u64) -> Rec {
    Rec {
        model: model.into(),
        instance: "i".into(),
        at_ms,
        ttft: Some(0.1),
        e2e: 1.0,
        prompt_tokens: Some(100),
        output_tokens: Some(output_tokens),
        ok: true,
        finish_reason: "stop".into(),
        ..Rec::default()
    }
}

fn eval_at<'a>(inputs: &'a Inputs, board: &'a SignalBoard, now: i64) -> EvalCtx<'a> {
    EvalCtx {
        splits: &NO_SPLITS,
        actions: &crate::kernel::actions::NoActions,
        inputs,
        windows: &NO_WINDOWS,
        board,
        new_records: &[],
        spans: &[],
        semantic_drift_models: &EMPTY_MODELS,
        now,
    }
}

static EMPTY_MODELS: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
static NO_WINDOWS: std::sync::LazyLock<crate::alerting::engine::windows::SharedWindows> =
    std::sync::LazyLock::new(Default::default);
static NO_SPLITS: crate::kernel::splits::SplitBoard = crate::kernel::splits::SplitBoard::empty();

#[test]
fn semantic_drift_fires_on_a_moved_centroid_only() {
    let r = rule("semantic_drift", "  semantic_drift: {window: 10s}\n");
    let mut inputs = Inputs::new(7 * W, 1000);
    // "moved": the reference on axis 0, the current window on axis 1. "steady": axis 0 throughout.
    // Each window holds more than the detector's 50-sample minimum.
    embed(&mut inputs, "moved", 0, 70, NOW - 6 * W, NOW - W);
    embed(&mut inputs, "moved", 1, 60, NOW - W + 1, NOW);
    embed(&mut inputs, "steady", 0, 70, NOW - 6 * W, NOW - W);
    embed(&mut inputs, "steady", 0, 60, NOW - W + 1, NOW);
    let board = SignalBoard::new(10, 10);
    let mut st = QualityState::default();
    let p = &r.detector_as::<detectors::SemanticDrift>().unwrap().params;
    let ev = semantic_drift(&r, p, &mut st, &eval_at(&inputs, &board, NOW));
    assert_eq!(ev.len(), 1, "{ev:#?}");
    let e = &ev[0];
    assert_eq!(e.labels["model_id"], "moved");
    assert_eq!(
        (e.detector.as_str(), e.signal.as_str()),
        ("semantic_drift", "output_embedding")
    );
    assert!(e.evidence["cosine"].as_f64().unwrap() < 0.85);
    assert_eq!(e.evidence["current_samples"], 60);
    assert_eq!(e.evidence["baseline_samples"], 70);
    assert_eq!(e.evidence["window_s"], 10.0);
    // Within the period the result is held; too few current samples later → nothing.
    assert_eq!(
        semantic_drift(&r, p, &mut st, &eval_at(&inputs, &board, NOW + 200)).len(),
        1
    );
    let later = NOW + W + 1;
    assert!(semantic_drift(&r, p, &mut st, &eval_at(&inputs, &board, later)).is_empty());
}

#[test]
fn drift_vote_needs_two_signals_and_reports_both() {
    let r = rule(
        "drift_vote",
        "  drift_vote: {window: 10s, params: {min_samples: 20}}\n",
    );
    let cfg = &r.detector_as::<detectors::DriftVote>().unwrap().params;
    let mut inputs = Inputs::new(7 * W, 10_000);
    for i in 0..60 {
        // Reference outputs ~100 tokens, current ~400.
        inputs.ingest(rec("m", NOW - 6 * W + i * 800, 90 + (i as u64 % 20)));
        inputs.ingest(rec("m", NOW - W + 1 + i * 150, 390 + (i as u64 % 20)));
    }
    let board = SignalBoard::new(10, 10);
    let mut st = QualityState::default();
    // KS alone has an opinion: no vote.
    assert!(drift_vote(&r, cfg, &mut st, &eval_at(&inputs, &board, NOW)).is_empty());
    embed(&mut inputs, "m", 0, 40, NOW - 6 * W, NOW - W);
    embed(&mut inputs, "m", 1, 30, NOW - W + 1, NOW);
    let ev = drift_vote(&r, cfg, &mut st, &eval_at(&inputs, &board, NOW + 1_000));
    assert_eq!(ev.len(), 1, "{ev:#?}");
    let e = &ev[0].evidence;
    assert_eq!(
        (e["ks"].as_bool(), e["embedding"].as_bool()),
        (Some(true), Some(true))
    );
    assert!(e["feedback"].is_null());
    assert!(e["ks_p_value"].as_f64().unwrap() < 0.01);
    assert!(e["embedding_cosine"].as_f64().unwrap() < 0.85);
    assert_eq!(ev[0].signal, "output_tokens");
}

#[test]
fn vote_weights_adapt_to_each_signals_false_alarms() {
    let mut v = VoteState::new(det::DriftVoteParams::default());
    let base = v.vote.weights();
    // KS flickers (one-evaluation alarms) five times; the embedding signal's alarms persist.
    for _ in 0..5 {
        v.learn([Some(true), None, None]);
        v.learn([Some(false), None, None]);
    }
    for _ in 0..CONFIRM_EVALUATIONS {
        v.learn([None, Some(true), None]);
    }
    let w = v.vote.weights();
    assert!(w[0] < base[0], "KS weight fell: {base:?} → {w:?}");
    assert!(w[1] > base[1], "embedding weight rose: {base:?} → {w:?}");
    // No opinion neither counts nor breaks a run.
    let before = v.vote.weights();
    v.learn([None, None, None]);
    assert_eq!(v.vote.weights(), before);
}

fn access(inputs: &mut Inputs, tenant: &str, key: u64, at_ms: i64) {
    inputs.add_prefix(PrefixAccess {
        model: "m".into(),
        tenant: tenant.into(),
        key,
        at_ms,
    });
}

#[test]
fn cache_pollution_fires_per_tenant() {
    let r = rule(
        "cache_pollution",
        "  cache_pollution: {window: 60s, params: {cold_after_ms: 5000}}\n",
    );
    let p = &r.detector_as::<detectors::CachePollution>().unwrap().params;
    let mut inputs = Inputs::new(120_000, 1000);
    // "noisy": one hot prefix (270 accesses, still in use) and 30 one-off prefixes 20 s ago.
    for i in 0..270 {
        access(&mut inputs, "noisy", 1, NOW - 40_000 + i * 140);
    }
    for i in 0..30 {
        access(&mut inputs, "noisy", 1_000 + i as u64, NOW - 20_000);
    }
    // "steady": three prefixes used evenly, and one of them went cold.
    for i in 0..150 {
        access(
            &mut inputs,
            "steady",
            7 + (i % 3) as u64,
            NOW - 30_000 + i as i64 * 100,
        );
    }
    let board = SignalBoard::new(10, 10);
    let mut st = QualityState::default();
    let ev = cache_pollution(&r, p, &mut st, &eval_at(&inputs, &board, NOW));
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_eq!(ev[0].labels["tenant"], "noisy");
    assert_eq!(ev[0].labels["model_id"], "m");
    let e = &ev[0].evidence;
    assert!(e["entropy"].as_f64().unwrap() < 0.3, "{e:?}");
    assert!(e["cold_ratio"].as_f64().unwrap() > 0.9, "{e:?}");
    assert_eq!(e["hottest_key"], format!("{:016x}", 1));
    // A minute later the window holds nothing.
    let later = NOW + 61_000;
    assert!(cache_pollution(&r, p, &mut st, &eval_at(&inputs, &board, later)).is_empty());
}
