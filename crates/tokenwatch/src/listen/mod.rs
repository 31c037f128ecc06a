// Serving tokenwatch's listeners: axum routers (under the request limits of `limits`) and the
// OTLP gRPC server over plain TCP or TLS, TCP_NODELAY on every connection, TLS handshakes in
// their own tasks with a deadline, each connection's protocol told before hyper reads from it.

pub mod browser;
pub mod limits;
pub mod tls;

use axum::serve::ListenerExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
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

/// Serve `app` on `listener` (TLS when `tls` is set) until `stop` turns true, under `guard`'s
/// request limits. Nagle's algorithm is off on every connection: each small SSE chunk would
/// otherwise wait for the client's (delayed) ACK of the previous one, adding up to ~40 ms per
/// token on the proxy. Handlers and layers can read the peer's address as
/// `axum::extract::ConnectInfo<SocketAddr>`, TLS or not.
///
/// Connections are served by hyper's auto builder (HTTP/1.1, and HTTP/2 by ALPN or prior
/// knowledge) rather than `axum::serve`, which cannot set hyper's head limits: those are set
/// above the configured ones (hyper's own 431 has no body and is not counted), and the
/// configured ones are checked per request by `Guard::check_head`, a sum over the parsed
/// headers (cheap on the proxy's hot path, unlike a layer buffering anything).
pub async fn serve_router(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    app: axum::Router,
    stop: watch::Receiver<bool>,
    guard: limits::Guard,
) {
    let what = guard.listener;
    let local = listener.local_addr();
    match tls {
        None => serve_connections(listener.tap_io(|tcp| set_nodelay(tcp)), app, stop, guard).await,
        Some(config) => {
            serve_connections(TlsListener::new(listener, config), app, stop, guard).await
        }
    }
    tracing::debug!(listener = what, addr = ?local, "server stopped");
}

/// The HTTP/2 connection preface: a client speaking HTTP/2 without TLS starts with it.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a new connection speaks, told without consuming any of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Protocol {
    Http1,
    Http2,
    /// Not told yet (a partial HTTP/2 preface, no ALPN over TLS, an error): hyper_util's auto
    /// detection reads it.
    Unknown,
}

impl Protocol {
    /// The protocol of a plain-TCP connection whose first bytes are `first`.
    fn of_first_bytes(first: &[u8]) -> Protocol {
        if first.is_empty() {
            Protocol::Unknown
        } else if !H2_PREFACE.starts_with(first) {
            Protocol::Http1
        } else if first.len() == H2_PREFACE.len() {
            Protocol::Http2
        } else {
            Protocol::Unknown
        }
    }
}

/// Connections that can tell their protocol before hyper reads from them. Serving a told
/// connection with hyper's own HTTP/1 or HTTP/2 server, rather than hyper_util's auto detection,
/// keeps hyper's HTTP/1 read buffer at its initial 8 KiB: the auto detection hands hyper the
/// 24 bytes it read as a separate first read, and hyper then doubles its buffer to 16 KiB to
/// read the rest of the head, on every connection and for as long as the connection lives.
pub trait Sniff {
    fn sniff(&self) -> impl std::future::Future<Output = Protocol> + Send;
}

impl Sniff for TcpStream {
    /// The first bytes, peeked (waits for the client's first bytes, as reading would).
    async fn sniff(&self) -> Protocol {
        let mut first = [0u8; H2_PREFACE.len()];
        match self.peek(&mut first).await {
            Ok(n) => Protocol::of_first_bytes(&first[..n]),
            Err(_) => Protocol::Unknown,
        }
    }
}

impl Sniff for TlsStream<TcpStream> {
    /// The protocol ALPN chose in the handshake.
    fn sniff(&self) -> impl std::future::Future<Output = Protocol> + Send {
        let protocol = match self.get_ref().1.alpn_protocol() {
            Some(b"h2") => Protocol::Http2,
            Some(b"http/1.1") => Protocol::Http1,
            _ => Protocol::Unknown,
        };
        std::future::ready(protocol)
    }
}

