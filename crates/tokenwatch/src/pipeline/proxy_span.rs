// The proxy's own span of each proxied request, built on the pipeline thread from the record
// (OTel GenAI conventions, kind CLIENT), stored like received spans and handed to OTLP export.

//! One span per record the proxy made (`RequestRecord::span.span_id` set): the id the upstream
//! received as its parent in `traceparent`, a child of the caller's span when the caller sent a
//! `traceparent`, else the trace's root. Name `{gen_ai.operation.name} {gen_ai.request.model}`,
//! kind CLIENT (the inference span of the GenAI conventions: the proxy calls the model server),
//! from arrival to the end of the response. Attributes: `gen_ai.operation.name`,
//! `gen_ai.provider.name` (the upstream's runtime), `gen_ai.request.model`,
//! `gen_ai.response.model`, `gen_ai.request.stream`, `gen_ai.usage.input_tokens`,
//! `gen_ai.usage.output_tokens`, `gen_ai.usage.reasoning.output_tokens`,
//! `gen_ai.response.finish_reasons`, `gen_ai.response.time_to_first_chunk` (also an event,
//! `gen_ai.first_token`, at that time), `server.address`/`server.port` of the upstream,
//! `http.request.method`, `url.path`, `http.response.status_code`, `error.type` (the error
//! class; status ERROR) and `tokenwatch.request_id`, `tokenwatch.tenant`, `tokenwatch.ab_group`,
//! `tokenwatch.model_version` when set. Resource `service.name` is `tokenwatch`.

use super::{RecordSink, SinkError};
use crate::config::{UpstreamConfig, parse_upstream_url};
use crate::export::otlp::{ExportSpan, SpanExport};
use crate::sources::otlp::attrs;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::span::{Event, SpanKind};
use opentelemetry_proto::tonic::trace::v1::{Span, Status, status::StatusCode};
use std::collections::HashMap;
use tokenwatch_core::model::RequestRecord;
use super::store_writer::StoreWriter;
use tokenwatch_store::SpanRow;

/// `service.name` of the proxy's spans.
pub const SERVICE_NAME: &str = "tokenwatch";
/// The event marking the first content token of a streamed response.
pub const FIRST_TOKEN_EVENT: &str = "gen_ai.first_token";

/// Builds the proxy's spans: knows each upstream's address by its instance label.
#[derive(Debug, Clone, Default)]
pub struct ProxySpanBuilder {
    /// Instance label → (host, port) of the upstream.
    upstreams: HashMap<String, (String, i64)>,
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn s(v: &str) -> Value {
    Value::StringValue(v.to_string())
}

fn int(v: u64) -> Value {
    Value::IntValue(i64::try_from(v).unwrap_or(i64::MAX))
}

/// `gen_ai.operation.name` of a proxied endpoint.
pub fn operation_of(endpoint: &str) -> &'static str {
    match endpoint {
        "/v1/completions" => "text_completion",
        "/v1/embeddings" => "embeddings",
        _ => "chat",
    }
}

fn span_id_bytes(hex_id: &str, len: usize) -> Option<Vec<u8>> {
    (hex_id.len() == 2 * len)
        .then(|| hex::decode(hex_id).ok())
        .flatten()
}

impl ProxySpanBuilder {
    /// From `proxy.upstreams`: the instance label each one's records carry, and its address.
    pub fn new(upstreams: &[UpstreamConfig]) -> ProxySpanBuilder {
        let mut map = HashMap::new();
        for u in upstreams {
            let Ok(url) = parse_upstream_url(&u.url) else {
                continue;
            };
            let port = url
                .authority
                .port_u16()
                .unwrap_or(if url.https { 443 } else { 80 });
            let instance = u
                .instance
                .clone()
                .unwrap_or_else(|| url.authority.to_string());
            map.entry(instance)
                .or_insert_with(|| (url.authority.host().to_string(), i64::from(port)));
        }
        ProxySpanBuilder { upstreams: map }
    }

