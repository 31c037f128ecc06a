// `absolute_latency`: a latency tail over a fixed limit, per model and per instance (evaluation
// in `engine/latency.rs`), and its PromQL form (`histogram_quantile` > threshold, peer clause).

use super::{BuiltinExport, Detector, EvalCtx, LATENCY_SIGNALS, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::latency::{self, latency_signal_name};
use crate::alerting::promexport::{
    INSTANCE, MODEL, count_floor, latency_histogram, num, peer_clause, tail,
};
use crate::alerting::rules::{RuleError, RuleSpec};
use tokenwatch_core::alert::{AnomalyEvent, Severity};
use tokenwatch_detect as det;

pub struct AbsoluteLatency {
    pub params: det::AbsoluteLatencyParams,
}

impl Detector for AbsoluteLatency {
    fn name() -> &'static str {
        "absolute_latency"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(LATENCY_SIGNALS, "ttft")?;
        Ok((AbsoluteLatency { params }, signal))
    }

    fn builtin_export() -> Option<BuiltinExport> {
        let summary = "P99 time to first token above 2 s: run the health check";
        Some(
            BuiltinExport::new(
                0,
                "ttft_p99_absolute",
                Self::name(),
                Severity::Warning,
                summary,
            )
            .for_s(60)
            .grade("L1"),
        )
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        latency::absolute(rule, &self.params, cx)
    }

    fn retention_ms(&self, rule: &RuleSpec) -> i64 {
        latency::MAX_STRETCH_WINDOWS * rule.window_ms
    }

    fn latency_symptom(&self) -> bool {
        true
    }

    /// `histogram_quantile(q, …vllm:<metric>_bucket…) > threshold` with a request-count floor
    /// (when `min_samples` > 0), per model, plus `<name>_instance`: an instance over the
    /// threshold and `peer_ratio` × the median of its model's instances.
    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let p = &self.params;
        let r = x.rule;
        let signal = latency_signal_name(&r.signal);
        let (hist, quant) = latency_histogram(&signal)?;
        let (t, w) = (p.threshold_s, x.window()?);
        let min = (p.min_samples > 0).then_some(p.min_samples as f64);
        let peer = p.peer_ratio;
        let mut out = Vec::new();
        for by in [MODEL, INSTANCE] {
            let q = tail(hist, quant, by, &w, "");
            let mut expr = format!("{q} > {}", num(t));
            if let Some(min) = min {
                expr.push_str(&count_floor(hist, by, &w, min));
            }
            let (name, desc) = if by == MODEL {
                (
                    r.name.clone(),
                    format!(
                        "{signal} of {{{{ $labels.model_name }}}} is {{{{ $value | humanizeDuration }}}} (threshold {}s over {w}).",
                        num(t)
                    ),
                )
            } else {
                expr.push_str(&peer_clause(&q, peer));
                (
                    format!("{}_instance", r.name),
                    format!(
                        "{signal} of {{{{ $labels.model_name }}}} on {{{{ $labels.instance }}}} is {{{{ $value | humanizeDuration }}}} (threshold {}s over {w}, and {}x its peers' median).",
                        num(t),
                        num(peer)
                    ),
                )
            };
            out.push(PromRule::new(name, expr, desc));
        }
        Ok(out)
    }
}
