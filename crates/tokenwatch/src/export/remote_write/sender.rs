// Delivery to one remote-write endpoint: the snapshot ticker, a bounded queue per shard that
// drops its oldest request when full, and per-shard senders retrying with exponential backoff.

use super::convert;
use super::proto::Label;
pub use crate::kernel::delivery::HttpClient;
use crate::kernel::delivery::{self, Attempt, Deliver, Delivered, stopped};
use crate::kernel::telemetry::Metrics;
use bytes::Bytes;
use http_body_util::Full;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

pub use crate::kernel::delivery::{MAX_BACKOFF, MIN_BACKOFF};

/// Why samples were dropped (`reason` of `tokenwatch_remote_write_dropped_total`).
pub const DROP_REASONS: [&str; 3] = ["queue_full", "rejected", "shutdown"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UrlLabels {
    url: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    url: String,
    reason: String,
}

/// `tokenwatch_remote_write_*` in `/metrics` (and so in what is remote-written).
#[derive(Clone)]
pub struct RemoteWriteMetrics {
    samples: Family<UrlLabels, Counter>,
    failures: Family<UrlLabels, Counter>,
    dropped: Family<DropLabels, Counter>,
}

impl RemoteWriteMetrics {
    /// Register the families (once per registry; the encoder adds `_total`).
    pub fn register(metrics: &Metrics) -> RemoteWriteMetrics {
        let m = RemoteWriteMetrics {
            samples: Family::default(),
            failures: Family::default(),
            dropped: Family::default(),
        };
        metrics.register(
            "tokenwatch_remote_write_samples",
            "Samples a remote-write endpoint accepted",
            m.samples.clone(),
        );
        metrics.register(
            "tokenwatch_remote_write_failures",
            "Remote-write requests that failed (each attempt: connection errors, timeouts, 429, 5xx, other 4xx)",
            m.failures.clone(),
        );
        metrics.register(
            "tokenwatch_remote_write_dropped",
            "Samples given up: the oldest request of a full queue (queue_full), refused with a 4xx other than 429 (rejected), or queued at shutdown (shutdown)",
            m.dropped.clone(),
        );
        m
    }

    /// Make an endpoint's series visible (at zero) before anything happens to it.
    fn init(&self, url: &str) {
        self.samples(url);
        self.failures(url);
        for reason in DROP_REASONS {
            self.dropped(url, reason);
        }
    }

    fn samples(&self, url: &str) -> Counter {
        self.samples
            .get_or_create(&UrlLabels { url: url.into() })
            .clone()
    }

    fn failures(&self, url: &str) -> Counter {
        self.failures
            .get_or_create(&UrlLabels { url: url.into() })
            .clone()
    }

    fn dropped(&self, url: &str, reason: &str) -> Counter {
        self.dropped
            .get_or_create(&DropLabels {
                url: url.into(),
                reason: reason.into(),
            })
            .clone()
    }
}

/// One compressed request waiting to be sent.
#[derive(Debug, Clone)]
pub struct Batch {
    pub body: Bytes,
    pub samples: u64,
}

/// A shard's bounded queue: `push` on a full queue drops the oldest request.
pub struct ShardQueue {
    items: std::sync::Mutex<VecDeque<Batch>>,
    ready: Notify,
    capacity: usize,
}

impl ShardQueue {
    pub fn new(capacity: usize) -> ShardQueue {
        ShardQueue {
            items: std::sync::Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            capacity: capacity.max(1),
        }
    }

    /// Queue `batch`; returns the request dropped to make room, if any.
    pub fn push(&self, batch: Batch) -> Option<Batch> {
        let dropped = {
            let mut q = self.items.lock().unwrap_or_else(|p| p.into_inner());
            let dropped = if q.len() >= self.capacity {
                q.pop_front()
            } else {
                None
            };
            q.push_back(batch);
            dropped
        };
        self.ready.notify_one();
        dropped
    }

    /// The oldest request, waiting for one if the queue is empty (one consumer per queue).
    pub async fn pop(&self) -> Batch {
        loop {
            let notified = self.ready.notified();
            if let Some(b) = self
                .items
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front()
            {
                return b;
            }
            notified.await;
        }
    }

    /// Take everything still queued.
    pub fn drain(&self) -> Vec<Batch> {
        self.items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect()
    }
}

/// One endpoint, ready to send: URL, every header of a request, client and counters.
pub struct Endpoint {
    /// The `url` label of the counters: the URL without its query string.
    pub label: String,
    pub uri: http::Uri,
    pub headers: http::HeaderMap,
    pub client: HttpClient,
    pub timeout: Duration,
    pub metrics: RemoteWriteMetrics,
    /// Backoff and state-change logging (shared with the OTLP exporter).
    delivery: delivery::Endpoint,
}

impl Endpoint {
    pub fn new(
        label: String,
        uri: http::Uri,
        headers: http::HeaderMap,
        client: HttpClient,
        timeout: Duration,
        metrics: RemoteWriteMetrics,
    ) -> Endpoint {
        metrics.init(&label);
        Endpoint {
            delivery: delivery::Endpoint::new(
                "remote write",
                label.clone(),
                "tokenwatch_remote_write_dropped_total",
            ),
            label,
            uri,
            headers,
            client,
            timeout,
            metrics,
        }
    }

    fn drop_samples(&self, reason: &str, samples: u64) {
        if samples > 0 {
            self.metrics.dropped(&self.label, reason).inc_by(samples);
        }
    }

    /// Queue `batch` on `queue`, counting the request it pushes out of a full queue.
    pub fn enqueue(&self, queue: &ShardQueue, batch: Batch) {
        if let Some(old) = queue.push(batch) {
            self.drop_samples("queue_full", old.samples);
        }
    }

    /// Every `interval`: take what `/metrics` serves, convert it and queue it on the shards.
    pub async fn run_snapshots(
        self: Arc<Self>,
        metrics: Arc<Metrics>,
        interval: Duration,
        external: Vec<Label>,
        max_samples: usize,
        shards: Vec<Arc<ShardQueue>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => return,
                _ = tick.tick() => {}
            }
            let now = chrono::Utc::now().timestamp_millis();
            let series = match convert::series_from_exposition(&metrics.encode(), now, &external) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(url = %self.label, error = %e, "remote write: the /metrics text did not parse; snapshot skipped");
                    continue;
                }
            };
            for (shard, requests) in convert::split(series, shards.len(), max_samples)
                .into_iter()
                .enumerate()
            {
                for req in requests {
                    let samples = req.sample_count() as u64;
                    match req.to_body() {
                        Ok(body) => self.enqueue(
                            &shards[shard],
                            Batch {
                                body: body.into(),
                                samples,
                            },
                        ),
                        Err(e) => {
                            tracing::error!(url = %self.label, error = %e, "remote write: snappy compression failed")
                        }
                    }
                }
            }
        }
    }

    /// One shard's sender: its requests in order, each until sent or given up. At shutdown the
    /// request in hand gets one last attempt; what is still queued is dropped and counted.
    pub async fn run_shard(
        self: Arc<Self>,
        queue: Arc<ShardQueue>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let batch = tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                b = queue.pop() => b,
            };
            if !self.deliver(&batch, &mut stop).await {
                break;
            }
        }
        let left: u64 = queue.drain().iter().map(|b| b.samples).sum();
        self.drop_samples("shutdown", left);
    }

    /// Send `batch`, retrying with backoff; false once shutdown was requested.
    async fn deliver(&self, batch: &Batch, stop: &mut watch::Receiver<bool>) -> bool {
        let (delivered, go_on) = delivery::deliver(self, batch, self.timeout, stop).await;
        match delivered {
            Delivered::Sent(()) => {
                self.metrics.samples(&self.label).inc_by(batch.samples);
            }
            Delivered::Rejected => self.drop_samples("rejected", batch.samples),
            Delivered::GaveUp => self.drop_samples("shutdown", batch.samples),
        }
        go_on
    }
}

