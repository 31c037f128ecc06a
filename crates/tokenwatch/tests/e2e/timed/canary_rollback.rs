// Canary rollback through the real binary: two simulators behind an 80/20 weighted route; a
// faulty canary is set to weight 0 automatically with an alert, a healthy one keeps its share.

use crate::alerting_support;
use crate::common;

use alerting_support::{FAST, MODEL, Stack, Traffic};
use common::{get, send, start_sim};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The tests share the machine's cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The canary simulator as `proxy.upstreams[0]` (instance `canary-gpu`); the stable one is the
/// `--upstream` the test stack adds after it (index 1). Route `chat` splits 80/20.
fn config(canary: SocketAddr, window: &str) -> String {
    format!(
        r#"
alerting:
  resolve_after: 3s
  overrides:
    canary_rollback:
      window: {window}
      resolve_after: 3s
      params: {{min_requests: 15}}
proxy:
  upstreams:
    - url: http://{canary}
      models: [{MODEL}]
      runtime: sim
      instance: canary-gpu
  routes:
    - name: chat
      model: {MODEL}
      split:
        - {{upstream: '1', version: v1, weight: 80}}
        - {{upstream: canary-gpu, version: v2, weight: 20}}
"#
    )
}

async fn route(api: SocketAddr) -> Value {
    let r = get(&format!("http://{api}/api/v1/routes/chat")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

async fn post_weights(api: SocketAddr, route: &str, body: &str) -> common::Reply {
    send(
        "POST",
        &format!("http://{api}/api/v1/routes/{route}/weights"),
        Some(body),
        &[],
    )
    .await
    .unwrap_or_else(|e| panic!("POST {e}"))
}

/// The model versions of the records that arrived after `since_ms`, once at least `n` are stored.
async fn versions_since(api: SocketAddr, since_ms: i64, n: usize) -> Vec<String> {
    let since = chrono::DateTime::from_timestamp_millis(since_ms)
        .expect("a valid time")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let url = format!("http://{api}/api/v1/requests?model={MODEL}&limit=10000&since={since}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = get(&url).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let recs = v["requests"].as_array().cloned().unwrap_or_default();
        let versions: Vec<String> = recs
            .iter()
            .filter(|r| r["arrival_unix_ms"].as_i64().is_some_and(|t| t >= since_ms))
            .map(|r| {
                // The arm is the record's A/B group as well as its version.
                assert_eq!(r["ab_group"], r["model_version"], "{r:#}");
                r["model_version"].as_str().unwrap_or_default().to_string()
            })
            .collect();
        if versions.len() >= n {
            return versions;
        }
        assert!(
            Instant::now() < deadline,
            "only {} records since {since}",
            versions.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[tokio::test]
async fn a_faulty_canary_is_rolled_back_and_restored_through_the_api() {
    let _serial = SERIAL.lock().await;
    let canary_dir = tempfile::tempdir().unwrap();
    let mut canary_args = FAST.to_vec();
    canary_args.extend(["--fault", "error_burst:rate=0.6"]);
    let (_canary, canary) = start_sim(canary_dir.path(), &canary_args).await;
    let s = Stack::with_sim(FAST, &config(canary, "3s")).await;

    let before = route(s.api).await;
    assert_eq!(before["arms"][0]["role"], "stable", "{before:#}");
    assert_eq!(before["arms"][1]["weight"], 20.0, "{before:#}");
    assert_eq!(before["arms"][1]["upstream"], "canary-gpu", "{before:#}");

    let traffic = Traffic::plain(s.proxy, 8);
    let alert = s
        .wait_firing("canary_rollback", Duration::from_secs(60), |a| {
            a["labels"]["model_version"] == "v2"
        })
        .await;
    assert_eq!(alert["labels"]["route"], "chat", "{alert:#}");
    let ev = &alert["last_event"]["evidence"];
    assert_eq!(ev["weight_before"], 20.0, "{alert:#}");
    assert_eq!(ev["weight_now"], 0.0, "{alert:#}");
    assert_eq!(ev["stable_version"], "v1", "{alert:#}");
    assert!(
        ev["bad_windows"].as_u64().is_some_and(|n| n >= 2),
        "{alert:#}"
    );
    assert!(
        ev["reason"]
            .as_str()
            .is_some_and(|r| r.contains("error rate")),
        "{alert:#}"
    );
    assert_eq!(ev["window_evidence"]["error_regression"], true, "{alert:#}");
    let summary = alert["annotations"]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("rolled back") && summary.contains("POST /api/v1/routes/chat/weights"),
        "{alert:#}"
    );
    assert!(
        alert["annotations"]["description"]
            .as_str()
            .is_some_and(|d| d.contains(r#"{"weights": {"v2": 20}}"#)),
        "{alert:#}"
    );

    let rolled = route(s.api).await;
    assert_eq!(rolled["arms"][1]["weight"], 0.0, "{rolled:#}");
    assert_eq!(rolled["arms"][1]["configured_weight"], 20.0, "{rolled:#}");
    assert_eq!(rolled["arms"][1]["rolled_back"], true, "{rolled:#}");
    assert_eq!(
        rolled["rollback"]["rolled_back"][0]["version"], "v2",
        "{rolled:#}"
    );
    // The window that decided it: the canary failed far more often than the stable arm.
    let last = &rolled["last_window"]["arms"];
    assert!(last[1]["error_rate"].as_f64().unwrap() > 0.3, "{rolled:#}");
    assert!(last[0]["error_rate"].as_f64().unwrap() < 0.05, "{rolled:#}");
    // The act stage applied the decision once, and counted it.
    let metrics = common::get(&format!("http://{}/metrics", s.api)).await.body;
    assert!(
        metrics
            .contains(r#"tokenwatch_actions_total{action="canary_rollback",outcome="applied"} 1"#),
        "{metrics}"
    );

    // From now on every request goes to the stable version.
    let after_rollback = versions_since(s.api, now_ms(), 150).await;
    assert!(
        after_rollback.iter().all(|v| v == "v1"),
        "{after_rollback:?}"
    );

    // Refused changes leave the weights alone.
    assert_eq!(
        post_weights(s.api, "nope", r#"{"weights": {"v2": 1}}"#)
            .await
            .status,
        404
    );
    let bad = post_weights(s.api, "chat", r#"{"weights": {"v9": 1}}"#).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(
        bad.body.contains("v9") && bad.body.contains("v1, v2"),
        "{}",
        bad.body
    );
    assert_eq!(
        post_weights(s.api, "chat", r#"{"weights": {"v1": 0}}"#)
            .await
            .status,
        400
    );
    assert_eq!(
        post_weights(s.api, "chat", r#"{"weights": {"v2": -1}}"#)
            .await
            .status,
        400
    );
    assert_eq!(
        post_weights(s.api, "chat", r#"{"wieghts": {}}"#)
            .await
            .status,
        400
    );
    assert_eq!(route(s.api).await["arms"][1]["weight"], 0.0);

    // The canary is fixed; the operator restores its weight as the alert says.
    let off = send(
        "DELETE",
        &format!("http://{canary}/admin/faults/error_burst"),
        None,
        &[],
    )
    .await
    .unwrap();
    assert!(off.status < 300, "{}", off.body);
    let restored = post_weights(s.api, "chat", r#"{"weights": {"v2": 20}}"#).await;
    assert_eq!(restored.status, 200, "{}", restored.body);
    let v = restored.json();
    assert_eq!(v["arms"][1]["weight"], 20.0, "{v:#}");
    assert_eq!(v["arms"][1]["rolled_back"], false, "{v:#}");
    let split = versions_since(s.api, now_ms(), 300).await;
    let canary_share = split.iter().filter(|v| *v == "v2").count() as f64 / split.len() as f64;
    assert!(
        (0.1..=0.32).contains(&canary_share),
        "canary share {canary_share} of {} records after the restore",
        split.len()
    );
    // The rollback alert resolves once the canary is back.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let open = s
            .alerts()
            .await
            .into_iter()
            .any(|a| a["rule"] == "canary_rollback" && a["resolved_at_unix_ms"].is_null());
        if !open {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rollback alert never resolved: {:#?}",
            s.alerts().await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(route(s.api).await["arms"][1]["weight"], 20.0);
    traffic.stop().await;
}

#[tokio::test]
async fn a_healthy_canary_keeps_its_share() {
    let _serial = SERIAL.lock().await;
    let canary_dir = tempfile::tempdir().unwrap();
    let (_canary, canary) = start_sim(canary_dir.path(), FAST).await;
    let s = Stack::with_sim(FAST, &config(canary, "2s")).await;
    let traffic = Traffic::plain(s.proxy, 8);
    // Several judged windows, none of them bad.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut judged = 0;
    let mut last_to = 0;
    while judged < 5 {
        assert!(
            Instant::now() < deadline,
            "only {judged} windows judged: {:#}",
            route(s.api).await
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = route(s.api).await;
        let w = &r["last_window"];
        let to = w["to_unix_ms"].as_i64().unwrap_or(0);
        if to == last_to || w["arms"][1]["bad"].is_null() {
            continue;
        }
        last_to = to;
        judged += 1;
        assert_eq!(w["arms"][1]["bad"], false, "{r:#}");
        let share = w["arms"][1]["share"].as_f64().unwrap();
        assert!((0.05..=0.4).contains(&share), "canary share {share}: {r:#}");
        assert_eq!(r["arms"][1]["weight"], 20.0, "{r:#}");
    }
    traffic.stop().await;
    let r = route(s.api).await;
    assert_eq!(r["rollback"]["rolled_back"], json!([]), "{r:#}");
    assert!(
        !s.alerts()
            .await
            .iter()
            .any(|a| a["rule"] == "canary_rollback"),
        "{:#?}",
        s.alerts().await
    );
    let versions = versions_since(s.api, 0, 200).await;
    let v2 = versions.iter().filter(|v| *v == "v2").count() as f64 / versions.len() as f64;
    assert!(
        (0.1..=0.3).contains(&v2),
        "v2 share {v2} of {}",
        versions.len()
    );

    // Weights set through the API last until a configuration reload puts the file's back.
    let set = post_weights(s.api, "chat", r#"{"weights": {"v1": 1, "v2": 1}}"#).await;
    assert_eq!(set.status, 200, "{}", set.body);
    assert_eq!(route(s.api).await["arms"][0]["weight"], 1.0);
    let reload = send("POST", &format!("http://{}/-/reload", s.api), None, &[])
        .await
        .unwrap();
    assert_eq!(reload.status, 200, "{}", reload.body);
    let r = route(s.api).await;
    assert_eq!(
        (
            r["arms"][0]["weight"].as_f64(),
            r["arms"][1]["weight"].as_f64()
        ),
        (Some(80.0), Some(20.0)),
        "{r:#}"
    );
}
