// `budget_burn`: the spend budgets (`budgets:`, `crate::alerting::budget`) that would run out well
// before their period ends at the current spend rate — the rate over each budget's
// `burn_window` at least `min_burn_rate` times the pace that spends exactly what is left by the
// period's end — or that are spent; the alert says when the money runs out.

use super::{Detector, EvalCtx, RuleInput};
use crate::alerting::budget::{BudgetStatus, human_duration};
use crate::alerting::promexport::num;
use crate::alerting::rules::{RuleError, RuleSpec};
use serde::Deserialize;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

/// The rule's parameters; the amounts, periods and burn windows are the budgets'.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetBurnParams {
    /// Fire when the spend rate is at least this many times the pace that spends exactly what
    /// is left by the period's end (2: the rest would be gone halfway through the remaining
    /// period). A spent budget always fires.
    pub min_burn_rate: f64,
    /// Names of the budgets this rule watches; empty: every budget.
    pub budgets: Vec<String>,
}

impl Default for BudgetBurnParams {
    fn default() -> Self {
        BudgetBurnParams {
            min_burn_rate: 2.0,
            budgets: Vec::new(),
        }
    }
}

impl det::Validate for BudgetBurnParams {
    fn validate(&self) -> Result<(), det::ParamError> {
        if self.min_burn_rate.is_finite() && self.min_burn_rate >= 1.0 {
            Ok(())
        } else {
            Err(det::ParamError {
                field: "min_burn_rate",
                reason: format!(
                    "{} is out of range: a finite number, 1 or more",
                    self.min_burn_rate
                ),
            })
        }
    }
}

pub struct BudgetBurn {
    pub params: BudgetBurnParams,
}

/// The alert's sentence and evidence for a budget that fires.
fn finding(st: &BudgetStatus, now_ms: i64) -> det::Finding {
    let left_s = ((st.period_end_ms - now_ms) as f64 / 1000.0).max(0.0);
    let usd = |v: f64| format!("${:.2}", v);
    let summary = if st.remaining_usd <= 0.0 {
        format!(
            "budget {} is spent: {} of {} {} ({} over), {} before the period ends",
            st.name,
            usd(st.spent_usd),
            usd(st.amount_usd),
            st.period.name(),
            usd(-st.remaining_usd),
            human_duration(left_s),
        )
    } else {
        format!(
            "budget {} runs out in {} at the last {}'s rate ({}/h), {} before the {} period ends: {} of {} spent",
            st.name,
            human_duration(st.time_to_exhaustion_s.unwrap_or(f64::INFINITY)),
            human_duration(st.burn_window_s),
            usd(st.burn_usd_per_s * 3600.0),
            human_duration(left_s - st.time_to_exhaustion_s.unwrap_or(0.0)),
            st.period.name(),
            usd(st.spent_usd),
            usd(st.amount_usd),
        )
    };
    let score = if st.burn_rate.is_finite() {
        st.burn_rate
    } else {
        f64::MAX
    };
    det::Finding::new(score, summary)
        .with("budget", st.name.as_str())
        .with("period", st.period.name())
        .with("amount_usd", st.amount_usd)
        .with("spent_usd", st.spent_usd)
        .with("remaining_usd", st.remaining_usd)
        .with("burn_usd_per_hour", st.burn_usd_per_s * 3600.0)
        .with(
            "burn_rate",
            if st.burn_rate.is_finite() {
                num(st.burn_rate)
            } else {
                "inf".into()
            },
        )
        .with(
            "time_to_exhaustion_s",
            st.time_to_exhaustion_s.unwrap_or(f64::INFINITY),
        )
        .with("period_end_unix_ms", st.period_end_ms)
}

