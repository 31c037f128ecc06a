// Tests of the template miner: warm-up and new error templates, the rate test on a preemption
// burst, hours of healthy vLLM logs that raise nothing, saved state, and root-cause ranking.

use super::*;
use rand::{Rng, SeedableRng};
use tokenwatch_detect as det;

const T0: i64 = 1_764_756_000_000;

fn cfg() -> LogsConfig {
    LogsConfig {
        warmup_lines: 20,
        ..LogsConfig::default()
    }
}

fn feed(m: &mut TemplateMiner, raw: &str, at: i64) {
    let (severity, text) = crate::logs::parse_line(raw);
    m.observe(
        &LogLine {
            text,
            severity,
            runtime: "vllm",
            instance: "gpu-1",
        },
        at,
    );
}

fn metrics_line(rng: &mut impl Rng, at: i64) -> String {
    let s = (at / 1000) % 60;
    format!(
        "INFO 12-03 10:{:02}:{s:02} [metrics.py:455] Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, Running: {} reqs, Swapped: 0 reqs, Pending: {} reqs, GPU KV cache usage: {:.1}%, CPU KV cache usage: 0.0%.",
        (at / 60_000) % 60,
        rng.random_range(0.0..4000.0),
        rng.random_range(0.0..900.0),
        rng.random_range(0..64),
        rng.random_range(0..5),
        rng.random_range(0.0..99.0)
    )
}

fn access_line(rng: &mut impl Rng) -> String {
    format!(
        "INFO:     10.0.{}.{}:{} - \"POST /v1/chat/completions HTTP/1.1\" 200 OK",
        rng.random_range(0..255),
        rng.random_range(0..255),
        rng.random_range(1024..65535)
    )
}

const OOM: &str = "ERROR 12-03 10:05:01 [engine.py:140] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.20 GiB is free.";

#[test]
fn new_error_templates_raise_only_after_warm_up_and_info_ones_never() {
    let mut m = TemplateMiner::new(&cfg(), T0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    feed(
        &mut m,
        "ERROR 12-03 10:00:00 [core.py:12] Failed to load the tokenizer config",
        T0,
    );
    for i in 0..20 {
        feed(
            &mut m,
            &metrics_line(&mut rng, T0 + i * 1000),
            T0 + i * 1000,
        );
    }
    assert!(
        m.evaluate(T0 + 20_000).is_empty(),
        "an error during warm-up is learnt, not raised"
    );
    let at = T0 + 21_000;
    feed(
        &mut m,
        "INFO 12-03 10:00:21 [engine.py:99] Started a brand new background loop",
        at,
    );
    assert!(
        m.evaluate(at).is_empty(),
        "new INFO templates raise nothing"
    );
    feed(&mut m, OOM, at);
    feed(&mut m, &OOM.replace("2.00 GiB", "4.00 GiB"), at + 10);
    let ev = m.evaluate(at + 100);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    let e = &ev[0];
    assert_eq!(e.detector, det::LOG_CUDA_OOM);
    assert_eq!(e.labels["runtime"], "vllm");
    assert_eq!(e.labels["instance"], "gpu-1");
    assert_eq!(e.evidence["kind"], "new_error_template");
    assert_eq!(e.evidence["class"], "cuda_oom");
    let template = e.evidence["template"].as_str().unwrap();
    assert!(
        template
            .contains("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate <NUM> GiB."),
        "{template}"
    );
    assert!(
        e.evidence["examples"][0]
            .as_str()
            .unwrap()
            .contains("2.00 GiB")
    );
    assert!(e.summary.contains("CUDA out of memory"), "{}", e.summary);
    // The same template again within the re-arm time: nothing more.
    for i in 0..30 {
        feed(&mut m, OOM, at + 200 + i);
    }
    assert!(m.evaluate(at + 1_000).is_empty());
    let rows = m.list(at + 1_000, &|v| v.class == TemplateClass::CudaOom);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].count, 32);
    assert_eq!(rows[0].severity, Severity::Error);
    assert_eq!(
        rows[0].last_anomaly.as_ref().unwrap().kind,
        "new_error_template"
    );
    assert!(
        rows[0]
            .fields
            .iter()
            .any(|f| f.kind == FieldKind::Num && f.examples.contains(&"4.00".to_string()))
    );
}

