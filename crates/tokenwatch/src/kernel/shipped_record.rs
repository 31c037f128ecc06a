// The request record as a proxy replica ships it (`role: proxy`): the `tokenwatch.record.*`
// span attributes that carry, beside the GenAI attributes of the proxy's span, every field an
// aggregator needs to rebuild the exact record the proxy made — written here (the pipeline's
// span builder) and read back here (the OTLP receiver), so the two sides cannot drift apart.

//! What the GenAI attributes of the proxy's span already carry exactly (and the receiver reads
//! as any GenAI span): arrival (the span's start, whole milliseconds), end, stream flag, time to
//! first token (`gen_ai.response.time_to_first_chunk`, an f64), tokens, reasoning tokens, finish
//! reason, endpoint (`url.path`), tenant, A/B group, model version, the prompt version
//! (`tokenwatch.prompt.version`), the prefix-cache key (`tokenwatch.prompt.prefix_hash`) and the
//! response's embedding (`tokenwatch.output.embedding`). What they do not, added here:
//!
//! | attribute | record field |
//! |---|---|
//! | `tokenwatch.record.schema` (int, 1) | marks a shipped record: the fields below override the GenAI reading |
//! | `tokenwatch.request_id` | `request_id` (the proxy's `x-request-id`; a received span's id otherwise) |
//! | `tokenwatch.record.model_id` | `model_id` (after alias resolution) |
//! | `tokenwatch.record.runtime` | `runtime` (may be empty) |
//! | `tokenwatch.record.instance` | `instance` (the upstream's label, not `server.address:port`) |
//! | `tokenwatch.record.status` (int) | `status` the client received |
//! | `tokenwatch.record.error_class` | `error_class` (its snake_case name), absent: none |
//! | `tokenwatch.record.upstream_headers_s` (double) | `upstream_headers_s` |
//! | `tokenwatch.record.queue_s` (double) | `queue_s` |
//! | `tokenwatch.record.chunk_offsets_us` (int array) | `chunk_offsets_us`: every content chunk's arrival, µs after arrival (the inter-token latencies) |
//! | `tokenwatch.record.tokens_from_usage` (bool) | `tokens_from_usage` |
//!
//! Captured text (`capture.text`) is never shipped.

use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};
use tokenwatch_core::model::{ErrorClass, RequestRecord};

/// The version of this mapping; a span naming another version is read as a plain GenAI span.
pub const SCHEMA: i64 = 1;
pub const SCHEMA_ATTR: &str = "tokenwatch.record.schema";
pub const REQUEST_ID_ATTR: &str = "tokenwatch.request_id";
pub const MODEL_ID_ATTR: &str = "tokenwatch.record.model_id";
pub const RUNTIME_ATTR: &str = "tokenwatch.record.runtime";
pub const INSTANCE_ATTR: &str = "tokenwatch.record.instance";
pub const STATUS_ATTR: &str = "tokenwatch.record.status";
pub const ERROR_CLASS_ATTR: &str = "tokenwatch.record.error_class";
pub const UPSTREAM_HEADERS_ATTR: &str = "tokenwatch.record.upstream_headers_s";
pub const QUEUE_ATTR: &str = "tokenwatch.record.queue_s";
pub const CHUNK_OFFSETS_ATTR: &str = "tokenwatch.record.chunk_offsets_us";
pub const TOKENS_FROM_USAGE_ATTR: &str = "tokenwatch.record.tokens_from_usage";
/// Read by the receiver as any GenAI span's (see `sources::otlp::genai`); written here.
pub const PROMPT_VERSION_ATTR: &str = "tokenwatch.prompt.version";
pub const PREFIX_HASH_ATTR: &str = "tokenwatch.prompt.prefix_hash";
pub const EMBEDDING_ATTR: &str = "tokenwatch.output.embedding";

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn array(values: impl Iterator<Item = Value>) -> Value {
    Value::ArrayValue(ArrayValue {
        values: values.map(|v| AnyValue { value: Some(v) }).collect(),
    })
}

