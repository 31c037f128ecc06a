// Configuration reload on SIGHUP and `POST /-/reload`: re-reads the file tokenwatch started from
// (with the same flags), validates it, applies routes, rules, SLOs and scrape targets in place.

use crate::alerting::engine::{EngineControl, Reconfigure};
use crate::alerting::rules::AlertingConfig;
use crate::audit::{AuditEvent, AuditLog};
use crate::config::Config;
use crate::kernel::telemetry::Metrics;
use crate::sources::ReloadHooks as Hooks;
use crate::sources::proxy::{ProxyState, UpstreamRouter};
use crate::sources::scrape::target::TargetSpec;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The sections a reload applies in place (when the part that runs them is running).
pub const RELOADABLE: [&str; 5] = [
    "proxy.upstreams",
    "proxy.routes",
    "alerting",
    "slos",
    "scrape.targets",
];

/// What a proxy replica (`role: proxy`) does not read: the aggregator's sections. A change there
/// is neither applied nor a restart's (restarting the replica would not apply it either): a
/// replica's reload reports it in `not_used`, so that one file can serve every role.
pub const NOT_USED_BY_REPLICAS: [&str; 18] = [
    "store",
    "pricing",
    "budgets",
    "aggregation",
    "scrape",
    "otlp",
    "gpu",
    "signals",
    "alerting",
    "slos",
    "scaling",
    "audit",
    "retention",
    "traces",
    "sources",
    "logs",
    "export.prometheus",
    "export.remote_write",
];

/// Builds the configuration as a start with the same command line would: the file read again,
/// the same flags applied over it, validated. Errors name the file and the key path.
pub type ConfigLoader = Arc<dyn Fn() -> anyhow::Result<Config> + Send + Sync>;

/// The file tokenwatch started from and how to build the configuration from it again.
#[derive(Clone)]
pub struct ConfigSource {
    pub file: PathBuf,
    pub load: ConfigLoader,
}

/// What caused a reload (named in the audit log and the logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Sighup,
    Api,
}

impl Trigger {
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Sighup => "sighup",
            Trigger::Api => "api",
        }
    }
}

/// A reload's answer: the sections applied, the changed keys that need a restart (by key path;
/// their running values stay), and the reloadable sections that did not change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub applied: Vec<&'static str>,
    pub restart_required: Vec<String>,
    pub unchanged: Vec<&'static str>,
    /// Changed keys this process does not read (a proxy replica: `NOT_USED_BY_REPLICAS`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_used: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("started without a config file: there is nothing to reload (start with --config)")]
    NoFile,
    /// The new configuration is invalid; nothing was applied.
    #[error("{0}")]
    Invalid(String),
}

/// What runs now and can take a reload.
#[derive(Debug, Clone, Copy, Default)]
pub struct Running {
    /// The proxy listens (it had upstreams at start).
    pub proxy: bool,
    /// The alert engine runs (`alerting.enabled` at start).
    pub engine: bool,
    /// The scrape source runs (it had targets or file_sd files at start).
    pub scrape: bool,
    /// A proxy replica (`role: proxy`): the sections of `NOT_USED_BY_REPLICAS` are not read.
    pub replica: bool,
}

/// A checked reload, ready to apply: everything that can fail has been built.
pub struct Plan {
    /// The running configuration with the reloadable sections of the new one.
    pub merged: Config,
    pub outcome: Outcome,
    routes: Option<UpstreamRouter>,
    engine: Option<Reconfigure>,
    targets: Option<Vec<TargetSpec>>,
}

