// `topology_convergence`: GPUs behind one PCIe switch saturated together are one group (one
// alert per switch, not one per GPU); owns its parameters.

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::labels;
use crate::alerting::engine::inputs;
use crate::alerting::rules::{RuleError, RuleSpec};
use serde::Deserialize;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::signals::names;
use tokenwatch_detect as det;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TopologyParams {
    pub min_gpus: usize,
    pub utilization: f64,
    /// A GPU counts as saturated when its last `min_points` samples are all over `utilization`
    /// (one busy scrape is not saturation). The rule has no `for`: it must be firing when the
    /// leak alerts it converges fire.
    pub min_points: usize,
}

impl Default for TopologyParams {
    fn default() -> Self {
        TopologyParams {
            min_gpus: 3,
            utilization: 0.85,
            min_points: 3,
        }
    }
}

pub struct TopologyConvergence {
    pub params: TopologyParams,
}

impl Detector for TopologyConvergence {
    fn name() -> &'static str {
        "topology_convergence"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let p: TopologyParams = rule.params()?;
        if p.min_gpus < 1 || !(0.0..=1.0).contains(&p.utilization) {
            return Err(rule.error("params", "min_gpus must be ≥ 1 and utilization within 0..1"));
        }
        if p.min_points < 1 {
            return Err(rule.error("params.min_points", "must be ≥ 1"));
        }
        let signal = rule.signal(&["gpu_utilization"], "gpu_utilization")?;
        Ok((TopologyConvergence { params: p }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, p) = (cx.now, &self.params);
        let mut seen = std::collections::HashSet::new();
        let mut gpus = Vec::new();
        for s in inputs::signal_series(cx.board, names::GPU_UTILIZATION, now - 30_000) {
            // Sustained: the lowest of the last `min_points` samples is what counts.
            let n = p.min_points.max(1);
            let (Some(bus), true) = (s.notes.get("pci_bus_id"), s.history.len() >= n) else {
                continue;
            };
            let u = s.history[s.history.len() - n..]
                .iter()
                .map(|(_, v)| *v)
                .fold(f64::INFINITY, f64::min);
            let id = if s.device.is_empty() {
                bus.clone()
            } else {
                s.device.clone()
            };
            if seen.insert(format!("{}/{id}", s.instance)) {
                gpus.push(det::GpuUtilReading {
                    device_id: id,
                    pci_switch: format!("{}/{}", s.instance, det::pci_switch_of(bus)),
                    sm_utilization: u,
                });
            }
        }
        let mut out = Vec::new();
        for (switch, devices) in det::topology_convergence(&gpus, p.min_gpus, p.utilization) {
            let f = det::Finding::new(devices.len() as f64 / p.min_gpus.max(1) as f64, format!(
                "{} GPUs behind PCIe switch {switch} are above {:.0}% utilisation; treat them as one saturated group",
                devices.len(),
                p.utilization * 100.0
            ))
            .with("devices", devices.clone());
            out.push(f.into_event(
                &rule.detector,
                names::GPU_UTILIZATION,
                labels(&[("pci_switch", &switch)]),
                now,
            ));
        }
        out
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql("needs the GPUs' PCIe topology"))
    }
}
