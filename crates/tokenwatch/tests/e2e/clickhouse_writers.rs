// Two tokenwatch proxies in front of the SAME upstream instance share one ClickHouse: their
// roll-ups of one series and minute are kept per writer and merged at query time (issue 11).

use crate::common;

use common::clickhouse::start_clickhouse;
use common::*;
use std::time::{Duration, Instant};

fn chat(i: usize) -> String {
    format!(
        r#"{{"model":"m","stream":true,"max_tokens":{},"messages":[{{"role":"user","content":"hi {i}"}}]}}"#,
        3 + i % 4
    )
}

async fn latency(api: std::net::SocketAddr, query: &str) -> serde_json::Value {
    let r = get(&format!("http://{api}/api/v1/latency?{query}")).await;
    assert_eq!(r.status, 200, "{query}: {}", r.body);
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_of_one_upstream_instance_add_up_in_the_shared_store() {
    let ch = start_clickhouse();
    let url = ch.url();
    // a: writer id derived and kept in its data dir; b: configured in its file.
    let a = Stack::start(
        &["--model", "m", "--ttft-ms", "30", "--itl-ms", "3"],
        &["--clickhouse-url", &url],
    )
    .await;
    let b_dir = tempfile::tempdir().unwrap();
    let b_cfg = b_dir.path().join("tw.yaml");
    std::fs::write(&b_cfg, "store:\n  writer_id: proxy-b\n").unwrap();
    let (b_tw, b_api, b_proxy) = run_tokenwatch(
        b_dir.path(),
        &format!("http://{}", a.sim_addr),
        &["--clickhouse-url", &url, "-c", b_cfg.to_str().unwrap()],
    )
    .await;

    let kept = std::fs::read_to_string(a.data_dir().join("writer_id")).unwrap();
    let a_writer = kept.trim().to_string();
    assert!(!a_writer.is_empty() && a_writer != "proxy-b", "{kept:?}");
    assert!(
        !b_dir.path().join("data/writer_id").exists(),
        "a configured writer id is not derived nor written"
    );

    let (n_a, n_b) = (7usize, 11usize);
    for (proxy, n) in [(a.proxy, n_a), (b_proxy, n_b)] {
        let proxy_url = format!("http://{proxy}/v1/chat/completions");
        for i in 0..n {
            let r = send("POST", &proxy_url, Some(&chat(i)), &[]).await.unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
        }
    }
    let total = (n_a + n_b) as u64;

    // Once both minutes are flushed (5 s after the minute ends), either instance reports the
    // requests of both, under the one instance label they share.
    let deadline = Instant::now() + Duration::from_secs(130);
    loop {
        let l = latency(a.api, "model=m&metric=e2e&window=1h&source=store").await;
        if l["count"] == total {
            break;
        }
        assert!(
            l["count"].as_u64().unwrap() < total && Instant::now() < deadline,
            "the store reports {} of {total} requests: {l}\n{}\n{}",
            l["count"],
            a.tw.log(),
            b_tw.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for api in [a.api, b_api] {
        let l = latency(api, "model=m&metric=e2e&window=1h&source=store").await;
        assert_eq!(l["count"], total, "{l}");
        let by = latency(api, "model=m&metric=e2e&window=1h&source=store&by=instance").await;
        let groups = by["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 1, "one upstream instance: {by}");
        assert_eq!(
            groups[0]["labels"]["instance"],
            a.sim_addr.to_string(),
            "{by}"
        );
        assert_eq!(groups[0]["summary"]["count"], total, "{by}");
    }
    // Each proxy's minutes are stored under its own writer, none replaced the other's.
    let per_writer = ch.query(
        "SELECT writer, sum(count) FROM tokenwatch.rollups_v6 FINAL \
         WHERE model_id = 'm' AND metric = 'e2e' GROUP BY writer ORDER BY writer",
    );
    let mut want = [format!("{a_writer}\t{n_a}"), format!("proxy-b\t{n_b}")];
    want.sort();
    assert_eq!(per_writer.trim(), want.join("\n"));
}
