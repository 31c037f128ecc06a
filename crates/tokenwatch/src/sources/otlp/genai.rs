// Traces in: every span becomes a stored `SpanRow` (ids intact), and spans following the OTel
// GenAI conventions (or OpenInference's `llm.*`) also become `RequestRecord`s; spans with invalid
// ids are rejected and counted.
//
// OpenInference LLM and EMBEDDING spans (`openinference.span.kind`, or none) map to the same
// fields as the GenAI attributes, which win when both are present (any GenAI model or provider
// attribute keeps all of OpenInference's model or provider names out): `llm.request.model_name` →
// request model, `llm.response.model_name` / `llm.model_name` / `embedding.model_name` → response
// model, `llm.provider` → provider, `llm.system` → system, `llm.token_count.prompt|completion` →
// input/output tokens (one of them derived from `llm.token_count.total` when missing),
// `llm.token_count.completion_details.reasoning` → reasoning tokens; the span kind gives the
// operation (`chat`, `embeddings`). Spans of other OpenInference kinds (CHAIN, TOOL, …) are not
// model calls and stay plain spans.
//
// Streams and first tokens, as each common instrumentation reports them: the stream flag from
// `gen_ai.request.stream`, OpenLIT's `gen_ai.request.is_stream`, Traceloop's
// `gen_ai.is_streaming` (older releases: `llm.is_streaming`) or OpenInference's
// `llm.invocation_parameters` (JSON, `"stream": true`); the first-token time from
// `gen_ai.response.time_to_first_chunk`, OpenLIT's `gen_ai.server.time_to_first_token`
// (older releases: `gen_ai.server.ttft`; seconds), OpenInference's `First Token Stream Event`
// event, or the first of Traceloop's `gen_ai.content.completion.chunk` events (older releases:
// `llm.content.completion.chunk`), whose times also give the chunk offsets (inter-token gaps).
// A span with a first-token time is a stream unless it says otherwise; one that says it did not
// stream has no first-token time (OpenLIT gives its whole duration there). OpenLIT's clock starts
// after the response's headers came back: where the HTTP client span under its span was received
// (`http_children`), the wait for them is added back, so its first-token time is the client's.
//
// One model, one id: the requested model names the record (the response's model, often a
// longer or dated spelling of the same, stays in the span's attributes), as the proxy and the
// runtime's metrics name it; the response model only when no request model was sent.
//
// Our own span attributes on GenAI spans: `tokenwatch.output.embedding` (array of numbers, 1 to
// 4096: the response's embedding, for semantic drift; kept on the record, not in the stored span
// attributes) and `tokenwatch.prompt.prefix_hash` (1 to 16 hex digits or an integer's 64 bits:
// the prefix-cache key, for cache pollution). An unusable one is ignored with a warning.
//
// A proxy replica's span (`role: proxy`, `tokenwatch.record.schema`) also carries the fields of
// its record no GenAI attribute holds — request id, labels as the proxy named them, status and
// error class, every chunk's time — and becomes exactly the record the proxy made
// (`kernel::shipped_record`).

use super::attrs::{self, as_f64, as_str, as_u64, first_str, value_of};
use super::http_children::HttpChildren;
use crate::capture::telemetry::TelemetryText;
use crate::kernel::{shipped_first_token, shipped_record};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::{Span, status::StatusCode};
use tokenwatch_core::embedding::check_embedding;
use tokenwatch_core::model::{
    ErrorClass, FirstToken, RequestRecord, SeriesLabels, parse_prefix_key,
};
use tokenwatch_store::SpanRow;

/// What one export request of spans turns into.
#[derive(Debug, Default)]
pub struct TraceBatch {
    pub records: Vec<RequestRecord>,
    /// First tokens a proxy replica shipped ahead of their records
    /// (`kernel::shipped_first_token`): neither stored nor records.
    pub first_tokens: Vec<FirstToken>,
    pub spans: Vec<SpanRow>,
    /// Spans refused (invalid ids); they are neither stored nor turned into records.
    pub rejected: u64,
    /// Why the first refused span was refused; with none refused, the first ignored attribute
    /// (an OTLP partial-success warning).
    pub first_error: Option<String>,
    /// Spans accepted.
    pub accepted: u64,
    /// Feedback and scores sent as span attributes (`span_scores`).
    pub scores: Vec<tokenwatch_store::ScoreRow>,
}

/// Labels and facts shared by every span of one resource.
#[derive(Default)]
struct ResourceInfo<'a> {
    service_name: &'a str,
    service_instance: Option<&'a Value>,
    tenant: Option<&'a Value>,
    ab_group: Option<&'a Value>,
    model_version: Option<&'a Value>,
    prompt_version: Option<&'a Value>,
}

