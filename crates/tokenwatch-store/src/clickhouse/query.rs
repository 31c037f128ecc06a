// Every read of the `Store` trait as ClickHouse SQL answered in RowBinary, and the decoding of
// those answers; values travel as query parameters; duplicates of replacing tables are resolved
// at query time with `LIMIT 1 BY`.

use crate::clickhouse::client::{Client, Params};
use crate::clickhouse::insert::{
    ANNOTATION_COLUMNS, LOG_COLUMNS, RECORD_COLUMNS, ROLLUP_COLUMNS, SPAN_COLUMNS,
};
use crate::clickhouse::rowbinary::Reader;
use crate::clickhouse::schema::{
    ALERTS, ANNOTATIONS, EMBEDDINGS, LOGS, RECORDS, ROLLUPS, SPANS, TEXT,
};
use crate::{
    AnnotationRow, LogQuery, LogRow, RecordOutcome, RecordQuery, RollupQuery, RollupRow, SpanQuery,
    SpanRow, SpendQuery, SpendRow, StoreError,
};
use std::collections::{BTreeMap, HashMap};
use tokenwatch_core::alert::Alert;
use tokenwatch_core::model::{
    CapturedText, ContextBucket, ErrorClass, GapSummary, LatencyMetric, RequestRecord, SeriesLabels,
};
use tokenwatch_core::sketch::LatencySketch;

/// Ids per `IN {pN:Array(String)}` parameter, well under the server's 1 MiB URL limit.
const IN_CHUNK: usize = 1000;

fn where_clause(conds: &[String]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    }
}

