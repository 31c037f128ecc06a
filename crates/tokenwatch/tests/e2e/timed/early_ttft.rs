// A time-to-first-token spike is found from first tokens, as the proxy reports them, not from
// records: the slowed streams take ~10 s to end, and the alert must come while none has ended.

use crate::alerting_support;
use crate::common;

use alerting_support::{Req, Stack, Traffic, prompt};
use common::get;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Short windows; `for: 0s` so the condition is seen as soon as it holds.
const CONFIG: &str = r#"
alerting:
  resolve_after: 10s
  overrides:
    latency_spike: {for: 0s, window: 5s, params: {min_samples: 20, fast_window_s: 2}}
"#;

/// Normal streams: ~120 tokens at 4 ms (about half a second). Under the fault below, TTFT and
/// every token are 20 times slower: first token after ~0.8 s, the end after ~10 s.
const SIM: &[&str] = &["--itl-ms", "4", "--max-tokens", "400", "--ttft-ms", "40"];

#[tokio::test]
async fn a_ttft_spike_alerts_before_any_slowed_stream_has_ended() {
    let s = Stack::with_sim(SIM, CONFIG).await;
    let make = Arc::new(|_phase: u64, w: u64, i: u64| Req {
        content: prompt(&format!("w{w} r{i}"), 200),
        headers: Vec::new(),
        max_tokens: None,
    });
    let traffic = Traffic::start(s.proxy, 16, make);
    traffic.wait_requests(400, Duration::from_secs(60)).await;
    let quiet: Vec<Value> = s
        .alerts()
        .await
        .into_iter()
        .filter(|a| a["rule"] == "latency_spike")
        .collect();
    assert!(quiet.is_empty(), "healthy traffic raised {quiet:#?}");

    let sim = s.sim.unwrap();
    let r = common::send(
        "POST",
        &format!("http://{sim}/admin/faults"),
        Some(&json!({"spec": "latency_spike:factor=20,share=1"}).to_string()),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let onset = Instant::now();

    let alert = s
        .wait_firing("latency_spike", Duration::from_secs(9), |_| true)
        .await;
    let after = onset.elapsed();
    // No slowed request (first token after 0.5 s; healthy ones take ~60 ms) has ended yet:
    // the alert came from first tokens, not from records.
    let recent = get(&format!("http://{}/api/v1/requests?limit=2000", s.api))
        .await
        .json();
    let slowed: Vec<&Value> = recent["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["first_token_s"].as_f64().is_some_and(|t| t > 0.5))
        .collect();
    eprintln!(
        "latency_spike fired {after:?} after the fault; slowed requests ended: {}",
        slowed.len()
    );
    assert!(
        slowed.is_empty(),
        "a slowed request had ended first: {slowed:#?}\n{alert:#}"
    );
    assert_eq!(
        alert["labels"]["model_id"],
        alerting_support::MODEL,
        "{alert:#}"
    );
    let ev = &alert["last_event"]["evidence"];
    assert!(
        ev["ratio"].as_f64().is_some_and(|r| r > 2.5) || ev["fast_path"] == true,
        "{alert:#}"
    );
    traffic.stop().await;
}
