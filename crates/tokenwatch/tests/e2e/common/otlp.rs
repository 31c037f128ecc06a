// OTLP/JSON for the tests: GenAI chat spans as the OpenTelemetry instrumentations send them, and
// one resource's spans POSTed to an OTLP/HTTP listener's `/v1/traces` (answered 200).

use super::{Reply, now_ms, send};
use serde_json::{Value, json};
use std::net::SocketAddr;

/// An attribute (`{"key", "value"}`) with an OTLP/JSON `value` such as `{"doubleValue": 0.5}`.
pub fn attr(key: &str, value: Value) -> Value {
    json!({"key": key, "value": value})
}

/// A string attribute.
pub fn str_attr(key: &str, value: &str) -> Value {
    attr(key, json!({ "stringValue": value }))
}

/// A GenAI chat span (kind client, named `chat {model}`) from `start_ns` to `end_ns` whose
/// attributes are the operation, the request model and `output_tokens`; push more onto
/// `["attributes"]`.
pub fn chat_span(
    trace_id: &str,
    span_id: &str,
    model: &str,
    start_ns: u128,
    end_ns: u128,
    output_tokens: u64,
) -> Value {
    json!({
        "traceId": trace_id,
        "spanId": span_id,
        "name": format!("chat {model}"),
        "kind": 3,
        "startTimeUnixNano": start_ns.to_string(),
        "endTimeUnixNano": end_ns.to_string(),
        "attributes": [
            str_attr("gen_ai.operation.name", "chat"),
            str_attr("gen_ai.request.model", model),
            attr("gen_ai.usage.output_tokens", json!({"intValue": output_tokens.to_string()})),
        ]
    })
}

/// The trace id of numbered span `i` ([`numbered_chat_span`]).
pub fn trace_id(i: usize) -> String {
    format!("{:032x}", 0xabc000 + i)
}

/// The span id of numbered span `i`: the request id of the record it makes.
pub fn span_id(i: usize) -> String {
    format!("{:016x}", 0xdef000 + i)
}

/// Chat span `i` of `model` ([`trace_id`], [`span_id`]), 1 s long, ending `ago_ms` before now.
pub fn numbered_chat_span(i: usize, model: &str, ago_ms: i64, output_tokens: u64) -> Value {
    let end_ns = (now_ms() - ago_ms) as u128 * 1_000_000;
    chat_span(
        &trace_id(i),
        &span_id(i),
        model,
        end_ns - 1_000_000_000,
        end_ns,
        output_tokens,
    )
}

/// POSTs `spans` of one resource with `resource` attributes to `otlp_http`'s `/v1/traces` and
/// asserts the listener answered 200; returns the reply (partial-success text).
pub async fn post_resource_spans(
    otlp_http: SocketAddr,
    resource: Vec<Value>,
    spans: Vec<Value>,
) -> Reply {
    let body = json!({"resourceSpans": [{
        "resource": {"attributes": resource},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]
    }]});
    post_otlp_json(otlp_http, "traces", &body).await
}

/// POSTs an OTLP/HTTP JSON export of `signal` (`traces`, `metrics`, `logs`); asserts 200.
pub async fn post_otlp_json(otlp_http: SocketAddr, signal: &str, body: &Value) -> Reply {
    let r = send(
        "POST",
        &format!("http://{otlp_http}/v1/{signal}"),
        Some(&body.to_string()),
        &[],
    )
    .await
    .unwrap_or_else(|e| panic!("POST {e}"));
    assert_eq!(r.status, 200, "{signal}: {}", r.body);
    r
}

/// [`post_resource_spans`] of a resource named only by `service.name` = `service`.
pub async fn post_otlp_spans(otlp_http: SocketAddr, service: &str, spans: Vec<Value>) -> Reply {
    post_resource_spans(otlp_http, vec![str_attr("service.name", service)], spans).await
}
