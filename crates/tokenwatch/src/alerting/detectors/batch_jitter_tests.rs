// `batch_jitter`'s pairs by binary search on the sorted history against the walk of the whole
// history per record it replaced, over random traffic and out-of-order signal histories.

use super::*;
use crate::alerting::engine::record::Rec;
use crate::alerting::rules::{AlertingConfig, compile};
use proptest::prelude::*;
use tokenwatch_core::signals::SignalPoint;

const MODELS: &[&str] = &["m1", "m2"];
const INSTANCES: &[&str] = &["", "a:1", "b:1", "c:1"];
const T0: i64 = 1_700_000_000_000;

/// The pairs as they were read before: each record walks its instance's whole history for the
/// nearest point (the first of equally near ones).
fn pairs_reference(
    inputs: &Inputs,
    board: &SignalBoard,
    m: &str,
    now: i64,
    w: i64,
) -> (Vec<f64>, Vec<f64>) {
    let (mut lat, mut batch) = (Vec::new(), Vec::new());
    let mut running: HashMap<String, Vec<(i64, f64)>> = HashMap::new();
    for r in inputs.window(m, now - w, now).filter(|r| r.ok) {
        let Some(itl) = r.itl else { continue };
        let h = running.entry(r.instance.to_string()).or_insert_with(|| {
            inputs::history(
                board,
                m,
                names::REQUESTS_RUNNING,
                &r.instance,
                "",
                now - 2 * w,
            )
        });
        let Some((_, b)) = h.iter().min_by_key(|(t, _)| (t - r.at_ms).abs()) else {
            continue;
        };
        lat.push(itl);
        batch.push(*b);
    }
    (lat, batch)
}

/// The evaluation as it was, on the reference pairs.
fn evaluate_reference(
    d: &BatchJitter,
    rule: &RuleSpec,
    inputs: &Inputs,
    board: &SignalBoard,
    now: i64,
) -> Vec<AnomalyEvent> {
    let w = rule.window_ms;
    let mut out = Vec::new();
    for m in inputs.models() {
        let (lat, batch) = pairs_reference(inputs, board, &m, now, w);
        if let Some(f) = det::batch_jitter(&lat, &batch, &d.params) {
            out.push(model_event(f, &rule.detector, "itl_seconds", &m, now));
        }
    }
    out
}

fn spec() -> RuleSpec {
    let rules = compile(&AlertingConfig::default()).expect("the shipped rules compile");
    rules
        .into_iter()
        .find(|r| r.detector == "batch_jitter")
        .map(|r| r.spec)
        .expect("batch_jitter is shipped")
}

