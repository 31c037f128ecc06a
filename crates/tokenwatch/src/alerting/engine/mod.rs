// The alert engine: one task, woken by arriving records (and a short tick for scraped signals),
// that evaluates every rule, drives alert lifecycles, enriches, snapshots, notifies and publishes.

pub mod burst;
pub mod enrich;
pub mod eval;
pub mod feed;
#[cfg(test)]
mod incident_tests;
pub mod inputs;
pub mod kept;
pub mod latency;
pub mod length;
pub mod lifecycle;
pub mod noise;
pub mod persist;
pub mod record;
#[cfg(test)]
mod reload_tests;
#[cfg(test)]
mod restore_tests;
pub mod scores;
pub mod thin;
pub mod vectors;
pub mod windows;

pub use inputs::AlertSink;

use crate::alerting::deliver::Notifier;
use crate::alerting::rules::{AlertingConfig, InhibitRule, Rule, default_inhibit_rules, render};
use crate::alerting::snapshot::{SnapshotContext, prune_snapshots, snapshot_dir, write_snapshot};
use crate::kernel::telemetry::Metrics;
use crate::pipeline::supervise::PanicWatch;
use enrich::EventHistory;
use lifecycle::{Timing, Tracked, Transition, fingerprint, group_labels};
use noise::{AlertMetrics, Firing, Incidents};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokenwatch_core::alert::EventInbox;
use tokenwatch_core::alert::{Alert, AlertState, AnomalyEvent};
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::signals::SharedSignals;
use tokenwatch_detect as det;
use tokenwatch_store::{SpanQuery, Store};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

/// Records waiting for the engine; beyond this the sink drops (and counts) them.
const RECORD_QUEUE: usize = 65_536;
/// Shortest time between two evaluations.
const MIN_EVAL_GAP: Duration = Duration::from_millis(50);
const SPAN_POLL_MS: i64 = 5_000;
const MAX_RESOLVED: usize = 1_000;
/// The value of a rule's grouping labels on the alert its folded label sets share.
const OTHER: &str = "__other__";
/// The annotation of that alert: how many label sets it stood for at the last evaluation.
pub const FOLDED_ANNOTATION: &str = "folded_label_sets";

/// A rule's events of one evaluation by fingerprint: the grouping labels and the strongest event.
type Groups = BTreeMap<String, (BTreeMap<String, String>, AnomalyEvent)>;
/// How often old snapshots are deleted (and once at start).
const SNAPSHOT_PRUNE_EVERY: Duration = Duration::from_secs(24 * 3600);

/// Alerts as the API sees them: active (pending, firing) and recently resolved.
#[derive(Default)]
pub struct AlertBook {
    inner: Mutex<BookInner>,
}

#[derive(Default)]
struct BookInner {
    active: Vec<Alert>,
    resolved: Vec<Alert>,
    /// The rules evaluated now, in evaluation order (`GET /api/v1/rules`).
    rules: Vec<RuleInfo>,
}

/// A rule as the rules listing shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RuleInfo {
    pub name: String,
    pub detector: String,
    pub signal: String,
    pub severity: tokenwatch_core::alert::Severity,
    pub group_by: Vec<String>,
    pub for_ms: i64,
    pub window_ms: i64,
    pub grade: Option<String>,
}

impl RuleInfo {
    fn of(rule: &Rule) -> RuleInfo {
        RuleInfo {
            name: rule.name.clone(),
            detector: rule.detector.clone(),
            signal: rule.signal.clone(),
            severity: rule.severity,
            group_by: rule.group_by.clone(),
            for_ms: rule.for_ms,
            window_ms: rule.window_ms,
            grade: rule.grade.clone(),
        }
    }
}

impl AlertBook {
    /// Active alerts (newest first), then resolved ones (newest first).
    pub fn list(&self) -> Vec<Alert> {
        let b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        b.active.iter().chain(b.resolved.iter()).cloned().collect()
    }

    /// By alert id, or by fingerprint (its current or latest activation).
    pub fn get(&self, id: &str) -> Option<Alert> {
        let b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let all = || b.active.iter().chain(b.resolved.iter());
        all()
            .find(|a| a.id == id)
            .or_else(|| all().find(|a| a.fingerprint == id))
            .cloned()
    }

    /// The rules evaluated now (empty while alerting is disabled).
    pub fn rules(&self) -> Vec<RuleInfo> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rules
            .clone()
    }

    fn publish(&self, active: Vec<Alert>, resolved: Vec<Alert>) {
        let mut b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        b.active = active;
        b.resolved = resolved;
    }

    fn publish_rules(&self, rules: &[Rule]) {
        let mut b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        b.rules = rules.iter().map(RuleInfo::of).collect();
    }
}

/// New rules and settings from a configuration reload, applied by the engine between two
/// evaluations (`EngineControl::reconfigure`).
pub struct Reconfigure {
    /// The compiled rules of the new configuration, in evaluation order.
    pub rules: Vec<Rule>,
    /// Per rule of `rules`: its configuration is the same as the running rule's of that name,
    /// so the running rule is kept with its detector's state (baselines, windows).
    pub unchanged: Vec<bool>,
    /// Inhibition, causal graph, resolve and pending timing, evaluation interval.
    pub cfg: AlertingConfig,
    /// The SLOs to count from now on; None: unchanged.
    pub slos: Option<Vec<crate::alerting::slo::SloConfig>>,
    /// The configuration snapshots show from now on (`Config::redacted_json` of the running one).
    pub config_json: Option<serde_json::Value>,
}

/// Hands configuration reloads to the running engine.
#[derive(Clone)]
pub struct EngineControl(mpsc::UnboundedSender<Reconfigure>);

impl EngineControl {
    /// Queue `r` for the engine; false when the engine has stopped.
    pub fn reconfigure(&self, r: Reconfigure) -> bool {
        self.0.send(r).is_ok()
    }
}

/// How long request records must be kept for `rules`, and embeddings (None: not at all).
fn retentions(rules: &[Rule]) -> (i64, Option<i64>) {
    let retention = rules
        .iter()
        .map(|r| r.compiled.retention_ms(&r.spec))
        .max()
        .unwrap_or(120_000)
        .clamp(120_000, 3_600_000);
    let embedding_retention = rules
        .iter()
        .filter_map(|r| r.compiled.embedding_retention_ms(&r.spec))
        .max();
    (retention, embedding_retention)
}

