// A response's first token as a proxy replica ships it (`role: proxy`), ahead of its record:
// one small span per first token, to the same OTLP endpoint as the records
// (`export::otlp::ship`), so that an aggregator behind replicas sees a slow first token while
// its stream still runs — as `role: all` does through its first-token queue — and the
// early-TTFT detection works behind replicas too. Written by the shipper, read back by the OTLP
// receiver (here, so the two sides cannot drift apart).

//! The span: named `tokenwatch.first_token`, kind internal, from the request's arrival to its
//! first content token, in a trace of its own whose ids derive from the request id (so a batch
//! sent again carries the same ids and the receiver's dedup drops it, and a tracing backend
//! behind a Collector does not mix it into the request's trace). Its attributes:
//!
//! | attribute | `FirstToken` field |
//! |---|---|
//! | `tokenwatch.first_token.schema` (int, 1) | marks a shipped first token |
//! | `tokenwatch.request_id` | `request_id` (never empty) |
//! | `tokenwatch.record.model_id` | `model_id` (after alias resolution) |
//! | `tokenwatch.record.instance` | `instance` |
//! | `tokenwatch.first_token.arrival_unix_ms` (int) | `arrival_unix_ms` |
//! | `tokenwatch.first_token.time_s` (double) | `first_token_s` |
//!
//! It is not a GenAI span: the receiver turns it into a first token, never into a record or a
//! stored span.

use super::shipped_record::{INSTANCE_ATTR, MODEL_ID_ATTR, REQUEST_ID_ATTR, ShippedAttrError};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use sha2::{Digest, Sha256};
use tokenwatch_core::model::FirstToken;

/// The version of this mapping; a span naming another is not read as a first token.
pub const SCHEMA: i64 = 1;
pub const SCHEMA_ATTR: &str = "tokenwatch.first_token.schema";
pub const ARRIVAL_ATTR: &str = "tokenwatch.first_token.arrival_unix_ms";
pub const TIME_ATTR: &str = "tokenwatch.first_token.time_s";
pub const SPAN_NAME: &str = "tokenwatch.first_token";

/// The (trace id, span id) of the first-token span of request `request_id`: the first 24 bytes
/// of SHA-256 over a fixed prefix and the id. The receiver's dedup computes them from a record's
/// request id too, to drop a first token arriving after its record.
pub fn ids(request_id: &str) -> ([u8; 16], [u8; 8]) {
    let mut h = Sha256::new();
    h.update(b"tokenwatch.first_token\0");
    h.update(request_id.as_bytes());
    let d = h.finalize();
    let mut trace = [0u8; 16];
    let mut span = [0u8; 8];
    trace.copy_from_slice(&d[..16]);
    span.copy_from_slice(&d[16..24]);
    (trace, span)
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// The span that ships `f`; None for a first token without a request id (it could not be
/// matched with its record).
pub fn span(f: &FirstToken) -> Option<Span> {
    if f.request_id.is_empty() {
        return None;
    }
    let (trace, span_id) = ids(&f.request_id);
    let start = u64::try_from(f.arrival_unix_ms).unwrap_or(0) * 1_000_000;
    let end = start + (f.first_token_s.max(0.0) * 1e9) as u64;
    Some(Span {
        trace_id: trace.to_vec(),
        span_id: span_id.to_vec(),
        name: SPAN_NAME.into(),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes: vec![
            kv(SCHEMA_ATTR, Value::IntValue(SCHEMA)),
            kv(REQUEST_ID_ATTR, Value::StringValue(f.request_id.clone())),
            kv(MODEL_ID_ATTR, Value::StringValue(f.model_id.clone())),
            kv(INSTANCE_ATTR, Value::StringValue(f.instance.clone())),
            kv(ARRIVAL_ATTR, Value::IntValue(f.arrival_unix_ms)),
            kv(TIME_ATTR, Value::DoubleValue(f.first_token_s)),
        ],
        ..Default::default()
    })
}

fn value<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

/// Whether `attrs` are those of a shipped first token of this schema.
pub fn is_first_token(attrs: &[KeyValue]) -> bool {
    matches!(value(attrs, SCHEMA_ATTR), Some(Value::IntValue(SCHEMA)))
}

/// The first token a shipped first-token span carries (call when `is_first_token`).
pub fn read(span: &Span) -> Result<FirstToken, ShippedAttrError> {
    let a = &span.attributes;
    let text = |key: &'static str| match value(a, key) {
        Some(Value::StringValue(s)) => Ok(s.clone()),
        _ => Err(ShippedAttrError {
            key,
            message: "expected a string".into(),
        }),
    };
    let request_id = text(REQUEST_ID_ATTR)?;
    if request_id.is_empty() {
        return Err(ShippedAttrError {
            key: REQUEST_ID_ATTR,
            message: "must not be empty".into(),
        });
    }
    let arrival_unix_ms = match value(a, ARRIVAL_ATTR) {
        Some(Value::IntValue(ms)) if *ms > 0 => *ms,
        _ => {
            return Err(ShippedAttrError {
                key: ARRIVAL_ATTR,
                message: "expected a positive integer of milliseconds".into(),
            });
        }
    };
    let first_token_s = match value(a, TIME_ATTR) {
        Some(Value::DoubleValue(s)) if s.is_finite() && *s >= 0.0 => *s,
        _ => {
            return Err(ShippedAttrError {
                key: TIME_ATTR,
                message: "expected a finite, non-negative number of seconds".into(),
            });
        }
    };
    Ok(FirstToken {
        request_id,
        model_id: text(MODEL_ID_ATTR)?,
        instance: text(INSTANCE_ATTR).unwrap_or_default(),
        arrival_unix_ms,
        first_token_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first() -> FirstToken {
        FirstToken {
            request_id: "req-9".into(),
            model_id: "llama".into(),
            instance: "gpu-a".into(),
            arrival_unix_ms: 1_700_000_000_123,
            first_token_s: 0.812_345_678,
        }
    }

    #[test]
    fn a_first_token_comes_back_as_it_was_with_ids_from_its_request() {
        let f = first();
        let s = span(&f).unwrap();
        assert!(is_first_token(&s.attributes));
        assert!(!super::super::shipped_record::is_shipped(&s.attributes));
        assert_eq!(read(&s).unwrap(), f);
        let (t, sp) = ids("req-9");
        assert_eq!(
            (s.trace_id.as_slice(), s.span_id.as_slice()),
            (&t[..], &sp[..])
        );
        assert_ne!(ids("req-10"), ids("req-9"));
        assert_eq!(s.end_time_unix_nano - s.start_time_unix_nano, 812_345_678);
        assert!(
            span(&FirstToken {
                request_id: String::new(),
                ..f
            })
            .is_none()
        );
    }

    #[test]
    fn bad_values_are_refused_by_key() {
        let mut s = span(&first()).unwrap();
        for a in s.attributes.iter_mut() {
            if a.key == TIME_ATTR {
                *a = kv(TIME_ATTR, Value::DoubleValue(f64::NAN));
            }
        }
        assert_eq!(read(&s).unwrap_err().key, TIME_ATTR);
        s.attributes.retain(|a| a.key != ARRIVAL_ATTR);
        assert_eq!(read(&s).unwrap_err().key, ARRIVAL_ATTR);
    }
}
