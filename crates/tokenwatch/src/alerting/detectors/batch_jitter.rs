// `batch_jitter`: per model, inter-token latency paired with the running batch size at each
// request's time; jitter that the batch size does not explain.

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::model_event;
use crate::alerting::engine::inputs;
use crate::alerting::rules::{RuleError, RuleSpec};
use std::collections::HashMap;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::signals::names;
use tokenwatch_detect as det;

pub struct BatchJitter {
    pub params: det::BatchJitterParams,
}

impl Detector for BatchJitter {
    fn name() -> &'static str {
        "batch_jitter"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["itl"], "itl")?;
        Ok((BatchJitter { params }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, w) = (cx.now, rule.window_ms);
        let mut out = Vec::new();
        for m in cx.inputs.models() {
            let (mut lat, mut batch) = (Vec::new(), Vec::new());
            let mut running: HashMap<String, Vec<(i64, f64)>> = HashMap::new();
            for r in cx.inputs.window(&m, now - w, now).filter(|r| r.ok) {
                let Some(itl) = r.itl else { continue };
                let h = running.entry(r.instance.to_string()).or_insert_with(|| {
                    inputs::history(
                        cx.board,
                        &m,
                        names::REQUESTS_RUNNING,
                        &r.instance,
                        "",
                        now - 2 * w,
                    )
                });
                let Some((_, b)) = h.iter().min_by_key(|(t, _)| (t - r.at_ms).abs()) else {
                    continue;
                };
                lat.push(itl);
                batch.push(*b);
            }
            if let Some(f) = det::batch_jitter(&lat, &batch, &self.params) {
                out.push(model_event(f, &rule.detector, "itl_seconds", &m, now));
            }
        }
        out
    }

    fn latency_symptom(&self) -> bool {
        true
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql("pairs each request's inter-token latency with the batch size at its time"))
    }
}