impl<'a> ResourceInfo<'a> {
    fn of(attrs: &'a [KeyValue]) -> ResourceInfo<'a> {
        let mut r = ResourceInfo::default();
        for kv in attrs {
            let v = value_of(kv);
            match kv.key.as_str() {
                "service.name" => {
                    if let Some(Value::StringValue(s)) = v {
                        r.service_name = s;
                    }
                }
                "service.instance.id" => r.service_instance = v,
                "tenant.id" | "tokenwatch.tenant" => r.tenant = r.tenant.or(v),
                "tokenwatch.ab_group" => r.ab_group = v,
                "gen_ai.request.model_version" | "tokenwatch.model_version" => {
                    r.model_version = r.model_version.or(v)
                }
                PROMPT_VERSION_ATTR | TW_PROMPT_VERSION_ATTR => {
                    r.prompt_version = r.prompt_version.or(v)
                }
                _ => {}
            }
        }
        r
    }
}

/// The GenAI attributes of one span, read in one pass.
#[derive(Default)]
struct GenAi<'a> {
    operation: Option<&'a Value>,
    request_model: Option<&'a Value>,
    response_model: Option<&'a Value>,
    provider: Option<&'a Value>,
    system: Option<&'a Value>,
    input_tokens: Option<&'a Value>,
    output_tokens: Option<&'a Value>,
    /// Reasoning tokens, included in `output_tokens` (semantic conventions v1.37+).
    reasoning_tokens: Option<&'a Value>,
    /// Input tokens read from the provider's prompt cache, included in `input_tokens`.
    cached_input_tokens: Option<&'a Value>,
    finish_reasons: Option<&'a Value>,
    time_to_first_chunk: Option<&'a Value>,
    server_address: Option<&'a Value>,
    server_port: Option<&'a Value>,
    error_type: Option<&'a Value>,
    http_status: Option<&'a Value>,
    route: Option<&'a Value>,
    stream: Option<&'a Value>,
    /// OpenLIT's `gen_ai.server.time_to_first_token` (seconds).
    server_ttft: Option<&'a Value>,
    tenant: Option<&'a Value>,
    ab_group: Option<&'a Value>,
    model_version: Option<&'a Value>,
    prompt_version: Option<&'a Value>,
    embedding: Option<&'a Value>,
    prefix_hash: Option<&'a Value>,
    /// A shipped record's chunk times are present (`kernel::shipped_record`).
    chunk_offsets: bool,
    /// `llm.token_count.total` (OpenInference), for a missing input or output count.
    total_tokens: Option<&'a Value>,
    /// The operation an OpenInference span kind implies when `gen_ai.operation.name` is absent.
    kind_operation: Option<&'static str>,
    /// `"stream"` of OpenInference's invocation parameters.
    invocation_stream: Option<bool>,
    oi: OpenInference<'a>,
}

/// OpenInference's `llm.*` attributes of one span, merged into the GenAI ones after the pass.
#[derive(Default)]
struct OpenInference<'a> {
    span_kind: Option<&'a Value>,
    model: Option<&'a Value>,
    request_model: Option<&'a Value>,
    response_model: Option<&'a Value>,
    provider: Option<&'a Value>,
    system: Option<&'a Value>,
    prompt_tokens: Option<&'a Value>,
    completion_tokens: Option<&'a Value>,
    reasoning_tokens: Option<&'a Value>,
    cached_input_tokens: Option<&'a Value>,
    total_tokens: Option<&'a Value>,
    /// `llm.invocation_parameters`: the call's parameters as JSON text (`"stream": true`).
    invocation_parameters: Option<&'a Value>,
}

impl OpenInference<'_> {
    /// The operation of a model-call span kind; None for other kinds. A span without a kind
    /// counts as an LLM call when it names a model.
    fn operation(&self) -> Option<&'static str> {
        match self.span_kind.and_then(as_str).as_deref() {
            Some(k) if k.eq_ignore_ascii_case("llm") => Some("chat"),
            Some(k) if k.eq_ignore_ascii_case("embedding") => Some("embeddings"),
            Some(_) => None,
            None => Some("chat"),
        }
    }

    fn names_a_model_call(&self) -> bool {
        self.span_kind.is_some()
            || self.model.is_some()
            || self.request_model.is_some()
            || self.response_model.is_some()
            || self.provider.is_some()
            || self.system.is_some()
    }
}

/// The response's embedding (array of numbers) on a GenAI span.
pub const EMBEDDING_ATTR: &str = "tokenwatch.output.embedding";
/// The prompt (template) version of a request, on the span or its resource; a change of the
/// version most requests carry is a version marker.
pub const PROMPT_VERSION_ATTR: &str = "gen_ai.prompt.version";
pub const TW_PROMPT_VERSION_ATTR: &str = "tokenwatch.prompt.version";
/// The prompt's prefix-cache key on a GenAI span.
pub const PREFIX_HASH_ATTR: &str = "tokenwatch.prompt.prefix_hash";

