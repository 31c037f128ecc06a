// Alert-quality regression (issues 9 and 27): the benchmark's harness, short.
// - 90 s of heavy-tailed, swinging healthy traffic over 4 pooled instances must fire no alert;
//   then an error burst on one instance must fire an alert naming the model (and that instance,
//   when labelled) quickly.
// - The seeded subset of the randomised topologies: two replicas behind one Service (the proxy
//   sees one upstream) and two replicas with no proxy at all, side by side; a fault from issue
//   27's table on one replica of each must page naming that replica, within 2× the optimal
//   CUSUM's delay (from the replica's own metrics) plus a scrape, and nothing else may alert.

#[path = "../../../benches/alert_quality/mod.rs"]
mod harness;

use harness::fleet::{Fleet, FleetSpec, Topology};
use harness::load::{self, LoadSpec};
use harness::observe::{self, SeenAlert};
use harness::procs::now_ms;
use harness::truth;
use std::time::Duration;
use tokio::sync::watch;

const MODEL: &str = "model-a";
const HEALTHY_S: u64 = 90;
/// Fault start → condition holding (pending): the bound for error bursts.
const DETECT_S: f64 = 10.0;
/// Longest wait for the burst's alert to fire (detection plus the rule's `for`).
const FIRE_WAIT_S: u64 = 60;
const FAULT: &str = "error_burst:rate=0.8";
const FAULTY: &str = "a-1";