    /// The proxy's span of `r`; None for records the proxy did not make (or with bad ids).
    pub fn build(&self, r: &RequestRecord) -> Option<Span> {
        let span_id = span_id_bytes(&r.span.span_id, 8)?;
        let trace_id = span_id_bytes(&r.trace_id, 16)?;
        let parent_span_id = if r.span.parent_span_id.is_empty() {
            Vec::new()
        } else {
            span_id_bytes(&r.span.parent_span_id, 8)?
        };
        let operation = operation_of(&r.endpoint);
        let request_model = (r.labels.model_id != crate::sources::proxy::UNKNOWN_MODEL)
            .then_some(&r.labels.model_id);
        let name = match request_model {
            Some(m) => format!("{operation} {m}"),
            None => operation.to_string(),
        };
        let start = u64::try_from(r.arrival_unix_ms)
            .unwrap_or(0)
            .saturating_mul(1_000_000);
        let at = |secs: f64| start.saturating_add((secs.max(0.0) * 1e9) as u64);

        let mut a = Vec::with_capacity(20);
        a.push(kv("gen_ai.operation.name", s(operation)));
        let provider = if !r.labels.runtime.is_empty() {
            r.labels.runtime.as_str()
        } else if r.endpoint == "/v1/messages" {
            "anthropic"
        } else {
            "openai"
        };
        a.push(kv("gen_ai.provider.name", s(provider)));
        if let Some(m) = request_model {
            a.push(kv("gen_ai.request.model", s(m)));
        }
        if !r.span.response_model.is_empty() {
            a.push(kv("gen_ai.response.model", s(&r.span.response_model)));
        }
        a.push(kv("gen_ai.request.stream", Value::BoolValue(r.stream)));
        if let Some(n) = r.prompt_tokens {
            a.push(kv("gen_ai.usage.input_tokens", int(n)));
        }
        if let Some(n) = r.output_tokens {
            a.push(kv("gen_ai.usage.output_tokens", int(n)));
        }
        if let Some(n) = r.reasoning_tokens {
            a.push(kv("gen_ai.usage.reasoning.output_tokens", int(n)));
        }
        if !r.finish_reason.is_empty() {
            let reasons = ArrayValue {
                values: vec![AnyValue {
                    value: Some(s(&r.finish_reason)),
                }],
            };
            a.push(kv(
                "gen_ai.response.finish_reasons",
                Value::ArrayValue(reasons),
            ));
        }
        let mut events = Vec::new();
        if let Some(t) = r.first_token_s {
            a.push(kv(
                "gen_ai.response.time_to_first_chunk",
                Value::DoubleValue(t),
            ));
            events.push(Event {
                time_unix_nano: at(t),
                name: FIRST_TOKEN_EVENT.into(),
                ..Default::default()
            });
        }
        match self.upstreams.get(&r.labels.instance) {
            Some((host, port)) => {
                a.push(kv("server.address", s(host)));
                a.push(kv("server.port", Value::IntValue(*port)));
            }
            None if !r.labels.instance.is_empty() => {
                a.push(kv("server.address", s(&r.labels.instance)))
            }
            None => {}
        }
        a.push(kv("http.request.method", s("POST")));
        a.push(kv("url.path", s(&r.endpoint)));
        if r.status != 0 {
            a.push(kv(
                "http.response.status_code",
                Value::IntValue(i64::from(r.status)),
            ));
        }
        let status = match r.error_class {
            Some(class) => {
                a.push(kv("error.type", s(class.name())));
                Some(Status {
                    code: StatusCode::Error as i32,
                    message: class.name().into(),
                })
            }
            None => None,
        };
        a.push(kv("tokenwatch.request_id", s(&r.request_id)));
        for (key, v) in [
            ("tokenwatch.tenant", &r.labels.tenant),
            ("tokenwatch.ab_group", &r.labels.ab_group),
            ("tokenwatch.model_version", &r.labels.model_version),
        ] {
            if !v.is_empty() {
                a.push(kv(key, s(v)));
            }
        }
        Some(Span {
            trace_id,
            span_id,
            parent_span_id,
            name,
            kind: SpanKind::Client as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: at(r.end_s),
            attributes: a,
            events,
            status,
            ..Default::default()
        })
    }
}

/// The stored row of one of the proxy's spans (ids from `r`, already checked by `build`).
pub fn row_of(span: &Span, r: &RequestRecord) -> SpanRow {
    let status = span.status.as_ref();
    SpanRow {
        trace_id: r.trace_id.clone(),
        span_id: r.span.span_id.clone(),
        parent_span_id: r.span.parent_span_id.clone(),
        name: span.name.clone(),
        kind: span.kind,
        start_unix_nano: i64::try_from(span.start_time_unix_nano).unwrap_or(i64::MAX),
        end_unix_nano: i64::try_from(span.end_time_unix_nano).unwrap_or(i64::MAX),
        status_code: status.map(|s| s.code).unwrap_or(0),
        status_message: status.map(|s| s.message.clone()).unwrap_or_default(),
        service_name: SERVICE_NAME.into(),
        attributes_json: attrs::to_json_object(&span.attributes),
        events_count: u32::try_from(span.events.len()).unwrap_or(u32::MAX),
    }
}

