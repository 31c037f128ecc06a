// The autoscaling recommendation through the binary: tokenwatch in front of a simulator that
// serves two sequences at a time; light load holds at one replica, rising load (queueing, TTFT
// up, throughput up) recommends more, and after the load is gone the recommendation steps down
// only after three calm periods and the cooldown. Read as KEDA does (/api/v1/scaling/{model})
// and as an HPA does (/metrics).

use crate::alerting_support;
use crate::common;

use alerting_support::{MODEL, Stack, Traffic};
use common::get;
use serde_json::Value;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PERIOD_MS: i64 = 1000;
const COOLDOWN_MS: i64 = 5000;
const CONFIG: &str = r#"
scaling:
  period: 1s
  recommendation: {cooldown_s: 5, baseline_periods: 30, max_replicas: 4}
"#;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn scaling(s: &Stack) -> Option<Value> {
    let r = get(&format!("http://{}/api/v1/scaling/{MODEL}", s.api)).await;
    match r.status {
        200 => Some(r.json()),
        404 => None,
        other => panic!("GET /api/v1/scaling/{MODEL}: {other} {}", r.body),
    }
}

/// Polls every 200 ms until `done` holds for the recommendation; returns every distinct one seen.
async fn watch(s: &Stack, within: Duration, done: impl Fn(&Value) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + within;
    let mut seen: Vec<Value> = Vec::new();
    loop {
        if let Some(v) = scaling(s).await {
            if seen
                .last()
                .is_none_or(|l| l["at_unix_ms"] != v["at_unix_ms"])
            {
                seen.push(v.clone());
            }
            if done(&v) {
                return seen;
            }
        }
        let last: Vec<String> = seen
            .iter()
            .rev()
            .take(8)
            .map(|v| {
                format!(
                    "{} {} {:.2} {}",
                    v["desired_replicas"],
                    v["decision"]["action"],
                    v["score"].as_f64().unwrap_or(-1.0),
                    v["decision"]["reason"]
                )
            })
            .collect();
        assert!(
            Instant::now() < deadline,
            "not reached within {within:?}; latest: {last:#?}\n{}",
            s.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn recommendation_rises_under_load_and_falls_only_after_calm_periods() {
    let sim = [
        "--itl-ms",
        "4",
        "--max-tokens",
        "24",
        "--ttft-ms",
        "40",
        "--max-num-seqs",
        "2",
    ];
    let s = Stack::with_sim(&sim, CONFIG).await;
    let unknown = get(&format!("http://{}/api/v1/scaling/no-such-model", s.api)).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);

    // Light load: one client. The baseline fills and the recommendation holds at one replica.
    let light = Traffic::plain(s.proxy, 1);
    light.wait_requests(20, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let calm = scaling(&s)
        .await
        .expect("a recommendation for the served model");
    assert_eq!(calm["desired_replicas"], 1, "{calm:#}");
    assert_eq!(calm["observed_replicas"], 1, "{calm:#}");
    assert_eq!(
        (calm["min_replicas"].as_u64(), calm["max_replicas"].as_u64()),
        (Some(1), Some(4))
    );
    assert!(
        calm["decision"]["ttft"]["value"]
            .as_f64()
            .is_some_and(|r| r < 0.25),
        "{calm:#}"
    );

    // Rising load: twelve more clients queue behind two sequences; TTFT and throughput climb.
    let heavy = Traffic::plain(s.proxy, 12);
    let up = watch(&s, Duration::from_secs(30), |v| {
        v["desired_replicas"].as_u64() >= Some(2)
    })
    .await;
    let first_up = up.last().unwrap().clone();
    assert_eq!(first_up["decision"]["action"], "up", "{first_up:#}");
    assert!(
        first_up["score"].as_f64().is_some_and(|x| x > 0.5),
        "{first_up:#}"
    );
    let hpa = get(&format!("http://{}/metrics", s.api)).await.body;
    assert!(
        hpa.lines().any(|l| l.starts_with(&format!(
            "tokenwatch_scaling_desired_replicas{{model=\"{MODEL}\"}}"
        )) && l
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n >= 2)),
        "no desired-replicas gauge ≥ 2 on /metrics"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    heavy.stop().await;
    light.stop().await;
    let stopped = now_ms();
    let at_stop = scaling(&s).await.unwrap();
    let peak = at_stop["desired_replicas"].as_u64().unwrap();
    assert!(peak >= 2, "{at_stop:#}");

    // Load gone: down only after 3 calm periods and 5 s since the last change, one step each.
    let down = watch(&s, Duration::from_secs(40), |v| {
        v["desired_replicas"].as_u64() < Some(peak)
    })
    .await;
    let mut last_change = None;
    for v in &up {
        if v["decision"]["action"] == "up" {
            last_change = v["at_unix_ms"].as_i64();
        }
    }
    for v in &down {
        if v["decision"]["action"] == "up" {
            last_change = v["at_unix_ms"].as_i64();
        }
    }
    let step = down.last().unwrap();
    assert_eq!(step["decision"]["action"], "down", "{step:#}");
    assert_eq!(
        step["desired_replicas"].as_u64(),
        Some(peak - 1),
        "{step:#}"
    );
    let at = step["at_unix_ms"].as_i64().unwrap();
    assert!(
        at - stopped >= 2 * PERIOD_MS,
        "down {} ms after the load stopped",
        at - stopped
    );
    if let Some(t) = last_change {
        assert!(
            at - t >= COOLDOWN_MS,
            "down {} ms after the last up",
            at - t
        );
    }
    // Every period from the stop to the step down was calm, counted up to the configured 3.
    let calm_counts: Vec<u64> = down
        .iter()
        .filter(|v| v["at_unix_ms"].as_i64() > Some(stopped + PERIOD_MS))
        .filter_map(|v| v["decision"]["calm_periods"].as_u64())
        .collect();
    assert!(
        calm_counts.iter().any(|&c| c >= 3)
            || step["decision"]["reason"]
                .as_str()
                .unwrap_or("")
                .contains("3 calm"),
        "{down:#?}"
    );
}