impl Deliver for Endpoint {
    type Batch = Batch;
    type Receipt = ();

    fn endpoint(&self) -> &delivery::Endpoint {
        &self.delivery
    }

    async fn attempt(&self, batch: &Batch, timeout: Duration) -> Attempt<()> {
        let mut req = http::Request::new(Full::new(batch.body.clone()));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        match self.client.exchange(req, timeout, 4096).await {
            Err(e) => Attempt::Retry(e),
            Ok((status, body)) => delivery::classify(status, &body),
        }
    }

    fn failed(&self) {
        self.metrics.failures(&self.label).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::delivery::conformance;

    #[tokio::test]
    async fn remote_write_passes_the_deliverers_conformance_checks() {
        let (url, script) = conformance::endpoint().await;
        let metrics = RemoteWriteMetrics::register(&Metrics::new());
        let label = format!("{url}/api/v1/write");
        let ep = Endpoint::new(
            label.clone(),
            label.parse().unwrap(),
            http::HeaderMap::new(),
            HttpClient::new(None, Duration::from_secs(2)),
            Duration::from_secs(2),
            metrics.clone(),
        );
        let batch = Batch {
            body: Bytes::from_static(b"snappy"),
            samples: 3,
        };
        conformance::check(&ep, &script, &batch, || metrics.failures(&label).get()).await;
    }
}
