// `cache_pollution`: per (model, tenant), prefix-cache key accesses whose entropy is low and
// whose keys go cold over the lookback (evaluation in `engine/quality.rs`).

use super::quality::{self, QualityState};
use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::rules::{RuleError, RuleSpec};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

pub struct CachePollution {
    pub params: det::CachePollutionParams,
    state: QualityState,
}

impl Detector for CachePollution {
    fn name() -> &'static str {
        "cache_pollution"
    }

    fn default_window_s() -> i64 {
        900
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let p: det::CachePollutionParams = rule.validated()?;
        let window_ms = rule.window_ms(Self::default_window_s());
        if window_ms <= p.cold_after_ms {
            return Err(rule.error(
                "window",
                format!(
                    "the lookback ({window_ms} ms) must be longer than params.cold_after_ms ({}), or no key can go cold",
                    p.cold_after_ms
                ),
            ));
        }
        let signal = rule.signal(&["prefix_key"], "prefix_key")?;
        let state = QualityState::default();
        Ok((CachePollution { params: p, state }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        quality::cache_pollution(rule, &self.params, &mut self.state, cx)
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql("needs per-tenant prefix-cache key accesses"))
    }
}
