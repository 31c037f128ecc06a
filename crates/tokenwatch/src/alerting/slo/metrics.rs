// The SLO gauges on `/metrics`: budget remaining, SLI and target per SLO series, burn rate per
// window, set from each refresh of the tracker (series that ended disappear). `model` and
// `tenant` come from requests, so their values are cut at `export.prometheus.max_label_bytes`.

use super::SloStatus;
use crate::kernel::telemetry::{Metrics, cap_label};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SloSeriesLabels {
    pub slo: String,
    pub objective: String,
    /// Empty when the SLO is not split by model (or tenant).
    pub model: String,
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SloWindowLabels {
    pub slo: String,
    pub objective: String,
    pub model: String,
    pub tenant: String,
    /// `1h`, `5m`, `6h`, `30m` by default.
    pub window: String,
}

type F64Gauge = Gauge<f64, AtomicU64>;

#[derive(Clone)]
pub struct SloMetrics {
    budget_remaining: Family<SloSeriesLabels, F64Gauge>,
    sli: Family<SloSeriesLabels, F64Gauge>,
    target: Family<SloSeriesLabels, F64Gauge>,
    burn_rate: Family<SloWindowLabels, F64Gauge>,
    /// `export.prometheus.max_label_bytes` when registered.
    max_label_bytes: usize,
}

impl SloMetrics {
    pub fn register(m: &Metrics) -> SloMetrics {
        let s = SloMetrics {
            budget_remaining: Family::default(),
            sli: Family::default(),
            target: Family::default(),
            burn_rate: Family::default(),
            max_label_bytes: m.max_label_bytes(),
        };
        m.register(
            "tokenwatch_slo_error_budget_remaining_ratio",
            "Share of the SLO's error budget left over its window (1 untouched, 0 spent, below 0 overspent)",
            s.budget_remaining.clone(),
        );
        m.register(
            "tokenwatch_slo_sli_ratio",
            "Good requests / counted requests over the SLO's window",
            s.sli.clone(),
        );
        m.register(
            "tokenwatch_slo_target_ratio",
            "The SLO's target share of good requests",
            s.target.clone(),
        );
        m.register(
            "tokenwatch_slo_burn_rate",
            "Error-budget burn rate over a window: (bad / counted) / (1 - target); 1 spends the budget in exactly the SLO window",
            s.burn_rate.clone(),
        );
        s
    }

    /// Replace every series with `statuses` (series without data get no value).
    pub fn set(&self, statuses: &[SloStatus]) {
        self.budget_remaining.clear();
        self.sli.clear();
        self.target.clear();
        self.burn_rate.clear();
        for st in statuses {
            let mut l = SloSeriesLabels {
                slo: st.slo.clone(),
                objective: st.objective.name().to_string(),
                model: st.labels.get("model_id").cloned().unwrap_or_default(),
                tenant: st.labels.get("tenant").cloned().unwrap_or_default(),
            };
            cap_label(&mut l.model, self.max_label_bytes);
            cap_label(&mut l.tenant, self.max_label_bytes);
            self.target.get_or_create(&l).set(st.target);
            if let Some(b) = st.budget_remaining {
                self.budget_remaining.get_or_create(&l).set(b);
            }
            if let Some(v) = st.sli {
                self.sli.get_or_create(&l).set(v);
            }
            for w in &st.burn {
                if let Some(r) = w.burn_rate {
                    let wl = SloWindowLabels {
                        slo: l.slo.clone(),
                        objective: l.objective.clone(),
                        model: l.model.clone(),
                        tenant: l.tenant.clone(),
                        window: w.window.clone(),
                    };
                    self.burn_rate.get_or_create(&wl).set(r);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_and_tenant_values_are_cut_at_the_label_limit() {
        let m = Metrics::new();
        m.set_series_limits(64, 100);
        let slo = SloMetrics::register(&m);
        let long = "x".repeat(100_000);
        let status = SloStatus {
            slo: "success".into(),
            objective: super::super::Objective::Success,
            threshold_ms: None,
            target: 0.99,
            window: "28d".into(),
            by: Vec::new(),
            labels: [("model_id", &long), ("tenant", &long)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            status: "ok",
            counted_from: "requests",
            note: None,
            total: 10,
            bad: 1,
            sli: Some(0.9),
            error_budget: 0.01,
            budget_remaining: Some(-9.0),
            burn: vec![super::super::BurnWindowStatus {
                window: "1h".into(),
                pair: "fast",
                bad: 1,
                total: 10,
                burn_rate: Some(10.0),
            }],
            counts: Default::default(),
            lengths: Default::default(),
            window_days: 28.0,
        };
        slo.set(&[status]);
        let text = m.encode();
        let cut = format!("{}...", "x".repeat(61));
        assert!(
            text.contains(&format!(
                "tokenwatch_slo_burn_rate{{slo=\"success\",objective=\"success\",model=\"{cut}\",tenant=\"{cut}\",window=\"1h\"}}"
            )),
            "{}",
            &text[..text.len().min(4000)]
        );
        assert!(!text.contains(&"x".repeat(62)));
    }
}
