// The text of a proxied request and of its response, read after the fact from the bytes the
// proxy kept: prompt fields of every API it times, streamed deltas or the whole JSON answer.

use crate::kernel::stream_format::StreamFormat;
use serde_json::Value;

/// The prompt as `role: text` lines: `system`/`instructions`, `messages`, `prompt` or `input`
/// (strings, arrays of strings, or messages whose content is a string or text parts). A body
/// that is not JSON gives an empty prompt.
pub fn prompt(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return String::new();
    };
    let mut lines: Vec<String> = Vec::new();
    let mut push = |role: &str, text: String| {
        if !text.is_empty() {
            lines.push(format!("{role}: {text}"));
        }
    };
    for key in ["system", "instructions"] {
        if let Some(x) = v.get(key) {
            push("system", text_of(x));
        }
    }
    for key in ["messages", "prompt", "input"] {
        match v.get(key) {
            Some(Value::Array(items)) => {
                for item in items {
                    match item.get("role").and_then(Value::as_str) {
                        Some(role) => {
                            push(role, item.get("content").map(text_of).unwrap_or_default())
                        }
                        None => push("user", text_of(item)),
                    }
                }
            }
            Some(x) => push("user", text_of(x)),
            None => {}
        }
    }
    lines.join("\n")
}

/// The generated text (reasoning and answer, in the order they came) of a response: streamed
/// events when `event_stream`, else the JSON body. Anything unreadable adds nothing.
pub fn completion(format: StreamFormat, body: &[u8], event_stream: bool) -> String {
    let mut out = String::new();
    if event_stream {
        for (name, data) in sse_events(body) {
            if let Ok(v) = serde_json::from_slice::<Value>(&data) {
                streamed(format, &name, &v, &mut out);
            }
        }
    } else if let Ok(v) = serde_json::from_slice::<Value>(body) {
        whole(format, &v, &mut out);
    }
    out
}

/// Text of a content value: a string, the `text` (or `content`) of a part, or parts joined.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            let texts: Vec<String> = parts
                .iter()
                .map(text_of)
                .filter(|t| !t.is_empty())
                .collect();
            texts.join("\n")
        }
        Value::Object(o) => o
            .get("text")
            .or_else(|| o.get("content"))
            .map(text_of)
            .unwrap_or_default(),
        _ => String::new(),
    }
}

fn push_str(out: &mut String, v: Option<&Value>) {
    if let Some(s) = v.and_then(Value::as_str) {
        out.push_str(s);
    }
}

/// The elements of the array `v[key]` (none when it is missing or not an array).
fn items<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v.get(key).and_then(Value::as_array).into_iter().flatten()
}

/// A chat choice's generated text: the reasoning and content of its `delta` (streamed) or
/// `message` (whole), or its `text` (completions).
fn chat_choice(c: &Value, part: &str, out: &mut String) {
    if let Some(m) = c.get(part) {
        push_str(
            out,
            m.get("reasoning_content").or_else(|| m.get("reasoning")),
        );
        out.push_str(&m.get("content").map(text_of).unwrap_or_default());
    }
    push_str(out, c.get("text"));
}

/// One streamed event's generated text.
fn streamed(format: StreamFormat, name: &str, v: &Value, out: &mut String) {
    let kind = v.get("type").and_then(Value::as_str).unwrap_or(name);
    match format {
        StreamFormat::OpenAi => items(v, "choices").for_each(|c| chat_choice(c, "delta", out)),
        StreamFormat::Responses => {
            if matches!(
                kind,
                "response.output_text.delta"
                    | "response.reasoning_text.delta"
                    | "response.reasoning_summary_text.delta"
                    | "response.refusal.delta"
            ) {
                push_str(out, v.get("delta"));
            }
        }
        StreamFormat::Anthropic => {
            if kind == "content_block_delta"
                && let Some(d) = v.get("delta")
            {
                push_str(out, d.get("thinking"));
                push_str(out, d.get("text"));
            }
        }
    }
}

/// A whole (non-streamed) answer's generated text.
fn whole(format: StreamFormat, v: &Value, out: &mut String) {
    let text = |item: &Value, key: &str| item.get(key).map(text_of).unwrap_or_default();
    match format {
        StreamFormat::OpenAi => items(v, "choices").for_each(|c| chat_choice(c, "message", out)),
        StreamFormat::Responses => {
            for item in items(v, "output") {
                match item.get("type").and_then(Value::as_str) {
                    Some("reasoning") => {
                        out.push_str(&text(item, "summary"));
                        out.push_str(&text(item, "content"));
                    }
                    Some("message") | None => out.push_str(&text(item, "content")),
                    Some(_) => {}
                }
            }
        }
        StreamFormat::Anthropic => {
            for block in items(v, "content") {
                push_str(out, block.get("thinking"));
                push_str(out, block.get("text"));
            }
        }
    }
}

