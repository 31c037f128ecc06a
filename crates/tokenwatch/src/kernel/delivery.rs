// The one delivery loop every deliverer sends through (Alertmanager, webhooks, OTLP export,
// remote write): a deliverer says how to make one attempt ([`Deliver`]); the loop retries what is
// worth retrying with exponential backoff ([`RetryPolicy`]), gives up on refusals, logs an
// endpoint's state changes once, and makes one short last attempt once shutdown is asked. Also
// the outbound HTTP client (plain or TLS) and one bounded HTTP exchange they share.

use crate::kernel::tls::{HttpsClient, UpstreamTls};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
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

/// How a deliverer retries: backoff from `min_backoff`, doubling up to `max_backoff`, at most
/// `max_retries` retries after the first attempt (None: until sent, refused or shut down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    pub max_retries: Option<u32>,
}

impl Default for RetryPolicy {
    /// The exporters' policy: 100 ms doubling to 30 s, retried until sent or shut down.
    fn default() -> Self {
        RetryPolicy {
            min_backoff: MIN_BACKOFF,
            max_backoff: MAX_BACKOFF,
            max_retries: None,
        }
    }
}

/// An outbound HTTP client: plain, or HTTPS with rustls as for https upstreams.
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

    /// Send `req` and read at most `body_limit` bytes of the answer (so the connection can be
    /// reused and an error named), all within `timeout`. A transport error or a timeout is worth
    /// retrying and comes back as its text.
    pub async fn exchange(
        &self,
        req: http::Request<Full<Bytes>>,
        timeout: Duration,
        body_limit: usize,
    ) -> Result<(http::StatusCode, Bytes), String> {
        let exchange = async {
            let resp = self.request(req).await.map_err(|e| error_chain(&e))?;
            let status = resp.status();
            let body = match http_body_util::Limited::new(resp.into_body(), body_limit)
                .collect()
                .await
            {
                Ok(c) => c.to_bytes(),
                Err(_) => Bytes::new(),
            };
            Ok::<_, String>((status, body))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Err(format!("no answer within {timeout:?}")),
            Ok(r) => r,
        }
    }
}

/// What an HTTP answer means for delivery: 2xx sent; 429 and 5xx worth retrying; any other
/// answer refused. `body` (trimmed) names the refusal.
pub fn classify(status: http::StatusCode, body: &[u8]) -> Attempt<()> {
    if status.is_success() {
        return Attempt::Sent(());
    }
    let why = format!(
        "answered {status}: {}",
        String::from_utf8_lossy(body).trim()
    );
    if status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS {
        Attempt::Retry(why)
    } else {
        Attempt::Rejected(why)
    }
}

/// An error with its causes (hyper's own message alone is "client error (Connect)").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
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
#[derive(Debug, PartialEq, Eq)]
pub enum Delivered<T> {
    Sent(T),
    /// Refused by the endpoint: the batch is dropped.
    Rejected,
    /// The retries ran out, or shutdown was requested and the last attempt failed: the batch is
    /// dropped.
    GaveUp,
}

/// A deliverer: one kind of batch sent to one endpoint. The loop ([`deliver`]) is the same for
/// every deliverer; what differs is how one attempt is made and what its failures count.
pub trait Deliver {
    type Batch: ?Sized;
    /// What the endpoint said about an accepted batch.
    type Receipt;
    /// The endpoint's delivery state (its retry policy and state-change logging).
    fn endpoint(&self) -> &Endpoint;
    /// One attempt to send `batch`, within `timeout`.
    fn attempt(
        &self,
        batch: &Self::Batch,
        timeout: Duration,
    ) -> impl Future<Output = Attempt<Self::Receipt>>;
    /// Runs after every failed attempt (the deliverer's failure counter).
    fn failed(&self) {}
}

/// Send `batch` through `d` with attempts of at most `timeout` each, retrying by its endpoint's
/// policy: how the batch ended, and whether the sender should keep going (false once shutdown
/// was asked).
pub async fn deliver<D: Deliver>(
    d: &D,
    batch: &D::Batch,
    timeout: Duration,
    stop: &mut watch::Receiver<bool>,
) -> (Delivered<D::Receipt>, bool) {
    d.endpoint()
        .deliver(
            timeout,
            stop,
            |limit| d.attempt(batch, limit),
            || d.failed(),
        )
        .await
}

