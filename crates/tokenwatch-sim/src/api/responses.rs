// POST /v1/responses (OpenAI Responses API, as vLLM serves it): body parsing, the response
// object, and the streamed `response.*` events with sequence numbers (no `[DONE]` line).

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
struct ResponsesBody {
    model: Option<String>,
    input: Value,
    instructions: Option<String>,
    max_output_tokens: Option<u32>,
    stream: Option<bool>,
}

#[derive(Debug)]
struct Parsed {
    gen_req: GenRequest,
    instructions: Option<String>,
    max_output_tokens: Option<u32>,
    stream: bool,
}

/// `input` is a string or a list of items: messages (`{role, content}` with string or
/// `input_text` parts) or other items whose `output` string is part of the conversation.
fn parse(body: &[u8], reasoning_tokens: u32) -> Result<Parsed, ApiError> {
    let b: ResponsesBody = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    let mut prompt = ChatPrompt::default();
    if let Some(i) = &b.instructions {
        prompt.push("system", i);
    }
    match &b.input {
        Value::String(s) => prompt.push("user", s),
        Value::Array(items) if !items.is_empty() => {
            for item in items {
                let Some(obj) = item.as_object() else {
                    return Err(ApiError::bad_request("`input` items must be objects"));
                };
                let role = obj.get("role").and_then(Value::as_str).unwrap_or("user");
                let text = match obj.get("content") {
                    Some(c) => content_text(Some(c)),
                    None => content_text(obj.get("output")),
                };
                prompt.push(role, &text);
            }
        }
        _ => {
            return Err(ApiError::bad_request(
                "`input` must be a string or a non-empty list of input items",
            ));
        }
    }
    if b.max_output_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "max_output_tokens must be at least 1, got 0.",
        ));
    }
    Ok(Parsed {
        gen_req: GenRequest {
            model: b.model,
            prompt_text: prompt.text,
            prompt_tokens: prompt.tokens,
            max_tokens: b.max_output_tokens,
            reasoning_tokens,
        },
        instructions: b.instructions,
        max_output_tokens: b.max_output_tokens,
        stream: b.stream.unwrap_or(false),
    })
}

pub async fn create(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(app, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn handle(app: AppState, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let p = parse(&body, app.reasoning().tokens)?;
    let generation = generate::start(&app, p.gen_req).await?;
    let ctx = RespCtx {
        id: random_id("resp_"),
        reasoning_id: random_id("rs_"),
        message_id: random_id("msg_"),
        created_at: now_secs(),
        model: generation.model.clone(),
        instructions: p.instructions,
        max_output_tokens: p.max_output_tokens,
    };
    let mut response = if p.stream {
        let enc = ResponsesEncoder {
            ctx,
            seq: 0,
            phase: Phase::Start,
            reasoning: None,
            answer: None,
            finish: FinishReason::Stop,
        };
        generate::stream_response(generation.rx, enc, app.headers_at_first_token()).await
    } else {
        let out = generate::collect(generation.rx).await?;
        let mut output = Vec::new();
        if out.usage.reasoning > 0 {
            output.push(ctx.reasoning_item(&out.reasoning, "completed"));
        }
        if out.answer_tokens > 0 {
            output.push(ctx.message_item(Some(&out.text), item_status(out.finish)));
        }
        Json(ctx.response("", output, Some(out.usage), Some(out.finish))).into_response()
    };
    generate::add_headers(&mut response, generation.queue_time, &headers);
    Ok(response)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn item_status(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

/// Identity of one response and its two possible output items.
struct RespCtx {
    id: String,
    reasoning_id: String,
    message_id: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<u32>,
}

impl RespCtx {
    /// The response object. `status` is derived from `finish` when given (else used as is).
    fn response(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Option<Usage>,
        finish: Option<FinishReason>,
    ) -> Value {
        let status = match finish {
            Some(f) => item_status(f),
            None => status,
        };
        let incomplete = match finish {
            Some(FinishReason::Length) => json!({ "reason": "max_output_tokens" }),
            _ => Value::Null,
        };
        let usage = usage.map_or(Value::Null, |u| {
            json!({
                "input_tokens": u.prompt,
                "input_tokens_details": { "cached_tokens": 0 },
                "output_tokens": u.completion,
                "output_tokens_details": { "reasoning_tokens": u.reasoning },
                "total_tokens": u.prompt + u.completion,
            })
        });
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": null,
            "temperature": 1.0,
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
        })
    }

    fn reasoning_item(&self, text: &str, status: &str) -> Value {
        let content = match status {
            "in_progress" => json!([]),
            _ => json!([{ "type": "reasoning_text", "text": text }]),
        };
        json!({
            "id": self.reasoning_id,
            "type": "reasoning",
            "summary": [],
            "content": content,
            "status": status,
        })
    }

    fn message_item(&self, text: Option<&str>, status: &str) -> Value {
        let content = match text {
            Some(t) => json!([output_text(t)]),
            None => json!([]),
        };
        json!({
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        })
    }
}

fn output_text(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [] })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Reasoning,
    Answer,
}

