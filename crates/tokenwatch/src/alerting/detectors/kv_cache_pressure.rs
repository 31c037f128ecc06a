// `kv_cache_pressure`: KV-cache usage over the limit while preemptions or the queue rise, per
// instance, and its PromQL form over vLLM's own series.

use super::{BuiltinExport, Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::labels;
use crate::alerting::engine::inputs;
use crate::alerting::promexport::num;
use crate::alerting::rules::{RuleError, RuleSpec};
use tokenwatch_core::alert::{AnomalyEvent, Severity};
use tokenwatch_core::signals::names;
use tokenwatch_detect as det;

pub struct KvCachePressure {
    pub params: det::KvPressureParams,
}

impl Detector for KvCachePressure {
    fn name() -> &'static str {
        "kv_cache_pressure"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["kv_cache_usage"], "kv_cache_usage")?;
        Ok((KvCachePressure { params }, signal))
    }

    /// Over scraped series the exported rule reads rates over 5 minutes and holds one.
    fn builtin_export() -> Option<BuiltinExport> {
        let summary = "KV cache above 90% with rising preemptions or queue";
        Some(
            BuiltinExport::new(
                2,
                "kv_cache_pressure",
                Self::name(),
                Severity::Warning,
                summary,
            )
            .window_s(300)
            .for_s(60),
        )
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, w) = (cx.now, rule.window_ms);
        let mut out = Vec::new();
        for s in inputs::signal_series(cx.board, names::KV_CACHE_USAGE, now - w) {
            let pre = inputs::history(
                cx.board,
                &s.model,
                names::PREEMPTIONS_PER_SECOND,
                &s.instance,
                &s.device,
                now - w,
            );
            let wait = inputs::history(
                cx.board,
                &s.model,
                names::REQUESTS_WAITING,
                &s.instance,
                &s.device,
                now - w,
            );
            if let Some(f) = det::kv_cache_pressure(&s.history, &pre, &wait, &self.params) {
                let l = labels(&[("model_id", &s.model), ("instance", &s.instance)]);
                out.push(f.into_event(&rule.detector, names::KV_CACHE_USAGE, l, now));
            }
        }
        out
    }

    fn gpu_memory(&self, _rule: &RuleSpec) -> bool {
        true
    }

    /// `vllm:kv_cache_usage_perc` over the limit while preemptions or the waiting queue rise.
    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let w = x.window()?;
        let expr = format!(
            "max by (model_name, instance) (vllm:kv_cache_usage_perc) > {} and on (model_name, instance) \
             (sum by (model_name, instance) (rate(vllm:num_preemptions_total[{w}])) > 0 \
             or sum by (model_name, instance) (deriv(vllm:num_requests_waiting[{w}])) > 0)",
            num(self.params.usage_threshold)
        );
        let desc = "KV cache of {{ $labels.model_name }} on {{ $labels.instance }} is {{ $value | humanizePercentage }} full while requests are preempted or queue up.".to_string();
        Ok(vec![PromRule::new(x.rule.name.clone(), expr, desc)])
    }
}
