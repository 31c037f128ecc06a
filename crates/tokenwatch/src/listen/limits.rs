// Request limits of the HTTP listeners (API, proxy, OTLP/HTTP): the `limits` configuration,
// the header check answering 431, the connection cap and the head deadline, the budget of
// request bodies held at once, and the count of refused requests and connections by listener
// and reason.

use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::{Metrics, RejectedLabels};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Deserialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// hyper's own default read-buffer limit (`8192 + 4096 * 100`), kept as a floor for its backstop.
const HYPER_DEFAULT_MAX_BUF: usize = 8192 + 4096 * 100;
/// hyper's own default number of headers, kept as a floor for its backstop.
const HYPER_DEFAULT_MAX_HEADERS: usize = 100;
/// Per-header overhead of the HTTP/1.1 wire form: `": "` and CRLF.
const HEADER_LINE_OVERHEAD: usize = 4;

/// `limits`: what one request may carry on every HTTP listener.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest request head (request line and headers) in bytes; more gets 431.
    pub max_header_bytes: usize,
    /// Most header fields in one request; more gets 431.
    pub max_headers: usize,
    /// Longest a connection may take to send a whole request head, counted from when it opens
    /// or, kept alive, from the end of its previous response: a client that sends nothing (an
    /// idle socket, a slow-loris head) is closed after it. Streams being answered are not cut.
    /// Above the idle timeout of load balancers in front (AWS ALB: 60 s), so that they, not
    /// tokenwatch, close an idle kept-alive connection (no request lost in the race).
    pub header_read_timeout: HumanDuration,
    /// Most connections open at once on each listener; beyond it a new connection is closed at
    /// once (counted, and warned about once), so idle sockets cannot take every descriptor.
    pub max_connections: usize,
    /// Most bytes of request bodies the proxy holds at once, over all its connections (each
    /// body is read whole to find its model, up to `proxy.max_request_body_bytes`), and, as a
    /// budget of its own, the OTLP/HTTP receiver. A request whose body would go over it is
    /// answered 503 with `Retry-After` at once, counted, instead of memory growing with every
    /// large body in flight.
    pub max_buffered_body_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            header_read_timeout: HumanDuration(Duration::from_secs(75)),
            max_connections: 10_000,
            max_buffered_body_bytes: 256 << 20,
        }
    }
}

impl LimitsConfig {
    /// Ranges serde cannot express: (key path, message).
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !(1024..=16 << 20).contains(&self.max_header_bytes) {
            return Err((
                "limits.max_header_bytes".into(),
                "must be between 1024 and 16777216 bytes".into(),
            ));
        }
        if !(1..=10_000).contains(&self.max_headers) {
            return Err((
                "limits.max_headers".into(),
                "must be between 1 and 10000".into(),
            ));
        }
        let timeout = self.header_read_timeout.0;
        if timeout < Duration::from_secs(1) || timeout > Duration::from_secs(3600) {
            return Err((
                "limits.header_read_timeout".into(),
                "must be between 1s and 1h".into(),
            ));
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err((
                "limits.max_connections".into(),
                "must be between 1 and 1000000".into(),
            ));
        }
        if !(1 << 20..=1 << 40).contains(&self.max_buffered_body_bytes) {
            return Err((
                "limits.max_buffered_body_bytes".into(),
                "must be between 1048576 (1 MiB) and 1099511627776 (1 TiB) bytes".into(),
            ));
        }
        Ok(())
    }

    /// hyper's hard limits, above the configured ones so that the check of `Guard` answers
    /// (with a body and a count) before hyper's bare 431 does; hyper stays the backstop
    /// against heads too large to be worth reading at all.
    pub(super) fn hyper_max_buf_size(&self) -> usize {
        self.max_header_bytes
            .saturating_mul(2)
            .max(HYPER_DEFAULT_MAX_BUF)
    }

    pub(super) fn hyper_max_headers(&self) -> usize {
        self.max_headers
            .saturating_mul(2)
            .max(HYPER_DEFAULT_MAX_HEADERS)
    }
}

