// `tokenwatch run`: wires the pipeline from configuration — store, aggregator, exporters,
// the proxy source and the API — and shuts it down in order, flushing what was accepted. The
// `role` picks what runs: everything (`all`), everything but the proxy (`aggregator`), or a thin
// proxy replica (`proxy`, assembled in `proxy_replica`).

mod proxy_replica;

use crate::api::{ApiState, router as api_router};
use crate::config::{Config, Role, ShutdownConfig};
use crate::export::prometheus::MetricsSink;
use crate::kernel::telemetry::Metrics;
use crate::listen::browser::{BrowserGuard, BrowserPolicy};
use crate::pipeline::{
    Pipeline, PipelineConfig, ProxySpanBuilder, ProxySpanSink, RecordSink, StoreSink, StoreWriter,
    StoreWriterConfig, StoreWriterThread,
};
use crate::sources::proxy::{self, source::ProxyServer};
use crate::sources::{
    Components, HostPort, ListenPort, RecordsPort, RowsPort, SignalsPort, SourceContext,
};
use anyhow::Context;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokenwatch_core::aggregate::{Aggregator, AggregatorConfig};
use tokenwatch_core::signals::{SharedSignals, SignalBoard};
use tokenwatch_store::{Store, StoreOptions};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long the API, the exporters and the store writer get to finish once the proxy has
/// drained (or, without a proxy, once shutdown starts).
const DRAIN_GRACE: Duration = Duration::from_secs(5);

pub struct RunningApp {
    pub api_addr: SocketAddr,
    pub proxy_addr: Option<SocketAddr>,
    /// Every listener's bound address by name (`api`, `proxy`, `otlp_grpc`, `otlp_http`): what
    /// port 0 picked, for the start line.
    pub listening: Vec<(&'static str, SocketAddr)>,
    shutdown: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    /// The proxy, drained before everything else stops (None in collector-only mode).
    proxy: Option<ProxyServer>,
    drain: ShutdownConfig,
    components: Components,
    in_flight_gauge: prometheus_client::metrics::gauge::Gauge,
    pipeline: Pipeline,
    /// The store's writer thread, drained after the pipeline (None for a proxy replica).
    store_writer: Option<StoreWriterThread>,
    /// OTLP trace export (`export.otlp`), stopped after the pipeline has drained.
    otlp_export: Option<crate::export::otlp::OtlpExporter>,
    /// A proxy replica's record shipping to its aggregator, stopped after the pipeline.
    shipper: Option<crate::export::otlp::ship::Shipper>,
    /// The proxy's runtime and the analysis runtime (see `runtimes`); stopped last.
    runtimes: Vec<OwnedRuntime>,
}

/// A runtime owned by the app. Dropping a runtime from async code panics, so a drop without
/// `shutdown` (a failed start) stops it in the background instead.
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl OwnedRuntime {
    fn handle(&self) -> &tokio::runtime::Handle {
        self.0
            .as_ref()
            .expect("runtime present until shutdown")
            .handle()
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what})"))
}

/// The hosts and origins browsers may reach the listeners from (`auth.allowed_hosts`,
/// `auth.allowed_origins`; checked by `Config::validate` already).
fn browser_policy(cfg: &Config) -> anyhow::Result<BrowserPolicy> {
    BrowserPolicy::from_lists(&cfg.auth.allowed_hosts, &cfg.auth.allowed_origins)
        .map_err(|(key, message)| anyhow::anyhow!("{key}: {message}"))
}

/// Serve `app` on `listener` (over TLS when `tls` is set) until shutdown: TCP_NODELAY on every
/// connection, TLS handshakes in tasks of their own (`crate::listen`).
fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: axum::Router,
    stop: watch::Receiver<bool>,
    guard: crate::listen::limits::Guard,
) -> JoinHandle<()> {
    tokio::spawn(crate::listen::serve_router(listener, tls, app, stop, guard))
}

