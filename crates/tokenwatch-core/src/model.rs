// The data model shared by every pipeline stage: request records, series labels,
// context-length buckets and the latency metrics the aggregator keeps (spec section 2).

use serde::{Deserialize, Serialize};
use std::fmt;

/// `model_id` of a request whose model could not be read (no `model` in its body or answer).
pub const UNKNOWN_MODEL: &str = "unknown";

/// The normalised label set of a series (spec section 2). Free-form ids never become labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct SeriesLabels {
    pub model_id: String,
    pub runtime: String,
    pub instance: String,
    pub tenant: String,
    pub ab_group: String,
    pub model_version: String,
}

/// The first content token of a streamed response, reported when it arrives rather than when
/// the response ends: time-to-first-token detectors need not wait for the whole (possibly slow)
/// answer. The request's record, later, carries the same `first_token_s`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FirstToken {
    pub request_id: String,
    pub model_id: String,
    pub instance: String,
    /// Wall-clock arrival at the proxy, milliseconds since the Unix epoch.
    pub arrival_unix_ms: i64,
    /// Seconds from arrival to the first content token.
    pub first_token_s: f64,
}

/// A label a query may group by (`by=` in the API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupLabel {
    ModelId,
    Runtime,
    Instance,
    Tenant,
    AbGroup,
    ModelVersion,
    ContextBucket,
}

impl GroupLabel {
    pub const ALL: [GroupLabel; 7] = [
        GroupLabel::ModelId,
        GroupLabel::Runtime,
        GroupLabel::Instance,
        GroupLabel::Tenant,
        GroupLabel::AbGroup,
        GroupLabel::ModelVersion,
        GroupLabel::ContextBucket,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GroupLabel::ModelId => "model_id",
            GroupLabel::Runtime => "runtime",
            GroupLabel::Instance => "instance",
            GroupLabel::Tenant => "tenant",
            GroupLabel::AbGroup => "ab_group",
            GroupLabel::ModelVersion => "model_version",
            GroupLabel::ContextBucket => "context_bucket",
        }
    }

    pub fn parse(s: &str) -> Option<GroupLabel> {
        GroupLabel::ALL.into_iter().find(|l| l.name() == s)
    }

    /// The value of this label for a series in a given context bucket.
    pub fn value_of(self, labels: &SeriesLabels, bucket: ContextBucket) -> &str {
        match self {
            GroupLabel::ModelId => &labels.model_id,
            GroupLabel::Runtime => &labels.runtime,
            GroupLabel::Instance => &labels.instance,
            GroupLabel::Tenant => &labels.tenant,
            GroupLabel::AbGroup => &labels.ab_group,
            GroupLabel::ModelVersion => &labels.model_version,
            GroupLabel::ContextBucket => bucket.name(),
        }
    }
}

/// Prompt-length buckets (spec section 3): latency is read per context length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextBucket {
    Le512,
    Le1024,
    Le2048,
    Le4096,
    Gt4096,
    /// Prompt length not known (no usage reported and not counted).
    Unknown,
}

impl ContextBucket {
    pub const ALL: [ContextBucket; 6] = [
        ContextBucket::Le512,
        ContextBucket::Le1024,
        ContextBucket::Le2048,
        ContextBucket::Le4096,
        ContextBucket::Gt4096,
        ContextBucket::Unknown,
    ];

    pub fn of(prompt_tokens: Option<u64>) -> ContextBucket {
        match prompt_tokens {
            None => ContextBucket::Unknown,
            Some(n) if n <= 512 => ContextBucket::Le512,
            Some(n) if n <= 1024 => ContextBucket::Le1024,
            Some(n) if n <= 2048 => ContextBucket::Le2048,
            Some(n) if n <= 4096 => ContextBucket::Le4096,
            Some(_) => ContextBucket::Gt4096,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ContextBucket::Le512 => "le512",
            ContextBucket::Le1024 => "le1024",
            ContextBucket::Le2048 => "le2048",
            ContextBucket::Le4096 => "le4096",
            ContextBucket::Gt4096 => "gt4096",
            ContextBucket::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<ContextBucket> {
        ContextBucket::ALL.into_iter().find(|b| b.name() == s)
    }
}

/// The latency signals kept as sketches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyMetric {
    /// Time to first token: arrival at the proxy to the first content-bearing chunk.
    Ttft,
    /// Inter-token latency: every gap between consecutive content-bearing chunks.
    Itl,
    /// End to end: arrival to the last byte of the response.
    E2e,
    /// Queue time reported by the upstream (`x-queue-time` header, milliseconds).
    Queue,
}

impl LatencyMetric {
    pub const ALL: [LatencyMetric; 4] = [
        LatencyMetric::Ttft,
        LatencyMetric::Itl,
        LatencyMetric::E2e,
        LatencyMetric::Queue,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LatencyMetric::Ttft => "ttft",
            LatencyMetric::Itl => "itl",
            LatencyMetric::E2e => "e2e",
            LatencyMetric::Queue => "queue",
        }
    }

