// When the response headers of a GenAI call came back, from the HTTP client span under its span.
//
// OpenLIT starts the clock of its `gen_ai.server.time_to_first_token` when its stream wrapper is
// made: after the OpenAI client sent the request and got the response's headers back, so its time
// to first token is short by that wait (the time to headers, up to the whole prefill where a
// server sends its headers with the first token). Its span starts before the request, and the
// HTTP client span it opens the call under (`openlit.init` turns on the httpx/requests
// instrumentations) ends when the headers came back: span start → child end + OpenLIT's time to
// first token is the first-token time the client felt.
//
// A child usually ends, and is exported, before its parent (each span is exported when it ends,
// in that order, by the SDK's simple and batch processors alike), often in another export: this
// keeps the end of the latest HTTP client span under each parent for the last `capacity` parents
// (the oldest forgotten first), and the parent's mapping takes it. A child that arrives after its
// parent, or was forgotten, leaves OpenLIT's own figure as it is.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Parents remembered by default: an HTTP client span with a parent is about 100 bytes here.
pub const DEFAULT_CAPACITY: usize = 16_384;

/// A parent span's identity: its trace id then its span id.
type ParentKey = [u8; 24];

fn key(trace_id: &[u8], span_id: &[u8]) -> Option<ParentKey> {
    if trace_id.len() != 16 || span_id.len() != 8 {
        return None;
    }
    let mut k = [0u8; 24];
    k[..16].copy_from_slice(trace_id);
    k[16..].copy_from_slice(span_id);
    Some(k)
}

/// An HTTP request made by a client (`http.request.method`, or `http.method` before the stable
/// HTTP conventions), under a parent span.
fn http_client_parent(span: &Span) -> Option<ParentKey> {
    if span.kind != SpanKind::Client as i32 || span.end_time_unix_nano == 0 {
        return None;
    }
    let http = span
        .attributes
        .iter()
        .any(|kv| kv.key == "http.request.method" || kv.key == "http.method");
    if !http {
        return None;
    }
    key(&span.trace_id, &span.parent_span_id)
}

#[derive(Default)]
struct Ends {
    /// Parent → (latest child end, when it was noted).
    by_parent: HashMap<ParentKey, (u64, u64)>,
    /// The parents noted, oldest first, each with when: the last `capacity` are remembered.
    order: VecDeque<(ParentKey, u64)>,
    noted: u64,
}

/// The end (unix ns) of the latest HTTP client span under each recent parent.
pub struct HttpChildren {
    ends: Mutex<Ends>,
    capacity: usize,
}

impl Default for HttpChildren {
    fn default() -> Self {
        HttpChildren::new(DEFAULT_CAPACITY)
    }
}

impl HttpChildren {
    pub fn new(capacity: usize) -> HttpChildren {
        HttpChildren {
            ends: Mutex::new(Ends::default()),
            capacity: capacity.max(1),
        }
    }

