// Alert-quality benchmark (issue 9): labelled scenarios on a simulated fleet — model A on 4
// instances, model B on 2, all behind one pooling tokenwatch proxy that also scrapes them, real
// Alertmanager grouping by incident — under heavy-tailed, swinging, drifting load. Scores recall
// (alert naming model + instance), time to detect (and minus `for`), false alerts per hour,
// Alertmanager groups per incident and top-1 root cause; prints the table and writes it into
// BENCHMARKS.md (section "## Alert quality", between markers).
//
// Run: `cargo bench -p tokenwatch --bench alert_quality` (~39 min) or with `-- --quick` (~31 min).
// Needs /usr/bin/prometheus-alertmanager (Debian's `prometheus-alertmanager`). Environment:
// ALERT_QUALITY_QUICK=1 (same as --quick), ALERT_QUALITY_SCENARIOS=healthy,error_burst,…
// (names: healthy, latency_spike, error_burst, length_blowup, gpu_leak, leak_then_latency),
// ALERT_QUALITY_HEALTHY_SECS, ALERT_QUALITY_RPS [14] mean requests/s, ALERT_QUALITY_SEED [7],
// ALERT_QUALITY_OUT [BENCHMARKS.md at the workspace root; `-` prints only].
//
// `-- --random` (issue 27, item 5) instead runs the randomised scenarios: three fleets drawn from
// ALERT_QUALITY_SEED, one per topology (a route per instance, replicas behind one Service,
// collector-only), side by side, each with ALERT_QUALITY_RANDOM_FAULTS [3] faults of drawn kind,
// size and replica after ALERT_QUALITY_WARMUP_SECS [2220] s of clean traffic on the default
// rules (the replica tests' baselines need 30 min ending 5 min ago), ALERT_QUALITY_FAULT_SECS
// [240] s each, ALERT_QUALITY_GAP_SECS [180] s apart; scored against the optimal CUSUM's delay
// computed from the replicas' own metrics. Writes the section "## Alert quality across
// topologies" (~70 min).

#[path = "alert_quality/mod.rs"]
mod harness;

use harness::fleet::{FleetSpec, Topology};
use harness::load::LoadSpec;
use harness::random::{self, Phases};
use harness::scenario::{self, Timing};
use harness::score;

const MODEL_A: &str = "model-a";
const MODEL_B: &str = "model-b";
const HEADING: &str = "## Alert quality\n";
const START: &str = "<!-- alert-quality:start -->";
const END: &str = "<!-- alert-quality:end -->";
const RANDOM_HEADING: &str = "## Alert quality across topologies\n";
const RANDOM_START: &str = "<!-- alert-quality-random:start -->";
const RANDOM_END: &str = "<!-- alert-quality-random:end -->";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        _ => default,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; anything else but `--quick` is a mistake worth naming.
    let mut quick = env_or("ALERT_QUALITY_QUICK", 0u8) == 1;
    let mut randomised = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--quick" => quick = true,
            "--random" => randomised = true,
            "--bench" => {}
            other => panic!(
                "unknown argument {other:?}; allowed: --quick, --random (and the environment, see the file header)"
            ),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if randomised {
        rt.block_on(run_random());
    } else {
        rt.block_on(run(quick));
    }
}

fn out_path() -> Option<std::path::PathBuf> {
    let out = std::env::var("ALERT_QUALITY_OUT")
        .unwrap_or_else(|_| format!("{}/../../BENCHMARKS.md", env!("CARGO_MANIFEST_DIR")));
    (out != "-").then(|| out.into())
}