/// What the engine needs from the rest of the process.
pub struct EngineDeps {
    /// The spend budgets (`budgets:`), seeded and publishing; empty by default.
    pub budgets: crate::alerting::budget::BudgetTracker,
    pub signals: SharedSignals,
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    pub notifier: Option<Notifier>,
    /// Set when snapshots are enabled.
    pub snapshot: Option<SnapshotContext>,
    pub shutdown: watch::Receiver<bool>,
    /// Maps spans to components for the latency breakdown measured from traces.
    pub components: Arc<crate::pipeline::trace_components::ComponentMap>,
    /// The proxy's route splits (canary rollback reads them); empty without a proxy.
    pub splits: Arc<crate::kernel::splits::SplitBoard>,
    /// Where a detector's decision to act goes (the act stage, `crate::act`).
    pub actions: Arc<dyn crate::kernel::actions::Actions>,
    /// Where the engine's status shows (`/readyz`'s `alerting`): `ok`, or the panics it caught
    /// (`crate::pipeline::supervise`). None: nowhere.
    pub health: Option<crate::sources::Components>,
}

pub struct Started {
    pub book: Arc<AlertBook>,
    /// Register in the pipeline's sink list.
    pub sink: AlertSink,
    pub task: JoinHandle<()>,
    /// The SLOs' statuses, published by the engine.
    pub slos: Arc<crate::alerting::slo::SloBook>,
    /// The scaling recommendations, published by the engine.
    pub scaling: Arc<crate::alerting::slo::scaling::ScalingBook>,
    /// Anomaly events from outside the rules (log templates), for root cause.
    pub inbox: EventInbox,
    /// Rules and settings of a configuration reload go to the engine through this.
    pub control: EngineControl,
}

/// The causal graph: the spec's defaults (unless replaced) with configured edges added or replacing.
pub fn causal_graph(cfg: &AlertingConfig) -> det::CausalGraph {
    let mut g = if cfg.causal_graph.replace_defaults {
        det::CausalGraph { edges: Vec::new() }
    } else {
        det::CausalGraph::default()
    };
    for e in &cfg.causal_graph.edges {
        g.edges
            .retain(|x| !(x.cause == e.cause && x.effect == e.effect));
        g.edges.push(det::CausalEdge {
            cause: e.cause.clone(),
            effect: e.effect.clone(),
            confidence: e.confidence,
            delay_ms: e.delay.0.as_millis() as i64,
        });
    }
    g
}

/// Start the engine task, counting the spec's default SLOs.
pub fn start(cfg: &AlertingConfig, rules: Vec<Rule>, deps: EngineDeps) -> Started {
    start_with_slos(
        cfg,
        rules,
        deps,
        &crate::alerting::slo::default_slos(),
        &crate::alerting::slo::scaling::ScalingConfig::default(),
    )
}

/// Start the engine task; it counts `slos` and publishes them (`Started::slos`, `/metrics`), and
/// steps the scaling recommendation (`Started::scaling`).
pub fn start_with_slos(
    cfg: &AlertingConfig,
    rules: Vec<Rule>,
    deps: EngineDeps,
    slos: &[crate::alerting::slo::SloConfig],
    scaling: &crate::alerting::slo::scaling::ScalingConfig,
) -> Started {
    let (tx, rx) = mpsc::channel(RECORD_QUEUE);
    let wake = Arc::new(Notify::new());
    let dropped = Arc::new(AtomicU64::new(0));
    let sink = AlertSink {
        feed: inputs::EngineFeed {
            tx,
            wake: wake.clone(),
            dropped: dropped.clone(),
            dims: Arc::default(),
        },
    };
    let book = Arc::new(AlertBook::default());
    let (retention, embedding_retention) = retentions(&rules);
    let (snap_tx, snap_rx) = mpsc::channel(256);
    let slo_book = Arc::new(crate::alerting::slo::SloBook::default());
    let scaling_book = Arc::new(crate::alerting::slo::scaling::ScalingBook::default());
    let scaler = crate::alerting::slo::scaling::Scaler::new(
        scaling,
        scaling_book.clone(),
        Some(&deps.metrics),
    );
    let slo_tracker = crate::alerting::slo::tracker::SloTracker::new(slos).publishing(
        slo_book.clone(),
        Some(crate::alerting::slo::metrics::SloMetrics::register(
            &deps.metrics,
        )),
    );
    let inbox = EventInbox::default();
    let mut engine = Engine {
        rules,
        tracked: HashMap::new(),
        resolved: VecDeque::new(),
        inputs: inputs::Inputs::new(retention, cfg.max_records_per_model)
            .with_total_budget(cfg.max_records)
            .with_embedding_retention(embedding_retention)
            .with_slos(slo_tracker)
            .with_budgets(deps.budgets)
            .with_score_metrics(scores::ScoreMetrics::register(&deps.metrics)),
        windows: Default::default(),
        scaler,
        history: EventHistory::new(cfg.event_lookback.0.as_millis() as i64),
        inbox: inbox.clone(),
        incidents: Incidents::new(cfg.incident_window.0.as_millis() as i64),
        metrics: AlertMetrics::register(&deps.metrics),
        kept_metrics: kept::KeptMetrics::register(&deps.metrics),
        inhibit: cfg
            .inhibit_rules
            .clone()
            .unwrap_or_else(default_inhibit_rules),
        graph: causal_graph(cfg),
        resolve_after_ms: cfg.resolve_after.0.as_millis() as i64,
        clean_evaluations: cfg.resolve_clean_evaluations,
        pending_grace_ms: cfg.pending_grace.0.as_millis() as i64,
        keep_resolved_ms: cfg.keep_resolved.0.as_millis() as i64,
        max_alerts_per_rule: cfg.max_alerts_per_rule,
        fold_warned: HashSet::new(),
        book: book.clone(),
        signals: deps.signals,
        store: deps.store.clone(),
        notifier: deps.notifier,
        snapshot: deps.snapshot.map(Arc::new),
        snap_tx,
        components: deps.components,
        splits: deps.splits,
        actions: deps.actions,
        breakdowns: enrich::TraceBreakdowns::default(),
        persist: persist::Persist::start(deps.store.clone()),
        spans: Vec::new(),
        last_span_poll: i64::MIN,
        dropped,
        dropped_seen: 0,
        slo_counts_seq: 0,
        interval: cfg.evaluation_interval.0.max(Duration::from_millis(10)),
    };
    engine.restore(now_unix_ms());
    engine.publish();
    book.publish_rules(&engine.rules);
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let (health, metrics) = (deps.health.clone(), deps.metrics.clone());
    let watch = PanicWatch::new("alerting", deps.health, &deps.metrics);
    let run = engine.run(rx, snap_rx, control_rx, wake, deps.shutdown, watch);
    let task = tokio::spawn(async move {
        use futures_util::FutureExt;
        // `run` catches the panics of its evaluations; one elsewhere ends the engine, visibly.
        if let Err(payload) = std::panic::AssertUnwindSafe(run).catch_unwind().await {
            let why = format!(
                "the alert engine ended on a panic ({}); alerts are no longer evaluated until a restart",
                crate::pipeline::supervise::panic_message(&*payload)
            );
            PanicWatch::new("alerting", health, &metrics).stopped(&why);
        }
    });
    Started {
        slos: slo_book,
        scaling: scaling_book,
        book,
        sink,
        task,
        inbox,
        control: EngineControl(control_tx),
    }
}

