// The Anthropic Messages vocabulary (`/v1/messages`): `message_start` … `content_block_delta`
// … `message_delta`, `message_stop` stream events and the message body, read into `Observed`.

use super::{AnyText, Observed, event_kind, typed_event};
use serde::Deserialize;
use std::borrow::Cow;

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    /// `message_start`: the message so far (model, input usage).
    message: Option<Message>,
    /// `content_block_delta`: the content; `message_delta`: the stop reason.
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    /// `message_delta`: cumulative usage (output tokens; newer APIs repeat input tokens).
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    text: AnyText,
    #[serde(default)]
    thinking: AnyText,
    #[serde(default)]
    partial_json: AnyText,
    stop_reason: Option<String>,
}

impl Delta<'_> {
    /// Whether a `content_block_delta` carried generated tokens: text, thinking and tool input
    /// when not empty; a signature (`signature_delta`) or citation (`citations_delta`) is not
    /// generated text; a delta type unknown here counts.
    fn is_content(&self) -> bool {
        match self.kind.as_deref() {
            Some("text_delta") => self.text.0,
            Some("thinking_delta") => self.thinking.0,
            Some("input_json_delta") => self.partial_json.0,
            Some("signature_delta" | "citations_delta") => false,
            _ => true,
        }
    }
}

/// The message object: the body of a non-streaming call, and `message` of `message_start`.
#[derive(Deserialize)]
struct Message {
    model: Option<String>,
    stop_reason: Option<String>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl Usage {
    /// The whole prompt: Anthropic's `input_tokens` leaves out the tokens written to and read
    /// from the prompt cache, which OpenAI's `prompt_tokens` includes.
    fn prompt_tokens(&self) -> Option<u64> {
        let cached = self.cache_creation_input_tokens.unwrap_or(0)
            + self.cache_read_input_tokens.unwrap_or(0);
        self.input_tokens.map(|n| n.saturating_add(cached))
    }
}

/// `stop_reason` in chat's finish_reason vocabulary:
///
/// | Anthropic stop_reason                   | finish_reason    |
/// |-----------------------------------------|------------------|
/// | `end_turn`, `stop_sequence`             | `stop`           |
/// | `max_tokens`, `model_context_window_exceeded` | `length`   |
/// | `tool_use`                              | `tool_calls`     |
/// | `refusal`                               | `content_filter` |
/// | anything else (`pause_turn` …)          | itself           |
fn finish_reason(stop_reason: &str) -> String {
    match stop_reason {
        "end_turn" | "stop_sequence" => "stop",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        other => other,
    }
    .to_string()
}

/// One streamed event; true when it carried generated content. The type comes from the data's
/// `type`, else from the `event:` line; unknown types (`ping` …) are skipped.
pub(super) fn event(
    name: &[u8],
    data: &[u8],
    seen: &mut Observed,
) -> Result<bool, serde_json::Error> {
    let Some(ev) = typed_event::<Event>(name, data, seen)? else {
        return Ok(false);
    };
    let kind = event_kind(&ev.kind, name);
    match kind {
        "content_block_delta" => return Ok(ev.delta.is_some_and(|d| d.is_content())),
        "message_start" => {
            if let Some(m) = ev.message {
                if m.model.is_some() {
                    seen.model = m.model;
                }
                // Its `output_tokens` is a provisional count (usually 1); message_delta's is final.
                if let Some(p) = m.usage.as_ref().and_then(Usage::prompt_tokens) {
                    seen.prompt_tokens = Some(p);
                }
                if let Some(c) = m.usage.as_ref().and_then(|u| u.cache_read_input_tokens) {
                    seen.cached_input_tokens = Some(c);
                }
            }
        }
        "message_delta" => {
            if let Some(reason) = ev.delta.and_then(|d| d.stop_reason) {
                seen.finish_reason = Some(finish_reason(&reason));
            }
            if let Some(u) = ev.usage {
                seen.prompt_tokens = u.prompt_tokens().or(seen.prompt_tokens);
                seen.completion_tokens = u.output_tokens.or(seen.completion_tokens);
                seen.cached_input_tokens = u.cache_read_input_tokens.or(seen.cached_input_tokens);
            }
        }
        "message_stop" => seen.done = true,
        "error" => seen.error_event = true,
        _ => {}
    }
    Ok(false)
}

/// A non-streaming message body.
pub(super) fn json_body(body: &[u8]) -> Option<Observed> {
    let m: Message = serde_json::from_slice(body).ok()?;
    let usage = m.usage.as_ref();
    Some(Observed {
        prompt_tokens: usage.and_then(Usage::prompt_tokens),
        completion_tokens: usage.and_then(|u| u.output_tokens),
        cached_input_tokens: usage.and_then(|u| u.cache_read_input_tokens),
        finish_reason: m.stop_reason.as_deref().map(finish_reason),
        model: m.model,
        ..Observed::default()
    })
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
