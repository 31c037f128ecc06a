// Experiment alerts through the real binary: A/B regression (arm B slower end to end, by its longer
// answers on the same simulator), traffic-split deviation, equal arms staying quiet, prompt decay.

use crate::alerting_support;

use alerting_support::{FAST, Req, Stack, Traffic, prompt};
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The tests share the machine's cores: one at a time, so one's load is not another's latency.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A/B on end-to-end latency over 8 s windows with 60 requests per arm (the shipped rule, replaced
/// by name); the detector's thresholds are the spec's.
const AB_CONFIG: &str = r#"
scrape:
  interval: 1s
alerting:
  resolve_after: 10s
  rules:
    - name: ab_regression
      detector: ab_regression
      signal: e2e
      window: 8s
      params: {min_requests: 60}
"#;

fn ab_req(group: &str, max_tokens: Option<u32>, w: u64, i: u64) -> Req {
    Req {
        content: prompt(&format!("w{w}-r{i}-{group}"), 80),
        headers: vec![("x-ab-group", group.to_string())],
        max_tokens,
    }
}

#[tokio::test]
async fn slower_arm_b_raises_the_ab_regression_alert() {
    let _serial = SERIAL.lock().await;
    let s = Stack::with_sim(FAST, AB_CONFIG).await;
    // Alternate arms (an exact 50/50 split); arm B's variant answers at length (up to 72 tokens
    // instead of the simulator's 24), so its end-to-end latency is about twice A's.
    let traffic = Traffic::start(
        s.proxy,
        6,
        Arc::new(|_, w, i| {
            if i % 2 == 0 {
                ab_req("b", Some(72), w, i)
            } else {
                ab_req("a", None, w, i)
            }
        }),
    );
    let a = s
        .wait_firing("ab_regression", Duration::from_secs(40), |_| true)
        .await;
    traffic.stop().await;
    let ev = &a["last_event"]["evidence"];
    assert_eq!(ev["latency_regression"], true, "{a:#}");
    assert_eq!(ev["split_deviation"], false, "{a:#}");
    assert_eq!(
        (ev["arm_a"].as_str(), ev["arm_b"].as_str()),
        (Some("a"), Some("b"))
    );
    let (pa, pb) = (
        ev["p99_a_s"].as_f64().unwrap(),
        ev["p99_b_s"].as_f64().unwrap(),
    );
    assert!(pb > pa * 1.5, "B's P99 {pb} should be well above A's {pa}");
    assert!(
        ev["p99_increase_required"].as_f64().unwrap() >= 0.05,
        "never below the spec's 5%: {a:#}"
    );
    assert_eq!(a["labels"]["model_id"], alerting_support::MODEL);
    assert!(
        a["annotations"]["detector_summary"]
            .as_str()
            .is_some_and(|t| t.contains("arm B regresses")),
        "{a:#}"
    );
}

#[tokio::test]
async fn off_target_split_raises_the_split_deviation_alert() {
    let _serial = SERIAL.lock().await;
    let s = Stack::with_sim(FAST, AB_CONFIG).await;
    // Same prompts for both arms, but B gets one request in four instead of the target half.
    let traffic = Traffic::start(
        s.proxy,
        6,
        Arc::new(|_, w, i| ab_req(if i % 4 == 0 { "b" } else { "a" }, None, w, i)),
    );
    let a = s
        .wait_firing("ab_regression", Duration::from_secs(40), |a| {
            a["last_event"]["evidence"]["split_deviation"] == true
        })
        .await;
    traffic.stop().await;
    let ev = &a["last_event"]["evidence"];
    let share = ev["share_b"].as_f64().unwrap();
    assert!((0.2..0.3).contains(&share), "share of B {share}: {a:#}");
    assert!(
        ev["split_deviation_points"].as_f64().unwrap() < -20.0,
        "{a:#}"
    );
}

#[tokio::test]
async fn equal_arms_raise_no_alert() {
    let _serial = SERIAL.lock().await;
    let s = Stack::with_sim(FAST, AB_CONFIG).await;
    // Arms drawn at random (as a hash-based router assigns them) with identical requests: the
    // split wanders by a few points and the P99s differ by chance, neither of which is a finding.
    let rng = Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(11)));
    let traffic = Traffic::start(
        s.proxy,
        6,
        Arc::new(move |_, w, i| {
            let b = rng.lock().unwrap().random_bool(0.5);
            ab_req(if b { "b" } else { "a" }, None, w, i)
        }),
    );
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(35) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let alerts = s.alerts().await;
        assert!(
            alerts.is_empty(),
            "equal arms raised alerts after {:?}: {alerts:#?}",
            start.elapsed()
        );
    }
    let n = traffic.done.load(std::sync::atomic::Ordering::Relaxed);
    traffic.stop().await;
    assert!(n > 500, "too little traffic to mean anything: {n} requests");
}

/// Prompt-version periods of 3 s (each version needs 20 requests a period).
const DECAY_CONFIG: &str = r#"
scrape:
  interval: 1s
alerting:
  resolve_after: 10s
  overrides:
    prompt_version_decay: {window: 3s}
"#;

#[tokio::test]
async fn newer_prompt_version_decaying_raises_its_own_alert() {
    let _serial = SERIAL.lock().await;
    let s = Stack::with_sim(FAST, DECAY_CONFIG).await;
    // Phase 0: both versions healthy. Phase 1: v2 grows a long preamble and 40% of its
    // requests no longer fit the model's 8,192-token context (the simulator answers 400).
    let traffic = Traffic::start(
        s.proxy,
        8,
        Arc::new(|phase, w, i| {
            let v2 = i % 2 == 0;
            let too_long = v2 && phase == 1 && i % 5 < 2;
            let chars = if too_long { 40_000 } else { 80 };
            Req {
                content: prompt(&format!("w{w}-r{i}"), chars),
                headers: vec![("x-prompt-version", if v2 { "v2" } else { "v1" }.to_string())],
                max_tokens: None,
            }
        }),
    );
    // Six healthy periods build each version's baseline (five are needed).
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        s.alerts().await.is_empty(),
        "healthy versions raised alerts: {:#?}",
        s.alerts().await
    );
    traffic.set_phase(1);
    let a = s
        .wait_firing("prompt_version_decay", Duration::from_secs(30), |_| true)
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let alerts = s.alerts().await;
    traffic.stop().await;
    assert_eq!(a["labels"]["prompt_version"], "v2", "{a:#}");
    let ev = &a["last_event"]["evidence"];
    assert!(
        ev["relative_drop"].as_f64().unwrap() > 0.2,
        "v2 lost ~40% of its successes: {a:#}"
    );
    assert!(ev["consecutive_periods"].as_u64().unwrap() >= 3, "{a:#}");
    let others: Vec<_> = alerts
        .iter()
        .filter(|x| x["labels"]["prompt_version"] != "v2")
        .collect();
    assert!(others.is_empty(), "only v2 decays: {others:#?}");
}