#[test]
fn a_preemption_burst_jumps_against_its_baseline() {
    let mut m = TemplateMiner::new(&cfg(), T0);
    let warn = |i: i64| {
        format!(
            "WARNING 12-03 10:00:00 [scheduler.py:1560] Sequence group cmpl-{i:08x} is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption={i}"
        )
    };
    // One preemption every two minutes for 40 minutes: the baseline.
    let mut at = T0;
    let mut n = 0;
    while at < T0 + 40 * 60_000 {
        feed(&mut m, &warn(n), at);
        n += 1;
        at += 120_000;
        assert!(
            m.evaluate(at).is_empty(),
            "steady preemptions at {}",
            (at - T0) / 60_000
        );
    }
    // Then 40 in 30 s.
    for i in 0..40 {
        feed(&mut m, &warn(n + i), at + i * 750);
    }
    let ev = m.evaluate(at + 30_000);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    let e = &ev[0];
    assert_eq!(e.detector, det::LOG_PREEMPTION);
    assert_eq!(e.evidence["kind"], "rate_jump");
    assert_eq!(e.evidence["count_recent"], 40);
    assert!(e.evidence["p_value"].as_f64().unwrap() < 1e-6);
    assert!(e.score > 3.0);
    let rows = m.list(at + 30_000, &|_| true);
    assert_eq!(
        rows.len(),
        1,
        "one template for every preemption line: {rows:#?}"
    );
    assert!(rows[0].rate_per_min > 7.0, "{}", rows[0].rate_per_min);
}