    pub fn parse(s: &str) -> Option<LatencyMetric> {
        LatencyMetric::ALL.into_iter().find(|m| m.name() == s)
    }
}

impl fmt::Display for LatencyMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a request failed, if it did. Stored as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The upstream refused the connection or could not be reached.
    UpstreamConnect,
    /// The upstream closed or reset the connection before or during the response.
    UpstreamReset,
    /// The upstream did not answer (headers or next chunk) within the configured timeout.
    UpstreamTimeout,
    /// The upstream answered with a 5xx status.
    #[serde(rename = "upstream_5xx")]
    Upstream5xx,
    /// The upstream answered with a 4xx status.
    #[serde(rename = "upstream_4xx")]
    Upstream4xx,
    /// The upstream's event stream could not be parsed.
    MalformedSse,
    /// The client went away before the response ended.
    ClientCancelled,
    /// No upstream is configured for the requested model.
    NoRoute,
    /// The request itself could not be read (bad JSON body, too large).
    BadRequest,
}

impl ErrorClass {
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::UpstreamConnect => "upstream_connect",
            ErrorClass::UpstreamReset => "upstream_reset",
            ErrorClass::UpstreamTimeout => "upstream_timeout",
            ErrorClass::Upstream5xx => "upstream_5xx",
            ErrorClass::Upstream4xx => "upstream_4xx",
            ErrorClass::MalformedSse => "malformed_sse",
            ErrorClass::ClientCancelled => "client_cancelled",
            ErrorClass::NoRoute => "no_route",
            ErrorClass::BadRequest => "bad_request",
        }
    }

    pub const ALL: [ErrorClass; 9] = [
        ErrorClass::UpstreamConnect,
        ErrorClass::UpstreamReset,
        ErrorClass::UpstreamTimeout,
        ErrorClass::Upstream5xx,
        ErrorClass::Upstream4xx,
        ErrorClass::MalformedSse,
        ErrorClass::ClientCancelled,
        ErrorClass::NoRoute,
        ErrorClass::BadRequest,
    ];

    pub fn parse(s: &str) -> Option<ErrorClass> {
        ErrorClass::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// Summary of the gaps between consecutive content-bearing chunks of one response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct GapSummary {
    pub count: u32,
    pub mean_s: f64,
    pub max_s: f64,
}

