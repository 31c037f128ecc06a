// The proxy as a source: binds `proxy.listen`, serves the proxy on the request-path runtime on a
// stop of its own (at shutdown it drains first, while everything downstream still runs), and
// sends every request's record into the records port. What shutdown and reloads need of it (its
// stop, its task, its state) comes back as the handle's request path.

use super::config::ProxyConfig;
use super::{ProxyState, UpstreamRouter};
use crate::sources::{SourceContext, SourceHandle, StartFuture};
use anyhow::Context;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The proxy's listener as shutdown meets it: its own stop, its task, what it has in flight.
pub struct ProxyServer {
    pub stop: watch::Sender<bool>,
    pub task: JoinHandle<()>,
    pub state: Arc<ProxyState>,
}

/// What the proxy serves with, besides the ports: its section and the ones it reads beside it.
pub struct ProxySettings {
    pub proxy: ProxyConfig,
    pub capture: crate::capture::CaptureConfig,
    pub limits: crate::listen::limits::LimitsConfig,
}

impl ProxyServer {
    /// Bind `proxy.listen` and serve the proxy on `runtime`, on a stop of its own. Returns the
    /// bound address too.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        settings: &ProxySettings,
        routes: UpstreamRouter,
        queue: crate::kernel::queue::TelemetryQueue,
        salt: Vec<u8>,
        splits: Arc<crate::kernel::splits::SplitBoard>,
        runtime: &tokio::runtime::Handle,
        tls: Option<Arc<rustls::ServerConfig>>,
        metrics: &crate::kernel::telemetry::Metrics,
    ) -> anyhow::Result<(SocketAddr, ProxyServer)> {
        let listen = settings.proxy.listen;
        let listener = std::net::TcpListener::bind(listen)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .with_context(|| {
                format!("cannot listen on {listen} (proxy.listen / --proxy-listen)")
            })?;
        let addr = listener.local_addr()?;
        for r in routes.routes() {
            tracing::info!(upstream = %r.instance, runtime = %r.runtime, "proxy route");
        }
        let budget =
            crate::listen::limits::BodyBudget::new(settings.limits.max_buffered_body_bytes);
        budget.register(metrics);
        let state = Arc::new(
            ProxyState::new(&settings.proxy, routes, queue, salt, splits)
                .with_capture(&settings.capture)
                .with_body_budget(budget),
        );
        let guard = crate::listen::limits::Guard::new("proxy", &settings.limits, metrics);
        let (stop, stopped) = watch::channel(false);
        let app = super::router(state.clone());
        // A tokio socket is driven by the runtime it was registered with: binding it here would
        // put the proxy's I/O on the caller's threads. The TLS handshakes of proxied connections
        // run on that runtime too: they are spawned by the accept loop.
        let task = runtime.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    crate::listen::serve_router(listener, tls, app, stopped, guard).await
                }
                Err(e) => {
                    tracing::error!(error = %e, "the proxy listener could not join its runtime")
                }
            }
        });
        Ok((addr, ProxyServer { stop, task, state }))
    }
}

/// The proxy of `role: all`: forwards to its routes; or, without routes or as an aggregator,
/// shows why it is off.
pub struct ProxySource {
    pub settings: ProxySettings,
    /// The routes, built from `proxy.upstreams` and `proxy.routes`.
    pub routes: UpstreamRouter,
    /// The tenant salt (`proxy.tenant_salt`, else the data directory's own).
    pub salt: Vec<u8>,
    /// Why the proxy does not run (`/readyz` shows it), or None.
    pub off: Option<&'static str>,
}

impl ProxySource {
    /// The proxy `proxy` asks for: off as an aggregator (the replicas' records arrive over
    /// OTLP) or without an upstream (collector-only). The tenant salt is `proxy.tenant_salt`, or
    /// made once in `data_dir` and kept there.
    pub fn from_config(
        proxy: &ProxyConfig,
        capture: &crate::capture::CaptureConfig,
        limits: &crate::listen::limits::LimitsConfig,
        data_dir: &std::path::Path,
        aggregator: bool,
    ) -> anyhow::Result<ProxySource> {
        let routes = UpstreamRouter::new(&proxy.upstreams)
            .and_then(|r| r.with_splits(&proxy.routes))
            .map_err(anyhow::Error::msg)?;
        let off = if aggregator {
            Some("role aggregator (the proxy replicas' records arrive over OTLP)")
        } else if routes.is_empty() {
            Some("no upstream configured (collector-only mode)")
        } else {
            None
        };
        let salt = if off.is_some() {
            Vec::new()
        } else if proxy.tenant_salt.is_empty() {
            super::identity::load_or_create_salt(data_dir)
                .with_context(|| format!("creating the tenant salt in {}", data_dir.display()))?
        } else {
            proxy.tenant_salt.clone().into_bytes()
        };
        Ok(ProxySource {
            settings: ProxySettings {
                proxy: proxy.clone(),
                capture: capture.clone(),
                limits: limits.clone(),
            },
            routes,
            salt,
            off,
        })
    }
}

impl crate::sources::Source for ProxySource {
    fn name(&self) -> &'static str {
        "proxy"
    }

    fn start(self: Box<Self>, ctx: SourceContext) -> StartFuture {
        Box::pin(async move {
            let mut handle = SourceHandle {
                tasks: Vec::new(),
                routes: None,
                listening: Vec::new(),
                request_path: None,
            };
            if let Some(why) = self.off {
                ctx.host.components.set("proxy", format!("disabled: {why}"));
                return Ok(handle);
            }
            let (addr, server) = ProxyServer::start(
                &self.settings,
                self.routes,
                ctx.records.queue,
                self.salt,
                ctx.records.splits,
                &ctx.host.request_runtime,
                ctx.listen.tls.proxy.clone(),
                &ctx.host.metrics,
            )?;
            ctx.host.reload.set_proxy(server.state.clone());
            ctx.host.components.set("proxy", "ok");
            handle.listening.push(("proxy", addr));
            handle.request_path = Some(server);
            Ok(handle)
        })
    }
}