/// The attributes a shipped span adds to the proxy's span of `r` (its GenAI attributes).
pub fn attributes(r: &RequestRecord) -> Vec<KeyValue> {
    let mut a = Vec::with_capacity(14);
    a.push(kv(SCHEMA_ATTR, Value::IntValue(SCHEMA)));
    a.push(kv(
        MODEL_ID_ATTR,
        Value::StringValue(r.labels.model_id.clone()),
    ));
    a.push(kv(
        RUNTIME_ATTR,
        Value::StringValue(r.labels.runtime.clone()),
    ));
    a.push(kv(
        INSTANCE_ATTR,
        Value::StringValue(r.labels.instance.clone()),
    ));
    a.push(kv(STATUS_ATTR, Value::IntValue(i64::from(r.status))));
    if let Some(class) = r.error_class {
        a.push(kv(
            ERROR_CLASS_ATTR,
            Value::StringValue(class.name().into()),
        ));
    }
    if let Some(s) = r.upstream_headers_s {
        a.push(kv(UPSTREAM_HEADERS_ATTR, Value::DoubleValue(s)));
    }
    if let Some(s) = r.queue_s {
        a.push(kv(QUEUE_ATTR, Value::DoubleValue(s)));
    }
    if !r.chunk_offsets_us.is_empty() {
        a.push(kv(
            CHUNK_OFFSETS_ATTR,
            array(
                r.chunk_offsets_us
                    .iter()
                    .map(|us| Value::IntValue(i64::from(*us))),
            ),
        ));
    }
    a.push(kv(
        TOKENS_FROM_USAGE_ATTR,
        Value::BoolValue(r.tokens_from_usage),
    ));
    if !r.prompt_version.is_empty() {
        a.push(kv(
            PROMPT_VERSION_ATTR,
            Value::StringValue(r.prompt_version.clone()),
        ));
    }
    if let Some(key) = r.prefix_key {
        a.push(kv(
            PREFIX_HASH_ATTR,
            Value::StringValue(format!("{key:016x}")),
        ));
    }
    if !r.embedding.is_empty() {
        a.push(kv(
            EMBEDDING_ATTR,
            array(
                r.embedding
                    .iter()
                    .map(|x| Value::DoubleValue(f64::from(*x))),
            ),
        ));
    }
    a
}

/// Why a shipped attribute was ignored (the rest of the record is kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ShippedAttrError {
    pub key: &'static str,
    pub message: String,
}

fn value<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

/// Whether `attrs` are those of a shipped record of this schema.
pub fn is_shipped(attrs: &[KeyValue]) -> bool {
    matches!(value(attrs, SCHEMA_ATTR), Some(Value::IntValue(SCHEMA)))
}

fn seconds(v: &Value, key: &'static str) -> Result<f64, ShippedAttrError> {
    match v {
        Value::DoubleValue(d) if d.is_finite() && *d >= 0.0 => Ok(*d),
        _ => Err(ShippedAttrError {
            key,
            message: "expected a finite, non-negative number of seconds".into(),
        }),
    }
}

fn offsets(v: &Value) -> Result<Vec<u32>, ShippedAttrError> {
    let bad = |message: String| ShippedAttrError {
        key: CHUNK_OFFSETS_ATTR,
        message,
    };
    let Value::ArrayValue(a) = v else {
        return Err(bad("expected an array of integers".into()));
    };
    let mut out = Vec::with_capacity(a.values.len());
    for (i, x) in a.values.iter().enumerate() {
        match x.value.as_ref() {
            Some(Value::IntValue(n)) => match u32::try_from(*n) {
                Ok(us) if out.last().is_none_or(|prev| *prev <= us) => out.push(us),
                Ok(_) => return Err(bad(format!("[{i}] is before the chunk ahead of it"))),
                Err(_) => return Err(bad(format!("[{i}] = {n} is not in 0..=4294967295"))),
            },
            _ => return Err(bad(format!("[{i}] is not an integer"))),
        }
    }
    Ok(out)
}

