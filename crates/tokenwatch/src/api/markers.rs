// `GET/POST /api/v1/markers` (version, deploy and custom markers) and `GET /api/v1/compare`:
// every signal of a marker's model before vs after it, with 95 % intervals and verdicts — from
// request records, or from the runtime's own histograms for a model no record holds.

use super::ApiState;
use crate::kernel::params::{ParamError, Params};
use crate::markers::compare::{compare_records, compare_runtime, compare_signal};
use crate::markers::{MarkerKind, MarkerSource, marker};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::runtime_latency::MINUTE_MS;
use tokenwatch_store::{MarkerQuery, MarkerRow, RecordQuery, StoreError};

/// Fields a posted marker may have.
const FIELDS: &str = "kind, model, from_version, to_version, note, at_unix_ms";
/// Longest text field of a posted marker, bytes.
const MAX_TEXT: usize = 1024;
/// How far in the future a posted marker may be dated (clock skew).
const MAX_FUTURE_MS: i64 = 5 * 60_000;
/// Default and longest comparison window (each side).
const DEFAULT_WINDOW: Duration = Duration::from_secs(30 * 60);
const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
/// Records read per comparison at most.
const MAX_RECORDS: usize = 200_000;
/// Why a comparison's latency and error rows came from the runtime.
const RUNTIME_CHOSEN: &str = "no proxy or OTLP record of this model in either window: latency and error rate from the runtime's own histograms and counters, in whole minutes (each percentile's interval reaches to the edges of its buckets)";

/// The runtime's minutes (their starts) on each side of a marker at `at`: before, those starting
/// in `[from, at)` and ending by `at`; after, those starting in `[at, to]`. The minute holding a
/// marker off a minute boundary mixes both sides and is left out (its start).
fn runtime_sides(from: i64, at: i64, to: i64) -> ((i64, i64), (i64, i64), Option<i64>) {
    let marker_minute = at.div_euclid(MINUTE_MS) * MINUTE_MS;
    let straddled = (marker_minute != at).then_some(marker_minute);
    let after_from = straddled.map_or(at, |m| m + MINUTE_MS);
    (
        (from.div_euclid(MINUTE_MS) * MINUTE_MS, marker_minute),
        (after_from, to.saturating_add(1)),
        straddled,
    )
}

fn error(status: StatusCode, msg: String) -> Response {
    (status, Json(json!({ "error": msg }))).into_response()
}

fn store_failed(e: String) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, e)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Response> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(store_failed(e.to_string())),
        Err(e) => Err(store_failed(format!("the store query stopped: {e}"))),
    }
}

/// `since`: Unix milliseconds, or a duration back from now (`1h`, `30m`).
fn parse_since(s: &str) -> Option<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return (ms >= 0).then_some(ms);
    }
    let d = crate::kernel::duration::HumanDuration::parse(s).ok()?.0;
    Some(now_unix_ms().saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
}

/// `GET /api/v1/markers?model=&since=&limit=`: oldest first.
pub async fn list(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(q.as_deref(), &["model", "since", "limit"])?;
    let since = p.parse_with(
        "since",
        parse_since,
        "Unix milliseconds or a duration back from now such as 1h",
    )?;
    let limit = p
        .parse_with(
            "limit",
            |s| s.parse::<usize>().ok().filter(|n| (1..=10_000).contains(n)),
            "1 to 10000",
        )?
        .unwrap_or(1000);
    let query = MarkerQuery {
        id: None,
        model: p.get("model").filter(|m| !m.is_empty()).map(str::to_string),
        since_unix_ms: since,
        limit,
    };
    let store = st.store.clone();
    Ok(match blocking(move || store.query_markers(&query)).await {
        Ok(rows) => Json(json!({ "count": rows.len(), "markers": rows })).into_response(),
        Err(resp) => resp,
    })
}

