// Feedback and evaluation scores sent as span attributes (`tokenwatch.feedback.thumbs`,
// `tokenwatch.score.<name>`, `tokenwatch.guardrail.flagged`, ...): read into score rows of the span's request or trace.

use super::attrs::{as_f64, as_str, value_of};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use tokenwatch_core::scores::{
    GUARDRAIL, HALLUCINATION, RETRIEVAL_EMPTY, RETRIEVAL_RECALL, THUMBS, valid_score_name,
};
use tokenwatch_store::ScoreRow;

/// Thumbs: `up` / `down`, true / false, or 1 / 0.
pub const THUMBS_ATTR: &str = "tokenwatch.feedback.thumbs";
/// An evaluation score: `tokenwatch.score.<name>` (name as `POST /api/v1/scores` takes it).
pub const SCORE_PREFIX: &str = "tokenwatch.score.";
pub const GUARDRAIL_ATTR: &str = "tokenwatch.guardrail.flagged";
pub const HALLUCINATION_ATTR: &str = "tokenwatch.hallucination.flagged";
pub const RECALL_ATTR: &str = "tokenwatch.retrieval.recall";
pub const EMPTY_ATTR: &str = "tokenwatch.retrieval.empty";

fn flag(v: &Value) -> Option<f64> {
    match v {
        Value::BoolValue(b) => Some(f64::from(u8::from(*b))),
        Value::IntValue(0) => Some(0.0),
        Value::IntValue(1) => Some(1.0),
        Value::StringValue(s) if s == "true" => Some(1.0),
        Value::StringValue(s) if s == "false" => Some(0.0),
        _ => None,
    }
}

fn thumbs(v: &Value) -> Option<f64> {
    match as_str(v).as_deref() {
        Some("up") => Some(1.0),
        Some("down") => Some(0.0),
        _ => flag(v),
    }
}

/// The scores among a span's attributes, as (name, value), and a warning naming the first
/// attribute ignored for a bad value.
pub fn of(attrs: &[KeyValue]) -> (Vec<(String, f64)>, Option<String>) {
    let mut out = Vec::new();
    let mut warning = None;
    for kv in attrs {
        let key = kv.key.as_str();
        let Some(v) = value_of(kv) else {
            continue;
        };
        let (name, value, expected) = match key {
            THUMBS_ATTR => (THUMBS.to_string(), thumbs(v), "\"up\" or \"down\""),
            GUARDRAIL_ATTR => (GUARDRAIL.to_string(), flag(v), "a boolean"),
            HALLUCINATION_ATTR => (HALLUCINATION.to_string(), flag(v), "a boolean"),
            EMPTY_ATTR => (RETRIEVAL_EMPTY.to_string(), flag(v), "a boolean"),
            RECALL_ATTR => (
                RETRIEVAL_RECALL.to_string(),
                as_f64(v).filter(|x| (0.0..=1.0).contains(x)),
                "a number between 0 and 1",
            ),
            k => match k.strip_prefix(SCORE_PREFIX) {
                Some(name) if valid_score_name(name) => {
                    (name.to_string(), as_f64(v), "a finite number")
                }
                Some(_) => {
                    warning = warning.or(Some(format!(
                        "{k}: the score name must be 1 to 64 characters of a-z, 0-9, '_' and '.'"
                    )));
                    continue;
                }
                None => continue,
            },
        };
        match value {
            Some(x) => out.push((name, x)),
            None => {
                warning = warning.or(Some(format!("{key} must be {expected}")));
            }
        }
    }
    (out, warning)
}

/// Rows of the scores of a span: for its request (a GenAI span's record has the span id as
/// request id) or, on any other span, for its trace.
pub fn rows(
    scores: Vec<(String, f64)>,
    trace_id: &str,
    request_id: Option<&str>,
    at_unix_ms: i64,
) -> Vec<ScoreRow> {
    scores
        .into_iter()
        .map(|(name, value)| ScoreRow {
            request_id: request_id.unwrap_or_default().to_string(),
            trace_id: trace_id.to_string(),
            at_unix_ms,
            name,
            value,
            source: "span".into(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::AnyValue;

    fn kv(k: &str, v: Value) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    #[test]
    fn score_attributes_are_read_and_bad_ones_named() {
        let attrs = vec![
            kv(THUMBS_ATTR, Value::StringValue("down".into())),
            kv("tokenwatch.score.toxicity", Value::DoubleValue(0.5)),
            kv("tokenwatch.score.bleu", Value::StringValue("0.25".into())),
            kv(GUARDRAIL_ATTR, Value::BoolValue(true)),
            kv(RECALL_ATTR, Value::DoubleValue(0.8)),
            kv(EMPTY_ATTR, Value::IntValue(0)),
            kv("gen_ai.request.model", Value::StringValue("m".into())),
        ];
        let (got, warning) = of(&attrs);
        assert_eq!(warning, None);
        assert_eq!(
            got,
            vec![
                (THUMBS.to_string(), 0.0),
                ("toxicity".to_string(), 0.5),
                ("bleu".to_string(), 0.25),
                (GUARDRAIL.to_string(), 1.0),
                (RETRIEVAL_RECALL.to_string(), 0.8),
                (RETRIEVAL_EMPTY.to_string(), 0.0),
            ]
        );
        let (got, warning) = of(&[
            kv(RECALL_ATTR, Value::DoubleValue(2.0)),
            kv("tokenwatch.score.Bad Name", Value::DoubleValue(1.0)),
            kv(HALLUCINATION_ATTR, Value::BoolValue(false)),
        ]);
        assert_eq!(got, vec![(HALLUCINATION.to_string(), 0.0)]);
        assert_eq!(
            warning.as_deref(),
            Some("tokenwatch.retrieval.recall must be a number between 0 and 1")
        );
        let r = rows(got, "ab", Some("cd"), 5);
        assert_eq!(
            (
                r[0].request_id.as_str(),
                r[0].trace_id.as_str(),
                r[0].source.as_str()
            ),
            ("cd", "ab", "span")
        );
    }
}
