// Sharded collectors end to end: two tokenwatch instances (`--shard 0/2` and `scrape.shard`
// 1/2), one target list, one real ClickHouse and Alertmanager: each target is scraped by exactly
// one, the fleet API of either lists all of them, each alert reaches Alertmanager once.

use crate::common;

use common::alertmanager::Alertmanager;
use common::clickhouse::start_clickhouse;
use common::metrics_target::MetricsTarget;
use common::*;
use md5::{Digest, Md5};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Prometheus `hashmod` over `__address__`, written out here apart from tokenwatch's own:
/// `binary.BigEndian.Uint64(md5.Sum(addr)[8:]) % modulus`.
fn prometheus_hashmod(address: &str, modulus: u64) -> u64 {
    let d = Md5::digest(address.as_bytes());
    let low: [u8; 8] = d[8..16].try_into().unwrap();
    u64::from_be_bytes(low) % modulus
}

/// A vLLM-shaped /metrics endpoint for `model` that counts the scrapes it answers.
async fn counting_target(model: String) -> MetricsTarget {
    let body = format!(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"{model}\"}} 1\n\
         # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"{model}\"}} 0\n"
    );
    MetricsTarget::start(move || body.clone()).await
}

/// A real Alertmanager whose receiver sends nothing: the test reads its alerts over its API.
async fn start_alertmanager(dir: &Path) -> Alertmanager {
    Alertmanager::start_with_config(
        dir,
        "route:\n  receiver: none\n  group_by: ['alertname']\nreceivers:\n  - name: none\n",
    )
    .await
}

/// Scrape every target each second; alert (to `am`) on any model with a request running —
/// only the counting endpoints report one.
fn write_config(dir: &Path, targets: &[String], shard_in_file: Option<&str>, am: &str) -> String {
    let mut y = format!(
        "alerting:\n  default_rules: false\n  delivery: {{alertmanagers: ['{am}']}}\n  rules:\n    - name: counted_running\n      detector: threshold\n      signal: requests_running\n      group_by: [model_id]\n      params: {{op: '>', value: 0.5}}\n"
    );
    y.push_str("scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n");
    for t in targets {
        y.push_str(&format!("    - url: {t}\n"));
    }
    if let Some(s) = shard_in_file {
        y.push_str(&format!("  shard: {s}\n"));
    }
    let p = dir.join("tw.yaml");
    std::fs::write(&p, y).unwrap();
    p.to_string_lossy().into_owned()
}

async fn targets_json(api: SocketAddr) -> Value {
    get(&format!("http://{api}/api/v1/targets")).await.json()
}

