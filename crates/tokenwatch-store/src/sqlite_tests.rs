// Tests of SqliteStore: round trips, query filters and order, retention per tier, reopen and
// migrations, corrupt rows and damaged files reported as errors naming what failed.

use super::*;
use crate::conformance::{full_record, ids, rec, rollup};
use std::sync::Arc;
use tokenwatch_core::model::LatencyMetric;

const MIN: i64 = 60_000;
const DAY: i64 = 24 * 3600 * 1000;

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(dir, StoreOptions::default()).unwrap()
}

fn all(store: &SqliteStore) -> Vec<RequestRecord> {
    store
        .query_records(&RecordQuery {
            limit: usize::MAX,
            ..Default::default()
        })
        .unwrap()
}

#[test]
fn retention_deletes_only_old_rows_per_tier() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let now = 1_000 * DAY;
    store
        .insert_records(&[
            rec("old", "m", now - 8 * DAY),
            rec("edge", "m", now - 7 * DAY),
            rec("new", "m", now - DAY),
        ])
        .unwrap();
    use LatencyMetric::*;
    store
        .insert_rollups(&[
            rollup("m", E2e, now - 91 * DAY, 1),
            rollup("m", E2e, now - 8 * DAY, 2),
            rollup("m", Queue, now - 89 * DAY, 3),
        ])
        .unwrap();
    let report = store.apply_retention(now).unwrap();
    assert_eq!(
        report,
        RetentionReport {
            records_deleted: 1,
            rollups_deleted: 1,
            texts_deleted: 0
        }
    );
    assert_eq!(ids(&all(&store)), ["new", "edge"]);
    let left = store
        .query_rollups(&RollupQuery {
            model: None,
            metric: None,
            from_unix_ms: 0,
            to_unix_ms: now,
        })
        .unwrap();
    assert_eq!(left.iter().map(|r| r.count).collect::<Vec<_>>(), [3, 2]);
    assert_eq!(
        store.apply_retention(now).unwrap(),
        RetentionReport::default()
    );
}

#[test]
fn retention_deletes_in_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let n = RETENTION_CHUNK as usize * 2 + 7;
    let batch: Vec<_> = (0..n).map(|i| rec(&i.to_string(), "m", i as i64)).collect();
    store.insert_records(&batch).unwrap();
    store
        .insert_records(&[rec("keep", "m", 100 * DAY)])
        .unwrap();
    let report = store.apply_retention(100 * DAY).unwrap();
    assert_eq!(report.records_deleted, n as u64);
    assert_eq!(ids(&all(&store)), ["keep"]);
}

#[test]
fn reopen_keeps_records_and_applies_migrations_once() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.insert_records(&[full_record()]).unwrap();
    }
    for _ in 0..2 {
        let store = open(dir.path());
        assert_eq!(all(&store), [full_record()]);
        let conn = lock(&store.read);
        let (n, max): (i64, i64) = conn
            .query_row(
                "SELECT COUNT(*), MAX(version) FROM schema_migrations",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(n as usize, schema::MIGRATIONS.len());
        assert_eq!(max, schema::latest_version());
    }
}

#[test]
fn migration_7_adds_reasoning_tokens_to_an_existing_database() {
    let dir = tempfile::tempdir().unwrap();
    let old = RequestRecord {
        reasoning_tokens: None,
        ..full_record()
    };
    {
        // A database as schema version 6 left it: no reasoning_tokens column.
        let store = open(dir.path());
        store.insert_records(std::slice::from_ref(&old)).unwrap();
        lock(&store.write)
            .execute_batch(
                "ALTER TABLE records DROP COLUMN reasoning_tokens;
                 DELETE FROM schema_migrations WHERE version = 7;",
            )
            .unwrap();
    }
    let store = open(dir.path());
    assert_eq!(
        all(&store),
        [old],
        "rows from before the migration read as unknown"
    );
    store.insert_records(&[rec("new", "m", 5)]).unwrap();
    let newer = RequestRecord {
        reasoning_tokens: Some(20),
        ..rec("newer", "m", 6)
    };
    store.insert_records(std::slice::from_ref(&newer)).unwrap();
    let got = all(&store);
    assert_eq!(got.iter().find(|r| r.request_id == "newer"), Some(&newer));
    assert_eq!(got.len(), 3);
}

#[test]
fn migration_14_adds_cached_tokens_and_cost_to_an_existing_database() {
    let dir = tempfile::tempdir().unwrap();
    let old = RequestRecord {
        cached_input_tokens: None,
        cost_usd: None,
        ..full_record()
    };
    {
        // A database as schema version 13 left it: neither column.
        let store = open(dir.path());
        store.insert_records(std::slice::from_ref(&old)).unwrap();
        lock(&store.write)
            .execute_batch(
                "ALTER TABLE records DROP COLUMN cached_input_tokens;
                 ALTER TABLE records DROP COLUMN cost_usd;
                 DELETE FROM schema_migrations WHERE version = 14;",
            )
            .unwrap();
    }
    let store = open(dir.path());
    assert_eq!(
        all(&store),
        [old],
        "rows from before the migration: unknown"
    );
    let newer = RequestRecord {
        cached_input_tokens: Some(128),
        cost_usd: Some(0.0425),
        ..rec("newer", "m", 6)
    };
    store.insert_records(std::slice::from_ref(&newer)).unwrap();
    let got = all(&store);
    assert_eq!(got.iter().find(|r| r.request_id == "newer"), Some(&newer));
}

