// Optional capture of prompt and completion text (off by default): extraction from the proxied
// request and response, PII masking before storage, and the region that decides retention.

pub mod extract;
pub mod mask;
pub mod telemetry;

use crate::kernel::duration::HumanDuration;
use crate::kernel::raw_text::RawText;
use http::HeaderMap;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tokenwatch_core::model::CapturedText;

/// File in the data directory holding the masking key (created on first use, mode 0600).
pub const KEY_FILE: &str = "capture-key";

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Store prompts and completions, with personal data masked. Off by default.
    pub text: bool,
    /// Most bytes kept of a prompt, and of a completion; longer text is cut and marked.
    pub max_bytes: usize,
    /// Request header naming the region of the request's data (`eu`, `us` …).
    pub region_header: String,
    /// Region by tenant, for requests without the header.
    pub tenant_regions: BTreeMap<String, String>,
    /// What counts as personal data.
    pub mask: mask::MaskConfig,
    /// Local embeddings of responses (for semantic drift), text not kept.
    pub embeddings: EmbeddingsConfig,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            text: false,
            max_bytes: 32 * 1024,
            region_header: "x-tokenwatch-region".into(),
            tenant_regions: BTreeMap::new(),
            mask: mask::MaskConfig::default(),
            embeddings: EmbeddingsConfig::default(),
        }
    }
}

impl CaptureConfig {
    /// (key path, message) of the first invalid setting.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.max_bytes == 0 {
            return Err(("capture.max_bytes".into(), "must be at least 1".into()));
        }
        if http::HeaderName::from_bytes(self.region_header.as_bytes()).is_err() {
            let m = format!("{:?} is not a valid HTTP header name", self.region_header);
            return Err(("capture.region_header".into(), m));
        }
        for (tenant, region) in &self.tenant_regions {
            if region_name(region).is_none() {
                let m = format!("{region:?} is not a region name (1 to 32 of a-z, 0-9, - and _)");
                return Err((format!("capture.tenant_regions.{tenant}"), m));
            }
        }
        self.embeddings.validate()?;
        match self.mask.validate() {
            Ok(()) => Ok(()),
            Err(mask::MaskError::Invalid { path, message }) => Err((path, message)),
            Err(e) => Err(("capture.mask".into(), e.to_string())),
        }
    }

    /// The region of a request: its header, else its tenant's, else `default`.
    pub fn region_of(&self, headers: &HeaderMap, tenant: &str) -> String {
        headers
            .get(&self.region_header)
            .and_then(|v| v.to_str().ok())
            .and_then(region_name)
            .or_else(|| self.tenant_regions.get(tenant).and_then(|r| region_name(r)))
            .unwrap_or_else(|| tokenwatch_store::DEFAULT_REGION.to_string())
    }
}

/// `capture.embeddings`: embed the responses the proxy sees with a local model.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddingsConfig {
    /// Embed each proxied response's completion text in memory (the text is dropped after,
    /// and stored only when `capture.text` is on). Off by default.
    pub enabled: bool,
    /// Directory of a BERT sentence-embedding model (all-MiniLM-L6-v2 kind):
    /// `model.safetensors`, `config.json`, `tokenizer.json`, optionally
    /// `sentence_bert_config.json`. Required when enabled.
    pub model_dir: Option<PathBuf>,
    /// Most characters of a completion that are embedded (the model reads at most its token
    /// limit, 256 for all-MiniLM-L6-v2, of them).
    pub max_chars: usize,
    /// CPU threads the model may use.
    pub threads: usize,
    /// Responses waiting for the embedder; when full, a response goes on without embedding
    /// (counted in `tokenwatch_embeddings_dropped_total`).
    pub queue_capacity: usize,
}

impl Default for EmbeddingsConfig {
    fn default() -> Self {
        EmbeddingsConfig {
            enabled: false,
            model_dir: None,
            max_chars: 4096,
            threads: 1,
            queue_capacity: 256,
        }
    }
}

impl EmbeddingsConfig {
    /// (key path, message) of the first invalid setting. The model itself is read at startup.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.max_chars == 0 {
            return Err((
                "capture.embeddings.max_chars".into(),
                "must be at least 1".into(),
            ));
        }
        if !(1..=256).contains(&self.threads) {
            return Err((
                "capture.embeddings.threads".into(),
                "must be 1 to 256".into(),
            ));
        }
        if self.queue_capacity == 0 {
            return Err((
                "capture.embeddings.queue_capacity".into(),
                "must be at least 1".into(),
            ));
        }
        if self.enabled && self.model_dir.is_none() {
            return Err((
                "capture.embeddings.model_dir".into(),
                "is required when capture.embeddings.enabled is true".into(),
            ));
        }
        Ok(())
    }
}

/// A region as stored: trimmed, lowercase, 1–32 of `a-z 0-9 - _`; None otherwise.
fn region_name(s: &str) -> Option<String> {
    let r = s.trim().to_ascii_lowercase();
    let ok = (1..=32).contains(&r.len())
        && r.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    ok.then_some(r)
}

