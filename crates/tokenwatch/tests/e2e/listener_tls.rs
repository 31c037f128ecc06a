// TLS on tokenwatch's own listeners through the real binary: API, proxy and both OTLP receivers
// with a CA and certificates made here (rcgen); curl, the OpenAI and OpenTelemetry Python
// clients, a plain-HTTP client refused promptly, certificate reload, and bad files refused.

use crate::common;
use crate::listener_tls_support;

use bytes::Bytes;
use common::*;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use listener_tls_support::*;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// tokenwatch running with one certificate on all four listeners, in front of a simulator.
struct TlsStack {
    pki: Pki,
    ca_pem: String,
    /// The CA file, for curl and the Python clients.
    ca_file: String,
    cert: PathBuf,
    key: PathBuf,
    first: Leaf,
    _sim: Proc,
    tw: Proc,
    api: SocketAddr,
    proxy: SocketAddr,
    grpc: SocketAddr,
    otlp_http: SocketAddr,
    /// Last: removed once the processes are gone.
    _dir: tempfile::TempDir,
}

async fn start() -> TlsStack {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let ca_pem = pki.ca_pem();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &ca_pem).unwrap();
    let (cert, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
    let first = pki.leaf("tokenwatch first");
    install(&first, &cert, &key);

    let (sim, sim_addr) = start_sim(
        dir.path(),
        &["--model", "m-tls", "--ttft-ms", "20", "--itl-ms", "5"],
    )
    .await;

    // Every listener on a port it picks, read back from the start line.
    let config = dir.path().join("tokenwatch.yaml");
    let yaml = format!(
        "listen: {ANY}\ndata_dir: {data}\n\
         tls:\n  cert_file: {cert}\n  key_file: {key}\n  reload_interval: 500ms\n\
         proxy:\n  listen: {ANY}\n  upstreams:\n    - url: http://{sim_addr}\n      runtime: sim\n\
         otlp:\n  grpc_listen: {ANY}\n  http_listen: {ANY}\n",
        data = dir.path().join("data").display(),
        cert = cert.display(),
        key = key.display(),
    );
    std::fs::write(&config, yaml).unwrap();
    let cfg = config.to_string_lossy().into_owned();
    let tw = Proc::start("tokenwatch", &["run", "--config", &cfg], dir.path());
    let bound = tw.listening().await;
    let (api, proxy, grpc, otlp_http) = (
        bound["api"],
        bound["proxy"],
        bound["otlp_grpc"],
        bound["otlp_http"],
    );
    wait_tls_ready(api, &ca_pem, &tw).await;
    let ca_file = ca.to_string_lossy().into_owned();
    TlsStack {
        _dir: dir,
        pki,
        ca_pem,
        ca_file,
        cert,
        key,
        first,
        _sim: sim,
        tw,
        api,
        proxy,
        grpc,
        otlp_http,
    }
}

