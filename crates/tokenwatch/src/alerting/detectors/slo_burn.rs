// `slo_burn`: the multi-window burn alerts of every configured SLO (`crate::alerting::slo`): per SLO series
// (model, tenant) the fast pair (1 h and 5 min) pages and the slow pair (6 h and 30 min) tickets;
// and the PromQL form of the success SLO over `vllm:request_success_total{finished_reason}`.

use super::{BuiltinExport, Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::promexport::num;
use crate::alerting::rules::{RuleError, RuleSpec};
use crate::alerting::slo::{Objective, SloStatus};
use serde::Deserialize;
use tokenwatch_core::alert::{AnomalyEvent, Severity};
use tokenwatch_detect as det;

/// The rule's parameters. The objective and its window are the SLO's (`slos:`), not the rule's.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SloBurnRuleParams {
    pub fast_burn: f64,
    pub slow_burn: f64,
    /// Requests a window needs before its burn rate counts.
    pub min_requests: u64,
    /// `fast` (page), `slow` (ticket) or `any` pair fires this rule.
    pub condition: det::BurnCondition,
    /// Names of the SLOs this rule watches; empty: every SLO.
    pub slos: Vec<String>,
}

impl Default for SloBurnRuleParams {
    fn default() -> Self {
        let d = det::SloBurnParams::default();
        SloBurnRuleParams {
            fast_burn: d.fast_burn,
            slow_burn: d.slow_burn,
            min_requests: d.min_requests,
            condition: det::BurnCondition::Any,
            slos: Vec::new(),
        }
    }
}

impl SloBurnRuleParams {
    /// tokenwatch-detect's parameters for one SLO series.
    pub fn for_slo(&self, objective: f64, period_days: f64) -> det::SloBurnParams {
        det::SloBurnParams {
            objective,
            fast_burn: self.fast_burn,
            slow_burn: self.slow_burn,
            min_requests: self.min_requests,
            period_days,
        }
    }
}

impl det::Validate for SloBurnRuleParams {
    fn validate(&self) -> Result<(), det::ParamError> {
        self.for_slo(det::SloBurnParams::default().objective, 28.0)
            .validate()
    }
}

/// What the SLO promises, for the alert's sentence.
fn promise(st: &SloStatus) -> String {
    let pct = |x: f64| format!("{}%", num(x * 100.0));
    match (st.objective, st.threshold_ms) {
        (Objective::TtftP95 | Objective::ItlP99, Some(t)) => format!(
            "{} ≤ {} ms for {} of requests",
            if st.objective == Objective::TtftP95 {
                "TTFT"
            } else {
                "ITL"
            },
            num(t),
            pct(st.target)
        ),
        (Objective::GuardrailRate, _) => {
            format!("guardrail-flagged responses under {}", pct(1.0 - st.target))
        }
        _ => format!("{} of requests succeed", pct(st.target)),
    }
}

pub struct SloBurn {
    pub params: SloBurnRuleParams,
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
        let signal = rule.signal(&["success_ratio", "slo"], "slo")?;
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
        let p = &self.params;
        let mut out = Vec::new();
        for st in cx.inputs.slos().statuses() {
            if st.total == 0 || !(p.slos.is_empty() || p.slos.contains(&st.slo)) {
                continue;
            }
            let params = p.for_slo(st.target, st.window_days);
            // A ticket is redundant while the same series pages: the slow rule stays quiet then.
            if p.condition == det::BurnCondition::Slow
                && det::slo_burn_over(&st.counts, &params, &st.lengths, det::BurnCondition::Fast)
                    .is_some()
            {
                continue;
            }
            let Some(f) = det::slo_burn_over(&st.counts, &params, &st.lengths, p.condition) else {
                continue;
            };
            let mut f = f
                .with("slo", st.slo.as_str())
                .with("slo_objective", st.objective.name())
                .with("budget_remaining", st.budget_remaining)
                .with("sli", st.sli);
            if let Some(t) = st.threshold_ms {
                f = f.with("threshold_ms", t);
            }
            f.summary = format!("SLO {} ({}): {}", st.slo, promise(st), f.summary);
            let mut labels = st.labels.clone();
            labels.insert("slo".into(), st.slo.clone());
            out.push(f.into_event(&rule.detector, st.objective.signal(), labels, cx.now));
        }
        out
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let p = &self.params;
        // The exported rule watches the success SLO at its default target (PromQL sees no
        // `slos:`; latency SLOs need tokenwatch's per-request counts).
        let objective = Objective::Success.default_target();
        if !(0.0..1.0).contains(&objective) || objective <= 0.0 {
            return Err(format!("objective {objective} is not within (0, 1)"));
        }
        let budget = 1.0 - objective;
        let ratio = |w: &str| {
            format!(
                "sum by (model_name) (rate(vllm:request_success_total{{finished_reason=\"error\"}}[{w}])) / sum by (model_name) (rate(vllm:request_success_total[{w}]))"
            )
        };
        if !p.slos.is_empty() {
            return Err(x.no_promql("it watches named SLOs; PromQL sees only the success ratio"));
        }
        let (fast, slow) = (num(p.fast_burn * budget), num(p.slow_burn * budget));
        let fast_expr = format!("({} > {fast} and {} > {fast})", ratio("1h"), ratio("5m"));
        let slow_expr = format!("({} > {slow} and {} > {slow})", ratio("6h"), ratio("30m"));
        let fast_text = format!("{}x over 1h and 5m", num(p.fast_burn));
        let slow_text = format!("{}x over 6h and 30m", num(p.slow_burn));
        let (expr, when) = match p.condition {
            det::BurnCondition::Any => (
                format!("{fast_expr} or {slow_expr}"),
                format!("{fast_text}, or {slow_text}"),
            ),
            det::BurnCondition::Fast => (fast_expr, fast_text),
            det::BurnCondition::Slow => (slow_expr, slow_text),
        };
        let desc = format!(
            "Error ratio of {{{{ $labels.model_name }}}} is {{{{ $value | humanizePercentage }}}}: burning the {}% success objective's budget ({when}).",
            num(objective * 100.0),
        );
        Ok(vec![PromRule::new(x.rule.name.clone(), expr, desc)])
    }
}

