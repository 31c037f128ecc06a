// Inputs posted to the API: `POST /api/v1/embeddings` (output embeddings computed after the
// response; here), `POST /api/v1/feedback` and `POST /api/v1/scores` (`feedback`) — checked item
// by item (partial success), stored, and handed to the alert engine through its posted-inputs
// port (semantic drift, drift vote, quality). A source: it serves routes on the API port.

pub mod feedback;

use crate::sources::{Source, SourceContext, SourceHandle, StartFuture};
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::sync::Arc;
use tokenwatch_core::alert::PostedInputs;
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::embedding::{
    EmbeddingDims, EmbeddingError, EmbeddingInput, MAX_DIMS, check_embedding,
};
use tokenwatch_store::{EmbeddingRow, Store};

/// Most items in one `POST /api/v1/embeddings`.
pub const MAX_ITEMS: usize = 256;
/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 << 20;
/// Oldest and furthest-ahead `timestamp_unix_ms` accepted, relative to now (every posted item).
pub(crate) const MAX_AGE_MS: i64 = 24 * 3_600_000;
pub(crate) const MAX_AHEAD_MS: i64 = 5 * 60_000;
const ITEM_FIELDS: &str = "request_id, model_id, embedding, timestamp_unix_ms";
/// What the endpoints need: the store, the embedding dimension each model keeps, and the
/// engine's port when alerting is enabled.
pub struct IngestState {
    pub store: Arc<dyn Store>,
    pub dims: Arc<EmbeddingDims>,
    pub engine: Option<Arc<dyn PostedInputs>>,
}

/// The endpoints over `store`, feeding `engine` (alerting enabled) or storing only.
pub fn router(store: Arc<dyn Store>, engine: Option<Arc<dyn PostedInputs>>) -> axum::Router {
    let dims = engine
        .as_ref()
        .map_or_else(|| Arc::new(EmbeddingDims::default()), |e| e.dims());
    axum::Router::new()
        .route("/api/v1/embeddings", post(post_embeddings))
        .route("/api/v1/feedback", post(feedback::post_feedback))
        .route("/api/v1/scores", post(feedback::post_scores))
        .with_state(Arc::new(IngestState {
            store,
            dims,
            engine,
        }))
}

/// The posted-inputs source: always on (the endpoints answer whether or not alerting runs).
pub struct Posted;

impl Source for Posted {
    fn name(&self) -> &'static str {
        "posted"
    }

    fn start(self: Box<Self>, ctx: SourceContext) -> StartFuture {
        Box::pin(async move {
            Ok(SourceHandle {
                request_path: None,
                listening: Vec::new(),
                tasks: Vec::new(),
                routes: Some(router(ctx.rows.store, ctx.signals.posted)),
            })
        })
    }
}

/// A refused item: its index, the field at fault (`items[3].embedding[7]`) and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ItemError {
    pub index: usize,
    pub field: String,
    pub message: String,
}

pub(crate) fn item_error(index: usize, field: String, why: impl std::fmt::Display) -> ItemError {
    ItemError {
        index,
        message: format!("{field} {why}"),
        field,
    }
}

/// One checked item.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub request_id: String,
    pub model_id: String,
    pub embedding: Vec<f32>,
    pub at_unix_ms: i64,
}

pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks item `i` of the body (everything but the per-model dimension).
pub fn parse_item(i: usize, v: &Value, now: i64) -> Result<Item, ItemError> {
    let at = |f: &str| format!("items[{i}].{f}");
    let Some(obj) = v.as_object() else {
        return Err(item_error(
            i,
            format!("items[{i}]"),
            format_args!("must be an object with {ITEM_FIELDS}, not {}", json_type(v)),
        ));
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !ITEM_FIELDS.split(", ").any(|f| f == k.as_str()))
    {
        return Err(item_error(
            i,
            at(k),
            format_args!("is not a known field; allowed: {ITEM_FIELDS}"),
        ));
    }
    let text = |name: &str, max: usize, ok: fn(u8) -> bool| -> Result<String, ItemError> {
        match obj.get(name) {
            None => Err(item_error(i, at(name), "is required")),
            Some(Value::String(s)) if !s.is_empty() && s.len() <= max && s.bytes().all(ok) => {
                Ok(s.clone())
            }
            Some(Value::String(_)) => Err(item_error(
                i,
                at(name),
                format_args!("must be 1 to {max} printable characters"),
            )),
            Some(other) => Err(item_error(
                i,
                at(name),
                format_args!("must be a string, not {}", json_type(other)),
            )),
        }
    };
    // As the proxy's x-request-id: printable ASCII without spaces.
    let request_id = text("request_id", 128, |b| b.is_ascii_graphic())?;
    let model_id = text("model_id", 256, |b| !b.is_ascii_control())?;
    let raw = match obj.get("embedding") {
        None => return Err(item_error(i, at("embedding"), "is required")),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(item_error(
                i,
                at("embedding"),
                format_args!("must be an array of numbers, not {}", json_type(other)),
            ));
        }
    };
    let mut values = Vec::with_capacity(raw.len().min(MAX_DIMS));
    for (j, x) in raw.iter().enumerate().take(MAX_DIMS + 1) {
        match x.as_f64() {
            Some(f) => values.push(f),
            None => {
                return Err(item_error(
                    i,
                    format!("items[{i}].embedding[{j}]"),
                    format_args!("must be a number, not {}", json_type(x)),
                ));
            }
        }
    }
    let embedding = check_embedding(&values).map_err(|e| match e {
        EmbeddingError::NotFinite(j) | EmbeddingError::OutOfRange(j) => {
            let why = if matches!(e, EmbeddingError::NotFinite(_)) {
                "is not a finite number"
            } else {
                "is outside the 32-bit float range"
            };
            item_error(i, format!("items[{i}].embedding[{j}]"), why)
        }
        EmbeddingError::Dimensions(_) => {
            item_error(i, at("embedding"), EmbeddingError::Dimensions(raw.len()))
        }
        other => item_error(i, at("embedding"), other),
    })?;
    let at_unix_ms = match obj.get("timestamp_unix_ms") {
        None | Some(Value::Null) => now,
        Some(t) => match t.as_i64() {
            Some(ms) if (now - MAX_AGE_MS..=now + MAX_AHEAD_MS).contains(&ms) => ms,
            Some(_) => {
                return Err(item_error(
                    i,
                    at("timestamp_unix_ms"),
                    "must be within the last 24 hours and at most 5 minutes ahead",
                ));
            }
            None => {
                return Err(item_error(
                    i,
                    at("timestamp_unix_ms"),
                    "must be an integer (milliseconds since the Unix epoch)",
                ));
            }
        },
    };
    Ok(Item {
        request_id,
        model_id,
        embedding,
        at_unix_ms,
    })
}

pub(crate) fn refuse(status: StatusCode, msg: String) -> Response {
    (status, Json(json!({ "error": msg }))).into_response()
}

/// Runs a store write of accepted items off the async workers; a failed one is logged (as
/// posted `logged`) and answered 503 — none of `answered` was accepted, the caller retries.
pub(crate) async fn store_or_refuse(
    logged: &str,
    answered: &str,
    write: impl FnOnce() -> Result<(), tokenwatch_store::StoreError> + Send + 'static,
) -> Result<(), Response> {
    let e = match tokio::task::spawn_blocking(write).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    tracing::warn!(error = %e, "storing posted {logged} failed");
    Err(refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("storing {answered} failed, none was accepted; retry later: {e}"),
    ))
}

/// How a partial-success endpoint names itself and its items in its refusals.
pub(crate) struct ItemsEndpoint {
    /// `POST /api/v1/embeddings`.
    pub route: &'static str,
    /// The fields of an item, `a, b, c`.
    pub fields: &'static str,
    /// What the items are, plural (`embeddings`).
    pub noun: &'static str,
    /// A bare JSON array is taken as the items too.
    pub bare_array: bool,
}