struct Engine {
    rules: Vec<Rule>,
    tracked: HashMap<String, Tracked>,
    resolved: VecDeque<Alert>,
    inputs: inputs::Inputs,
    /// The incremental windows over `inputs` the latency rules, `ks_drift` and
    /// `ab_regression` share.
    windows: windows::SharedWindows,
    /// The scaling recommendation per model (`crate::alerting::slo::scaling`).
    scaler: crate::alerting::slo::scaling::Scaler,
    history: EventHistory,
    inbox: EventInbox,
    incidents: Incidents,
    metrics: AlertMetrics,
    kept_metrics: kept::KeptMetrics,
    inhibit: Vec<InhibitRule>,
    graph: det::CausalGraph,
    resolve_after_ms: i64,
    clean_evaluations: u32,
    pending_grace_ms: i64,
    keep_resolved_ms: i64,
    /// Active alerts a rule may hold; new label sets beyond fold into its `__other__` alert.
    max_alerts_per_rule: usize,
    /// Rules whose folding was warned about (once per rule).
    fold_warned: HashSet<String>,
    book: Arc<AlertBook>,
    signals: SharedSignals,
    store: Arc<dyn Store>,
    notifier: Option<Notifier>,
    snapshot: Option<Arc<SnapshotContext>>,
    snap_tx: mpsc::Sender<(String, String)>,
    components: Arc<crate::pipeline::trace_components::ComponentMap>,
    splits: Arc<crate::kernel::splits::SplitBoard>,
    actions: Arc<dyn crate::kernel::actions::Actions>,
    /// Latency breakdowns measured from traces, read off the engine's thread after `enrich`.
    breakdowns: enrich::TraceBreakdowns,
    persist: persist::Persist,
    spans: Vec<(String, bool)>,
    last_span_poll: i64,
    dropped: Arc<AtomicU64>,
    dropped_seen: u64,
    /// The last scraped counts the SLOs counted (the signal board's counts log).
    slo_counts_seq: u64,
    /// Longest time between two evaluations (`alerting.evaluation_interval`).
    interval: Duration,
}

