// Prometheus rules export (`tokenwatch rules export --format prometheus`): the threshold rules
// that PromQL can express over the runtimes' own metrics (vLLM, DCGM), as an alerting rules file.
//
// Exported detectors and the metrics they use:
// - `absolute_latency`: `histogram_quantile(q, …vllm:<metric>_bucket…) > threshold` (with a
//   request-count floor when the rule has `min_samples`), per model, plus `<name>_instance`: an
//   instance over the threshold and `peer_ratio` × the median of its model's instances.
// - `latency_spike`: quantile of the last window > ratio × the same quantile over the
//   `baseline_windows` windows before it (`offset` one window), with at least `min_samples`
//   requests in the window; per model, plus `<name>_instance` (also `peer_ratio` × the median
//   of the model's instances). PromQL cannot freeze the baseline at onset as tokenwatch does.
// - `error_burst`: the error ratio over `window_seconds` ≥ burn_rate × the budget with at least
//   `min_requests` requests, per model and per (model, instance).
// - `context_aware_threshold`: the P99 against base × (1 + k × median prompt tokens) ×
//   (offset − weight × KV-cache usage), all three read from vLLM.
// - `kv_cache_pressure`: `vllm:kv_cache_usage_perc` over the limit while preemptions or the
//   waiting queue rise.
// - `gpu_memory_leak`: `deriv(DCGM_FI_DEV_FB_USED)` over the growth limit with `DCGM_FI_DEV_GPU_UTIL`
//   under the utilisation limit, plus a `predict_linear` exhaustion rule; configured rules also
//   get their step rule (`consecutive` × `step_mib` of growth over the window, still rising).
// - `slo_burn`: multi-window error-budget burn over `vllm:request_success_total{finished_reason}`.
// - `threshold`: the signal read from its runtime metric (see `configured::signal_expr`).
// Every other detector (drift, outliers, entropy, per-request grading…) needs tokenwatch's own
// data and is listed as skipped in a comment of the output. `configured` maps a configuration's
// rules onto export specs.

pub mod configured;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;
use tokenwatch_core::alert::Severity;

/// The part of a rule the export needs; the engine maps its rule configuration onto it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleExportSpec {
    /// Rule name, used as the Prometheus `alert` name (so routes match both sources).
    pub name: String,
    /// Detector name, e.g. `absolute_latency`, `latency_spike`, `kv_cache_pressure`.
    pub detector: String,
    /// Watched signal where it matters, e.g. `ttft_p99_seconds` (latency detectors).
    pub signal: String,
    /// Numeric parameters by name (see [`default_export_specs`] for each detector's keys);
    /// missing ones take the spec's defaults.
    pub params: BTreeMap<String, f64>,
    /// How long the condition must hold (`for`).
    pub for_duration: Duration,
    pub severity: Severity,
    /// `L1` / `L2` where graded.
    pub grade: Option<String>,
    /// One-line summary: plain text (template markers are escaped), or a Prometheus template
    /// when `summary_is_template`.
    pub summary: String,
    /// The summary is already a Prometheus template (a configured rule's, translated).
    #[serde(default)]
    pub summary_is_template: bool,
    /// `>`, `>=`, `<` or `<=` of a `threshold` rule.
    #[serde(default)]
    pub comparison: Option<String>,
}

impl RuleExportSpec {
    fn param(&self, key: &str, default: f64) -> f64 {
        self.params
            .get(key)
            .copied()
            .filter(|v| v.is_finite())
            .unwrap_or(default)
    }
}

#[allow(clippy::too_many_arguments)] // a table row of `default_export_specs`
fn spec(
    name: &str,
    detector: &str,
    signal: &str,
    params: &[(&str, f64)],
    for_s: u64,
    severity: Severity,
    grade: Option<&str>,
    summary: &str,
) -> RuleExportSpec {
    RuleExportSpec {
        name: name.into(),
        detector: detector.into(),
        signal: signal.into(),
        params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        for_duration: Duration::from_secs(for_s),
        severity,
        grade: grade.map(str::to_string),
        summary: summary.into(),
        summary_is_template: false,
        comparison: None,
    }
}

