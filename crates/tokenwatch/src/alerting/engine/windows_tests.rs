// The incremental windows against a from-scratch read of the kept records after every step of
// random traffic: late and bursty arrivals, early first tokens, evictions, models and A/B arms
// that go and come.

use super::super::inputs::{Inputs, values};
use super::super::record::{Rec, rec};
use super::{LatencyWindows, SAMPLE_BYTES, Slot};
use proptest::prelude::*;
use std::collections::BTreeMap;
use tokenwatch_core::model::FirstToken;

const INSTANCES: &[&str] = &["", "a:1", "b:1", "c:1"];
const MODELS: &[&str] = &["m1", "m2"];
/// A/B groups ("": none); an arm is used only by some steps, so arms come and go.
const ARMS: &[&str] = &["", "a", "b", "c"];
/// Few distinct values: windows hold many equal ones.
const VALUES: &[f64] = &[0.1, 0.2, 0.25, 0.5, 1.0, 2.0];

#[derive(Debug, Clone)]
enum Op {
    /// A request: model, instance, known this late (ms) before the clock, its TTFT's index,
    /// success, whether its first token is reported ahead of it.
    Request {
        model: usize,
        instance: usize,
        arm: usize,
        late: i64,
        value: usize,
        ok: bool,
        early: bool,
        has_ttft: bool,
    },
    /// A first token whose record never comes.
    Orphan {
        model: usize,
        instance: usize,
        late: i64,
        value: usize,
    },
    /// The clock moves (and the kept records are pruned).
    Tick(i64),
    /// The clock goes back.
    Back(i64),
    /// Compare every window, the rules' window length given.
    Check { w: i64, stretch: i64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..MODELS.len(), 0..INSTANCES.len(), prop_oneof![4 => 0..500i64, 1 => 0..40_000i64],
              0..VALUES.len(), prop::bool::weighted(0.9), any::<bool>(), prop::bool::weighted(0.9),
              prop_oneof![3 => 0..3usize, 1 => 0..ARMS.len()])
            .prop_map(|(model, instance, late, value, ok, early, has_ttft, arm)| Op::Request {
                model, instance, arm, late, value, ok, early, has_ttft
            }),
        1 => (0..MODELS.len(), 0..INSTANCES.len(), 0..3_000i64, 0..VALUES.len())
            .prop_map(|(model, instance, late, value)| Op::Orphan { model, instance, late, value }),
        3 => prop_oneof![6 => 0..2_000i64, 1 => 0..200_000i64].prop_map(Op::Tick),
        1 => (0..5_000i64).prop_map(Op::Back),
        4 => (prop_oneof![4 => Just(10_000i64), 1 => Just(7_000i64)], 1..=3i64)
            .prop_map(|(w, stretch)| Op::Check { w, stretch }),
    ]
}