fn three(l: &str) -> String {
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

async fn run_random() {
    let seed: u64 = env_or("ALERT_QUALITY_SEED", 27);
    let phases = Phases {
        warmup_s: env_or("ALERT_QUALITY_WARMUP_SECS", 2220),
        fault_s: env_or("ALERT_QUALITY_FAULT_SECS", 240),
        gap_s: env_or("ALERT_QUALITY_GAP_SECS", 180),
        faults: env_or("ALERT_QUALITY_RANDOM_FAULTS", 3),
        tail_s: 60,
    };
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut tasks = Vec::new();
    for (i, topology) in Topology::ALL.into_iter().enumerate() {
        let drawn = random::draw(seed.wrapping_add(i as u64), topology, phases);
        let mut layout: Vec<String> = Vec::new();
        for m in drawn.fleet.models() {
            let n = drawn
                .fleet
                .instances
                .iter()
                .filter(|s| s.model == m)
                .count();
            layout.push(format!("{n} × {m}"));
        }
        let rps: f64 = drawn.model_rps.iter().map(|(_, r)| r).sum();
        let fleet = format!(
            "{}; scrape {} s; {rps:.1} req/s",
            layout.join(", "),
            drawn.fleet.scrape_interval_s
        );
        eprintln!(
            "alert_quality --random: {} — {fleet}; faults: {}",
            topology.name(),
            drawn
                .scenario
                .faults
                .iter()
                .map(|f| format!("{} on {} at {} s", f.specs[0], f.instance, f.start_s))
                .collect::<Vec<_>>()
                .join(", ")
        );
        tasks.push(tokio::spawn(async move {
            let outcome = scenario::run(&drawn.scenario, &drawn.fleet, &drawn.load)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let s = score::score(&outcome);
            eprintln!(
                "alert_quality --random: {}: {} false alert(s); load: {}",
                topology.name(),
                s.false_alerts.len(),
                s.load
            );
            score::RandomRun {
                topology: topology.name().to_string(),
                fleet,
                score: s,
            }
        }));
    }
    let mut runs = Vec::new();
    for t in tasks {
        runs.push(t.await.expect("a topology's run panicked"));
    }
    let load_end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let table = score::random_markdown(&runs);
    let section = format!(
        "{RANDOM_HEADING}\n{RANDOM_START}\n`cargo bench -p tokenwatch --bench alert_quality -- --random` \
         (seed {seed}) — {}, load average {} → {}.\n\n\
         Three fleets drawn from the seed, one per topology, run side by side on the default rules: \
         one route per instance (the proxy names each), replicas behind one load balancer (a \
         replica drawn at random per request, as an Ingress or mesh does; the proxy sees one \
         upstream per model), and collector-only (clients call replicas directly; tokenwatch only \
         scrapes). Each fleet: 1–2 models on 2–4 simulator replicas of random speed and drift, a \
         scrape interval from {{1, 2, 5, 10, 15, 30}} s, 2–16 req/s of heavy-tailed, swinging \
         traffic. After {} s of clean traffic, {} faults of {} s, {} s apart, each on a replica \
         drawn at random, of a drawn kind and size: a slow tail (×3–×10 on 5–30 % of requests), \
         errors (5–50 %), a slower replica (×1.8–×3 on every request), a GPU leak (10–200 MiB/s). \
         A fault is paged when a critical alert names its model and replica; the bound is the \
         optimal CUSUM's delay at the same budget (one false page per model per 30 days) for the \
         best statistic that sees the fault — error rate, share beyond 6 × the healthy median, the \
         per-minute median against the peers', GPU memory growth — computed from what the replica's \
         own /metrics recorded, plus one scrape interval. A false alert is any alert (page or \
         ticket) that matches no fault; the warm-ups are the healthy traffic.\n\n{table}{RANDOM_END}\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        three(&load_start),
        three(&load_end),
        phases.warmup_s,
        phases.faults,
        phases.fault_s,
        phases.gap_s,
    );
    println!("{section}");
    if let Some(out) = out_path() {
        write_section(&out, &section, RANDOM_HEADING, RANDOM_END);
        eprintln!("alert_quality: written to {}", out.display());
    }
}

async fn run(quick: bool) {
    let mut timing = if quick {
        Timing::quick()
    } else {
        Timing::full()
    };
    timing.healthy_s = env_or("ALERT_QUALITY_HEALTHY_SECS", timing.healthy_s);
    let rps: f64 = env_or("ALERT_QUALITY_RPS", 14.0);
    let seed: u64 = env_or("ALERT_QUALITY_SEED", 7);
    let mut scenarios = scenario::catalogue(timing, MODEL_A, MODEL_B);
    let all: Vec<String> = scenarios.iter().map(|s| s.name.clone()).collect();
    if let Ok(list) = std::env::var("ALERT_QUALITY_SCENARIOS") {
        let wanted: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        for w in &wanted {
            assert!(
                all.iter().any(|a| a == w),
                "ALERT_QUALITY_SCENARIOS: unknown scenario {w:?}; known: {}",
                all.join(", ")
            );
        }
        scenarios.retain(|s| wanted.contains(&s.name.as_str()));
    }
    let fleet = FleetSpec::new(&[(MODEL_A, 4), (MODEL_B, 2)], seed);
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut scores = Vec::new();
    for (i, sc) in scenarios.iter().enumerate() {
        let minutes = sc.duration_s as f64 / 60.0;
        eprintln!(
            "alert_quality: scenario {} ({minutes:.1} min, {} fault(s))",
            sc.name,
            sc.faults.len()
        );
        let load = LoadSpec::heavy(
            &[(MODEL_A, 0.65), (MODEL_B, 0.35)],
            rps,
            seed.wrapping_add(i as u64),
        );
        let outcome = scenario::run(sc, &fleet, &load)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let s = score::score(&outcome);
        eprintln!(
            "alert_quality: {}: {} false alert(s); load: {}",
            s.name,
            s.false_alerts.len(),
            s.load
        );
        scores.push(s);
    }
    let load_end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let table = score::markdown(&scores);
    let command = format!(
        "cargo bench -p tokenwatch --bench alert_quality{}{}",
        if quick { " -- --quick" } else { "" },
        std::env::var("ALERT_QUALITY_SCENARIOS")
            .map(|s| format!(" (ALERT_QUALITY_SCENARIOS={s})"))
            .unwrap_or_default()
    );
    let section = format!(
        "## Alert quality\n\n{START}\n`{command}` — {}, load average {} → {}.\n\n\
         Fleet: `{MODEL_A}` on 4 simulator instances, `{MODEL_B}` on 2 (each with its own speed ±20 % and a slow \
         drift of ±15 % around it, main period 4–7 min per instance), one tokenwatch proxying them as pools (fewest in flight) and scraping each every second, the \
         default rules, Alertmanager grouping by `incident_id`. Load: Poisson arrivals, mean {rps} req/s \
         swinging ±40 % (sinusoid + random walk), log-normal prompts (median 180 tokens, 4 % Pareto tail \
         up to 6,000) and max_tokens (median 160), model mix drifting ±10 %. Each scenario starts a \
         fresh fleet; faults are switched on one instance after {} s of clean traffic, for {} s. A \
         fault counts as caught when a firing alert names its model and instance within its window \
         (+{} s); \"time to detect\" is fault start → firing, in brackets fault start → pending \
         (i.e. without `for`); a false alert is a firing alert that matches no fault.\n\n{table}{END}\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        three(&load_start),
        three(&load_end),
        timing.warmup_s,
        timing.fault_s,
        timing.tail_s,
    );
    println!("{section}");
    if let Some(out) = out_path() {
        write_section(&out, &section, HEADING, END);
        eprintln!("alert_quality: written to {}", out.display());
    }
}

/// Replace a section (from its heading to its end marker) or append it.
fn write_section(path: &std::path::Path, section: &str, heading: &str, end: &str) {
    let old =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let new = match (old.find(heading), old.find(end)) {
        (Some(a), Some(b)) if b > a => {
            let rest = old[b + end.len()..].trim_start_matches('\n');
            format!(
                "{}{section}{}{rest}",
                &old[..a],
                if rest.is_empty() { "" } else { "\n" }
            )
        }
        _ => format!(
            "{}\n{}",
            old.trim_end_matches('\n').to_string() + "\n",
            section
        ),
    };
    std::fs::write(path, new).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
