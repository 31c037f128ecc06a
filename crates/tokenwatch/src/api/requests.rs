// `GET /api/v1/requests` (filters: model, tenant, status, min_e2e_s, request_id, annotated, since,
// limit) and `GET /api/v1/requests/{id}`: stored request records with their per-chunk token
// timeline, their `annotations` (per-request anomalies such as output length outliers) and, for
// one request, its captured `text` (masked; only when `capture.text` is on) and its `scores`.

use super::ApiState;
use crate::kernel::params::{ParamError, Params};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use tokenwatch_core::model::RequestRecord;
use tokenwatch_store::{AnnotationRow, RecordOutcome, RecordQuery, Store};

/// A record with its annotations (`[]` when none), serialised as the record's fields plus
/// `annotations`.
#[derive(serde::Serialize)]
struct Annotated {
    #[serde(flatten)]
    record: RequestRecord,
    annotations: Vec<AnnotationRow>,
}

impl Annotated {
    fn new(record: RequestRecord, notes: &[AnnotationRow]) -> Annotated {
        let annotations = notes
            .iter()
            .filter(|a| a.request_id == record.request_id)
            .cloned()
            .collect();
        Annotated {
            record,
            annotations,
        }
    }
}

/// Records matching `query` with their annotations.
async fn run_query(store: Arc<dyn Store>, query: RecordQuery) -> Result<Vec<Annotated>, Response> {
    let found = tokio::task::spawn_blocking(move || {
        let records = store.query_records(&query)?;
        let ids: Vec<String> = records.iter().map(|r| r.request_id.clone()).collect();
        let notes = store.query_annotations(&ids)?;
        Ok::<_, tokenwatch_store::StoreError>(
            records
                .into_iter()
                .map(|r| Annotated::new(r, &notes))
                .collect(),
        )
    })
    .await;
    match found {
        Ok(Ok(records)) => Ok(records),
        Ok(Err(e)) => Err(internal_error(e.to_string())),
        Err(e) => Err(internal_error(e.to_string())),
    }
}

/// `{"count": N, "requests": [...]}`, streamed: each record is serialised as the body is sent
/// and let go after, so a large answer never exists twice in memory (as records and as a JSON
/// tree of them: `limit=10000` over long streams' chunk times cost 121 MB that way).
fn stream_list(records: Vec<Annotated>) -> Response {
    let count = records.len();
    let head = std::iter::once(bytes::Bytes::from(format!(
        "{{\"count\":{count},\"requests\":["
    )));
    let body = records.into_iter().enumerate().map(|(i, r)| {
        let mut out = if i == 0 { Vec::new() } else { vec![b','] };
        if let Err(e) = serde_json::to_writer(&mut out, &r) {
            // A record that cannot be written (none can: the types serialise) is named, not lost.
            out.truncate(usize::from(i > 0));
            out.extend_from_slice(json!({ "error": e.to_string() }).to_string().as_bytes());
        }
        bytes::Bytes::from(out)
    });
    let tail = std::iter::once(bytes::Bytes::from_static(b"]}"));
    let chunks = head
        .chain(body)
        .chain(tail)
        .map(Ok::<_, std::convert::Infallible>);
    let mut resp =
        axum::body::Body::from_stream(futures_util::stream::iter(chunks)).into_response();
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    resp
}

