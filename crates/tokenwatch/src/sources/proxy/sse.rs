// Incremental observer of an OpenAI-style server-sent-event stream as it passes through the
// proxy: it never holds more than one partial line and never alters the bytes it sees.

use serde::Deserialize;
use serde::de::IgnoredAny;

/// What the observer learned from one fed chunk of bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FeedResult {
    /// Events in this chunk that carried generated content (a token or more).
    pub content_events: u32,
}

/// Longest single SSE line accepted before the stream is called malformed.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

#[derive(Debug, Default)]
pub struct SseObserver {
    partial: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    skip_lf: bool,
    pub events: u32,
    pub content_events: u32,
    pub done: bool,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub finish_reason: Option<String>,
    pub model: Option<String>,
    /// First problem seen (unparsable event, over-long line, error event); bytes still flow.
    pub malformed: Option<String>,
    pub error_event: bool,
}

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
    text: Option<String>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    reasoning_content: Option<String>,
    tool_calls: Option<IgnoredAny>,
}

#[derive(Deserialize)]
pub(crate) struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

impl SseObserver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Observe the next bytes of the stream (any split, even mid-line or mid-UTF-8).
    pub fn feed(&mut self, bytes: &[u8]) -> FeedResult {
        let mut result = FeedResult::default();
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.skip_lf {
                self.skip_lf = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
                Some(i) => {
                    if rest[i] == b'\r' {
                        self.skip_lf = true;
                    }
                    if self.partial.is_empty() {
                        self.line(&rest[..i], &mut result);
                    } else {
                        let mut line = std::mem::take(&mut self.partial);
                        line.extend_from_slice(&rest[..i]);
                        self.line(&line, &mut result);
                        line.clear();
                        self.partial = line;
                    }
                    rest = &rest[i + 1..];
                }
                None => {
                    if self.partial.len() + rest.len() > MAX_LINE_BYTES {
                        self.note_malformed(format!("an SSE line is longer than {MAX_LINE_BYTES} bytes"));
                        self.partial.clear();
                    } else {
                        self.partial.extend_from_slice(rest);
                    }
                    rest = &[];
                }
            }
        }
        result
    }

    /// The stream ended: dispatch a final event that lacked its blank line.
    pub fn finish(&mut self) -> FeedResult {
        let mut result = FeedResult::default();
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut result);
        }
        self.dispatch(&mut result);
        result
    }

    fn line(&mut self, line: &[u8], result: &mut FeedResult) {
        if line.is_empty() {
            self.dispatch(result);
            return;
        }
        if line[0] == b':' {
            return; // comment / keep-alive
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
        // `event`, `id`, `retry` carry nothing we time.
    }

    fn dispatch(&mut self, result: &mut FeedResult) {
        if !self.has_data {
            return;
        }
        self.has_data = false;
        self.events += 1;
        let data = std::mem::take(&mut self.data);
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
        } else {
            match serde_json::from_slice::<Chunk>(&data) {
                Ok(chunk) => {
                    if self.observe_chunk(chunk) {
                        self.content_events += 1;
                        result.content_events += 1;
                    }
                }
                Err(e) => self.note_malformed(format!("event {} is not valid JSON: {e}", self.events)),
            }
        }
        let mut data = data;
        data.clear();
        self.data = data;
    }

    /// Returns true when the chunk carried generated content.
    fn observe_chunk(&mut self, chunk: Chunk) -> bool {
        if chunk.error.is_some() {
            self.error_event = true;
            self.note_malformed(format!("event {} is an error event", self.events));
        }
        if self.model.is_none() {
            self.model = chunk.model;
        }
        if let Some(u) = chunk.usage {
            self.prompt_tokens = u.prompt_tokens.or(self.prompt_tokens);
            self.completion_tokens = u.completion_tokens.or(self.completion_tokens);
        }
        let mut content = false;
        for c in chunk.choices {
            if let Some(reason) = c.finish_reason {
                self.finish_reason = Some(reason);
            }
            if c.text.as_deref().is_some_and(|t| !t.is_empty()) {
                content = true;
            }
            if let Some(d) = c.delta
                && (d.content.as_deref().is_some_and(|t| !t.is_empty())
                    || d.reasoning_content.as_deref().is_some_and(|t| !t.is_empty())
                    || d.tool_calls.is_some())
            {
                content = true;
            }
        }
        content
    }

    fn note_malformed(&mut self, why: String) {
        if self.malformed.is_none() {
            self.malformed = Some(why);
        }
    }
}

