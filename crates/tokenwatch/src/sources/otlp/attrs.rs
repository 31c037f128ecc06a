// OTLP attribute helpers: typed reads of `AnyValue`s (numbers sent as strings or doubles
// included), attribute sets rendered as JSON objects (as stored: content dropped or masked, other
// text masked, by `TelemetryText`), and trace/span ids checked and hex-encoded.

use crate::capture::mask::Masker;
use crate::capture::telemetry::{AttributeText, TelemetryText};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use std::borrow::Cow;

/// The value of `key` in an attribute list (the first one when repeated).
pub fn find<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(value_of)
}

/// The inner value of an attribute, if set.
pub fn value_of(kv: &KeyValue) -> Option<&Value> {
    kv.value.as_ref().and_then(|v| v.value.as_ref())
}

/// A scalar rendered as text (strings borrowed); None for arrays, maps, bytes and empty strings.
pub fn as_str(v: &Value) -> Option<Cow<'_, str>> {
    let s: Cow<'_, str> = match v {
        Value::StringValue(s) => Cow::Borrowed(s.as_str()),
        Value::IntValue(i) => Cow::Owned(i.to_string()),
        Value::DoubleValue(d) => Cow::Owned(d.to_string()),
        Value::BoolValue(b) => Cow::Owned(b.to_string()),
        _ => return None,
    };
    (!s.is_empty()).then_some(s)
}

/// A non-negative integer (ints, whole non-negative doubles, numeric strings).
pub fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::IntValue(i) => u64::try_from(*i).ok(),
        Value::DoubleValue(d) if d.is_finite() && *d >= 0.0 && d.fract() == 0.0 && *d < 1.8e19 => {
            Some(*d as u64)
        }
        Value::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A finite number (doubles, ints, numeric strings).
pub fn as_f64(v: &Value) -> Option<f64> {
    let f = match v {
        Value::DoubleValue(d) => *d,
        Value::IntValue(i) => *i as f64,
        Value::StringValue(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    f.is_finite().then_some(f)
}

/// The first element of an array value (or a scalar itself) as text.
pub fn first_str(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::ArrayValue(a) => a
            .values
            .iter()
            .find_map(|x| x.value.as_ref().and_then(as_str)),
        other => as_str(other),
    }
}

/// An attribute value as JSON (bytes as lowercase hex).
pub fn to_json(v: Option<&AnyValue>) -> serde_json::Value {
    use serde_json::Value as J;
    let Some(v) = v.and_then(|v| v.value.as_ref()) else {
        return J::Null;
    };
    match v {
        Value::StringValue(s) => J::String(s.clone()),
        Value::BoolValue(b) => J::Bool(*b),
        Value::IntValue(i) => J::from(*i),
        Value::DoubleValue(d) => serde_json::Number::from_f64(*d)
            .map(J::Number)
            .unwrap_or(J::Null),
        Value::ArrayValue(a) => J::Array(a.values.iter().map(|x| to_json(Some(x))).collect()),
        Value::KvlistValue(kv) => J::Object(
            kv.values
                .iter()
                .map(|kv| (kv.key.clone(), to_json(kv.value.as_ref())))
                .collect(),
        ),
        Value::BytesValue(b) => J::String(hex::encode(b)),
        // String-table references only appear in profiles, never in traces, metrics or logs.
        _ => J::Null,
    }
}

/// An attribute list as a JSON object text, written directly (no intermediate JSON tree), as
/// received (for what is not stored: `to_stored_json_object` for what is).
pub fn to_json_object(attrs: &[KeyValue]) -> String {
    let mut out = Vec::with_capacity(32 * attrs.len() + 2);
    write_object(&mut out, attrs, &|_| AttributeText::Keep);
    String::from_utf8(out).unwrap_or_default()
}

/// An attribute list as the JSON object text that is stored: each attribute's value as `text`
/// decides — kept, left out, or with every string in it masked.
pub fn to_stored_json_object(attrs: &[KeyValue], text: &TelemetryText) -> String {
    let mut out = Vec::with_capacity(32 * attrs.len() + 2);
    write_object(&mut out, attrs, &|key| text.attribute(key));
    String::from_utf8(out).unwrap_or_default()
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing a &str into a Vec cannot fail; the result is a quoted, escaped JSON string.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// A string value, masked when `mask` is given.
fn write_text(out: &mut Vec<u8>, s: &str, mask: Option<&Masker>) {
    match mask.and_then(|m| m.mask_free_text(s)) {
        Some(masked) => write_str(out, &masked),
        None => write_str(out, s),
    }
}

/// An object, each attribute's value as `decide` says for its key: left out, as sent, or with
/// every string in it masked.
fn write_object<'m>(
    out: &mut Vec<u8>,
    attrs: &[KeyValue],
    decide: &dyn Fn(&str) -> AttributeText<'m>,
) {
    out.push(b'{');
    let mut first = true;
    for kv in attrs {
        let mask = match decide(&kv.key) {
            AttributeText::Drop => continue,
            AttributeText::Keep => None,
            AttributeText::Mask(m) => Some(m),
        };
        if !first {
            out.push(b',');
        }
        first = false;
        write_str(out, &kv.key);
        out.push(b':');
        write_value(out, kv.value.as_ref().and_then(|v| v.value.as_ref()), mask);
    }
    out.push(b'}');
}

/// A value as JSON; with `mask`, every string in it masked (keys of nested lists kept).
fn write_value(out: &mut Vec<u8>, v: Option<&Value>, mask: Option<&Masker>) {
    use std::io::Write as _;
    match v {
        Some(Value::StringValue(s)) => write_text(out, s, mask),
        Some(Value::BoolValue(b)) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Some(Value::IntValue(i)) => {
            let _ = write!(out, "{i}");
        }
        Some(Value::DoubleValue(d)) if d.is_finite() => {
            let _ = serde_json::to_writer(&mut *out, d);
        }
        Some(Value::ArrayValue(a)) => {
            out.push(b'[');
            for (i, x) in a.values.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, x.value.as_ref(), mask);
            }
            out.push(b']');
        }
        Some(Value::KvlistValue(kv)) => {
            // A nested list: its values are treated as the attribute that holds it.
            let inner = |_: &str| mask.map_or(AttributeText::Keep, AttributeText::Mask);
            write_object(out, &kv.values, &inner);
        }
        Some(Value::BytesValue(b)) => {
            out.push(b'"');
            out.extend_from_slice(hex::encode(b).as_bytes());
            out.push(b'"');
        }
        _ => out.extend_from_slice(b"null"),
    }
}

