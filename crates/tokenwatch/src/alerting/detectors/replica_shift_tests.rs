// `replica_shift` against a randomised fleet: topologies (1–4 replicas of a model, one model or
// two), request rates, scrape intervals 1–30 s, heavy-tailed, swinging, drifting healthy latency
// with batch hiccups and clumped errors; faults drawn down to the small ones of issue 27. Scores
// false alarms on healthy traffic and detection delay against the optimal CUSUM's bound.

use super::*;
use crate::alerting::rules::{AlertingConfig, Rule, compile};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokenwatch_core::signals::SignalBoard;

const T0: i64 = 1_800_000_000_000;
const HOUR_MS: i64 = 3_600_000;

/// vLLM's default buckets (as the simulator and vLLM export them).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A fault on some replicas from `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fault {
    /// TTFT and ITL × `factor` on `share` of requests.
    Latency { factor: f64, share: f64 },
    /// `rate` of requests fail.
    Errors { rate: f64 },
}

#[derive(Debug, Clone)]
struct Replica {
    name: String,
    model: String,
    /// Mean requests per second.
    rate: f64,
    ttft_median: f64,
    itl_median: f64,
    error_rate: f64,
    scrape_ms: i64,
    next_scrape: i64,
    last_scrape: i64,
    swing_period_ms: f64,
    swing_phase: f64,
    /// The replica's own slow speed drift (±10 %, as the simulator's `--speed-drift`): period
    /// and phase.
    drift_period_ms: f64,
    drift_phase: f64,
}

/// A healthy fleet with optional faults.
pub(crate) struct Fleet {
    rng: StdRng,
    replicas: Vec<Replica>,
    /// Load swing amplitude (rate × 1 ± this) and how strongly latency follows load.
    swing: f64,
    latency_per_load: f64,
    /// Latency drift per hour (relative).
    drift: f64,
    pub faults: Vec<(Vec<usize>, Fault, i64, i64)>,
    /// Healthy errors also come in clumps (about one failed batch of 1–3 every 100 s).
    pub clumps: bool,
}

pub(crate) struct Topology {
    pub models: usize,
    pub replicas_per_model: usize,
    pub rate: (f64, f64),
    pub scrape_s: (i64, i64),
}

impl Fleet {
    pub(crate) fn new(seed: u64, t: &Topology) -> Fleet {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut replicas = Vec::new();
        for m in 0..t.models {
            // Replicas of one model are alike but not equal (hardware, placement).
            let ttft = rng.random_range(0.05..0.6);
            let itl = rng.random_range(0.015..0.06);
            let rate = rng.random_range(t.rate.0..=t.rate.1);
            // Replicas behind one Service share the load's swings.
            let period = rng.random_range(10.0..40.0) * 60_000.0;
            let phase = rng.random_range(0.0..std::f64::consts::TAU);
            for r in 0..t.replicas_per_model {
                let scrape_ms = rng.random_range(t.scrape_s.0..=t.scrape_s.1) * 1000;
                replicas.push(Replica {
                    name: format!("10.0.{m}.{r}:8000"),
                    model: format!("model-{m}"),
                    rate: rate * rng.random_range(0.8..1.2),
                    ttft_median: ttft * rng.random_range(0.85..1.15),
                    itl_median: itl * rng.random_range(0.9..1.1),
                    error_rate: rng.random_range(0.0..0.003),
                    scrape_ms,
                    next_scrape: T0 + rng.random_range(0..scrape_ms),
                    last_scrape: T0,
                    swing_period_ms: period,
                    swing_phase: phase,
                    drift_period_ms: rng.random_range(5.0..15.0) * 60_000.0,
                    drift_phase: rng.random_range(0.0..std::f64::consts::TAU),
                });
            }
        }
        Fleet {
            swing: rng.random_range(0.0..0.6),
            latency_per_load: rng.random_range(0.0..1.0),
            drift: rng.random_range(-0.2..0.4),
            rng,
            replicas,
            faults: Vec::new(),
            clumps: true,
        }
    }

    pub(crate) fn replica_names(&self) -> Vec<(String, String)> {
        self.replicas
            .iter()
            .map(|r| (r.model.clone(), r.name.clone()))
            .collect()
    }

