// TLS to https:// upstreams: rustls (ring provider) trusting the system's roots plus an optional
// per-upstream CA file, SNI from the URL host or `server_name`, an optional client certificate
// (mutual TLS), ALPN h2 + http/1.1, clear errors.

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
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
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
    #[error("cannot read the client certificate file {file}: {message}")]
    ClientCert { file: String, message: String },
    #[error("cannot read the client key file {file}: {message}")]
    ClientKey { file: String, message: String },
    #[error("cert_file and key_file go together: {missing} is missing")]
    ClientPair { missing: &'static str },
    #[error("cannot set up TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

impl TlsSetupError {
    /// The key, under the upstream's `tls`, that the error is about.
    pub fn key(&self) -> &'static str {
        match self {
            TlsSetupError::ServerName { .. } => "server_name",
            TlsSetupError::ClientCert { .. } => "cert_file",
            TlsSetupError::ClientKey { .. } => "key_file",
            TlsSetupError::ClientPair { missing } => missing,
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
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let config = match client_identity(cfg)? {
            Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
            None => builder.with_no_client_auth(),
        };
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

/// The client certificate chain and key of `cert_file` and `key_file` (PEM), when both are set.
type ClientIdentity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn client_identity(
    cfg: Option<&UpstreamTlsConfig>,
) -> Result<Option<ClientIdentity>, TlsSetupError> {
    let (cert, key) = match cfg.map(|c| (c.cert_file.as_deref(), c.key_file.as_deref())) {
        Some((Some(c), Some(k))) => (c, k),
        Some((Some(_), None)) => {
            return Err(TlsSetupError::ClientPair {
                missing: "key_file",
            });
        }
        Some((None, Some(_))) => {
            return Err(TlsSetupError::ClientPair {
                missing: "cert_file",
            });
        }
        _ => return Ok(None),
    };
    let cert_name = cert.display().to_string();
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsSetupError::ClientCert {
            file: cert_name.clone(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsSetupError::ClientCert {
            file: cert_name,
            message: "no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsSetupError::ClientKey {
        file: key.display().to_string(),
        message: e.to_string(),
    })?;
    Ok(Some((chain, key)))
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
    /// PEM certificate (chain) tokenwatch presents when the endpoint asks for one (mutual TLS),
    /// with `key_file`, its PEM private key (PKCS#8, PKCS#1 or SEC1).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn tls(ca: Option<&Path>, name: Option<&str>) -> Result<UpstreamTls, TlsSetupError> {
        UpstreamTls::new(Some(&UpstreamTlsConfig {
            ca_file: ca.map(PathBuf::from),
            server_name: name.map(str::to_string),
            ..Default::default()
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

    /// A test CA and a certificate it signs for `localhost` (PEM certificate, PEM key).
    fn ca_and_leaf(
        cn: &str,
    ) -> (
        rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
        String,
        String,
    ) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let (cert, key) = leaf(&ca, cn);
        (ca, cert, key)
    }

    fn leaf(ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>, cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// An https server on loopback that requires a client certificate signed by `client_ca`
    /// and answers every request 200 with the client's certificate count.
    async fn mtls_server(
        cert_pem: &str,
        key_pem: &str,
        client_ca_pem: &str,
    ) -> std::net::SocketAddr {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = [0u8; 4096];
                    let _ = tls.read(&mut buf).await;
                    let _ = tls
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                        )
                        .await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_client_certificate_is_presented_to_an_endpoint_that_requires_one() {
        let dir = tempfile::tempdir().unwrap();
        let (server_ca, server_cert, server_key) = ca_and_leaf("server");
        let (client_ca, client_cert, client_key) = ca_and_leaf("tokenwatch");
        let addr = mtls_server(&server_cert, &server_key, &client_ca.pem()).await;
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let ca_file = write("ca.pem", &server_ca.pem());
        let (cert_file, key_file) = (write("c.pem", &client_cert), write("k.pem", &client_key));
        let get = |tls: UpstreamTls| async move {
            let client = tls.client(
                &Client::builder(hyper_util::rt::TokioExecutor::new()),
                Duration::from_secs(5),
            );
            let uri: Uri = format!("https://localhost:{}/", addr.port())
                .parse()
                .unwrap();
            client.get(uri).await.map(|r| r.status().as_u16())
        };
        let with = UpstreamTls::new(Some(&UpstreamTlsConfig {
            ca_file: Some(ca_file.clone()),
            cert_file: Some(cert_file.clone()),
            key_file: Some(key_file.clone()),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(get(with).await.unwrap(), 200);
        // Without one, the server refuses the handshake.
        let without = UpstreamTls::new(Some(&UpstreamTlsConfig {
            ca_file: Some(ca_file.clone()),
            ..Default::default()
        }))
        .unwrap();
        assert!(get(without).await.is_err());
        // One signed by another CA is refused too.
        let (other_ca, _, _) = ca_and_leaf("other");
        let (other_cert, other_key) = leaf(&other_ca, "stranger");
        let stranger = UpstreamTls::new(Some(&UpstreamTlsConfig {
            ca_file: Some(ca_file),
            cert_file: Some(write("oc.pem", &other_cert)),
            key_file: Some(write("ok.pem", &other_key)),
            ..Default::default()
        }))
        .unwrap();
        assert!(get(stranger).await.is_err());
    }

    #[test]
    fn client_certificate_errors_name_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "nothing here\n").unwrap();
        let cfg = |cert: Option<&Path>, key: Option<&Path>| UpstreamTlsConfig {
            cert_file: cert.map(PathBuf::from),
            key_file: key.map(PathBuf::from),
            ..Default::default()
        };
        let e = UpstreamTls::new(Some(&cfg(Some(&junk), None))).unwrap_err();
        assert_eq!(e.key(), "key_file", "{e}");
        let e = UpstreamTls::new(Some(&cfg(None, Some(&junk)))).unwrap_err();
        assert_eq!(e.key(), "cert_file", "{e}");
        let e = UpstreamTls::new(Some(&cfg(Some(&junk), Some(&junk)))).unwrap_err();
        assert_eq!(e.key(), "cert_file", "{e}");
        assert!(e.to_string().contains("junk.pem"), "{e}");
        let (_, cert, _) = ca_and_leaf("x");
        let good = dir.path().join("c.pem");
        std::fs::write(&good, cert).unwrap();
        let e = UpstreamTls::new(Some(&cfg(Some(&good), Some(&junk)))).unwrap_err();
        assert_eq!(e.key(), "key_file", "{e}");
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