/// The spec's default rules that PromQL can express (spec sections 4 and 5), with their
/// parameters spelled out.
pub fn default_export_specs() -> Vec<RuleExportSpec> {
    vec![
        spec(
            "ttft_p99_absolute",
            "absolute_latency",
            "ttft_p99_seconds",
            &[
                ("threshold_seconds", 2.0),
                ("window_seconds", 60.0),
                ("min_samples", 20.0),
                ("peer_ratio", 2.0),
            ],
            60,
            Severity::Warning,
            Some("L1"),
            "P99 time to first token above 2 s: run the health check",
        ),
        spec(
            "ttft_p99_spike",
            "latency_spike",
            "ttft_p99_seconds",
            &[
                ("ratio", 2.5),
                ("window_seconds", 60.0),
                ("min_samples", 50.0),
                ("baseline_windows", 5.0),
                ("peer_ratio", 2.0),
            ],
            120,
            Severity::Critical,
            Some("L2"),
            "P99 time to first token jumped 2.5x against the minutes before: diagnose the inference path",
        ),
        spec(
            "kv_cache_pressure",
            "kv_cache_pressure",
            "kv_cache_usage",
            &[("usage_threshold", 0.9), ("window_seconds", 300.0)],
            60,
            Severity::Warning,
            None,
            "KV cache above 90% with rising preemptions or queue",
        ),
        spec(
            "gpu_memory_leak",
            "gpu_memory_leak",
            "gpu_memory_used_bytes",
            &[
                ("growth_mib_per_minute", 128.0),
                ("max_utilization", 0.05),
                ("window_seconds", 600.0),
                ("exhaustion_horizon_seconds", 3600.0),
            ],
            300,
            Severity::Critical,
            None,
            "GPU memory grows steadily while the GPU is idle: likely leak",
        ),
        spec(
            "slo_error_budget_burn",
            "slo_burn",
            "error_ratio",
            &[
                ("objective", 0.995),
                ("fast_burn", 14.4),
                ("slow_burn", 6.0),
            ],
            120,
            Severity::Critical,
            None,
            "Error budget of the success-rate SLO burning fast",
        ),
        spec(
            "error_burst",
            "error_burst",
            "error_ratio",
            &[
                ("objective", 0.995),
                ("burn_rate", 40.0),
                ("min_requests", 20.0),
                ("window_seconds", 60.0),
            ],
            0,
            Severity::Critical,
            None,
            "Error burst: a large share of requests failing right now",
        ),
    ]
}

