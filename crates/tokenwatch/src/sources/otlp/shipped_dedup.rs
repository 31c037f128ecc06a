// Shipped records received twice: a proxy replica (`role: proxy`) sends a batch again when its
// answer was lost (the aggregator stalled past the replica's timeout, or the connection was
// cut), and the aggregator may have taken the first copy. This remembers the (trace id, span
// id) of the last `otlp.shipped_dedup_capacity` shipped spans received and drops a span seen
// again, so each record is counted once. First tokens shipped ahead of their records
// (`kernel::shipped_first_token`) are remembered alike, and a shipped record also marks its
// request's first token as received: a first token arriving again, or after its record (a
// Collector in between may reorder batches), is dropped — it is no longer early, and the record
// carries its time. Spans that are neither pass untouched.

use crate::kernel::{shipped_first_token, shipped_record};
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

impl Seen {
    /// `key`, just inserted into `keys`: kept in order (the oldest forgotten beyond
    /// `capacity`) and noted in `claimed`.
    fn remember(&mut self, key: SpanKey, claimed: &mut Vec<SpanKey>, capacity: usize) {
        self.order.push_back(key);
        claimed.push(key);
        if self.order.len() > capacity
            && let Some(old) = self.order.pop_front()
        {
            self.keys.remove(&old);
        }
    }
}

/// The request id a shipped record's span carries.
fn request_id(span: &Span) -> Option<&str> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    span.attributes
        .iter()
        .find(|kv| kv.key == shipped_record::REQUEST_ID_ATTR)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) if !s.is_empty() => Some(s.as_str()),
            _ => None,
        })
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
                    let record = shipped_record::is_shipped(&span.attributes);
                    let first = !record && shipped_first_token::is_first_token(&span.attributes);
                    let Some(key) = key_of(span).filter(|_| record || first) else {
                        return true;
                    };
                    if !seen.keys.insert(key) {
                        claimed.duplicates += 1;
                        return false;
                    }
                    seen.remember(key, &mut claimed.keys, self.capacity);
                    // The record's first token, should it come later, is not early any more.
                    if record && let Some(id) = request_id(span) {
                        let (trace, span_id) = shipped_first_token::ids(id);
                        let mut k = [0u8; 24];
                        k[..16].copy_from_slice(&trace);
                        k[16..].copy_from_slice(&span_id);
                        if seen.keys.insert(k) {
                            seen.remember(k, &mut claimed.keys, self.capacity);
                        }
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

    #[test]
    fn a_first_token_again_or_after_its_record_is_dropped() {
        use tokenwatch_core::model::FirstToken;
        let d = ShippedDedup::new(100);
        let first = |id: &str| {
            shipped_first_token::span(&FirstToken {
                request_id: id.into(),
                model_id: "m".into(),
                arrival_unix_ms: 1,
                ..Default::default()
            })
            .unwrap()
        };
        let record = |id: &str, n: u8| {
            let mut s = span(n, true);
            s.attributes.push(KeyValue {
                key: shipped_record::REQUEST_ID_ATTR.into(),
                value: Some(AnyValue {
                    value: Some(Value::StringValue(id.into())),
                }),
                ..Default::default()
            });
            s
        };
        // In order: the first token, then its record — both kept.
        let mut r = request(vec![first("a"), record("a", 1)]);
        let c = d.claim(&mut r);
        assert_eq!(c.duplicates, 0);
        c.commit();
        assert_eq!(r.resource_spans[0].scope_spans[0].spans.len(), 2);
        // Sent again: dropped. After its record (b's record came first): dropped.
        let mut again = request(vec![first("a"), record("b", 2)]);
        let c = d.claim(&mut again);
        assert_eq!(c.duplicates, 1);
        c.commit();
        let mut late = request(vec![first("b"), first("c")]);
        let c = d.claim(&mut late);
        assert_eq!(c.duplicates, 1);
        c.commit();
        let kept = &late.resource_spans[0].scope_spans[0].spans;
        assert_eq!(kept.len(), 1);
        assert_eq!(shipped_first_token::read(&kept[0]).unwrap().request_id, "c");
    }
}
