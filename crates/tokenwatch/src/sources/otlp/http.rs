// OTLP/HTTP: POST /v1/traces, /v1/metrics, /v1/logs in protobuf or JSON, optionally gzip,
// size-limited; answers 200 (with partial success), 400, 413, 415, 429 or 503 with a clear message.

use super::codec::{self, DecodeError, Encoding};
use super::ingest::{Accepted, Ingest, Refused, Transport};
use crate::listen::limits::{BodyBudget, BodyReservation};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use std::sync::Arc;

pub struct HttpState {
    pub ingest: Arc<Ingest>,
    pub max_request_bytes: usize,
    /// Bytes of bodies being received at once, over every connection (`limits.max_buffered_body_bytes`).
    pub body_budget: BodyBudget,
    /// Longest a body may take to arrive (`otlp.body_read_timeout`).
    pub body_read_timeout: std::time::Duration,
}

#[derive(Clone, Copy)]
enum Signal {
    Traces,
    Metrics,
    Logs,
}

type St = State<Arc<HttpState>>;

pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route(
            "/v1/traces",
            post(|s: St, h: HeaderMap, b: Body| handle(s, h, b, Signal::Traces)),
        )
        .route(
            "/v1/metrics",
            post(|s: St, h: HeaderMap, b: Body| handle(s, h, b, Signal::Metrics)),
        )
        .route(
            "/v1/logs",
            post(|s: St, h: HeaderMap, b: Body| handle(s, h, b, Signal::Logs)),
        )
        .with_state(state)
}

/// An error answer: the status and a `google.rpc.Status` body in the request's encoding.
fn error(status: StatusCode, code: tonic::Code, message: &str, enc: Option<Encoding>) -> Response {
    let (body, content_type) = codec::error_body(code, message, enc);
    let mut resp = (status, [(header::CONTENT_TYPE, content_type)], body).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    resp
}

fn decode_failure(state: &HttpState, e: &DecodeError, enc: Option<Encoding>) -> Response {
    state.ingest.stats.request(Transport::Http, e.outcome());
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let resp = error(status, e.code(), &e.to_string(), enc);
    // Counted by the listener in `tokenwatch_rejected_requests{reason="body_too_large"}`.
    if matches!(e, DecodeError::TooLarge { .. }) {
        crate::listen::limits::mark_body_too_large(resp)
    } else {
        resp
    }
}

fn refused(state: &HttpState, r: Refused, enc: Encoding) -> Response {
    match r {
        Refused::Busy(m) => {
            state.ingest.stats.request(Transport::Http, "busy");
            error(
                StatusCode::TOO_MANY_REQUESTS,
                tonic::Code::ResourceExhausted,
                &m,
                Some(enc),
            )
        }
        Refused::Unavailable(m) => {
            state.ingest.stats.request(Transport::Http, "unavailable");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                tonic::Code::Unavailable,
                &m,
                Some(enc),
            )
        }
    }
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Bytes of an oversized body read and discarded before answering 413, so that clients still
/// sending see the answer instead of a reset connection; beyond this the connection is dropped.
const DRAIN_MAX_BYTES: usize = 64 * 1024 * 1024;
const DRAIN_MAX_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// The request body, inflated when gzip, never more than `limit` bytes held, and what it holds
/// of the listener's `budget` (its bytes as received) until dropped.
async fn read_body(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
    budget: &BodyBudget,
) -> Result<(Vec<u8>, BodyReservation), DecodeError> {
    let mut held = budget.reservation();
    let gzip = codec::is_gzip(header_str(headers, header::CONTENT_ENCODING))?;
    let declared = header_str(headers, header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    let mut too_large = declared.is_some_and(|n| n > limit as u64);
    let mut raw = Vec::new();
    let mut drained = 0usize;
    let started = tokio::time::Instant::now();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| DecodeError::Body(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if !too_large && raw.len() + data.len() > limit {
            too_large = true;
            raw = Vec::new();
        }
        if too_large {
            drained += data.len();
            if drained > DRAIN_MAX_BYTES || started.elapsed() > DRAIN_MAX_TIME {
                break;
            }
        } else {
            if !held.cover(raw.len() + data.len()) {
                return Err(DecodeError::OverBudget {
                    held: budget.held(),
                    limit: budget.limit(),
                });
            }
            raw.extend_from_slice(&data);
        }
    }
    if too_large {
        return Err(DecodeError::TooLarge { limit });
    }
    if gzip {
        Ok((codec::gunzip(&raw, limit)?, held))
    } else {
        Ok((raw, held))
    }
}

fn ok<T: prost::Message + serde::Serialize>(
    state: &HttpState,
    a: &Accepted,
    resp: T,
    enc: Encoding,
) -> Response {
    state.ingest.stats.request(
        Transport::Http,
        if a.rejected > 0 { "partial" } else { "ok" },
    );
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, enc.content_type())],
        codec::encode(&resp, enc),
    )
        .into_response()
}

