// POST /v1/messages (Anthropic Messages API): body parsing, the message object, the streamed
// message_start … message_stop events, and errors in Anthropic's `{"type":"error",…}` shape.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::generate::{self, GenRequest, SseEncoder, Usage, event_frame, random_id};
use super::openai::{ChatPrompt, content_text};
use crate::metrics::FinishReason;

#[derive(Debug, Deserialize)]
struct Message {
    role: Option<String>,
    content: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: String,
    budget_tokens: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct MessagesBody {
    model: Option<String>,
    messages: Vec<Message>,
    system: Option<Value>,
    max_tokens: Option<u32>,
    stream: Option<bool>,
    thinking: Option<Thinking>,
}

#[derive(Debug)]
struct Parsed {
    gen_req: GenRequest,
    stream: bool,
}

/// `reasoning_tokens` is the simulator's setting; `thinking` can turn it off
/// (`disabled`) or cap it (`enabled` with `budget_tokens`).
fn parse(body: &[u8], reasoning_tokens: u32) -> Result<Parsed, ApiError> {
    let b: MessagesBody = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    let Some(max_tokens) = b.max_tokens else {
        return Err(ApiError::bad_request("max_tokens: Field required"));
    };
    if max_tokens == 0 {
        return Err(ApiError::bad_request(
            "max_tokens: must be greater than or equal to 1",
        ));
    }
    if b.messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages: at least one message is required",
        ));
    }
    let mut prompt = ChatPrompt::default();
    if let Some(system) = &b.system {
        prompt.push("system", &content_text(Some(system)));
    }
    for m in &b.messages {
        prompt.push(
            m.role.as_deref().unwrap_or("user"),
            &content_text(m.content.as_ref()),
        );
    }
    let reasoning = match &b.thinking {
        Some(t) if t.kind == "disabled" => 0,
        Some(t) if t.kind == "enabled" => t
            .budget_tokens
            .map_or(reasoning_tokens, |b| b.min(reasoning_tokens)),
        _ => reasoning_tokens,
    };
    Ok(Parsed {
        gen_req: GenRequest {
            model: b.model,
            prompt_text: prompt.text,
            prompt_tokens: prompt.tokens,
            max_tokens: Some(max_tokens),
            reasoning_tokens: reasoning,
        },
        stream: b.stream.unwrap_or(false),
    })
}

/// An error in Anthropic's shape, its type derived from the HTTP status.
fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    json!({ "type": "error", "error": { "type": kind, "message": message } })
}

pub async fn create(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(app, headers, body).await.unwrap_or_else(|e| {
        (e.status, Json(error_body(e.status.as_u16(), &e.message))).into_response()
    })
}

async fn handle(app: AppState, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let p = parse(&body, app.reasoning().tokens)?;
    let prompt_tokens = p.gen_req.prompt_tokens.max(1);
    let generation = generate::start(&app, p.gen_req).await?;
    let ctx = MsgCtx {
        id: random_id("msg_"),
        model: generation.model.clone(),
    };
    let mut response = if p.stream {
        let enc = MessagesEncoder {
            ctx,
            prompt_tokens,
            block: Block::None,
            index: 0,
            finish: FinishReason::Stop,
        };
        generate::stream_response(generation.rx, enc, app.headers_at_first_token()).await
    } else {
        let out = generate::collect(generation.rx).await?;
        let mut content = Vec::new();
        if out.usage.reasoning > 0 {
            content.push(json!({
                "type": "thinking",
                "thinking": out.reasoning,
                "signature": signature(),
            }));
        }
        if out.answer_tokens > 0 {
            content.push(json!({ "type": "text", "text": out.text }));
        }
        let usage = out.usage;
        Json(ctx.message(content, Some(out.finish), usage.prompt, usage.completion)).into_response()
    };
    generate::add_headers(&mut response, generation.queue_time, &headers);
    Ok(response)
}

/// The opaque signature that closes a thinking block (real ones are encrypted digests).
fn signature() -> String {
    format!(
        "c2ltLXNpZ25hdHVyZS0{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

fn stop_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "max_tokens",
        _ => "end_turn",
    }
}

struct MsgCtx {
    id: String,
    model: String,
}

impl MsgCtx {
    /// The message object; `finish` None while it is still being generated.
    fn message(
        &self,
        content: Vec<Value>,
        finish: Option<FinishReason>,
        input: u32,
        output: u32,
    ) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": finish.map(stop_reason),
            "stop_sequence": null,
            "usage": {
                "input_tokens": input,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": output,
            },
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    None,
    Thinking,
    Text,
}

