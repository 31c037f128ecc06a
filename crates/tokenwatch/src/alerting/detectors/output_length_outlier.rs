// `output_length_outlier`: each long (or short) response is an annotation on its request; the
// rule tests the share of them over its window (evaluation and state in `engine/length.rs`).

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::length::{self, LengthState};
use crate::alerting::rules::{RuleError, RuleSpec};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;
use tokenwatch_store::AnnotationRow;

pub struct OutputLengthOutlier {
    pub params: det::LengthOutlierParams,
    state: LengthState,
}

impl Detector for OutputLengthOutlier {
    fn name() -> &'static str {
        "output_length_outlier"
    }

    fn default_window_s() -> i64 {
        120
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["output_tokens"], "output_tokens")?;
        let state = LengthState::default();
        Ok((OutputLengthOutlier { params, state }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        length::evaluate(
            &rule.detector,
            &self.params,
            rule.window_ms,
            &mut self.state,
            cx,
        )
    }

    fn take_annotations(&mut self) -> Vec<AnnotationRow> {
        self.state.take_annotations()
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql(
            "tests each response on a log scale against the model's previous responses, then the share of outliers against the model's own baseline rate: needs tokenwatch's per-request records",
        ))
    }
}