fn point(model: &str, instance: &str, at: i64, value: f64) -> SignalPoint {
    SignalPoint {
        model_id: model.into(),
        signal: names::REQUESTS_RUNNING.into(),
        value,
        source: "test".into(),
        runtime: String::new(),
        instance: instance.into(),
        device_id: String::new(),
        timestamp_unix_ms: at,
        notes: Default::default(),
    }
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[derive(Debug, Clone)]
enum Op {
    /// A request known `late` ms before the clock (on a 50 ms grid: ties with the history's).
    Request {
        model: usize,
        instance: usize,
        late: i64,
        itl: u8,
        ok: bool,
        has_itl: bool,
    },
    /// A running-requests point written at the clock + `offset` (on a 100 ms grid, often the
    /// same time as another point, before or after those already written).
    Signal {
        model: usize,
        instance: usize,
        offset: i64,
    },
    /// The clock moves; old records are pruned and idle series dropped from the board.
    Tick(i64),
    Back(i64),
    Check(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..MODELS.len(), 0..INSTANCES.len(),
              prop_oneof![4 => 0..20i64, 1 => 0..800i64], 0..6u8,
              prop::bool::weighted(0.9), prop::bool::weighted(0.9))
            .prop_map(|(model, instance, late, itl, ok, has_itl)| Op::Request {
                model, instance, late: late * 50, itl, ok, has_itl
            }),
        6 => (0..MODELS.len(), 0..INSTANCES.len(), prop_oneof![3 => -5..5i64, 1 => -300..30i64])
            .prop_map(|(model, instance, offset)| Op::Signal { model, instance, offset: offset * 100 }),
        3 => prop_oneof![6 => 0..2_000i64, 1 => 0..120_000i64].prop_map(Op::Tick),
        1 => (0..5_000i64).prop_map(Op::Back),
        3 => prop_oneof![3 => Just(10_000i64), 1 => Just(3_000i64), 1 => Just(60_000i64)]
            .prop_map(Op::Check),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn pairs_by_binary_search_equal_the_walk_of_the_whole_history(
        ops in prop::collection::vec(op(), 1..220),
        cap in prop_oneof![Just(20usize), Just(100_000usize)],
        history in prop_oneof![Just(5usize), Just(720usize)],
    ) {
        let mut inputs = Inputs::new(90_000, cap);
        let windows = crate::alerting::engine::windows::SharedWindows::default();
        let mut board = SignalBoard::new(history, 1_000);
        let mut detector = BatchJitter {
            params: det::BatchJitterParams { max_score: 0.05, min_samples: 4, segments: 2 },
        };
        let mut rule = spec();
        let (mut now, mut written) = (T0, 0u32);
        for op in ops.iter().chain([&Op::Check(10_000)]) {
            match *op {
                Op::Request { model, instance, late, itl, ok, has_itl } => inputs.ingest(Rec {
                    model: MODELS[model].into(),
                    instance: INSTANCES[instance].into(),
                    at_ms: (now / 50) * 50 - late,
                    itl: has_itl.then_some(0.01 + 0.02 * f64::from(itl * itl)),
                    ok,
                    ..Rec::default()
                }),
                Op::Signal { model, instance, offset } => {
                    // Every value differs: a pick of the wrong one of equally near points shows.
                    written += 1;
                    let at = (now / 100) * 100 + offset;
                    board.update(point(MODELS[model], INSTANCES[instance], at, f64::from(written)));
                }
                Op::Tick(ms) => {
                    now += ms;
                    inputs.prune(now);
                    board.evict_older_than(now, 30_000);
                }
                Op::Back(ms) => now -= ms,
                Op::Check(w) => {
                    for m in MODELS {
                        let (lat, batch) = pairs(&inputs, &board, m, now, w);
                        let (want_lat, want_batch) = pairs_reference(&inputs, &board, m, now, w);
                        prop_assert_eq!(bits(&lat), bits(&want_lat), "{} at {} w {}", m, now, w);
                        prop_assert_eq!(bits(&batch), bits(&want_batch), "{} at {} w {}", m, now, w);
                    }
                    rule.window_ms = w;
                    let cx = EvalCtx {
                        splits: &Default::default(),
                        actions: &crate::kernel::actions::NoActions,
                        inputs: &inputs,
                        windows: &windows,
                        board: &board,
                        new_records: &[],
                        spans: &[],
                        semantic_drift_models: &Default::default(),
                        now,
                    };
                    let got = format!("{:?}", detector.evaluate(&rule, &cx));
                    let want = format!("{:?}", evaluate_reference(&detector, &rule, &inputs, &board, now));
                    prop_assert_eq!(got, want);
                }
            }
        }
    }
}

#[test]
fn the_nearest_point_is_the_first_written_of_equally_near_ones() {
    // Out of time order, with a repeated time and points equally far on both sides.
    let n = Nearest::new(vec![
        (300, 1.0),
        (100, 2.0),
        (300, 3.0),
        (200, 4.0),
        (0, 5.0),
    ]);
    assert_eq!(n.at(300), Some(1.0));
    assert_eq!(
        n.at(250),
        Some(1.0),
        "200 and 300 equally near: 300 was written first"
    );
    assert_eq!(n.at(150), Some(2.0), "100 was written before 200");
    assert_eq!(n.at(-1_000), Some(5.0));
    assert_eq!(n.at(10_000), Some(1.0));
    assert_eq!(n.at(199), Some(4.0));
    assert_eq!(Nearest::new(Vec::new()).at(0), None);
}

/// A minute of 100,000 records on four instances, each with a full history (720 points):
/// the pairs found by binary search, and by the walk they replace (printed: debug build).
#[test]
fn a_large_window_pairs_its_records_without_walking_the_history_for_each() {
    let (now, w) = (T0 + 60_000, 60_000);
    let mut inputs = Inputs::new(3_600_000, 1_000_000);
    let mut board = SignalBoard::new(720, 1_000);
    for (k, inst) in INSTANCES[1..].iter().enumerate() {
        // Scrapes out of order: two sources writing the same series, interleaved.
        for s in 0..720i64 {
            let at = now - 2 * w + (s % 2) * 60_000 + (s / 2) * 333;
            board.update(point("m", inst, at, (s as f64) + k as f64));
        }
    }
    for n in 0..100_000i64 {
        inputs.ingest(Rec {
            model: "m".into(),
            instance: INSTANCES[1 + (n % 3) as usize].into(),
            at_ms: now - w + 1 + (n * 7919) % w,
            itl: Some(0.01 * (1 + n % 9) as f64),
            ok: n % 17 != 0,
            ..Rec::default()
        });
    }
    let t = std::time::Instant::now();
    let got = pairs(&inputs, &board, "m", now, w);
    let fast = t.elapsed();
    let t = std::time::Instant::now();
    let want = pairs_reference(&inputs, &board, "m", now, w);
    let walk = t.elapsed();
    println!("batch_jitter pairs of 100,000 records: {fast:?} (binary search), {walk:?} (walk)");
    assert_eq!(got.0.len(), 100_000 - 100_000 / 17 - 1);
    assert_eq!((bits(&got.0), bits(&got.1)), (bits(&want.0), bits(&want.1)));
    assert!(fast < walk, "{fast:?} vs {walk:?}");
}
