// End to end through the real binaries: OpenAI Responses and Anthropic Messages requests and a
// reasoning model's chat stream are timed and recorded like chat completions; mid-stream error
// events are recorded as errors, and every byte reaches the client as the upstream sent it.

use crate::common;

use common::*;
use serde_json::Value;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reasoning tokens the simulator streams before each answer, one decode step of `ITL_MS` each.
const REASONING: u64 = 20;
const ITL_MS: u64 = 50;
/// The token cap of every request: the reasoning plus one answer token, so each is cut there.
const MAX_TOKENS: u64 = REASONING + 1;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// A streamed record timed at its first reasoning delta, every delta with text a timed chunk
/// (`text_deltas`: how many the client saw; the simulator, like vLLM, sends some empty ones).
fn check_stream_timing(r: &Value, text_deltas: u64) {
    let id = &r["request_id"];
    assert_eq!(r["stream"], true, "{id}");
    let headers = r["upstream_headers_s"].as_f64().unwrap();
    let ttft = r["first_token_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("{id}: no first token: {r}"));
    // The answer starts after REASONING decode steps; a first token taken at the answer would
    // come at least REASONING × ITL after the headers.
    let budget = (REASONING * ITL_MS) as f64 / 1000.0;
    assert!(
        ttft >= headers && ttft - headers < budget,
        "{id}: ttft {ttft} s, headers {headers} s"
    );
    let offsets: Vec<u64> = r["chunk_offsets_us"]
        .as_array()
        .unwrap()
        .iter()
        .map(u)
        .collect();
    assert_eq!(
        offsets.len() as u64,
        text_deltas,
        "{id}: one timed chunk per reasoning and answer delta"
    );
    assert!(
        (offsets[0] as f64 / 1e6 - ttft).abs() < 1e-5,
        "{id}: the first chunk is the first token"
    );
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]),
        "{id}: {offsets:?}"
    );
    assert_eq!(u(&r["gaps"]["count"]), text_deltas - 1, "{id}");
}

fn check_ok(r: &Value, endpoint: &str) {
    assert_eq!(r["endpoint"], endpoint, "{r}");
    assert_eq!(r["status"], 200, "{r}");
    assert!(r["error_class"].is_null(), "{r}");
    assert_eq!(r["model_id"], "m-think", "{r}");
    assert_eq!(r["runtime"], "sim", "{r}");
    assert_eq!(r["tokens_from_usage"], true, "{r}");
    assert_eq!(
        r["finish_reason"], "length",
        "cut at the request's token cap: {r}"
    );
}

