// SLOs as objects (spec section 3): the `slos:` configuration with the spec's defaults, and the
// SLO definitions the alert engine counts (`tracker.rs`) and the API and `/metrics` publish.
//
// Every SLO is request-based (the SRE workbook's formulation): each request is a good or a bad
// event, or is not counted, and the SLI is good / counted over a window.
//
// - `ttft_p95` (default: under 800 ms for 95 % of requests): a successful request that reported
//   a first token is good when its TTFT ≤ `threshold_ms`. "P95 < 800 ms" holds over a window
//   exactly when ≥ 95 % of the counted requests are good, so the target is the percentile.
// - `itl_p99` (default: 200 ms, 99 %): the same over the request's mean inter-token latency
//   (time per output token after the first; requests with fewer than two output tokens are not
//   counted). Failed requests count against `success`, not against the latency SLOs.
// - `success` (default: 99.5 %): every request counts; a server-side failure is bad (client
//   errors and cancellations are the caller's, as the error-burst detector counts them).
// - `guardrail_rate` (default: < 3.5 % flagged, target 96.5 %): each guardrail or hallucination
//   verdict posted for a request (`POST /api/v1/feedback`, `/api/v1/scores`) is counted, bad
//   when flagged. Without verdicts this SLO reports "no data" (no SLI, no budget).
//
// Error budget = 1 − target. Budget remaining = 1 − (bad / counted) / budget over the SLO window
// (1: untouched, 0: spent, below 0: overspent). Burn rate over a window = (bad / counted) /
// budget: 1 spends the budget in exactly the SLO window. Alerts: multi-window burn pairs (fast
// 1 h and 5 min ≥ 14.4×: page; slow 6 h and 30 min ≥ 6×: ticket), evaluated by the `slo_burn`
// detector with tokenwatch-detect's burn logic on the windows counted here.

pub mod metrics;
pub mod scaling;
pub mod tracker;

use crate::kernel::duration::HumanDuration;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// What an SLO measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    TtftP95,
    ItlP99,
    Success,
    GuardrailRate,
}

impl Objective {
    pub fn name(self) -> &'static str {
        match self {
            Objective::TtftP95 => "ttft_p95",
            Objective::ItlP99 => "itl_p99",
            Objective::Success => "success",
            Objective::GuardrailRate => "guardrail_rate",
        }
    }

    /// The signal its burn alerts name.
    pub fn signal(self) -> &'static str {
        match self {
            Objective::TtftP95 => "ttft",
            Objective::ItlP99 => "itl",
            Objective::Success => "success_ratio",
            Objective::GuardrailRate => "guardrail_ratio",
        }
    }

    /// The spec's latency threshold; None: not a latency objective.
    pub fn default_threshold_ms(self) -> Option<f64> {
        match self {
            Objective::TtftP95 => Some(800.0),
            Objective::ItlP99 => Some(200.0),
            Objective::Success | Objective::GuardrailRate => None,
        }
    }

    /// The spec's target share of good requests.
    pub fn default_target(self) -> f64 {
        match self {
            Objective::TtftP95 => 0.95,
            Objective::ItlP99 => 0.99,
            Objective::Success => 0.995,
            Objective::GuardrailRate => 0.965,
        }
    }
}

/// A label an SLO is computed per value of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SloLabel {
    Model,
    Tenant,
}

/// One entry of `slos:`.
///
/// ```yaml
/// slos:                      # omitted: the spec's four defaults, per model
///   - name: ttft_p95
///     objective: ttft_p95    # ttft_p95 | itl_p99 | success | guardrail_rate
///     threshold_ms: 800      # latency objectives only
///     target: 0.95           # share of good requests
///     window: 28d            # the error budget's window
///     by: [model, tenant]    # one series per value ([] = one overall)
///     burn_windows: {fast_long: 1h, fast_short: 5m, slow_long: 6h, slow_short: 30m}
/// ```
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SloConfig {
    pub name: String,
    pub objective: Objective,
    #[serde(default)]
    pub threshold_ms: Option<f64>,
    #[serde(default)]
    pub target: Option<f64>,
    #[serde(default = "default_window")]
    pub window: HumanDuration,
    #[serde(default = "default_by")]
    pub by: Vec<SloLabel>,
    #[serde(default)]
    pub burn_windows: BurnWindowsConfig,
}

fn default_window() -> HumanDuration {
    HumanDuration(Duration::from_secs(28 * 86_400))
}

fn default_by() -> Vec<SloLabel> {
    vec![SloLabel::Model]
}

/// The two window pairs of the multi-window burn alerts.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BurnWindowsConfig {
    pub fast_long: HumanDuration,
    pub fast_short: HumanDuration,
    pub slow_long: HumanDuration,
    pub slow_short: HumanDuration,
}

