// /v1/chat/completions and /v1/completions: submit to the model's engine, wait
// until scheduled (so x-queue-time is real), then stream SSE or answer one JSON body.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::AppState;
use super::error::ApiError;
use super::openai::{Endpoint, ParsedRequest, parse, prefix_hashes};
use super::sse::{ChunkCtx, DONE_FRAME};
use crate::engine::{SeqEvent, SubmitRequest};
use crate::metrics::FinishReason;

pub async fn chat(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(app, Endpoint::Chat, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
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
    let engine = app.engine(req.model.as_deref())?;
    let (tx, mut rx) = unbounded_channel();
    engine
        .submit(SubmitRequest {
            prompt_tokens: req.prompt_tokens,
            prefix_hashes: prefix_hashes(&req.prompt_text, engine.config().block_size),
            max_tokens: req.max_tokens,
            events: tx,
        })
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    let queue_time = match rx.recv().await {
        Some(SeqEvent::Scheduled { queue_time }) => queue_time,
        Some(SeqEvent::Rejected {
            status,
            kind,
            message,
        }) => return Err(ApiError::new(status, kind, message)),
        _ => {
            return Err(ApiError::unavailable(
                "engine stopped before scheduling the request",
            ));
        }
    };
    let ctx = ChunkCtx::new(endpoint, engine.model());
    let mut response = if req.stream {
        stream_response(ctx, rx, req.include_usage)
    } else {
        full_response(ctx, rx).await?
    };
    let h = response.headers_mut();
    h.insert(
        "x-queue-time",
        HeaderValue::from(queue_time.as_millis() as u64),
    );
    if let Some(id) = headers.get("x-request-id") {
        h.insert("x-request-id", id.clone());
    }
    Ok(response)
}

struct StreamState {
    rx: UnboundedReceiver<SeqEvent>,
    ctx: ChunkCtx,
    include_usage: bool,
    role_sent: bool,
    done: bool,
}

/// Next SSE bytes for the client, or None when the stream is over.
async fn next_frames(st: &mut StreamState) -> Option<String> {
    if st.done {
        return None;
    }
    loop {
        match st.rx.recv().await {
            Some(SeqEvent::Token { text, finish }) => {
                let mut out = String::new();
                if st.ctx.endpoint == Endpoint::Chat && !st.role_sent {
                    st.role_sent = true;
                    out.push_str(&st.ctx.role_chunk());
                }
                out.push_str(&st.ctx.token_chunk(&text, finish));
                return Some(out);
            }
            Some(SeqEvent::Done {
                prompt_tokens,
                completion_tokens,
            }) => {
                st.done = true;
                let mut out = String::new();
                if st.include_usage {
                    out.push_str(&st.ctx.usage_chunk(prompt_tokens, completion_tokens));
                }
                out.push_str(DONE_FRAME);
                return Some(out);
            }
            Some(SeqEvent::Scheduled { .. } | SeqEvent::Rejected { .. }) => continue,
            None => return None, // engine gone: end the stream
        }
    }
}

fn stream_response(
    ctx: ChunkCtx,
    rx: UnboundedReceiver<SeqEvent>,
    include_usage: bool,
) -> Response {
    let state = StreamState {
        rx,
        ctx,
        include_usage,
        role_sent: false,
        done: false,
    };
    let body = stream::unfold(state, |mut st| async move {
        next_frames(&mut st)
            .await
            .map(|frames| (Ok::<_, std::convert::Infallible>(Bytes::from(frames)), st))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| ApiError::unavailable("cannot build response").into_response())
}

async fn full_response(
    ctx: ChunkCtx,
    mut rx: UnboundedReceiver<SeqEvent>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut reason = FinishReason::Stop;
    while let Some(ev) = rx.recv().await {
        match ev {
            SeqEvent::Token { text: t, finish } => {
                text.push_str(&t);
                if let Some(r) = finish {
                    reason = r;
                }
            }
            SeqEvent::Done {
                prompt_tokens,
                completion_tokens,
            } => {
                let body = ctx.full_response(&text, reason, prompt_tokens, completion_tokens);
                return Ok(Json(body).into_response());
            }
            SeqEvent::Scheduled { .. } | SeqEvent::Rejected { .. } => {}
        }
    }
    Err(ApiError::unavailable("engine stopped while generating"))
}