/// Sorted values of `value` of the successful samples of (model, view) in (from, to] of the
/// instance (None: all), read from the kept records.
fn naive(
    inputs: &Inputs,
    (model, view, value): (&str, &str, &str),
    scope: Option<&str>,
    (from, to): (i64, i64),
) -> Vec<f64> {
    let mut v: Vec<f64> = inputs
        .latency_window(model, view, from, to)
        .filter(|s| s.ok() && scope.is_none_or(|i| s.instance() == i))
        .filter_map(|s| s.value(value))
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

struct World {
    inputs: Inputs,
    windows: LatencyWindows,
    now: i64,
    seq: u64,
}

impl World {
    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Request {
                model,
                instance,
                arm,
                late,
                value,
                ok,
                early,
                has_ttft,
            } => {
                self.seq += 1;
                let id = format!("r{}", self.seq);
                let ttft = VALUES[value];
                let at = self.now - late;
                if early && ok {
                    self.inputs.add_first_token(&FirstToken {
                        request_id: id.clone(),
                        model_id: MODELS[model].into(),
                        instance: INSTANCES[instance].into(),
                        arrival_unix_ms: at - 1_000,
                        first_token_s: ttft,
                    });
                }
                self.inputs.ingest(Rec {
                    model: MODELS[model].into(),
                    instance: INSTANCES[instance].into(),
                    ab_group: ARMS[arm].into(),
                    request_id: id.into(),
                    at_ms: at,
                    ttft: has_ttft.then_some(ttft),
                    e2e: ttft * 4.0,
                    prompt_tokens: (value % 3 != 0).then_some(100 * value as u64),
                    ok,
                    server_failure: !ok && value % 2 == 0,
                    ..Rec::default()
                });
            }
            Op::Orphan {
                model,
                instance,
                late,
                value,
            } => {
                self.seq += 1;
                self.inputs.add_first_token(&FirstToken {
                    request_id: format!("r{}", self.seq),
                    model_id: MODELS[model].into(),
                    instance: INSTANCES[instance].into(),
                    arrival_unix_ms: self.now - late - 500,
                    first_token_s: VALUES[value],
                });
            }
            Op::Tick(ms) => {
                self.now += ms;
                self.inputs.prune(self.now);
            }
            Op::Back(ms) => self.now -= ms,
            Op::Check { w, stretch } => self.check(w, stretch)?,
        }
        Ok(())
    }

    /// Every window a latency rule or `ab_regression` reads, incrementally and from scratch.
    fn check(&mut self, w: i64, stretch: i64) -> Result<(), TestCaseError> {
        self.check_arms(w, stretch)?;
        self.check_outcomes(w, stretch)?;
        let now = self.now;
        let span = 5 * w;
        for model in MODELS {
            // ("", _): the records alone (`LatencyWindows::record_windows`).
            let series = [
                ("ttft", "ttft"),
                ("e2e", "e2e"),
                ("ttft", "prompt_tokens"),
                ("", "ttft"),
            ];
            for (view, value) in series {
                let series = (*model, view, value);
                let reach = 3 * w + span;
                if !self.windows.sync(&self.inputs, series, reach, now) {
                    prop_assert!(self.inputs.kept_seq(model).is_none());
                    continue;
                }
                let ranges = [(now - w, now), (now - 2 * w, now), (now - 3 * w, now)];
                let counts = self.windows.counts(series, now, &ranges);
                prop_assert!(counts.is_some());
                let counts = counts.unwrap_or_default();
                let known: Vec<&str> = counts.iter().map(|(i, _)| i.as_str()).collect();
                for inst in INSTANCES {
                    let want: Vec<usize> = ranges
                        .iter()
                        .map(|r| naive(&self.inputs, series, Some(inst), *r).len())
                        .collect();
                    let got = counts
                        .iter()
                        .find(|(i, _)| i.as_str() == *inst)
                        .map(|(_, n)| n.clone())
                        .unwrap_or(vec![0; ranges.len()]);
                    prop_assert_eq!(&got, &want, "counts of {:?} {} at {}", series, inst, now);
                    if want[2] > 0 {
                        prop_assert!(known.contains(inst));
                    }
                }
                let stretched = stretch * w;
                let windows = [
                    (Slot::Current(w), (now - w, now)),
                    (Slot::Scaled(w), (now - stretched, now)),
                    (Slot::Short(w / 6), (now - w / 6, now)),
                    (
                        Slot::Baseline(span),
                        (now - stretched - span, now - stretched),
                    ),
                ];
                let scopes = INSTANCES.iter().map(|i| Some(*i)).chain([None]);
                for scope in scopes {
                    for (slot, range) in windows {
                        let want = naive(&self.inputs, series, scope, range);
                        let got = self
                            .windows
                            .window(series, now, scope, slot, range)
                            .map(|v| v.to_vec());
                        prop_assert_eq!(
                            got.as_deref(),
                            Some(want.as_slice()),
                            "{:?} {:?} {:?} {:?} at {}",
                            series,
                            scope,
                            slot,
                            range,
                            now
                        );
                    }
                }
                // Windows reaching before every reach asked for are not answered.
                let early = (now - 200_000, now);
                prop_assert!(
                    self.windows
                        .window(series, now, None, Slot::Baseline(0), early)
                        .is_none()
                );
                prop_assert!(
                    self.windows
                        .window(series, now + 1, None, Slot::Current(w), (now - w, now))
                        .is_none(),
                    "not synced at that time"
                );
            }
        }
        Ok(())
    }
}

