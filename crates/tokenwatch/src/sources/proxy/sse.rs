// Incremental observer of a server-sent-event stream as it passes through the proxy: it frames
// events, hands each to its API's vocabulary (`StreamFormat`), and never alters the bytes it sees.

mod anthropic;
mod chat;
mod responses;

pub use crate::kernel::stream_format::StreamFormat;
use serde::de::{self, Deserializer, Visitor};
use std::fmt;

/// What the observer learned from one fed chunk of bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FeedResult {
    /// Events in this chunk that carried generated content (a token or more).
    pub content_events: u32,
}

/// Longest single SSE line accepted before the stream is called malformed.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// Longest `event:` name kept; longer names are cut (no vocabulary has names near this).
const MAX_EVENT_NAME: usize = 64;

impl StreamFormat {
    /// Reads one dispatched event (`event:` name, possibly empty, and its joined `data:`) into
    /// `seen`; true when the event carried generated content.
    fn event(
        self,
        name: &[u8],
        data: &[u8],
        seen: &mut Observed,
    ) -> Result<bool, serde_json::Error> {
        match self {
            StreamFormat::OpenAi => chat::event(data, seen),
            StreamFormat::Responses => responses::event(name, data, seen),
            StreamFormat::Anthropic => anthropic::event(name, data, seen),
        }
    }

    /// Token counts, finish reason and model of a non-streaming JSON response body; None when
    /// the body is not JSON of the expected shape.
    pub fn json_body(self, body: &[u8]) -> Option<Observed> {
        match self {
            StreamFormat::OpenAi => chat::json_body(body),
            StreamFormat::Responses => responses::json_body(body),
            StreamFormat::Anthropic => anthropic::json_body(body),
        }
    }

    /// The event that ends a complete stream, for the message when it never came.
    pub fn terminal_event(self) -> &'static str {
        match self {
            StreamFormat::OpenAi => "[DONE]",
            StreamFormat::Responses => "response.completed, response.incomplete or response.failed",
            StreamFormat::Anthropic => "message_stop",
        }
    }
}

/// What a response said about itself, in the OpenAI vocabulary whatever its API.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The stream's terminal event arrived (`[DONE]`, `response.completed`, `message_stop` …).
    pub done: bool,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Of `completion_tokens`, the reasoning tokens, when the upstream reported them.
    pub reasoning_tokens: Option<u64>,
    /// Of `prompt_tokens`, the tokens read from the upstream's prompt cache, when it reported them.
    pub cached_input_tokens: Option<u64>,
    /// Normalised to chat's `finish_reason` values (`stop`, `length`, `tool_calls` …).
    pub finish_reason: Option<String>,
    pub model: Option<String>,
    /// An error event arrived (a mid-stream failure of the upstream).
    pub error_event: bool,
}

#[derive(Debug)]
pub struct SseObserver {
    format: StreamFormat,
    partial: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    skip_lf: bool,
    /// The pending event's `event:` field.
    event: Vec<u8>,
    pub events: u32,
    pub content_events: u32,
    pub seen: Observed,
    /// First problem seen (unparsable event, over-long line, error event); bytes still flow.
    pub malformed: Option<String>,
}

impl SseObserver {
    pub fn new(format: StreamFormat) -> Self {
        SseObserver {
            format,
            partial: Vec::new(),
            data: Vec::new(),
            has_data: false,
            skip_lf: false,
            event: Vec::new(),
            events: 0,
            content_events: 0,
            seen: Observed::default(),
            malformed: None,
        }
    }

