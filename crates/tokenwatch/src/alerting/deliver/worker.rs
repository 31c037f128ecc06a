// One receiver's delivery task: takes jobs from its own bounded queue and POSTs them, retrying
// with exponential backoff, so a slow or dead receiver only ever delays itself.

use super::metrics::DeliveryMetrics;
use super::payload::{self, RenderOptions};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokenwatch_core::alert::Alert;
use tokenwatch_core::backoff::Backoff;
use tokio::sync::{mpsc, watch};

pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Longest wait between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub(crate) enum Kind {
    Alertmanager,
    Webhook {
        headers: Vec<(http::HeaderName, http::HeaderValue)>,
    },
}

/// Alerts to deliver together (one POST for Alertmanager, one POST per alert for a webhook).
pub(crate) struct Job {
    pub alerts: Vec<Arc<Alert>>,
    pub enqueued: Instant,
}

pub(crate) struct Worker {
    pub name: String,
    pub kind: Kind,
    /// Full endpoint, e.g. `http://am:9093/api/v2/alerts`.
    pub endpoint: http::Uri,
    pub client: HttpClient,
    pub render: RenderOptions,
    pub metrics: DeliveryMetrics,
    pub timeout: Duration,
    pub max_retries: u32,
    pub initial_backoff: Duration,
}

enum Attempt {
    Sent,
    /// Worth retrying: connection error, timeout, 429 or 5xx.
    Retry(String),
    /// Retrying cannot help (4xx other than 429).
    Fatal(String),
}

/// Resolves once shutdown is requested; never when the sender is gone without asking.
pub(crate) async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Worker {
    pub(crate) async fn run(
        self,
        mut rx: mpsc::Receiver<Job>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let job = tokio::select! {
                job = rx.recv() => match job { Some(j) => j, None => return },
                _ = shutdown_requested(&mut shutdown) => return,
            };
            self.metrics.depth(&self.name).dec();
            match &self.kind {
                Kind::Alertmanager => {
                    // Rendered per attempt inside `deliver`, so a retried firing alert carries a fresh endsAt.
                    let alerts = job.alerts.clone();
                    let n = alerts.len() as u64;
                    self.deliver(n, job.enqueued, &mut shutdown, move |r| {
                        payload::am_body(&alerts, r, now_ms())
                    })
                    .await;
                }
                Kind::Webhook { .. } => {
                    for alert in job.alerts {
                        self.deliver(1, job.enqueued, &mut shutdown, move |_| {
                            Some(payload::webhook_body(&alert, now_ms()))
                        })
                        .await;
                    }
                }
            }
        }
    }

    /// Send one body (rendered afresh before each attempt), retrying with backoff; counts the
    /// outcome for `n` alerts. Returns early (counted as failed) when shutdown is requested.
    async fn deliver(
        &self,
        n: u64,
        enqueued: Instant,
        shutdown: &mut watch::Receiver<bool>,
        render: impl Fn(&RenderOptions) -> Option<Vec<u8>>,
    ) {
        let mut backoff = Backoff::new(self.initial_backoff, MAX_BACKOFF);
        let mut attempt = 0u32;
        loop {
            let Some(body) = render(&self.render) else {
                return;
            };
            let outcome = tokio::select! {
                a = self.attempt(body) => a,
                _ = shutdown_requested(shutdown) => {
                    self.metrics.outcome(&self.name, "failed").inc_by(n);
                    return;
                }
            };
            match outcome {
                Attempt::Sent => {
                    self.metrics.outcome(&self.name, "sent").inc_by(n);
                    self.metrics
                        .latency(&self.name)
                        .observe(enqueued.elapsed().as_secs_f64());
                    return;
                }
                Attempt::Fatal(why) => {
                    tracing::warn!(receiver = %self.name, error = %why, "alert notification refused; not retrying");
                    self.metrics.outcome(&self.name, "failed").inc_by(n);
                    return;
                }
                Attempt::Retry(why) if attempt < self.max_retries => {
                    tracing::debug!(receiver = %self.name, error = %why, attempt, "alert notification failed; retrying");
                    attempt += 1;
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                        _ = shutdown_requested(shutdown) => {
                            self.metrics.outcome(&self.name, "failed").inc_by(n);
                            return;
                        }
                    }
                }
                Attempt::Retry(why) => {
                    tracing::warn!(receiver = %self.name, error = %why, attempts = attempt + 1, "alert notification failed; giving up");
                    self.metrics.outcome(&self.name, "failed").inc_by(n);
                    return;
                }
            }
        }
    }

    async fn attempt(&self, body: Vec<u8>) -> Attempt {
        let mut b = http::Request::builder()
            .method(http::Method::POST)
            .uri(self.endpoint.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(
                http::header::USER_AGENT,
                concat!("tokenwatch/", env!("CARGO_PKG_VERSION")),
            );
        if let Kind::Webhook { headers } = &self.kind {
            for (k, v) in headers {
                b = b.header(k, v);
            }
        }
        let req = match b.body(Full::new(Bytes::from(body))) {
            Ok(r) => r,
            Err(e) => return Attempt::Fatal(format!("building the request: {e}")),
        };
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| format!("{e}"))?;
            let status = resp.status();
            // Read (a bounded part of) the body so the connection can be reused and errors named.
            let text = match http_body_util::Limited::new(resp.into_body(), 4096)
                .collect()
                .await
            {
                Ok(c) => String::from_utf8_lossy(&c.to_bytes()).trim().to_string(),
                Err(_) => String::new(),
            };
            Ok::<_, String>((status, text))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => Attempt::Retry(format!(
                "no answer from {} within {:?}",
                self.endpoint, self.timeout
            )),
            Ok(Err(e)) => Attempt::Retry(format!("{}: {e}", self.endpoint)),
            Ok(Ok((status, _))) if status.is_success() => Attempt::Sent,
            Ok(Ok((status, text))) => {
                let why = format!("{} answered {status}: {text}", self.endpoint);
                if status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS {
                    Attempt::Retry(why)
                } else {
                    Attempt::Fatal(why)
                }
            }
        }
    }
}
