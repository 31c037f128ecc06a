// What a rule is, below the detectors that run it: a rule as configured (`RuleConfig`), as
// compiled for the engine and the export (`RuleSpec`), and the error naming a key path. The
// detectors' port (`detectors::Detector`) takes these; `rules` compiles them through the
// detector registry.

use crate::kernel::duration::HumanDuration;
use serde::Deserialize;
use tokenwatch_core::alert::Severity;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub name: String,
    /// One of the registered detectors (`detectors::names()`).
    pub detector: String,
    /// Watched signal where the detector takes one (latency metric, drift series, threshold signal).
    #[serde(default)]
    pub signal: Option<String>,
    /// Labels that make one alert; default `[model_id]`.
    #[serde(default)]
    pub group_by: Option<Vec<String>>,
    /// How long the condition must hold before the alert fires (default 0s).
    #[serde(default, rename = "for")]
    pub for_: Option<HumanDuration>,
    /// Evaluation window of windowed detectors (latency, drift, jitter, A/B, prompt decay).
    #[serde(default)]
    pub window: Option<HumanDuration>,
    /// Overrides `alerting.resolve_after` for this rule (a suppression window).
    #[serde(default)]
    pub resolve_after: Option<HumanDuration>,
    #[serde(default = "default_severity")]
    pub severity: Severity,
    /// `L1` or `L2` (spec section 5).
    #[serde(default)]
    pub grade: Option<String>,
    /// Detector parameters; unknown keys are refused.
    #[serde(default)]
    pub params: serde_json::Value,
    #[serde(default)]
    pub summary: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// A link to what to do about it, sent as the `runbook_url` annotation (Alertmanager's and
    /// Grafana's convention): an `http(s)://` URL that may hold the summary's placeholders
    /// (`{{ rule }}`, `{{ labels.model_id }}` …, each value percent-encoded). Default:
    /// `alerting.runbook_url`.
    #[serde(default)]
    pub runbook_url: Option<String>,
}

fn default_severity() -> Severity {
    Severity::Warning
}

/// A compiled rule: what the engine and the export read (its detector is beside it, in `Rule`).
#[derive(Debug, Clone)]
pub struct RuleSpec {
    pub name: String,
    pub detector: String,
    pub signal: String,
    pub group_by: Vec<String>,
    pub for_ms: i64,
    pub window_ms: i64,
    pub resolve_after_ms: Option<i64>,
    pub severity: Severity,
    pub grade: Option<String>,
    pub summary: String,
    pub description: String,
    /// The `runbook_url` template, when the rule has one.
    pub runbook_url: Option<String>,
}

/// A configuration error: key path and message.
pub type RuleError = (String, String);
