// Tests of ClickHouseStore against a real clickhouse-server (Debian's 18.16, started per test
// on loopback): the conformance suite, migrations, day partitions, errors naming the server.

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

    server.query("DROP TABLE tw.rollups");
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