/// Why a request was refused before (or while) being handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    HeadersTooLarge,
    BodyTooLarge,
    /// A connection closed for not sending a whole request head within `header_read_timeout`.
    HeaderTimeout,
    /// A connection closed at once: the listener had `max_connections` open.
    TooManyConnections,
    /// A request answered 503: its body would have taken the bodies held over
    /// `max_buffered_body_bytes`.
    BodyBudget,
    /// A request naming a host a loopback listener does not answer (DNS rebinding,
    /// `listen::browser`).
    ForeignHost,
    /// A write from a page of another origin (`listen::browser`).
    ForeignOrigin,
    /// A write to the API port whose body is not JSON (`listen::browser`).
    NotJson,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::HeadersTooLarge => "headers_too_large",
            Reason::BodyTooLarge => "body_too_large",
            Reason::HeaderTimeout => "header_timeout",
            Reason::TooManyConnections => "too_many_connections",
            Reason::BodyBudget => "body_budget",
            Reason::ForeignHost => "foreign_host",
            Reason::ForeignOrigin => "foreign_origin",
            Reason::NotJson => "unsupported_media_type",
        }
    }
}

/// Response extension a handler sets on its 413 for a body over its limit, so that the
/// listener counts it (an upstream's own 413 forwarded by the proxy carries none).
#[derive(Debug, Clone, Copy)]
pub struct BodyTooLarge;

/// Mark `resp` as a refusal of a body over its limit (counted by the listener serving it).
pub fn mark_body_too_large(mut resp: Response) -> Response {
    resp.extensions_mut().insert(BodyTooLarge);
    resp
}

/// Response extension a handler sets on its 503 for a body over the listener's budget
/// (`max_buffered_body_bytes`), so that the listener counts it.
#[derive(Debug, Clone, Copy)]
pub struct OverBodyBudget;

/// Bytes of the budget one permit stands for (a semaphore counts permits in `u32`s).
const BUDGET_UNIT: usize = 1024;

/// The bytes of request bodies held at once (`limits.max_buffered_body_bytes`), shared by every
/// connection of a listener: a body is read against it chunk by chunk, and what it reserved is
/// given back when the reservation is dropped.
#[derive(Clone)]
pub struct BodyBudget {
    units: Arc<Semaphore>,
    limit: usize,
    /// `tokenwatch_proxy_buffered_body_bytes`: what is held now.
    held_gauge: prometheus_client::metrics::gauge::Gauge,
}

/// A body's bytes held against the budget, given back when dropped.
pub struct BodyReservation {
    permit: Option<OwnedSemaphorePermit>,
    budget: BodyBudget,
}

impl BodyReservation {
    /// Reserve what a body of `len` bytes needs beyond what is held already; false (nothing
    /// more reserved) when the budget has not that much left.
    pub fn cover(&mut self, len: usize) -> bool {
        let held = self.permit.as_ref().map_or(0, |p| p.num_permits());
        let need = len.div_ceil(BUDGET_UNIT).saturating_sub(held);
        if need == 0 {
            return true;
        }
        let Some(more) = u32::try_from(need)
            .ok()
            .and_then(|n| self.budget.units.clone().try_acquire_many_owned(n).ok())
        else {
            return false;
        };
        match self.permit.as_mut() {
            Some(h) => h.merge(more),
            None => self.permit = Some(more),
        }
        self.budget.show();
        true
    }
}

impl Drop for BodyReservation {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.budget.show();
    }
}

/// Why a body could not be read whole.
#[derive(Debug)]
pub enum BodyReadError {
    /// Over the request's own limit (`max` bytes).
    TooLarge,
    /// Over what the budget had left.
    OverBudget,
    /// The client's connection failed.
    Read(axum::Error),
}

impl BodyBudget {
    pub fn new(limit_bytes: usize) -> BodyBudget {
        BodyBudget {
            units: Arc::new(Semaphore::new(limit_bytes.div_ceil(BUDGET_UNIT))),
            limit: limit_bytes,
            held_gauge: Default::default(),
        }
    }