impl Default for BurnWindowsConfig {
    fn default() -> Self {
        let s = |n| HumanDuration(Duration::from_secs(n));
        BurnWindowsConfig {
            fast_long: s(3600),
            fast_short: s(300),
            slow_long: s(6 * 3600),
            slow_short: s(1800),
        }
    }
}

impl SloConfig {
    /// The spec's default SLO of `objective`, named after it.
    pub fn default_for(objective: Objective) -> SloConfig {
        SloConfig {
            name: objective.name().to_string(),
            objective,
            threshold_ms: None,
            target: None,
            window: default_window(),
            by: default_by(),
            burn_windows: BurnWindowsConfig::default(),
        }
    }

    pub fn target(&self) -> f64 {
        self.target
            .unwrap_or_else(|| self.objective.default_target())
    }

    pub fn threshold_ms(&self) -> Option<f64> {
        self.threshold_ms
            .or_else(|| self.objective.default_threshold_ms())
    }
}

/// The spec's defaults: TTFT P95 < 800 ms, ITL P99 < 200 ms, success ≥ 99.5 %, guardrail rate
/// < 3.5 %, each per model over 28 days.
pub fn default_slos() -> Vec<SloConfig> {
    [
        Objective::TtftP95,
        Objective::ItlP99,
        Objective::Success,
        Objective::GuardrailRate,
    ]
    .into_iter()
    .map(SloConfig::default_for)
    .collect()
}

/// The configured SLOs, or the defaults when `slos:` is absent (`slos: []` means none).
pub fn effective(configured: &Option<Vec<SloConfig>>) -> Vec<SloConfig> {
    configured.clone().unwrap_or_else(default_slos)
}

/// Checks serde cannot express; errors are (key path, message).
pub fn validate(configured: &Option<Vec<SloConfig>>) -> Result<(), (String, String)> {
    let Some(slos) = configured else {
        return Ok(());
    };
    let mut names = std::collections::HashSet::new();
    for (i, s) in slos.iter().enumerate() {
        let at = |k: &str| format!("slos[{i}].{k}");
        let ok_name = !s.name.is_empty()
            && s.name.len() <= 64
            && s.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok_name {
            return Err((
                at("name"),
                format!("{:?}: 1–64 letters, digits, _, - or .", s.name),
            ));
        }
        if !names.insert(s.name.as_str()) {
            return Err((at("name"), format!("SLO name {:?} is used twice", s.name)));
        }
        match (s.objective.default_threshold_ms(), s.threshold_ms) {
            (None, Some(_)) => {
                return Err((
                    at("threshold_ms"),
                    format!("{} is not a latency objective", s.objective.name()),
                ));
            }
            (Some(_), Some(t)) if !(t.is_finite() && t > 0.0) => {
                return Err((at("threshold_ms"), format!("must be > 0, got {t}")));
            }
            _ => {}
        }
        let target = s.target();
        if !(target > 0.0 && target < 1.0) {
            return Err((at("target"), format!("must be within (0, 1), got {target}")));
        }
        let mut seen = std::collections::HashSet::new();
        for (j, l) in s.by.iter().enumerate() {
            if !seen.insert(*l) {
                return Err((format!("slos[{i}].by[{j}]"), "listed twice".into()));
            }
        }
        let w = &s.burn_windows;
        let window = s.window.0;
        let key = |k: &str| format!("slos[{i}].burn_windows.{k}");
        for (k, d) in [
            ("fast_long", w.fast_long.0),
            ("fast_short", w.fast_short.0),
            ("slow_long", w.slow_long.0),
            ("slow_short", w.slow_short.0),
        ] {
            if d < Duration::from_secs(1) {
                return Err((key(k), "must be at least 1s".into()));
            }
            if d > window {
                return Err((key(k), format!("longer than the SLO window {window:?}")));
            }
        }
        if w.fast_short.0 >= w.fast_long.0 {
            return Err((key("fast_short"), "must be shorter than fast_long".into()));
        }
        if w.slow_short.0 >= w.slow_long.0 {
            return Err((key("slow_short"), "must be shorter than slow_long".into()));
        }
        if window > Duration::from_secs(400 * 86_400) {
            return Err((at("window"), "must be at most 400d".into()));
        }
    }
    Ok(())
}

