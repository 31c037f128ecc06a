// Engine-level tests of the latency and error-burst rules with the shipped defaults: hours of
// heavy-tailed, drifting, swinging healthy traffic on four instances raise nothing; a spike on
// one instance or an error burst alerts, named, within seconds (+ `for`).

use super::super::eval::EvalCtx;
use super::super::inputs::Inputs;
use super::super::lifecycle::{Timing, Tracked, Transition, fingerprint, group_labels};
use super::super::record::{Rec, first_token_at_ms};
use crate::alerting::rules::{AlertingConfig, Rule, compile};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::model::FirstToken;
use tokenwatch_core::signals::SignalBoard;

const RULES: &[&str] = &[
    "latency_spike",
    "absolute_latency",
    "context_aware_threshold",
    "error_burst",
];
const INSTANCES: &[&str] = &[
    "10.0.0.1:8000",
    "10.0.0.2:8000",
    "10.0.0.3:8000",
    "10.0.0.4:8000",
];
const T0: i64 = 1_700_000_000_000;
const MIN: i64 = 60_000;

/// A fault injected on some instances (empty: all) during `[from, to)` (ms after T0).
#[derive(Clone, Copy)]
enum Fault {
    Slow {
        factor: f64,
    },
    /// A share of the requests slowed (the simulator's `latency_spike:factor=…,share=…`).
    SlowShare {
        factor: f64,
        share: f64,
    },
    Errors {
        share: f64,
    },
}

struct Injected {
    fault: Fault,
    instances: &'static [&'static str],
    from: i64,
    to: i64,
}

/// The shipped rules, the engine's inputs and its lifecycle, stepped once a second.
struct Harness {
    rules: Vec<Rule>,
    inputs: Inputs,
    windows: crate::alerting::engine::windows::SharedWindows,
    board: SignalBoard,
    tracked: HashMap<String, Tracked>,
    /// Every event: (rule, labels, at).
    events: Vec<(String, BTreeMap<String, String>, i64)>,
    /// Alerts that fired: (rule, labels, fired at).
    fired: Vec<(String, BTreeMap<String, String>, i64)>,
    /// Every event in full (`Debug`), in order.
    detail: Vec<String>,
    rng: StdRng,
    /// Records generated but not known yet (they become known at arrival + end).
    pending: Vec<Rec>,
    /// First tokens of streamed requests not known yet (known at arrival + TTFT, as the
    /// proxy reports them).
    pending_first: Vec<FirstToken>,
    seq: u64,
}

impl Harness {
    fn new(seed: u64) -> Harness {
        Harness::with_budget(seed, 200_000)
    }

    /// With `budget` records kept before the older ones are thinned (`alerting.max_records`).
    fn with_budget(seed: u64, budget: usize) -> Harness {
        let rules: Vec<Rule> = compile(&AlertingConfig::default())
            .unwrap()
            .into_iter()
            .filter(|r| RULES.contains(&r.name.as_str()))
            .collect();
        assert_eq!(rules.len(), RULES.len());
        Harness {
            rules,
            inputs: Inputs::new(15 * MIN, budget),
            windows: Default::default(),
            board: SignalBoard::new(10, 10),
            tracked: HashMap::new(),
            events: Vec::new(),
            fired: Vec::new(),
            detail: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            pending: Vec::new(),
            pending_first: Vec::new(),
            seq: 0,
        }
    }

