// The OpenAI Responses API vocabulary (`/v1/responses`): typed `response.*` stream events and
// the response object, read into `Observed` with status mapped to chat's finish reasons.

use super::{AnyText, CachedDetails, Observed, ReasoningDetails, event_kind, typed_event};
use serde::Deserialize;
use std::borrow::Cow;

/// Events whose `delta` is generated text: output, reasoning (raw and summary), refusals and
/// the arguments or input of tool calls the model writes.
const CONTENT_DELTAS: &[&str] = &[
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.refusal.delta",
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
    "response.mcp_call_arguments.delta",
    "response.code_interpreter_call_code.delta",
];

/// Events that end the stream, each carrying the final response object with its `usage`.
const TERMINAL: &[&str] = &[
    "response.completed",
    "response.incomplete",
    "response.failed",
];

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    delta: AnyText,
    response: Option<Response>,
}

/// The response object: the body of a non-streaming call, and `response` of lifecycle events.
#[derive(Deserialize)]
struct Response {
    model: Option<String>,
    status: Option<String>,
    incomplete_details: Option<IncompleteDetails>,
    usage: Option<Usage>,
    #[serde(default)]
    output: Vec<OutputItem>,
}

#[derive(Deserialize)]
struct IncompleteDetails {
    reason: Option<String>,
}

#[derive(Deserialize)]
struct OutputItem {
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    output_tokens_details: Option<ReasoningDetails>,
    input_tokens_details: Option<CachedDetails>,
}

/// `status` (and `incomplete_details.reason`) in chat's finish_reason vocabulary:
///
/// | Responses                              | finish_reason                                  |
/// |----------------------------------------|------------------------------------------------|
/// | `completed`                            | `stop` (`tool_calls` when it output a function or custom tool call) |
/// | `incomplete`, reason `max_output_tokens` | `length`                                     |
/// | `incomplete`, reason `content_filter`  | `content_filter`                               |
/// | `incomplete`, another reason           | that reason                                    |
/// | `failed`                               | `error`                                        |
/// | anything else (`cancelled` …)          | the status itself                              |
fn finish_reason(status: &str, incomplete: Option<&str>, tool_call: bool) -> String {
    match (status, incomplete) {
        ("completed", _) if tool_call => "tool_calls",
        ("completed", _) => "stop",
        ("incomplete", Some("max_output_tokens")) => "length",
        ("incomplete", Some(reason)) => reason,
        ("failed", _) => "error",
        (other, _) => other,
    }
    .to_string()
}

impl Response {
    /// Takes model, usage and finish reason (when the status is final) into `seen`.
    fn apply(self, seen: &mut Observed) {
        if self.model.is_some() {
            seen.model = self.model;
        }
        if let Some(u) = self.usage {
            seen.prompt_tokens = u.input_tokens.or(seen.prompt_tokens);
            seen.completion_tokens = u.output_tokens.or(seen.completion_tokens);
            if let Some(r) = u.output_tokens_details.and_then(|d| d.reasoning_tokens) {
                seen.reasoning_tokens = Some(r);
            }
            if let Some(c) = u.input_tokens_details.and_then(|d| d.cached_tokens) {
                seen.cached_input_tokens = Some(c);
            }
        }
        if let Some(status) = self
            .status
            .as_deref()
            .filter(|s| !matches!(*s, "in_progress" | "queued"))
        {
            let tool_call = self.output.iter().any(|o| {
                matches!(
                    o.kind.as_deref(),
                    Some("function_call" | "custom_tool_call")
                )
            });
            let reason = self.incomplete_details.and_then(|d| d.reason);
            seen.finish_reason = Some(finish_reason(status, reason.as_deref(), tool_call));
        }
    }
}

/// One streamed event; true when it carried generated content. The type comes from the data's
/// `type`, else from the `event:` line; unknown types are skipped.
pub(super) fn event(
    name: &[u8],
    data: &[u8],
    seen: &mut Observed,
) -> Result<bool, serde_json::Error> {
    let Some(ev) = typed_event::<Event>(name, data, seen)? else {
        return Ok(false);
    };
    let kind = event_kind(&ev.kind, name);
    if CONTENT_DELTAS.contains(&kind) {
        return Ok(ev.delta.0);
    }
    if kind == "error" {
        seen.error_event = true;
    }
    if TERMINAL.contains(&kind) {
        seen.done = true;
        if kind == "response.failed" {
            seen.error_event = true;
        }
    }
    if let Some(r) = ev.response {
        r.apply(seen);
    }
    Ok(false)
}

/// A non-streaming response object.
pub(super) fn json_body(body: &[u8]) -> Option<Observed> {
    let r: Response = serde_json::from_slice(body).ok()?;
    let mut seen = Observed::default();
    r.apply(&mut seen);
    Some(seen)
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
