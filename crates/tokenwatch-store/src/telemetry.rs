// Stored OpenTelemetry data: span and log-record rows, their queries, and the SQL that writes
// and reads them (one transaction per batch; a re-sent span is ignored, not duplicated).

use crate::span_attrs;
use rusqlite::types::{ToSqlOutput, Type, Value, ValueRef};
use rusqlite::{Connection, Row, TransactionBehavior, params, params_from_iter};
use serde::Serialize;

/// One span as received over OTLP, ids as lowercase hex, attributes as a JSON object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct SpanRow {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP `SpanKind` number (0 unspecified, 1 internal, 2 server, 3 client, 4 producer, 5 consumer).
    pub kind: i32,
    pub start_unix_nano: i64,
    pub end_unix_nano: i64,
    /// OTLP status code (0 unset, 1 ok, 2 error).
    pub status_code: i32,
    pub status_message: String,
    /// Resource `service.name`.
    pub service_name: String,
    /// Span attributes as a JSON object (`{"gen_ai.request.model": "m", ...}`).
    pub attributes_json: String,
    pub events_count: u32,
}

/// One log record as received over OTLP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct LogRow {
    /// Event time, or the observed time when the event time is not set.
    pub time_unix_nano: i64,
    pub severity_number: i32,
    pub severity_text: String,
    /// The body rendered as a string (JSON for structured bodies).
    pub body: String,
    /// Empty when the record is not tied to a trace.
    pub trace_id: String,
    pub span_id: String,
    pub service_name: String,
    pub attributes_json: String,
}

/// Filters for [`crate::Store::query_spans`]: every span of one trace, or spans starting in
/// `[from_unix_nano, to_unix_nano)`; oldest start first, at most `limit` rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanQuery {
    pub trace_id: Option<String>,
    pub from_unix_nano: Option<i64>,
    pub to_unix_nano: Option<i64>,
    pub limit: usize,
}

impl Default for SpanQuery {
    /// No filter, the first 1000 spans.
    fn default() -> Self {
        SpanQuery {
            trace_id: None,
            from_unix_nano: None,
            to_unix_nano: None,
            limit: 1000,
        }
    }
}

/// Filters for [`crate::Store::query_logs`]: by trace and/or time range, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogQuery {
    pub trace_id: Option<String>,
    pub from_unix_nano: Option<i64>,
    pub to_unix_nano: Option<i64>,
    pub limit: usize,
}

impl Default for LogQuery {
    /// No filter, the first 1000 records.
    fn default() -> Self {
        LogQuery {
            trace_id: None,
            from_unix_nano: None,
            to_unix_nano: None,
            limit: 1000,
        }
    }
}

const SPAN_COLUMNS: &str = "trace_id, span_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano, \
     status_code, status_message, service_name, attributes, events_count";
const LOG_COLUMNS: &str = "time_unix_nano, severity_number, severity_text, body, trace_id, span_id, service_name, attributes";

/// The attributes column: the compact form (a BLOB, `span_attrs`), or the JSON as it is
/// (TEXT) when it cannot be compacted.
fn attributes_value(json: &str) -> ToSqlOutput<'_> {
    match span_attrs::encode(json) {
        Some(blob) => ToSqlOutput::Owned(Value::Blob(blob)),
        None => ToSqlOutput::Borrowed(ValueRef::Text(json.as_bytes())),
    }
}

const INSERT_SPAN: &str = "INSERT OR IGNORE INTO spans (trace_id, span_id, parent_span_id, name, \
     kind, start_unix_nano, end_unix_nano, status_code, status_message, service_name, attributes, \
     events_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