    pub fn format(&self) -> StreamFormat {
        self.format
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
                        self.note_malformed(format!(
                            "an SSE line is longer than {MAX_LINE_BYTES} bytes"
                        ));
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
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event
                    .extend_from_slice(&value[..value.len().min(MAX_EVENT_NAME)]);
            }
            _ => {} // `id`, `retry` carry nothing we time.
        }
    }

    fn dispatch(&mut self, result: &mut FeedResult) {
        if !self.has_data {
            self.event.clear();
            return;
        }
        self.has_data = false;
        self.events += 1;
        let was_error = self.seen.error_event;
        match self.format.event(&self.event, &self.data, &mut self.seen) {
            Ok(true) => {
                self.content_events += 1;
                result.content_events += 1;
            }
            Ok(false) => {}
            Err(e) => self.note_malformed(format!("event {} is not valid JSON: {e}", self.events)),
        }
        if self.seen.error_event && !was_error {
            self.note_malformed(format!("event {} is an error event", self.events));
        }
        self.data.clear();
        self.event.clear();
    }

    fn note_malformed(&mut self, why: String) {
        if self.malformed.is_none() {
            self.malformed = Some(why);
        }
    }
}

/// The `[DONE]` sentinel that ends OpenAI chat streams (some gateways add it to other APIs).
fn is_done_sentinel(data: &[u8]) -> bool {
    data.trim_ascii() == b"[DONE]"
}

/// The start the typed-event formats (Responses, Anthropic) share: an `event: error` line marks
/// the stream, a `[DONE]` sentinel carries nothing (None), anything else is parsed as `T`.
fn typed_event<'a, T: de::Deserialize<'a>>(
    name: &[u8],
    data: &'a [u8],
    seen: &mut Observed,
) -> Result<Option<T>, serde_json::Error> {
    if name == b"error" {
        seen.error_event = true;
    }
    if is_done_sentinel(data) {
        return Ok(None);
    }
    serde_json::from_slice(data).map(Some)
}

/// An event's type: the data's `type` field, else the `event:` line's name.
fn event_kind<'a>(kind: &'a Option<std::borrow::Cow<'a, str>>, name: &'a [u8]) -> &'a str {
    match kind {
        Some(k) => k.as_ref(),
        None => std::str::from_utf8(name).unwrap_or(""),
    }
}

/// Whether a JSON string field carries text: `""`, `null` and absent do not. Read without
/// keeping the text; any other JSON type is an error, as it would be for `Option<String>`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct HasText(bool);

impl<'de> de::Deserialize<'de> for HasText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HasText, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = HasText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or null")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HasText, E> {
                Ok(HasText(!v.is_empty()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<HasText, E> {
                Ok(HasText(false))
            }
            fn visit_none<E: de::Error>(self) -> Result<HasText, E> {
                Ok(HasText(false))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<HasText, D::Error> {
                d.deserialize_str(V)
            }
        }
        d.deserialize_option(V)
    }
}

/// Like `HasText`, for fields whose type may vary between events: a non-empty string, or any
/// object, array, number or boolean, carries text; `""`, `null` and absent do not.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct AnyText(bool);

impl<'de> de::Deserialize<'de> for AnyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AnyText, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AnyText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AnyText, E> {
                Ok(AnyText(!v.is_empty()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<AnyText, E> {
                Ok(AnyText(false))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<AnyText, E> {
                Ok(AnyText(true))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<AnyText, E> {
                Ok(AnyText(true))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<AnyText, E> {
                Ok(AnyText(true))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<AnyText, E> {
                Ok(AnyText(true))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<AnyText, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(AnyText(true))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<AnyText, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(AnyText(true))
            }
        }
        d.deserialize_any(V)
    }
}

/// Counts that are reported as `{"reasoning_tokens": n, …}` under a usage object.
#[derive(serde::Deserialize)]
struct ReasoningDetails {
    reasoning_tokens: Option<u64>,
}

/// Counts that are reported as `{"cached_tokens": n, …}` under a usage object
/// (`prompt_tokens_details` in chat, `input_tokens_details` in Responses).
#[derive(serde::Deserialize)]
struct CachedDetails {
    cached_tokens: Option<u64>,
}

#[cfg(test)]
mod tests;
