// HTTP surface of the simulator: shared state, the router, and the small
// informational endpoints (/v1/models, /metrics — or each exporter's alone at /vllm/metrics and
// /dcgm/metrics —, fallback 404).

mod admin;
mod completions;
mod error;
mod generate;
mod messages;
mod openai;
mod responses;
mod sse;

pub use error::ApiError;
pub use openai::Endpoint;
pub use sse::ChunkCtx;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use serde_json::{Value, json};

use crate::args::ReasoningField;
use crate::engine::EngineHandle;
use crate::fault::FaultBoard;
use crate::metrics::{Exporters, MetricsInput, render_exporters};

/// How generated completions reason: tokens before each answer, and the chat field name.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reasoning {
    pub tokens: u32,
    pub field: ReasoningField,
}

/// State shared by all handlers.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    engines: Vec<EngineHandle>,
    board: Arc<FaultBoard>,
    hostname: String,
    gpu_name: String,
    reasoning: Reasoning,
    /// Streams' headers wait for their first token (`--stream-headers-at-first-token`).
    headers_at_first_token: bool,
    /// Chat and completions usage names the cached prompt tokens
    /// (`--enable-prompt-tokens-details`).
    prompt_tokens_details: bool,
    started_unix: u64,
}

impl AppState {
    pub fn new(
        engines: Vec<EngineHandle>,
        board: Arc<FaultBoard>,
        hostname: String,
        gpu_name: String,
        reasoning: Reasoning,
        headers_at_first_token: bool,
        prompt_tokens_details: bool,
    ) -> Self {
        let started_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        AppState {
            inner: Arc::new(Inner {
                engines,
                board,
                hostname,
                gpu_name,
                reasoning,
                headers_at_first_token,
                prompt_tokens_details,
                started_unix,
            }),
        }
    }

    pub fn engines(&self) -> &[EngineHandle] {
        &self.inner.engines
    }

    pub fn board(&self) -> &FaultBoard {
        &self.inner.board
    }

    pub fn reasoning(&self) -> Reasoning {
        self.inner.reasoning
    }

    /// Whether chat and completions usage names the prompt tokens read from the prefix cache.
    pub fn prompt_tokens_details(&self) -> bool {
        self.inner.prompt_tokens_details
    }

    /// Whether a stream's response headers wait for its first token.
    pub fn headers_at_first_token(&self) -> bool {
        self.inner.headers_at_first_token
    }

    pub fn hostname(&self) -> &str {
        &self.inner.hostname
    }

    /// The engine for `model`; without a model, the first served one (as vLLM does).
    pub fn engine(&self, model: Option<&str>) -> Result<&EngineHandle, ApiError> {
        let engines = &self.inner.engines;
        match model {
            None => engines
                .first()
                .ok_or_else(|| ApiError::not_found("no model is served")),
            Some(m) => engines.iter().find(|e| e.model() == m).ok_or_else(|| {
                let served: Vec<&str> = engines.iter().map(|e| e.model()).collect();
                ApiError::not_found(format!(
                    "The model `{m}` does not exist. Served models: {}",
                    served.join(", ")
                ))
            }),
        }
    }

    pub fn faults_changed(&self) {
        self.inner
            .engines
            .iter()
            .for_each(EngineHandle::faults_changed);
    }
}

/// All routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(completions::chat))
        // Azure OpenAI's two shapes of the same call: its v1 API under /openai, and a
        // deployment's path (the model is the deployment).
        .route("/openai/v1/chat/completions", post(completions::chat))
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(completions::azure_chat),
        )
        .route("/v1/completions", post(completions::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/messages", post(messages::create))
        .route("/v1/models", get(models))
        .route("/metrics", get(|s| metrics(s, Exporters::Both)))
        .route("/vllm/metrics", get(|s| metrics(s, Exporters::Vllm)))
        .route("/dcgm/metrics", get(|s| metrics(s, Exporters::Dcgm)))
        .route("/health", get(|| async { "" }))
        .route(
            "/admin/faults",
            get(admin::list_faults).post(admin::enable_fault),
        )
        .route("/admin/faults/{name}", delete(admin::disable_fault))
        .route("/admin/state", get(admin::state))
        .fallback(|| async { ApiError::not_found("no such route") })
        .with_state(state)
}

async fn models(State(app): State<AppState>) -> axum::Json<Value> {
    let data: Vec<Value> = app
        .engines()
        .iter()
        .map(|e| {
            json!({
                "id": e.model(),
                "object": "model",
                "created": app.inner.started_unix,
                "owned_by": "vllm",
                "root": e.model(),
                "parent": null,
                "max_model_len": e.config().max_model_len,
                "permission": [],
            })
        })
        .collect();
    axum::Json(json!({ "object": "list", "data": data }))
}

/// `/metrics` (both exporters' series), `/vllm/metrics` or `/dcgm/metrics` (one exporter's).
async fn metrics(State(app): State<AppState>, which: Exporters) -> impl IntoResponse {
    let snapshots: Vec<_> = app
        .engines()
        .iter()
        .map(|e| (e.config(), e.stats()))
        .collect();
    let input = MetricsInput {
        engines: snapshots,
        hostname: app.hostname(),
        gpu_name: &app.inner.gpu_name,
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render_exporters(&input, which),
    )
}