/// The pipeline sink that stores the proxy's spans (through the store's writer thread, which
/// counts those it cannot write) and queues them for OTLP export.
pub struct ProxySpanSink {
    builder: ProxySpanBuilder,
    store: StoreWriter,
    export: Option<SpanExport>,
}

impl ProxySpanSink {
    pub fn new(
        builder: ProxySpanBuilder,
        store: StoreWriter,
        export: Option<SpanExport>,
    ) -> ProxySpanSink {
        ProxySpanSink {
            builder,
            store,
            export,
        }
    }
}

impl RecordSink for ProxySpanSink {
    fn name(&self) -> &'static str {
        "proxy_spans"
    }

    fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError> {
        let mut rows = Vec::new();
        let mut spans = Vec::new();
        for r in batch.iter().filter(|r| !r.span.span_id.is_empty()) {
            if let Some(span) = self.builder.build(r) {
                rows.push(row_of(&span, r));
                if self.export.is_some() {
                    spans.push(ExportSpan {
                        service_name: SERVICE_NAME.into(),
                        span,
                    });
                }
            }
        }
        if let Some(export) = &self.export {
            export.push(spans);
        }
        self.store.spans(rows);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::prometheus::Metrics;
    use std::sync::Arc;
    use tokenwatch_core::model::{ErrorClass, ProxySpan, SeriesLabels};

    fn upstreams() -> Vec<UpstreamConfig> {
        let json = r#"[{"url": "http://127.0.0.1:8000", "runtime": "vllm"},
                       {"url": "https://gpu.example.com/v1", "instance": "gpu-b"}]"#;
        serde_json::from_str(json).unwrap()
    }

    fn record() -> RequestRecord {
        RequestRecord {
            request_id: "req-1".into(),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            labels: SeriesLabels {
                model_id: "llama".into(),
                runtime: "vllm".into(),
                instance: "127.0.0.1:8000".into(),
                tenant: "acme".into(),
                ..Default::default()
            },
            endpoint: "/v1/chat/completions".into(),
            stream: true,
            arrival_unix_ms: 1_700_000_000_000,
            first_token_s: Some(0.25),
            end_s: 1.5,
            prompt_tokens: Some(12),
            output_tokens: Some(30),
            finish_reason: "stop".into(),
            status: 200,
            span: ProxySpan {
                span_id: "00f067aa0ba902b7".into(),
                parent_span_id: "b7ad6b7169203331".into(),
                response_model: "llama-3.1-8b".into(),
            },
            ..Default::default()
        }
    }

    fn attr(span: &Span, key: &str) -> Option<Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.clone()?.value)
    }

    #[test]
    fn a_proxied_request_becomes_a_genai_client_span() {
        let b = ProxySpanBuilder::new(&upstreams());
        let span = b.build(&record()).unwrap();
        assert_eq!(span.name, "chat llama");
        assert_eq!(span.kind, SpanKind::Client as i32);
        assert_eq!(
            hex::encode(&span.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(hex::encode(&span.span_id), "00f067aa0ba902b7");
        assert_eq!(hex::encode(&span.parent_span_id), "b7ad6b7169203331");
        assert_eq!(span.start_time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(span.end_time_unix_nano, 1_700_000_001_500_000_000);
        assert_eq!(attr(&span, "gen_ai.operation.name"), Some(s("chat")));
        assert_eq!(attr(&span, "gen_ai.provider.name"), Some(s("vllm")));
        assert_eq!(attr(&span, "gen_ai.request.model"), Some(s("llama")));
        assert_eq!(
            attr(&span, "gen_ai.response.model"),
            Some(s("llama-3.1-8b"))
        );
        assert_eq!(
            attr(&span, "gen_ai.usage.input_tokens"),
            Some(Value::IntValue(12))
        );
        assert_eq!(
            attr(&span, "gen_ai.usage.output_tokens"),
            Some(Value::IntValue(30))
        );
        assert_eq!(attr(&span, "gen_ai.usage.reasoning.output_tokens"), None);
        assert_eq!(
            attr(&span, "gen_ai.response.finish_reasons"),
            Some(Value::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(s("stop"))
                }]
            }))
        );
        assert_eq!(
            attr(&span, "gen_ai.response.time_to_first_chunk"),
            Some(Value::DoubleValue(0.25))
        );
        assert_eq!(attr(&span, "server.address"), Some(s("127.0.0.1")));
        assert_eq!(attr(&span, "server.port"), Some(Value::IntValue(8000)));
        assert_eq!(
            attr(&span, "http.response.status_code"),
            Some(Value::IntValue(200))
        );
        assert_eq!(attr(&span, "error.type"), None);
        assert!(span.status.is_none());
        assert_eq!(span.events.len(), 1);
        assert_eq!(span.events[0].name, FIRST_TOKEN_EVENT);
        assert_eq!(span.events[0].time_unix_nano, 1_700_000_000_250_000_000);

        let row = row_of(&span, &record());
        assert_eq!(
            (row.span_id.as_str(), row.parent_span_id.as_str()),
            ("00f067aa0ba902b7", "b7ad6b7169203331")
        );
        assert_eq!(
            (row.kind, row.events_count, row.service_name.as_str()),
            (3, 1, SERVICE_NAME)
        );
        let attrs: serde_json::Value = serde_json::from_str(&row.attributes_json).unwrap();
        assert_eq!(attrs["gen_ai.usage.input_tokens"], 12);
        assert_eq!(attrs["server.port"], 8000);
        assert_eq!(attrs["tokenwatch.request_id"], "req-1");
    }

    #[test]
    fn failures_roots_and_named_instances() {
        let b = ProxySpanBuilder::new(&upstreams());
        let mut r = record();
        r.span.parent_span_id.clear();
        r.labels.instance = "gpu-b".into();
        r.labels.model_id = crate::sources::proxy::UNKNOWN_MODEL.into();
        r.endpoint = "/v1/completions".into();
        r.first_token_s = None;
        r.status = 502;
        r.error_class = Some(ErrorClass::UpstreamTimeout);
        let span = b.build(&r).unwrap();
        assert!(
            span.parent_span_id.is_empty(),
            "no caller span: the proxy's span is the root"
        );
        assert_eq!(span.name, "text_completion");
        assert_eq!(attr(&span, "gen_ai.request.model"), None);
        assert_eq!(attr(&span, "server.address"), Some(s("gpu.example.com")));
        assert_eq!(attr(&span, "server.port"), Some(Value::IntValue(443)));
        assert_eq!(attr(&span, "error.type"), Some(s("upstream_timeout")));
        assert_eq!(
            span.status.as_ref().map(|s| s.code),
            Some(StatusCode::Error as i32)
        );
        assert!(span.events.is_empty());
        assert_eq!(row_of(&span, &r).status_code, 2);

        let mut otlp = record();
        otlp.span = ProxySpan::default();
        assert!(
            b.build(&otlp).is_none(),
            "records the proxy did not make get no span"
        );
        let mut bad = record();
        bad.span.span_id = "zz".into();
        assert!(b.build(&bad).is_none());
    }

    #[test]
    fn the_sink_stores_spans_and_queues_them_for_export() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn tokenwatch_store::Store> =
            Arc::new(tokenwatch_store::SqliteStore::open(dir.path(), Default::default()).unwrap());
        let cfg = crate::pipeline::StoreWriterConfig { queue_rows: 16, batch_max: 16, niceness: 0 };
        let (writer, thread) = StoreWriter::start(store.clone(), cfg, Arc::new(Metrics::new())).unwrap();
        let mut sink = ProxySpanSink::new(ProxySpanBuilder::new(&upstreams()), writer, None);
        let mut other = record();
        other.span = ProxySpan::default();
        other.request_id = "otlp".into();
        sink.consume(&[record(), other]).unwrap();
        drop(sink);
        assert!(thread.finish(std::time::Duration::from_secs(5)), "the writer drained");
        let spans = store
            .query_spans(&tokenwatch_store::SpanQuery {
                trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
                limit: 10,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].span_id, "00f067aa0ba902b7");
        assert_eq!(spans[0].name, "chat llama");
    }
}