/// `tokenwatch_shutdown_in_flight_requests`, registered: what the proxy still forwards while it
/// drains.
fn in_flight_gauge(metrics: &Metrics) -> prometheus_client::metrics::gauge::Gauge {
    let gauge = prometheus_client::metrics::gauge::Gauge::default();
    metrics.register(
        "tokenwatch_shutdown_in_flight_requests",
        "Requests and streams the proxy still forwards while it drains at shutdown (0 otherwise)",
        gauge.clone(),
    );
    gauge
}

impl RunningApp {
    /// Open the store, start the pipeline, bind and serve. Returns once everything listens.
    pub async fn start(cfg: Config) -> anyhow::Result<RunningApp> {
        RunningApp::start_with_reload(cfg, None).await
    }

    /// As `start`, reloading `reload_source` on SIGHUP and `POST /-/reload` (`crate::reload`).
    pub async fn start_with_reload(
        cfg: Config,
        reload_source: Option<crate::reload::ConfigSource>,
    ) -> anyhow::Result<RunningApp> {
        if cfg.role == Role::Proxy {
            return RunningApp::start_proxy_replica(cfg, reload_source).await;
        }
        let store_opts = StoreOptions {
            raw_retention: cfg.store.raw_retention.0,
            rollup_retention: cfg.store.rollup_retention.0,
            fsync: cfg.store.fsync,
            text_retention: cfg.retention.text_retention(),
        };
        let runtimes_cfg = &cfg.runtime;
        // Refuse to listen off loopback by accident, and load the tokens, before anything binds.
        if let Some((key, message)) = cfg.exposure_problem() {
            anyhow::bail!("{key}: {message}");
        }
        let auth = crate::auth::AuthHandle::from_config(&cfg.auth)?;
        let browser = browser_policy(&cfg)?;
        // Certificates first: a missing or bad file stops the start before anything binds.
        let tls = Arc::new(
            cfg.listener_certs()
                .and_then(|certs| {
                    crate::listen::tls::ServerTls::load(certs, cfg.tls.reload_interval.0)
                })
                .map_err(anyhow::Error::msg)?,
        );
        let analysis = OwnedRuntime(Some(
            crate::runtimes::analysis_runtime(runtimes_cfg)
                .context("starting the analysis runtime")?,
        ));
        let proxy_rt = OwnedRuntime(Some(
            crate::runtimes::proxy_runtime(runtimes_cfg).context("starting the proxy runtime")?,
        ));
        let analysis_priority = crate::runtimes::analysis_priority(runtimes_cfg);
        let mut backend = cfg.store.backend(&cfg.data_dir);
        if let tokenwatch_store::StoreBackend::ClickHouse(c) = &mut backend {
            c.writer_id = crate::writer_id::resolve(
                cfg.store.writer_id.as_deref(),
                &cfg.data_dir,
                &[cfg.listen, cfg.proxy.listen],
            )
            .context("the store's writer id")?;
        }
        let store_name = match &backend {
            tokenwatch_store::StoreBackend::Sqlite { data_dir } => {
                format!("in {}", data_dir.display())
            }
            tokenwatch_store::StoreBackend::ClickHouse(c) => {
                format!("at {} (database {})", c.url, c.database)
            }
        };
        let store: Arc<dyn Store> =
            tokio::task::spawn_blocking(move || tokenwatch_store::open_store(&backend, store_opts))
                .await?
                .with_context(|| format!("opening the store {store_name}"))?;
        // Version markers: learns the live versions from the store, then watches every record.
        let marker_store = store.clone();
        let markers =
            tokio::task::spawn_blocking(move || crate::markers::MarkerSink::start(marker_store))
                .await?
                .context("starting the version-marker detector")?;
        let metrics = Arc::new(Metrics::new());
        metrics.set_tenant_label(cfg.export.prometheus.tenant_label);
        metrics.set_series_limits(
            cfg.export.prometheus.max_label_bytes,
            cfg.export.prometheus.max_series_per_family,
        );
        metrics.set_idle_series_after(cfg.export.prometheus.idle_series_after.0);
        auth.register(&metrics);
        let aggregator = Arc::new(Mutex::new(Aggregator::new(AggregatorConfig {
            idle_series_after_ms: cfg.aggregation.idle_series_after.0.as_millis() as i64,
            max_series: cfg.aggregation.max_series,
        })));
        let (shutdown, stop) = watch::channel(false);
        // What `/readyz` lists: each component's status.
        let components = Components::default();
        let signals: SharedSignals = Arc::new(std::sync::RwLock::new(SignalBoard::new(
            cfg.signals.history_points,
            cfg.signals.max_series,
        )));
        crate::export::prometheus::register_signals(&metrics, signals.clone());
        // Evaluation, roll-ups and sampling run on the analysis runtime (lower priority).
        let in_analysis = analysis.handle().enter();
        // The proxy's route splits: published by the proxy, judged by canary rollback, changed by
        // the act stage on its decision, shown and set through the API.
        let splits: Arc<crate::kernel::splits::SplitBoard> = Arc::default();
        let actions = Arc::new(crate::act::Actuator::new(
            splits.clone(),
            Some(metrics.as_ref()),
        ));
        // The API binds before the engine starts: alert links (an empty
        // `alerting.delivery.external_url`) name the address it bound, port 0 included.
        let listener = bind(cfg.listen, "listen / --listen").await?;
        let api_addr = listener.local_addr()?;
        let alerting = crate::alerting::engine::start_from_config(
            crate::alerting::engine::EngineSections {
                listen: api_addr,
                ..cfg.engine_sections()
            },
            signals.clone(),
            store.clone(),
            aggregator.clone(),
            metrics.clone(),
            crate::alerting::engine::RouteHandles {
                splits: splits.clone(),
                actions,
            },
            &components,
            stop.clone(),
        )?;
        // OTLP trace export: its sender runs on the analysis runtime, never the proxy's.
        let otlp_export = crate::export::otlp::start(cfg.export.otlp.as_ref(), &metrics)?;
        let span_export = otlp_export.as_ref().map(|e| e.handle());
        // Records, proxy spans, roll-ups and retention reach the store on its own thread.
        let (writer, store_writer) = StoreWriter::start(
            store.clone(),
            StoreWriterConfig {
                queue_rows: cfg.store.write_queue_records,
                batch_max: cfg.store.batch_rows(cfg.telemetry.batch_max),
                flush_interval: cfg.store.flush_interval(),
                priority: analysis_priority,
            },
            metrics.clone(),
        )
        .context("starting the store writer thread")?;
        // `traces.sampling`: spans pass the tail sampler's thread on their way to the writer.
        let writer = writer
            .with_span_sampler(&cfg.traces.sampling, &metrics, analysis_priority)
            .context("starting the span sampler thread")?;
        let store_health = store_writer.health();
        let mut sinks: Vec<Box<dyn RecordSink>> = vec![
            Box::new(StoreSink::new(writer.clone())),
            Box::new(ProxySpanSink::new(
                ProxySpanBuilder::new(&cfg.proxy.upstreams),
                writer.clone(),
                span_export.clone(),
            )),
            Box::new(MetricsSink(metrics.clone())),
        ];
        let posted = alerting
            .sink
            .as_ref()
            .map(|s| Arc::new(s.feed.clone()) as Arc<dyn tokenwatch_core::alert::PostedInputs>);
        if let Some(sink) = alerting.sink {
            sinks.push(Box::new(sink));
        }
        sinks.push(Box::new(markers));
        let capture_key = if cfg.capture.text || cfg.capture.mask.telemetry {
            let key =
                proxy::identity::load_or_create_secret(&cfg.data_dir, crate::capture::KEY_FILE)
                    .with_context(|| {
                        format!("creating the capture key in {}", cfg.data_dir.display())
                    })?;
            Some(key)
        } else {
            None
        };
        let text_capture = match (&capture_key, cfg.capture.text) {
            (Some(key), true) => {
                tracing::info!(
                    "text capture is on: prompts and completions are stored, masked (capture.text)"
                );
                Some(
                    crate::capture::TextCapture::new(&cfg.capture, key)
                        .context("starting text capture")?,
                )
            }
            _ => None,
        };
        let telemetry_text = crate::capture::telemetry_text(
            &cfg.capture,
            text_capture.as_ref(),
            capture_key.as_deref(),
        )
        .context("starting the masking of received telemetry")?;
        let model_aliases: crate::kernel::models::SharedAliases = Arc::new(
            cfg.models
                .aliases()
                .map_err(|(key, message)| anyhow::anyhow!("configuration {key}: {message}"))?,
        );
        if !model_aliases.is_empty() {
            tracing::info!(aliases = ?cfg.models.aliases, "model aliases: these ids are counted under their model's");
        }
        let prices = Arc::new(
            crate::pipeline::pricing::PriceTable::load(&cfg.pricing, &cfg.proxy.upstreams)
                .map_err(|e| anyhow::anyhow!("configuration {e}"))?,
        );
        let (pipeline, queue) = Pipeline::start(
            PipelineConfig {
                queue_capacity: cfg.telemetry.queue_capacity,
                batch_max: cfg.telemetry.batch_max,
                flush_interval: cfg.telemetry.flush_interval.0,
                maintenance_interval: Duration::from_secs(600),
                thread_priority: analysis_priority,
                text_capture,
                model_aliases: model_aliases.clone(),
                model_admission: Some(crate::kernel::models::ModelAdmission::new(
                    &cfg.models,
                    cfg.proxy
                        .upstreams
                        .iter()
                        .flat_map(|u| u.models.iter().cloned())
                        .chain(cfg.proxy.routes.iter().map(|r| r.model.clone())),
                )),
                prices,
                record_identity: Some(crate::pipeline::RecordIdentityConfig::new(
                    telemetry_text.others_masker(),
                )),
                health: Some(components.clone()),
            },
            Some(aggregator.clone()),
            sinks,
            metrics.clone(),
        );
        let queue = crate::embed::start(&cfg.capture, queue, &metrics, analysis_priority)?;
        let timeline = Arc::new(std::sync::RwLock::new(
            crate::api::timeline::Timeline::default(),
        ));
        let mut servers = alerting.tasks;
        servers.push(crate::api::timeline::spawn_sampler(
            aggregator.clone(),
            signals.clone(),
            timeline.clone(),
            stop.clone(),
        ));
        servers.push(spawn_signal_eviction(
            signals.clone(),
            cfg.signals.stale_after.0,
            stop.clone(),
        ));
        servers.extend(crate::export::remote_write::start(
            &cfg.export.remote_write,
            metrics.clone(),
            stop.clone(),
        )?);
        // Log templates: OTLP logs and tailed files, mined on a thread of their own.
        let log_templates = crate::logs::start(
            &cfg.logs,
            &cfg.sources,
            &cfg.data_dir,
            &cfg.runtime,
            crate::logs::MinerLinks {
                inbox: alerting.events.clone(),
                masker: telemetry_text.others_masker(),
            },
            &metrics,
            stop.clone(),
        )?;
        servers.extend(log_templates.task);
        drop(in_analysis);
        servers.extend(tls.spawn_reloader(stop.clone()));
        let (audit, audit_closer) =
            crate::audit::start(&cfg.audit, &cfg.data_dir, &metrics, stop.clone())?;
        servers.extend(audit_closer);
        let tokens_audit = audit.clone();
        servers.extend(auth.spawn_reload(stop.clone(), move |r| tokens_audit.event(r.into())));

        let mut source_routes = Vec::new();
        let mut listening = Vec::new();
        let mut proxy_server = None;
        let reload_hooks = crate::sources::ReloadHooks::default();
        for source in cfg.sources()? {
            let name = source.name();
            let ctx = SourceContext {
                records: RecordsPort {
                    queue: queue.clone(),
                    splits: splits.clone(),
                },
                signals: SignalsPort {
                    board: signals.clone(),
                    events: alerting.events.clone(),
                    posted: posted.clone(),
                    model_aliases: model_aliases.clone(),
                },
                rows: RowsPort {
                    store: store.clone(),
                    writer: std::sync::Arc::new(writer.clone()),
                    telemetry_text: telemetry_text.clone(),
                    log_feed: log_templates.feed.clone(),
                    span_export: span_export.clone().filter(|e| e.includes_received()),
                },
                listen: ListenPort {
                    auth: auth.clone(),
                    tls: tls.clone(),
                    browser: browser.clone(),
                },
                host: HostPort {
                    shutdown: stop.clone(),
                    components: components.clone(),
                    metrics: metrics.clone(),
                    reload: reload_hooks.clone(),
                    request_runtime: proxy_rt.handle().clone(),
                },
            };
            let handle = source
                .start(ctx)
                .await
                .with_context(|| format!("starting the {name} source"))?;
            servers.extend(handle.tasks);
            source_routes.extend(handle.routes);
            listening.extend(handle.listening);
            if let Some(server) = handle.request_path {
                proxy_server = Some(server);
            }
        }
        drop(queue);

        let proxy_addr = listening
            .iter()
            .find(|(name, _)| *name == "proxy")
            .map(|(_, addr)| *addr);

        let reload_handles = crate::reload::Handles {
            proxy: reload_hooks.proxy(),
            engine: alerting.control.clone(),
            hooks: reload_hooks,
            audit: audit.clone(),
            replica: false,
        };
        let reloader = Arc::new(crate::reload::Reloader::new(
            reload_source,
            cfg.clone(),
            reload_handles,
            &metrics,
        ));
        servers.extend(crate::reload::spawn_sighup(reloader.clone(), stop.clone()));
        let alerts = alerting.book.clone();
        let slos = alerting.slos.clone();
        let scaling = alerting.scaling.clone();
        let api_guard = crate::listen::limits::Guard::new("api", &cfg.limits, &metrics);
        let trace_components = Arc::new(crate::pipeline::trace_components::ComponentMap::new(
            &cfg.traces,
        ));
        let api = Arc::new(ApiState {
            aggregator,
            store,
            store_backend: cfg.store.backend,
            store_health,
            metrics: metrics.clone(),
            components: components.clone(),
            signals,
            alerts,
            timeline,
            slos,
            scaling,
            trace_components,
            budgets: Arc::new(cfg.budgets.clone()),
        });
        let mut app = api_router(api);
        for routes in source_routes {
            app = app.merge(routes);
        }
        app = app.merge(crate::alerting::api::router(alerting.book.clone()));
        app = app.merge(log_templates.routes);
        app = app.merge(crate::ui::router());
        app = app.merge(crate::reload::router(reloader));
        app = app.merge(crate::api::routes::router(splits));
        app = crate::auth::http::protect_api(app, &auth);
        app = crate::listen::browser::protect(
            app,
            BrowserGuard::new(&browser, api_addr, true, &api_guard),
        );
        app = crate::audit::http::audit_api(app, &audit);
        servers.push(serve(listener, tls.api.clone(), app, stop, api_guard));
        let in_flight_gauge = in_flight_gauge(&metrics);
        listening.insert(0, ("api", api_addr));
        Ok(RunningApp {
            api_addr,
            proxy_addr,
            listening,
            shutdown,
            servers,
            proxy: proxy_server,
            drain: cfg.shutdown.clone(),
            components: components.clone(),
            in_flight_gauge,
            pipeline,
            store_writer: Some(store_writer),
            otlp_export,
            shipper: None,
            runtimes: vec![proxy_rt, analysis],
        })
    }

