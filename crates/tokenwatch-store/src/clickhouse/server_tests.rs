// Tests of ClickHouseStore against ClickHouse 26.9 (the chDB stand-in of scripts/clickhouse-chdb,
// started per test on loopback): the conformance suite, migrations, day partitions, errors
// naming the server.

use super::*;
use crate::testing::ClickHouseServer;
use crate::{RecordQuery, conformance};
use std::sync::Arc;

fn open(server: &ClickHouseServer, db: &str) -> ClickHouseStore {
    ClickHouseStore::open(&server.config(db), conformance::options())
        .unwrap_or_else(|e| panic!("{e}\nserver log:\n{}", server.log()))
}

#[test]
fn passes_the_conformance_suite() {
    let server = ClickHouseServer::start();
    conformance::run_all(&mut |name| Arc::new(open(&server, &format!("conf_{name}"))));
}

#[test]
fn migrations_apply_once_and_a_newer_schema_is_refused() {
    let server = ClickHouseServer::start();
    let store = open(&server, "tw");
    store.insert_records(&[conformance::full_record()]).unwrap();
    drop(store);
    let store = open(&server, "tw");
    assert_eq!(
        store.query_records(&RecordQuery::default()).unwrap(),
        [conformance::full_record()],
        "reopening keeps the data"
    );
    let versions = server.query(
        "SELECT version, count() FROM tw.schema_migrations GROUP BY version ORDER BY version",
    );
    let every_once: Vec<String> = (1..=schema::latest_version())
        .map(|v| format!("{v}\t1"))
        .collect();
    assert_eq!(versions.trim(), every_once.join("\n"));
    server.query("INSERT INTO tw.schema_migrations VALUES (999, 'future', 0)");
    let err = ClickHouseStore::open(&server.config("tw"), StoreOptions::default()).unwrap_err();
    assert!(
        matches!(err, StoreError::SchemaTooNew { found: 999, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains(&server.url()), "{err}");
}

#[test]
fn rows_land_in_day_partitions_and_retention_drops_them() {
    let server = ClickHouseServer::start();
    let store = open(&server, "tw");
    let day: i64 = 86_400_000;
    // 2023-11-14 and 2023-11-15 (UTC).
    let at = |ms| RequestRecord {
        request_id: format!("r{ms}"),
        arrival_unix_ms: ms,
        ..Default::default()
    };
    store
        .insert_records(&[at(1_699_920_000_000), at(1_699_920_000_000 + day + 5)])
        .unwrap();
    let parts = server.query(
        "SELECT DISTINCT partition FROM system.parts WHERE database = 'tw' AND table = 'records' \
         AND active ORDER BY partition",
    );
    assert_eq!(
        parts.split_whitespace().collect::<Vec<_>>(),
        ["20231114", "20231115"]
    );
    // Seven days after the end of the 14th: only that day goes.
    let report = store.apply_retention(1_699_920_000_000 + 8 * day).unwrap();
    assert_eq!(report.records_deleted, 1);
    let parts = server.query(
        "SELECT DISTINCT partition FROM system.parts WHERE database = 'tw' AND table = 'records' \
         AND active",
    );
    assert_eq!(parts.trim(), "20231115");
}

#[test]
fn server_errors_and_corrupt_rows_name_the_database() {
    let server = ClickHouseServer::start();
    let store = open(&server, "tw");
    store
        .insert_records(&[RequestRecord {
            request_id: "bad-class".into(),
            ..Default::default()
        }])
        .unwrap();
    server.query("ALTER TABLE tw.records UPDATE error_class = 'gremlins' WHERE 1");
    // The mutation runs in the background: wait until it is done.
    for _ in 0..200 {
        let pending = server.query("SELECT count() FROM system.mutations WHERE is_done = 0");
        if pending.trim() == "0" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let err = store.query_records(&RecordQuery::default()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::CorruptRow { .. }), "{err:?}");
    assert!(
        text.contains("bad-class") && text.contains("gremlins"),
        "{text}"
    );
    assert!(
        text.contains(&server.url()) && text.contains("database tw"),
        "{text}"
    );

    server.query("DROP TABLE tw.rollups_v2");
    let err = store
        .query_rollups(&crate::RollupQuery {
            model: None,
            metric: None,
            from_unix_ms: 0,
            to_unix_ms: 1,
        })
        .unwrap_err();
    match &err {
        StoreError::Server {
            code,
            status,
            message,
            ..
        } => {
            assert_eq!(*code, Some(60), "{err}");
            assert_eq!(*status, 404, "{err}");
            assert!(message.contains("rollups"), "{err}");
        }
        other => panic!("not a server error: {other:?}"),
    }
    assert!(err.to_string().contains("query_rollups"), "{err}");
}

#[test]
fn an_unreachable_server_fails_within_the_retry_budget() {
    let server = ClickHouseServer::start();
    let cfg = ClickHouseConfig {
        retry_for: Duration::from_millis(600),
        ..server.config("tw")
    };
    let store = ClickHouseStore::open(&cfg, StoreOptions::default()).unwrap();
    drop(server);
    let started = std::time::Instant::now();
    let err = store
        .insert_records(&[conformance::full_record()])
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("insert_records"), "{err}");
}

#[test]
fn the_password_is_sent_from_its_file_and_never_shown() {
    let server = ClickHouseServer::start();
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "not-the-password\n").unwrap();
    let cfg = ClickHouseConfig {
        password_file: Some(pw),
        ..server.config("tw")
    };
    // The packaged `default` user has an empty password: this one is refused, unretried.
    let started = std::time::Instant::now();
    let err = ClickHouseStore::open(&cfg, StoreOptions::default()).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(matches!(err, StoreError::Server { .. }), "{err:?}");
    assert!(
        text.contains("password") && text.contains(&server.url()),
        "{text}"
    );
    assert!(!text.contains("not-the-password"), "{text}");
}