/// `retention:` — how long captured text is kept per region.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Region → how long its text is kept; `default` covers every region not listed. Text
    /// never outlives its record (`store.raw_retention`). A configured map replaces the
    /// default one whole.
    pub regions: BTreeMap<String, HumanDuration>,
}

impl Default for RetentionConfig {
    /// The spec's regional retention (§10): EU text 7 days, elsewhere 30.
    fn default() -> RetentionConfig {
        let days = |d: u64| HumanDuration(Duration::from_secs(d * 86_400));
        RetentionConfig {
            regions: BTreeMap::from([
                ("eu".to_string(), days(7)),
                ("default".to_string(), days(30)),
            ]),
        }
    }
}

impl RetentionConfig {
    pub fn text_retention(&self) -> BTreeMap<String, Duration> {
        self.regions
            .iter()
            .map(|(r, d)| (r.trim().to_ascii_lowercase(), d.0))
            .collect()
    }

    pub fn validate(&self) -> Result<(), (String, String)> {
        for (region, keep) in &self.regions {
            if region_name(region).is_none() {
                let m = "a region name is 1 to 32 of a-z, 0-9, - and _".to_string();
                return Err((format!("retention.regions.{region}"), m));
            }
            if keep.0.is_zero() {
                return Err((
                    format!("retention.regions.{region}"),
                    "must be longer than 0".into(),
                ));
            }
        }
        Ok(())
    }
}

/// What becomes of text in received telemetry: content masked with the capture's masker while
/// `capture.text` is on (else dropped), other free text masked while `capture.mask.telemetry` is
/// on (with the same key: a value gives the same token in captured text and in spans).
pub fn telemetry_text(
    cfg: &CaptureConfig,
    capture: Option<&TextCapture>,
    key: Option<&[u8]>,
) -> Result<telemetry::TelemetryText, mask::MaskError> {
    let text = match capture {
        Some(c) => telemetry::TelemetryText::masking(c.masker()),
        None => telemetry::TelemetryText::dropping(),
    };
    if !cfg.mask.telemetry {
        return Ok(text);
    }
    let masker = match (capture, key) {
        (Some(c), _) => c.masker(),
        (None, Some(key)) => std::sync::Arc::new(mask::Masker::new(&cfg.mask, key)?),
        (None, None) => return Err(mask::MaskError::EmptyKey),
    };
    let verbatim = telemetry::Verbatim::new(&cfg.mask.verbatim_attributes);
    Ok(text.masking_others(masker, verbatim))
}

/// The completion text of the response the proxy kept, unmasked (for local embeddings, and
/// masked by `TextCapture::finish` for storage).
pub fn completion_text(raw: &RawText) -> String {
    extract::completion(raw.format, &raw.response_bytes(), raw.event_stream)
}

/// The pipeline's capture stage: turns what the proxy kept into masked, bounded text.
pub struct TextCapture {
    masker: std::sync::Arc<mask::Masker>,
    max_bytes: usize,
}

impl TextCapture {
    pub fn new(cfg: &CaptureConfig, key: &[u8]) -> Result<TextCapture, mask::MaskError> {
        Ok(TextCapture {
            masker: std::sync::Arc::new(mask::Masker::new(&cfg.mask, key)?),
            max_bytes: cfg.max_bytes,
        })
    }

    /// The masker, shared with the OTLP receiver (`telemetry::TelemetryText`).
    pub fn masker(&self) -> std::sync::Arc<mask::Masker> {
        self.masker.clone()
    }

    pub fn finish(&self, raw: &RawText) -> CapturedText {
        let prompt = extract::prompt(&raw.request);
        let completion = completion_text(raw);
        // Masked before the final cut, so that a value the cut crosses (an e-mail address, a
        // card number) is never kept in part: the text is first cut `MASK_MARGIN` bytes past
        // the limit (a huge text is not masked whole), masked, then cut at the limit — a value
        // crossing the first cut lies wholly beyond the limit. Counts include what the margin
        // held.
        let (prompt, prompt_cut) = cut(prompt, self.max_bytes + MASK_MARGIN);
        let (completion, completion_cut) = cut(completion, self.max_bytes + MASK_MARGIN);
        let p = self.masker.mask(&prompt);
        let c = self.masker.mask(&completion);
        let (prompt, prompt_cut_masked) = cut(p.text, self.max_bytes);
        let (completion, completion_cut_masked) = cut(c.text, self.max_bytes);
        let mut masked = p.counts;
        for (kind, n) in c.counts {
            *masked.entry(kind).or_insert(0) += n;
        }
        CapturedText {
            region: raw.region.clone(),
            prompt,
            completion,
            masked,
            truncated: prompt_cut
                || completion_cut
                || prompt_cut_masked
                || completion_cut_masked
                || raw.response_cut(),
        }
    }
}

/// `s` cut to at most `max` bytes at a character boundary; true when it was cut.
/// Bytes past `capture.max_bytes` masked before the final cut (longer than any value masked).
const MASK_MARGIN: usize = 1024;

