// Alert-quality regression (issue 9): the benchmark's harness, short. 90 s of heavy-tailed,
// swinging healthy traffic over 4 pooled instances must fire no alert; then an error burst on
// one instance must fire an alert naming the model (and that instance, when labelled) quickly.

#[path = "../benches/alert_quality/mod.rs"]
mod harness;

use harness::fleet::{Fleet, FleetSpec};
use harness::load::{self, LoadSpec};
use harness::observe::{self, SeenAlert};
use harness::procs::now_ms;
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
        let stats = load::spawn(fleet.proxy, load_spec, stop_rx.clone());
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
