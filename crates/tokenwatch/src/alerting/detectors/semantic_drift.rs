// `semantic_drift`: the centroid of a model's output embeddings in the last window against the
// six windows before it (evaluation in `engine/quality.rs`).

use super::quality::{self, QualityState};
use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::rules::{RuleError, RuleSpec};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

pub struct SemanticDrift {
    pub params: det::SemanticDriftParams,
    state: QualityState,
}

impl Detector for SemanticDrift {
    fn name() -> &'static str {
        "semantic_drift"
    }

    fn default_window_s() -> i64 {
        300
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["output_embedding"], "output_embedding")?;
        let state = QualityState::default();
        Ok((SemanticDrift { params, state }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        quality::semantic_drift(rule, &self.params, &mut self.state, cx)
    }

    /// The reference and current windows (7 windows).
    fn embedding_retention_ms(&self, rule: &RuleSpec) -> Option<i64> {
        Some(7 * rule.window_ms)
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql(super::ks_drift::TWO_SAMPLE))
    }
}
