// Spans into OTLP protobuf: stored span rows (received spans) back into OTLP spans, and a batch
// of spans into one `ExportTraceServiceRequest`, one resource per service.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value::Value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use std::collections::BTreeMap;
use tokenwatch_store::SpanRow;

pub use crate::kernel::spans::ExportSpan;

/// A JSON value (a stored attribute) as an OTLP value; None for null.
fn any_value(v: serde_json::Value) -> Option<AnyValue> {
    use serde_json::Value as J;
    let value = match v {
        J::Null => return None,
        J::Bool(b) => Value::BoolValue(b),
        J::Number(n) => match n.as_i64() {
            Some(i) => Value::IntValue(i),
            None => Value::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::StringValue(s),
        J::Array(items) => Value::ArrayValue(ArrayValue {
            values: items.into_iter().filter_map(any_value).collect(),
        }),
        J::Object(map) => Value::KvlistValue(KeyValueList {
            values: key_values(map),
        }),
    };
    Some(AnyValue { value: Some(value) })
}

fn key_values(map: serde_json::Map<String, serde_json::Value>) -> Vec<KeyValue> {
    map.into_iter()
        .filter_map(|(key, v)| {
            any_value(v).map(|value| KeyValue {
                key,
                value: Some(value),
                ..Default::default()
            })
        })
        .collect()
}

fn hex_id(s: &str, len: usize) -> Option<Vec<u8>> {
    if s.len() != len * 2 {
        return None;
    }
    hex::decode(s).ok()
}

/// A stored span row as an OTLP span (its events are not stored, so none are sent); None when
/// its ids are not valid hex.
pub fn span_of_row(row: &SpanRow) -> Option<ExportSpan> {
    let trace_id = hex_id(&row.trace_id, 16)?;
    let span_id = hex_id(&row.span_id, 8)?;
    let parent_span_id = if row.parent_span_id.is_empty() {
        Vec::new()
    } else {
        hex_id(&row.parent_span_id, 8)?
    };
    let attributes = match serde_json::from_str::<serde_json::Value>(&row.attributes_json) {
        Ok(serde_json::Value::Object(map)) => key_values(map),
        _ => Vec::new(),
    };
    let span = Span {
        trace_id,
        span_id,
        parent_span_id,
        name: row.name.clone(),
        kind: row.kind,
        start_time_unix_nano: u64::try_from(row.start_unix_nano).unwrap_or(0),
        end_time_unix_nano: u64::try_from(row.end_unix_nano).unwrap_or(0),
        attributes,
        status: (row.status_code != 0 || !row.status_message.is_empty()).then(|| Status {
            code: row.status_code,
            message: row.status_message.clone(),
        }),
        ..Default::default()
    };
    Some(ExportSpan {
        service_name: row.service_name.clone(),
        span,
    })
}

/// One export request for `spans`: a resource per `service.name` (in name order), each with one
/// scope, `tokenwatch`.
pub fn request_of(spans: Vec<ExportSpan>) -> ExportTraceServiceRequest {
    let mut by_service: BTreeMap<String, Vec<Span>> = BTreeMap::new();
    for s in spans {
        by_service.entry(s.service_name).or_default().push(s.span);
    }
    let resource_spans = by_service
        .into_iter()
        .map(|(service, spans)| {
            let attributes = if service.is_empty() {
                Vec::new()
            } else {
                vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(Value::StringValue(service)),
                    }),
                    ..Default::default()
                }]
            };
            ResourceSpans {
                resource: Some(Resource {
                    attributes,
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "tokenwatch".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }
        })
        .collect();
    ExportTraceServiceRequest { resource_spans }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> SpanRow {
        SpanRow {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: "00f067aa0ba902b7".into(),
            parent_span_id: "1111111111111111".into(),
            name: "vllm.request".into(),
            kind: 2,
            start_unix_nano: 1_700_000_000_000_000_000,
            end_unix_nano: 1_700_000_001_000_000_000,
            status_code: 2,
            status_message: "boom".into(),
            service_name: "vllm".into(),
            attributes_json: r#"{"a":"x","n":3,"f":0.5,"b":true,"l":["s","t"],"z":null}"#.into(),
            events_count: 2,
        }
    }

    #[test]
    fn rows_become_spans_with_typed_attributes() {
        let s = span_of_row(&row()).unwrap();
        assert_eq!(s.service_name, "vllm");
        assert_eq!(
            hex::encode(&s.span.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(hex::encode(&s.span.parent_span_id), "1111111111111111");
        assert_eq!((s.span.kind, s.span.status.as_ref().unwrap().code), (2, 2));
        let get = |k: &str| {
            s.span
                .attributes
                .iter()
                .find(|kv| kv.key == k)
                .and_then(|kv| kv.value.clone()?.value)
        };
        assert_eq!(get("a"), Some(Value::StringValue("x".into())));
        assert_eq!(get("n"), Some(Value::IntValue(3)));
        assert_eq!(get("f"), Some(Value::DoubleValue(0.5)));
        assert_eq!(get("b"), Some(Value::BoolValue(true)));
        assert!(matches!(get("l"), Some(Value::ArrayValue(a)) if a.values.len() == 2));
        assert_eq!(get("z"), None, "null attributes are left out");

        let mut root = row();
        root.parent_span_id.clear();
        assert!(span_of_row(&root).unwrap().span.parent_span_id.is_empty());
        let mut bad = row();
        bad.span_id = "xyz".into();
        assert!(span_of_row(&bad).is_none());
    }

    #[test]
    fn requests_group_spans_by_service() {
        let a = span_of_row(&row()).unwrap();
        let mut b = a.clone();
        b.service_name = "tokenwatch".into();
        let req = request_of(vec![a.clone(), b, a]);
        assert_eq!(req.resource_spans.len(), 2);
        let services: Vec<_> = req
            .resource_spans
            .iter()
            .map(|rs| {
                let kv = &rs.resource.as_ref().unwrap().attributes[0];
                (
                    kv.value.clone().unwrap().value.unwrap(),
                    rs.scope_spans[0].spans.len(),
                )
            })
            .collect();
        assert_eq!(
            services,
            vec![
                (Value::StringValue("tokenwatch".into()), 1),
                (Value::StringValue("vllm".into()), 2)
            ]
        );
    }
}