impl Engine {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<inputs::Input>,
        mut snap_rx: mpsc::Receiver<(String, String)>,
        mut control: mpsc::UnboundedReceiver<Reconfigure>,
        wake: Arc<Notify>,
        mut stop: watch::Receiver<bool>,
        mut panics: PanicWatch,
    ) {
        let mut last: Option<tokio::time::Instant> = None;
        let mut pruned: Option<tokio::time::Instant> = None;
        loop {
            if pruned.is_none_or(|p| p.elapsed() >= SNAPSHOT_PRUNE_EVERY) {
                pruned = Some(tokio::time::Instant::now());
                self.prune_snapshots();
            }
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(self.interval) => {}
                Some((id, path)) = snap_rx.recv() => { self.attach_snapshot(&id, path); continue; }
                Some(r) = control.recv() => { self.reconfigure(r, now_unix_ms()); continue; }
                _ = stop.wait_for(|s| *s) => break,
            }
            if let Some(since) = last.map(|l| l.elapsed())
                && since < MIN_EVAL_GAP
            {
                tokio::time::sleep(MIN_EVAL_GAP - since).await;
            }
            last = Some(tokio::time::Instant::now());
            // A panic in draining or evaluating is caught: the records of this evaluation are
            // dropped (counted), the engine keeps its state and evaluates again next time.
            let drained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                inputs::drain(&mut rx, &mut self.inputs)
            }));
            let new_records = match drained {
                Ok(r) => r,
                Err(payload) => {
                    panics.caught(&*payload, 0);
                    continue;
                }
            };
            self.poll_spans().await;
            let n = new_records.len() as u64;
            let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.step(new_records, now_unix_ms())
            }));
            if let Err(payload) = stepped {
                self.metrics.dropped_records.inc_by(n);
                panics.caught(&*payload, n);
            }
        }
        // Everything queued for the store is written before the engine ends.
        if let Some(writer) = self.persist.finish() {
            let _ = tokio::task::spawn_blocking(move || writer.join()).await;
        }
    }

    /// Delete snapshots older than the raw-record retention, off the engine's thread.
    fn prune_snapshots(&self) {
        let Some(ctx) = self.snapshot.clone() else {
            return;
        };
        tokio::task::spawn_blocking(move || {
            let dir = snapshot_dir(&ctx.data_dir);
            match prune_snapshots(&dir, ctx.retention, std::time::SystemTime::now()) {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, dir = %dir.display(), "deleted old snapshots"),
                Err(e) => {
                    tracing::warn!(error = %e, dir = %dir.display(), "deleting old snapshots failed")
                }
            }
        });
    }

    /// Alerts stored before a restart: resolved ones (within `keep_resolved`) are listed again;
    /// pending and firing ones are tracked again with the same id, fingerprint, activation and
    /// incident, as if their condition held just now (gone, it resolves through the normal
    /// resolve delay), and are not announced again. One whose rule no longer exists is resolved.
    fn restore(&mut self, now: i64) {
        let loaded = match self.store.load_alerts(now - self.keep_resolved_ms) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "reading stored alerts failed: starting without them");
                return;
            }
        };
        let mut ended = Vec::new();
        for mut a in loaded {
            if a.state == AlertState::Resolved {
                if self.resolved.len() < MAX_RESOLVED {
                    self.resolved.push_back(a);
                }
                continue;
            }
            let rule_index = self.rules.iter().position(|r| r.name == a.rule);
            match rule_index {
                Some(i) if !self.tracked.contains_key(&a.fingerprint) => {
                    if let Some(n) = &self.notifier {
                        n.restore(&a);
                    }
                    self.incidents.restore(&a, now);
                    self.tracked.insert(
                        a.fingerprint.clone(),
                        Tracked {
                            alert: a,
                            rule_index: i,
                            last_true_ms: now,
                            clean_evaluations: 0,
                        },
                    );
                }
                _ => {
                    a.state = AlertState::Resolved;
                    a.resolved_at_unix_ms = Some(now);
                    ended.push(a);
                }
            }
        }
        let restored = self
            .tracked
            .values()
            .map(|t| &t.alert)
            .chain(self.resolved.iter());
        self.persist.seed(restored, now);
        tracing::info!(
            active = self.tracked.len(),
            resolved = self.resolved.len(),
            ended = ended.len(),
            "restored stored alerts"
        );
        for a in ended {
            tracing::info!(rule = %a.rule, alert = %a.id, "stored alert resolved: its rule no longer exists");
            if let Some(n) = &self.notifier {
                n.notify(&a);
            }
            self.resolved.push_front(a);
        }
        self.resolved.truncate(MAX_RESOLVED);
    }

    /// A configuration reload, between two evaluations: the new rules replace the old ones (a
    /// rule whose configuration is unchanged stays as it is, detector state included); alerts of
    /// rules that still exist keep their state, those of removed rules are resolved (and
    /// announced as resolved); the inhibition, causal graph and timing settings are replaced.
    fn reconfigure(&mut self, r: Reconfigure, now: i64) {
        let old_names: Vec<String> = self.rules.iter().map(|x| x.name.clone()).collect();
        let mut old: Vec<Option<Rule>> = std::mem::take(&mut self.rules)
            .into_iter()
            .map(Some)
            .collect();
        let mut rules = Vec::with_capacity(r.rules.len());
        let mut kept = 0;
        for (i, new) in r.rules.into_iter().enumerate() {
            let same = r.unchanged.get(i).copied().unwrap_or(false);
            let running = old_names
                .iter()
                .position(|n| *n == new.name)
                .filter(|_| same)
                .and_then(|k| old[k].take());
            kept += usize::from(running.is_some());
            rules.push(running.unwrap_or(new));
        }
        let mut ended = Vec::new();
        for (fp, t) in self.tracked.iter_mut() {
            let name = old_names
                .get(t.rule_index)
                .map(String::as_str)
                .unwrap_or_default();
            match rules.iter().position(|x| x.name == name) {
                Some(i) => t.rule_index = i,
                None => ended.push(fp.clone()),
            }
        }
        for fp in &ended {
            let Some(mut t) = self.tracked.remove(fp) else {
                continue;
            };
            if let Some(Some(rule)) = old.get(t.rule_index) {
                fill_annotations(rule, &mut t.alert);
            }
            t.alert.state = AlertState::Resolved;
            t.alert.resolved_at_unix_ms = Some(now);
            tracing::info!(
                rule = %t.alert.rule,
                alert = %t.alert.id,
                "alert resolved: its rule was removed by a configuration reload"
            );
            if !t.alert.annotations.contains_key("inhibited_by")
                && let Some(n) = &self.notifier
            {
                n.notify(&t.alert);
            }
            self.resolved.push_front(t.alert);
        }
        self.resolved.truncate(MAX_RESOLVED);
        let (retention, embedding_retention) = retentions(&rules);
        self.inputs.set_retention(retention, embedding_retention);
        if let Some(slos) = &r.slos {
            self.inputs.slos_mut().reconfigure(slos, now);
        }
        let cfg = &r.cfg;
        self.inputs
            .set_budget(cfg.max_records_per_model, cfg.max_records);
        self.inhibit = cfg
            .inhibit_rules
            .clone()
            .unwrap_or_else(default_inhibit_rules);
        self.graph = causal_graph(cfg);
        self.resolve_after_ms = cfg.resolve_after.0.as_millis() as i64;
        self.clean_evaluations = cfg.resolve_clean_evaluations;
        self.pending_grace_ms = cfg.pending_grace.0.as_millis() as i64;
        self.keep_resolved_ms = cfg.keep_resolved.0.as_millis() as i64;
        self.max_alerts_per_rule = cfg.max_alerts_per_rule;
        self.interval = cfg.evaluation_interval.0.max(Duration::from_millis(10));
        if let (Some(json), Some(ctx)) = (r.config_json, &self.snapshot) {
            self.snapshot = Some(Arc::new(SnapshotContext {
                signals: ctx.signals.clone(),
                store: ctx.store.clone(),
                aggregator: ctx.aggregator.clone(),
                config_json: json,
                data_dir: ctx.data_dir.clone(),
                retention: ctx.retention,
            }));
        }
        self.rules = rules;
        tracing::info!(
            rules = self.rules.len(),
            kept,
            resolved = ended.len(),
            "alert rules reloaded"
        );
        self.book.publish_rules(&self.rules);
        self.publish();
    }

    async fn poll_spans(&mut self) {
        let Some(pattern) = self.rules.iter().find_map(|r| r.compiled.span_pattern()) else {
            return;
        };
        let now = now_unix_ms();
        if now.saturating_sub(self.last_span_poll) < SPAN_POLL_MS {
            return;
        }
        self.last_span_poll = now;
        let store = self.store.clone();
        let q = SpanQuery {
            from_unix_nano: Some((now - 30_000) * 1_000_000),
            limit: 5_000,
            ..SpanQuery::default()
        };
        if let Ok(Ok(spans)) = tokio::task::spawn_blocking(move || store.query_spans(&q)).await {
            self.spans = spans
                .into_iter()
                .map(|s| {
                    let oom = s.status_message.to_lowercase().contains(&pattern)
                        || s.attributes_json.to_lowercase().contains(&pattern);
                    (s.trace_id, oom)
                })
                .collect();
        }
    }

    /// One evaluation of every rule at `now`.
    fn step(&mut self, new_records: Vec<record::Rec>, now: i64) {
        for r in &new_records {
            crate::kernel::failpoint::panic_on_model("alerting", &r.model);
        }
        self.apply_trace_breakdowns();
        for r in &new_records {
            self.inputs.ingest(r.clone());
        }
        {
            // Models no record names are counted by the SLOs from their runtime's scrapes.
            let board = self.signals.read().unwrap_or_else(|p| p.into_inner());
            let log = board.counts();
            for (_, c) in log.since(self.slo_counts_seq) {
                self.inputs.slos_mut().observe_scraped(c);
            }
            self.slo_counts_seq = log.last_seq();
        }
        self.inputs.prune(now);
        self.kept_metrics.publish(
            (self.inputs.evicted_records(), self.inputs.thinned_records()),
            self.inputs.kept_bytes() + self.windows.lock().bytes(),
        );
        self.history.prune(now);
        let mut outside = self.inbox.take();
        if !outside.is_empty() {
            let board = self.signals.read().unwrap_or_else(|p| p.into_inner());
            for e in &mut outside {
                board.placement().complete_labels(&mut e.labels);
            }
        }
        for e in &outside {
            self.history.record(e);
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        self.metrics
            .dropped_records
            .inc_by(dropped - self.dropped_seen);
        self.dropped_seen = dropped;

        let mut per_rule: Vec<Vec<AnomalyEvent>> = Vec::with_capacity(self.rules.len());
        {
            let board = self.signals.read().unwrap_or_else(|p| p.into_inner());
            let semantic_drift_models = self.history.models_with_ongoing("semantic_drift", now);
            let cx = eval::EvalCtx {
                inputs: &self.inputs,
                windows: &self.windows,
                board: &board,
                splits: &self.splits,
                actions: self.actions.as_ref(),
                new_records: &new_records,
                spans: &self.spans,
                semantic_drift_models: &semantic_drift_models,
                now,
            };
            for rule in self.rules.iter_mut() {
                let mut events = rule.evaluate(&cx);
                // A GPU's events name the model and replica it works for, when known: its
                // alert and its replica's symptoms then meet in one incident.
                for e in &mut events {
                    board.placement().complete_labels(&mut e.labels);
                }
                per_rule.push(events);
            }
        }
        self.scaler.step(&self.signals, &self.inputs, now);
        self.store_annotations();
        self.metrics.evaluations.inc();
        let mut transitions = Vec::new();
        for (i, events) in per_rule.into_iter().enumerate() {
            for e in &events {
                self.history.record(e);
            }
            self.apply(i, events, now, &mut transitions);
        }
        for (fp, t) in transitions {
            self.on_transition(&fp, t, now);
        }
        for t in self.tracked.values() {
            self.incidents.touch(&t.alert, now);
        }
        for n in self.incidents.close_idle(now) {
            self.metrics.per_incident.observe(n as f64);
        }
        self.metrics
            .open_incidents
            .set(self.incidents.open_count() as i64);
        let keep = self.keep_resolved_ms;
        while self
            .resolved
            .back()
            .is_some_and(|a| now - a.resolved_at_unix_ms.unwrap_or(now) > keep)
            || self.resolved.len() > MAX_RESOLVED
        {
            self.resolved.pop_back();
        }
        self.publish();
    }

    /// Group a rule's events by its labels and step each of its alerts.
    fn apply(
        &mut self,
        i: usize,
        events: Vec<AnomalyEvent>,
        now: i64,
        out: &mut Vec<(String, Transition)>,
    ) {
        let rule = &self.rules[i];
        let mut groups: Groups = BTreeMap::new();
        for e in events {
            let gl = group_labels(&e, &rule.group_by);
            let fp = fingerprint(&rule.name, &gl);
            match groups.get(&fp) {
                Some((_, best)) if best.score >= e.score => {}
                _ => {
                    groups.insert(fp, (gl, e));
                }
            }
        }
        let folded = self.fold_beyond_cap(i, &mut groups);
        let rule = &self.rules[i];
        let timing = Timing {
            for_ms: rule.for_ms,
            resolve_after_ms: rule.resolve_after_ms.unwrap_or(self.resolve_after_ms),
            clean_evaluations: self.clean_evaluations,
            pending_grace_ms: self.pending_grace_ms,
        };
        for (fp, t) in self.tracked.iter_mut().filter(|(_, t)| t.rule_index == i) {
            if !groups.contains_key(fp)
                && let Some(tr) = t.step(None, now, &timing)
            {
                out.push((fp.clone(), tr));
            }
        }
        for (fp, (gl, e)) in groups {
            if let Some(t) = self.tracked.get_mut(&fp) {
                if let Some(tr) = t.step(Some(&e), now, &timing) {
                    out.push((fp, tr));
                }
                continue;
            }
            let mut t = Tracked::new(
                &rule.name,
                i,
                rule.severity,
                rule.grade.clone(),
                gl,
                &e,
                now,
            );
            out.push((fp.clone(), Transition::Pending));
            if let Some(tr) = t.step(Some(&e), now, &timing) {
                out.push((fp.clone(), tr));
            }
            self.tracked.insert(fp, t);
        }
        if let Some((fp, n)) = folded
            && let Some(t) = self.tracked.get_mut(&fp)
        {
            t.alert
                .annotations
                .insert(FOLDED_ANNOTATION.into(), n.to_string());
        }
    }

    /// Rule `i`'s new label sets beyond `max_alerts_per_rule` active alerts fold into its
    /// `__other__` alert (`fold_groups`); counted, the first fold of a rule warned about.
    fn fold_beyond_cap(&mut self, i: usize, groups: &mut Groups) -> Option<(String, usize)> {
        let cap = self.max_alerts_per_rule;
        let rule = &self.rules[i];
        let tracked: HashSet<&str> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.rule_index == i)
            .map(|(fp, _)| fp.as_str())
            .collect();
        let (fp, n) = fold_groups(groups, &rule.name, &rule.group_by, &tracked, cap)?;
        self.metrics
            .folded
            .get_or_create(&noise::RuleLabels {
                rule: rule.name.clone(),
            })
            .inc_by(n as u64);
        if self.fold_warned.insert(rule.name.clone()) {
            tracing::warn!(
                rule = %rule.name,
                max_alerts_per_rule = cap,
                folded = n,
                "a rule holds alerting.max_alerts_per_rule alerts: new label sets fold into its __other__ alert (counted in tokenwatch_alerts_folded_total; warned once per rule)"
            );
        }
        Some((fp, n))
    }

    fn on_transition(&mut self, fp: &str, tr: Transition, now: i64) {
        match tr {
            Transition::Dropped => {
                if let Some(t) = self.tracked.remove(fp) {
                    self.persist.forget(&t.alert.id);
                }
            }
            Transition::Pending => {
                if let Some(t) = self.tracked.get_mut(fp) {
                    let rule = &self.rules[t.rule_index];
                    fill_annotations(rule, &mut t.alert);
                    // A zero-`for` alert is already firing here: it goes out after `Fired` has
                    // enriched it (root cause, inhibition), not before.
                    if t.alert.state == AlertState::Pending {
                        self.notify(fp);
                    }
                }
            }
            Transition::Fired => {
                self.enrich(fp, now);
                if let Some(t) = self.tracked.get(fp) {
                    tracing::warn!(rule = %t.alert.rule, labels = ?t.alert.labels, summary = %t.alert.annotations.get("summary").cloned().unwrap_or_default(), "alert firing");
                    if let Some(ctx) = &self.snapshot {
                        let (ctx, alert, tx) = (ctx.clone(), t.alert.clone(), self.snap_tx.clone());
                        tokio::spawn(async move {
                            let a = alert.clone();
                            let res = tokio::task::spawn_blocking(move || {
                                write_snapshot(&snapshot_dir(&ctx.data_dir), &a, &ctx)
                            })
                            .await;
                            match res {
                                Ok(Ok(path)) => {
                                    let _ = tx.send((alert.id, path.display().to_string())).await;
                                }
                                Ok(Err(e)) => {
                                    tracing::warn!(alert = %alert.id, error = %e, "snapshot failed")
                                }
                                Err(e) => {
                                    tracing::warn!(alert = %alert.id, error = %e, "snapshot task failed")
                                }
                            }
                        });
                    }
                }
                self.notify(fp);
            }
            Transition::Resolved => {
                if let Some(mut t) = self.tracked.remove(fp) {
                    let rule = &self.rules[t.rule_index];
                    fill_annotations(rule, &mut t.alert);
                    tracing::info!(rule = %t.alert.rule, labels = ?t.alert.labels, "alert resolved");
                    if !t.alert.annotations.contains_key("inhibited_by")
                        && let Some(n) = &self.notifier
                    {
                        n.notify(&t.alert);
                    }
                    self.resolved.push_front(t.alert);
                }
            }
        }
    }

    /// Per-request annotations of this evaluation go to the store, off the engine's thread
    /// (inline when there is no runtime, as in unit tests).
    fn store_annotations(&mut self) {
        let rows: Vec<_> = self
            .rules
            .iter_mut()
            .flat_map(|r| r.compiled.take_annotations())
            .collect();
        if rows.is_empty() {
            return;
        }
        let store = self.store.clone();
        let write = move || {
            if let Err(e) = store.insert_annotations(&rows) {
                tracing::warn!(error = %e, rows = rows.len(), "storing request annotations failed");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(write);
            }
            Err(_) => write(),
        }
    }

    fn notify(&self, fp: &str) {
        if let (Some(n), Some(t)) = (&self.notifier, self.tracked.get(fp))
            && !t.alert.annotations.contains_key("inhibited_by")
        {
            n.notify(&t.alert);
        }
    }

    /// Root cause, latency breakdown, eviction ranking, incident and inhibition of a firing alert.
    fn enrich(&mut self, fp: &str, now: i64) {
        let Some(t) = self.tracked.get(fp) else {
            return;
        };
        let rule = &self.rules[t.rule_index];
        let mut alert = t.alert.clone();
        let model = alert.labels.get("model_id").cloned().unwrap_or_default();
        // The effect is the onset of the condition (when it first held), so delays compare onsets.
        let effect = alert.last_event.clone().map(|mut e| {
            e.at_unix_ms = e.at_unix_ms.min(alert.active_at_unix_ms);
            e
        });
        if let Some(effect) = &effect {
            alert.root_cause = enrich::root_cause(&self.graph, effect, &self.history);
            if let Some(logs) = enrich::log_evidence(&alert.root_cause, &self.history) {
                alert.annotations.insert("log_evidence".into(), logs);
            }
        }
        if rule.compiled.latency_symptom() && !model.is_empty() {
            // An instance's alert breaks down that instance's requests.
            let instance = alert.labels.get("instance").cloned().unwrap_or_default();
            let recs: Vec<&record::Rec> = self
                .inputs
                .window(&model, now - rule.window_ms, now)
                .filter(|r| instance.is_empty() || r.instance == instance)
                .collect();
            if let Some((text, json)) = enrich::latency_breakdown(&recs) {
                alert.annotations.insert("latency_breakdown".into(), text);
                alert
                    .annotations
                    .insert("latency_breakdown_json".into(), json.to_string());
                // The slowest requests' stored traces replace the estimate when they hold
                // spans (`apply_trace_breakdowns`, at a later evaluation).
                enrich::measure_from_traces(
                    self.store.clone(),
                    self.components.clone(),
                    alert.id.clone(),
                    enrich::slowest_traces(&recs),
                    self.breakdowns.clone(),
                );
            }
        }
        if rule.compiled.gpu_memory(&rule.spec) && !model.is_empty() {
            let board = self.signals.read().unwrap_or_else(|p| p.into_inner());
            if let Some(rank) = self
                .scaler
                .eviction_ranking(&board, &self.inputs, &model, now)
                && let Some((worst, _)) = rank.first()
            {
                alert
                    .annotations
                    .insert("eviction_candidate".into(), worst.clone());
                alert.annotations.insert(
                    "eviction_ranking".into(),
                    serde_json::json!(rank).to_string(),
                );
            }
        }
        if let Some(c) = alert.root_cause.first() {
            alert.annotations.insert(
                "root_cause".into(),
                format!(
                    "{} (rank {:.2}, path {})",
                    c.summary,
                    c.rank,
                    c.path.join(" → ")
                ),
            );
        }
        let firing: Vec<Firing> = self
            .tracked
            .iter()
            .filter(|(f, _)| f.as_str() != fp)
            .map(|(_, t)| Firing {
                rule: &self.rules[t.rule_index].name,
                detector: &self.rules[t.rule_index].detector,
                alert: &t.alert,
            })
            .collect();
        if let Some(by) = noise::inhibitor(
            &self.inhibit,
            &rule.name,
            &rule.detector,
            &alert.labels,
            &firing,
        ) {
            alert
                .annotations
                .insert("inhibited_by".into(), format!("{} ({})", by.rule, by.id));
        }
        drop(firing);
        let cause_incident = self
            .cause_incident(&alert)
            .or_else(|| self.effect_incident(&alert));
        alert.incident_id = Some(
            self.incidents
                .assign(&alert, cause_incident.as_deref(), now),
        );
        fill_annotations(rule, &mut alert);
        if let Some(t) = self.tracked.get_mut(fp) {
            t.alert = alert;
        }
    }

    /// The incident of the alert (active or recently resolved) that the new alert's root-cause
    /// chain names, best-ranked cause first: the alert of that cause's detector whose labels all
    /// agree with the cause's.
    fn cause_incident(&self, alert: &Alert) -> Option<String> {
        let others = self
            .tracked
            .values()
            .map(|t| &t.alert)
            .chain(self.resolved.iter())
            .filter(|a| a.id != alert.id);
        let known: Vec<&Alert> = others.filter(|a| a.incident_id.is_some()).collect();
        alert.root_cause.iter().find_map(|c| {
            known
                .iter()
                .filter(|a| {
                    a.last_event
                        .as_ref()
                        .is_some_and(|e| e.detector == c.detector)
                        && lifecycle::grouping_labels(a).all(|(k, v)| c.labels.get(k) == Some(v))
                })
                .max_by_key(|a| a.active_at_unix_ms)
                .and_then(|a| a.incident_id.clone())
        })
    }

    /// The incident of an active alert that the new alert could have caused (its detector leads
    /// there in the causal graph, labels agreeing, onsets close enough): a leak whose alert fires
    /// after its replica's pressure or latency alert joins that alert's incident, the
    /// best-ranked one first. A cause's detector can be slower than its symptom's, so the two
    /// onsets are compared by their distance, whichever came first.
    fn effect_incident(&self, alert: &Alert) -> Option<String> {
        let mut cause = alert.last_event.clone()?;
        cause.at_unix_ms = cause.at_unix_ms.min(alert.active_at_unix_ms);
        let params = enrich::cause_params();
        self.tracked
            .values()
            .map(|t| &t.alert)
            .filter(|a| a.id != alert.id && a.incident_id.is_some())
            .filter_map(|a| {
                let mut effect = a.last_event.clone()?;
                let distance = (a.active_at_unix_ms - cause.at_unix_ms).abs();
                effect.at_unix_ms = cause.at_unix_ms.saturating_add(distance);
                let ranked =
                    det::rank_causes(&self.graph, &effect, std::slice::from_ref(&cause), &params);
                ranked.first().map(|c| (c.rank, a))
            })
            .max_by(|(ra, a), (rb, b)| {
                ra.total_cmp(rb)
                    .then(a.active_at_unix_ms.cmp(&b.active_at_unix_ms))
            })
            .and_then(|(_, a)| a.incident_id.clone())
    }

    /// Measured breakdowns that arrived since the last evaluation replace their alerts'
    /// estimates; the alert goes out again with them.
    fn apply_trace_breakdowns(&mut self) {
        let changed = enrich::apply_breakdowns(self.breakdowns.take(), &mut self.tracked);
        for fp in &changed {
            self.notify(fp);
        }
        if !changed.is_empty() {
            self.publish();
        }
    }

    fn attach_snapshot(&mut self, id: &str, path: String) {
        let fp = self
            .tracked
            .iter()
            .find(|(_, t)| t.alert.id == id)
            .map(|(f, _)| f.clone());
        if let Some(fp) = fp {
            if let Some(t) = self.tracked.get_mut(&fp) {
                t.alert.snapshot = Some(path);
            }
            self.notify(&fp);
        } else if let Some(a) = self.resolved.iter_mut().find(|a| a.id == id) {
            a.snapshot = Some(path);
        }
        self.publish();
    }

    fn publish(&mut self) {
        for t in self.tracked.values_mut() {
            if t.alert.state == AlertState::Firing {
                let rule = &self.rules[t.rule_index];
                fill_annotations(rule, &mut t.alert);
            }
        }
        let mut active: Vec<Alert> = self.tracked.values().map(|t| t.alert.clone()).collect();
        active.sort_by(|a, b| {
            b.active_at_unix_ms
                .cmp(&a.active_at_unix_ms)
                .then(a.id.cmp(&b.id))
        });
        let resolved: Vec<Alert> = self.resolved.iter().cloned().collect();
        self.persist
            .sync(active.iter(), resolved.iter(), now_unix_ms());
        self.metrics
            .set_alerts(active.iter().chain(resolved.iter()));
        self.book.publish(active, resolved);
    }
}

