// The user's configured rules (`alerting.rules`, overrides applied) as export specs, and the
// PromQL that reads each normalised signal from the runtimes' own metrics (vLLM, DCGM exporter).

use super::{ExportRule, latency_histogram, prom_duration};
use crate::alerting::detectors::REGISTRY;
use crate::alerting::rules::{AlertingConfig, RuleError, RuleSpec, compile, compile_rule};
use std::time::Duration;
use tokenwatch_core::signals::names;

/// What `tokenwatch rules export` writes for a configuration: the built-in export set (when
/// `alerting.default_rules` is on), then every configured rule (`alerting.rules`, with its
/// overrides). A configured rule named like a built-in export replaces it. Rules PromQL cannot
/// express stay in the list; the renderer turns them into `# skipped` comment lines.
pub fn rules_for_config(cfg: &AlertingConfig) -> Result<Vec<ExportRule>, RuleError> {
    let configured: Vec<ExportRule> = compile(cfg)?
        .into_iter()
        .filter(|r| cfg.rules.iter().any(|rc| rc.name == r.name))
        .map(|rule| ExportRule {
            rule,
            builtin: false,
        })
        .collect();
    let mut out: Vec<ExportRule> = if cfg.default_rules {
        builtin_rules()
            .into_iter()
            .filter(|d| !configured.iter().any(|c| c.rule.name == d.rule.name))
            .collect()
    } else {
        Vec::new()
    };
    out.extend(configured);
    Ok(out)
}

/// The built-in export set: each detector's `builtin_export` rule, compiled as any rule (its
/// parameters are the detector's), in their file order.
pub fn builtin_rules() -> Vec<ExportRule> {
    let mut builtins: Vec<_> = REGISTRY
        .iter()
        .filter_map(|r| (r.builtin_export)())
        .collect();
    builtins.sort_by_key(|b| b.position);
    builtins
        .iter()
        .filter_map(|b| {
            let path = format!("builtin_export({})", b.rule.name);
            // The built-in definitions compile (a unit test checks); a failure drops the rule.
            let rule = compile_rule(&path, &b.rule).ok()?;
            Some(ExportRule {
                rule,
                builtin: true,
            })
        })
        .collect()
}

/// A tokenwatch template as a Prometheus one: label placeholders become `$labels` (with the
/// runtimes' label names), `value` becomes `$value`, `rule`/`severity` are filled in, and
/// evidence (which only tokenwatch's detectors produce) is left out.
pub(crate) fn prom_template(tpl: &str, r: &RuleSpec) -> String {
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
        let specs = rules_for_config(&c).unwrap();
        let names: Vec<&str> = specs.iter().map(|s| s.rule.name.as_str()).collect();
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
        let y = super::super::export_prometheus_rules(&specs);
        let kv = &y[y.find("- alert: \"kv_full\"").unwrap()..];
        let kv = &kv[..kv[1..].find("- alert:").unwrap()];
        assert!(kv.contains("vllm:kv_cache_usage_perc) > 0.98\""), "{kv}");
        assert!(kv.contains("for: 1m"), "{kv}");
        assert!(
            kv.contains("summary: \"KV full on {{ $labels.instance }} ({{ $labels.model_name }}): {{ $value }}\""),
            "{kv}"
        );
        assert!(y.contains("(vllm:kv_cache_usage_perc) > 0.95 and"), "{y}");
        let only = rules_for_config(&cfg(
            "default_rules: false\nrules:\n  - {name: a, detector: absolute_latency, signal: e2e}\n",
        ))
        .unwrap();
        assert_eq!(only.len(), 1);
        let y = super::super::export_prometheus_rules(&only);
        assert!(
            y.contains("rate(vllm:e2e_request_latency_seconds_bucket[1m]))) > 2 and"),
            "{y}"
        );
        assert!(
            y.contains("e2e_p99_seconds of {{ $labels.model_name }}"),
            "{y}"
        );
        assert!(rules_for_config(&cfg("overrides:\n  nope: {for: 1s}\n")).is_err());
    }

    #[test]
    fn builtin_exports_compile_from_the_detectors_defaults() {
        let names: Vec<String> = builtin_rules()
            .into_iter()
            .map(|r| r.rule.name.clone())
            .collect();
        assert_eq!(
            names,
            [
                "ttft_p99_absolute",
                "ttft_p99_spike",
                "kv_cache_pressure",
                "gpu_memory_leak",
                "slo_error_budget_burn",
                "error_burst"
            ]
        );
        let builtins = REGISTRY
            .iter()
            .filter(|r| (r.builtin_export)().is_some())
            .count();
        assert_eq!(builtins, names.len(), "every built-in export compiles");
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