/// One request seen by a source (the proxy today). Times are offsets from `arrival_unix_ms`
/// so the record is cheap to build on the hot path; absolute wall-clock only at arrival.
/// Prompt and completion text are stored only when text capture is on, masked (`text`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct RequestRecord {
    pub request_id: String,
    pub trace_id: String,
    #[serde(flatten)]
    pub labels: SeriesLabels,
    pub prompt_version: String,
    /// Request path, e.g. `/v1/chat/completions`.
    pub endpoint: String,
    pub stream: bool,
    /// Wall-clock arrival at the proxy, milliseconds since the Unix epoch.
    pub arrival_unix_ms: i64,
    /// Seconds from arrival to the upstream's response headers.
    pub upstream_headers_s: Option<f64>,
    /// Seconds from arrival to the first content-bearing chunk (streams only).
    pub first_token_s: Option<f64>,
    /// Seconds from arrival to the end of the response (or of the failure).
    pub end_s: f64,
    /// Queue time the upstream reported (`x-queue-time`), seconds.
    pub queue_s: Option<f64>,
    /// Arrival of every content-bearing chunk, microseconds after `arrival`.
    pub chunk_offsets_us: Vec<u32>,
    pub gaps: GapSummary,
    pub prompt_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Of `output_tokens`, the reasoning (thinking) tokens, when the upstream reported them
    /// (`completion_tokens_details.reasoning_tokens` / `output_tokens_details.reasoning_tokens`).
    #[serde(default)]
    pub reasoning_tokens: Option<u64>,
    /// Of `prompt_tokens`, the tokens the upstream read from its prompt cache, when it reported
    /// them (`prompt_tokens_details.cached_tokens`, `input_tokens_details.cached_tokens`,
    /// Anthropic's `cache_read_input_tokens`, GenAI `gen_ai.usage.cache_read.input_tokens`).
    #[serde(default)]
    pub cached_input_tokens: Option<u64>,
    /// What the request cost in US dollars at the configured price table (`pricing`), set by
    /// the pipeline; None when its model (or upstream) has no price.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// True when token counts came from `usage`; false when counted from chunks.
    pub tokens_from_usage: bool,
    pub finish_reason: String,
    /// HTTP status the client received.
    pub status: u16,
    pub error_class: Option<ErrorClass>,
    /// Embedding of the response, when one was reported (OTLP attribute
    /// `tokenwatch.output.embedding` or `POST /api/v1/embeddings`); empty = none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub embedding: Vec<f32>,
    /// Prefix-cache key: a 64-bit hash of the prompt's leading bytes (never the text), written
    /// in JSON as 16 lowercase hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "prefix_hex")]
    pub prefix_key: Option<u64>,
    /// Prompt and completion text, only when text capture is on (`capture.text`), with personal
    /// data already replaced by keyed hashes: the pipeline masks it before any sink sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Box<CapturedText>>,
    /// What the proxy's own span of this request needs beyond the fields above (empty for
    /// records not made by the proxy). Not stored with the record: the span is stored as a span.
    #[serde(default, skip_serializing_if = "ProxySpan::is_empty")]
    pub span: ProxySpan,
}

/// The proxy's span of one request (W3C ids as lowercase hex): its own id, which the upstream
/// received as the parent in `traceparent`, the caller's span id when the caller sent a
/// `traceparent`, and the model the response named. Built into a span off the proxy's threads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ProxySpan {
    /// 16 hex digits; empty: the record was not made by the proxy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub span_id: String,
    /// The caller's span (16 hex digits); empty: the proxy's span is the trace's root.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent_span_id: String,
    /// `model` of the response, when it named one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub response_model: String,
}

impl ProxySpan {
    pub fn is_empty(&self) -> bool {
        self.span_id.is_empty() && self.parent_span_id.is_empty() && self.response_model.is_empty()
    }
}

/// The text of one request as stored: masked, cut to the configured size, with its region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CapturedText {
    /// Decides how long the text is kept (`retention.regions`); `default` when none applies.
    pub region: String,
    /// The prompt as the model saw it: messages (`role: content` lines), prompt or input.
    pub prompt: String,
    /// The generated text: answer and reasoning, as streamed or returned.
    pub completion: String,
    /// Personal data replaced, by kind (`email`, `phone`, `card`, …): how many of each.
    #[serde(default)]
    pub masked: std::collections::BTreeMap<String, u32>,
    /// True when the prompt or completion was cut at `capture.max_bytes`.
    #[serde(default)]
    pub truncated: bool,
}

/// `prefix_key` in JSON: 16 lowercase hex digits (a u64 does not fit a JavaScript number).
mod prefix_hex {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(k) => s.serialize_str(&format!("{k:016x}")),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(h) => parse(&h).map(Some).ok_or_else(|| {
                D::Error::custom(format!("prefix_key {h:?} is not 1 to 16 hex digits"))
            }),
        }
    }

    /// 1 to 16 hex digits.
    pub fn parse(h: &str) -> Option<u64> {
        if h.is_empty() || h.len() > 16 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(h, 16).ok()
    }
}

/// Parse a prefix key written as 1 to 16 hex digits (as `prefix_key` is in JSON).
pub fn parse_prefix_key(hex: &str) -> Option<u64> {
    prefix_hex::parse(hex)
}

impl RequestRecord {
    pub fn context_bucket(&self) -> ContextBucket {
        ContextBucket::of(self.prompt_tokens)
    }

    /// Time per output token after the first (OpenTelemetry `time_per_output_token`).
    pub fn time_per_output_token_s(&self) -> Option<f64> {
        let first = self.first_token_s?;
        let n = self.output_tokens?;
        if n < 2 {
            return None;
        }
        let last = self
            .chunk_offsets_us
            .last()
            .map(|us| *us as f64 / 1e6)
            .unwrap_or(self.end_s);
        Some(((last - first).max(0.0)) / (n - 1) as f64)
    }

