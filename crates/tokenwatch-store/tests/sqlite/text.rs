// Captured (masked) text in the store: stored with its record in one transaction, attached to
// records when read back after a reopen, and deleted per region (`retention.regions`).

use std::collections::BTreeMap;
use std::time::Duration;
use tokenwatch_core::model::{CapturedText, RequestRecord, SeriesLabels};
use tokenwatch_store::{RecordQuery, SqliteStore, Store, StoreOptions};

const DAY_MS: i64 = 86_400_000;

fn rec(id: &str, arrival: i64, region: Option<&str>) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        labels: SeriesLabels {
            model_id: "m".into(),
            ..Default::default()
        },
        arrival_unix_ms: arrival,
        text: region.map(|r| {
            Box::new(CapturedText {
                region: r.into(),
                prompt: format!("user: question {id} from [email:0123456789abcdef]"),
                completion: format!("answer {id}"),
                masked: BTreeMap::from([("email".to_string(), 1)]),
                truncated: id == "eu-new",
            })
        }),
        ..Default::default()
    }
}

fn texts(store: &SqliteStore) -> BTreeMap<String, Option<String>> {
    store
        .query_records(&RecordQuery {
            limit: 100,
            with_text: true,
            ..RecordQuery::default()
        })
        .unwrap()
        .into_iter()
        .map(|r| (r.request_id, r.text.map(|t| t.region)))
        .collect()
}

#[test]
fn text_round_trips_with_its_record_and_follows_its_region_retention() {
    let dir = tempfile::tempdir().unwrap();
    let now = 100 * DAY_MS;
    let opts = StoreOptions {
        raw_retention: Duration::from_secs(40 * 86_400),
        text_retention: BTreeMap::from([
            ("eu".to_string(), Duration::from_secs(7 * 86_400)),
            ("default".to_string(), Duration::from_secs(30 * 86_400)),
        ]),
        ..StoreOptions::default()
    };
    {
        let store = SqliteStore::open(dir.path(), opts.clone()).unwrap();
        store
            .insert_records(&[
                rec("eu-old", now - 8 * DAY_MS, Some("eu")),
                rec("eu-new", now - 6 * DAY_MS, Some("eu")),
                rec("us-mid", now - 20 * DAY_MS, Some("us")),
                rec("us-old", now - 31 * DAY_MS, Some("us")),
                rec("none", now - 31 * DAY_MS, None),
            ])
            .unwrap();
    }
    let store = SqliteStore::open(dir.path(), opts).unwrap();
    let got = store
        .query_records(&RecordQuery {
            request_id: Some("eu-new".into()),
            with_text: true,
            ..RecordQuery::default()
        })
        .unwrap();
    let t = got[0]
        .text
        .as_deref()
        .expect("text read back with its record");
    assert_eq!(
        t.prompt,
        "user: question eu-new from [email:0123456789abcdef]"
    );
    assert_eq!(t.completion, "answer eu-new");
    assert_eq!(t.masked.get("email"), Some(&1));
    assert!(t.truncated);

    let report = store.apply_retention(now).unwrap();
    assert_eq!(
        report.records_deleted, 0,
        "records follow raw_retention (40 d)"
    );
    assert_eq!(
        report.texts_deleted, 2,
        "eu text after 7 d, any other region's after 30 d"
    );
    let left = texts(&store);
    assert_eq!(left["eu-old"], None);
    assert_eq!(left["eu-new"].as_deref(), Some("eu"));
    assert_eq!(left["us-mid"].as_deref(), Some("us"));
    assert_eq!(left["us-old"], None);
    assert_eq!(left["none"], None);
}

#[test]
fn text_never_outlives_its_record_and_without_regions_follows_raw_retention() {
    let dir = tempfile::tempdir().unwrap();
    let now = 100 * DAY_MS;
    let opts = StoreOptions {
        raw_retention: Duration::from_secs(10 * 86_400),
        text_retention: BTreeMap::from([("eu".to_string(), Duration::from_secs(30 * 86_400))]),
        ..StoreOptions::default()
    };
    let store = SqliteStore::open(dir.path(), opts).unwrap();
    store
        .insert_records(&[
            rec("eu-old", now - 11 * DAY_MS, Some("eu")),
            rec("x-old", now - 11 * DAY_MS, Some("x")),
            rec("x-new", now - 9 * DAY_MS, Some("x")),
        ])
        .unwrap();
    let report = store.apply_retention(now).unwrap();
    assert_eq!(report.records_deleted, 2);
    assert_eq!(report.texts_deleted, 2);
    let left = texts(&store);
    assert_eq!(left.len(), 1);
    assert_eq!(left["x-new"].as_deref(), Some("x"));
}
