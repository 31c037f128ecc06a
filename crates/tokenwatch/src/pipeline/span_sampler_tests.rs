// Tests of the tail span sampler (span_sampler.rs): critical paths kept with their ancestors,
// ordinary deep spans thinned, decisions repeatable, overflow counted.

use super::*;
use std::sync::Mutex;

const MS: i64 = 1_000_000;

fn span(trace: &str, id: &str, parent: &str, name: &str, start_ms: i64, dur_ms: i64) -> SpanRow {
    SpanRow {
        trace_id: trace.into(),
        span_id: id.into(),
        parent_span_id: parent.into(),
        name: name.into(),
        service_name: "svc".into(),
        start_unix_nano: start_ms * MS,
        end_unix_nano: (start_ms + dur_ms) * MS,
        attributes_json: "{}".into(),
        ..Default::default()
    }
}

/// A chain root → c1 → … → c<depth>, every span `dur_ms` long.
fn chain(trace: &str, depth: usize, dur_ms: i64) -> Vec<SpanRow> {
    let mut out = vec![span(trace, &format!("{trace}-0"), "", "root", 0, dur_ms)];
    for d in 1..=depth {
        out.push(span(
            trace,
            &format!("{trace}-{d}"),
            &format!("{trace}-{}", d - 1),
            &format!("step{d}"),
            0,
            dur_ms,
        ));
    }
    out
}

fn cfg() -> SamplingConfig {
    SamplingConfig {
        enabled: true,
        warmup_spans: 20,
        ..SamplingConfig::default()
    }
}

/// A sampler that has seen `n` ordinary chains of depth 6, each span 10–12 ms.
fn warm(n: usize) -> Sampler {
    let mut s = Sampler::new(&cfg());
    for t in 0..n {
        let mut spans = chain(&format!("warm{t}"), 6, 10);
        for (k, sp) in spans.iter_mut().enumerate() {
            sp.end_unix_nano += ((t + k) % 3) as i64 * MS;
        }
        s.decide(spans);
    }
    s
}

fn kept_ids(d: &Decisions) -> Vec<String> {
    let mut ids: Vec<String> = d.kept.iter().map(|s| s.span_id.clone()).collect();
    ids.sort();
    ids
}

fn weight(s: &SpanRow) -> f64 {
    let v: serde_json::Value = serde_json::from_str(&s.attributes_json).unwrap();
    v[WEIGHT_ATTRIBUTE].as_f64().unwrap()
}

#[test]
fn a_deep_error_span_is_kept_with_every_ancestor_up_to_the_root() {
    let mut s = warm(200);
    let mut spans = chain("err", 6, 10);
    spans[5].status_code = 2;
    let d = s.decide(spans);
    let ids = kept_ids(&d);
    for k in 0..=5 {
        assert!(
            ids.contains(&format!("err-{k}")),
            "err-{k} missing from {ids:?}"
        );
    }
    assert_eq!(
        d.critical, 6,
        "the error span, its 4 ancestors and the root"
    );
    assert!(
        d.kept
            .iter()
            .filter(|k| k.span_id != "err-6")
            .all(|k| weight(k) == 1.0)
    );
}

#[test]
fn a_span_slower_than_its_components_p95_is_kept_with_its_path() {
    let mut s = warm(200);
    let mut spans = chain("slow", 6, 10);
    spans[4].end_unix_nano = spans[4].start_unix_nano + 200 * MS;
    let d = s.decide(spans);
    let ids = kept_ids(&d);
    for k in 0..=4 {
        assert!(
            ids.contains(&format!("slow-{k}")),
            "slow-{k} missing from {ids:?}"
        );
    }
}

#[test]
fn a_fan_in_span_is_kept_and_ordinary_deep_spans_are_mostly_dropped() {
    let mut s = warm(200);
    // root → join → 40 ordinary leaves (depth 2), and a deep ordinary chain below leaf 0.
    let mut spans = vec![
        span("wide", "r", "", "root", 0, 100),
        span("wide", "j", "r", "step1", 0, 10),
    ];
    for k in 0..40 {
        spans.push(span("wide", &format!("l{k}"), "j", "step2", 0, 11));
    }
    let mut prev = "l0".to_string();
    for d in 3..=6 {
        let id = format!("deep{d}");
        spans.push(span("wide", &id, &prev, &format!("step{d}"), 0, 11));
        prev = id;
    }
    let total = spans.len() as u64;
    let d = s.decide(spans);
    let ids = kept_ids(&d);
    assert!(
        ids.contains(&"j".to_string()) && ids.contains(&"r".to_string()),
        "{ids:?}"
    );
    assert_eq!(d.critical + d.sampled + d.dropped, total);
    assert!(
        d.dropped * 10 >= total * 7,
        "most ordinary deep spans are dropped: kept {ids:?}"
    );
    for k in d.kept.iter().filter(|k| k.span_id.starts_with('l')) {
        assert!(
            weight(k) > 1.0,
            "a sampled span carries 1/p: {}",
            k.attributes_json
        );
    }
}

