// /v1/chat/completions and /v1/completions (and Azure OpenAI's deployment path for chat): parse
// the body, run it through the shared request path (generate.rs), then stream vLLM-shaped SSE
// chunks or answer one JSON body.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use super::generate::{self, GenRequest, SseEncoder, Usage};
use super::openai::{Endpoint, ParsedRequest, parse};
use super::sse::{ChunkCtx, DONE_FRAME};
use crate::metrics::FinishReason;

pub async fn chat(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(app, Endpoint::Chat, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Azure OpenAI's `/openai/deployments/{deployment}/chat/completions`: a chat request whose
/// model is the deployment when the body names none (Azure clients send none).
pub async fn azure_chat(
    State(app): State<AppState>,
    axum::extract::Path(deployment): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(serde_json::Value::Object(mut o)) => {
            o.entry("model")
                .or_insert_with(|| serde_json::Value::String(deployment));
            Bytes::from(serde_json::Value::Object(o).to_string())
        }
        _ => body,
    };
    chat(State(app), headers, body).await
}

pub async fn completions(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(app, Endpoint::Completion, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn handle(
    app: AppState,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ParsedRequest = parse(endpoint, &body)?;
    let reasoning = app.reasoning();
    let generation = generate::start(
        &app,
        GenRequest {
            model: req.model,
            prompt_text: req.prompt_text,
            prompt_tokens: req.prompt_tokens,
            max_tokens: req.max_tokens,
            reasoning_tokens: reasoning.tokens,
        },
    )
    .await?;
    let mut ctx = ChunkCtx::new(endpoint, &generation.model);
    if app.prompt_tokens_details() {
        ctx.cached_tokens = Some(generation.cached_tokens);
    }
    let key = reasoning.field.key();
    let mut response = if req.stream {
        let enc = VllmEncoder {
            ctx,
            reasoning_key: key,
            include_usage: req.include_usage,
            role_sent: false,
        };
        generate::stream_response(generation.rx, enc, app.headers_at_first_token()).await
    } else {
        let mut out = generate::collect(generation.rx).await?;
        if endpoint == Endpoint::Completion {
            // Completions have no reasoning field: the thinking is part of the text.
            out.text.insert_str(0, &out.reasoning);
            out.usage.reasoning = 0;
        }
        let body = ctx.full_response(&out.text, (key, &out.reasoning), out.finish, out.usage);
        Json(body).into_response()
    };
    generate::add_headers(&mut response, generation.queue_time, &headers);
    Ok(response)
}

/// vLLM's chunks: chat sends a role chunk before its first token and reasoning tokens in
/// the reasoning delta field (completions carry them as text); optional usage chunk; `[DONE]`.
struct VllmEncoder {
    ctx: ChunkCtx,
    reasoning_key: &'static str,
    include_usage: bool,
    role_sent: bool,
}

impl SseEncoder for VllmEncoder {
    fn open(&mut self) -> String {
        String::new()
    }

    fn token(&mut self, text: &str, reasoning: bool, finish: Option<FinishReason>) -> String {
        let mut out = String::new();
        if self.ctx.endpoint == Endpoint::Chat && !self.role_sent {
            self.role_sent = true;
            out.push_str(&self.ctx.role_chunk());
        }
        let key = if reasoning {
            self.reasoning_key
        } else {
            "content"
        };
        out.push_str(&self.ctx.delta_chunk(key, text, finish));
        out
    }

    fn done(&mut self, usage: Usage) -> String {
        let mut out = String::new();
        if self.include_usage {
            let reasoning = match self.ctx.endpoint {
                Endpoint::Chat => usage.reasoning,
                Endpoint::Completion => 0,
            };
            out.push_str(
                &self
                    .ctx
                    .usage_chunk(usage.prompt, usage.completion, reasoning),
            );
        }
        out.push_str(DONE_FRAME);
        out
    }

    fn failed(&mut self, _message: &str) -> String {
        // vLLM simply ends the stream when its engine dies.
        String::new()
    }
}
