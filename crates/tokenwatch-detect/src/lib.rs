// tokenwatch-detect: the detectors of spec section 4, root-cause ranking and noise reduction of
// section 5 and eviction ranking of section 6. Pure logic: no I/O, no clocks (time is unix ms).

pub mod actions;
pub mod burst;
mod cache;
mod drift;
pub mod episodes;
pub mod experiments;
mod jitter;
mod kv;
pub mod latency;
pub mod leak;
mod length;
pub mod noise;
pub mod quality;
pub mod resources;
pub mod robust;
pub mod rootcause;
pub mod sequential;
pub mod slo;
mod stats;
#[cfg(test)]
mod test_rng;
mod text;

pub use actions::*;
pub use burst::*;
pub use episodes::*;
pub use experiments::*;
pub use latency::*;
pub use leak::gpu_memory_leak_sequential;
pub use noise::*;
pub use quality::*;
pub use resources::*;
pub use rootcause::*;
pub use sequential::ReplicaShiftParams;
pub use slo::*;
pub use stats::{LinearFit, kolmogorov_sf, ks_two_sample, linear_fit};

use std::collections::BTreeMap;
use tokenwatch_core::alert::AnomalyEvent;

/// Detector names, as used in `AnomalyEvent::detector`, rules and the causal graph.
pub mod names {
    pub const LATENCY_SPIKE: &str = "latency_spike";
    pub const ABSOLUTE_LATENCY: &str = "absolute_latency";
    pub const CONTEXT_AWARE_THRESHOLD: &str = "context_aware_threshold";
    pub const GPU_MEMORY_LEAK: &str = "gpu_memory_leak";
    pub const KV_CACHE_PRESSURE: &str = "kv_cache_pressure";
    pub const OUTPUT_LENGTH_OUTLIER: &str = "output_length_outlier";
    pub const SEMANTIC_DRIFT: &str = "semantic_drift";
    pub const KS_DRIFT: &str = "ks_drift";
    pub const KL_DRIFT: &str = "kl_drift";
    pub const DRIFT_VOTE: &str = "drift_vote";
    pub const CACHE_POLLUTION: &str = "cache_pollution";
    pub const BATCH_JITTER: &str = "batch_jitter";
    pub const SLO_BURN: &str = "slo_burn";
    pub const ERROR_BURST: &str = "error_burst";
    pub const AB_REGRESSION: &str = "ab_regression";
    pub const PROMPT_VERSION_DECAY: &str = "prompt_version_decay";
    pub const TRIPLE_SIGNAL_HEALTH: &str = "triple_signal_health";
    pub const REPLICA_SHIFT: &str = "replica_shift";
}

/// A time series: (unix ms, value), ascending time.
pub type Series<'a> = &'a [(i64, f64)];

/// What a detector found: a score (1.0 = exactly at its threshold, growing with severity), the
/// values and windows it compared, and a sentence a person can act on.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Finding {
    pub score: f64,
    pub evidence: BTreeMap<String, serde_json::Value>,
    pub summary: String,
}

impl Finding {
    pub fn new(score: f64, summary: impl Into<String>) -> Self {
        Finding {
            score,
            evidence: BTreeMap::new(),
            summary: summary.into(),
        }
    }

    /// Adds one evidence entry (numbers become JSON numbers; NaN/inf become null).
    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.evidence.insert(key.to_string(), value.into());
        self
    }

    pub fn into_event(
        self,
        detector: &str,
        signal: &str,
        labels: BTreeMap<String, String>,
        at_unix_ms: i64,
    ) -> AnomalyEvent {
        AnomalyEvent {
            detector: detector.to_string(),
            signal: signal.to_string(),
            labels,
            score: self.score,
            at_unix_ms,
            evidence: self.evidence,
            summary: self.summary,
        }
    }
}

/// A parameter set that was configured with an impossible value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid detector parameter `{field}`: {reason}")]
pub struct ParamError {
    pub field: &'static str,
    pub reason: String,
}

/// Checks the values of a parameter struct (for `tokenwatch check-config`).
pub trait Validate {
    fn validate(&self) -> Result<(), ParamError>;
}

pub(crate) fn check(ok: bool, field: &'static str, reason: &str) -> Result<(), ParamError> {
    if ok {
        Ok(())
    } else {
        Err(ParamError {
            field,
            reason: reason.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;

    fn defaults_ok<T: DeserializeOwned + Default + PartialEq + std::fmt::Debug + Validate>() {
        let from_empty: T = serde_json::from_str("{}").expect("empty config gives the defaults");
        assert_eq!(from_empty, T::default());
        assert!(T::default().validate().is_ok(), "{:?}", T::default());
        assert!(serde_json::from_str::<T>(r#"{"no_such_field": 1}"#).is_err());
    }

    #[test]
    fn every_parameter_set_defaults_validates_and_rejects_unknown_fields() {
        defaults_ok::<LatencySpikeParams>();
        defaults_ok::<AbsoluteLatencyParams>();
        defaults_ok::<ContextThresholdParams>();
        defaults_ok::<GpuLeakParams>();
        defaults_ok::<KvPressureParams>();
        defaults_ok::<TripleSignalParams>();
        defaults_ok::<BatchJitterParams>();
        defaults_ok::<LengthOutlierParams>();
        defaults_ok::<SemanticDriftParams>();
        defaults_ok::<KsDriftParams>();
        defaults_ok::<KlDriftParams>();
        defaults_ok::<DriftVoteParams>();
        defaults_ok::<CachePollutionParams>();
        defaults_ok::<SloBurnParams>();
        defaults_ok::<ErrorBurstParams>();
        defaults_ok::<AbRegressionParams>();
        defaults_ok::<PromptDecayParams>();
        defaults_ok::<RootCauseParams>();
        defaults_ok::<CausalGraph>();
        defaults_ok::<NoiseParams>();
        defaults_ok::<EvictionParams>();
    }

    #[test]
    fn finding_becomes_an_event() {
        let f = Finding::new(2.0, "x").with("a", 1.5).with("nan", f64::NAN);
        assert!(f.evidence["nan"].is_null());
        let e = f.into_event(
            names::LATENCY_SPIKE,
            "ttft_p99_seconds",
            BTreeMap::new(),
            42,
        );
        assert_eq!(
            (e.detector.as_str(), e.score, e.at_unix_ms),
            ("latency_spike", 2.0, 42)
        );
        assert_eq!(e.evidence["a"], 1.5);
    }
}
