// The request path shared by every generating endpoint (chat, completions, responses,
// messages): submit to the engine, wait until scheduled, then stream through an encoder or collect.

use std::collections::VecDeque;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::Value;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::AppState;
use super::error::ApiError;
use super::openai::prefix_hashes;
use crate::engine::{SeqEvent, SubmitRequest};
use crate::metrics::FinishReason;

/// What an endpoint asks the engine for, whatever its body looked like.
#[derive(Debug)]
pub struct GenRequest {
    pub model: Option<String>,
    pub prompt_text: String,
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    pub reasoning_tokens: u32,
}

/// A request the engine has scheduled: its events from here on, and how long it queued.
pub struct Generation {
    pub rx: UnboundedReceiver<SeqEvent>,
    pub queue_time: Duration,
    /// Prompt tokens the engine found in its prefix cache.
    pub cached_tokens: u32,
    pub model: String,
}

/// Token counts of a finished generation (`completion` includes `reasoning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt: u32,
    pub completion: u32,
    pub reasoning: u32,
}

/// The whole output of a non-streaming request.
#[derive(Debug)]
pub struct Output {
    pub reasoning: String,
    pub text: String,
    pub finish: FinishReason,
    /// Answer tokens (after the reasoning); 0 when the cap ended the output while reasoning.
    pub answer_tokens: u32,
    pub usage: Usage,
}

/// Submit `req` and wait until it is scheduled; rejections (faults, too long) become errors.
pub async fn start(app: &AppState, req: GenRequest) -> Result<Generation, ApiError> {
    let engine = app.engine(req.model.as_deref())?;
    let (tx, mut rx) = unbounded_channel();
    engine
        .submit(SubmitRequest {
            prompt_tokens: req.prompt_tokens,
            prefix_hashes: prefix_hashes(&req.prompt_text, engine.config().block_size),
            max_tokens: req.max_tokens,
            reasoning_tokens: req.reasoning_tokens,
            events: tx,
        })
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    loop {
        match rx.recv().await {
            Some(SeqEvent::Scheduled {
                queue_time,
                cached_tokens,
            }) => {
                return Ok(Generation {
                    rx,
                    queue_time,
                    cached_tokens,
                    model: engine.model().to_string(),
                });
            }
            Some(SeqEvent::Rejected {
                status,
                kind,
                message,
            }) => return Err(ApiError::new(status, kind, message)),
            Some(SeqEvent::Token { .. } | SeqEvent::Done { .. }) => continue,
            None => {
                return Err(ApiError::unavailable(
                    "engine stopped before scheduling the request",
                ));
            }
        }
    }
}

/// Wait for the whole output.
pub async fn collect(mut rx: UnboundedReceiver<SeqEvent>) -> Result<Output, ApiError> {
    let mut out = Output {
        reasoning: String::new(),
        text: String::new(),
        finish: FinishReason::Stop,
        answer_tokens: 0,
        usage: Usage {
            prompt: 0,
            completion: 0,
            reasoning: 0,
        },
    };
    while let Some(ev) = rx.recv().await {
        match ev {
            SeqEvent::Token {
                text,
                reasoning,
                finish,
            } => {
                if reasoning {
                    out.reasoning.push_str(&text);
                    out.usage.reasoning += 1;
                } else {
                    out.text.push_str(&text);
                    out.answer_tokens += 1;
                }
                if let Some(r) = finish {
                    out.finish = r;
                }
            }
            SeqEvent::Done {
                prompt_tokens,
                completion_tokens,
            } => {
                out.usage.prompt = prompt_tokens;
                out.usage.completion = completion_tokens;
                return Ok(out);
            }
            SeqEvent::Scheduled { .. } | SeqEvent::Rejected { .. } => {}
        }
    }
    Err(ApiError::unavailable("engine stopped while generating"))
}

/// Turns engine events into one endpoint's SSE bytes.
pub trait SseEncoder: Send + 'static {
    /// Frames sent as soon as the stream opens, before the first token (may be empty).
    fn open(&mut self) -> String;
    /// One generated token; the last one carries the finish reason.
    fn token(&mut self, text: &str, reasoning: bool, finish: Option<FinishReason>) -> String;
    /// The generation ended; the final frames.
    fn done(&mut self, usage: Usage) -> String;
    /// The engine went away mid-stream; the frames (if any) that tell the client.
    fn failed(&mut self, message: &str) -> String;
}