/// Waits until `api` reports exactly `want` as its targets, all up; returns the status.
async fn wait_all_up(api: SocketAddr, want: &BTreeSet<String>, tw: &Proc) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = targets_json(api).await;
        let up: BTreeSet<String> = v["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["health"] == "up")
            .filter_map(|t| t["url"].as_str().map(str::to_string))
            .collect();
        let all: BTreeSet<String> = v["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["url"].as_str().map(str::to_string))
            .collect();
        if &up == want && &all == want {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "targets of {api}: want {want:?} up, got {v}\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn other_shards(v: &Value) -> BTreeMap<String, u64> {
    v["other_shards"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["url"].as_str().unwrap().to_string(),
                o["shard"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_split_targets_as_hashmod_and_share_fleet_and_alertmanager() {
    let ch = start_clickhouse();
    let ch_url = ch.url();
    let sim_dir = tempfile::tempdir().unwrap();
    let am = start_alertmanager(sim_dir.path()).await;

    // Three simulators (vLLM-style /metrics) and five counting endpoints: ten targets.
    let mut sims = Vec::new();
    let mut urls = Vec::new();
    for i in 0..3 {
        let model = format!("sim-model-{i}");
        let p = Proc::start(
            &format!("sim{i}"),
            &["sim", "--listen", ANY, "--model", &model],
            sim_dir.path(),
        );
        let addr = p.sim_listening().await;
        wait_ready(&format!("http://{addr}/v1/models"), &p).await;
        urls.push(format!("http://{addr}/metrics"));
        sims.push((addr, p));
    }
    let mut counting = Vec::new();
    for i in 0..5 {
        let t = counting_target(format!("counted-model-{i}")).await;
        urls.push(format!("http://{}/metrics", t.addr));
        counting.push(t);
    }
    let shard_of = |url: &str| -> u64 {
        let addr = url
            .strip_prefix("http://")
            .and_then(|r| r.split('/').next())
            .unwrap();
        prometheus_hashmod(addr, 2)
    };
    let expected: [BTreeSet<String>; 2] =
        [0, 1].map(|s| urls.iter().filter(|u| shard_of(u) == s).cloned().collect());
    let upstream = format!("http://{}", sims[0].0);

    // Shard 0 alone first: it scrapes its share, and nothing of shard 1 is touched.
    let dir0 = tempfile::tempdir().unwrap();
    let cfg0 = write_config(dir0.path(), &urls, None, &am.url);
    // Each shard on ports it picks: an alert names its sender by generatorURL, built from the
    // address its API bound.
    let (tw0, api0, _) = run_tokenwatch(
        dir0.path(),
        &upstream,
        &[
            "--config",
            &cfg0,
            "--clickhouse-url",
            &ch_url,
            "--shard",
            "0/2",
        ],
    )
    .await;
    let st0 = wait_all_up(api0, &expected[0], &tw0).await;
    assert_eq!(
        other_shards(&st0),
        expected[1].iter().map(|u| (u.clone(), 1)).collect(),
        "{st0}"
    );
    assert_eq!(
        st0["shard"],
        serde_json::json!({"index": 0, "count": 2, "owned": expected[0].len(), "other": expected[1].len()})
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for t in &counting {
        let url = format!("http://{}/metrics", t.addr);
        if shard_of(&url) == 0 {
            assert!(t.hits() > 0, "{url} (shard 0) never scraped");
        } else {
            assert_eq!(t.hits(), 0, "{url} belongs to shard 1 but was scraped");
        }
    }

    // Shard 1 from the configuration file, the same targets and the same ClickHouse.
    let dir1 = tempfile::tempdir().unwrap();
    let cfg1 = write_config(dir1.path(), &urls, Some("{index: 1, count: 2}"), &am.url);
    let (tw1, api1, _) = run_tokenwatch(
        dir1.path(),
        &upstream,
        &["--config", &cfg1, "--clickhouse-url", &ch_url],
    )
    .await;
    let st1 = wait_all_up(api1, &expected[1], &tw1).await;
    assert_eq!(
        other_shards(&st1),
        expected[0].iter().map(|u| (u.clone(), 0)).collect(),
        "{st1}"
    );

    // Both running: every counted target is scraped once a second, not twice.
    let before: Vec<usize> = counting.iter().map(MetricsTarget::hits).collect();
    let window = Duration::from_secs(6);
    tokio::time::sleep(window).await;
    for (t, b) in counting.iter().zip(&before) {
        let n = t.hits() - b;
        assert!(
            (1..=window.as_secs() as usize + 2).contains(&n),
            "{}: {n} scrapes in {window:?} at a 1s interval (two collectors would double it)",
            t.addr
        );
    }
    // The union of the two instances' targets is every target, their intersection empty.
    let mine = |v: &Value| -> BTreeSet<String> {
        v["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["url"].as_str().map(str::to_string))
            .collect()
    };
    let (m0, m1) = (
        mine(&targets_json(api0).await),
        mine(&targets_json(api1).await),
    );
    assert!(m0.is_disjoint(&m1), "{m0:?} {m1:?}");
    assert_eq!(
        m0.union(&m1).cloned().collect::<BTreeSet<_>>(),
        urls.iter().cloned().collect()
    );
    // The split is exported on both.
    for api in [api0, api1] {
        let m = get(&format!("http://{api}/metrics")).await.body;
        for (s, targets) in expected.iter().enumerate().take(2) {
            assert_eq!(
                metric_value(
                    &m,
                    &format!("tokenwatch_scrape_shard_targets{{shard=\"{s}\"}}")
                ),
                Some(targets.len() as f64),
                "{api}"
            );
        }
    }
    // The fleet API of either instance lists every target, each with the shard scraping it,
    // read from what both published to the shared ClickHouse.
    let want: BTreeMap<String, String> = urls
        .iter()
        .map(|u| (u.clone(), format!("{}/2", shard_of(u))))
        .collect();
    for (api, tw) in [(api0, &tw0), (api1, &tw1)] {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = get(&format!("http://{api}/api/v1/fleet")).await.json();
            let got: BTreeMap<String, String> = v["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["health"] == "up" && t["stale"] == false)
                .map(|t| {
                    (
                        t["url"].as_str().unwrap_or("").to_string(),
                        t["shard"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            if got == want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "fleet of {api}: want {want:?}, got {v}\n{}",
                tw.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // Each model's alert reaches Alertmanager once, from the instance that scrapes its target.
    let owner_api = |model: &str| -> String {
        let i: usize = model.trim_start_matches("counted-model-").parse().unwrap();
        let url = format!("http://{}/metrics", counting[i].addr);
        format!("http://{}", if shard_of(&url) == 0 { api0 } else { api1 })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alerts: Vec<Value> = am
            .alerts()
            .await
            .into_iter()
            .filter(|a| a["labels"]["alertname"] == "counted_running")
            .collect();
        let mut per_model: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for a in &alerts {
            per_model
                .entry(a["labels"]["model_id"].as_str().unwrap_or("").to_string())
                .or_default()
                .push(a["generatorURL"].as_str().unwrap_or("").to_string());
        }
        let want: BTreeSet<String> = (0..counting.len())
            .map(|i| format!("counted-model-{i}"))
            .collect();
        if per_model.keys().cloned().collect::<BTreeSet<_>>() == want {
            for (model, gens) in &per_model {
                assert_eq!(
                    gens.len(),
                    1,
                    "{model} in Alertmanager {} times: {alerts:?}",
                    gens.len()
                );
                assert!(
                    gens[0].starts_with(&owner_api(model)),
                    "{model} sent by {} (its target is scraped by {})",
                    gens[0],
                    owner_api(model)
                );
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Alertmanager has {per_model:?}, want one alert for each of {want:?}\n{}\n{}",
            tw0.log(),
            tw1.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    drop((tw0, tw1, sims, ch, am));
}
