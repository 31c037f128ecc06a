// Prompt and completion text that OpenTelemetry instrumentations put in span attributes and log
// bodies: dropped before storage while text capture is off, masked like captured text when on.

use super::mask::Masker;
use serde_json::{Map, Value};
use std::sync::Arc;

/// Attribute keys that carry prompt or completion text: the GenAI semantic conventions
/// (`gen_ai.input.messages` …), their older indexed form (`gen_ai.prompt.0.content`),
/// OpenInference (`llm.input_messages.0.message.content`, `input.value`).
const CONTENT_KEYS: [&str; 8] = [
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.prompt",
    "gen_ai.completion",
    "llm.prompts",
    "input.value",
    "output.value",
];
const CONTENT_PREFIXES: [&str; 5] = [
    "gen_ai.prompt.",
    "gen_ai.completion.",
    "llm.input_messages",
    "llm.output_messages",
    "llm.prompts.",
];

/// Whether an attribute key carries prompt or completion text.
pub fn is_content_key(key: &str) -> bool {
    CONTENT_KEYS.contains(&key) || CONTENT_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Whether a log event's body is a message's content (`gen_ai.user.message`, `gen_ai.choice`,
/// `gen_ai.client.inference.operation.details` …).
pub fn is_content_event(name: &str) -> bool {
    name.starts_with("gen_ai.")
        && (name.ends_with(".message")
            || name == "gen_ai.choice"
            || name.ends_with(".operation.details"))
}

/// What happens to text found in received telemetry: dropped (capture off) or masked.
#[derive(Clone, Default)]
pub struct TelemetryText {
    masker: Option<Arc<Masker>>,
}

impl TelemetryText {
    /// Capture is off: content attributes and content event bodies are not stored.
    pub fn dropping() -> TelemetryText {
        TelemetryText { masker: None }
    }

    /// Capture is on: their text is stored with personal data masked.
    pub fn masking(masker: Arc<Masker>) -> TelemetryText {
        TelemetryText {
            masker: Some(masker),
        }
    }

    /// A stored attributes object (JSON text) with its content attributes dropped or masked;
    /// anything that is not a JSON object comes back unchanged.
    pub fn attributes(&self, json: String) -> String {
        // Most spans carry no content: skip the parse unless a content key can be in there.
        let maybe = CONTENT_KEYS
            .iter()
            .chain(CONTENT_PREFIXES.iter())
            .any(|k| json.contains(k));
        if !maybe {
            return json;
        }
        let Ok(Value::Object(attrs)) = serde_json::from_str::<Value>(&json) else {
            return json;
        };
        let mut out = Map::with_capacity(attrs.len());
        for (key, value) in attrs {
            match (&self.masker, is_content_key(&key)) {
                (_, false) => {
                    out.insert(key, value);
                }
                (Some(m), true) => {
                    out.insert(key, mask_value(m, value));
                }
                (None, true) => {}
            }
        }
        Value::Object(out).to_string()
    }

    /// A log record's body, given its attributes (JSON text): a content event's body dropped
    /// (empty) or masked; any other body unchanged.
    pub fn log_body(&self, attributes_json: &str, body: String) -> String {
        if body.is_empty() || !attributes_json.contains("gen_ai.") {
            return body;
        }
        let event = serde_json::from_str::<Value>(attributes_json)
            .ok()
            .and_then(|v| {
                v.get("event.name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        match (event.as_deref().is_some_and(is_content_event), &self.masker) {
            (false, _) => body,
            (true, Some(m)) => m.mask(&body).text,
            (true, None) => String::new(),
        }
    }
}

/// Every string inside `v` masked (keys kept).
fn mask_value(m: &Masker, v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(m.mask(&s).text),
        Value::Array(items) => Value::Array(items.into_iter().map(|x| mask_value(m, x)).collect()),
        Value::Object(o) => {
            Value::Object(o.into_iter().map(|(k, x)| (k, mask_value(m, x))).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::mask::MaskConfig;

    const ATTRS: &str = r#"{"gen_ai.operation.name":"chat","gen_ai.request.model":"m","gen_ai.input.messages":"[{\"role\":\"user\",\"parts\":[{\"type\":\"text\",\"content\":\"mail ann@example.org\"}]}]","gen_ai.prompt.0.content":"call +44 20 7946 0958","llm.input_messages.0.message.content":"ann@example.org","gen_ai.usage.input_tokens":12}"#;

    fn masker() -> Arc<Masker> {
        Arc::new(Masker::new(&MaskConfig::default(), b"k").unwrap())
    }

    #[test]
    fn content_keys_and_events() {
        for k in [
            "gen_ai.input.messages",
            "gen_ai.prompt.3.content",
            "llm.output_messages.0.message.content",
            "input.value",
        ] {
            assert!(is_content_key(k), "{k}");
        }
        for k in [
            "gen_ai.request.model",
            "gen_ai.usage.input_tokens",
            "gen_ai.prompt_version",
            "llm.model_name",
        ] {
            assert!(!is_content_key(k), "{k}");
        }
        assert!(is_content_event("gen_ai.user.message") && is_content_event("gen_ai.choice"));
        assert!(!is_content_event("gen_ai.evaluation.result") && !is_content_event("exception"));
    }

    #[test]
    fn dropped_when_capture_is_off() {
        let out: Value =
            serde_json::from_str(&TelemetryText::dropping().attributes(ATTRS.into())).unwrap();
        let keys: Vec<&str> = out
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys.len(), 3, "{out}");
        assert_eq!(out["gen_ai.usage.input_tokens"], 12);
        assert_eq!(out["gen_ai.request.model"], "m");
        let plain = r#"{"http.route":"/x"}"#.to_string();
        assert_eq!(TelemetryText::dropping().attributes(plain.clone()), plain);
    }

    #[test]
    fn masked_when_capture_is_on() {
        let text = TelemetryText::masking(masker()).attributes(ATTRS.into());
        assert!(
            !text.contains("ann@example.org") && !text.contains("7946"),
            "{text}"
        );
        let out: Value = serde_json::from_str(&text).unwrap();
        assert!(
            out["gen_ai.input.messages"]
                .as_str()
                .unwrap()
                .contains("mail [email:"),
            "{out}"
        );
        assert!(
            out["gen_ai.prompt.0.content"]
                .as_str()
                .unwrap()
                .starts_with("call [phone:"),
            "{out}"
        );
        assert_eq!(out["gen_ai.usage.input_tokens"], 12);
    }

    #[test]
    fn content_event_bodies() {
        let user = r#"{"event.name":"gen_ai.user.message","gen_ai.system":"openai"}"#;
        let other = r#"{"event.name":"gen_ai.evaluation.result"}"#;
        let body = "write to ann@example.org".to_string();
        assert_eq!(TelemetryText::dropping().log_body(user, body.clone()), "");
        assert_eq!(
            TelemetryText::dropping().log_body(other, body.clone()),
            body
        );
        assert_eq!(TelemetryText::dropping().log_body("{}", body.clone()), body);
        let masked = TelemetryText::masking(masker()).log_body(user, body);
        assert!(masked.starts_with("write to [email:"), "{masked}");
    }
}
