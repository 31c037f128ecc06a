// `tokenwatch rules export --format prometheus`: the real binary writes a rules file that the
// real `promtool check rules` accepts; bad formats and bad configurations fail clearly.

use crate::common;

use std::process::Command;

fn tokenwatch(args: &[&str]) -> std::process::Output {
    Command::new(common::BIN)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running tokenwatch {args:?}: {e}"))
}

#[test]
fn exported_rules_pass_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let (text, report) = export("listen: 127.0.0.1:9464\n", dir.path());
    for name in [
        "ttft_p99_absolute",
        "ttft_p99_spike",
        "kv_cache_pressure",
        "gpu_memory_leak",
        "slo_error_budget_burn",
    ] {
        assert!(
            text.contains(&format!("alert: \"{name}\"")),
            "{name} missing from\n{text}"
        );
    }
    // Each latency and error rule per model and per (model, instance).
    assert!(report.contains("SUCCESS: 10 rules found"), "{report}");
    for name in [
        "ttft_p99_absolute_instance",
        "ttft_p99_spike_instance",
        "error_burst",
        "error_burst_instance",
    ] {
        assert!(
            text.contains(&format!("alert: \"{name}\"")),
            "{name} missing"
        );
    }

    // The exported error burst fires for the failing instance alone (promtool's rule unit test).
    let test = dir.path().join("burst_test.yml");
    std::fs::write(&test, BURST_TEST).unwrap();
    let run = Command::new(common::promtool())
        .args(["test", "rules"])
        .arg(&test)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "promtool test rules failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );

    // Without -o the same rules go to standard output.
    let stdout = tokenwatch(&["rules", "export", "--format", "prometheus"]);
    assert!(stdout.status.success());
    assert_eq!(String::from_utf8_lossy(&stdout.stdout), text);
}

/// promtool rule unit test of the exported error burst: instance a fails 25 % of its requests
/// (20 of 80 a minute), b none; the model as a whole is at 12.5 %, under the 20 % threshold.
const BURST_TEST: &str = r#"rule_files: [rules.yml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'vllm:request_success_total{model_name="m", instance="a", finished_reason="stop"}'
        values: '0+15x12'
      - series: 'vllm:request_success_total{model_name="m", instance="a", finished_reason="error"}'
        values: '0+5x12'
      - series: 'vllm:request_success_total{model_name="m", instance="b", finished_reason="stop"}'
        values: '0+20x12'
    alert_rule_test:
      - eval_time: 2m
        alertname: error_burst_instance
        exp_alerts:
          - exp_labels: {model_name: m, instance: a, severity: critical}
            exp_annotations:
              summary: "Error burst: a large share of requests failing right now"
              description: "25% of the requests of m on a failed over the last 1m (40x the 0.5% error budget or more)."
      - eval_time: 2m
        alertname: error_burst
        exp_alerts: []
"#;

/// A configuration with threshold rules over runtime metrics, a tuned latency spike, a leak and
/// rules PromQL cannot express.
const CONFIGURED: &str = r#"
alerting:
  rules:
    - name: kv_full
      detector: threshold
      signal: kv_cache_usage
      params: {op: ">=", value: 0.98}
      for: 30s
      severity: critical
      summary: "KV cache of {{ labels.model_id }} on {{ labels.instance }} full"
    - name: gpu_hot
      detector: threshold
      signal: gpu_temperature_celsius
      params: {op: ">", value: 85}
    - name: queue_p95
      detector: threshold
      signal: queue_p95_seconds
      params: {op: ">", value: 0.5}
    - name: fast_spike
      detector: latency_spike
      signal: e2e
      window: 30s
      for: 1m
      params: {ratio: 3, min_samples: 100}
      grade: L2
      severity: critical
    - name: ctx
      detector: context_aware_threshold
    - name: leak
      detector: gpu_memory_leak
      window: 1m
    - name: lengths
      detector: output_length_outlier
    - name: embedding_norm
      detector: threshold
      signal: embedding_norm
      params: {op: "<", value: 0.5}
"#;

