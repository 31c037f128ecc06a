// The prefix-cache key of a proxied request: the leading `PREFIX_BYTES` of its prompt (chat or
// Anthropic messages' roles and text in order after any system text, Responses `input`, or
// `prompt`) collected while the body is parsed, then a salted 64-bit hash — text never kept.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use sha2::{Digest, Sha256};
use std::fmt;

/// How many leading bytes of the prompt make the key.
pub const PREFIX_BYTES: usize = 1024;

/// The leading bytes of a request's prompt, as `messages`, `input`, `system` or `prompt` of
/// the request body.
#[derive(Debug, Default, PartialEq)]
pub struct PromptHead(String);

impl PromptHead {
    /// The key: the first 8 bytes of SHA-256(salt, 0, head); None without any prompt text.
    pub fn key(&self, salt: &[u8]) -> Option<u64> {
        if self.0.is_empty() {
            return None;
        }
        let mut h = Sha256::new();
        h.update(salt);
        h.update([0u8]);
        h.update(self.0.as_bytes());
        let d = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&d[..8]);
        Some(u64::from_be_bytes(first))
    }

    pub fn text(&self) -> &str {
        &self.0
    }

    /// A system text given apart from the messages (Anthropic `system`, Responses
    /// `instructions`) written as the leading system message, as chat carries it: the same
    /// conversation gets the same key whichever of the three APIs sent it.
    pub fn after_system(system: &PromptHead, rest: &PromptHead) -> PromptHead {
        if system.0.is_empty() {
            return PromptHead(rest.0.clone());
        }
        let mut head = String::new();
        push(&mut head, "system:");
        push(&mut head, &system.0);
        push(&mut head, "\n");
        push(&mut head, &rest.0);
        PromptHead(head)
    }
}

/// Appends as much of `s` as fits in `PREFIX_BYTES` (cut at a character boundary).
fn push(head: &mut String, s: &str) {
    let room = PREFIX_BYTES.saturating_sub(head.len());
    if room == 0 {
        return;
    }
    let mut end = s.len().min(room);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    head.push_str(&s[..end]);
}

/// `messages`: each message's role, `:`, its text (a string, or the `text` of its parts), `\n`.
pub fn messages<'de, D: Deserializer<'de>>(d: D) -> Result<PromptHead, D::Error> {
    let mut head = String::new();
    d.deserialize_any(Collect {
        head: &mut head,
        mode: Mode::Messages,
    })?;
    Ok(PromptHead(head))
}

/// Responses `input`: a string (the user's message) or a list of input items (messages with
/// `role` and `content`, written like chat messages).
pub fn input<'de, D: Deserializer<'de>>(d: D) -> Result<PromptHead, D::Error> {
    let mut head = String::new();
    d.deserialize_any(Collect {
        head: &mut head,
        mode: Mode::Input,
    })?;
    Ok(PromptHead(head))
}

/// Anthropic `system` (a string or text blocks) or Responses `instructions`: the text alone.
pub fn system<'de, D: Deserializer<'de>>(d: D) -> Result<PromptHead, D::Error> {
    prompt(d)
}

/// `prompt` of completions: a string, strings, or token ids (written as numbers).
pub fn prompt<'de, D: Deserializer<'de>>(d: D) -> Result<PromptHead, D::Error> {
    let mut head = String::new();
    d.deserialize_any(Collect {
        head: &mut head,
        mode: Mode::Text,
    })?;
    Ok(PromptHead(head))
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// A list of chat messages.
    Messages,
    /// Responses `input`: a string is one user message; a list holds messages.
    Input,
    /// One message object: take `role` and `content`.
    Message,
    /// Text: strings are taken, arrays walked, objects give their `text`; numbers as text.
    Text,
}

/// Walks any JSON value, appending the prompt text it holds to `head`; never fails on a value
/// of an unexpected type (that value is skipped), so the model is still read from the body.
struct Collect<'h> {
    head: &'h mut String,
    mode: Mode,
}

