// The audit log's axum layer on the API port: one entry per guarded request (or refused
// attempt) with the caller, the redacted query, the status and the bytes of the response body.

use super::AuditLog;
use super::entry::{RequestEntry, bounded, redact_query};
use crate::auth::Caller;
use crate::auth::http::api_role;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use chrono::Utc;
use http_body::{Frame, SizeHint};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// An entry waiting for its response body to end.
struct Pending {
    entry: RequestEntry,
    started: Instant,
    log: AuditLog,
}

impl Pending {
    fn send(mut self, bytes: u64) {
        self.entry.bytes = bytes;
        self.entry.duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.log.request(self.entry);
    }
}

/// A response body that counts its bytes and sends the entry when it ends or is dropped
/// (a client that goes away mid-stream).
struct Counted {
    inner: Body,
    bytes: u64,
    pending: Option<Pending>,
}

impl Counted {
    fn finish(&mut self) {
        if let Some(p) = self.pending.take() {
            p.send(self.bytes);
        }
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The body's size when it is known before it is sent: `Content-Length`, or an exact hint.
fn known_size(resp: &Response) -> Option<u64> {
    resp.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .or_else(|| http_body::Body::size_hint(resp.body()).exact())
}

async fn audit(State(log): State<AuditLog>, req: Request, next: Next) -> Response {
    // The probes and the UI's static files are not audited (they hold no data).
    if api_role(req.method(), req.uri().path()).is_none() {
        return next.run(req).await;
    }
    let started = Instant::now();
    let ts = Utc::now();
    let remote = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let method = req.method().clone();
    let path = bounded(req.uri().path());
    let query = req.uri().query().map(redact_query);
    let resp = next.run(req).await;
    // The auth guard names the caller; without tokens everyone is `anonymous`.
    let caller = resp
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(Caller::anonymous);
    let pending = Pending {
        entry: RequestEntry {
            ts,
            caller: caller.name,
            role: caller.role.map(|r| r.name()),
            remote,
            method: method.to_string(),
            path,
            query,
            status: resp.status().as_u16(),
            bytes: 0,
            duration_ms: 0.0,
        },
        started,
        log,
    };
    if method == Method::HEAD {
        pending.send(0);
        return resp;
    }
    if let Some(n) = known_size(&resp) {
        pending.send(n);
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let counted = Counted {
        inner: body,
        bytes: 0,
        pending: Some(pending),
    };
    Response::from_parts(parts, Body::new(counted))
}

/// The API router with every guarded request audited (unchanged when the audit log is off).
/// Add it after `auth::http::protect_api`, so that it sees the guard's refusals and callers.
pub fn audit_api(router: axum::Router, log: &AuditLog) -> axum::Router {
    if !log.enabled() {
        return router;
    }
    router.layer(axum::middleware::from_fn_with_state(log.clone(), audit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::entry::Record;
    use crate::audit::test_log;
    use axum::routing::get;
    use tower_service::Service;

    /// The size of the body `app` answers `GET uri` with.
    async fn call(app: &mut axum::Router, uri: &str) -> usize {
        let req = Request::builder().uri(uri).body(Body::empty()).unwrap();
        let resp = app.call(req).await.unwrap();
        axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap()
            .len()
    }

    #[tokio::test]
    async fn entries_carry_status_bytes_and_redacted_query() {
        let (log, rx) = test_log(8);
        let stream = || {
            let chunks = ["ab", "cde", "f"].map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
            Body::from_stream(futures_util::stream::iter(chunks))
        };
        let mut app = audit_api(
            axum::Router::new()
                .route("/api/v1/x", get(|| async { "hello" }))
                .route("/api/v1/stream", get(move || async move { stream() }))
                .route("/healthz", get(|| async { "ok" })),
            &log,
        );
        assert_eq!(call(&mut app, "/api/v1/x?model=m&token=abc").await, 5);
        assert_eq!(call(&mut app, "/api/v1/stream").await, 6);
        assert_eq!(call(&mut app, "/healthz").await, 2);
        assert_eq!(call(&mut app, "/api/v1/none").await, 0);
        let got: Vec<RequestEntry> = rx
            .try_iter()
            .map(|m| match m {
                crate::audit::writer::Msg::Record(r) => match *r {
                    Record::Request(e) => e,
                    other => panic!("{other:?}"),
                },
                crate::audit::writer::Msg::Close => panic!("close"),
            })
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(
            (got[0].path.as_str(), got[0].query.as_deref(), got[0].bytes),
            ("/api/v1/x", Some("model=m&token=REDACTED"), 5)
        );
        assert_eq!(
            (&*got[0].caller, got[0].role, got[0].status),
            ("anonymous", None, 200)
        );
        assert_eq!((got[1].path.as_str(), got[1].bytes), ("/api/v1/stream", 6));
        assert_eq!((got[2].status, got[2].method.as_str()), (404, "GET"));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let (log, rx) = test_log(1);
        let mut app = audit_api(
            axum::Router::new().route("/metrics", get(|| async { "m" })),
            &log,
        );
        for _ in 0..3 {
            assert_eq!(call(&mut app, "/metrics").await, 1);
        }
        assert_eq!(rx.try_iter().count(), 1);
        assert_eq!(log.dropped(), 2);
    }
}
