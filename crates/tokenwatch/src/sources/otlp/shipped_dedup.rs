// Shipped records received twice: a proxy replica (`role: proxy`) sends a batch again when its
// answer was lost (the aggregator stalled past the replica's timeout, or the connection was
// cut), and the aggregator may have taken the first copy. This remembers the (trace id, span
// id) of the last `otlp.shipped_dedup_capacity` shipped spans received and drops a span seen
// again, so each record is counted once. Spans that are not shipped records pass untouched.

use crate::kernel::shipped_record;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

/// A shipped span's identity: its trace id then its span id.
type SpanKey = [u8; 24];

fn key_of(span: &Span) -> Option<SpanKey> {
    if span.trace_id.len() != 16 || span.span_id.len() != 8 {
        return None;
    }
    let mut k = [0u8; 24];
    k[..16].copy_from_slice(&span.trace_id);
    k[16..].copy_from_slice(&span.span_id);
    Some(k)
}

#[derive(Default)]
struct Seen {
    keys: HashSet<SpanKey>,
    /// Oldest first, for eviction at capacity.
    order: VecDeque<SpanKey>,
}

/// The shipped spans received lately (bounded; the oldest forgotten first).
pub struct ShippedDedup {
    seen: Mutex<Seen>,
    capacity: usize,
}

/// What `claim` took. Unless `commit`ted — the export was accepted — its keys are forgotten
/// again when it is dropped: a refused export, or one cancelled half-way (its client hung up
/// before the answer), must be let in when it is sent again.
pub struct Claimed<'a> {
    dedup: &'a ShippedDedup,
    keys: Vec<SpanKey>,
    /// Shipped spans dropped as already received.
    pub duplicates: u64,
    committed: bool,
}

impl Claimed<'_> {
    /// The export was accepted: its records stay remembered.
    pub fn commit(mut self) {
        self.committed = true;
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.dedup.release(&self.keys);
        }
    }
}

impl ShippedDedup {
    pub fn new(capacity: usize) -> ShippedDedup {
        ShippedDedup {
            seen: Mutex::new(Seen::default()),
            capacity,
        }
    }

    /// Drop from `req` the shipped spans received before (or twice in `req`) and remember the
    /// others. With capacity 0 nothing is remembered or dropped.
    pub fn claim(&self, req: &mut ExportTraceServiceRequest) -> Claimed<'_> {
        let mut claimed = Claimed {
            dedup: self,
            keys: Vec::new(),
            duplicates: 0,
            committed: false,
        };
        if self.capacity == 0 {
            return claimed;
        }
        let mut guard = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let seen = &mut *guard;
        for rs in &mut req.resource_spans {
            for ss in &mut rs.scope_spans {
                ss.spans.retain(|span| {
                    let Some(key) =
                        key_of(span).filter(|_| shipped_record::is_shipped(&span.attributes))
                    else {
                        return true;
                    };
                    if !seen.keys.insert(key) {
                        claimed.duplicates += 1;
                        return false;
                    }
                    seen.order.push_back(key);
                    claimed.keys.push(key);
                    if seen.order.len() > self.capacity
                        && let Some(old) = seen.order.pop_front()
                    {
                        seen.keys.remove(&old);
                    }
                    true
                });
            }
        }
        claimed
    }

    /// Forget `keys` (an export not accepted).
    fn release(&self, keys: &[SpanKey]) {
        if keys.is_empty() {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            seen.keys.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    fn span(id: u8, shipped: bool) -> Span {
        let attributes = if shipped {
            vec![KeyValue {
                key: shipped_record::SCHEMA_ATTR.into(),
                value: Some(AnyValue {
                    value: Some(Value::IntValue(shipped_record::SCHEMA)),
                }),
                ..Default::default()
            }]
        } else {
            Vec::new()
        };
        Span {
            trace_id: vec![7; 16],
            span_id: vec![id; 8],
            attributes,
            ..Default::default()
        }
    }

    fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn ids(req: &ExportTraceServiceRequest) -> Vec<u8> {
        req.resource_spans[0].scope_spans[0]
            .spans
            .iter()
            .map(|s| s.span_id[0])
            .collect()
    }

    #[test]
    fn a_shipped_span_received_again_is_dropped_others_pass() {
        let d = ShippedDedup::new(3);
        let mut first = request(vec![span(1, true), span(2, true), span(9, false)]);
        let claimed = d.claim(&mut first);
        assert_eq!(claimed.duplicates, 0);
        claimed.commit();
        let mut again = request(vec![
            span(1, true),
            span(2, true),
            span(3, true),
            span(3, true),
            span(9, false),
            span(9, false),
        ]);
        let claimed = d.claim(&mut again);
        assert_eq!(claimed.duplicates, 3);
        claimed.commit();
        assert_eq!(ids(&again), vec![3, 9, 9], "plain spans are never dropped");
        // Capacity 3: 1 is forgotten once 4 is remembered.
        let mut more = request(vec![span(4, true), span(1, true)]);
        assert_eq!(d.claim(&mut more).duplicates, 0);
    }

    #[test]
    fn an_export_not_accepted_is_let_in_when_retried() {
        let d = ShippedDedup::new(100);
        let mut r = request(vec![span(1, true)]);
        // Refused, or cancelled half-way: dropped without a commit.
        drop(d.claim(&mut r));
        let mut retry = request(vec![span(1, true)]);
        let claimed = d.claim(&mut retry);
        assert_eq!(claimed.duplicates, 0);
        claimed.commit();
        assert_eq!(ids(&retry), vec![1]);
        let mut late = request(vec![span(1, true)]);
        assert_eq!(d.claim(&mut late).duplicates, 1);
    }
}
