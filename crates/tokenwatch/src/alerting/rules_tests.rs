// Tests of rule configuration: the default set, compilation with key-path errors, overrides,
// detector parameters and template rendering.

use super::*;
use crate::alerting::detectors::{CachePollution, DriftVote, LatencySpike, SemanticDrift};
use tokenwatch_detect as det;

fn cfg(yaml: &str) -> AlertingConfig {
    serde_saphyr::from_str(yaml).unwrap()
}

#[test]
fn default_rules_parse_and_compile() {
    assert!(!default_rule_configs().is_empty());
    let rules = compile(&AlertingConfig::default()).unwrap();
    let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    for n in [
        "gpu_memory_leak",
        "kv_cache_pressure",
        "absolute_latency",
        "latency_spike",
        "slo_burn",
        "output_length_outlier",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    let spike = rules.iter().find(|r| r.name == "latency_spike").unwrap();
    assert_eq!(
        (spike.for_ms, spike.grade.as_deref(), spike.severity),
        (120_000, Some("L2"), Severity::Critical)
    );
}

#[test]
fn errors_name_the_key_path() {
    let c = cfg(
        "default_rules: false\nrules:\n  - {name: a, detector: latency_spike}\n  - {name: b, detector: nope}\n",
    );
    let (path, msg) = compile(&c).unwrap_err();
    assert_eq!(path, "alerting.rules[1].detector");
    assert!(msg.contains("allowed"), "{msg}");
    let c = cfg(
        "default_rules: false\nrules:\n  - {name: a, detector: latency_spike, params: {ratioo: 3}}\n",
    );
    let (path, msg) = compile(&c).unwrap_err();
    assert!(path.starts_with("alerting.rules[0].params"), "{path}");
    assert!(msg.contains("ratioo"), "{msg}");
    let c = cfg(
        "default_rules: false\nrules:\n  - {name: a, detector: absolute_latency, summary: '{{ nope }}'}\n",
    );
    assert_eq!(compile(&c).unwrap_err().0, "alerting.rules[0].summary");
    let c = cfg("overrides:\n  nope: {for: 1s}\n");
    assert_eq!(compile(&c).unwrap_err().0, "alerting.overrides.nope");
}

#[test]
fn check_config_reports_rule_errors_with_the_file_and_path() {
    let y = "alerting:\n  rules:\n    - {name: a, detector: slo_burn}\n    - {name: b, detector: absolute_latency, params: {threshold_s: -1}}\n";
    let err = crate::config::Config::from_yaml(y, "tw.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tw.yaml") && err.contains("alerting.rules[1].params.threshold_s"),
        "{err}"
    );
    let err = crate::config::Config::from_yaml(
        "alerting:\n  rules:\n    - {name: a, detectr: x}\n",
        "tw.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("alerting.rules[0]") && err.contains("detectr"),
        "{err}"
    );
}

#[test]
fn overrides_merge_params_and_replace_fields() {
    let c = cfg(
        "overrides:\n  latency_spike: {for: 3s, window: 5s, params: {min_samples: 20}}\n  batch_jitter: {enabled: false}\n",
    );
    let rules = compile(&c).unwrap();
    let r = rules.iter().find(|r| r.name == "latency_spike").unwrap();
    assert_eq!((r.for_ms, r.window_ms), (3000, 5000));
    let p = &r.detector_as::<LatencySpike>().unwrap().params;
    assert_eq!((p.min_samples, p.ratio), (20, 2.5));
    assert!(!rules.iter().any(|r| r.name == "batch_jitter"));
}

#[test]
fn quality_and_cache_detectors_compile_with_the_spec_defaults() {
    let rules = compile(&AlertingConfig::default()).unwrap();
    let find = |n: &str| rules.iter().find(|r| r.name == n).unwrap();
    let p = &find("semantic_drift")
        .detector_as::<SemanticDrift>()
        .unwrap()
        .params;
    assert_eq!(p.min_cosine, 0.85);
    let v = &find("drift_vote")
        .detector_as::<DriftVote>()
        .unwrap()
        .params;
    assert_eq!(
        (v.vote.w_ks, v.vote.w_embedding, v.vote.w_feedback),
        (0.4, 0.35, 0.25)
    );
    assert_eq!((v.ks.alpha, v.embedding.min_cosine), (0.01, 0.85));
    let cache = find("cache_pollution");
    assert_eq!(cache.group_by, vec!["model_id", "tenant"]);
    let p = &cache.detector_as::<CachePollution>().unwrap().params;
    assert_eq!(
        (p.max_entropy, p.max_cold_ratio, p.cold_after_ms),
        (0.3, 0.4, 300_000)
    );
    let c = cfg(
        "overrides:\n  drift_vote: {params: {threshold: 0.6, ks_alpha: 0.05, min_samples: 10}}\n",
    );
    let rules = compile(&c).unwrap();
    let v = &rules
        .iter()
        .find(|r| r.name == "drift_vote")
        .unwrap()
        .detector_as::<DriftVote>()
        .unwrap()
        .params;
    assert_eq!(
        (
            v.vote.threshold,
            v.ks.alpha,
            v.ks.min_samples,
            v.embedding.min_samples
        ),
        (0.6, 0.05, 10, 10)
    );
}