/// Overwrite the fields of `r` (read from the span's GenAI attributes) with the shipped ones of
/// `attrs`, when they are a shipped record's; else leave `r` as it is. An unusable attribute
/// is skipped and the first such is returned (the record is kept).
pub fn apply(attrs: &[KeyValue], r: &mut RequestRecord) -> Option<ShippedAttrError> {
    if !is_shipped(attrs) {
        return None;
    }
    let mut first_error = None;
    let mut note = |e: ShippedAttrError| {
        first_error.get_or_insert(e);
    };
    let text = |key: &str| match value(attrs, key) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    };
    if let Some(id) = text(REQUEST_ID_ATTR).filter(|s| !s.is_empty()) {
        r.request_id = id;
    }
    if let Some(m) = text(MODEL_ID_ATTR).filter(|s| !s.is_empty()) {
        r.labels.model_id = m;
    }
    if let Some(rt) = text(RUNTIME_ATTR) {
        r.labels.runtime = rt;
    }
    if let Some(i) = text(INSTANCE_ATTR) {
        r.labels.instance = i;
    }
    match value(attrs, STATUS_ATTR) {
        Some(Value::IntValue(s)) => match u16::try_from(*s) {
            Ok(s) => r.status = s,
            Err(_) => note(ShippedAttrError {
                key: STATUS_ATTR,
                message: format!("{s} is not an HTTP status"),
            }),
        },
        Some(_) => note(ShippedAttrError {
            key: STATUS_ATTR,
            message: "expected an integer".into(),
        }),
        None => {}
    }
    r.error_class = match text(ERROR_CLASS_ATTR) {
        None => None,
        Some(name) => match ErrorClass::parse(&name) {
            Some(c) => Some(c),
            None => {
                note(ShippedAttrError {
                    key: ERROR_CLASS_ATTR,
                    message: format!("{name:?} is not an error class"),
                });
                r.error_class
            }
        },
    };
    for (key, field) in [
        (UPSTREAM_HEADERS_ATTR, &mut r.upstream_headers_s),
        (QUEUE_ATTR, &mut r.queue_s),
    ] {
        if let Some(v) = value(attrs, key) {
            match seconds(v, key) {
                Ok(s) => *field = Some(s),
                Err(e) => note(e),
            }
        }
    }
    if let Some(v) = value(attrs, CHUNK_OFFSETS_ATTR) {
        match offsets(v) {
            Ok(o) => r.chunk_offsets_us = o,
            Err(e) => note(e),
        }
    }
    if let Some(Value::BoolValue(b)) = value(attrs, TOKENS_FROM_USAGE_ATTR) {
        r.tokens_from_usage = *b;
    }
    first_error
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> RequestRecord {
        RequestRecord {
            request_id: "req-7".into(),
            status: 499,
            error_class: Some(ErrorClass::ClientCancelled),
            upstream_headers_s: Some(0.012),
            queue_s: Some(0.003),
            chunk_offsets_us: vec![80_000, 95_000, 95_000, 4_000_000_000],
            tokens_from_usage: false,
            prefix_key: Some(0xab),
            ..Default::default()
        }
    }

    /// The shipped attributes with the request id the proxy's span always carries.
    fn span_attributes(r: &RequestRecord) -> Vec<KeyValue> {
        let mut a = attributes(r);
        a.push(kv(
            REQUEST_ID_ATTR,
            Value::StringValue(r.request_id.clone()),
        ));
        a
    }

    #[test]
    fn shipped_fields_come_back_as_they_were() {
        let r = record();
        let attrs = span_attributes(&r);
        let mut back = RequestRecord {
            request_id: "span-id".into(),
            status: 500,
            error_class: Some(ErrorClass::Upstream5xx),
            tokens_from_usage: true,
            ..Default::default()
        };
        assert_eq!(apply(&attrs, &mut back), None);
        assert_eq!(back.request_id, "req-7");
        assert_eq!((back.status, back.error_class), (499, r.error_class));
        assert_eq!(back.upstream_headers_s, r.upstream_headers_s);
        assert_eq!(back.queue_s, r.queue_s);
        assert_eq!(back.chunk_offsets_us, r.chunk_offsets_us);
        assert!(!back.tokens_from_usage);
    }

    #[test]
    fn a_success_clears_the_error_the_genai_reading_guessed() {
        let r = RequestRecord {
            status: 200,
            ..Default::default()
        };
        let mut back = RequestRecord {
            status: 500,
            error_class: Some(ErrorClass::Upstream5xx),
            ..Default::default()
        };
        apply(&attributes(&r), &mut back);
        assert_eq!((back.status, back.error_class), (200, None));
    }

    #[test]
    fn spans_of_other_schemas_are_left_alone_and_bad_values_are_skipped() {
        let mut attrs = span_attributes(&record());
        let mut untouched = RequestRecord::default();
        let mut other = attrs.clone();
        other[0] = kv(SCHEMA_ATTR, Value::IntValue(2));
        assert_eq!(apply(&other, &mut untouched), None);
        assert_eq!(untouched, RequestRecord::default());

        for a in attrs.iter_mut() {
            if a.key == CHUNK_OFFSETS_ATTR {
                *a = kv(
                    CHUNK_OFFSETS_ATTR,
                    array([Value::IntValue(5), Value::IntValue(-1)].into_iter()),
                );
            }
        }
        let mut back = RequestRecord::default();
        let e = apply(&attrs, &mut back).expect("the bad offsets are reported");
        assert_eq!(e.key, CHUNK_OFFSETS_ATTR);
        assert!(back.chunk_offsets_us.is_empty());
        assert_eq!(back.request_id, "req-7", "the rest is kept");
        let unordered = array([Value::IntValue(9), Value::IntValue(3)].into_iter());
        assert!(offsets(&unordered).is_err());
    }
}
