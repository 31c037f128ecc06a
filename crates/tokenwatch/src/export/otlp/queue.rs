// The export queue: spans (or, for a proxy replica's shipping, request records) waiting to be
// sent, bounded (a full queue drops its oldest), pushed from any thread without waiting and
// taken in batches by the one sender task.

use super::convert::ExportSpan;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::sync::Notify;

pub struct SpanQueue<T = ExportSpan> {
    items: Mutex<VecDeque<T>>,
    ready: Notify,
    capacity: usize,
    /// Set to the queue's length after every change, when given.
    depth: Option<Gauge>,
}

impl<T> SpanQueue<T> {
    pub fn new(capacity: usize) -> SpanQueue<T> {
        SpanQueue {
            items: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            capacity: capacity.max(1),
            depth: None,
        }
    }

    /// The same queue, publishing its length in `depth`.
    pub fn with_depth_gauge(mut self, depth: Gauge) -> SpanQueue<T> {
        self.depth = Some(depth);
        self
    }

    fn publish_depth(&self, len: usize) {
        if let Some(g) = &self.depth {
            g.set(i64::try_from(len).unwrap_or(i64::MAX));
        }
    }

    /// Queue `spans`; returns how many spans were dropped (the oldest) to make room.
    pub fn push(&self, spans: Vec<T>) -> usize {
        if spans.is_empty() {
            return 0;
        }
        let dropped = {
            let mut q = self.items.lock().unwrap_or_else(|p| p.into_inner());
            q.extend(spans);
            let over = q.len().saturating_sub(self.capacity);
            q.drain(..over);
            self.publish_depth(q.len());
            over
        };
        self.ready.notify_one();
        dropped
    }

    pub fn len(&self) -> usize {
        self.items.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The oldest `max` spans (fewer when fewer wait).
    pub fn take(&self, max: usize) -> Vec<T> {
        let mut q = self.items.lock().unwrap_or_else(|p| p.into_inner());
        let n = q.len().min(max);
        let taken = q.drain(..n).collect();
        self.publish_depth(q.len());
        taken
    }

    /// Resolves once a push happened after the call (or one was pending unconsumed).
    pub async fn pushed(&self) {
        self.ready.notified().await
    }

    /// Resolves once the queue holds at least one span (one consumer).
    pub async fn non_empty(&self) {
        loop {
            let notified = self.ready.notified();
            if !self.is_empty() {
                return;
            }
            notified.await;
        }
    }
}
