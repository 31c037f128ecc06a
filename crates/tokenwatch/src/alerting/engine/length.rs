// The output length outlier rule: each long (or short) response becomes an annotation on its
// request (joint grade, stored); the rule's events are the model- and instance-level share tests
// of longer, shorter and truncated (stopped at the token limit) responses, naming the instance
// the outliers concentrate on.

use super::eval::{EvalCtx, labels};
use super::record::Rec;
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
            .entry(r.model.to_string())
            .or_insert_with(|| det::LengthOutlier::new(p.clone(), window_ms));
        let Some(f) = d.observe(r.at_ms, &r.instance, len as f64, hit_token_limit(r)) else {
            continue;
        };
        // Spec 4's joint grade: high when the model's outputs also drift semantically.
        let drifting = cx.semantic_drift_models.contains(r.model.as_str());
        st.annotations.push(AnnotationRow {
            request_id: r.request_id.to_string(),
            model_id: r.model.to_string(),
            instance: r.instance.to_string(),
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

/// One event per model: the finding of the instance the outliers are attributed to when one
/// is named (labelled `instance`: the default rule groups by `[model_id, instance]`, so it is
/// that instance's alert), else the model-wide finding (no `instance` label: one alert for
/// the model), else the strongest instance's. `evidence.instances` names the instances
/// (`det::LengthVerdict::named`) or says "model-wide"; `evidence.significant_instances` lists
/// every instance whose own share test holds.
fn model_event(
    detector: &str,
    model: &str,
    v: det::LengthVerdict,
    cx: &EvalCtx,
) -> Option<AnomalyEvent> {
    if v.is_empty() {
        return None;
    }
    let named = v.named();
    let label = match named.as_slice() {
        [one] => *one,
        _ => "",
    };
    let f = v
        .attributed
        .iter()
        .chain(&v.instances)
        .find(|(i, _)| !label.is_empty() && i == label)
        .map(|(_, f)| f)
        .or(v.model.as_ref())
        .or_else(|| {
            v.instances
                .iter()
                .chain(&v.attributed)
                .map(|(_, f)| f)
                .max_by(|a, b| a.score.total_cmp(&b.score))
        })?;
    let grade = det::joint_grade(cx.semantic_drift_models.contains(model), true);
    let list = named.join(", ");
    let where_ = if list.is_empty() {
        "across its instances".to_string()
    } else {
        format!("on {list}")
    };
    let significant: Vec<&str> = v.instances.iter().map(|(i, _)| i.as_str()).collect();
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
    .with("significant_instances", significant.join(", "))
    .with("joint_grade", grade.name());
    let l = labels(&[("model_id", model), ("instance", label)]);
    Some(f.into_event(detector, "output_tokens", l, cx.now))
}

#[cfg(test)]
mod tests {
    use super::super::eval::EvalCtx;
    use super::super::inputs::Inputs;
    use super::super::lifecycle::group_labels;
    use super::super::record::Rec;
    use crate::alerting::rules::{AlertingConfig, Rule, compile};
    use std::collections::{BTreeMap, BTreeSet};
    use tokenwatch_core::model::{RequestRecord, SeriesLabels};
    use tokenwatch_core::signals::SignalBoard;

    const T0: i64 = 1_700_000_000_000;
    const INSTANCES: [&str; 4] = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"];

    /// splitmix64, uniform in (0, 1).
    fn unit(state: &mut u64) -> f64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (((z ^ (z >> 31)) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(state: &mut u64) -> f64 {
        (-2.0 * unit(state).ln()).sqrt() * (std::f64::consts::TAU * unit(state)).cos()
    }

    /// The default `output_length_outlier` rule fed `seconds` of traffic at 12 req/s spread
    /// over four instances, clients sending max_tokens (median 160) and the answers capped at
    /// it; from `fault_from_s` on the answers of `faulty` are four times longer. Returns the
    /// group labels of every event, with its time (s).
    fn run(
        seconds: i64,
        fault_from_s: i64,
        faulty: &[&str],
    ) -> Vec<(i64, BTreeMap<String, String>)> {
        let mut rules: Vec<Rule> = compile(&AlertingConfig::default())
            .unwrap()
            .into_iter()
            .filter(|r| r.name == "output_length_outlier")
            .collect();
        let rule = &mut rules[0];
        let (inputs, board, drift) = (
            Inputs::new(900_000, 10_000),
            SignalBoard::new(10, 10),
            BTreeSet::new(),
        );
        let mut rng = 7u64;
        let mut out = Vec::new();
        for s in 0..seconds {
            let mut new = Vec::new();
            for j in 0..12 {
                let inst = INSTANCES[(unit(&mut rng) * 4.0) as usize % 4];
                let max_tokens = (160.0 * (0.8 * normal(&mut rng)).exp())
                    .clamp(8.0, 2048.0)
                    .round();
                let mut len = (max_tokens / 2.0).min(120.0) * (0.6 * normal(&mut rng)).exp();
                if s >= fault_from_s && faulty.contains(&inst) {
                    len *= 4.0;
                }
                let len = len.ceil().clamp(1.0, max_tokens);
                let r = RequestRecord {
                    request_id: format!("r{s}-{j}"),
                    labels: SeriesLabels {
                        model_id: "m".into(),
                        instance: inst.into(),
                        ..SeriesLabels::default()
                    },
                    arrival_unix_ms: T0 + s * 1000 + j * 80,
                    end_s: 0.01,
                    status: 200,
                    output_tokens: Some(len as u64),
                    finish_reason: if len >= max_tokens { "length" } else { "stop" }.into(),
                    ..RequestRecord::default()
                };
                new.push(Rec::from_record(&r));
            }
            let cx = EvalCtx {
                splits: &Default::default(),
                actions: &crate::kernel::actions::NoActions,
                inputs: &inputs,
                windows: &Default::default(),
                board: &board,
                new_records: &new,
                spans: &[],
                semantic_drift_models: &drift,
                now: T0 + (s + 1) * 1000,
            };
            for e in rule.evaluate(&cx) {
                out.push((s, group_labels(&e, &rule.group_by)));
            }
        }
        out
    }

    #[test]
    fn a_blow_up_on_one_instance_is_its_alert_and_on_all_the_models() {
        // 10 min of healthy traffic raise nothing; ×4 on one of four instances from then on is
        // an event labelled with that instance (the default rule groups by it) within 20 s.
        let one = run(660, 600, &["gpu-c"]);
        assert!(
            one.iter().all(|(s, _)| *s >= 600),
            "an event on healthy traffic: {one:?}"
        );
        let (s, labels) = one.first().expect("the blow-up raised an event");
        assert!(*s <= 620, "first event after {} s", s - 600);
        let want = BTreeMap::from([
            ("model_id".to_string(), "m".to_string()),
            ("instance".to_string(), "gpu-c".to_string()),
        ]);
        assert_eq!(labels, &want);
        assert!(one.iter().all(|(_, l)| l == &want), "{one:?}");
        // On every instance: one model-wide event stream, no instance label.
        let all = run(660, 600, &INSTANCES);
        assert!(!all.is_empty(), "the model-wide blow-up raised no event");
        let model = BTreeMap::from([("model_id".to_string(), "m".to_string())]);
        assert!(all.iter().all(|(s, l)| *s >= 600 && l == &model), "{all:?}");
    }
}
