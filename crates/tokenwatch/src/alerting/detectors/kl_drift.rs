// `kl_drift`: the finish-reason mix of a model's last window against the six before it (KL
// divergence), evaluated once per window and held in between.

use super::{Detector, EvalCtx, Periodic, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::{MIN_WINDOW_SAMPLES, model_event};
use crate::alerting::rules::{RuleError, RuleSpec};
use std::collections::{BTreeMap, HashMap};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

pub struct KlDrift {
    pub params: det::KlDriftParams,
    models: HashMap<String, det::KlDrift>,
    period: Periodic,
}

impl Detector for KlDrift {
    fn name() -> &'static str {
        "kl_drift"
    }

    fn default_window_s() -> i64 {
        300
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["finish_reason"], "finish_reason")?;
        let d = KlDrift {
            params,
            models: HashMap::new(),
            period: Periodic::default(),
        };
        Ok((d, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, w) = (cx.now, rule.window_ms);
        if self.period.due(now, w) {
            let mut held = Vec::new();
            for m in cx.inputs.models() {
                let dist = |from: i64, to: i64| -> BTreeMap<String, f64> {
                    let mut d = BTreeMap::new();
                    for r in cx
                        .inputs
                        .window(&m, from, to)
                        .filter(|r| r.ok && !r.finish_reason.is_empty())
                    {
                        *d.entry(r.finish_reason.to_string()).or_insert(0.0) += 1.0;
                    }
                    d
                };
                let (base, cur) = (dist(now - 7 * w, now - w), dist(now - w, now));
                if base.values().sum::<f64>() < MIN_WINDOW_SAMPLES as f64
                    || cur.values().sum::<f64>() < MIN_WINDOW_SAMPLES as f64
                {
                    continue;
                }
                let d = self
                    .models
                    .entry(m.clone())
                    .or_insert_with(|| det::KlDrift::new(self.params.clone()));
                if let Some(f) = d.evaluate(&base, &cur) {
                    held.push(model_event(f, &rule.detector, "finish_reason", &m, now));
                }
            }
            self.period.held = held;
        }
        self.period.held.clone()
    }

    /// The reference and current windows (7 windows).
    fn retention_ms(&self, rule: &RuleSpec) -> i64 {
        7 * rule.window_ms
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql(super::ks_drift::TWO_SAMPLE))
    }
}
