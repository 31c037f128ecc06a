// `threshold`: the latest value of any signal compared with a fixed value, per series, and its
// PromQL form (the signal read from its runtime metric, `configured::signal_expr`).

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::labels;
use crate::alerting::engine::inputs;
use crate::alerting::promexport::{configured::signal_expr, num};
use crate::alerting::rules::{RuleError, RuleSpec};
use serde::Deserialize;
use std::time::Duration;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ThresholdParams {
    /// `>`, `>=`, `<` or `<=`.
    pub op: String,
    pub value: f64,
}

impl Default for ThresholdParams {
    fn default() -> Self {
        ThresholdParams {
            op: ">".into(),
            value: 0.0,
        }
    }
}

pub struct Threshold {
    pub params: ThresholdParams,
}

impl Detector for Threshold {
    fn name() -> &'static str {
        "threshold"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let p: ThresholdParams = rule.params()?;
        if !matches!(p.op.as_str(), ">" | ">=" | "<" | "<=") {
            return Err(rule.error("params.op", format!("{:?}: expected >, >=, < or <=", p.op)));
        }
        let Some(s) = rule.rule.signal.clone().filter(|s| !s.is_empty()) else {
            return Err(rule.error("signal", "a threshold rule needs the signal it compares"));
        };
        Ok((Threshold { params: p }, s))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, p) = (cx.now, &self.params);
        let mut out = Vec::new();
        for s in inputs::signal_series(cx.board, &rule.signal, now - rule.window_ms) {
            let Some((_, v)) = s.history.last().copied() else {
                continue;
            };
            let hit = match p.op.as_str() {
                ">" => v > p.value,
                ">=" => v >= p.value,
                "<" => v < p.value,
                _ => v <= p.value,
            };
            if hit {
                let score = if p.value != 0.0 {
                    (v / p.value).abs()
                } else {
                    1.0
                };
                let f = det::Finding::new(
                    score,
                    format!("{} is {v} ({} {})", rule.signal, p.op, p.value),
                )
                .with("value", v)
                .with("threshold", p.value);
                let l = labels(&[
                    ("model_id", &s.model),
                    ("instance", &s.instance),
                    ("device_id", &s.device),
                ]);
                out.push(f.into_event(&rule.detector, &rule.signal, l, now));
            }
        }
        out
    }

    fn gpu_memory(&self, rule: &RuleSpec) -> bool {
        rule.signal.starts_with("gpu_memory")
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let (op, value) = (self.params.op.as_str(), self.params.value);
        if !value.is_finite() {
            return Err("a threshold needs a finite value".into());
        }
        let w = x.window()?;
        let read = signal_expr(
            &x.rule.signal,
            Duration::from_secs(x.window_seconds().round().max(1.0) as u64),
        )?;
        let expr = format!("{read} {op} {}", num(value));
        let desc = format!(
            "{} is {{{{ $value | humanize }}}} ({op} {}; rates over {w}).",
            x.rule.signal,
            num(value)
        );
        Ok(vec![PromRule::new(x.rule.name.clone(), expr, desc)])
    }
}
