// Per-request anomaly annotations in the store: round trip by request id across a reopen, the
// `annotated` record filter, and their raw-record retention.

use std::time::Duration;
use tokenwatch_core::model::{RequestRecord, SeriesLabels};
use tokenwatch_store::{AnnotationRow, RecordQuery, SqliteStore, Store, StoreOptions};

fn rec(id: &str, arrival: i64) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        labels: SeriesLabels {
            model_id: "m".into(),
            ..Default::default()
        },
        arrival_unix_ms: arrival,
        ..Default::default()
    }
}

fn note(id: &str, at: i64, score: f64) -> AnnotationRow {
    AnnotationRow {
        request_id: id.into(),
        model_id: "m".into(),
        instance: "i1".into(),
        at_unix_ms: at,
        detector: "output_length_outlier".into(),
        score,
        joint_grade: "medium".into(),
        value: 2048.0,
        summary: "a response of 2048 tokens is 4.1σ longer".into(),
        evidence: serde_json::json!({"median": 120.0, "deviation_sigmas": 4.1}),
    }
}

#[test]
fn annotations_round_trip_filter_records_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap();
        store
            .insert_records(&[rec("a", 1_000), rec("b", 2_000), rec("c", 3_000)])
            .unwrap();
        store
            .insert_annotations(&[note("b", 2_500, 1.4), note("c", 3_500, f64::NAN)])
            .unwrap();
        store.insert_annotations(&[]).unwrap();
    }
    let store = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap();
    let got = store
        .query_annotations(&["a".into(), "b".into(), "c".into()])
        .unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], note("b", 2_500, 1.4));
    assert_eq!(got[1].score, 0.0, "a non-finite score is stored as 0");
    assert_eq!(got[1].evidence["median"], 120.0);
    assert!(store.query_annotations(&[]).unwrap().is_empty());
    let annotated = store
        .query_records(&RecordQuery {
            annotated: true,
            ..RecordQuery::default()
        })
        .unwrap();
    let ids: Vec<&str> = annotated.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(ids, ["c", "b"], "only annotated records, newest first");
    // More ids than SQLite takes parameters in one statement.
    let many: Vec<String> = (0..1_200)
        .map(|i| format!("x{i}"))
        .chain(["b".to_string()])
        .collect();
    assert_eq!(store.query_annotations(&many).unwrap().len(), 1);
}

#[test]
fn annotations_follow_the_raw_retention() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        raw_retention: Duration::from_secs(60),
        ..StoreOptions::default()
    };
    let store = SqliteStore::open(dir.path(), opts).unwrap();
    let now = 10_000_000;
    store
        .insert_annotations(&[
            note("old", now - 120_000, 2.0),
            note("new", now - 1_000, 2.0),
        ])
        .unwrap();
    store.apply_retention(now).unwrap();
    let got = store
        .query_annotations(&["old".into(), "new".into()])
        .unwrap();
    let ids: Vec<&str> = got.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(ids, ["new"]);
}
