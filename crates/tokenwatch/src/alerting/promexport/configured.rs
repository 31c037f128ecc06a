// The user's configured rules (`alerting.rules`, overrides applied) as export specs, and the
// PromQL that reads each normalised signal from the runtimes' own metrics (vLLM, DCGM exporter).

use super::{RuleExportSpec, default_export_specs, latency_histogram, prom_duration};
use crate::alerting::rules::{AlertingConfig, DetectorKind, Rule, RuleError, compile};
use std::collections::BTreeMap;
use std::time::Duration;
use tokenwatch_core::signals::names;

const MIB: f64 = 1024.0 * 1024.0;

/// What `tokenwatch rules export` writes for a configuration: the built-in export set (when
/// `alerting.default_rules` is on), then every configured rule (`alerting.rules`, with its
/// overrides). A configured rule named like a built-in export replaces it. Rules PromQL cannot
/// express stay in the list; the renderer turns them into `# skipped` comment lines.
pub fn specs_for_config(cfg: &AlertingConfig) -> Result<Vec<RuleExportSpec>, RuleError> {
    let compiled = compile(cfg)?;
    let configured: Vec<RuleExportSpec> = cfg
        .rules
        .iter()
        .filter_map(|rc| compiled.iter().find(|r| r.name == rc.name))
        .map(spec_of_rule)
        .collect();
    let mut out: Vec<RuleExportSpec> = if cfg.default_rules {
        default_export_specs()
            .into_iter()
            .filter(|d| !configured.iter().any(|c| c.name == d.name))
            .collect()
    } else {
        Vec::new()
    };
    out.extend(configured);
    Ok(out)
}

/// One compiled rule as an export spec (parameters in the exporter's units).
pub fn spec_of_rule(r: &Rule) -> RuleExportSpec {
    let window_s = r.window_ms as f64 / 1000.0;
    let latency = |metric: &str| match metric {
        "itl" => "itl_p99_seconds".to_string(),
        m => names::latency_signal(m, "p99"),
    };
    let mut comparison = None;
    let (signal, params): (String, Vec<(&str, f64)>) = match &r.kind {
        DetectorKind::AbsoluteLatency(p) => (
            latency(&r.signal),
            vec![
                ("threshold_seconds", p.threshold_s),
                ("min_samples", p.min_samples as f64),
                ("peer_ratio", p.peer_ratio),
            ],
        ),
        DetectorKind::LatencySpike(p) => (
            latency(&r.signal),
            vec![
                ("ratio", p.ratio),
                ("min_samples", p.min_samples as f64),
                ("baseline_windows", f64::from(p.baseline_windows)),
                ("peer_ratio", p.peer_ratio),
            ],
        ),
        DetectorKind::ContextAware(p) => (
            latency(&r.signal),
            vec![
                ("base_ms", p.base_ms),
                ("per_prompt_token", p.per_prompt_token),
                ("kv_offset", p.kv_offset),
                ("kv_weight", p.kv_weight),
            ],
        ),
        DetectorKind::KvPressure(p) => (
            r.signal.clone(),
            vec![("usage_threshold", p.usage_threshold)],
        ),
        DetectorKind::GpuLeak(p) => (
            r.signal.clone(),
            vec![
                (
                    "growth_mib_per_minute",
                    p.min_slope_bytes_per_s * 60.0 / MIB,
                ),
                ("max_utilization", p.max_utilization),
                ("step_mib", p.step_bytes / MIB),
                ("consecutive", p.consecutive as f64),
            ],
        ),
        DetectorKind::SloBurn(p) => (
            "error_ratio".to_string(),
            vec![
                ("objective", p.objective),
                ("fast_burn", p.fast_burn),
                ("slow_burn", p.slow_burn),
            ],
        ),
        DetectorKind::ErrorBurst(p) => (
            "error_ratio".to_string(),
            vec![
                ("objective", p.objective),
                ("burn_rate", p.burn_rate),
                ("min_requests", p.min_requests as f64),
            ],
        ),
        DetectorKind::Threshold(p) => {
            comparison = Some(p.op.clone());
            (r.signal.clone(), vec![("value", p.value)])
        }
        _ => (r.signal.clone(), Vec::new()),
    };
    let mut params: BTreeMap<String, f64> = params
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    params.insert("window_seconds".into(), window_s);
    RuleExportSpec {
        name: r.name.clone(),
        detector: r.detector.clone(),
        signal,
        params,
        for_duration: Duration::from_millis(r.for_ms.max(0) as u64),
        severity: r.severity,
        grade: r.grade.clone(),
        summary: prom_template(&r.summary, r),
        summary_is_template: true,
        comparison,
    }
}

