// `error_burst` counted on the incremental per-instance mirrors against the evaluation it
// replaced (the records of its longest window collected and sorted each time), over random traffic.

use super::*;
use crate::alerting::engine::inputs::Inputs;
use crate::alerting::engine::record::Rec;
use crate::alerting::rules::{AlertingConfig, compile};
use proptest::prelude::*;
use std::collections::BTreeMap;
use tokenwatch_core::signals::SignalBoard;

// ---- The evaluation as it was (the reference), unchanged but for the names. ----

/// (failed, total) of records.
fn count_ref<'a>(recs: impl Iterator<Item = &'a &'a Rec>) -> (u64, u64) {
    recs.fold((0, 0), |(b, n), r| (b + u64::from(r.server_failure), n + 1))
}

/// The short window of one series: the rule's window, grown (up to `max_ms`) until it holds
/// `min_requests`. `times` are the series' record times, newest first.
fn short_window_ref(times: &[i64], now: i64, window: i64, max_ms: i64, min_requests: u64) -> i64 {
    let min = min_requests.max(1) as usize;
    let within = times.iter().take_while(|t| now - **t < window).count();
    if within >= min || times.len() < min {
        return window;
    }
    (now - times[min - 1] + 1).clamp(window, max_ms.max(window))
}

/// The series' usual error ratio over `(from, to]`, anomaly episodes left out; None with
/// fewer than `min_requests`.
fn usual_ref(
    st: &SeriesState,
    model: &str,
    inputs: &Inputs,
    instance: Option<&str>,
    (from, to): (i64, i64),
    min_requests: u64,
) -> Option<f64> {
    let covered = st.coverage(model);
    let (bad, total) = inputs
        .window(model, from, to)
        .filter(|r| instance.is_none_or(|i| r.instance == i))
        .filter(|r| !covered(&r.instance, r.at_ms))
        .fold((0, 0), |(b, n), r| (b + u64::from(r.server_failure), n + 1));
    (total >= min_requests.max(1)).then(|| bad as f64 / total as f64)
}