/// curl trusting the CA: the API over HTTP/2 (ALPN) and HTTP/1.1; without the CA, refused.
fn curl_over_tls(s: &TlsStack) {
    let url = format!("https://127.0.0.1:{}/api/v1/fleet", s.api.port());
    let (status, body, err) = run_curl(&[
        "--cacert",
        &s.ca_file,
        "-w",
        "\n%{http_code} %{http_version}",
        &url,
    ]);
    assert!(status.success(), "curl https API: {err}\n{}", s.tw.log());
    let (json, tail) = body.rsplit_once('\n').unwrap();
    assert_eq!(
        tail, "200 2",
        "status and HTTP version over TLS+ALPN: {body}"
    );
    serde_json::from_str::<serde_json::Value>(json)
        .unwrap_or_else(|e| panic!("fleet not JSON ({e}): {json}"));
    let url = format!("https://localhost:{}/metrics", s.api.port());
    let (status, body, err) = run_curl(&["--http1.1", "--cacert", &s.ca_file, &url]);
    assert!(
        status.success() && body.contains("# TYPE"),
        "curl https /metrics: {err}\n{body}"
    );
    let (status, _, err) = run_curl(&[&format!("https://127.0.0.1:{}/readyz", s.api.port())]);
    assert!(
        !status.success(),
        "curl trusted a certificate of an unknown CA"
    );
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

/// `tokenwatch top` reads an https API trusting the CA it is given (and not without it).
fn top_over_tls(s: &TlsStack) {
    let url = format!("https://127.0.0.1:{}", s.api.port());
    let out = std::process::Command::new(BIN)
        .args(["top", "--url", &url, "--ca-file", &s.ca_file, "--once"])
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && screen.contains("tokenwatch top") && screen.contains("connected"),
        "top over https: {}\n{screen}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(BIN)
        .args(["top", "--url", &url, "--once"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        !out.status.success() && err.contains("certificate"),
        "top trusted a certificate of an unknown CA: {err}"
    );
}

/// Plain HTTP to a TLS port gets a prompt 400 saying so; a client that connects and says
/// nothing does not hold up the others.
async fn plain_http_is_refused_promptly(s: &TlsStack) {
    let silent = std::net::TcpStream::connect(s.api).unwrap();
    for port in [s.api.port(), s.proxy.port()] {
        let started = Instant::now();
        let url = format!("http://127.0.0.1:{port}/api/v1/fleet");
        let (status, body, err) = run_curl(&["-w", "\n%{http_code}", &url]);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "plain HTTP took {:?}",
            started.elapsed()
        );
        assert!(
            status.success() && body.ends_with("\n400") && body.contains("TLS"),
            "plain HTTP: {body} {err}"
        );
    }
    let mut raw = std::net::TcpStream::connect(s.otlp_http).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer)
        .expect("the plain request was answered and closed within 5 s");
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("https://"),
        "{answer}"
    );
    let (status, _) = https_get(s.api, &s.ca_pem, "/healthz").await.unwrap();
    assert_eq!(status, 200, "a silent connection blocked the accept loop");
    drop(silent);
}

/// The OpenAI client streams through the TLS proxy; the OTLP exporters (gRPC and HTTP) export
/// spans over TLS; the records appear in the API.
async fn python_clients_over_tls(s: &TlsStack) {
    let base = format!("https://localhost:{}/v1", s.proxy.port());
    let out = run_python(&["openai", &base, &s.ca_file, "m-tls"], &s.tw);
    let streamed =
        out["content_chunks"].as_u64().unwrap() > 1 && !out["text"].as_str().unwrap().is_empty();
    assert!(streamed && out["usage"].as_u64().unwrap() > 0, "{out}");
    poll_api(
        s.api,
        &s.ca_pem,
        "/api/v1/requests?model=m-tls",
        &s.tw,
        |v| v["count"] == 1,
    )
    .await;

    for (transport, addr, model) in [
        ("grpc", s.grpc, "m-otlp-grpc"),
        ("http", s.otlp_http, "m-otlp-http"),
    ] {
        let endpoint = format!("https://localhost:{}", addr.port());
        let sent = run_python(
            &["otlp", transport, &endpoint, &s.ca_file, model, "3"],
            &s.tw,
        );
        assert_eq!(sent["span_ids"].as_array().unwrap().len(), 3, "{sent}");
        let path = format!("/api/v1/requests?model={model}");
        poll_api(s.api, &s.ca_pem, &path, &s.tw, |v| v["count"] == 3).await;
    }
}