/// A tokenwatch template as a Prometheus one: label placeholders become `$labels` (with the
/// runtimes' label names), `value` becomes `$value`, `rule`/`severity` are filled in, and
/// evidence (which only tokenwatch's detectors produce) is left out.
fn prom_template(tpl: &str, r: &Rule) -> String {
    let mut out = String::with_capacity(tpl.len());
    let mut rest = tpl;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find("}}").map(|i| i + start) else {
            // Unclosed (refused by the rule checks): keep it as text.
            out.push_str(&rest[start..].replace("{{", "{{ \"{{\" }}"));
            return out;
        };
        let key = rest[start + 2..end].trim();
        match key {
            "value" => out.push_str("{{ $value }}"),
            "rule" => out.push_str(&r.name),
            "severity" => out.push_str(r.severity.name()),
            k => {
                if let Some(l) = k.strip_prefix("labels.") {
                    let l = match l {
                        "model_id" => "model_name",
                        "device_id" => "UUID",
                        other => other,
                    };
                    if l.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !l.is_empty() {
                        out.push_str(&format!("{{{{ $labels.{l} }}}}"));
                    }
                }
            }
        }
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out
}

/// PromQL reading a normalised signal from the runtimes' own metrics, one series per
/// (model, instance) or per GPU, as tokenwatch's threshold rules see it. `Err` says why not.
pub fn signal_expr(signal: &str, window: Duration) -> Result<String, String> {
    let w = prom_duration(window);
    let by = "by (model_name, instance)";
    let rate = |m: &str| format!("sum {by} (rate({m}[{w}]))");
    Ok(match signal {
        names::KV_CACHE_USAGE => format!("max {by} (vllm:kv_cache_usage_perc)"),
        names::REQUESTS_RUNNING => format!("sum {by} (vllm:num_requests_running)"),
        names::REQUESTS_WAITING => format!("sum {by} (vllm:num_requests_waiting)"),
        names::PREEMPTIONS_PER_SECOND => rate("vllm:num_preemptions_total"),
        names::REQUESTS_PER_SECOND => rate("vllm:request_success_total"),
        names::PROMPT_TOKENS_PER_SECOND => rate("vllm:prompt_tokens_total"),
        names::OUTPUT_TOKENS_PER_SECOND => rate("vllm:generation_tokens_total"),
        names::PREFIX_CACHE_HIT_RATE => format!(
            "{} / {}",
            rate("vllm:prefix_cache_hits_total"),
            rate("vllm:prefix_cache_queries_total")
        ),
        names::SPEC_DECODE_ACCEPTANCE_RATE => format!(
            "{} / {}",
            rate("vllm:spec_decode_num_accepted_tokens_total"),
            rate("vllm:spec_decode_num_draft_tokens_total")
        ),
        // dcgm-exporter: framebuffer in MiB, utilisation in percent.
        names::GPU_MEMORY_USED_BYTES => "DCGM_FI_DEV_FB_USED * 1048576".into(),
        names::GPU_MEMORY_TOTAL_BYTES => {
            "(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) * 1048576".into()
        }
        names::GPU_MEMORY_USED_RATIO => {
            "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)".into()
        }
        names::GPU_UTILIZATION => "DCGM_FI_DEV_GPU_UTIL / 100".into(),
        names::GPU_TEMPERATURE_CELSIUS => "DCGM_FI_DEV_GPU_TEMP".into(),
        names::GPU_POWER_WATTS => "DCGM_FI_DEV_POWER_USAGE".into(),
        other => {
            let (hist, q) = latency_histogram(other).map_err(|_| {
                format!(
                    "signal {other:?} is not read from a runtime metric (vLLM or dcgm-exporter), so PromQL cannot see it"
                )
            })?;
            format!("histogram_quantile({q}, sum by (le, model_name) (rate({hist}_bucket[{w}])))")
        }
    })
}