/// hyper's connection builders for `limits`: HTTP/1.1 and HTTP/2 for told connections, and
/// the auto-detecting one (both protocols, the same settings) for the rest.
struct ConnBuilders {
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
    auto: ConnBuilder<TokioExecutor>,
}

impl ConnBuilders {
    fn new(limits: &limits::LimitsConfig) -> ConnBuilders {
        let max_buf = limits.hyper_max_buf_size();
        let max_headers = limits.hyper_max_headers();
        let h2_list = u32::try_from(max_buf).unwrap_or(u32::MAX);
        let head_deadline = limits.header_read_timeout.0;
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .max_buf_size(max_buf)
            .max_headers(max_headers)
            .timer(TokioTimer::new())
            .header_read_timeout(head_deadline);
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        http2
            .enable_connect_protocol()
            .max_header_list_size(h2_list);
        let mut auto = ConnBuilder::new(TokioExecutor::new());
        auto.http1()
            .max_buf_size(max_buf)
            .max_headers(max_headers)
            .timer(TokioTimer::new())
            .header_read_timeout(head_deadline);
        auto.http2()
            .enable_connect_protocol()
            .max_header_list_size(h2_list);
        ConnBuilders { http1, http2, auto }
    }
}

/// Serve one connection until it ends; once `shutting_down` resolves it finishes its requests
/// and closes (`graceful` starts that).
async fn drive<C, E>(
    conn: C,
    graceful: impl Fn(Pin<&mut C>),
    mut shutting_down: Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    C: std::future::Future<Output = Result<(), E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut conn = std::pin::pin!(conn);
    let mut graceful_started = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => return result.map_err(Into::into),
            _ = &mut shutting_down, if !graceful_started => {
                graceful_started = true;
                graceful(conn.as_mut());
            }
        }
    }
}

/// Accept until `stop`, each connection in a task of its own; then let the connections finish
/// their requests (graceful shutdown) and return once all have closed.
async fn serve_connections<L>(
    mut listener: L,
    app: axum::Router,
    mut stop: watch::Receiver<bool>,
    guard: limits::Guard,
) where
    L: axum::serve::Listener<Addr = SocketAddr>,
    L::Io: Sniff,
{
    let builders = Arc::new(ConnBuilders::new(&guard.limits));
    // Receivers dropped at shutdown: connections see `closed()` and shut down gracefully.
    let (signal_tx, signal_rx) = watch::channel(());
    // One receiver per live connection: `closed()` resolves once all are gone.
    let (close_tx, close_rx) = watch::channel(());
    loop {
        let (io, peer) = tokio::select! {
            conn = listener.accept() => conn,
            _ = stop.wait_for(|s| *s) => break,
        };
        // Over `max_connections`: closed at once (dropped), counted.
        let Some(permit) = guard.admit() else {
            drop(io);
            continue;
        };
        let service = connection_service(app.clone(), guard.clone(), peer);
        let conn_guard = guard.clone();
        let head_deadline = guard.limits.header_read_timeout.0;
        let builders = builders.clone();
        let signal_tx = signal_tx.clone();
        let close_rx = close_rx.clone();
        tokio::spawn(async move {
            let mut shutting_down = std::pin::pin!(signal_tx.closed());
            // Shutting down before the client sent anything closes the connection at once.
            // A client that sends nothing within `header_read_timeout` is closed (hyper keeps
            // the same deadline for each request head after that).
            let protocol = tokio::select! {
                protocol = tokio::time::timeout(head_deadline, io.sniff()) => match protocol {
                    Ok(protocol) => protocol,
                    Err(_) => {
                        conn_guard.count(limits::Reason::HeaderTimeout);
                        return drop((close_rx, permit));
                    }
                },
                _ = &mut shutting_down => return drop((close_rx, permit)),
            };
            let io = TokioIo::new(io);
            let shutting_down = shutting_down.as_mut();
            // The task is sized for its largest state, kept for the connection's life: the
            // HTTP/2 and auto-detecting connections (twice an HTTP/1 one) live in a box of
            // their own, so the HTTP/1 connections that carry most streams stay small.
            let result = match protocol {
                Protocol::Http1 => {
                    let conn = builders.http1.serve_connection(io, service).with_upgrades();
                    drive(conn, |c| c.graceful_shutdown(), shutting_down).await
                }
                Protocol::Http2 => {
                    let conn = builders.http2.serve_connection(io, service);
                    Box::pin(drive(conn, |c| c.graceful_shutdown(), shutting_down)).await
                }
                Protocol::Unknown => {
                    let conn = builders.auto.serve_connection_with_upgrades(io, service);
                    Box::pin(drive(conn, |c| c.graceful_shutdown(), shutting_down)).await
                }
            };
            if let Err(e) = result {
                if hyper_cause(e.as_ref(), hyper::Error::is_parse_too_large) {
                    // hyper answered its own bare 431 (a head over the backstop).
                    conn_guard.count(limits::Reason::HeadersTooLarge);
                } else if hyper_cause(e.as_ref(), hyper::Error::is_timeout) {
                    conn_guard.count(limits::Reason::HeaderTimeout);
                }
                tracing::trace!(%peer, error = %e, "connection ended with an error");
            }
            drop((close_rx, permit));
        });
    }
    drop(listener);
    drop(signal_rx);
    drop(close_rx);
    close_tx.closed().await;
}