impl<'de> DeserializeSeed<'de> for Collect<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Collect<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        match self.mode {
            Mode::Text => push(self.head, v),
            Mode::Input => {
                push(self.head, "user:");
                push(self.head, v);
                push(self.head, "\n");
            }
            Mode::Messages | Mode::Message => {}
        }
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        if self.mode == Mode::Text {
            push(self.head, &format!("{v},"));
        }
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        if self.mode == Mode::Text {
            push(self.head, &format!("{v},"));
        }
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mode = match self.mode {
            Mode::Messages | Mode::Input => Mode::Message,
            Mode::Message | Mode::Text => Mode::Text,
        };
        while seq
            .next_element_seed(Collect {
                head: &mut *self.head,
                mode,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut role = String::new();
        let mut content = String::new();
        while let Some(key) = map.next_key::<Key>()? {
            match (self.mode, key) {
                (Mode::Message, Key::Role) => map.next_value_seed(Collect {
                    head: &mut role,
                    mode: Mode::Text,
                })?,
                (Mode::Message, Key::Content) => map.next_value_seed(Collect {
                    head: &mut content,
                    mode: Mode::Text,
                })?,
                (Mode::Text, Key::Text) => map.next_value_seed(Collect {
                    head: &mut *self.head,
                    mode: Mode::Text,
                })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if self.mode == Mode::Message {
            push(self.head, &role);
            push(self.head, ":");
            push(self.head, &content);
            push(self.head, "\n");
        }
        Ok(())
    }
}

/// The object keys that matter, read without allocating.
enum Key {
    Role,
    Content,
    Text,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct K;
        impl Visitor<'_> for K {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "role" => Key::Role,
                    "content" => Key::Content,
                    "text" => Key::Text,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(K)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Default)]
    struct Body {
        #[serde(default, deserialize_with = "messages")]
        messages: PromptHead,
        #[serde(default, deserialize_with = "prompt")]
        prompt: PromptHead,
        #[serde(default, deserialize_with = "input")]
        input: PromptHead,
        #[serde(default, deserialize_with = "system")]
        system: PromptHead,
        #[serde(default, deserialize_with = "system")]
        instructions: PromptHead,
        model: Option<String>,
    }

    fn parse(v: serde_json::Value) -> Body {
        serde_json::from_str(&v.to_string()).unwrap()
    }

    #[test]
    fn chat_messages_give_roles_and_text_in_order() {
        let b = parse(serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "You are terse.", "name": "x"},
                {"content": [{"type": "text", "text": "Hi "}, {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "there"}], "role": "user"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]},
                "not a message", 7
            ]
        }));
        assert_eq!(b.model.as_deref(), Some("m"));
        assert_eq!(
            b.messages.text(),
            "system:You are terse.\nuser:Hi there\nassistant:\n"
        );
        assert_eq!(b.prompt, PromptHead::default());
    }

    #[test]
    fn completion_prompts_and_token_ids() {
        assert_eq!(
            parse(serde_json::json!({"prompt": "Once upon"}))
                .prompt
                .text(),
            "Once upon"
        );
        assert_eq!(
            parse(serde_json::json!({"prompt": ["a", "b"]}))
                .prompt
                .text(),
            "ab"
        );
        assert_eq!(
            parse(serde_json::json!({"prompt": [[1, 2], [3]]}))
                .prompt
                .text(),
            "1,2,3,"
        );
        assert_eq!(
            parse(serde_json::json!({"prompt": {"x": 1}})).prompt.text(),
            ""
        );
    }

    #[test]
    fn only_the_leading_bytes_count_and_keys_are_salted() {
        let long = |tail: &str| {
            let content = format!("{}{tail}", "é".repeat(PREFIX_BYTES));
            parse(serde_json::json!({"messages": [{"role": "user", "content": content}]})).messages
        };
        let (a, b) = (long("first"), long("second"));
        assert!(a.text().len() <= PREFIX_BYTES && a.text().len() > PREFIX_BYTES - 2);
        assert_eq!(
            a.key(b"s"),
            b.key(b"s"),
            "differences after the prefix do not matter"
        );
        let c =
            parse(serde_json::json!({"messages": [{"role": "user", "content": "other"}]})).messages;
        assert_ne!(a.key(b"s"), c.key(b"s"));
        assert_ne!(c.key(b"s"), c.key(b"t"), "the salt changes the key");
        assert_eq!(PromptHead::default().key(b"s"), None);
        // Message boundaries matter: "ab" + "c" is not "a" + "bc".
        let m = |x: &str, y: &str| {
            parse(serde_json::json!({"messages": [{"role": "user", "content": x}, {"role": "user", "content": y}]}))
                .messages
                .key(b"s")
        };
        assert_ne!(m("ab", "c"), m("a", "bc"));
    }

    #[test]
    fn responses_input_and_anthropic_system_read_like_chat() {
        let chat = parse(serde_json::json!({"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"}
        ]}))
        .messages;
        assert_eq!(chat.text(), "system:You are terse.\nuser:Hi\n");

        // Responses: `instructions` (read after `input` here: field order does not matter).
        let b = parse(serde_json::json!({"input": "Hi", "instructions": "You are terse."}));
        let responses = PromptHead::after_system(&b.instructions, &b.input);
        assert_eq!(responses, chat);
        let b = parse(
            serde_json::json!({"instructions": "You are terse.", "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
            ]}),
        );
        assert_eq!(PromptHead::after_system(&b.instructions, &b.input), chat);

        // Anthropic: `system` as a string or as text blocks, then `messages` with content blocks.
        for system in [
            serde_json::json!("You are terse."),
            serde_json::json!([{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]),
        ] {
            let b = parse(serde_json::json!({"system": system, "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
            ]}));
            assert_eq!(PromptHead::after_system(&b.system, &b.messages), chat);
        }

        // No system text: the messages alone; unexpected shapes are skipped, never an error.
        let b = parse(
            serde_json::json!({"input": [{"role": "user", "content": "Hi"}], "system": {"odd": 7}}),
        );
        assert_eq!(
            PromptHead::after_system(&b.system, &b.input).text(),
            "user:Hi\n"
        );
        assert_eq!(
            parse(serde_json::json!({"input": {"odd": true}}))
                .input
                .text(),
            ""
        );
        // The joined head is still cut at PREFIX_BYTES.
        let long = "é".repeat(PREFIX_BYTES);
        let b = parse(serde_json::json!({"instructions": long, "input": "Hi"}));
        assert!(
            PromptHead::after_system(&b.instructions, &b.input)
                .text()
                .len()
                <= PREFIX_BYTES
        );
    }
}
