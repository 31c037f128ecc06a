// Alert API on the API port: `GET /api/v1/alerts` (filters state, severity, model),
// `GET /api/v1/alerts/{id}` (evidence, root-cause chain), `/api/v1/alerts/{id}/snapshot` and
// `GET /api/v1/rules` (the rules evaluated now).

use crate::alerting::engine::AlertBook;
use crate::alerting::snapshot::{SNAPSHOT_CONTENT_TYPE, read_snapshot};
use crate::kernel::params::{ParamError, Params};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use std::sync::Arc;
use tokenwatch_core::alert::{AlertState, Severity};

pub fn router(book: Arc<AlertBook>) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/alerts", get(list))
        .route("/api/v1/alerts/{id}", get(one))
        .route("/api/v1/alerts/{id}/snapshot", get(snapshot))
        .route("/api/v1/rules", get(rules))
        .with_state(book)
}

fn not_found(id: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": format!("no alert with id or fingerprint {id:?}") })),
    )
        .into_response()
}

async fn list(
    State(book): State<Arc<AlertBook>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(q.as_deref(), &["state", "severity", "model"])?;
    let state = p.parse_with("state", AlertState::parse, "pending, firing, resolved")?;
    let severity = p.parse_with("severity", Severity::parse, "critical, warning, info")?;
    let model = p.get("model");
    let alerts: Vec<_> = book
        .list()
        .into_iter()
        .filter(|a| state.is_none_or(|s| a.state == s))
        .filter(|a| severity.is_none_or(|s| a.severity == s))
        .filter(|a| model.is_none_or(|m| a.labels.get("model_id").map(String::as_str) == Some(m)))
        .collect();
    Ok(Json(json!({ "count": alerts.len(), "alerts": alerts })).into_response())
}

async fn rules(State(book): State<Arc<AlertBook>>) -> Response {
    let rules = book.rules();
    Json(json!({ "count": rules.len(), "rules": rules })).into_response()
}

async fn one(State(book): State<Arc<AlertBook>>, Path(id): Path<String>) -> Response {
    match book.get(&id) {
        Some(a) => Json(a).into_response(),
        None => not_found(&id),
    }
}

async fn snapshot(State(book): State<Arc<AlertBook>>, Path(id): Path<String>) -> Response {
    let Some(alert) = book.get(&id) else {
        return not_found(&id);
    };
    let Some(path) = alert.snapshot.clone() else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("alert {} has no snapshot (yet)", alert.id) })),
        )
            .into_response();
    };
    match tokio::task::spawn_blocking(move || read_snapshot(std::path::Path::new(&path))).await {
        Ok(Ok(bytes)) => ([(header::CONTENT_TYPE, SNAPSHOT_CONTENT_TYPE)], bytes).into_response(),
        Ok(Err(e)) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": e.to_string() })),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}
