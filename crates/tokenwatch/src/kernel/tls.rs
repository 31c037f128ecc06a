// TLS to https:// upstreams: rustls (ring provider) trusting the system's roots plus an optional
// per-upstream CA file, SNI from the URL host or `server_name`, ALPN h2 + http/1.1, clear errors.

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper_rustls::{
    FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream,
};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Builder, Client};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use serde::Deserialize;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The client for one https upstream (HTTP/2 when the upstream offers it over ALPN).
pub type HttpsClient = Client<TlsConnector, Full<Bytes>>;

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("cannot read the CA file {file}: {source}")]
    ReadCa {
        file: String,
        source: std::io::Error,
    },
    #[error("the CA file {file} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate { file: String },
    #[error("the CA file {file} is not valid PEM: {message}")]
    BadPem { file: String, message: String },
    #[error("the CA file {file}: certificate {index} cannot be used as a trust anchor: {source}")]
    BadCertificate {
        file: String,
        index: usize,
        source: rustls::Error,
    },
    #[error("{name:?} is not a valid DNS name or IP address")]
    ServerName { name: String },
    #[error("cannot set up TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

impl TlsSetupError {
    /// The key, under the upstream's `tls`, that the error is about.
    pub fn key(&self) -> &'static str {
        match self {
            TlsSetupError::ServerName { .. } => "server_name",
            TlsSetupError::Rustls(_) => "",
            _ => "ca_file",
        }
    }
}

/// The TLS settings of one https upstream, checked and loaded (the CA file read) at start.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    config: ClientConfig,
    server_name: Option<ServerName<'static>>,
}

impl UpstreamTls {
    pub fn new(cfg: Option<&UpstreamTlsConfig>) -> Result<UpstreamTls, TlsSetupError> {
        let mut roots = system_roots().clone();
        if let Some(file) = cfg.and_then(|c| c.ca_file.as_deref()) {
            add_ca_file(&mut roots, file)?;
        }
        let server_name = match cfg.and_then(|c| c.server_name.as_deref()) {
            Some(name) => Some(ServerName::try_from(name.to_string()).map_err(|_| {
                TlsSetupError::ServerName {
                    name: name.to_string(),
                }
            })?),
            None => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(UpstreamTls {
            config,
            server_name,
        })
    }

    /// An HTTPS client on `builder`'s pool settings: TCP_NODELAY and the connect timeout on the
    /// TCP connection, then the TLS handshake offering h2 and http/1.1.
    pub fn client(&self, builder: &Builder, connect_timeout: Duration) -> HttpsClient {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        http.enforce_http(false);
        let b = HttpsConnectorBuilder::new()
            .with_tls_config(self.config.clone())
            .https_only();
        let b = match &self.server_name {
            Some(name) => b.with_server_name_resolver(FixedServerNameResolver::new(name.clone())),
            None => b,
        };
        let inner = b.enable_all_versions().wrap_connector(http);
        let server_name = self
            .server_name
            .as_ref()
            .map(|n| Arc::<str>::from(n.to_str().as_ref()));
        builder.build(TlsConnector { inner, server_name })
    }
}

/// The system's trust store, loaded once. The system's store comes first because it is the one
/// the host's operators manage (private CAs installed there, `SSL_CERT_FILE`/`SSL_CERT_DIR`,
/// OS updates); Mozilla's bundle compiled into the binary (webpki-roots) is used only when the
/// system has no usable store at all (minimal containers), so hosted APIs stay reachable.
fn system_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(found.certs);
        if added > 0 {
            tracing::debug!(added, ignored, "TLS roots: the system's certificate store");
        } else {
            let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
            tracing::warn!(
                ?errors,
                "no usable certificate in the system's store; https upstreams are checked against Mozilla's bundled roots"
            );
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        roots
    })
}

fn add_ca_file(roots: &mut RootCertStore, file: &Path) -> Result<(), TlsSetupError> {
    let name = file.display().to_string();
    let pem = std::fs::read(file).map_err(|source| TlsSetupError::ReadCa {
        file: name.clone(),
        source,
    })?;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| TlsSetupError::BadPem {
            file: name.clone(),
            message: e.to_string(),
        })?;
        count += 1;
        roots
            .add(cert)
            .map_err(|source| TlsSetupError::BadCertificate {
                file: name.clone(),
                index: count,
                source,
            })?;
    }
    if count == 0 {
        return Err(TlsSetupError::NoCertificate { file: name });
    }
    Ok(())
}

