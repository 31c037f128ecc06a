// `POST /api/v1/feedback` and `POST /api/v1/scores`: thumbs, evaluation scores, guardrail and
// hallucination verdicts and RAG retrieval numbers on requests, checked item by item, stored, fed to the engine.

use super::{
    IngestState, ItemError, ItemsEndpoint, MAX_AGE_MS, MAX_AHEAD_MS, item_error, items_answer,
    json_type, read_items, store_or_refuse,
};
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use serde_json::{Map, Value};
use std::sync::Arc;
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::scores::{
    GUARDRAIL, HALLUCINATION, MAX_NAME, RESERVED, RETRIEVAL_EMPTY, RETRIEVAL_RECALL, ScoreInput,
    THUMBS, valid_score_name,
};
use tokenwatch_store::ScoreRow;

/// Most scores in one item's `scores` object.
pub const MAX_SCORES_PER_ITEM: usize = 32;

const FEEDBACK_FIELDS: &str = "request_id, trace_id, model_id, thumbs, guardrail_flagged, \
    hallucination_flagged, retrieval_recall, retrieval_empty, timestamp_unix_ms";
const SCORE_FIELDS: &str = "request_id, trace_id, model_id, name, value, scores, \
    guardrail_flagged, hallucination_flagged, retrieval_recall, retrieval_empty, timestamp_unix_ms";

const FEEDBACK: ItemsEndpoint = ItemsEndpoint {
    route: "POST /api/v1/feedback",
    fields: FEEDBACK_FIELDS,
    noun: "feedback items",
    bare_array: true,
};
const SCORES: ItemsEndpoint = ItemsEndpoint {
    route: "POST /api/v1/scores",
    fields: SCORE_FIELDS,
    noun: "score items",
    bare_array: true,
};

/// Which endpoint an item came to (`ScoreRow::source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Feedback,
    Scores,
}

impl Source {
    fn fields(self) -> &'static str {
        match self {
            Source::Feedback => FEEDBACK_FIELDS,
            Source::Scores => SCORE_FIELDS,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Feedback => "feedback",
            Source::Scores => "scores",
        }
    }
}

/// One checked item: the request it is about and its scores (name, value).
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub request_id: String,
    pub trace_id: String,
    pub model_id: String,
    pub at_unix_ms: i64,
    pub scores: Vec<(String, f64)>,
}

impl Item {
    pub fn rows(&self, source: Source) -> impl Iterator<Item = ScoreRow> + '_ {
        self.scores.iter().map(move |(name, value)| ScoreRow {
            request_id: self.request_id.clone(),
            trace_id: self.trace_id.clone(),
            at_unix_ms: self.at_unix_ms,
            name: name.clone(),
            value: *value,
            source: source.as_str().to_string(),
        })
    }

    pub fn inputs(&self) -> impl Iterator<Item = ScoreInput> + '_ {
        self.scores.iter().map(move |(name, value)| ScoreInput {
            request_id: self.request_id.clone(),
            trace_id: self.trace_id.clone(),
            model: self.model_id.clone(),
            at_ms: self.at_unix_ms,
            name: name.clone(),
            value: *value,
        })
    }
}

struct Fields<'a> {
    i: usize,
    obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn at(&self, f: &str) -> String {
        format!("items[{}].{f}", self.i)
    }

    fn err(&self, f: &str, why: impl std::fmt::Display) -> ItemError {
        item_error(self.i, self.at(f), why)
    }

    /// An optional string of 1 to `max` bytes whose bytes pass `ok`.
    fn text(&self, name: &str, max: usize, ok: fn(u8) -> bool) -> Result<String, ItemError> {
        match self.obj.get(name) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) if !s.is_empty() && s.len() <= max && s.bytes().all(ok) => {
                Ok(s.clone())
            }
            Some(Value::String(_)) => Err(self.err(
                name,
                format_args!("must be 1 to {max} printable characters"),
            )),
            Some(other) => Err(self.err(
                name,
                format_args!("must be a string, not {}", json_type(other)),
            )),
        }
    }

    /// An optional boolean as 1 / 0.
    fn flag(&self, name: &str) -> Result<Option<f64>, ItemError> {
        match self.obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(if *b { 1.0 } else { 0.0 })),
            Some(other) => Err(self.err(
                name,
                format_args!("must be true or false, not {}", json_type(other)),
            )),
        }
    }

    /// A finite number, in `range` when given.
    fn number(&self, field: &str, v: &Value, range: Option<(f64, f64)>) -> Result<f64, ItemError> {
        let Some(x) = v.as_f64() else {
            return Err(self.err(
                field,
                format_args!("must be a number, not {}", json_type(v)),
            ));
        };
        if !x.is_finite() {
            return Err(self.err(field, "must be a finite number"));
        }
        if let Some((lo, hi)) = range
            && !(lo..=hi).contains(&x)
        {
            return Err(self.err(field, format_args!("must be between {lo} and {hi}")));
        }
        Ok(x)
    }
}

