// One receiver's delivery task: takes jobs from its own bounded queue and POSTs them through the
// kernel's delivery loop (retries with exponential backoff, one short last attempt at shutdown),
// so a slow or dead receiver only ever delays itself.

use super::metrics::DeliveryMetrics;
use super::payload::{self, RenderOptions};
use crate::kernel::delivery::{self, Attempt, Deliver, Delivered, HttpClient, stopped};
use bytes::Bytes;
use http_body_util::Full;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokenwatch_core::alert::Alert;
use tokio::sync::{mpsc, watch};

/// Longest wait between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub(crate) enum Kind {
    Alertmanager,
    Webhook {
        headers: Vec<(http::HeaderName, http::HeaderValue)>,
        format: super::WebhookFormat,
        /// PagerDuty's integration key (`format: pagerduty`).
        routing_key: String,
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
    /// Retry policy and state-change logging.
    pub delivery: delivery::Endpoint,
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
        // Whether what is queued at shutdown is still worth one short attempt each.
        let mut flush = true;
        loop {
            let job = tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => break,
                job = rx.recv() => match job { Some(j) => j, None => return },
            };
            self.metrics.depth(&self.name).dec();
            if !self.send(job, &mut shutdown).await {
                flush = false;
                break;
            }
        }
        // Shutdown: what is queued gets one short attempt each, until one fails; the rest is
        // counted failed.
        while let Ok(job) = rx.try_recv() {
            self.metrics.depth(&self.name).dec();
            if flush {
                flush = self.send(job, &mut shutdown).await;
            } else {
                self.metrics
                    .outcome(&self.name, "failed")
                    .inc_by(job.alerts.len() as u64);
            }
        }
    }

    /// Deliver one job: one POST of all its alerts for Alertmanager, one per alert for a
    /// webhook. False once a delivery gave up at shutdown (the rest of the job counted failed).
    async fn send(&self, job: Job, shutdown: &mut watch::Receiver<bool>) -> bool {
        let batches: Vec<Vec<Arc<Alert>>> = match self.kind {
            Kind::Alertmanager => vec![job.alerts],
            Kind::Webhook { .. } => job.alerts.into_iter().map(|a| vec![a]).collect(),
        };
        let mut batches = batches.into_iter();
        while let Some(alerts) = batches.next() {
            let n = alerts.len() as u64;
            // Pending alerts are not sent to Alertmanager: nothing to do for a batch of them.
            if !self.sends(&alerts) {
                continue;
            }
            let (outcome, go_on) = delivery::deliver(self, &alerts, self.timeout, shutdown).await;
            match outcome {
                Delivered::Sent(()) => {
                    self.metrics.outcome(&self.name, "sent").inc_by(n);
                    self.metrics
                        .latency(&self.name)
                        .observe(job.enqueued.elapsed().as_secs_f64());
                }
                Delivered::Rejected | Delivered::GaveUp => {
                    self.metrics.outcome(&self.name, "failed").inc_by(n);
                }
            }
            if !go_on {
                let rest: u64 = batches.map(|b| b.len() as u64).sum();
                self.metrics.outcome(&self.name, "failed").inc_by(rest);
                return false;
            }
        }
        true
    }

    /// Whether `alerts` make a request at all (the body itself is rendered per attempt).
    fn sends(&self, alerts: &[Arc<Alert>]) -> bool {
        match &self.kind {
            Kind::Alertmanager => alerts.iter().any(|a| payload::am_sends(a)),
            Kind::Webhook { format, .. } => alerts.iter().any(|a| format.sends(a)),
        }
    }

    /// The body for `alerts`, rendered afresh (a retried firing alert carries a fresh endsAt);
    /// None when there is nothing to send.
    fn body(&self, alerts: &[Arc<Alert>]) -> Option<Vec<u8>> {
        match &self.kind {
            Kind::Alertmanager => payload::am_body(alerts, &self.render, now_ms()),
            Kind::Webhook {
                format: super::WebhookFormat::Tokenwatch,
                ..
            } => alerts
                .first()
                .map(|a| payload::webhook_body(a, &self.render, now_ms())),
            Kind::Webhook {
                format,
                routing_key,
                ..
            } => alerts.first().filter(|a| format.sends(a)).map(|a| {
                serde_json::to_vec(&super::chat::body(*format, a, &self.render, routing_key))
                    .unwrap_or_default()
            }),
        }
    }
}

impl Deliver for Worker {
    type Batch = [Arc<Alert>];
    type Receipt = ();

    fn endpoint(&self) -> &delivery::Endpoint {
        &self.delivery
    }

    fn failed(&self) {
        self.metrics.attempt_failures(&self.name).inc();
    }

    async fn attempt(&self, alerts: &[Arc<Alert>], timeout: Duration) -> Attempt<()> {
        let Some(body) = self.body(alerts) else {
            return Attempt::Sent(());
        };
        let mut b = http::Request::builder()
            .method(http::Method::POST)
            .uri(self.endpoint.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(
                http::header::USER_AGENT,
                concat!("tokenwatch/", env!("CARGO_PKG_VERSION")),
            );
        if let Kind::Webhook { headers, .. } = &self.kind {
            for (k, v) in headers {
                b = b.header(k, v);
            }
        }
        let req = match b.body(Full::new(Bytes::from(body))) {
            Ok(r) => r,
            Err(e) => return Attempt::Rejected(format!("building the request: {e}")),
        };
        // Errors name the receiver (its log label), not the URL: webhook paths carry secrets.
        match self.client.exchange(req, timeout, 4096).await {
            Err(e) => Attempt::Retry(e),
            Ok((status, body)) => delivery::classify(status, &body),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::delivery::{RetryPolicy, conformance};
    use crate::kernel::telemetry::Metrics;
    use tokenwatch_core::alert::AlertState;

    fn worker(kind: Kind, url: &str, metrics: DeliveryMetrics) -> Worker {
        Worker {
            name: "receiver".into(),
            kind,
            endpoint: url.parse().unwrap(),
            client: HttpClient::new(None, Duration::from_secs(2)),
            render: RenderOptions {
                external_url: "http://127.0.0.1:9464".into(),
                firing_ttl_ms: 120_000,
            },
            metrics,
            timeout: Duration::from_secs(2),
            delivery: delivery::Endpoint::new("alert notification", "receiver".into(), "-")
                .with_policy(RetryPolicy {
                    min_backoff: Duration::from_millis(50),
                    max_backoff: MAX_BACKOFF,
                    max_retries: Some(2),
                }),
        }
    }

    #[tokio::test]
    async fn alertmanager_and_webhook_delivery_pass_the_deliverers_conformance_checks() {
        let batch = [Arc::new(payload::tests::alert(AlertState::Firing))];
        for kind in [
            Kind::Alertmanager,
            Kind::Webhook {
                headers: Vec::new(),
                format: super::super::WebhookFormat::Tokenwatch,
                routing_key: String::new(),
            },
        ] {
            let (url, script) = conformance::endpoint().await;
            let dm = DeliveryMetrics::register(&Metrics::new());
            let w = worker(kind, &format!("{url}/api/v2/alerts"), dm.clone());
            let failures = || dm.attempt_failures("receiver").get();
            conformance::check(&w, &script, &batch, failures).await;
        }
    }
}
