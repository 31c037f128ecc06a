// Tests of the output length outlier detector: per-request annotations on a robust log scale, and
// hours of simulated heavy-tailed, swinging, drifting healthy traffic against length blow-ups
// (uncapped, and capped at each request's own max_tokens: found by the truncated share).

use super::*;
use crate::Validate;

#[path = "length_attribution_tests.rs"]
mod attribution;
#[path = "length_truncation_tests.rs"]
mod truncation;

use crate::test_rng::Rng;

/// How healthy output lengths are drawn.
#[derive(Clone, Copy)]
enum Shape {
    /// Log-normal (σ 0.8) with a 10 % Pareto tail (α 1.3) above the median, capped at 8192.
    ParetoTail,
    /// The simulator's: log-normal σ 0.6, median 120, capped at max_tokens 256 (~10 % at the cap).
    CappedLogNormal,
    /// The simulator with clients that send max_tokens (as the alert-quality bench's do): each
    /// request's limit log-normal (median 160, σ 0.8, in [8, 2048]), the answer's median half of
    /// it (at most 120), σ 0.6, capped at the limit — ~10 % truncated — and a blow-up still
    /// capped at each request's own limit.
    MaxTokens,
}

struct Fault {
    from_ms: i64,
    to_ms: i64,
    factor: f64,
    /// None: every instance; Some(i): only instance i.
    instance: Option<usize>,
}

struct Run {
    /// Findings of the scopes' own share tests per evaluation second: (t, scope, finding).
    findings: Vec<(i64, String, Finding)>,
    /// Instances the outliers were attributed to: (t, instance, finding).
    attributed: Vec<(i64, String, Finding)>,
    /// The instances each evaluation with a finding named (empty: model-wide).
    named: Vec<(i64, Vec<String>)>,
    annotations: u64,
    responses: u64,
    truncated: u64,
}

/// `hours` of traffic at 14 req/s swinging ±40 % (two periods), four instances whose medians
/// drift independently by up to ±25 %, the model's median drifting ×1.6 over four hours;
/// evaluated every second like the engine does (it evaluates more often).
fn simulate(shape: Shape, hours: f64, seed: u64, fault: Option<Fault>) -> Run {
    simulate_with(LengthOutlierParams::default(), shape, hours, seed, fault)
}

fn simulate_with(
    p: LengthOutlierParams,
    shape: Shape,
    hours: f64,
    seed: u64,
    fault: Option<Fault>,
) -> Run {
    let mut rng = Rng(seed);
    let mut d = LengthOutlier::new(p, 120_000);
    let end = (hours * 3_600_000.0) as i64;
    let (mut t, mut next_eval) = (0.0f64, 1_000i64);
    let mut run = Run {
        findings: Vec::new(),
        attributed: Vec::new(),
        named: Vec::new(),
        annotations: 0,
        responses: 0,
        truncated: 0,
    };
    let phases = [0.3, 1.9, 3.4, 5.0];
    loop {
        let ts = t / 1000.0;
        let rate = 14.0
            * (1.0
                + 0.3 * (ts / 600.0 * std::f64::consts::TAU).sin()
                + 0.1 * (ts / 97.0 * std::f64::consts::TAU).sin());
        t += -rng.unit().ln() / rate * 1000.0;
        let at = t as i64;
        while next_eval <= at.min(end) {
            let v = d.evaluate(next_eval);
            if !v.is_empty() {
                let named = v.named().into_iter().map(str::to_string).collect();
                run.named.push((next_eval, named));
            }
            let model = v.model.map(|f| (String::new(), f));
            for (scope, f) in model.into_iter().chain(v.instances) {
                run.findings.push((next_eval, scope, f));
            }
            for (scope, f) in v.attributed {
                run.attributed.push((next_eval, scope, f));
            }
            next_eval += 1_000;
        }
        if at >= end {
            return run;
        }
        let inst = (rng.next() % 4) as usize;
        let drift = (ts / 14_400.0 * 1.6f64.ln()).exp()
            * (0.25 * (ts / 5_400.0 * std::f64::consts::TAU + phases[inst]).sin()).exp();
        let max_tokens = match shape {
            Shape::MaxTokens => (160.0 * (0.8 * rng.normal()).exp())
                .clamp(8.0, 2048.0)
                .round(),
            _ => f64::INFINITY,
        };
        let mut len = match shape {
            Shape::ParetoTail => {
                let base = 180.0 * drift * (0.8 * rng.normal()).exp();
                let tail = if rng.unit() < 0.1 {
                    rng.unit().powf(-1.0 / 1.3)
                } else {
                    1.0
                };
                (base * tail).min(8192.0)
            }
            Shape::CappedLogNormal => 120.0 * drift * (0.6 * rng.normal()).exp(),
            Shape::MaxTokens => {
                (max_tokens / 2.0).clamp(1.0, 120.0) * drift * (0.6 * rng.normal()).exp()
            }
        };
        let faulty = fault
            .as_ref()
            .filter(|f| at >= f.from_ms && at < f.to_ms && f.instance.is_none_or(|i| i == inst));
        if let Some(f) = faulty {
            len *= f.factor;
        }
        // The cap a response can hit: a blow-up lifts the simulator's default one, never the
        // request's own.
        let cap = match shape {
            Shape::ParetoTail => 8192.0,
            Shape::CappedLogNormal if faulty.is_none() => 256.0,
            Shape::CappedLogNormal => f64::INFINITY,
            Shape::MaxTokens => max_tokens,
        };
        let len = len.ceil().max(1.0);
        let truncated = len >= cap;
        run.responses += 1;
        run.truncated += u64::from(truncated);
        if d.observe(at, &format!("i{inst}"), len.min(cap), truncated)
            .is_some()
        {
            run.annotations += 1;
        }
    }
}

