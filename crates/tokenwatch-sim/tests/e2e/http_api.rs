// End-to-end tests: start `serve` on 127.0.0.1:0 and talk HTTP to it (streaming
// and plain completions, errors, /metrics, admin faults and state).

use crate::common::{fast_args, sse_frames, start};
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use tokenwatch_sim::{SimArgs, serve};

#[tokio::test]
async fn chat_stream_has_vllm_shape() {
    let sim = start(fast_args(&["m1"])).await;
    let body = json!({"model":"m1","messages":[{"role":"user","content":"hello there"}],
        "stream":true,"max_tokens":12,"stream_options":{"include_usage":true}});
    let r = sim
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(body),
            &[("x-request-id", "abc-1")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    assert_eq!(r.headers["x-request-id"], "abc-1");
    r.headers["x-queue-time"]
        .to_str()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    let frames = sse_frames(&r.body);
    assert_eq!(frames.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(f).unwrap())
        .collect();
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role":"assistant","content":""})
    );
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    let completion = usage["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion));
    let content = &chunks[1..chunks.len() - 1];
    assert_eq!(content.len() as u64, completion, "one token per chunk");
    assert!(
        content[..content.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );
    let finish = &content.last().unwrap()["choices"][0]["finish_reason"];
    assert!(finish == "stop" || finish == "length");
    assert!(
        chunks
            .iter()
            .all(|c| c["id"] == chunks[0]["id"] && c["model"] == "m1")
    );
    assert_eq!(
        usage["usage"]["total_tokens"].as_u64().unwrap(),
        completion + usage["usage"]["prompt_tokens"].as_u64().unwrap()
    );
}

#[tokio::test]
async fn completions_plain_and_stream_without_usage() {
    let sim = start(fast_args(&["m1", "m2"])).await;
    let r = sim
        .post(
            "/v1/completions",
            json!({"model":"m2","prompt":"once upon a time","max_tokens":5}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (v["object"].as_str(), v["model"].as_str()),
        (Some("text_completion"), Some("m2"))
    );
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 5);
    assert!(v["choices"][0]["text"].is_string());
    let r = sim
        .post(
            "/v1/completions",
            json!({"model":"m1","prompt":"x","stream":true}),
        )
        .await;
    let frames = sse_frames(&r.body);
    let first: Value = serde_json::from_str(frames[0]).unwrap();
    assert_eq!(first["object"], "text_completion");
    assert!(first["choices"][0]["text"].is_string());
    let last: Value = serde_json::from_str(frames[frames.len() - 2]).unwrap();
    assert!(
        last["choices"][0]["finish_reason"].is_string(),
        "no usage chunk unless asked"
    );
    let models = sim.get("/v1/models").await.json();
    assert_eq!(models["data"].as_array().unwrap().len(), 2);
    assert_eq!(models["object"], "list");
}

#[tokio::test]
async fn errors_use_openai_shape() {
    let sim = start(fast_args(&["m1"])).await;
    let r = sim
        .post(
            "/v1/chat/completions",
            json!({"model":"nope","messages":[{"role":"user","content":"hi"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let e = r.json();
    assert_eq!(
        (e["error"]["type"].as_str(), e["error"]["code"].as_u64()),
        (Some("NotFoundError"), Some(404))
    );
    assert!(e["error"]["message"].as_str().unwrap().contains("nope"));
    let r = sim.raw_post("/v1/chat/completions", "{not json").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["code"], 400);
    let r = sim
        .post("/admin/faults", json!({"spec":"kv_leak:bloks=1"}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bloks")
    );
    let r = sim
        .post("/admin/faults", json!({"fault":"stall","model":"ghost"}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn admin_faults_error_burst_and_kv_leak() {
    let sim = start(fast_args(&["m1"])).await;
    let r = sim
        .post(
            "/admin/faults",
            json!({"fault":"error_burst","params":{"rate":1,"status":"502"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = sim.post("/v1/completions", json!({"prompt":"x"})).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.json()["error"]["code"], 502);
    let r = sim
        .call(Method::DELETE, "/admin/faults/error_burst", None, &[])
        .await;
    assert_eq!(r.json()["removed"], 1);

    let r = sim
        .post(
            "/admin/faults",
            json!({"spec":"kv_leak:blocks=64","model":"m1"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let listed = sim.get("/admin/faults").await.json();
    assert_eq!(listed["faults"][0]["name"], "kv_leak");
    assert_eq!(listed["faults"][0]["params"]["blocks"], "64");
    for _ in 0..3 {
        assert_eq!(
            sim.post("/v1/completions", json!({"prompt":"x","max_tokens":3}))
                .await
                .status,
            StatusCode::OK
        );
    }
    let state = sim.get("/admin/state").await.json();
    let m = &state["models"][0];
    assert_eq!(m["kv"]["leaked_blocks"], 192);
    assert_eq!(m["faults"][0]["name"], "kv_leak");
    assert!(m["gpu"]["memory_used_bytes"].as_u64().unwrap() > 16 << 30);
    let metrics = sim.get("/metrics").await.body;
    assert!(
        metrics.contains(r#"vllm:kv_cache_usage_perc{engine="0",model_name="m1"} 0.046875"#),
        "{metrics}"
    );
    sim.call(Method::DELETE, "/admin/faults/kv_leak", None, &[])
        .await;
    let state = sim.get("/admin/state").await.json();
    assert_eq!(state["models"][0]["kv"]["leaked_blocks"], 0);
    let r = sim
        .call(Method::DELETE, "/admin/faults/bogus", None, &[])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn queue_time_header_reflects_waiting() {
    let args = SimArgs {
        max_num_seqs: 1,
        ..fast_args(&["m1"])
    };
    let sim = std::sync::Arc::new(start(args).await);
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let sim = std::sync::Arc::clone(&sim);
        tasks.push(tokio::spawn(async move {
            let r = sim
                .post("/v1/completions", json!({"prompt":"x","max_tokens":50}))
                .await;
            r.headers["x-queue-time"]
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        }));
    }
    let mut waits = Vec::new();
    for t in tasks {
        waits.push(t.await.unwrap());
    }
    waits.sort_unstable();
    assert!(
        waits[2] >= 5,
        "someone must have queued behind 50-token requests: {waits:?}"
    );
}

#[tokio::test]
async fn metrics_exposition_is_well_formed() {
    let sim = start(fast_args(&["m1", "we\"ird\\model"])).await;
    sim.post("/v1/completions", json!({"prompt":"hello","max_tokens":4}))
        .await;
    let r = sim.get("/metrics").await;
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = r.body;
    for family in [
        "vllm:num_requests_running",
        "vllm:time_to_first_token_seconds",
        "DCGM_FI_DEV_FB_USED",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "missing {family}"
        );
    }
    assert!(text.contains(r#"model_name="we\"ird\\model""#));
    let finished: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("vllm:request_success_total{") && l.contains(r#"model_name="m1""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(finished, 1.0);
    assert!(
        text.contains(r#"vllm:time_to_first_token_seconds_count{engine="0",model_name="m1"} 1.0"#)
    );
    assert!(text.contains(r#"DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-"#));
    promtool_check(&text);
}

/// If promtool is installed, the exposition must parse; the only lint findings allowed are
/// the two that the real vLLM/dcgm names cause (':' in names, camelCase `modelName`).
fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool not installed; skipping");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let unexpected: Vec<&str> = report
        .lines()
        .filter(|l| {
            !l.contains("should not contain ':'")
                && !l.contains("label names should be written in 'snake_case'")
        })
        .collect();
    assert!(unexpected.is_empty(), "promtool: {report}");
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "promtool failed: {report}"
    );
}

#[tokio::test]
async fn bad_start_fault_is_an_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let args = SimArgs {
        fault: vec!["stall:rate=7".into()],
        ..fast_args(&["m1"])
    };
    let err = serve(args, listener, async {})
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("rate=7"), "{err}");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let args = SimArgs {
        fault: vec!["stall:model=zz".into()],
        ..fast_args(&["m1"])
    };
    assert!(serve(args, listener, async {}).await.is_err());
}

#[tokio::test]
async fn out_of_range_speed_drift_is_an_error_naming_the_flag() {
    for (amplitude, period, flag) in [
        (1.5, 600.0, "--speed-drift"),
        (0.1, 0.0, "--speed-drift-period"),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let args = SimArgs {
            speed_drift: amplitude,
            speed_drift_period: period,
            ..fast_args(&["m1"])
        };
        let err = serve(args, listener, async {})
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("{flag} must")), "{err}");
    }
}
