// Through the real binary with `--clickhouse-url`: requests through the proxy land in a real
// ClickHouse (checked over its own HTTP), the API answers from it, the stored roll-up sketches
// merge to the latency the API reports (also for two instances sharing the server), and a
// vanished server costs records (each counted), never requests, aggregates or a prompt `/readyz`.

use crate::common;

use common::clickhouse::start_clickhouse;
use common::*;
use std::time::{Duration, Instant};
use tokenwatch_core::model::LatencyMetric;
use tokenwatch_core::sketch::{LatencySketch, RELATIVE_ACCURACY};
use tokenwatch_store::{ClickHouseStore, RollupQuery, Store, StoreOptions};

const N: usize = 12;

fn chat(i: usize) -> String {
    format!(
        r#"{{"model":"m","stream":true,"max_tokens":{},"messages":[{{"role":"user","content":"hello {i}"}}]}}"#,
        4 + i % 5
    )
}

/// The value of rank floor(q * (n - 1)) of `v` (the rank `LatencySketch::quantile` estimates).
fn exact_quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(q * (v.len() - 1) as f64).floor() as usize]
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_from_clickhouse_and_an_outage_never_blocks_the_proxy() {
    let ch = start_clickhouse();
    let url = ch.url();
    let stack = Stack::start(
        &["--model", "m", "--ttft-ms", "40", "--itl-ms", "4"],
        &["--clickhouse-url", &url],
    )
    .await;
    assert!(
        !stack.data_dir().join("tokenwatch.db").exists(),
        "the SQLite file is not opened with the ClickHouse backend"
    );

    let proxy_url = format!("http://{}/v1/chat/completions", stack.proxy);
    for i in 0..N {
        let r = send("POST", &proxy_url, Some(&chat(i)), &[]).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }

    // /api/v1/requests: every record, read back from ClickHouse.
    let deadline = Instant::now() + Duration::from_secs(20);
    let recs = loop {
        let r = get(&format!(
            "http://{}/api/v1/requests?model=m&limit=100",
            stack.api
        ))
        .await;
        let recs = r.json()["requests"].as_array().cloned().unwrap_or_default();
        if recs.len() == N {
            break recs;
        }
        assert!(
            Instant::now() < deadline,
            "{} records of {N}: {}\n{}",
            recs.len(),
            r.body,
            stack.tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut api_ids: Vec<String> = recs
        .iter()
        .map(|r| r["request_id"].as_str().unwrap().to_string())
        .collect();
    api_ids.sort();
    // The same rows, asked of ClickHouse itself.
    let direct = ch.query(
        "SELECT request_id FROM tokenwatch.records_v6 WHERE model_id = 'm' ORDER BY request_id",
    );
    let direct: Vec<&str> = direct.lines().collect();
    assert_eq!(
        direct, api_ids,
        "ClickHouse holds exactly the records the API lists"
    );
    let one = stored_record(stack.api, &api_ids[0], &stack.tw).await;
    assert_eq!(one["request_id"], api_ids[0].as_str());
    assert!(one["output_tokens"].as_u64().unwrap() > 0, "{one}");
    let ready = get(&format!("http://{}/readyz", stack.api)).await.json();
    assert_eq!(ready["components"]["store"], "ok", "{ready}");

    // Roll-ups: the minute's sketches arrive once the minute is over (plus 5 s of grace).
    let store = ClickHouseStore::open(&ch.config("tokenwatch"), StoreOptions::default()).unwrap();
    let q = RollupQuery {
        model: Some("m".into()),
        metric: Some(LatencyMetric::E2e),
        from_unix_ms: 0,
        to_unix_ms: i64::MAX,
    };
    let deadline = Instant::now() + Duration::from_secs(100);
    let rows = loop {
        let rows = store.query_rollups(&q).unwrap();
        if rows.iter().map(|r| r.count).sum::<u64>() == N as u64 {
            break rows;
        }
        assert!(
            Instant::now() < deadline,
            "roll-ups never reached ClickHouse: {rows:?}\n{}",
            stack.tw.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let stored_rows = ch.query(
        "SELECT sum(count) FROM tokenwatch.rollups_v6 WHERE model_id = 'm' AND metric = 'e2e'",
    );
    assert_eq!(stored_rows.trim(), N.to_string());
    let mut merged = LatencySketch::default();
    for r in &rows {
        merged.merge_bytes(&r.sketch).unwrap();
    }
    let mut e2e: Vec<f64> = recs.iter().map(|r| r["end_s"].as_f64().unwrap()).collect();
    let latency = get(&format!(
        "http://{}/api/v1/latency?model=m&metric=e2e&window=1h",
        stack.api
    ))
    .await
    .json();
    assert_eq!(latency["count"], N as u64, "{latency}");
    for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
        let from_store = merged.quantile(q).unwrap();
        let exact = exact_quantile(&mut e2e, q);
        let api = latency[name].as_f64().unwrap();
        assert!(
            close(from_store, exact, RELATIVE_ACCURACY * 1.01),
            "{name}: stored sketches {from_store} vs records {exact}"
        );
        assert!(
            close(from_store, api, 2.0 * RELATIVE_ACCURACY),
            "{name}: stored sketches {from_store} vs API {api}"
        );
    }

    // ClickHouse goes away: requests still pass at full speed, the pipeline keeps feeding
    // /metrics while the store writer retries (10 s per call), /readyz answers at once, and
    // every record that could not be written is counted, one by one.
    drop(ch);
    let requests_before = series_sum(&metrics(stack.api).await, "tokenwatch_requests_total{");
    for wave in 1..=2 {
        for i in 0..4 {
            let started = Instant::now();
            let r = send("POST", &proxy_url, Some(&chat(i)), &[]).await.unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "a request took {:?} with the store down",
                started.elapsed()
            );
        }
        // Well within one retry of the writer (10 s): the aggregates do not wait on it.
        let deadline = Instant::now() + Duration::from_secs(4);
        loop {
            let m = metrics(stack.api).await;
            let seen = series_sum(&m, "tokenwatch_requests_total{") - requests_before;
            if seen == 4.0 * wave as f64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "wave {wave}: {seen} requests counted in /metrics while the store is down\n{m}\n{}",
                stack.tw.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let started = Instant::now();
        let r = get(&format!("http://{}/readyz", stack.api)).await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "/readyz took {:?} with the store down: {}",
            started.elapsed(),
            r.body
        );
    }
    let failed = "tokenwatch_store_records_dropped_total{reason=\"write_failed\"}";
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let m = metrics(stack.api).await;
        let lost = metric_value(&m, failed).unwrap_or(0.0);
        if lost == 8.0 {
            assert!(
                metric_value(&m, "tokenwatch_store_write_errors_total").unwrap_or(0.0) >= 1.0,
                "{m}"
            );
            assert_eq!(
                metric_value(
                    &m,
                    "tokenwatch_store_records_dropped_total{reason=\"queue_full\"}"
                ),
                Some(0.0),
                "{m}"
            );
            break;
        }
        assert!(
            lost < 8.0 && Instant::now() < deadline,
            "{lost} of 8 records counted as failed writes:\n{m}\n{}",
            stack.tw.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let started = Instant::now();
    let r = get(&format!("http://{}/readyz", stack.api)).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "/readyz took {:?}",
        started.elapsed()
    );
    // The proxy still forwards every request: it stays in rotation, the store's error named.
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("unreachable"), "{}", r.body);
    // Latency from the store: the store's failure is a 503 that names it; the in-memory
    // windows still answer.
    let r = get(&format!(
        "http://{}/api/v1/latency?model=m&metric=e2e&window=1h&source=store",
        stack.api
    ))
    .await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["store"], "clickhouse", "{}", r.body);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("clickhouse store"),
        "{}",
        r.body
    );
    let r = get(&format!(
        "http://{}/api/v1/latency?model=m&metric=e2e&window=1h&source=memory",
        stack.api
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["count"], (N + 8) as u64, "{}", r.body);
}

