// Engine start with alerts stored before a restart: active ones tracked again as they were, ones of
// a rule that no longer exists resolved (and stored so), resolved ones listed again.

use super::*;
use tokenwatch_core::alert::Severity;
use tokenwatch_core::signals::SignalBoard;
use tokenwatch_store::{SqliteStore, StoreOptions};

/// An alert as the store would hold it (also used by `reload_tests`).
pub(super) fn stored(id: &str, rule: &str, state: AlertState, active: i64) -> Alert {
    Alert {
        id: id.into(),
        fingerprint: format!("fp-{id}"),
        rule: rule.into(),
        labels: BTreeMap::from([
            ("alertname".to_string(), rule.to_string()),
            ("model_id".to_string(), "m".to_string()),
        ]),
        annotations: BTreeMap::new(),
        severity: Severity::Critical,
        grade: None,
        state,
        active_at_unix_ms: active,
        fired_at_unix_ms: (state != AlertState::Pending).then_some(active + 1_000),
        resolved_at_unix_ms: (state == AlertState::Resolved).then_some(active + 2_000),
        last_event: None,
        root_cause: Vec::new(),
        incident_id: Some(format!("inc-{active}-1")),
        snapshot: None,
    }
}

/// The engine started on the default rules over `store`, with no notifier or snapshots; the
/// sender stops it.
pub(super) fn start_default(store: &Arc<dyn Store>) -> (watch::Sender<bool>, Started) {
    start_default_on(store, SignalBoard::default())
}

/// `start_default` reading the signals of `board`.
pub(super) fn start_default_on(
    store: &Arc<dyn Store>,
    board: SignalBoard,
) -> (watch::Sender<bool>, Started) {
    let cfg = AlertingConfig::default();
    let rules = crate::alerting::rules::compile(&cfg).unwrap();
    let (stop, shutdown) = watch::channel(false);
    let started = start(
        &cfg,
        rules,
        EngineDeps {
            budgets: Default::default(),
            signals: Arc::new(std::sync::RwLock::new(board)),
            store: store.clone(),
            metrics: Arc::new(Metrics::new()),
            notifier: None,
            snapshot: None,
            shutdown,
            components: Default::default(),
            splits: Default::default(),
            actions: Arc::new(crate::kernel::actions::NoActions),
            health: None,
        },
    );
    (stop, started)
}

#[tokio::test]
async fn stored_alerts_are_restored_and_those_of_removed_rules_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path(), StoreOptions::default()).unwrap());
    let now = now_unix_ms();
    let firing = stored("a-1", "error_burst", AlertState::Firing, now - 60_000);
    let gone = stored("b-1", "no_such_rule", AlertState::Firing, now - 50_000);
    let resolved = stored("c-1", "error_burst", AlertState::Resolved, now - 120_000);
    // Resolved before `keep_resolved` (1 h): not listed again.
    let ancient = stored("d-1", "error_burst", AlertState::Resolved, now - 7_200_000);
    store
        .upsert_alerts(&[
            firing.clone(),
            gone.clone(),
            resolved.clone(),
            ancient.clone(),
        ])
        .unwrap();

    let (stop, started) = start_default(&store);
    // Listed at once, before any evaluation.
    // As stored, its summary rendered again from the rule.
    let mut a = started.book.get("a-1").unwrap();
    assert!(a.annotations.contains_key("summary"), "{a:?}");
    a.annotations.clear();
    assert_eq!(a, firing);
    assert_eq!(started.book.get("c-1"), Some(resolved.clone()));
    assert_eq!(started.book.get("d-1"), None);
    let ended = started.book.get("b-1").unwrap();
    assert_eq!(ended.state, AlertState::Resolved);
    assert!(ended.resolved_at_unix_ms.is_some_and(|t| t >= now));
    let ids: Vec<String> = started.book.list().into_iter().map(|a| a.id).collect();
    assert_eq!(ids, ["a-1", "b-1", "c-1"]);

    // A few evaluations without the condition: the restored alert keeps firing (resolve delay).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        started
            .book
            .get("a-1")
            .map(|a| (a.state, a.active_at_unix_ms)),
        Some((AlertState::Firing, firing.active_at_unix_ms))
    );

    // Stopping writes everything queued: the ended alert is stored resolved.
    stop.send(true).unwrap();
    started.task.await.unwrap();
    let back = store.load_alerts(0).unwrap();
    let state = |id: &str| back.iter().find(|a| a.id == id).map(|a| a.state);
    assert_eq!(state("a-1"), Some(AlertState::Firing));
    assert_eq!(state("b-1"), Some(AlertState::Resolved));
    assert_eq!(state("c-1"), Some(AlertState::Resolved));
}
