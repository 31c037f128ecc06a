// What `tokenwatch top` reads from the API: `/api/v1/fleet` rows and `/api/v1/alerts` items,
// deserialized tolerantly (unknown fields ignored, missing or null optional fields allowed).

use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// `null` and a missing field both become the type's default.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `GET /api/v1/fleet?window=…`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Fleet {
    #[serde(default, deserialize_with = "nullable")]
    pub window: String,
    pub generated_at_unix_ms: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    pub models: Vec<ModelRow>,
}

/// One model of the fleet: latency percentiles in seconds, rates per second, ratios in 0..1.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ModelRow {
    pub model_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub runtimes: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub instances: Vec<String>,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p99_s: Option<f64>,
    pub itl_p50_s: Option<f64>,
    pub itl_p99_s: Option<f64>,
    pub e2e_p50_s: Option<f64>,
    pub e2e_p99_s: Option<f64>,
    pub requests_per_s: Option<f64>,
    pub prompt_tokens_per_s: Option<f64>,
    pub output_tokens_per_s: Option<f64>,
    pub error_ratio: Option<f64>,
    pub kv_cache_usage: Option<f64>,
    pub requests_waiting: Option<f64>,
    pub requests_running: Option<f64>,
    pub gpu_memory_used_bytes: Option<f64>,
    pub gpu_memory_total_bytes: Option<f64>,
    pub gpu_memory_used_ratio: Option<f64>,
    #[serde(default, deserialize_with = "nullable")]
    pub alerts_firing: u64,
    #[serde(default, deserialize_with = "nullable")]
    pub alerts_pending: u64,
    /// Where the latency, rate and error figures come from: `proxy` (request records) or
    /// `runtime` (the runtime's scraped histograms and counters); None without figures.
    pub figure_source: Option<String>,
    /// Where the proxy and the runtime both see the model: the runtime's own percentiles by
    /// fleet column (`ttft_p50_s` …) …
    #[serde(default, deserialize_with = "nullable")]
    pub runtime_view: BTreeMap<String, RuntimeFigure>,
    /// … and the time in front of the runtime, known to its bucket.
    #[serde(default, deserialize_with = "nullable")]
    pub client_minus_runtime: BTreeMap<String, FrontGap>,
    /// Of the firing alerts: `critical`, `warning`, `info` (kept as text so a new level still shows).
    pub worst_severity: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub sparklines: Sparklines,
}

/// One of the runtime's own percentiles beside the proxy's.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct RuntimeFigure {
    pub value: f64,
}

/// Client-felt minus runtime-reported: `at_least` (None: unbounded) to `at_most`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct FrontGap {
    pub value: f64,
    pub at_least: Option<f64>,
    pub at_most: f64,
}

impl ModelRow {
    /// Whether the figures are the runtime's own (no proxy or OTLP record of the model).
    pub fn from_runtime(&self) -> bool {
        self.figure_source.as_deref() == Some("runtime")
    }

    /// GPU memory in use as a ratio: the reported one, else used / total.
    pub fn gpu_ratio(&self) -> Option<f64> {
        self.gpu_memory_used_ratio.or_else(|| {
            match (self.gpu_memory_used_bytes, self.gpu_memory_total_bytes) {
                (Some(u), Some(t)) if t > 0.0 => Some(u / t),
                _ => None,
            }
        })
    }
}

/// The last few minutes of a model, one point per step; `null` points are gaps.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Sparklines {
    #[serde(default, deserialize_with = "nullable")]
    pub t: Vec<Option<f64>>,
    #[serde(default, deserialize_with = "nullable")]
    pub ttft_p99_s: Vec<Option<f64>>,
    #[serde(default, deserialize_with = "nullable")]
    pub itl_p99_s: Vec<Option<f64>>,
    #[serde(default, deserialize_with = "nullable")]
    pub requests_per_s: Vec<Option<f64>>,
    #[serde(default, deserialize_with = "nullable")]
    pub kv_cache_usage: Vec<Option<f64>>,
    #[serde(default, deserialize_with = "nullable")]
    pub gpu_memory_used_bytes: Vec<Option<f64>>,
}

/// `GET /api/v1/alerts?model=…`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AlertList {
    #[serde(default, deserialize_with = "nullable")]
    pub alerts: Vec<AlertItem>,
}

