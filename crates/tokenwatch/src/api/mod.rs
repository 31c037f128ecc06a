// The HTTP API on the API port: `/api/v1/*` JSON queries, `/metrics`, `/healthz`, `/readyz`.
// Every query parameter is checked; unknown names or values get a 400 that says what is allowed.

mod budgets;
mod fleet;
mod gpu_history;
pub mod health;
pub mod latency;
mod markers;
mod requests;
pub mod routes;
mod scaling;
mod slos;
mod spend;
pub mod timeline;
mod traces;

use crate::alerting::engine::AlertBook;
use crate::kernel::params::{ParamError, Params};
use crate::kernel::telemetry::Metrics;
use crate::sources::Components;
use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use std::sync::{Arc, Mutex, RwLock};
use tokenwatch_core::aggregate::Aggregator;
use tokenwatch_core::signals::SharedSignals;
use tokenwatch_store::Store;

/// A 500 answer naming what failed (a store error, a blocking task that did not finish).
fn internal_error(e: String) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({ "error": e })),
    )
        .into_response()
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds (`2026-12-02T10:00:00.000Z`); "" for a
/// time chrono cannot hold.
fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

pub struct ApiState {
    pub aggregator: Arc<Mutex<Aggregator>>,
    pub store: Arc<dyn Store>,
    /// The backend behind `store`: `/api/v1/latency` answers from it by default when shared.
    pub store_backend: tokenwatch_store::StoreBackendKind,
    /// What the store's writer thread last learnt of the store, for `/readyz`.
    pub store_health: Arc<crate::pipeline::StoreHealth>,
    pub metrics: Arc<Metrics>,
    /// Components and whether each is ready, for `/readyz`.
    pub components: Components,
    pub signals: SharedSignals,
    /// Alerts, for the per-model counts of `/api/v1/fleet`.
    pub alerts: Arc<AlertBook>,
    /// Per-model history sampled every 5 s (`timeline::spawn_sampler`).
    pub timeline: Arc<RwLock<timeline::Timeline>>,
    /// SLO statuses, published by the alert engine.
    pub slos: Arc<crate::alerting::slo::SloBook>,
    /// Scaling recommendations, published by the alert engine.
    pub scaling: Arc<crate::alerting::slo::scaling::ScalingBook>,
    /// Span → component rules for per-trace self time (`traces.components`).
    pub trace_components: Arc<crate::pipeline::trace_components::ComponentMap>,
    /// The spend budgets (`budgets:`), answered from the store.
    pub budgets: Arc<Vec<crate::alerting::budget::BudgetConfig>>,
}

pub fn router(state: Arc<ApiState>) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/latency", get(latency::latency))
        .route("/api/v1/requests", get(requests::list))
        .route("/api/v1/requests/{id}", get(requests::one))
        .route("/api/v1/traces/{trace_id}", get(traces::trace))
        .route("/api/v1/fleet", get(fleet::fleet))
        .route("/api/v1/timeseries", get(fleet::timeseries))
        .route("/api/v1/gpus/history", get(gpu_history::gpu_history))
        .route("/api/v1/signals", get(signals))
        .route("/api/v1/slos", get(slos::list))
        .route("/api/v1/spend", get(spend::spend))
        .route("/api/v1/budgets", get(budgets::list))
        .route("/api/v1/scaling", get(scaling::all))
        .route("/api/v1/scaling/{model}", get(scaling::one))
        .route("/api/v1/markers", get(markers::list).post(markers::create))
        .route("/api/v1/compare", get(markers::compare))
        .fallback(not_found)
        .with_state(state)
}

impl IntoResponse for ParamError {
    fn into_response(self) -> Response {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": self.to_string() })),
        )
            .into_response()
    }
}

async fn not_found(uri: axum::http::Uri) -> Response {
    let msg = format!(
        "no such endpoint {}; available: /, /api/v1/fleet, /api/v1/timeseries, /api/v1/latency, /api/v1/requests, /api/v1/requests/{{id}}, /api/v1/traces/{{trace_id}}, /api/v1/signals, /api/v1/alerts, /api/v1/rules, /api/v1/slos, /api/v1/spend, /api/v1/budgets, /api/v1/scaling/{{model}}, /api/v1/markers, /api/v1/compare?marker={{id}}, /api/v1/logs/templates, /api/v1/gpus/history, /api/v1/targets, /api/v1/gpus, /metrics, /healthz, /readyz",
        uri.path()
    );
    (StatusCode::NOT_FOUND, Json(json!({ "error": msg }))).into_response()
}

async fn metrics(State(st): State<Arc<ApiState>>) -> Response {
    (
        [(header::CONTENT_TYPE, Metrics::CONTENT_TYPE)],
        st.metrics.encode(),
    )
        .into_response()
}

async fn readyz(State(st): State<Arc<ApiState>>) -> Response {
    // The writer thread's last store call (or its idle probe), never a store call here: a
    // store that hangs must not hold an API worker.
    let store = match st.store_health.readiness() {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("error: {e}"),
    };
    let snapshot = st.components.snapshot();
    // Where this process forwards requests, a failing store is analysis failing: the proxy
    // still serves every request (records wait or are counted lost), so it stays in rotation
    // and the store's error is only named. Without a proxy (collector-only, aggregator) the
    // store is the job: not ready. Shutting down: not ready, whatever else holds, so a load
    // balancer stops sending.
    let forwarding = snapshot.get("proxy").is_some_and(|p| p == "ok");
    let ready = (store == "ok" || forwarding) && !st.components.draining();
    let mut components: serde_json::Map<String, serde_json::Value> =
        snapshot.into_iter().map(|(k, v)| (k, json!(v))).collect();
    components.insert("store".into(), json!(store));
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

/// Latest value of every normalised signal of a model (or of all models), with its source.
async fn signals(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(q.as_deref(), &["model"])?;
    let model = p.get("model");
    let points = {
        let board = st.signals.read().unwrap_or_else(|p| p.into_inner());
        board.latest(model)
    };
    Ok(Json(json!({ "model": model, "count": points.len(), "signals": points })).into_response())
}
