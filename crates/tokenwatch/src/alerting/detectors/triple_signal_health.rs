// `triple_signal_health`: per instance, GPU utilisation, prefix-cache hit rate and speculative
// decoding acceptance read together (one low signal is noise, the three together are not).

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::labels;
use crate::alerting::engine::inputs;
use crate::alerting::rules::{RuleError, RuleSpec};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::signals::names;
use tokenwatch_detect as det;

pub struct TripleSignalHealth {
    pub params: det::TripleSignalParams,
}

impl Detector for TripleSignalHealth {
    fn name() -> &'static str {
        "triple_signal_health"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["gpu_utilization"], "gpu_utilization")?;
        Ok((TripleSignalHealth { params }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let now = cx.now;
        let mut out = Vec::new();
        for s in inputs::signal_series(cx.board, names::PREFIX_CACHE_HIT_RATE, now - rule.window_ms)
        {
            let Some((_, hit)) = s.history.last().copied() else {
                continue;
            };
            let util = inputs::latest(
                cx.board,
                &s.model,
                names::GPU_UTILIZATION,
                Some(&s.instance),
            )
            .or_else(|| inputs::latest(cx.board, &s.model, names::GPU_UTILIZATION, None));
            let acc = inputs::latest(
                cx.board,
                &s.model,
                names::SPEC_DECODE_ACCEPTANCE_RATE,
                Some(&s.instance),
            );
            let (Some(util), Some(acc)) = (util, acc) else {
                continue;
            };
            if let Some(f) = det::triple_signal_health(util, hit, acc, &self.params) {
                let l = labels(&[("model_id", &s.model), ("instance", &s.instance)]);
                out.push(f.into_event(&rule.detector, names::PREFIX_CACHE_HIT_RATE, l, now));
            }
        }
        out
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql(
            "joins GPU (DCGM) and runtime series of one instance, whose labels differ per deployment",
        ))
    }
}