/// Streams the events in vLLM's order: created, in_progress, the reasoning item (if any),
/// the message item, then `response.completed` or `response.incomplete`.
struct ResponsesEncoder {
    ctx: RespCtx,
    seq: u64,
    phase: Phase,
    /// Text of the reasoning / answer item once opened (None: never opened).
    reasoning: Option<String>,
    answer: Option<String>,
    finish: FinishReason,
}

impl ResponsesEncoder {
    fn emit(&mut self, out: &mut String, kind: &str, data: Value) {
        out.push_str(&event_frame(kind, Some(self.seq), &data));
        self.seq += 1;
    }

    fn answer_index(&self) -> usize {
        usize::from(self.reasoning.is_some())
    }

    fn open_reasoning(&mut self, out: &mut String) {
        let item = self.ctx.reasoning_item("", "in_progress");
        let id = self.ctx.reasoning_id.clone();
        self.emit(
            out,
            "response.output_item.added",
            json!({ "output_index": 0, "item": item }),
        );
        self.emit(
            out,
            "response.reasoning_part.added",
            json!({ "item_id": id, "output_index": 0, "content_index": 0,
                    "part": { "type": "reasoning_text", "text": "" } }),
        );
        self.reasoning = Some(String::new());
        self.phase = Phase::Reasoning;
    }

    fn close_reasoning(&mut self, out: &mut String) {
        let text = self.reasoning.clone().unwrap_or_default();
        let id = self.ctx.reasoning_id.clone();
        let item = self.ctx.reasoning_item(&text, "completed");
        self.emit(
            out,
            "response.reasoning_text.done",
            json!({ "item_id": id, "output_index": 0, "content_index": 0, "text": text }),
        );
        self.emit(
            out,
            "response.reasoning_part.done",
            json!({ "item_id": id, "output_index": 0, "content_index": 0,
                    "part": { "type": "reasoning_text", "text": text } }),
        );
        self.emit(
            out,
            "response.output_item.done",
            json!({ "output_index": 0, "item": item }),
        );
    }

    fn open_answer(&mut self, out: &mut String) {
        let index = self.answer_index();
        let id = self.ctx.message_id.clone();
        let item = self.ctx.message_item(None, "in_progress");
        self.emit(
            out,
            "response.output_item.added",
            json!({ "output_index": index, "item": item }),
        );
        self.emit(
            out,
            "response.content_part.added",
            json!({ "item_id": id, "output_index": index, "content_index": 0,
                    "part": output_text("") }),
        );
        self.answer = Some(String::new());
        self.phase = Phase::Answer;
    }

    fn close_answer(&mut self, out: &mut String) {
        let index = self.answer_index();
        let text = self.answer.clone().unwrap_or_default();
        let id = self.ctx.message_id.clone();
        let item = self.ctx.message_item(Some(&text), item_status(self.finish));
        self.emit(
            out,
            "response.output_text.done",
            json!({ "item_id": id, "output_index": index, "content_index": 0,
                    "text": text, "logprobs": [] }),
        );
        self.emit(
            out,
            "response.content_part.done",
            json!({ "item_id": id, "output_index": index, "content_index": 0,
                    "part": output_text(&text) }),
        );
        self.emit(
            out,
            "response.output_item.done",
            json!({ "output_index": index, "item": item }),
        );
    }

