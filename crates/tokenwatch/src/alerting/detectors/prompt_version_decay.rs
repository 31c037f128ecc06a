// `prompt_version_decay`: per (model, prompt version), the success ratio of each period against
// the version's own history, evaluated once per window and held in between.

use super::{Detector, EvalCtx, Periodic, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::{MIN_WINDOW_SAMPLES, labels};
use crate::alerting::rules::{RuleError, RuleSpec};
use std::collections::{BTreeMap, HashMap};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

pub struct PromptVersionDecay {
    pub params: det::PromptDecayParams,
    models: HashMap<String, det::PromptVersionDecay>,
    period: Periodic,
}

impl Detector for PromptVersionDecay {
    fn name() -> &'static str {
        "prompt_version_decay"
    }

    fn default_window_s() -> i64 {
        300
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        // `quality`: mean of the quality score (`factuality`, else the first given);
        // `feedback`: share of thumbs-up (see `engine::scores`).
        let signal = rule.signal(&["success_ratio", "quality", "feedback"], "success_ratio")?;
        let d = PromptVersionDecay {
            params,
            models: HashMap::new(),
            period: Periodic::default(),
        };
        Ok((d, signal))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, w) = (cx.now, rule.window_ms);
        if self.period.due(now, w) {
            let mut held = Vec::new();
            for m in cx.inputs.models() {
                let per = match rule.signal.as_str() {
                    "quality" | "feedback" => score_periods(cx, &m, &rule.signal, now - w, now),
                    _ => {
                        let mut per: BTreeMap<String, (f64, u64)> = BTreeMap::new();
                        for r in cx
                            .inputs
                            .window(&m, now - w, now)
                            .filter(|r| !r.prompt_version.is_empty())
                        {
                            let e = per.entry(r.prompt_version.to_string()).or_default();
                            e.0 += f64::from(u8::from(r.ok));
                            e.1 += 1;
                        }
                        per
                    }
                };
                let d = self
                    .models
                    .entry(m.clone())
                    .or_insert_with(|| det::PromptVersionDecay::new(self.params.clone()));
                for (v, (ok, n)) in per {
                    if (n as usize) < MIN_WINDOW_SAMPLES {
                        continue;
                    }
                    if let Some(f) = d.observe_period(&v, ok / n as f64) {
                        held.push(f.into_event(
                            &rule.detector,
                            &rule.signal,
                            labels(&[("model_id", &m), ("prompt_version", &v)]),
                            now,
                        ));
                    }
                }
            }
            self.period.held = held;
        }
        self.period.held.clone()
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql(super::ab_regression::PER_REQUEST_LABELS))
    }
}

/// Per prompt version of `model` in `[from, to)`: the sum and count of the quality score
/// (`quality`) or of thumbs-up (`feedback`, thumbs are 1 up / 0 down).
fn score_periods(
    cx: &EvalCtx,
    model: &str,
    signal: &str,
    from: i64,
    to: i64,
) -> BTreeMap<String, (f64, u64)> {
    use crate::alerting::engine::scores::{DEFAULT_QUALITY, THUMBS};
    let book = cx.inputs.scores();
    let name = if signal == "feedback" {
        Some(THUMBS.into())
    } else {
        book.quality_name(model, DEFAULT_QUALITY, from, to)
    };
    let mut per: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    let Some(name) = name else {
        return per;
    };
    for s in book
        .window(model, from, to)
        .filter(|s| s.name == name && !s.prompt_version.is_empty())
    {
        let e = per.entry(s.prompt_version.to_string()).or_default();
        e.0 += s.value;
        e.1 += 1;
    }
    per
}
