// Alerts in the store: upsert by id and load across a reopen (active ones always, resolved ones
// since a time), delete of forgotten alerts, and the raw-record retention of resolved alerts.

use std::collections::BTreeMap;
use std::time::Duration;
use tokenwatch_core::alert::{Alert, AlertState, AnomalyEvent, Severity};
use tokenwatch_store::{SqliteStore, Store, StoreOptions};

fn alert(id: &str, fp: &str, state: AlertState, active: i64) -> Alert {
    Alert {
        id: id.into(),
        fingerprint: fp.into(),
        rule: "TokenwatchLatencySpike".into(),
        labels: BTreeMap::from([
            (
                "alertname".to_string(),
                "TokenwatchLatencySpike".to_string(),
            ),
            ("model_id".to_string(), "m".to_string()),
        ]),
        annotations: BTreeMap::from([("summary".to_string(), "slow".to_string())]),
        severity: Severity::Critical,
        grade: Some("L2".into()),
        state,
        active_at_unix_ms: active,
        fired_at_unix_ms: (state != AlertState::Pending).then_some(active + 10),
        resolved_at_unix_ms: (state == AlertState::Resolved).then_some(active + 100),
        last_event: Some(AnomalyEvent {
            detector: "latency_spike".into(),
            signal: "ttft".into(),
            labels: BTreeMap::from([("model_id".to_string(), "m".to_string())]),
            score: 3.5,
            at_unix_ms: active + 5,
            evidence: BTreeMap::from([("p99_s".to_string(), serde_json::json!(2.5))]),
            summary: "p99 TTFT 2.5 s".into(),
        }),
        root_cause: Vec::new(),
        incident_id: Some(format!("inc-{active}-1")),
        snapshot: None,
    }
}

#[test]
fn alerts_round_trip_across_reopen_and_update_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let firing = alert("fp1-1000", "fp1", AlertState::Firing, 1_000);
    let pending = alert("fp2-2000", "fp2", AlertState::Pending, 2_000);
    let old_resolved = alert("fp3-100", "fp3", AlertState::Resolved, 100);
    let new_resolved = alert("fp3-5000", "fp3", AlertState::Resolved, 5_000);
    {
        let store = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap();
        store
            .upsert_alerts(&[
                alert("fp1-1000", "fp1", AlertState::Pending, 1_000),
                pending.clone(),
                old_resolved.clone(),
                new_resolved.clone(),
            ])
            .unwrap();
        // The same id again replaces the row: pending → firing.
        store.upsert_alerts(std::slice::from_ref(&firing)).unwrap();
        store.upsert_alerts(&[]).unwrap();
    }
    let store = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap();
    // Resolved since 1 000: the old resolved one (resolved at 200) is left out.
    let got = store.load_alerts(1_000).unwrap();
    let ids: Vec<&str> = got.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["fp3-5000", "fp2-2000", "fp1-1000"]);
    assert_eq!(got[2], firing);
    assert_eq!(got[1], pending);
    assert_eq!(got[0], new_resolved);
    assert_eq!(store.load_alerts(0).unwrap().len(), 4);

    store.delete_alerts(&["fp2-2000".to_string()]).unwrap();
    let ids: Vec<String> = store
        .load_alerts(0)
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(ids, ["fp3-5000", "fp1-1000", "fp3-100"]);
}

#[test]
fn resolved_alerts_follow_raw_retention_active_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        raw_retention: Duration::from_secs(60),
        ..StoreOptions::default()
    };
    let store = SqliteStore::open(dir.path(), opts).unwrap();
    let now = 10_000_000;
    store
        .upsert_alerts(&[
            // Fired long ago and still firing: kept however old.
            alert("a-old-firing", "a", AlertState::Firing, now - 3_600_000),
            // Resolved two hours ago: past the 60 s raw retention.
            alert("b-old", "b", AlertState::Resolved, now - 7_200_000),
            // Resolved 50 s ago: kept.
            alert("c-new", "c", AlertState::Resolved, now - 50_000),
        ])
        .unwrap();
    store.apply_retention(now).unwrap();
    let ids: Vec<String> = store
        .load_alerts(0)
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(ids, ["c-new", "a-old-firing"]);
}