    /// One second of traffic starting at `t` (ms after T0): ~14 req/s ± 40 % (sinusoid, 7 min
    /// period), Poisson arrivals split over four instances, log-normal TTFT (σ 0.5) with a
    /// Pareto tail on 3 % of requests and a rare very slow one, each instance drifting slowly
    /// and differently, prompt lengths long-tailed, 0.3 % serving errors.
    fn traffic(&mut self, t: i64, faults: &[Injected]) {
        let secs = t as f64 / 1000.0;
        let load = 1.0 + 0.4 * (std::f64::consts::TAU * secs / 420.0).sin();
        for (k, inst) in INSTANCES.iter().enumerate() {
            let rate = 14.0 * load / INSTANCES.len() as f64;
            let n = poisson(&mut self.rng, rate);
            let phase = k as f64 * 1.7;
            let period = 2400.0 + 900.0 * k as f64;
            let drift = (1.0 + 0.15 * k as f64)
                * (1.0 + 0.3 * (std::f64::consts::TAU * secs / period + phase).sin());
            for _ in 0..n {
                let arrival = t + self.rng.random_range(0..1000);
                let z = normal(&mut self.rng);
                let mut ttft = 0.18 * drift * (1.0 + 0.25 * (load - 1.0)) * (0.5 * z).exp();
                if self.rng.random::<f64>() < 0.03 {
                    ttft *= self
                        .rng
                        .random::<f64>()
                        .max(1e-3)
                        .powf(-1.0 / 1.5)
                        .min(20.0);
                }
                if self.rng.random::<f64>() < 0.002 {
                    ttft *= 15.0;
                }
                let mut failed = self.rng.random::<f64>() < 0.003;
                for f in faults.iter().filter(|f| {
                    arrival >= f.from
                        && arrival < f.to
                        && (f.instances.is_empty() || f.instances.contains(inst))
                }) {
                    match f.fault {
                        Fault::Slow { factor } => ttft *= factor,
                        Fault::SlowShare { factor, share } => {
                            if self.rng.random::<f64>() < share {
                                ttft *= factor;
                            }
                        }
                        Fault::Errors { share } => failed |= self.rng.random::<f64>() < share,
                    }
                }
                let prompt = (300.0 * (0.8 * normal(&mut self.rng)).exp()).round() as u64;
                let output = 20 + self.rng.random_range(0..200u64);
                let e2e = if failed {
                    0.05 + ttft * 0.2
                } else {
                    ttft + output as f64 * 0.012
                };
                self.seq += 1;
                if !failed {
                    self.pending_first.push(FirstToken {
                        request_id: format!("r{}", self.seq),
                        model_id: "llama".into(),
                        instance: inst.to_string(),
                        arrival_unix_ms: T0 + arrival,
                        first_token_s: ttft,
                    });
                }
                self.pending.push(Rec {
                    model: "llama".into(),
                    instance: (*inst).into(),
                    request_id: format!("r{}", self.seq).into(),
                    at_ms: T0 + arrival + (e2e * 1000.0) as i64,
                    ttft: (!failed).then_some(ttft),
                    e2e,
                    itl: Some(0.012),
                    prompt_tokens: Some(prompt),
                    output_tokens: (!failed).then_some(output),
                    ok: !failed,
                    server_failure: failed,
                    finish_reason: if failed { "error" } else { "stop" }.into(),
                    ..Rec::default()
                });
            }
        }
    }

    /// Generate one second of traffic, feed what became known, evaluate and step the alerts.
    fn step(&mut self, t: i64, faults: &[Injected]) {
        self.traffic(t, faults);
        let now = T0 + t + 1000;
        let (known, later): (Vec<Rec>, Vec<Rec>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|r| r.at_ms <= now);
        self.pending = later;
        let (first, later): (Vec<FirstToken>, Vec<FirstToken>) =
            std::mem::take(&mut self.pending_first)
                .into_iter()
                .partition(|f| first_token_at_ms(f) <= now);
        self.pending_first = later;
        for f in &first {
            self.inputs.add_first_token(f);
        }
        for r in known {
            self.inputs.ingest(r);
        }
        self.inputs.prune(now);
        let empty = BTreeSet::new();
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
        let per_rule: Vec<Vec<AnomalyEvent>> =
            self.rules.iter_mut().map(|r| r.evaluate(&cx)).collect();
        for (i, events) in per_rule.into_iter().enumerate() {
            self.apply(i, events, now);
        }
    }