    /// The start line's `listening` field: `api=ADDR proxy=ADDR otlp_grpc=ADDR otlp_http=ADDR`
    /// (the listeners that run), so a supervisor or a test that asked for port 0 reads what it got.
    pub fn listening_line(&self) -> String {
        self.listening
            .iter()
            .map(|(name, addr)| format!("{name}={addr}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Shut down without waiting for a second signal (`shutdown_or_cut`).
    pub async fn shutdown(self) {
        self.shutdown_or_cut(std::future::pending()).await
    }

    /// Drain, then stop: `/readyz` answers 503 at once; the proxy keeps accepting for
    /// `shutdown.delay`, then stops accepting and lets what is in flight finish for up to
    /// `shutdown.drain_timeout` (`cut` resolving — a second signal — ends either wait); then
    /// the API and the other tasks stop within one grace, and what the pipeline has queued is
    /// flushed.
    pub async fn shutdown_or_cut(mut self, cut: impl std::future::Future<Output = ()>) {
        tokio::pin!(cut);
        self.components.set_draining("draining: shutting down");
        if let Some(proxy) = self.proxy.take() {
            let (delay, timeout) = (self.drain.delay.0, self.drain.drain_timeout.0);
            tracing::info!(
                delay_s = delay.as_secs_f64(),
                drain_timeout_s = timeout.as_secs_f64(),
                "shutting down: /readyz answers 503; the proxy keeps accepting for shutdown.delay"
            );
            let mut cut_short = tokio::select! {
                _ = tokio::time::sleep(delay) => false,
                _ = &mut cut => true,
            };
            let _ = proxy.stop.send(true);
            let abort = proxy.task.abort_handle();
            let deadline = tokio::time::Instant::now() + timeout;
            let mut task = proxy.task;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut last_log = tokio::time::Instant::now();
            while !cut_short {
                tokio::select! {
                    _ = &mut task => break,
                    _ = tick.tick() => {
                        let n = proxy.state.in_flight();
                        self.in_flight_gauge.set(n as i64);
                        if tokio::time::Instant::now() >= deadline {
                            tracing::warn!(in_flight = n, "shutdown.drain_timeout reached: cutting what is still in flight");
                            cut_short = true;
                        } else if last_log.elapsed() >= Duration::from_secs(5) {
                            last_log = tokio::time::Instant::now();
                            tracing::info!(in_flight = n, "draining: the proxy no longer accepts; waiting for requests in flight");
                        }
                    }
                    _ = &mut cut => {
                        tracing::warn!(in_flight = proxy.state.in_flight(), "second signal: cutting the drain short");
                        cut_short = true;
                    }
                }
            }
            if cut_short {
                abort.abort();
            }
            self.in_flight_gauge.set(0);
        }
        let _ = self.shutdown.send(true);
        let deadline = tokio::time::Instant::now() + DRAIN_GRACE;
        for s in std::mem::take(&mut self.servers) {
            let abort = s.abort_handle();
            if tokio::time::timeout_at(deadline, s).await.is_err() {
                abort.abort();
            }
        }
        let pipeline = self.pipeline;
        let _ = tokio::task::spawn_blocking(move || pipeline.close_and_join()).await;
        // The pipeline's senders are gone: the writer stores what is queued, within the grace.
        if let Some(store_writer) = self.store_writer {
            let _ = tokio::task::spawn_blocking(move || store_writer.finish(DRAIN_GRACE)).await;
        }
        if let Some(export) = self.otlp_export {
            export.shutdown(DRAIN_GRACE).await;
        }
        // A replica's last records: one last attempt to ship what is buffered (the rest counted).
        if let Some(shipper) = self.shipper {
            shipper.shutdown(DRAIN_GRACE).await;
        }
        for mut rt in self.runtimes {
            if let Some(rt) = rt.0.take() {
                crate::runtimes::shut_down(rt, Duration::from_secs(1)).await;
            }
        }
    }
}

/// Drop signal series that stopped receiving points, once a minute.
fn spawn_signal_eviction(
    signals: SharedSignals,
    stale_after: Duration,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = tokenwatch_core::clock::now_unix_ms();
                    let mut board = signals.write().unwrap_or_else(|p| p.into_inner());
                    board.evict_older_than(now, stale_after.as_millis() as i64);
                }
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    })
}

/// Resolve on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
