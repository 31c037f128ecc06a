// `context_aware_threshold`: a latency tail against a limit scaled by prompt length and KV-cache
// usage (evaluation in `engine/latency.rs`), and its PromQL form over vLLM's own series.

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::latency::{self, latency_signal_name};
use crate::alerting::promexport::{latency_histogram, num};
use crate::alerting::rules::{RuleError, RuleSpec};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

pub struct ContextAwareThreshold {
    pub params: det::ContextThresholdParams,
}

impl Detector for ContextAwareThreshold {
    fn name() -> &'static str {
        "context_aware_threshold"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["ttft", "e2e"], "ttft")?;
        Ok((ContextAwareThreshold { params }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        latency::context(rule, &self.params, cx)
    }

    fn latency_symptom(&self) -> bool {
        true
    }

    /// The P99 against base × (1 + k × median prompt tokens) × (offset − weight × KV-cache
    /// usage), all three read from vLLM.
    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let p = &self.params;
        let signal = latency_signal_name(&x.rule.signal);
        let (hist, quant) = latency_histogram(&signal)?;
        let w = x.window()?;
        let (base, k) = (p.base_ms / 1000.0, p.per_prompt_token);
        let (off, weight) = (p.kv_offset, p.kv_weight);
        let expr = format!(
            "histogram_quantile({}, sum by (le, model_name) (rate({hist}_bucket[{w}]))) > on (model_name) \
             {} * (1 + {} * histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:request_prompt_tokens_bucket[{w}])))) \
             * ({} - {} * max by (model_name) (vllm:kv_cache_usage_perc))",
            num(quant),
            num(base),
            num(k),
            num(off),
            num(weight)
        );
        let desc = format!(
            "{signal} of {{{{ $labels.model_name }}}} is {{{{ $value | humanizeDuration }}}}, above {}s × (1 + {} × median prompt tokens) × ({} − {} × KV-cache usage).",
            num(base),
            num(k),
            num(off),
            num(weight)
        );
        Ok(vec![PromRule::new(x.rule.name.clone(), expr, desc)])
    }
}
