// Labelled scenarios: which fault goes on which instance when, what should catch it, and the
// runner that plays one scenario against a fresh fleet and returns what was observed.

use super::fleet::{Fleet, FleetSpec};
use super::load::{self, LoadSpec};
use super::observe::{self, Observed};
use super::procs::now_ms;
use super::truth;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::watch;

/// One injected fault and its label.
#[derive(Debug, Clone)]
pub struct Fault {
    /// The simulator fault, as `tokenwatch sim --fault` takes it; the first of `specs` that the
    /// simulator accepts is used (so a newer fault name can fall back to an older one).
    pub specs: Vec<String>,
    pub model: String,
    pub instance: String,
    /// Seconds after the scenario's start.
    pub start_s: u64,
    /// How long the fault stays on.
    pub duration_s: u64,
    /// Rules / detectors expected to catch it (substrings of the alert's rule or detector).
    pub expected: Vec<String>,
    /// Faults with the same incident number are one incident (cause and symptom).
    pub incident: usize,
    /// The detector expected as top-1 root cause of this fault's alerts (symptoms only).
    pub root_cause: Option<String>,
}

/// A fault as it actually ran.
#[derive(Debug, Clone)]
pub struct RanFault {
    pub fault: Fault,
    pub spec: String,
    pub start_ms: i64,
    pub end_ms: i64,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub duration_s: u64,
    pub faults: Vec<Fault>,
    /// An alert that starts firing this long after its fault ended still belongs to it.
    pub tail_s: u64,
}

pub struct Outcome {
    pub scenario: Scenario,
    pub start_ms: i64,
    pub end_ms: i64,
    pub faults: Vec<RanFault>,
    pub observed: Observed,
    pub load: String,
    /// Every replica's own /metrics over the run (the ground truth for the bound).
    pub truth: truth::Record,
    /// Per instance, the other replicas of its model.
    pub peers: BTreeMap<String, Vec<String>>,
    pub scrape_s: f64,
}

fn fault_name(spec: &str) -> &str {
    spec.split(':').next().unwrap_or(spec)
}