/// Checks item `i` of a body posted to `source`'s endpoint.
pub fn parse_item(i: usize, v: &Value, source: Source, now: i64) -> Result<Item, ItemError> {
    let allowed = source.fields();
    let Some(obj) = v.as_object() else {
        return Err(item_error(
            i,
            format!("items[{i}]"),
            format_args!("must be an object with {allowed}, not {}", json_type(v)),
        ));
    };
    let f = Fields { i, obj };
    if let Some(k) = obj
        .keys()
        .find(|k| !allowed.split(", ").any(|a| a == k.as_str()))
    {
        return Err(f.err(k, format_args!("is not a known field; allowed: {allowed}")));
    }
    // As the proxy's x-request-id: printable ASCII without spaces.
    let request_id = f.text("request_id", 128, |b| b.is_ascii_graphic())?;
    let trace_id = f.text("trace_id", 32, |b| b.is_ascii_hexdigit())?;
    if !trace_id.is_empty() && (trace_id.len() != 32 || trace_id.bytes().all(|b| b == b'0')) {
        return Err(f.err("trace_id", "must be 32 hex digits, not all zero"));
    }
    let trace_id = trace_id.to_ascii_lowercase();
    if request_id.is_empty() && trace_id.is_empty() {
        return Err(item_error(
            i,
            format!("items[{i}]"),
            "must name its request: request_id or trace_id is required",
        ));
    }
    let model_id = f.text("model_id", 256, |b| !b.is_ascii_control())?;
    let mut scores: Vec<(String, f64)> = Vec::new();
    if let Some(t) = obj.get("thumbs").filter(|t| !t.is_null()) {
        let value = match t {
            Value::String(s) if s == "up" => 1.0,
            Value::String(s) if s == "down" => 0.0,
            Value::Bool(b) => f64::from(u8::from(*b)),
            _ => {
                return Err(f.err(
                    "thumbs",
                    "must be \"up\" or \"down\" (or true for up, false for down)",
                ));
            }
        };
        scores.push((THUMBS.to_string(), value));
    }
    for (field, name) in [
        ("guardrail_flagged", GUARDRAIL),
        ("hallucination_flagged", HALLUCINATION),
        ("retrieval_empty", RETRIEVAL_EMPTY),
    ] {
        if let Some(v) = f.flag(field)? {
            scores.push((name.to_string(), v));
        }
    }
    if let Some(v) = obj.get("retrieval_recall").filter(|v| !v.is_null()) {
        scores.push((
            RETRIEVAL_RECALL.to_string(),
            f.number("retrieval_recall", v, Some((0.0, 1.0)))?,
        ));
    }
    let name_error = |field: &str| {
        f.err(
            field,
            format_args!(
                "must be 1 to {MAX_NAME} characters of a-z, 0-9, '_' and '.', and not one of {}",
                RESERVED.join(", ")
            ),
        )
    };
    match (obj.get("name"), obj.get("value")) {
        (None, None) => {}
        (Some(Value::String(n)), Some(v)) => {
            if !valid_score_name(n) {
                return Err(name_error("name"));
            }
            scores.push((n.clone(), f.number("value", v, None)?));
        }
        (Some(n @ Value::String(_)), None) => {
            let _ = n;
            return Err(f.err("value", "is required with name"));
        }
        (Some(other), _) => {
            return Err(f.err(
                "name",
                format_args!("must be a string, not {}", json_type(other)),
            ));
        }
        (None, Some(_)) => return Err(f.err("name", "is required with value")),
    }
    match obj.get("scores") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            if m.len() > MAX_SCORES_PER_ITEM {
                return Err(f.err(
                    "scores",
                    format_args!("must hold at most {MAX_SCORES_PER_ITEM} scores"),
                ));
            }
            for (n, v) in m {
                let field = format!("scores.{n}");
                if !valid_score_name(n) {
                    return Err(name_error(&field));
                }
                scores.push((n.clone(), f.number(&field, v, None)?));
            }
        }
        Some(other) => {
            return Err(f.err(
                "scores",
                format_args!(
                    "must be an object of score names to numbers, not {}",
                    json_type(other)
                ),
            ));
        }
    }
    if scores.is_empty() {
        let what = match source {
            Source::Feedback => {
                "thumbs, guardrail_flagged, hallucination_flagged, retrieval_recall or retrieval_empty"
            }
            Source::Scores => {
                "name and value, scores, guardrail_flagged, hallucination_flagged, retrieval_recall or retrieval_empty"
            }
        };
        return Err(item_error(
            i,
            format!("items[{i}]"),
            format_args!("carries nothing: give {what}"),
        ));
    }
    let at_unix_ms = match obj.get("timestamp_unix_ms") {
        None | Some(Value::Null) => now,
        Some(t) => match t.as_i64() {
            Some(ms) if (now - MAX_AGE_MS..=now + MAX_AHEAD_MS).contains(&ms) => ms,
            Some(_) => {
                return Err(f.err(
                    "timestamp_unix_ms",
                    "must be within the last 24 hours and at most 5 minutes ahead",
                ));
            }
            None => {
                return Err(f.err(
                    "timestamp_unix_ms",
                    "must be an integer (milliseconds since the Unix epoch)",
                ));
            }
        },
    };
    Ok(Item {
        request_id,
        trace_id,
        model_id,
        at_unix_ms,
        scores,
    })
}

