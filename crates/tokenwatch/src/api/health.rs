// The API port of a proxy replica (`role: proxy`): `/metrics`, `/healthz` and `/readyz` (and
// `POST /-/reload`, merged by the replica) only — a replica keeps no store and runs no analysis,
// so there is nothing else to ask it.

use crate::kernel::telemetry::Metrics;
use crate::sources::Components;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use std::sync::Arc;

#[derive(Clone)]
struct Health {
    metrics: Arc<Metrics>,
    components: Components,
}

/// `/metrics`, `/healthz`, `/readyz` (503 once shutdown started, so a load balancer stops
/// sending; a missing aggregator never makes a replica unready: it fails open).
pub fn router(metrics: Arc<Metrics>, components: Components) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(Health {
            metrics,
            components,
        })
}

async fn metrics_text(State(h): State<Health>) -> Response {
    (
        [(header::CONTENT_TYPE, Metrics::CONTENT_TYPE)],
        h.metrics.encode(),
    )
        .into_response()
}

async fn readyz(State(h): State<Health>) -> Response {
    let ready = !h.components.draining();
    let components: serde_json::Map<String, serde_json::Value> = h
        .components
        .snapshot()
        .into_iter()
        .map(|(k, v)| (k, json!(v)))
        .collect();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(json!({ "ready": ready, "components": components })),
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> Response {
    let msg = format!(
        "no such endpoint {}: this is a proxy replica (role: proxy), whose API port serves /metrics, /healthz, /readyz and POST /-/reload; ask the aggregator for the rest",
        uri.path()
    );
    (StatusCode::NOT_FOUND, Json(json!({ "error": msg }))).into_response()
}
