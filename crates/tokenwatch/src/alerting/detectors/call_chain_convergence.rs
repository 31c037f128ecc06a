// `call_chain_convergence`: CUDA out-of-memory reported by several spans of one trace is one
// failure spreading along the call chain; owns its parameters and the span pattern.

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::rules::{RuleError, RuleSpec};
use serde::Deserialize;
use std::collections::BTreeMap;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CallChainParams {
    pub min_spans: usize,
    /// Case-insensitive text of a span's status message (or attributes) meaning CUDA OOM.
    pub pattern: String,
}

impl Default for CallChainParams {
    fn default() -> Self {
        CallChainParams {
            min_spans: 5,
            pattern: "out of memory".into(),
        }
    }
}

pub struct CallChainConvergence {
    pub params: CallChainParams,
}

impl Detector for CallChainConvergence {
    fn name() -> &'static str {
        "call_chain_convergence"
    }

    fn default_window_s() -> i64 {
        30
    }

    /// Reads spans, whatever the rule's signal.
    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let p: CallChainParams = rule.params()?;
        if p.min_spans < 1 || p.pattern.is_empty() {
            return Err(rule.error("params", "min_spans must be ≥ 1 and pattern non-empty"));
        }
        Ok((
            CallChainConvergence { params: p },
            "span_status".to_string(),
        ))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let p = &self.params;
        let traces = det::call_chain_convergence(cx.spans, p.min_spans);
        if traces.is_empty() {
            return Vec::new();
        }
        let f = det::Finding::new(1.0, format!(
            "{} trace(s) with at least {} spans reporting CUDA out-of-memory: one failure spreading along the call chain",
            traces.len(),
            p.min_spans
        ))
        .with("trace_ids", traces);
        vec![f.into_event(&rule.detector, "span_status", BTreeMap::new(), cx.now)]
    }

    fn span_pattern(&self) -> Option<String> {
        Some(self.params.pattern.to_lowercase())
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql("needs trace spans"))
    }
}