/// A posted marker, checked field by field; Err names the field.
fn parse_marker(body: &[u8], now: i64) -> Result<MarkerRow, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Some(obj) = v.as_object() else {
        return Err(format!(
            "the body must be a JSON object with fields {FIELDS}"
        ));
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !FIELDS.split(", ").any(|f| f == k.as_str()))
    {
        return Err(format!("unknown field {k:?}; allowed: {FIELDS}"));
    }
    let text = |name: &str| -> Result<String, String> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) if s.len() > MAX_TEXT => {
                Err(format!("field {name:?} is longer than {MAX_TEXT} bytes"))
            }
            Some(Value::String(s)) if s.chars().any(char::is_control) => {
                Err(format!("field {name:?} must not hold control characters"))
            }
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(format!("field {name:?} must be a string, not {other}")),
        }
    };
    let kinds = MarkerKind::ALL.map(MarkerKind::name).join(", ");
    let kind = match obj.get("kind") {
        None | Some(Value::Null) => {
            return Err(format!("field \"kind\" is required: one of {kinds}"));
        }
        Some(Value::String(s)) => MarkerKind::parse(s)
            .ok_or_else(|| format!("field \"kind\": {s:?} is not one of {kinds}"))?,
        Some(other) => return Err(format!("field \"kind\" must be a string, not {other}")),
    };
    let model = text("model")?;
    let from_version = text("from_version")?;
    let to_version = text("to_version")?;
    let note = text("note")?;
    if matches!(kind, MarkerKind::ModelVersion | MarkerKind::PromptVersion) {
        if model.is_empty() {
            return Err(format!(
                "field \"model\" is required for a {} marker",
                kind.name()
            ));
        }
        if to_version.is_empty() {
            return Err(format!(
                "field \"to_version\" is required for a {} marker",
                kind.name()
            ));
        }
    }
    let at = match obj.get("at_unix_ms") {
        None | Some(Value::Null) => now,
        Some(v) => match v.as_i64() {
            Some(ms) if ms > 0 && ms <= now + MAX_FUTURE_MS => ms,
            _ => {
                return Err(format!(
                    "field \"at_unix_ms\" must be a positive integer of Unix milliseconds, at most 5 minutes ahead of now; got {v}"
                ));
            }
        },
    };
    Ok(marker(
        kind,
        &model,
        &from_version,
        &to_version,
        MarkerSource::Api,
        at,
        &note,
    ))
}

/// `POST /api/v1/markers`: 201 with the stored marker; 400 naming the field at fault.
pub async fn create(State(st): State<Arc<ApiState>>, body: Bytes) -> Response {
    let row = match parse_marker(&body, now_unix_ms()) {
        Ok(r) => r,
        Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
    };
    let store = st.store.clone();
    let stored = row.clone();
    match blocking(move || store.insert_markers(std::slice::from_ref(&stored))).await {
        Ok(()) => (StatusCode::CREATED, Json(json!(row))).into_response(),
        Err(resp) => resp,
    }
}

