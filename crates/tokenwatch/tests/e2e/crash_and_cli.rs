// Crash safety (`kill -9` loses nothing acknowledged), API parameter errors, `check-config`,
// `--version` and the `demo` command, all through the real binary.

use crate::common;

use common::*;
use std::process::Command;
use std::time::Duration;

/// Waits until the stack's simulator has generated a token: a stream is under way through the
/// proxy (nothing else sends it requests).
async fn stream_started(stack: &Stack) {
    let url = format!("http://{}/metrics", stack.sim_addr);
    wait_metric_sum(&url, "vllm:generation_tokens_total", 20, &stack.sim, |n| {
        n > 0.0
    })
    .await;
}

const CHAT: &str = r#"{"model":"m1","messages":[{"role":"user","content":"hi there"}],"stream":true,"max_tokens":6}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_kill_9() {
    let mut stack =
        Stack::start_restartable(&["--model", "m1", "--ttft-ms", "1", "--itl-ms", "1"], &[]).await;
    let url = format!("http://{}/v1/chat/completions", stack.proxy);
    for i in 0..30 {
        let id = format!("crash-{i}");
        let r = send("POST", &url, Some(CHAT), &[("x-request-id", &id)])
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = get(&format!("http://{}/metrics", stack.api)).await.body;
        if metric_value(&m, "tokenwatch_store_records_written_total") == Some(30.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "records not flushed:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stack.tw.kill9();
    stack.restart_tokenwatch();
    wait_ready(&format!("http://{}/readyz", stack.api), &stack.tw).await;
    let recs = get(&format!("http://{}/api/v1/requests?limit=1000", stack.api))
        .await
        .json();
    let ids: Vec<&str> = recs["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    for i in 0..30 {
        assert!(
            ids.contains(&format!("crash-{i}").as_str()),
            "crash-{i} lost after kill -9; have {ids:?}"
        );
    }
    // The proxy still works after the restart, and the clean shutdown path exits 0.
    let r = send("POST", &url, Some(CHAT), &[]).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(stack.tw.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_rejects_bad_parameters_with_clear_messages() {
    let stack = Stack::start(&["--model", "m1"], &[]).await;
    let api = stack.api;
    let cases = [
        ("/api/v1/latency?model=m1&windw=5m", "windw"),
        ("/api/v1/latency?metric=ttfb", "ttft, itl, e2e, queue"),
        ("/api/v1/latency?window=2m", "1m, 5m, 1h"),
        ("/api/v1/latency?by=user_id", "tenant"),
        ("/api/v1/requests?limit=0", "1 to 10000"),
        ("/api/v1/requests?since=yesterday", "RFC 3339"),
    ];
    for (path, expect) in cases {
        let r = get(&format!("http://{api}{path}")).await;
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(msg.contains(expect), "{path}: {msg}");
    }
    let ok = get(&format!(
        "http://{api}/api/v1/latency?model=m1&metric=queue&window=1h"
    ))
    .await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["count"], 0);
    assert_eq!(get(&format!("http://{api}/healthz")).await.status, 200);
    let ready = get(&format!("http://{api}/readyz")).await.json();
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["components"]["proxy"], "ok");
    let since = get(&format!(
        "http://{api}/api/v1/requests?since=2030-01-01T00:00:00Z"
    ))
    .await
    .json();
    assert_eq!(since["count"], 0);
}

/// `--version` names the version, where the commit would be and the features built in (the
/// debug binary the tests run records no commit; see build.rs).
#[test]
fn version_names_the_commit_and_the_features() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let want = format!("tokenwatch {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(line.starts_with(&want), "{line}");
    let features = line
        .split("; features: ")
        .nth(1)
        .and_then(|f| f.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no features in {line:?}"));
    let built: Vec<&str> = features.split(',').collect();
    assert_eq!(
        built.contains(&"embeddings"),
        cfg!(feature = "embeddings"),
        "{line}"
    );
    assert!(
        built.iter().all(|f| !f.is_empty() && !f.contains('_')),
        "{line}"
    );
}

/// A binary built without local embeddings (the default) refuses `capture.embeddings` at start,
/// saying which feature to build with.
#[cfg(not(feature = "embeddings"))]
#[test]
fn embeddings_without_the_feature_are_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tw.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:0\ndata_dir: {}\notlp: {{enabled: false}}\ncapture:\n  embeddings: {{enabled: true, model_dir: {}}}\n",
            dir.path().join("data").display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let out = Command::new("timeout")
        .args(["30", BIN, "run", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--features embeddings"),
        "{:?}: {err}",
        out.status
    );
}

#[test]
fn check_config_reports_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "proxy:\n  upstreams:\n    - url: http://127.0.0.1:8000\n      modles: [a]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml") && err.contains("modles"), "{err}");

    let bad_url = dir.path().join("url.yaml");
    std::fs::write(&bad_url, "proxy:\n  upstreams:\n    - url: ftp://example\n").unwrap();
    let out = Command::new(BIN)
        .args(["check-config", bad_url.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("proxy.upstreams[0].url"),
        "{err}"
    );

    let good = dir.path().join("good.yaml");
    std::fs::write(&good, "listen: 127.0.0.1:9999\nproxy:\n  upstreams:\n    - url: http://127.0.0.1:8000\n      models: [a]\n").unwrap();
    let out = Command::new(BIN)
        .args(["check-config", good.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));

    let missing = Command::new(BIN)
        .args(["check-config", "/nonexistent/tw.yaml"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/tw.yaml"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_traffic_switches_a_fault_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (mut demo, api, _) = start_demo(dir.path(), &["--fault-after", "2s", "--rps", "20"]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let l = get(&format!(
            "http://{api}/api/v1/latency?model=llama-3.1-8b-instruct&metric=ttft&window=1m"
        ))
        .await
        .json();
        let q = get(&format!(
            "http://{api}/api/v1/latency?model=qwen2.5-14b-instruct&metric=ttft&window=1m"
        ))
        .await
        .json();
        if l["count"].as_u64().unwrap_or(0) >= 5
            && q["count"].as_u64().unwrap_or(0) >= 5
            && demo.log().contains("is now ON")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "demo traffic did not show up: {l} {q}\n{}",
            demo.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let log = demo.log();
    for expect in [
        "tokenwatch demo is running",
        "/metrics",
        "/api/v1/latency",
        "kv_leak",
    ] {
        assert!(log.contains(expect), "demo output lacks {expect:?}:\n{log}");
    }
    assert!(
        demo.terminate().success(),
        "demo did not exit cleanly:\n{}",
        demo.log()
    );
    assert!(demo.log().contains("stopped"));
}

