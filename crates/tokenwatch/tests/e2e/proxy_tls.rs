// HTTPS upstreams through the real binary: a local TLS upstream (rustls, a CA and leaf made with
// rcgen here) reached with SNI and HTTP/2 via ALPN; CA trust, wrong names and bad CA files.

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::LazyConfigAcceptor;

const CHUNKS: [&str; 6] = [
    r#"{"id":"c1","object":"chat.completion.chunk","model":"M","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
    r#"{"id":"c1","object":"chat.completion.chunk","model":"M","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
    r#"{"id":"c1","object":"chat.completion.chunk","model":"M","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}"#,
    r#"{"id":"c1","object":"chat.completion.chunk","model":"M","choices":[{"index":0,"delta":{"content":" TLS"},"finish_reason":"stop"}]}"#,
    r#"{"id":"c1","object":"chat.completion.chunk","model":"M","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}"#,
    "[DONE]",
];

fn sse_event(chunk: &str, model: &str) -> String {
    format!(
        "data: {}\n\n",
        chunk.replace("\"M\"", &format!("\"{model}\""))
    )
}

/// The stream the upstream sends for `model`, byte for byte.
fn expected_stream(model: &str) -> String {
    CHUNKS.iter().map(|c| sse_event(c, model)).collect()
}

/// What the TLS upstream saw of one request (or of one failed handshake: no path).
#[derive(Debug, Clone)]
struct Seen {
    sni: Option<String>,
    alpn: Option<String>,
    version: Option<http::Version>,
    path: Option<String>,
}

struct Certs {
    ca_pem: String,
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
}

/// A CA, and a leaf certificate for `localhost` and 127.0.0.1 signed by it.
fn make_certs() -> Certs {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tokenwatch test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let mut leaf_params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    leaf_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "localhost");
    let leaf = leaf_params.signed_by(&leaf_key, &ca).unwrap();
    Certs {
        ca_pem: ca.pem(),
        chain: vec![leaf.der().clone(), ca.der().clone()],
        key_der: leaf_key.serialize_der(),
    }
}

/// A TLS upstream on 127.0.0.1 offering `alpn`, answering /v1/chat/completions with a short SSE
/// stream and /v1/models with JSON, and recording each connection's SNI and protocol.
async fn tls_upstream(certs: &Certs, alpn: &[&[u8]], seen: Arc<Mutex<Vec<Seen>>>) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certs.key_der.clone()));
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs.chain.clone(), key)
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let _ = tcp.set_nodelay(true);
            let (config, seen) = (config.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(start) =
                    LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await
                else {
                    return;
                };
                let sni = start.client_hello().server_name().map(str::to_string);
                let tls = match start.into_stream(config).await {
                    Ok(tls) => tls,
                    Err(_) => {
                        seen.lock().unwrap().push(Seen {
                            sni,
                            alpn: None,
                            version: None,
                            path: None,
                        });
                        return;
                    }
                };
                let alpn = tls
                    .get_ref()
                    .1
                    .alpn_protocol()
                    .map(|p| String::from_utf8_lossy(p).into_owned());
                let h2 = alpn.as_deref() == Some("h2");
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let (sni, alpn, seen) = (sni.clone(), alpn.clone(), seen.clone());
                    async move {
                        seen.lock().unwrap().push(Seen {
                            sni,
                            alpn,
                            version: Some(req.version()),
                            path: Some(req.uri().path().to_string()),
                        });
                        Ok::<_, Infallible>(answer(req).await)
                    }
                });
                let io = TokioIo::new(tls);
                if h2 {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, svc)
                        .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                }
            });
        }
    });
    addr
}