/// `/api/v1/latency` of `api` with `query`, as JSON; fails on anything but 200.
async fn latency(api: std::net::SocketAddr, query: &str) -> serde_json::Value {
    let r = get(&format!("http://{api}/api/v1/latency?{query}")).await;
    assert_eq!(r.status, 200, "{query}: {}", r.body);
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_clickhouse_report_the_latency_of_all_their_requests() {
    let ch = start_clickhouse();
    let url = ch.url();
    let tw_args = ["--clickhouse-url", url.as_str()];
    // Two proxies, each in front of its own simulator (one faster than the other).
    let a = Stack::start(
        &["--model", "m", "--ttft-ms", "30", "--itl-ms", "3"],
        &tw_args,
    )
    .await;
    let b = Stack::start(
        &["--model", "m", "--ttft-ms", "90", "--itl-ms", "6"],
        &tw_args,
    )
    .await;
    let (n_a, n_b) = (9usize, 14usize);
    for (stack, n) in [(&a, n_a), (&b, n_b)] {
        let proxy_url = format!("http://{}/v1/chat/completions", stack.proxy);
        for i in 0..n {
            let r = send("POST", &proxy_url, Some(&chat(i)), &[]).await.unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
        }
    }
    let total = n_a + n_b;

    // Every request's record, as either instance reads them back from ClickHouse.
    let deadline = Instant::now() + Duration::from_secs(20);
    let recs = loop {
        let r = get(&format!(
            "http://{}/api/v1/requests?model=m&limit=100",
            b.api
        ))
        .await;
        let recs = r.json()["requests"].as_array().cloned().unwrap_or_default();
        if recs.len() == total {
            break recs;
        }
        assert!(
            Instant::now() < deadline,
            "{} records of {total}: {}\n{}\n{}",
            recs.len(),
            r.body,
            a.tw.log(),
            b.tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut e2e: Vec<f64> = recs.iter().map(|r| r["end_s"].as_f64().unwrap()).collect();

    // Each instance's memory holds its own traffic only.
    for (stack, n) in [(&a, n_a), (&b, n_b)] {
        let mem = latency(stack.api, "model=m&metric=e2e&window=1h&source=memory").await;
        assert_eq!(mem["source"], "memory", "{mem}");
        assert_eq!(mem["count"], n as u64, "{mem}");
    }
    let r = get(&format!(
        "http://{}/api/v1/latency?model=m&window=6h&source=memory",
        a.api
    ))
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("source=store"), "{}", r.body);

    // Once the minute's roll-ups are flushed (5 s after the minute ends), the store answers
    // for both: the ClickHouse backend makes `store` the default source.
    let deadline = Instant::now() + Duration::from_secs(130);
    let from_a = loop {
        let l = latency(a.api, "model=m&metric=e2e&window=1h").await;
        assert_eq!(l["source"], "store", "{l}");
        if l["count"] == total as u64 {
            break l;
        }
        assert!(
            l["count"].as_u64().unwrap() < total as u64 && Instant::now() < deadline,
            "the store reports {} of {total} requests: {l}\n{}",
            l["count"],
            a.tw.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let through = from_a["through_unix_ms"].as_i64().unwrap();
    assert_eq!(through % 60_000, 0, "{from_a}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        through <= now_ms && from_a["from_unix_ms"] == through - 3_600_000,
        "{from_a}"
    );
    let from_b = latency(b.api, "model=m&metric=e2e&window=1h&source=store").await;
    for (who, l) in [("a", &from_a), ("b", &from_b)] {
        assert_eq!(l["count"], total as u64, "{who}: {l}");
        for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
            let exact = exact_quantile(&mut e2e, q);
            let got = l[name].as_f64().unwrap();
            assert!(
                close(got, exact, RELATIVE_ACCURACY * 1.01),
                "{who} {name}: store {got} vs exact {exact} of all requests: {l}"
            );
        }
    }
    // The same figures over the longest window, and one group per proxy instance.
    let week = latency(b.api, "model=m&metric=e2e&window=7d").await;
    assert_eq!(week["count"], total as u64, "{week}");
    assert_eq!(week["p50"], from_a["p50"], "{week}");
    let by = latency(a.api, "model=m&metric=e2e&window=24h&by=instance").await;
    let mut counts: Vec<u64> = by["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["summary"]["count"].as_u64().unwrap())
        .collect();
    counts.sort();
    assert_eq!(counts, [n_a as u64, n_b as u64], "{by}");
    let instances: Vec<&str> = by["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["labels"]["instance"].as_str().unwrap())
        .collect();
    assert!(
        instances.iter().all(|i| !i.is_empty()) && instances[0] != instances[1],
        "{by}"
    );
}

async fn metrics(api: std::net::SocketAddr) -> String {
    get(&format!("http://{api}/metrics")).await.body
}

/// The sum of every series whose line starts with `prefix` (all label sets of one metric).
fn series_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