/// One endpoint's delivery state, for logging transitions once instead of on every attempt.
pub struct Endpoint {
    /// What the logs call the deliverer ("remote write", "OTLP export", "alert notification").
    what: &'static str,
    /// The endpoint as the logs and counters name it.
    label: String,
    /// The counter that counts what a refused request drops, named in the log.
    dropped_counter: &'static str,
    policy: RetryPolicy,
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
            policy: RetryPolicy::default(),
            healthy: AtomicBool::new(true),
            rejection_logged: AtomicBool::new(false),
        }
    }

    /// The same endpoint retrying by `policy`.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Endpoint {
        self.policy = policy;
        self
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// What the logs call the deliverer.
    pub fn what(&self) -> &'static str {
        self.what
    }

    pub fn policy(&self) -> RetryPolicy {
        self.policy
    }

    /// Send one batch with `attempt(timeout)`, retrying with backoff until it is accepted,
    /// refused or out of retries; once `stop` turns true, one more attempt with at most
    /// [`LAST_ATTEMPT`] (an attempt in flight then is that last one, given that much longer). `on_failure` runs after every failed attempt (the deliverer's failure
    /// counter). Returns how the batch ended and whether the sender should keep going (false
    /// once shutdown was asked).
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
        let mut backoff = Backoff::new(self.policy.min_backoff, self.policy.max_backoff);
        let mut last = *stop.borrow();
        let mut retries = 0u32;
        loop {
            let limit = if last {
                timeout.min(LAST_ATTEMPT)
            } else {
                timeout
            };
            let mut pending = std::pin::pin!(attempt(limit));
            let outcome = if last {
                pending.await
            } else {
                // Shutdown asked while an attempt is in flight: it gets at most LAST_ATTEMPT
                // more and is the last (not cut and sent again: the endpoint may have it).
                tokio::select! {
                    biased;
                    a = &mut pending => a,
                    _ = stopped(stop) => {
                        last = true;
                        tokio::time::timeout(LAST_ATTEMPT, &mut pending)
                            .await
                            .unwrap_or_else(|_| Attempt::Retry(format!("no answer {LAST_ATTEMPT:?} after shutdown was asked")))
                    }
                }
            };
            match outcome {
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
                    if self.policy.max_retries.is_some_and(|max| retries >= max) {
                        tracing::warn!(endpoint = %label, error = %why, attempts = retries + 1, "{what} failed; giving up (see {counter})");
                        return (Delivered::GaveUp, true);
                    }
                    retries += 1;
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

/// What every deliverer must do, checked against a scripted HTTP endpoint (each deliverer's tests
/// call [`conformance::check`]): retry 5xx with its backoff, doubling, within its bounds; not
/// retry a refusal; retry an attempt that timed out; stop after its retries; at shutdown give an
/// attempt in flight one short last chance and never send it again; count every failed attempt.
#[cfg(test)]
pub(crate) mod conformance {
    use super::*;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    /// How the scripted endpoint answers one request.
    #[derive(Debug, Clone, Copy)]
    pub(crate) enum Answer {
        Status(u16),
        /// Never answers.
        Silent,
    }

    /// The endpoint's script (answers in order; 200 once it runs out) and the requests' times.
    #[derive(Default)]
    pub(crate) struct Script {
        answers: Mutex<VecDeque<Answer>>,
        requests: Mutex<Vec<Instant>>,
    }

    impl Script {
        fn set(&self, answers: &[Answer]) {
            *self.answers.lock().unwrap() = answers.iter().copied().collect();
            self.requests.lock().unwrap().clear();
        }

        fn requests(&self) -> Vec<Instant> {
            self.requests.lock().unwrap().clone()
        }
    }

    /// A scripted HTTP/1.1 endpoint on 127.0.0.1 answering any path: its base URL.
    pub(crate) async fn endpoint() -> (String, Arc<Script>) {
        let script = Arc::new(Script::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = script.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                let script = shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let script = script.clone();
                        async move {
                            let _ = req.into_body().collect().await;
                            script.requests.lock().unwrap().push(Instant::now());
                            let answer = script.answers.lock().unwrap().pop_front();
                            let status = match answer.unwrap_or(Answer::Status(200)) {
                                Answer::Status(s) => s,
                                Answer::Silent => std::future::pending::<u16>().await,
                            };
                            let mut resp = http::Response::new(Full::new(Bytes::new()));
                            *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        (format!("http://{addr}"), script)
    }

    fn gaps(times: &[Instant]) -> Vec<Duration> {
        times.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// Checks `d` (which sends to the `script`ed endpoint) with `batch`; `failures` reads the
    /// deliverer's own count of failed attempts.
    pub(crate) async fn check<D: Deliver>(
        d: &D,
        script: &Script,
        batch: &D::Batch,
        failures: impl Fn() -> u64,
    ) {
        let policy = d.endpoint().policy();
        let slack = Duration::from_millis(400);
        let (_keep, mut stop) = watch::channel(false);
        let second = Duration::from_secs(2);

        // 5xx is retried after the policy's backoff, doubling, then sent.
        script.set(&[
            Answer::Status(503),
            Answer::Status(503),
            Answer::Status(200),
        ]);
        let before = failures();
        let (out, go_on) = deliver(d, batch, second, &mut stop).await;
        assert!(matches!(out, Delivered::Sent(_)) && go_on, "503, 503, 200");
        let times = script.requests();
        assert_eq!(times.len(), 3, "503, 503, 200: three attempts");
        assert_eq!(failures() - before, 2, "each failed attempt counted");
        let g = gaps(&times);
        let first = policy.min_backoff.min(policy.max_backoff);
        let then = (first * 2).min(policy.max_backoff);
        assert!(
            g[0] >= first && g[0] <= first + slack,
            "first backoff {:?}, policy {policy:?}",
            g[0]
        );
        assert!(
            g[1] >= then && g[1] <= then + slack,
            "second backoff {:?}, policy {policy:?}",
            g[1]
        );

        // A refusal is not retried.
        script.set(&[Answer::Status(400)]);
        let before = failures();
        let (out, go_on) = deliver(d, batch, second, &mut stop).await;
        assert!(
            matches!(out, Delivered::Rejected) && go_on,
            "400 is a refusal"
        );
        assert_eq!(script.requests().len(), 1, "a refusal is not retried");
        assert_eq!(failures() - before, 1);

        // An attempt that times out is retried.
        script.set(&[Answer::Silent, Answer::Status(200)]);
        let (out, _) = deliver(d, batch, Duration::from_millis(300), &mut stop).await;
        assert!(matches!(out, Delivered::Sent(_)), "a timeout is retried");
        assert_eq!(script.requests().len(), 2);

        // The retries run out.
        if let Some(max) = policy.max_retries {
            script.set(&vec![Answer::Status(503); max as usize + 1]);
            let (out, go_on) = deliver(d, batch, second, &mut stop).await;
            assert!(matches!(out, Delivered::GaveUp) && go_on, "out of retries");
            assert_eq!(script.requests().len(), max as usize + 1);
        }

        // Shutdown during an attempt that hangs: one short last chance, never sent twice.
        script.set(&[Answer::Silent, Answer::Silent, Answer::Silent]);
        let (stop_tx, mut stop) = watch::channel(false);
        let started = Instant::now();
        let stopper = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            stop_tx.send(true).unwrap();
        };
        let ((out, go_on), ()) = tokio::join!(
            deliver(d, batch, Duration::from_secs(30), &mut stop),
            stopper
        );
        assert!(
            matches!(out, Delivered::GaveUp) && !go_on,
            "given up at shutdown"
        );
        let took = started.elapsed();
        assert!(
            took <= Duration::from_millis(200) + LAST_ATTEMPT + slack,
            "shutdown took {took:?}"
        );
        assert_eq!(
            script.requests().len(),
            1,
            "the hanging attempt is not sent again"
        );

        // Once shutdown is asked, a batch gets one short attempt.
        script.set(&[Answer::Status(503)]);
        let (out, go_on) = deliver(d, batch, Duration::from_secs(30), &mut stop).await;
        assert!(matches!(out, Delivered::GaveUp) && !go_on);
        assert_eq!(script.requests().len(), 1, "one attempt after shutdown");
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