/// One line per alert; times in seconds after `t0_ms`.
fn describe(alerts: &[SeenAlert], t0_ms: i64) -> String {
    let s = |t: i64| (t - t0_ms) as f64 / 1000.0;
    alerts
        .iter()
        .map(|a| {
            format!(
                "  {} ({}) model={} instance={} pending at {:.1} s, firing at {:.1} s",
                a.rule,
                a.detector,
                a.model().unwrap_or("-"),
                a.instance().unwrap_or("-"),
                s(a.active_at_ms),
                s(a.fired_at_ms)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn healthy_traffic_is_quiet_and_an_error_burst_is_caught() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let spec = FleetSpec::new(&[(MODEL, 4)], 11);
        let fleet = Fleet::start(&spec).await;
        let mut load_spec = LoadSpec::heavy(&[(MODEL, 1.0)], 10.0, 5);
        // Shorter answers than the benchmark's, to stay light on a loaded 2-core box; the
        // shapes (swings, tails) stay the same.
        load_spec.max_tokens_median = 64.0;
        load_spec.swing_period_s = 60.0;
        let (stop_tx, stop_rx) = watch::channel(false);
        let start = now_ms();
        let stats = load::spawn(fleet.entry(), load_spec, stop_rx.clone());
        let seen = observe::spawn(fleet.api, fleet.am, Duration::from_millis(250), stop_rx);

        tokio::time::sleep(Duration::from_secs(HEALTHY_S)).await;
        observe::poll_once(fleet.api, fleet.am, &seen).await;
        let healthy: Vec<SeenAlert> = observe::snapshot(&seen).alerts.into_values().collect();
        let sent = stats.sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent as f64 >= HEALTHY_S as f64 * 10.0 * 0.5, "the load generator fell behind: {}", stats.line());
        assert!(
            healthy.is_empty(),
            "{} alert(s) fired on {HEALTHY_S} s of healthy traffic ({}; times after the start):\n{}\n{}",
            healthy.len(),
            stats.line(),
            describe(&healthy, start),
            fleet.logs_tail(5)
        );

        fleet.enable_fault(FAULTY, FAULT).await.expect("enable the error burst");
        let burst = now_ms();
        let deadline = burst + (DETECT_S as i64 + FIRE_WAIT_S as i64) * 1000;
        let caught = loop {
            let now: Vec<SeenAlert> = observe::snapshot(&seen).alerts.into_values().collect();
            let hit = now.iter().find(|a| {
                a.model() == Some(MODEL) && a.fired_at_ms >= burst && a.instance().is_none_or(|i| i == FAULTY)
            });
            if let Some(a) = hit {
                break Some(a.clone());
            }
            if now_ms() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let _ = stop_tx.send(true);
        let all: Vec<SeenAlert> = observe::snapshot(&seen).alerts.into_values().collect();
        let Some(alert) = caught else {
            panic!(
                "no alert naming {MODEL} fired within {} s of `{FAULT}` on {FAULTY} ({}); alerts (times after the burst):\n{}\n{}",
                DETECT_S as u64 + FIRE_WAIT_S,
                stats.line(),
                describe(&all, burst),
                fleet.logs_tail(5)
            );
        };
        let pending_after = (alert.active_at_ms - burst) as f64 / 1000.0;
        assert!(
            pending_after <= DETECT_S,
            "the burst's alert {} became pending {pending_after:.1} s after the fault started (bound {DETECT_S} s)",
            alert.rule
        );
        // Alerts naming another instance of the model would be false: only a-1 is broken.
        let wrong: Vec<SeenAlert> =
            all.into_iter().filter(|a| a.instance().is_some_and(|i| i != FAULTY)).collect();
        assert!(wrong.is_empty(), "alerts named healthy instances:\n{}", describe(&wrong, burst));
        eprintln!(
            "alert_quality: caught by {} (instance {:?}) pending after {pending_after:.1} s, firing after {:.1} s ({})",
            alert.rule,
            alert.instance(),
            (alert.fired_at_ms - burst) as f64 / 1000.0,
            stats.line()
        );
    });
}

/// The default rules, but for a test that cannot wait the production warm-up: the replica tests'
/// baseline needs 100 requests over a minute, ending a minute before the current one (not 200
/// over 30 minutes ending 5 minutes ago) — the guard keeps a fault's first minutes out of the
/// reference it is tested against.
const SHORT_BASELINES: &str = "  overrides:
    replica_errors:
      params: {tests: [errors], baseline_guard_s: 60, min_reference: 100, min_baseline_s: 60}
    replica_latency:
      params: {tests: [latency], baseline_guard_s: 60, min_reference: 100, min_baseline_s: 60}
";

struct Case {
    topology: Topology,
    fault: &'static str,
    faulty: &'static str,
    seed: u64,
    scrape_s: u32,
}

#[test]
fn a_fault_on_one_replica_behind_one_service_or_without_a_proxy_is_paged_naming_it() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Rows of issue 27's table: a fifth of one replica's requests failing behind one load
    // balancer (was paged after 109 s), and a GPU leak on one replica with no proxy at all (was
    // two incidents). A slow tail on a tenth of one replica's requests needs a longer reference
    // than a test can wait for under this mix (tests/replica_shift.rs pages it on lighter
    // traffic; the benchmark on half-hour baselines).
    let cases = [
        Case {
            topology: Topology::OneUpstream,
            fault: "error_burst:rate=0.2",
            faulty: "a-1",
            seed: 27,
            scrape_s: 2,
        },
        Case {
            topology: Topology::CollectorOnly,
            fault: "kv_leak:blocks=1,mib_per_s=50",
            faulty: "a-0",
            seed: 28,
            scrape_s: 5,
        },
    ];
    rt.block_on(async {
        let mut fleets = Vec::new();
        for c in &cases {
            let mut spec = FleetSpec::new(&[(MODEL, 2)], c.seed);
            spec.topology = c.topology;
            spec.scrape_interval_s = c.scrape_s;
            spec.alerting_extra = SHORT_BASELINES.into();
            fleets.push(Fleet::start(&spec).await);
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let start = now_ms();
        let mut runs = Vec::new();
        for (c, fleet) in cases.iter().zip(&fleets) {
            let mut load_spec = LoadSpec::heavy(&[(MODEL, 1.0)], 12.0, c.seed);
            load_spec.max_tokens_median = 48.0;
            load_spec.swing_period_s = 60.0;
            // Prompts of ordinary length: a minute's baseline of the heavy mix (a 4 % tail up
            // to 6,000 tokens) is too short to tell a slow tail from a long prompt; the
            // benchmark's 30-minute baselines carry the heavy mix.
            load_spec.prompt_sigma = 0.5;
            load_spec.prompt_tail.0 = 0.0;
            let stats = load::spawn(fleet.entry(), load_spec, stop_rx.clone());
            let seen = observe::spawn(fleet.api, fleet.am, Duration::from_millis(500), stop_rx.clone());
            let sims = fleet.sims.iter().map(|s| (s.spec.name.clone(), s.addr)).collect();
            let rec = truth::spawn(sims, Duration::from_secs(2), stop_rx.clone());
            runs.push((stats, seen, rec));
        }
        // The reference: the replicas' first two minutes (at least 80 s of them), complete a
        // minute before the fault's. With one minute (as few as 20 s of traffic) the error
        // test's reference is the upper confidence bound of a rate from ~100 requests — about
        // 6 %, so a 20 % burst gathers ~0.04 nats a request and paged after 46–67 s; two
        // minutes bring that to ~20 s. Production baselines are half an hour.
        let first_minute = (start + 20_000) / 60_000 * 60_000;
        let fault_at = first_minute + 3 * 60_000 + 5_000;
        tokio::time::sleep(Duration::from_millis((fault_at - now_ms()).max(0) as u64)).await;
        for ((c, fleet), (stats, seen, _)) in cases.iter().zip(&fleets).zip(&runs) {
            observe::poll_once(fleet.api, fleet.am, seen).await;
            let healthy: Vec<SeenAlert> = observe::snapshot(seen).alerts.into_values().collect();
            assert!(
                healthy.is_empty(),
                "{}: {} alert(s) on healthy traffic ({}):\n{}\n{}",
                c.topology.name(),
                healthy.len(),
                stats.line(),
                describe(&healthy, start),
                fleet.logs_tail(5)
            );
        }
        let mut injected = Vec::new();
        for (c, fleet) in cases.iter().zip(&fleets) {
            fleet.enable_fault(c.faulty, c.fault).await.expect("enable the fault");
            injected.push(now_ms());
        }
        // Wait for both pages (critical alerts naming the model and the replica), 150 s at most.
        let paged = |seen: &observe::Shared, c: &Case, from: i64| {
            observe::snapshot(seen).alerts.into_values().find(|a| {
                a.model() == Some(MODEL)
                    && a.instance() == Some(c.faulty)
                    && a.severity == "critical"
                    && a.fired_at_ms >= from
            })
        };
        let deadline = now_ms() + 150_000;
        while now_ms() < deadline
            && cases
                .iter()
                .zip(&runs)
                .zip(&injected)
                .any(|((c, (_, seen, _)), t)| paged(seen, c, *t).is_none())
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let end = now_ms();
        let _ = stop_tx.send(true);
        let mut failures = Vec::new();
        for (((c, fleet), (stats, seen, rec)), t) in cases.iter().zip(&fleets).zip(&runs).zip(&injected) {
            observe::poll_once(fleet.api, fleet.am, seen).await;
            let all: Vec<SeenAlert> = observe::snapshot(seen).alerts.into_values().collect();
            let peer: Vec<String> = fleet.sims.iter().map(|s| s.spec.name.clone()).filter(|n| n != c.faulty).collect();
            let bound = truth::bound_s(&truth::copy(rec), c.faulty, &peer, *t, end, f64::from(c.scrape_s))
                + f64::from(c.scrape_s);
            let Some(page) = paged(seen, c, *t) else {
                failures.push(format!(
                    "{}: no page naming {MODEL} / {} within 150 s of `{}` (bound {bound:.1} s; {}); alerts (times after the fault):\n{}\n{}",
                    c.topology.name(), c.faulty, c.fault, stats.line(), describe(&all, *t), fleet.logs_tail(10)
                ) + &format!("\nper-replica request rates tokenwatch saw: {}", request_rates(fleet.api).await));
                continue;
            };
            let delay = (page.fired_at_ms - t) as f64 / 1000.0;
            // Within 2× the bound plus a scrape, or the 60 s where that is longer (a
            // minute's reference is looser than the production half hour's).
            assert!(
                delay <= (2.0 * bound + f64::from(c.scrape_s)).max(60.0),
                "{}: `{}` paged after {delay:.1} s, the bound is {bound:.1} s ({})",
                c.topology.name(), c.fault, stats.line()
            );
            let others: Vec<SeenAlert> =
                all.into_iter().filter(|a| a.instance().is_some_and(|i| i != c.faulty)).collect();
            assert!(others.is_empty(), "{}: the healthy replica was named:\n{}", c.topology.name(), describe(&others, *t));
            eprintln!(
                "alert_quality: {}: `{}` on {} paged by {} after {delay:.1} s (bound {bound:.1} s; {})",
                c.topology.name(), c.fault, c.faulty, page.rule, stats.line()
            );
        }
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    });
}

/// tokenwatch's request and error rates per replica, for a failure message.
async fn request_rates(api: std::net::SocketAddr) -> String {
    let v = harness::procs::get_json(
        &harness::procs::client(),
        &format!("http://{api}/api/v1/signals"),
    )
    .await;
    v["signals"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| {
            x["signal"]
                .as_str()
                .is_some_and(|n| n.starts_with("request"))
        })
        .map(|x| format!("{} {} {}", x["signal"], x["instance"], x["value"]))
        .collect::<Vec<_>>()
        .join("; ")
}
