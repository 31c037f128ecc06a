// `latency_spike`: a latency tail against its own reference period, per model and per instance
// (evaluation in `engine/latency.rs`), and its PromQL form (`offset` baseline, peer clause).

use super::{BuiltinExport, Detector, EvalCtx, LATENCY_SIGNALS, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::latency::{self, SeriesState, latency_signal_name};
use crate::alerting::promexport::{
    INSTANCE, MODEL, count_floor, latency_histogram, num, peer_clause, prom_duration, tail,
};
use crate::alerting::rules::{RuleError, RuleSpec};
use std::time::Duration;
use tokenwatch_core::alert::{AnomalyEvent, Severity};
use tokenwatch_detect as det;

pub struct LatencySpike {
    pub params: det::LatencySpikeParams,
    series: SeriesState,
}

impl Detector for LatencySpike {
    fn name() -> &'static str {
        "latency_spike"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(LATENCY_SIGNALS, "ttft")?;
        let series = SeriesState::default();
        Ok((LatencySpike { params, series }, signal))
    }

    fn builtin_export() -> Option<BuiltinExport> {
        let summary = "P99 time to first token jumped 2.5x against the minutes before: diagnose the inference path";
        Some(
            BuiltinExport::new(
                1,
                "ttft_p99_spike",
                Self::name(),
                Severity::Critical,
                summary,
            )
            .for_s(120)
            .grade("L2"),
        )
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        latency::spike(rule, &self.params, &mut self.series, cx)
    }

    /// The window and the `baseline_windows` before it.
    fn retention_ms(&self, rule: &RuleSpec) -> i64 {
        (latency::MAX_STRETCH_WINDOWS + i64::from(self.params.baseline_windows)) * rule.window_ms
    }

    fn latency_symptom(&self) -> bool {
        true
    }

    /// The quantile of the last window > ratio × the same quantile over the `baseline_windows`
    /// windows before it (`offset` one window), with at least `min_samples` requests; per model,
    /// plus `<name>_instance` (also `peer_ratio` × the median of the model's instances). PromQL
    /// cannot freeze the baseline at onset as tokenwatch does.
    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let p = &self.params;
        let r = x.rule;
        let signal = latency_signal_name(&r.signal);
        let (hist, quant) = latency_histogram(&signal)?;
        let (ratio, w, min) = (p.ratio, x.window()?, p.min_samples as f64);
        let w_s = x.window_seconds().round().max(1.0);
        let span = prom_duration(Duration::from_secs(
            (w_s * f64::from(p.baseline_windows).round().max(1.0)) as u64,
        ));
        let peer = p.peer_ratio;
        let mut out = Vec::new();
        for by in [MODEL, INSTANCE] {
            let q = tail(hist, quant, by, &w, "");
            let base = tail(hist, quant, by, &span, &format!(" offset {w}"));
            let mut expr = format!(
                "{q} > {} * {base}{}",
                num(ratio),
                count_floor(hist, by, &w, min)
            );
            let (name, desc) = if by == MODEL {
                (
                    r.name.clone(),
                    format!(
                        "{signal} of {{{{ $labels.model_name }}}} is {{{{ $value | humanizeDuration }}}}, over {}x the {span} before the last {w}.",
                        num(ratio)
                    ),
                )
            } else {
                expr.push_str(&peer_clause(&q, peer));
                (
                    format!("{}_instance", r.name),
                    format!(
                        "{signal} of {{{{ $labels.model_name }}}} on {{{{ $labels.instance }}}} is {{{{ $value | humanizeDuration }}}}, over {}x the {span} before the last {w} and {}x its peers' median.",
                        num(ratio),
                        num(peer)
                    ),
                )
            };
            out.push(PromRule::new(name, expr, desc));
        }
        Ok(out)
    }
}
