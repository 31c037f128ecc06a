// `ks_drift`: a two-sample Kolmogorov–Smirnov test of a per-request series, the last window
// against the six before it, per model.

use super::{DRIFT_SIGNALS, Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::model_event;
use crate::alerting::engine::inputs::values;
use crate::alerting::engine::windows::Slot;
use crate::alerting::rules::{RuleError, RuleSpec};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

/// Why the drift detectors have no PromQL form.
pub(super) const TWO_SAMPLE: &str =
    "a two-sample test between request windows: needs tokenwatch's per-request records";

pub struct KsDrift {
    pub params: det::KsDriftParams,
}

impl Detector for KsDrift {
    fn name() -> &'static str {
        "ks_drift"
    }

    fn default_window_s() -> i64 {
        300
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(DRIFT_SIGNALS, "output_tokens")?;
        Ok((KsDrift { params }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, w) = (cx.now, rule.window_ms);
        let mut out = Vec::new();
        let mut windows = cx.latency_windows();
        for m in cx.inputs.models() {
            // Read incrementally, sorted (the test is blind to order); from the records else.
            let slots = [
                (Slot::Current(w), (now - w, now)),
                (Slot::Baseline(6 * w), (now - 7 * w, now - w)),
            ];
            let (cur, reference) =
                match windows.record_windows(cx.inputs, (&m, &rule.signal), (now, 7 * w), slots) {
                    Some([cur, reference]) => (cur, reference),
                    None => (
                        values(cx.inputs.window(&m, now - w, now), &rule.signal),
                        values(cx.inputs.window(&m, now - 7 * w, now - w), &rule.signal),
                    ),
                };
            if let Some(f) = det::ks_drift(&reference, &cur, &self.params) {
                out.push(model_event(f, &rule.detector, &rule.signal, &m, now));
            }
        }
        out
    }

    /// The reference and current windows (7 windows).
    fn retention_ms(&self, rule: &RuleSpec) -> i64 {
        7 * rule.window_ms
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql(TWO_SAMPLE))
    }
}
