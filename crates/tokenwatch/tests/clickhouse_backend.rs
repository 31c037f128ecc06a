// Through the real binary with `--clickhouse-url`: requests through the proxy land in a real
// ClickHouse (checked over its own HTTP), the API answers from it, the stored roll-up sketches
// merge to the latency the API reports, and a vanished server costs records (each counted),
// never requests, aggregates or a prompt `/readyz`.

mod common;

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
        "SELECT request_id FROM tokenwatch.records WHERE model_id = 'm' ORDER BY request_id",
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
    let stored_rows = ch
        .query("SELECT sum(count) FROM tokenwatch.rollups WHERE model_id = 'm' AND metric = 'e2e'");
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
    assert!(started.elapsed() < Duration::from_secs(1), "/readyz took {:?}", started.elapsed());
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("unreachable"), "{}", r.body);
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
