// Tests of root-cause ranking: the leak → KV pressure → latency chain, exclusion of later and
// unrelated events, label agreement, and configuration of the graph.

use super::*;

const T: i64 = 1_700_000_000_000;

fn ev(detector: &str, signal: &str, at: i64, labels: &[(&str, &str)]) -> AnomalyEvent {
    AnomalyEvent {
        detector: detector.to_string(),
        signal: signal.to_string(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        score: 2.0,
        at_unix_ms: at,
        evidence: BTreeMap::new(),
        summary: format!("{detector} fired"),
    }
}

#[test]
fn leak_three_minutes_before_spike_ranks_first() {
    let g = CausalGraph::default();
    let p = RootCauseParams::default();
    let spike = ev(
        "latency_spike",
        "ttft_p99_seconds",
        T,
        &[("instance", "a"), ("model_id", "m")],
    );
    let candidates = vec![
        ev(
            "cache_pollution",
            "prefix_cache",
            T - 25 * 60_000,
            &[("instance", "a")],
        ), // too early
        ev(
            "gpu_memory_leak",
            "gpu_memory_used_bytes",
            T - 180_000,
            &[("instance", "a"), ("device_id", "GPU-1")],
        ),
        ev(
            "gpu_memory_leak",
            "gpu_memory_used_bytes",
            T + 5_000,
            &[("instance", "a"), ("device_id", "GPU-2")],
        ), // after
        ev(
            "gpu_memory_leak",
            "gpu_memory_used_bytes",
            T - 180_000,
            &[("instance", "b")],
        ), // other instance
        ev(
            "batch_jitter",
            "itl_seconds",
            T - 60_000,
            &[("instance", "a")],
        ), // not in the graph
    ];
    let ranked = rank_causes(&g, &spike, &candidates, &p);
    assert_eq!(ranked.len(), 1, "{ranked:#?}");
    let top = &ranked[0];
    assert_eq!(top.detector, "gpu_memory_leak");
    assert_eq!(
        top.path,
        ["gpu_memory_leak", "kv_cache_pressure", "latency_spike"]
    );
    assert_eq!(top.labels["device_id"], "GPU-1");
    assert_eq!(top.observed_delay_ms, 180_000);
    assert_eq!(top.expected_delay_ms, 330_000);
    assert!((top.confidence - 0.85 * 0.8).abs() < 1e-12);
    assert!((top.rank - top.confidence * top.alignment).abs() < 1e-12);
    assert!(
        top.alignment > 0.8 && top.alignment <= 1.0,
        "{}",
        top.alignment
    );
    assert!(
        top.summary.contains("via kv_cache_pressure"),
        "{}",
        top.summary
    );
}

#[test]
fn ranking_order_and_alignment() {
    let g = CausalGraph::default();
    let p = RootCauseParams::default();
    let spike = ev("latency_spike", "ttft_p99_seconds", T, &[]);
    let candidates = vec![
        ev("gpu_memory_leak", "mem", T - 180_000, &[]),
        ev("cache_pollution", "prefix", T - 20_000, &[]),
        ev("kv_cache_pressure", "kv", T - 5 * 60_000, &[]),
    ];
    let ranked = rank_causes(&g, &spike, &candidates, &p);
    assert_eq!(ranked.len(), 3);
    assert_eq!(ranked[0].detector, "cache_pollution", "{ranked:#?}");
    assert!(ranked.windows(2).all(|w| w[0].rank >= w[1].rank));
    assert_eq!(alignment(30_000, 30_000, 60_000), 1.0);
    assert!((alignment(90_000, 30_000, 60_000) - 0.5).abs() < 1e-12);
    assert!(alignment(0, 300_000, 60_000) > alignment(-1_000_000, 300_000, 60_000));
    assert!(rank_causes(&g, &spike, &[], &p).is_empty());
}

#[test]
fn duplicates_keep_the_best_and_graph_is_configurable() {
    let p = RootCauseParams::default();
    let spike = ev("latency_spike", "ttft", T, &[]);
    let c = vec![
        ev("kv_cache_pressure", "kv", T - 30_000, &[]),
        ev("kv_cache_pressure", "kv", T - 400_000, &[]),
    ];
    let ranked = rank_causes(&CausalGraph::default(), &spike, &c, &p);
    assert_eq!(ranked.len(), 1);
    assert_eq!(ranked[0].observed_delay_ms, 30_000);

    let mut g: CausalGraph = serde_json::from_str(r#"{"edges": [{"cause": "signal:node_cpu", "effect": "latency_spike", "confidence": 0.5, "delay_ms": 1000}]}"#).unwrap();
    g.extend(CausalGraph::default().edges);
    let ranked = rank_causes(
        &g,
        &spike,
        &[ev("threshold", "node_cpu", T - 2_000, &[])],
        &p,
    );
    assert_eq!(ranked[0].path, ["signal:node_cpu", "latency_spike"]);
    assert!(CausalGraph::default().validate().is_ok());
    let bad = CausalGraph {
        edges: vec![edge("a", "a", 0.5, 0)],
    };
    assert!(bad.validate().is_err());
}

/// A GPU leak and KV pressure of model `m`, `leak_ago` and `kv_ago` ms before `T`.
fn leak_and_pressure(leak_ago: i64, kv_ago: i64) -> Vec<AnomalyEvent> {
    let m = &[("model_id", "m")];
    vec![
        ev("gpu_memory_leak", "gpu_memory_used_bytes", T - leak_ago, m),
        ev("kv_cache_pressure", "kv_cache_usage", T - kv_ago, m),
    ]
}

#[test]
fn the_first_cause_of_an_observed_chain_ranks_first() {
    // A leak, then the KV pressure it causes, then a latency spike: the KV pressure is the
    // closer cause with the stronger single edge, but it is a link of the leak's chain.
    let g = CausalGraph::default();
    let p = RootCauseParams::default();
    let spike = ev("latency_spike", "ttft_p99_seconds", T, &[("model_id", "m")]);
    let ranked = rank_causes(&g, &spike, &leak_and_pressure(50_000, 30_000), &p);
    assert_eq!(ranked.len(), 2, "{ranked:#?}");
    assert!(
        ranked[1].rank > ranked[0].rank,
        "the link ranks higher on its own: {ranked:#?}"
    );
    assert_eq!(ranked[0].detector, "gpu_memory_leak", "{ranked:#?}");
    assert!(
        ranked[0]
            .summary
            .contains("kv_cache_pressure seen in between"),
        "{}",
        ranked[0].summary
    );
    assert_eq!(ranked[1].detector, "kv_cache_pressure");

    // KV pressure that began before the leak was seen is not the leak's doing: it stays first.
    let ranked = rank_causes(&g, &spike, &leak_and_pressure(20_000, 30_000), &p);
    assert_eq!(ranked[0].detector, "kv_cache_pressure", "{ranked:#?}");
}

#[test]
fn a_gpu_placed_on_a_replica_causes_only_that_replicas_symptoms() {
    // The engine's agreement: the model must agree; a GPU's `serving_instance` must be the
    // symptom's `instance` (its own `instance` is the GPU host, which never equals a target).
    let g = CausalGraph::default();
    let p = RootCauseParams {
        match_labels: vec!["model_id".into()],
        paired_labels: vec![("serving_instance".into(), "instance".into())],
        ..RootCauseParams::default()
    };
    let leak = ev(
        "gpu_memory_leak",
        "gpu_memory_used_bytes",
        T - 60_000,
        &[
            ("instance", "gpu-host-a"),
            ("device_id", "GPU-1"),
            ("model_id", "m"),
            ("serving_instance", "10.0.0.1:8000"),
        ],
    );
    let on = |instance: &str| {
        ev(
            "kv_cache_pressure",
            "kv_cache_usage_ratio",
            T,
            &[("instance", instance), ("model_id", "m")],
        )
    };
    let ranked = rank_causes(&g, &on("10.0.0.1:8000"), std::slice::from_ref(&leak), &p);
    assert_eq!(ranked.len(), 1, "{ranked:?}");
    assert_eq!(ranked[0].detector, "gpu_memory_leak");
    assert!(
        rank_causes(&g, &on("10.0.0.2:8000"), std::slice::from_ref(&leak), &p).is_empty(),
        "the peer replica's pressure is not the leak's doing"
    );
    // Either way round: a symptom event cannot cause the GPU's, but the pair is still checked.
    let pressure_b = on("10.0.0.2:8000");
    assert!(!labels_agree(&pressure_b, &leak, &p));
    assert!(labels_agree(&on("10.0.0.1:8000"), &leak, &p));
    // A GPU not placed (no serving_instance) keeps the old rule: the model alone.
    let mut unplaced = leak.clone();
    unplaced.labels.remove("serving_instance");
    assert_eq!(
        rank_causes(&g, &on("10.0.0.2:8000"), &[unplaced], &p).len(),
        1
    );
}