async fn handle(State(state): St, headers: HeaderMap, body: Body, signal: Signal) -> Response {
    let enc = match codec::encoding_of(header_str(&headers, header::CONTENT_TYPE)) {
        Ok(e) => e,
        Err(e) => return decode_failure(&state, &e, None),
    };
    // The body is received before a processing slot is taken: a slot is held only while an
    // export is decoded and mapped, so slow uploads (a trickling client, a congested link) wait
    // on their own bytes — bounded by the body budget and the read timeout — and never starve
    // other clients' exports of slots.
    let read = read_body(&headers, body, state.max_request_bytes, &state.body_budget);
    let (bytes, _held) = match tokio::time::timeout(state.body_read_timeout, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return decode_failure(&state, &e, Some(enc)),
        Err(_) => {
            let e = DecodeError::SlowBody {
                timeout_ms: u64::try_from(state.body_read_timeout.as_millis()).unwrap_or(u64::MAX),
            };
            return decode_failure(&state, &e, Some(enc));
        }
    };
    let _permit = match state.ingest.admit() {
        Ok(p) => p,
        Err(r) => return refused(&state, r, enc),
    };
    let ingest = &state.ingest;
    match signal {
        Signal::Traces => {
            let req: ExportTraceServiceRequest =
                match codec::decode(&bytes, enc, "ExportTraceServiceRequest") {
                    Ok(r) => r,
                    Err(e) => return decode_failure(&state, &e, Some(enc)),
                };
            drop(bytes);
            match ingest.traces_to_the_end(req, Transport::Http).await {
                Ok(a) => {
                    let partial_success = (a.rejected > 0).then(|| ExportTracePartialSuccess {
                        rejected_spans: a.rejected,
                        error_message: a.message.clone(),
                    });
                    ok(
                        &state,
                        &a,
                        ExportTraceServiceResponse { partial_success },
                        enc,
                    )
                }
                Err(r) => refused(&state, r, enc),
            }
        }
        Signal::Metrics => {
            let req: ExportMetricsServiceRequest =
                match codec::decode(&bytes, enc, "ExportMetricsServiceRequest") {
                    Ok(r) => r,
                    Err(e) => return decode_failure(&state, &e, Some(enc)),
                };
            let a = ingest.metrics(&req, Transport::Http);
            let partial_success = (a.rejected > 0).then(|| ExportMetricsPartialSuccess {
                rejected_data_points: a.rejected,
                error_message: a.message.clone(),
            });
            ok(
                &state,
                &a,
                ExportMetricsServiceResponse { partial_success },
                enc,
            )
        }
        Signal::Logs => {
            let req: ExportLogsServiceRequest =
                match codec::decode(&bytes, enc, "ExportLogsServiceRequest") {
                    Ok(r) => r,
                    Err(e) => return decode_failure(&state, &e, Some(enc)),
                };
            drop(bytes);
            match ingest.logs(req, Transport::Http).await {
                Ok(a) => {
                    let partial_success = (a.rejected > 0).then(|| ExportLogsPartialSuccess {
                        rejected_log_records: a.rejected,
                        error_message: a.message.clone(),
                    });
                    ok(
                        &state,
                        &a,
                        ExportLogsServiceResponse { partial_success },
                        enc,
                    )
                }
                Err(r) => refused(&state, r, enc),
            }
        }
    }
}
