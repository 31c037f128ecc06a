// SLOs through the binary: tokenwatch in front of the simulator with SLOs on short windows;
// healthy traffic leaves the budgets intact and raises no burn alert, then a latency fault makes
// the TTFT SLO burn and its fast-burn (page) alert fire, seen in /api/v1/slos and /metrics.

use crate::alerting_support;
use crate::common;

use alerting_support::{FAST, MODEL, Stack, Traffic};
use common::{get, send};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The spec's objectives on windows of seconds: budget over 10 min, fast pair 20 s / 10 s,
/// slow pair 60 s / 15 s. The TTFT SLO keeps the 800 ms threshold with a 99 % target.
const CONFIG: &str = r#"
alerting:
  resolve_after: 10s
  overrides:
    slo_burn: {params: {min_requests: 10}}
    slo_burn_slow: {params: {min_requests: 10}}
slos:
  - name: ttft_p95
    objective: ttft_p95
    target: 0.99
    window: 10m
    burn_windows: {fast_long: 20s, fast_short: 10s, slow_long: 60s, slow_short: 15s}
  - name: success
    objective: success
    window: 10m
    burn_windows: {fast_long: 20s, fast_short: 10s, slow_long: 60s, slow_short: 15s}
  - name: guardrail_rate
    objective: guardrail_rate
"#;

async fn slos(s: &Stack) -> Vec<Value> {
    let r = get(&format!("http://{}/api/v1/slos", s.api)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let body = r.json();
    assert_eq!(body["computed"], true, "{body:#}");
    body["slos"].as_array().cloned().unwrap_or_default()
}

/// The series of SLO `name` for the simulator's model, once `pred` holds for it.
async fn wait_series(
    s: &Stack,
    name: &str,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let all = slos(s).await;
        if let Some(x) = all
            .iter()
            .find(|x| x["slo"] == name && x["labels"]["model_id"] == MODEL && pred(x))
        {
            return x.clone();
        }
        assert!(
            Instant::now() < deadline,
            "SLO {name} never matched within {within:?}: {all:#?}\n{}",
            s.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn burn(series: &Value, window: &str) -> Option<f64> {
    series["burn"]
        .as_array()?
        .iter()
        .find(|w| w["window"] == window)?["burn_rate"]
        .as_f64()
}

#[tokio::test]
async fn latency_fault_burns_the_ttft_slo_and_pages() {
    let s = Stack::with_sim(FAST, CONFIG).await;
    let traffic = Traffic::plain(s.proxy, 6);
    traffic.wait_requests(300, Duration::from_secs(30)).await;

    // Healthy: every counted SLO has its budget nearly intact, nothing burns, no alert.
    let ttft = wait_series(&s, "ttft_p95", Duration::from_secs(10), |x| {
        x["total"].as_u64().is_some_and(|n| n >= 200)
    })
    .await;
    assert_eq!(ttft["status"], "ok");
    assert_eq!(ttft["objective"], "ttft_p95");
    assert_eq!(ttft["threshold_ms"], 800.0);
    assert_eq!(ttft["target"], 0.99);
    assert_eq!(ttft["window"], "10m");
    assert!(ttft["budget_remaining"].as_f64().unwrap() > 0.5, "{ttft:#}");
    assert!(ttft["sli"].as_f64().unwrap() > 0.995, "{ttft:#}");
    for w in ["20s", "10s", "1m"] {
        assert!(burn(&ttft, w).is_some_and(|b| b < 2.0), "{w}: {ttft:#}");
    }
    assert_eq!(ttft["alert_state"], "ok");
    let success = wait_series(&s, "success", Duration::from_secs(5), |_| true).await;
    assert_eq!(
        (
            success["bad"].as_u64(),
            success["budget_remaining"].as_f64()
        ),
        (Some(0), Some(1.0)),
        "{success:#}"
    );
    // The guardrail SLO has no input: it says so instead of showing a number.
    let all = slos(&s).await;
    let guard = all
        .iter()
        .find(|x| x["slo"] == "guardrail_rate")
        .expect("guardrail SLO listed");
    assert_eq!(guard["status"], "no_data");
    assert!(
        guard["sli"].is_null() && guard["budget_remaining"].is_null(),
        "{guard:#}"
    );
    assert!(
        guard["note"].as_str().unwrap().contains("verdict"),
        "{guard:#}"
    );
    // Filters, and a 400 naming the allowed ones.
    let one = get(&format!(
        "http://{}/api/v1/slos?slo=success&model={MODEL}",
        s.api
    ))
    .await;
    assert_eq!(one.json()["count"], 1, "{}", one.body);
    let bad = get(&format!("http://{}/api/v1/slos?colour=red", s.api)).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    let burning: Vec<Value> = s
        .alerts()
        .await
        .into_iter()
        .filter(|a| {
            a["rule"]
                .as_str()
                .is_some_and(|r| r.starts_with("slo_burn"))
        })
        .collect();
    assert!(
        burning.is_empty(),
        "burn alerts on healthy traffic: {burning:#?}"
    );
    // /metrics: budget and burn gauges per SLO series and window.
    let m = get(&format!("http://{}/metrics", s.api)).await.body;
    for want in [
        "tokenwatch_slo_error_budget_remaining_ratio{slo=\"ttft_p95\"",
        "tokenwatch_slo_burn_rate{slo=\"ttft_p95\"",
        "window=\"20s\"",
        "tokenwatch_slo_sli_ratio{slo=\"success\"",
    ] {
        assert!(m.contains(want), "{want} missing from /metrics");
    }

    // Half the requests 40× slower (≈ 1.6 s TTFT against 800 ms): 50× the 1 % budget.
    let sim = s.sim.unwrap();
    let r = send(
        "POST",
        &format!("http://{sim}/admin/faults"),
        Some(&json!({ "spec": "latency_spike:factor=40,share=0.5" }).to_string()),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let page = s
        .wait_firing("slo_burn", Duration::from_secs(45), |a| {
            a["labels"]["slo"] == "ttft_p95"
        })
        .await;
    traffic.stop().await;
    assert_eq!(page["severity"], "critical");
    assert_eq!(page["labels"]["model_id"], MODEL);
    let ev = &page["last_event"]["evidence"];
    assert_eq!(ev["condition"], "fast", "{page:#}");
    assert!(
        ev["burn_rate_20s"].as_f64().is_some_and(|b| b >= 14.4),
        "{page:#}"
    );
    assert!(
        ev["burn_rate_10s"].as_f64().is_some_and(|b| b >= 14.4),
        "{page:#}"
    );
    let summary = page["annotations"]["summary"].as_str().unwrap_or_default();
    assert!(summary.contains("ttft_p95"), "{summary}");
    let sentence = page["last_event"]["summary"].as_str().unwrap_or_default();
    assert!(sentence.contains("TTFT ≤ 800 ms for 99%"), "{sentence}");
    // The SLO shows its page and a budget eaten into.
    let burnt = wait_series(&s, "ttft_p95", Duration::from_secs(5), |x| {
        x["alert_state"] == "firing"
    })
    .await;
    assert!(
        burnt["budget_remaining"].as_f64().unwrap() < ttft["budget_remaining"].as_f64().unwrap(),
        "{burnt:#}"
    );
    assert!(
        burnt["alerts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["rule"] == "slo_burn")),
        "{burnt:#}"
    );
    // No request failed: the success SLO does not burn.
    let success_alerts: Vec<Value> = s
        .alerts()
        .await
        .into_iter()
        .filter(|a| a["labels"]["slo"] == "success")
        .collect();
    assert!(success_alerts.is_empty(), "{success_alerts:#?}");
}
