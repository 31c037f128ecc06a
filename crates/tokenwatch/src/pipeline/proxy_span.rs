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

use super::store_writer::StoreWriter;
use super::{RecordSink, SinkError};
use crate::kernel::spans::{ExportSpan, SpanExport};
use crate::sources::otlp::attrs;
use crate::sources::proxy::config::{UpstreamConfig, parse_upstream_url};
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::span::{Event, SpanKind};
use opentelemetry_proto::tonic::trace::v1::{Span, Status, status::StatusCode};
use std::collections::HashMap;
use tokenwatch_core::model::RequestRecord;
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

/// `gen_ai.operation.name` of a proxied endpoint.
pub fn operation_of(endpoint: &str) -> &'static str {
    match endpoint {
        "/v1/completions" => "text_completion",
        "/v1/embeddings" => "embeddings",
        _ => "chat",
    }
}

/// A hex id of `len` bytes (what `hex::decode` accepts), checked without decoding it.
fn is_hex_id(hex_id: &str, len: usize) -> bool {
    hex_id.len() == 2 * len && hex_id.bytes().all(|b| b.is_ascii_hexdigit())
}

fn span_id_bytes(hex_id: &str, len: usize) -> Option<Vec<u8>> {
    is_hex_id(hex_id, len)
        .then(|| hex::decode(hex_id).ok())
        .flatten()
}

/// One attribute value of the proxy's span, borrowed from the record.
#[derive(Debug, Clone, Copy)]
enum Attr<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Double(f64),
    /// An array of one string (`gen_ai.response.finish_reasons`).
    OneStr(&'a str),
}

impl Attr<'_> {
    fn to_value(self) -> Value {
        match self {
            Attr::Str(v) => Value::StringValue(v.to_string()),
            Attr::Int(v) => Value::IntValue(v),
            Attr::Bool(v) => Value::BoolValue(v),
            Attr::Double(v) => Value::DoubleValue(v),
            Attr::OneStr(v) => Value::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(Value::StringValue(v.to_string())),
                }],
            }),
        }
    }

    /// As `attrs::to_json_object` writes the same value.
    fn write_json(self, out: &mut Vec<u8>) {
        use std::io::Write as _;
        match self {
            Attr::Str(v) => write_json_str(out, v),
            Attr::Int(v) => {
                let _ = write!(out, "{v}");
            }
            Attr::Bool(v) => out.extend_from_slice(if v { b"true" } else { b"false" }),
            Attr::Double(v) if v.is_finite() => {
                let _ = serde_json::to_writer(&mut *out, &v);
            }
            Attr::Double(_) => out.extend_from_slice(b"null"),
            Attr::OneStr(v) => {
                out.push(b'[');
                write_json_str(out, v);
                out.push(b']');
            }
        }
    }
}

fn write_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing a &str into a Vec cannot fail: a quoted, escaped JSON string.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// What the exported span and the stored row share, derived from the record once.
struct Shape<'a> {
    operation: &'static str,
    request_model: Option<&'a str>,
    start: u64,
    end: u64,
    first_token: Option<u64>,
}