#[test]
fn stats_and_data_dir_creation() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b");
    let store = SqliteStore::open(
        &nested,
        StoreOptions {
            fsync: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(store.path(), nested.join("tokenwatch.db"));
    // The counts and size, with fsync on, as every backend must report them.
    crate::conformance::stats(&store);
}

#[test]
fn corrupt_rows_are_errors_naming_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.insert_records(&[rec("bad-class", "m", 1)]).unwrap();
    let raw = |sql: &str| lock(&store.write).execute(sql, []).unwrap();
    raw("UPDATE records SET error_class = 'gremlins' WHERE request_id = 'bad-class'");
    let err = store
        .query_records(&RecordQuery::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bad-class") && err.contains("gremlins"),
        "{err}"
    );
    assert!(err.contains("tokenwatch.db"), "{err}");

    raw("UPDATE records SET error_class = NULL, chunk_offsets_us = x'010203'");
    let err = store
        .query_records(&RecordQuery::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bad-class") && err.contains("chunk_offsets_us"),
        "{err}"
    );

    raw("UPDATE records SET chunk_offsets_us = x'', status = 'two hundred'");
    let err = store
        .query_records(&RecordQuery::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad-class") && err.contains("status"), "{err}");

    store
        .insert_rollups(&[rollup("m", LatencyMetric::Itl, 0, 1)])
        .unwrap();
    raw("UPDATE rollups SET bucket = 'le9999'");
    let q = RollupQuery {
        model: None,
        metric: None,
        from_unix_ms: 0,
        to_unix_ms: MIN,
    };
    let err = store.query_rollups(&q).unwrap_err().to_string();
    assert!(err.contains("le9999") && err.contains("\"m\""), "{err}");
}

#[test]
fn damaged_file_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join(DB_FILE_NAME);
    std::fs::write(&db, vec![0x5a; 8192]).unwrap();
    let err = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(err.to_string().contains(&db.display().to_string()), "{err}");

    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = SqliteStore::open(&file, StoreOptions::default()).unwrap_err();
    assert!(err.to_string().contains("not-a-dir"), "{err}");
}

#[test]
fn oversized_values_are_refused_without_partial_batches() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let huge = RequestRecord {
        output_tokens: Some(u64::MAX),
        ..rec("huge", "m", 2)
    };
    let err = store
        .insert_records(&[rec("ok", "m", 1), huge])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("huge") && err.contains("output_tokens"),
        "{err}"
    );
    assert!(all(&store).is_empty(), "the batch is one transaction");
}

#[test]
fn readers_and_writers_share_the_store_across_threads() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(open(dir.path()));
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let s = Arc::clone(&store);
            std::thread::spawn(move || {
                for b in 0..10 {
                    let batch: Vec<_> = (0..20)
                        .map(|i| rec(&format!("{t}-{b}-{i}"), "m", b * 100 + i))
                        .collect();
                    s.insert_records(&batch).unwrap();
                    s.query_records(&RecordQuery::default()).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(store.stats().unwrap().records, 4 * 10 * 20);
}

#[test]
fn passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    crate::conformance::run_all(&mut |name| {
        Arc::new(SqliteStore::open(&dir.path().join(name), crate::conformance::options()).unwrap())
    });
}

#[test]
fn span_attributes_are_stored_compact_and_older_text_rows_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let proxy_json = r#"{"gen_ai.operation.name":"chat","gen_ai.provider.name":"vllm","gen_ai.request.model":"llama","gen_ai.request.stream":true,"gen_ai.usage.input_tokens":12,"gen_ai.usage.output_tokens":30,"server.address":"127.0.0.1","server.port":8000,"http.request.method":"POST","url.path":"/v1/chat/completions","http.response.status_code":200,"tokenwatch.request_id":"req-1"}"#;
    let span = |id: &str, attrs: &str| SpanRow {
        trace_id: "aa".into(),
        span_id: id.into(),
        name: "chat llama".into(),
        kind: 3,
        start_unix_nano: 100,
        end_unix_nano: 200,
        service_name: "tokenwatch".into(),
        attributes_json: attrs.into(),
        ..Default::default()
    };
    let compact = span("01", proxy_json);
    let control = span("02", "{\"a\":\"\u{7}\"}");
    store
        .insert_spans(&[compact.clone(), control.clone()])
        .unwrap();
    // A row as builds before the compact form wrote it: the JSON as TEXT.
    let older = span("03", proxy_json);
    lock(&store.write)
        .execute(
            "INSERT INTO spans (trace_id, span_id, parent_span_id, name, kind, start_unix_nano, \
             end_unix_nano, status_code, status_message, service_name, attributes, events_count) \
             VALUES ('aa', '03', '', 'chat llama', 3, 100, 200, 0, '', 'tokenwatch', ?1, 0)",
            [proxy_json],
        )
        .unwrap();
    let stored: Vec<(String, String, i64)> = {
        let conn = lock(&store.read);
        let mut st = conn
            .prepare("SELECT span_id, typeof(attributes), length(attributes) FROM spans ORDER BY span_id")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(stored[0].1, "blob", "the proxy's attributes are compacted");
    assert!(
        stored[0].2 * 3 < proxy_json.len() as i64,
        "{} compact bytes of {}",
        stored[0].2,
        proxy_json.len()
    );
    assert_eq!(stored[1].1, "text", "control bytes: stored as given");
    assert_eq!(stored[2].1, "text");
    let q = SpanQuery {
        trace_id: Some("aa".into()),
        ..Default::default()
    };
    assert_eq!(
        store.query_spans(&q).unwrap(),
        vec![compact, control, older]
    );

    // A damaged compact row is an error, not a wrong answer.
    lock(&store.write)
        .execute(
            "UPDATE spans SET attributes = X'7B1F7D' WHERE span_id = '01'",
            [],
        )
        .unwrap();
    let err = store.query_spans(&q).unwrap_err().to_string();
    assert!(err.contains("0x1f"), "{err}");
}