fn e2e_rollup(minute: i64, values: &[f64]) -> crate::RollupRow {
    let mut s = tokenwatch_core::sketch::LatencySketch::new();
    for v in values {
        s.add(*v);
    }
    crate::RollupRow {
        count: s.count(),
        sketch: s.to_bytes(),
        ..conformance::rollup("m", tokenwatch_core::model::LatencyMetric::E2e, minute, 0)
    }
}

fn all_rollups(store: &ClickHouseStore) -> Vec<crate::RollupRow> {
    store
        .query_rollups(&crate::RollupQuery {
            model: None,
            metric: None,
            from_unix_ms: i64::MIN,
            to_unix_ms: i64::MAX,
        })
        .unwrap()
}

#[test]
fn writers_of_one_series_minute_are_merged_not_replaced() {
    let server = ClickHouseServer::start();
    let writer = |id: &str| {
        let cfg = ClickHouseConfig {
            writer_id: id.into(),
            ..server.config("tw")
        };
        ClickHouseStore::open(&cfg, conformance::options()).unwrap()
    };
    let (a, b) = (writer("a"), writer("b"));
    a.insert_rollups(&[e2e_rollup(0, &[0.1, 0.2])]).unwrap();
    b.insert_rollups(&[e2e_rollup(0, &[0.4, 0.8, 1.6])])
        .unwrap();
    // a re-emits its minute: it replaces a's row only.
    a.insert_rollups(&[e2e_rollup(0, &[0.1, 0.2, 0.3]), e2e_rollup(60_000, &[0.5])])
        .unwrap();
    for store in [&a, &b] {
        let rows = all_rollups(store);
        assert_eq!(rows.len(), 2, "one row per minute: {rows:?}");
        assert_eq!((rows[0].minute_start_unix_ms, rows[0].count), (0, 6));
        let merged = tokenwatch_core::sketch::LatencySketch::from_bytes(&rows[0].sketch).unwrap();
        assert_eq!(merged.count(), 6);
        let max = merged.quantile(1.0).unwrap();
        assert!((max - 1.6).abs() < 0.02 * 1.6, "{max}");
        assert_eq!((rows[1].minute_start_unix_ms, rows[1].count), (60_000, 1));
    }
    assert_eq!(
        a.stats().unwrap().rollups,
        3,
        "stored rows: a's two minutes and b's one"
    );
    let keyed = server.query(
        "SELECT writer, sum(count) FROM tw.rollups_v2 FINAL GROUP BY writer ORDER BY writer",
    );
    assert_eq!(keyed.trim(), "a\t4\nb\t3");
}