/// A stream the upstream never finishes must not hold the process open on SIGTERM: the drain
/// ends at `shutdown.drain_timeout` (or at a second signal), the pipeline stops accepting and
/// the records already queued are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_stalled_stream_stops_at_the_drain_timeout_or_a_second_signal() {
    for second_signal in [false, true] {
        let timeout = if second_signal { "10m" } else { "3s" };
        let mut stack = Stack::start_with_config(
            &[
                "--model",
                "m1",
                "--ttft-ms",
                "1",
                "--itl-ms",
                "1",
                "--fault",
                "stall:seconds=600,rate=1",
            ],
            &format!("shutdown:\n  delay: 1s\n  drain_timeout: {timeout}\n"),
        )
        .await;
        let url = format!("http://{}/v1/chat/completions", stack.proxy);
        let stalled = tokio::spawn(async move {
            send("POST", &url, Some(CHAT), &[("x-request-id", "stalled")]).await
        });
        // The stream has started (the simulator has generated its first tokens) and stalls
        // mid-way (the simulator pauses it for 10 minutes).
        stream_started(&stack).await;
        assert!(!stalled.is_finished(), "the stalled stream ended early");
        let began = std::time::Instant::now();
        stack.tw.send_term();
        if second_signal {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            stack.tw.send_term();
        }
        let status = stack.tw.wait_exit(Duration::from_secs(15));
        assert!(
            status.success(),
            "exit status {status}; log:\n{}",
            stack.tw.log()
        );
        let took = began.elapsed();
        // delay 1 s + drain_timeout 3 s; or the second signal at 2.5 s.
        assert!(
            took >= Duration::from_millis(2400) && took < Duration::from_secs(12),
            "second signal {second_signal}: took {took:?}"
        );
        stalled.abort();
    }
}

/// SIGTERM with a stream in flight: `/readyz` answers 503 at once, the proxy still serves new
/// requests during `shutdown.delay` and refuses connections after it, the API answers with the
/// count still in flight, and the stream runs to its end before the process exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_stream_in_flight_finish_and_serves_new_requests_during_the_delay() {
    let mut stack = Stack::start_with_config(
        // Every answer streams 60 reasoning tokens first (within a request's max_tokens).
        &[
            "--model",
            "m1",
            "--ttft-ms",
            "1",
            "--itl-ms",
            "100",
            "--reasoning-tokens",
            "60",
        ],
        "shutdown:\n  delay: 2s\n  drain_timeout: 60s\n",
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", stack.proxy);
    let long = r#"{"model":"m1","messages":[{"role":"user","content":"hi there"}],"stream":true,"max_tokens":300}"#;
    let stream = {
        let url = url.clone();
        tokio::spawn(async move { send("POST", &url, Some(long), &[]).await })
    };
    stream_started(&stack).await;
    let began = std::time::Instant::now();
    stack.tw.send_term();
    // `/readyz` answers 503 at once (well within the 2 s delay).
    let deadline = began + Duration::from_secs(1);
    let ready = loop {
        let r = get(&format!("http://{}/readyz", stack.api)).await;
        if r.status == 503 || std::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(ready.body.contains("draining"), "{}", ready.body);
    // Within the delay: a new request is served in full.
    let short = send("POST", &url, Some(CHAT), &[]).await.unwrap();
    assert_eq!(short.status, 200, "{}", short.body);
    assert!(short.body.contains("[DONE]"), "{}", short.body);
    // After it: the proxy accepts no more; the API answers, counting the stream in flight.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        send("POST", &url, Some(CHAT), &[]).await.is_err(),
        "the proxy still accepts after shutdown.delay"
    );
    let metrics = match send("GET", &format!("http://{}/metrics", stack.api), None, &[]).await {
        Ok(r) => r.body,
        Err(e) => panic!(
            "the API no longer answers during the drain: {e}; log:\n{}",
            stack.tw.log()
        ),
    };
    assert!(
        metrics.contains("tokenwatch_shutdown_in_flight_requests 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("shutdown"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The stream (at least 61 tokens, 100 ms apart: over 6 s) ends whole, then the process
    // exits.
    let r = stream.await.unwrap().unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.contains("[DONE]"), "cut: {}", r.body);
    let chunks = r.body.matches("data: {").count();
    assert!(chunks >= 61, "{chunks} chunks: {}", r.body);
    let status = stack.tw.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status}; log:\n{}", stack.tw.log());
    assert!(
        began.elapsed() > Duration::from_secs(5),
        "exited after {:?}, before the stream could end",
        began.elapsed()
    );
}