    fn normal(&mut self) -> f64 {
        let (u1, u2): (f64, f64) = (self.rng.random_range(1e-12..1.0), self.rng.random());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    fn poisson(&mut self, mean: f64) -> u64 {
        if mean > 40.0 {
            return (mean + mean.sqrt() * self.normal()).round().max(0.0) as u64;
        }
        let (l, mut k, mut p) = ((-mean).exp(), 0u64, 1.0);
        loop {
            p *= self.rng.random::<f64>();
            if p <= l {
                return k;
            }
            k += 1;
        }
    }

    /// Heavy-tailed latency around `median`: lognormal body, 1 % Pareto tail (α = 1.5).
    fn latency(&mut self, median: f64) -> f64 {
        let body = median * (0.5 * self.normal()).exp();
        if self.rng.random_bool(0.01) {
            body * self.rng.random_range(1e-9f64..1.0).powf(-1.0 / 1.5)
        } else {
            body
        }
    }

    fn active(&self, i: usize, at: i64) -> Option<Fault> {
        self.faults
            .iter()
            .find(|(rs, _, from, to)| rs.contains(&i) && at >= *from && at < *to)
            .map(|(_, f, _, _)| *f)
    }

    /// The scrapes due up to `until`, in time order.
    pub(crate) fn scrapes_until(&mut self, until: i64) -> Vec<ScrapeCounts> {
        let mut out = Vec::new();
        while let Some(i) = (0..self.replicas.len())
            .filter(|i| self.replicas[*i].next_scrape <= until)
            .min_by_key(|i| self.replicas[*i].next_scrape)
        {
            let c = self.scrape(i);
            out.push(c);
        }
        out
    }

    fn scrape(&mut self, i: usize) -> ScrapeCounts {
        let r = self.replicas[i].clone();
        let at = r.next_scrape;
        let interval = at - r.last_scrape;
        let mid = (at - interval / 2) as f64;
        let load =
            (std::f64::consts::TAU * (mid - T0 as f64) / r.swing_period_ms + r.swing_phase).sin();
        let rate = r.rate * (1.0 + self.swing * load);
        let own = 1.0
            + 0.1
                * (std::f64::consts::TAU * (mid - T0 as f64) / r.drift_period_ms + r.drift_phase)
                    .sin();
        let slow = (1.0 + self.latency_per_load * self.swing * (load + 1.0))
            * (1.0 + self.drift * (mid - T0 as f64) / HOUR_MS as f64).max(0.3)
            * own;
        let n = self.poisson(rate * interval as f64 / 1000.0);
        // Batch hiccups (a long prefill stalls the running batch), about one every 20 s, each
        // slowing the requests of a 2 s stretch together; error clumps (a failed batch) about one
        // every 100 s: events in time, whatever the scrape interval.
        let interval_s = interval as f64 / 1000.0;
        let hiccups = self.poisson(0.05 * interval_s) as f64;
        let in_hiccup = (hiccups * 2.0 / interval_s).min(1.0);
        let hiccup = self.rng.random_range(1.5..3.0);
        let fault = self.active(i, at);
        let (mut ttft, mut itl, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
        let mut failed = 0u64;
        let clumps = if self.clumps {
            self.poisson(0.01 * interval_s)
        } else {
            0
        };
        let clump: u64 = (0..clumps).map(|_| self.rng.random_range(1..=3u64)).sum();
        for _ in 0..n {
            let err = match fault {
                Some(Fault::Errors { rate }) => self.rng.random_bool(rate),
                _ => false,
            } || self.rng.random_bool(r.error_rate);
            if err {
                failed += 1;
                continue;
            }
            let mut factor = slow;
            if self.rng.random_bool(in_hiccup) {
                factor *= hiccup;
            }
            if let Some(Fault::Latency { factor: f, share }) = fault
                && self.rng.random_bool(share)
            {
                factor *= f;
            }
            let t = self.latency(r.ttft_median) * factor;
            let g = self.latency(r.itl_median) * factor;
            let tokens = self.rng.random_range(20..300u32);
            ttft.push(t);
            // A request's gaps are alike: its ITL observations come together.
            for _ in 0..tokens / 10 {
                itl.push(g * (0.2 * self.normal()).exp());
            }
            e2e.push(t + g * tokens as f64);
        }
        failed = (failed + clump).min(n);
        let r = &mut self.replicas[i];
        r.last_scrape = at;
        r.next_scrape = at + r.scrape_ms;
        ScrapeCounts {
            model_id: r.model.clone(),
            instance: r.name.clone(),
            runtime: "vllm".into(),
            at_unix_ms: at,
            interval_ms: interval,
            finished: Some(n as f64),
            failed: Some(failed as f64),
            prompt_tokens: None,
            output_tokens: None,
            latency: vec![
                ("ttft".into(), histogram(TTFT_BUCKETS, &ttft)),
                ("itl".into(), histogram(ITL_BUCKETS, &itl)),
                ("e2e".into(), histogram(E2E_BUCKETS, &e2e)),
            ],
        }
    }
}

fn histogram(bounds: &[f64], values: &[f64]) -> CumulativeHistogram {
    let mut b: Vec<f64> = bounds.to_vec();
    b.push(f64::INFINITY);
    let cumulative = b
        .iter()
        .map(|ub| values.iter().filter(|v| **v <= *ub).count() as f64)
        .collect();
    CumulativeHistogram {
        bounds: b,
        cumulative,
        sum: values.iter().sum(),
        count: values.len() as f64,
    }
}

/// One rule running both kinds of test (the default rule set splits them into
/// `replica_errors` and `replica_latency`, both critical), with the detector's defaults.
pub(crate) fn rule() -> Rule {
    rule_with("{}")
}

/// The same rule with `params` (a YAML mapping) overriding the detector's defaults.
fn rule_with(params: &str) -> Rule {
    let cfg: AlertingConfig = serde_saphyr::from_str(&format!(
        "default_rules: false\nrules: [{{name: replica_shift, detector: replica_shift, group_by: [model_id, instance], severity: critical, params: {params}}}]",
    ))
    .expect("config");
    compile(&cfg)
        .expect("the rule compiles")
        .into_iter()
        .next()
        .expect("one rule")
}

/// Runs the fleet from `from` to `to`, evaluating once a second; the events seen, with times.
pub(crate) fn run(
    fleet: &mut Fleet,
    rule: &mut Rule,
    board: &mut SignalBoard,
    from: i64,
    to: i64,
) -> Vec<(i64, AnomalyEvent)> {
    let inputs = crate::alerting::engine::inputs::Inputs::new(60_000, 1000);
    let windows = crate::alerting::engine::windows::SharedWindows::default();
    let mut out = Vec::new();
    let mut now = from;
    while now < to {
        now += 1000;
        for c in fleet.scrapes_until(now) {
            board.record_counts(c);
        }
        let cx = EvalCtx {
            splits: &Default::default(),
            actions: &crate::kernel::actions::NoActions,
            inputs: &inputs,
            windows: &windows,
            board,
            new_records: &[],
            spans: &[],
            semantic_drift_models: &Default::default(),
            now,
        };
        let spec = rule.spec.clone();
        for e in rule.compiled.evaluate(&spec, &cx) {
            out.push((now, e));
        }
    }
    out
}

fn topology(rng: &mut StdRng) -> Topology {
    Topology {
        models: rng.random_range(1..=2),
        replicas_per_model: rng.random_range(1..=4),
        rate: (1.0, 15.0),
        scrape_s: (1, 30),
    }
}

#[test]
fn hours_of_healthy_heavy_tailed_swinging_traffic_raise_nothing() {
    // 6 fleets × 2 h (warm-up included: a false alarm while learning counts too).
    let mut rng = StdRng::seed_from_u64(27);
    for seed in 0..6u64 {
        let t = topology(&mut rng);
        let mut fleet = Fleet::new(seed, &t);
        let mut rule = rule();
        let mut board = SignalBoard::default();
        let events = run(&mut fleet, &mut rule, &mut board, T0, T0 + 2 * HOUR_MS);
        assert!(
            events.is_empty(),
            "seed {seed} ({} models × {} replicas, swing {:.2}, drift {:.2}): {:?}",
            t.models,
            t.replicas_per_model,
            fleet.swing,
            fleet.drift,
            events.first().map(|(at, e)| ((at - T0) / 1000, &e.summary))
        );
    }
}

/// The first event of `model` at or after `from` naming `instance` (any event with None).
fn first(
    events: &[(i64, AnomalyEvent)],
    model: &str,
    instance: Option<&str>,
    from: i64,
) -> Option<i64> {
    events
        .iter()
        .find(|(at, e)| {
            *at >= from
                && e.labels.get("model_id").map(String::as_str) == Some(model)
                && instance.is_none_or(|i| e.labels.get("instance").map(String::as_str) == Some(i))
        })
        .map(|(at, _)| *at)
}

/// What one fault scenario gave.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Seconds from the fault's start to the first event naming the replica (or the model).
    pub delay_s: Option<f64>,
    /// The optimal CUSUM's delay for the best of the detector's tests at the same false-alarm
    /// budget, plus one scrape interval (data arrive only at scrapes).
    pub bound_s: f64,
    pub before: Vec<String>,
    pub others: Vec<String>,
    pub late: Vec<String>,
    /// The first event that counted as the page, as text.
    pub paged_by: Option<String>,
}

pub(crate) struct Scenario {
    pub seed: u64,
    pub replicas: usize,
    pub rate: f64,
    pub scrape_s: i64,
    pub whole_model: bool,
    pub fault: Fault,
    pub fault_s: i64,
    /// Healthy errors come in clumps (failed batches) beside independent ones.
    pub clumps: bool,
    /// The rule's parameters over the detector's defaults (a YAML mapping).
    pub params: &'static str,
}

/// A fault on a fresh random fleet after 40 healthy minutes: when it was paged against the bound.
pub(crate) fn scenario(sc: &Scenario) -> Outcome {
    let t = Topology {
        models: 1,
        replicas_per_model: sc.replicas,
        rate: (sc.rate, sc.rate),
        scrape_s: (sc.scrape_s, sc.scrape_s),
    };
    let mut fleet = Fleet::new(sc.seed, &t);
    fleet.clumps = sc.clumps;
    let names = fleet.replica_names();
    let start = T0 + 40 * 60_000;
    let end = start + sc.fault_s * 1000;
    let faulty: Vec<usize> = if sc.whole_model {
        (0..sc.replicas).collect()
    } else {
        vec![0]
    };
    fleet.faults.push((faulty.clone(), sc.fault, start, end));
    let mut rule = rule_with(sc.params);
    let mut board = SignalBoard::default();
    let mut events = run(&mut fleet, &mut rule, &mut board, T0, start);
    let (model, instance) = names[0].clone();
    let series = (!sc.whole_model).then_some(instance.as_str());
    events.extend(run(
        &mut fleet,
        &mut rule,
        &mut board,
        start,
        end + 10 * 60_000,
    ));
    let detector = (rule.compiled.as_ref() as &dyn std::any::Any)
        .downcast_ref::<ReplicaShift>()
        .expect("replica_shift");
    // The optimal test's delay, for each of the detector's tests: the fault's true rate (its
    // whole minutes) against the healthy rate of the 30 minutes before, with the healthy
    // minutes' overdispersion (counts that vary more than a binomial's carry less evidence per
    // request: the optimal test at the same false-alarm rate needs proportionally more).
    let period_s = det::ReplicaShiftParams::default().false_page_days * 86_400.0;
    let mut bound_s = f64::INFINITY;
    for k in detector.test_keys(&model, series) {
        let minutes = detector.minute_counts(&model, series, &k);
        let healthy: Vec<&(i64, f64, f64)> = minutes
            .iter()
            .filter(|(m, _, _)| *m + MINUTE_MS <= start && *m >= start - 30 * 60_000)
            .collect();
        let faulted: Vec<&(i64, f64, f64)> = minutes
            .iter()
            .filter(|(m, _, _)| *m >= start && *m + MINUTE_MS <= end)
            .collect();
        let sum = |v: &[&(i64, f64, f64)]| {
            v.iter()
                .fold((0.0, 0.0), |(a, b), (_, n, x)| (a + n, b + x))
        };
        let ((n0, x0), (n1, x1)) = (sum(&healthy), sum(&faulted));
        if n0 <= 0.0 || n1 <= 0.0 {
            continue;
        }
        let (p0, p1) = ((x0 / n0).max(1e-4), x1 / n1);
        if p1 <= p0 {
            continue;
        }
        let mut blocks: BTreeMap<i64, Vec<(f64, f64)>> = BTreeMap::new();
        for (m, n, x) in &healthy {
            blocks
                .entry(m / (5 * MINUTE_MS))
                .or_default()
                .push((*n, *x));
        }
        let phi = seq::overdispersion(&blocks.into_values().collect::<Vec<_>>()).unwrap_or(1.0);
        let rate = n1 / (faulted.len() as f64 * 60.0);
        let h = seq::cusum_threshold(period_s, rate, 1);
        bound_s = bound_s.min(phi * seq::optimal_delay_samples(h, p1, p0) / rate);
    }
    // The location tests (a replica's median against its peers'): a Gaussian shift of δ
    // standard deviations per sample (the healthy samples' spread), KL δ²/2 per sample, each
    // sample's evidence complete at its end (so never under a sample). A sample is a slot, or
    // the slots pooled where one holds too few observations: the faulted samples' mean length.
    if let Some(instance) = series {
        let step_ms = detector.params.location_step_ms();
        for signal in &detector.params.signals {
            let samples = detector.slot_log_ratios(&model, instance, signal);
            let pick = |healthy: bool| -> Vec<(f64, usize)> {
                samples
                    .iter()
                    .filter(|(m, _, n)| {
                        let sample_end = *m + *n as i64 * step_ms;
                        if healthy {
                            sample_end <= start && *m >= start - 30 * 60_000
                        } else {
                            *m >= start && sample_end <= end
                        }
                    })
                    .map(|(_, r, n)| (*r, *n))
                    .collect()
            };
            let (healthy, faulted) = (pick(true), pick(false));
            let ratios = |v: &[(f64, usize)]| v.iter().map(|(r, _)| *r).collect::<Vec<f64>>();
            let (Some((mu, sd)), Some((shifted, _))) = (
                seq::mean_sd(&ratios(&healthy)),
                seq::mean_sd(&ratios(&faulted)),
            ) else {
                continue;
            };
            let slots = faulted.iter().map(|(_, n)| *n).sum::<usize>() as f64;
            let sample_s = detector.params.location_step_s * slots / faulted.len() as f64;
            let delta = (shifted - mu) / sd.max(MIN_LOG_RATIO_SPREAD);
            bound_s = bound_s.min(seq::location_delay_s(delta, sample_s, period_s));
        }
    }
    let bound_s = bound_s + sc.scrape_s as f64;
    let want = series;
    let delay_s = first(&events, &model, want, start).map(|at| (at - start) as f64 / 1000.0);
    let text = |v: Vec<&(i64, AnomalyEvent)>| {
        v.into_iter()
            .map(|(at, e)| format!("{} s: {}", (at - start) / 1000, e.summary))
            .collect::<Vec<_>>()
    };
    let paged_by = text(
        events
            .iter()
            .filter(|(at, e)| {
                *at >= start
                    && e.labels.get("model_id") == Some(&model)
                    && want.is_none_or(|i| e.labels.get("instance").map(String::as_str) == Some(i))
            })
            .take(1)
            .collect(),
    )
    .pop();
    Outcome {
        delay_s,
        bound_s,
        paged_by,
        before: text(events.iter().filter(|(at, _)| *at < start).collect()),
        others: text(
            events
                .iter()
                .filter(|(_, e)| {
                    !sc.whole_model && e.labels.get("instance").is_some_and(|i| *i != instance)
                })
                .collect(),
        ),
        // Ending an alarm takes evidence as raising it does (slowly at a few requests a second
        // with clumped errors): it must end within 8 minutes of the fault.
        late: text(
            events
                .iter()
                .filter(|(at, _)| *at > end + 8 * 60_000)
                .collect(),
        ),
    }
}

/// A fault from issue 27's table on a random fleet: paged within 2× the bound plus one scrape
/// interval (and `limit_s` where that is shorter), naming the replica (or the model), nothing on other replicas,
/// resolved within 8 minutes after it ends.
fn fault_is_paged(sc: Scenario, limit_s: f64) -> Outcome {
    let o = scenario(&sc);
    let (seed, fault) = (sc.seed, sc.fault);
    assert!(
        o.before.is_empty(),
        "seed {seed}: alarm before the fault: {:?}",
        o.before
    );
    let delay = o
        .delay_s
        .unwrap_or_else(|| panic!("seed {seed}: {fault:?} never paged: {o:?}"));
    // Within 2× the optimal test's delay, plus one scrape: no single scrape pages.
    let allowed = (2.0 * o.bound_s + sc.scrape_s as f64).max(limit_s);
    assert!(
        delay <= allowed,
        "seed {seed}: {fault:?} paged after {delay} s (bound {:.1} s, allowed {allowed:.0} s)",
        o.bound_s
    );
    assert!(
        o.others.is_empty(),
        "seed {seed}: a healthy replica was named: {:?}",
        o.others
    );
    assert!(
        o.late.is_empty(),
        "seed {seed}: still alarmed long after the fault ended: {:?}",
        o.late
    );
    o
}

fn replica_fault(seed: u64, scrape_s: i64, fault: Fault) -> Scenario {
    Scenario {
        seed,
        replicas: 2,
        rate: 3.0,
        scrape_s,
        whole_model: false,
        fault,
        fault_s: 360,
        clumps: true,
        params: "{}",
    }
}

#[test]
fn a_slowdown_on_a_tenth_of_one_replicas_requests_behind_one_service_is_paged() {
    // Issue 27, first row: ×8 on 10 % of one replica's requests, 2 replicas per model.
    for (seed, scrape_s) in [(1, 15), (2, 5), (3, 30)] {
        fault_is_paged(
            replica_fault(
                seed,
                scrape_s,
                Fault::Latency {
                    factor: 8.0,
                    share: 0.1,
                },
            ),
            60.0,
        );
    }
}

#[test]
fn a_replica_drifting_a_fifth_slower_than_its_peers_is_no_page() {
    // Every request of one replica 25 % slower for 10 minutes (a warmer GPU, a noisier
    // neighbour): its share beyond a bound set by its peers would rise several-fold (a steep
    // function of scale on a light-tailed body); its tail against its own median does not.
    for (seed, scrape_s) in [(11, 5), (12, 15), (13, 2)] {
        let sc = Scenario {
            replicas: 3,
            rate: 20.0,
            fault_s: 600,
            ..replica_fault(
                seed,
                scrape_s,
                Fault::Latency {
                    factor: 1.25,
                    share: 1.0,
                },
            )
        };
        let o = scenario(&sc);
        assert!(o.before.is_empty(), "seed {seed}: {:?}", o.before);
        assert!(
            o.delay_s.is_none() && o.others.is_empty(),
            "seed {seed}: a 25 % drift was alarmed: {o:?}"
        );
    }
}

/// Every request of one replica ×2 for 10 minutes (a throttled GPU).
fn every_request_twofold(seed: u64, scrape_s: i64) -> Scenario {
    Scenario {
        fault_s: 600,
        ..replica_fault(
            seed,
            scrape_s,
            Fault::Latency {
                factor: 2.0,
                share: 1.0,
            },
        )
    }
}

#[test]
fn a_replica_slowing_every_request_twofold_is_paged_by_its_median_against_its_peers() {
    // A throttled GPU: every request of one replica ×2. Its tail against its own median does not
    // move; its median against its peers' does.
    for (seed, scrape_s) in [(14, 5), (15, 15), (16, 30)] {
        let sc = Scenario {
            replicas: 3,
            rate: 10.0,
            ..every_request_twofold(seed, scrape_s)
        };
        let o = scenario(&sc);
        assert!(o.before.is_empty(), "seed {seed}: {:?}", o.before);
        assert!(o.others.is_empty(), "seed {seed}: {:?}", o.others);
        // Half-minute slots, each read 5 s after it ends; three of them at least (no single
        // slot, nor a minute, pages): with the slot the fault begins in, about two minutes.
        let delay = o.delay_s.unwrap_or(f64::INFINITY);
        assert!(delay <= 150.0, "seed {seed}: ×2 on every request: {o:?}");
        eprintln!(
            "seed {seed}, scrape {scrape_s} s: paged after {delay} s: {}",
            o.paged_by.as_deref().unwrap_or("")
        );
        assert!(o.late.is_empty(), "seed {seed}: {:?}", o.late);
    }
}

#[test]
fn a_replica_slowing_every_request_twofold_at_half_a_request_a_second_is_paged() {
    // Two replicas at 0.5 req/s (less in a load swing's trough): a half-minute slot holds ~15
    // first tokens, under the 25 a median needs, so slots are pooled until it has them (before
    // pooling this never paged). TTFT alone: one observation per request (ITL's per-token
    // counts would fill a slot). 16 fleets, scrapes every 2–30 s.
    let mut ratios = Vec::new();
    for seed in 30..46u64 {
        let scrape_s = [2, 5, 10, 15, 30][seed as usize % 5];
        let sc = Scenario {
            rate: 0.5,
            params: "{signals: [ttft]}",
            ..every_request_twofold(seed, scrape_s)
        };
        let o = scenario(&sc);
        assert!(o.before.is_empty(), "seed {seed}: {:?}", o.before);
        assert!(o.others.is_empty(), "seed {seed}: {:?}", o.others);
        // Ending takes evidence as raising does: a pooled sample a minute or more, so up to 10
        // minutes after the fault (8 at the usual rates).
        let last_s = |e: &String| e.split(' ').next().and_then(|s| s.parse::<i64>().ok());
        assert!(
            o.late
                .iter()
                .filter_map(last_s)
                .all(|t| t <= sc.fault_s + 600),
            "seed {seed}: still alarmed 10 minutes after the fault: {:?}",
            o.late.last()
        );
        // A pool of 2–4 slots; ×2 is about 3σ of a pooled sample's log ratio, so the optimal
        // test needs about three samples (the bound, from the samples the detector read), and
        // the pool the fault begins in is diluted: paged within the 10-minute fault, and within
        // 2.5× the bound at the median.
        let delay = o.delay_s.unwrap_or(f64::INFINITY);
        assert!(delay <= 400.0, "seed {seed}: ×2 at 0.5 req/s: {o:?}");
        eprintln!(
            "seed {seed}, scrape {scrape_s} s: paged after {delay} s, bound {:.0} s",
            o.bound_s
        );
        ratios.push(delay / o.bound_s);
    }
    ratios.sort_by(f64::total_cmp);
    assert!(ratios[ratios.len() / 2] <= 2.5, "delay / bound: {ratios:?}");
}

#[test]
fn twenty_percent_errors_on_one_replica_are_paged() {
    for (seed, scrape_s) in [(4, 15), (5, 1)] {
        fault_is_paged(
            replica_fault(seed, scrape_s, Fault::Errors { rate: 0.2 }),
            60.0,
        );
    }
}

#[test]
fn a_sustained_fault_on_a_slow_replica_is_one_alarm_until_it_ends() {
    // One request at a time (1.4 req/s, 1-s scrapes): the alarm once raised holds through the
    // fault's ordinary runs of good requests — it used to end and start again every minute or
    // so, each time a resolved and a new page — and ends within a few minutes after the fault.
    let t = Topology {
        models: 1,
        replicas_per_model: 2,
        rate: (1.4, 1.4),
        scrape_s: (1, 1),
    };
    for (seed, fault) in [
        (3, Fault::Errors { rate: 0.137 }),
        (4, Fault::Errors { rate: 0.137 }),
        (
            5,
            Fault::Latency {
                factor: 6.0,
                share: 0.2,
            },
        ),
    ] {
        let mut fleet = Fleet::new(seed, &t);
        let start = T0 + 40 * 60_000;
        let end = start + 600_000;
        fleet.faults.push((vec![0], fault, start, end));
        let mut rule = rule();
        let mut board = SignalBoard::default();
        let before = run(&mut fleet, &mut rule, &mut board, T0, start);
        assert!(before.is_empty(), "seed {seed}: {before:?}");
        let times: Vec<i64> = run(&mut fleet, &mut rule, &mut board, start, end + 600_000)
            .into_iter()
            .filter(|(_, e)| e.labels.get("instance").map(String::as_str) == Some("10.0.0.0:8000"))
            .map(|(at, _)| at)
            .collect();
        let (Some(first), Some(last)) = (times.first(), times.last()) else {
            panic!("seed {seed}: {fault:?} never alarmed");
        };
        let gaps: Vec<i64> = times
            .windows(2)
            .map(|w| w[1] - w[0])
            .filter(|g| *g > 1000)
            .collect();
        assert!(
            gaps.is_empty(),
            "seed {seed}: {fault:?} alarmed from +{} s with gaps {gaps:?} ms",
            (first - start) / 1000
        );
        assert!(
            *last >= end && *last - end <= 300_000,
            "seed {seed}: {fault:?} alarmed until +{} s of a fault ending at +600 s",
            (last - start) / 1000
        );
    }
}

#[test]
fn ten_percent_errors_on_a_whole_model_are_paged_not_ticketed() {
    // Issue 27: 10 % errors on one model at ~2 req/s, the bound ≈ 50 s, so ≤ 100 s — with
    // independent healthy errors (0.5 %) as the issue assumes …
    for (seed, scrape_s) in [(6, 15), (7, 10)] {
        let sc = Scenario {
            seed,
            replicas: 1,
            rate: 2.0,
            scrape_s,
            whole_model: true,
            fault: Fault::Errors { rate: 0.1 },
            fault_s: 360,
            clumps: false,
            params: "{}",
        };
        let o = fault_is_paged(sc, 100.0);
        assert!(o.delay_s.unwrap() <= 100.0, "{o:?}");
    }
    // … and within 2× the bound with clumped healthy errors (failed batches).
    let sc = Scenario {
        seed: 8,
        replicas: 2,
        rate: 2.0,
        scrape_s: 15,
        whole_model: true,
        fault: Fault::Errors { rate: 0.1 },
        fault_s: 600,
        clumps: true,
        params: "{}",
    };
    fault_is_paged(sc, 100.0);
}

#[test]
fn a_slowdown_on_six_percent_of_a_models_requests_is_paged() {
    for (seed, scrape_s) in [(8, 15), (9, 5)] {
        let sc = Scenario {
            seed,
            replicas: 2,
            rate: 3.0,
            scrape_s,
            whole_model: true,
            fault: Fault::Latency {
                factor: 6.0,
                share: 0.06,
            },
            fault_s: 600,
            clumps: true,
            params: "{}",
        };
        fault_is_paged(sc, 60.0);
    }
}

/// The power curves of issue 27: detection delay against effect size and request rate, for
/// `replica_shift` and for the optimal CUSUM's bound, over random fleets (scrape interval 1–30 s).
/// A benchmark, not a test: `cargo test --release -p tokenwatch --lib power_curves -- --ignored
/// --nocapture` (TW_POWER_SEEDS seeds per cell, default 3).
#[test]
#[ignore]
fn power_curves() {
    let seeds: u64 = knob("TW_POWER_SEEDS", 3);
    // TW_POWER_RUNS=1 prints every run (scrape interval, delay, bound, the paging event).
    let runs: u64 = knob("TW_POWER_RUNS", 0);
    // TW_POWER_ONLY="latency ×6 on 6%/one replica/2" runs only the cells whose name, place and
    // rate contain those parts (the seeds drawn stay those of the whole table).
    let only: Vec<String> = std::env::var("TW_POWER_ONLY")
        .map(|v| v.split('/').map(str::to_string).collect())
        .unwrap_or_default();
    let mut rng = StdRng::seed_from_u64(2027);
    let mut faults: Vec<(String, Fault)> = Vec::new();
    for rate in [0.02, 0.05, 0.1, 0.2, 0.5] {
        faults.push((
            format!("errors {:.0}%", rate * 100.0),
            Fault::Errors { rate },
        ));
    }
    for (factor, share) in [
        (2.0, 0.5),
        (2.0, 0.2),
        (4.0, 0.1),
        (6.0, 0.06),
        (8.0, 0.1),
        (10.0, 0.03),
        (10.0, 0.2),
        (2.0, 1.0),
    ] {
        faults.push((
            format!("latency ×{factor} on {:.0}%", share * 100.0),
            Fault::Latency { factor, share },
        ));
    }
    println!(
        "| fault | where | req/s per replica | runs | paged | median delay (s) | median bound (s) | median delay / bound | worst delay / bound |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut false_before = Vec::new();
    for (name, fault) in &faults {
        for whole_model in [false, true] {
            for rate in [0.5, 2.0, 10.0, 50.0] {
                let (mut ratios, mut delays, mut bounds, mut paged) =
                    (Vec::new(), Vec::new(), Vec::new(), 0);
                let place = if whole_model {
                    "whole model"
                } else {
                    "one replica"
                };
                let cell = [name.as_str(), place, &rate.to_string()];
                let wanted = only.iter().zip(cell).all(|(o, c)| c.contains(o.as_str()));
                for _ in 0..seeds {
                    let sc = Scenario {
                        seed: rng.random(),
                        replicas: rng.random_range(2..=4),
                        rate,
                        scrape_s: rng.random_range(1..=30),
                        whole_model,
                        fault: *fault,
                        fault_s: 900,
                        clumps: true,
                        params: "{}",
                    };
                    if !wanted {
                        continue;
                    }
                    let o = scenario(&sc);
                    if runs > 0 {
                        eprintln!(
                            "  {name} {} {rate} req/s, {} replicas, scrape {} s (seed {}): delay {:?} bound {:.0} by {:?}",
                            if whole_model { "model" } else { "replica" },
                            sc.replicas,
                            sc.scrape_s,
                            sc.seed,
                            o.delay_s.map(|d| d.round()),
                            o.bound_s,
                            o.paged_by
                        );
                    }
                    if let Some(first) = o.before.first() {
                        false_before.push(format!("{name}, {rate} req/s: {first}"));
                    }
                    bounds.push(o.bound_s);
                    if let Some(d) = o.delay_s {
                        paged += 1;
                        delays.push(d);
                        ratios.push(d / o.bound_s);
                    }
                }
                let median = |v: &mut Vec<f64>| {
                    v.sort_by(f64::total_cmp);
                    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
                };
                let worst = ratios.iter().copied().fold(f64::NAN, f64::max);
                if !wanted {
                    continue;
                }
                println!(
                    "| {name} | {place} | {rate} | {seeds} | {paged} | {:.0} | {:.0} | {:.2} | {:.2} |",
                    median(&mut delays),
                    median(&mut bounds),
                    median(&mut ratios),
                    worst
                );
            }
        }
    }
    println!(
        "\nruns with an alarm before their fault: {}",
        false_before.len()
    );
    for f in &false_before {
        println!("  {f}");
    }
}

/// A number from the environment (the benches' knobs), else `default`.
fn knob<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fleet of `healthy_hours`: 1–2 models of 1–4 replicas, up to 0.5, 2, 10 or 50 req/s per
/// replica (at least half that), scrape intervals 1–30 s.
fn healthy_topology(rng: &mut StdRng) -> (f64, Topology) {
    let rate = [0.5, 2.0, 10.0, 50.0][rng.random_range(0..4)];
    let t = Topology {
        models: rng.random_range(1..=2),
        replicas_per_model: rng.random_range(1..=4),
        rate: (rate * 0.5, rate),
        scrape_s: (1, 30),
    };
    (rate, t)
}

/// False pages on healthy traffic, the other half of the power curves: random fleets (1–2 models
/// of 1–4 replicas, 0.5–50 req/s per replica, scrape intervals 1–30 s), 2 h each. A benchmark:
/// `cargo test --release -p tokenwatch --lib healthy_hours -- --ignored --nocapture`
/// (TW_HEALTHY_FLEETS fleets, default 40).
#[test]
#[ignore]
fn healthy_hours() {
    let fleets: u64 = knob("TW_HEALTHY_FLEETS", 40);
    let mut rng = StdRng::seed_from_u64(4242);
    let (mut hours, mut model_hours, mut pages) = (0.0, 0.0, Vec::new());
    for seed in 0..fleets {
        let (rate, t) = healthy_topology(&mut rng);
        let mut fleet = Fleet::new(10_000 + seed, &t);
        let mut rule = rule();
        let mut board = SignalBoard::default();
        let events = run(&mut fleet, &mut rule, &mut board, T0, T0 + 2 * HOUR_MS);
        hours += 2.0;
        model_hours += 2.0 * t.models as f64;
        for (at, e) in events.iter().take(1) {
            pages.push(format!(
                "fleet {seed} ({} × {}, ≤ {rate} req/s) at {} s: {}",
                t.models,
                t.replicas_per_model,
                (at - T0) / 1000,
                e.summary
            ));
        }
    }
    println!(
        "{fleets} fleets, {hours} h of healthy traffic ({model_hours} model-hours): {} with a page",
        pages.len()
    );
    for p in &pages {
        println!("  {p}");
    }
}

/// Replays fleet TW_SEED of `healthy_hours` up to TW_AT seconds, then prints the tests whose
/// line holds TW_WHO (e.g. `10.0.1.0:8000 ITL`) every 20 s, with their last minutes' counts.
#[test]
#[ignore]
fn diagnose_bench_fleet() {
    let want: u64 = knob("TW_SEED", 7);
    let at: i64 = knob("TW_AT", 1200);
    let who = std::env::var("TW_WHO").unwrap_or_default();
    let mut rng = StdRng::seed_from_u64(4242);
    for seed in 0..=want {
        let (_, t) = healthy_topology(&mut rng);
        if seed < want {
            continue;
        }
        let mut fleet = Fleet::new(10_000 + seed, &t);
        println!(
            "{:?}",
            fleet
                .replicas
                .iter()
                .map(|r| (r.name.clone(), r.scrape_ms, r.rate))
                .collect::<Vec<_>>()
        );
        let mut rule = rule();
        let mut board = SignalBoard::default();
        let d = |rule: &Rule| {
            (rule.compiled.as_ref() as &dyn std::any::Any)
                .downcast_ref::<ReplicaShift>()
                .unwrap()
                .dump()
        };
        run(&mut fleet, &mut rule, &mut board, T0, T0 + at * 1000);
        for step in 0..6 {
            let from = T0 + at * 1000 + step * 20_000;
            let ev = run(&mut fleet, &mut rule, &mut board, from, from + 20_000);
            let dump = d(&rule);
            let lines: Vec<&str> = dump.lines().collect();
            println!("+{} events {}", at + (step + 1) * 20, ev.len());
            for (i, l) in lines.iter().enumerate() {
                if l.contains(&who) && !l.starts_with("    minutes") {
                    println!("{}\n{l}", lines[i - 1]);
                }
            }
        }
    }
}

/// Replays one power-curve run (TW_SEED, TW_REPLICAS, TW_RATE, TW_SCRAPE, TW_ERRORS: the error
/// rate of a fault on replica 0, or TW_SHARE × TW_FACTOR: a latency fault; TW_FAULT_S: how long
/// it lasts; TW_SECONDS) and prints, each second a scrape arrives after the fault starts, the
/// test lines holding TW_WHO with the events raised.
#[test]
#[ignore]
fn diagnose_fault_run() {
    let seed: u64 = knob("TW_SEED", 1);
    let replicas: usize = knob("TW_REPLICAS", 2);
    let rate: f64 = knob("TW_RATE", 10.0);
    let scrape_s: i64 = knob("TW_SCRAPE", 16);
    let errors: f64 = knob("TW_ERRORS", 0.5);
    // TW_SHARE (with TW_FACTOR, default 6): a latency fault on that share of requests instead.
    let share: f64 = knob("TW_SHARE", 0.0);
    let factor: f64 = knob("TW_FACTOR", 6.0);
    let fault = if share > 0.0 {
        Fault::Latency { factor, share }
    } else {
        Fault::Errors { rate: errors }
    };
    let who = std::env::var("TW_WHO").unwrap_or_else(|_| "failed".into());
    let t = Topology {
        models: 1,
        replicas_per_model: replicas,
        rate: (rate, rate),
        scrape_s: (scrape_s, scrape_s),
    };
    let mut fleet = Fleet::new(seed, &t);
    let start = T0 + 40 * 60_000;
    let fault_s: i64 = knob("TW_FAULT_S", 900);
    fleet
        .faults
        .push((vec![0], fault, start, start + fault_s * 1000));
    // TW_PARAMS: the rule's parameters over the defaults (a YAML mapping).
    let mut rule = rule_with(&std::env::var("TW_PARAMS").unwrap_or_else(|_| "{}".into()));
    let mut board = SignalBoard::default();
    run(&mut fleet, &mut rule, &mut board, T0, start);
    let d = |rule: &Rule| {
        (rule.compiled.as_ref() as &dyn std::any::Any)
            .downcast_ref::<ReplicaShift>()
            .unwrap()
            .dump()
    };
    let seconds: i64 = knob("TW_SECONDS", 120);
    for second in 1..=seconds {
        let from = start + (second - 1) * 1000;
        let ev = run(&mut fleet, &mut rule, &mut board, from, from + 1000);
        let dump = d(&rule);
        for l in dump.lines() {
            if l.contains(&who) && l.contains("10.0.0.0") {
                println!("+{second} s: {l}");
            }
        }
        for (_, e) in &ev {
            println!("+{second} s EVENT {}", e.summary);
        }
    }
}

/// The events after `start` of a rule whose replica tests cannot alarm (a replica's tail beyond
/// 10⁶ × its median, a location test designed for ×10⁶): only the model's own test speaks.
fn model_test_only(seed: u64, faulty: Vec<usize>, fault: Fault) -> Vec<AnomalyEvent> {
    let t = Topology {
        models: 1,
        replicas_per_model: 4,
        rate: (3.0, 3.0),
        scrape_s: (5, 5),
    };
    let mut fleet = Fleet::new(seed, &t);
    let start = T0 + 40 * 60_000;
    fleet.faults.push((faulty, fault, start, start + 600_000));
    let mut rule = rule_with("{own_multiple: 1000000, location_ratio: 1000000}");
    let mut board = SignalBoard::default();
    let before = run(&mut fleet, &mut rule, &mut board, T0, start);
    assert!(before.is_empty(), "seed {seed}: {before:?}");
    run(&mut fleet, &mut rule, &mut board, start, start + 600_000)
        .into_iter()
        .map(|(_, e)| e)
        .collect()
}

#[test]
fn a_model_alarm_carried_by_one_replica_names_that_replica_and_a_spread_one_names_none() {
    let slow = Fault::Latency {
        factor: 8.0,
        share: 0.2,
    };
    for seed in [51, 52, 53] {
        // One replica of four: the model's test alarms, and its alert names the replica for
        // the whole alarm (one label set).
        let events = model_test_only(seed, vec![0], slow);
        assert!(
            !events.is_empty(),
            "seed {seed}: the model test never alarmed"
        );
        for e in &events {
            assert_eq!(
                e.labels.get("instance").map(String::as_str),
                Some("10.0.0.0:8000"),
                "seed {seed}: {}",
                e.summary
            );
            assert!(
                e.summary
                    .starts_with("model-0, concentrated on replica 10.0.0.0:8000:"),
                "{}",
                e.summary
            );
        }
        // Every replica alike: the model as a whole, no replica named.
        let events = model_test_only(seed, vec![0, 1, 2, 3], slow);
        assert!(
            !events.is_empty(),
            "seed {seed}: the model test never alarmed"
        );
        for e in &events {
            assert!(
                e.labels.get("instance").is_none_or(String::is_empty),
                "seed {seed}: {}",
                e.summary
            );
            assert!(
                e.summary.starts_with("model-0 (all replicas)"),
                "{}",
                e.summary
            );
        }
    }
}

#[test]
fn a_median_inside_its_bucket_is_placed_geometrically_and_left_alone_where_it_cannot_be() {
    // Half-way through 0.1–0.4 by rank: 0.25 linearly, 0.2 geometrically.
    assert!((geometric_within_bucket(0.25, 0.1, 0.4) - 0.2).abs() < 1e-12);
    // The bounds stay the bounds.
    assert_eq!(geometric_within_bucket(0.1, 0.1, 0.4), 0.1);
    assert!((geometric_within_bucket(0.4, 0.1, 0.4) - 0.4).abs() < 1e-12);
    // A first bucket from 0 and an open last one keep the linear reading.
    assert_eq!(geometric_within_bucket(0.003, 0.0, 0.005), 0.003);
    assert_eq!(
        geometric_within_bucket(2560.0, 2560.0, f64::INFINITY),
        2560.0
    );
}

#[test]
fn a_model_alarm_waits_for_its_attribution_to_decide_but_no_longer_than_attribute_wait_s() {
    let p = det::ReplicaShiftParams::default();
    let wait_ms = (p.attribute_wait_s * 1000.0) as i64;
    // Undecided: no page until the wait is over, then the whole model's.
    let mut st = ModelState::default();
    assert!(!st.decide(Place::Undecided, 1_000, &p));
    assert!(!st.decide(Place::Undecided, 1_000 + wait_ms - 1, &p));
    assert_eq!(st.attributed, None);
    assert!(st.decide(Place::Undecided, 1_000 + wait_ms, &p));
    assert_eq!(st.attributed, Some(None));
    // Decided while waiting: the replica, at once.
    let mut st = ModelState::default();
    assert!(!st.decide(Place::Undecided, 1_000, &p));
    assert!(st.decide(Place::Replica("a".into()), 2_000, &p));
    assert_eq!(st.attributed, Some(Some("a".into())));
    // Spread: no wait at all.
    let mut st = ModelState::default();
    assert!(st.decide(Place::Spread, 1_000, &p));
    assert_eq!(st.attributed, Some(None));
}