/// Token counts and finish reason of a non-streaming JSON response body.
pub fn observe_json_body(body: &[u8]) -> Option<(Option<u64>, Option<u64>, Option<String>, Option<String>)> {
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
    let finish = full.choices.into_iter().find_map(|c| c.finish_reason);
    let (p, c) = full.usage.map(|u| (u.prompt_tokens, u.completion_tokens)).unwrap_or((None, None));
    Some((p, c, finish, full.model))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CHAT: &str = include_str!("../../../../../fixtures/vllm-cpu-sse-chat.txt");
    const COMPLETION: &str = include_str!("../../../../../fixtures/vllm-cpu-sse.txt");

    fn run(bytes: &[u8]) -> SseObserver {
        let mut o = SseObserver::new();
        o.feed(bytes);
        o.finish();
        o
    }

    #[test]
    fn real_vllm_chat_stream() {
        let o = run(CHAT.as_bytes());
        assert!(o.done);
        assert!(o.malformed.is_none(), "{:?}", o.malformed);
        assert_eq!(o.prompt_tokens, Some(16));
        assert_eq!(o.completion_tokens, Some(20));
        assert_eq!(o.finish_reason.as_deref(), Some("length"));
        assert_eq!(o.model.as_deref(), Some("tinyllama"));
        // The role-only first chunk and the empty-content chunks do not count as content.
        let non_empty = CHAT
            .lines()
            .filter(|l| l.contains("\"content\":\"") && !l.contains("\"content\":\"\""))
            .count() as u32;
        assert_eq!(o.content_events, non_empty);
        assert!(o.content_events < o.events - 2);
    }

    #[test]
    fn real_vllm_completion_stream() {
        let o = run(COMPLETION.as_bytes());
        assert!(o.done);
        assert_eq!(o.completion_tokens, Some(20));
        let non_empty = COMPLETION.lines().filter(|l| l.contains("\"text\":\"") && !l.contains("\"text\":\"\"")).count();
        assert_eq!(o.content_events as usize, non_empty);
    }

    #[test]
    fn first_role_only_chunk_is_not_content() {
        let mut o = SseObserver::new();
        let r = o.feed(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
        assert_eq!(r.content_events, 0);
        let r = o.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n");
        assert_eq!(r.content_events, 1);
    }

    #[test]
    fn malformed_event_is_noted_not_fatal() {
        let o = run(b"data: {not json\n\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n");
        assert!(o.malformed.is_some());
        assert_eq!(o.content_events, 1);
        assert!(o.done);
    }

    #[test]
    fn crlf_and_multiline_data() {
        let o = run(b": keep-alive\r\ndata: {\"choices\":\r\ndata: [{\"text\":\"a\"}]}\r\n\r\ndata: [DONE]\r\n\r\n");
        assert!(o.malformed.is_none(), "{:?}", o.malformed);
        assert_eq!(o.content_events, 1);
        assert!(o.done);
    }

    #[test]
    fn non_streaming_body() {
        let body = br#"{"model":"m","choices":[{"message":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7}}"#;
        let (p, c, f, m) = observe_json_body(body).unwrap();
        assert_eq!((p, c, f.as_deref(), m.as_deref()), (Some(5), Some(7), Some("stop"), Some("m")));
    }

    proptest! {
        // However the stream is cut into chunks, the observer sees the same events.
        #[test]
        fn chunk_boundaries_do_not_matter(cuts in proptest::collection::vec(0usize..CHAT.len(), 0..40)) {
            let whole = run(CHAT.as_bytes());
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut o = SseObserver::new();
            let mut prev = 0;
            for c in cuts {
                o.feed(&CHAT.as_bytes()[prev..c]);
                prev = c;
            }
            o.feed(&CHAT.as_bytes()[prev..]);
            o.finish();
            prop_assert_eq!(o.events, whole.events);
            prop_assert_eq!(o.content_events, whole.content_events);
            prop_assert_eq!(o.completion_tokens, whole.completion_tokens);
            prop_assert!(o.done);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = run(&bytes);
        }
    }
}