#[test]
fn hours_of_healthy_heavy_tailed_traffic_raise_no_model_level_finding() {
    for (shape, seed) in [
        (Shape::ParetoTail, 7),
        (Shape::CappedLogNormal, 11),
        (Shape::MaxTokens, 17),
        (Shape::ParetoTail, 23),
        (Shape::CappedLogNormal, 3),
        (Shape::MaxTokens, 29),
    ] {
        let run = simulate(shape, 4.0, seed, None);
        assert!(run.responses > 190_000, "{}", run.responses);
        let rate = run.annotations as f64 / run.responses as f64;
        // Annotations still mark the tail: per request, not per page.
        assert!(rate < 0.05, "annotation rate {rate}");
        if matches!(shape, Shape::MaxTokens) {
            // Truncation is normal: ~10–15 % of the answers stop at their limit (more as the
            // model's lengths drift up), and it pages nobody.
            let truncated = run.truncated as f64 / run.responses as f64;
            assert!((0.08..0.25).contains(&truncated), "truncated {truncated}");
        }
        assert!(
            run.findings.is_empty(),
            "seed {seed}: {} findings, first {:?}",
            run.findings.len(),
            run.findings.first().map(|(t, s, f)| (t, s, &f.summary))
        );
        assert!(
            run.attributed.is_empty(),
            "seed {seed}: {} attributions, first {:?}",
            run.attributed.len(),
            run.attributed.first().map(|(t, s, f)| (t, s, &f.summary))
        );
    }
}

/// Seconds from the fault's start to the first finding of `scope` (None: never).
fn detected_after(run: &Run, from_ms: i64, scope: &str) -> Option<f64> {
    run.findings
        .iter()
        .find(|(t, s, _)| *t >= from_ms && s == scope)
        .map(|(t, _, _)| (t - from_ms) as f64 / 1000.0)
}

#[test]
fn blow_up_on_all_traffic_is_found_fast_and_not_absorbed() {
    // Capped at each request's own max_tokens, a blow-up shows as answers cut off at their limit.
    for (shape, direction) in [
        (Shape::ParetoTail, "longer"),
        (Shape::CappedLogNormal, "longer"),
        (Shape::MaxTokens, "truncated"),
    ] {
        let (from, to) = (2_400_000, 3_000_000);
        let run = simulate(
            shape,
            1.0,
            5,
            Some(Fault {
                from_ms: from,
                to_ms: to,
                factor: 4.0,
                instance: None,
            }),
        );
        let after = detected_after(&run, from, "").expect("the blow-up was found");
        assert!(after <= 15.0, "found after {after} s");
        assert!(
            run.findings.iter().all(|(t, _, _)| *t >= from),
            "finding before the fault"
        );
        // Sustained while it lasts: the reference and the baseline do not learn the blow-up.
        let during: Vec<i64> = run
            .findings
            .iter()
            .filter(|(_, s, _)| s.is_empty())
            .map(|(t, _, _)| *t)
            .collect();
        let held = (from + 20_000..to)
            .step_by(1_000)
            .filter(|t| during.contains(t))
            .count();
        assert!(
            held as i64 >= (to - from - 20_000) / 1_000 - 2,
            "held {held} s of {} s",
            (to - from) / 1_000
        );
        // And it ends once the fault does (the window drains).
        let last = during.last().copied().unwrap();
        assert!(
            last <= to + 125_000,
            "still firing {} s after the fault",
            (last - to) / 1000
        );
        let f = &run
            .findings
            .iter()
            .find(|(_, s, _)| s.is_empty())
            .unwrap()
            .2;
        assert_eq!(f.evidence["direction"], direction, "{}", f.summary);
        assert!(f.evidence["p_value"].as_f64().unwrap() < 1e-4);
    }
}

