// Delivery loop shared by the exporters (remote write, OTLP): attempts with a timeout,
// exponential backoff between retryable failures, one short last attempt once shutdown is asked.

use crate::kernel::tls::{HttpsClient, UpstreamTls};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokenwatch_core::backoff::Backoff;
use tokio::sync::watch;

/// First wait after a failed attempt; doubles after each further failure.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Time allowed to each attempt made after shutdown was requested.
pub const LAST_ATTEMPT: Duration = Duration::from_secs(2);

/// An exporter's HTTP client: plain, or HTTPS with rustls as for https upstreams.
#[derive(Clone)]
pub enum HttpClient {
    Plain(Client<HttpConnector, Full<Bytes>>),
    Tls(HttpsClient),
}

impl HttpClient {
    /// A pooled client with TCP_NODELAY and `connect_timeout`; HTTPS when `tls` is given.
    pub fn new(tls: Option<&UpstreamTls>, connect_timeout: Duration) -> HttpClient {
        let builder = Client::builder(TokioExecutor::new());
        match tls {
            Some(tls) => HttpClient::Tls(tls.client(&builder, connect_timeout)),
            None => {
                let mut http = HttpConnector::new();
                http.set_nodelay(true);
                http.set_connect_timeout(Some(connect_timeout));
                HttpClient::Plain(builder.build(http))
            }
        }
    }

    pub fn request(
        &self,
        req: http::Request<Full<Bytes>>,
    ) -> hyper_util::client::legacy::ResponseFuture {
        match self {
            HttpClient::Plain(c) => c.request(req),
            HttpClient::Tls(c) => c.request(req),
        }
    }
}

/// What one attempt to send a batch gave.
pub enum Attempt<T> {
    /// Accepted, with what the endpoint said about it (e.g. how many items it refused).
    Sent(T),
    /// Worth retrying: connection error, timeout, 429, 5xx, retryable gRPC codes.
    Retry(String),
    /// Retrying cannot help.
    Rejected(String),
}

/// How a batch ended.
pub enum Delivered<T> {
    Sent(T),
    /// Refused by the endpoint: the batch is dropped.
    Rejected,
    /// Shutdown was requested and the last attempt failed: the batch is dropped.
    GaveUp,
}

/// One endpoint's delivery state, for logging transitions once instead of on every attempt.
pub struct Endpoint {
    /// What the logs call the exporter ("remote write", "OTLP export").
    what: &'static str,
    /// The endpoint as the logs and counters name it.
    label: String,
    /// The counter that counts what a refused request drops, named in the log.
    dropped_counter: &'static str,
    healthy: AtomicBool,
    rejection_logged: AtomicBool,
}

/// Resolves once shutdown is requested (never if the sender is dropped without asking).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Endpoint {
    pub fn new(what: &'static str, label: String, dropped_counter: &'static str) -> Endpoint {
        Endpoint {
            what,
            label,
            dropped_counter,
            healthy: AtomicBool::new(true),
            rejection_logged: AtomicBool::new(false),
        }
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Send one batch with `attempt(timeout)`, retrying with backoff until it is accepted or
    /// refused; once `stop` turns true, one more attempt with at most [`LAST_ATTEMPT`].
    /// `on_failure` runs after every failed attempt (the exporter's failure counter). Returns how
    /// the batch ended and whether the sender should keep going (false once shutdown was asked).
    pub async fn deliver<T, F, Fut>(
        &self,
        timeout: Duration,
        stop: &mut watch::Receiver<bool>,
        mut attempt: F,
        on_failure: impl Fn(),
    ) -> (Delivered<T>, bool)
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        let (what, label, counter) = (self.what, self.label.as_str(), self.dropped_counter);
        let mut backoff = Backoff::new(MIN_BACKOFF, MAX_BACKOFF);
        let mut last = false;
        loop {
            let limit = if last {
                timeout.min(LAST_ATTEMPT)
            } else {
                timeout
            };
            match attempt(limit).await {
                Attempt::Sent(v) => {
                    if !self.healthy.swap(true, Ordering::Relaxed) {
                        tracing::info!(endpoint = %label, "{what}: the endpoint accepts requests again");
                    }
                    return (Delivered::Sent(v), !last);
                }
                Attempt::Rejected(why) => {
                    on_failure();
                    if !self.rejection_logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!(endpoint = %label, error = %why, "{what}: request refused, its contents are dropped (logged once; see {counter})");
                    } else {
                        tracing::debug!(endpoint = %label, error = %why, "{what}: request refused");
                    }
                    return (Delivered::Rejected, !last);
                }
                Attempt::Retry(why) => {
                    on_failure();
                    if last {
                        return (Delivered::GaveUp, false);
                    }
                    if self.healthy.swap(false, Ordering::Relaxed) {
                        tracing::warn!(endpoint = %label, error = %why, "{what} failed; retrying with backoff");
                    } else {
                        tracing::debug!(endpoint = %label, error = %why, backoff = ?backoff.peek(), "{what} failed; retrying");
                    }
                    tokio::select! {
                        biased;
                        _ = stopped(stop) => last = true,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[tokio::test]
    async fn retries_with_doubling_backoff_until_sent() {
        let ep = Endpoint::new("test export", "http://x".into(), "test_dropped_total");
        let (_tx, mut rx) = watch::channel(false);
        let (tries, failures) = (AtomicU32::new(0), AtomicU32::new(0));
        let start = std::time::Instant::now();
        let (out, go_on) = ep
            .deliver(
                Duration::from_secs(1),
                &mut rx,
                |_| {
                    let n = tries.fetch_add(1, Ordering::Relaxed);
                    async move {
                        if n < 3 {
                            Attempt::Retry("503".into())
                        } else {
                            Attempt::Sent(n)
                        }
                    }
                },
                || {
                    failures.fetch_add(1, Ordering::Relaxed);
                },
            )
            .await;
        assert!(matches!(out, Delivered::Sent(3)));
        assert!(go_on);
        assert_eq!(failures.load(Ordering::Relaxed), 3);
        // 100 + 200 + 400 ms of backoff.
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(700), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[tokio::test]
    async fn a_rejection_is_final_and_shutdown_gets_one_short_attempt() {
        let ep = Endpoint::new("test export", "http://x".into(), "test_dropped_total");
        let (_tx, mut rx) = watch::channel(false);
        let (out, go_on) = ep
            .deliver(
                Duration::from_secs(1),
                &mut rx,
                |_| async { Attempt::<()>::Rejected("400".into()) },
                || {},
            )
            .await;
        assert!(matches!(out, Delivered::Rejected) && go_on);

        let (tx, mut rx) = watch::channel(false);
        let limits = std::sync::Mutex::new(Vec::new());
        let stopper = async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            tx.send(true).unwrap();
        };
        let sending = ep.deliver(
            Duration::from_secs(10),
            &mut rx,
            |limit| {
                limits.lock().unwrap().push(limit);
                async { Attempt::<()>::Retry("refused".into()) }
            },
            || {},
        );
        let ((out, go_on), ()) = tokio::join!(sending, stopper);
        assert!(matches!(out, Delivered::GaveUp) && !go_on);
        let limits = limits.into_inner().unwrap();
        assert_eq!(limits.last(), Some(&LAST_ATTEMPT), "{limits:?}");
        assert!(
            limits[..limits.len() - 1]
                .iter()
                .all(|l| *l == Duration::from_secs(10))
        );
    }
}