/// `error_burst`: an instance bursts when its errors are improbable against its own usual rate
/// and its peers' rate in the same window; the model on its other instances.
fn error_burst_ref(
    rule: &RuleSpec,
    p: &det::ErrorBurstParams,
    st: &mut SeriesState,
    cx: &EvalCtx,
) -> Vec<AnomalyEvent> {
    let now = cx.now;
    let w = rule.window_ms;
    let max_w = ((p.max_window_s * 1000.0) as i64).max(w);
    let span = (p.baseline_s * 1000.0) as i64;
    let max_hold = (p.max_hold_s * 1000.0) as i64;
    // The reference period is long: its rate is recounted once per max window fraction.
    let refresh = (max_w / super::super::latency::BASELINE_REFRESH_DIVISOR).max(100);
    let mut out = Vec::new();
    for m in cx.inputs.models() {
        // The short windows' records, newest first (the reference period is counted apart).
        let mut recent: Vec<&Rec> = cx.inputs.window(&m, now - max_w, now).collect();
        recent.sort_by_key(|r| std::cmp::Reverse(r.at_ms));
        let mut times: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for r in &recent {
            times.entry(r.instance.as_str()).or_default().push(r.at_ms);
        }
        let instances: Vec<String> = times
            .keys()
            .filter(|i| !i.is_empty())
            .map(|i| i.to_string())
            .collect();
        let mut flagged = BTreeSet::new();
        if instances.len() >= 2 {
            for i in &instances {
                let win = short_window_ref(&times[i.as_str()], now, w, max_w, p.min_requests);
                let in_win = |r: &&&Rec| now - r.at_ms < win;
                let (bad, total) =
                    count_ref(recent.iter().filter(in_win).filter(|r| r.instance == *i));
                let peers = count_ref(recent.iter().filter(in_win).filter(|r| r.instance != *i));
                let own = observe_ref(
                    st,
                    &m,
                    i,
                    cx.inputs,
                    (now - win - span, now - win),
                    p,
                    (max_hold, refresh),
                    now,
                );
                let f = det::error_burst(bad, total, win as f64 / 1000.0, own, p);
                track(st, &m, i, f.is_some(), own, (win, max_w), now);
                let peer_rate =
                    (peers.1 >= p.min_requests.max(1)).then(|| peers.0 as f64 / peers.1 as f64);
                let reference = match (own, peer_rate) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                let Some(f) =
                    f.and_then(|_| det::error_burst(bad, total, win as f64 / 1000.0, reference, p))
                else {
                    continue;
                };
                let mut f = f.with(
                    "peer_error_ratio",
                    peer_rate.map_or(serde_json::Value::Null, Into::into),
                );
                f.summary = format!("instance {i}: {}", f.summary);
                out.push(f.into_event(
                    &rule.detector,
                    "success_ratio",
                    labels(&[("model_id", &m), ("instance", i)]),
                    now,
                ));
                flagged.insert(i.clone());
            }
        }
        let model_times: Vec<i64> = recent
            .iter()
            .filter(|r| !flagged.contains(r.instance.as_str()))
            .map(|r| r.at_ms)
            .collect();
        let win = short_window_ref(&model_times, now, w, max_w, p.min_requests);
        let (bad, total) = count_ref(
            recent
                .iter()
                .filter(|r| now - r.at_ms < win && !flagged.contains(r.instance.as_str())),
        );
        let own = observe_ref(
            st,
            &m,
            "",
            cx.inputs,
            (now - win - span, now - win),
            p,
            (max_hold, refresh),
            now,
        );
        let f = det::error_burst(bad, total, win as f64 / 1000.0, own, p);
        track(st, &m, "", f.is_some(), own, (win, max_w), now);
        if let Some(f) = f {
            out.push(f.into_event(
                &rule.detector,
                "success_ratio",
                labels(&[("model_id", &m)]),
                now,
            ));
        }
    }
    st.prune(now - max_w - span);
    out
}

/// The usual error ratio of a series: frozen at the onset of its ongoing burst, else measured
/// over its reference period.
#[allow(clippy::too_many_arguments)] // the series key, its records and the period
fn observe_ref(
    st: &mut SeriesState,
    model: &str,
    instance: &str,
    inputs: &Inputs,
    period: (i64, i64),
    p: &det::ErrorBurstParams,
    (max_hold, refresh_ms): (i64, i64),
    now: i64,
) -> Option<f64> {
    let s = st.get(model, instance);
    if s.episodes.expire(now, max_hold) {
        s.frozen_rate = None;
    }
    if let Some(r) = s.frozen_rate {
        return r;
    }
    if let Some((t, r)) = s.cached_rate
        && now - t < refresh_ms
    {
        return r;
    }
    let who = (!instance.is_empty()).then_some(instance);
    let r = usual_ref(st, model, inputs, who, period, p.min_requests);
    st.get(model, instance).cached_rate = Some((now, r));
    r
}

// ---- The tests. ----

const MODELS: &[&str] = &["m1", "m2"];
const INSTANCES: &[&str] = &["", "a:1", "b:1", "c:1"];
const T0: i64 = 1_700_000_000_000;

fn spec(window_ms: i64) -> RuleSpec {
    let rules = compile(&AlertingConfig::default()).expect("the shipped rules compile");
    let mut spec = rules
        .into_iter()
        .find(|r| r.detector == "error_burst")
        .map(|r| r.spec)
        .expect("error_burst is shipped");
    spec.window_ms = window_ms;
    spec
}

/// Small enough that short traffic bursts and is held, its windows grow and its episodes end.
fn touchy() -> det::ErrorBurstParams {
    det::ErrorBurstParams {
        objective: 0.9,
        burn_rate: 3.0,
        min_requests: 4,
        min_errors: 2,
        max_window_s: 3.0,
        baseline_s: 6.0,
        alpha: 0.2,
        max_hold_s: 5.0,
    }
}

