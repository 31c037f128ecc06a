// `GET /api/v1/routes` (weighted routes: configured and current weights, observed shares,
// rollback state) and `POST /api/v1/routes/{name}/weights` (an admin sets or restores weights).

use crate::kernel::splits::SplitBoard;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The routes API over the process's split board (its own state, merged into the API router).
pub fn router(board: Arc<SplitBoard>) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/routes", axum::routing::get(list))
        .route("/api/v1/routes/{name}", axum::routing::get(one))
        .route(
            "/api/v1/routes/{name}/weights",
            axum::routing::post(set_weights),
        )
        .with_state(board)
}

fn error(status: StatusCode, msg: String) -> Response {
    (status, Json(json!({ "error": msg }))).into_response()
}

async fn list(State(b): State<Arc<SplitBoard>>) -> Response {
    let routes: Vec<serde_json::Value> = b.all().iter().map(|t| t.view()).collect();
    Json(json!({ "routes": routes })).into_response()
}

async fn one(State(b): State<Arc<SplitBoard>>, Path(name): Path<String>) -> Response {
    match b.get(&name) {
        Some(t) => Json(t.view()).into_response(),
        None => no_route(&b, &name),
    }
}

fn no_route(b: &SplitBoard, name: &str) -> Response {
    let names: Vec<String> = b.all().iter().map(|t| t.name.clone()).collect();
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no route named {name:?} (proxy.routes: {})",
            names.join(", ")
        ),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightsBody {
    /// Version → weight; versions left out keep their weight.
    weights: BTreeMap<String, f64>,
}

async fn set_weights(
    State(b): State<Arc<SplitBoard>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let Some(t) = b.get(&name) else {
        return no_route(&b, &name);
    };
    let parsed: WeightsBody = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("expected {{\"weights\": {{\"<version>\": <weight ≥ 0>, ...}}}}: {e}"),
            );
        }
    };
    if parsed.weights.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "weights: name at least one version".into(),
        );
    }
    let weights: Vec<(String, f64)> = parsed.weights.into_iter().collect();
    match t.set_weights(&weights) {
        Ok(()) => {
            tracing::info!(route = %t.name, weights = ?t.weights(), "route weights set through the API");
            Json(t.view()).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}
