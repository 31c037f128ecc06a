// Anomalies and alerts: what detectors emit (anomaly events with score, evidence and a sentence)
// and what the alerting stage raises from them (alerts with state, grade and root-cause chain).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One detector's finding on one series at one time (spec section 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnomalyEvent {
    /// Detector name, e.g. `latency_spike`, `gpu_memory_leak`.
    pub detector: String,
    /// The signal it watched, e.g. `ttft_p99_seconds`, `gpu_memory_used_bytes`.
    pub signal: String,
    /// Where: `model_id`, `instance`, `device_id`, `tenant`, … (never free-form ids).
    pub labels: BTreeMap<String, String>,
    /// How anomalous, ≥ 0; 1.0 means exactly at the detector's threshold.
    pub score: f64,
    pub at_unix_ms: i64,
    /// The values and windows compared, by name.
    pub evidence: BTreeMap<String, serde_json::Value>,
    /// A sentence a person can act on.
    pub summary: String,
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Critical,
    Warning,
    Info,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }

    pub fn parse(s: &str) -> Option<Severity> {
        [Severity::Critical, Severity::Warning, Severity::Info]
            .into_iter()
            .find(|x| x.name() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    Pending,
    Firing,
    Resolved,
}

impl AlertState {
    pub fn name(self) -> &'static str {
        match self {
            AlertState::Pending => "pending",
            AlertState::Firing => "firing",
            AlertState::Resolved => "resolved",
        }
    }

    pub fn parse(s: &str) -> Option<AlertState> {
        [
            AlertState::Pending,
            AlertState::Firing,
            AlertState::Resolved,
        ]
        .into_iter()
        .find(|x| x.name() == s)
    }
}

/// A candidate cause attached to an alert by root-cause ranking (spec section 5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CauseCandidate {
    pub detector: String,
    pub signal: String,
    pub labels: BTreeMap<String, String>,
    /// Edge confidence from the causal graph (product along the path).
    pub confidence: f64,
    /// Typical propagation delay along the path, and the delay actually observed.
    pub expected_delay_ms: i64,
    pub observed_delay_ms: i64,
    /// 0..1, how well the observed delay matches the expected one.
    pub alignment: f64,
    /// confidence × alignment; candidates are sorted by it, highest first.
    pub rank: f64,
    /// The chain from this cause to the alert's signal, e.g. [gpu_memory_leak, kv_cache_pressure, latency_spike].
    pub path: Vec<String>,
    pub summary: String,
}

/// An alert raised by a rule (spec section 5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// Stable id of this alert instance (rule + labels + activation).
    pub id: String,
    /// Hash of rule name + group labels: the same problem keeps the same fingerprint.
    pub fingerprint: String,
    pub rule: String,
    pub labels: BTreeMap<String, String>,
    /// `summary`, `description` and any other annotations, templates already filled in.
    pub annotations: BTreeMap<String, String>,
    pub severity: Severity,
    /// `L1` (health check) or `L2` (inference path diagnosis) where the rule grades it.
    pub grade: Option<String>,
    pub state: AlertState,
    /// When the condition first held (pending since).
    pub active_at_unix_ms: i64,
    pub fired_at_unix_ms: Option<i64>,
    pub resolved_at_unix_ms: Option<i64>,
    /// Latest anomaly that kept the alert active (its evidence and sentence).
    pub last_event: Option<AnomalyEvent>,
    pub root_cause: Vec<CauseCandidate>,
    /// Incident this alert was grouped into (alerts per incident is a measured quality).
    pub incident_id: Option<String>,
    /// Path of the snapshot archive in the data directory, once written.
    pub snapshot: Option<String>,
}

/// Events raised outside the rules (log-template anomalies, XID errors from scrapes), taken
/// into the alert engine's history at the next evaluation so they rank as causes like any detector's. Bounded: the
/// oldest are dropped when the engine does not keep up (or alerting is off).
#[derive(Clone, Default)]
pub struct EventInbox(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<AnomalyEvent>>>);

impl EventInbox {
    const CAPACITY: usize = 1_000;

    pub fn push(&self, e: AnomalyEvent) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= Self::CAPACITY {
            q.pop_front();
        }
        q.push_back(e);
    }

    pub fn take(&self) -> Vec<AnomalyEvent> {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        q.drain(..).collect()
    }
}

/// A future a port returns (object-safe without an async-trait crate).
pub type PortFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// The alert engine's door for inputs that sources take from outside the request path —
/// embeddings, feedback and scores posted to the API or sent as span attributes — so a source
/// hands them over without knowing the engine. Sends wait a bounded time for room (a caller
/// may be slowed, never the proxy) and count what they drop.
pub trait PostedInputs: Send + Sync {
    /// The embedding dimension each model keeps (shared with the engine's own record path: an
    /// input admits an embedding here before storing it).
    fn dims(&self) -> std::sync::Arc<crate::embedding::EmbeddingDims>;
    fn send_embeddings(&self, items: Vec<crate::embedding::EmbeddingInput>) -> PortFuture<'_>;
    fn send_scores(&self, items: Vec<crate::scores::ScoreInput>) -> PortFuture<'_>;
}
