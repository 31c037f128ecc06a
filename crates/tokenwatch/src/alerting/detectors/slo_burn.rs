// `slo_burn`: multi-window error-budget burn per model (1 h and 5 min, 6 h and 30 min), and its
// PromQL form over `vllm:request_success_total{finished_reason}`.

use super::{BuiltinExport, Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::model_event;
use crate::alerting::promexport::num;
use crate::alerting::rules::{RuleError, RuleSpec};
use tokenwatch_core::alert::{AnomalyEvent, Severity};
use tokenwatch_detect as det;

pub struct SloBurn {
    pub params: det::SloBurnParams,
}

impl Detector for SloBurn {
    fn name() -> &'static str {
        "slo_burn"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["success_ratio"], "success_ratio")?;
        Ok((SloBurn { params }, signal))
    }

    fn builtin_export() -> Option<BuiltinExport> {
        let summary = "Error budget of the success-rate SLO burning fast";
        Some(
            BuiltinExport::new(
                4,
                "slo_error_budget_burn",
                Self::name(),
                Severity::Critical,
                summary,
            )
            .for_s(120),
        )
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let now = cx.now;
        let mut out = Vec::new();
        for m in cx.inputs.models() {
            let bw = det::BurnWindows {
                h1: cx.inputs.counts(&m, now, 3_600_000),
                m5: cx.inputs.counts(&m, now, 300_000),
                h6: cx.inputs.counts(&m, now, 6 * 3_600_000),
                m30: cx.inputs.counts(&m, now, 1_800_000),
            };
            if let Some(f) = det::slo_burn(&bw, &self.params) {
                out.push(model_event(f, &rule.detector, "success_ratio", &m, now));
            }
        }
        out
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let p = &self.params;
        let objective = p.objective;
        if !(0.0..1.0).contains(&objective) || objective <= 0.0 {
            return Err(format!("objective {objective} is not within (0, 1)"));
        }
        let budget = 1.0 - objective;
        let ratio = |w: &str| {
            format!(
                "sum by (model_name) (rate(vllm:request_success_total{{finished_reason=\"error\"}}[{w}])) / sum by (model_name) (rate(vllm:request_success_total[{w}]))"
            )
        };
        let (fast, slow) = (num(p.fast_burn * budget), num(p.slow_burn * budget));
        let expr = format!(
            "({} > {fast} and {} > {fast}) or ({} > {slow} and {} > {slow})",
            ratio("1h"),
            ratio("5m"),
            ratio("6h"),
            ratio("30m")
        );
        let desc = format!(
            "Error ratio of {{{{ $labels.model_name }}}} is {{{{ $value | humanizePercentage }}}}: burning the {}% success objective's budget ({}x over 1h and 5m, or {}x over 6h and 30m).",
            num(objective * 100.0),
            num(p.fast_burn),
            num(p.slow_burn)
        );
        Ok(vec![PromRule::new(x.rule.name.clone(), expr, desc)])
    }
}