    /// As `Engine::apply`: the best event per group steps that group's alert.
    fn apply(&mut self, i: usize, events: Vec<AnomalyEvent>, now: i64) {
        let rule = &self.rules[i];
        let mut groups: BTreeMap<String, (BTreeMap<String, String>, AnomalyEvent)> =
            BTreeMap::new();
        for e in events {
            self.events.push((rule.name.clone(), e.labels.clone(), now));
            self.detail.push(format!("{} {e:?}", rule.name));
            let gl = group_labels(&e, &rule.group_by);
            let fp = fingerprint(&rule.name, &gl);
            if groups.get(&fp).is_none_or(|(_, b)| b.score < e.score) {
                groups.insert(fp, (gl, e));
            }
        }
        let timing = Timing {
            for_ms: rule.for_ms,
            resolve_after_ms: 30_000,
            clean_evaluations: 3,
            pending_grace_ms: AlertingConfig::default().pending_grace.0.as_millis() as i64,
        };
        let mut gone = Vec::new();
        for (fp, t) in self.tracked.iter_mut().filter(|(_, t)| t.rule_index == i) {
            let step = match groups.get(fp) {
                Some((_, e)) => t.step(Some(e), now, &timing),
                None => t.step(None, now, &timing),
            };
            match step {
                Some(Transition::Fired) => {
                    self.fired
                        .push((rule.name.clone(), t.alert.labels.clone(), now))
                }
                Some(Transition::Resolved | Transition::Dropped) => gone.push(fp.clone()),
                _ => {}
            }
        }
        for fp in gone {
            self.tracked.remove(&fp);
        }
        for (fp, (gl, e)) in groups {
            if self.tracked.contains_key(&fp) {
                continue;
            }
            let mut t = Tracked::new(
                &rule.name,
                i,
                rule.severity,
                rule.grade.clone(),
                gl,
                &e,
                now,
            );
            if t.step(Some(&e), now, &timing) == Some(Transition::Fired) {
                self.fired
                    .push((rule.name.clone(), t.alert.labels.clone(), now));
            }
            self.tracked.insert(fp, t);
        }
    }

    fn run(&mut self, from_s: i64, to_s: i64, faults: &[Injected]) {
        for s in from_s..to_s {
            self.step(s * 1000, faults);
        }
    }

    /// First event (ms after T0) of `rule` with exactly these instance labels ("" = the model).
    fn first_event(&self, rule: &str, instance: &str, after: i64) -> Option<i64> {
        self.events
            .iter()
            .filter(|(r, l, at)| r == rule && *at - T0 >= after && label(l) == instance)
            .map(|(_, _, at)| at - T0)
            .next()
    }

    fn first_fired(&self, rule: &str, instance: &str) -> Option<i64> {
        self.fired
            .iter()
            .filter(|(r, l, _)| r == rule && label(l) == instance)
            .map(|(_, _, at)| at - T0)
            .next()
    }

    /// The spike on `instance` was seen within `within` ms of `onset` and fired within that +
    /// its `for` (+ a little), and nothing else raised any event.
    fn assert_spike_named(&self, what: &str, instance: &str, onset: i64, within: i64) {
        let seen = self
            .first_event("latency_spike", instance, onset)
            .expect("an instance-level spike event");
        eprintln!("{what}: first event after {} ms", seen - onset);
        assert!(
            seen - onset <= within,
            "{what}: seen {} ms after the onset",
            seen - onset
        );
        let fired = self.first_fired("latency_spike", instance).expect("fired");
        let spike = self
            .rules
            .iter()
            .find(|r| r.name == "latency_spike")
            .unwrap();
        assert!(
            fired - onset <= within + spike.for_ms + 5_000,
            "{what}: fired {} ms after the onset (for {} ms)",
            fired - onset,
            spike.for_ms
        );
        for (r, l, at) in &self.events {
            assert!(
                label(l) == instance,
                "{r} event for {l:?} at {} s",
                (at - T0) / 1000
            );
        }
    }

