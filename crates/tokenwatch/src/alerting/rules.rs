// Alerting rules: the `alerting:` configuration section, the default rule set covering spec
// section 4, and rule compilation with key-path errors (`alerting.rules[3].params`) by the
// registered detectors (`alerting/detectors`); templates are in `rules/template.rs`.

pub mod spec;
mod template;

pub use template::{render, render_url};

use crate::alerting::detectors::{self, Detector, EvalCtx, RuleInput};
use crate::kernel::duration::HumanDuration;
use serde::Deserialize;
pub use spec::{RuleConfig, RuleError, RuleSpec};
use std::collections::BTreeMap;
use std::time::Duration;
use template::check_template;
use tokenwatch_core::alert::{AnomalyEvent, Severity};

/// The `alerting:` section.
///
/// ```yaml
/// alerting:
///   default_rules: true          # the shipped rule set (see DEFAULT_RULES_YAML)
///   overrides:                   # change a default (or configured) rule by name
///     latency_spike: {for: 30s, window: 30s, params: {ratio: 3}}
///   rules:                       # more rules; a rule named like a default one replaces it
///     - name: kv_full
///       detector: threshold
///       signal: kv_cache_usage
///       params: {op: ">", value: 0.98}
///       for: 1m
///       severity: critical
///   inhibit_rules:               # omitted: cause alerts inhibit latency symptoms (see below)
///     - {source: [gpu_memory_leak], target: [latency_spike], equal: [model_id]}
///   causal_graph: {replace_defaults: false, edges: [{cause: a, effect: b, confidence: 0.8, delay: 2s}]}
///   delivery: {alertmanagers: [http://127.0.0.1:9093]}
/// ```
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertingConfig {
    /// Evaluate rules at all.
    pub enabled: bool,
    /// Use the shipped rule set (`DEFAULT_RULES_YAML`).
    pub default_rules: bool,
    pub rules: Vec<RuleConfig>,
    /// Per-rule-name changes to default or configured rules.
    pub overrides: BTreeMap<String, RuleOverride>,
    pub delivery: crate::alerting::deliver::DeliveryConfig,
    pub causal_graph: CausalGraphConfig,
    /// `None`: the default inhibition (a firing cause alert inhibits latency alerts of its model).
    pub inhibit_rules: Option<Vec<InhibitRule>>,
    /// A firing alert resolves after its condition was absent this long …
    pub resolve_after: HumanDuration,
    /// … and for at least this many consecutive evaluations.
    pub resolve_clean_evaluations: u32,
    /// A pending alert survives gaps in its condition this short (see `lifecycle::Timing`).
    pub pending_grace: HumanDuration,
    /// Longest time between two evaluations when no data arrives (data wakes the engine earlier).
    pub evaluation_interval: HumanDuration,
    /// Resolved alerts stay visible in the API this long.
    pub keep_resolved: HumanDuration,
    /// Alerts of one model that become active within this time of an open incident join it.
    pub incident_window: HumanDuration,
    /// Anomaly events are kept this long for root-cause ranking.
    pub event_lookback: HumanDuration,
    /// Write a snapshot archive when an alert fires.
    pub snapshots: bool,
    /// Request records the engine keeps for its windows, all models together (≈ 250 bytes
    /// each, and the latency, A/B and error-burst windows' copies); each model gets an equal
    /// share (at least 1,000, at most `max_records_per_model`). Past its share a model's older
    /// records are thinned to a uniform sample (`tokenwatch_alerting_thinned_records_total`):
    /// windows keep their span, those reaching back past the newest records read fewer of them.
    pub max_records: usize,
    /// At most this many request records per model; a quarter more, between two evaluations,
    /// and the oldest go first (`tokenwatch_alerting_evicted_records_total`).
    pub max_records_per_model: usize,
    /// At most this many active alerts (label sets) per rule. Further label sets — a storm of
    /// models or attributes from input — fold into one alert of the rule whose grouping labels
    /// read `__other__`, with the count of label sets it stands for (`folded_label_sets`),
    /// counted in `tokenwatch_alerts_folded_total{rule}`: one alert and one snapshot instead of
    /// thousands.
    pub max_alerts_per_rule: usize,
    /// The `runbook_url` of every rule that sets none (empty: none), e.g.
    /// `https://wiki.example/runbooks/tokenwatch/{{ rule }}`.
    pub runbook_url: String,
}

