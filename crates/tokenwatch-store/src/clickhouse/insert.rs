// Rows of every table as RowBinary bodies for batched `INSERT ... FORMAT RowBinary`, each in
// the column order of its `*_COLUMNS` list (the same lists the queries read back).

use crate::clickhouse::rowbinary::Writer;
use crate::{AnnotationRow, EmbeddingRow, LogRow, RollupRow, SpanRow};
use tokenwatch_core::alert::{Alert, AlertState};
use tokenwatch_core::model::RequestRecord;

pub(crate) const RECORD_COLUMNS: &str = "seq, request_id, trace_id, model_id, runtime, \
    instance, tenant, ab_group, model_version, prompt_version, endpoint, stream, arrival_unix_ms, \
    upstream_headers_s, first_token_s, end_s, queue_s, chunk_offsets_us, gap_count, gap_mean_s, \
    gap_max_s, prompt_tokens, output_tokens, reasoning_tokens, tokens_from_usage, finish_reason, \
    status, error_class, embedding, prefix_key, cached_input_tokens, cost_usd";
pub(crate) const TEXT_COLUMNS: &str =
    "seq, request_id, arrival_unix_ms, region, prompt, completion, masked, truncated";
pub(crate) const ROLLUP_COLUMNS: &str = "model_id, runtime, instance, tenant, ab_group, \
    model_version, bucket, metric, minute_start_unix_ms, writer, count, sketch, seq";
pub(crate) const SPAN_COLUMNS: &str = "trace_id, span_id, parent_span_id, name, kind, \
    start_unix_nano, end_unix_nano, status_code, status_message, service_name, attributes, \
    events_count, seq, keep";
pub(crate) const LOG_COLUMNS: &str = "time_unix_nano, severity_number, severity_text, body, \
    trace_id, span_id, service_name, attributes, seq";
pub(crate) const EMBEDDING_COLUMNS: &str = "request_id, model_id, at_unix_ms, embedding, seq";
pub(crate) const ANNOTATION_COLUMNS: &str = "request_id, model_id, instance, at_unix_ms, \
    detector, score, joint_grade, value, summary, evidence, seq";
pub(crate) const ALERT_COLUMNS: &str = "id, fingerprint, state, active_at_unix_ms, \
    updated_unix_ms, resolved_at_unix_ms, alert, deleted, seq";

pub(crate) fn records(rows: &[RequestRecord], seq: u64) -> Vec<u8> {
    let mut w = Writer::default();
    for (i, r) in rows.iter().enumerate() {
        let l = &r.labels;
        w.u64(seq + i as u64);
        w.str(&r.request_id);
        w.str(&r.trace_id);
        w.str(&l.model_id);
        w.str(&l.runtime);
        w.str(&l.instance);
        w.str(&l.tenant);
        w.str(&l.ab_group);
        w.str(&l.model_version);
        w.str(&r.prompt_version);
        w.str(&r.endpoint);
        w.bool(r.stream);
        w.i64(r.arrival_unix_ms);
        w.nullable(r.upstream_headers_s, Writer::f64);
        w.nullable(r.first_token_s, Writer::f64);
        w.f64(r.end_s);
        w.nullable(r.queue_s, Writer::f64);
        w.array_u32(&r.chunk_offsets_us);
        w.u32(r.gaps.count);
        w.f64(r.gaps.mean_s);
        w.f64(r.gaps.max_s);
        w.nullable(r.prompt_tokens, Writer::u64);
        w.nullable(r.output_tokens, Writer::u64);
        w.nullable(r.reasoning_tokens, Writer::u64);
        w.bool(r.tokens_from_usage);
        w.str(&r.finish_reason);
        w.u16(r.status);
        w.nullable(r.error_class.map(|c| c.name()), |w, s| w.str(s));
        w.array_f32(&r.embedding);
        w.nullable(r.prefix_key, Writer::u64);
        w.nullable(r.cached_input_tokens, Writer::u64);
        w.nullable(r.cost_usd, Writer::f64);
    }
    w.buf
}

/// The captured texts of `rows` (records without text add nothing); None when there is none.
pub(crate) fn texts(rows: &[RequestRecord], seq: u64) -> Option<Vec<u8>> {
    let mut w = Writer::default();
    for (i, r) in rows.iter().enumerate() {
        let Some(t) = &r.text else { continue };
        let masked = serde_json::to_string(&t.masked).unwrap_or_else(|_| "{}".into());
        w.u64(seq + i as u64);
        w.str(&r.request_id);
        w.i64(r.arrival_unix_ms);
        w.str(&t.region);
        w.str(&t.prompt);
        w.str(&t.completion);
        w.str(&masked);
        w.bool(t.truncated);
    }
    (!w.buf.is_empty()).then_some(w.buf)
}