impl<'a> Shape<'a> {
    /// None for records the proxy did not make (or with bad ids).
    fn of(r: &'a RequestRecord) -> Option<Shape<'a>> {
        if !is_hex_id(&r.span.span_id, 8)
            || !is_hex_id(&r.trace_id, 16)
            || !(r.span.parent_span_id.is_empty() || is_hex_id(&r.span.parent_span_id, 8))
        {
            return None;
        }
        let start = u64::try_from(r.arrival_unix_ms)
            .unwrap_or(0)
            .saturating_mul(1_000_000);
        let at = |secs: f64| start.saturating_add((secs.max(0.0) * 1e9) as u64);
        Some(Shape {
            operation: operation_of(&r.endpoint),
            request_model: (r.labels.model_id != tokenwatch_core::model::UNKNOWN_MODEL)
                .then_some(r.labels.model_id.as_str()),
            start,
            end: at(r.end_s),
            first_token: r.first_token_s.map(at),
        })
    }

    fn name(&self) -> String {
        match self.request_model {
            Some(m) => {
                let mut name = String::with_capacity(self.operation.len() + 1 + m.len());
                name.push_str(self.operation);
                name.push(' ');
                name.push_str(m);
                name
            }
            None => self.operation.to_string(),
        }
    }
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

    /// The span's attributes, in order, each handed to `f`: the one list both the exported
    /// span (`build`) and the stored row (`row`) are made from.
    fn attributes<'a>(
        &'a self,
        r: &'a RequestRecord,
        shape: &Shape<'a>,
        mut f: impl FnMut(&'static str, Attr<'a>),
    ) {
        f("gen_ai.operation.name", Attr::Str(shape.operation));
        let provider = if !r.labels.runtime.is_empty() {
            r.labels.runtime.as_str()
        } else if r.endpoint == "/v1/messages" {
            "anthropic"
        } else {
            "openai"
        };
        f("gen_ai.provider.name", Attr::Str(provider));
        if let Some(m) = shape.request_model {
            f("gen_ai.request.model", Attr::Str(m));
        }
        if !r.span.response_model.is_empty() {
            f("gen_ai.response.model", Attr::Str(&r.span.response_model));
        }
        f("gen_ai.request.stream", Attr::Bool(r.stream));
        if let Some(n) = r.prompt_tokens {
            f("gen_ai.usage.input_tokens", Attr::Int(saturating_i64(n)));
        }
        if let Some(n) = r.output_tokens {
            f("gen_ai.usage.output_tokens", Attr::Int(saturating_i64(n)));
        }
        if let Some(n) = r.reasoning_tokens {
            f(
                "gen_ai.usage.reasoning.output_tokens",
                Attr::Int(saturating_i64(n)),
            );
        }
        if let Some(n) = r.cached_input_tokens {
            f(
                "gen_ai.usage.cache_read.input_tokens",
                Attr::Int(saturating_i64(n)),
            );
        }
        if !r.finish_reason.is_empty() {
            f(
                "gen_ai.response.finish_reasons",
                Attr::OneStr(&r.finish_reason),
            );
        }
        if let Some(t) = r.first_token_s {
            f("gen_ai.response.time_to_first_chunk", Attr::Double(t));
        }
        match self.upstreams.get(&r.labels.instance) {
            Some((host, port)) => {
                f("server.address", Attr::Str(host));
                f("server.port", Attr::Int(*port));
            }
            None if !r.labels.instance.is_empty() => {
                f("server.address", Attr::Str(&r.labels.instance))
            }
            None => {}
        }
        f("http.request.method", Attr::Str("POST"));
        f("url.path", Attr::Str(&r.endpoint));
        if r.status != 0 {
            f("http.response.status_code", Attr::Int(i64::from(r.status)));
        }
        if let Some(class) = r.error_class {
            f("error.type", Attr::Str(class.name()));
        }
        f("tokenwatch.request_id", Attr::Str(&r.request_id));
        for (key, v) in [
            ("tokenwatch.tenant", &r.labels.tenant),
            ("tokenwatch.ab_group", &r.labels.ab_group),
            ("tokenwatch.model_version", &r.labels.model_version),
        ] {
            if !v.is_empty() {
                f(key, Attr::Str(v));
            }
        }
    }

    /// The proxy's span of `r`, for OTLP export; None for records the proxy did not make (or
    /// with bad ids).
    pub fn build(&self, r: &RequestRecord) -> Option<Span> {
        let shape = Shape::of(r)?;
        let span_id = span_id_bytes(&r.span.span_id, 8)?;
        let trace_id = span_id_bytes(&r.trace_id, 16)?;
        let parent_span_id = if r.span.parent_span_id.is_empty() {
            Vec::new()
        } else {
            span_id_bytes(&r.span.parent_span_id, 8)?
        };
        let mut a = Vec::with_capacity(20);
        self.attributes(r, &shape, |key, v| a.push(kv(key, v.to_value())));
        let events = shape
            .first_token
            .map(|t| Event {
                time_unix_nano: t,
                name: FIRST_TOKEN_EVENT.into(),
                ..Default::default()
            })
            .into_iter()
            .collect();
        let status = r.error_class.map(|class| Status {
            code: StatusCode::Error as i32,
            message: class.name().into(),
        });
        Some(Span {
            trace_id,
            span_id,
            parent_span_id,
            name: shape.name(),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: shape.start,
            end_time_unix_nano: shape.end,
            attributes: a,
            events,
            status,
            ..Default::default()
        })
    }

    /// The span a proxy replica ships to its aggregator (`role: proxy`): `build`'s span with the
    /// `tokenwatch.record.*` attributes that let the aggregator rebuild `r` exactly
    /// (`kernel::shipped_record`).
    pub fn build_shipped(&self, r: &RequestRecord) -> Option<Span> {
        let mut span = self.build(r)?;
        span.attributes
            .extend(crate::kernel::shipped_record::attributes(r));
        Some(span)
    }