pub(crate) fn cut(mut s: String, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    (s, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::stream_format::StreamFormat;
    use bytes::Bytes;

    #[test]
    fn region_from_header_then_tenant_then_default() {
        let cfg = CaptureConfig {
            tenant_regions: BTreeMap::from([("acme".to_string(), "EU".to_string())]),
            ..CaptureConfig::default()
        };
        let mut h = HeaderMap::new();
        assert_eq!(cfg.region_of(&h, "someone"), "default");
        assert_eq!(cfg.region_of(&h, "acme"), "eu");
        h.insert("x-tokenwatch-region", " US ".parse().unwrap());
        assert_eq!(cfg.region_of(&h, "acme"), "us");
        h.insert("x-tokenwatch-region", "not a region!".parse().unwrap());
        assert_eq!(
            cfg.region_of(&h, "acme"),
            "eu",
            "an invalid header falls back to the tenant's"
        );
    }

    #[test]
    fn cut_keeps_whole_characters() {
        assert_eq!(cut("héllo".into(), 2), ("h".to_string(), true));
        assert_eq!(cut("héllo".into(), 3), ("hé".to_string(), true));
        assert_eq!(cut("abc".into(), 3), ("abc".to_string(), false));
    }

    #[test]
    fn invalid_settings_name_their_key() {
        let bad = CaptureConfig {
            max_bytes: 0,
            ..CaptureConfig::default()
        };
        assert_eq!(bad.validate().unwrap_err().0, "capture.max_bytes");
        let bad = CaptureConfig {
            tenant_regions: BTreeMap::from([("t".to_string(), "eu west".to_string())]),
            ..CaptureConfig::default()
        };
        assert_eq!(bad.validate().unwrap_err().0, "capture.tenant_regions.t");
        let bad = RetentionConfig {
            regions: BTreeMap::from([("eu".to_string(), HumanDuration(Duration::ZERO))]),
        };
        assert_eq!(bad.validate().unwrap_err().0, "retention.regions.eu");
        let spec = RetentionConfig::default().text_retention();
        assert_eq!(
            (spec["eu"], spec["default"]),
            (
                Duration::from_secs(7 * 86_400),
                Duration::from_secs(30 * 86_400)
            ),
            "the spec's regional defaults"
        );
    }

    #[test]
    fn finish_masks_prompt_and_completion_and_cuts_them() {
        let cfg = CaptureConfig {
            max_bytes: 60,
            ..CaptureConfig::default()
        };
        let capture = TextCapture::new(&cfg, b"key").unwrap();
        let req = br#"{"messages":[{"role":"user","content":"I am ann@example.org"}]}"#;
        let mut raw = RawText::new(StreamFormat::OpenAi, "eu".into(), Bytes::from_static(req));
        raw.event_stream = true;
        raw.push(&Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi ANN@example.org, \"}}]}\n\n",
        ));
        raw.push(&Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"your card 4111111111111111 is fine and this sentence is long\"}}]}\n\n"));
        let t = capture.finish(&raw);
        assert_eq!(t.region, "eu");
        let email = t.prompt.strip_prefix("user: I am ").unwrap();
        assert!(
            email.starts_with("[email:") && email.len() == 24,
            "{}",
            t.prompt
        );
        assert!(
            t.completion
                .starts_with(&format!("Hi {email}, your card [card:")),
            "{}",
            t.completion
        );
        assert!(!t.completion.contains("4111") && !t.prompt.contains("ann@"));
        assert_eq!(t.masked.get("email"), Some(&2));
        assert_eq!(t.masked.get("card"), Some(&1));
        assert!(t.truncated, "the completion was over 60 bytes");
        assert!(t.completion.len() <= 60, "{}", t.completion);
    }

    #[test]
    fn a_value_crossing_the_cut_is_masked_not_kept_in_part() {
        let cfg = CaptureConfig {
            max_bytes: 40,
            ..CaptureConfig::default()
        };
        let capture = TextCapture::new(&cfg, b"key").unwrap();
        // "user: " + 28 bytes, then the address across byte 40, and a card number across it in
        // the completion.
        let req = br#"{"messages":[{"role":"user","content":"please write back to me at judy.pii@example.org today"}]}"#;
        let mut raw = RawText::new(StreamFormat::OpenAi, "eu".into(), Bytes::from_static(req));
        raw.event_stream = true;
        raw.push(&Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"Charged to the card 4111 1111 1111 1111 just now\"}}]}\n\n",
        ));
        let t = capture.finish(&raw);
        for partial in ["judy", "pii@", "4111", "1111"] {
            assert!(
                !t.prompt.contains(partial) && !t.completion.contains(partial),
                "{partial}: {:?} / {:?}",
                t.prompt,
                t.completion
            );
        }
        assert!(t.prompt.len() <= 40 && t.completion.len() <= 40, "{t:?}");
        assert!(t.truncated);
    }
}
