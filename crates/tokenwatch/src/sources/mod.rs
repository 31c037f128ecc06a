// Sources: where data enters tokenwatch. Each source turns what it sees into normalised
// request records (into the telemetry queue) or signal points (onto the signal board).

pub mod gpu;
pub mod otlp;
pub mod posted;
pub mod proxy;
pub mod scrape;

use crate::kernel::queue::TelemetryQueue;
use crate::kernel::telemetry::Metrics;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use tokenwatch_core::signals::SharedSignals;
use tokenwatch_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Readiness of each component, shown by `/readyz` (`ok`, `disabled: <why>`, `error: <why>`).
#[derive(Clone, Default)]
pub struct Components(Arc<RwLock<BTreeMap<String, String>>>);

impl Components {
    pub fn set(&self, name: &str, status: impl Into<String>) {
        let mut m = self.0.write().unwrap_or_else(|p| p.into_inner());
        m.insert(name.to_string(), status.into());
    }

    pub fn snapshot(&self) -> BTreeMap<String, String> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Shutdown has begun: `/readyz` answers 503 from now on (a load balancer stops sending).
    pub fn set_draining(&self, status: impl Into<String>) {
        self.set(DRAINING, status);
    }

    pub fn draining(&self) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(DRAINING)
    }
}

/// The component `/readyz` shows while tokenwatch shuts down.
const DRAINING: &str = "shutdown";

/// What a source gets to work with when it starts: five ports, each a small set of handles on
/// what lies downstream (nothing of a later stage's internals), as a Vector source gets its
/// outputs. A source takes the ports it needs and leaves the rest.
pub struct SourceContext {
    /// Where request records go (the proxy, OTLP GenAI spans).
    pub records: RecordsPort,
    /// Where signal points, anomaly events and posted inputs go.
    pub signals: SignalsPort,
    /// Where received spans, log records and a source's own rows go.
    pub rows: RowsPort,
    /// What a source's listeners need: bearer-token checks and TLS.
    pub listen: ListenPort,
    /// The process around the source: shutdown, readiness, self-telemetry, reloads.
    pub host: HostPort,
}

/// Request records into the pipeline, and the routes' splits the proxy forwards by.
pub struct RecordsPort {
    pub queue: TelemetryQueue,
    /// The proxy publishes its routes' splits here; canary rollback (through the act stage) and
    /// the API set their weights.
    pub splits: Arc<crate::kernel::splits::SplitBoard>,
}

/// Signal points, anomaly events and posted inputs.
#[derive(Clone)]
pub struct SignalsPort {
    pub board: SharedSignals,
    /// Anomaly events raised by a source (GPU XID errors) go to the alert engine's root cause.
    pub events: tokenwatch_core::alert::EventInbox,
    /// The alert engine's port for embeddings, feedback and scores (posted to the API, sent as
    /// span attributes); None: alerting is off.
    pub posted: Option<Arc<dyn tokenwatch_core::alert::PostedInputs>>,
    /// Other ids of a model (`models.aliases`): scraped and OTLP-metric series naming one go
    /// under the model's id (records are resolved by the pipeline).
    pub model_aliases: crate::kernel::models::SharedAliases,
}

/// Rows for the store and what else receives them.
pub struct RowsPort {
    /// The store, for what a source reads back or writes beside rows (feedback, markers).
    pub store: Arc<dyn Store>,
    /// Received spans and log records reach the store through its writer thread.
    pub writer: crate::kernel::rows::StoreRows,
    /// Prompt and completion text in received spans and logs: dropped, or masked when
    /// `capture.text` is on.
    pub telemetry_text: crate::capture::telemetry::TelemetryText,
    /// Received OTLP log records go to the log-template miner too (None: mining is off).
    pub log_feed: Option<crate::logs::LogFeed>,
    /// Received spans are exported too (`export.otlp.include_received`): stored rows go here.
    pub span_export: Option<crate::kernel::spans::SpanExport>,
}

/// A source's listeners: bearer-token checks and TLS.
#[derive(Clone)]
pub struct ListenPort {
    /// Bearer-token checks (passes everything without tokens).
    pub auth: crate::auth::AuthHandle,
    /// The listeners' TLS (`otlp_grpc`, `otlp_http`; None: plain TCP), see `crate::listen`.
    pub tls: Arc<crate::listen::tls::ServerTls>,
    /// The names and origins browsers may reach the listeners from (`auth.allowed_hosts`,
    /// `auth.allowed_origins`), see `crate::listen::browser`.
    pub browser: crate::listen::browser::BrowserPolicy,
}

/// The process around a source.
#[derive(Clone)]
pub struct HostPort {
    /// Turns true when tokenwatch shuts down; tasks must then end (dropping their queues).
    pub shutdown: watch::Receiver<bool>,
    /// Readiness shown by `/readyz`: a source sets its own component.
    pub components: Components,
    /// Register the source's own health metrics with `metrics.register(..)`.
    pub metrics: Arc<Metrics>,
    /// Where a source leaves what configuration reloads change in it (scrape targets, the
    /// proxy's routes).
    pub reload: ReloadHooks,
    /// The runtime of the request path (the proxy's own threads): a source that forwards
    /// requests serves on it, never on the analysis runtime.
    pub request_runtime: tokio::runtime::Handle,
}

/// A started source: its tasks, API routes it serves on the API port (if any), and the
/// addresses its own listeners bound (named as in the start line's `listening`).
pub struct SourceHandle {
    pub tasks: Vec<JoinHandle<()>>,
    pub routes: Option<axum::Router>,
    pub listening: Vec<(&'static str, std::net::SocketAddr)>,
    /// A source in the request path (the proxy): drained before anything else stops.
    pub request_path: Option<proxy::source::ProxyServer>,
}

pub type StartFuture = Pin<Box<dyn Future<Output = anyhow::Result<SourceHandle>> + Send>>;

/// A pluggable source. A new source is one module implementing this, listed in `from_config`.
pub trait Source: Send {
    fn name(&self) -> &'static str;
    /// Bind, spawn the source's tasks and return. Errors stop tokenwatch from starting.
    fn start(self: Box<Self>, ctx: SourceContext) -> StartFuture;
}

/// Where sources leave what a configuration reload changes in them (`SourceContext::reload`;
/// `crate::reload` sends the new values).
#[derive(Clone, Default)]
pub struct ReloadHooks(Arc<Mutex<HookSet>>);

#[derive(Default)]
struct HookSet {
    scrape_targets: Option<watch::Sender<Vec<scrape::target::TargetSpec>>>,
    proxy: Option<Arc<proxy::ProxyState>>,
}

impl ReloadHooks {
    /// The running scrape source's static targets: a reload sends the new list here.
    pub fn set_scrape_targets(&self, tx: watch::Sender<Vec<scrape::target::TargetSpec>>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .scrape_targets = Some(tx);
    }

    /// The running proxy: a reload swaps its routes in place.
    pub fn set_proxy(&self, state: Arc<proxy::ProxyState>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).proxy = Some(state);
    }

    pub(crate) fn proxy(&self) -> Option<Arc<proxy::ProxyState>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .proxy
            .clone()
    }

    pub(crate) fn scrape_targets(&self) -> Option<watch::Sender<Vec<scrape::target::TargetSpec>>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .scrape_targets
            .clone()
    }
}
