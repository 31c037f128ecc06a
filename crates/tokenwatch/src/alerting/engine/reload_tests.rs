// A configuration reload handed to the running engine: alerts of rules that still exist keep
// their state, those of removed rules are resolved, the rules listing follows the new rules.

use super::*;
use tokenwatch_store::{SqliteStore, StoreOptions};

fn firing(id: &str, rule: &str, active: i64) -> Alert {
    super::restore_tests::stored(id, rule, AlertState::Firing, active)
}

fn names(book: &AlertBook) -> Vec<String> {
    book.rules().into_iter().map(|r| r.name).collect()
}

#[tokio::test]
async fn reloaded_rules_keep_alerts_of_kept_rules_and_resolve_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path(), StoreOptions::default()).unwrap());
    let now = now_unix_ms();
    let kept = firing("a-1", "error_burst", now - 60_000);
    let removed = firing("b-1", "kv_cache_pressure", now - 50_000);
    store
        .upsert_alerts(&[kept.clone(), removed.clone()])
        .unwrap();

    let (stop, started) = super::restore_tests::start_default(&store);
    assert!(names(&started.book).contains(&"kv_cache_pressure".to_string()));
    assert_eq!(
        started.book.get("b-1").map(|a| a.state),
        Some(AlertState::Firing)
    );

    let new: AlertingConfig = serde_saphyr::from_str(
        "overrides:\n  kv_cache_pressure: {enabled: false}\nrules:\n  - {name: kv_probe, detector: threshold, signal: kv_cache_usage, params: {op: '>', value: 2}}\n",
    )
    .unwrap();
    let rules = crate::alerting::rules::compile(&new).unwrap();
    let unchanged = rules.iter().map(|r| r.name != "kv_probe").collect();
    assert!(started.control.reconfigure(Reconfigure {
        rules,
        unchanged,
        cfg: new,
        slos: None,
        config_json: None,
    }));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !names(&started.book).contains(&"kv_probe".to_string()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new rules never came: {:?}",
            names(&started.book)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!names(&started.book).contains(&"kv_cache_pressure".to_string()));
    // The kept rule's alert is as it was; the removed rule's alert is resolved now.
    let a = started.book.get("a-1").unwrap();
    assert_eq!(
        (a.state, a.active_at_unix_ms, a.incident_id.clone()),
        (
            AlertState::Firing,
            kept.active_at_unix_ms,
            kept.incident_id.clone()
        )
    );
    let b = started.book.get("b-1").unwrap();
    assert_eq!(b.state, AlertState::Resolved);
    assert!(b.resolved_at_unix_ms.is_some_and(|t| t >= now), "{b:?}");
    assert!(b.annotations.contains_key("summary"), "{b:?}");

    stop.send(true).unwrap();
    started.task.await.unwrap();
    let back = store.load_alerts(0).unwrap();
    let state = |id: &str| back.iter().find(|a| a.id == id).map(|a| a.state);
    assert_eq!(
        (state("a-1"), state("b-1")),
        (Some(AlertState::Firing), Some(AlertState::Resolved))
    );
}
