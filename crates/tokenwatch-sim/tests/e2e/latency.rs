// Timing seen by a client: TCP_NODELAY on accepted connections (no Nagle/delayed-ACK wait
// before the first SSE chunk), reasoning tokens delaying the first answer token, and
// `--stream-headers-at-first-token` holding a stream's headers until its first token.

use std::time::Duration;

use crate::common::{fast_args, named_events, start};
use serde_json::json;
use tokenwatch_sim::SimArgs;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// With Nagle's algorithm on, the first small SSE write after the response headers waits
/// for the client's delayed ACK (~40 ms on Linux). With TCP_NODELAY it follows at once.
#[tokio::test]
async fn first_sse_chunk_is_not_held_by_nagle() {
    let args = SimArgs {
        ttft_ms: 1.0,
        itl_ms: 1.0,
        ..fast_args(&["m1"])
    };
    let sim = start(args).await;
    let body = json!({"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":4});
    // One warm-up request opens the (kept-alive) connection the others reuse.
    sim.timed_stream("/v1/chat/completions", body.clone()).await;
    let mut gaps = Vec::new();
    let mut firsts = Vec::new();
    for _ in 0..20 {
        let (headers, first, _, _) = sim.timed_stream("/v1/chat/completions", body.clone()).await;
        gaps.push(first - headers);
        firsts.push(first);
    }
    let (gap, first) = (median(gaps), median(firsts));
    assert!(
        first < Duration::from_millis(30),
        "median time to the first data line {first:?} (headers→data {gap:?}): Nagle is on"
    );
}

/// Reasoning tokens take decode steps: the first answer token cannot come before TTFT plus
/// N steps (a lower bound, so CPU contention cannot break it).
#[tokio::test]
async fn reasoning_delays_the_first_answer_token() {
    let args = SimArgs {
        ttft_ms: 1.0,
        itl_ms: 25.0,
        reasoning_tokens: 8,
        ..fast_args(&["m1"])
    };
    let sim = start(args).await;
    let body = json!({"input":"think first","stream":true,"max_output_tokens":12});
    let req = axum::http::Request::post(format!("http://{}/v1/responses", sim.addr))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let t0 = std::time::Instant::now();
    let res = sim.client.request(req).await.unwrap();
    let mut body = res.into_body();
    let mut text = String::new();
    let mut first_answer = None;
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let Ok(data) = frame.unwrap().into_data() else {
            continue;
        };
        text.push_str(std::str::from_utf8(&data).unwrap());
        if first_answer.is_none() && text.contains("response.output_text.delta") {
            first_answer = Some(t0.elapsed());
        }
    }
    let events = named_events(&text);
    let reasoning = events
        .iter()
        .filter(|(n, _)| n == "response.reasoning_text.delta")
        .count();
    assert_eq!(reasoning, 8);
    let ttft = first_answer.expect("an answer token");
    assert!(
        ttft >= Duration::from_millis(1 + 8 * 25),
        "first answer token after {ttft:?}"
    );
}

/// `--speed-drift` reaches the running server: with a seed whose drift starts slow (factor
/// ≥ 1.7 over the first minute), no request finishes before 1.6 × the base TTFT. A lower
/// bound only, so CPU contention cannot break it; the drift's own shape is unit-tested.
#[tokio::test]
async fn speed_drift_slows_a_served_engine() {
    use tokenwatch_sim::engine::SpeedDrift;
    let slow_start = |seed: u64| {
        let d = SpeedDrift::new(0.9, 600.0, seed);
        (0..=120).all(|i| d.factor(f64::from(i) * 0.5) >= 1.7)
    };
    let seed = (0..10_000u64)
        .find(|s| slow_start(*s))
        .expect("a seed whose drift starts slow");
    let args = SimArgs {
        ttft_ms: 50.0,
        itl_ms: 1.0,
        seed,
        speed_drift: 0.9,
        speed_drift_period: 600.0,
        ..fast_args(&["m1"])
    };
    let sim = start(args).await;
    let body = json!({"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":1});
    for _ in 0..5 {
        let (_, _, end, _) = sim.timed_stream("/v1/chat/completions", body.clone()).await;
        assert!(
            end >= Duration::from_millis(80),
            "request done after {end:?}, before the drifted TTFT"
        );
    }
}

/// vLLM sends a stream's headers once the request is scheduled, before its prefill; with
/// `--stream-headers-at-first-token` they come with the first token, as the OpenAI API's do.
/// Lower bounds against the base TTFT (and an upper one with ample room), so CPU contention
/// cannot break them.
#[tokio::test]
async fn stream_headers_wait_for_the_first_token_when_asked() {
    let body = json!({"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":2});
    for hold in [false, true] {
        let args = SimArgs {
            ttft_ms: 150.0,
            itl_ms: 1.0,
            stream_headers_at_first_token: hold,
            ..fast_args(&["m1"])
        };
        let sim = start(args).await;
        let (headers, first, _, text) =
            sim.timed_stream("/v1/chat/completions", body.clone()).await;
        assert!(
            first >= Duration::from_millis(150),
            "first data after {first:?}"
        );
        if hold {
            assert!(
                headers >= Duration::from_millis(150),
                "headers after {headers:?}"
            );
        } else {
            assert!(
                headers < Duration::from_millis(100),
                "headers after {headers:?}"
            );
        }
        assert!(text.contains("[DONE]"), "{text}");
        for path in ["/v1/responses", "/v1/messages"] {
            let b = json!({"input":"hi","messages":[{"role":"user","content":"hi"}],"stream":true,"max_output_tokens":2,"max_tokens":2,"model":"m1"});
            let (headers, _, _, _) = sim.timed_stream(path, b).await;
            assert_eq!(
                headers >= Duration::from_millis(150),
                hold,
                "{path}: headers after {headers:?}"
            );
        }
    }
}
