// `GET /api/v1/traces/{trace_id}`: one trace for the UI's waterfall — the proxy's request records
// of that trace, its spans (received and the proxy's own; attributes as JSON), their self time
// per component (`crate::pipeline::trace_components`) and its logs.

use super::ApiState;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use tokenwatch_store::{LogQuery, RecordQuery, SpanQuery};

/// Spans, logs and records returned per trace at most.
const PER_TRACE_LIMIT: usize = 2_000;

fn valid_trace_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

pub(super) async fn trace(State(st): State<Arc<ApiState>>, Path(id): Path<String>) -> Response {
    if !valid_trace_id(&id) {
        let msg =
            format!("{id:?} is not a trace id: expected 32 hexadecimal digits (W3C trace context)");
        return (StatusCode::BAD_REQUEST, Json(json!({ "error": msg }))).into_response();
    }
    let id = id.to_ascii_lowercase();
    let store = st.store.clone();
    let trace_id = id.clone();
    let result = tokio::task::spawn_blocking(move || {
        let records = store.query_records(&RecordQuery {
            trace_id: Some(trace_id.clone()),
            limit: PER_TRACE_LIMIT,
            ..RecordQuery::default()
        })?;
        let spans = store.query_spans(&SpanQuery {
            trace_id: Some(trace_id.clone()),
            limit: PER_TRACE_LIMIT,
            ..SpanQuery::default()
        })?;
        let logs = store.query_logs(&LogQuery {
            trace_id: Some(trace_id),
            limit: PER_TRACE_LIMIT,
            ..LogQuery::default()
        })?;
        Ok::<_, tokenwatch_store::StoreError>((records, spans, logs))
    })
    .await;
    let (records, spans, logs) = match result {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({ "error": e.to_string() })),
            )
                .into_response();
        }
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({ "error": e.to_string() })),
            )
                .into_response();
        }
    };
    if records.is_empty() && spans.is_empty() && logs.is_empty() {
        let msg =
            format!("nothing stored for trace {id} (no proxied request, span or log carries it)");
        return (StatusCode::NOT_FOUND, Json(json!({ "error": msg }))).into_response();
    }
    let attribution = st.trace_components.attribute(&spans);
    let spans: Vec<Value> = spans
        .into_iter()
        .map(|s| {
            let attributes: Value = serde_json::from_str(&s.attributes_json).unwrap_or(Value::Null);
            let own = attribution.spans.get(&s.span_id);
            json!({
                "component": own.map(|a| a.component.as_str()),
                "self_ms": own.map(|a| a.self_ms),
                "span_id": s.span_id,
                "parent_span_id": s.parent_span_id,
                "name": s.name,
                "kind": s.kind,
                "service_name": s.service_name,
                "start_unix_nano": s.start_unix_nano,
                "end_unix_nano": s.end_unix_nano,
                "status_code": s.status_code,
                "status_message": s.status_message,
                "events_count": s.events_count,
                "attributes": attributes,
            })
        })
        .collect();
    let components =
        json!({ "self_time_ms": attribution.total_ms, "by_component": attribution.components });
    Json(json!({ "trace_id": id, "requests": records, "spans": spans, "components": components, "logs": logs }))
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn trace_ids_are_32_hex_digits() {
        assert!(super::valid_trace_id("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert!(!super::valid_trace_id("4bf92f3577b34da6a3ce929d0e0e473"));
        assert!(!super::valid_trace_id("4bf92f3577b34da6a3ce929d0e0e473z"));
    }
}