async fn answer(req: http::Request<Incoming>) -> http::Response<BoxBody<Bytes, Infallible>> {
    let path = req.uri().path().to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let model = json["model"].as_str().unwrap_or("none").to_string();
    let mut resp = http::Response::builder();
    let body = if path == "/v1/chat/completions" {
        resp = resp.header("content-type", "text/event-stream");
        let events: Vec<String> = CHUNKS.iter().map(|c| sse_event(c, &model)).collect();
        let stream = futures_util::stream::unfold(events.into_iter(), |mut events| async move {
            let event = events.next()?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some((Ok::<_, Infallible>(Frame::data(Bytes::from(event))), events))
        });
        StreamBody::new(stream).boxed()
    } else if path == "/v1/models" {
        resp = resp.header("content-type", "application/json");
        Full::new(Bytes::from_static(
            br#"{"object":"list","data":[{"id":"m-tls","object":"model"}]}"#,
        ))
        .boxed()
    } else {
        resp = resp.status(404);
        Full::new(Bytes::new()).boxed()
    };
    resp.body(body).unwrap()
}

async fn record_of(api: SocketAddr, model: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(&format!("http://{api}/api/v1/requests?model={model}"))
            .await
            .json();
        if let Some(rec) = r["requests"].as_array().and_then(|a| a.first()) {
            return rec.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no record for {model}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn chat(model: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"stream":true}}"#)
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_with_sni_alpn_and_a_configured_ca() {
    let certs = make_certs();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let h2_up = tls_upstream(&certs, &[b"h2", b"http/1.1"], seen.clone()).await;
    let h1_seen = Arc::new(Mutex::new(Vec::new()));
    let h1_up = tls_upstream(&certs, &[b"http/1.1"], h1_seen.clone()).await;

    let dir = tempfile::tempdir().unwrap();
    let ca = write(dir.path(), "ca.pem", &certs.ca_pem);
    let (p2, p1) = (h2_up.port(), h1_up.port());
    let cfg = format!(
        "proxy:\n  upstreams:\n\
         \x20   - url: https://localhost:{p2}\n      models: [m-noca]\n      instance: noca-upstream\n\
         \x20   - url: https://localhost:{p2}\n      models: [m-wrongname]\n      tls:\n        ca_file: {ca}\n        server_name: wrong.example\n\
         \x20   - url: https://127.0.0.1:{p2}\n      models: [m-ip]\n      tls:\n        ca_file: {ca}\n\
         \x20   - url: https://localhost:{p1}\n      models: [m-h1]\n      tls:\n        ca_file: {ca}\n"
    );
    let cfg_path = write(dir.path(), "tokenwatch.yaml", &cfg);
    let upstream = format!("https://localhost:{p2}");
    let (tw, api, proxy) = run_tokenwatch(
        dir.path(),
        &upstream,
        &["-c", &cfg_path, "--upstream-ca-file", &ca],
    )
    .await;
    let url = format!("http://{proxy}/v1/chat/completions");

    // A streamed chat completion over TLS (the catch-all --upstream with --upstream-ca-file).
    let r = send("POST", &url, Some(&chat("m-tls")), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}\n{}", r.body, tw.log());
    assert_eq!(
        r.body,
        expected_stream("m-tls"),
        "the stream must arrive intact"
    );
    let models = send("GET", &format!("http://{proxy}/v1/models"), None, &[])
        .await
        .unwrap();
    assert_eq!(models.status, 200);
    assert!(models.body.contains("\"m-tls\""), "{}", models.body);

    let rec = record_of(api, "m-tls").await;
    assert_eq!(rec["status"], 200, "{rec}");
    assert!(rec["error_class"].is_null(), "{rec}");
    let ttft = rec["first_token_s"].as_f64().expect("TTFT recorded");
    assert!(
        ttft > 0.0 && ttft <= rec["end_s"].as_f64().unwrap(),
        "{rec}"
    );
    assert_eq!(rec["output_tokens"], 3, "{rec}");
    assert_eq!(rec["prompt_tokens"], 5, "{rec}");
    assert_eq!(rec["instance"], format!("localhost:{p2}"), "{rec}");

    let chat_seen = |seen: &Mutex<Vec<Seen>>, path: &str| -> Vec<Seen> {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|s| s.path.as_deref() == Some(path))
            .cloned()
            .collect()
    };
    let got = chat_seen(&seen, "/v1/chat/completions");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        got[0].sni.as_deref(),
        Some("localhost"),
        "SNI must be the URL's host: {got:?}"
    );
    assert_eq!(got[0].alpn.as_deref(), Some("h2"), "{got:?}");
    assert_eq!(
        got[0].version,
        Some(http::Version::HTTP_2),
        "the upstream must see HTTP/2: {got:?}"
    );
    let got = chat_seen(&seen, "/v1/models");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].version, Some(http::Version::HTTP_2), "{got:?}");

    // An upstream addressed by IP: the certificate's IP SAN is checked; no SNI is sent for an IP.
    let r = send("POST", &url, Some(&chat("m-ip")), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body, expected_stream("m-ip"));
    let ip = seen
        .lock()
        .unwrap()
        .iter()
        .find(|s| s.path.is_some() && s.sni.is_none())
        .cloned();
    assert!(
        ip.is_some_and(|s| s.version == Some(http::Version::HTTP_2)),
        "{:?}",
        seen.lock().unwrap()
    );

    // An upstream offering only http/1.1 over ALPN is spoken to in HTTP/1.1.
    let r = send("POST", &url, Some(&chat("m-h1")), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body, expected_stream("m-h1"));
    let got = chat_seen(&h1_seen, "/v1/chat/completions");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].alpn.as_deref(), got[0].version),
        (Some("http/1.1"), Some(http::Version::HTTP_11))
    );
    assert_eq!(rec_of_ok(api, "m-h1").await["output_tokens"], 3);

    // No CA configured: the system roots do not trust the test CA; a 502 naming the problem.
    let r = send("POST", &url, Some(&chat("m-noca")), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 502, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["type"], "upstream_connect", "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    for part in [
        "noca-upstream",
        "TLS handshake with localhost failed",
        "invalid peer certificate",
        "UnknownIssuer",
        "tls.ca_file",
    ] {
        assert!(msg.contains(part), "{part:?} missing from {msg:?}");
    }
    assert_eq!(
        record_of(api, "m-noca").await["error_class"],
        "upstream_connect"
    );

    // A certificate that does not hold the configured server_name (also sent as SNI).
    let r = send("POST", &url, Some(&chat("m-wrongname")), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 502, "{}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("certificate not valid for name \"wrong.example\"")
            && msg.contains("server_name"),
        "{msg}"
    );
    assert_eq!(
        record_of(api, "m-wrongname").await["error_class"],
        "upstream_connect"
    );
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|s| s.sni.as_deref() == Some("wrong.example") && s.path.is_none()),
        "{:?}",
        seen.lock().unwrap()
    );
    drop(tw);
}

