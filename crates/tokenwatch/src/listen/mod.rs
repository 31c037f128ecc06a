// Serving tokenwatch's listeners: axum routers and the OTLP gRPC server over plain TCP or TLS,
// TCP_NODELAY on every connection, TLS handshakes in their own tasks with a deadline.

pub mod tls;

use axum::serve::ListenerExt;
use rustls::ServerConfig;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once per listener; beyond it, accepting waits for one to end.
const MAX_HANDSHAKES: usize = 1024;
/// The first byte of a TLS record carrying a handshake message (ClientHello).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

const PLAIN_HTTP_REPLY: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: 57\r\n\r\nthis port speaks TLS only: use https:// to connect to it\n";

fn set_nodelay(tcp: &TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY on an accepted connection");
    }
}

/// Serve `app` on `listener` (TLS when `tls` is set) until `stop` turns true. Nagle's algorithm
/// is off on every connection: each small SSE chunk would otherwise wait for the client's
/// (delayed) ACK of the previous one, adding up to ~40 ms per token on the proxy. Handlers and
/// layers can read the peer's address as `axum::extract::ConnectInfo<SocketAddr>`, TLS or not.
pub async fn serve_router(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    app: axum::Router,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
) {
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let result = match tls {
        None => {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener.tap_io(|tcp| set_nodelay(tcp)), app)
                .with_graceful_shutdown(stopped)
                .await
        }
        Some(config) => {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            // A no-op tap: axum provides `ConnectInfo<SocketAddr>` for tapped listeners (the
            // orphan rule keeps it from being implemented here for `TlsListener` itself).
            let listener = TlsListener::new(listener, config).tap_io(|_| {});
            axum::serve(listener, app).with_graceful_shutdown(stopped).await
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, listener = what, "server stopped with an error");
    }
}

/// A TCP listener yielding TLS streams. Each accepted connection gets TCP_NODELAY and its
/// handshake runs in a task of its own, on the runtime polling `accept` (for the proxy: the
/// proxy's runtime), so a slow or silent client never holds up the next one. A client
/// speaking plain HTTP gets a 400 saying the port speaks TLS, and is closed.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> TlsListener {
        TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(config),
            handshakes: JoinSet::new(),
        }
    }

    /// The next connection whose handshake succeeded.
    pub async fn accept_tls(&mut self) -> (TlsStream<TcpStream>, SocketAddr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept(), if self.handshakes.len() < MAX_HANDSHAKES => match accepted {
                    Ok((tcp, peer)) => {
                        set_nodelay(&tcp);
                        self.handshakes.spawn(handshake(self.acceptor.clone(), tcp, peer));
                    }
                    Err(e) => accept_failed(e).await,
                },
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(conn)) = done {
                        return conn;
                    }
                }
            }
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.accept_tls().await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// As axum and hyper do: a failed accept of one connection is skipped; anything else (out of
/// file descriptors) is logged and accepting pauses for a second.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::*;
    if matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset) {
        return;
    }
    tracing::error!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

async fn handshake(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Option<(TlsStream<TcpStream>, SocketAddr)> {
    let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut first = [0u8; 1];
        match tcp.peek(&mut first).await {
            Ok(0) => return Err("closed before the handshake".to_string()),
            Ok(_) if first[0] != TLS_HANDSHAKE_RECORD => {
                let mut tcp = tcp;
                let _ = tcp.write_all(PLAIN_HTTP_REPLY).await;
                let _ = tcp.shutdown().await;
                return Err("not TLS (plain HTTP?): answered 400".to_string());
            }
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        acceptor.accept(tcp).await.map_err(|e| e.to_string())
    })
    .await;
    match outcome {
        Ok(Ok(tls)) => Some((tls, peer)),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// A TLS connection for tonic, which asks each connection for its addresses.
pub struct GrpcTlsConn(TlsStream<TcpStream>);

impl tonic::transport::server::Connected for GrpcTlsConn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let tcp = self.0.get_ref().0;
        tonic::transport::server::TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: tcp.peer_addr().ok(),
        }
    }
}

impl AsyncRead for GrpcTlsConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcTlsConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// TLS connections of `listener` as the incoming stream tonic's server takes.
pub fn grpc_tls_incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> impl futures_util::Stream<Item = io::Result<GrpcTlsConn>> + Send + 'static {
    futures_util::stream::unfold(TlsListener::new(listener, config), |mut l| async move {
        let (conn, _) = l.accept_tls().await;
        Some((Ok(GrpcTlsConn(conn)), l))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listen::tls::{CertSource, ReloadingCert};
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio::io::AsyncReadExt;

    /// A self-signed certificate for localhost written to `dir`, and a server config using it.
    fn server_config(dir: &std::path::Path) -> (Arc<ServerConfig>, CertificateDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let src = CertSource {
            key: "tls".into(),
            cert_file: dir.join("c.pem"),
            key_file: dir.join("k.pem"),
        };
        std::fs::write(&src.cert_file, cert.pem()).unwrap();
        std::fs::write(&src.key_file, key.serialize_pem()).unwrap();
        let resolver = Arc::new(ReloadingCert::load(src).unwrap());
        let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(resolver);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        (Arc::new(config), cert.der().clone())
    }

    #[tokio::test]
    async fn tls_router_answers_with_the_peer_address_and_refuses_plain_http() {
        let dir = tempfile::tempdir().unwrap();
        let (config, cert) = server_config(dir.path());
        let app = axum::Router::new().route(
            "/peer",
            axum::routing::get(
                |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>| async move {
                    peer.ip().to_string()
                },
            ),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop) = watch::channel(false);
        let server = tokio::spawn(serve_router(listener, Some(config), app, stop, "test"));

        // A silent client does not hold up the next one; plain HTTP gets a 400 and is closed.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain.write_all(b"GET /peer HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer, PLAIN_HTTP_REPLY);

        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .unwrap();
        tls.write_all(b"GET /peer HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("127.0.0.1"),
            "{answer}"
        );

        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }
}
