// Fail open against a panicking analysis thread (issue 28, item 3): in one `role: all` process,
// the pipeline thread and then the alert engine panic while streams flow — made to by the
// debug-build failpoint `TOKENWATCH_TEST_PANIC` (`kernel::failpoint`), on a record of a model kept
// for the purpose. The forwarded streams must not notice: every one completes, whole, at the
// latency it had before. The failure is visible: `/readyz` (still 200: the proxy forwards) names
// each stage's panic, `tokenwatch_analysis_panics_total` counts them, the records the pipeline
// had in hand are counted as dropped, an error line is logged. And both stages go on: records
// after the panics are stored and the alert engine evaluates again.

use crate::common;
use crate::timed::proxy_roles::{Seen, assert_fails_open, traffic};

use common::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const MODEL: &str = "sim-llama-8b";
/// The pipeline thread panics on a record of this model.
const PANIC_PIPELINE: &str = "panic-pipeline";
/// The alert engine panics on a record of this model.
const PANIC_ALERTING: &str = "panic-alerting";

async fn metrics(api: SocketAddr) -> String {
    get(&format!("http://{api}/metrics")).await.body
}

fn value(m: &str, series: &str) -> f64 {
    metric_value(m, series).unwrap_or(0.0)
}

async fn stored(api: SocketAddr, model: &str) -> usize {
    let v = get(&format!(
        "http://{api}/api/v1/requests?model={model}&limit=10000"
    ))
    .await
    .json();
    v["requests"].as_array().map_or(0, Vec::len)
}

/// One short chat completion of `model` through the proxy: 200, whole.
async fn trigger(proxy: SocketAddr, model: &str) {
    let body = serde_json::json!({
        "model": model,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "panic, please"}],
    })
    .to_string();
    let r = send(
        "POST",
        &format!("http://{proxy}/v1/chat/completions"),
        Some(&body),
        &[("content-type", "application/json")],
    )
    .await
    .expect("the proxy answers");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("\"finish_reason\""), "{}", r.body);
}

/// Waits until `series` in `/metrics` reaches `at_least`; returns the metrics text.
async fn wait_metric(api: SocketAddr, series: &str, at_least: f64, tw: &Proc) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = metrics(api).await;
        if value(&m, series) >= at_least {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never reached {at_least}\n{}",
            tw.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(debug_assertions),
    ignore = "the failpoint exists in debug builds only"
)]
async fn streams_flow_untouched_while_analysis_threads_panic_and_the_failure_shows() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let models = format!("{MODEL},{PANIC_PIPELINE},{PANIC_ALERTING}");
    let (_sim, sim) = start_sim(
        d,
        &["--model", &models, "--ttft-ms", "40", "--itl-ms", "10"],
    )
    .await;
    let u = format!("http://{sim}");
    let data = d.join("data").to_string_lossy().into_owned();
    let failpoints = format!("pipeline:{PANIC_PIPELINE},alerting:{PANIC_ALERTING}");
    let mut tw = Proc::start_with_env(
        "tokenwatch",
        &[
            "run",
            "--listen",
            ANY,
            "--proxy-listen",
            ANY,
            "--upstream",
            &u,
            "--upstream-runtime",
            "sim",
            "--data-dir",
            &data,
            "--otlp-grpc-listen",
            ANY,
            "--otlp-http-listen",
            ANY,
        ],
        d,
        &[("TOKENWATCH_TEST_PANIC", &failpoints)],
    );
    let (api, proxy) = ready_on(&tw).await;
    let ready = get(&format!("http://{api}/readyz")).await.json();
    assert_eq!(ready["components"]["pipeline"], "ok", "{ready}");
    assert_eq!(ready["components"]["alerting"], "ok", "{ready}");
    let (n, workers, tokens) = (32, 4, 40);

    // Healthy: every record stored.
    let up = traffic(&[proxy], n, workers, tokens).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while stored(api, MODEL).await < n {
        assert!(Instant::now() < deadline, "{}", tw.log_tail(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Streams flow while the pipeline thread panics, then the alert engine.
    let load = tokio::spawn(async move { traffic(&[proxy], 3 * n, workers, tokens).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    trigger(proxy, PANIC_PIPELINE).await;
    let m = wait_metric(
        api,
        "tokenwatch_analysis_panics_total{component=\"pipeline\"}",
        1.0,
        &tw,
    )
    .await;
    let evaluations = value(&m, "tokenwatch_alert_evaluations_total");
    trigger(proxy, PANIC_ALERTING).await;
    wait_metric(
        api,
        "tokenwatch_analysis_panics_total{component=\"alerting\"}",
        1.0,
        &tw,
    )
    .await;
    let started = Instant::now();
    let r = get(&format!("http://{api}/readyz")).await;
    let ready_took = started.elapsed();
    let during: Vec<Seen> = load.await.expect("every stream completed whole");

    // The client saw nothing: every stream whole (`traffic` checks), latency as before.
    let report = assert_fails_open(&up, &during, "analysis panicking");
    // Visible: /readyz names both panics and stays 200 (the proxy forwards).
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        ready_took < Duration::from_secs(1),
        "/readyz took {ready_took:?}"
    );
    let ready = r.json();
    let status = |c: &str| {
        ready["components"][c]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        status("pipeline").starts_with("error: panicked 1 time(s)")
            && status("pipeline").contains(PANIC_PIPELINE),
        "{ready}"
    );
    assert!(
        status("alerting").starts_with("error: panicked 1 time(s)")
            && status("alerting").contains(PANIC_ALERTING),
        "{ready}"
    );
    assert_eq!(status("proxy"), "ok", "{ready}");
    assert!(
        tw.log().contains("an analysis stage panicked"),
        "{}",
        tw.log_tail(40)
    );

    // Both went on: the streams after the panics are stored, the engine evaluates again.
    let after = traffic(&[proxy], n, workers, tokens).await;
    let total = up.len() + during.len() + after.len();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (kept, dropped) = loop {
        let m = metrics(api).await;
        let dropped = value(
            &m,
            "tokenwatch_telemetry_dropped_records_total{reason=\"analysis_panic\"}",
        );
        let kept = stored(api, MODEL).await;
        // Every record is stored or counted as dropped — the trigger's own among the dropped.
        if kept + dropped as usize == total + 1 {
            break (kept, dropped);
        }
        assert!(
            Instant::now() < deadline,
            "{kept} stored + {dropped} counted dropped for {total} streams and 1 trigger\n{m}\n{}",
            tw.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(dropped >= 1.0, "the trigger's record was not counted");
    assert!(kept >= up.len() + after.len(), "{kept} stored");
    assert_eq!(
        stored(api, PANIC_ALERTING).await,
        1,
        "the pipeline stored it"
    );
    wait_metric(
        api,
        "tokenwatch_alert_evaluations_total",
        evaluations + 3.0,
        &tw,
    )
    .await;
    let m = metrics(api).await;
    assert_eq!(
        value(
            &m,
            "tokenwatch_analysis_panics_total{component=\"pipeline\"}"
        ),
        1.0
    );
    println!(
        "{report}\n{} streams while the pipeline and the alert engine panicked, all complete; {total} streams in all: {kept} records stored, {dropped} counted dropped (the trigger's among them); /readyz then: {} {ready}",
        during.len(),
        r.status,
    );
    assert!(tw.terminate().success());
}
