// The output length outlier rule: each long (or short) response becomes an annotation on its
// request (joint grade, stored); the rule's events are the model- and instance-level share tests
// of longer, shorter and truncated (stopped at the token limit) responses.

use super::eval::{EvalCtx, labels};
use super::inputs::Rec;
use std::collections::HashMap;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;
use tokenwatch_store::AnnotationRow;

/// Per-model detectors and the annotations made since the engine last collected them.
#[derive(Default)]
pub struct LengthState {
    models: HashMap<String, det::LengthOutlier>,
    annotations: Vec<AnnotationRow>,
}

impl LengthState {
    /// Annotations made since the last call (the engine stores them).
    pub fn take_annotations(&mut self) -> Vec<AnnotationRow> {
        std::mem::take(&mut self.annotations)
    }
}

/// Annotates this evaluation's new records and runs every model's share tests.
pub(crate) fn evaluate(
    detector: &str,
    p: &det::LengthOutlierParams,
    window_ms: i64,
    st: &mut LengthState,
    cx: &EvalCtx,
) -> Vec<AnomalyEvent> {
    for r in cx.new_records.iter().filter(|r| r.ok) {
        let Some(len) = r.output_tokens else { continue };
        let d = st
            .models
            .entry(r.model.clone())
            .or_insert_with(|| det::LengthOutlier::new(p.clone(), window_ms));
        let Some(f) = d.observe(r.at_ms, &r.instance, len as f64, hit_token_limit(r)) else {
            continue;
        };
        // Spec 4's joint grade: high when the model's outputs also drift semantically.
        let drifting = cx.semantic_drift_models.contains(&r.model);
        st.annotations.push(AnnotationRow {
            request_id: r.request_id.clone(),
            model_id: r.model.clone(),
            instance: r.instance.clone(),
            at_unix_ms: r.at_ms,
            detector: detector.to_string(),
            score: f.score,
            joint_grade: det::joint_grade(drifting, true).name().to_string(),
            value: len as f64,
            summary: f.summary,
            evidence: serde_json::json!(f.evidence),
        });
    }
    let mut out = Vec::new();
    for (model, d) in st.models.iter_mut() {
        if let Some(e) = model_event(detector, model, d.evaluate(cx.now), cx) {
            out.push(e);
        }
    }
    out
}

/// The response stopped at its request's token limit: OpenAI-compatible servers (vLLM, TGI,
/// SGLang) say finish_reason "length", Anthropic-shaped ones stop_reason "max_tokens".
fn hit_token_limit(r: &Rec) -> bool {
    matches!(r.finish_reason.as_str(), "length" | "max_tokens")
}

/// One event per model (one alert under the default `group_by: [model_id]`): the model-wide
/// finding when there is one, else the strongest instance's; `evidence.instances` names every
/// instance whose own share test is significant, and a single such instance is also a label.
fn model_event(
    detector: &str,
    model: &str,
    found: Vec<(String, det::Finding)>,
    cx: &EvalCtx,
) -> Option<AnomalyEvent> {
    let instances: Vec<&str> = found
        .iter()
        .map(|(i, _)| i.as_str())
        .filter(|i| !i.is_empty())
        .collect();
    let named = if instances.len() == 1 {
        instances[0]
    } else {
        ""
    };
    let list = instances.join(", ");
    let (_, f) = found
        .iter()
        .find(|(i, _)| i.is_empty())
        .or_else(|| found.iter().max_by(|a, b| a.1.score.total_cmp(&b.1.score)))?;
    let grade = det::joint_grade(cx.semantic_drift_models.contains(model), true);
    let where_ = if list.is_empty() {
        "across its instances".to_string()
    } else {
        format!("on {list}")
    };
    let f = det::Finding {
        summary: format!("{model} {where_}: {}", f.summary),
        ..f.clone()
    }
    .with(
        "instances",
        if list.is_empty() {
            "model-wide".to_string()
        } else {
            list.clone()
        },
    )
    .with("joint_grade", grade.name());
    let l = labels(&[("model_id", model), ("instance", named)]);
    Some(f.into_event(detector, "output_tokens", l, cx.now))
}
