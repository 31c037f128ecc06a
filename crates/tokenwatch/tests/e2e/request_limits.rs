// Request limits through the real binary: heads over `limits` get 431 and bodies over their
// limits 413 on the API, proxy and OTLP/HTTP listeners, named and counted, and each listener
// keeps serving afterwards; silent and slow clients are closed at `limits.header_read_timeout`
// and a listener holding `limits.max_connections` closes new ones at once.

use crate::common;

use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const CHAT: &str =
    r#"{"model":"sim-llama-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
const PROXY_BODY_LIMIT: usize = 4096;

/// One HTTP/1.1 exchange over a fresh connection, written by hand (hyper's client will not
/// send heads this large): the status and the body of the answer.
fn raw_exchange(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut answer = Vec::new();
    // The server closes after refusing (`connection: close`), ending the read.
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer from {addr}: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A POST to `path` with ~100 KiB of headers (25 of 4 KiB: under the count limit, over the bytes).
fn big_head(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
    );
    for i in 0..25 {
        head.push_str(&format!("x-filler-{i}: {}\r\n", "f".repeat(4096)));
    }
    head.push_str("\r\n");
    raw_exchange(addr, &head, b"{}")
}

/// POST `body` to `url` over the test client: the answer's status and body.
async fn post(url: &str, body: &str) -> (u16, String) {
    let r = send("POST", url, Some(body), &[]).await.unwrap();
    (r.status, r.body)
}