/// A failed TLS handshake, naming the server and the cause as rustls reports it.
#[derive(Debug, thiserror::Error)]
#[error("TLS handshake with {server} failed: {cause}{hint}")]
pub struct HandshakeError {
    server: String,
    #[source]
    cause: BoxError,
    hint: &'static str,
}

/// hyper-rustls's connector with handshake failures made explicit; TCP errors pass unchanged.
#[derive(Clone)]
pub struct TlsConnector {
    inner: HttpsConnector<HttpConnector>,
    /// The configured `server_name`, if any (else the URL's host is the name).
    server_name: Option<Arc<str>>,
}

impl tower_service::Service<Uri> for TlsConnector {
    type Response = MaybeHttpsStream<TokioIo<TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let server = match &self.server_name {
            Some(n) => n.to_string(),
            None => dst.host().unwrap_or_default().to_string(),
        };
        let connecting = self.inner.call(dst);
        Box::pin(async move { connecting.await.map_err(|e| explain(e, server)) })
    }
}

/// hyper-rustls reports the TCP connection's errors as they are and the handshake's as an
/// `io::Error` (wrapping rustls's error); the latter become a `HandshakeError`.
fn explain(e: BoxError, server: String) -> BoxError {
    if !e.is::<std::io::Error>() {
        return e;
    }
    let hint = match rustls_error(&*e) {
        Some(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) => {
            " (the upstream's certificate is not signed by a CA tokenwatch trusts: add that CA with proxy.upstreams[].tls.ca_file or --upstream-ca-file)"
        }
        Some(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => {
            " (the certificate does not hold this name: use a name it holds in the URL or set proxy.upstreams[].tls.server_name)"
        }
        _ => "",
    };
    Box::new(HandshakeError {
        server,
        cause: e,
        hint,
    })
}

/// rustls's error inside an error chain (`io::Error::source` skips the wrapped error, so the
/// wrapped error of an `io::Error` is followed explicitly).
fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        cur = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

/// `proxy.upstreams[].tls` (and the exporters' and alert receivers' `tls`): what an https
/// endpoint is trusted by and called.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema, serde::Serialize,
)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// PEM file of CA certificates trusted for this upstream, in addition to the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Name sent in SNI and checked against the certificate [default: the URL's host].
    #[serde(default)]
    pub server_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn tls(ca: Option<&Path>, name: Option<&str>) -> Result<UpstreamTls, TlsSetupError> {
        UpstreamTls::new(Some(&UpstreamTlsConfig {
            ca_file: ca.map(PathBuf::from),
            server_name: name.map(str::to_string),
        }))
    }

    #[test]
    fn ca_file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = tls(Some(&missing), None).unwrap_err();
        assert_eq!(e.key(), "ca_file");
        assert!(e.to_string().contains("missing.pem"), "{e}");

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = tls(Some(&empty), None).unwrap_err();
        assert!(matches!(e, TlsSetupError::NoCertificate { .. }), "{e}");
        assert!(e.to_string().contains("empty.pem"), "{e}");

        let junk = dir.path().join("junk.pem");
        std::fs::write(
            &junk,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = tls(Some(&junk), None).unwrap_err();
        assert!(
            matches!(e, TlsSetupError::BadCertificate { index: 1, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("junk.pem"), "{e}");
    }

    #[test]
    fn server_name_must_be_a_name() {
        let e = tls(None, Some("not a name!")).unwrap_err();
        assert_eq!(e.key(), "server_name");
        assert!(tls(None, Some("api.example.com")).is_ok());
        assert!(tls(None, Some("10.0.0.1")).is_ok());
        assert!(UpstreamTls::new(None).is_ok());
    }

    #[test]
    fn handshake_errors_are_found_and_explained() {
        let rustls_err = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        // As hyper-rustls wraps it: io::Error::other(io::Error(InvalidData, rustls::Error)).
        let wrapped: BoxError = Box::new(std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls_err,
        )));
        let e = explain(wrapped, "localhost".into()).to_string();
        assert!(
            e.starts_with(
                "TLS handshake with localhost failed: invalid peer certificate: UnknownIssuer"
            ),
            "{e}"
        );
        assert!(e.contains("tls.ca_file"), "{e}");
        // A TCP error is not a handshake error.
        let tcp: BoxError = "tcp connect error".into();
        assert_eq!(explain(tcp, "h".into()).to_string(), "tcp connect error");
    }
}