    /// Show what is held as `tokenwatch_proxy_buffered_body_bytes` in `metrics`.
    pub fn register(&self, metrics: &Metrics) {
        metrics.register(
            "tokenwatch_proxy_buffered_body_bytes",
            "Bytes of request bodies the proxy holds now, against limits.max_buffered_body_bytes",
            self.held_gauge.clone(),
        );
    }

    fn show(&self) {
        self.held_gauge.set(self.held() as i64);
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes of the budget reserved now.
    pub fn held(&self) -> usize {
        (self.limit.div_ceil(BUDGET_UNIT) - self.units.available_permits()) * BUDGET_UNIT
    }

    /// An empty reservation, grown with `BodyReservation::cover` as a body is read.
    pub fn reservation(&self) -> BodyReservation {
        BodyReservation {
            permit: None,
            budget: self.clone(),
        }
    }

    /// Reads `body` whole (at most `max` bytes), reserving each chunk's bytes before keeping
    /// it; the reservation is held until the returned one is dropped. A body that arrives as
    /// one chunk is returned without a copy.
    pub async fn read(
        &self,
        body: axum::body::Body,
        max: usize,
    ) -> Result<(bytes::Bytes, BodyReservation), BodyReadError> {
        use http_body_util::BodyExt;
        let mut body = body;
        let mut chunks: Vec<bytes::Bytes> = Vec::new();
        let mut len = 0usize;
        let mut held = self.reservation();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(BodyReadError::Read)?.into_data() else {
                continue; // trailers
            };
            len += data.len();
            if len > max {
                return Err(BodyReadError::TooLarge);
            }
            if !held.cover(len) {
                return Err(BodyReadError::OverBudget);
            }
            chunks.push(data);
        }
        let bytes = match chunks.len() {
            0 => bytes::Bytes::new(),
            1 => chunks.pop().unwrap_or_default(),
            _ => {
                let mut all = bytes::BytesMut::with_capacity(len);
                for c in &chunks {
                    all.extend_from_slice(c);
                }
                all.freeze()
            }
        };
        Ok((bytes, held))
    }

    /// The 503 for a request over the budget (marked so that its listener counts it).
    pub fn refusal(&self) -> Response {
        let message = format!(
            "tokenwatch holds {} bytes of request bodies in flight, and this one would go over limits.max_buffered_body_bytes ({}); retry shortly",
            self.held(),
            self.limit
        );
        let mut resp = refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            &message,
            "limits.max_buffered_body_bytes",
            self.limit,
        );
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        resp.extensions_mut().insert(OverBodyBudget);
        resp
    }
}

/// Whether reading a body (`axum::body::to_bytes`) failed on its size limit rather than on
/// the client's connection.
pub fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// One listener's limits and its refusal counters.
#[derive(Clone)]
pub struct Guard {
    pub(super) listener: &'static str,
    pub(super) limits: LimitsConfig,
    rejected: Family<RejectedLabels, Counter>,
    /// One permit per open connection (`max_connections`).
    connections: Arc<Semaphore>,
    /// Whether the cap was warned about (once per listener).
    cap_warned: Arc<AtomicBool>,
}

impl Guard {
    /// The limits of the listener named `listener` (`api`, `proxy`, `otlp`), counted in `metrics`.
    pub fn new(listener: &'static str, limits: &LimitsConfig, metrics: &Metrics) -> Guard {
        Guard {
            listener,
            limits: limits.clone(),
            rejected: metrics.rejected_requests.clone(),
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            cap_warned: Arc::default(),
        }
    }

