// Tests of the fleet timeline: sampling from the aggregator and the signal board, alignment,
// retention and dropping silent models.

use super::*;
use tokenwatch_core::aggregate::AggregatorConfig;
use tokenwatch_core::counts::ScrapeCounts;
use tokenwatch_core::histogram::CumulativeHistogram;
use tokenwatch_core::model::{RequestRecord, SeriesLabels};
use tokenwatch_core::signals::SignalPoint;

const NOW: i64 = 1_764_680_000_000;

fn rec(model: &str, finish_ms: i64, ttft: f64, prompt: u64, status: u16) -> RequestRecord {
    RequestRecord {
        labels: SeriesLabels {
            model_id: model.into(),
            runtime: "vllm".into(),
            instance: "i1".into(),
            ..Default::default()
        },
        arrival_unix_ms: finish_ms - 1000,
        first_token_s: Some(ttft),
        end_s: 1.0,
        chunk_offsets_us: vec![100_000, 120_000, 150_000],
        prompt_tokens: Some(prompt),
        output_tokens: Some(3),
        status,
        ..Default::default()
    }
}

fn signal(model: &str, name: &str, instance: &str, device: &str, v: f64, ts: i64) -> SignalPoint {
    SignalPoint {
        model_id: model.into(),
        signal: name.into(),
        value: v,
        source: "scrape:vllm".into(),
        runtime: "vllm".into(),
        instance: instance.into(),
        device_id: device.into(),
        timestamp_unix_ms: ts,
        notes: BTreeMap::new(),
    }
}

#[test]
fn samples_latency_rates_errors_and_signals_per_model() {
    let mut agg = Aggregator::new(AggregatorConfig::default());
    for i in 0..57 {
        agg.observe(&rec("a", NOW - i * 1000, 0.1, 100, 200));
    }
    for _ in 0..3 {
        agg.observe(&rec("a", NOW, 2.0, 3000, 500));
    }
    let mut board = SignalBoard::default();
    board.update(signal("a", names::KV_CACHE_USAGE, "i1", "", 0.3, NOW));
    board.update(signal("a", names::KV_CACHE_USAGE, "i2", "", 0.7, NOW));
    board.update(signal("a", names::REQUESTS_WAITING, "i1", "", 2.0, NOW));
    board.update(signal("a", names::REQUESTS_WAITING, "i2", "", 3.0, NOW));
    board.update(signal(
        "a",
        names::GPU_MEMORY_USED_BYTES,
        "i1",
        "GPU-0",
        1e9,
        NOW,
    ));
    board.update(signal(
        "a",
        names::GPU_MEMORY_USED_BYTES,
        "i1",
        "GPU-1",
        2e9,
        NOW,
    ));
    board.update(signal(
        "b",
        names::KV_CACHE_USAGE,
        "i9",
        "",
        0.9,
        NOW - 60_000,
    ));
    let fleet = sample_fleet(&agg, &board, Window::M1, NOW);
    let a = &fleet["a"];
    assert!((a.get(Column::TtftP50).unwrap() - 0.1).abs() < 0.002);
    assert!(
        (a.get(Column::TtftP99).unwrap() - 2.0).abs() < 0.03,
        "{:?}",
        a.get(Column::TtftP99)
    );
    assert!(a.get(Column::RequestsPerS).unwrap() > 0.9);
    let c = agg.counts(Some("a"), Window::M1, None, NOW)[0].counts;
    assert_eq!(c.errors, 3);
    assert!((a.get(Column::ErrorRatio).unwrap() - 3.0 / c.requests as f64).abs() < 1e-9);
    assert_eq!(a.get(Column::KvCacheUsage), Some(0.7), "fullest instance");
    assert_eq!(a.get(Column::RequestsWaiting), Some(5.0), "summed");
    assert_eq!(
        a.get(Column::GpuMemoryUsedBytes),
        Some(3e9),
        "summed over devices"
    );
    assert!(
        a.by_bucket
            .contains_key(&(ContextBucket::Le512, LatencyMetric::Ttft))
    );
    assert!(
        a.by_bucket
            .contains_key(&(ContextBucket::Le4096, LatencyMetric::Ttft))
    );
    assert_eq!(a.runtimes.iter().collect::<Vec<_>>(), ["vllm"]);
    assert_eq!(a.instances.iter().collect::<Vec<_>>(), ["i1", "i2"]);
    assert!(
        fleet
            .get("b")
            .is_none_or(|b| b.get(Column::KvCacheUsage).is_none()),
        "stale signal not sampled"
    );
}

