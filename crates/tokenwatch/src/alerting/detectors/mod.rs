// The detector interface: the `Detector` trait every rule's detector implements (parameters,
// compilation, evaluation, retention, enrichment flags, PromQL export) and the registry of them.
//
// A new detector is one new file here (a type implementing `Detector`) plus one `register`
// line in `REGISTRY`; the name list, the "unknown detector" message and the built-in Prometheus
// export are generated from the registry. tokenwatch-detect keeps the statistics.

mod ab_regression;
mod absolute_latency;
mod batch_jitter;
mod budget_burn;
mod cache_pollution;
mod call_chain_convergence;
mod canary_rollback;
mod context_aware_threshold;
pub mod drift_vote;
mod error_burst;
mod gpu_memory_leak;
mod gpu_xid_fatal;
mod kl_drift;
mod ks_drift;
mod kv_cache_pressure;
mod latency_spike;
mod output_length_outlier;
mod prompt_version_decay;
mod quality;
mod replica_shift;
mod semantic_drift;
mod slo_burn;
mod threshold;
mod topology_convergence;
mod triple_signal_health;

pub use ab_regression::AbRegression;
pub use absolute_latency::AbsoluteLatency;
pub use batch_jitter::BatchJitter;
pub use budget_burn::BudgetBurn;
pub use cache_pollution::CachePollution;
pub use call_chain_convergence::{CallChainConvergence, CallChainParams};
pub use canary_rollback::CanaryRollback;
pub use context_aware_threshold::ContextAwareThreshold;
pub use drift_vote::DriftVote;
pub use error_burst::ErrorBurst;
pub use gpu_memory_leak::GpuMemoryLeak;
pub use gpu_xid_fatal::GpuXidFatal;
pub use kl_drift::KlDrift;
pub use ks_drift::KsDrift;
pub use kv_cache_pressure::KvCachePressure;
pub use latency_spike::LatencySpike;
pub use output_length_outlier::OutputLengthOutlier;
pub use prompt_version_decay::PromptVersionDecay;
pub use replica_shift::ReplicaShift;
pub use semantic_drift::SemanticDrift;
pub use slo_burn::SloBurn;
pub use threshold::{Threshold, ThresholdParams};
pub use topology_convergence::{TopologyConvergence, TopologyParams};
pub use triple_signal_health::TripleSignalHealth;

pub use crate::alerting::engine::eval::EvalCtx;
pub use crate::alerting::promexport::{PromCtx, PromRule};
use crate::alerting::rules::spec::{RuleConfig, RuleError, RuleSpec};
use serde::de::DeserializeOwned;
use std::any::Any;
use tokenwatch_core::alert::{AnomalyEvent, Severity};
use tokenwatch_detect as det;
use tokenwatch_store::AnnotationRow;

/// One detector. The associated functions describe the kind (name, default window, how a rule
/// compiles into it); a compiled value holds the rule's parameters and its per-rule state.
pub trait Detector: Any + Send {
    /// The name rules use (`detector:`) and events carry.
    fn name() -> &'static str
    where
        Self: Sized;

    /// The rule's window when it sets none, in seconds.
    fn default_window_s() -> i64
    where
        Self: Sized;

    /// The detector with the rule's parameters (defaults for missing keys, unknown keys refused,
    /// validated; errors name the key path) and the signal it watches.
    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError>
    where
        Self: Sized;

    /// The rule written into `tokenwatch rules export` when the default rules are on.
    fn builtin_export() -> Option<BuiltinExport>
    where
        Self: Sized,
    {
        None
    }

    /// The rule's events at `cx.now`; none: its condition is absent.
    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent>;

    /// How long request records must be kept for this rule (ms).
    fn retention_ms(&self, rule: &RuleSpec) -> i64 {
        2 * rule.window_ms
    }

    /// How long output embeddings must be kept for this rule (ms); None: it reads none.
    fn embedding_retention_ms(&self, _rule: &RuleSpec) -> Option<i64> {
        None
    }

    /// Its alerts are latency symptoms: enrichment adds the latency breakdown.
    fn latency_symptom(&self) -> bool {
        false
    }

    /// Its alerts are about GPU memory: enrichment adds the eviction ranking.
    fn gpu_memory(&self, _rule: &RuleSpec) -> bool {
        false
    }

    /// The lowercase span text meaning failure, for detectors that read trace spans.
    fn span_pattern(&self) -> Option<String> {
        None
    }

    /// Per-request annotations made since the last call (the engine stores them).
    fn take_annotations(&mut self) -> Vec<AnnotationRow> {
        Vec::new()
    }

