// `/api/v1/latency` on the embedded SQLite backend, through the real binary: memory is the
// default source, `source=store` merges the stored per-minute roll-ups to the same figures.

use crate::common;

use common::*;
use std::time::{Duration, Instant};
use tokenwatch_core::sketch::RELATIVE_ACCURACY;

const N: usize = 10;

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

/// The value of rank floor(q * (n - 1)) of `v` (the rank `LatencySketch::quantile` estimates).
fn exact_quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(q * (v.len() - 1) as f64).floor() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_store_answers_latency_from_its_rollups_and_bad_sources_are_refused() {
    let stack = Stack::start(&["--model", "m", "--ttft-ms", "25", "--itl-ms", "2"], &[]).await;
    let proxy_url = format!("http://{}/v1/chat/completions", stack.proxy);
    for i in 0..N {
        let body = format!(
            r#"{{"model":"m","stream":true,"max_tokens":{},"messages":[{{"role":"user","content":"hi {i}"}}]}}"#,
            3 + i % 4
        );
        let r = send("POST", &proxy_url, Some(&body), &[]).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let api = stack.api;

    for (query, says) in [
        ("source=bogus", "memory, store"),
        ("source=store&window=2m", "1m, 5m, 1h, 6h, 24h, 7d"),
        ("window=7d", "source=store"),
    ] {
        let r = get(&format!("http://{api}/api/v1/latency?{query}")).await;
        assert_eq!(r.status, 400, "{query}: {}", r.body);
        assert!(
            r.json()["error"].as_str().unwrap().contains(says),
            "{query}: {}",
            r.body
        );
    }

    // Memory is the default with SQLite; it sees every request at once.
    let deadline = Instant::now() + Duration::from_secs(20);
    let memory = loop {
        let r = get(&format!(
            "http://{api}/api/v1/latency?model=m&metric=ttft&window=1h"
        ))
        .await;
        let l = r.json();
        assert_eq!(l["source"], "memory", "{l}");
        if l["count"] == N as u64 {
            break l;
        }
        assert!(Instant::now() < deadline, "{l}\n{}", stack.tw.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The store: once the minute's roll-ups are written (5 s after the minute ends).
    let deadline = Instant::now() + Duration::from_secs(130);
    let stored = loop {
        let r = get(&format!(
            "http://{api}/api/v1/latency?model=m&metric=ttft&window=1h&source=store"
        ))
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let l = r.json();
        assert_eq!(l["source"], "store", "{l}");
        if l["count"] == N as u64 {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "the store reports {l}\n{}",
            stack.tw.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        stored["through_unix_ms"].as_i64().unwrap() % 60_000,
        0,
        "{stored}"
    );
    let recs = get(&format!("http://{api}/api/v1/requests?model=m&limit=100"))
        .await
        .json();
    let mut ttft: Vec<f64> = recs["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["first_token_s"].as_f64().unwrap())
        .collect();
    assert_eq!(ttft.len(), N, "{recs}");
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        let (from_store, from_memory) = (
            stored[name].as_f64().unwrap(),
            memory[name].as_f64().unwrap(),
        );
        let exact = exact_quantile(&mut ttft, q);
        assert!(
            close(from_store, exact, RELATIVE_ACCURACY * 1.01),
            "{name}: store {from_store} vs exact {exact}"
        );
        assert!(
            close(from_store, from_memory, 2.0 * RELATIVE_ACCURACY),
            "{name}: store {from_store} vs memory {from_memory}"
        );
    }
    let week = get(&format!(
        "http://{api}/api/v1/latency?model=m&metric=ttft&window=7d&source=store&by=runtime"
    ))
    .await;
    assert_eq!(week.status, 200, "{}", week.body);
    let week = week.json();
    assert_eq!(week["window"], "7d", "{week}");
    assert_eq!(week["count"], N as u64, "{week}");
    assert_eq!(week["groups"][0]["labels"]["runtime"], "sim", "{week}");
    assert_eq!(week["groups"][0]["summary"]["count"], N as u64, "{week}");
}