impl World {
    /// The arms' counts and windows (`LatencyWindows::sync_arms`) against the kept records.
    fn check_arms(&mut self, w: i64, stretch: i64) -> Result<(), TestCaseError> {
        let now = self.now;
        for model in MODELS {
            for value in ["ttft", "e2e"] {
                let series = (*model, value);
                // The rule's window, or (as another rule's) a longer one: a longer reach
                // reads everything again.
                if !self
                    .windows
                    .sync_arms(&self.inputs, series, stretch * w, now)
                {
                    prop_assert!(self.inputs.kept_seq(model).is_none());
                    continue;
                }
                let slots = [
                    (Slot::Current(w), (now - w, now)),
                    (Slot::Scaled(w), (now - stretch * w, now)),
                ];
                for (slot, range) in slots {
                    let inside = || self.inputs.window(model, range.0, range.1);
                    let want: Vec<(String, usize)> = ARMS[1..]
                        .iter()
                        .map(|a| (a.to_string(), inside().filter(|r| r.ab_group == *a).count()))
                        .filter(|(_, n)| *n > 0)
                        .collect();
                    let got: Option<Vec<(String, usize)>> = self
                        .windows
                        .arm_counts(series, now, range)
                        .map(|c| c.into_iter().map(|(a, n)| (a.to_string(), n)).collect());
                    prop_assert_eq!(got, Some(want), "arms of {:?} in {:?}", series, range);
                    for arm in ARMS {
                        let mut want: Vec<f64> = inside()
                            .filter(|r| r.ab_group == *arm && r.ok)
                            .filter_map(|r| r.value(value))
                            .collect();
                        want.sort_by(f64::total_cmp);
                        // The records without an arm are not mirrored.
                        if arm.is_empty() {
                            want.clear();
                        }
                        let got = self
                            .windows
                            .arm_window(series, now, arm, slot, range)
                            .map(|v| v.to_vec());
                        prop_assert_eq!(
                            got.as_deref(),
                            Some(want.as_slice()),
                            "arm {:?} of {:?} {:?} {:?} at {}",
                            arm,
                            series,
                            slot,
                            range,
                            now
                        );
                    }
                }
                prop_assert!(
                    self.windows
                        .arm_counts(series, now, (now - 200_000, now))
                        .is_none(),
                    "before the reach"
                );
            }
        }
        Ok(())
    }
}