#[test]
fn blow_up_on_one_instance_of_four_is_found_and_named() {
    // ×4 moves a Pareto-tailed model's responses by only ~1.7σ (few become outliers): slower.
    // Capped at each request's max_tokens (the bench's clients), only the instance's truncated
    // share changes (~10 % → ~80 %): found by it, within the ~15 s the short window needs.
    for (shape, within) in [
        (Shape::ParetoTail, 60.0),
        (Shape::CappedLogNormal, 30.0),
        (Shape::MaxTokens, 20.0),
    ] {
        let from = 2_400_000;
        let run = simulate(
            shape,
            0.9,
            9,
            Some(Fault {
                from_ms: from,
                to_ms: i64::MAX,
                factor: 4.0,
                instance: Some(2),
            }),
        );
        let after = detected_after(&run, from, "i2").expect("the instance's blow-up was found");
        assert!(after <= within, "found after {after} s");
        if matches!(shape, Shape::MaxTokens) {
            let f = &run.findings.iter().find(|(_, s, _)| s == "i2").unwrap().2;
            assert_eq!(f.evidence["direction"], "truncated", "{}", f.summary);
            assert_eq!(
                f.evidence["pattern"],
                "cut off at their token limit, more often than normal"
            );
            assert!(f.summary.contains("token limit"), "{}", f.summary);
        }
        let wrong = run
            .findings
            .iter()
            .find(|(t, s, _)| *t < from || !(s == "i2" || s.is_empty()));
        assert!(
            wrong.is_none(),
            "a finding on a healthy instance or before the fault: {:?}",
            wrong.map(|(t, s, f)| (t, s, &f.summary))
        );
    }
}

fn steady(d: &mut LengthOutlier, from: i64, n: usize) -> i64 {
    let mut at = from;
    for i in 0..n {
        // 200 ± 20 tokens, deterministic.
        assert!(
            d.observe(at, "a", 180.0 + f64::from((i * 7 % 41) as u32), false)
                .is_none()
        );
        at += 100;
    }
    at
}

#[test]
fn annotations_test_against_the_reference_outside_the_window() {
    let mut d = LengthOutlier::new(LengthOutlierParams::default(), 10_000);
    // 100 responses in 10 s: all still inside the window, none in the reference yet.
    let at = steady(&mut d, 0, 100);
    assert_eq!(d.reference_len(), 0);
    assert!(
        d.observe(at, "a", 5000.0, false).is_none(),
        "no reference yet: not tested"
    );
    let at = steady(&mut d, at + 100, 200);
    assert_eq!(d.reference_len(), 100);
    let f = d
        .observe(at, "a", 1500.0, false)
        .expect("a long response is annotated");
    assert!(
        f.score > 1.0 && f.summary.contains("longer"),
        "{}",
        f.summary
    );
    assert_eq!(f.evidence["value"], 1500.0);
    assert!(
        (f.evidence["median"].as_f64().unwrap() - 200.0).abs() < 15.0,
        "{:?}",
        f.evidence
    );
    assert!(
        d.observe(at, "a", 5.0, false)
            .unwrap()
            .summary
            .contains("shorter")
    );
    assert!(d.observe(at, "a", 215.0, false).is_none());
    assert!(
        d.observe(at, "a", f64::NAN, false).is_none() && d.observe(at, "a", -1.0, false).is_none()
    );
}

#[test]
fn constant_reference_needs_a_real_change() {
    let mut d = LengthOutlier::new(LengthOutlierParams::default(), 1_000);
    for i in 0..200 {
        assert!(
            d.observe(i * 100, "", 256.0, true).is_none(),
            "constant series"
        );
    }
    assert!(
        d.observe(20_000, "", 262.0, false).is_none(),
        "a few tokens off a constant reference"
    );
    assert!(
        d.observe(20_000, "", 1000.0, false).is_some(),
        "a blow-up from a constant reference"
    );
    // More than half of the answers at a cap: nothing is above the median, and a blow-up that
    // lifts the cap is an outlier from its first response.
    let mut m = LengthOutlier::new(LengthOutlierParams::default(), 1_000);
    for i in 0..200 {
        m.observe(
            i * 100,
            "",
            if i % 3 == 0 {
                90.0 + f64::from(i as u32 % 50)
            } else {
                256.0
            },
            i % 3 != 0,
        );
    }
    assert!(
        m.observe(20_000, "", 256.0, true).is_none()
            && m.observe(20_000, "", 110.0, false).is_none()
    );
    assert!(m.observe(20_000, "", 700.0, false).is_some());
}

