// Output embeddings and prefix-cache keys in the store: on records (a compact f32 blob, the key's
// 64 bits), posted after the fact for a request id (merged when read), and their retention.

use std::time::Duration;
use tokenwatch_core::model::{RequestRecord, SeriesLabels};
use tokenwatch_store::{EmbeddingRow, RecordQuery, SqliteStore, Store, StoreOptions};

fn rec(id: &str, model: &str, arrival: i64) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        labels: SeriesLabels {
            model_id: model.into(),
            ..Default::default()
        },
        arrival_unix_ms: arrival,
        ..Default::default()
    }
}

fn by_id(store: &SqliteStore) -> std::collections::BTreeMap<String, RequestRecord> {
    store
        .query_records(&RecordQuery {
            limit: 100,
            ..Default::default()
        })
        .unwrap()
        .into_iter()
        .map(|r| (r.request_id.clone(), r))
        .collect()
}

#[test]
fn record_embeddings_and_prefix_keys_round_trip_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut with = rec("with", "m", 10);
    with.embedding = (0..384).map(|i| (i as f32 - 191.5) / 97.0).collect();
    with.prefix_key = Some(u64::MAX - 5); // the top bit set: stored as a negative i64
    let without = rec("without", "m", 11);
    {
        let store = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap();
        store
            .insert_records(&[with.clone(), without.clone()])
            .unwrap();
    }
    let store = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap();
    let got = by_id(&store);
    assert_eq!(got["with"], with);
    assert_eq!(got["without"], without);
    assert!(got["without"].embedding.is_empty() && got["without"].prefix_key.is_none());
}

#[test]
fn posted_embeddings_merge_into_records_in_either_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap();
    let row = |id: &str, model: &str, v: Vec<f32>| EmbeddingRow {
        request_id: id.into(),
        model_id: model.into(),
        at_unix_ms: 50,
        embedding: v,
    };
    // Posted before the record is written, then the record arrives.
    store
        .insert_embeddings(&[row("early", "m", vec![1.0, 2.0])])
        .unwrap();
    let mut own = rec("own", "m", 3);
    own.embedding = vec![9.0, 9.0];
    store
        .insert_records(&[
            rec("early", "m", 1),
            rec("late", "m", 2),
            own,
            rec("other-model", "m", 4),
        ])
        .unwrap();
    // Posted after; a second post for the same request replaces the first; another model's
    // request id does not match; a record's own embedding wins over a posted one.
    store
        .insert_embeddings(&[
            row("late", "m", vec![0.5]),
            row("late", "m", vec![0.75, 0.25]),
            row("other-model", "n", vec![4.0]),
            row("own", "m", vec![1.0, 1.0]),
        ])
        .unwrap();
    let got = by_id(&store);
    assert_eq!(got["early"].embedding, vec![1.0, 2.0]);
    assert_eq!(got["late"].embedding, vec![0.75, 0.25]);
    assert!(got["other-model"].embedding.is_empty());
    assert_eq!(got["own"].embedding, vec![9.0, 9.0]);
    store.insert_embeddings(&[]).unwrap();
}

#[test]
fn posted_embeddings_follow_the_raw_retention() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        raw_retention: Duration::from_secs(60),
        ..StoreOptions::default()
    };
    let store = SqliteStore::open(dir.path(), opts).unwrap();
    let now = 10_000_000;
    store
        .insert_embeddings(&[
            EmbeddingRow {
                request_id: "old".into(),
                model_id: "m".into(),
                at_unix_ms: now - 120_000,
                embedding: vec![1.0],
            },
            EmbeddingRow {
                request_id: "new".into(),
                model_id: "m".into(),
                at_unix_ms: now - 1_000,
                embedding: vec![2.0],
            },
        ])
        .unwrap();
    store.apply_retention(now).unwrap();
    store
        .insert_records(&[rec("old", "m", now), rec("new", "m", now)])
        .unwrap();
    let got = by_id(&store);
    assert!(
        got["old"].embedding.is_empty(),
        "the expired embedding was deleted"
    );
    assert_eq!(got["new"].embedding, vec![2.0]);
}