    /// A new connection's place under `max_connections`, held for its life; None (counted, the
    /// first time warned) when the listener is full and the connection is to be closed.
    pub fn admit(&self) -> Option<OwnedSemaphorePermit> {
        match self.connections.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                self.count(Reason::TooManyConnections);
                if !self.cap_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        listener = self.listener,
                        max_connections = self.limits.max_connections,
                        "listener full: new connections are closed at once (limits.max_connections; counted in tokenwatch_rejected_requests_total{{reason=\"too_many_connections\"}})"
                    );
                }
                None
            }
        }
    }

    pub fn count(&self, reason: Reason) {
        self.rejected
            .get_or_create(&RejectedLabels {
                listener: self.listener.to_string(),
                reason: reason.label().to_string(),
            })
            .inc();
    }

    /// The 431 for a request whose head is over the limits, or None. A sum over the headers
    /// already parsed: cheap enough for the proxy's hot path, unlike buffering or re-parsing.
    pub fn check_head<B>(&self, req: &http::Request<B>) -> Option<Response> {
        let headers = req.headers();
        if headers.len() > self.limits.max_headers {
            let msg = format!(
                "the request has {} header fields, over the limit of {} (limits.max_headers)",
                headers.len(),
                self.limits.max_headers
            );
            return Some(self.refuse_head(msg, "limits.max_headers", self.limits.max_headers));
        }
        let line =
            req.method().as_str().len() + req.uri().to_string().len() + " HTTP/1.1\r\n ".len();
        let size = headers.iter().fold(line, |n, (name, value)| {
            n + name.as_str().len() + value.len() + HEADER_LINE_OVERHEAD
        });
        if size > self.limits.max_header_bytes {
            let msg = format!(
                "the request head is {size} bytes, over the limit of {} bytes (limits.max_header_bytes)",
                self.limits.max_header_bytes
            );
            return Some(self.refuse_head(
                msg,
                "limits.max_header_bytes",
                self.limits.max_header_bytes,
            ));
        }
        None
    }

    fn refuse_head(&self, message: String, key: &str, limit: usize) -> Response {
        self.count(Reason::HeadersTooLarge);
        tracing::debug!(listener = self.listener, %message, "request refused");
        too_large(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            &message,
            key,
            limit,
        )
    }

    /// Count `resp` when its handler marked it as a body over its limit.
    pub fn observe(&self, resp: &Response) {
        if resp.extensions().get::<BodyTooLarge>().is_some() {
            self.count(Reason::BodyTooLarge);
        }
        if resp.extensions().get::<OverBodyBudget>().is_some() {
            self.count(Reason::BodyBudget);
        }
    }
}

/// A JSON refusal naming the limit and its configuration key, in the shape of an OpenAI error
/// (`error.message`) so that SDK clients of the proxy show the message.
pub fn too_large(status: StatusCode, message: &str, key: &str, limit: usize) -> Response {
    refusal(status, "request_too_large", message, key, limit)
}