/// The parts of an alert the detail pane shows.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct AlertItem {
    #[serde(default, deserialize_with = "nullable")]
    pub id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub rule: String,
    #[serde(default, deserialize_with = "nullable")]
    pub severity: String,
    #[serde(default, deserialize_with = "nullable")]
    pub state: String,
    pub grade: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
    pub active_at_unix_ms: Option<i64>,
    pub fired_at_unix_ms: Option<i64>,
    pub resolved_at_unix_ms: Option<i64>,
    pub last_event: Option<EventSummary>,
    #[serde(default, deserialize_with = "nullable")]
    pub root_cause: Vec<CauseSummary>,
}

impl AlertItem {
    /// The sentence to show: the `summary` annotation, else the latest anomaly's sentence.
    pub fn summary(&self) -> &str {
        self.annotations
            .get("summary")
            .map(String::as_str)
            .or_else(|| self.last_event.as_ref().map(|e| e.summary.as_str()))
            .unwrap_or("")
    }

    /// Firing first, then pending, then resolved; within a state, most severe first.
    pub fn order_key(&self) -> (u8, u8) {
        let state = match self.state.as_str() {
            "firing" => 0,
            "pending" => 1,
            _ => 2,
        };
        (state, severity_rank(Some(&self.severity)))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct EventSummary {
    #[serde(default, deserialize_with = "nullable")]
    pub detector: String,
    #[serde(default, deserialize_with = "nullable")]
    pub summary: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct CauseSummary {
    #[serde(default, deserialize_with = "nullable")]
    pub path: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub summary: String,
    pub rank: Option<f64>,
}

/// 0 = critical (most severe) … 3 = none/unknown.
pub fn severity_rank(severity: Option<&str>) -> u8 {
    match severity {
        Some("critical") => 0,
        Some("warning") => 1,
        Some("info") => 2,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_parses_the_documented_shape_and_tolerates_gaps() {
        let json = r#"{
          "window": "1m", "generated_at_unix_ms": 1764680000000, "future_field": {"x": 1},
          "models": [
            { "model_id": "a", "runtimes": ["sim"], "instances": ["sim-1"],
              "ttft_p50_s": 0.041, "ttft_p99_s": 0.12, "itl_p50_s": null,
              "requests_per_s": 4.1, "alerts_firing": 1, "alerts_pending": null,
              "worst_severity": "critical", "gpu_memory_used_bytes": 6.0e10, "gpu_memory_total_bytes": 8.0e10,
              "sparklines": { "t": [1, 2, 3], "ttft_p99_s": [0.1, null, 0.2], "new_series": [1] } },
            { "model_id": "b", "sparklines": null }
          ]
        }"#;
        let fleet: Fleet = serde_json::from_str(json).expect("parses");
        assert_eq!(fleet.models.len(), 2);
        let a = &fleet.models[0];
        assert_eq!(a.ttft_p99_s, Some(0.12));
        assert_eq!(a.itl_p50_s, None);
        assert_eq!((a.alerts_firing, a.alerts_pending), (1, 0));
        assert_eq!(a.sparklines.ttft_p99_s, vec![Some(0.1), None, Some(0.2)]);
        assert_eq!(a.gpu_ratio(), Some(0.75));
        assert_eq!(fleet.models[1].sparklines, Sparklines::default());
        assert!(
            serde_json::from_str::<Fleet>(r#"{"models":[{"ttft_p50_s":1}]}"#).is_err(),
            "model_id is required"
        );
    }

    #[test]
    fn alerts_parse_from_the_alert_api_shape() {
        let json = r#"{"count":1,"alerts":[{"id":"x","fingerprint":"f","rule":"ttft_p99_spike","labels":{"model_id":"a"},
          "annotations":{},"severity":"warning","grade":"L2","state":"firing","active_at_unix_ms":1,
          "fired_at_unix_ms":2,"resolved_at_unix_ms":null,
          "last_event":{"detector":"latency_spike","signal":"ttft","labels":{},"score":2.0,"at_unix_ms":2,"evidence":{},"summary":"TTFT P99 tripled"},
          "root_cause":[{"detector":"gpu_memory_leak","path":["gpu_memory_leak","latency_spike"],"summary":"leak","rank":0.8}],
          "incident_id":null,"snapshot":null}]}"#;
        let list: AlertList = serde_json::from_str(json).expect("parses");
        assert_eq!(list.alerts[0].summary(), "TTFT P99 tripled");
        assert_eq!(list.alerts[0].order_key(), (0, 1));
        assert_eq!(list.alerts[0].root_cause[0].path.len(), 2);
    }
}
