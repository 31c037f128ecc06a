// `GET /api/v1/requests` (filters: model, tenant, status, min_e2e_s, request_id, annotated, since,
// limit) and `GET /api/v1/requests/{id}`: stored request records with their per-chunk token
// timeline, their `annotations` (per-request anomalies such as output length outliers) and, for
// one request, its captured `text` (masked; only when `capture.text` is on) and its `scores`.

use super::ApiState;
use crate::kernel::params::{ParamError, Params};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use tokenwatch_core::model::RequestRecord;
use tokenwatch_store::{AnnotationRow, RecordOutcome, RecordQuery, Store};

/// A record as JSON with its annotations (`[]` when none).
fn with_annotations(r: RequestRecord, notes: &[AnnotationRow]) -> serde_json::Value {
    let mine: Vec<&AnnotationRow> = notes
        .iter()
        .filter(|a| a.request_id == r.request_id)
        .collect();
    let mut v = serde_json::to_value(&r).unwrap_or_else(|e| json!({ "error": e.to_string() }));
    if let Some(o) = v.as_object_mut() {
        o.insert("annotations".into(), json!(mine));
    }
    v
}

/// Records matching `query` with their annotations.
async fn run_query(
    store: Arc<dyn Store>,
    query: RecordQuery,
) -> Result<Vec<serde_json::Value>, Response> {
    let fail = |e: String| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": e })),
        )
            .into_response()
    };
    let found = tokio::task::spawn_blocking(move || {
        let records = store.query_records(&query)?;
        let ids: Vec<String> = records.iter().map(|r| r.request_id.clone()).collect();
        let notes = store.query_annotations(&ids)?;
        Ok::<_, tokenwatch_store::StoreError>(
            records
                .into_iter()
                .map(|r| with_annotations(r, &notes))
                .collect(),
        )
    })
    .await;
    match found {
        Ok(Ok(records)) => Ok(records),
        Ok(Err(e)) => Err(fail(e.to_string())),
        Err(e) => Err(fail(e.to_string())),
    }
}

pub(super) async fn list(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(
        q.as_deref(),
        &[
            "model",
            "tenant",
            "status",
            "min_e2e_s",
            "request_id",
            "annotated",
            "limit",
            "since",
        ],
    )?;
    let annotated = p
        .parse_with(
            "annotated",
            |s| match s {
                "true" | "1" => Some(true),
                "false" | "0" | "" => Some(false),
                _ => None,
            },
            "true or false",
        )?
        .unwrap_or(false);
    let limit = p
        .parse_with(
            "limit",
            |s| s.parse::<usize>().ok().filter(|n| (1..=10_000).contains(n)),
            "an integer from 1 to 10000",
        )?
        .unwrap_or(100);
    let since = p.parse_with(
        "since",
        |s| {
            chrono::DateTime::parse_from_rfc3339(s)
                .ok()
                .map(|t| t.timestamp_millis())
        },
        "an RFC 3339 timestamp such as 2026-12-02T10:00:00Z",
    )?;
    let outcome = p.parse_with(
        "status",
        RecordOutcome::parse,
        "ok, error, or an error class such as upstream_5xx",
    )?;
    let min_e2e_s = p.parse_with(
        "min_e2e_s",
        |s| s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0),
        "a non-negative number of seconds such as 1.5",
    )?;
    let non_empty = |name: &str| p.get(name).filter(|v| !v.is_empty()).map(str::to_string);
    let query = RecordQuery {
        model: non_empty("model"),
        since_unix_ms: since,
        tenant: non_empty("tenant"),
        request_id: non_empty("request_id"),
        trace_id: None,
        outcome,
        min_e2e_s,
        annotated,
        limit,
        with_text: false,
    };
    Ok(match run_query(st.store.clone(), query).await {
        Ok(records) => Json(json!({ "count": records.len(), "requests": records })).into_response(),
        Err(resp) => resp,
    })
}

fn internal_error(e: String) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({ "error": e })),
    )
        .into_response()
}

pub(super) async fn one(State(st): State<Arc<ApiState>>, Path(id): Path<String>) -> Response {
    let query = RecordQuery {
        request_id: Some(id.clone()),
        limit: 1,
        with_text: true,
        ..RecordQuery::default()
    };
    match run_query(st.store.clone(), query).await {
        Ok(mut records) => match records.pop() {
            Some(mut r) => {
                // Its feedback and evaluation scores (`POST /api/v1/feedback`, `/api/v1/scores`),
                // given for its request id or its trace id.
                let trace = r["trace_id"].as_str().unwrap_or_default().to_string();
                let store = st.store.clone();
                let (ids, traces) = (vec![id.clone()], vec![trace]);
                let scores =
                    tokio::task::spawn_blocking(move || store.query_scores(&ids, &traces)).await;
                match scores {
                    Ok(Ok(rows)) => {
                        if let Some(o) = r.as_object_mut() {
                            o.insert("scores".into(), json!(rows));
                        }
                    }
                    Ok(Err(e)) => return internal_error(e.to_string()),
                    Err(e) => return internal_error(e.to_string()),
                }
                Json(r).into_response()
            }
            None => (
                StatusCode::NOT_FOUND,
                Json(json!({ "error": format!("no stored request with id {id:?} (records are kept for the raw retention period)") })),
            )
                .into_response(),
        },
        Err(resp) => resp,
    }
}
