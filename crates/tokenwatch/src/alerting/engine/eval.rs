// What one evaluation of a rule sees (record windows, signal board, new records, spans) and
// the event helpers the detectors share; each detector's evaluation is in `alerting/detectors`.

use super::inputs::Inputs;
use super::record::Rec;
use super::windows::{LatencyWindows, SharedWindows};
use std::collections::BTreeMap;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::signals::SignalBoard;
use tokenwatch_detect as det;

/// Fewest requests in a window before a windowed detector without its own minimum may fire.
pub const MIN_WINDOW_SAMPLES: usize = 20;

/// What one evaluation sees.
pub struct EvalCtx<'a> {
    pub inputs: &'a Inputs,
    /// The incremental windows over `inputs` the engine keeps between evaluations.
    pub windows: &'a SharedWindows,
    pub board: &'a SignalBoard,
    /// The proxy's route splits, read (canary rollback judges their arms' windows) …
    pub splits: &'a crate::kernel::splits::SplitBoard,
    /// … and the action port a detector's decision goes through (the act stage applies it).
    pub actions: &'a dyn crate::kernel::actions::Actions,
    /// Records ingested since the previous evaluation (per-request detectors).
    pub new_records: &'a [Rec],
    /// Recent spans: (root trace id, reports CUDA OOM).
    pub spans: &'a [(String, bool)],
    /// Models whose semantic drift is ongoing (for the joint grade of per-request anomalies).
    pub semantic_drift_models: &'a std::collections::BTreeSet<String>,
    pub now: i64,
}

impl EvalCtx<'_> {
    /// The incremental windows the latency rules, `ks_drift` and `ab_regression` share.
    pub fn latency_windows(&self) -> std::sync::MutexGuard<'_, LatencyWindows> {
        self.windows.lock()
    }
}

/// An event of a model-level detector: labelled by `model_id` alone.
pub(crate) fn model_event(
    f: det::Finding,
    detector: &str,
    signal: &str,
    model: &str,
    now: i64,
) -> AnomalyEvent {
    f.into_event(detector, signal, labels(&[("model_id", model)]), now)
}

/// Event labels from (name, value) pairs, leaving out empty values.
pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
