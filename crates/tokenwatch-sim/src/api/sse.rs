// Response bodies byte-for-byte in vLLM's shape: SSE chunks (role chunk, token
// chunks, finish, usage, [DONE]) and the non-streaming JSON bodies.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::generate::Usage;
use super::openai::Endpoint;
use crate::metrics::FinishReason;

/// Reported where vLLM reports its version.
pub const SYSTEM_FINGERPRINT: &str = concat!("tokenwatch-sim-", env!("CARGO_PKG_VERSION"));

fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn frame(json: &str) -> String {
    format!("data: {json}\n\n")
}

/// The final SSE frame.
pub const DONE_FRAME: &str = "data: [DONE]\n\n";

/// Identity shared by all chunks of one response.
#[derive(Debug, Clone)]
pub struct ChunkCtx {
    pub endpoint: Endpoint,
    pub id: String,
    pub model: String,
    pub created: u64,
    /// `usage.prompt_tokens_details.cached_tokens` (vLLM's `--enable-prompt-tokens-details`);
    /// None: `prompt_tokens_details` is null, or absent from streamed usage.
    pub cached_tokens: Option<u32>,
}

impl ChunkCtx {
    pub fn new(endpoint: Endpoint, model: &str) -> ChunkCtx {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completion => "cmpl-",
        };
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        ChunkCtx {
            endpoint,
            id: format!("{prefix}{:016x}", rand::random::<u64>()),
            model: model.to_string(),
            cached_tokens: None,
            created,
        }
    }

    fn head(&self, object: &str) -> String {
        format!(
            r#""id":{},"object":"{object}","created":{},"model":{}"#,
            js(&self.id),
            self.created,
            js(&self.model)
        )
    }

    /// Chat only: the first chunk, carrying the role and empty content.
    pub fn role_chunk(&self) -> String {
        frame(&format!(
            r#"{{{},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}],"prompt_token_ids":null,"prompt_text":null}}"#,
            self.head("chat.completion.chunk")
        ))
    }

    /// One token; the last one carries its finish reason.
    pub fn token_chunk(&self, text: &str, finish: Option<FinishReason>) -> String {
        self.delta_chunk("content", text, finish)
    }

    /// One token whose chat delta carries `text` under `key` (`content`, or the reasoning
    /// field); completions have no such split and carry it as `text`.
    pub fn delta_chunk(&self, key: &str, text: &str, finish: Option<FinishReason>) -> String {
        let (finish, stop) = match finish {
            Some(r) => (js(r.as_str()), r#","stop_reason":null"#),
            None => ("null".to_string(), ""),
        };
        let body = match self.endpoint {
            Endpoint::Chat => format!(
                r#"{{{},"choices":[{{"index":0,"delta":{{{}:{}}},"logprobs":null,"finish_reason":{finish}{stop},"token_ids":null}}]}}"#,
                self.head("chat.completion.chunk"),
                js(key),
                js(text)
            ),
            Endpoint::Completion => format!(
                r#"{{{},"choices":[{{"index":0,"text":{},"logprobs":null,"finish_reason":{finish},"stop_reason":null,"prompt_token_ids":null,"token_ids":null}}]}}"#,
                self.head("text_completion"),
                js(text)
            ),
        };
        frame(&body)
    }

    /// Final usage chunk (`stream_options.include_usage`); reasoning models add
    /// `completion_tokens_details.reasoning_tokens`.
    pub fn usage_chunk(&self, prompt: u32, completion: u32, reasoning: u32) -> String {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        let mut details = if reasoning > 0 {
            format!(r#","completion_tokens_details":{{"reasoning_tokens":{reasoning}}}"#)
        } else {
            String::new()
        };
        if let Some(cached) = self.cached_tokens {
            details.push_str(&format!(
                r#","prompt_tokens_details":{{"cached_tokens":{cached}}}"#
            ));
        }
        frame(&format!(
            r#"{{{},"choices":[],"usage":{{"prompt_tokens":{prompt},"total_tokens":{},"completion_tokens":{completion}{details}}},"system_fingerprint":{}}}"#,
            self.head(object),
            prompt + completion,
            js(SYSTEM_FINGERPRINT)
        ))
    }

    /// Whole non-streaming response. `reasoning` is the chat field name and its text
    /// (`null` when the model did not reason).
    pub fn full_response(
        &self,
        text: &str,
        reasoning: (&str, &str),
        finish: FinishReason,
        usage: Usage,
    ) -> Value {
        let mut usage_json = json!({
            "prompt_tokens": usage.prompt,
            "total_tokens": usage.prompt + usage.completion,
            "completion_tokens": usage.completion,
            "prompt_tokens_details": null,
        });
        if let Some(cached) = self.cached_tokens {
            usage_json["prompt_tokens_details"] = json!({ "cached_tokens": cached });
        }
        if usage.reasoning > 0 {
            usage_json["completion_tokens_details"] =
                json!({ "reasoning_tokens": usage.reasoning });
        }
        let (key, reasoning_text) = reasoning;
        let reasoning_value = match usage.reasoning {
            0 => Value::Null,
            _ => Value::from(reasoning_text),
        };
        let (object, choice) = match self.endpoint {
            Endpoint::Chat => {
                let mut message = json!({"role": "assistant", "content": text, "tool_calls": []});
                message[key] = reasoning_value;
                (
                    "chat.completion",
                    json!({
                        "index": 0,
                        "message": message,
                        "logprobs": null,
                        "finish_reason": finish.as_str(),
                        "stop_reason": null,
                    }),
                )
            }
            Endpoint::Completion => (
                "text_completion",
                json!({
                    "index": 0,
                    "text": text,
                    "logprobs": null,
                    "finish_reason": finish.as_str(),
                    "stop_reason": null,
                    "prompt_logprobs": null,
                }),
            ),
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_json,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT_SAMPLE: &str = include_str!("../../../../fixtures/vllm-cpu-sse-chat.txt");
    const COMPLETION_SAMPLE: &str = include_str!("../../../../fixtures/vllm-cpu-sse.txt");

    fn ctx(endpoint: Endpoint) -> ChunkCtx {
        ChunkCtx {
            endpoint,
            id: "chatcmpl-8cafd02b14aedd00".into(),
            model: "tinyllama".into(),
            created: 1796202257,
            cached_tokens: None,
        }
    }

    fn frames(s: &str) -> Vec<&str> {
        s.split("\n\n")
            .filter(|f| !f.trim().is_empty())
            .map(str::trim)
            .collect()
    }

    /// Same keys in the same order, recursively (values may differ).
    fn same_shape(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .zip(y.iter())
                        .all(|((ka, va), (kb, vb))| ka == kb && same_shape(va, vb))
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_shape(p, q))
            }
            (Value::Null, Value::Null) => true,
            (Value::Null, _) | (_, Value::Null) => false,
            _ => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }

    fn parse(frame: &str) -> Value {
        let json = frame.strip_prefix("data: ").unwrap();
        serde_json::from_str(json).unwrap()
    }

    fn check_against(sample: &str, ours: &[String]) {
        let real = frames(sample);
        let ours: Vec<&str> = ours.iter().map(|s| s.trim()).collect();
        assert_eq!(real.last(), Some(&"data: [DONE]"));
        assert_eq!(ours.last(), Some(&"data: [DONE]"));
        // first, a middle token chunk, the finishing chunk and the usage chunk
        let n = real.len();
        for (r, o) in [
            (0, 0),
            (1, 1),
            (n - 3, ours.len() - 3),
            (n - 2, ours.len() - 2),
        ] {
            assert!(
                same_shape(&parse(real[r]), &parse(ours[o])),
                "frame shape differs:\n{}\n{}",
                real[r],
                ours[o]
            );
        }
    }

    #[test]
    fn chat_stream_matches_real_vllm_shape() {
        let c = ctx(Endpoint::Chat);
        let ours = vec![
            c.role_chunk(),
            c.token_chunk("q", None),
            c.token_chunk("", Some(FinishReason::Length)),
            c.usage_chunk(16, 20, 0),
            DONE_FRAME.to_string(),
        ];
        assert!(ours[0].contains(r#""delta":{"role":"assistant","content":""}"#));
        check_against(CHAT_SAMPLE, &ours);
    }

    #[test]
    fn completion_stream_matches_real_vllm_shape() {
        let c = ChunkCtx {
            id: "cmpl-850c97dae22111ef".into(),
            ..ctx(Endpoint::Completion)
        };
        let ours = vec![
            c.token_chunk("cy", None),
            c.token_chunk(" co", None),
            c.token_chunk("", Some(FinishReason::Length)),
            c.usage_chunk(3, 20, 0),
            DONE_FRAME.to_string(),
        ];
        check_against(COMPLETION_SAMPLE, &ours);
    }

    #[test]
    fn reasoning_goes_under_the_chosen_key() {
        let c = ctx(Endpoint::Chat);
        let f = parse(c.delta_chunk("reasoning", "hm", None).trim());
        assert_eq!(f["choices"][0]["delta"], json!({"reasoning": "hm"}));
        let u = parse(c.usage_chunk(5, 9, 4).trim());
        assert_eq!(
            u["usage"]["completion_tokens_details"]["reasoning_tokens"],
            4
        );
        let usage = Usage {
            prompt: 5,
            completion: 9,
            reasoning: 4,
        };
        let full = c.full_response("a", ("reasoning_content", "r"), FinishReason::Stop, usage);
        assert_eq!(full["choices"][0]["message"]["reasoning_content"], "r");
        assert!(full["choices"][0]["message"].get("reasoning").is_none());
        assert_eq!(
            full["usage"]["completion_tokens_details"]["reasoning_tokens"],
            4
        );
        let plain = Usage {
            reasoning: 0,
            ..usage
        };
        let full = c.full_response("a", ("reasoning", ""), FinishReason::Stop, plain);
        assert!(full["choices"][0]["message"]["reasoning"].is_null());
        assert!(full["usage"].get("completion_tokens_details").is_none());
    }

    #[test]
    fn cached_prompt_tokens_only_with_prompt_tokens_details() {
        let mut c = ctx(Endpoint::Chat);
        let usage = Usage {
            prompt: 40,
            completion: 9,
            reasoning: 0,
        };
        let streamed = parse(c.usage_chunk(40, 9, 0).trim());
        assert!(streamed["usage"].get("prompt_tokens_details").is_none());
        let full = c.full_response("a", ("reasoning", ""), FinishReason::Stop, usage);
        assert!(full["usage"]["prompt_tokens_details"].is_null());
        c.cached_tokens = Some(32);
        let streamed = parse(c.usage_chunk(40, 9, 0).trim());
        assert_eq!(
            streamed["usage"]["prompt_tokens_details"]["cached_tokens"],
            32
        );
        let full = c.full_response("a", ("reasoning", ""), FinishReason::Stop, usage);
        assert_eq!(full["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
    }

    #[test]
    fn text_is_json_escaped() {
        let c = ctx(Endpoint::Chat);
        let f = c.token_chunk("a\"b\n", None);
        assert_eq!(parse(f.trim())["choices"][0]["delta"]["content"], "a\"b\n");
    }
}