    fn is_firing(&self, rule: &str, instance: &str) -> bool {
        self.tracked.values().any(|t| {
            t.alert.rule == rule
                && label(&t.alert.labels) == instance
                && t.alert.state == tokenwatch_core::alert::AlertState::Firing
        })
    }
}

fn label(l: &BTreeMap<String, String>) -> &str {
    l.get("instance").map_or("", String::as_str)
}

fn normal(rng: &mut StdRng) -> f64 {
    let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

fn poisson(rng: &mut StdRng, lambda: f64) -> u64 {
    let (limit, mut k, mut p) = ((-lambda).exp(), 0u64, 1.0);
    loop {
        p *= rng.random::<f64>();
        if p <= limit {
            return k;
        }
        k += 1;
    }
}

/// One hour of healthy traffic per seed (two seeds: two hours, in parallel).
fn healthy_hour(seed: u64) {
    healthy_hour_within(seed, 200_000);
}

/// One hour of healthy traffic, `budget` records kept.
fn healthy_hour_within(seed: u64, budget: usize) {
    {
        let mut h = Harness::with_budget(seed, budget);
        h.run(0, 60 * 60, &[]);
        let by_rule: BTreeMap<&str, usize> =
            h.events.iter().fold(BTreeMap::new(), |mut m, (r, _, _)| {
                *m.entry(r.as_str()).or_default() += 1;
                m
            });
        assert!(
            h.events.is_empty(),
            "seed {seed}: healthy traffic raised events {by_rule:?}, first: {:?}",
            h.events.iter().take(5).collect::<Vec<_>>()
        );
        assert!(h.fired.is_empty());
        let n = h
            .inputs
            .window("llama", T0 + 59 * MIN, T0 + 61 * MIN)
            .count();
        assert!(n > 200, "the last minutes hold traffic: {n}");
        if budget == THINNED {
            let dense = h.inputs.dense_ms("llama");
            eprintln!(
                "thinned: dense span {dense:?} ms, {} records thinned",
                h.inputs.thinned_records()
            );
            assert!(dense.is_some_and(|d| d < 5 * MIN) && h.inputs.thinned_records() > 10_000);
        }
    }
}

/// Budget for the thinned runs: at ≈ 14 requests/s and 15 minutes' retention the engine keeps
/// about a quarter of its records, the newest minute or so whole and the rest thinned, so the
/// latency spike's baseline and the error burst's usual rate read uniform samples.
const THINNED: usize = 3_000;

#[test]
fn an_hour_of_healthy_traffic_read_through_thinned_windows_raises_nothing() {
    healthy_hour_within(3, THINNED);
}

#[test]
fn a_five_fold_ttft_spike_on_one_instance_of_four_is_named_through_thinned_windows() {
    let h = five_fold_spike_on_one_instance_of_four(THINNED);
    let dense = h
        .inputs
        .dense_ms("llama")
        .expect("the records were thinned");
    assert!(dense < 5 * MIN, "dense span {dense} ms");
}

#[test]
fn an_hour_of_heavy_tailed_swinging_drifting_traffic_raises_no_latency_or_burst_event() {
    healthy_hour(1);
}

#[test]
fn another_hour_of_healthy_traffic_with_other_draws_raises_nothing_either() {
    healthy_hour(2);
}

#[test]
fn a_five_fold_ttft_spike_on_one_instance_of_four_alerts_naming_it() {
    five_fold_spike_on_one_instance_of_four(200_000);
}

/// Ten minutes of a ×5 TTFT on one instance of four, `budget` records kept: one alert naming
/// it, its condition held to the end, resolved after.
fn five_fold_spike_on_one_instance_of_four(budget: usize) -> Harness {
    let mut h = Harness::with_budget(7, budget);
    let onset = 20 * MIN;
    let faults = [Injected {
        fault: Fault::Slow { factor: 5.0 },
        instances: &["10.0.0.3:8000"],
        from: onset,
        to: onset + 10 * MIN,
    }];
    h.run(0, 34 * 60, &faults);
    h.assert_spike_named(
        "×5 spike on one instance of four",
        "10.0.0.3:8000",
        onset,
        10_000,
    );
    // The spike is not absorbed by its baseline: still one alert when the fault ends, resolved after.
    let spikes: Vec<_> = h
        .fired
        .iter()
        .filter(|(r, _, _)| r == "latency_spike")
        .collect();
    assert_eq!(spikes.len(), 1, "{spikes:?}");
    let last = h
        .events
        .iter()
        .filter(|(r, _, _)| r == "latency_spike")
        .map(|(_, _, at)| at - T0)
        .max()
        .unwrap();
    assert!(
        last >= onset + 10 * MIN - 5_000,
        "condition held to the end: {last}"
    );
    assert!(
        !h.is_firing("latency_spike", "10.0.0.3:8000"),
        "resolved after the fault"
    );
    h
}

#[test]
fn a_twenty_percent_error_burst_alerts_within_ten_seconds_for_the_model_and_an_instance() {
    twenty_percent_error_bursts(200_000);
}

#[test]
fn twenty_percent_error_bursts_are_paged_within_ten_seconds_through_thinned_windows() {
    twenty_percent_error_bursts(THINNED);
}

/// A 20 % error burst on the whole model, later one on one instance of four, `budget` records
/// kept: each alerts within 10 s, for the model and then the instance, and nothing else does.
fn twenty_percent_error_bursts(budget: usize) {
    let mut h = Harness::with_budget(11, budget);
    let (a, b) = (15 * MIN, 30 * MIN);
    let faults = [
        Injected {
            fault: Fault::Errors { share: 0.2 },
            instances: &[],
            from: a,
            to: a + 2 * MIN,
        },
        Injected {
            fault: Fault::Errors { share: 0.2 },
            instances: &["10.0.0.2:8000"],
            from: b,
            to: b + 2 * MIN,
        },
    ];
    h.run(0, 34 * 60, &faults);
    let model = h
        .first_fired("error_burst", "")
        .expect("model-level burst fired");
    eprintln!("20 % burst, whole model: fired after {} ms", model - a);
    assert!(
        (a..=a + 10_000).contains(&model),
        "model burst after {} ms",
        model - a
    );
    let inst = h
        .first_fired("error_burst", "10.0.0.2:8000")
        .expect("instance-level burst fired");
    eprintln!(
        "20 % burst, one instance of four: fired after {} ms",
        inst - b
    );
    assert!(
        (b..=b + 10_000).contains(&inst),
        "instance burst after {} ms",
        inst - b
    );
    // No burst event outside the two bursts (+ the window that still holds them), and during
    // the model-wide one no instance is singled out.
    for (r, l, at) in h.events.iter().filter(|(r, _, _)| r == "error_burst") {
        let t = at - T0;
        let in_a = (a..a + 2 * MIN + 61_000).contains(&t);
        let in_b = (b..b + 2 * MIN + 61_000).contains(&t);
        assert!(
            in_a && label(l).is_empty() || in_b && label(l) == "10.0.0.2:8000",
            "{r} {l:?} at {t}"
        );
    }
}

#[test]
fn ten_and_three_fold_spikes_on_single_instances_are_named_within_seconds() {
    let mut h = Harness::new(23);
    let (a, b) = (20 * MIN, 30 * MIN);
    let faults = [
        Injected {
            fault: Fault::Slow { factor: 10.0 },
            instances: &["10.0.0.1:8000"],
            from: a,
            to: a + 3 * MIN,
        },
        Injected {
            fault: Fault::Slow { factor: 3.0 },
            instances: &["10.0.0.4:8000"],
            from: b,
            to: b + 5 * MIN,
        },
    ];
    h.run(0, 36 * 60, &faults);
    let ten = h
        .first_event("latency_spike", "10.0.0.1:8000", a)
        .expect("×10 found");
    let three = h
        .first_event("latency_spike", "10.0.0.4:8000", b)
        .expect("×3 found");
    eprintln!(
        "×10 on one instance: first event after {} ms; ×3: after {} ms",
        ten - a,
        three - b
    );
    // A TTFT is known at the first token (as the proxy reports it), and this onset falls in a
    // load trough (~2.4 req/s on the instance): a few slow requests take a few seconds.
    assert!(ten - a <= 10_000, "×10 after {} ms", ten - a);
    // ×3 barely clears the spec's 2.5× ratio: its tail needs more slow requests to move.
    assert!(three - b <= 45_000, "×3 after {} ms", three - b);
    assert!(h.first_fired("latency_spike", "10.0.0.1:8000").is_some());
    assert!(h.first_fired("latency_spike", "10.0.0.4:8000").is_some());
    assert!(
        h.first_fired("latency_spike", "").is_none(),
        "the model itself stays quiet"
    );
}

#[test]
fn a_slow_third_on_one_instance_of_four_is_found_within_seconds_and_named() {
    // The alert-quality bench's latency fault: 30 % of one instance's requests ten times slower.
    let mut h = Harness::new(31);
    let onset = 20 * MIN;
    let faults = [Injected {
        fault: Fault::SlowShare {
            factor: 10.0,
            share: 0.3,
        },
        instances: &["10.0.0.2:8000"],
        from: onset,
        to: onset + 4 * MIN,
    }];
    h.run(0, 26 * 60, &faults);
    // The onset falls in a load trough: ~2.4 req/s on the instance, so ~0.7 slow requests a
    // second, the first known ~2 s in (at its slowed first token); the reference's own tail
    // holds ~1 % above the slow line, so about five slow requests make it significant.
    h.assert_spike_named(
        "×10 on 30 % of one instance",
        "10.0.0.2:8000",
        onset,
        15_000,
    );
}

/// The same traffic through the rules with their windows read incrementally and read from
/// the kept records every time: the same events, evidence and all.
fn same_events_both_ways(seed: u64, minutes: i64, faults: &[Injected]) {
    let run = |from_records: bool| {
        super::FROM_RECORDS.with(|f| f.set(from_records));
        let mut h = Harness::new(seed);
        h.run(0, minutes * 60, faults);
        super::FROM_RECORDS.with(|f| f.set(false));
        h
    };
    let (fresh, incremental) = (run(true), run(false));
    assert!(!fresh.detail.is_empty(), "the faults raised events");
    for (k, (a, b)) in fresh.detail.iter().zip(&incremental.detail).enumerate() {
        assert_eq!(a, b, "event {k}");
    }
    assert_eq!(fresh.detail.len(), incremental.detail.len());
    assert_eq!(fresh.fired, incremental.fired);
}

#[test]
fn incremental_windows_raise_exactly_the_events_of_a_fresh_read() {
    let slow = |factor, instances, from, minutes| Injected {
        fault: Fault::Slow { factor },
        instances,
        from,
        to: from + minutes * MIN,
    };
    same_events_both_ways(
        41,
        16,
        &[
            slow(6.0, &["10.0.0.3:8000"], 9 * MIN, 2),
            slow(4.0, &[], 12 * MIN, 1),
            Injected {
                fault: Fault::SlowShare {
                    factor: 10.0,
                    share: 0.3,
                },
                instances: &["10.0.0.1:8000"],
                from: 14 * MIN,
                to: 15 * MIN,
            },
            Injected {
                fault: Fault::Errors { share: 0.3 },
                instances: &["10.0.0.2:8000"],
                from: 10 * MIN,
                to: 11 * MIN,
            },
        ],
    );
}
