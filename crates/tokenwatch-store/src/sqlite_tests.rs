// Tests of SqliteStore: round trips, query filters and order, retention per tier, reopen and
// migrations, corrupt rows and damaged files reported as errors naming what failed.

use super::*;
use std::sync::Arc;
use tokenwatch_core::model::{ContextBucket, ErrorClass, GapSummary, LatencyMetric, SeriesLabels};

const MIN: i64 = 60_000;
const DAY: i64 = 24 * 3600 * 1000;

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(dir, StoreOptions::default()).unwrap()
}

fn labels(model: &str) -> SeriesLabels {
    SeriesLabels {
        model_id: model.into(),
        runtime: "vllm".into(),
        instance: "gpu-0:8000".into(),
        tenant: "acme".into(),
        ab_group: "b".into(),
        model_version: "2024-06".into(),
    }
}

fn full_record() -> RequestRecord {
    RequestRecord {
        request_id: "req-1".into(),
        trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
        labels: labels("llama-3-8b"),
        prompt_version: "p7".into(),
        endpoint: "/v1/chat/completions".into(),
        stream: true,
        arrival_unix_ms: 1_700_000_000_123,
        upstream_headers_s: Some(0.012),
        first_token_s: Some(0.25),
        end_s: 1.75,
        queue_s: Some(0.003),
        chunk_offsets_us: vec![250_000, 300_000, 1_750_000, u32::MAX],
        gaps: GapSummary {
            count: 3,
            mean_s: 0.5,
            max_s: 1.45,
        },
        prompt_tokens: Some(900),
        output_tokens: Some(4),
        reasoning_tokens: Some(3),
        tokens_from_usage: true,
        finish_reason: "stop".into(),
        status: 200,
        error_class: None,
        embedding: vec![0.25, -1.5, 3.0e-8],
        prefix_key: Some(0xfedc_ba98_7654_3210),
        text: None,
    }
}

fn rec(id: &str, model: &str, arrival: i64) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        labels: labels(model),
        arrival_unix_ms: arrival,
        ..Default::default()
    }
}

fn rollup(model: &str, metric: LatencyMetric, minute: i64, count: u64) -> RollupRow {
    RollupRow {
        labels: labels(model),
        bucket: ContextBucket::Le1024,
        metric,
        minute_start_unix_ms: minute,
        count,
        sketch: vec![1, 2, 3, count as u8],
    }
}

fn ids(v: &[RequestRecord]) -> Vec<&str> {
    v.iter().map(|r| r.request_id.as_str()).collect()
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
fn full_records_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let full = full_record();
    let bare = RequestRecord {
        request_id: "req-2".into(),
        arrival_unix_ms: 1,
        ..Default::default()
    };
    let failed = RequestRecord {
        request_id: "req-3".into(),
        arrival_unix_ms: 0,
        status: 502,
        error_class: Some(ErrorClass::Upstream5xx),
        gaps: GapSummary {
            count: 0,
            mean_s: f64::NAN,
            max_s: f64::INFINITY,
        },
        ..Default::default()
    };
    store
        .insert_records(&[full.clone(), bare.clone(), failed.clone()])
        .unwrap();
    let got = all(&store);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0], full);
    assert_eq!(got[1], bare);
    assert_eq!(got[2].error_class, Some(ErrorClass::Upstream5xx));
    assert!(got[2].gaps.mean_s.is_nan(), "NaN survives as NaN");
    assert_eq!(got[2].gaps.max_s, f64::INFINITY);
}

