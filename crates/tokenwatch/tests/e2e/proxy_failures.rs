// Upstream failures through the real binary: refused, hung, reset mid-stream, malformed SSE,
// 5xx and stalls reach the client as they happened and are recorded with their error class.

use crate::common;

use common::*;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const CHAT: &str =
    r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":8}"#;

/// A deliberately broken upstream: behaviour chosen by the model name in the request.
async fn broken_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                // Read headers and body (small requests only).
                loop {
                    let Ok(n) = s.read(&mut tmp).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                    let text = String::from_utf8_lossy(&buf);
                    if let Some(h) = text.find("\r\n\r\n") {
                        let len = text[..h]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if buf.len() >= h + 4 + len {
                            break;
                        }
                    }
                }
                let req = String::from_utf8_lossy(&buf).to_string();
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
                if req.contains("\"model\":\"hang\"") {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                } else if req.contains("\"model\":\"malformed\"") {
                    let body = chunk(
                        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {not json\n\ndata: [DONE]\n\n",
                    );
                    let _ = s
                        .write_all(format!("{head}{body}0\r\n\r\n").as_bytes())
                        .await;
                } else if req.contains("\"model\":\"reset\"") {
                    let body = chunk("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
                    let _ = s.write_all(format!("{head}{body}").as_bytes()).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    // Drop the socket without the terminating chunk: a reset mid-stream.
                } else if req.contains("\"model\":\"linger\"") {
                    // The whole answer, then the end of the body only after a pause (below
                    // proxy.idle_timeout): a client may close in between.
                    let body = chunk(
                        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n",
                    );
                    let _ = s.write_all(format!("{head}{body}").as_bytes()).await;
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    let _ = s.write_all(b"0\r\n\r\n").await;
                } else if req.contains("\"model\":\"silent\"") {
                    let body = chunk("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
                    let _ = s.write_all(format!("{head}{body}").as_bytes()).await;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            });
        }
    });
    addr
}

/// Sends `body` to the proxy on a raw connection, reads until `until` appears in the answer (or
/// `give_up` passes), then closes the connection, as a client that stops reading would.
async fn send_then_close(proxy: SocketAddr, body: &str, until: &str, give_up: Duration) {
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {proxy}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut tmp = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + give_up;
    while !String::from_utf8_lossy(&got).contains(until) {
        match tokio::time::timeout_at(deadline, s.read(&mut tmp)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&tmp[..n]),
            _ => break,
        }
    }
    drop(s);
}