/// Reads the body of a partial-success endpoint: `{"items": [...]}` (or, with `bare_array`, a
/// JSON array) of 1 to `MAX_ITEMS` items within `MAX_BODY_BYTES`; anything else is the answer.
pub(crate) async fn read_items(body: Body, ep: &ItemsEndpoint) -> Result<Vec<Value>, Response> {
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) if crate::listen::limits::is_length_limit(&e) => {
            // Counted by the API listener in `tokenwatch_rejected_requests{reason="body_too_large"}`.
            let msg = format!(
                "the request body is over the limit of {MAX_BODY_BYTES} bytes (fixed for {})",
                ep.route
            );
            return Err(crate::listen::limits::mark_body_too_large(refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                msg,
            )));
        }
        Err(e) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                format!("could not read the body: {e}"),
            ));
        }
    };
    let body: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                format!("the body is not valid JSON: {e}"),
            ));
        }
    };
    let fields = ep.fields;
    let items = match body {
        Value::Array(a) if ep.bare_array => a,
        Value::Object(mut o) => {
            let Some(Value::Array(a)) = o.remove("items") else {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    format!("the body must be an object {{\"items\": [{{{fields}}}, ...]}}"),
                ));
            };
            if let Some(k) = o.keys().next() {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    format!("unknown field {k:?}; allowed: items"),
                ));
            }
            a
        }
        _ => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                format!("the body must be an object {{\"items\": [{{{fields}}}, ...]}}"),
            ));
        }
    };
    if items.is_empty() || items.len() > MAX_ITEMS {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            format!(
                "items must hold 1 to {MAX_ITEMS} {}, has {}",
                ep.noun,
                items.len()
            ),
        ));
    }
    Ok(items)
}

/// The partial-success answer: 200 with `accepted`, `rejected` and each refused item's index,
/// field and reason; 400 (with `error` naming the first problem) when nothing was accepted.
pub(crate) fn items_answer(total: usize, errors: Vec<ItemError>) -> Response {
    let n_ok = total - errors.len();
    let status = if n_ok == 0 {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    let mut out = json!({ "accepted": n_ok, "rejected": errors.len(), "errors": errors });
    if let Some(first) = errors.first().filter(|_| n_ok == 0) {
        out["error"] = json!(format!(
            "no item was accepted; first problem: {}",
            first.message
        ));
    }
    (status, Json(out)).into_response()
}

const EMBEDDINGS: ItemsEndpoint = ItemsEndpoint {
    route: "POST /api/v1/embeddings",
    fields: ITEM_FIELDS,
    noun: "embeddings",
    bare_array: false,
};

async fn post_embeddings(State(st): State<Arc<IngestState>>, body: Body) -> Response {
    let items = match read_items(body, &EMBEDDINGS).await {
        Ok(items) => items,
        Err(answer) => return answer,
    };
    let now = now_unix_ms();
    let mut errors = Vec::new();
    let mut accepted = Vec::new();
    for (i, v) in items.iter().enumerate() {
        match parse_item(i, v, now) {
            Ok(item) => match st.dims.admit(&item.model_id, item.embedding.len(), now) {
                Ok(()) => accepted.push(item),
                Err(e) => errors.push(item_error(i, format!("items[{i}].embedding"), e)),
            },
            Err(e) => errors.push(e),
        }
    }
    if !accepted.is_empty() {
        let rows: Vec<EmbeddingRow> = accepted
            .iter()
            .map(|it| EmbeddingRow {
                request_id: it.request_id.clone(),
                model_id: it.model_id.clone(),
                at_unix_ms: it.at_unix_ms,
                embedding: it.embedding.clone(),
            })
            .collect();
        let store = st.store.clone();
        if let Err(answer) = store_or_refuse("embeddings", "the embeddings", move || {
            store.insert_embeddings(&rows)
        })
        .await
        {
            return answer;
        }
        if let Some(feed) = &st.engine {
            let inputs = accepted
                .into_iter()
                .map(|it| EmbeddingInput {
                    model: it.model_id,
                    at_ms: it.at_unix_ms,
                    vector: it.embedding.into(),
                })
                .collect();
            feed.send_embeddings(inputs).await;
        }
    }
    items_answer(items.len(), errors)
}

#[cfg(test)]
#[path = "embeddings_tests.rs"]
mod tests;
