// `drift_vote`: the adaptive vote of KS, embedding cosine and feedback over one per-request
// series; owns its flat parameter layout (evaluation in `engine/quality.rs`).

use super::quality::{self, DriftVoteRule, QualityState};
use super::{DRIFT_SIGNALS, Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::rules::{RuleError, RuleSpec};
use serde::Deserialize;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

/// A drift vote's parameters, written flat in `params`: the vote's own (`w_ks`, `w_embedding`,
/// `w_feedback`, `threshold`, `min_signals`) and those of the signals it polls.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct DriftVoteConfig {
    /// Significance level of the KS signal.
    pub ks_alpha: f64,
    /// Centroid cosine below which the embedding signal votes "drift".
    pub min_cosine: f64,
    /// Values (and embeddings) each window needs before a signal has an opinion.
    pub min_samples: usize,
    #[serde(flatten)]
    pub vote: serde_json::Map<String, serde_json::Value>,
}

impl Default for DriftVoteConfig {
    fn default() -> Self {
        let (ks, emb) = (
            det::KsDriftParams::default(),
            det::SemanticDriftParams::default(),
        );
        DriftVoteConfig {
            ks_alpha: ks.alpha,
            min_cosine: emb.min_cosine,
            min_samples: ks.min_samples,
            vote: Default::default(),
        }
    }
}

pub struct DriftVote {
    pub params: DriftVoteRule,
    state: QualityState,
}

fn drift_vote_rule(rule: &RuleInput) -> Result<DriftVoteRule, RuleError> {
    let c: DriftVoteConfig = rule.params()?;
    let vote = rule.validated_from(&serde_json::Value::Object(c.vote))?;
    let ks = det::KsDriftParams {
        alpha: c.ks_alpha,
        min_samples: c.min_samples,
        ..det::KsDriftParams::default()
    };
    let embedding = det::SemanticDriftParams {
        min_cosine: c.min_cosine,
        min_samples: c.min_samples,
    };
    let field = |f: &str| match f {
        "alpha" => "ks_alpha".to_string(),
        other => other.to_string(),
    };
    det::Validate::validate(&ks)
        .and_then(|()| det::Validate::validate(&embedding))
        .map_err(|e| rule.error(&format!("params.{}", field(e.field)), e.reason))?;
    Ok(DriftVoteRule {
        vote,
        ks,
        embedding,
    })
}

impl Detector for DriftVote {
    fn name() -> &'static str {
        "drift_vote"
    }

    fn default_window_s() -> i64 {
        300
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = drift_vote_rule(rule)?;
        let signal = rule.signal(DRIFT_SIGNALS, "output_tokens")?;
        let state = QualityState::default();
        Ok((DriftVote { params, state }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        quality::drift_vote(rule, &self.params, &mut self.state, cx)
    }

    /// The reference and current windows (7 windows), of records and of embeddings.
    fn retention_ms(&self, rule: &RuleSpec) -> i64 {
        7 * rule.window_ms
    }

    fn embedding_retention_ms(&self, rule: &RuleSpec) -> Option<i64> {
        Some(7 * rule.window_ms)
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql(super::ks_drift::TWO_SAMPLE))
    }
}
