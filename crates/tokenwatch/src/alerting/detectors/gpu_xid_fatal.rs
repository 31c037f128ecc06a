// `gpu_xid_fatal`: a GPU whose last XID code (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS`) is one
// that takes it out of service until a reset, per GPU, and its PromQL form over that series.
//
// Every new XID error also reaches root cause as a `gpu_xid_error` event (`sources::scrape::xid`);
// this rule is the page for the fatal codes alone. It fires while the code stays (the GPU stays
// broken until it is reset, which restarts the exporter's reading at 0) and while the exporter
// is scraped within the rule's window.

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::labels;
use crate::alerting::engine::inputs;
use crate::alerting::rules::{RuleError, RuleSpec};
use crate::sources::scrape::xid::{LAST_CODE_METRIC, describe};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::signals::names;

/// The codes NVIDIA's XID catalogue says need a GPU reset or a node reboot: double-bit ECC,
/// row-remapping failure, NVLink, off the bus, uncontained ECC, GSP timeout and error,
/// recovery action changed.
pub const FATAL_CODES: [u32; 8] = [48, 64, 74, 79, 95, 119, 120, 154];

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct XidFatalParams {
    /// XID codes that page.
    pub codes: Vec<u32>,
}

impl Default for XidFatalParams {
    fn default() -> Self {
        XidFatalParams {
            codes: FATAL_CODES.to_vec(),
        }
    }
}

pub struct GpuXidFatal {
    pub params: XidFatalParams,
}

impl Detector for GpuXidFatal {
    fn name() -> &'static str {
        "gpu_xid_fatal"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params: XidFatalParams = rule.params()?;
        if params.codes.is_empty() {
            return Err(rule.error("params.codes", "must list at least one XID code"));
        }
        let signal = rule.signal(&[names::GPU_XID_LAST_CODE], names::GPU_XID_LAST_CODE)?;
        Ok((GpuXidFatal { params }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let now = cx.now;
        let mut out = Vec::new();
        for s in inputs::signal_series(cx.board, names::GPU_XID_LAST_CODE, now - rule.window_ms) {
            let Some((_, v)) = s.history.last().copied() else {
                continue;
            };
            if !(v.is_finite() && v > 0.0 && v.fract() == 0.0 && v <= f64::from(u32::MAX)) {
                continue;
            }
            let code = v as u32;
            if !self.params.codes.contains(&code) {
                continue;
            }
            let xid = code.to_string();
            let note = |k: &str| s.notes.get(k).map(String::as_str).unwrap_or("");
            let l = labels(&[
                ("model_id", &s.model),
                ("instance", &s.instance),
                ("device_id", &s.device),
                ("gpu", note("gpu")),
                ("pod", note("pod")),
                ("namespace", note("namespace")),
                ("xid", &xid),
            ]);
            let meaning = describe(code).map_or("see NVIDIA's XID catalogue", |i| i.meaning);
            let action = "reset the GPU or reboot the node";
            let evidence = BTreeMap::from([
                ("xid".to_string(), json!(code)),
                ("meaning".to_string(), json!(meaning)),
                ("action".to_string(), json!(action)),
            ]);
            out.push(AnomalyEvent {
                detector: rule.detector.clone(),
                signal: names::GPU_XID_LAST_CODE.into(),
                summary: format!(
                    "GPU {} on {} reported XID {code} ({meaning}): {action}",
                    s.device, s.instance
                ),
                labels: l,
                // A listed code is the condition itself: always exactly at the threshold.
                score: 1.0,
                at_unix_ms: now,
                evidence,
            });
        }
        out
    }

    /// The last XID code of each GPU equal to one of the codes.
    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let expr = self
            .params
            .codes
            .iter()
            .map(|c| format!("{LAST_CODE_METRIC} == {c}"))
            .collect::<Vec<_>>()
            .join(" or ");
        let desc = "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) reported XID {{ $value }}: reset the GPU or reboot the node.".to_string();
        Ok(vec![PromRule::new(x.rule.name.clone(), expr, desc)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerting::rules::{AlertingConfig, compile};
    use tokenwatch_core::signals::{SignalBoard, SignalPoint};

    fn rule(params: &str) -> Result<Vec<crate::alerting::rules::Rule>, RuleError> {
        let cfg: AlertingConfig = serde_saphyr::from_str(&format!(
            "default_rules: false\nrules:\n  - {{name: xid, detector: gpu_xid_fatal{params}}}\n"
        ))
        .expect("alerting config");
        compile(&cfg)
    }

    fn point(device: &str, code: f64, at: i64) -> SignalPoint {
        SignalPoint {
            model_id: String::new(),
            signal: names::GPU_XID_LAST_CODE.into(),
            value: code,
            source: "scrape:dcgm".into(),
            runtime: "dcgm".into(),
            instance: "gpu1".into(),
            device_id: device.into(),
            timestamp_unix_ms: at,
            notes: BTreeMap::from([("pod".to_string(), "vllm-0".to_string())]),
        }
    }

    #[test]
    fn fatal_codes_fire_per_gpu_while_fresh() {
        let mut rules = rule("").unwrap();
        let r = &mut rules[0];
        let mut board = SignalBoard::default();
        board.update(point("GPU-a", 79.0, 100_000));
        board.update(point("GPU-b", 13.0, 100_000));
        board.update(point("GPU-c", 0.0, 100_000));
        let inputs = inputs::Inputs::new(120_000, 100);
        let drift = Default::default();
        let splits = Default::default();
        let windows = Default::default();
        let cx = |now| EvalCtx {
            splits: &splits,
            actions: &crate::kernel::actions::NoActions,
            inputs: &inputs,
            windows: &windows,
            board: &board,
            new_records: &[],
            spans: &[],
            semantic_drift_models: &drift,
            now,
        };
        let events = r.evaluate(&cx(110_000));
        assert_eq!(events.len(), 1, "{events:#?}");
        let e = &events[0];
        assert_eq!(
            (
                e.labels["device_id"].as_str(),
                e.labels["xid"].as_str(),
                e.labels["pod"].as_str()
            ),
            ("GPU-a", "79", "vllm-0")
        );
        assert_eq!(e.evidence["meaning"], json!("GPU has fallen off the bus"));
        // The exporter gone for longer than the window: no reading, no alert.
        assert!(r.evaluate(&cx(200_000)).is_empty());
    }

    #[test]
    fn codes_are_configurable_and_checked() {
        let rules = rule(", params: {codes: [13]}").unwrap();
        let d = rules[0].detector_as::<GpuXidFatal>().unwrap();
        assert_eq!(d.params.codes, [13]);
        let err = rule(", params: {codes: []}").err().unwrap();
        assert!(err.0.ends_with("params.codes"), "{err:?}");
        let err = rule(", params: {code: [1]}").err().unwrap();
        assert!(err.0.contains("params"), "{err:?}");
        let err = rule(", signal: gpu_utilization").err().unwrap();
        assert!(err.0.ends_with("signal"), "{err:?}");
        assert!(
            XidFatalParams::default()
                .codes
                .iter()
                .all(|c| describe(*c).is_some_and(|i| i.needs_reset))
        );
    }
}
