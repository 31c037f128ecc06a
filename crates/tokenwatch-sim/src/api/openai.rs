// Request bodies of /v1/chat/completions and /v1/completions, parsed leniently,
// and the prompt-size estimate (~4 characters per token) with prefix-block hashes.

use std::hash::{DefaultHasher, Hash, Hasher};

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;

/// Chat-template tokens added per message and per conversation (Llama-style estimate).
const CHAT_TOKENS_PER_MESSAGE: u32 = 4;
const CHAT_TOKENS_PER_CONVERSATION: u32 = 3;

#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    model: Option<String>,
    messages: Vec<ChatMessage>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    model: Option<String>,
    prompt: Value,
    max_tokens: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

/// Which endpoint a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What the handlers need from either body.
#[derive(Debug)]
pub struct ParsedRequest {
    pub model: Option<String>,
    pub prompt_text: String,
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Text of a message's content: a string, or the `text` of each part of a list of parts.
pub fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A conversation rendered for the prompt-size estimate and the prefix cache (chat template
/// tokens included), built message by message.
#[derive(Debug)]
pub struct ChatPrompt {
    pub text: String,
    pub tokens: u32,
}

impl Default for ChatPrompt {
    fn default() -> Self {
        ChatPrompt {
            text: String::new(),
            tokens: CHAT_TOKENS_PER_CONVERSATION,
        }
    }
}

impl ChatPrompt {
    pub fn push(&mut self, role: &str, content: &str) {
        self.tokens += tokens_for(content) + CHAT_TOKENS_PER_MESSAGE;
        self.text.push_str(role);
        self.text.push_str(": ");
        self.text.push_str(content);
        self.text.push('\n');
    }
}

/// Parse a body for `endpoint`; errors are 400s naming the problem.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<ParsedRequest, ApiError> {
    let invalid =
        |e: serde_json::Error| ApiError::bad_request(format!("invalid request body: {e}"));
    let parsed = match endpoint {
        Endpoint::Chat => {
            let b: ChatBody = serde_json::from_slice(body).map_err(invalid)?;
            let mut prompt = ChatPrompt::default();
            for m in &b.messages {
                prompt.push(
                    m.role.as_deref().unwrap_or("user"),
                    &content_text(m.content.as_ref()),
                );
            }
            if b.messages.is_empty() {
                return Err(ApiError::bad_request("`messages` must not be empty"));
            }
            ParsedRequest {
                model: b.model,
                prompt_text: prompt.text,
                prompt_tokens: prompt.tokens,
                max_tokens: b.max_completion_tokens.or(b.max_tokens),
                stream: b.stream.unwrap_or(false),
                include_usage: b
                    .stream_options
                    .and_then(|o| o.include_usage)
                    .unwrap_or(false),
            }
        }
        Endpoint::Completion => {
            let b: CompletionBody = serde_json::from_slice(body).map_err(invalid)?;
            let (text, tokens) = prompt_of(&b.prompt)?;
            ParsedRequest {
                model: b.model,
                prompt_text: text,
                prompt_tokens: tokens,
                max_tokens: b.max_tokens,
                stream: b.stream.unwrap_or(false),
                include_usage: b
                    .stream_options
                    .and_then(|o| o.include_usage)
                    .unwrap_or(false),
            }
        }
    };
    if parsed.max_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "max_tokens must be at least 1, got 0.",
        ));
    }
    Ok(parsed)
}

/// Completion prompt: a string, a list of strings, or a list of token ids.
fn prompt_of(prompt: &Value) -> Result<(String, u32), ApiError> {
    match prompt {
        Value::String(s) => Ok((s.clone(), tokens_for(s))),
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_u64) => {
            let text = items
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(" ");
            Ok((text, items.len() as u32))
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_string) => {
            let text: String = items
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n");
            let tokens = tokens_for(&text);
            Ok((text, tokens))
        }
        _ => Err(ApiError::bad_request(
            "`prompt` must be a string, a list of strings or a list of token ids",
        )),
    }
}

/// Prompt-size estimate (~4 characters per token), shared by all body parsers.
pub fn tokens_for(text: &str) -> u32 {
    (text.chars().count() as u32).div_ceil(4).max(1)
}

/// Cumulative hashes of the prompt's full KV blocks (block_size tokens ≈ 4×block_size chars).
pub fn prefix_hashes(text: &str, block_size: u32) -> Vec<u64> {
    let chars: Vec<char> = text.chars().collect();
    let per_block = (block_size as usize * 4).max(1);
    let mut h = DefaultHasher::new();
    chars
        .chunks_exact(per_block)
        .map(|chunk| {
            chunk.hash(&mut h);
            h.finish()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_body_fields() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],
            "max_tokens":5,"max_completion_tokens":7,"stream":true,"stream_options":{"include_usage":true}}"#;
        let p = parse(Endpoint::Chat, body).unwrap();
        assert_eq!(
            (p.model.as_deref(), p.max_tokens, p.stream, p.include_usage),
            (Some("m"), Some(7), true, true)
        );
        assert_eq!(p.prompt_tokens, 3 + 2 + 4);
    }

    #[test]
    fn completion_prompt_forms() {
        let p = parse(Endpoint::Completion, br#"{"prompt":"hello world!"}"#).unwrap();
        assert_eq!((p.prompt_tokens, p.stream, p.model), (3, false, None));
        let p = parse(Endpoint::Completion, br#"{"prompt":[1,2,3,4,5]}"#).unwrap();
        assert_eq!(p.prompt_tokens, 5);
        assert!(parse(Endpoint::Completion, br#"{"prompt":{}}"#).is_err());
    }

    #[test]
    fn bad_bodies_are_400() {
        for body in [
            &b"{"[..],
            br#"{"messages":"x"}"#,
            br#"{"messages":[]}"#,
            br#"{"messages":[{"content":"a"}],"max_tokens":-1}"#,
        ] {
            assert_eq!(
                parse(Endpoint::Chat, body).unwrap_err().status.as_u16(),
                400
            );
        }
    }

    #[test]
    fn shared_prefix_gives_shared_hashes() {
        let a = prefix_hashes(&"x".repeat(200), 16);
        let b = prefix_hashes(&format!("{}{}", "x".repeat(64), "y".repeat(136)), 16);
        assert_eq!(a.len(), 3);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
    }
}