    /// Remember the HTTP client spans of `req` (the latest end per parent: a retried request's
    /// last attempt is the one whose response was read).
    pub fn note(&self, req: &ExportTraceServiceRequest) {
        let mut ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
        let ends = &mut *ends;
        let spans = req
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans);
        for span in spans {
            let Some(parent) = http_client_parent(span) else {
                continue;
            };
            let end = span.end_time_unix_nano;
            if let Some((kept, _)) = ends.by_parent.get_mut(&parent) {
                *kept = (*kept).max(end);
                continue;
            }
            // The last `capacity` parents noted are kept (those taken since still hold a place).
            while ends.order.len() >= self.capacity {
                let Some((old, when)) = ends.order.pop_front() else {
                    break;
                };
                if ends.by_parent.get(&old).is_some_and(|(_, w)| *w == when) {
                    ends.by_parent.remove(&old);
                }
            }
            ends.noted += 1;
            ends.by_parent.insert(parent, (end, ends.noted));
            ends.order.push_back((parent, ends.noted));
        }
    }

    /// The end of the latest HTTP client span under `span` (forgotten once taken).
    pub fn take(&self, span: &Span) -> Option<u64> {
        let parent = key(&span.trace_id, &span.span_id)?;
        let mut ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
        // Its place in `order` goes when it comes to the front.
        ends.by_parent.remove(&parent).map(|(end, _)| end)
    }

    /// Parents remembered now.
    pub fn len(&self) -> usize {
        self.ends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_parent
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    fn http_span(trace: u8, parent: u8, id: u8, end: u64, method_key: &str) -> Span {
        Span {
            trace_id: vec![trace; 16],
            span_id: vec![id; 8],
            parent_span_id: vec![parent; 8],
            name: "POST".into(),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: end.saturating_sub(1_000_000),
            end_time_unix_nano: end,
            attributes: vec![KeyValue {
                key: method_key.into(),
                value: Some(AnyValue {
                    value: Some(Value::StringValue("POST".into())),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn req(spans: Vec<Span>) -> ExportTraceServiceRequest {
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

    fn parent(trace: u8, id: u8) -> Span {
        Span {
            trace_id: vec![trace; 16],
            span_id: vec![id; 8],
            ..Default::default()
        }
    }

    #[test]
    fn the_latest_http_client_child_is_taken_once_by_its_parent() {
        let h = HttpChildren::new(8);
        // A retried request: two attempts under parent 1; one under parent 2 (new conventions).
        h.note(&req(vec![
            http_span(1, 1, 10, 5_000, "http.method"),
            http_span(2, 2, 20, 7_000, "http.request.method"),
        ]));
        h.note(&req(vec![http_span(1, 1, 11, 9_000, "http.method")]));
        // Not HTTP client spans: a server span, a span without a method, one without a parent.
        let mut server = http_span(3, 3, 30, 1_000, "http.method");
        server.kind = SpanKind::Server as i32;
        let mut plain = http_span(4, 4, 40, 1_000, "http.method");
        plain.attributes.clear();
        let mut root = http_span(5, 5, 50, 1_000, "http.method");
        root.parent_span_id.clear();
        h.note(&req(vec![server, plain, root]));
        assert_eq!(h.len(), 2);
        assert_eq!(h.take(&parent(1, 1)), Some(9_000));
        assert_eq!(h.take(&parent(1, 1)), None, "taken once");
        assert_eq!(h.take(&parent(2, 1)), None, "another trace");
        assert_eq!(h.take(&parent(2, 2)), Some(7_000));
        assert!(h.is_empty());
    }

    #[test]
    fn the_oldest_parents_are_forgotten_at_capacity() {
        let h = HttpChildren::new(2);
        h.note(&req(vec![
            http_span(1, 1, 10, 1_000, "http.method"),
            http_span(1, 2, 11, 2_000, "http.method"),
            http_span(1, 3, 12, 3_000, "http.method"),
        ]));
        assert_eq!(h.len(), 2);
        assert_eq!(h.take(&parent(1, 1)), None);
        assert_eq!(h.take(&parent(1, 3)), Some(3_000));
        // Parents taken keep their place until it comes round: memory stays bounded, and a
        // parent noted again after it was taken is not forgotten for its older place.
        for round in 0..100u8 {
            h.note(&req(vec![http_span(2, round, 1, 1_000, "http.method")]));
            assert_eq!(h.take(&parent(2, round)), Some(1_000));
        }
        h.note(&req(vec![http_span(3, 7, 1, 1_000, "http.method")]));
        h.take(&parent(3, 7));
        h.note(&req(vec![http_span(3, 7, 2, 2_000, "http.method")]));
        h.note(&req(vec![http_span(3, 8, 3, 3_000, "http.method")]));
        assert_eq!(h.take(&parent(3, 7)), Some(2_000));
        assert!(h.ends.lock().unwrap().order.len() <= 2);
    }
}