fn assert_names(body: &str, key: &str) {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    let msg = v["error"]["message"]
        .as_str()
        .or_else(|| v["message"].as_str())
        .unwrap_or_default();
    assert!(msg.contains(key), "the answer should name {key}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_and_bodies_over_their_limits_are_refused_named_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, sim_addr) = start_sim(dir.path(), &[]).await;

    // Every listener on a port it picks, read back from the start line.
    let config = dir.path().join("tokenwatch.yaml");
    let yaml = format!(
        "listen: {ANY}\ndata_dir: {data}\nlimits:\n  max_header_bytes: 65536\n  max_headers: 100\n\
         proxy:\n  listen: {ANY}\n  max_request_body_bytes: {PROXY_BODY_LIMIT}\n  upstreams:\n    - url: http://{sim_addr}\n      runtime: sim\n\
         otlp:\n  http_listen: {ANY}\n  grpc_listen: {ANY}\n  max_request_bytes: 4096\n",
        data = dir.path().join("data").display()
    );
    std::fs::write(&config, yaml).unwrap();
    let cfg = config.to_string_lossy().into_owned();
    let tw = Proc::start("tokenwatch", &["run", "--config", &cfg], dir.path());
    let otlp_http = tw.listening().await["otlp_http"];
    let (api, proxy) = ready_on(&tw).await;

    // Headers over limits.max_header_bytes: 431 naming the key, on each listener; and the
    // listener still answers a normal request afterwards.
    let listeners = [
        (api, "/api/v1/embeddings"),
        (proxy, "/v1/chat/completions"),
        (otlp_http, "/v1/traces"),
    ];
    for (addr, path) in listeners {
        let (status, body) = tokio::task::spawn_blocking(move || big_head(addr, path))
            .await
            .unwrap();
        assert_eq!(status, 431, "{addr}{path}: {body}");
        assert_names(&body, "limits.max_header_bytes");
    }
    // Too many header fields: 431 naming limits.max_headers.
    let (status, body) = tokio::task::spawn_blocking(move || {
        let mut head = format!("GET /readyz HTTP/1.1\r\nhost: {api}\r\n");
        for i in 0..120 {
            head.push_str(&format!("x-h{i}: v\r\n"));
        }
        head.push_str("\r\n");
        raw_exchange(api, &head, b"")
    })
    .await
    .unwrap();
    assert_eq!(status, 431, "{body}");
    assert_names(&body, "limits.max_headers");

    assert_eq!(get(&format!("http://{api}/readyz")).await.status, 200);
    let chat_url = format!("http://{proxy}/v1/chat/completions");
    let (status, body) = post(&chat_url, CHAT).await;
    assert_eq!(status, 200, "{body}");

    // Bodies over their limits: 413 naming the key; the listeners keep serving.
    let big = format!(
        r#"{{"model":"sim-llama-8b","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2 * PROXY_BODY_LIMIT)
    );
    let bodies = [
        (chat_url.clone(), "proxy.max_request_body_bytes", CHAT),
        (
            format!("http://{otlp_http}/v1/traces"),
            "otlp.max_request_bytes",
            "{}",
        ),
    ];
    for (url, key, normal) in bodies {
        let (status, body) = post(&url, &big).await;
        assert_eq!(status, 413, "{url}: {body}");
        assert_names(&body, key);
        let (status, body) = post(&url, normal).await;
        assert_eq!(status, 200, "{url}: {body}");
    }

    // An upstream's own answers are not counted as refusals of the proxy: only ours are.
    let text = get(&format!("http://{api}/metrics")).await.body;
    let count = |listener: &str, reason: &str| {
        let series = format!(
            "tokenwatch_rejected_requests_total{{listener=\"{listener}\",reason=\"{reason}\"}}"
        );
        metric_value(&text, &series).unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    };
    assert_eq!(count("api", "headers_too_large"), 2.0);
    assert_eq!(count("proxy", "headers_too_large"), 1.0);
    assert_eq!(count("otlp", "headers_too_large"), 1.0);
    assert_eq!(count("proxy", "body_too_large"), 1.0);
    assert_eq!(count("otlp", "body_too_large"), 1.0);
    drop(tw);
    drop(sim);
}

#[test]
fn unknown_and_out_of_range_limit_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (yaml, key) in [
        ("limits:\n  max_header_byte: 10\n", "max_header_byte"),
        (
            "limits:\n  max_header_bytes: 10\n",
            "limits.max_header_bytes",
        ),
        ("limits:\n  max_headers: 0\n", "limits.max_headers"),
        (
            "limits:\n  header_read_timeout: 0s\n",
            "limits.header_read_timeout",
        ),
        ("limits:\n  max_connections: 0\n", "limits.max_connections"),
        (
            "limits:\n  max_buffered_body_bytes: 1000\n",
            "limits.max_buffered_body_bytes",
        ),
    ] {
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, yaml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenwatch"))
            .args(["check-config", file.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(key), "{yaml}: {err}");
    }
}

/// Whether the server closed `s` within `within` (a read returning end of file or a reset),
/// sending nothing.
fn closed_within(s: &mut TcpStream, within: Duration) -> Result<Duration, String> {
    let started = std::time::Instant::now();
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        Ok(0) => Ok(started.elapsed()),
        Ok(n) => Err(format!(
            "answered instead: {:?}",
            String::from_utf8_lossy(&buf[..n])
        )),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(started.elapsed()),
        Err(e) => Err(format!("still open after {within:?}: {e}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_slow_and_surplus_connections_are_closed_and_counted_while_requests_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tokenwatch.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: {ANY}\ndata_dir: {data}\nlimits:\n  header_read_timeout: 2s\n  max_connections: 8\n",
            data = dir.path().join("data").display()
        ),
    )
    .unwrap();
    let cfg = config.to_string_lossy().into_owned();
    let tw = Proc::start(
        "tokenwatch",
        &["run", "--config", &cfg, "--no-otlp"],
        dir.path(),
    );
    let (api, _) = ready_on(&tw).await;

    let checks = tokio::task::spawn_blocking(move || -> Result<(), String> {
        // The readiness check's connection holds its place until the server has seen it close.
        std::thread::sleep(Duration::from_millis(500));
        // Eight idle sockets fill the listener: a ninth is closed at once, unanswered.
        let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(api).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(300));
        let mut surplus = TcpStream::connect(api).unwrap();
        let _ = surplus.write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n");
        let after = closed_within(&mut surplus, Duration::from_secs(1))
            .map_err(|e| format!("surplus connection: {e}"))?;
        assert!(after < Duration::from_secs(1), "{after:?}");
        // Once they close, requests are served again.
        drop(idle);
        std::thread::sleep(Duration::from_millis(300));
        let (status, body) = raw_exchange(
            api,
            "GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            b"",
        );
        assert_eq!(status, 200, "{body}");
        // A socket that sends nothing, one that sends half a head and stops (slow loris), and
        // one kept alive after its answer: each closed about 2 s later.
        let opened = std::time::Instant::now();
        let mut silent = TcpStream::connect(api).unwrap();
        let mut slow = TcpStream::connect(api).unwrap();
        slow.write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\nx-slow: ")
            .unwrap();
        let mut kept = TcpStream::connect(api).unwrap();
        kept.write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = [0u8; 1024];
        let n = kept.read(&mut answer).unwrap();
        assert!(
            String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&answer[..n])
        );
        for (what, s) in [
            ("silent", &mut silent),
            ("slow", &mut slow),
            ("kept alive", &mut kept),
        ] {
            closed_within(s, Duration::from_secs(6))
                .unwrap_or_else(|e| panic!("{what} connection: {e}"));
            let after = opened.elapsed();
            assert!(
                after >= Duration::from_millis(1500),
                "{what} closed too soon: {after:?}"
            );
        }

        Ok(())
    });
    if let Err(e) = checks.await.unwrap() {
        panic!("{e}\nlog:\n{}", tw.log_tail(40));
    }

    let text = get(&format!("http://{api}/metrics")).await.body;
    let count = |reason: &str| {
        let series =
            format!("tokenwatch_rejected_requests_total{{listener=\"api\",reason=\"{reason}\"}}");
        metric_value(&text, &series).unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    };
    assert!(count("header_timeout") >= 3.0);
    assert!(count("too_many_connections") >= 1.0);
    assert!(
        tw.log_tail(200).contains("limits.max_connections"),
        "the full listener is warned about, naming the key:\n{}",
        tw.log_tail(200)
    );
    drop(tw);
}