/// Play `sc` on a fresh fleet: load from the start, faults on and off as labelled.
pub async fn run(
    sc: &Scenario,
    fleet_spec: &FleetSpec,
    load_spec: &LoadSpec,
) -> Result<Outcome, String> {
    let fleet = Fleet::start(fleet_spec).await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let start_ms = now_ms();
    let stats = load::spawn(fleet.entry(), load_spec.clone(), stop_rx.clone());
    let observed = observe::spawn(
        fleet.api,
        fleet.am,
        Duration::from_millis(500),
        stop_rx.clone(),
    );
    let replicas: Vec<(String, std::net::SocketAddr)> = fleet
        .sims
        .iter()
        .map(|s| (s.spec.name.clone(), s.addr))
        .collect();
    let recorder = truth::spawn(replicas, Duration::from_secs(5), stop_rx);
    let at = |s: u64| start_ms + s as i64 * 1000;
    let mut events: Vec<(i64, bool, usize)> = Vec::new();
    for (i, f) in sc.faults.iter().enumerate() {
        events.push((at(f.start_s), true, i));
        events.push((at(f.start_s + f.duration_s), false, i));
    }
    events.sort();
    let mut ran: Vec<Option<RanFault>> = vec![None; sc.faults.len()];
    let mut failure = None;
    for (when, on, i) in events {
        let wait = when - now_ms();
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
        let f = &sc.faults[i];
        if on {
            let mut last = String::new();
            for spec in &f.specs {
                match fleet.enable_fault(&f.instance, spec).await {
                    Ok(()) => {
                        ran[i] = Some(RanFault {
                            fault: f.clone(),
                            spec: spec.clone(),
                            start_ms: now_ms(),
                            end_ms: 0,
                        });
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            if ran[i].is_none() {
                failure = Some(format!(
                    "no fault of {:?} could be enabled: {last}",
                    f.specs
                ));
                break;
            }
        } else if let Some(r) = ran[i].as_mut() {
            let name = fault_name(&r.spec).to_string();
            if let Err(e) = fleet.disable_fault(&f.instance, &name).await {
                failure = Some(e);
                break;
            }
            r.end_ms = now_ms();
        }
    }
    if failure.is_none() {
        let wait = at(sc.duration_s) - now_ms();
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
    }
    let _ = stop_tx.send(true);
    let end_ms = now_ms();
    observe::poll_once(fleet.api, fleet.am, &observed).await;
    let log = fleet.tokenwatch.log();
    let mut peers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in &fleet.sims {
        let others = fleet
            .sims
            .iter()
            .filter(|b| b.spec.model == a.spec.model && b.spec.name != a.spec.name)
            .map(|b| b.spec.name.clone())
            .collect();
        peers.insert(a.spec.name.clone(), others);
    }
    let routers: Vec<String> = fleet
        .routers
        .iter()
        .map(|(m, r)| format!("{m} Service: {}", r.line()))
        .collect();
    if let Some(e) = failure {
        return Err(format!("{}: {e}\n{}", sc.name, fleet.logs_tail(20)));
    }
    if log.contains("panicked") {
        return Err(format!("{}: tokenwatch panicked:\n{log}", sc.name));
    }
    Ok(Outcome {
        scenario: sc.clone(),
        start_ms,
        end_ms,
        faults: ran.into_iter().flatten().collect(),
        observed: observe::snapshot(&observed),
        load: if routers.is_empty() {
            stats.line()
        } else {
            format!("{}; {}", stats.line(), routers.join("; "))
        },
        truth: truth::copy(&recorder),
        peers,
        scrape_s: f64::from(fleet_spec.scrape_interval_s),
    })
}

/// Durations of the scenario set (seconds).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub healthy_s: u64,
    /// Clean traffic before the first fault (baselines fill).
    pub warmup_s: u64,
    /// How long each fault lasts: longer than the longest `for` of the rules expected to catch
    /// it (the L2 latency spike is sustained 2 min by the spec), or a fault cannot be caught.
    pub fault_s: u64,
    /// Clean traffic after the last fault.
    pub cooldown_s: u64,
    pub tail_s: u64,
}

impl Timing {
    pub fn full() -> Timing {
        Timing {
            healthy_s: 600,
            warmup_s: 150,
            fault_s: 180,
            cooldown_s: 60,
            tail_s: 60,
        }
    }

    pub fn quick() -> Timing {
        Timing {
            healthy_s: 180,
            // Past the length rule's 2 min window, so its reference (responses older than the
            // window) is there when the fault starts, as on any fleet running for minutes.
            warmup_s: 150,
            fault_s: 150,
            cooldown_s: 20,
            tail_s: 30,
        }
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The labelled scenario set. `a` is a model on several instances, `b` another model.
pub fn catalogue(t: Timing, a: &str, b: &str) -> Vec<Scenario> {
    let one =
        |name: &str, specs: &[&str], model: &str, instance: &str, expected: &[&str]| Scenario {
            name: name.into(),
            duration_s: t.warmup_s + t.fault_s + t.cooldown_s,
            tail_s: t.tail_s,
            faults: vec![Fault {
                specs: names(specs),
                model: model.into(),
                instance: instance.into(),
                start_s: t.warmup_s,
                duration_s: t.fault_s,
                expected: names(expected),
                incident: 0,
                root_cause: None,
            }],
        };
    let a1 = format!("{}-1", a.rsplit('-').next().unwrap_or(a));
    let a2 = format!("{}-2", a.rsplit('-').next().unwrap_or(a));
    let b1 = format!("{}-1", b.rsplit('-').next().unwrap_or(b));
    let leak_specs: &[&str] = &["gpu_leak", "kv_leak"];
    let leak_detectors: &[&str] = &["gpu_memory_leak", "kv_cache_pressure", "leak"];
    // Leak first; 45 s later the latency it causes (KV exhausted → queueing) is reinforced by
    // a latency spike on the same instance. One incident, cause = the leak.
    let lag = (t.fault_s / 2).max(30);
    let chain = Scenario {
        name: "leak_then_latency".into(),
        duration_s: t.warmup_s + lag + t.fault_s + t.cooldown_s,
        tail_s: t.tail_s,
        faults: vec![
            Fault {
                specs: names(leak_specs),
                model: a.into(),
                instance: a2.clone(),
                start_s: t.warmup_s,
                duration_s: lag + t.fault_s,
                expected: names(leak_detectors),
                incident: 0,
                root_cause: None,
            },
            Fault {
                specs: names(&["latency_spike:factor=8,share=0.5"]),
                model: a.into(),
                instance: a2.clone(),
                start_s: t.warmup_s + lag,
                duration_s: t.fault_s,
                expected: names(&["latency", "spike", "jitter"]),
                incident: 0,
                root_cause: Some("leak".into()),
            },
        ],
    };
    vec![
        Scenario {
            name: "healthy".into(),
            duration_s: t.healthy_s,
            tail_s: t.tail_s,
            faults: vec![],
        },
        one(
            "latency_spike",
            &["latency_spike:factor=10,share=0.3"],
            a,
            &a1,
            &["latency", "spike", "jitter"],
        ),
        one(
            "error_burst",
            &["error_burst:rate=0.4"],
            b,
            &b1,
            &["burn", "error"],
        ),
        one(
            "length_blowup",
            &["length_blowup:factor=4"],
            a,
            &a2,
            &["length"],
        ),
        one("gpu_leak", leak_specs, b, &b1, leak_detectors),
        chain,
    ]
}