impl<'a> GenAi<'a> {
    fn of(attrs: &'a [KeyValue]) -> GenAi<'a> {
        let mut g = GenAi::default();
        for kv in attrs {
            let v = value_of(kv);
            let slot = match kv.key.as_str() {
                shipped_record::CHUNK_OFFSETS_ATTR => {
                    g.chunk_offsets = true;
                    continue;
                }
                "gen_ai.operation.name" => &mut g.operation,
                "gen_ai.request.model" => &mut g.request_model,
                "gen_ai.response.model" => &mut g.response_model,
                "gen_ai.provider.name" => &mut g.provider,
                "gen_ai.system" => &mut g.system,
                "gen_ai.usage.input_tokens" => &mut g.input_tokens,
                // Deprecated names: used only when the current ones are absent.
                "gen_ai.usage.prompt_tokens" if g.input_tokens.is_none() => &mut g.input_tokens,
                "gen_ai.usage.output_tokens" => &mut g.output_tokens,
                "gen_ai.usage.completion_tokens" if g.output_tokens.is_none() => {
                    &mut g.output_tokens
                }
                "gen_ai.usage.reasoning.output_tokens" => &mut g.reasoning_tokens,
                "gen_ai.usage.cache_read.input_tokens" => &mut g.cached_input_tokens,
                // An older name: used only when the current one is absent.
                "gen_ai.usage.cached_input_tokens" if g.cached_input_tokens.is_none() => {
                    &mut g.cached_input_tokens
                }
                "gen_ai.response.finish_reasons" => &mut g.finish_reasons,
                "gen_ai.response.time_to_first_chunk" => &mut g.time_to_first_chunk,
                "server.address" => &mut g.server_address,
                "server.port" => &mut g.server_port,
                "error.type" => &mut g.error_type,
                "http.response.status_code" => &mut g.http_status,
                "http.route" | "url.path" => &mut g.route,
                "gen_ai.request.stream"
                | "gen_ai.request.is_stream"
                | "gen_ai.is_streaming"
                | "llm.is_streaming" => &mut g.stream,
                "gen_ai.server.time_to_first_token" | "gen_ai.server.ttft" => &mut g.server_ttft,
                "tenant.id" | "tokenwatch.tenant" => &mut g.tenant,
                "tokenwatch.ab_group" => &mut g.ab_group,
                "gen_ai.request.model_version" | "tokenwatch.model_version" => &mut g.model_version,
                PROMPT_VERSION_ATTR | TW_PROMPT_VERSION_ATTR => &mut g.prompt_version,
                EMBEDDING_ATTR => &mut g.embedding,
                PREFIX_HASH_ATTR => &mut g.prefix_hash,
                "openinference.span.kind" => &mut g.oi.span_kind,
                "llm.model_name" | "embedding.model_name" => &mut g.oi.model,
                "llm.request.model_name" => &mut g.oi.request_model,
                "llm.response.model_name" => &mut g.oi.response_model,
                "llm.provider" => &mut g.oi.provider,
                "llm.system" => &mut g.oi.system,
                "llm.token_count.prompt" => &mut g.oi.prompt_tokens,
                "llm.token_count.completion" => &mut g.oi.completion_tokens,
                "llm.token_count.completion_details.reasoning" => &mut g.oi.reasoning_tokens,
                "llm.token_count.prompt_details.cache_read" => &mut g.oi.cached_input_tokens,
                "llm.token_count.total" => &mut g.oi.total_tokens,
                "llm.invocation_parameters" => &mut g.oi.invocation_parameters,
                _ => continue,
            };
            *slot = v;
        }
        g.merge_openinference();
        g
    }

    /// Fill what the GenAI attributes left empty from OpenInference's, on model-call spans.
    fn merge_openinference(&mut self) {
        let oi = std::mem::take(&mut self.oi);
        let Some(operation) = oi.operation().filter(|_| oi.names_a_model_call()) else {
            return;
        };
        self.kind_operation = Some(operation);
        // The model and the provider as a whole: one GenAI name of either keeps all of OpenInference's out.
        if self.request_model.is_none() && self.response_model.is_none() {
            self.request_model = oi.request_model;
            self.response_model = oi.response_model.or(oi.model);
        }
        if self.provider.is_none() && self.system.is_none() {
            self.provider = oi.provider;
            self.system = oi.system;
        }
        self.input_tokens = self.input_tokens.or(oi.prompt_tokens);
        self.output_tokens = self.output_tokens.or(oi.completion_tokens);
        self.reasoning_tokens = self.reasoning_tokens.or(oi.reasoning_tokens);
        self.cached_input_tokens = self.cached_input_tokens.or(oi.cached_input_tokens);
        self.total_tokens = oi.total_tokens;
        self.invocation_stream = oi
            .invocation_parameters
            .and_then(as_str)
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("stream").and_then(serde_json::Value::as_bool));
    }

    fn is_genai(&self) -> bool {
        self.operation.is_some()
            || self.kind_operation.is_some()
            || self.request_model.is_some()
            || self.response_model.is_some()
            || self.provider.is_some()
            || self.system.is_some()
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(as_str).map(|s| s.into_owned())
}

/// `tokenwatch.output.embedding`: an array of 1 to 4096 finite numbers, not all zero.
fn embedding_of(v: &Value) -> Result<Vec<f32>, String> {
    let Value::ArrayValue(a) = v else {
        return Err(format!("{EMBEDDING_ATTR} must be an array of numbers"));
    };
    let mut values = Vec::with_capacity(a.values.len());
    for (i, x) in a.values.iter().enumerate() {
        match x.value.as_ref() {
            Some(Value::DoubleValue(d)) => values.push(*d),
            Some(Value::IntValue(n)) => values.push(*n as f64),
            _ => return Err(format!("{EMBEDDING_ATTR}[{i}] is not a number")),
        }
    }
    check_embedding(&values).map_err(|e| format!("{EMBEDDING_ATTR} {e}"))
}

/// `tokenwatch.prompt.prefix_hash`: 1 to 16 hex digits, or an integer (its 64 bits).
fn prefix_key_of(v: &Value) -> Result<u64, String> {
    match v {
        Value::StringValue(s) => parse_prefix_key(s.trim())
            .ok_or_else(|| format!("{PREFIX_HASH_ATTR} {s:?} is not 1 to 16 hex digits")),
        Value::IntValue(n) => Ok(*n as u64),
        _ => Err(format!(
            "{PREFIX_HASH_ATTR} must be a hex string or an integer"
        )),
    }
}

/// Map one export request. `rows`: build the stored span rows with their text as it says (None
/// skips them: benchmarks of the records alone). Only this request's HTTP client spans are
/// known (`map_traces_with` for the receiver's).
pub fn map_traces(req: &ExportTraceServiceRequest, rows: Option<&TelemetryText>) -> TraceBatch {
    map_traces_with(req, rows, &HttpChildren::default())
}

/// Map one export request, `children` holding the HTTP client spans received before (and taking
/// this request's).
pub fn map_traces_with(
    req: &ExportTraceServiceRequest,
    rows: Option<&TelemetryText>,
    children: &HttpChildren,
) -> TraceBatch {
    children.note(req);
    let mut out = TraceBatch::default();
    let mut first_warning = None;
    for rs in &req.resource_spans {
        let res_attrs = rs
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or(&[]);
        let res = ResourceInfo::of(res_attrs);
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                if shipped_first_token::is_first_token(&span.attributes) {
                    match shipped_first_token::read(span) {
                        Ok(f) => {
                            out.accepted += 1;
                            out.first_tokens.push(f);
                        }
                        Err(e) => {
                            out.rejected += 1;
                            if out.first_error.is_none() {
                                out.first_error = Some(format!("span {:?}: {e}", span.name));
                            }
                        }
                    }
                    continue;
                }
                match map_span(span, &res, rows, children) {
                    Ok((record, row, warning)) => {
                        out.accepted += 1;
                        let (scores, score_warning) = super::span_scores::of(&span.attributes);
                        if !scores.is_empty()
                            && let Ok(trace_id) = attrs::trace_id(&span.trace_id)
                        {
                            let request_id = record.as_ref().map(|r| r.request_id.as_str());
                            let at = match nanos(span.end_time_unix_nano) / 1_000_000 {
                                0 => tokenwatch_core::clock::now_unix_ms(),
                                ms => ms,
                            };
                            out.scores.extend(super::span_scores::rows(
                                scores, &trace_id, request_id, at,
                            ));
                        }
                        let warning = warning.or(score_warning);
                        out.records.extend(record);
                        out.spans.extend(row);
                        if let Some(w) = warning
                            && first_warning.is_none()
                        {
                            first_warning = Some(format!("span {:?}: {w} (ignored)", span.name));
                        }
                    }
                    Err(e) => {
                        out.rejected += 1;
                        if out.first_error.is_none() {
                            out.first_error = Some(format!("span {:?}: {e}", span.name));
                        }
                    }
                }
            }
        }
    }
    // A refused span's reason takes precedence over an ignored attribute's warning.
    if out.first_error.is_none() {
        out.first_error = first_warning;
    }
    out
}