#[cfg(test)]
mod tests {
    use crate::alerting::engine::inputs::Inputs;
    use crate::alerting::engine::record::Rec;
    use crate::alerting::rules::{RuleConfig, compile_rule};
    use crate::alerting::slo::{BurnWindowsConfig, Objective, SloConfig, tracker::SloTracker};
    use crate::kernel::duration::HumanDuration;
    use std::time::Duration;

    fn slo(objective: Objective) -> SloConfig {
        let s = |n| HumanDuration(Duration::from_secs(n));
        SloConfig {
            window: s(3600),
            burn_windows: BurnWindowsConfig {
                fast_long: s(60),
                fast_short: s(10),
                slow_long: s(600),
                slow_short: s(60),
            },
            ..SloConfig::default_for(objective)
        }
    }

    use super::super::events_of_rule as events;

    #[test]
    fn each_slo_series_pages_or_tickets_once() {
        let tracker = SloTracker::new(&[slo(Objective::TtftP95), slo(Objective::Success)]);
        let mut inputs = Inputs::new(600_000, 100_000).with_slos(tracker);
        // 10 min at 4 requests/s: every request slow (TTFT 2 s), none failed.
        for k in 0..2400i64 {
            inputs.ingest(Rec {
                model: "m".into(),
                at_ms: k * 250,
                ttft: Some(2.0),
                ok: true,
                ..Rec::default()
            });
        }
        inputs.prune(600_000);
        let fast = events(
            "{name: p, detector: slo_burn, params: {condition: fast}}",
            &inputs,
            600_000,
        );
        assert_eq!(fast.len(), 1, "{fast:#?}");
        let e = &fast[0];
        assert_eq!(
            (e.labels["slo"].as_str(), e.labels["model_id"].as_str()),
            ("ttft_p95", "m")
        );
        assert_eq!(
            (e.signal.as_str(), e.evidence["condition"].as_str()),
            ("ttft", Some("fast"))
        );
        assert!(
            e.summary
                .starts_with("SLO ttft_p95 (TTFT ≤ 800 ms for 95% of requests)"),
            "{}",
            e.summary
        );
        // The slow pair burns too, but the ticket stays quiet while the page holds.
        assert!(
            events(
                "{name: t, detector: slo_burn, params: {condition: slow}}",
                &inputs,
                600_000
            )
            .is_empty()
        );
        // Only named SLOs; unknown parameters are refused with their path.
        assert!(
            events(
                "{name: p, detector: slo_burn, params: {slos: [success]}}",
                &inputs,
                600_000
            )
            .is_empty()
        );
        let bad: RuleConfig =
            serde_saphyr::from_str("{name: p, detector: slo_burn, params: {objective: 0.9}}")
                .unwrap();
        let err = compile_rule("alerting.rules[0]", &bad).unwrap_err();
        assert!(err.0.starts_with("alerting.rules[0].params"), "{err:?}");
    }
}
