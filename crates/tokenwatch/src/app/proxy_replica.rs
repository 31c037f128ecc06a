// `tokenwatch run --role proxy`: a thin proxy replica. The proxy on its own runtime, exactly
// as in `role: all` (it forwards every byte as it comes and times every chunk); a pipeline with
// no aggregation whose sinks ship each record to the aggregator (`aggregator:`, over OTLP) and,
// when `export.otlp` is set, its span to a tracing backend; and an API port with `/metrics`,
// `/healthz`, `/readyz` and `POST /-/reload` only. No store, no detectors, no OTLP receiver, no
// scrapes: those are the aggregator's. SIGHUP and `POST /-/reload` reload the file through the
// same machinery as `role: all` (`crate::reload`): routes apply in place, the aggregator's
// sections are reported as not used, every other changed key as needing a restart. Nothing here can slow a forwarded byte: records leave the proxy through
// the never-waiting telemetry queue, and shipping runs on the analysis runtime.

use super::{OwnedRuntime, RunningApp, serve};
use crate::config::Config;
use crate::kernel::telemetry::Metrics;
use crate::pipeline::{Pipeline, PipelineConfig, ProxySpanBuilder, ProxySpanSink, RecordSink};
use crate::sources::Components;
use crate::sources::proxy::UpstreamRouter;
use crate::sources::proxy::source::{ProxyServer, ProxySettings};
use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