impl Default for AlertingConfig {
    fn default() -> Self {
        AlertingConfig {
            enabled: true,
            default_rules: true,
            rules: Vec::new(),
            overrides: BTreeMap::new(),
            delivery: Default::default(),
            causal_graph: CausalGraphConfig::default(),
            inhibit_rules: None,
            resolve_after: HumanDuration(Duration::from_secs(30)),
            resolve_clean_evaluations: 3,
            pending_grace: HumanDuration(Duration::from_secs(5)),
            evaluation_interval: HumanDuration(Duration::from_millis(250)),
            keep_resolved: HumanDuration(Duration::from_secs(3600)),
            incident_window: HumanDuration(Duration::from_secs(300)),
            event_lookback: HumanDuration(Duration::from_secs(600)),
            snapshots: true,
            max_records: 30_000,
            max_records_per_model: 200_000,
            max_alerts_per_rule: 256,
            runbook_url: String::new(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuleOverride {
    /// `false` removes the rule.
    pub enabled: Option<bool>,
    #[serde(rename = "for")]
    pub for_: Option<HumanDuration>,
    pub window: Option<HumanDuration>,
    pub resolve_after: Option<HumanDuration>,
    pub severity: Option<Severity>,
    pub group_by: Option<Vec<String>>,
    /// Merged key by key into the rule's params.
    pub params: serde_json::Map<String, serde_json::Value>,
    pub summary: Option<String>,
    pub description: Option<String>,
    pub runbook_url: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CausalGraphConfig {
    /// Start from an empty graph instead of the spec's default edges.
    pub replace_defaults: bool,
    pub edges: Vec<CausalEdgeConfig>,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct CausalEdgeConfig {
    pub cause: String,
    pub effect: String,
    pub confidence: f64,
    pub delay: HumanDuration,
}

/// While an alert of a `source` rule (rule name or detector) fires, alerts of `target` rules
/// whose `equal` labels match are kept but marked `inhibited_by` and not delivered.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct InhibitRule {
    pub source: Vec<String>,
    pub target: Vec<String>,
    #[serde(default = "default_equal")]
    pub equal: Vec<String>,
}

fn default_equal() -> Vec<String> {
    vec!["model_id".into()]
}

pub fn default_inhibit_rules() -> Vec<InhibitRule> {
    vec![
        InhibitRule {
            source: vec!["gpu_memory_leak".into(), "kv_cache_pressure".into()],
            target: vec![
                "absolute_latency".into(),
                "latency_spike".into(),
                "context_aware_threshold".into(),
                "replica_shift".into(),
            ],
            equal: default_equal(),
        },
        // An SLO's page makes its ticket redundant.
        InhibitRule {
            source: vec!["slo_burn".into()],
            target: vec!["slo_burn_slow".into()],
            equal: vec!["slo".into(), "model_id".into(), "tenant".into()],
        },
    ]
}

/// A compiled rule with its detector (parameters and per-rule state).
pub struct Rule {
    pub spec: RuleSpec,
    pub compiled: Box<dyn Detector>,
}

impl std::ops::Deref for Rule {
    type Target = RuleSpec;
    fn deref(&self) -> &RuleSpec {
        &self.spec
    }
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.spec.fmt(f)
    }
}

impl Rule {
    /// This rule's events at `cx.now`.
    pub fn evaluate(&mut self, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        self.compiled.evaluate(&self.spec, cx)
    }

    /// The compiled detector as its own type (tests read its parameters).
    pub fn detector_as<D: Detector>(&self) -> Option<&D> {
        let any: &dyn std::any::Any = self.compiled.as_ref();
        any.downcast_ref::<D>()
    }
}

/// The shipped rule set (spec sections 4 and 5). `for`s follow the spec's "sustained
/// conditions for paging alerts"; detectors with their own sustain (leak steps, burn windows)
/// fire at once.
pub const DEFAULT_RULES_YAML: &str = r#"
- name: gpu_memory_leak
  detector: gpu_memory_leak
  group_by: [model_id, instance, device_id, serving_instance]
  severity: critical
  summary: "GPU memory leak on {{ labels.instance }} {{ labels.device_id }} ({{ labels.model_id }})"
  description: "{{ summary }} Growth {{ evidence.growth_bytes_per_s }} B/s, exhaustion in {{ evidence.time_to_exhaustion_s }} s."
- name: kv_cache_pressure
  detector: kv_cache_pressure
  group_by: [model_id, instance]
  for: 15s
  severity: warning
  summary: "KV-cache pressure on {{ labels.instance }} ({{ labels.model_id }})"
- name: absolute_latency
  detector: absolute_latency
  signal: ttft
  group_by: [model_id, instance]
  grade: L1
  for: 1m
  severity: warning
  summary: "L1: P99 TTFT of {{ labels.model_id }} {{ labels.instance }} above 2 s — run a health check"
- name: latency_spike
  detector: latency_spike
  signal: ttft
  group_by: [model_id, instance]
  grade: L2
  for: 2m
  severity: critical
  summary: "L2: P99 TTFT spike on {{ labels.model_id }} {{ labels.instance }} — diagnose the inference path"
- name: context_aware_threshold
  detector: context_aware_threshold
  signal: ttft
  group_by: [model_id, instance]
  for: 2m
  severity: warning
  summary: "P99 TTFT of {{ labels.model_id }} {{ labels.instance }} above its context-aware threshold"
- name: output_length_outlier
  detector: output_length_outlier
  group_by: [model_id, instance]
  window: 2m
  for: 30s
  severity: warning
  summary: "Output lengths of {{ labels.model_id }} out of line ({{ evidence.instances }}): {{ evidence.outliers }} of {{ evidence.tested }} responses {{ evidence.pattern }}"
- name: slo_burn
  detector: slo_burn
  group_by: [slo, model_id, tenant]
  params: {condition: fast}
  severity: critical
  summary: "SLO {{ labels.slo }} of {{ labels.model_id }}: error budget burning fast — page"
- name: slo_burn_slow
  detector: slo_burn
  group_by: [slo, model_id, tenant]
  params: {condition: slow}
  severity: warning
  summary: "SLO {{ labels.slo }} of {{ labels.model_id }}: error budget eroding — ticket"
- name: budget_burn
  detector: budget_burn
  group_by: [budget]
  severity: critical
  summary: "{{ summary }}"
- name: error_burst
  detector: error_burst
  group_by: [model_id, instance]
  window: 5s
  severity: critical
  summary: "Error burst on {{ labels.model_id }} {{ labels.instance }}: {{ evidence.error_ratio }} of requests failing"
- name: replica_errors
  detector: replica_shift
  group_by: [model_id, instance]
  params: {tests: [errors]}
  severity: critical
  summary: "{{ summary }}"
- name: replica_latency
  detector: replica_shift
  group_by: [model_id, instance]
  params: {tests: [latency]}
  severity: critical
  summary: "{{ summary }}"
- name: batch_jitter
  detector: batch_jitter
  for: 2m
  severity: warning
  summary: "Batch jitter on {{ labels.model_id }}"
- name: triple_signal_health
  detector: triple_signal_health
  group_by: [model_id, instance]
  for: 2m
  severity: warning
  summary: "Inference health degraded on {{ labels.instance }} ({{ labels.model_id }})"
- name: output_length_drift
  detector: ks_drift
  signal: output_tokens
  window: 5m
  for: 5m
  severity: info
  summary: "Output length distribution of {{ labels.model_id }} drifted"
- name: finish_reason_drift
  detector: kl_drift
  signal: finish_reason
  window: 5m
  severity: info
  summary: "Finish-reason mix of {{ labels.model_id }} drifted"
- name: semantic_drift
  detector: semantic_drift
  signal: output_embedding
  window: 5m
  for: 5m
  severity: warning
  summary: "Outputs of {{ labels.model_id }} drifted in meaning (centroid cosine {{ evidence.cosine }})"
- name: drift_vote
  detector: drift_vote
  signal: output_tokens
  window: 5m
  for: 5m
  severity: warning
  summary: "Drift of {{ labels.model_id }} confirmed by the drift vote ({{ evidence.vote_share }} of the weight)"
- name: cache_pollution
  detector: cache_pollution
  signal: prefix_key
  group_by: [model_id, tenant]
  window: 15m
  for: 2m
  severity: warning
  summary: "Prefix cache of {{ labels.model_id }} polluted by tenant {{ labels.tenant }}"
- name: ab_regression
  detector: ab_regression
  window: 5m
  for: 1m
  severity: warning
  summary: "A/B regression on {{ labels.model_id }}"
- name: canary_rollback
  detector: canary_rollback
  group_by: [route, model_version]
  window: 1m
  resolve_after: 1m
  severity: critical
  summary: "Canary {{ labels.model_version }} of route {{ labels.route }} rolled back to weight 0 — restore with POST /api/v1/routes/{{ labels.route }}/weights"
  description: "{{ evidence.reason }}; traffic goes to {{ evidence.stable_version }}. Restore: {{ evidence.restore }}"
- name: prompt_version_decay
  detector: prompt_version_decay
  group_by: [model_id, prompt_version]
  window: 5m
  severity: warning
  summary: "Prompt version {{ labels.prompt_version }} of {{ labels.model_id }} decaying"
- name: gpu_switch_saturation
  detector: topology_convergence
  group_by: [pci_switch]
  resolve_after: 2m
  severity: warning
  summary: "GPUs behind PCIe switch {{ labels.pci_switch }} saturated"
- name: cuda_oom_call_chain
  detector: call_chain_convergence
  group_by: []
  resolve_after: 30s
  severity: critical
  summary: "CUDA out-of-memory across one call chain"
- name: gpu_xid_fatal
  detector: gpu_xid_fatal
  group_by: [instance, device_id, model_id, serving_instance]
  severity: critical
  summary: "GPU {{ labels.device_id }} on {{ labels.instance }}: XID {{ evidence.xid }} ({{ evidence.meaning }}) — {{ evidence.action }}"
"#;

pub fn default_rule_configs() -> Vec<RuleConfig> {
    // The embedded YAML is checked by a unit test; a failure here is a build defect.
    serde_saphyr::from_str(DEFAULT_RULES_YAML).unwrap_or_default()
}

/// Default rules (when enabled), then configured ones (replacing same-named defaults), then overrides.
pub fn compile(cfg: &AlertingConfig) -> Result<Vec<Rule>, RuleError> {
    if !(1..=100_000).contains(&cfg.max_alerts_per_rule) {
        return Err((
            "alerting.max_alerts_per_rule".into(),
            "must be between 1 and 100000".into(),
        ));
    }
    let mut entries: Vec<(String, RuleConfig)> = Vec::new();
    if cfg.default_rules {
        for r in default_rule_configs() {
            entries.push((format!("alerting.default_rules({})", r.name), r));
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, r) in cfg.rules.iter().enumerate() {
        let path = format!("alerting.rules[{i}]");
        if r.name.trim().is_empty() {
            return Err((format!("{path}.name"), "must not be empty".into()));
        }
        if !seen.insert(r.name.clone()) {
            return Err((
                format!("{path}.name"),
                format!("rule name {:?} is used twice", r.name),
            ));
        }
        entries.retain(|(_, d)| d.name != r.name);
        entries.push((path, r.clone()));
    }
    for (name, o) in &cfg.overrides {
        let path = format!("alerting.overrides.{name}");
        let Some(pos) = entries.iter().position(|(_, r)| &r.name == name) else {
            let names: Vec<&str> = entries.iter().map(|(_, r)| r.name.as_str()).collect();
            return Err((
                path,
                format!("no rule named {name:?}; rules: {}", names.join(", ")),
            ));
        };
        if o.enabled == Some(false) {
            entries.remove(pos);
            continue;
        }
        entries[pos].0 = path;
        let r = &mut entries[pos].1;
        if let Some(f) = o.for_ {
            r.for_ = Some(f);
        }
        if let Some(w) = o.window {
            r.window = Some(w);
        }
        if let Some(w) = o.resolve_after {
            r.resolve_after = Some(w);
        }
        if let Some(s) = o.severity {
            r.severity = s;
        }
        if let Some(g) = &o.group_by {
            r.group_by = Some(g.clone());
        }
        if let Some(s) = &o.summary {
            r.summary = Some(s.clone());
        }
        if let Some(s) = &o.description {
            r.description = Some(s.clone());
        }
        if let Some(s) = &o.runbook_url {
            r.runbook_url = Some(s.clone());
        }
        if !o.params.is_empty() {
            let mut merged = match &r.params {
                serde_json::Value::Object(m) => m.clone(),
                _ => serde_json::Map::new(),
            };
            merged.extend(o.params.clone());
            r.params = serde_json::Value::Object(merged);
        }
    }
    let global_runbook = Some(cfg.runbook_url.trim()).filter(|u| !u.is_empty());
    if let Some(u) = global_runbook {
        check_runbook_url(u).map_err(|m| ("alerting.runbook_url".to_string(), m))?;
    }
    entries
        .iter_mut()
        .map(|(path, r)| {
            if r.runbook_url.is_none() {
                r.runbook_url = global_runbook.map(str::to_string);
            }
            compile_rule(path, r)
        })
        .collect()
}

/// A runbook URL template must be an absolute `http(s)://` URL with known placeholders.
fn check_runbook_url(tpl: &str) -> Result<(), String> {
    if !(tpl.starts_with("https://") || tpl.starts_with("http://")) {
        return Err(format!("{tpl:?} is not an http:// or https:// URL"));
    }
    check_template(tpl)
}

/// One rule (`path` names it in errors) compiled by its detector.
pub(crate) fn compile_rule(path: &str, r: &RuleConfig) -> Result<Rule, RuleError> {
    let Some(reg) = detectors::find(&r.detector) else {
        return Err((
            format!("{path}.detector"),
            format!(
                "unknown detector {:?}; allowed: {}",
                r.detector,
                detectors::names().join(", ")
            ),
        ));
    };
    let (compiled, signal) = (reg.compile)(&RuleInput { path, rule: r })?;
    let window_s = (reg.default_window_s)();
    let group_by = r
        .group_by
        .clone()
        .unwrap_or_else(|| vec!["model_id".into()]);
    for (j, l) in group_by.iter().enumerate() {
        if l.is_empty()
            || !l
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err((
                format!("{path}.group_by[{j}]"),
                format!("{l:?} is not a label name (lowercase, digits, _)"),
            ));
        }
    }
    if let Some(g) = &r.grade
        && g != "L1"
        && g != "L2"
    {
        return Err((format!("{path}.grade"), format!("{g:?}: expected L1 or L2")));
    }
    let summary = r
        .summary
        .clone()
        .unwrap_or_else(|| format!("{} on {{{{ labels.model_id }}}}", r.name));
    let description = r
        .description
        .clone()
        .unwrap_or_else(|| "{{ summary }}".to_string());
    check_template(&summary).map_err(|m| (format!("{path}.summary"), m))?;
    check_template(&description).map_err(|m| (format!("{path}.description"), m))?;
    let runbook_url = r
        .runbook_url
        .as_deref()
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string);
    if let Some(u) = &runbook_url {
        check_runbook_url(u).map_err(|m| (format!("{path}.runbook_url"), m))?;
    }
    let window_ms = r
        .window
        .map(|w| w.0.as_millis() as i64)
        .unwrap_or(window_s * 1000);
    if window_ms < 1000 {
        return Err((format!("{path}.window"), "must be at least 1s".into()));
    }
    let spec = RuleSpec {
        name: r.name.clone(),
        detector: r.detector.clone(),
        signal,
        group_by,
        for_ms: r.for_.map(|f| f.0.as_millis() as i64).unwrap_or(0),
        window_ms,
        resolve_after_ms: r.resolve_after.map(|d| d.0.as_millis() as i64),
        severity: r.severity,
        grade: r.grade.clone(),
        summary,
        description,
        runbook_url,
    };
    Ok(Rule { spec, compiled })
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