pub(crate) fn insert_spans(conn: &mut Connection, spans: &[SpanRow]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut st = tx.prepare_cached(INSERT_SPAN)?;
        for s in spans {
            st.execute(params![
                s.trace_id,
                s.span_id,
                s.parent_span_id,
                s.name,
                s.kind,
                s.start_unix_nano,
                s.end_unix_nano,
                s.status_code,
                s.status_message,
                s.service_name,
                attributes_value(&s.attributes_json),
                s.events_count,
            ])?;
        }
    }
    tx.commit()
}

pub(crate) fn insert_logs(conn: &mut Connection, logs: &[LogRow]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let sql = format!("INSERT INTO logs ({LOG_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
        let mut st = tx.prepare_cached(&sql)?;
        for l in logs {
            st.execute(params![
                l.time_unix_nano,
                l.severity_number,
                l.severity_text,
                l.body,
                l.trace_id,
                l.span_id,
                l.service_name,
                l.attributes_json,
            ])?;
        }
    }
    tx.commit()
}

/// WHERE clause and parameters shared by the span and log queries.
fn filters(
    trace_id: &Option<String>,
    from: Option<i64>,
    to: Option<i64>,
    time_col: &str,
    limit: usize,
) -> (String, Vec<Value>) {
    let mut conds = Vec::new();
    let mut params = Vec::new();
    if let Some(t) = trace_id {
        conds.push("trace_id = ?".to_string());
        params.push(Value::Text(t.to_ascii_lowercase()));
    }
    if let Some(f) = from {
        conds.push(format!("{time_col} >= ?"));
        params.push(Value::Integer(f));
    }
    if let Some(t) = to {
        conds.push(format!("{time_col} < ?"));
        params.push(Value::Integer(t));
    }
    params.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
    let clause = if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    };
    (clause, params)
}

pub(crate) fn query_spans(conn: &Connection, q: &SpanQuery) -> rusqlite::Result<Vec<SpanRow>> {
    let (clause, params) = filters(
        &q.trace_id,
        q.from_unix_nano,
        q.to_unix_nano,
        "start_unix_nano",
        q.limit,
    );
    let sql =
        format!("SELECT {SPAN_COLUMNS} FROM spans{clause} ORDER BY start_unix_nano, id LIMIT ?");
    let mut st = conn.prepare_cached(&sql)?;
    let rows = st.query_map(params_from_iter(params), span_from_row)?;
    rows.collect()
}

pub(crate) fn query_logs(conn: &Connection, q: &LogQuery) -> rusqlite::Result<Vec<LogRow>> {
    let (clause, params) = filters(
        &q.trace_id,
        q.from_unix_nano,
        q.to_unix_nano,
        "time_unix_nano",
        q.limit,
    );
    let sql = format!("SELECT {LOG_COLUMNS} FROM logs{clause} ORDER BY time_unix_nano, id LIMIT ?");
    let mut st = conn.prepare_cached(&sql)?;
    let rows = st.query_map(params_from_iter(params), log_from_row)?;
    rows.collect()
}

fn span_from_row(r: &Row<'_>) -> rusqlite::Result<SpanRow> {
    Ok(SpanRow {
        trace_id: r.get(0)?,
        span_id: r.get(1)?,
        parent_span_id: r.get(2)?,
        name: r.get(3)?,
        kind: r.get(4)?,
        start_unix_nano: r.get(5)?,
        end_unix_nano: r.get(6)?,
        status_code: r.get(7)?,
        status_message: r.get(8)?,
        service_name: r.get(9)?,
        attributes_json: attributes_from(r, 10)?,
        events_count: r.get(11)?,
    })
}

/// The attributes JSON of a span row, stored as it is (TEXT) or compact (BLOB).
fn attributes_from(r: &Row<'_>, idx: usize) -> rusqlite::Result<String> {
    match r.get_ref(idx)? {
        ValueRef::Blob(blob) => span_attrs::decode(blob)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Blob, e.into())),
        _ => r.get(idx),
    }
}

