// Two tokenwatch instances watching the same target, sharing one ClickHouse and a real
// Alertmanager: the alert both fire is one incident, one alert in Alertmanager and one in the
// shared store's alert list (issue 11).

use crate::common;

use common::alertmanager::Alertmanager;
use common::clickhouse::start_clickhouse;
use common::metrics_target::MetricsTarget;
use common::*;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tokenwatch_store::{ClickHouseStore, Store, StoreOptions};

const RULE: &str = "dual_running";

fn write_config(dir: &Path, target: &str, am: &str) -> String {
    let y = format!(
        "alerting:\n  default_rules: false\n  incident_window: 1h\n  delivery: {{alertmanagers: ['{am}'], resend_interval: 1s}}\n  rules:\n    - name: {RULE}\n      detector: threshold\n      signal: requests_running\n      group_by: [model_id]\n      params: {{op: '>', value: 0.5}}\n\
         scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n    - url: {target}\n"
    );
    let p = dir.join("tw.yaml");
    std::fs::write(&p, y).unwrap();
    p.to_string_lossy().into_owned()
}

/// The firing alert of `RULE` on `api`, once there is one.
async fn firing(api: SocketAddr, tw: &Proc) -> Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let v = get(&format!("http://{api}/api/v1/alerts?state=firing"))
            .await
            .json();
        if let Some(a) = v["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["rule"] == RULE)
        {
            return a.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{api}: no firing {RULE}: {v}\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_two_instances_fire_is_one_incident_in_alertmanager_and_the_store() {
    let ch = start_clickhouse();
    let ch_url = ch.url();
    let am_dir = tempfile::tempdir().unwrap();
    let am = Alertmanager::start_with_config(
        am_dir.path(),
        "route:\n  receiver: none\n  group_by: ['incident_id']\nreceivers:\n  - name: none\n",
    )
    .await;
    let body = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"dual\"} 2\n\
                # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"dual\"} 0\n";
    let target = MetricsTarget::start(move || body.to_string()).await;
    let target_url = format!("http://{}/metrics", target.addr);
    // An upstream nobody listens on: no request goes through the proxies.
    let upstream = format!("http://{}", free_addr());

    let mut instances = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_config(dir.path(), &target_url, &am.url);
        // Each on ports it picks: the instances are told apart by their alerts'
        // generatorURL, built from the address the API bound.
        let (tw, api, _) = run_tokenwatch(
            dir.path(),
            &upstream,
            &["--config", &cfg, "--clickhouse-url", &ch_url],
        )
        .await;
        instances.push((dir, api, tw));
    }

    // Each instance fires it under its own alert id, in the same incident.
    let a = firing(instances[0].1, &instances[0].2).await;
    let b = firing(instances[1].1, &instances[1].2).await;
    assert_ne!(a["id"], b["id"], "each instance tracks its own copy");
    assert_eq!(a["fingerprint"], b["fingerprint"]);
    let incident = a["incident_id"].as_str().unwrap().to_string();
    assert!(!incident.is_empty(), "{a}");
    assert_eq!(b["incident_id"], incident.as_str(), "{a}\n{b}");

    // Alertmanager: both instances posted it (each its own generator URL over time), and it
    // holds one alert, labelled with the shared incident.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut generators = std::collections::BTreeSet::new();
    loop {
        let alerts: Vec<Value> = am
            .alerts()
            .await
            .into_iter()
            .filter(|x| x["labels"]["alertname"] == RULE)
            .collect();
        assert!(
            alerts.len() <= 1,
            "one alert in Alertmanager, got {alerts:?}"
        );
        if let Some(x) = alerts.first() {
            assert_eq!(x["labels"]["incident_id"], incident.as_str(), "{x}");
            assert_eq!(x["labels"]["model_id"], "dual", "{x}");
            if let Some(g) = x["generatorURL"].as_str() {
                generators.insert(g.split("/api/").next().unwrap_or("").to_string());
            }
        }
        if generators.len() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Alertmanager saw {generators:?} post {RULE}, want both instances: {alerts:?}\n{}\n{}",
            instances[0].2.log(),
            instances[1].2.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The shared store holds both copies and lists the alert once.
    let store = ClickHouseStore::open(&ch.config("tokenwatch"), StoreOptions::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stored = ch.query(&format!(
            "SELECT uniqExact(id) FROM tokenwatch.alerts_v6 WHERE deleted = 0 AND state = 'firing' \
             AND alert LIKE '%\"rule\":\"{RULE}\"%'"
        ));
        if stored.trim() == "2" {
            break;
        }
        assert!(Instant::now() < deadline, "stored copies: {stored}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let listed: Vec<_> = store
        .load_alerts(0)
        .unwrap()
        .into_iter()
        .filter(|x| x.rule == RULE)
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].incident_id.as_deref(), Some(incident.as_str()));
    drop((instances, target, ch, am));
}