#[test]
fn the_share_test_needs_samples_and_a_baseline() {
    let p = LengthOutlierParams::default();
    // 40 of 1000 at a 1 % baseline: found; 15 of 1000: chance; too few samples: never.
    let c = |tested, longer, shorter| Counts {
        tested,
        longer,
        shorter,
        truncated: 0,
        truncated_of: tested,
    };
    let base = c(10_000, 50, 50);
    let test = |cur: Counts| share_test(&p, &cur, &base, 120_000, p.alpha / 4.0);
    // Baseline 0.5 % each way, floored at 2 %: 80 of 1000 is 4× the floor and far beyond chance.
    assert!(test(c(1000, 80, 0)).is_some());
    assert!(test(c(1000, 0, 80)).is_some());
    assert!(test(c(1000, 40, 40)).is_none(), "4 %: only 2× the floor");
    assert!(
        test(c(100, 7, 0)).is_none(),
        "7 of 100: not significant at this size"
    );
    let mut d = LengthOutlier::new(p, 10_000);
    let at = steady(&mut d, 0, 400) + 20_000;
    for i in 0..30 {
        assert!(
            d.observe(at + i * 100, "a", 5000.0, false).is_some(),
            "each is annotated"
        );
    }
    assert!(
        d.evaluate(at + 3_000).is_empty(),
        "30 tested responses in the window: under min_samples"
    );
    for i in 30..60 {
        d.observe(at + i * 100, "a", 5000.0, false);
    }
    let found = d.evaluate(at + 6_000);
    assert_eq!(
        found.scopes(),
        ["", "a"],
        "60 of 60: the model and its instance"
    );
    assert!(found.attributed.is_empty(), "no peers to compare with");
    assert_eq!(found.serving, ["a"]);
}

#[test]
fn params_validate_with_field_names() {
    let bad = |p: LengthOutlierParams| p.validate().unwrap_err().field;
    let d = LengthOutlierParams::default;
    assert_eq!(
        bad(LengthOutlierParams {
            min_reference: 500,
            ..d()
        }),
        "min_reference"
    );
    assert_eq!(bad(LengthOutlierParams { alpha: 0.0, ..d() }), "alpha");
    assert_eq!(
        bad(LengthOutlierParams {
            min_baseline_rate: 1.0,
            ..d()
        }),
        "min_baseline_rate"
    );
    assert_eq!(
        bad(LengthOutlierParams {
            min_ratio: 0.5,
            ..d()
        }),
        "min_ratio"
    );
    assert_eq!(
        bad(LengthOutlierParams {
            truncated_min_baseline_rate: 0.0,
            ..d()
        }),
        "truncated_min_baseline_rate"
    );
    assert_eq!(
        bad(LengthOutlierParams {
            truncated_min_odds_ratio: 0.9,
            ..d()
        }),
        "truncated_min_odds_ratio"
    );
    assert_eq!(
        bad(LengthOutlierParams {
            attribution_alpha: 0.5,
            ..d()
        }),
        "attribution_alpha"
    );
    assert_eq!(
        bad(LengthOutlierParams {
            attribution_min_outliers: 0,
            ..d()
        }),
        "attribution_min_outliers"
    );
    let old: LengthOutlierParams = serde_json::from_str(r#"{"window": 200}"#).unwrap();
    assert_eq!(
        old.reference_size, 200,
        "the old key `window` still sets the reference size"
    );
}

#[test]
fn right_after_start_the_reference_stands_in_for_the_baseline() {
    // Reference from 2 min on, tested history older than the window only from 4 min on: a
    // blow-up at 2.5 min is judged against the reference's own tail share.
    // Capped at max_tokens: the truncated share against the reference's last 1000 responses.
    for shape in [Shape::ParetoTail, Shape::CappedLogNormal, Shape::MaxTokens] {
        let from = 150_000;
        let fault = Fault {
            from_ms: from,
            to_ms: i64::MAX,
            factor: 4.0,
            instance: None,
        };
        let run = simulate(shape, 0.08, 13, Some(fault));
        let after = detected_after(&run, from, "").expect("found during warm-up");
        assert!(after <= 20.0, "found after {after} s");
        assert!(
            run.findings.iter().all(|(t, _, _)| *t >= from),
            "a finding before the fault"
        );
    }
    // And on one instance of four (the bench's fault starts 150 s in): named within 20 s.
    let fault = Fault {
        from_ms: 150_000,
        to_ms: i64::MAX,
        factor: 4.0,
        instance: Some(2),
    };
    let run = simulate(Shape::MaxTokens, 0.08, 13, Some(fault));
    let after = detected_after(&run, 150_000, "i2").expect("found during warm-up");
    assert!(after <= 20.0, "found after {after} s");
    assert!(
        run.findings
            .iter()
            .all(|(t, s, _)| *t >= 150_000 && (s == "i2" || s.is_empty())),
        "a finding before the fault or on a healthy instance"
    );
}
