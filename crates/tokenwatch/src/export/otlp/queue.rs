// The export queue: spans waiting to be sent, bounded (a full queue drops its oldest spans),
// pushed from any thread without waiting and taken in batches by the one sender task.

use super::convert::ExportSpan;
use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::sync::Notify;

pub struct SpanQueue {
    items: Mutex<VecDeque<ExportSpan>>,
    ready: Notify,
    capacity: usize,
}

impl SpanQueue {
    pub fn new(capacity: usize) -> SpanQueue {
        SpanQueue {
            items: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            capacity: capacity.max(1),
        }
    }

    /// Queue `spans`; returns how many spans were dropped (the oldest) to make room.
    pub fn push(&self, spans: Vec<ExportSpan>) -> usize {
        if spans.is_empty() {
            return 0;
        }
        let dropped = {
            let mut q = self.items.lock().unwrap_or_else(|p| p.into_inner());
            q.extend(spans);
            let over = q.len().saturating_sub(self.capacity);
            q.drain(..over);
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
    pub fn take(&self, max: usize) -> Vec<ExportSpan> {
        let mut q = self.items.lock().unwrap_or_else(|p| p.into_inner());
        let n = q.len().min(max);
        q.drain(..n).collect()
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