/// The events of a whole SSE body: (`event:` name, joined `data:` lines), per the SSE framing
/// (CR, LF or CRLF line ends; a blank line dispatches; comments and other fields ignored).
fn sse_events(body: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut events = Vec::new();
    let (mut name, mut data, mut has_data) = (String::new(), Vec::new(), false);
    let text = String::from_utf8_lossy(body)
        .replace("\r\n", "\n")
        .replace('\r', "\n");
    for line in text.split('\n') {
        if line.is_empty() {
            if has_data {
                events.push((std::mem::take(&mut name), std::mem::take(&mut data)));
                has_data = false;
            }
            name.clear();
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if has_data {
                    data.push(b'\n');
                }
                data.extend_from_slice(value.as_bytes());
                has_data = true;
            }
            "event" => name = value.to_string(),
            _ => {}
        }
    }
    if has_data {
        events.push((name, data));
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompt_and_streamed_answer_with_reasoning() {
        let req = br#"{"model":"m","stream":true,"messages":[
            {"role":"system","content":"Be brief."},
            {"role":"user","content":[{"type":"text","text":"Mail bob@example.com"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
        assert_eq!(prompt(req), "system: Be brief.\nuser: Mail bob@example.com");
        let sse = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n\
            data: {\"choices\":[{\"delta\":{\"reasoning\":\"think \"}}]}\n\n\
            data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
            : keep-alive\n\n\
            data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n\
            data: [DONE]\n\n";
        assert_eq!(completion(StreamFormat::OpenAi, sse, true), "think Hello");
    }

    #[test]
    fn completions_and_embeddings_prompts() {
        assert_eq!(prompt(br#"{"prompt":"Say hi"}"#), "user: Say hi");
        assert_eq!(prompt(br#"{"input":["a","b"]}"#), "user: a\nuser: b");
        assert_eq!(prompt(b"not json"), "");
        let body = br#"{"choices":[{"text":"hi there","finish_reason":"stop"}]}"#;
        assert_eq!(completion(StreamFormat::OpenAi, body, false), "hi there");
        let body = br#"{"choices":[{"message":{"role":"assistant","content":"ok","reasoning_content":"hm "}}]}"#;
        assert_eq!(completion(StreamFormat::OpenAi, body, false), "hm ok");
    }

    #[test]
    fn responses_api() {
        let req = br#"{"model":"m","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]}]}"#;
        assert_eq!(prompt(req), "system: Be brief.\nuser: Hi");
        let sse = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{}}\n\n\
            event: response.reasoning_summary_text.delta\ndata: {\"type\":\"response.reasoning_summary_text.delta\",\"delta\":\"plan \"}\n\n\
            event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hello\"}\n\n\
            event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[]}}\n\n";
        assert_eq!(completion(StreamFormat::Responses, sse, true), "plan Hello");
        let body = br#"{"output":[{"type":"reasoning","summary":[{"type":"summary_text","text":"plan "}]},
            {"type":"message","content":[{"type":"output_text","text":"Hello"}]},{"type":"function_call","arguments":"{}"}]}"#;
        assert_eq!(
            completion(StreamFormat::Responses, body, false),
            "plan Hello"
        );
    }

    #[test]
    fn anthropic_messages() {
        let req = br#"{"model":"m","system":[{"type":"text","text":"Be brief."}],"messages":[{"role":"user","content":"Hi"}]}"#;
        assert_eq!(prompt(req), "system: Be brief.\nuser: Hi");
        let sse = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm \"}}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n\
            event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(completion(StreamFormat::Anthropic, sse, true), "hm Hello");
        let body =
            br#"{"content":[{"type":"thinking","thinking":"hm "},{"type":"text","text":"Hello"}]}"#;
        assert_eq!(completion(StreamFormat::Anthropic, body, false), "hm Hello");
    }

    #[test]
    fn multi_line_data_and_garbage_do_not_break_extraction() {
        let sse = b"data: {\"choices\":\r\ndata: [{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {broken\n\nevent: x\n\n";
        assert_eq!(completion(StreamFormat::OpenAi, sse, true), "a");
        assert_eq!(
            completion(StreamFormat::OpenAi, &[0xff, 0xfe, b'\n'], true),
            ""
        );
    }
}
