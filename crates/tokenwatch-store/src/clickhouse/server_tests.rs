// Tests of ClickHouseStore against ClickHouse 26.9 (the chDB stand-in of scripts/clickhouse-chdb,
// started per test on loopback): the conformance suite, migrations, day partitions, errors
// naming the server.

use super::*;
use crate::testing::ClickHouseServer;
use crate::{RecordQuery, RollupQuery, conformance};
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
        "SELECT DISTINCT partition FROM system.parts WHERE database = 'tw' AND table = 'records_v6' \
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
        "SELECT DISTINCT partition FROM system.parts WHERE database = 'tw' AND table = 'records_v6' \
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
    server.query("ALTER TABLE tw.records_v6 UPDATE error_class = 'gremlins' WHERE 1");
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

    server.query("DROP TABLE tw.rollups_v6");
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
        "SELECT writer, sum(count) FROM tw.rollups_v6 FINAL GROUP BY writer ORDER BY writer",
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

/// One row of every kind, with an id that needs escaping (quote, backslash, tab, newline).
struct Sample {
    records: Vec<RequestRecord>,
    rollups: Vec<crate::RollupRow>,
    spans: Vec<crate::SpanRow>,
    logs: Vec<crate::LogRow>,
    embeddings: Vec<crate::EmbeddingRow>,
    annotations: Vec<crate::AnnotationRow>,
    alerts: Vec<tokenwatch_core::alert::Alert>,
    targets: Vec<crate::ScrapeTargetRow>,
    markers: Vec<crate::MarkerRow>,
    scores: Vec<crate::ScoreRow>,
}

const ODD_ID: &str = "it's a \\ back\tslash\nid";

fn sample() -> Sample {
    use tokenwatch_core::alert::AlertState;
    let mut with_text = conformance::full_record();
    with_text.request_id = ODD_ID.into();
    with_text.embedding = Vec::new();
    with_text.text = Some(Box::new(tokenwatch_core::model::CapturedText {
        region: "eu".into(),
        prompt: "hello 'there'".into(),
        completion: "hi\\n".into(),
        masked: [("email".to_string(), 2u32)].into(),
        truncated: true,
    }));
    let mut failed = conformance::rec("req-2", "m2", 1_700_000_100_000);
    failed.error_class = Some(tokenwatch_core::model::ErrorClass::UpstreamTimeout);
    Sample {
        records: vec![with_text, failed],
        rollups: vec![e2e_rollup(1_700_000_040_000, &[0.1, 0.3])],
        spans: vec![conformance::span(
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "00f067aa0ba902b7",
            1_700_000_000_123_456_789,
        )],
        logs: vec![crate::LogRow {
            time_unix_nano: 1_700_000_000_987_654_321,
            severity_number: 9,
            severity_text: "INFO".into(),
            body: "done".into(),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: "00f067aa0ba902b7".into(),
            service_name: "svc".into(),
            attributes_json: "{\"k\":1}".into(),
        }],
        embeddings: vec![crate::EmbeddingRow {
            request_id: ODD_ID.into(),
            model_id: "llama-3-8b".into(),
            at_unix_ms: 1_700_000_000_500,
            embedding: vec![1.0, 2.0],
        }],
        annotations: vec![crate::AnnotationRow {
            request_id: ODD_ID.into(),
            model_id: "llama-3-8b".into(),
            instance: "i1".into(),
            at_unix_ms: 1_700_000_000_600,
            detector: "d".into(),
            score: 2.5,
            joint_grade: "L2".into(),
            value: 0.5,
            summary: "s".into(),
            evidence: serde_json::json!({"a": 1}),
        }],
        alerts: vec![
            conformance::alert("a1", AlertState::Firing, 1_700_000_000_000, None),
            conformance::alert(
                "a2",
                AlertState::Resolved,
                1_700_000_000_000,
                Some(1_700_000_050_000),
            ),
        ],
        targets: vec![conformance::scrape_target(
            "http://10.0.0.1:9400/metrics",
            1,
            "up",
            1_700_000_000_000,
        )],
        markers: vec![conformance::marker("mk1", "llama-3-8b", 1_700_000_000_000)],
        scores: vec![crate::ScoreRow {
            request_id: ODD_ID.into(),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            at_unix_ms: 1_700_000_000_700,
            name: "thumbs".into(),
            value: 1.0,
            source: "user".into(),
        }],
    }
}