impl RunningApp {
    /// Start a proxy replica (`role: proxy`; the configuration was validated for it: upstreams,
    /// `aggregator` and the shared `proxy.tenant_salt` are set). Returns once it listens.
    pub(super) async fn start_proxy_replica(
        cfg: Config,
        reload_source: Option<crate::reload::ConfigSource>,
    ) -> anyhow::Result<RunningApp> {
        if let Some((key, message)) = cfg.exposure_problem() {
            anyhow::bail!("{key}: {message}");
        }
        let link = cfg
            .aggregator
            .as_ref()
            .context("aggregator: role proxy ships its records to an aggregator: set aggregator.endpoint (or --aggregator URL)")?;
        anyhow::ensure!(
            !cfg.proxy.tenant_salt.is_empty(),
            "proxy.tenant_salt: role proxy needs the salt every replica shares"
        );
        let auth = crate::auth::AuthHandle::from_config(&cfg.auth)?;
        let browser = super::browser_policy(&cfg)?;
        let tls = Arc::new(
            cfg.listener_certs()
                .and_then(|certs| {
                    crate::listen::tls::ServerTls::load(certs, cfg.tls.reload_interval.0)
                })
                .map_err(anyhow::Error::msg)?,
        );
        let analysis = OwnedRuntime(Some(
            crate::runtimes::analysis_runtime(&cfg.runtime)
                .context("starting the analysis runtime")?,
        ));
        let proxy_rt = OwnedRuntime(Some(
            crate::runtimes::proxy_runtime(&cfg.runtime).context("starting the proxy runtime")?,
        ));
        let analysis_priority = crate::runtimes::analysis_priority(&cfg.runtime);
        let metrics = Arc::new(Metrics::new());
        auth.register(&metrics);
        let (shutdown, stop) = watch::channel(false);

        // Shipping and export run on the analysis runtime, never the proxy's.
        let in_analysis = analysis.handle().enter();
        let builder = ProxySpanBuilder::new(&cfg.proxy.upstreams);
        let mut shipper = crate::export::otlp::ship::start(link, builder.clone(), &metrics)?;
        let otlp_export = crate::export::otlp::start(cfg.export.otlp.as_ref(), &metrics)?;
        let mut sinks: Vec<Box<dyn RecordSink>> = Vec::new();
        if let Some(sink) = shipper.take_sink() {
            sinks.push(Box::new(sink));
        }
        if let Some(export) = &otlp_export {
            sinks.push(Box::new(ProxySpanSink::export_only(
                builder,
                export.handle(),
            )));
        }
        let model_aliases: crate::kernel::models::SharedAliases = Arc::new(
            cfg.models
                .aliases()
                .map_err(|(key, message)| anyhow::anyhow!("configuration {key}: {message}"))?,
        );
        let components = Components::default();
        let (pipeline, queue) = Pipeline::start(
            PipelineConfig {
                queue_capacity: cfg.telemetry.queue_capacity,
                batch_max: cfg.telemetry.batch_max,
                flush_interval: cfg.telemetry.flush_interval.0,
                maintenance_interval: Duration::from_secs(600),
                thread_priority: analysis_priority,
                text_capture: None,
                model_aliases,
                // The aggregator admits model ids, for every replica at once.
                model_admission: None,
                // The aggregator prices the records.
                prices: Default::default(),
                record_identity: None,
                health: Some(components.clone()),
            },
            None,
            sinks,
            metrics.clone(),
        );
        let queue = crate::embed::start(&cfg.capture, queue, &metrics, analysis_priority)?;
        drop(in_analysis);

        let mut servers = Vec::new();
        servers.extend(tls.spawn_reloader(stop.clone()));
        // A replica keeps no audit log; the reload is logged.
        servers.extend(auth.spawn_reload(stop.clone(), |_| {}));
        components.set(
            "ship",
            format!("ok: records go to the aggregator at {}", link.endpoint),
        );

        let routes = UpstreamRouter::new(&cfg.proxy.upstreams)
            .and_then(|r| r.with_splits(&cfg.proxy.routes))
            .map_err(anyhow::Error::msg)?;
        let salt = cfg.proxy.tenant_salt.clone().into_bytes();
        let settings = ProxySettings {
            proxy: cfg.proxy.clone(),
            capture: cfg.capture.clone(),
            limits: cfg.limits.clone(),
        };
        let (proxy_addr, proxy_server) = ProxyServer::start(
            &settings,
            routes,
            queue,
            salt,
            Arc::default(),
            proxy_rt.handle(),
            tls.proxy.clone(),
            &metrics,
        )?;
        components.set("proxy", "ok");

        // Reload (SIGHUP, `POST /-/reload`): the routes in place, as in `role: all`.
        let reloader = Arc::new(crate::reload::Reloader::new(
            reload_source,
            cfg.clone(),
            crate::reload::Handles {
                proxy: Some(proxy_server.state.clone()),
                engine: None,
                hooks: Default::default(),
                audit: Default::default(),
                replica: true,
            },
            &metrics,
        ));
        match crate::reload::spawn_sighup(reloader.clone(), stop.clone()) {
            Some(task) => servers.push(task),
            None => servers.extend(spawn_sighup_notice(stop.clone())),
        }
        let listener = super::bind(cfg.listen, "listen / --listen").await?;
        let api_addr = listener.local_addr()?;
        let api_guard = crate::listen::limits::Guard::new("api", &cfg.limits, &metrics);
        let app = crate::api::health::router(metrics.clone(), components.clone())
            .merge(crate::reload::router(reloader));
        let app = crate::auth::http::protect_api(app, &auth);
        let app = crate::listen::browser::protect(
            app,
            crate::listen::browser::BrowserGuard::new(&browser, api_addr, true, &api_guard),
        );
        servers.push(serve(listener, tls.api.clone(), app, stop, api_guard));
        let in_flight_gauge = super::in_flight_gauge(&metrics);
        tracing::info!(
            aggregator = %link.endpoint,
            "role proxy: forwarding, and shipping every request record to the aggregator"
        );
        Ok(RunningApp {
            api_addr,
            proxy_addr: Some(proxy_addr),
            listening: vec![("api", api_addr), ("proxy", proxy_addr)],
            shutdown,
            servers,
            proxy: Some(proxy_server),
            drain: cfg.shutdown.clone(),
            components,
            in_flight_gauge,
            pipeline,
            store_writer: None,
            otlp_export,
            shipper: Some(shipper),
            runtimes: vec![proxy_rt, analysis],
        })
    }
}

/// A replica started without a config file has nothing to reload: SIGHUP is answered with a
/// warning instead of the signal's default, which would end the process.
fn spawn_sighup_notice(mut stop: watch::Receiver<bool>) -> Option<tokio::task::JoinHandle<()>> {
    #[cfg(unix)]
    {
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP");
                return None;
            }
        };
        Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    r = hup.recv() => {
                        if r.is_none() {
                            return;
                        }
                        tracing::warn!("SIGHUP: started without a config file (--config), there is nothing to reload");
                    }
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }))
    }
    #[cfg(not(unix))]
    {
        let _ = &mut stop;
        None
    }
}