/// Compare `new` with `running` and build what the changed reloadable sections need. Keys
/// outside them (or of parts that do not run) are reported in `restart_required`.
pub fn plan(running: &Config, new: &Config, parts: Running) -> Result<Plan, String> {
    let mut merged = running.clone();
    let mut applied = Vec::new();
    let mut routes = None;
    let upstreams_changed = differs(&running.proxy.upstreams, &new.proxy.upstreams);
    let routes_changed = differs(&running.proxy.routes, &new.proxy.routes);
    if parts.proxy && (upstreams_changed || routes_changed) {
        routes = Some(UpstreamRouter::new(&new.proxy.upstreams)?.with_splits(&new.proxy.routes)?);
        merged.proxy.upstreams = new.proxy.upstreams.clone();
        merged.proxy.routes = new.proxy.routes.clone();
        if upstreams_changed {
            applied.push("proxy.upstreams");
        }
        if routes_changed {
            applied.push("proxy.routes");
        }
    }
    let mut slos_changed = false;
    if parts.engine {
        take_reloadable_alerting(&mut merged.alerting, &new.alerting);
        slos_changed = differs(&running.slos, &new.slos);
        if slos_changed {
            merged.slos = new.slos.clone();
            applied.push("slos");
        }
        if differs(&running.alerting, &merged.alerting) {
            applied.push("alerting");
        }
    }
    let mut targets = None;
    if parts.scrape && differs(&running.scrape.targets, &new.scrape.targets) {
        merged.scrape.targets = new.scrape.targets.clone();
        // The other scrape keys stay as they run (defaults such as the interval included).
        targets = Some(
            merged
                .scrape
                .static_targets()
                .map_err(|(path, msg)| format!("{path}: {msg}"))?,
        );
        applied.push("scrape.targets");
    }
    // The engine takes the rules (unchanged ones stay as they run) and, for its snapshots, the
    // configuration that runs now, whenever anything is applied.
    let mut engine = None;
    if parts.engine && !applied.is_empty() {
        let rules = crate::alerting::rules::compile(&merged.alerting)
            .map_err(|(path, msg)| format!("{path}: {msg}"))?;
        let unchanged = rules
            .iter()
            .map(|r| rule_unchanged(&running.alerting, &merged.alerting, &r.name))
            .collect();
        engine = Some(Reconfigure {
            rules,
            unchanged,
            cfg: merged.alerting.clone(),
            slos: slos_changed.then(|| crate::alerting::slo::effective(&merged.slos)),
            config_json: Some(merged.redacted_json()),
        });
    }
    let unused = |key: &str| parts.replica && NOT_USED_BY_REPLICAS.iter().any(|s| within(key, s));
    let (not_used, restart_required): (Vec<String>, Vec<String>) = changed_keys(&merged, new)
        .into_iter()
        .partition(|k| unused(k));
    let unchanged = RELOADABLE
        .into_iter()
        .filter(|s| {
            !applied.contains(s) && !restart_required.iter().any(|k| within(k, s)) && !unused(s)
        })
        .collect();
    applied.sort_by_key(|s| RELOADABLE.iter().position(|r| r == s));
    Ok(Plan {
        merged,
        outcome: Outcome {
            applied,
            restart_required,
            unchanged,
            not_used,
        },
        routes,
        engine,
        targets,
    })
}