/// Summary and description from the rule's templates and the latest event.
/// A rule's new label sets (not in `tracked`, the fingerprints of its active alerts) beyond
/// `cap` active alerts are taken out of `groups` — the strongest events keep the places left —
/// and folded into one group whose grouping labels read `__other__`, carrying the strongest
/// folded event: (its fingerprint, how many label sets it stands for). None when all fit.
fn fold_groups(
    groups: &mut Groups,
    rule: &str,
    group_by: &[String],
    tracked: &HashSet<&str>,
    cap: usize,
) -> Option<(String, usize)> {
    let other_labels: BTreeMap<String, String> = group_by
        .iter()
        .map(|k| (k.clone(), OTHER.to_string()))
        .collect();
    let other_fp = fingerprint(rule, &other_labels);
    let active = tracked.iter().filter(|fp| **fp != other_fp).count();
    let mut new: Vec<String> = groups
        .keys()
        .filter(|fp| !tracked.contains(fp.as_str()) && **fp != other_fp)
        .cloned()
        .collect();
    if active + new.len() <= cap {
        return None;
    }
    new.sort_by(|a, b| {
        groups[b]
            .1
            .score
            .total_cmp(&groups[a].1.score)
            .then(a.cmp(b))
    });
    let room = cap.saturating_sub(active);
    let mut strongest: Option<AnomalyEvent> = groups.get(&other_fp).map(|(_, e)| e.clone());
    let mut n = 0usize;
    for fp in new.into_iter().skip(room) {
        let Some((_, e)) = groups.remove(&fp) else {
            continue;
        };
        n += 1;
        if strongest.as_ref().is_none_or(|s| e.score > s.score) {
            strongest = Some(e);
        }
    }
    let mut e = strongest?;
    for k in group_by {
        e.labels.insert(k.clone(), OTHER.to_string());
    }
    groups.insert(other_fp.clone(), (other_labels, e));
    Some((other_fp, n))
}

