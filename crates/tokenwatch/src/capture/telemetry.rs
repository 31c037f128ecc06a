// Text in received telemetry before storage: prompt and completion text that OpenTelemetry
// instrumentations put in span attributes and log bodies — dropped while text capture is off,
// masked like captured text when on — and every other free text (span names, status messages,
// log bodies, attribute values not kept verbatim), masked while `capture.mask.telemetry` is on.
// The OTLP mapping asks, attribute by attribute, what becomes of a value (`attribute`).

use super::mask::Masker;
use std::sync::Arc;

/// Attribute keys that carry prompt or completion text: the GenAI semantic conventions
/// (`gen_ai.input.messages` …), their older indexed form (`gen_ai.prompt.0.content`),
/// OpenInference (`llm.input_messages.0.message.content`, `input.value`), OpenLLMetry
/// (`traceloop.entity.input`).
const CONTENT_KEYS: [&str; 10] = [
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.prompt",
    "gen_ai.completion",
    "llm.prompts",
    "input.value",
    "output.value",
    "traceloop.entity.input",
    "traceloop.entity.output",
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

/// What happens to text found in received telemetry before it is stored: prompt and completion
/// text dropped (capture off) or masked (capture on); every other free text — span names, status
/// messages, log bodies, attribute values whose keys are not kept verbatim — masked while
/// `capture.mask.telemetry` is on.
#[derive(Clone, Default)]
pub struct TelemetryText {
    /// Capture is on: content is masked with it; None: content is dropped.
    content: Option<Arc<Masker>>,
    /// `capture.mask.telemetry`: other free text is masked with it.
    others: Option<Arc<OtherText>>,
}

struct OtherText {
    masker: Arc<Masker>,
    verbatim: Verbatim,
    /// What each attribute key is, remembered: keys repeat across every span of an export, and
    /// deciding (content keys, the verbatim set and prefixes) cost more than the lookup (OTLP
    /// bench: ~1 µs of a span's ~14 attributes). At most `KEY_CACHE` keys (keys come from input).
    kinds: std::sync::Mutex<std::collections::HashMap<String, KeyKind>>,
}

/// Keys whose kind is remembered at most (beyond, a key's kind is decided each time).
const KEY_CACHE: usize = 4096;

#[derive(Clone, Copy)]
enum KeyKind {
    Content,
    Verbatim,
    Other,
}

impl OtherText {
    fn kind_of(&self, key: &str) -> KeyKind {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = kinds.get(key) {
            return *k;
        }
        let kind = if is_content_key(key) {
            KeyKind::Content
        } else if self.verbatim.contains(key) {
            KeyKind::Verbatim
        } else {
            KeyKind::Other
        };
        if kinds.len() < KEY_CACHE {
            kinds.insert(key.to_string(), kind);
        }
        kind
    }
}

/// Attribute keys stored as sent (`capture.mask.verbatim_attributes`).
#[derive(Debug, Clone, Default)]
pub struct Verbatim {
    keys: std::collections::HashSet<String>,
    prefixes: Vec<String>,
}

impl Verbatim {
    /// From the configured list (checked by `MaskConfig::validate`): `key`, or `prefix*`.
    pub fn new(list: &[String]) -> Verbatim {
        let mut v = Verbatim::default();
        for k in list {
            match k.strip_suffix('*') {
                Some(prefix) => v.prefixes.push(prefix.to_string()),
                None => {
                    v.keys.insert(k.clone());
                }
            }
        }
        v
    }

    pub fn contains(&self, key: &str) -> bool {
        self.keys.contains(key) || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }
}

/// What becomes of one attribute's value.
#[derive(Clone, Copy)]
pub enum AttributeText<'a> {
    /// Stored as sent.
    Keep,
    /// Not stored (content while capture is off).
    Drop,
    /// Every string inside it masked.
    Mask(&'a Masker),
}

impl TelemetryText {
    /// Capture is off and other text is not masked: content attributes and content event
    /// bodies are not stored, everything else is stored as sent.
    pub fn dropping() -> TelemetryText {
        TelemetryText::default()
    }

    /// Capture is on: content is stored with personal data masked.
    pub fn masking(masker: Arc<Masker>) -> TelemetryText {
        TelemetryText {
            content: Some(masker),
            others: None,
        }
    }

    /// Other free text masked too (`capture.mask.telemetry`), attributes under `verbatim` kept.
    pub fn masking_others(mut self, masker: Arc<Masker>, verbatim: Verbatim) -> TelemetryText {
        self.others = Some(Arc::new(OtherText {
            masker,
            verbatim,
            kinds: Default::default(),
        }));
        self
    }

    /// The masker of other free text, when it is masked (tailed log lines use it too).
    pub fn others_masker(&self) -> Option<Arc<Masker>> {
        self.others.as_ref().map(|o| o.masker.clone())
    }

    /// What becomes of the value of attribute `key`.
    pub fn attribute(&self, key: &str) -> AttributeText<'_> {
        let kind = match &self.others {
            Some(o) => o.kind_of(key),
            None if is_content_key(key) => KeyKind::Content,
            None => KeyKind::Verbatim,
        };
        match (kind, &self.content, &self.others) {
            (KeyKind::Content, Some(m), _) => AttributeText::Mask(m),
            (KeyKind::Content, None, _) => AttributeText::Drop,
            (KeyKind::Other, _, Some(o)) => AttributeText::Mask(&o.masker),
            _ => AttributeText::Keep,
        }
    }

    /// Free text other than content (a span name, a status message, a log body): masked when
    /// other text is masked, else as it came.
    pub fn free_text(&self, text: String) -> String {
        match &self.others {
            Some(o) => o.masker.mask_free_text(&text).unwrap_or(text),
            None => text,
        }
    }

    /// A log record's body, given its `event.name`: a content event's body dropped (empty) or
    /// masked as content; any other body as free text.
    pub fn log_body(&self, event_name: Option<&str>, body: String) -> String {
        if body.is_empty() {
            return body;
        }
        match (event_name.is_some_and(is_content_event), &self.content) {
            (false, _) => self.free_text(body),
            (true, Some(m)) => m.mask(&body).text,
            (true, None) => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::mask::{MaskConfig, default_verbatim_attributes};

    fn masker() -> Arc<Masker> {
        Arc::new(Masker::new(&MaskConfig::default(), b"k").unwrap())
    }

    fn others() -> TelemetryText {
        TelemetryText::dropping()
            .masking_others(masker(), Verbatim::new(&default_verbatim_attributes()))
    }

    fn decision(t: &TelemetryText, key: &str) -> &'static str {
        match t.attribute(key) {
            AttributeText::Keep => "keep",
            AttributeText::Drop => "drop",
            AttributeText::Mask(_) => "mask",
        }
    }

    #[test]
    fn content_keys_and_events() {
        for k in [
            "gen_ai.input.messages",
            "gen_ai.prompt.3.content",
            "llm.output_messages.0.message.content",
            "input.value",
            "traceloop.entity.input",
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
    fn what_becomes_of_each_attribute() {
        // Capture off, other text stored as sent: content dropped, the rest kept.
        let plain = TelemetryText::dropping();
        assert_eq!(decision(&plain, "gen_ai.input.messages"), "drop");
        assert_eq!(decision(&plain, "user.email"), "keep");
        // Capture on: content masked.
        let capture = TelemetryText::masking(masker());
        assert_eq!(decision(&capture, "gen_ai.prompt.0.content"), "mask");
        assert_eq!(decision(&capture, "user.email"), "keep");
        // Other text masked: everything not kept verbatim is masked; content still dropped.
        let t = others();
        for k in [
            "user.email",
            "traceloop.association.properties.user",
            "client.address",
        ] {
            assert_eq!(decision(&t, k), "mask", "{k}");
        }
        for k in [
            "gen_ai.request.model",
            "gen_ai.usage.input_tokens",
            "http.route",
            "server.address",
            "k8s.pod.name",
            "tokenwatch.request_id",
        ] {
            assert_eq!(decision(&t, k), "keep", "{k}");
        }
        assert_eq!(decision(&t, "traceloop.entity.output"), "drop");
        // Decisions are remembered for a bounded number of keys; past it, still decided.
        for i in 0..(KEY_CACHE + 100) {
            assert_eq!(decision(&t, &format!("app.k{i}")), "mask");
        }
        assert_eq!(decision(&t, "gen_ai.request.model"), "keep");
        assert_eq!(decision(&t, "service.version"), "keep");
        assert_eq!(decision(&t, "gen_ai.input.messages"), "drop");
        let both = TelemetryText::masking(masker()).masking_others(
            masker(),
            Verbatim::new(&["a.*".to_string(), "b".to_string()]),
        );
        assert_eq!(decision(&both, "gen_ai.input.messages"), "mask");
        assert_eq!(decision(&both, "a.x"), "keep");
        assert_eq!(decision(&both, "b"), "keep");
        assert_eq!(decision(&both, "bb"), "mask");
    }

    #[test]
    fn free_text_is_masked_only_when_asked() {
        let name = "lookup ann@example.org from 10.1.2.3".to_string();
        assert_eq!(TelemetryText::dropping().free_text(name.clone()), name);
        let masked = others().free_text(name);
        assert!(
            masked.starts_with("lookup [email:") && masked.contains(" from [ipv4:"),
            "{masked}"
        );
        assert_eq!(others().free_text("chat gpt-4o".into()), "chat gpt-4o");
    }

    #[test]
    fn log_bodies() {
        let body = "write to ann@example.org".to_string();
        let user = Some("gen_ai.user.message");
        let other = Some("gen_ai.evaluation.result");
        let plain = TelemetryText::dropping();
        assert_eq!(plain.log_body(user, body.clone()), "");
        assert_eq!(plain.log_body(other, body.clone()), body);
        assert_eq!(plain.log_body(None, body.clone()), body);
        let masked = TelemetryText::masking(masker()).log_body(user, body.clone());
        assert!(masked.starts_with("write to [email:"), "{masked}");
        // Other text masked: a plain log line too; a content event still dropped without capture.
        let t = others();
        let masked = t.log_body(None, "card 4111 1111 1111 1111 declined".into());
        assert!(
            masked.starts_with("card [card:") && masked.ends_with("] declined"),
            "{masked}"
        );
        assert_eq!(t.log_body(user, body), "");
    }
}