/// Why a detector has no PromQL form (the `# skipped` comment).
pub fn skip_reason(detector: &str) -> String {
    let why = match detector {
        "output_length_outlier" => {
            "tests each response on a log scale against the model's previous responses, then the share of outliers against the model's own baseline rate: needs tokenwatch's per-request records"
        }
        "ks_drift" | "kl_drift" | "semantic_drift" | "drift_vote" => {
            "a two-sample test between request windows: needs tokenwatch's per-request records"
        }
        "batch_jitter" => {
            "pairs each request's inter-token latency with the batch size at its time"
        }
        "triple_signal_health" => {
            "joins GPU (DCGM) and runtime series of one instance, whose labels differ per deployment"
        }
        "ab_regression" | "prompt_version_decay" => {
            "needs the A/B group / prompt version of each request, which the runtimes do not export"
        }
        "topology_convergence" => "needs the GPUs' PCIe topology",
        "call_chain_convergence" => "needs trace spans",
        "cache_pollution" => "needs per-tenant prefix-cache key accesses",
        _ => "needs tokenwatch's own data",
    };
    format!("detector {detector:?} has no PromQL equivalent ({why})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml: &str) -> AlertingConfig {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn configured_rules_follow_the_builtins_and_replace_same_names() {
        let c = cfg(
            "rules:\n  - {name: kv_full, detector: threshold, signal: kv_cache_usage, params: {op: '>', value: 0.98}, for: 1m, severity: critical, summary: 'KV full on {{ labels.instance }} ({{ labels.model_id }}): {{ value }}'}\n  - {name: kv_cache_pressure, detector: kv_cache_pressure, params: {usage_threshold: 0.95}}\n  - {name: drift, detector: ks_drift}\n",
        );
        let specs = specs_for_config(&c).unwrap();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "ttft_p99_absolute",
                "ttft_p99_spike",
                "gpu_memory_leak",
                "slo_error_budget_burn",
                "error_burst",
                "kv_full",
                "kv_cache_pressure",
                "drift"
            ]
        );
        let kv = &specs[5];
        assert_eq!(kv.comparison.as_deref(), Some(">"));
        assert_eq!(kv.params["value"], 0.98);
        assert_eq!(kv.for_duration, Duration::from_secs(60));
        assert_eq!(
            kv.summary,
            "KV full on {{ $labels.instance }} ({{ $labels.model_name }}): {{ $value }}"
        );
        assert_eq!(specs[6].params["usage_threshold"], 0.95);
        let only = specs_for_config(&cfg(
            "default_rules: false\nrules:\n  - {name: a, detector: absolute_latency, signal: e2e}\n",
        ))
        .unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].signal, "e2e_p99_seconds");
        assert_eq!(only[0].params["threshold_seconds"], 2.0);
        assert!(specs_for_config(&cfg("overrides:\n  nope: {for: 1s}\n")).is_err());
    }

    #[test]
    fn signals_map_to_runtime_metrics_or_say_why_not() {
        let w = Duration::from_secs(60);
        assert_eq!(
            signal_expr("kv_cache_usage", w).unwrap(),
            "max by (model_name, instance) (vllm:kv_cache_usage_perc)"
        );
        assert!(
            signal_expr("preemptions_per_second", w)
                .unwrap()
                .contains("rate(vllm:num_preemptions_total[1m])")
        );
        assert_eq!(
            signal_expr("gpu_utilization", w).unwrap(),
            "DCGM_FI_DEV_GPU_UTIL / 100"
        );
        assert!(
            signal_expr("ttft_p95_seconds", w)
                .unwrap()
                .starts_with("histogram_quantile(0.95")
        );
        let err = signal_expr("embedding_drift", w).unwrap_err();
        assert!(err.contains("embedding_drift"), "{err}");
    }
}
