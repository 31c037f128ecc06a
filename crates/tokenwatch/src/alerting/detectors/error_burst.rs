// `error_burst` (fast burn): failures of a short window against the budget and the usual rate,
// per model and per instance (evaluation in `engine/burst.rs`), and its PromQL form.

use super::{BuiltinExport, Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::burst;
use crate::alerting::engine::latency::SeriesState;
use crate::alerting::promexport::{INSTANCE, MODEL, num, prom_duration};
use crate::alerting::rules::{RuleError, RuleSpec};
use std::time::Duration;
use tokenwatch_core::alert::{AnomalyEvent, Severity};
use tokenwatch_detect as det;

pub struct ErrorBurst {
    pub params: det::ErrorBurstParams,
    series: SeriesState,
}

impl Detector for ErrorBurst {
    fn name() -> &'static str {
        "error_burst"
    }

    fn default_window_s() -> i64 {
        5
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["success_ratio"], "success_ratio")?;
        let series = SeriesState::default();
        Ok((ErrorBurst { params, series }, signal))
    }

    fn builtin_export() -> Option<BuiltinExport> {
        let summary = "Error burst: a large share of requests failing right now";
        Some(BuiltinExport::new(
            5,
            "error_burst",
            Self::name(),
            Severity::Critical,
            summary,
        ))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        burst::error_burst(rule, &self.params, &mut self.series, cx)
    }

    /// The longest short window and the reference period before it.
    fn retention_ms(&self, rule: &RuleSpec) -> i64 {
        let p = &self.params;
        rule.window_ms.max((p.max_window_s * 1000.0) as i64) + (p.baseline_s * 1000.0) as i64
    }

    /// The error ratio over the window ≥ burn_rate × the budget with at least `min_requests`
    /// requests, per model and per (model, instance).
    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let p = &self.params;
        let objective = p.objective;
        if !(0.0..1.0).contains(&objective) || objective <= 0.0 {
            return Err(format!("objective {objective} is not within (0, 1)"));
        }
        let threshold = p.burn_rate * (1.0 - objective);
        if !(threshold > 0.0 && threshold <= 1.0) {
            return Err(format!(
                "burn_rate × (1 − objective) = {threshold} is not within (0, 1]"
            ));
        }
        // Scrape intervals make windows under a minute meaningless to `rate`: the engine's
        // 5 s window is exported as one minute.
        let w_s = x.window_seconds().round().max(60.0);
        let w = prom_duration(Duration::from_secs(w_s as u64));
        let min = p.min_requests as f64;
        let mut out = Vec::new();
        for by in [MODEL, INSTANCE] {
            let expr = format!(
                "sum by ({by}) (rate(vllm:request_success_total{{finished_reason=\"error\"}}[{w}])) / sum by ({by}) (rate(vllm:request_success_total[{w}])) >= {} and on ({by}) sum by ({by}) (increase(vllm:request_success_total[{w}])) >= {}",
                num(threshold),
                num(min)
            );
            let (name, at) = if by == MODEL {
                (x.rule.name.clone(), "{{ $labels.model_name }}")
            } else {
                (
                    format!("{}_instance", x.rule.name),
                    "{{ $labels.model_name }} on {{ $labels.instance }}",
                )
            };
            let desc = format!(
                "{{{{ $value | humanizePercentage }}}} of the requests of {at} failed over the last {w} ({}x the {}% error budget or more).",
                num(p.burn_rate),
                num((1.0 - objective) * 100.0)
            );
            out.push(PromRule::new(name, expr, desc));
        }
        Ok(out)
    }
}