fn fill_annotations(rule: &Rule, alert: &mut Alert) {
    let ev = alert.last_event.as_ref();
    alert.annotations.insert(
        "summary".into(),
        render(&rule.summary, rule, &alert.labels, ev),
    );
    alert.annotations.insert(
        "description".into(),
        render(&rule.description, rule, &alert.labels, ev),
    );
    if let Some(e) = ev {
        alert
            .annotations
            .insert("detector_summary".into(), e.summary.clone());
    }
    if let Some(tpl) = &rule.runbook_url {
        alert.annotations.insert(
            "runbook_url".into(),
            crate::alerting::rules::render_url(tpl, rule, &alert.labels, ev),
        );
    }
}

/// What `app.rs` wires in: the record sink (when alerting is enabled), the API routes, the tasks.
pub struct AlertingHandle {
    pub sink: Option<AlertSink>,
    /// The alerts, for other readers of the API (fleet overview).
    pub book: Arc<AlertBook>,
    pub tasks: Vec<JoinHandle<()>>,
    /// The SLOs' statuses (never computed while alerting is disabled).
    pub slos: Arc<crate::alerting::slo::SloBook>,
    /// The scaling recommendations (none while alerting is disabled).
    pub scaling: Arc<crate::alerting::slo::scaling::ScalingBook>,
    /// Where anomaly events from outside the rules go (read only while alerting is enabled).
    pub events: EventInbox,
    /// The running engine's reload entry point (None while alerting is disabled).
    pub control: Option<EngineControl>,
}