/// Six hours of a healthy vLLM server: metrics lines every 10 s with changing numbers, access
/// lines following traffic that swings 5x, steady preemption and tokenizer warnings, and an
/// occasional aborted request. Nothing is ever raised.
#[test]
fn hours_of_healthy_logs_raise_nothing() {
    let mut m = TemplateMiner::new(&LogsConfig::default(), T0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let hours = 6;
    let mut at = T0;
    let mut next_metrics = T0;
    let mut next_eval = T0;
    let mut lines = 0u64;
    for i in 0..40 {
        feed(
            &mut m,
            &format!(
                "INFO 12-03 09:59:{:02} [model_runner.py:1072] Loading model weights took {}.{} GB",
                i % 60,
                14 + i % 3,
                i
            ),
            at,
        );
    }
    while at < T0 + hours * 3_600_000 {
        // Traffic: 1 to 5 requests a second, changing every 20 minutes.
        let phase = ((at - T0) / 1_200_000) as f64;
        let per_s = 1.0 + 4.0 * (0.5 + 0.5 * (phase * 1.3).sin());
        at += (-(1.0 - rng.random::<f64>()).ln() / per_s * 1000.0) as i64 + 1;
        feed(&mut m, &access_line(&mut rng), at);
        lines += 1;
        if rng.random::<f64>() < 0.01 {
            feed(
                &mut m,
                &format!(
                    "INFO 12-03 10:00:00 [async_llm_engine.py:180] Aborted request chatcmpl-{:032x}.",
                    rng.random::<u128>()
                ),
                at,
            );
        }
        if rng.random::<f64>() < 0.004 {
            feed(
                &mut m,
                &format!(
                    "WARNING 12-03 10:00:00 [scheduler.py:1560] Sequence group cmpl-{:08x} is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space.",
                    rng.random::<u32>()
                ),
                at,
            );
        }
        if rng.random::<f64>() < 0.002 {
            feed(
                &mut m,
                "WARNING 12-03 10:00:00 [tokenizer.py:281] Token indices sequence length is longer than the specified maximum sequence length for this model",
                at,
            );
        }
        while next_metrics <= at {
            feed(&mut m, &metrics_line(&mut rng, next_metrics), next_metrics);
            next_metrics += 10_000;
        }
        if at >= next_eval {
            let ev = m.evaluate(at);
            assert!(ev.is_empty(), "after {} min: {ev:#?}", (at - T0) / 60_000);
            next_eval = at + 1_000;
        }
    }
    assert!(lines > 20_000, "{lines}");
    let rows = m.list(at, &|_| true);
    assert!(
        rows.len() <= 8,
        "templates stay few: {:#?}",
        rows.iter().map(|r| &r.template).collect::<Vec<_>>()
    );
    assert!(rows.iter().all(|r| r.last_anomaly.is_none()));
    let metrics = rows
        .iter()
        .find(|r| r.template.contains("Avg prompt throughput"))
        .unwrap();
    assert!(!metrics.template.contains("<*>"), "{}", metrics.template);
    assert!(
        (metrics.rate_per_min - 6.0).abs() < 1.5,
        "{}",
        metrics.rate_per_min
    );
}

#[test]
fn saved_state_restores_ids_counts_and_routing() {
    let mut m = TemplateMiner::new(&cfg(), T0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for i in 0..50 {
        feed(
            &mut m,
            &metrics_line(&mut rng, T0 + i * 10_000),
            T0 + i * 10_000,
        );
        feed(&mut m, &access_line(&mut rng), T0 + i * 10_000);
    }
    feed(&mut m, OOM, T0 + 600_000);
    let files = BTreeMap::from([(
        "/var/log/vllm.log".to_string(),
        FileOffset {
            inode: 7,
            offset: 1234,
        },
    )]);
    let saved = m.save(files.clone());
    let json = serde_json::to_string(&saved).unwrap();
    let back: SavedState = serde_json::from_str(&json).unwrap();
    assert_eq!(back.files, files);
    let mut r = TemplateMiner::restore(&cfg(), back, T0 + 700_000).unwrap();
    let before = m.list(T0 + 700_000, &|_| true);
    let after = r.list(T0 + 700_000, &|_| true);
    assert_eq!(before, after);
    // The same lines after the restart join the same templates, nothing new is made.
    let n = r.template_count();
    feed(&mut r, &metrics_line(&mut rng, T0 + 710_000), T0 + 710_000);
    feed(&mut r, &access_line(&mut rng), T0 + 710_000);
    feed(&mut r, OOM, T0 + 710_000);
    assert_eq!(r.template_count(), n);
    assert!(
        r.evaluate(T0 + 710_000).is_empty(),
        "a known template is not new after a restart"
    );
    let counts: Vec<u64> = r
        .list(T0 + 710_000, &|_| true)
        .iter()
        .map(|v| v.count)
        .collect();
    assert_eq!(counts, [51, 51, 2]);
    // Another version is refused, not misread.
    let mut other = m.save(BTreeMap::new());
    other.version = 99;
    assert!(TemplateMiner::restore(&cfg(), other, T0).is_err());
}

#[test]
fn a_cuda_oom_event_ranks_as_the_root_cause_of_an_error_burst() {
    let mut m = TemplateMiner::new(&cfg(), T0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for i in 0..30 {
        feed(
            &mut m,
            &metrics_line(&mut rng, T0 + i * 1000),
            T0 + i * 1000,
        );
    }
    feed(&mut m, OOM, T0 + 40_000);
    let oom = m.evaluate(T0 + 40_000).remove(0);
    let burst = AnomalyEvent {
        detector: "error_burst".into(),
        signal: "error_ratio".into(),
        labels: BTreeMap::from([
            ("model_id".to_string(), "m".to_string()),
            ("instance".to_string(), "sim".to_string()),
        ]),
        score: 3.0,
        at_unix_ms: T0 + 44_000,
        evidence: BTreeMap::new(),
        summary: "errors".into(),
    };
    let ranked = det::rank_causes(
        &det::CausalGraph::default(),
        &burst,
        &[oom],
        &det::RootCauseParams {
            match_labels: vec!["model_id".into()],
            ..det::RootCauseParams::default()
        },
    );
    assert_eq!(ranked.len(), 1, "{ranked:#?}");
    assert_eq!(ranked[0].detector, det::LOG_CUDA_OOM);
    assert_eq!(ranked[0].path, [det::LOG_CUDA_OOM, "error_burst"]);
    assert!(
        ranked[0].summary.contains("CUDA out of memory"),
        "{}",
        ranked[0].summary
    );
    // Preemption warnings explain latency, not errors.
    let mut pre = burst.clone();
    pre.detector = det::LOG_PREEMPTION.into();
    pre.at_unix_ms = T0;
    assert!(
        det::rank_causes(
            &det::CausalGraph::default(),
            &burst,
            &[pre.clone()],
            &det::RootCauseParams::default()
        )
        .is_empty()
    );
    let mut spike = burst.clone();
    spike.detector = "latency_spike".into();
    assert_eq!(
        det::rank_causes(
            &det::CausalGraph::default(),
            &spike,
            &[pre],
            &det::RootCauseParams::default()
        )
        .len(),
        1
    );
}