impl Detector for BudgetBurn {
    fn name() -> &'static str {
        "budget_burn"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["spend"], "spend")?;
        Ok((BudgetBurn { params }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let p = &self.params;
        cx.inputs
            .budgets()
            .statuses(cx.now)
            .into_iter()
            .filter(|st| p.budgets.is_empty() || p.budgets.contains(&st.name))
            .filter(|st| {
                let left_s = (st.period_end_ms - cx.now) as f64 / 1000.0;
                st.remaining_usd <= 0.0
                    || (st.burn_rate >= p.min_burn_rate
                        && st.time_to_exhaustion_s.is_some_and(|t| t < left_s))
            })
            .map(|st| {
                finding(&st, cx.now).into_event(&rule.detector, "spend", st.labels.clone(), cx.now)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::alerting::budget::{BudgetConfig, BudgetPeriod, BudgetTracker};
    use crate::alerting::engine::inputs::Inputs;
    use crate::alerting::engine::record::Rec;
    use crate::alerting::rules::{RuleConfig, compile_rule};
    use crate::kernel::duration::HumanDuration;
    use std::time::Duration;

    const HOUR: i64 = 3_600_000;
    /// 2026-12-08T00:00:00Z.
    const DAY_START: i64 = 1_796_688_000_000;

    use super::super::events_of_rule as events;

    fn inputs(amount: f64, cost_per_minute: f32, minutes: i64, now: i64) -> Inputs {
        let budget = BudgetConfig {
            name: "acme-daily".into(),
            period: BudgetPeriod::Daily,
            amount_usd: amount,
            model: None,
            tenant: Some("acme".into()),
            burn_window: HumanDuration(Duration::from_secs(3600)),
        };
        let mut inputs =
            Inputs::new(600_000, 100_000).with_budgets(BudgetTracker::new(&[budget], DAY_START));
        for k in 0..minutes {
            inputs.ingest(Rec {
                model: "m".into(),
                tenant: "acme".into(),
                at_ms: now - (minutes - k) * 60_000 + 1,
                cost_usd: cost_per_minute,
                ok: true,
                ..Rec::default()
            });
        }
        inputs
    }

    #[test]
    fn pages_when_the_budget_runs_out_well_before_the_period_ends() {
        let rule = "{name: b, detector: budget_burn}";
        // Noon, $1 a minute for the last hour: $60 spent of $100, $60/h, 12 h to go: out in
        // 40 min (18x the pace).
        let now = DAY_START + 12 * HOUR;
        let fired = events(rule, &inputs(100.0, 1.0, 60, now), now);
        assert_eq!(fired.len(), 1, "{fired:#?}");
        let e = &fired[0];
        assert_eq!(e.labels["budget"], "acme-daily");
        assert_eq!(e.labels["tenant"], "acme");
        assert!(
            e.summary
                .starts_with("budget acme-daily runs out in 40m at the last 1h's rate ($60.00/h), 11h 20m before the daily period ends"),
            "{}",
            e.summary
        );
        let tte = e.evidence["time_to_exhaustion_s"].as_f64().unwrap();
        assert!((tte - 2400.0).abs() < 1e-6, "{tte}");
        // On pace: $100 a day spent at $4/h leaves the rest for the period: quiet.
        let calm = inputs(100.0, 4.0 / 60.0, 60, now);
        assert!(events(rule, &calm, now).is_empty());
        // A higher bar: 18x is under 20x.
        assert!(
            events(
                "{name: b, detector: budget_burn, params: {min_burn_rate: 20}}",
                &inputs(100.0, 1.0, 60, now),
                now
            )
            .is_empty()
        );
        // Spent: fires whatever the rate.
        let spent = inputs(30.0, 1.0, 60, now);
        let fired = events(rule, &spent, now);
        assert!(
            fired[0]
                .summary
                .starts_with("budget acme-daily is spent: $60.00 of $30.00 daily ($30.00 over)"),
            "{}",
            fired[0].summary
        );
        // Other budgets only; bad parameters refused with their path.
        assert!(
            events(
                "{name: b, detector: budget_burn, params: {budgets: [other]}}",
                &spent,
                now
            )
            .is_empty()
        );
        let bad: RuleConfig = serde_saphyr::from_str(
            "{name: b, detector: budget_burn, params: {min_burn_rate: 0.5}}",
        )
        .unwrap();
        let err = compile_rule("alerting.rules[0]", &bad).unwrap_err();
        assert_eq!(err.0, "alerting.rules[0].params.min_burn_rate", "{err:?}");
    }
}