/// The configuration sections the engine starts from (the assembly reads them out of the whole
/// configuration: `crate::app`).
pub struct EngineSections<'a> {
    pub alerting: &'a AlertingConfig,
    /// `slos:` as configured (None: the spec's defaults).
    pub slos: &'a Option<Vec<crate::alerting::slo::SloConfig>>,
    pub scaling: &'a crate::alerting::slo::scaling::ScalingConfig,
    /// `budgets:` as configured.
    pub budgets: &'a [crate::alerting::budget::BudgetConfig],
    pub traces: &'a crate::pipeline::trace_components::TracesConfig,
    /// The API's bound address: receivers' links when `delivery.external_url` is empty.
    pub listen: std::net::SocketAddr,
    /// Where snapshots are written, and how long they are kept (the raw-record retention).
    pub data_dir: std::path::PathBuf,
    pub raw_retention: Duration,
    /// The effective configuration as snapshots carry it, secrets redacted.
    pub config_json: serde_json::Value,
}

/// The proxy's routes as the engine meets them: the board it reads, and the port its decisions to
/// change them go through.
pub struct RouteHandles {
    pub splits: Arc<crate::kernel::splits::SplitBoard>,
    pub actions: Arc<dyn crate::kernel::actions::Actions>,
}

impl Default for RouteHandles {
    /// No proxy: no routes, and every action refused.
    fn default() -> Self {
        RouteHandles {
            splits: Arc::default(),
            actions: Arc::new(crate::kernel::actions::NoActions),
        }
    }
}