#[test]
fn quality_and_cache_parameter_errors_name_the_key() {
    let err = |y: &str| compile(&cfg(y)).unwrap_err();
    let (path, msg) = err("overrides:\n  drift_vote: {params: {ks_alpha: 2}}\n");
    assert_eq!(
        path, "alerting.overrides.drift_vote.params.ks_alpha",
        "{msg}"
    );
    let (path, msg) = err("overrides:\n  drift_vote: {params: {w_kss: 1}}\n");
    assert!(
        path.starts_with("alerting.overrides.drift_vote.params") && msg.contains("w_kss"),
        "{path}: {msg}"
    );
    let (path, _) = err("overrides:\n  semantic_drift: {params: {min_cosine: 1.5}}\n");
    assert_eq!(path, "alerting.overrides.semantic_drift.params.min_cosine");
    let (path, msg) = err("overrides:\n  cache_pollution: {window: 1m}\n");
    assert_eq!(path, "alerting.overrides.cache_pollution.window", "{msg}");
    assert!(msg.contains("cold_after_ms"), "{msg}");
    let (path, _) = err(
        "default_rules: false\nrules:\n  - {name: s, detector: semantic_drift, signal: ttft}\n",
    );
    assert_eq!(path, "alerting.rules[0].signal");
}

#[test]
fn templates_fill_labels_value_and_evidence() {
    let rule = compile(&AlertingConfig::default()).unwrap().remove(0);
    let mut labels = BTreeMap::new();
    labels.insert("model_id".to_string(), "m1".to_string());
    let mut ev = det::Finding::new(2.0, "it leaks")
        .with("value", 3.25)
        .with("rate", 7)
        .into_event("d", "s", labels.clone(), 0);
    ev.evidence.insert("text".into(), serde_json::json!("x"));
    let s = render(
        "{{ labels.model_id }} {{value}} {{ evidence.rate }} {{ evidence.text }} {{ summary }} {{ evidence.none }}.",
        &rule,
        &labels,
        Some(&ev),
    );
    assert_eq!(s, "m1 3.250 7 x it leaks .");
    let s = render(
        "P99 of {{ labels.model_id }} {{ labels.instance }} above 2 s",
        &rule,
        &labels,
        None,
    );
    assert_eq!(
        s, "P99 of m1 above 2 s",
        "no double space for a missing label"
    );
}

#[test]
fn runbook_urls_come_from_the_rule_its_override_or_the_default_and_are_checked() {
    let rules = compile(&cfg(
        "runbook_url: 'https://wiki.example/tw/{{ rule }}'\noverrides:\n  gpu_memory_leak: {runbook_url: 'https://wiki.example/leaks?model={{ labels.model_id }}'}\nrules:\n  - {name: own, detector: threshold, signal: kv_cache_usage, params: {op: '>', value: 0.9}, runbook_url: 'http://runbooks.internal/own'}\n",
    ))
    .unwrap();
    let url = |name: &str| {
        rules
            .iter()
            .find(|r| r.spec.name == name)
            .and_then(|r| r.spec.runbook_url.clone())
    };
    assert_eq!(url("own").as_deref(), Some("http://runbooks.internal/own"));
    assert_eq!(
        url("gpu_memory_leak").as_deref(),
        Some("https://wiki.example/leaks?model={{ labels.model_id }}")
    );
    assert_eq!(
        url("latency_spike").as_deref(),
        Some("https://wiki.example/tw/{{ rule }}")
    );
    // Rendered with each value percent-encoded.
    let leak = rules
        .iter()
        .find(|r| r.spec.name == "gpu_memory_leak")
        .unwrap();
    let mut labels = BTreeMap::new();
    labels.insert("model_id".to_string(), "meta-llama/Llama 3".to_string());
    assert_eq!(
        render_url(
            leak.spec.runbook_url.as_deref().unwrap(),
            &leak.spec,
            &labels,
            None
        ),
        "https://wiki.example/leaks?model=meta-llama%2FLlama%203"
    );
    // None by default.
    let defaults = compile(&AlertingConfig::default()).unwrap();
    assert!(defaults.iter().all(|r| r.spec.runbook_url.is_none()));
    // Errors name the key.
    for (yaml, key) in [
        ("runbook_url: 'wiki/{{ rule }}'\n", "alerting.runbook_url"),
        (
            "overrides:\n  latency_spike: {runbook_url: 'https://x/{{ nope }}'}\n",
            "alerting.overrides.latency_spike.runbook_url",
        ),
    ] {
        let (path, msg) = compile(&cfg(yaml)).unwrap_err();
        assert_eq!(path, key, "{msg}");
    }
}