    /// Summarise the inter-chunk gaps (count, mean, max) from `chunk_offsets_us`; left as it
    /// is when there is no gap.
    pub fn summarize_gaps(&mut self) {
        let gaps: Vec<f64> = self.gaps_s().collect();
        if !gaps.is_empty() {
            let sum: f64 = gaps.iter().sum();
            self.gaps = GapSummary {
                count: gaps.len() as u32,
                mean_s: sum / gaps.len() as f64,
                max_s: gaps.iter().copied().fold(0.0, f64::max),
            };
        }
    }

    /// Every inter-chunk gap, in seconds.
    pub fn gaps_s(&self) -> impl Iterator<Item = f64> + '_ {
        self.chunk_offsets_us
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]) as f64 / 1e6)
    }

    pub fn is_success(&self) -> bool {
        self.error_class.is_none() && self.status < 400
    }

    /// A failure of the serving side, which counts against a success-rate SLO. Client errors
    /// (4xx, an unreadable request) and clients that went away do not.
    pub fn is_server_failure(&self) -> bool {
        match self.error_class {
            Some(
                ErrorClass::Upstream4xx | ErrorClass::BadRequest | ErrorClass::ClientCancelled,
            ) => false,
            Some(_) => true,
            None => self.status >= 500,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_buckets_follow_the_spec_edges() {
        assert_eq!(ContextBucket::of(Some(512)), ContextBucket::Le512);
        assert_eq!(ContextBucket::of(Some(513)), ContextBucket::Le1024);
        assert_eq!(ContextBucket::of(Some(4096)), ContextBucket::Le4096);
        assert_eq!(ContextBucket::of(Some(4097)), ContextBucket::Gt4096);
        assert_eq!(ContextBucket::of(None), ContextBucket::Unknown);
        for b in ContextBucket::ALL {
            assert_eq!(ContextBucket::parse(b.name()), Some(b));
        }
    }

    #[test]
    fn only_serving_side_failures_count_against_the_slo() {
        let mut r = RequestRecord {
            status: 200,
            ..Default::default()
        };
        assert!(!r.is_server_failure());
        r.status = 400;
        r.error_class = Some(ErrorClass::Upstream4xx);
        assert!(!r.is_server_failure() && !r.is_success());
        r.error_class = Some(ErrorClass::ClientCancelled);
        assert!(!r.is_server_failure());
        r.status = 503;
        r.error_class = Some(ErrorClass::Upstream5xx);
        assert!(r.is_server_failure());
        r.status = 200;
        r.error_class = Some(ErrorClass::MalformedSse);
        assert!(r.is_server_failure());
    }

    #[test]
    fn error_class_names_match_serde() {
        for c in ErrorClass::ALL {
            assert_eq!(
                serde_json::to_value(c).unwrap(),
                serde_json::Value::String(c.name().into())
            );
            assert_eq!(ErrorClass::parse(c.name()), Some(c));
        }
    }

    #[test]
    fn embedding_and_prefix_key_round_trip_through_json() {
        let r = RequestRecord {
            embedding: vec![0.5, -1.25],
            prefix_key: Some(0xfedc_ba98_7654_3210),
            ..Default::default()
        };
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["prefix_key"], "fedcba9876543210");
        assert_eq!(j["embedding"], serde_json::json!([0.5, -1.25]));
        assert_eq!(serde_json::from_value::<RequestRecord>(j).unwrap(), r);
        let bare = serde_json::to_value(RequestRecord::default()).unwrap();
        assert!(bare.get("embedding").is_none() && bare.get("prefix_key").is_none());
        assert_eq!(
            serde_json::from_value::<RequestRecord>(bare).unwrap(),
            RequestRecord::default()
        );
        assert_eq!(parse_prefix_key("00ff"), Some(255));
        for bad in ["", "xyz", "12345678901234567", "-1", "+1"] {
            assert_eq!(parse_prefix_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn time_per_output_token_uses_last_chunk() {
        let r = RequestRecord {
            first_token_s: Some(0.5),
            output_tokens: Some(11),
            chunk_offsets_us: vec![500_000, 1_500_000],
            end_s: 2.0,
            ..Default::default()
        };
        assert!((r.time_per_output_token_s().unwrap() - 0.1).abs() < 1e-9);
        assert_eq!(r.gaps_s().collect::<Vec<_>>(), vec![1.0]);
    }
}