/// Compile the rules, start the notifier and the engine (when `alerting.enabled`); the engine's
/// The budgets of `budgets:` with what the stored records of their current periods spent, and
/// their gauges; a store that cannot answer leaves them counting from zero (logged).
fn start_budgets(
    budgets: &[crate::alerting::budget::BudgetConfig],
    store: &dyn Store,
    metrics: &Metrics,
) -> crate::alerting::budget::BudgetTracker {
    let now = tokenwatch_core::clock::now_unix_ms();
    if budgets.is_empty() {
        return Default::default();
    }
    let mut tracker = crate::alerting::budget::BudgetTracker::new(budgets, now).publishing(metrics);
    let seeded = tracker.seed(now, |since_unix_ms, until_unix_ms| {
        store.query_spend(&tokenwatch_store::SpendQuery {
            since_unix_ms,
            until_unix_ms,
        })
    });
    if let Err(e) = seeded {
        tracing::warn!(error = %e, "budgets: the stored spend of the current period could not be read; counting from now");
    }
    tracker.publish(now);
    tracker
}

/// status shows in `health` (`/readyz`'s `alerting`).
#[allow(clippy::too_many_arguments)]
pub fn start_from_config(
    cfg: EngineSections<'_>,
    signals: SharedSignals,
    store: Arc<dyn Store>,
    aggregator: Arc<Mutex<tokenwatch_core::aggregate::Aggregator>>,
    metrics: Arc<Metrics>,
    routes: RouteHandles,
    health: &crate::sources::Components,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<AlertingHandle> {
    let a = cfg.alerting;
    if !a.enabled {
        let book = Arc::new(AlertBook::default());
        return Ok(AlertingHandle {
            sink: None,
            book,
            tasks: Vec::new(),
            slos: Arc::default(),
            scaling: Arc::default(),
            events: EventInbox::default(),
            control: None,
        });
    }
    let rules = crate::alerting::rules::compile(a)
        .map_err(|(path, msg)| anyhow::anyhow!("{path}: {msg}"))?;
    let mut delivery = a.delivery.clone();
    delivery.resolve_external_url(cfg.listen);
    let (notifier, mut tasks) = Notifier::start(delivery, metrics.clone(), shutdown.clone());
    let snapshot = a.snapshots.then(|| SnapshotContext {
        signals: signals.clone(),
        store: store.clone(),
        aggregator,
        config_json: cfg.config_json.clone(),
        data_dir: cfg.data_dir.clone(),
        retention: cfg.raw_retention,
    });
    tracing::info!(rules = rules.len(), receivers = ?notifier.receiver_names(), "alerting enabled");
    let budgets = start_budgets(cfg.budgets, store.as_ref(), &metrics);
    let started = start_with_slos(
        a,
        rules,
        EngineDeps {
            budgets,
            signals,
            store: store.clone(),
            metrics,
            notifier: Some(notifier),
            snapshot,
            shutdown,
            components: Arc::new(crate::pipeline::trace_components::ComponentMap::new(
                cfg.traces,
            )),
            splits: routes.splits,
            actions: routes.actions,
            health: Some(health.clone()),
        },
        &crate::alerting::slo::effective(cfg.slos),
        cfg.scaling,
    );
    tasks.push(started.task);
    Ok(AlertingHandle {
        sink: Some(started.sink),
        book: started.book,
        slos: started.slos,
        scaling: started.scaling,
        tasks,
        events: started.inbox,
        control: Some(started.control),
    })
}

#[cfg(test)]
mod fold_tests {
    use super::*;

    fn event(model: &str, score: f64) -> AnomalyEvent {
        AnomalyEvent {
            detector: "d".into(),
            signal: "s".into(),
            labels: BTreeMap::from([("model_id".to_string(), model.to_string())]),
            score,
            at_unix_ms: 0,
            evidence: BTreeMap::new(),
            summary: format!("{model} is bad"),
        }
    }

    fn groups_of(models: impl Iterator<Item = (String, f64)>) -> Groups {
        let by = ["model_id".to_string()];
        models
            .map(|(m, score)| {
                let e = event(&m, score);
                let gl = group_labels(&e, &by);
                (fingerprint("r", &gl), (gl, e))
            })
            .collect()
    }

    #[test]
    fn a_storm_of_label_sets_becomes_the_cap_and_one_alert_with_a_count() {
        let by = ["model_id".to_string()];
        let mut groups = groups_of((0..5000).map(|i| (format!("m{i}"), f64::from(i))));
        let none = HashSet::new();
        let (fp, n) = fold_groups(&mut groups, "r", &by, &none, 10).unwrap();
        assert_eq!(groups.len(), 11, "10 alerts and __other__");
        assert_eq!(n, 4990);
        let (labels, e) = &groups[&fp];
        assert_eq!(labels["model_id"], "__other__");
        assert_eq!(e.labels["model_id"], "__other__");
        assert_eq!(e.score, 4989.0, "the strongest folded event");
        // The strongest label sets kept their own alerts.
        let kept: Vec<&str> = groups
            .values()
            .map(|(l, _)| l["model_id"].as_str())
            .filter(|m| *m != "__other__")
            .collect();
        assert!(
            kept.iter().all(|m| m[1..].parse::<u32>().unwrap() >= 4990),
            "{kept:?}"
        );
    }

    #[test]
    fn active_alerts_keep_their_places_and_label_sets_within_the_cap_are_untouched() {
        let by = ["model_id".to_string()];
        let mut groups = groups_of((0..3).map(|i| (format!("m{i}"), 1.0)));
        let before = groups.clone();
        assert_eq!(fold_groups(&mut groups, "r", &by, &HashSet::new(), 3), None);
        assert_eq!(groups.len(), before.len());
        // Two active alerts (m0 and one no longer firing) leave one place for m1 or m2.
        let fps: Vec<String> = before.keys().cloned().collect();
        let m0 = before
            .iter()
            .find(|(_, (l, _))| l["model_id"] == "m0")
            .unwrap()
            .0
            .clone();
        let tracked: HashSet<&str> = [m0.as_str(), "gone"].into_iter().collect();
        let (_, n) = fold_groups(&mut groups, "r", &by, &tracked, 3).unwrap();
        assert_eq!(n, 1);
        assert_eq!(groups.len(), 3, "m0, one new, __other__: {fps:?}");
        assert!(groups.contains_key(&m0));
    }
}