#[test]
fn query_filters_order_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store
        .insert_records(&[
            rec("a1", "a", 100),
            rec("b1", "b", 150),
            rec("a2", "a", 200),
        ])
        .unwrap();
    store
        .insert_records(&[rec("a3", "a", 200), rec("a0", "a", 50)])
        .unwrap();
    assert_eq!(
        ids(&all(&store)),
        ["a3", "a2", "b1", "a1", "a0"],
        "newest first, ties by insertion"
    );
    let q = |model: Option<&str>, since, limit| RecordQuery {
        model: model.map(String::from),
        since_unix_ms: since,
        limit,
        ..RecordQuery::default()
    };
    let got = store.query_records(&q(Some("a"), None, 10)).unwrap();
    assert_eq!(ids(&got), ["a3", "a2", "a1", "a0"]);
    let got = store.query_records(&q(Some("a"), Some(100), 10)).unwrap();
    assert_eq!(ids(&got), ["a3", "a2", "a1"]);
    let got = store.query_records(&q(None, Some(150), 10)).unwrap();
    assert_eq!(ids(&got), ["a3", "a2", "b1"]);
    assert_eq!(
        ids(&store.query_records(&q(None, None, 2)).unwrap()),
        ["a3", "a2"]
    );
    assert!(store.query_records(&q(None, None, 0)).unwrap().is_empty());
    assert!(
        store
            .query_records(&q(Some("zzz"), None, 10))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn rollups_replace_and_filter() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    use LatencyMetric::*;
    store
        .insert_rollups(&[
            rollup("a", Ttft, 0, 1),
            rollup("a", Itl, 0, 2),
            rollup("b", Ttft, MIN, 3),
        ])
        .unwrap();
    store
        .insert_rollups(&[rollup("a", Ttft, 0, 9), rollup("a", Ttft, 2 * MIN, 4)])
        .unwrap();
    let q = |model: Option<&str>, metric, from, to| RollupQuery {
        model: model.map(String::from),
        metric,
        from_unix_ms: from,
        to_unix_ms: to,
    };
    let got = store.query_rollups(&q(None, None, 0, 10 * MIN)).unwrap();
    assert_eq!(got.len(), 4, "the re-emitted minute replaced the old row");
    assert_eq!(got[0], rollup("a", Itl, 0, 2));
    assert_eq!(got[1], rollup("a", Ttft, 0, 9));
    let got = store
        .query_rollups(&q(Some("a"), Some(Ttft), 0, 10 * MIN))
        .unwrap();
    assert_eq!(got.iter().map(|r| r.count).collect::<Vec<_>>(), [9, 4]);
    let got = store
        .query_rollups(&q(None, Some(Ttft), MIN, 2 * MIN))
        .unwrap();
    assert_eq!(got, [rollup("b", Ttft, MIN, 3)], "range is [from, to)");
    assert_eq!(store.stats().unwrap().rollups, 4);
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
    assert_eq!(all(&store), [old], "rows from before the migration read as unknown");
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
    store
        .insert_records(&[rec("x", "m", 1), rec("y", "m", 2)])
        .unwrap();
    store
        .insert_rollups(&[rollup("m", LatencyMetric::Ttft, 0, 1)])
        .unwrap();
    let s = store.stats().unwrap();
    assert_eq!((s.records, s.rollups), (2, 1));
    assert!(s.file_bytes > 0);
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
fn record_filters_tenant_outcome_latency_and_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mk = |id: &str, tenant: &str, end_s: f64, status: u16, class: Option<ErrorClass>| RequestRecord {
        request_id: id.into(),
        trace_id: format!("trace-{id}"),
        labels: SeriesLabels { tenant: tenant.into(), ..labels("m") },
        arrival_unix_ms: 1000,
        end_s,
        status,
        error_class: class,
        ..Default::default()
    };
    store
        .insert_records(&[
            mk("ok-fast", "t1", 0.2, 200, None),
            mk("ok-slow", "t2", 4.0, 200, None),
            mk("bad-5xx", "t1", 1.0, 502, Some(ErrorClass::Upstream5xx)),
            mk("client-4xx", "t2", 0.1, 404, None),
        ])
        .unwrap();
    let q = |f: &dyn Fn(&mut RecordQuery)| {
        let mut q = RecordQuery { limit: 10, ..Default::default() };
        f(&mut q);
        let mut got: Vec<String> = store.query_records(&q).unwrap().into_iter().map(|r| r.request_id).collect();
        got.sort();
        got
    };
    assert_eq!(q(&|q| q.tenant = Some("t1".into())), ["bad-5xx", "ok-fast"]);
    assert_eq!(q(&|q| q.outcome = Some(RecordOutcome::Ok)), ["ok-fast", "ok-slow"]);
    assert_eq!(q(&|q| q.outcome = Some(RecordOutcome::Error)), ["bad-5xx", "client-4xx"]);
    assert_eq!(q(&|q| q.outcome = RecordOutcome::parse("upstream_5xx")), ["bad-5xx"]);
    assert_eq!(q(&|q| q.min_e2e_s = Some(1.0)), ["bad-5xx", "ok-slow"]);
    assert_eq!(q(&|q| q.request_id = Some("ok-slow".into())), ["ok-slow"]);
    assert_eq!(q(&|q| q.trace_id = Some("trace-bad-5xx".into())), ["bad-5xx"]);
    assert_eq!(
        q(&|q| {
            q.tenant = Some("t2".into());
            q.min_e2e_s = Some(1.0);
        }),
        ["ok-slow"]
    );
    assert_eq!(RecordOutcome::parse("nope"), None);
}