async fn rec_of_ok(api: SocketAddr, model: &str) -> serde_json::Value {
    let rec = record_of(api, model).await;
    assert_eq!(rec["status"], 200, "{rec}");
    rec
}

#[test]
fn bad_ca_files_fail_check_config_and_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing-ca.pem");
    let cfg = write(
        dir.path(),
        "tw.yaml",
        &format!(
            "proxy:\n  upstreams:\n    - url: https://localhost:8443\n      tls:\n        ca_file: {}\n",
            missing.display()
        ),
    );
    let out = std::process::Command::new(BIN)
        .args(["check-config", &cfg])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("tw.yaml")
            && err.contains("proxy.upstreams[0].tls.ca_file")
            && err.contains("missing-ca.pem"),
        "{err}"
    );

    let not_pem = write(dir.path(), "not-pem.pem", "hello\n");
    let out = std::process::Command::new(BIN)
        .args([
            "run",
            "--upstream",
            "https://localhost:8443",
            "--upstream-ca-file",
            &not_pem,
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--upstream-ca-file")
            && err.contains("not-pem.pem")
            && err.contains("no PEM certificate"),
        "{err}"
    );

    let certs = make_certs();
    let ca = write(dir.path(), "ca.pem", &certs.ca_pem);
    let cfg = write(
        dir.path(),
        "ok.yaml",
        &format!(
            "proxy:\n  upstreams:\n    - url: https://localhost:8443\n      tls:\n        ca_file: {ca}\n        server_name: api.internal\n"
        ),
    );
    let out = std::process::Command::new(BIN)
        .args(["check-config", &cfg])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