/// One Prometheus alerting rule.
struct PromRule {
    alert: String,
    expr: String,
    for_duration: Duration,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

/// Render the rules as a Prometheus rule file (one group, `tokenwatch`); rules whose detector
/// PromQL cannot express are listed in comments at the top.
pub fn export_prometheus_rules(rules: &[RuleExportSpec]) -> String {
    let mut out = String::from("# Generated by `tokenwatch rules export --format prometheus`.\n");
    out.push_str("# Alerting rules over the runtimes' own metrics (vLLM, DCGM exporter); check with `promtool check rules`.\n");
    let mut prom = Vec::new();
    for r in rules {
        match to_prom(r) {
            Ok(mut p) => prom.append(&mut p),
            Err(why) => {
                let _ = writeln!(
                    out,
                    "# skipped {} ({}): {}",
                    r.name.replace('\n', " "),
                    r.detector.replace('\n', " "),
                    why
                );
            }
        }
    }
    out.push_str("groups:\n  - name: tokenwatch\n    rules:");
    if prom.is_empty() {
        out.push_str(" []\n");
        return out;
    }
    out.push('\n');
    for p in prom {
        let _ = writeln!(out, "      - alert: {}", q(&p.alert));
        let _ = writeln!(out, "        expr: {}", q(&p.expr));
        if !p.for_duration.is_zero() {
            let _ = writeln!(out, "        for: {}", prom_duration(p.for_duration));
        }
        for (section, map) in [("labels", &p.labels), ("annotations", &p.annotations)] {
            let _ = writeln!(out, "        {section}:");
            for (k, v) in map {
                let _ = writeln!(out, "          {}: {}", key(k), q(v));
            }
        }
    }
    out
}

/// A YAML double-quoted scalar (JSON string syntax is valid YAML).
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A mapping key: plain when it is a label name, quoted otherwise.
fn key(s: &str) -> String {
    let plain = s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain { s.to_string() } else { q(s) }
}

/// Prometheus duration: `90s`, `2m`, `1h`, `1500ms`.
fn prom_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// A number as PromQL accepts it, without float noise (`0.072`, not `0.07200000000000001`).
fn num(x: f64) -> String {
    let s = format!("{x:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// Escape Go-template actions so a plain summary is printed as written.
fn literal(text: &str) -> String {
    text.replace("{{", "{{ \"{{\" }}")
}

/// `ttft_p99_seconds` → (`vllm:time_to_first_token_seconds`, 0.99).
fn latency_histogram(signal: &str) -> Result<(&'static str, f64), String> {
    let mut parts = signal
        .strip_suffix("_seconds")
        .unwrap_or(signal)
        .rsplitn(2, '_');
    let (qs, metric) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let hist = match metric {
        "ttft" => "vllm:time_to_first_token_seconds",
        "itl" => "vllm:inter_token_latency_seconds",
        "e2e" => "vllm:e2e_request_latency_seconds",
        "queue" => "vllm:request_queue_time_seconds",
        _ => {
            return Err(format!(
                "signal {signal:?} is not a latency the runtimes export (ttft, itl, e2e, queue)"
            ));
        }
    };
    let quantile = match qs.strip_prefix('p').and_then(|d| d.parse::<f64>().ok()) {
        Some(p) if p > 0.0 && p < 100.0 => p / 100.0,
        _ => {
            return Err(format!(
                "signal {signal:?} names no percentile (e.g. ttft_p99_seconds)"
            ));
        }
    };
    Ok((hist, quantile))
}

fn window(r: &RuleExportSpec, default_s: f64) -> Result<String, String> {
    let s = r.param("window_seconds", default_s);
    if s < 1.0 {
        return Err(format!("window_seconds {s} is below 1"));
    }
    Ok(prom_duration(Duration::from_secs(s.round() as u64)))
}

/// Label sets of the latency and error rules: per model and per (model, instance).
const MODEL: &str = "model_name";
const INSTANCE: &str = "model_name, instance";

/// A latency quantile over `w` (optionally offset), aggregated `by`.
fn tail(hist: &str, quant: f64, by: &str, w: &str, offset: &str) -> String {
    format!(
        "histogram_quantile({}, sum by (le, {by}) (rate({hist}_bucket[{w}]{offset})))",
        num(quant)
    )
}

/// At least `min` requests in the window.
fn count_floor(hist: &str, by: &str, w: &str, min: f64) -> String {
    format!(
        " and on ({by}) sum by ({by}) (increase({hist}_count[{w}])) >= {}",
        num(min)
    )
}

/// An instance's tail `q` (per model and instance) is `ratio` × its model's median instance.
fn peer_clause(q: &str, ratio: f64) -> String {
    format!(
        " and on (model_name, instance) ({q} > on (model_name) group_left () ({} * quantile by (model_name) (0.5, {q})))",
        num(ratio)
    )
}

fn to_prom(r: &RuleExportSpec) -> Result<Vec<PromRule>, String> {
    let mut labels = BTreeMap::from([("severity".to_string(), r.severity.name().to_string())]);
    if let Some(g) = r.grade.as_ref().filter(|g| !g.is_empty()) {
        labels.insert("grade".into(), g.clone());
    }
    let summary = if r.summary_is_template {
        r.summary.clone()
    } else {
        literal(&r.summary)
    };
    let rule = |alert: String, expr: String, description: String| PromRule {
        alert,
        expr,
        for_duration: r.for_duration,
        labels: labels.clone(),
        annotations: BTreeMap::from([
            ("summary".into(), summary.clone()),
            ("description".into(), description),
        ]),
    };
    match r.detector.as_str() {
        "absolute_latency" => {
            let (hist, quant) = latency_histogram(&r.signal)?;
            let (t, w) = (r.param("threshold_seconds", 2.0), window(r, 60.0)?);
            let min = r.params.get("min_samples").copied().filter(|m| *m > 0.0);
            let peer = r.param("peer_ratio", 2.0);
            let mut out = Vec::new();
            for by in [MODEL, INSTANCE] {
                let q = tail(hist, quant, by, &w, "");
                let mut expr = format!("{q} > {}", num(t));
                if let Some(min) = min {
                    expr.push_str(&count_floor(hist, by, &w, min));
                }
                let (name, desc) = if by == MODEL {
                    (r.name.clone(), format!(
                        "{} of {{{{ $labels.model_name }}}} is {{{{ $value | humanizeDuration }}}} (threshold {}s over {w}).",
                        r.signal,
                        num(t)
                    ))
                } else {
                    expr.push_str(&peer_clause(&q, peer));
                    (format!("{}_instance", r.name), format!(
                        "{} of {{{{ $labels.model_name }}}} on {{{{ $labels.instance }}}} is {{{{ $value | humanizeDuration }}}} (threshold {}s over {w}, and {}x its peers' median).",
                        r.signal,
                        num(t),
                        num(peer)
                    ))
                };
                out.push(rule(name, expr, desc));
            }
            Ok(out)
        }
        "latency_spike" => {
            let (hist, quant) = latency_histogram(&r.signal)?;
            let (ratio, w, min) = (
                r.param("ratio", 2.5),
                window(r, 60.0)?,
                r.param("min_samples", 50.0),
            );
            let w_s = r.param("window_seconds", 60.0).round().max(1.0);
            let span = prom_duration(Duration::from_secs(
                (w_s * r.param("baseline_windows", 5.0).round().max(1.0)) as u64,
            ));
            let peer = r.param("peer_ratio", 2.0);
            let mut out = Vec::new();
            for by in [MODEL, INSTANCE] {
                let q = tail(hist, quant, by, &w, "");
                let base = tail(hist, quant, by, &span, &format!(" offset {w}"));
                let mut expr = format!(
                    "{q} > {} * {base}{}",
                    num(ratio),
                    count_floor(hist, by, &w, min)
                );
                let (name, desc) = if by == MODEL {
                    (r.name.clone(), format!(
                        "{} of {{{{ $labels.model_name }}}} is {{{{ $value | humanizeDuration }}}}, over {}x the {span} before the last {w}.",
                        r.signal,
                        num(ratio)
                    ))
                } else {
                    expr.push_str(&peer_clause(&q, peer));
                    (format!("{}_instance", r.name), format!(
                        "{} of {{{{ $labels.model_name }}}} on {{{{ $labels.instance }}}} is {{{{ $value | humanizeDuration }}}}, over {}x the {span} before the last {w} and {}x its peers' median.",
                        r.signal,
                        num(ratio),
                        num(peer)
                    ))
                };
                out.push(rule(name, expr, desc));
            }
            Ok(out)
        }
        "error_burst" => {
            let objective = r.param("objective", 0.995);
            if !(0.0..1.0).contains(&objective) || objective <= 0.0 {
                return Err(format!("objective {objective} is not within (0, 1)"));
            }
            let threshold = r.param("burn_rate", 40.0) * (1.0 - objective);
            if !(threshold > 0.0 && threshold <= 1.0) {
                return Err(format!("burn_rate × (1 − objective) = {threshold} is not within (0, 1]"));
            }
            // Scrape intervals make windows under a minute meaningless to `rate`: the engine's
            // 5 s window is exported as one minute.
            let w_s = r.param("window_seconds", 60.0).round().max(60.0);
            let w = prom_duration(Duration::from_secs(w_s as u64));
            let min = r.param("min_requests", 20.0);
            let mut out = Vec::new();
            for by in [MODEL, INSTANCE] {
                let expr = format!(
                    "sum by ({by}) (rate(vllm:request_success_total{{finished_reason=\"error\"}}[{w}])) / sum by ({by}) (rate(vllm:request_success_total[{w}])) >= {} and on ({by}) sum by ({by}) (increase(vllm:request_success_total[{w}])) >= {}",
                    num(threshold),
                    num(min)
                );
                let (name, at) = if by == MODEL {
                    (r.name.clone(), "{{ $labels.model_name }}")
                } else {
                    (format!("{}_instance", r.name), "{{ $labels.model_name }} on {{ $labels.instance }}")
                };
                let desc = format!(
                    "{{{{ $value | humanizePercentage }}}} of the requests of {at} failed over the last {w} ({}x the {}% error budget or more).",
                    num(r.param("burn_rate", 40.0)),
                    num((1.0 - objective) * 100.0)
                );
                out.push(rule(name, expr, desc));
            }
            Ok(out)
        }
        "kv_cache_pressure" => {
            let (u, w) = (r.param("usage_threshold", 0.9), window(r, 300.0)?);
            let expr = format!(
                "max by (model_name, instance) (vllm:kv_cache_usage_perc) > {} and on (model_name, instance) \
                 (sum by (model_name, instance) (rate(vllm:num_preemptions_total[{w}])) > 0 \
                 or sum by (model_name, instance) (deriv(vllm:num_requests_waiting[{w}])) > 0)",
                num(u)
            );
            let desc = "KV cache of {{ $labels.model_name }} on {{ $labels.instance }} is {{ $value | humanizePercentage }} full while requests are preempted or queue up.".to_string();
            Ok(vec![rule(r.name.clone(), expr, desc)])
        }
        "gpu_memory_leak" => {
            let (g, util, w) = (
                r.param("growth_mib_per_minute", 128.0),
                r.param("max_utilization", 0.05),
                window(r, 600.0)?,
            );
            let horizon = r.param("exhaustion_horizon_seconds", 3600.0).max(60.0);
            // DCGM reports framebuffer memory in MiB and utilisation in percent.
            let leak = format!(
                "deriv(DCGM_FI_DEV_FB_USED[{w}]) * 60 > {} and on (instance, gpu, UUID) DCGM_FI_DEV_GPU_UTIL < {}",
                num(g),
                num(util * 100.0)
            );
            let exhaustion = format!(
                "predict_linear(DCGM_FI_DEV_FB_USED[{w}], {}) >= (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) and deriv(DCGM_FI_DEV_FB_USED[{w}]) > 0",
                num(horizon.round())
            );
            let mut out = Vec::new();
            if let (Some(step), Some(n)) = (r.params.get("step_mib"), r.params.get("consecutive")) {
                let steps = format!(
                    "delta(DCGM_FI_DEV_FB_USED[{w}]) >= {} and deriv(DCGM_FI_DEV_FB_USED[{w}]) > 0",
                    num(step * n)
                );
                out.push(rule(
                    format!("{}_steps", r.name),
                    steps,
                    format!("GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) on {{{{ $labels.instance }}}}: used memory grew {{{{ $value | humanize }}}} MiB within {w} and is still rising ({} steps of {} MiB make a leak).", num(*n), num(*step)),
                ));
            }
            out.extend([
                rule(r.name.clone(), leak, "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.instance }}: used memory grows {{ $value | humanize }} MiB/min while nearly idle.".into()),
                rule(
                    format!("{}_exhaustion", r.name),
                    exhaustion,
                    format!("GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) on {{{{ $labels.instance }}}} will run out of memory within {} at the current growth.", prom_duration(Duration::from_secs(horizon.round() as u64))),
                ),
            ]);
            Ok(out)
        }
        "slo_burn" => {
            let objective = r.param("objective", 0.995);
            if !(0.0..1.0).contains(&objective) || objective <= 0.0 {
                return Err(format!("objective {objective} is not within (0, 1)"));
            }
            let budget = 1.0 - objective;
            let ratio = |w: &str| {
                format!(
                    "sum by (model_name) (rate(vllm:request_success_total{{finished_reason=\"error\"}}[{w}])) / sum by (model_name) (rate(vllm:request_success_total[{w}]))"
                )
            };
            let (fast, slow) = (
                num(r.param("fast_burn", 14.4) * budget),
                num(r.param("slow_burn", 6.0) * budget),
            );
            let expr = format!(
                "({} > {fast} and {} > {fast}) or ({} > {slow} and {} > {slow})",
                ratio("1h"),
                ratio("5m"),
                ratio("6h"),
                ratio("30m")
            );
            let desc = format!(
                "Error ratio of {{{{ $labels.model_name }}}} is {{{{ $value | humanizePercentage }}}}: burning the {}% success objective's budget ({}x over 1h and 5m, or {}x over 6h and 30m).",
                num(objective * 100.0),
                num(r.param("fast_burn", 14.4)),
                num(r.param("slow_burn", 6.0))
            );
            Ok(vec![rule(r.name.clone(), expr, desc)])
        }
        "context_aware_threshold" => {
            let (hist, quant) = latency_histogram(&r.signal)?;
            let w = window(r, 60.0)?;
            let (base, k) = (
                r.param("base_ms", 1200.0) / 1000.0,
                r.param("per_prompt_token", 0.002),
            );
            let (off, weight) = (r.param("kv_offset", 1.5), r.param("kv_weight", 0.8));
            let expr = format!(
                "histogram_quantile({}, sum by (le, model_name) (rate({hist}_bucket[{w}]))) > on (model_name) \
                 {} * (1 + {} * histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:request_prompt_tokens_bucket[{w}])))) \
                 * ({} - {} * max by (model_name) (vllm:kv_cache_usage_perc))",
                num(quant),
                num(base),
                num(k),
                num(off),
                num(weight)
            );
            let desc = format!(
                "{} of {{{{ $labels.model_name }}}} is {{{{ $value | humanizeDuration }}}}, above {}s × (1 + {} × median prompt tokens) × ({} − {} × KV-cache usage).",
                r.signal,
                num(base),
                num(k),
                num(off),
                num(weight)
            );
            Ok(vec![rule(r.name.clone(), expr, desc)])
        }
        "threshold" => {
            let op = r.comparison.as_deref().unwrap_or(">");
            if !matches!(op, ">" | ">=" | "<" | "<=") {
                return Err(format!("comparison {op:?} is not >, >=, < or <="));
            }
            let value = r
                .params
                .get("value")
                .copied()
                .filter(|v| v.is_finite())
                .ok_or_else(|| "a threshold needs a finite value".to_string())?;
            let w = window(r, 60.0)?;
            let read = configured::signal_expr(
                &r.signal,
                Duration::from_secs(r.param("window_seconds", 60.0).round().max(1.0) as u64),
            )?;
            let expr = format!("{read} {op} {}", num(value));
            let desc = format!(
                "{} is {{{{ $value | humanize }}}} ({op} {}; rates over {w}).",
                r.signal,
                num(value)
            );
            Ok(vec![rule(r.name.clone(), expr, desc)])
        }
        other => Err(configured::skip_reason(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_export_every_rule() {
        let y = export_prometheus_rules(&default_export_specs());
        assert!(!y.contains("# skipped"), "{y}");
        for name in [
            "ttft_p99_absolute",
            "ttft_p99_spike",
            "kv_cache_pressure",
            "gpu_memory_leak",
            "gpu_memory_leak_exhaustion",
            "slo_error_budget_burn",
            "ttft_p99_absolute_instance",
            "ttft_p99_spike_instance",
            "error_burst",
            "error_burst_instance",
        ] {
            assert!(
                y.contains(&format!("- alert: \"{name}\"")),
                "{name} in\n{y}"
            );
        }
        // The built-in absolute-latency rule's 60 s window, as the engine's.
        assert!(y.contains(r#"histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[1m]))) > 2"#), "{y}");
        assert!(y.contains("[5m] offset 1m"), "baseline: 5 windows before the current one: {y}");
        assert!(y.contains("sum by (le, model_name, instance)"), "{y}");
        assert!(y.contains("group_left () (2 * quantile by (model_name) (0.5, "), "{y}");
        assert!(y.contains(">= 0.2 and on (model_name) sum by (model_name) (increase(vllm:request_success_total[1m])) >= 20"), "{y}");
        assert!(
            y.contains("> 0.072 and"),
            "fast burn threshold 14.4 × 0.5%: {y}"
        );
        assert!(y.contains("for: 2m"));
    }

    #[test]
    fn unknown_detectors_are_listed_as_skipped() {
        let mut s = default_export_specs()[0].clone();
        s.detector = "distribution_drift".into();
        s.name = "drift".into();
        let y = export_prometheus_rules(&[s]);
        assert!(y.contains("# skipped drift (distribution_drift)"), "{y}");
        assert!(y.contains("rules: []"), "{y}");
    }

    #[test]
    fn configured_threshold_leak_and_context_rules_render() {
        let c: crate::alerting::rules::AlertingConfig = serde_saphyr::from_str(
            "default_rules: false\nrules:\n  - {name: kv_full, detector: threshold, signal: kv_cache_usage, params: {op: '>=', value: 0.98}, for: 30s}\n  - {name: hot, detector: threshold, signal: gpu_temperature_celsius, params: {op: '>', value: 85}}\n  - {name: custom, detector: threshold, signal: my_signal, params: {value: 1}}\n  - {name: leak, detector: gpu_memory_leak, window: 1m}\n  - {name: ctx, detector: context_aware_threshold}\n  - {name: len, detector: output_length_outlier}\n",
        )
        .unwrap();
        let y = export_prometheus_rules(&configured::specs_for_config(&c).unwrap());
        assert!(
            y.contains(
                "expr: \"max by (model_name, instance) (vllm:kv_cache_usage_perc) >= 0.98\""
            ),
            "{y}"
        );
        assert!(y.contains("expr: \"DCGM_FI_DEV_GPU_TEMP > 85\""), "{y}");
        assert!(
            y.contains("# skipped custom (threshold): signal \"my_signal\""),
            "{y}"
        );
        assert!(
            y.contains(
                "delta(DCGM_FI_DEV_FB_USED[1m]) >= 640 and deriv(DCGM_FI_DEV_FB_USED[1m]) > 0"
            ),
            "{y}"
        );
        assert!(y.contains("- alert: \"leak_steps\""), "{y}");
        assert!(y.contains("vllm:request_prompt_tokens_bucket[1m]"), "{y}");
        assert!(
            y.contains("# skipped len (output_length_outlier): detector \"output_length_outlier\" has no PromQL equivalent"),
            "{y}"
        );
        assert!(y.contains("for: 30s"), "{y}");
    }

    #[test]
    fn latency_signal_mapping() {
        assert_eq!(
            latency_histogram("ttft_p99_seconds").unwrap(),
            ("vllm:time_to_first_token_seconds", 0.99)
        );
        assert_eq!(
            latency_histogram("e2e_p50_seconds").unwrap(),
            ("vllm:e2e_request_latency_seconds", 0.5)
        );
        assert!(latency_histogram("gpu_utilization").is_err());
        assert!(latency_histogram("ttft_pxx_seconds").is_err());
    }

    #[test]
    fn templates_in_summaries_are_escaped_and_numbers_clean() {
        assert_eq!(literal("a {{ x }} b"), "a {{ \"{{\" }} x }} b");
        assert_eq!(num(14.4 * 0.005), "0.072");
        assert_eq!(num(2.0), "2");
        assert_eq!(prom_duration(Duration::from_secs(90)), "90s");
        assert_eq!(prom_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(prom_duration(Duration::from_secs(7200)), "2h");
    }
}