#[test]
fn timeline_aligns_models_keeps_an_hour_and_drops_silent_models() {
    let mut tl = Timeline::default();
    let sample = |v: f64| ModelSample {
        values: {
            let mut a = [None; COLUMNS];
            a[Column::TtftP99 as usize] = Some(v);
            a
        },
        by_bucket: BTreeMap::from([((ContextBucket::Le512, LatencyMetric::Ttft), v)]),
        ..Default::default()
    };
    tl.record(NOW, &BTreeMap::from([("a".to_string(), sample(1.0))]));
    tl.record(
        NOW + STEP_MS,
        &BTreeMap::from([("b".to_string(), sample(2.0))]),
    );
    let a = tl.view("a", 0, &[Column::TtftP99]).unwrap();
    assert_eq!(a.t_ms, vec![NOW, NOW + STEP_MS]);
    assert_eq!(a.columns[0].1, vec![Some(1.0), None]);
    assert_eq!(a.buckets[0].1, vec![Some(1.0), None]);
    let b = tl.view("b", NOW + 1, &[Column::TtftP99]).unwrap();
    assert_eq!(b.columns[0].1, vec![Some(2.0)]);
    assert!(tl.view("zzz", 0, &[]).is_none());
    for i in 2..(KEEP_POINTS as i64 + 10) {
        tl.record(
            NOW + i * STEP_MS,
            &BTreeMap::from([("b".to_string(), sample(3.0))]),
        );
    }
    assert_eq!(
        tl.models().collect::<Vec<_>>(),
        ["b"],
        "a had no data for an hour"
    );
    assert_eq!(
        tl.view("b", 0, &[Column::TtftP99]).unwrap().t_ms.len(),
        KEEP_POINTS
    );
}

/// What one 5 s scrape of `model` on instance `i1` counted: `per_bucket` TTFT observations in
/// (0, 0.1], (0.1, 0.5], (0.5, +Inf), one request each, 20 output tokens each, `failed` failed.
fn scraped(model: &str, at: i64, per_bucket: [f64; 3], failed: f64) -> ScrapeCounts {
    let ttft = CumulativeHistogram::from_bucket_counts(&[0.1, 0.5, f64::INFINITY], &per_bucket);
    let requests = ttft.count;
    ScrapeCounts {
        model_id: model.into(),
        instance: "i1".into(),
        runtime: "vllm".into(),
        at_unix_ms: at,
        interval_ms: 5_000,
        finished: Some(requests),
        failed: Some(failed),
        prompt_tokens: Some(requests * 100.0),
        output_tokens: Some(requests * 20.0),
        latency: vec![("ttft".into(), ttft)],
    }
}

#[test]
fn a_model_no_record_holds_gets_its_figures_from_the_runtime() {
    let mut agg = Aggregator::new(AggregatorConfig::default());
    for i in 0..10 {
        agg.observe(&rec("proxied", NOW - i * 1000, 0.1, 100, 200));
    }
    let mut board = SignalBoard::default();
    for k in 0..4 {
        board.record_counts(scraped("scraped", NOW - k * 5_000, [8.0, 2.0, 0.0], 1.0));
        // The runtime of the proxied model too: its records win.
        board.record_counts(scraped("proxied", NOW - k * 5_000, [0.0, 0.0, 10.0], 0.0));
    }
    let fleet = sample_fleet(&agg, &board, Window::M1, NOW);
    let s = &fleet["scraped"];
    assert_eq!(s.figure_source, FigureSource::Runtime);
    let p50 = s.get(Column::TtftP50).unwrap();
    let (lower, upper) = s.bucket_bounds[&Column::TtftP50];
    assert_eq!((lower, upper), (0.0, 0.1));
    assert!(lower <= p50 && p50 <= upper, "{p50}");
    assert_eq!(s.bucket_bounds[&Column::TtftP99], (0.1, 0.5));
    // 10 requests per 5 s scrape: 2/s, 40 output tokens/s, 1 failed of 10.
    assert!((s.get(Column::RequestsPerS).unwrap() - 2.0).abs() < 1e-9);
    assert!((s.get(Column::OutputTokensPerS).unwrap() - 40.0).abs() < 1e-9);
    assert!((s.get(Column::ErrorRatio).unwrap() - 0.1).abs() < 1e-9);
    assert_eq!(s.get(Column::ItlP50), None, "no ITL histogram scraped");
    assert_eq!(s.instances.iter().collect::<Vec<_>>(), ["i1"]);
    let p = &fleet["proxied"];
    assert_eq!(p.figure_source, FigureSource::Proxy);
    assert!((p.get(Column::TtftP50).unwrap() - 0.1).abs() < 0.002);
    assert!(p.bucket_bounds.is_empty());
    assert_eq!(
        sample_fleet(&agg, &SignalBoard::default(), Window::M1, NOW)
            .get("scraped")
            .map(|s| s.figure_source),
        None
    );
}