fn log_from_row(r: &Row<'_>) -> rusqlite::Result<LogRow> {
    Ok(LogRow {
        time_unix_nano: r.get(0)?,
        severity_number: r.get(1)?,
        severity_text: r.get(2)?,
        body: r.get(3)?,
        trace_id: r.get(4)?,
        span_id: r.get(5)?,
        service_name: r.get(6)?,
        attributes_json: r.get(7)?,
    })
}

/// SQL deleting up to `?2` spans / log records older than the cutoff `?1` (Unix milliseconds).
pub(crate) const RETENTION_SPANS: &str = "DELETE FROM spans WHERE id IN \
     (SELECT id FROM spans WHERE start_unix_nano < ?1 * 1000000 LIMIT ?2)";
pub(crate) const RETENTION_LOGS: &str = "DELETE FROM logs WHERE id IN \
     (SELECT id FROM logs WHERE time_unix_nano < ?1 * 1000000 LIMIT ?2)";

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Connection {
        let mut c = Connection::open_in_memory().unwrap();
        crate::schema::migrate(&mut c, std::path::Path::new(":memory:")).unwrap();
        c
    }

    fn span(trace: &str, id: &str, start: i64) -> SpanRow {
        SpanRow {
            trace_id: trace.into(),
            span_id: id.into(),
            name: "chat m".into(),
            kind: 3,
            start_unix_nano: start,
            end_unix_nano: start + 10,
            attributes_json: r#"{"gen_ai.request.model":"m"}"#.into(),
            events_count: 2,
            ..Default::default()
        }
    }

    #[test]
    fn spans_round_trip_by_trace_and_time_and_ignore_resends() {
        let mut c = conn();
        let a = span("aa", "01", 100);
        let mut b = span("aa", "02", 50);
        b.parent_span_id = "01".into();
        let other = span("bb", "01", 300);
        insert_spans(&mut c, &[a.clone(), b.clone(), other.clone()]).unwrap();
        insert_spans(&mut c, std::slice::from_ref(&a)).unwrap();
        let q = SpanQuery {
            trace_id: Some("AA".into()),
            ..Default::default()
        };
        assert_eq!(query_spans(&c, &q).unwrap(), vec![b, a.clone()]);
        let q = SpanQuery {
            from_unix_nano: Some(100),
            to_unix_nano: Some(301),
            ..Default::default()
        };
        assert_eq!(query_spans(&c, &q).unwrap(), vec![a, other]);
    }

    #[test]
    fn retention_drops_old_spans_and_logs_through_the_store() {
        use crate::{SqliteStore, Store, StoreOptions};
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap();
        let day_ns: i64 = 24 * 3600 * 1_000_000_000;
        let now_ms: i64 = 100 * 24 * 3600 * 1000;
        let now_ns = now_ms * 1_000_000;
        let old = span("aa", "01", now_ns - 8 * day_ns);
        let new = span("aa", "02", now_ns - day_ns);
        store.insert_spans(&[old, new.clone()]).unwrap();
        let log = |t| LogRow {
            time_unix_nano: t,
            body: "x".into(),
            ..Default::default()
        };
        store
            .insert_logs(&[log(now_ns - 8 * day_ns), log(now_ns)])
            .unwrap();
        store.apply_retention(now_ms).unwrap();
        assert_eq!(store.query_spans(&SpanQuery::default()).unwrap(), vec![new]);
        assert_eq!(
            store.query_logs(&LogQuery::default()).unwrap(),
            vec![log(now_ns)]
        );
    }

    #[test]
    fn logs_round_trip() {
        let mut c = conn();
        let l = LogRow {
            time_unix_nano: 5,
            body: "hello".into(),
            trace_id: "aa".into(),
            ..Default::default()
        };
        insert_logs(&mut c, &[l.clone(), l.clone()]).unwrap();
        let q = LogQuery {
            trace_id: Some("aa".into()),
            ..Default::default()
        };
        assert_eq!(query_logs(&c, &q).unwrap(), vec![l.clone(), l]);
    }
}