/// `GET /api/v1/compare?marker=ID[&window=30m]`: the marker's model (every model for a marker
/// without one), each signal over `window` before the marker and `window` after it (cut at now).
pub async fn compare(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(q.as_deref(), &["marker", "window"])?;
    let id = p
        .get("marker")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ParamError::BadValue {
            name: "marker".into(),
            value: String::new(),
            allowed: "a marker id from /api/v1/markers (required)".into(),
        })?
        .to_string();
    let window = p
        .parse_with(
            "window",
            |s| {
                crate::kernel::duration::HumanDuration::parse(s)
                    .ok()
                    .map(|d| d.0)
                    .filter(|d| *d >= Duration::from_secs(1) && *d <= MAX_WINDOW)
            },
            "a duration from 1s to 7d such as 30m",
        )?
        .unwrap_or(DEFAULT_WINDOW);
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let window_name = p.get("window").unwrap_or("30m").to_string();
    let store = st.store.clone();
    let found = blocking(move || {
        let q = MarkerQuery {
            id: Some(id.clone()),
            limit: 1,
            ..MarkerQuery::default()
        };
        let Some(m) = store.query_markers(&q)?.pop() else {
            return Ok(Err(id));
        };
        let now = now_unix_ms();
        let from = m.at_unix_ms.saturating_sub(window_ms);
        let to = m.at_unix_ms.saturating_add(window_ms).min(now);
        let records = store.query_records(&RecordQuery {
            model: (!m.model.is_empty()).then(|| m.model.clone()),
            since_unix_ms: Some(from),
            limit: MAX_RECORDS,
            ..RecordQuery::default()
        })?;
        Ok(Ok((m, records, from, to, now)))
    })
    .await;
    let (m, records, from, to, now) = match found {
        Ok(Ok(v)) => v,
        Ok(Err(id)) => {
            return Ok(error(
                StatusCode::NOT_FOUND,
                format!("no marker with id {id:?}; list them at /api/v1/markers"),
            ));
        }
        Err(resp) => return Ok(resp),
    };
    let truncated = records.len() >= MAX_RECORDS;
    let (before, after): (Vec<_>, Vec<_>) = records
        .into_iter()
        .filter(|r| r.arrival_unix_ms < to)
        .partition(|r| r.arrival_unix_ms < m.at_unix_ms);
    // No record of the model on either side: the runtime's own minutes answer, when it has any.
    let mut figure_source = "records";
    let mut runtime_note = None;
    let mut rows = if before.is_empty() && after.is_empty() {
        let (b_range, a_range, left_out) = runtime_sides(from, m.at_unix_ms, to);
        let model = (!m.model.is_empty()).then_some(m.model.as_str());
        let (b_span, a_span) = {
            let board = st.signals.read().unwrap_or_else(|p| p.into_inner());
            let w = board.runtime_windows();
            (
                w.span(model, b_range.0, b_range.1),
                w.span(model, a_range.0, a_range.1),
            )
        };
        if b_span.histograms.is_empty() && a_span.histograms.is_empty() {
            compare_records(&before, &after)
        } else {
            figure_source = "runtime";
            let side = |s: &tokenwatch_core::runtime_latency::RuntimeSpan| {
                json!({
                    "first_minute_unix_ms": s.first_minute_ms,
                    "last_minute_unix_ms": s.last_minute_ms,
                    "instances": s.instances,
                    "runtimes": s.runtimes,
                    "observations_left_out": s.observations_left_out,
                })
            };
            runtime_note = Some(json!({
                "before": side(&b_span),
                "after": side(&a_span),
                "marker_minute_left_out_unix_ms": left_out,
                "resolution_ms": MINUTE_MS,
            }));
            let mut rows = compare_runtime(&b_span, &a_span);
            // Tokens per request have no runtime histogram here: the records' rows stay (no data).
            rows.extend(
                compare_records(&before, &after)
                    .into_iter()
                    .filter(|r| r.signal.ends_with("_per_request")),
            );
            rows
        }
    } else {
        compare_records(&before, &after)
    };
    // Normalised signals of the model (every instance together) from the board's history.
    let mut series: BTreeMap<(String, String), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    {
        let board = st.signals.read().unwrap_or_else(|p| p.into_inner());
        for (point, history) in
            board.series_where(from, |pt| !m.model.is_empty() && pt.model_id == m.model)
        {
            let e = series
                .entry((point.signal.clone(), point.source.clone()))
                .or_default();
            for (t, v) in history {
                if t < m.at_unix_ms {
                    e.0.push(v);
                } else if t < to.max(m.at_unix_ms + 1) {
                    e.1.push(v);
                }
            }
        }
    }
    rows.extend(
        series
            .iter()
            .filter(|(_, (b, a))| !b.is_empty() || !a.is_empty())
            .map(|((signal, source), (b, a))| compare_signal(signal, source, b, a)),
    );
    let mut body = json!({
        "marker": m,
        "window": window_name,
        "window_ms": window_ms,
        "confidence": 0.95,
        "before": { "from_unix_ms": from, "to_unix_ms": m.at_unix_ms, "requests": before.len() },
        "after": { "from_unix_ms": m.at_unix_ms, "to_unix_ms": to, "requests": after.len() },
        "signals": rows,
        "figure_source": figure_source,
    });
    if let Some(runtime) = runtime_note {
        body["source_chosen"] = json!(RUNTIME_CHOSEN);
        body["runtime"] = runtime;
    }
    if m.at_unix_ms > now {
        body["note"] = json!("the marker is in the future: nothing after it yet");
    }
    if truncated {
        body["truncated"] = json!(format!(
            "only the newest {MAX_RECORDS} records of the window were compared"
        ));
    }
    Ok(Json(body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn posted_markers_are_checked_field_by_field() {
        let ok = parse_marker(br#"{"kind":"deploy","note":"helm 1.2.3"}"#, NOW).unwrap();
        assert_eq!(
            (
                ok.kind.as_str(),
                ok.source.as_str(),
                ok.at_unix_ms,
                ok.note.as_str()
            ),
            ("deploy", "api", NOW, "helm 1.2.3")
        );
        let v = parse_marker(br#"{"kind":"model_version","model":"m","from_version":"a","to_version":"b","at_unix_ms":5}"#, NOW).unwrap();
        assert_eq!(
            (v.model.as_str(), v.to_version.as_str(), v.at_unix_ms),
            ("m", "b", 5)
        );
        for (body, field) in [
            (&br#"{"note":"x"}"#[..], "\"kind\""),
            (br#"{"kind":"rollout"}"#, "\"kind\""),
            (br#"{"kind":7}"#, "\"kind\""),
            (br#"{"kind":"deploy","modle":"m"}"#, "\"modle\""),
            (br#"{"kind":"deploy","model":3}"#, "\"model\""),
            (br#"{"kind":"custom","note":"a\u0000b"}"#, "\"note\""),
            (br#"{"kind":"deploy","at_unix_ms":-1}"#, "\"at_unix_ms\""),
            (br#"{"kind":"deploy","at_unix_ms":"now"}"#, "\"at_unix_ms\""),
            (br#"{"kind":"model_version","to_version":"b"}"#, "\"model\""),
            (
                br#"{"kind":"prompt_version","model":"m"}"#,
                "\"to_version\"",
            ),
        ] {
            let err = parse_marker(body, NOW).unwrap_err();
            assert!(
                err.contains(field),
                "{}: {err}",
                String::from_utf8_lossy(body)
            );
        }
        let far = format!(r#"{{"kind":"deploy","at_unix_ms":{}}}"#, NOW + 3_600_000);
        assert!(
            parse_marker(far.as_bytes(), NOW)
                .unwrap_err()
                .contains("at_unix_ms")
        );
        assert!(
            parse_marker(b"[1]", NOW)
                .unwrap_err()
                .contains("JSON object")
        );
        assert!(
            parse_marker(b"{", NOW)
                .unwrap_err()
                .contains("not valid JSON")
        );
        let long = format!(
            r#"{{"kind":"custom","note":"{}"}}"#,
            "x".repeat(MAX_TEXT + 1)
        );
        assert!(
            parse_marker(long.as_bytes(), NOW)
                .unwrap_err()
                .contains("\"note\"")
        );
    }

    #[test]
    fn the_minute_holding_a_marker_is_left_out_of_both_sides() {
        let minute = 1_800_000_000_000 - 1_800_000_000_000 % MINUTE_MS;
        let at = minute + 20_000;
        let (before, after, left_out) = runtime_sides(at - 600_000, at, at + 600_000);
        assert_eq!(before, (minute - 10 * MINUTE_MS, minute));
        assert_eq!(after, (minute + MINUTE_MS, at + 600_001));
        assert_eq!(left_out, Some(minute));
        // On a minute boundary: nothing mixed, nothing left out.
        let (before, after, left_out) = runtime_sides(minute - 300_000, minute, minute + 1);
        assert_eq!((before.1, after.0, left_out), (minute, minute, None));
    }

    #[test]
    fn since_takes_milliseconds_or_a_duration() {
        assert_eq!(parse_since("1700000000000"), Some(1_700_000_000_000));
        let ago = parse_since("1h").unwrap();
        assert!((now_unix_ms() - ago - 3_600_000).abs() < 5_000);
        assert_eq!(parse_since("-5"), None);
        assert_eq!(parse_since("soon"), None);
    }
}