/// A new certificate installed over the files reaches new connections on every listener; an
/// established connection keeps working; a bad file keeps the certificate and is logged.
async fn certificate_reload(s: &TlsStack) {
    let kept = tls_connect(s.api, &s.ca_pem, &[b"http/1.1"]).await.unwrap();
    let second = s.pki.leaf("tokenwatch second");
    install(&second, &s.cert, &s.key);
    let deadline = Instant::now() + Duration::from_secs(15);
    for addr in [s.api, s.proxy, s.grpc, s.otlp_http] {
        let alpn: &[&[u8]] = if addr == s.grpc {
            &[b"h2"]
        } else {
            &[b"http/1.1"]
        };
        loop {
            let tls = tls_connect(addr, &s.ca_pem, alpn).await.unwrap();
            if tls.get_ref().1.peer_certificates().unwrap()[0].as_ref() == second.der.as_slice() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{addr} still serves the first certificate; log:\n{}",
                s.tw.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(kept))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/healthz")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new());
    let resp = send.send_request(req.unwrap()).await.unwrap();
    assert_eq!(
        resp.status(),
        200,
        "the connection made before the reload broke"
    );

    std::fs::write(&s.cert, "not a certificate\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let cert = s.cert.to_string_lossy().into_owned();
    let names_cert =
        |l: &str| l.contains("not reloaded") && l.contains("tls.cert_file") && l.contains(&cert);
    while !s.tw.log().lines().any(names_cert) {
        assert!(
            Instant::now() < deadline,
            "no reload error naming {cert}; log:\n{}",
            s.tw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let served = served_leaf(s.api, &s.ca_pem).await.unwrap();
    assert_eq!(
        served, second.der,
        "a bad file replaced the served certificate"
    );
    assert_eq!(
        https_get(s.api, &s.ca_pem, "/healthz").await.unwrap().0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_speaks_tls_to_real_clients_and_reloads_its_certificate() {
    let mut s = start().await;
    assert_eq!(served_leaf(s.api, &s.ca_pem).await.unwrap(), s.first.der);
    curl_over_tls(&s);
    top_over_tls(&s);
    plain_http_is_refused_promptly(&s).await;
    python_clients_over_tls(&s).await;
    certificate_reload(&s).await;
    assert!(
        s.tw.terminate().success(),
        "tokenwatch did not exit cleanly; log:\n{}",
        s.tw.log()
    );
}

#[test]
fn missing_or_bad_tls_files_are_refused_naming_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let (cert, key) = (dir.path().join("ok.crt"), dir.path().join("ok.key"));
    install(&pki.leaf("ok"), &cert, &key);
    let other_key = dir.path().join("other.key");
    std::fs::write(&other_key, pki.leaf("other").key_pem).unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.key");
    let (c, k, o, g, m) = (
        cert.display(),
        key.display(),
        other_key.display(),
        garbage.display(),
        missing.display(),
    );

    let cases: Vec<(String, &str, String)> = vec![
        (
            format!("tls:\n  cert_file: {c}\n  key_file: {m}\n"),
            "tls.key_file",
            m.to_string(),
        ),
        (
            format!("tls:\n  cert_file: {g}\n  key_file: {k}\n"),
            "tls.cert_file",
            g.to_string(),
        ),
        (
            format!("tls:\n  cert_file: {c}\n  key_file: {o}\n"),
            "tls.key_file",
            o.to_string(),
        ),
        (
            format!("tls:\n  cert_file: {c}\n  key_file: {c}\n"),
            "tls.key_file",
            c.to_string(),
        ),
        (
            format!("proxy:\n  tls:\n    cert_file: {c}\n"),
            "proxy.tls.key_file",
            "missing".into(),
        ),
        (
            format!("otlp:\n  tls:\n    cert_file: {c}\n    key_file: {m}\n"),
            "otlp.tls.key_file",
            m.to_string(),
        ),
        (
            format!("tls:\n  cert_file: {c}\n  key_file: {k}\n  crt: x\n"),
            "tls",
            "crt".into(),
        ),
    ];
    for (i, (yaml, key_path, names)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("case{i}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        let out = Command::new(BIN)
            .arg("check-config")
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "check-config accepted:\n{yaml}");
        assert!(
            err.contains(key_path) && err.contains(names.as_str()),
            "case {i}: {err}"
        );
    }

    // `run` refuses the same before binding anything.
    let file = dir.path().join("case0.yaml");
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .args(["run", "--no-otlp", "--listen", ANY, "--data-dir"])
        .arg(&data)
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("tls.key_file") && err.contains("missing.key"),
        "{err}"
    );

    // The flags set the shared pair: both are needed, and their files are checked the same way.
    let run_with = |flags: &[&std::path::Path]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--no-otlp", "--listen", ANY, "--data-dir"])
            .arg(&data);
        for (flag, file) in ["--tls-cert", "--tls-key"].iter().zip(flags) {
            cmd.arg(flag).arg(file);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run_with(&[&cert]);
    assert!(err.contains("--tls-key"), "{err}");
    let err = run_with(&[&cert, &missing]);
    assert!(
        err.contains("tls.key_file") && err.contains("missing.key"),
        "{err}"
    );

    // A complete pair passes.
    let file = dir.path().join("good.yaml");
    std::fs::write(
        &file,
        format!("tls:\n  cert_file: {c}\n  key_file: {k}\nproxy:\n  tls:\n    enabled: false\n"),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