pub(crate) async fn post_feedback(State(st): State<Arc<IngestState>>, body: Body) -> Response {
    post(st, body, Source::Feedback).await
}

pub(crate) async fn post_scores(State(st): State<Arc<IngestState>>, body: Body) -> Response {
    post(st, body, Source::Scores).await
}

async fn post(st: Arc<IngestState>, body: Body, source: Source) -> Response {
    let ep = match source {
        Source::Feedback => &FEEDBACK,
        Source::Scores => &SCORES,
    };
    let items = match read_items(body, ep).await {
        Ok(items) => items,
        Err(answer) => return answer,
    };
    let now = now_unix_ms();
    let mut errors = Vec::new();
    let mut accepted = Vec::new();
    for (i, v) in items.iter().enumerate() {
        match parse_item(i, v, source, now) {
            Ok(item) => accepted.push(item),
            Err(e) => errors.push(e),
        }
    }
    if !accepted.is_empty() {
        let rows: Vec<ScoreRow> = accepted.iter().flat_map(|it| it.rows(source)).collect();
        let store = st.store.clone();
        if let Err(answer) = store_or_refuse(source.as_str(), "the items", move || {
            store.insert_scores(&rows)
        })
        .await
        {
            return answer;
        }
        if let Some(feed) = &st.engine {
            let inputs: Vec<ScoreInput> = accepted.iter().flat_map(Item::inputs).collect();
            feed.send_scores(inputs).await;
        }
    }
    items_answer(items.len(), errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_700_000_000_000;

    #[test]
    fn feedback_items_become_named_values() {
        let it = parse_item(
            0,
            &json!({"request_id": "r1", "thumbs": "down", "guardrail_flagged": true,
                    "retrieval_recall": 0.5, "retrieval_empty": false}),
            Source::Feedback,
            NOW,
        )
        .unwrap();
        assert_eq!(it.at_unix_ms, NOW);
        assert_eq!(
            it.scores,
            vec![
                (THUMBS.to_string(), 0.0),
                (GUARDRAIL.to_string(), 1.0),
                (RETRIEVAL_EMPTY.to_string(), 0.0),
                (RETRIEVAL_RECALL.to_string(), 0.5),
            ]
        );
        let rows: Vec<ScoreRow> = it.rows(Source::Feedback).collect();
        assert!(
            rows.iter()
                .all(|r| r.source == "feedback" && r.request_id == "r1")
        );
        let up = parse_item(
            1,
            &json!({"trace_id": "0AF7651916CD43DD8448EB211C80319C", "thumbs": true}),
            Source::Feedback,
            NOW,
        )
        .unwrap();
        assert_eq!(up.trace_id, "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(up.scores, vec![(THUMBS.to_string(), 1.0)]);
    }

    #[test]
    fn score_items_take_a_name_and_value_or_a_map() {
        let it = parse_item(
            0,
            &json!({"request_id": "r", "model_id": "m", "name": "toxicity", "value": 0.9,
                    "scores": {"bleu": 0.25, "rag.relevance_2": 3}}),
            Source::Scores,
            NOW,
        )
        .unwrap();
        assert_eq!(it.model_id, "m");
        assert_eq!(it.scores.len(), 3);
        assert!(it.scores.contains(&("rag.relevance_2".to_string(), 3.0)));
    }

    fn why(v: Value, source: Source) -> (String, String) {
        let e = parse_item(3, &v, source, NOW).unwrap_err();
        assert_eq!(e.index, 3);
        (e.field, e.message)
    }

    #[test]
    fn bad_items_name_the_field_and_reason() {
        let fb = Source::Feedback;
        let sc = Source::Scores;
        assert_eq!(why(json!(5), fb).0, "items[3]");
        assert!(
            why(json!({"thumbs": "up"}), fb)
                .1
                .contains("request_id or trace_id")
        );
        assert_eq!(
            why(json!({"request_id": "r", "thumbs": "meh"}), fb).0,
            "items[3].thumbs"
        );
        assert_eq!(
            why(json!({"request_id": "r", "name": "x", "value": 1}), fb).0,
            "items[3].name",
            "not a feedback field"
        );
        assert_eq!(
            why(
                json!({"request_id": "r", "trace_id": "abc", "thumbs": "up"}),
                fb
            )
            .0,
            "items[3].trace_id"
        );
        assert_eq!(
            why(json!({"request_id": "r"}), fb).1,
            "items[3] carries nothing: give thumbs, guardrail_flagged, hallucination_flagged, retrieval_recall or retrieval_empty"
        );
        assert_eq!(
            why(json!({"request_id": "r", "retrieval_recall": 1.5}), fb).0,
            "items[3].retrieval_recall"
        );
        assert_eq!(
            why(json!({"request_id": "r", "guardrail_flagged": "yes"}), fb).0,
            "items[3].guardrail_flagged"
        );
        assert_eq!(
            why(
                json!({"request_id": "r", "name": "Toxicity", "value": 1}),
                sc
            )
            .0,
            "items[3].name"
        );
        assert_eq!(
            why(json!({"request_id": "r", "name": "thumbs", "value": 1}), sc).0,
            "items[3].name"
        );
        assert_eq!(
            why(
                json!({"request_id": "r", "name": "bleu", "value": "high"}),
                sc
            )
            .0,
            "items[3].value"
        );
        assert_eq!(
            why(json!({"request_id": "r", "name": "bleu"}), sc).0,
            "items[3].value"
        );
        assert_eq!(
            why(json!({"request_id": "r", "value": 1}), sc).0,
            "items[3].name"
        );
        assert_eq!(
            why(json!({"request_id": "r", "scores": {"a b": 1}}), sc).0,
            "items[3].scores.a b"
        );
        assert_eq!(
            why(json!({"request_id": "r", "scores": [1]}), sc).0,
            "items[3].scores"
        );
        assert_eq!(why(json!({"request_id": "r", "scores": {"bleu": 1}, "timestamp_unix_ms": NOW + 3_600_000}), sc).0, "items[3].timestamp_unix_ms");
        assert_eq!(
            why(json!({"request_id": "has space", "thumbs": "up"}), fb).0,
            "items[3].request_id"
        );
    }
}