/// A refused request's answer: `error.type` `kind`, the message, the limit and its key; the rest
/// of the request is not read, so the connection is not reused.
fn refusal(status: StatusCode, kind: &str, message: &str, key: &str, limit: usize) -> Response {
    let body = serde_json::json!({
        "error": { "message": message, "type": kind, "key": key, "limit": limit }
    });
    let mut resp = (status, axum::Json(body)).into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(limits: LimitsConfig) -> (Guard, Metrics) {
        let metrics = Metrics::new();
        (Guard::new("api", &limits, &metrics), metrics)
    }

    /// A body of `chunks` chunks of `size` bytes each.
    fn chunked(chunks: usize, size: usize) -> axum::body::Body {
        let parts: Vec<Result<bytes::Bytes, std::io::Error>> = (0..chunks)
            .map(|i| Ok(bytes::Bytes::from(vec![i as u8; size])))
            .collect();
        axum::body::Body::from_stream(futures_util::stream::iter(parts))
    }

    #[tokio::test]
    async fn bodies_are_held_against_the_budget_until_their_reservation_is_dropped() {
        let budget = BodyBudget::new(1 << 20);
        let metrics = Metrics::new();
        budget.register(&metrics);
        let gauge = || {
            let text = metrics.encode();
            text.lines()
                .find_map(|l| l.strip_prefix("tokenwatch_proxy_buffered_body_bytes "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        // 600 KiB in three chunks, kept whole in order; 600 KiB of the budget held.
        let (first, held) = budget.read(chunked(3, 200 << 10), 32 << 20).await.unwrap();
        assert_eq!(first.len(), 600 << 10);
        assert_eq!(first[0], 0);
        assert_eq!(first[(600 << 10) - 1], 2);
        assert_eq!(budget.held(), 600 << 10);
        assert_eq!(gauge(), Some((600 << 10) as f64));
        // Another 600 KiB would go over 1 MiB: refused, and what it had reserved given back.
        assert!(matches!(
            budget.read(chunked(3, 200 << 10), 32 << 20).await,
            Err(BodyReadError::OverBudget)
        ));
        assert_eq!(budget.held(), 600 << 10);
        let resp = budget.refusal();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        // Once the first is let go, it fits; a body over the request's own limit does not.
        drop(held);
        assert_eq!(budget.held(), 0);
        assert_eq!(gauge(), Some(0.0));
        let (again, _held) = budget.read(chunked(3, 200 << 10), 32 << 20).await.unwrap();
        assert_eq!(again.len(), 600 << 10);
        assert!(matches!(
            budget.read(chunked(2, 100), 150).await,
            Err(BodyReadError::TooLarge)
        ));
        // One chunk comes back as it is; an empty body reserves nothing.
        let (one, _h) = budget.read(chunked(1, 10), 100).await.unwrap();
        assert_eq!(one.len(), 10);
        let (none, h) = budget.read(chunked(0, 0), 100).await.unwrap();
        assert!(none.is_empty() && h.permit.is_none());
    }

    #[test]
    fn heads_over_either_limit_are_refused_and_counted() {
        let (g, metrics) = guard(LimitsConfig {
            max_header_bytes: 2048,
            max_headers: 4,
            ..LimitsConfig::default()
        });
        let ok = http::Request::get("/x").header("a", "b").body(()).unwrap();
        assert!(g.check_head(&ok).is_none());

        let big = http::Request::get("/x")
            .header("a", "v".repeat(4096))
            .body(())
            .unwrap();
        let resp = g.check_head(&big).expect("refused");
        assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);

        let mut many = http::Request::get("/x");
        for i in 0..5 {
            many = many.header(format!("h{i}"), "v");
        }
        assert!(g.check_head(&many.body(()).unwrap()).is_some());

        let long_uri = http::Request::get(format!("/x?{}", "q".repeat(4096)))
            .body(())
            .unwrap();
        assert!(g.check_head(&long_uri).is_some(), "the request line counts");

        let mut marked = mark_body_too_large(StatusCode::PAYLOAD_TOO_LARGE.into_response());
        g.observe(&marked);
        marked.extensions_mut().clear();
        g.observe(&marked);
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"tokenwatch_rejected_requests_total{listener="api",reason="headers_too_large"} 3"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"tokenwatch_rejected_requests_total{listener="api",reason="body_too_large"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn hyper_backstops_stay_above_the_configured_limits() {
        let d = LimitsConfig::default();
        assert!(
            d.hyper_max_buf_size() > d.max_header_bytes
                && d.hyper_max_buf_size() >= HYPER_DEFAULT_MAX_BUF
        );
        assert!(d.hyper_max_headers() > d.max_headers);
        let big = LimitsConfig {
            max_header_bytes: 1 << 20,
            max_headers: 500,
            ..LimitsConfig::default()
        };
        assert_eq!(
            (big.hyper_max_buf_size(), big.hyper_max_headers()),
            (2 << 20, 1000)
        );
        assert!(
            LimitsConfig {
                max_header_bytes: 10,
                max_headers: 1,
                ..LimitsConfig::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            LimitsConfig {
                max_header_bytes: 4096,
                max_headers: 0,
                ..LimitsConfig::default()
            }
            .validate()
            .is_err()
        );
        assert!(d.validate().is_ok());
    }
}