/// Both evaluations of the same inputs, each with its own series state.
struct Pair {
    inputs: Inputs,
    windows: crate::alerting::engine::windows::SharedWindows,
    board: SignalBoard,
    new: SeriesState,
    old: SeriesState,
}

impl Pair {
    fn new(retention: i64, cap: usize) -> Pair {
        Pair {
            inputs: Inputs::new(retention, cap),
            windows: Default::default(),
            board: SignalBoard::new(4, 4),
            new: SeriesState::default(),
            old: SeriesState::default(),
        }
    }

    /// The events of both, in full.
    fn evaluate(&mut self, rule: &RuleSpec, p: &det::ErrorBurstParams, now: i64) -> [String; 2] {
        let empty = Default::default();
        let cx = EvalCtx {
            splits: &Default::default(),
            actions: &crate::kernel::actions::NoActions,
            inputs: &self.inputs,
            windows: &self.windows,
            board: &self.board,
            new_records: &[],
            spans: &[],
            semantic_drift_models: &empty,
            now,
        };
        [
            format!("{:?}", error_burst(rule, p, &mut self.new, &cx)),
            format!("{:?}", error_burst_ref(rule, p, &mut self.old, &cx)),
        ]
    }
}

fn rec(model: &str, instance: &str, at_ms: i64, failed: bool) -> Rec {
    Rec {
        model: model.into(),
        instance: instance.into(),
        at_ms,
        e2e: 0.5,
        ok: !failed,
        server_failure: failed,
        ..Rec::default()
    }
}

/// A request that failed on the client's side (4xx, cancelled): not a server failure.
fn client_error(model: &str, instance: &str, at_ms: i64) -> Rec {
    Rec {
        ok: false,
        ..rec(model, instance, at_ms, false)
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A request known `late` ms before the clock: 0 served, 1 a server failure, 2 a client's.
    Request {
        model: usize,
        instance: usize,
        late: i64,
        outcome: u8,
    },
    /// `n` requests on one instance within the last `spread` ms, this share of them failed.
    Burst {
        model: usize,
        instance: usize,
        n: u8,
        spread: i64,
        share: u8,
    },
    /// The clock moves (the kept records are pruned).
    Tick(i64),
    Back(i64),
    /// Evaluate both, the rule's window given.
    Check(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..MODELS.len(), 0..INSTANCES.len(),
              prop_oneof![5 => 0..400i64, 1 => 0..12_000i64],
              prop_oneof![16 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8)])
            .prop_map(|(model, instance, late, outcome)| Op::Request { model, instance, late, outcome }),
        2 => (0..MODELS.len(), 0..INSTANCES.len(), 1..40u8, 1..4_000i64, 0..=4u8)
            .prop_map(|(model, instance, n, spread, share)| Op::Burst { model, instance, n, spread, share }),
        4 => prop_oneof![6 => 0..800i64, 1 => 0..40_000i64].prop_map(Op::Tick),
        1 => (0..4_000i64).prop_map(Op::Back),
        5 => prop_oneof![4 => Just(1_000i64), 1 => Just(2_500i64), 1 => Just(5_000i64)]
            .prop_map(Op::Check),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn bursts_counted_on_the_mirrors_equal_the_collected_and_sorted_window(
        ops in prop::collection::vec(op(), 1..240),
        cap in prop_oneof![Just(25usize), Just(100_000usize)],
    ) {
        let p = touchy();
        let mut pair = Pair::new(20_000, cap);
        let mut now = T0;
        let mut n = 0u64;
        for op in ops.iter().chain([&Op::Check(1_000)]) {
            match *op {
                Op::Request { model, instance, late, outcome } => {
                    let (m, i, at) = (MODELS[model], INSTANCES[instance], now - late);
                    pair.inputs.ingest(match outcome {
                        2 => client_error(m, i, at),
                        o => rec(m, i, at, o == 1),
                    });
                }
                Op::Burst { model, instance, n: count, spread, share } => {
                    for k in 0..i64::from(count) {
                        n += 1;
                        let failed = (n % 4) < u64::from(share);
                        let at = now - (k * 7_919) % spread;
                        pair.inputs.ingest(rec(MODELS[model], INSTANCES[instance], at, failed));
                    }
                }
                Op::Tick(ms) => {
                    now += ms;
                    pair.inputs.prune(now);
                }
                Op::Back(ms) => now -= ms,
                Op::Check(w) => {
                    let [got, want] = pair.evaluate(&spec(w), &p, now);
                    prop_assert_eq!(got, want, "at {} w {}", now, w);
                }
            }
        }
    }
}