/// A log body as text: strings as is, anything else as JSON.
pub fn body_text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        None => String::new(),
        Some(_) => to_json(v).to_string(),
    }
}

/// Why an id was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("trace_id must be 16 bytes, not all zero (got {0} bytes)")]
    TraceId(usize),
    #[error("span_id must be 8 bytes, not all zero (got {0} bytes)")]
    SpanId(usize),
    #[error("parent_span_id must be empty or 8 bytes (got {0} bytes)")]
    ParentSpanId(usize),
}

fn valid(bytes: &[u8], len: usize) -> bool {
    bytes.len() == len && bytes.iter().any(|b| *b != 0)
}

/// A required trace id (16 non-zero bytes) as hex.
pub fn trace_id(bytes: &[u8]) -> Result<String, IdError> {
    if valid(bytes, 16) {
        Ok(hex::encode(bytes))
    } else {
        Err(IdError::TraceId(bytes.len()))
    }
}

/// A required span id (8 non-zero bytes) as hex.
pub fn span_id(bytes: &[u8]) -> Result<String, IdError> {
    if valid(bytes, 8) {
        Ok(hex::encode(bytes))
    } else {
        Err(IdError::SpanId(bytes.len()))
    }
}

/// An optional parent span id: empty (a root span) or 8 bytes.
pub fn parent_span_id(bytes: &[u8]) -> Result<String, IdError> {
    match bytes.len() {
        0 => Ok(String::new()),
        8 => Ok(hex::encode(bytes)),
        n => Err(IdError::ParentSpanId(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::ArrayValue;

    fn kv(k: &str, v: Value) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    #[test]
    fn typed_reads_accept_numbers_in_any_form() {
        assert_eq!(as_u64(&Value::IntValue(7)), Some(7));
        assert_eq!(as_u64(&Value::IntValue(-1)), None);
        assert_eq!(as_u64(&Value::DoubleValue(7.0)), Some(7));
        assert_eq!(as_u64(&Value::DoubleValue(7.5)), None);
        assert_eq!(as_u64(&Value::StringValue(" 12 ".into())), Some(12));
        assert_eq!(as_f64(&Value::StringValue("0.25".into())), Some(0.25));
        assert_eq!(as_f64(&Value::DoubleValue(f64::NAN)), None);
        assert_eq!(as_str(&Value::StringValue(String::new())), None);
        let arr = Value::ArrayValue(ArrayValue {
            values: vec![AnyValue {
                value: Some(Value::StringValue("stop".into())),
            }],
        });
        assert_eq!(first_str(&arr).as_deref(), Some("stop"));
    }

    #[test]
    fn stored_attributes_drop_content_and_mask_the_rest_but_verbatim_keys() {
        use crate::capture::mask::{MaskConfig, default_verbatim_attributes};
        use crate::capture::telemetry::Verbatim;
        use opentelemetry_proto::tonic::common::v1::KeyValueList;
        let masker = std::sync::Arc::new(Masker::new(&MaskConfig::default(), b"k").unwrap());
        let text = TelemetryText::dropping()
            .masking_others(masker, Verbatim::new(&default_verbatim_attributes()));
        let s = |v: &str| Value::StringValue(v.into());
        let attrs = vec![
            kv("gen_ai.request.model", s("qwen3-8b")),
            kv("gen_ai.input.messages", s("hi, I am ann@example.org")),
            kv("user.email", s("ann@example.org")),
            kv("server.address", s("10.0.0.7")),
            kv("gen_ai.usage.input_tokens", Value::IntValue(12)),
            kv(
                "app.user",
                Value::KvlistValue(KeyValueList {
                    values: vec![
                        kv("phone", s("+44 20 7946 0958")),
                        kv("n", Value::IntValue(3)),
                    ],
                }),
            ),
            kv("note", s("no personal data here")),
        ];
        let out = to_stored_json_object(&attrs, &text);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["gen_ai.request.model"], "qwen3-8b");
        assert!(v.get("gen_ai.input.messages").is_none(), "{out}");
        assert!(
            v["user.email"].as_str().unwrap().starts_with("[email:"),
            "{out}"
        );
        assert_eq!(v["server.address"], "10.0.0.7");
        assert_eq!(v["gen_ai.usage.input_tokens"], 12);
        assert!(
            v["app.user"]["phone"]
                .as_str()
                .unwrap()
                .starts_with("[phone:"),
            "{out}"
        );
        assert_eq!(v["app.user"]["n"], 3);
        assert_eq!(v["note"], "no personal data here");
        assert!(!out.contains("ann@") && !out.contains("7946"), "{out}");
        // As received, nothing changes.
        assert!(to_json_object(&attrs).contains("ann@example.org"));
    }

    #[test]
    fn attributes_render_as_json_and_ids_are_checked() {
        let attrs = vec![
            kv("a", Value::IntValue(1)),
            kv("b", Value::BytesValue(vec![0xab])),
            kv("c", Value::DoubleValue(f64::INFINITY)),
        ];
        assert_eq!(to_json_object(&attrs), r#"{"a":1,"b":"ab","c":null}"#);
        let nested = vec![
            kv("q\"uote", Value::StringValue("line\nbreak".into())),
            kv(
                "arr",
                Value::ArrayValue(ArrayValue {
                    values: vec![
                        AnyValue {
                            value: Some(Value::BoolValue(true)),
                        },
                        AnyValue {
                            value: Some(Value::DoubleValue(0.5)),
                        },
                    ],
                }),
            ),
        ];
        let text = to_json_object(&nested);
        assert_eq!(text, r#"{"q\"uote":"line\nbreak","arr":[true,0.5]}"#);
        assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok());
        assert!(find(&attrs, "a").is_some() && find(&attrs, "z").is_none());
        assert_eq!(trace_id(&[1; 16]).unwrap(), "01".repeat(16));
        assert_eq!(trace_id(&[0; 16]), Err(IdError::TraceId(16)));
        assert_eq!(span_id(&[1; 7]), Err(IdError::SpanId(7)));
        assert_eq!(parent_span_id(&[]).unwrap(), "");
        assert!(parent_span_id(&[1; 3]).is_err());
    }
}