/// Whether a connection ended on a hyper error that `is` — its own bare 431 for a head over
/// its limits (`hyper::Error::is_parse_too_large`), or `header_read_timeout` passing before a
/// whole request head arrived (`hyper::Error::is_timeout`) — anywhere in the error's chain.
fn hyper_cause(e: &(dyn std::error::Error + 'static), is: fn(&hyper::Error) -> bool) -> bool {
    let mut source = Some(e);
    while let Some(err) = source {
        if err.downcast_ref::<hyper::Error>().is_some_and(is) {
            return true;
        }
        source = err.source();
    }
    false
}

/// The per-connection service: the peer's address for `ConnectInfo`, the head check, and the
/// count of bodies refused by the handlers.
fn connection_service(
    app: axum::Router,
    guard: limits::Guard,
    peer: SocketAddr,
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl std::future::Future<
        Output = Result<axum::response::Response, std::convert::Infallible>,
    > + Send,
> + Clone
+ Send
+ 'static {
    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let mut app = app.clone();
        let guard = guard.clone();
        async move {
            if let Some(refused) = guard.check_head(&req) {
                return Ok(refused);
            }
            let mut req = req.map(axum::body::Body::new);
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            // A Router is always ready (`poll_ready` is `Ready(Ok)`), as axum::serve relies on too.
            let resp = tower_service::Service::call(&mut app, req).await?;
            guard.observe(&resp);
            Ok(resp)
        }
    })
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
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
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
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcTlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
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
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_cert_resolver(resolver);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        (Arc::new(config), cert.der().clone())
    }

    #[tokio::test]
    async fn plain_router_refuses_large_heads_with_431_and_keeps_serving() {
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = crate::kernel::telemetry::Metrics::new();
        let limits = limits::LimitsConfig {
            max_header_bytes: 4096,
            max_headers: 10,
            ..limits::LimitsConfig::default()
        };
        let guard = limits::Guard::new("proxy", &limits, &metrics);
        let (stop_tx, stop) = watch::channel(false);
        let server = tokio::spawn(serve_router(listener, None, app, stop, guard));

        async fn exchange(addr: SocketAddr, head: String) -> String {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(head.as_bytes()).await.unwrap();
            let mut answer = String::new();
            tokio::time::timeout(Duration::from_secs(5), tcp.read_to_string(&mut answer))
                .await
                .unwrap()
                .unwrap();
            answer
        }
        let big = format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "b".repeat(6000)
        );
        let answer = exchange(addr, big).await;
        assert!(
            answer.starts_with("HTTP/1.1 431") && answer.contains("limits.max_header_bytes"),
            "{answer}"
        );
        let answer = exchange(
            addr,
            "GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".into(),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
            "{answer}"
        );
        let text = metrics.encode();
        assert!(text.contains(r#"tokenwatch_rejected_requests_total{listener="proxy",reason="headers_too_large"} 1"#), "{text}");
        // Over hyper's own backstop, hyper answers its bare 431 before the guard sees the
        // request; the connection's end still counts it.
        let huge = format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "b".repeat(limits.hyper_max_buf_size() + 1)
        );
        // hyper may close with unread bytes (a reset), so the answer is read as far as it comes.
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let _ = tcp.write_all(huge.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );
        let counted = async {
            loop {
                let text = metrics.encode();
                if text.contains(r#"tokenwatch_rejected_requests_total{listener="proxy",reason="headers_too_large"} 2"#) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), counted)
            .await
            .expect("the backstop's 431 was not counted");

        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn first_bytes_tell_http1_from_the_http2_preface() {
        assert_eq!(
            Protocol::of_first_bytes(b"POST /v1/chat/completions HTTP/1.1\r\n"),
            Protocol::Http1
        );
        assert_eq!(Protocol::of_first_bytes(b"G"), Protocol::Http1);
        // "PRI" is also how an HTTP/1 method could start: only the whole preface is HTTP/2.
        assert_eq!(
            Protocol::of_first_bytes(b"PRI * HTTP/2.0\r\n"),
            Protocol::Unknown
        );
        assert_eq!(Protocol::of_first_bytes(b"PRIX"), Protocol::Http1);
        assert_eq!(Protocol::of_first_bytes(H2_PREFACE), Protocol::Http2);
        assert_eq!(Protocol::of_first_bytes(b""), Protocol::Unknown);
    }

    #[tokio::test]
    async fn plain_router_serves_http1_http2_prior_knowledge_and_a_preface_sent_in_pieces() {
        use http_body_util::{BodyExt, Empty};
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(|req: axum::extract::Request| async move {
                format!("{:?}", req.version())
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop) = watch::channel(false);
        let guard = limits::Guard::new(
            "api",
            &Default::default(),
            &crate::kernel::telemetry::Metrics::new(),
        );
        let server = tokio::spawn(serve_router(listener, None, app, stop, guard));

        // HTTP/1.1, two requests on one connection.
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), tcp.read_to_string(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer.matches("HTTP/1.1 200").count(), 2, "{answer}");
        assert!(answer.ends_with("HTTP/1.1"), "{answer}");

        // HTTP/2 with prior knowledge: whole preface first, then in two pieces (told by hyper_util).
        for split in [None, Some(5)] {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            if let Some(at) = split {
                tcp.write_all(&H2_PREFACE[..at]).await.unwrap();
                tcp.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let io = TokioIo::new(Prefixed {
                sent: split.map(|at| &H2_PREFACE[..at]),
                tcp,
            });
            let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = http::Request::get(format!("http://{addr}/"))
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(5), send.send_request(req))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(resp.status(), http::StatusCode::OK);
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"HTTP/2.0", "split {split:?}");
        }

        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }

    /// A client socket whose first bytes were already written by the test: the HTTP/2 client
    /// writes its whole preface, so the part sent is skipped once.
    struct Prefixed {
        sent: Option<&'static [u8]>,
        tcp: TcpStream,
    }

    impl AsyncRead for Prefixed {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.tcp).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Prefixed {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if let Some(sent) = self.sent {
                // The preface is written first and whole (hyper's h2 client writes it in one piece).
                assert!(
                    buf.starts_with(sent),
                    "the client did not start with the preface"
                );
                let rest = &buf[sent.len()..];
                let n = std::task::ready!(Pin::new(&mut self.tcp).poll_write(cx, rest))?;
                self.sent = None;
                return Poll::Ready(Ok(n + sent.len()));
            }
            Pin::new(&mut self.tcp).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.tcp).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.tcp).poll_shutdown(cx)
        }
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
        let guard = limits::Guard::new(
            "api",
            &Default::default(),
            &crate::kernel::telemetry::Metrics::new(),
        );
        let server = tokio::spawn(serve_router(listener, Some(config), app, stop, guard));

        // A silent client does not hold up the next one; plain HTTP gets a 400 and is closed.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"GET /peer HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer, PLAIN_HTTP_REPLY);

        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
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