    /// The rule as Prometheus alerting rules, from these compiled parameters; Err: why PromQL
    /// cannot express it (written as a `# skipped` comment).
    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql("needs tokenwatch's own data"))
    }
}

/// A rule's compiled detector and the signal it watches.
pub type Compiled = (Box<dyn Detector>, String);

/// A registry entry: a detector kind's associated functions.
pub struct Registration {
    pub name: fn() -> &'static str,
    pub default_window_s: fn() -> i64,
    pub compile: fn(&RuleInput) -> Result<Compiled, RuleError>,
    pub builtin_export: fn() -> Option<BuiltinExport>,
}

const fn register<D: Detector>() -> Registration {
    Registration {
        name: D::name,
        default_window_s: D::default_window_s,
        compile: compile_boxed::<D>,
        builtin_export: D::builtin_export,
    }
}

fn compile_boxed<D: Detector>(r: &RuleInput) -> Result<Compiled, RuleError> {
    let (d, signal) = D::compile(r)?;
    Ok((Box::new(d), signal))
}

/// Every detector, in the order of the "allowed:" list.
pub const REGISTRY: &[Registration] = &[
    register::<LatencySpike>(),
    register::<AbsoluteLatency>(),
    register::<ContextAwareThreshold>(),
    register::<GpuMemoryLeak>(),
    register::<KvCachePressure>(),
    register::<OutputLengthOutlier>(),
    register::<SemanticDrift>(),
    register::<KsDrift>(),
    register::<KlDrift>(),
    register::<DriftVote>(),
    register::<CachePollution>(),
    register::<SloBurn>(),
    register::<BudgetBurn>(),
    register::<ErrorBurst>(),
    register::<ReplicaShift>(),
    register::<BatchJitter>(),
    register::<TripleSignalHealth>(),
    register::<AbRegression>(),
    register::<CanaryRollback>(),
    register::<PromptVersionDecay>(),
    register::<TopologyConvergence>(),
    register::<CallChainConvergence>(),
    register::<Threshold>(),
    register::<GpuXidFatal>(),
];

/// Detector names a rule may use.
pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|r| (r.name)()).collect()
}

pub fn find(name: &str) -> Option<&'static Registration> {
    REGISTRY.iter().find(|r| (r.name)() == name)
}

/// Latency metrics a latency rule may watch (from request records).
pub const LATENCY_SIGNALS: &[&str] = &["ttft", "e2e", "itl", "queue"];
/// Per-request series a drift rule may compare.
pub const DRIFT_SIGNALS: &[&str] = &["output_tokens", "prompt_tokens", "ttft", "e2e"];

/// A rule configuration being compiled, with the key path its errors name.
pub struct RuleInput<'a> {
    pub path: &'a str,
    pub rule: &'a RuleConfig,
}

impl RuleInput<'_> {
    /// An error at `key` below the rule (`params.op`, `signal`, `window`).
    pub fn error(&self, key: &str, msg: impl Into<String>) -> RuleError {
        (format!("{}.{key}", self.path), msg.into())
    }

    /// The rule's `params` as `P`: defaults for missing keys, errors at `….params.<key>`.
    pub fn params<P: DeserializeOwned + Default>(&self) -> Result<P, RuleError> {
        self.params_from(&self.rule.params)
    }

    /// As `params`, validated by tokenwatch-detect's rules.
    pub fn validated<P: DeserializeOwned + Default + det::Validate>(&self) -> Result<P, RuleError> {
        self.validated_from(&self.rule.params)
    }

    /// `P` from part of the params (the keys left after a flattened struct took its own).
    pub fn params_from<P: DeserializeOwned + Default>(
        &self,
        v: &serde_json::Value,
    ) -> Result<P, RuleError> {
        if v.is_null() {
            return Ok(P::default());
        }
        serde_path_to_error::deserialize(v).map_err(|e| {
            let at = e.path().to_string();
            let key = if at.is_empty() || at == "." {
                "params".to_string()
            } else {
                format!("params.{at}")
            };
            self.error(&key, e.into_inner().to_string())
        })
    }

    pub fn validated_from<P: DeserializeOwned + Default + det::Validate>(
        &self,
        v: &serde_json::Value,
    ) -> Result<P, RuleError> {
        let p: P = self.params_from(v)?;
        p.validate()
            .map_err(|e| self.error(&format!("params.{}", e.field), e.reason))?;
        Ok(p)
    }

    /// The rule's signal (or `default`), which must be one of `allowed`.
    pub fn signal(&self, allowed: &[&str], default: &str) -> Result<String, RuleError> {
        let s = self
            .rule
            .signal
            .clone()
            .unwrap_or_else(|| default.to_string());
        if allowed.contains(&s.as_str()) {
            Ok(s)
        } else {
            Err(self.error(
                "signal",
                format!(
                    "{s:?} is not watched by {}; allowed: {}",
                    self.rule.detector,
                    allowed.join(", ")
                ),
            ))
        }
    }

    /// The rule's window in ms, `default_s` when it sets none.
    pub fn window_ms(&self, default_s: i64) -> i64 {
        self.rule
            .window
            .map_or(default_s * 1000, |w| w.0.as_millis() as i64)
    }
}