/// Whether key path `key` is `section` or inside it.
fn within(key: &str, section: &str) -> bool {
    key == section
        || key
            .strip_prefix(section)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// The `alerting` keys the engine takes between two evaluations; the others (delivery,
/// snapshots, incident window, event lookback, `enabled`) need a restart.
fn take_reloadable_alerting(into: &mut AlertingConfig, from: &AlertingConfig) {
    into.default_rules = from.default_rules;
    into.rules = from.rules.clone();
    into.overrides = from.overrides.clone();
    into.inhibit_rules = from.inhibit_rules.clone();
    into.causal_graph = from.causal_graph.clone();
    into.resolve_after = from.resolve_after;
    into.resolve_clean_evaluations = from.resolve_clean_evaluations;
    into.pending_grace = from.pending_grace;
    into.keep_resolved = from.keep_resolved;
    into.evaluation_interval = from.evaluation_interval;
}

/// A rule's effective configuration comes from the default of its name (when the defaults are
/// on), the configured rule of its name and the override of its name: all three the same, the
/// rule is the same.
fn rule_unchanged(old: &AlertingConfig, new: &AlertingConfig, name: &str) -> bool {
    let configured = |c: &AlertingConfig| value(&c.rules.iter().find(|r| r.name == name));
    let overridden = |c: &AlertingConfig| value(&c.overrides.get(name));
    old.default_rules == new.default_rules
        && configured(old) == configured(new)
        && overridden(old) == overridden(new)
}

/// A configuration value as data (every section serialises as it deserialises: durations in
/// their syntax, enums by their names), for comparing two of them. Serialising plain
/// configuration data cannot fail; if it ever did, the value reads as null on both sides only
/// when both fail.
fn value<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// Whether two values of one configuration type differ.
fn differs<T: Serialize>(a: &T, b: &T) -> bool {
    value(a) != value(b)
}

/// Key paths whose values differ between `a` and `b`, in key order: the fields of sections are followed down
/// (`store.clickhouse.url`); anything else (lists, maps, options, plain values) is compared
/// whole. A field added to the configuration later is covered without being listed anywhere.
pub fn changed_keys<T: Serialize>(a: &T, b: &T) -> Vec<String> {
    let mut out = Vec::new();
    diff_values("", &value(a), &value(b), &mut out);
    out
}

fn diff_values(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value::Object;
    if a == b {
        return;
    }
    // Sections and maps are followed down to the key that changed; lists and plain values are
    // compared whole.
    let (Object(fa), Object(fb)) = (a, b) else {
        out.push(path.to_string());
        return;
    };
    let key = |name: &str| {
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    };
    for (name, va) in fa {
        match fb.get(name) {
            Some(vb) => diff_values(&key(name), va, vb, out),
            None => out.push(key(name)),
        }
    }
    for name in fb.keys().filter(|n| !fa.contains_key(*n)) {
        out.push(key(name));
    }
}

impl Plan {
    /// Apply every part of the plan (none of this can fail): new requests take the new routes,
    /// the engine takes the rules at its next evaluation boundary, the scrape source reconciles
    /// its targets. Returns the configuration that now runs.
    fn apply(
        self,
        proxy: Option<&ProxyState>,
        engine: Option<&EngineControl>,
        hooks: &Hooks,
    ) -> Config {
        if let (Some(routes), Some(p)) = (self.routes, proxy) {
            for r in routes.routes() {
                tracing::info!(upstream = %r.instance, runtime = %r.runtime, "proxy route (reloaded)");
            }
            p.swap_routes(routes);
        } else if let Some(p) = proxy {
            // The same routes: their weights go back to the file's (undoing rollbacks and
            // weights set through the API).
            p.reset_weights();
        }
        if let (Some(r), Some(e)) = (self.engine, engine)
            && !e.reconfigure(r)
        {
            tracing::warn!("the alert engine has stopped: the reloaded rules were not handed over");
        }
        if let (Some(t), Some(tx)) = (self.targets, hooks.scrape_targets()) {
            tx.send_replace(t);
        }
        self.merged
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// The reload metrics, named as Prometheus names its own.
struct ReloadMetrics {
    successful: Gauge,
    success_ts: Gauge<f64, AtomicU64>,
    total: Family<ResultLabel, Counter>,
}

impl ReloadMetrics {
    fn register(metrics: &Metrics) -> ReloadMetrics {
        let m = ReloadMetrics {
            successful: Gauge::default(),
            success_ts: Gauge::default(),
            total: Family::default(),
        };
        metrics.register(
            "tokenwatch_config_last_reload_successful",
            "Whether the last configuration reload attempt was successful",
            m.successful.clone(),
        );
        metrics.register(
            "tokenwatch_config_last_reload_success_timestamp_seconds",
            "Timestamp of the last successful configuration reload (the start counts as one)",
            m.success_ts.clone(),
        );
        metrics.register(
            "tokenwatch_config_reloads",
            "Configuration reload attempts by result",
            m.total.clone(),
        );
        m.successful.set(1);
        m.success_ts.set(now_s());
        m
    }

    fn record(&self, ok: bool) {
        self.successful.set(i64::from(ok));
        if ok {
            self.success_ts.set(now_s());
        }
        let result = if ok { "success" } else { "failure" };
        self.total.get_or_create(&ResultLabel { result }).inc();
    }
}

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The running configuration and the handles a reload changes.
pub struct Reloader {
    source: Option<ConfigSource>,
    /// Held for a whole reload: two reloads never interleave.
    running: tokio::sync::Mutex<Config>,
    parts: Running,
    proxy: Option<Arc<ProxyState>>,
    engine: Option<EngineControl>,
    hooks: Hooks,
    audit: AuditLog,
    metrics: ReloadMetrics,
}

/// What `app.rs` hands over once everything is started.
pub struct Handles {
    pub proxy: Option<Arc<ProxyState>>,
    pub engine: Option<EngineControl>,
    pub hooks: Hooks,
    pub audit: AuditLog,
    /// A proxy replica (`role: proxy`): changes to the aggregator's sections are `not_used`.
    pub replica: bool,
}

impl Reloader {
    pub fn new(
        source: Option<ConfigSource>,
        running: Config,
        handles: Handles,
        metrics: &Metrics,
    ) -> Reloader {
        let parts = Running {
            proxy: handles.proxy.is_some(),
            engine: handles.engine.is_some(),
            scrape: handles.hooks.scrape_targets().is_some(),
            replica: handles.replica,
        };
        Reloader {
            source,
            running: tokio::sync::Mutex::new(running),
            parts,
            proxy: handles.proxy,
            engine: handles.engine,
            hooks: handles.hooks,
            audit: handles.audit,
            metrics: ReloadMetrics::register(metrics),
        }
    }

    pub fn has_file(&self) -> bool {
        self.source.is_some()
    }

    /// Read, validate and apply the configuration file again. Invalid: nothing changes.
    pub async fn reload(&self, trigger: Trigger) -> Result<Outcome, ReloadError> {
        let Some(source) = &self.source else {
            return Err(ReloadError::NoFile);
        };
        let file = source.file.display().to_string();
        let mut running = self.running.lock().await;
        let load = source.load.clone();
        let result = match tokio::task::spawn_blocking(move || load()).await {
            Ok(Ok(new)) => plan(&running, &new, self.parts),
            Ok(Err(e)) => Err(format!("{e:#}")),
            Err(e) => Err(format!("reading the configuration failed: {e}")),
        };
        match result {
            Ok(plan) => {
                let outcome = plan.outcome.clone();
                *running = plan.apply(self.proxy.as_deref(), self.engine.as_ref(), &self.hooks);
                self.metrics.record(true);
                tracing::info!(file = %file, trigger = trigger.name(), applied = ?outcome.applied, restart_required = ?outcome.restart_required, not_used = ?outcome.not_used, "configuration reloaded");
                self.audit.event(AuditEvent::ConfigReloaded {
                    file,
                    trigger: trigger.name(),
                    applied: outcome.applied.iter().map(|s| s.to_string()).collect(),
                    restart_required: outcome.restart_required.clone(),
                });
                Ok(outcome)
            }
            Err(error) => {
                self.metrics.record(false);
                tracing::warn!(file = %file, trigger = trigger.name(), %error, "configuration reload refused; the running configuration stays");
                self.audit.event(AuditEvent::ConfigReloadFailed {
                    file,
                    trigger: trigger.name(),
                    error: error.clone(),
                });
                Err(ReloadError::Invalid(error))
            }
        }
    }
}

/// `POST /-/reload` on the API port (an admin's when tokens are on, see `auth::http::api_role`).
pub fn router(reloader: Arc<Reloader>) -> axum::Router {
    axum::Router::new()
        .route("/-/reload", axum::routing::post(reload_endpoint))
        .with_state(reloader)
}

async fn reload_endpoint(State(reloader): State<Arc<Reloader>>) -> Response {
    match reloader.reload(Trigger::Api).await {
        Ok(outcome) => Json(outcome).into_response(),
        Err(e @ ReloadError::NoFile) => (
            StatusCode::CONFLICT,
            Json(serde_json::json!({ "error": e.to_string() })),
        )
            .into_response(),
        Err(e @ ReloadError::Invalid(_)) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}

/// Reload on every SIGHUP until shutdown (only when started from a file: without one SIGHUP
/// keeps its default action).
pub fn spawn_sighup(
    reloader: Arc<Reloader>,
    mut stop: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    if !reloader.has_file() {
        return None;
    }
    #[cfg(unix)]
    {
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP: reload with POST /-/reload");
                return None;
            }
        };
        Some(tokio::spawn(async move {
            loop {
                let stopped = async { stop.wait_for(|s| *s).await.is_ok() };
                let signalled = tokio::select! {
                    r = hup.recv() => r.is_some(),
                    _ = stopped => false,
                };
                if !signalled {
                    return;
                }
                tracing::info!("SIGHUP: reloading the configuration");
                // The outcome is logged, audited and counted by `reload`.
                let _ = reloader.reload(Trigger::Sighup).await;
            }
        }))
    }
    #[cfg(not(unix))]
    {
        let _ = (&reloader, &mut stop);
        None
    }
}

#[cfg(test)]
#[path = "reload_tests.rs"]
mod tests;
