// `/metrics` under hostile model names through the real binary (issue 35 item 1): thousands of
// requests naming random models, and some naming one very long model, leave the request
// families at their `export.prometheus.max_series_per_family` budget with the rest counted in
// `tokenwatch_metrics_series_overflow_total`, no label value over `max_label_bytes`, the scrape
// under a fixed size, and a normal request still served and counted under its own model; and
// models that fall silent leave the families after `export.prometheus.idle_series_after`,
// making room for new ones.

use crate::common;

use common::*;
use std::time::{Duration, Instant};

const BUDGET: usize = 100;
const RANDOM_MODELS: usize = 2_000;
const LONG_MODELS: usize = 20;
/// The request families' share of `/metrics` must stay under this, whatever the names sent
/// (unbounded, the same traffic produced 426 MB).
const MAX_REQUEST_FAMILY_BYTES: usize = 3 * 1024 * 1024;

/// The bytes of the request families' samples in `text` (the series this budget bounds).
fn request_family_bytes(text: &str) -> usize {
    text.lines()
        .filter(|l| l.starts_with("gen_ai_") || l.starts_with("tokenwatch_requests_total"))
        .map(|l| l.len() + 1)
        .sum()
}

/// The sum of `tokenwatch_metrics_series_overflow_total{family="tokenwatch_requests"}`.
fn requests_overflow(text: &str) -> f64 {
    metric_value(
        text,
        "tokenwatch_metrics_series_overflow_total{family=\"tokenwatch_requests\"}",
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_long_model_names_stay_within_the_series_budget() {
    let stack = Stack::start_with_config(
        &["--ttft-ms", "1", "--itl-ms", "1"],
        &format!(
            "export:\n  prometheus:\n    max_series_per_family: {BUDGET}\n    max_label_bytes: 128\n"
        ),
    )
    .await;
    let proxy = format!("http://{}/v1/chat/completions", stack.proxy);
    let metrics = format!("http://{}/metrics", stack.api);

    let first = post(&proxy, &short_chat("sim-llama-8b")).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let normal = "tokenwatch_requests_total{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"sim\",gen_ai_request_model=\"sim-llama-8b\"";
    let deadline = Instant::now() + Duration::from_secs(10);
    let before = loop {
        let m = get(&metrics).await.body;
        if m.contains(normal) {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "the first request never counted: {m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // Random names from many concurrent clients, then a few 256 KiB names.
    let seed = now_ns();
    let mut names: Vec<String> = (0..RANDOM_MODELS)
        .map(|i| format!("m-{seed:x}-{i}"))
        .collect();
    names.extend((0..LONG_MODELS).map(|i| format!("{i}{}", "x".repeat(256 * 1024))));
    let names = std::sync::Arc::new(names);
    let answered = {
        let (names, proxy) = (names.clone(), proxy.clone());
        concurrently(names.len(), 32, move |i| {
            let (body, proxy) = (short_chat(&names[i]), proxy.clone());
            async move { send("POST", &proxy, Some(&body), &[]).await.is_ok() }
        })
        .await
    };
    assert_eq!(answered, RANDOM_MODELS + LONG_MODELS);

    // Every request past the budget ends in the overflow counter once the pipeline carried it.
    let want = (RANDOM_MODELS + LONG_MODELS + 1 - BUDGET) as f64;
    let deadline = Instant::now() + Duration::from_secs(15);
    let after = loop {
        let m = get(&metrics).await.body;
        if requests_overflow(&m) >= want {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "overflow {} of {want}: {}",
            requests_overflow(&m),
            stack.tw.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "/metrics: {} bytes before, {} after {} model names, {} of them the request families'",
        before.len(),
        after.len(),
        RANDOM_MODELS + LONG_MODELS,
        request_family_bytes(&after)
    );
    assert!(
        request_family_bytes(&after) < MAX_REQUEST_FAMILY_BYTES,
        "the request families take {} bytes",
        request_family_bytes(&after)
    );
    assert_eq!(requests_overflow(&after), want);
    let request_series = after
        .lines()
        .filter(|l| l.starts_with("tokenwatch_requests_total{"))
        .count();
    assert!(
        request_series <= BUDGET + 5,
        "{request_series} tokenwatch_requests series"
    );
    assert!(
        after.contains("gen_ai_request_model=\"__other__\""),
        "no __other__ series"
    );
    // No label value over max_label_bytes, and nothing of the long names but a cut prefix.
    assert!(
        !after.contains(&"x".repeat(126)),
        "a long model name went through whole"
    );
    // Whichever family names them (request series, SLO gauges): label values are the text
    // between quotes, odd pieces once split on `"` (the names sent hold no quote).
    for l in after.lines().filter(|l| l.contains("xxxxxxxx")) {
        for v in l
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|v| v.contains("xxx"))
        {
            assert!(v.len() <= 128 && v.ends_with("..."), "{l}");
        }
    }
    // Warned once per family at most.
    let warnings = stack
        .tw
        .log()
        .matches("a request metric family reached")
        .count();
    assert!((1..=6).contains(&warnings), "{warnings} warnings");

    // A normal request is still served, and counted under its own model.
    let again = post(&proxy, &short_chat("sim-llama-8b")).await;
    assert_eq!(again.status, 200, "{}", again.body);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = get(&metrics).await.body;
        let n = m
            .lines()
            .find(|l| l.starts_with(normal) && !l.contains("error_type"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        if n == Some(2.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "normal request not counted: {n:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_no_upstream_routes_are_counted_under_other() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim_addr) = start_sim(dir.path(), &["--ttft-ms", "1", "--itl-ms", "1"]).await;
    let config = write_config(
        dir.path(),
        &format!(
            "data_dir: {}\nproxy:\n  upstreams:\n    - url: http://{sim_addr}\n      runtime: sim\n      models: [sim-llama-8b]\n",
            dir.path().join("data").display()
        ),
    );
    let (_tw, api, proxy) = run_with_config(dir.path(), &config).await;
    let proxy = format!("http://{proxy}/v1/chat/completions");
    const UNKNOWN: usize = 300;
    for i in 0..UNKNOWN {
        let r = post(&proxy, &short_chat(&format!("unknown-{i}"))).await;
        assert_eq!(r.status, 502, "{}", r.body);
    }
    let ok = post(&proxy, &short_chat("sim-llama-8b")).await;
    assert_eq!(ok.status, 200, "{}", ok.body);

    // No route, no runtime: the provider reads `openai`, the API the proxy speaks.
    let other = "tokenwatch_requests_total{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"openai\",gen_ai_request_model=\"__other__\",gen_ai_response_model=\"__other__\"";
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = get(&format!("http://{api}/metrics")).await.body;
        let folded = m
            .lines()
            .find(|l| l.starts_with(other) && l.contains("error_type=\"no_route\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        if folded == Some(UNKNOWN as f64) && m.contains("gen_ai_request_model=\"sim-llama-8b\"") {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "{folded:?} of {UNKNOWN} no_route requests under __other__: {:?}",
            m.lines()
                .filter(|l| l.starts_with("tokenwatch_requests_total"))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The request families name no unrouted model. (The SLO and scaling series,
    // `tokenwatch_slo_*` and `tokenwatch_scaling_*`, still do: they have no `__other__` yet.)
    let leaked: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("gen_ai_") || l.starts_with("tokenwatch_requests_total"))
        .filter(|l| l.contains("unknown-"))
        .collect();
    assert!(
        leaked.is_empty(),
        "an unrouted model got a request series: {leaked:?}"
    );
    assert_eq!(requests_overflow(&m), 0.0);
}

/// Label sets not seen for `export.prometheus.idle_series_after` leave `/metrics` and free their
/// place: with a budget of three, three models that fall silent make room for a new one, which
/// gets series of its own instead of `__other__`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_model_series_leave_and_make_room_for_new_ones() {
    let stack = Stack::start_with_config(
        &["--ttft-ms", "1", "--itl-ms", "1"],
        "export:\n  prometheus:\n    max_series_per_family: 3\n    idle_series_after: 2s\n",
    )
    .await;
    let proxy = format!("http://{}/v1/chat/completions", stack.proxy);
    let metrics = format!("http://{}/metrics", stack.api);
    let request_models = |m: &str| -> Vec<String> {
        let mut v: Vec<String> = m
            .lines()
            .filter(|l| l.starts_with("tokenwatch_requests_total{"))
            .filter_map(|l| {
                let (_, rest) = l.split_once("gen_ai_request_model=\"")?;
                Some(rest.split('"').next()?.to_string())
            })
            .collect();
        v.sort();
        v
    };
    let wait_for = |want: Vec<&'static str>| {
        let metrics = metrics.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let m = get(&metrics).await.body;
                if request_models(&m) == want {
                    return m;
                }
                assert!(
                    Instant::now() < deadline,
                    "want {want:?}, have {:?}",
                    request_models(&m)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // The simulator serves one model and answers 404 for the others: they are counted all the
    // same, under their own names (error_type 404).
    for model in ["old-0", "old-1", "old-2"] {
        let r = post(&proxy, &short_chat(model)).await;
        assert_eq!(r.status, 404, "{}", r.body);
    }
    wait_for(vec!["old-0", "old-1", "old-2"]).await;
    // Silent for longer than idle_series_after: a scrape no longer shows them …
    tokio::time::sleep(Duration::from_millis(2500)).await;
    wait_for(vec![]).await;
    // … and a new model has a series of its own.
    let r = post(&proxy, &short_chat("new-0")).await;
    assert_eq!(r.status, 404, "{}", r.body);
    let m = wait_for(vec!["new-0"]).await;
    assert_eq!(requests_overflow(&m), 0.0, "{m}");
}
