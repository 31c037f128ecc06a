// The SLO gauges on `/metrics`: budget remaining, SLI and target per SLO series, burn rate per
// window, set from each refresh of the tracker (series that ended disappear).

use super::SloStatus;
use crate::kernel::telemetry::Metrics;
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
}

impl SloMetrics {
    pub fn register(m: &Metrics) -> SloMetrics {
        let s = SloMetrics {
            budget_remaining: Family::default(),
            sli: Family::default(),
            target: Family::default(),
            burn_rate: Family::default(),
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
            let l = SloSeriesLabels {
                slo: st.slo.clone(),
                objective: st.objective.name().to_string(),
                model: st.labels.get("model_id").cloned().unwrap_or_default(),
                tenant: st.labels.get("tenant").cloned().unwrap_or_default(),
            };
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
