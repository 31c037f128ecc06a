// Randomised scenarios (issue 27, item 5): from a seed, a fleet in one of the three topologies
// (a route per instance, replicas behind one Service, collector-only), with its own replicas,
// speeds, drift, scrape interval (1–30 s) and request rate (heavy-tailed, swinging), then a run
// of faults, each on one replica drawn at random, of a kind and size drawn from ranges that reach
// down to the small faults of issue 27's table: a slow tail on 5–30 % of requests (×3–×10),
// 5–50 % errors, every request ×1.8–×3 slower, a GPU memory leak of 10–200 MiB/s.
// Nothing here is tuned to a detector: sizes are drawn, not picked.

use super::fleet::{FleetSpec, InstanceSpec, Topology};
use super::load::LoadSpec;
use super::scenario::{Fault, Scenario};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Scrape intervals drawn from (seconds).
pub const SCRAPE_INTERVALS: [u32; 6] = [1, 2, 5, 10, 15, 30];

/// How long each part of a randomised run lasts (seconds).
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    /// Clean traffic before the first fault: long enough for the default rules' baselines (the
    /// replica tests want 30 minutes ending 5 minutes ago).
    pub warmup_s: u64,
    pub fault_s: u64,
    /// Clean traffic between faults (and after the last).
    pub gap_s: u64,
    pub faults: usize,
    /// An alert firing this long after its fault ended still belongs to it.
    pub tail_s: u64,
}

#[derive(Debug, Clone)]
pub struct Drawn {
    pub fleet: FleetSpec,
    pub load: LoadSpec,
    pub scenario: Scenario,
    /// Mean requests per second of each model.
    pub model_rps: Vec<(String, f64)>,
}

fn log_uniform(rng: &mut StdRng, lo: f64, hi: f64) -> f64 {
    (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp()
}

/// One fault of a drawn kind and size: (simulator spec, detectors expected to catch it).
fn fault_kind(rng: &mut StdRng) -> (String, &'static [&'static str]) {
    const LATENCY: &[&str] = &["latency", "spike", "jitter", "slow"];
    match rng.random_range(0..4) {
        0 => (
            format!(
                "latency_spike:factor={:.1},share={:.3}",
                rng.random_range(3.0..10.0),
                log_uniform(rng, 0.05, 0.3)
            ),
            LATENCY,
        ),
        1 => (
            format!("error_burst:rate={:.3}", log_uniform(rng, 0.05, 0.5)),
            &["error", "burn"],
        ),
        2 => (
            format!(
                "latency_spike:factor={:.2},share=1",
                rng.random_range(1.8..3.0)
            ),
            LATENCY,
        ),
        _ => (
            format!(
                "kv_leak:blocks=1,mib_per_s={:.0}",
                log_uniform(rng, 10.0, 200.0)
            ),
            &["leak", "kv"],
        ),
    }
}

/// A fleet, its load and a run of faults, all drawn from `seed`.
pub fn draw(seed: u64, topology: Topology, p: Phases) -> Drawn {
    let mut rng = StdRng::seed_from_u64(seed);
    // One model on 2–4 replicas, half the time a second one on 2 (at most 5 simulators: three
    // such fleets run side by side on the benchmark's 2-core machine).
    let mut layout: Vec<(String, usize)> = vec![("model-a".into(), rng.random_range(2..=4))];
    if layout[0].1 < 4 && rng.random_bool(0.5) {
        layout.push(("model-b".into(), 2));
    }
    let mut instances = Vec::new();
    for (m, (model, n)) in layout.iter().enumerate() {
        let short = model.rsplit('-').next().unwrap_or(model);
        let ttft = rng.random_range(35.0..90.0);
        let itl = rng.random_range(6.0..16.0);
        for i in 0..*n {
            let speed = rng.random_range(0.8..1.2);
            instances.push(InstanceSpec {
                model: model.clone(),
                name: format!("{short}-{i}"),
                ttft_ms: ttft * speed,
                itl_ms: itl * speed,
                speed_drift: rng.random_range(0.0..0.15),
                speed_drift_period_s: rng.random_range(240.0..420.0),
                seed: seed.wrapping_mul(1000).wrapping_add((m * 100 + i) as u64),
            });
        }
    }
    let mut fleet = FleetSpec::new(&[], seed);
    fleet.topology = topology;
    fleet.instances = instances;
    fleet.scrape_interval_s = SCRAPE_INTERVALS[rng.random_range(0..SCRAPE_INTERVALS.len())];
    // 2–16 requests/s for the fleet (log-uniform), 70/30 when there are two models.
    let rps = log_uniform(&mut rng, 2.0, 16.0);
    let shares: Vec<(String, f64)> = if layout.len() == 2 {
        vec![("model-a".into(), 0.7), ("model-b".into(), 0.3)]
    } else {
        vec![("model-a".into(), 1.0)]
    };
    let share_refs: Vec<(&str, f64)> = shares.iter().map(|(m, s)| (m.as_str(), *s)).collect();
    let mut load = LoadSpec::heavy(&share_refs, rps, seed ^ 0x5eed);
    // Answers of ~100 tokens: streams of a second or two, as chat traffic is.
    load.max_tokens_median = 100.0;
    load.swing_period_s = rng.random_range(180.0..480.0);
    let mut faults = Vec::new();
    for k in 0..p.faults {
        let m = if layout.len() == 2 && rng.random_bool(0.3) {
            1
        } else {
            0
        };
        let model = layout[m].0.clone();
        let replicas: Vec<&InstanceSpec> = fleet
            .instances
            .iter()
            .filter(|i| i.model == model)
            .collect();
        let instance = replicas[rng.random_range(0..replicas.len())].name.clone();
        let (spec, expected) = fault_kind(&mut rng);
        faults.push(Fault {
            specs: vec![spec],
            model,
            instance,
            start_s: p.warmup_s + k as u64 * (p.fault_s + p.gap_s),
            duration_s: p.fault_s,
            expected: expected.iter().map(|s| s.to_string()).collect(),
            incident: k,
            root_cause: None,
        });
    }
    let topo = match topology {
        Topology::PerInstance => "per-instance",
        Topology::OneUpstream => "one-upstream",
        Topology::CollectorOnly => "collector-only",
    };
    Drawn {
        scenario: Scenario {
            name: format!("{topo} (seed {seed})"),
            duration_s: p.warmup_s + p.faults as u64 * (p.fault_s + p.gap_s),
            faults,
            tail_s: p.tail_s,
        },
        model_rps: shares.iter().map(|(m, s)| (m.clone(), rps * s)).collect(),
        fleet,
        load,
    }
}