/// One SLO series as the API and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloStatus {
    pub slo: String,
    pub objective: Objective,
    pub threshold_ms: Option<f64>,
    pub target: f64,
    /// The error budget's window, e.g. `28d`.
    pub window: String,
    /// The labels the SLO is split by (`model`, `tenant`).
    pub by: Vec<SloLabel>,
    /// `model_id` and `tenant` when the SLO is split by them (empty: one series overall, or
    /// the `no_data` entry of an SLO without any series).
    pub labels: std::collections::BTreeMap<String, String>,
    /// `ok`, or `no_data` when no request was counted in the window.
    pub status: &'static str,
    /// What was counted: `requests` (the proxy's or OTLP's request records), `runtime` (a
    /// model no record names, counted from its runtime's scraped histograms and counters —
    /// latency SLOs within the histogram bucket that holds the threshold), or both.
    pub counted_from: &'static str,
    /// Why there is no data, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Counted requests and bad ones over the SLO window.
    pub total: u64,
    pub bad: u64,
    /// Good / counted over the SLO window.
    pub sli: Option<f64>,
    pub error_budget: f64,
    /// 1 − (bad / counted) / error budget (below 0 when overspent).
    pub budget_remaining: Option<f64>,
    /// The four burn windows (fast long, fast short, slow long, slow short).
    pub burn: Vec<BurnWindowStatus>,
    /// For the `slo_burn` detector (not serialised: `burn` shows the same counts).
    #[serde(skip)]
    pub counts: tokenwatch_detect::BurnWindows,
    #[serde(skip)]
    pub lengths: tokenwatch_detect::BurnWindowLengths,
    #[serde(skip)]
    pub window_days: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BurnWindowStatus {
    pub window: String,
    /// `fast` (page) or `slow` (ticket) pair.
    pub pair: &'static str,
    pub bad: u64,
    pub total: u64,
    /// (bad / total) / error budget; None without requests.
    pub burn_rate: Option<f64>,
}

/// What the engine last published, for the API (`GET /api/v1/slos`).
#[derive(Default)]
pub struct SloBook {
    inner: RwLock<SloSnapshot>,
}

#[derive(Default, Clone)]
pub struct SloSnapshot {
    /// False when the alert engine (which computes SLOs) is disabled.
    pub computed: bool,
    pub at_unix_ms: i64,
    pub series: Arc<Vec<SloStatus>>,
}

impl SloBook {
    pub fn snapshot(&self) -> SloSnapshot {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn publish(&self, at_unix_ms: i64, series: Vec<SloStatus>) {
        let mut b = self.inner.write().unwrap_or_else(|p| p.into_inner());
        *b = SloSnapshot {
            computed: true,
            at_unix_ms,
            series: Arc::new(series),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(y: &str) -> Result<Option<Vec<SloConfig>>, String> {
        let v: Vec<SloConfig> = serde_saphyr::from_str(y).map_err(|e| e.to_string())?;
        let c = Some(v);
        validate(&c).map_err(|(k, m)| format!("{k}: {m}"))?;
        Ok(c)
    }

    #[test]
    fn defaults_are_the_spec_s() {
        let d = effective(&None);
        let got: Vec<(&str, Option<f64>, f64)> = d
            .iter()
            .map(|s| (s.name.as_str(), s.threshold_ms(), s.target()))
            .collect();
        assert_eq!(
            got,
            [
                ("ttft_p95", Some(800.0), 0.95),
                ("itl_p99", Some(200.0), 0.99),
                ("success", None, 0.995),
                ("guardrail_rate", None, 0.965),
            ]
        );
        assert!(
            d.iter().all(
                |s| s.window.0 == Duration::from_secs(28 * 86_400) && s.by == [SloLabel::Model]
            )
        );
        assert!(effective(&Some(Vec::new())).is_empty(), "slos: [] is none");
        assert!(validate(&Some(default_slos())).is_ok());
    }

    #[test]
    fn configured_slos_and_their_errors() {
        let c = parse(
            "- {name: fast, objective: ttft_p95, threshold_ms: 500, target: 0.9, window: 7d, by: [model, tenant], burn_windows: {fast_long: 10s, fast_short: 2s}}",
        )
        .unwrap()
        .unwrap();
        assert_eq!(c[0].threshold_ms(), Some(500.0));
        assert_eq!(c[0].burn_windows.fast_short.0, Duration::from_secs(2));
        assert_eq!(c[0].burn_windows.slow_long.0, Duration::from_secs(6 * 3600));
        for (y, want) in [
            ("- {name: a, objective: ttft_p95, colour: red}", "colour"),
            ("- {name: a, objective: p50}", "ttft_p95"),
            (
                "- {name: a, objective: success, threshold_ms: 5}",
                "slos[0].threshold_ms",
            ),
            (
                "- {name: a, objective: success, target: 1.5}",
                "slos[0].target",
            ),
            (
                "- {name: a, objective: success}\n- {name: a, objective: itl_p99}",
                "slos[1].name: SLO name \"a\" is used twice",
            ),
            ("- {name: a, objective: success, by: [region]}", "model"),
            (
                "- {name: a, objective: success, window: 1h, burn_windows: {slow_long: 6h}}",
                "slos[0].burn_windows.slow_long",
            ),
            (
                "- {name: a, objective: success, burn_windows: {fast_short: 2h}}",
                "slos[0].burn_windows.fast_short: must be shorter",
            ),
            ("- {name: 'a b', objective: success}", "slos[0].name"),
        ] {
            let e = parse(y).unwrap_err();
            assert!(e.contains(want), "{y}: {e}");
        }
    }
}