struct StreamState<E> {
    rx: UnboundedReceiver<SeqEvent>,
    /// Events received before the response was sent (`hold`), sent first.
    pending: VecDeque<SeqEvent>,
    enc: E,
    opened: bool,
    done: bool,
    reasoning: u32,
}

impl<E> StreamState<E> {
    async fn next_event(&mut self) -> Option<SeqEvent> {
        match self.pending.pop_front() {
            Some(ev) => Some(ev),
            None => self.rx.recv().await,
        }
    }
}

/// Next SSE bytes for the client, or None when the stream is over.
async fn next_frames<E: SseEncoder>(st: &mut StreamState<E>) -> Option<String> {
    if !st.opened {
        st.opened = true;
        let frames = st.enc.open();
        if !frames.is_empty() {
            return Some(frames);
        }
    }
    while !st.done {
        match st.next_event().await {
            Some(SeqEvent::Token {
                text,
                reasoning,
                finish,
            }) => {
                st.reasoning += u32::from(reasoning);
                return Some(st.enc.token(&text, reasoning, finish));
            }
            Some(SeqEvent::Done {
                prompt_tokens,
                completion_tokens,
            }) => {
                st.done = true;
                return Some(st.enc.done(Usage {
                    prompt: prompt_tokens,
                    completion: completion_tokens,
                    reasoning: st.reasoning,
                }));
            }
            Some(SeqEvent::Scheduled { .. } | SeqEvent::Rejected { .. }) => continue,
            None => {
                st.done = true;
                let frames = st.enc.failed("engine stopped while generating");
                return (!frames.is_empty()).then_some(frames);
            }
        }
    }
    None
}

/// A `text/event-stream` response driven by `enc`; with `hold`, not before the first token is
/// ready (or the generation ended): the headers then come with it.
pub async fn stream_response<E: SseEncoder>(
    mut rx: UnboundedReceiver<SeqEvent>,
    enc: E,
    hold: bool,
) -> Response {
    let mut pending = VecDeque::new();
    if hold {
        while let Some(ev) = rx.recv().await {
            let first = matches!(ev, SeqEvent::Token { .. } | SeqEvent::Done { .. });
            pending.push_back(ev);
            if first {
                break;
            }
        }
    }
    let state = StreamState {
        rx,
        pending,
        enc,
        opened: false,
        done: false,
        reasoning: 0,
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

/// Headers every generating endpoint adds: `x-queue-time` (ms) and the echoed `x-request-id`.
pub fn add_headers(response: &mut Response, queue_time: Duration, request: &HeaderMap) {
    let h = response.headers_mut();
    h.insert(
        "x-queue-time",
        HeaderValue::from(queue_time.as_millis() as u64),
    );
    if let Some(id) = request.get("x-request-id") {
        h.insert("x-request-id", id.clone());
    }
}

/// One named SSE event (`event: NAME` + `data: JSON`), as the Responses and Messages APIs
/// send them: the JSON starts with `"type":NAME` (and `"sequence_number"` when given), as the
/// real servers' do, followed by the members of the `fields` object.
pub fn event_frame(name: &str, seq: Option<u64>, fields: &Value) -> String {
    let mut data = format!("{{\"type\":{}", Value::from(name));
    if let Some(n) = seq {
        data.push_str(&format!(",\"sequence_number\":{n}"));
    }
    let rest = fields.to_string();
    match rest.strip_prefix('{').filter(|r| *r != "}") {
        Some(members) => {
            data.push(',');
            data.push_str(members);
        }
        None => data.push('}'),
    }
    format!("event: {name}\ndata: {data}\n\n")
}

/// A random hex id with `prefix`.
pub fn random_id(prefix: &str) -> String {
    format!(
        "{prefix}{:016x}{:08x}",
        rand::random::<u64>(),
        rand::random::<u32>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_frames_start_with_type() {
        let f = event_frame("x.y", Some(4), &serde_json::json!({"t":"a\nb"}));
        assert_eq!(
            f,
            "event: x.y\ndata: {\"type\":\"x.y\",\"sequence_number\":4,\"t\":\"a\\nb\"}\n\n"
        );
        let f = event_frame("ping", None, &serde_json::json!({}));
        assert_eq!(f, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    }
}