/// A rule of the built-in Prometheus export: configured like any rule (its parameters are the
/// detector's defaults unless set here), placed at `position` in the file.
pub struct BuiltinExport {
    /// Place in the exported file (kept from the former hand-written list).
    pub position: u8,
    pub rule: RuleConfig,
}

impl BuiltinExport {
    pub fn new(
        position: u8,
        name: &str,
        detector: &str,
        severity: Severity,
        summary: &str,
    ) -> BuiltinExport {
        BuiltinExport {
            position,
            rule: RuleConfig {
                name: name.into(),
                detector: detector.into(),
                signal: None,
                group_by: None,
                for_: None,
                window: None,
                resolve_after: None,
                severity,
                grade: None,
                params: serde_json::Value::Null,
                summary: Some(summary.into()),
                description: None,
                runbook_url: None,
            },
        }
    }

    pub fn for_s(mut self, s: u64) -> Self {
        self.rule.for_ = Some(secs(s));
        self
    }

    pub fn window_s(mut self, s: u64) -> Self {
        self.rule.window = Some(secs(s));
        self
    }

    pub fn grade(mut self, g: &str) -> Self {
        self.rule.grade = Some(g.into());
        self
    }

    /// One parameter differing from the detector's default.
    pub fn param(mut self, key: &str, value: serde_json::Value) -> Self {
        let mut m = match self.rule.params.take() {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        m.insert(key.into(), value);
        self.rule.params = serde_json::Value::Object(m);
        self
    }
}

fn secs(s: u64) -> crate::kernel::duration::HumanDuration {
    crate::kernel::duration::HumanDuration(std::time::Duration::from_secs(s))
}

/// True once per period (the first call, then every `period_ms`); holds the last result.
#[derive(Default)]
pub struct Periodic {
    last_ms: Option<i64>,
    pub held: Vec<AnomalyEvent>,
}

impl Periodic {
    pub fn due(&mut self, now: i64, period_ms: i64) -> bool {
        match self.last_ms {
            Some(t) if now - t < period_ms => false,
            _ => {
                self.last_ms = Some(now);
                true
            }
        }
    }
}

/// The events one rule raises on given inputs (detector unit tests that read the engine's
/// inputs rather than signals or records).
#[cfg(test)]
pub(crate) fn events_of_rule(
    rule_yaml: &str,
    inputs: &crate::alerting::engine::inputs::Inputs,
    now: i64,
) -> Vec<tokenwatch_core::alert::AnomalyEvent> {
    let cfg: RuleConfig = serde_saphyr::from_str(rule_yaml).unwrap();
    let mut rule = crate::alerting::rules::compile_rule("alerting.rules[0]", &cfg).unwrap();
    let board = tokenwatch_core::signals::SignalBoard::default();
    let models = Default::default();
    let cx = crate::alerting::engine::eval::EvalCtx {
        splits: &Default::default(),
        actions: &crate::kernel::actions::NoActions,
        inputs,
        windows: &Default::default(),
        board: &board,
        new_records: &[],
        spans: &[],
        semantic_drift_models: &models,
        now,
    };
    rule.evaluate(&cx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names_are_unique_and_each_detector_compiles_with_its_defaults() {
        let names = names();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for name in names {
            let rule: RuleConfig = serde_saphyr::from_str(&format!(
                "{{name: r, detector: {name}, signal: {}}}",
                if name == "threshold" {
                    "kv_cache_usage"
                } else {
                    "null"
                }
            ))
            .unwrap();
            let input = RuleInput {
                path: "alerting.rules[0]",
                rule: &rule,
            };
            let reg = find(name).unwrap();
            let (_, signal) = (reg.compile)(&input).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert!(!signal.is_empty(), "{name}");
        }
    }
}