/// What an Anthropic event stream said: text and thinking deltas with text, input and output
/// tokens, stop reason.
fn read_anthropic_stream(body: &str) -> (u64, u64, u64, String) {
    let (mut deltas, mut input, mut output, mut stop) = (0, 0, 0, String::new());
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let ev: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        match ev["type"].as_str().unwrap() {
            "message_start" => input = u(&ev["message"]["usage"]["input_tokens"]),
            "content_block_delta" => {
                let d = &ev["delta"];
                let text = d["text"].as_str().or(d["thinking"].as_str()).unwrap_or("");
                deltas += u64::from(!text.is_empty());
            }
            "message_delta" => {
                output = u(&ev["usage"]["output_tokens"]);
                stop = ev["delta"]["stop_reason"].as_str().unwrap().to_string();
            }
            _ => {}
        }
    }
    (deltas, input, output, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_messages_and_reasoning_chat_are_timed_and_recorded() {
    let (itl, reasoning) = (ITL_MS.to_string(), REASONING.to_string());
    let sim = [
        "--model",
        "m-think",
        "--ttft-ms",
        "30",
        "--itl-ms",
        &itl,
        "--reasoning-tokens",
        &reasoning,
    ];
    let stack = Stack::start(&sim, &[]).await;

    // The OpenAI Python client: a streamed and a plain Responses call, a streamed chat call.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/streaming_apis_client.py"
    );
    let out = Command::new(python())
        .args([
            script,
            &format!("http://{}/v1", stack.proxy),
            "m-think",
            &MAX_TOKENS.to_string(),
        ])
        .output()
        .expect("running the OpenAI client");
    assert!(
        out.status.success(),
        "openai client failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        stack.tw.log()
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();

    // Anthropic Messages over plain HTTP, streamed and not; same conversation as resp-stream.
    let url = format!("http://{}/v1/messages", stack.proxy);
    let body = |stream: bool| {
        serde_json::json!({
            "model": "m-think", "max_tokens": MAX_TOKENS, "stream": stream, "system": "You are terse.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "what is paged attention?"}]}]
        })
        .to_string()
    };
    let headers = |id| [("x-request-id", id), ("anthropic-version", "2023-06-01")];
    let streamed = send("POST", &url, Some(&body(true)), &headers("msg-stream"))
        .await
        .unwrap();
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    let (msg_deltas, msg_input, msg_output, msg_stop) = read_anthropic_stream(&streamed.body);
    assert_eq!((msg_output, msg_stop.as_str()), (MAX_TOKENS, "max_tokens"));
    assert!(msg_deltas > REASONING / 2, "{}", streamed.body);
    let plain = send("POST", &url, Some(&body(false)), &headers("msg-json"))
        .await
        .unwrap();
    assert_eq!(plain.status, 200, "{}", plain.body);
    let plain = plain.json();

    // Responses, streamed: first token at the first reasoning delta, usage from response.incomplete.
    let c = &seen["resp-stream"];
    assert_eq!(
        (c["status"].as_str(), c["incomplete_reason"].as_str()),
        (Some("incomplete"), Some("max_output_tokens"))
    );
    assert_eq!(
        u(&c["kinds"]["response.reasoning_text.delta"]),
        REASONING,
        "{c}"
    );
    let r = stored_record(stack.api, "resp-stream", &stack.tw).await;
    check_ok(&r, "/v1/responses");
    check_stream_timing(&r, u(&c["text_deltas"]));
    assert_eq!(r["output_tokens"], c["output_tokens"], "{r}");
    assert_eq!(r["prompt_tokens"], c["input_tokens"], "{r}");
    assert_eq!(u(&r["reasoning_tokens"]), REASONING, "{r}");
    assert_eq!(u(&c["reasoning_tokens"]), REASONING, "{c}");
    assert!(r["prefix_key"].is_string(), "{r}");

    // Anthropic Messages through the Anthropic SDK: timed and counted like the raw calls below,
    // and its `x-api-key` is the same tenant as the OpenAI client's bearer token of that key.
    let c = &seen["sdk-msg"];
    let r = stored_record(stack.api, "sdk-msg", &stack.tw).await;
    check_ok(&r, "/v1/messages");
    check_stream_timing(&r, u(&c["deltas"]));
    assert_eq!(
        (&r["output_tokens"], &r["prompt_tokens"]),
        (&c["output_tokens"], &c["input_tokens"]),
        "{r}"
    );
    let openai_tenant = stored_record(stack.api, "resp-json", &stack.tw).await["tenant"].clone();
    assert!(
        openai_tenant
            .as_str()
            .is_some_and(|t| t.starts_with("key-")),
        "{openai_tenant}"
    );
    assert_eq!(r["tenant"], openai_tenant, "{r}");

    // Responses, not streamed.
    let c = &seen["resp-json"];
    let r = stored_record(stack.api, "resp-json", &stack.tw).await;
    check_ok(&r, "/v1/responses");
    assert_eq!(
        (r["stream"].as_bool(), r["first_token_s"].as_f64()),
        (Some(false), None),
        "{r}"
    );
    assert_eq!(
        (&r["output_tokens"], &r["prompt_tokens"]),
        (&c["output_tokens"], &c["input_tokens"]),
        "{r}"
    );
    assert_eq!(u(&r["reasoning_tokens"]), REASONING, "{r}");

    // Chat from the reasoning model: `delta.reasoning` chunks are tokens.
    let c = &seen["chat-think"];
    let (reasoning_chunks, content_chunks) = (u(&c["reasoning_chunks"]), u(&c["content_chunks"]));
    assert!(
        reasoning_chunks > REASONING / 2 && content_chunks <= 1,
        "{c}"
    );
    let r = stored_record(stack.api, "chat-think", &stack.tw).await;
    check_ok(&r, "/v1/chat/completions");
    check_stream_timing(&r, reasoning_chunks + content_chunks);
    assert_eq!(
        (&r["output_tokens"], &r["prompt_tokens"]),
        (&c["completion_tokens"], &c["prompt_tokens"]),
        "{r}"
    );
    assert_eq!(u(&r["reasoning_tokens"]), REASONING, "{r}");

    // Anthropic, streamed: thinking deltas time the first token; usage from message_start + message_delta.
    let r = stored_record(stack.api, "msg-stream", &stack.tw).await;
    check_ok(&r, "/v1/messages");
    check_stream_timing(&r, msg_deltas);
    assert_eq!(
        (u(&r["output_tokens"]), u(&r["prompt_tokens"])),
        (msg_output, msg_input),
        "{r}"
    );
    assert!(
        r["reasoning_tokens"].is_null(),
        "Anthropic does not report a reasoning count: {r}"
    );
    let resp_key = stored_record(stack.api, "resp-stream", &stack.tw).await["prefix_key"].clone();
    assert_eq!(
        r["prefix_key"], resp_key,
        "the same conversation has the same prefix key in both APIs"
    );

    // Anthropic, not streamed.
    let r = stored_record(stack.api, "msg-json", &stack.tw).await;
    check_ok(&r, "/v1/messages");
    assert_eq!(r["stream"], false);
    assert_eq!(r["output_tokens"], plain["usage"]["output_tokens"], "{r}");
    assert_eq!(r["prompt_tokens"], plain["usage"]["input_tokens"], "{r}");

    // The list endpoint returns the reasoning count too.
    let list = get(&format!(
        "http://{}/api/v1/requests?model=m-think&limit=10",
        stack.api
    ))
    .await
    .json();
    let reqs = list["requests"].as_array().unwrap();
    assert_eq!(
        reqs.len(),
        6,
        "three OpenAI client calls, the Anthropic SDK's, two raw: {list}"
    );
    let with_reasoning = reqs
        .iter()
        .filter(|r| r["reasoning_tokens"] == REASONING)
        .count();
    assert_eq!(
        with_reasoning, 3,
        "resp-stream, resp-json, chat-think: {list}"
    );
}

/// Canned upstream streams: events the proxy knows, events it does not, comments, and errors.
const RESPONSES_FAILED: &[&str] = &[
    "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_x\",\"status\":\"in_progress\",\"model\":\"up-model\",\"output\":[],\"usage\":null}}\n\n",
    ": keep-alive\n\n",
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"Hel\"}\n\n",
    "event: response.future_thing\r\ndata: {\"type\":\"response.future_thing\",\"sequence_number\":2,\"x\":[1,{\"y\":null}]}\r\n\r\n",
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"delta\":\"lo \\u00e9\"}\n\n",
    "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":4,\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"model\":\"up-model\",\"output\":[],\"usage\":null}}\n\n",
];
const RESPONSES_CUT: &[&str] = &[
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"b\"}\n\n",
];
const MESSAGES_ERROR: &[&str] = &[
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_x\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"up-claude\",\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n",
    "event: ping\ndata: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
    "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
];

/// A loopback upstream answering each request with the canned stream its path and model pick,
/// one event per write, then closing the connection.
async fn canned_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            sock.set_nodelay(true).unwrap();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                // Headers, then the body by its content-length.
                let (head_end, len) = loop {
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                    if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&req[..i]).to_ascii_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                        break (i + 4, len);
                    }
                };
                while req.len() < head_end + len {
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                let text = String::from_utf8_lossy(&req);
                let events = if text.starts_with("POST /v1/messages ") {
                    MESSAGES_ERROR
                } else if text.contains("\"model\":\"cut\"") {
                    RESPONSES_CUT
                } else {
                    RESPONSES_FAILED
                };
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                if sock.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for e in events {
                    if sock.write_all(e.as_bytes()).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let _ = sock.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_events_are_recorded_and_bytes_pass_untouched() {
    let upstream = canned_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut tw, api, proxy) = run_tokenwatch(dir.path(), &format!("http://{upstream}"), &[]).await;

    let cases: [(&str, &str, &str, &[&str]); 3] = [
        (
            "/v1/responses",
            r#"{"stream":true,"input":"hi"}"#,
            "resp-failed",
            RESPONSES_FAILED,
        ),
        (
            "/v1/responses",
            r#"{"model":"cut","stream":true,"input":"hi"}"#,
            "resp-cut",
            RESPONSES_CUT,
        ),
        (
            "/v1/messages",
            r#"{"stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#,
            "msg-error",
            MESSAGES_ERROR,
        ),
    ];
    for (path, body, id, events) in cases {
        let url = format!("http://{proxy}{path}");
        let r = send("POST", &url, Some(body), &[("x-request-id", id)])
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{id}");
        assert_eq!(
            r.body,
            events.concat(),
            "{id}: the client gets the upstream's bytes unchanged"
        );
    }

    // Failed mid-stream: an upstream error after content, timed up to there, tokens counted.
    let r = stored_record(api, "resp-failed", &tw).await;
    assert_eq!(
        (r["error_class"].as_str(), r["status"].as_u64()),
        (Some("upstream_5xx"), Some(200)),
        "{r}"
    );
    assert_eq!(
        r["model_id"], "up-model",
        "the model from the stream when the request named none: {r}"
    );
    assert_eq!(
        (u(&r["output_tokens"]), r["tokens_from_usage"].as_bool()),
        (2, Some(false)),
        "{r}"
    );
    assert_eq!(r["chunk_offsets_us"].as_array().unwrap().len(), 2, "{r}");
    assert_eq!(r["finish_reason"], "error", "{r}");
    assert!(r["first_token_s"].as_f64().is_some(), "{r}");

    // Ended without a terminal event: a malformed stream.
    let r = stored_record(api, "resp-cut", &tw).await;
    assert_eq!(r["error_class"], "malformed_sse", "{r}");
    assert_eq!(u(&r["output_tokens"]), 2, "{r}");

    let r = stored_record(api, "msg-error", &tw).await;
    assert_eq!(r["error_class"], "upstream_5xx", "{r}");
    assert_eq!(r["model_id"], "up-claude", "{r}");
    assert_eq!(
        (u(&r["prompt_tokens"]), u(&r["output_tokens"])),
        (7, 1),
        "{r}"
    );

    let status = tw.terminate();
    assert!(
        status.success(),
        "tokenwatch exited with {status}; log:\n{}",
        tw.log()
    );
}
