// The OpenAI chat/completions vocabulary: `choices` chunks ending with `data: [DONE]`, and
// the non-streaming body; content is `delta.content`, reasoning, tool calls or `text`.

use super::{CachedDetails, HasText, Observed, ReasoningDetails, is_done_sentinel};
use serde::Deserialize;
use serde::de::IgnoredAny;

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
    model: Option<String>,
    error: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Choice {
    delta: Option<Delta>,
    #[serde(default)]
    text: HasText,
    finish_reason: Option<String>,
}

/// A streamed delta. Reasoning arrives as `reasoning` (vLLM since early 2026, OpenRouter) or
/// `reasoning_content` (older vLLM, DeepSeek, SGLang); both are generated tokens.
#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: HasText,
    #[serde(default)]
    reasoning: HasText,
    #[serde(default)]
    reasoning_content: HasText,
    tool_calls: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    completion_tokens_details: Option<ReasoningDetails>,
    prompt_tokens_details: Option<CachedDetails>,
}

impl Usage {
    fn apply(self, seen: &mut Observed) {
        seen.prompt_tokens = self.prompt_tokens.or(seen.prompt_tokens);
        seen.completion_tokens = self.completion_tokens.or(seen.completion_tokens);
        if let Some(r) = self
            .completion_tokens_details
            .and_then(|d| d.reasoning_tokens)
        {
            seen.reasoning_tokens = Some(r);
        }
        if let Some(c) = self.prompt_tokens_details.and_then(|d| d.cached_tokens) {
            seen.cached_input_tokens = Some(c);
        }
    }
}

/// One streamed event; true when it carried generated content.
pub(super) fn event(data: &[u8], seen: &mut Observed) -> Result<bool, serde_json::Error> {
    if is_done_sentinel(data) {
        seen.done = true;
        return Ok(false);
    }
    let chunk: Chunk = serde_json::from_slice(data)?;
    if chunk.error.is_some() {
        seen.error_event = true;
    }
    if seen.model.is_none() {
        seen.model = chunk.model;
    }
    if let Some(u) = chunk.usage {
        u.apply(seen);
    }
    let mut content = false;
    for c in chunk.choices {
        if let Some(reason) = c.finish_reason {
            seen.finish_reason = Some(reason);
        }
        if c.text.0 {
            content = true;
        }
        if let Some(d) = c.delta
            && (d.content.0 || d.reasoning.0 || d.reasoning_content.0 || d.tool_calls.is_some())
        {
            content = true;
        }
    }
    Ok(content)
}

/// A non-streaming chat/completions/embeddings body.
pub(super) fn json_body(body: &[u8]) -> Option<Observed> {
    #[derive(Deserialize)]
    struct Full {
        #[serde(default)]
        choices: Vec<FullChoice>,
        usage: Option<Usage>,
        model: Option<String>,
    }
    #[derive(Deserialize)]
    struct FullChoice {
        finish_reason: Option<String>,
    }
    let full: Full = serde_json::from_slice(body).ok()?;
    let mut seen = Observed {
        finish_reason: full.choices.into_iter().find_map(|c| c.finish_reason),
        model: full.model,
        ..Observed::default()
    };
    if let Some(u) = full.usage {
        u.apply(&mut seen);
    }
    Some(seen)
}