/// promtool rule unit test of the exported `kv_full`: one instance over the threshold fires with
/// the runtime's labels and the translated summary, the other stays quiet.
const KV_FULL_TEST: &str = r#"rule_files: [rules.yml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'vllm:kv_cache_usage_perc{model_name="m", instance="10.0.0.7:8000"}'
        values: '0.5 0.5 0.99 0.99 0.99 0.99 0.99'
      - series: 'vllm:kv_cache_usage_perc{model_name="m", instance="10.0.0.8:8000"}'
        values: '0.5 0.5 0.5 0.5 0.5 0.5 0.5'
    alert_rule_test:
      - eval_time: 30s
        alertname: kv_full
        exp_alerts: []
      - eval_time: 90s
        alertname: kv_full
        exp_alerts:
          - exp_labels: {model_name: m, instance: "10.0.0.7:8000", severity: critical}
            exp_annotations:
              summary: "KV cache of m on 10.0.0.7:8000 full"
              description: "kv_cache_usage is 990m (>= 0.98; rates over 1m)."
"#;

fn export(config: &str, dir: &std::path::Path) -> (String, String) {
    let cfg = dir.join("tokenwatch.yaml");
    std::fs::write(&cfg, config).unwrap();
    let file = dir.join("rules.yml");
    let out = tokenwatch(&[
        "rules",
        "export",
        "--format",
        "prometheus",
        "-c",
        cfg.to_str().unwrap(),
        "-o",
        file.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "export failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let check = Command::new(common::promtool())
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        check.status.success(),
        "promtool check rules failed:\n{report}\n--- file ---\n{text}"
    );
    (text, report)
}

#[test]
fn configured_threshold_rules_are_exported_and_others_skipped_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (text, report) = export(CONFIGURED, dir.path());
    // 10 built-in rules, then kv_full, gpu_hot, queue_p95, fast_spike (model and instance), ctx
    // and the leak's three.
    assert!(
        report.contains("SUCCESS: 19 rules found"),
        "{report}\n{text}"
    );
    for (name, expr) in [
        (
            "kv_full",
            "max by (model_name, instance) (vllm:kv_cache_usage_perc) >= 0.98",
        ),
        ("gpu_hot", "DCGM_FI_DEV_GPU_TEMP > 85"),
        (
            "queue_p95",
            "histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:request_queue_time_seconds_bucket[1m]))) > 0.5",
        ),
        ("leak_steps", "delta(DCGM_FI_DEV_FB_USED[1m]) >= 640"),
    ] {
        let at = text
            .find(&format!("- alert: \"{name}\""))
            .unwrap_or_else(|| panic!("{name} missing from\n{text}"));
        let rule = &text[at..];
        let rule = &rule[..rule[1..]
            .find("- alert:")
            .map(|i| i + 1)
            .unwrap_or(rule.len())];
        assert!(rule.contains(expr), "{name}: {expr} not in\n{rule}");
    }
    assert!(
        text.contains("offset 30s"),
        "fast_spike compares 30 s windows:\n{text}"
    );
    assert!(
        text.contains(">= 100"),
        "fast_spike's request floor:\n{text}"
    );
    assert!(
        text.contains(
            "summary: \"KV cache of {{ $labels.model_name }} on {{ $labels.instance }} full\""
        ),
        "{text}"
    );
    assert!(
        text.contains("# skipped lengths (output_length_outlier): detector \"output_length_outlier\" has no PromQL equivalent"),
        "{text}"
    );
    assert!(
        text.contains("# skipped embedding_norm (threshold): signal \"embedding_norm\" is not read from a runtime metric"),
        "{text}"
    );

    // The exported threshold rule fires on the runtime's own series (promtool's rule unit test).
    let test = dir.path().join("kv_full_test.yml");
    std::fs::write(&test, KV_FULL_TEST).unwrap();
    let run = Command::new(common::promtool())
        .args(["test", "rules"])
        .arg(&test)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "promtool test rules failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );

    // Without the built-in set only the configured rules are written.
    let (only, report) = export(
        "alerting:\n  default_rules: false\n  rules:\n    - {name: kv_full, detector: threshold, signal: kv_cache_usage, params: {op: '>', value: 0.9}}\n",
        dir.path(),
    );
    assert!(
        report.contains("SUCCESS: 1 rules found"),
        "{report}\n{only}"
    );
}

#[test]
fn unknown_format_and_bad_config_are_refused() {
    let out = tokenwatch(&["rules", "export", "--format", "thanos"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("thanos") && err.contains("prometheus"),
        "error should list the formats: {err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(&cfg, "no_such_key: 1\n").unwrap();
    let out = tokenwatch(&[
        "rules",
        "export",
        "--format",
        "prometheus",
        "-c",
        cfg.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml"),
        "error should name the file: {err}"
    );
}
