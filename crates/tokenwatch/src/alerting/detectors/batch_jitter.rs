// `batch_jitter`: per model, inter-token latency paired with the running batch size at each
// request's time; jitter that the batch size does not explain.

use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::model_event;
use crate::alerting::engine::inputs;
use crate::alerting::engine::inputs::Inputs;
use crate::alerting::rules::{RuleError, RuleSpec};
use std::collections::HashMap;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::signals::{SignalBoard, names};
use tokenwatch_detect as det;

pub struct BatchJitter {
    pub params: det::BatchJitterParams,
}

impl Detector for BatchJitter {
    fn name() -> &'static str {
        "batch_jitter"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["itl"], "itl")?;
        Ok((BatchJitter { params }, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, w) = (cx.now, rule.window_ms);
        let mut out = Vec::new();
        for m in cx.inputs.models() {
            let (lat, batch) = pairs(cx.inputs, cx.board, &m, now, w);
            if let Some(f) = det::batch_jitter(&lat, &batch, &self.params) {
                out.push(model_event(f, &rule.detector, "itl_seconds", &m, now));
            }
        }
        out
    }

    fn latency_symptom(&self) -> bool {
        true
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql("pairs each request's inter-token latency with the batch size at its time"))
    }
}

/// The (inter-token latency, running batch size) pairs of `model`'s successful records in
/// `(now - w, now]`, in window order: each record's batch size is the point of its instance's
/// running-requests history (since `now - 2w`) nearest its time; a record whose instance has
/// none is left out.
fn pairs(
    inputs: &Inputs,
    board: &SignalBoard,
    model: &str,
    now: i64,
    w: i64,
) -> (Vec<f64>, Vec<f64>) {
    let (mut lat, mut batch) = (Vec::new(), Vec::new());
    let mut running: HashMap<&str, Nearest> = HashMap::new();
    for r in inputs.window(model, now - w, now).filter(|r| r.ok) {
        let Some(itl) = r.itl else { continue };
        let h = running.entry(r.instance.as_str()).or_insert_with(|| {
            Nearest::new(inputs::history(
                board,
                model,
                names::REQUESTS_RUNNING,
                &r.instance,
                "",
                now - 2 * w,
            ))
        });
        let Some(b) = h.at(r.at_ms) else { continue };
        lat.push(itl);
        batch.push(b);
    }
    (lat, batch)
}

/// A signal history (in the order it was written, which need not be time order) sorted once
/// by (time, place in the history): the point nearest a time is found by binary search.
struct Nearest {
    /// (time, place in the history, value), sorted.
    points: Vec<(i64, usize, f64)>,
}

impl Nearest {
    fn new(history: Vec<(i64, f64)>) -> Nearest {
        let mut points: Vec<(i64, usize, f64)> = history
            .into_iter()
            .enumerate()
            .map(|(k, (t, v))| (t, k, v))
            .collect();
        points.sort_unstable_by_key(|p| (p.0, p.1));
        Nearest { points }
    }

    /// The value of the point nearest `at`; of equally near points, the one written first (as
    /// the least distance found walking the history in order would be). None when empty.
    fn at(&self, at: i64) -> Option<f64> {
        let pts = &self.points;
        // The first point at or after `at`: the earliest written of its time.
        let i = pts.partition_point(|p| p.0 < at);
        let after = pts.get(i);
        // The earliest written of the latest time before `at`.
        let before = i.checked_sub(1).map(|j| {
            let t = pts[j].0;
            &pts[pts[..j].partition_point(|p| p.0 < t)]
        });
        let best = match (before, after) {
            (Some(b), Some(a)) => {
                let (db, da) = (at.abs_diff(b.0), a.0.abs_diff(at));
                if db < da || (db == da && b.1 < a.1) {
                    b
                } else {
                    a
                }
            }
            (Some(p), None) | (None, Some(p)) => p,
            (None, None) => return None,
        };
        Some(best.2)
    }
}

#[cfg(test)]
#[path = "batch_jitter_tests.rs"]
mod tests;