    /// The stored row of the proxy's span of `r`, made straight from the record (no span is
    /// built: its attributes are written as JSON as they are visited); the same row as
    /// `row_of(&build(r)?, r)`. None where `build` gives none.
    pub fn row(&self, r: &RequestRecord) -> Option<SpanRow> {
        let shape = Shape::of(r)?;
        let mut json = Vec::with_capacity(640);
        json.push(b'{');
        self.attributes(r, &shape, |key, v| {
            if json.len() > 1 {
                json.push(b',');
            }
            write_json_str(&mut json, key);
            json.push(b':');
            v.write_json(&mut json);
        });
        json.push(b'}');
        Some(SpanRow {
            trace_id: r.trace_id.clone(),
            span_id: r.span.span_id.clone(),
            parent_span_id: r.span.parent_span_id.clone(),
            name: shape.name(),
            kind: SpanKind::Client as i32,
            start_unix_nano: saturating_i64(shape.start),
            end_unix_nano: saturating_i64(shape.end),
            status_code: if r.error_class.is_some() {
                StatusCode::Error as i32
            } else {
                0
            },
            status_message: r
                .error_class
                .map(|c| c.name().to_string())
                .unwrap_or_default(),
            service_name: SERVICE_NAME.into(),
            attributes_json: String::from_utf8(json).unwrap_or_default(),
            events_count: u32::from(shape.first_token.is_some()),
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
    /// None for a proxy replica (`role: proxy`), which has no store: export only.
    store: Option<StoreWriter>,
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
            store: Some(store),
            export,
        }
    }

    /// A sink that only queues the spans for OTLP export (a proxy replica's `export.otlp`).
    pub fn export_only(builder: ProxySpanBuilder, export: SpanExport) -> ProxySpanSink {
        ProxySpanSink {
            builder,
            store: None,
            export: Some(export),
        }
    }
}

impl RecordSink for ProxySpanSink {
    fn name(&self) -> &'static str {
        "proxy_spans"
    }

    fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError> {
        let mut rows = Vec::with_capacity(batch.len());
        let mut spans = Vec::new();
        for r in batch.iter().filter(|r| !r.span.span_id.is_empty()) {
            // The row is written straight from the record; a span is built only for export
            // (both or neither: `row` and `build` refuse the same records).
            if self.store.is_some()
                && let Some(row) = self.builder.row(r)
            {
                rows.push(row);
            }
            if self.export.is_some()
                && let Some(span) = self.builder.build(r)
            {
                spans.push(ExportSpan {
                    service_name: SERVICE_NAME.into(),
                    span,
                });
            }
        }
        if let Some(export) = &self.export {
            export.push(spans);
        }
        if let Some(store) = &self.store {
            store.spans(rows);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::telemetry::Metrics;
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

    fn s(v: &str) -> Value {
        Value::StringValue(v.to_string())
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
        r.labels.model_id = tokenwatch_core::model::UNKNOWN_MODEL.into();
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
    fn the_row_made_from_the_record_is_the_row_of_the_exported_span() {
        let b = ProxySpanBuilder::new(&upstreams());
        let mut variants = vec![record()];
        let mut r = record();
        r.span.parent_span_id.clear();
        r.labels.instance = "gpu-b".into();
        r.labels.model_id = tokenwatch_core::model::UNKNOWN_MODEL.into();
        r.labels.ab_group = "b".into();
        r.labels.model_version = "v2 \"quoted\"\n".into();
        r.endpoint = "/v1/completions".into();
        r.first_token_s = None;
        r.reasoning_tokens = Some(7);
        r.status = 502;
        r.error_class = Some(ErrorClass::UpstreamTimeout);
        variants.push(r);
        let mut r = record();
        r.labels.instance = "elsewhere:9".into();
        r.labels.runtime.clear();
        r.endpoint = "/v1/messages".into();
        r.first_token_s = Some(f64::NAN);
        r.finish_reason.clear();
        r.prompt_tokens = Some(u64::MAX);
        r.arrival_unix_ms = -5;
        r.status = 0;
        variants.push(r);
        let mut r = record();
        r.labels.instance.clear();
        r.trace_id = r.trace_id.to_uppercase();
        variants.push(r);
        for r in &variants {
            let span = b.build(r).unwrap();
            assert_eq!(b.row(r).unwrap(), row_of(&span, r), "{r:?}");
        }
        let mut bad = record();
        bad.span.parent_span_id = "b7ad6b716920333".into();
        assert!(b.build(&bad).is_none() && b.row(&bad).is_none());
        bad.span.parent_span_id = "g7ad6b7169203331".into();
        assert!(b.build(&bad).is_none() && b.row(&bad).is_none());
        let mut bad = record();
        bad.trace_id = "4bf92f3577b34da6".into();
        assert!(b.build(&bad).is_none() && b.row(&bad).is_none());
    }

    #[test]
    fn the_sink_stores_spans_and_queues_them_for_export() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn tokenwatch_store::Store> =
            Arc::new(tokenwatch_store::SqliteStore::open(dir.path(), Default::default()).unwrap());
        let cfg = crate::pipeline::StoreWriterConfig {
            queue_rows: 16,
            batch_max: 16,
            priority: Default::default(),
            flush_interval: std::time::Duration::ZERO,
        };
        let (writer, thread) =
            StoreWriter::start(store.clone(), cfg, Arc::new(Metrics::new())).unwrap();
        let mut sink = ProxySpanSink::new(ProxySpanBuilder::new(&upstreams()), writer, None);
        let mut other = record();
        other.span = ProxySpan::default();
        other.request_id = "otlp".into();
        sink.consume(&[record(), other]).unwrap();
        drop(sink);
        assert!(
            thread.finish(std::time::Duration::from_secs(5)),
            "the writer drained"
        );
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
