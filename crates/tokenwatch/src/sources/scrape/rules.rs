// Mapping rules: how one runtime metric becomes one normalised signal (the config schema of
// `scrape.mappings`), and the rule set compiled into a lookup by exposed series name.

use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// How a metric turns into a signal value.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema, serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// The value as read (× scale), combined across series with `aggregate`.
    Gauge,
    /// Increase per second of a counter between two scrapes (resets handled).
    CounterRate,
    /// Increase of `metric` divided by the increase of `denominator` (a hit or acceptance rate).
    CounterRatio,
    /// Cumulative-bucket histogram: `<signal>_p50/p90/p95/p99_seconds` and `<signal>_mean_seconds`
    /// over the latency window, from bucket deltas.
    Histogram,
}

/// How the series of one group (same model, device and instance) are combined.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    #[default]
    Sum,
    Mean,
    Max,
}

fn one() -> f64 {
    1.0
}

/// One entry of `scrape.mappings` (user rules come before the built-in ones and win over them
/// for the same signal). Example:
///
/// ```yaml
/// scrape:
///   mappings:
///     - metric: myserver_kv_used_ratio      # exposed name (counters: with or without _total)
///       signal: kv_cache_usage              # normalised signal name
///       kind: gauge                         # gauge | counter_rate | counter_ratio | histogram
///       aggregate: mean                     # sum (default) | mean | max, across series
///       model_label: deployment             # label holding the model (default: model_id, model_name, model)
///     - metric: myserver_ttft_milliseconds  # histogram base name (_bucket/_sum/_count)
///       signal: ttft                        # gives ttft_p50_seconds … ttft_p99_seconds
///       kind: histogram
///       scale: 0.001                        # milliseconds → seconds
///     - metric: myserver_cache_hits_total
///       denominator: myserver_cache_lookups_total
///       signal: prefix_cache_hit_rate
///       kind: counter_ratio
///       match_labels: {tier: gpu}           # only series with these label values
/// ```
///
/// `device_label` makes the rule a device-level (GPU) rule: its value becomes `device_id`, and a
/// `Hostname`/`hostname` label, when present, becomes the instance.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MappingRule {
    pub metric: String,
    pub signal: String,
    pub kind: RuleKind,
    #[serde(default = "one")]
    pub scale: f64,
    #[serde(default)]
    pub model_label: Option<String>,
    #[serde(default)]
    pub device_label: Option<String>,
    /// Denominator counter of a `counter_ratio` rule.
    #[serde(default)]
    pub denominator: Option<String>,
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub aggregate: Aggregate,
    /// Runtime stamped on the points (default: the target's runtime).
    #[serde(default)]
    pub runtime: Option<String>,
}

impl MappingRule {
    pub fn new(metric: &str, signal: &str, kind: RuleKind) -> MappingRule {
        MappingRule {
            metric: metric.into(),
            signal: signal.into(),
            kind,
            scale: 1.0,
            model_label: None,
            device_label: None,
            denominator: None,
            match_labels: BTreeMap::new(),
            aggregate: Aggregate::Sum,
            runtime: None,
        }
    }

    /// Why this rule cannot be used, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.metric.trim().is_empty() {
            return Err("metric must not be empty".into());
        }
        if self.signal.trim().is_empty() {
            return Err("signal must not be empty".into());
        }
        if !self.scale.is_finite() || self.scale == 0.0 {
            return Err(format!(
                "scale {} must be a finite, non-zero number",
                self.scale
            ));
        }
        match (self.kind, &self.denominator) {
            (RuleKind::CounterRatio, None) => {
                Err("kind counter_ratio needs a denominator metric".into())
            }
            (RuleKind::CounterRatio, Some(_)) | (_, None) => Ok(()),
            (_, Some(_)) => Err("denominator is only used with kind counter_ratio".into()),
        }
    }

    pub fn is_device_rule(&self) -> bool {
        self.device_label.is_some()
    }
}

/// What role an exposed series plays for a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Value,
    Denominator,
    Bucket,
    Sum,
    Count,
}

/// Rules in priority order, indexed by the exposed series names they read.
#[derive(Debug, Default)]
pub struct RuleSet {
    pub rules: Vec<MappingRule>,
    by_series: HashMap<String, Vec<(usize, Role)>>,
}

impl RuleSet {
    pub fn new(rules: Vec<MappingRule>) -> RuleSet {
        let mut by_series: HashMap<String, Vec<(usize, Role)>> = HashMap::new();
        let mut add = |name: String, idx: usize, role: Role| {
            let e = by_series.entry(name).or_default();
            if !e.contains(&(idx, role)) {
                e.push((idx, role));
            }
        };
        for (i, r) in rules.iter().enumerate() {
            match r.kind {
                RuleKind::Gauge => add(r.metric.clone(), i, Role::Value),
                RuleKind::CounterRate | RuleKind::CounterRatio => {
                    for n in counter_names(&r.metric) {
                        add(n, i, Role::Value);
                    }
                    if let Some(d) = &r.denominator {
                        for n in counter_names(d) {
                            add(n, i, Role::Denominator);
                        }
                    }
                }
                RuleKind::Histogram => {
                    add(format!("{}_bucket", r.metric), i, Role::Bucket);
                    add(format!("{}_sum", r.metric), i, Role::Sum);
                    add(format!("{}_count", r.metric), i, Role::Count);
                }
            }
        }
        RuleSet { rules, by_series }
    }

    pub fn lookup(&self, series_name: &str) -> &[(usize, Role)] {
        self.by_series
            .get(series_name)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

/// A counter is exposed as `name_total` (prometheus_client, OpenMetrics) or bare (TGI).
fn counter_names(metric: &str) -> Vec<String> {
    if metric.ends_with("_total") {
        vec![metric.to_string()]
    } else {
        vec![metric.to_string(), format!("{metric}_total")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_rules_parse_and_check() {
        let y = "- metric: a_ms\n  signal: ttft\n  kind: histogram\n  scale: 0.001\n- metric: hits\n  signal: prefix_cache_hit_rate\n  kind: counter_ratio\n";
        let rules: Vec<MappingRule> = serde_saphyr::from_str(y).unwrap();
        assert_eq!(rules[0].scale, 0.001);
        assert!(rules[0].check().is_ok());
        assert!(rules[1].check().unwrap_err().contains("denominator"));
        let bad: Result<Vec<MappingRule>, _> =
            serde_saphyr::from_str("- metric: a\n  signal: b\n  kind: sometimes\n");
        assert!(bad.is_err());
    }

    #[test]
    fn index_covers_counter_and_histogram_series() {
        let mut ratio = MappingRule::new("h", "r", RuleKind::CounterRatio);
        ratio.denominator = Some("q_total".into());
        let set = RuleSet::new(vec![
            MappingRule::new("x", "ttft", RuleKind::Histogram),
            ratio,
        ]);
        assert_eq!(set.lookup("x_bucket"), &[(0, Role::Bucket)]);
        assert_eq!(set.lookup("h_total"), &[(1, Role::Value)]);
        assert_eq!(set.lookup("h"), &[(1, Role::Value)]);
        assert_eq!(set.lookup("q_total"), &[(1, Role::Denominator)]);
        assert!(set.lookup("q_total_total").is_empty());
    }
}