#[test]
fn instance_and_model_bursts_are_found_the_same() {
    let p = touchy();
    let rule = spec(1_000);
    let mut pair = Pair::new(60_000, 100_000);
    let (mut found, mut instance_events) = (0, 0);
    for step in 0..400i64 {
        let now = T0 + step * 250;
        for k in 0..6i64 {
            let inst = INSTANCES[1 + (k % 3) as usize];
            // b:1 fails in bursts of a few seconds; everything fails for a moment later on.
            let failed = (inst == "b:1" && (step / 20) % 3 == 1)
                || (200..212).contains(&step)
                || (step * 6 + k) % 97 == 0;
            pair.inputs.ingest(rec("m", inst, now - k * 37, failed));
        }
        pair.inputs.prune(now);
        let [got, want] = pair.evaluate(&rule, &p, now);
        assert_eq!(got, want, "at step {step}");
        found += usize::from(got != "[]");
        instance_events += got.matches("\"instance\": \"b:1\"").count();
    }
    assert!(
        found > 10 && instance_events > 5,
        "{found} {instance_events}"
    );
}

/// A minute of 100,000 records on four instances: one evaluation 250 ms after the last, as
/// counted on the mirrors and as collected and sorted before (printed: debug build).
#[test]
fn a_large_window_is_counted_without_collecting_and_sorting_it() {
    let p = det::ErrorBurstParams::default();
    let rule = spec(5_000);
    let now = T0 + 60_000;
    let mut pair = Pair::new(3_600_000, 1_000_000);
    // `n` records known in (from, from + span], out of order.
    let add = |pair: &mut Pair, from: i64, span: i64, n: i64| {
        for k in 0..n {
            let inst = INSTANCES[(k % 4) as usize];
            let at = from + 1 + (k * 7_919) % span;
            pair.inputs.ingest(rec("m", inst, at, k % 101 == 0));
        }
    };
    add(&mut pair, now - 60_000, 60_000, 100_000);
    let first = pair.evaluate(&rule, &p, now);
    assert_eq!(first[0], first[1]);
    add(&mut pair, now, 250, 400);
    let later = now + 250;
    let empty = Default::default();
    let cx = EvalCtx {
        splits: &Default::default(),
        actions: &crate::kernel::actions::NoActions,
        inputs: &pair.inputs,
        windows: &pair.windows,
        board: &pair.board,
        new_records: &[],
        spans: &[],
        semantic_drift_models: &empty,
        now: later,
    };
    let t = std::time::Instant::now();
    let got = error_burst(&rule, &p, &mut pair.new, &cx);
    let mirrored = t.elapsed();
    let t = std::time::Instant::now();
    let want = error_burst_ref(&rule, &p, &mut pair.old, &cx);
    let collected = t.elapsed();
    println!(
        "error_burst over 100,000 records: {mirrored:?} (mirrors), {collected:?} (collected and sorted)"
    );
    assert_eq!(format!("{got:?}"), format!("{want:?}"));
    assert!(mirrored < collected, "{mirrored:?} vs {collected:?}");
}
