// Logs in: each OTLP log record becomes a stored `LogRow` (body as text, ids as hex, its text
// dropped or masked as `TelemetryText` says); records whose trace or span id has the wrong length
// are rejected and counted.

use super::attrs::{self, value_of};
use crate::capture::telemetry::TelemetryText;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokenwatch_store::LogRow;

#[derive(Debug, Default)]
pub struct LogsBatch {
    pub rows: Vec<LogRow>,
    pub accepted: u64,
    pub rejected: u64,
    pub first_error: Option<String>,
}

fn optional_id(bytes: &[u8], len: usize, what: &str) -> Result<String, String> {
    match bytes.len() {
        0 => Ok(String::new()),
        n if n == len => Ok(hex::encode(bytes)),
        n => Err(format!(
            "{what} must be empty or {len} bytes (got {n} bytes)"
        )),
    }
}

/// Map one export request into stored log rows, their text as `text` says.
pub fn map_logs(req: &ExportLogsServiceRequest, text: &TelemetryText) -> LogsBatch {
    let mut out = LogsBatch::default();
    for rl in &req.resource_logs {
        let res = rl
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or(&[]);
        let service_name = match attrs::find(res, "service.name") {
            Some(Value::StringValue(s)) => s.clone(),
            _ => String::new(),
        };
        for sl in &rl.scope_logs {
            for l in &sl.log_records {
                let ids = optional_id(&l.trace_id, 16, "trace_id")
                    .and_then(|t| optional_id(&l.span_id, 8, "span_id").map(|s| (t, s)));
                let (trace_id, span_id) = match ids {
                    Ok(ids) => ids,
                    Err(e) => {
                        out.rejected += 1;
                        out.first_error
                            .get_or_insert_with(|| format!("log record: {e}"));
                        continue;
                    }
                };
                let time = if l.time_unix_nano != 0 {
                    l.time_unix_nano
                } else {
                    l.observed_time_unix_nano
                };
                let mut attributes = l.attributes.clone();
                if !l.event_name.is_empty()
                    && !attributes
                        .iter()
                        .any(|kv| kv.key == "event.name" && value_of(kv).is_some())
                {
                    attributes.push(opentelemetry_proto::tonic::common::v1::KeyValue {
                        key: "event.name".into(),
                        value: Some(opentelemetry_proto::tonic::common::v1::AnyValue {
                            value: Some(Value::StringValue(l.event_name.clone())),
                        }),
                        ..Default::default()
                    });
                }
                let event = attributes
                    .iter()
                    .find(|kv| kv.key == "event.name")
                    .and_then(value_of)
                    .and_then(attrs::as_str);
                let body = text.log_body(event.as_deref(), attrs::body_text(l.body.as_ref()));
                out.accepted += 1;
                out.rows.push(LogRow {
                    time_unix_nano: i64::try_from(time).unwrap_or(i64::MAX),
                    severity_number: l.severity_number,
                    severity_text: l.severity_text.clone(),
                    body,
                    trace_id,
                    span_id,
                    service_name: service_name.clone(),
                    attributes_json: attrs::to_stored_json_object(&attributes, text),
                });
            }
        }
    }
    out
}

/// Offer stored log records (their text already dropped or masked) to the template miner.
pub fn feed_templates(feed: Option<&crate::logs::LogFeed>, rows: &[LogRow]) {
    if let Some(f) = feed {
        f.offer_rows(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};

    #[test]
    fn records_become_rows_and_bad_ids_are_rejected() {
        let good = LogRecord {
            observed_time_unix_nano: 42,
            severity_number: 17,
            severity_text: "ERROR".into(),
            body: Some(AnyValue {
                value: Some(Value::StringValue("upstream timed out".into())),
            }),
            trace_id: vec![0xaa; 16],
            span_id: vec![0xbb; 8],
            event_name: "gen_ai.choice".into(),
            ..Default::default()
        };
        let bad = LogRecord {
            trace_id: vec![1; 3],
            ..Default::default()
        };
        let req = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![good, bad],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        // Capture on: the content event's body is stored (masked; nothing personal in it).
        let masker = crate::capture::mask::Masker::new(&Default::default(), b"k").unwrap();
        let b = map_logs(&req, &TelemetryText::masking(std::sync::Arc::new(masker)));
        assert_eq!((b.accepted, b.rejected), (1, 1));
        assert!(
            b.first_error
                .unwrap()
                .contains("trace_id must be empty or 16 bytes (got 3 bytes)")
        );
        let r = &b.rows[0];
        assert_eq!(
            (r.time_unix_nano, r.severity_number, r.body.as_str()),
            (42, 17, "upstream timed out")
        );
        assert_eq!(r.trace_id, "aa".repeat(16));
        assert_eq!(r.attributes_json, r#"{"event.name":"gen_ai.choice"}"#);
    }
}
