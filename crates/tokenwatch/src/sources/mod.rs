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

/// What a source gets to work with when it starts.
pub struct SourceContext {
    pub signals: SharedSignals,
    /// Request records (the proxy, OTLP GenAI spans) go here.
    pub queue: TelemetryQueue,
    pub store: Arc<dyn Store>,
    /// Received spans and log records reach the store through its writer thread.
    pub store_writer: crate::kernel::rows::StoreRows,
    /// Register the source's own health metrics with `metrics.register(..)`.
    pub metrics: Arc<Metrics>,
    pub components: Components,
    /// Turns true when tokenwatch shuts down; tasks must then end (dropping `queue`).
    pub shutdown: watch::Receiver<bool>,
    /// Bearer-token checks for the source's listeners (passes everything without tokens).
    pub auth: crate::auth::AuthHandle,
    /// The listeners' TLS (`otlp_grpc`, `otlp_http`; None: plain TCP), see `crate::listen`.
    pub tls: Arc<crate::listen::tls::ServerTls>,
    /// Prompt and completion text in received spans and logs: dropped, or masked when
    /// `capture.text` is on.
    pub telemetry_text: crate::capture::telemetry::TelemetryText,
    /// Received OTLP log records go to the log-template miner too (None: mining is off).
    pub log_feed: Option<crate::logs::LogFeed>,
    /// Received spans are exported too (`export.otlp.include_received`): stored rows go here.
    pub span_export: Option<crate::kernel::spans::SpanExport>,
    /// Anomaly events raised by a source (GPU XID errors) go to the alert engine's root cause.
    pub events: tokenwatch_core::alert::EventInbox,
    /// Where a source leaves what configuration reloads change in it (scrape targets).
    pub reload: ReloadHooks,
    /// The alert engine's port for embeddings, feedback and scores (posted to the API, sent as
    /// span attributes); None: alerting is off.
    pub posted: Option<Arc<dyn tokenwatch_core::alert::PostedInputs>>,
    /// Other ids of a model (`models.aliases`): scraped and OTLP-metric series naming one go
    /// under the model's id (records are resolved by the pipeline).
    pub model_aliases: crate::kernel::models::SharedAliases,
}

/// A started source: its tasks, and API routes it serves on the API port (if any).
pub struct SourceHandle {
    pub tasks: Vec<JoinHandle<()>>,
    pub routes: Option<axum::Router>,
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
}

impl ReloadHooks {
    /// The running scrape source's static targets: a reload sends the new list here.
    pub fn set_scrape_targets(&self, tx: watch::Sender<Vec<scrape::target::TargetSpec>>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .scrape_targets = Some(tx);
    }

    pub(crate) fn scrape_targets(&self) -> Option<watch::Sender<Vec<scrape::target::TargetSpec>>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .scrape_targets
            .clone()
    }
}