#[test]
fn roll_ups_of_the_writerless_schema_stay_readable_after_the_migration() {
    let server = ClickHouseServer::start();
    let cfg = server.config("tw");
    let client = Client::new(&cfg, None).unwrap();
    schema::migrate_up_to(&client, 3).unwrap();
    let old = e2e_rollup(120_000, &[0.25, 0.5]);
    let body = {
        let mut w = super::rowbinary::Writer::default();
        let l = &old.labels;
        for s in [
            &l.model_id,
            &l.runtime,
            &l.instance,
            &l.tenant,
            &l.ab_group,
            &l.model_version,
        ] {
            w.str(s);
        }
        w.str(old.bucket.name());
        w.str(old.metric.name());
        w.i64(old.minute_start_unix_ms);
        w.u64(old.count);
        w.bytes(&old.sketch);
        w.u64(1);
        w.buf
    };
    client
        .insert(
            "legacy roll-up",
            "rollups",
            "model_id, runtime, instance, tenant, ab_group, model_version, bucket, metric, \
             minute_start_unix_ms, count, sketch, seq",
            &body,
        )
        .unwrap();
    let store = ClickHouseStore::open(
        &ClickHouseConfig {
            writer_id: "new".into(),
            ..cfg
        },
        conformance::options(),
    )
    .unwrap();
    assert_eq!(
        all_rollups(&store),
        std::slice::from_ref(&old),
        "copied with the migration"
    );
    // A writer of the new schema adds to the migrated minute.
    store
        .insert_rollups(&[e2e_rollup(120_000, &[1.0])])
        .unwrap();
    let rows = all_rollups(&store);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].count, 3);
}

#[test]
fn copies_of_one_alert_from_several_instances_load_once() {
    use tokenwatch_core::alert::{Alert, AlertState, Severity};
    let server = ClickHouseServer::start();
    let store = open(&server, "tw");
    let copy = |id: &str, incident: Option<&str>, state: AlertState, at: i64| Alert {
        id: id.into(),
        fingerprint: "fp1".into(),
        rule: "ttft_high".into(),
        labels: std::collections::BTreeMap::new(),
        annotations: std::collections::BTreeMap::new(),
        severity: Severity::Warning,
        grade: None,
        state,
        active_at_unix_ms: at,
        fired_at_unix_ms: (state != AlertState::Pending).then_some(at),
        resolved_at_unix_ms: None,
        last_event: None,
        root_cause: Vec::new(),
        incident_id: incident.map(String::from),
        snapshot: None,
    };
    store
        .upsert_alerts(&[
            // Instances a and b fired the same alert (one incident), and both hold a pending
            // copy of its next activation.
            copy("fp1-100", Some("inc-0-fp1"), AlertState::Firing, 100),
            copy("fp1-130", Some("inc-0-fp1"), AlertState::Firing, 130),
            copy("fp1-900", None, AlertState::Pending, 900),
            copy("fp1-910", None, AlertState::Pending, 910),
            // The same alert in a later incident is another alert.
            copy("fp1-500", Some("inc-480-fp1"), AlertState::Firing, 500),
        ])
        .unwrap();
    let mut ids: Vec<String> = store
        .load_alerts(0)
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["fp1-130", "fp1-500", "fp1-910"]);
}
