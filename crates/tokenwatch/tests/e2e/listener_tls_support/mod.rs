// listener_tls's tools: a test CA issuing server certificates (rcgen), a rustls client that
// checks them and reads the served certificate, and the curl and Python client runners.
#![allow(dead_code)]

use crate::common::{Proc, python};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/tls_clients.py");

/// A test CA issuing server certificates for localhost and 127.0.0.1.
pub struct Pki {
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

/// A server certificate (PEM) and its key (PEM), and the certificate's DER to compare with.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl Pki {
    pub fn new() -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tokenwatch listener test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        Pki { ca }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    pub fn leaf(&self, common_name: &str) -> Leaf {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let cert = params.signed_by(&key, &self.ca).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

/// Write `leaf` over `cert`/`key` atomically (each file renamed into place).
pub fn install(leaf: &Leaf, cert: &Path, key: &Path) {
    for (path, text) in [(key, &leaf.key_pem), (cert, &leaf.cert_pem)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
}

pub fn connector(ca_pem: &str, alpn: &[&[u8]]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

/// A TLS connection to `addr` checked against the CA for the name `localhost`.
pub async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
) -> Result<TlsStream<TcpStream>, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        connector(ca_pem, alpn).connect(name, tcp),
    )
    .await
    .map_err(|_| format!("{addr}: TLS handshake timed out"))?
    .map_err(|e| format!("{addr}: TLS handshake: {e}"))
}

/// The leaf certificate `addr` presents now.
pub async fn served_leaf(addr: SocketAddr, ca_pem: &str) -> Result<Vec<u8>, String> {
    let tls = tls_connect(addr, ca_pem, &[b"http/1.1"]).await?;
    let certs = tls
        .get_ref()
        .1
        .peer_certificates()
        .ok_or("no peer certificate")?;
    Ok(certs[0].to_vec())
}

/// GET `path` over HTTPS (HTTP/1.1) with the in-test rustls client.
pub async fn https_get(
    addr: SocketAddr,
    ca_pem: &str,
    path: &str,
) -> Result<(u16, String), String> {
    let tls = tls_connect(addr, ca_pem, &[b"http/1.1"]).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", format!("localhost:{}", addr.port()))
        .body(Empty::<Bytes>::new());
    let fut = async {
        let resp = send
            .send_request(req.unwrap())
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .map_err(|_| format!("GET {path}: timed out"))?
}

pub async fn wait_tls_ready(addr: SocketAddr, ca_pem: &str, tw: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        match https_get(addr, ca_pem, "/readyz").await {
            Ok((200, _)) => return,
            Ok((s, b)) => last = format!("{s} {b}"),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "https://{addr}/readyz never answered 200 (last: {last}); log:\n{}",
        tw.log()
    );
}

/// Poll `path` on the TLS API until `ok` accepts its JSON.
pub async fn poll_api(
    api: SocketAddr,
    ca_pem: &str,
    path: &str,
    tw: &Proc,
    ok: impl Fn(&serde_json::Value) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = https_get(api, ca_pem, path)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", tw.log()));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && ok(&v) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never matched; last: {status} {body}\nlog:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn curl() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("curl"))
            .find(|p| p.exists())
    });
    found.expect(
        "curl is not installed — listener_tls checks the TLS listeners with curl; install it (apt-get install curl)",
    )
}

/// Run curl; returns (exit status, stdout, stderr).
pub fn run_curl(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(curl())
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .output()
        .expect("running curl");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn run_python(args: &[&str], tw: &Proc) -> serde_json::Value {
    // requests (under the OTLP/HTTP exporter) lets these variables override the session's
    // `verify`, i.e. the exporter's `certificate_file`; a user's shell may well set them.
    let out = Command::new(python())
        .arg(SCRIPT)
        .args(args)
        .env_remove("REQUESTS_CA_BUNDLE")
        .env_remove("CURL_CA_BUNDLE")
        .output()
        .expect("running tls_clients.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tls_clients.py {args:?} failed ({}):\n{stdout}\n{}\ntokenwatch log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        tw.log()
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("tls_clients.py output not JSON ({e}): {stdout}"))
}