/// The record (GenAI spans), the stored row, and a warning about an ignored attribute.
type Mapped = (Option<RequestRecord>, Option<SpanRow>, Option<String>);

fn map_span(
    span: &Span,
    res: &ResourceInfo<'_>,
    rows: Option<&TelemetryText>,
    children: &HttpChildren,
) -> Result<Mapped, attrs::IdError> {
    let trace_id = attrs::trace_id(&span.trace_id)?;
    let span_id = attrs::span_id(&span.span_id)?;
    let parent = attrs::parent_span_id(&span.parent_span_id)?;
    let g = GenAi::of(&span.attributes);
    let mut warning = None;
    let record = if g.is_genai() {
        let headers_at = children.take(span);
        let mut r = record_of(span, &g, res, &trace_id, &span_id, headers_at);
        // A proxy replica's span (`role: proxy`) carries the rest of its record exactly.
        warning = shipped_record::apply(&span.attributes, &mut r).map(|e| e.to_string());
        r.summarize_gaps();
        if let Some(v) = g.embedding {
            match embedding_of(v) {
                Ok(e) => r.embedding = e,
                Err(e) => warning = Some(e),
            }
        }
        if let Some(v) = g.prefix_hash {
            match prefix_key_of(v) {
                Ok(k) => r.prefix_key = Some(k),
                Err(e) => warning = warning.or(Some(e)),
            }
        }
        Some(r)
    } else {
        None
    };
    let row = rows.map(|text| {
        let status = span.status.as_ref();
        SpanRow {
            trace_id,
            span_id,
            parent_span_id: parent,
            name: text.free_text(span.name.clone()),
            kind: span.kind,
            start_unix_nano: nanos(span.start_time_unix_nano),
            end_unix_nano: nanos(span.end_time_unix_nano),
            status_code: status.map(|s| s.code).unwrap_or(0),
            status_message: text.free_text(status.map(|s| s.message.clone()).unwrap_or_default()),
            service_name: res.service_name.to_string(),
            // The embedding and a shipped record's chunk times are kept on the record; stored
            // twice they would dominate the span row.
            attributes_json: if g.is_genai() && (g.embedding.is_some() || g.chunk_offsets) {
                let kept: Vec<KeyValue> = span
                    .attributes
                    .iter()
                    .filter(|kv| {
                        kv.key != EMBEDDING_ATTR && kv.key != shipped_record::CHUNK_OFFSETS_ATTR
                    })
                    .cloned()
                    .collect();
                attrs::to_stored_json_object(&kept, text)
            } else {
                attrs::to_stored_json_object(&span.attributes, text)
            },
            events_count: u32::try_from(span.events.len()).unwrap_or(u32::MAX),
        }
    });
    Ok((record, row, warning))
}