pub(crate) fn rollups(rows: &[RollupRow], writer: &str, seq: u64) -> Vec<u8> {
    let mut w = Writer::default();
    for (i, r) in rows.iter().enumerate() {
        let l = &r.labels;
        w.str(&l.model_id);
        w.str(&l.runtime);
        w.str(&l.instance);
        w.str(&l.tenant);
        w.str(&l.ab_group);
        w.str(&l.model_version);
        w.str(r.bucket.name());
        w.str(r.metric.name());
        w.i64(r.minute_start_unix_ms);
        w.str(writer);
        w.u64(r.count);
        w.bytes(&r.sketch);
        w.u64(seq + i as u64);
    }
    w.buf
}

pub(crate) fn spans(rows: &[SpanRow], seq: u64) -> Vec<u8> {
    let mut w = Writer::default();
    for (i, s) in rows.iter().enumerate() {
        let seq = seq + i as u64;
        w.str(&s.trace_id);
        w.str(&s.span_id);
        w.str(&s.parent_span_id);
        w.str(&s.name);
        w.i32(s.kind);
        w.i64(s.start_unix_nano);
        w.i64(s.end_unix_nano);
        w.i32(s.status_code);
        w.str(&s.status_message);
        w.str(&s.service_name);
        w.str(&s.attributes_json);
        w.u32(s.events_count);
        w.u64(seq);
        w.u64(u64::MAX - seq);
    }
    w.buf
}

pub(crate) fn logs(rows: &[LogRow], seq: u64) -> Vec<u8> {
    let mut w = Writer::default();
    for (i, l) in rows.iter().enumerate() {
        w.i64(l.time_unix_nano);
        w.i32(l.severity_number);
        w.str(&l.severity_text);
        w.str(&l.body);
        w.str(&l.trace_id);
        w.str(&l.span_id);
        w.str(&l.service_name);
        w.str(&l.attributes_json);
        w.u64(seq + i as u64);
    }
    w.buf
}

pub(crate) fn embeddings(rows: &[EmbeddingRow], seq: u64) -> Vec<u8> {
    let mut w = Writer::default();
    for (i, r) in rows.iter().enumerate() {
        w.str(&r.request_id);
        w.str(&r.model_id);
        w.i64(r.at_unix_ms);
        w.array_f32(&r.embedding);
        w.u64(seq + i as u64);
    }
    w.buf
}

/// Non-finite scores are stored as 0, as the SQLite store does.
fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

pub(crate) fn annotations(rows: &[AnnotationRow], seq: u64) -> Vec<u8> {
    let mut w = Writer::default();
    for (i, r) in rows.iter().enumerate() {
        w.str(&r.request_id);
        w.str(&r.model_id);
        w.str(&r.instance);
        w.i64(r.at_unix_ms);
        w.str(&r.detector);
        w.f64(finite(r.score));
        w.str(&r.joint_grade);
        w.f64(finite(r.value));
        w.str(&r.summary);
        w.str(&r.evidence.to_string());
        w.u64(seq + i as u64);
    }
    w.buf
}

/// The latest time the alert changed at: its resolution, firing, activation or latest event.
fn updated_at(a: &Alert) -> i64 {
    [
        Some(a.active_at_unix_ms),
        a.fired_at_unix_ms,
        a.resolved_at_unix_ms,
        a.last_event.as_ref().map(|e| e.at_unix_ms),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(a.active_at_unix_ms)
}

/// One row per alert; Err names the alert whose JSON could not be written.
pub(crate) fn alerts(list: &[Alert], seq: u64) -> Result<Vec<u8>, (String, String)> {
    let mut w = Writer::default();
    for (i, a) in list.iter().enumerate() {
        let json = serde_json::to_string(a).map_err(|e| (a.id.clone(), e.to_string()))?;
        // A resolved alert always has a resolution time, so retention can find it.
        let resolved_at = match a.state {
            AlertState::Resolved => Some(a.resolved_at_unix_ms.unwrap_or_else(|| updated_at(a))),
            _ => None,
        };
        w.str(&a.id);
        w.str(&a.fingerprint);
        w.str(a.state.name());
        w.i64(a.active_at_unix_ms);
        w.i64(updated_at(a));
        w.nullable(resolved_at, Writer::i64);
        w.str(&json);
        w.u8(0);
        w.u64(seq + i as u64);
    }
    Ok(w.buf)
}

/// Tombstones: the alerts `ids` are gone from `load_alerts` from now on.
pub(crate) fn alert_tombstones(ids: &[String], seq: u64, now_unix_ms: i64) -> Vec<u8> {
    let mut w = Writer::default();
    for (i, id) in ids.iter().enumerate() {
        w.str(id);
        w.str("");
        w.str("");
        w.i64(now_unix_ms);
        w.i64(now_unix_ms);
        w.nullable(None::<i64>, Writer::i64);
        w.str("");
        w.u8(1);
        w.u64(seq + i as u64);
    }
    w.buf
}