/// Decodes every row of `body` with `row`; a failure names the table and row number.
fn decode<T>(
    client: &Client,
    table: &'static str,
    body: &[u8],
    mut row: impl FnMut(&mut Reader<'_>) -> Result<T, String>,
) -> Result<Vec<T>, StoreError> {
    let mut r = Reader::new(body);
    let mut out = Vec::new();
    while !r.is_empty() {
        let item = row(&mut r).map_err(|detail| StoreError::CorruptRow {
            database: client.label().to_string(),
            table,
            row: format!("row {} of the answer", out.len()),
            detail,
        })?;
        out.push(item);
    }
    Ok(out)
}

pub(crate) fn records(client: &Client, q: &RecordQuery) -> Result<Vec<RequestRecord>, StoreError> {
    if q.limit == 0 {
        return Ok(Vec::new());
    }
    let db = client.database();
    let mut p = Params::default();
    let mut conds = Vec::new();
    if let Some(m) = &q.model {
        conds.push(format!("model_id = {}", p.str(m)));
    }
    if let Some(since) = q.since_unix_ms {
        conds.push(format!("arrival_unix_ms >= {}", p.ms(since)));
    }
    if let Some(t) = &q.tenant {
        conds.push(format!("tenant = {}", p.str(t)));
    }
    if let Some(id) = &q.request_id {
        conds.push(format!("request_id = {}", p.str(id)));
    }
    if let Some(id) = &q.trace_id {
        conds.push(format!("trace_id = {}", p.str(id)));
    }
    match q.outcome {
        None => {}
        Some(RecordOutcome::Ok) => conds.push("(isNull(error_class) AND status < 400)".into()),
        Some(RecordOutcome::Error) => {
            conds.push("NOT (isNull(error_class) AND status < 400)".into())
        }
        Some(RecordOutcome::Class(c)) => conds.push(format!("error_class = {}", p.str(c.name()))),
    }
    if let Some(min) = q.min_e2e_s.filter(|v| v.is_finite()) {
        conds.push(format!("end_s >= {}", p.f64(min)));
    }
    if q.annotated {
        conds.push(format!(
            "request_id IN (SELECT request_id FROM {db}.{ANNOTATIONS})"
        ));
    }
    // Oldest first for a request id (`RecordQuery::request_id`), newest first otherwise.
    let order = if q.request_id.is_some() {
        "ASC"
    } else {
        "DESC"
    };
    let sql = format!(
        "SELECT {RECORD_COLUMNS} FROM {db}.{RECORDS}{} ORDER BY arrival_unix_ms {order}, \
         seq {order} LIMIT {} FORMAT RowBinary",
        where_clause(&conds),
        p.u64(u64::try_from(q.limit).unwrap_or(u64::MAX))
    );
    let body = client.query_with("query_records", &sql, &p, true)?;
    let mut out = decode(client, RECORDS, &body, record_from)?;
    attach_embeddings(client, &mut out)?;
    if q.with_text {
        attach_text(client, &mut out)?;
    }
    Ok(out)
}

/// `Store::query_spend`: unpriced records (NULL cost) count as 0 and are left out of
/// `priced_requests`.
pub(crate) fn spend(client: &Client, q: &SpendQuery) -> Result<Vec<SpendRow>, StoreError> {
    let db = client.database();
    let mut p = Params::default();
    let sql = format!(
        "SELECT model_id, tenant, sum(ifNull(cost_usd, 0)), count(), count(cost_usd) \
         FROM {db}.{RECORDS} WHERE arrival_unix_ms >= {} AND arrival_unix_ms < {} \
         GROUP BY model_id, tenant ORDER BY model_id, tenant FORMAT RowBinary",
        p.ms(q.since_unix_ms),
        p.ms(q.until_unix_ms),
    );
    let body = client.query_with("query_spend", &sql, &p, true)?;
    decode(client, RECORDS, &body, |r| {
        Ok(SpendRow {
            model: r.string()?,
            tenant: r.string()?,
            cost_usd: r.f64()?,
            requests: r.u64()?,
            priced_requests: r.u64()?,
        })
    })
}

fn record_from(r: &mut Reader<'_>) -> Result<RequestRecord, String> {
    let _seq = r.u64()?;
    let request_id = r.string()?;
    let ctx = |e: String| format!("request_id {request_id:?}: {e}");
    let rest = (|| -> Result<RequestRecord, String> {
        let trace_id = r.string()?;
        let labels = SeriesLabels {
            model_id: r.string()?,
            runtime: r.string()?,
            instance: r.string()?,
            tenant: r.string()?,
            ab_group: r.string()?,
            model_version: r.string()?,
        };
        let prompt_version = r.string()?;
        let endpoint = r.string()?;
        let stream = r.bool()?;
        let arrival_unix_ms = r.i64()?;
        let upstream_headers_s = r.nullable(Reader::f64)?;
        let first_token_s = r.nullable(Reader::f64)?;
        let end_s = r.f64()?;
        let queue_s = r.nullable(Reader::f64)?;
        let chunk_offsets_us = r.array_u32()?;
        let gaps = GapSummary {
            count: r.u32()?,
            mean_s: r.f64()?,
            max_s: r.f64()?,
        };
        let prompt_tokens = r.nullable(Reader::u64)?;
        let output_tokens = r.nullable(Reader::u64)?;
        let reasoning_tokens = r.nullable(Reader::u64)?;
        let tokens_from_usage = r.bool()?;
        let finish_reason = r.string()?;
        let status = r.u16()?;
        let error_class = match r.nullable(Reader::string)? {
            None => None,
            Some(s) => {
                Some(ErrorClass::parse(&s).ok_or_else(|| format!("unknown error_class {s:?}"))?)
            }
        };
        let embedding = r.array_f32()?;
        let prefix_key = r.nullable(Reader::u64)?;
        let cached_input_tokens = r.nullable(Reader::u64)?;
        let cost_usd = r.nullable(Reader::f64)?;
        Ok(RequestRecord {
            request_id: String::new(),
            trace_id,
            labels,
            prompt_version,
            endpoint,
            stream,
            arrival_unix_ms,
            upstream_headers_s,
            first_token_s,
            end_s,
            queue_s,
            chunk_offsets_us,
            gaps,
            prompt_tokens,
            output_tokens,
            reasoning_tokens,
            cached_input_tokens,
            cost_usd,
            tokens_from_usage,
            finish_reason,
            status,
            error_class,
            embedding,
            prefix_key,
            text: None,
            span: Default::default(),
        })
    })();
    let mut rec = rest.map_err(ctx)?;
    rec.request_id = request_id;
    Ok(rec)
}

/// A record without its own embedding takes the latest one posted for its request id and model.
fn attach_embeddings(client: &Client, records: &mut [RequestRecord]) -> Result<(), StoreError> {
    let ids: Vec<&str> = records
        .iter()
        .filter(|r| r.embedding.is_empty())
        .map(|r| r.request_id.as_str())
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let db = client.database();
    let mut found: HashMap<(String, String), Vec<f32>> = HashMap::new();
    for chunk in ids.chunks(IN_CHUNK) {
        let mut p = Params::default();
        let sql = format!(
            "SELECT request_id, model_id, embedding FROM {db}.{EMBEDDINGS} WHERE request_id IN {} \
             ORDER BY request_id, model_id, seq DESC LIMIT 1 BY request_id, model_id \
             FORMAT RowBinary",
            p.strs(chunk.iter().copied())
        );
        let body = client.query_with("query_records (embeddings)", &sql, &p, true)?;
        for (id, model, emb) in decode(client, EMBEDDINGS, &body, |r| {
            Ok((r.string()?, r.string()?, r.array_f32()?))
        })? {
            found.insert((id, model), emb);
        }
    }
    for r in records.iter_mut().filter(|r| r.embedding.is_empty()) {
        if let Some(e) = found.get(&(r.request_id.clone(), r.labels.model_id.clone())) {
            r.embedding = e.clone();
        }
    }
    Ok(())
}

fn attach_text(client: &Client, records: &mut [RequestRecord]) -> Result<(), StoreError> {
    let ids: Vec<&str> = records.iter().map(|r| r.request_id.as_str()).collect();
    let db = client.database();
    let mut found: HashMap<(String, i64), CapturedText> = HashMap::new();
    for chunk in ids.chunks(IN_CHUNK) {
        let mut p = Params::default();
        let sql = format!(
            "SELECT request_id, arrival_unix_ms, region, prompt, completion, masked, truncated \
             FROM {db}.{TEXT} WHERE request_id IN {} FORMAT RowBinary",
            p.strs(chunk.iter().copied())
        );
        let body = client.query_with("query_records (captured text)", &sql, &p, true)?;
        for (key, text) in decode(client, TEXT, &body, |r| {
            let key = (r.string()?, r.i64()?);
            let region = r.string()?;
            let prompt = r.string()?;
            let completion = r.string()?;
            let masked: BTreeMap<String, u32> =
                serde_json::from_str(&r.string()?).unwrap_or_default();
            let truncated = r.bool()?;
            Ok((
                key,
                CapturedText {
                    region,
                    prompt,
                    completion,
                    masked,
                    truncated,
                },
            ))
        })? {
            found.insert(key, text);
        }
    }
    for r in records.iter_mut() {
        if let Some(t) = found.remove(&(r.request_id.clone(), r.arrival_unix_ms)) {
            r.text = Some(Box::new(t));
        }
    }
    Ok(())
}

/// The roll-up key, in the order of the table's sorting key minus the metric.
const ROLLUP_KEY: &str = "minute_start_unix_ms, model_id, runtime, instance, tenant, ab_group, \
    model_version, bucket, metric";

pub(crate) fn rollups(client: &Client, q: &RollupQuery) -> Result<Vec<RollupRow>, StoreError> {
    let db = client.database();
    let mut p = Params::default();
    let mut conds = vec![
        format!("minute_start_unix_ms >= {}", p.ms(q.from_unix_ms)),
        format!("minute_start_unix_ms < {}", p.ms(q.to_unix_ms)),
    ];
    if let Some(m) = &q.model {
        conds.push(format!("model_id = {}", p.str(m)));
    }
    if let Some(m) = q.metric {
        conds.push(format!("metric = {}", p.str(m.name())));
    }
    // The newest row per key and writer wins (replace semantics before the engine merges
    // duplicates); the writers' rows of one key are then merged into one.
    let sql = format!(
        "SELECT {ROLLUP_COLUMNS} FROM {db}.{ROLLUPS}{} ORDER BY {ROLLUP_KEY}, writer, seq DESC \
         LIMIT 1 BY {ROLLUP_KEY}, writer FORMAT RowBinary",
        where_clause(&conds)
    );
    let body = client.query_with("query_rollups", &sql, &p, true)?;
    let rows = decode(client, ROLLUPS, &body, rollup_from)?;
    Ok(merge_writers(rows))
}

/// One row per (labels, bucket, metric, minute): the rows several writers stored for the same
/// key (adjacent, the query orders by key) merge into one sketch. Rows whose sketch does not
/// decode are returned as they are, for the caller to count as unreadable.
fn merge_writers(rows: Vec<RollupRow>) -> Vec<RollupRow> {
    let same_key = |a: &RollupRow, b: &RollupRow| {
        a.minute_start_unix_ms == b.minute_start_unix_ms
            && a.labels == b.labels
            && a.bucket == b.bucket
            && a.metric == b.metric
    };
    let mut out: Vec<RollupRow> = Vec::with_capacity(rows.len());
    let mut group: Vec<RollupRow> = Vec::new();
    let flush = |group: &mut Vec<RollupRow>, out: &mut Vec<RollupRow>| {
        if group.len() <= 1 {
            out.append(group);
            return;
        }
        let mut merged = LatencySketch::new();
        let mut readable = Vec::new();
        for r in group.drain(..) {
            match merged.merge_bytes(&r.sketch) {
                Ok(()) => readable.push(r),
                Err(_) => out.push(r),
            }
        }
        match readable.len() {
            0 => {}
            1 => out.extend(readable),
            _ => {
                let mut row = readable.swap_remove(0);
                row.count = merged.count();
                row.sketch = merged.to_bytes();
                out.push(row);
            }
        }
    };
    for r in rows {
        if group.last().is_some_and(|g| !same_key(g, &r)) {
            flush(&mut group, &mut out);
        }
        group.push(r);
    }
    flush(&mut group, &mut out);
    out
}

fn rollup_from(r: &mut Reader<'_>) -> Result<RollupRow, String> {
    let labels = SeriesLabels {
        model_id: r.string()?,
        runtime: r.string()?,
        instance: r.string()?,
        tenant: r.string()?,
        ab_group: r.string()?,
        model_version: r.string()?,
    };
    let bucket = r.string()?;
    let metric = r.string()?;
    let minute = r.i64()?;
    let _writer = r.string()?;
    let desc = format!(
        "model_id {:?}, minute_start_unix_ms {minute}, bucket {bucket:?}, metric {metric:?}",
        labels.model_id
    );
    let bucket = ContextBucket::parse(&bucket)
        .ok_or_else(|| format!("{desc}: unknown context bucket {bucket:?}"))?;
    let metric = LatencyMetric::parse(&metric)
        .ok_or_else(|| format!("{desc}: unknown latency metric {metric:?}"))?;
    let count = r.u64()?;
    let sketch = r.bytes()?;
    let _seq = r.u64()?;
    Ok(RollupRow {
        labels,
        bucket,
        metric,
        minute_start_unix_ms: minute,
        count,
        sketch,
    })
}

fn telemetry_filters(
    p: &mut Params,
    trace_id: &Option<String>,
    from: Option<i64>,
    to: Option<i64>,
    time_col: &str,
) -> Vec<String> {
    let mut conds = Vec::new();
    if let Some(t) = trace_id {
        conds.push(format!("trace_id = {}", p.str(&t.to_ascii_lowercase())));
    }
    if let Some(f) = from {
        conds.push(format!("{time_col} >= {}", p.ns(f)));
    }
    if let Some(t) = to {
        conds.push(format!("{time_col} < {}", p.ns(t)));
    }
    conds
}

pub(crate) fn spans(client: &Client, q: &SpanQuery) -> Result<Vec<SpanRow>, StoreError> {
    if q.limit == 0 {
        return Ok(Vec::new());
    }
    let db = client.database();
    let mut p = Params::default();
    let conds = telemetry_filters(
        &mut p,
        &q.trace_id,
        q.from_unix_nano,
        q.to_unix_nano,
        "start_unix_nano",
    );
    // The first copy of a re-sent span wins (lowest seq), then oldest start first.
    let sql = format!(
        "SELECT {SPAN_COLUMNS} FROM (SELECT {SPAN_COLUMNS} FROM {db}.{SPANS}{} \
         ORDER BY trace_id, span_id, seq LIMIT 1 BY trace_id, span_id) \
         ORDER BY start_unix_nano, seq LIMIT {} FORMAT RowBinary",
        where_clause(&conds),
        p.u64(u64::try_from(q.limit).unwrap_or(u64::MAX))
    );
    let body = client.query_with("query_spans", &sql, &p, true)?;
    decode(client, SPANS, &body, |r| {
        let row = SpanRow {
            trace_id: r.string()?,
            span_id: r.string()?,
            parent_span_id: r.string()?,
            name: r.string()?,
            kind: r.i32()?,
            start_unix_nano: r.i64()?,
            end_unix_nano: r.i64()?,
            status_code: r.i32()?,
            status_message: r.string()?,
            service_name: r.string()?,
            attributes_json: r.string()?,
            events_count: r.u32()?,
        };
        let _seq = r.u64()?;
        let _keep = r.u64()?;
        Ok(row)
    })
}

pub(crate) fn logs(client: &Client, q: &LogQuery) -> Result<Vec<LogRow>, StoreError> {
    if q.limit == 0 {
        return Ok(Vec::new());
    }
    let db = client.database();
    let mut p = Params::default();
    let conds = telemetry_filters(
        &mut p,
        &q.trace_id,
        q.from_unix_nano,
        q.to_unix_nano,
        "time_unix_nano",
    );
    let sql = format!(
        "SELECT {LOG_COLUMNS} FROM {db}.{LOGS}{} ORDER BY time_unix_nano, seq LIMIT {} \
         FORMAT RowBinary",
        where_clause(&conds),
        p.u64(u64::try_from(q.limit).unwrap_or(u64::MAX))
    );
    let body = client.query_with("query_logs", &sql, &p, true)?;
    decode(client, LOGS, &body, |r| {
        let row = LogRow {
            time_unix_nano: r.i64()?,
            severity_number: r.i32()?,
            severity_text: r.string()?,
            body: r.string()?,
            trace_id: r.string()?,
            span_id: r.string()?,
            service_name: r.string()?,
            attributes_json: r.string()?,
        };
        let _seq = r.u64()?;
        Ok(row)
    })
}

pub(crate) fn annotations(
    client: &Client,
    request_ids: &[String],
) -> Result<Vec<AnnotationRow>, StoreError> {
    let db = client.database();
    let mut out = Vec::new();
    for chunk in request_ids.chunks(IN_CHUNK) {
        let mut p = Params::default();
        let sql = format!(
            "SELECT {ANNOTATION_COLUMNS} FROM {db}.{ANNOTATIONS} WHERE request_id IN {} \
             ORDER BY at_unix_ms, seq FORMAT RowBinary",
            p.strs(chunk.iter().map(String::as_str))
        );
        let body = client.query_with("query_annotations", &sql, &p, true)?;
        out.extend(decode(client, ANNOTATIONS, &body, |r| {
            let row = AnnotationRow {
                request_id: r.string()?,
                model_id: r.string()?,
                instance: r.string()?,
                at_unix_ms: r.i64()?,
                detector: r.string()?,
                score: r.f64()?,
                joint_grade: r.string()?,
                value: r.f64()?,
                summary: r.string()?,
                evidence: serde_json::from_str(&r.string()?).unwrap_or(serde_json::Value::Null),
            };
            let _seq = r.u64()?;
            Ok(row)
        })?);
    }
    out.sort_by_key(|r| r.at_unix_ms);
    Ok(out)
}

/// The current row of every alert (its newest, tombstones included), as a subquery.
fn latest_alerts(db: &str) -> String {
    format!(
        "(SELECT id, alert, deleted, state, active_at_unix_ms, resolved_at_unix_ms \
         FROM {db}.{ALERTS} ORDER BY id, seq DESC LIMIT 1 BY id)"
    )
}

pub(crate) fn alerts(
    client: &Client,
    resolved_since_unix_ms: i64,
) -> Result<Vec<Alert>, StoreError> {
    let mut p = Params::default();
    let sql = format!(
        "SELECT id, alert FROM {} WHERE deleted = 0 AND (isNull(resolved_at_unix_ms) OR \
         resolved_at_unix_ms >= {}) \
         ORDER BY coalesce(resolved_at_unix_ms, active_at_unix_ms) DESC, id FORMAT RowBinary",
        latest_alerts(client.database()),
        p.ms(resolved_since_unix_ms)
    );
    let body = client.query_with("load_alerts", &sql, &p, true)?;
    let rows = decode(client, ALERTS, &body, |r| Ok((r.string()?, r.string()?)))?;
    let mut out = Vec::with_capacity(rows.len());
    let mut seen = std::collections::HashSet::new();
    for (id, json) in rows {
        match serde_json::from_str::<Alert>(&json) {
            Ok(a) => {
                if seen.insert(same_alert_key(&a).unwrap_or_else(|| (id, String::new()))) {
                    out.push(a)
                }
            }
            Err(e) => {
                tracing::warn!(alert = %id, error = %e, "stored alert does not decode; skipped")
            }
        }
    }
    Ok(out)
}

/// Instances sharing the database each store their own copy (own id) of an alert they all
/// fire: the copies share the fingerprint (rule + labels) and, once fired, the incident id
/// (derived from the fingerprint and window, not the process); pending copies have no incident
/// and share the fingerprint. Copies with one key are listed once (the first, newest).
fn same_alert_key(a: &Alert) -> Option<(String, String)> {
    match (&a.incident_id, a.state) {
        (Some(inc), _) if !inc.is_empty() => Some((a.fingerprint.clone(), inc.clone())),
        (_, tokenwatch_core::alert::AlertState::Pending) => {
            Some((a.fingerprint.clone(), "pending".into()))
        }
        _ => None,
    }
}

/// Ids of resolved alerts resolved before `cutoff` (due for retention).
pub(crate) fn expired_alert_ids(client: &Client, cutoff: i64) -> Result<Vec<String>, StoreError> {
    let mut p = Params::default();
    let sql = format!(
        "SELECT id FROM {} WHERE deleted = 0 AND resolved_at_unix_ms < {} FORMAT RowBinary",
        latest_alerts(client.database()),
        p.ms(cutoff)
    );
    let body = client.query_with("retention of alerts", &sql, &p, true)?;
    decode(client, ALERTS, &body, |r| r.string())
}

/// One unsigned number answered by `sql` (a count, a size).
pub(crate) fn scalar_u64(
    client: &Client,
    op: &'static str,
    sql: &str,
    p: &Params,
) -> Result<u64, StoreError> {
    let body = client.query_with(op, &format!("{sql} FORMAT RowBinary"), p, true)?;
    let v = decode(client, "system", &body, |r| r.u64())?;
    Ok(v.first().copied().unwrap_or(0))
}