async fn records(api: SocketAddr, want: usize) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(&format!("http://{api}/api/v1/requests?limit=100"))
            .await
            .json();
        let recs = r["requests"].as_array().unwrap().clone();
        if recs.len() >= want {
            return recs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {} records: {recs:?}",
            recs.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn class_of<'a>(recs: &'a [serde_json::Value], model: &str) -> &'a serde_json::Value {
    &recs
        .iter()
        .find(|r| r["model_id"] == model)
        .unwrap_or_else(|| panic!("no record for {model}: {recs:?}"))["error_class"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_reach_the_client_and_are_recorded() {
    let bad = broken_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let refused = free_addr(); // nothing listens here
    let cfg = format!(
        "data_dir: {data}\nproxy:\n  response_timeout: 1s\n  idle_timeout: 1s\n  upstreams:\n    - url: http://{refused}\n      models: [refused]\n    - url: http://{bad}\n      models: ['*']\n      runtime: vllm\n",
        data = dir.path().join("data").display()
    );
    let cfg_path = dir.path().join("tokenwatch.yaml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let (_tw, api, proxy) = run_with_config(dir.path(), &cfg_path).await;
    let url = format!("http://{proxy}/v1/chat/completions");
    let body = |m: &str| CHAT.replace("\"m1\"", &format!("\"{m}\""));

    // Refused: a clear 502 JSON error.
    let r = send("POST", &url, Some(&body("refused")), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 502);
    let e = r.json();
    assert_eq!(e["error"]["type"], "upstream_connect", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&refused.to_string())
    );

    // Hung before headers: 502 after proxy.response_timeout, naming the setting.
    let r = send("POST", &url, Some(&body("hang")), &[]).await.unwrap();
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error"]["type"], "upstream_timeout");
    assert!(r.body.contains("proxy.response_timeout"));

    // Malformed SSE: the client gets the bytes exactly as sent.
    let r = send("POST", &url, Some(&body("malformed")), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.contains("data: {not json\n\n"), "{:?}", r.body);

    // Reset mid-stream: the client's body fails too, as it did upstream.
    let r = send("POST", &url, Some(&body("reset")), &[]).await;
    assert!(
        r.is_err(),
        "a reset upstream must not look like a clean end: {r:?}",
        r = r.as_ref().map(|x| &x.body)
    );

    // Silent mid-stream beyond proxy.idle_timeout: cut and recorded as a timeout.
    let r = send("POST", &url, Some(&body("silent")), &[]).await;
    assert!(r.is_err());

    // A client that closes once `[DONE]` reached it, before the upstream ended its body, had
    // the whole answer; one that closes mid-stream cancelled.
    send_then_close(proxy, &body("linger"), "[DONE]", Duration::from_secs(5)).await;
    send_then_close(
        proxy,
        &body("silent"),
        "\"content\"",
        Duration::from_secs(5),
    )
    .await;

    let recs = records(api, 7).await;
    assert_eq!(
        *class_of(&recs, "linger"),
        serde_json::Value::Null,
        "{recs:?}"
    );
    let cancelled = recs
        .iter()
        .filter(|r| r["model_id"] == "silent")
        .map(|r| r["error_class"].clone())
        .collect::<Vec<_>>();
    assert!(
        cancelled.contains(&serde_json::json!("client_cancelled")),
        "{cancelled:?}"
    );
    assert_eq!(*class_of(&recs, "refused"), "upstream_connect");
    assert_eq!(*class_of(&recs, "hang"), "upstream_timeout");
    assert_eq!(*class_of(&recs, "malformed"), "malformed_sse");
    assert_eq!(*class_of(&recs, "reset"), "upstream_reset");
    assert!(
        recs.iter()
            .any(|r| r["model_id"] == "silent" && r["error_class"] == "upstream_timeout"),
        "{recs:?}"
    );
    let malformed = recs.iter().find(|r| r["model_id"] == "malformed").unwrap();
    assert!(malformed["first_token_s"].as_f64().is_some());
    assert_eq!(malformed["runtime"], "vllm");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_5xx_passes_through_and_counts_as_error() {
    let stack = Stack::start(
        &[
            "--model",
            "m1",
            "--ttft-ms",
            "5",
            "--itl-ms",
            "1",
            "--fault",
            "error_burst:rate=1",
        ],
        &[],
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", stack.proxy);
    let r = send("POST", &url, Some(CHAT), &[]).await.unwrap();
    assert!(r.status >= 500, "status {}", r.status);
    assert!(r.body.contains("error"), "{}", r.body);
    let recs = records(stack.api, 1).await;
    assert_eq!(recs[0]["error_class"], "upstream_5xx");
    assert_eq!(recs[0]["status"], r.status);
    // The store writer thread may have the record queryable before the metrics sink, later in
    // the same pipeline batch, has observed it: the series can land a moment after the record.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = get(&format!("http://{}/metrics", stack.api)).await.body;
        if m.contains("error_type=\"upstream_5xx\"") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no upstream_5xx series on /metrics:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_telemetry_queue_drops_records_not_requests() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("tw.yaml");
    std::fs::write(
        &cfg_path,
        "telemetry:\n  queue_capacity: 1\n  flush_interval: 1s\n  batch_max: 1\n",
    )
    .unwrap();
    let stack = Stack::start(
        &["--model", "m1", "--ttft-ms", "1", "--itl-ms", "1"],
        &["-c", cfg_path.to_str().unwrap()],
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", stack.proxy);
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            send("POST", &url, Some(CHAT), &[]).await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        assert_eq!(
            r.status, 200,
            "a request failed while telemetry was full: {}",
            r.body
        );
        assert!(r.body.contains("[DONE]"));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = get(&format!("http://{}/metrics", stack.api)).await.body;
        let written = metric_value(&m, "tokenwatch_store_records_written_total").unwrap();
        let dropped = metric_value(
            &m,
            "tokenwatch_telemetry_dropped_records_total{reason=\"queue_full\"}",
        )
        .unwrap();
        if written + dropped == 40.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "written {written} + dropped {dropped} != 40"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
