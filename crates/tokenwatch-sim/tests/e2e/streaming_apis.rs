// End-to-end tests of the reasoning output and the other streaming APIs: chat reasoning
// field per flag, /v1/responses and /v1/messages (streamed and not), caps, errors, faults.

use crate::common::{Sim, fast_args, named_events, sse_frames, start};
use axum::http::StatusCode;
use serde_json::{Value, json};
use tokenwatch_sim::{ReasoningField, SimArgs};

async fn reasoning_sim(tokens: u32, field: ReasoningField) -> Sim {
    start(SimArgs {
        reasoning_tokens: tokens,
        reasoning_field: field,
        ..fast_args(&["m1"])
    })
    .await
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

/// Count of `name` events in a row starting at `*i`; advances `*i` past them.
fn run_of(names: &[&str], i: &mut usize, name: &str) -> usize {
    let start = *i;
    while names.get(*i) == Some(&name) {
        *i += 1;
    }
    *i - start
}

/// Asserts `names[*i..]` starts with `expected`, and advances past them.
fn expect_seq(names: &[&str], i: &mut usize, expected: &[&str]) {
    let got = &names[*i..(*i + expected.len()).min(names.len())];
    assert_eq!(got, expected, "at event {}: {names:?}", *i);
    *i += expected.len();
}

#[tokio::test]
async fn chat_reasoning_field_follows_the_flag() {
    for (field, key, other) in [
        (ReasoningField::Reasoning, "reasoning", "reasoning_content"),
        (
            ReasoningField::ReasoningContent,
            "reasoning_content",
            "reasoning",
        ),
    ] {
        let sim = reasoning_sim(3, field).await;
        let body = json!({"messages":[{"role":"user","content":"hi"}],"stream":true,
            "max_tokens":10,"stream_options":{"include_usage":true}});
        let r = sim.post("/v1/chat/completions", body).await;
        let frames = sse_frames(&r.body);
        assert_eq!(frames.last(), Some(&"[DONE]"));
        let chunks: Vec<Value> = frames[..frames.len() - 1]
            .iter()
            .map(|f| serde_json::from_str(f).unwrap())
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let deltas: Vec<&Value> = chunks[1..chunks.len() - 1]
            .iter()
            .map(|c| &c["choices"][0]["delta"])
            .collect();
        for d in &deltas[..3] {
            assert!(d[key].is_string() && d.get(other).is_none(), "{d}");
        }
        assert!(deltas[3..].iter().all(|d| d["content"].is_string()));
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 3);
        assert_eq!(usage["completion_tokens"], deltas.len() as u64);

        let r = sim
            .post(
                "/v1/chat/completions",
                json!({"messages":[{"role":"user","content":"hi"}],"max_tokens":10}),
            )
            .await
            .json();
        let message = &r["choices"][0]["message"];
        assert!(message[key].is_string(), "{r}");
        assert!(message.get(other).is_none());
        assert_eq!(
            r["usage"]["completion_tokens_details"]["reasoning_tokens"],
            3
        );
    }
    // /v1/completions has no reasoning field: the reasoning is plain text.
    let sim = reasoning_sim(3, ReasoningField::Reasoning).await;
    let body = json!({"prompt":"x","max_tokens":3,"stream":true,
        "stream_options":{"include_usage":true}});
    let r = sim.post("/v1/completions", body).await;
    let frames = sse_frames(&r.body);
    assert_eq!(frames.len(), 3 + 2, "{frames:?}");
    let usage: Value = serde_json::from_str(frames[3]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert!(usage["usage"].get("completion_tokens_details").is_none());
    assert!(!r.body.contains("reasoning"));
}

#[tokio::test]
async fn responses_stream_events_in_order_with_usage() {
    let sim = reasoning_sim(3, ReasoningField::Reasoning).await;
    let body = json!({"model":"m1","input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}],
        "instructions":"be brief","stream":true,"max_output_tokens":12});
    let r = sim
        .call(
            axum::http::Method::POST,
            "/v1/responses",
            Some(body),
            &[("x-request-id", "r-1")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    assert_eq!(r.headers["x-request-id"], "r-1");
    assert!(!r.body.contains("[DONE]"));
    let events = named_events(&r.body);
    for (n, (_, v)) in events.iter().enumerate() {
        assert_eq!(v["sequence_number"], n as u64);
    }
    let names = names(&events);
    let mut i = 0;
    expect_seq(
        &names,
        &mut i,
        &["response.created", "response.in_progress"],
    );
    expect_seq(
        &names,
        &mut i,
        &[
            "response.output_item.added",
            "response.reasoning_part.added",
        ],
    );
    assert_eq!(events[2].1["item"]["type"], "reasoning");
    assert_eq!(run_of(&names, &mut i, "response.reasoning_text.delta"), 3);
    expect_seq(
        &names,
        &mut i,
        &[
            "response.reasoning_text.done",
            "response.reasoning_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
        ],
    );
    assert_eq!(events[i - 1].1["output_index"], 1);
    let answer = run_of(&names, &mut i, "response.output_text.delta");
    assert!(answer >= 1);
    expect_seq(
        &names,
        &mut i,
        &[
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ],
    );
    let (last, fin) = events.last().unwrap();
    assert_eq!(i, events.len() - 1);
    let resp = &fin["response"];
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap())
        .collect();
    let delta = events
        .iter()
        .find(|(n, _)| n == "response.output_text.delta")
        .unwrap();
    assert_eq!(delta.1["item_id"], resp["output"][1]["id"]);
    assert_eq!(delta.1["content_index"], 0);
    assert_eq!(resp["output"][1]["content"][0]["text"], text.as_str());
    assert_eq!(resp["output"][0]["type"], "reasoning");
    let usage = &resp["usage"];
    assert_eq!(usage["output_tokens"], 3 + answer as u64);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 3);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["input_tokens"].as_u64().unwrap() + 3 + answer as u64)
    );
    if last == "response.completed" {
        assert_eq!(resp["status"], "completed");
        assert!(resp["incomplete_details"].is_null());
    } else {
        assert_eq!(last, "response.incomplete");
        assert_eq!(resp["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(usage["output_tokens"], 12);
    }
    assert!(resp["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(
        (resp["object"].as_str(), resp["model"].as_str()),
        (Some("response"), Some("m1"))
    );
    assert_eq!(events[0].1["response"]["id"], resp["id"]);
}

#[tokio::test]
async fn responses_cut_by_max_output_tokens_is_incomplete() {
    // The cap ends the output while it still reasons: no message item at all.
    let sim = reasoning_sim(3, ReasoningField::Reasoning).await;
    let body = json!({"input":"hi","stream":true,"max_output_tokens":2});
    let events = named_events(&sim.post("/v1/responses", body).await.body);
    let names = names(&events);
    assert!(!names.contains(&"response.output_text.delta"), "{names:?}");
    assert_eq!(names.last(), Some(&"response.incomplete"));
    let resp = &events.last().unwrap().1["response"];
    assert_eq!(resp["status"], "incomplete");
    assert_eq!(resp["output"].as_array().unwrap().len(), 1);
    assert_eq!(
        resp["usage"]["output_tokens_details"]["reasoning_tokens"],
        2
    );

    // Without reasoning, one token with max_output_tokens=1, not streamed.
    let sim = start(fast_args(&["m1"])).await;
    let r = sim
        .post("/v1/responses", json!({"input":"hi","max_output_tokens":1}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["usage"]["output_tokens"], 1);
    assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn responses_plain_body_with_reasoning() {
    let sim = reasoning_sim(2, ReasoningField::Reasoning).await;
    let r = sim
        .post(
            "/v1/responses",
            json!({"input":"hello","max_output_tokens":30}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "response");
    assert!(["completed", "incomplete"].contains(&v["status"].as_str().unwrap()));
    let out = v["output"].as_array().unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0]["type"], "reasoning");
    assert_eq!(out[0]["content"][0]["type"], "reasoning_text");
    assert_eq!(
        (out[1]["type"].as_str(), out[1]["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(out[1]["content"][0]["annotations"], json!([]));
    let u = &v["usage"];
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 2);
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap()
    );
    let r = sim.post("/v1/responses", json!({"input":7})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["code"], 400);
}

#[tokio::test]
async fn messages_stream_events_in_order_with_usage() {
    let sim = reasoning_sim(3, ReasoningField::Reasoning).await;
    let body = json!({"model":"m1","max_tokens":12,"stream":true,"system":"be brief",
        "messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]});
    let r = sim.post("/v1/messages", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let events = named_events(&r.body);
    let names = names(&events);
    let mut i = 0;
    expect_seq(&names, &mut i, &["message_start", "content_block_start"]);
    let start = &events[0].1["message"];
    assert_eq!(
        (start["role"].as_str(), start["content"].clone()),
        (Some("assistant"), json!([]))
    );
    assert!(start["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(start["usage"]["output_tokens"], 1);
    assert_eq!(events[1].1["content_block"]["type"], "thinking");
    assert_eq!(
        run_of(&names, &mut i, "content_block_delta"),
        4,
        "{names:?}"
    );
    assert_eq!(events[5].1["delta"]["type"], "signature_delta");
    assert!(
        events[2..5]
            .iter()
            .all(|(_, v)| v["delta"]["type"] == "thinking_delta" && v["index"] == 0)
    );
    expect_seq(
        &names,
        &mut i,
        &["content_block_stop", "content_block_start", "ping"],
    );
    assert_eq!(
        events[i - 2].1["content_block"],
        json!({"type":"text","text":""})
    );
    assert_eq!(events[i - 2].1["index"], 1);
    let answer = run_of(&names, &mut i, "content_block_delta");
    assert!(answer >= 1);
    assert!(
        events[i - answer..i]
            .iter()
            .all(|(_, v)| v["delta"]["type"] == "text_delta" && v["index"] == 1)
    );
    expect_seq(
        &names,
        &mut i,
        &["content_block_stop", "message_delta", "message_stop"],
    );
    assert_eq!(i, events.len());
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["usage"]["output_tokens"], 3 + answer as u64);
    let stop = delta["delta"]["stop_reason"].as_str().unwrap();
    assert!(
        stop == "end_turn" || (stop == "max_tokens" && answer == 9),
        "{stop} {answer}"
    );
    assert!(delta["delta"]["stop_sequence"].is_null());
}

#[tokio::test]
async fn messages_plain_body_caps_and_errors() {
    let sim = reasoning_sim(2, ReasoningField::Reasoning).await;
    let msgs = json!([{"role":"user","content":"hi"}]);
    let r = sim
        .post("/v1/messages", json!({"max_tokens":40,"messages":msgs}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (v["type"].as_str(), v["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(v["content"][0]["type"], "thinking");
    assert!(v["content"][0]["signature"].is_string());
    assert_eq!(v["content"][1]["type"], "text");
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() >= 3);
    // thinking disabled and a one-token cap: just text, cut.
    let r = sim
        .post(
            "/v1/messages",
            json!({"max_tokens":1,"messages":msgs,"thinking":{"type":"disabled"}}),
        )
        .await
        .json();
    assert_eq!(r["stop_reason"], "max_tokens");
    assert_eq!(r["content"].as_array().unwrap().len(), 1);
    assert_eq!(r["content"][0]["type"], "text");
    assert_eq!(r["usage"]["output_tokens"], 1);
    assert!(r["stop_sequence"].is_null());
    // Errors in Anthropic's shape.
    let r = sim.post("/v1/messages", json!({"messages":msgs})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let e = r.json();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens")
    );
    let r = sim
        .post(
            "/v1/messages",
            json!({"model":"nope","max_tokens":5,"messages":msgs}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn error_burst_applies_to_the_new_endpoints() {
    let sim = start(SimArgs {
        fault: vec!["error_burst:rate=1,status=503".into()],
        ..fast_args(&["m1"])
    })
    .await;
    let r = sim
        .post("/v1/responses", json!({"input":"hi","stream":true}))
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.json()["error"]["code"], 503);
    let r = sim
        .post(
            "/v1/messages",
            json!({"max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let e = r.json();
    assert_eq!(
        (e["type"].as_str(), e["error"]["type"].as_str()),
        (Some("error"), Some("overloaded_error"))
    );
    let r = sim
        .post(
            "/v1/messages",
            json!({"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let metrics = sim.get("/metrics").await.body;
    assert!(
        metrics.contains(
            r#"vllm:request_success_total{engine="0",finished_reason="error",model_name="m1"} 3"#
        ),
        "{metrics}"
    );
}