    fn output(&self) -> Vec<Value> {
        let mut items = Vec::new();
        if let Some(r) = &self.reasoning {
            items.push(self.ctx.reasoning_item(r, "completed"));
        }
        if let Some(a) = &self.answer {
            items.push(self.ctx.message_item(Some(a), item_status(self.finish)));
        }
        items
    }
}

impl SseEncoder for ResponsesEncoder {
    fn open(&mut self) -> String {
        let mut out = String::new();
        let resp = self.ctx.response("in_progress", vec![], None, None);
        self.emit(
            &mut out,
            "response.created",
            json!({ "response": resp.clone() }),
        );
        self.emit(
            &mut out,
            "response.in_progress",
            json!({ "response": resp }),
        );
        out
    }

    fn token(&mut self, text: &str, reasoning: bool, finish: Option<FinishReason>) -> String {
        let mut out = String::new();
        if let Some(f) = finish {
            self.finish = f;
        }
        if reasoning {
            if self.phase == Phase::Start {
                self.open_reasoning(&mut out);
            }
            if let Some(r) = self.reasoning.as_mut() {
                r.push_str(text);
            }
            let id = self.ctx.reasoning_id.clone();
            self.emit(
                &mut out,
                "response.reasoning_text.delta",
                json!({ "item_id": id, "output_index": 0, "content_index": 0, "delta": text }),
            );
            return out;
        }
        if self.phase == Phase::Reasoning {
            self.close_reasoning(&mut out);
        }
        if self.phase != Phase::Answer {
            self.open_answer(&mut out);
        }
        if let Some(a) = self.answer.as_mut() {
            a.push_str(text);
        }
        let (id, index) = (self.ctx.message_id.clone(), self.answer_index());
        self.emit(
            &mut out,
            "response.output_text.delta",
            json!({ "item_id": id, "output_index": index, "content_index": 0,
                    "delta": text, "logprobs": [] }),
        );
        out
    }

    fn done(&mut self, usage: Usage) -> String {
        let mut out = String::new();
        match self.phase {
            Phase::Reasoning => self.close_reasoning(&mut out),
            Phase::Answer => self.close_answer(&mut out),
            Phase::Start => {}
        }
        let kind = match self.finish {
            FinishReason::Length => "response.incomplete",
            _ => "response.completed",
        };
        let resp = self
            .ctx
            .response("", self.output(), Some(usage), Some(self.finish));
        self.emit(&mut out, kind, json!({ "response": resp }));
        out
    }

    fn failed(&mut self, message: &str) -> String {
        let mut out = String::new();
        let mut resp = self.ctx.response("failed", self.output(), None, None);
        resp["error"] = json!({ "code": "server_error", "message": message });
        self.emit(&mut out, "response.failed", json!({ "response": resp }));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_forms() {
        let p = parse(br#"{"input":"hello there","model":"m"}"#, 0).unwrap();
        assert_eq!(p.gen_req.model.as_deref(), Some("m"));
        assert!(!p.stream);
        let p = parse(
            br#"{"input":[{"role":"user","content":[{"type":"input_text","text":"abcd"}]},
                {"role":"assistant","content":"ok"}],"instructions":"be brief",
                "max_output_tokens":9,"stream":true}"#,
            5,
        )
        .unwrap();
        assert!(p.gen_req.prompt_text.contains("system: be brief"));
        assert!(p.gen_req.prompt_text.contains("user: abcd"));
        assert_eq!(
            (p.gen_req.max_tokens, p.gen_req.reasoning_tokens, p.stream),
            (Some(9), 5, true)
        );
        for bad in [
            &br#"{"input":[]}"#[..],
            br#"{"input":7}"#,
            br#"{"model":"m"}"#,
            br#"{"input":["x"]}"#,
            br#"{"input":"x","max_output_tokens":0}"#,
        ] {
            assert_eq!(parse(bad, 0).err().map(|e| e.status.as_u16()), Some(400));
        }
    }
}