fn nanos(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The request record of a GenAI span (see the module comment of `mod.rs` for the mapping);
/// `headers_at` is when the HTTP client span under it ended (unix ns), if one was received.
fn record_of(
    span: &Span,
    g: &GenAi<'_>,
    res: &ResourceInfo<'_>,
    trace_id: &str,
    span_id: &str,
    headers_at: Option<u64>,
) -> RequestRecord {
    let model_id = text(g.request_model)
        .or_else(|| text(g.response_model))
        .unwrap_or_else(|| "unknown".into());
    let runtime = text(g.provider)
        .or_else(|| text(g.system))
        .or_else(|| (!res.service_name.is_empty()).then(|| res.service_name.to_string()))
        .unwrap_or_else(|| "otlp".into());
    let instance = match (text(g.server_address), text(g.server_port)) {
        (Some(a), Some(p)) => format!("{a}:{p}"),
        (Some(a), None) => a,
        _ => text(res.service_instance).unwrap_or_default(),
    };
    let labels = SeriesLabels {
        model_id,
        runtime,
        instance,
        tenant: text(g.tenant.or(res.tenant)).unwrap_or_default(),
        ab_group: text(g.ab_group.or(res.ab_group)).unwrap_or_default(),
        model_version: text(g.model_version.or(res.model_version)).unwrap_or_default(),
    };
    let start = span.start_time_unix_nano;
    let end_s = span.end_time_unix_nano.saturating_sub(start) as f64 / 1e9;
    let events = StreamEvents::of(span);
    // OpenLIT's time to first token runs from when the response's headers came back; the HTTP
    // client span under its span ended then: the wait before it is added back.
    let headers_wait_s = headers_at
        .filter(|end| (start..=span.end_time_unix_nano).contains(end))
        .map_or(0.0, |end| (end - start) as f64 / 1e9);
    let first_token_s = g
        .time_to_first_chunk
        .and_then(as_f64)
        .filter(|t| *t >= 0.0)
        .or_else(|| {
            g.server_ttft
                .and_then(as_f64)
                .filter(|t| *t >= 0.0)
                .map(|t| t + headers_wait_s)
        })
        .or(events.first_token_s);
    let stream = match (g.stream, g.invocation_stream) {
        (Some(Value::BoolValue(b)), _) => *b,
        (Some(Value::StringValue(t)), _) if t.eq_ignore_ascii_case("true") => true,
        (Some(Value::StringValue(t)), _) if t.eq_ignore_ascii_case("false") => false,
        (_, Some(b)) => b,
        _ => first_token_s.is_some(),
    };
    // A call that did not stream has no first token apart from its answer (OpenLIT reports its
    // whole duration as the time to first token), as the proxy records it.
    let first_token_s = first_token_s.filter(|_| stream);
    let (prompt_tokens, output_tokens) = match (
        g.input_tokens.and_then(as_u64),
        g.output_tokens.and_then(as_u64),
        g.total_tokens.and_then(as_u64),
    ) {
        (Some(p), None, Some(t)) => (Some(p), t.checked_sub(p)),
        (None, Some(o), Some(t)) => (t.checked_sub(o), Some(o)),
        (p, o, _) => (p, o),
    };
    let span_error = span
        .status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32);
    let http_status = g
        .http_status
        .and_then(as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .filter(|s| (100..600).contains(s));
    let (status, error_class) = match http_status {
        Some(s) if s >= 500 => (s, Some(ErrorClass::Upstream5xx)),
        Some(s) if s >= 400 => (s, Some(ErrorClass::Upstream4xx)),
        _ if span_error || g.error_type.is_some() => (500, Some(ErrorClass::Upstream5xx)),
        Some(s) => (s, None),
        None => (200, None),
    };
    RequestRecord {
        request_id: span_id.to_string(),
        trace_id: trace_id.to_string(),
        labels,
        prompt_version: text(g.prompt_version.or(res.prompt_version)).unwrap_or_default(),
        endpoint: text(g.route)
            .or_else(|| text(g.operation))
            .or_else(|| g.kind_operation.map(String::from))
            .unwrap_or_default(),
        stream,
        arrival_unix_ms: nanos(start / 1_000_000),
        upstream_headers_s: None,
        first_token_s,
        end_s,
        queue_s: None,
        chunk_offsets_us: events.chunk_offsets_us,
        gaps: Default::default(),
        tokens_from_usage: prompt_tokens.is_some() || output_tokens.is_some(),
        prompt_tokens,
        output_tokens,
        reasoning_tokens: g.reasoning_tokens.and_then(as_u64),
        cached_input_tokens: g.cached_input_tokens.and_then(as_u64),
        cost_usd: None,
        finish_reason: g
            .finish_reasons
            .and_then(first_str)
            .map(|s| s.into_owned())
            .unwrap_or_default(),
        status,
        error_class,
        embedding: Vec::new(),
        prefix_key: None,
        text: None,
        span: Default::default(),
    }
}

/// OpenInference's first-token event.
pub const OPENINFERENCE_FIRST_TOKEN_EVENT: &str = "First Token Stream Event";
/// Traceloop's (OpenLLMetry's) event per streamed chunk: its current name, and the one of
/// releases before 0.4x.
pub const TRACELOOP_CHUNK_EVENT: &str = "gen_ai.content.completion.chunk";
pub const TRACELOOP_CHUNK_EVENT_OLD: &str = "llm.content.completion.chunk";

/// What a span's events say about its stream: the first token's time and every chunk's, in
/// seconds / microseconds after the span's start.
#[derive(Debug, Default)]
struct StreamEvents {
    first_token_s: Option<f64>,
    chunk_offsets_us: Vec<u32>,
}

impl StreamEvents {
    fn of(span: &Span) -> StreamEvents {
        let start = span.start_time_unix_nano;
        let after = |t: u64| t.checked_sub(start);
        let mut first = None;
        let mut chunks: Vec<u32> = Vec::new();
        for e in &span.events {
            match e.name.as_str() {
                OPENINFERENCE_FIRST_TOKEN_EVENT => {
                    if let Some(ns) = after(e.time_unix_nano) {
                        first = Some(first.map_or(ns, |f: u64| f.min(ns)));
                    }
                }
                TRACELOOP_CHUNK_EVENT | TRACELOOP_CHUNK_EVENT_OLD => {
                    if let Some(ns) = after(e.time_unix_nano) {
                        chunks.push(u32::try_from(ns / 1_000).unwrap_or(u32::MAX));
                    }
                }
                _ => {}
            }
        }
        chunks.sort_unstable();
        let first_ns = first.or_else(|| chunks.first().map(|us| u64::from(*us) * 1_000));
        StreamEvents {
            first_token_s: first_ns.map(|ns| ns as f64 / 1e9),
            chunk_offsets_us: chunks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status};

    fn kv(k: &str, v: Value) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }
    fn s(v: &str) -> Value {
        Value::StringValue(v.into())
    }

    fn genai_span() -> Span {
        Span {
            trace_id: vec![0xab; 16],
            span_id: vec![0x01; 8],
            parent_span_id: vec![0x02; 8],
            name: "chat llama".into(),
            kind: 3,
            start_time_unix_nano: 1_700_000_000_123_000_000,
            end_time_unix_nano: 1_700_000_002_123_000_000,
            attributes: vec![
                kv("gen_ai.operation.name", s("chat")),
                kv("gen_ai.request.model", s("llama-req")),
                kv("gen_ai.response.model", s("llama-resp")),
                kv("gen_ai.provider.name", s("vllm")),
                kv("gen_ai.usage.prompt_tokens", Value::IntValue(99)),
                kv("gen_ai.usage.input_tokens", Value::IntValue(100)),
                kv("gen_ai.usage.completion_tokens", Value::IntValue(20)),
                kv("gen_ai.usage.reasoning.output_tokens", Value::IntValue(12)),
                kv("gen_ai.usage.cache_read.input_tokens", Value::IntValue(64)),
                kv(
                    "gen_ai.response.finish_reasons",
                    Value::ArrayValue(ArrayValue {
                        values: vec![AnyValue {
                            value: Some(s("stop")),
                        }],
                    }),
                ),
                kv(
                    "gen_ai.response.time_to_first_chunk",
                    Value::DoubleValue(0.25),
                ),
                kv("server.address", s("gpu-1")),
                kv("server.port", Value::IntValue(8000)),
                kv("tokenwatch.ab_group", s("b")),
            ],
            ..Default::default()
        }
    }

    fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.name", s("chat-app")),
                        kv("tenant.id", s("acme")),
                    ],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn genai_span_becomes_a_record() {
        let b = map_traces(
            &request(vec![genai_span()]),
            Some(&TelemetryText::dropping()),
        );
        assert_eq!((b.accepted, b.rejected), (1, 0));
        let r = &b.records[0];
        // The requested model is the id (as the proxy and the runtime name it).
        assert_eq!(r.labels.model_id, "llama-req");
        assert_eq!(r.labels.runtime, "vllm");
        assert_eq!(r.labels.instance, "gpu-1:8000");
        assert_eq!(r.labels.tenant, "acme");
        assert_eq!(r.labels.ab_group, "b");
        assert_eq!(r.request_id, "0101010101010101");
        assert_eq!(r.trace_id, "ab".repeat(16));
        assert_eq!(r.arrival_unix_ms, 1_700_000_000_123);
        assert!((r.end_s - 2.0).abs() < 1e-9);
        assert_eq!(r.first_token_s, Some(0.25));
        assert!(r.stream);
        assert_eq!(
            (r.prompt_tokens, r.output_tokens, r.tokens_from_usage),
            (Some(100), Some(20), true)
        );
        assert_eq!(r.reasoning_tokens, Some(12));
        assert_eq!(r.cached_input_tokens, Some(64));
        assert_eq!(r.finish_reason, "stop");
        assert_eq!((r.status, r.error_class), (200, None));
        assert_eq!(r.endpoint, "chat");
        let row = &b.spans[0];
        assert_eq!(row.parent_span_id, "0202020202020202");
        assert_eq!(row.service_name, "chat-app");
        assert!(
            row.attributes_json
                .contains(r#""gen_ai.usage.input_tokens":100"#)
        );
    }

    fn event(
        name: &str,
        after_start_ms: u64,
    ) -> opentelemetry_proto::tonic::trace::v1::span::Event {
        opentelemetry_proto::tonic::trace::v1::span::Event {
            name: name.into(),
            time_unix_nano: 1_700_000_000_123_000_000 + after_start_ms * 1_000_000,
            ..Default::default()
        }
    }

    /// A streamed chat span without the GenAI first-chunk attribute, as an instrumentation
    /// other than the conventions' own sends it.
    fn bare_stream_span(attributes: Vec<KeyValue>, events: Vec<(&str, u64)>) -> RequestRecord {
        let mut span = genai_span();
        span.attributes
            .retain(|kv| kv.key != "gen_ai.response.time_to_first_chunk");
        span.attributes.extend(attributes);
        span.events = events.into_iter().map(|(n, t)| event(n, t)).collect();
        let b = map_traces(&request(vec![span]), None);
        assert_eq!(b.records.len(), 1);
        b.records[0].clone()
    }

    #[test]
    fn openinference_streams_take_their_first_token_from_the_event_and_the_flag_from_the_parameters()
     {
        let r = bare_stream_span(
            vec![kv(
                "llm.invocation_parameters",
                s(
                    r#"{"model": "llama-req", "stream": true, "stream_options": {"include_usage": true}}"#,
                ),
            )],
            vec![("First Token Stream Event", 180), ("other", 5)],
        );
        assert!(r.stream);
        assert_eq!(r.first_token_s, Some(0.18));
        // Not streamed: the parameters say so, and no first token is invented.
        let r = bare_stream_span(
            vec![kv("llm.invocation_parameters", s(r#"{"stream": false}"#))],
            vec![],
        );
        assert!(!r.stream);
        assert_eq!(r.first_token_s, None);
    }

    #[test]
    fn traceloop_chunk_events_give_the_first_token_and_the_gaps() {
        let r = bare_stream_span(
            vec![kv("llm.is_streaming", Value::BoolValue(true))],
            vec![
                ("llm.content.completion.chunk", 250),
                ("llm.content.completion.chunk", 210),
                ("llm.content.completion.chunk", 300),
            ],
        );
        assert!(r.stream);
        assert_eq!(r.first_token_s, Some(0.21));
        assert_eq!(r.chunk_offsets_us, vec![210_000, 250_000, 300_000]);
        assert_eq!(r.gaps.count, 2);
        assert!((r.gaps.max_s - 0.05).abs() < 1e-9, "{:?}", r.gaps);
    }

    #[test]
    fn current_traceloop_names_give_the_stream_and_the_first_token() {
        // traceloop-sdk 0.62: `gen_ai.is_streaming` and `gen_ai.content.completion.chunk`.
        let r = bare_stream_span(
            vec![kv("gen_ai.is_streaming", Value::BoolValue(true))],
            vec![
                ("gen_ai.content.completion.chunk", 80),
                ("gen_ai.content.completion.chunk", 95),
            ],
        );
        assert!(r.stream);
        assert_eq!(r.first_token_s, Some(0.08));
        assert_eq!(r.chunk_offsets_us, vec![80_000, 95_000]);
    }

    #[test]
    fn openlit_stream_flag_and_server_first_token_time() {
        let r = bare_stream_span(
            vec![
                kv("gen_ai.request.is_stream", Value::BoolValue(true)),
                kv(
                    "gen_ai.server.time_to_first_token",
                    Value::DoubleValue(0.042),
                ),
            ],
            vec![],
        );
        assert!(r.stream);
        assert_eq!(r.first_token_s, Some(0.042));
        // None of them: no first token, not a stream.
        let r = bare_stream_span(vec![], vec![]);
        assert_eq!((r.first_token_s, r.stream), (None, false));
        // OpenLIT on a call that did not stream: its "first token" is the whole answer.
        let r = bare_stream_span(
            vec![
                kv("gen_ai.request.is_stream", Value::BoolValue(false)),
                kv(
                    "gen_ai.server.time_to_first_token",
                    Value::DoubleValue(0.265),
                ),
            ],
            vec![],
        );
        assert_eq!((r.first_token_s, r.stream), (None, false));
    }

    #[test]
    fn openlit_first_token_adds_back_the_wait_for_the_headers_of_its_http_child() {
        // OpenLIT (1.45) on a stream: its span starts before the request; the httpx span under
        // it ends when the headers came back, 12 ms later; its clock starts there and reads
        // 42 ms to the first chunk: the client felt 54 ms.
        let mut span = genai_span();
        span.attributes
            .retain(|kv| kv.key != "gen_ai.response.time_to_first_chunk");
        span.attributes.extend([
            kv("gen_ai.request.stream", Value::BoolValue(true)),
            kv(
                "gen_ai.server.time_to_first_token",
                Value::DoubleValue(0.042),
            ),
        ]);
        let start = span.start_time_unix_nano;
        let child = |end: u64| Span {
            trace_id: span.trace_id.clone(),
            span_id: vec![0x77; 8],
            parent_span_id: span.span_id.clone(),
            name: "POST".into(),
            kind: 3,
            start_time_unix_nano: start + 500_000,
            end_time_unix_nano: end,
            attributes: vec![kv("http.method", s("POST"))],
            ..Default::default()
        };
        let first = |b: &TraceBatch| b.records[0].first_token_s.unwrap();
        // In the same export, the child first (as the SDK's processors send them) or after.
        for spans in [
            vec![child(start + 12_000_000), span.clone()],
            vec![span.clone(), child(start + 12_000_000)],
        ] {
            let b = map_traces(&request(spans), None);
            assert_eq!(b.records.len(), 1, "the HTTP span is no record");
            assert!((first(&b) - 0.054).abs() < 1e-9, "{}", first(&b));
        }
        // In an earlier export to the receiver (SimpleSpanProcessor: one span per export).
        let children = HttpChildren::default();
        let b = map_traces_with(&request(vec![child(start + 12_000_000)]), None, &children);
        assert!(b.records.is_empty());
        let b = map_traces_with(&request(vec![span.clone()]), None, &children);
        assert!((first(&b) - 0.054).abs() < 1e-9, "{}", first(&b));
        assert!(children.is_empty(), "taken by its parent");
        // No child received, or one ending outside the span: OpenLIT's own figure.
        let b = map_traces_with(&request(vec![span.clone()]), None, &children);
        assert_eq!(first(&b), 0.042);
        let late = child(span.end_time_unix_nano + 1);
        let b = map_traces(&request(vec![late, span.clone()]), None);
        assert_eq!(first(&b), 0.042);
        // An instrumentation's own client-side first chunk time is taken as it is.
        let mut oi = genai_span();
        oi.span_id = vec![0x05; 8];
        let mut c = child(start + 12_000_000);
        c.parent_span_id = oi.span_id.clone();
        let b = map_traces(&request(vec![c, oi]), None);
        assert_eq!(first(&b), 0.25);
    }

    fn doubles(v: &[f64]) -> Value {
        Value::ArrayValue(ArrayValue {
            values: v
                .iter()
                .map(|d| AnyValue {
                    value: Some(Value::DoubleValue(*d)),
                })
                .collect(),
        })
    }

    #[test]
    fn embedding_and_prefix_hash_reach_the_record_not_the_span_row() {
        let mut span = genai_span();
        span.attributes
            .push(kv(EMBEDDING_ATTR, doubles(&[0.25, -0.5, 1.0])));
        span.attributes
            .push(kv(PREFIX_HASH_ATTR, s("00ABCDEF01234567")));
        let mut int_key = genai_span();
        int_key.span_id = vec![0x03; 8];
        int_key
            .attributes
            .push(kv(PREFIX_HASH_ATTR, Value::IntValue(-1)));
        let b = map_traces(
            &request(vec![span, int_key]),
            Some(&TelemetryText::dropping()),
        );
        assert_eq!(
            (b.accepted, b.rejected, b.first_error.as_deref()),
            (2, 0, None)
        );
        assert_eq!(b.records[0].embedding, vec![0.25, -0.5, 1.0]);
        assert_eq!(b.records[0].prefix_key, Some(0x00ab_cdef_0123_4567));
        assert_eq!(b.records[1].prefix_key, Some(u64::MAX));
        assert!(b.records[1].embedding.is_empty());
        assert!(
            !b.spans[0].attributes_json.contains(EMBEDDING_ATTR),
            "{}",
            b.spans[0].attributes_json
        );
        assert!(b.spans[0].attributes_json.contains(PREFIX_HASH_ATTR));
    }

    #[test]
    fn unusable_embedding_or_prefix_hash_is_ignored_with_a_warning() {
        let mut nan = genai_span();
        nan.attributes
            .push(kv(EMBEDDING_ATTR, doubles(&[1.0, f64::NAN])));
        let mut text = genai_span();
        text.attributes.push(kv(
            EMBEDDING_ATTR,
            Value::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(s("x")),
                }],
            }),
        ));
        let mut key = genai_span();
        key.attributes.push(kv(PREFIX_HASH_ATTR, s("not-hex")));
        for (span, want) in [
            (
                nan,
                "tokenwatch.output.embedding element 1 is not a finite number",
            ),
            (text, "tokenwatch.output.embedding[0] is not a number"),
            (
                key,
                "tokenwatch.prompt.prefix_hash \"not-hex\" is not 1 to 16 hex digits",
            ),
        ] {
            let b = map_traces(&request(vec![span]), Some(&TelemetryText::dropping()));
            assert_eq!((b.accepted, b.rejected, b.records.len()), (1, 0, 1));
            let msg = b.first_error.unwrap_or_default();
            assert!(msg.contains(want) && msg.ends_with("(ignored)"), "{msg}");
            assert!(b.records[0].embedding.is_empty() && b.records[0].prefix_key.is_none());
        }
        // A refused span's reason wins over a warning.
        let mut warn = genai_span();
        warn.attributes.push(kv(EMBEDDING_ATTR, doubles(&[])));
        let bad = Span {
            trace_id: vec![1; 15],
            span_id: vec![2; 8],
            name: "bad".into(),
            ..Default::default()
        };
        let b = map_traces(&request(vec![warn, bad]), Some(&TelemetryText::dropping()));
        assert!(b.first_error.unwrap_or_default().contains("trace_id"));
    }

    fn span_with(attributes: Vec<KeyValue>) -> Span {
        Span {
            trace_id: vec![0xcd; 16],
            span_id: vec![0x05; 8],
            name: "ChatCompletion".into(),
            start_time_unix_nano: 1_700_000_000_000_000_000,
            end_time_unix_nano: 1_700_000_001_500_000_000,
            attributes,
            ..Default::default()
        }
    }

    #[test]
    fn openinference_llm_spans_map_to_the_genai_fields() {
        let llm = span_with(vec![
            kv("openinference.span.kind", s("LLM")),
            kv("llm.model_name", s("gpt-4o-2024-08-06")),
            kv("llm.provider", s("azure")),
            kv("llm.system", s("openai")),
            kv("llm.token_count.prompt", Value::IntValue(120)),
            kv("llm.token_count.completion", Value::IntValue(30)),
            kv(
                "llm.token_count.completion_details.reasoning",
                Value::IntValue(8),
            ),
            kv("llm.token_count.total", Value::IntValue(150)),
        ]);
        let mut embedding = span_with(vec![
            kv("openinference.span.kind", s("EMBEDDING")),
            kv("embedding.model_name", s("text-embedding-3-small")),
            kv("llm.token_count.total", Value::IntValue(42)),
            kv("llm.token_count.prompt", Value::IntValue(42)),
        ]);
        embedding.span_id = vec![0x06; 8];
        // GenAI attributes win over OpenInference ones; a total fills the missing count.
        let mut both = span_with(vec![
            kv("gen_ai.request.model", s("llama-req")),
            kv("gen_ai.provider.name", s("vllm")),
            kv("llm.model_name", s("ignored")),
            kv("llm.provider", s("ignored")),
            kv("gen_ai.usage.input_tokens", Value::IntValue(10)),
            kv("llm.token_count.prompt", Value::IntValue(99)),
            kv("llm.token_count.total", Value::IntValue(25)),
        ]);
        both.span_id = vec![0x07; 8];
        let b = map_traces(
            &request(vec![llm, embedding, both]),
            Some(&TelemetryText::dropping()),
        );
        assert_eq!((b.accepted, b.rejected, b.records.len()), (3, 0, 3));
        let r = &b.records[0];
        assert_eq!(r.labels.model_id, "gpt-4o-2024-08-06");
        assert_eq!(r.labels.runtime, "azure");
        assert_eq!(
            (r.prompt_tokens, r.output_tokens, r.reasoning_tokens),
            (Some(120), Some(30), Some(8))
        );
        assert!(r.tokens_from_usage);
        assert_eq!(r.endpoint, "chat");
        assert!((r.end_s - 1.5).abs() < 1e-9);
        let e = &b.records[1];
        assert_eq!(e.labels.model_id, "text-embedding-3-small");
        assert_eq!(e.endpoint, "embeddings");
        assert_eq!((e.prompt_tokens, e.output_tokens), (Some(42), Some(0)));
        let w = &b.records[2];
        assert_eq!(
            (w.labels.model_id.as_str(), w.labels.runtime.as_str()),
            ("llama-req", "vllm")
        );
        assert_eq!((w.prompt_tokens, w.output_tokens), (Some(10), Some(15)));
        // The stored rows keep every attribute as sent.
        assert!(
            b.spans[0]
                .attributes_json
                .contains(r#""llm.model_name":"gpt-4o-2024-08-06""#)
        );
    }

    #[test]
    fn openinference_spans_that_are_not_model_calls_stay_plain_spans() {
        let chain = span_with(vec![
            kv("openinference.span.kind", s("CHAIN")),
            kv("llm.model_name", s("gpt-4o")),
            kv("input.value", s("hello")),
        ]);
        let mut tool = span_with(vec![kv("openinference.span.kind", s("TOOL"))]);
        tool.span_id = vec![0x08; 8];
        let mut bare = span_with(vec![kv("llm.model_name", s("gpt-4o"))]);
        bare.span_id = vec![0x09; 8];
        let b = map_traces(
            &request(vec![chain, tool, bare]),
            Some(&TelemetryText::dropping()),
        );
        assert_eq!((b.accepted, b.spans.len()), (3, 3));
        // Only the span naming a model without a kind is taken for an LLM call.
        assert_eq!(b.records.len(), 1);
        assert_eq!(b.records[0].request_id, "0909090909090909");
        assert_eq!(b.records[0].endpoint, "chat");
    }

    #[test]
    fn error_status_non_genai_and_invalid_ids() {
        let mut err = genai_span();
        err.status = Some(Status {
            code: StatusCode::Error as i32,
            message: "boom".into(),
        });
        err.attributes.retain(|kv| {
            !kv.key.starts_with("gen_ai.response") && kv.key != "gen_ai.provider.name"
        });
        let plain = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "db".into(),
            ..Default::default()
        };
        let bad = Span {
            trace_id: vec![1; 15],
            span_id: vec![2; 8],
            name: "bad".into(),
            ..Default::default()
        };
        let b = map_traces(
            &request(vec![err, plain, bad]),
            Some(&TelemetryText::dropping()),
        );
        assert_eq!(
            (b.accepted, b.rejected, b.records.len(), b.spans.len()),
            (2, 1, 1, 2)
        );
        assert!(
            b.first_error
                .as_deref()
                .unwrap()
                .contains("trace_id must be 16 bytes"),
            "{:?}",
            b.first_error
        );
        let r = &b.records[0];
        assert_eq!(
            (r.status, r.error_class),
            (500, Some(ErrorClass::Upstream5xx))
        );
        assert_eq!(r.labels.model_id, "llama-req");
        assert_eq!(r.labels.runtime, "chat-app");
        assert_eq!(b.spans[0].status_message, "boom");
        assert_eq!(b.spans[1].parent_span_id, "");
    }
}