#[test]
fn deciding_the_same_trace_twice_keeps_the_same_spans() {
    let wide = |t: &str| {
        let mut spans = vec![span(t, "r", "", "root", 0, 100)];
        for k in 0..60 {
            spans.push(span(t, &format!("{t}-l{k}"), "r", "step3", 0, 11));
        }
        spans
    };
    let mut a = warm(200);
    let mut b = warm(200);
    let first = kept_ids(&a.decide(wide("same")));
    let again = kept_ids(&b.decide(wide("same")));
    assert_eq!(first, again);
    assert!(first.len() > 1 && first.len() < 61, "{first:?}");
}

#[test]
fn a_component_still_warming_up_keeps_everything() {
    let mut s = Sampler::new(&cfg());
    let d = s.decide(chain("cold", 6, 10));
    assert_eq!((d.dropped, d.kept.len()), (0, 7));
}

#[test]
fn the_weight_goes_into_the_attributes_whatever_they_hold() {
    assert_eq!(
        with_weight("{}", 1.0),
        r#"{"tokenwatch.sampling.weight":1}"#
    );
    assert_eq!(
        with_weight("", 2.5),
        r#"{"tokenwatch.sampling.weight":2.5}"#
    );
    let w = with_weight(r#"{"a":1}"#, 4.0);
    let v: serde_json::Value = serde_json::from_str(&w).unwrap();
    assert_eq!(
        (v["a"].as_i64(), v[WEIGHT_ATTRIBUTE].as_f64()),
        (Some(1), Some(4.0))
    );
    let already = r#"{"tokenwatch.sampling.weight":3}"#;
    assert_eq!(with_weight(already, 2.0), already);
}

#[test]
fn cyclic_parent_links_end() {
    let spans = vec![
        span("c", "a", "b", "x", 0, 1),
        span("c", "b", "a", "x", 0, 1),
    ];
    let d = Sampler::new(&cfg()).decide(spans);
    assert_eq!(d.critical + d.sampled + d.dropped, 2);
}

#[test]
fn config_rejects_unknown_keys_and_bad_values() {
    assert!(serde_json::from_str::<SamplingConfig>(r#"{"enabled": true, "rate": 0.1}"#).is_err());
    let c: SamplingConfig =
        serde_json::from_str(r#"{"enabled": true, "decision_delay": "2s", "base_rate": 0.2}"#)
            .unwrap();
    assert_eq!(c.decision_delay.0, Duration::from_secs(2));
    c.validate().unwrap();
    let bad = SamplingConfig {
        base_rate: 0.0,
        ..c.clone()
    };
    assert_eq!(bad.validate().unwrap_err().0, "traces.sampling.base_rate");
    let bad = SamplingConfig {
        max_buffered_spans: 0,
        ..c
    };
    assert_eq!(
        bad.validate().unwrap_err().0,
        "traces.sampling.max_buffered_spans"
    );
}

fn value(metrics: &Metrics, series: &str) -> f64 {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[test]
fn overflow_is_stored_and_counted_and_the_thread_decides_after_the_delay() {
    let metrics = Metrics::new();
    let got = Arc::new(Mutex::new(Vec::<SpanRow>::new()));
    let sink = got.clone();
    let cfg = SamplingConfig {
        enabled: true,
        decision_delay: HumanDuration(Duration::from_millis(200)),
        max_buffered_spans: 10,
        ..SamplingConfig::default()
    };
    let sampler = SpanSampler::start(
        &cfg,
        &metrics,
        Default::default(),
        Box::new(move |rows| {
            let n = rows.len();
            sink.lock().unwrap().extend(rows);
            n
        }),
    )
    .unwrap();
    assert_eq!(sampler.push(chain("a", 6, 10)), 7);
    // 7 buffered: 5 more do not fit and go straight through, counted.
    assert_eq!(sampler.push(chain("b", 4, 10)), 5);
    assert_eq!(
        got.lock().unwrap().len(),
        5,
        "the overflow is forwarded at once"
    );
    assert_eq!(
        value(
            &metrics,
            "tokenwatch_spans_sampled_total{decision=\"kept_overflow\"}"
        ),
        5.0
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.lock().unwrap().len() < 12 {
        assert!(Instant::now() < deadline, "trace a was never decided");
        std::thread::sleep(Duration::from_millis(10));
    }
    // A cold component: trace a is kept whole (its root critical, the rest warm-up).
    assert_eq!(
        value(
            &metrics,
            "tokenwatch_spans_sampled_total{decision=\"kept_critical\"}"
        ) + value(
            &metrics,
            "tokenwatch_spans_sampled_total{decision=\"kept_sampled\"}"
        ),
        7.0
    );
    assert_eq!(
        value(&metrics, "tokenwatch_span_sampler_buffered_spans"),
        0.0
    );
    // Dropping the last handle decides what is still buffered and ends the thread.
    sampler.push(chain("c", 2, 10));
    drop(sampler);
    while got.lock().unwrap().len() < 15 {
        assert!(
            Instant::now() < deadline,
            "trace c was not decided at shutdown"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