impl World {
    /// The records and server failures per instance (`LatencyWindows::sync_outcomes`) against
    /// the kept records.
    fn check_outcomes(&mut self, w: i64, stretch: i64) -> Result<(), TestCaseError> {
        let now = self.now;
        let reach = stretch * w;
        for model in MODELS {
            if !self.windows.sync_outcomes(&self.inputs, model, reach, now) {
                prop_assert!(self.inputs.kept_seq(model).is_none());
                continue;
            }
            prop_assert!(self.windows.outcomes(model, now, now - 200_000).is_none());
            prop_assert!(self.windows.outcomes(model, now + 1, now - reach).is_none());
            let Some(o) = self.windows.outcomes(model, now, now - reach) else {
                return Err(TestCaseError::fail("synced outcomes not answered"));
            };
            let ranges = [
                (now - w, now),
                (now - reach, now - w),
                (now - reach, now + 500),
            ];
            let mut seen: Vec<String> = o.instances().map(|i| i.to_string()).collect();
            seen.sort();
            seen.dedup();
            for inst in INSTANCES {
                for (from, to) in ranges {
                    // Read at the level of a window reaching back to `from`, as the records.
                    let o = o.reading_from(from);
                    let recs = || {
                        self.inputs
                            .window(model, from, to)
                            .filter(|r| r.instance == *inst)
                    };
                    let want = (
                        recs().filter(|r| r.server_failure).count() as u64,
                        recs().count() as u64,
                    );
                    prop_assert_eq!(o.count(inst, (from, to)), want, "{} {:?}", inst, (from, to));
                    let mut times: Vec<i64> = recs().map(|r| r.at_ms).collect();
                    times.sort();
                    prop_assert_eq!(o.times(inst, false, (from, to)).collect::<Vec<_>>(), times);
                    let mut failed: Vec<i64> = recs()
                        .filter(|r| r.server_failure)
                        .map(|r| r.at_ms)
                        .collect();
                    failed.sort();
                    prop_assert_eq!(o.times(inst, true, (from, to)).collect::<Vec<_>>(), failed);
                    if want.1 > 0 {
                        prop_assert!(seen.iter().any(|i| i == inst));
                    }
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn incremental_windows_equal_a_fresh_read_after_every_step(
        ops in prop::collection::vec(op(), 1..160),
        cap in prop_oneof![Just(12usize), Just(100_000usize)],
    ) {
        let mut world = World {
            inputs: Inputs::new(90_000, cap),
            windows: LatencyWindows::default(),
            now: 1_700_000_000_000,
            seq: 0,
        };
        for op in &ops {
            world.apply(op)?;
        }
        world.apply(&Op::Check { w: 10_000, stretch: 2 })?;
    }
}

#[test]
fn a_steady_stream_slides_its_windows_without_rebuilding_them() {
    let mut inputs = Inputs::new(600_000, 1_000_000);
    let mut windows = LatencyWindows::default();
    let t0 = 1_700_000_000_000;
    let series = ("m", "e2e", "e2e");
    let mut seq = 0u64;
    for step in 0..200i64 {
        let now = t0 + step * 250;
        for k in 0..50 {
            seq += 1;
            inputs.ingest(Rec {
                model: "m".into(),
                instance: INSTANCES[(seq % 4) as usize].into(),
                at_ms: now - 250 + k * 5 - (seq % 7) as i64 * 30,
                e2e: VALUES[(seq % 6) as usize] * (1.0 + (seq % 11) as f64),
                ok: !seq.is_multiple_of(13),
                ..Rec::default()
            });
        }
        assert!(windows.sync(&inputs, series, 40_000, now));
        for scope in [None, Some("a:1")] {
            let range = (now - 10_000, now);
            let got = windows
                .window(series, now, scope, Slot::Current(10_000), range)
                .map(|v| v.to_vec());
            assert_eq!(got, Some(naive(&inputs, series, scope, range)));
        }
    }
    // The windows moved by difference, read from scratch only when made.
    let m = &windows.mirrors[&super::key("m", "e2e", "e2e")];
    assert_eq!(m.windows.len(), 2);
    assert!(m.windows.values().all(|w| w.rebuilds == 1 && !w.stale));
}

#[test]
fn a_steady_stream_slides_the_arms_windows_without_rebuilding_them() {
    let mut inputs = Inputs::new(600_000, 1_000_000);
    let mut windows = LatencyWindows::default();
    let t0 = 1_700_000_000_000;
    let series = ("m", "e2e");
    let mut seq = 0u64;
    for step in 0..200i64 {
        let now = t0 + step * 250;
        for k in 0..50 {
            seq += 1;
            inputs.ingest(Rec {
                model: "m".into(),
                ab_group: ARMS[(seq % 3) as usize].into(),
                at_ms: now - 250 + k * 5 - (seq % 7) as i64 * 30,
                e2e: VALUES[(seq % 6) as usize] * (1.0 + (seq % 11) as f64),
                ok: !seq.is_multiple_of(13),
                ..Rec::default()
            });
        }
        let range = (now - 10_000, now);
        assert!(windows.sync_arms(&inputs, series, 10_000, now));
        let counts = windows.arm_counts(series, now, range).unwrap_or_default();
        assert_eq!(counts.len(), 2);
        for (arm, n) in counts {
            let recs = || {
                inputs
                    .window("m", range.0, range.1)
                    .filter(|r| r.ab_group == arm)
            };
            assert_eq!(n, recs().count());
            let mut want: Vec<f64> = recs().filter(|r| r.ok).map(|r| r.e2e).collect();
            want.sort_by(f64::total_cmp);
            let got = windows.arm_window(series, now, &arm, Slot::Current(10_000), range);
            assert_eq!(got, Some(want.as_slice()));
        }
    }
    let m = &windows.mirrors[&super::arm_key("m", "e2e")];
    assert_eq!(m.windows.len(), 2);
    assert!(m.windows.values().all(|w| w.rebuilds == 1 && !w.stale));
    // Records without an arm (a third of them) are not mirrored.
    let mirrored: usize = m.lines.values().map(|l| l.len()).sum();
    let with_arm = inputs
        .window("m", t0 + 199 * 250 - 10_000, i64::MAX)
        .filter(|r| !r.ab_group.is_empty())
        .count();
    assert_eq!(mirrored, with_arm);
}

#[test]
fn records_evicted_at_the_cap_leave_the_windows_and_a_model_that_comes_back_starts_afresh() {
    // A budget of 8: between two prunes, a quarter more (10) are kept before the oldest go.
    let mut inputs = Inputs::new(600_000, 8);
    let mut windows = LatencyWindows::default();
    let series = ("m", "e2e", "e2e");
    let now = 1_700_000_000_000;
    let push = |inputs: &mut Inputs, at: i64, e2e: f64| {
        inputs.ingest(Rec {
            model: "m".into(),
            instance: "a:1".into(),
            at_ms: at,
            e2e,
            ok: true,
            ..Rec::default()
        })
    };
    let read = |windows: &mut LatencyWindows, inputs: &Inputs, now: i64| {
        assert!(windows.sync(inputs, series, 60_000, now));
        let range = (now - 10_000, now);
        let got = windows
            .window(series, now, Some("a:1"), Slot::Current(10_000), range)
            .map(|v| v.to_vec());
        assert_eq!(got, Some(naive(inputs, series, Some("a:1"), range)));
        got.unwrap_or_default()
    };
    for k in 0..10 {
        push(&mut inputs, now - 5_000 + k, k as f64);
    }
    assert_eq!(read(&mut windows, &inputs, now).len(), 10);
    // Five more, late (known inside the window): the five oldest pushed are evicted.
    for k in 0..5 {
        push(&mut inputs, now - 9_000 + k, 100.0 + k as f64);
    }
    let v = read(&mut windows, &inputs, now);
    assert_eq!(v.len(), 10);
    assert_eq!(v[0], 5.0, "the evicted values are gone: {v:?}");
    // The model goes (pruned) and comes back: its new queue is read from scratch.
    inputs.prune(now + 1_000_000);
    assert!(!windows.sync(&inputs, series, 60_000, now + 1_000_000));
    let later = now + 1_000_000;
    for k in 0..3 {
        push(&mut inputs, later - 100 + k, 7.0);
    }
    assert_eq!(read(&mut windows, &inputs, later), vec![7.0; 3]);
}

#[test]
fn kept_bytes_count_the_samples_the_windows_mirror() {
    let n: usize = 4096;
    let mut i = Inputs::new(3_600_000, 1_000_000);
    let mut lw = LatencyWindows::default();
    for t in 0..n as i64 {
        let mut r = rec("m", t, 1.0 + (t % 7) as f64, t % 5 != 0);
        r.ab_group = if t % 2 == 0 { "a" } else { "b" }.into();
        i.ingest(r);
    }
    let records = i.kept_bytes() + lw.bytes();
    assert!(records >= n * size_of::<Rec>());
    // A value per sample in the one window read on each mirror.
    let per = SAMPLE_BYTES + size_of::<f64>();
    println!("mirrored per record: {SAMPLE_BYTES} bytes + 8 per window holding it");
    let now = n as i64;
    let range = (now - 60_000, now);
    let ok = (0..n).filter(|t| t % 5 != 0).count();
    let series = ("m", "e2e", "e2e");
    {
        assert!(lw.sync(&i, series, 60_000, now));
        let all = lw.window(series, now, None, Slot::Current(60_000), range);
        // The successful records: 4 in 5.
        assert_eq!(all.map(<[f64]>::len), Some(ok));
    }
    let latency = (i.kept_bytes() + lw.bytes()) - records;
    assert!(
        latency >= ok * per && latency <= 2 * ok * per,
        "{latency} bytes for {ok} samples"
    );
    // The arms' mirror counts every record with an arm, failed ones too.
    {
        assert!(lw.sync_arms(&i, ("m", "e2e"), 60_000, now));
        for arm in ["a", "b"] {
            let v = lw.arm_window(("m", "e2e"), now, arm, Slot::Current(60_000), range);
            assert!(v.is_some_and(|v| !v.is_empty()));
        }
    }
    let arms = (i.kept_bytes() + lw.bytes()) - records - latency;
    let lines = n * SAMPLE_BYTES + ok * size_of::<f64>();
    assert!(
        arms >= lines && arms <= 2 * lines,
        "{arms} bytes for {n} records ({ok} with values)"
    );
    // The records go: their samples go with them.
    let later = now + 10_000_000;
    i.prune(later);
    assert!(!lw.sync(&i, series, 60_000, later));
    let arms = ("m", "e2e");
    assert!(!lw.sync_arms(&i, arms, 60_000, later));
    assert_eq!(i.kept_bytes() + lw.bytes(), 0);
}

#[test]
fn past_the_budget_old_records_are_thinned_to_a_uniform_sample_over_the_whole_retention() {
    // 200 requests/s for 40 minutes against a budget of 20,000 and 35 minutes' retention
    // (the drift rules' 7 windows of 5 minutes): the e2e of a request is its minute.
    let (retention, budget) = (35 * 60_000, 20_000);
    let mut i = Inputs::new(retention, budget);
    let mut lw = LatencyWindows::default();
    let series = ("m", "e2e", "e2e");
    let (t0, end) = (1_700_000_000_000i64, 40 * 60_000);
    let mut most = 0;
    for t in (0..end).step_by(5) {
        let mut r = rec("m", t0 + t, 1.0, t % 50 != 0);
        r.e2e = (t / 60_000) as f64;
        i.ingest(r);
        if t % 250 == 0 {
            i.prune(t0 + t);
            most = most.max(i.window("m", i64::MIN, i64::MAX).count());
            if t % 60_000 == 0 {
                // A latency rule reading 6 minutes keeps its mirror in step.
                assert!(lw.sync(&i, series, 360_000, t0 + t));
            }
        }
    }
    let now = t0 + end - 5;
    assert!(most <= budget + budget / 4, "kept up to {most}");
    assert_eq!(
        i.evicted_records(),
        0,
        "thinned, never evicted at a steady rate"
    );
    let dense = i.dense_ms("m").expect("thinned");
    assert!((2_000..60_000).contains(&dense), "dense span {dense} ms");
    // The dense span is read whole.
    let recent = i.window("m", now - dense / 2, now).count() as i64;
    assert!(
        (recent - dense / 2 / 5).abs() <= 1,
        "{recent} in {} ms",
        dense / 2
    );
    // The drift rules' reference (the six windows before the last) is a uniform sample of
    // its whole span: as many of each minute, within chance.
    let (from, to) = (now - retention, now - 5 * 60_000);
    let mut per_minute = BTreeMap::<i64, usize>::new();
    for r in i.window("m", from, to) {
        *per_minute.entry(r.e2e as i64).or_default() += 1;
    }
    let full: Vec<usize> = per_minute.values().copied().skip(1).take(28).collect();
    assert_eq!(full.len(), 28, "{per_minute:?}");
    let mean = full.iter().sum::<usize>() as f64 / full.len() as f64;
    assert!(mean >= 20.0, "{mean} a minute");
    for n in &full {
        assert!(
            (*n as f64 - mean).abs() < 5.0 * mean.sqrt() + 2.0,
            "{per_minute:?}"
        );
    }
    // The mirrored windows read what the records read, thinned the same way.
    assert!(lw.sync(&i, series, 360_000, now));
    for (slot, range) in [
        (Slot::Current(30_000), (now - 30_000, now)),
        (Slot::Baseline(300_000), (now - 330_000, now - 30_000)),
    ] {
        let mut want = values(i.window("m", range.0, range.1), "e2e");
        want.sort_by(f64::total_cmp);
        let got = lw
            .window(series, now, None, slot, range)
            .map(<[f64]>::to_vec);
        assert_eq!(got, Some(want), "{slot:?}");
    }
    // The mirror dropped what the records' thinning dropped.
    let kept_bytes = i.kept_bytes();
    assert!(
        kept_bytes < 3 * budget * size_of::<Rec>(),
        "{kept_bytes} bytes"
    );
}