/// The proxy holds at most `limits.max_buffered_body_bytes` of request bodies at once: with
/// 900 KB of one client's body in hand (the client pauses before its last bytes), a second
/// request of 400 KB is answered 503 at once, naming the key, with Retry-After, and counted;
/// once the first body is whole and answered, the same second request goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_held_at_once_stay_within_their_budget() {
    let stack = Stack::start_with_config(
        &["--model", "sim-llama-8b", "--ttft-ms", "1", "--itl-ms", "1"],
        "limits:\n  max_buffered_body_bytes: 1048576\nproxy:\n  max_request_body_bytes: 4194304\n",
    )
    .await;
    let proxy = stack.proxy;
    // A chat request padded to `len` bytes with a long `user` field (a long prompt would be
    // over the simulated model's context).
    let padded = |len: usize| {
        let head = r#"{"model":"sim-llama-8b","max_tokens":4,"messages":[{"role":"user","content":"hi"}],"user":""#;
        let tail = r#""}"#;
        format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len()))
    };
    let first = padded(1_000_000);
    let mut held = TcpStream::connect(proxy).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    held.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {proxy}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            first.len()
        )
        .as_bytes(),
    )
    .unwrap();
    held.write_all(&first.as_bytes()[..900_000]).unwrap();
    // Once the proxy holds what was sent (its gauge says so), a second body cannot fit.
    let metrics = format!("http://{}/metrics", stack.api);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = get(&metrics).await.body;
        let held_bytes = metric_value(&m, "tokenwatch_proxy_buffered_body_bytes").unwrap_or(0.0);
        if held_bytes >= 900_000.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "held {held_bytes}:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = padded(400_000);
    let url = format!("http://{proxy}/v1/chat/completions");
    let (status, body) = post(&url, &second).await;
    assert_eq!(status, 503, "{body}");
    assert_names(&body, "limits.max_buffered_body_bytes");
    let m = get(&metrics).await.body;
    assert!(
        metric_value(
            &m,
            r#"tokenwatch_rejected_requests_total{listener="proxy",reason="body_budget"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{m}"
    );
    // The first client sends the rest: its request is answered, and the budget is free again.
    held.write_all(&first.as_bytes()[900_000..]).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains("\r\n\r\n") {
        let n = held.read(&mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    drop(held);
    let (status, body) = post(&url, &second).await;
    assert_eq!(status, 200, "{body}");
    let m = get(&metrics).await.body;
    assert_eq!(
        metric_value(&m, "tokenwatch_proxy_buffered_body_bytes"),
        Some(0.0),
        "{m}"
    );
}

/// Slow OTLP/HTTP uploads do not starve other exporters: 20 connections trickling their bodies
/// (more than the receiver's 16 processing slots) hold no slot while their bytes arrive, so an
/// ordinary export is answered 200 meanwhile; each slow one is answered 408 at
/// `otlp.body_read_timeout`, naming the key, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_otlp_uploads_hold_no_processing_slot_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let (tw, api, otlp_http) =
        start_otlp_collector_with(dir.path(), "otlp:\n  body_read_timeout: 3s\n").await;
    let mut slow: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = TcpStream::connect(otlp_http).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s.write_all(
                format!(
                    "POST /v1/traces HTTP/1.1\r\nhost: {otlp_http}\r\ncontent-type: application/json\r\ncontent-length: 50000\r\n\r\n{{\"resourceSpans\""
                )
                .as_bytes(),
            )
            .unwrap();
            s
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let span = common::otlp::chat_span(
        &format!("{:032x}", 0xfa11_u128),
        &format!("{:016x}", 0xfa11_u64),
        "fair-model",
        now_ns() - 100_000_000,
        now_ns(),
        5,
    );
    // Asserts 200.
    common::otlp::post_otlp_spans(otlp_http, "fair-app", vec![span]).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "an ordinary export waited {:?} behind slow uploads",
        started.elapsed()
    );
    for s in &mut slow {
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("otlp.body_read_timeout"), "{text}");
    }
    let m = get(&format!("http://{api}/metrics")).await.body;
    assert_eq!(
        metric_value(
            &m,
            r#"tokenwatch_otlp_requests_total{transport="http",outcome="body_timeout"}"#
        ),
        Some(20.0),
        "{m}\n{}",
        tw.log_tail(20)
    );
}