#[test]
fn queue_prefill_and_decode_come_from_the_runtime_unless_records_carry_the_queue() {
    // Per scrape of each model: 6 queue waits in (0, 0.3] and 2 in (0.3, 0.5]; the same for
    // prefill; 5 decodes in (0.8, 1.0] and 3 in (1.5, 2.0] (vLLM's own bucket bounds).
    let bounds = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, f64::INFINITY];
    let short =
        CumulativeHistogram::from_bucket_counts(&bounds, &[6.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let decode =
        CumulativeHistogram::from_bucket_counts(&bounds, &[0.0, 0.0, 0.0, 5.0, 0.0, 3.0, 0.0]);
    let mut agg = Aggregator::new(AggregatorConfig::default());
    for i in 0..10 {
        agg.observe(&rec("proxied", NOW - i * 1000, 0.1, 100, 200));
        // This proxy's upstream sends `x-queue-time`: 20 ms each.
        let mut queued = rec("queued", NOW - i * 1000, 0.1, 100, 200);
        queued.queue_s = Some(0.02);
        agg.observe(&queued);
    }
    let mut board = SignalBoard::default();
    for model in ["scraped", "proxied", "queued"] {
        for k in 0..3 {
            let mut c = scraped(model, NOW - k * 5_000, [8.0, 0.0, 0.0], 0.0);
            c.latency.extend([
                ("queue".to_string(), short.clone()),
                ("prefill".to_string(), short.clone()),
                ("decode".to_string(), decode.clone()),
            ]);
            board.record_counts(c);
        }
    }
    let fleet = sample_fleet(&agg, &board, Window::M1, NOW);
    let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
    for model in ["scraped", "proxied", "queued"] {
        let s = &fleet[model];
        // Rank 4 of 8 in (0, 0.3] holding 6; rank 7.92 in (0.3, 0.5] holding 2.
        assert!(close(s.get(Column::PrefillP50), 0.2), "{model}: {s:?}");
        assert!(
            close(s.get(Column::PrefillP99), 0.3 + 0.2 * 1.92 / 2.0),
            "{model}"
        );
        assert_eq!(s.bucket_bounds[&Column::PrefillP50], (0.0, 0.3), "{model}");
        assert!(close(s.get(Column::DecodeP50), 0.96), "{model}: {s:?}");
        assert!(
            close(s.get(Column::DecodeP90), 1.5 + 0.5 * 2.2 / 3.0),
            "{model}"
        );
        assert_eq!(s.bucket_bounds[&Column::DecodeP99], (1.5, 2.0), "{model}");
    }
    // No record carries a queue time: the runtime's, with its bucket.
    for model in ["scraped", "proxied"] {
        let s = &fleet[model];
        assert!(close(s.get(Column::QueueP50), 0.2), "{model}: {s:?}");
        assert_eq!(s.bucket_bounds[&Column::QueueP90], (0.3, 0.5), "{model}");
    }
    assert_eq!(fleet["proxied"].figure_source, FigureSource::Proxy);
    assert!(
        !fleet["proxied"]
            .bucket_bounds
            .contains_key(&Column::TtftP50),
        "the proxy's TTFT stays the proxy's"
    );
    // The records carry one: theirs (a sketch, no bucket).
    let q = &fleet["queued"];
    assert!(
        (q.get(Column::QueueP50).unwrap() - 0.02).abs() < 0.0005,
        "{q:?}"
    );
    assert!(!q.bucket_bounds.contains_key(&Column::QueueP50));
    // Nothing scraped, nothing recorded: no phase columns.
    let none = sample_fleet(&agg, &SignalBoard::default(), Window::M1, NOW);
    assert_eq!(none["proxied"].get(Column::PrefillP50), None);
    assert_eq!(none["proxied"].get(Column::QueueP50), None);
    // The fleet API and the model page name them so.
    let names: Vec<&str> = Column::ALL.iter().map(|c| c.name()).collect();
    for n in ["queue_p50_s", "prefill_p90_s", "decode_p99_s"] {
        assert!(names.contains(&n), "{n}");
    }
    assert!(!FIGURE_COLUMNS.contains(&Column::PrefillP50));
}