pub(super) async fn list(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(
        q.as_deref(),
        &[
            "model",
            "tenant",
            "status",
            "min_e2e_s",
            "request_id",
            "annotated",
            "limit",
            "since",
        ],
    )?;
    let annotated = p
        .parse_with(
            "annotated",
            |s| match s {
                "true" | "1" => Some(true),
                "false" | "0" | "" => Some(false),
                _ => None,
            },
            "true or false",
        )?
        .unwrap_or(false);
    let limit = p
        .parse_with(
            "limit",
            |s| s.parse::<usize>().ok().filter(|n| (1..=10_000).contains(n)),
            "an integer from 1 to 10000",
        )?
        .unwrap_or(100);
    let since = p.parse_with(
        "since",
        |s| {
            chrono::DateTime::parse_from_rfc3339(s)
                .ok()
                .map(|t| t.timestamp_millis())
        },
        "an RFC 3339 timestamp such as 2026-12-02T10:00:00Z",
    )?;
    let outcome = p.parse_with(
        "status",
        RecordOutcome::parse,
        "ok, error, or an error class such as upstream_5xx",
    )?;
    let min_e2e_s = p.parse_with(
        "min_e2e_s",
        |s| s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0),
        "a non-negative number of seconds such as 1.5",
    )?;
    let non_empty = |name: &str| p.get(name).filter(|v| !v.is_empty()).map(str::to_string);
    let query = RecordQuery {
        model: non_empty("model"),
        since_unix_ms: since,
        tenant: non_empty("tenant"),
        request_id: non_empty("request_id"),
        trace_id: None,
        outcome,
        min_e2e_s,
        annotated,
        limit,
        with_text: false,
    };
    Ok(match run_query(st.store.clone(), query).await {
        Ok(records) => stream_list(records),
        Err(resp) => resp,
    })
}

use super::internal_error;

pub(super) async fn one(State(st): State<Arc<ApiState>>, Path(id): Path<String>) -> Response {
    let query = RecordQuery {
        request_id: Some(id.clone()),
        limit: 1,
        with_text: true,
        ..RecordQuery::default()
    };
    match run_query(st.store.clone(), query).await {
        Ok(mut records) => match records.pop() {
            Some(one) => {
                let mut r =
                    serde_json::to_value(&one).unwrap_or_else(|e| json!({ "error": e.to_string() }));
                // Its feedback and evaluation scores (`POST /api/v1/feedback`, `/api/v1/scores`),
                // given for its request id or its trace id.
                let trace = r["trace_id"].as_str().unwrap_or_default().to_string();
                let store = st.store.clone();
                let (ids, traces) = (vec![id.clone()], vec![trace]);
                let scores =
                    tokio::task::spawn_blocking(move || store.query_scores(&ids, &traces)).await;
                match scores {
                    Ok(Ok(rows)) => {
                        if let Some(o) = r.as_object_mut() {
                            o.insert("scores".into(), json!(rows));
                        }
                    }
                    Ok(Err(e)) => return internal_error(e.to_string()),
                    Err(e) => return internal_error(e.to_string()),
                }
                Json(r).into_response()
            }
            None => (
                StatusCode::NOT_FOUND,
                Json(json!({ "error": format!("no stored request with id {id:?} (records are kept for the raw retention period)") })),
            )
                .into_response(),
        },
        Err(resp) => resp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_streamed_list_is_the_records_with_their_annotations() {
        let record = |id: &str| RequestRecord {
            request_id: id.into(),
            chunk_offsets_us: vec![10, 12_500, 15_000],
            ..RequestRecord::default()
        };
        let note = AnnotationRow {
            request_id: "b".into(),
            detector: "output_length_outlier".into(),
            score: 2.0,
            ..AnnotationRow::default()
        };
        let notes = [note];
        for records in [
            vec![],
            vec![Annotated::new(record("a"), &notes)],
            vec![
                Annotated::new(record("a"), &notes),
                Annotated::new(record("b"), &notes),
            ],
        ] {
            let n = records.len();
            let resp = stream_list(records);
            assert_eq!(resp.headers()["content-type"], "application/json");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
            assert_eq!(v["count"], n);
            let list = v["requests"].as_array().unwrap();
            assert_eq!(list.len(), n);
            for (i, r) in list.iter().enumerate() {
                let id = ["a", "b"][i];
                assert_eq!(r["request_id"], id);
                assert_eq!(r["chunk_offsets_us"], json!([10, 12_500, 15_000]));
                let annotations = r["annotations"].as_array().unwrap();
                assert_eq!(annotations.len(), usize::from(id == "b"), "{r}");
            }
        }
    }
}
