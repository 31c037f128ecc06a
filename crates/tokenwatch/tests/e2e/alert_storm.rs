// An alert storm through the real binary (issue 35 item 10): a scrape target reporting 300
// models at once, every one over a threshold rule grouped by model, opens
// `alerting.max_alerts_per_rule` alerts and one `__other__` alert standing for the rest (counted),
// with a snapshot each — not 300 alerts and 300 snapshot files.

use crate::common;

use common::metrics_target::MetricsTarget;
use common::*;
use std::time::{Duration, Instant};

const MODELS: usize = 300;
const CAP: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_models_over_one_rule_is_the_cap_and_one_folded_alert() {
    let mut body = String::from("# TYPE vllm:num_requests_running gauge\n");
    for i in 0..MODELS {
        body.push_str(&format!(
            "vllm:num_requests_running{{model_name=\"storm-{i}\"}} {}\n",
            2 + i
        ));
    }
    let target = MetricsTarget::start(move || body.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "alerting:\n  default_rules: false\n  max_alerts_per_rule: {CAP}\n  rules:\n    - name: storm\n      detector: threshold\n      signal: requests_running\n      group_by: [model_id]\n      params: {{op: '>', value: 1}}\n      runbook_url: 'https://wiki.example/runbooks/{{{{ rule }}}}?model={{{{ labels.model_id }}}}'\n\
             scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n    - url: http://{}/metrics\n",
            target.addr
        ),
    );
    let (tw, api) = start_collector(dir.path(), &["-c", &config.to_string_lossy()]).await;

    // Wait until the storm has fired: CAP alerts and the folded one.
    let deadline = Instant::now() + Duration::from_secs(40);
    let alerts = loop {
        let v = get(&format!("http://{api}/api/v1/alerts?state=firing"))
            .await
            .json();
        let list = v["alerts"].as_array().cloned().unwrap_or_default();
        if list.len() > CAP {
            break list;
        }
        assert!(
            Instant::now() < deadline,
            "the storm never fired: {v}\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // A few evaluations more: nothing beyond the cap opens.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = get(&format!("http://{api}/api/v1/alerts")).await.json();
    let all = all["alerts"].as_array().cloned().unwrap_or_default();
    assert_eq!(all.len(), CAP + 1, "{all:#?}");
    let folded: Vec<_> = alerts
        .iter()
        .filter(|a| a["labels"]["model_id"] == "__other__")
        .collect();
    assert_eq!(folded.len(), 1, "{alerts:#?}");
    let count: usize = folded[0]["annotations"]["folded_label_sets"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count: {}", folded[0]));
    assert_eq!(count, MODELS - CAP, "{}", folded[0]);
    // The strongest models (the highest values) kept their own alerts, each with its runbook.
    for a in alerts
        .iter()
        .filter(|a| a["labels"]["model_id"] != "__other__")
    {
        let model = a["labels"]["model_id"].as_str().unwrap();
        assert_eq!(
            a["annotations"]["runbook_url"],
            format!("https://wiki.example/runbooks/storm?model={model}"),
            "{a}"
        );
        let i: usize = model.trim_start_matches("storm-").parse().unwrap();
        assert!(i >= MODELS - CAP, "{model} kept over a stronger one");
    }
    let metrics = get(&format!("http://{api}/metrics")).await.body;
    let folded_total = metric_value(&metrics, "tokenwatch_alerts_folded_total{rule=\"storm\"}");
    assert!(
        folded_total.is_some_and(|n| n >= (MODELS - CAP) as f64),
        "{folded_total:?}"
    );
    // One snapshot per alert at most.
    let snapshots = std::fs::read_dir(dir.path().join("data").join("snapshots"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(snapshots <= CAP + 1, "{snapshots} snapshots");
    let warned = tw
        .log()
        .lines()
        .filter(|l| l.contains("max_alerts_per_rule") && l.contains("storm"))
        .count();
    assert_eq!(warned, 1, "warned once:\n{}", tw.log());
}