/// Streams message_start, a thinking block (if the model reasons), a text block,
/// message_delta (stop reason, output tokens) and message_stop.
struct MessagesEncoder {
    ctx: MsgCtx,
    prompt_tokens: u32,
    block: Block,
    /// Index of the open block (or of the next one when none is open).
    index: u32,
    finish: FinishReason,
}

impl MessagesEncoder {
    fn emit(out: &mut String, kind: &str, data: Value) {
        out.push_str(&event_frame(kind, None, &data));
    }

    fn close_block(&mut self, out: &mut String) {
        if self.block == Block::None {
            return;
        }
        if self.block == Block::Thinking {
            Self::emit(
                out,
                "content_block_delta",
                json!({ "index": self.index,
                        "delta": { "type": "signature_delta", "signature": signature() } }),
            );
        }
        Self::emit(out, "content_block_stop", json!({ "index": self.index }));
        self.block = Block::None;
        self.index += 1;
    }
}

impl SseEncoder for MessagesEncoder {
    fn open(&mut self) -> String {
        let mut out = String::new();
        let message = self.ctx.message(vec![], None, self.prompt_tokens, 1);
        Self::emit(&mut out, "message_start", json!({ "message": message }));
        out
    }

    fn token(&mut self, text: &str, reasoning: bool, finish: Option<FinishReason>) -> String {
        let mut out = String::new();
        if let Some(f) = finish {
            self.finish = f;
        }
        let want = if reasoning {
            Block::Thinking
        } else {
            Block::Text
        };
        if self.block != want {
            self.close_block(&mut out);
            let block = match want {
                Block::Thinking => json!({ "type": "thinking", "thinking": "", "signature": "" }),
                _ => json!({ "type": "text", "text": "" }),
            };
            Self::emit(
                &mut out,
                "content_block_start",
                json!({ "index": self.index, "content_block": block }),
            );
            if want == Block::Text {
                Self::emit(&mut out, "ping", json!({}));
            }
            self.block = want;
        }
        let delta = match want {
            Block::Thinking => json!({ "type": "thinking_delta", "thinking": text }),
            _ => json!({ "type": "text_delta", "text": text }),
        };
        Self::emit(
            &mut out,
            "content_block_delta",
            json!({ "index": self.index, "delta": delta }),
        );
        out
    }

    fn done(&mut self, usage: Usage) -> String {
        let mut out = String::new();
        self.close_block(&mut out);
        Self::emit(
            &mut out,
            "message_delta",
            json!({
                "delta": { "stop_reason": stop_reason(self.finish), "stop_sequence": null },
                "usage": { "output_tokens": usage.completion },
            }),
        );
        Self::emit(&mut out, "message_stop", json!({}));
        out
    }

    fn failed(&mut self, message: &str) -> String {
        let mut out = String::new();
        let error = &error_body(500, message)["error"];
        out.push_str(&event_frame("error", None, &json!({ "error": error })));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinking_caps_or_disables_reasoning() {
        let base = r#""max_tokens":50,"messages":[{"role":"user","content":"hi"}]"#;
        let r = |extra: &str| {
            let body = format!("{{{base}{extra}}}");
            parse(body.as_bytes(), 40).unwrap().gen_req.reasoning_tokens
        };
        assert_eq!(r(""), 40);
        assert_eq!(r(r#","thinking":{"type":"disabled"}"#), 0);
        assert_eq!(
            r(r#","thinking":{"type":"enabled","budget_tokens":16}"#),
            16
        );
        assert_eq!(
            r(r#","thinking":{"type":"enabled","budget_tokens":1024}"#),
            40
        );
    }

    #[test]
    fn system_blocks_and_errors() {
        let p = parse(
            br#"{"max_tokens":5,"system":[{"type":"text","text":"be kind"}],
                "messages":[{"role":"user","content":[{"type":"text","text":"yo"}]}]}"#,
            0,
        )
        .unwrap();
        assert!(p.gen_req.prompt_text.starts_with("system: be kind\n"));
        let e = parse(br#"{"messages":[{"role":"user","content":"x"}]}"#, 0).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("max_tokens"));
        assert_eq!(error_body(503, "busy")["error"]["type"], "overloaded_error");
        assert_eq!(error_body(502, "x")["error"]["type"], "api_error");
    }
}