/// Everything the `Store` reads back, for comparing two stores.
fn read_all(store: &ClickHouseStore) -> String {
    let records = store
        .query_records(&RecordQuery {
            with_text: true,
            ..Default::default()
        })
        .unwrap();
    let by_id = store
        .query_records(&RecordQuery {
            request_id: Some(ODD_ID.into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(by_id.len(), 1, "the escaped id is found by its parameter");
    let failed = store
        .query_records(&RecordQuery {
            outcome: Some(crate::RecordOutcome::Error),
            ..Default::default()
        })
        .unwrap();
    let since = store
        .query_records(&RecordQuery {
            since_unix_ms: Some(1_700_000_050_000),
            ..Default::default()
        })
        .unwrap();
    format!(
        "{records:?}\n{by_id:?}\n{failed:?}\n{since:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
        all_rollups(store),
        store.query_spans(&crate::SpanQuery::default()).unwrap(),
        store.query_logs(&crate::LogQuery::default()).unwrap(),
        store.query_annotations(&[ODD_ID.to_string()]).unwrap(),
        store.load_alerts(0).unwrap(),
        store.load_scrape_targets(0).unwrap(),
        store
            .query_markers(&crate::MarkerQuery {
                id: None,
                model: None,
                since_unix_ms: None,
                limit: 10,
            })
            .unwrap(),
        store.query_scores(&[ODD_ID.to_string()], &[]).unwrap(),
    )
}

#[test]
fn a_version_5_database_is_carried_forward_by_the_migration() {
    let server = ClickHouseServer::start();
    let mut s = sample();
    // Records of that release had no cached-token count and no cost (version 8 added them).
    for r in &mut s.records {
        (r.cached_input_tokens, r.cost_usd) = (None, None);
    }
    // Version 5, written as the previous release wrote it (same columns and RowBinary: times
    // were Int64 then, DateTime64 ticks now).
    let cfg = server.config("old");
    let client = Client::new(&cfg, None).unwrap();
    schema::migrate_up_to(&client, 5).unwrap();
    // This build's record rows end with version 8's two columns: the version-5 table takes them
    // (the copy into version 6 leaves them behind; version 8 adds them back, empty).
    for alter in schema::RECORDS_COST_COLUMNS {
        let sql = alter
            .replace("{db}.records_v6", "{db}.records")
            .replace("{db}", client.database());
        client.query("v5 columns", &sql, true).unwrap();
    }
    let put = |table: &str, columns: &str, body: Vec<u8>| {
        client.insert("v5 rows", table, columns, &body).unwrap();
    };
    put(
        "record_text",
        insert::TEXT_COLUMNS,
        insert::texts(&s.records, 10).unwrap(),
    );
    put(
        "records",
        insert::RECORD_COLUMNS,
        insert::records(&s.records, 10),
    );
    put(
        "rollups_v2",
        insert::ROLLUP_COLUMNS,
        insert::rollups(&s.rollups, "", 20),
    );
    put("spans", insert::SPAN_COLUMNS, insert::spans(&s.spans, 30));
    put("logs", insert::LOG_COLUMNS, insert::logs(&s.logs, 40));
    put(
        "embeddings",
        insert::EMBEDDING_COLUMNS,
        insert::embeddings(&s.embeddings, 50),
    );
    put(
        "annotations",
        insert::ANNOTATION_COLUMNS,
        insert::annotations(&s.annotations, 60),
    );
    put(
        "alerts",
        insert::ALERT_COLUMNS,
        insert::alerts(&s.alerts, 70).unwrap(),
    );
    put(
        "scrape_targets",
        scrape_targets::COLUMNS,
        scrape_targets::rows(&s.targets, 80).unwrap(),
    );
    put("markers", markers::COLUMNS, markers::rows(&s.markers, 90));
    put("scores", scores::COLUMNS, scores::rows(&s.scores, 100));

    let migrated = open(&server, "old");
    let tables = server
        .query("SELECT name FROM system.tables WHERE database = 'old' ORDER BY name FORMAT TSV");
    assert!(
        tables
            .split_whitespace()
            .all(|t| t == "schema_migrations" || t.ends_with("_v6")),
        "the version-5 tables are gone: {tables}"
    );
    // The same rows written through a store of the new schema read back the same.
    let fresh = open(&server, "fresh");
    fresh.insert_records(&s.records).unwrap();
    fresh.insert_rollups(&s.rollups).unwrap();
    fresh.insert_spans(&s.spans).unwrap();
    fresh.insert_logs(&s.logs).unwrap();
    fresh.insert_embeddings(&s.embeddings).unwrap();
    fresh.insert_annotations(&s.annotations).unwrap();
    fresh.upsert_alerts(&s.alerts).unwrap();
    fresh.upsert_scrape_targets(&s.targets).unwrap();
    fresh.insert_markers(&s.markers).unwrap();
    fresh.insert_scores(&s.scores).unwrap();
    let want = read_all(&fresh);
    assert!(
        want.contains("hello 'there'") && want.contains("a2"),
        "{want}"
    );
    assert_eq!(read_all(&migrated), want);
    // Times are DateTime64 now: the server reads them as dates.
    let at = server
        .query("SELECT toString(arrival_unix_ms) FROM old.records_v6 WHERE request_id = 'req-2'");
    assert_eq!(at.trim(), "2023-11-14 22:15:00.000");
}

#[test]
fn a_batch_sent_twice_is_stored_once() {
    let server = ClickHouseServer::start();
    let store = open(&server, "tw");
    let body = insert::records(&[conformance::full_record()], 7);
    for _ in 0..2 {
        store
            .client
            .insert("retry", schema::RECORDS, insert::RECORD_COLUMNS, &body)
            .unwrap();
    }
    assert_eq!(
        server.query("SELECT count() FROM tw.records_v6").trim(),
        "1"
    );
    // Another batch (another seq) is another insert.
    let other = insert::records(&[conformance::full_record()], 8);
    store
        .client
        .insert("retry", schema::RECORDS, insert::RECORD_COLUMNS, &other)
        .unwrap();
    assert_eq!(
        server.query("SELECT count() FROM tw.records_v6").trim(),
        "2"
    );
}

#[test]
fn ttls_follow_the_retention_and_expire_rows_on_the_servers_clock() {
    let server = ClickHouseServer::start();
    let day = Duration::from_secs(86_400);
    let opts = StoreOptions {
        raw_retention: 2 * day,
        rollup_retention: 30 * day,
        text_retention: [
            ("eu".to_string(), Duration::from_secs(3600)),
            ("default".to_string(), day),
        ]
        .into(),
        ..conformance::options()
    };
    let cfg = ClickHouseConfig {
        ttl: true,
        ..server.config("tw")
    };
    let store = ClickHouseStore::open(&cfg, opts.clone()).unwrap();
    let ttl_of = |table: &str| {
        server.query(&format!(
            "SELECT create_table_query FROM system.tables WHERE database = 'tw' AND name = '{table}' \
             FORMAT RawBLOB"
        ))
    };
    let records = ttl_of("records_v6");
    assert!(
        records.contains("TTL arrival_unix_ms + toIntervalSecond(172800)"),
        "{records}"
    );
    assert!(ttl_of("rollups_v6").contains("TTL minute_start_unix_ms + toIntervalSecond(2592000)"));
    assert!(ttl_of("spans_v6").contains("TTL start_unix_nano + toIntervalSecond(172800)"));
    let text = ttl_of("record_text_v6");
    assert!(
        text.contains(
            "TTL arrival_unix_ms + toIntervalSecond(172800), arrival_unix_ms + \
             toIntervalSecond(3600) WHERE region = 'eu', arrival_unix_ms + \
             toIntervalSecond(86400) WHERE region NOT IN ('eu')"
        ),
        "{text}"
    );
    // Reopening with the same retention changes nothing (no ALTER, no mutation).
    let mutations = || server.query("SELECT count() FROM system.mutations WHERE database = 'tw'");
    let before = (mutations(), ttl_of("record_text_v6"));
    drop(ClickHouseStore::open(&cfg, opts.clone()).unwrap());
    assert_eq!((mutations(), ttl_of("record_text_v6")), before);

    // Rows: now, three days ago; text in eu two hours ago and elsewhere now.
    let now = now_unix_ms();
    let rec = |id: &str, at: i64, region: &str| RequestRecord {
        text: Some(Box::new(tokenwatch_core::model::CapturedText {
            region: region.into(),
            prompt: "p".into(),
            ..Default::default()
        })),
        ..conformance::rec(id, "m", at)
    };
    store
        .insert_records(&[
            rec("new", now, "us"),
            rec("eu-old", now - 2 * 3_600_000, "eu"),
            rec("old", now - 3 * 86_400_000, "us"),
        ])
        .unwrap();
    let report = store.apply_retention(now).unwrap();
    assert_eq!(report, RetentionReport::default(), "the server does it");
    let ids = |table: &str| {
        server.query(&format!(
            "SELECT arrayStringConcat(groupArray(request_id), ',') FROM \
             (SELECT request_id FROM tw.{table} ORDER BY request_id)"
        ))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        server.query("OPTIMIZE TABLE tw.records_v6 FINAL");
        server.query("OPTIMIZE TABLE tw.record_text_v6 FINAL");
        let got = (ids("records_v6"), ids("record_text_v6"));
        if got.0.trim() == "eu-old,new" && got.1.trim() == "new" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not expired: {got:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Retention by TTL off again: the TTLs go.
    let off = ClickHouseConfig { ttl: false, ..cfg };
    drop(ClickHouseStore::open(&off, opts).unwrap());
    assert!(
        !ttl_of("records_v6").contains(" TTL "),
        "{}",
        ttl_of("records_v6")
    );
}

/// A TLS-terminating proxy on 127.0.0.1 in front of `upstream` (the stand-in has no HTTPS), with
/// a self-signed certificate for `localhost`: returns its port and the certificate (PEM). Each
/// request is forwarded on its own upstream connection (`Connection: close`).
fn tls_proxy(upstream: std::net::SocketAddr) -> (u16, String) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use std::io::{Read, Write};
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(cert.der().to_vec())],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .unwrap();
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { return };
            let config = config.clone();
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                loop {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match tls.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let text = String::from_utf8_lossy(&head).to_string();
                    let len: usize = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().to_string())
                        })
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let mut body = vec![0u8; len];
                    if tls.read_exact(&mut body).is_err() {
                        return;
                    }
                    let head = text.replacen("\r\n", "\r\nConnection: close\r\n", 1);
                    let Ok(mut up) = std::net::TcpStream::connect(upstream) else {
                        return;
                    };
                    let mut answer = Vec::new();
                    if up.write_all(head.as_bytes()).is_err()
                        || up.write_all(&body).is_err()
                        || up.read_to_end(&mut answer).is_err()
                        || tls.write_all(&answer).is_err()
                        || tls.flush().is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (port, cert.pem())
}

#[test]
fn https_with_a_configured_ca_reaches_the_server_and_an_unknown_one_is_refused() {
    let server = ClickHouseServer::start();
    let (port, ca) = tls_proxy(server.http);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let cfg = ClickHouseConfig {
        url: format!("https://localhost:{port}"),
        ca_file: Some(ca_file),
        ..server.config("tls")
    };
    let store = ClickHouseStore::open(&cfg, conformance::options())
        .unwrap_or_else(|e| panic!("{e}\nserver log:\n{}", server.log()));
    store.insert_records(&[conformance::full_record()]).unwrap();
    assert_eq!(
        store.query_records(&RecordQuery::default()).unwrap(),
        [conformance::full_record()]
    );
    // Without the CA, the self-signed certificate is not trusted: refused, not retried for long.
    let started = std::time::Instant::now();
    let err = ClickHouseStore::open(
        &ClickHouseConfig {
            ca_file: None,
            ..cfg
        },
        conformance::options(),
    )
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let text = format!("{err} {err:?}");
    assert!(
        text.to_ascii_lowercase().contains("certificate") || text.contains("UnknownIssuer"),
        "{text}"
    );
}

#[test]
fn the_password_may_come_from_the_environment() {
    let server = ClickHouseServer::start();
    // PATH is set and not empty: the stand-in's `default` user has an empty password, so the
    // password read from it is refused — it was read and sent — and never shown.
    let path = std::env::var("PATH").unwrap();
    let cfg = ClickHouseConfig {
        password_env: Some("PATH".into()),
        ..server.config("tw")
    };
    let err = ClickHouseStore::open(&cfg, StoreOptions::default()).unwrap_err();
    assert!(
        matches!(err, StoreError::Server { status: 403, .. }),
        "{err:?}"
    );
    assert!(!err.to_string().contains(&path), "{err}");
    let missing = ClickHouseConfig {
        password_env: Some("TOKENWATCH_TEST_UNSET_VARIABLE_32".into()),
        ..server.config("tw")
    };
    let err = ClickHouseStore::open(&missing, StoreOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("TOKENWATCH_TEST_UNSET_VARIABLE_32"),
        "{err}"
    );
}

/// The store-insert benchmark's schema comparison on a small set, as a check: the same records
/// take at most half the bytes on disk in the version-6 table, and a lookup by request id reads
/// a fraction of it (the bloom filter) where version 5 reads every row.
/// `TW_SCHEMA_RECORDS=200000 cargo test -p tokenwatch-store schema_6_stores -- --nocapture`
/// prints the figures for more records.
#[test]
fn schema_6_stores_records_in_half_the_bytes_and_finds_one_by_id_without_a_scan() {
    let server = ClickHouseServer::start();
    let n: u64 = std::env::var("TW_SCHEMA_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40_000);
    let rows: Vec<RequestRecord> = (0..n).map(bench_record).collect();
    let lookup = rows[rows.len() / 2].request_id.clone();
    let [v5, v6] =
        crate::testing::compare_record_schemas(&server, "cmp", &rows, 5000, &lookup).unwrap();
    println!("{v5:?}\n{v6:?}");
    assert_eq!((v5.records, v6.records), (n, n));
    assert!(
        v6.bytes_per_record * 2.0 <= v5.bytes_per_record,
        "{v6:?} vs {v5:?}"
    );
    assert_eq!(v5.lookup_read_rows, n, "version 5 scans the table");
    assert!(v6.lookup_read_rows * 4 <= n, "{v6:?}");
}

/// A record shaped as the store-insert benchmark's (a streamed chat completion).
fn bench_record(i: u64) -> RequestRecord {
    RequestRecord {
        request_id: format!("req-{i:012}"),
        trace_id: format!("{:032x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        labels: crate::SeriesLabels {
            model_id: format!("model-{}", i % 8),
            runtime: "vllm".into(),
            instance: format!("gpu-{}:8000", (i / 8) % 8),
            tenant: format!("tenant-{:08x}", (i / 64) % 16),
            ab_group: String::new(),
            model_version: String::new(),
        },
        endpoint: "/v1/chat/completions".into(),
        stream: true,
        arrival_unix_ms: 1_800_000_000_000 + i as i64,
        upstream_headers_s: Some(0.01),
        first_token_s: Some(0.15),
        end_s: 0.15 + 63.0 * 0.012,
        queue_s: Some(0.002),
        chunk_offsets_us: (0..64)
            .map(|k| 150_000 + k * 12_000 + (i % 97) as u32)
            .collect(),
        gaps: tokenwatch_core::model::GapSummary {
            count: 63,
            mean_s: 0.012,
            max_s: 0.02,
        },
        prompt_tokens: Some(900 + i % 300),
        output_tokens: Some(64),
        tokens_from_usage: true,
        finish_reason: "stop".into(),
        status: 200,
        ..Default::default()
    }
}

/// Every statement a cluster deployment sends (`store.clickhouse.cluster`) is accepted by the
/// current engine's parser: the database, the migrations table, each migration a cluster runs,
/// each table's TTL, a partition drop and the regional text deletion. (No cluster runs here: the
/// statements are parsed with `formatQuery`, and their one-node forms run in every other test.)
#[test]
fn every_cluster_statement_parses_on_the_current_engine() {
    let server = ClickHouseServer::start();
    let store = open(&server, "tw");
    let layout = cluster::Layout::new(Some("tw_cluster")).unwrap();
    let db = "tw";
    let mut written = vec![
        format!("CREATE DATABASE IF NOT EXISTS {db}"),
        schema::schema_migrations_table(db),
    ];
    for m in schema::MIGRATIONS {
        for st in m.statements {
            if schema::runs_in(&layout, m.version, st) {
                written.push(st.replace("{db}", db));
            }
        }
    }
    let mut opts = conformance::options();
    opts.text_retention = [("eu".to_string(), std::time::Duration::from_secs(86_400))].into();
    for (table, ttl) in schema::ttl_clauses(&opts) {
        written.push(format!("ALTER TABLE {db}.{table} MODIFY TTL {ttl}"));
    }
    written.push(format!(
        "ALTER TABLE {db}.{} DROP PARTITION 20261201",
        schema::RECORDS
    ));
    written.push(format!(
        "ALTER TABLE {db}.{} DELETE WHERE (region = 'eu' AND arrival_unix_ms < \
         fromUnixTimestamp64Milli(0, 'UTC'))",
        schema::TEXT
    ));
    let mut sent = 0;
    for sql in &written {
        for st in layout.statements(sql).unwrap() {
            assert!(st.contains(" ON CLUSTER tw_cluster"), "{st}");
            let mut p = Params::default();
            let check = format!("SELECT formatQuery({}) FORMAT TSV", p.str(&st));
            let formatted = store
                .client
                .query_with("parsing a cluster statement", &check, &p, false)
                .unwrap_or_else(|e| panic!("{st}\n{e}"));
            assert!(!formatted.is_empty(), "{st}");
            sent += 1;
        }
    }
    // The version-6 tables each as a replicated local table and a distributed one.
    let distributed = written
        .iter()
        .flat_map(|sql| layout.statements(sql).unwrap())
        .filter(|st| st.contains("ENGINE = Distributed(tw_cluster, tw, "))
        .count();
    assert_eq!(distributed, 11, "one distributed table per version-6 table");
    assert!(sent > 30, "{sent}");
}

/// The API's reads at scale (issue 32): `TW_QUERY_RECORDS` records (10 million by default)
/// over 7 days and a week of per-minute roll-ups of 8 models, stored through the store; then
/// a request by id (`GET /api/v1/requests/{id}`) against the same lookup with the skip indexes
/// off, and 7 days of one model's TTFT roll-ups (`/api/v1/latency?window=7d&source=store`)
/// against the same percentiles computed from the raw records. Prints a table (release:
/// `cargo test --release -p tokenwatch-store --lib reads_at_ten_million -- --ignored --nocapture`).
#[test]
#[ignore = "benchmark: minutes"]
fn reads_at_ten_million_records() {
    use std::time::Instant;
    use tokenwatch_core::model::LatencyMetric;
    let n: u64 = std::env::var("TW_QUERY_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let server = ClickHouseServer::start();
    let store = open(&server, "big");
    const WEEK_MS: i64 = 7 * 86_400_000;
    let start = 1_800_000_000_000i64;
    let t0 = Instant::now();
    let batch = 16_384u64;
    let mut i = 0;
    while i < n {
        let rows: Vec<RequestRecord> = (i..(i + batch).min(n))
            .map(|k| RequestRecord {
                arrival_unix_ms: start + (k as i128 * WEEK_MS as i128 / n as i128) as i64,
                first_token_s: Some(0.05 + (k % 1000) as f64 / 2000.0),
                ..bench_record(k)
            })
            .collect();
        store.insert_records(&rows).unwrap();
        i += batch;
    }
    let insert_s = t0.elapsed().as_secs_f64();
    let minutes = WEEK_MS / 60_000;
    let sketch: Vec<u8> = (0..240u32).map(|b| (b * 37 % 251) as u8).collect();
    let mut rollups = Vec::new();
    for m in 0..minutes {
        for model in 0..8 {
            rollups.push(crate::RollupRow {
                sketch: sketch.clone(),
                ..conformance::rollup(
                    &format!("model-{model}"),
                    LatencyMetric::Ttft,
                    start + m * 60_000,
                    (n / minutes as u64 / 8).max(1),
                )
            });
        }
        if rollups.len() >= 16_384 {
            store.insert_rollups(&rollups).unwrap();
            rollups.clear();
        }
    }
    store.insert_rollups(&rollups).unwrap();
    server.query("OPTIMIZE TABLE big.records_v6 FINAL");
    let median_ms = |f: &mut dyn FnMut()| {
        let mut v: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v[2]
    };
    let estimate = |sql: &str| -> u64 {
        server
            .query(&format!("EXPLAIN ESTIMATE {sql} FORMAT TSV"))
            .lines()
            .filter_map(|l| l.split('\t').nth(3)?.parse::<u64>().ok())
            .sum()
    };
    let id = format!("req-{:012}", n * 2 / 3);
    let by_id = RecordQuery {
        request_id: Some(id.clone()),
        limit: 1,
        with_text: true,
        ..RecordQuery::default()
    };
    assert_eq!(store.query_records(&by_id).unwrap().len(), 1);
    let lookup_ms = median_ms(&mut || {
        store.query_records(&by_id).unwrap();
    });
    let lookup_sql =
        format!("SELECT request_id, end_s FROM big.records_v6 WHERE request_id = '{id}'");
    let indexed_ms = median_ms(&mut || {
        server.query(&format!("{lookup_sql} FORMAT TSV"));
    });
    let no_index = format!("{lookup_sql} SETTINGS use_skip_indexes = 0");
    let scan_ms = median_ms(&mut || {
        server.query(&format!("{no_index} FORMAT TSV"));
    });
    let (read, read_scan) = (estimate(&lookup_sql), estimate(&no_index));
    let week = RollupQuery {
        model: Some("model-3".into()),
        metric: Some(LatencyMetric::Ttft),
        from_unix_ms: start,
        to_unix_ms: start + WEEK_MS,
    };
    let got = store.query_rollups(&week).unwrap();
    assert_eq!(got.len() as i64, minutes);
    let rollup_ms = median_ms(&mut || {
        store.query_rollups(&week).unwrap();
    });
    let raw = format!(
        "SELECT quantiles(0.5, 0.9, 0.99)(first_token_s) FROM big.records_v6 \
         WHERE model_id = 'model-3' AND arrival_unix_ms >= fromUnixTimestamp64Milli({start}, 'UTC') \
         AND arrival_unix_ms < fromUnixTimestamp64Milli({}, 'UTC')",
        start + WEEK_MS
    );
    let raw_ms = median_ms(&mut || {
        server.query(&format!("{raw} FORMAT TSV"));
    });
    let disk = server.query(
        "SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE database = 'big' \
         AND table = 'records_v6' AND active FORMAT TSV",
    );
    println!(
        "{n} records inserted through the store in {insert_s:.0} s ({:.0} rec/s); records_v6 rows, bytes on disk: {}",
        n as f64 / insert_s,
        disk.trim()
    );
    println!(
        "| read | tokenwatch ms (median of 5) | rows read | baseline | baseline ms | baseline rows read | ratio (time) |"
    );
    println!("|---|---:|---:|---|---:|---:|---:|");
    println!(
        "| request by id (the SQL; the store's whole call with text and embeddings: {lookup_ms:.1} ms) | {indexed_ms:.1} | {read} | the same lookup, skip indexes off | {scan_ms:.1} | {read_scan} | {:.3} |",
        indexed_ms / scan_ms
    );
    println!(
        "| 7 days of one model's TTFT | {rollup_ms:.1} | {} roll-ups | percentiles from the raw records | {raw_ms:.1} | {} | {:.3} |",
        minutes,
        estimate(&raw),
        rollup_ms / raw_ms
    );
    assert!(read * 100 <= n, "a lookup reads {read} of {n} rows");
}
