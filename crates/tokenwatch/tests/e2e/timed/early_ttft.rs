// A time-to-first-token spike is found from first tokens, as the proxy reports them, not from
// records: the slowed streams take ~10 s to end, and the alert must come while none has ended —
// in one `role: all` process, and behind a `role: proxy` replica that ships its first tokens to a
// `role: aggregator` ahead of their records (issue 28).

use crate::alerting_support;
use crate::common;

use alerting_support::{Req, Stack, Traffic, prompt};
use common::{ANY, Proc, free_addr, get, ready_on, start_sim};
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
    spike_alerts_early(&s).await;
}

/// The same behind a proxy replica: the replica ships each first token to the aggregator ahead
/// of its record; the aggregator (whose API `s` names) alerts as early.
#[tokio::test]
async fn behind_a_proxy_replica_a_ttft_spike_alerts_before_any_slowed_stream_has_ended() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (sim_proc, sim) = start_sim(d, SIM).await;
    // The aggregator's OTLP address is in the configuration both processes read, so it is
    // picked before either starts; every other listener picks its own port.
    let otlp = free_addr();
    let cfg = d.join("tw.yaml");
    std::fs::write(
        &cfg,
        format!(
            "{CONFIG}proxy:\n  tenant_salt: replicas-share-this-salt\naggregator:\n  endpoint: http://{otlp}\n  buffer: {{flush_interval: 50ms}}\n"
        ),
    )
    .unwrap();
    let cfg = cfg.display().to_string();
    let run = |name: &str, args: &[String]| {
        let data = d.join(name).display().to_string();
        let mut all = vec!["run", "-c", &cfg, "--data-dir", &data];
        all.extend(args.iter().map(String::as_str));
        Proc::start(name, &all, d)
    };
    let aggregator = run(
        "aggregator",
        &[
            "--role".into(),
            "aggregator".into(),
            "--listen".into(),
            ANY.into(),
            "--otlp-http-listen".into(),
            otlp.to_string(),
            "--otlp-grpc-listen".into(),
            ANY.into(),
        ],
    );
    let replica = run(
        "replica",
        &[
            "--role".into(),
            "proxy".into(),
            "--listen".into(),
            ANY.into(),
            "--proxy-listen".into(),
            ANY.into(),
            "--upstream".into(),
            format!("http://{sim}"),
            "--upstream-runtime".into(),
            "sim".into(),
        ],
    );
    let (api, _) = ready_on(&aggregator).await;
    let (replica_api, proxy) = ready_on(&replica).await;
    let s = Stack {
        sim_proc: Some(sim_proc),
        tw: aggregator,
        sim: Some(sim),
        api,
        proxy,
        otlp_http: otlp,
        dir,
    };
    spike_alerts_early(&s).await;
    let m = get(&format!("http://{replica_api}/metrics")).await.body;
    let value = |series: &str| common::metric_value(&m, series).unwrap_or(0.0);
    // The healthy phase's 400 requests (and more) went both ways: records and first tokens.
    let (records, firsts) = (
        value("tokenwatch_ship_spans_total"),
        value("tokenwatch_ship_first_tokens_spans_total"),
    );
    assert!(
        records > 400.0 && firsts > 400.0,
        "shipped {records} records, {firsts} first tokens\n{m}"
    );
    drop(replica);
}

/// Healthy traffic through `s.proxy`, then every response's first token and tokens 20 times
/// slower: `latency_spike` fires at `s.api` before any slowed stream has ended.
async fn spike_alerts_early(s: &Stack) {
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

    let sim = s.sim.expect("a simulator");
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
