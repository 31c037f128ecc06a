// Tests of the embeddings API's checks: per-item fields with their paths, timestamps, and the
// per-model dimension registry (the values themselves: tokenwatch_core::embedding).

use super::*;

const NOW: i64 = 1_700_000_000_000;

fn item(v: Value) -> Result<Item, ItemError> {
    parse_item(3, &v, NOW)
}

fn field_of(v: Value) -> (String, String) {
    let e = item(v).unwrap_err();
    assert_eq!(e.index, 3);
    assert!(e.message.starts_with(&e.field), "{e:?}");
    (e.field, e.message)
}

#[test]
fn items_parse_with_defaults() {
    let it = item(json!({"request_id": "r-1", "model_id": "m", "embedding": [1, 0.5]})).unwrap();
    assert_eq!(
        it,
        Item {
            request_id: "r-1".into(),
            model_id: "m".into(),
            embedding: vec![1.0, 0.5],
            at_unix_ms: NOW,
        }
    );
    let it = item(json!({"request_id": "r", "model_id": "m", "embedding": [1], "timestamp_unix_ms": NOW - 5_000}))
        .unwrap();
    assert_eq!(it.at_unix_ms, NOW - 5_000);
}

#[test]
fn item_errors_name_the_index_and_field() {
    let ok = || json!({"request_id": "r", "model_id": "m", "embedding": [1.0, 2.0]});
    let with = |k: &str, v: Value| {
        let mut o = ok();
        o[k] = v;
        o
    };
    let without = |k: &str| {
        let mut o = ok();
        o.as_object_mut().unwrap().remove(k);
        o
    };
    assert_eq!(field_of(json!([1])).0, "items[3]");
    let (f, m) = field_of(with("extra", json!(1)));
    assert_eq!(f, "items[3].extra");
    assert!(m.contains("allowed: request_id"), "{m}");
    assert_eq!(field_of(without("request_id")).0, "items[3].request_id");
    assert_eq!(
        field_of(with("request_id", json!("has space"))).0,
        "items[3].request_id"
    );
    assert_eq!(
        field_of(with("request_id", json!(7))).0,
        "items[3].request_id"
    );
    assert_eq!(field_of(with("model_id", json!(""))).0, "items[3].model_id");
    assert_eq!(field_of(without("embedding")).0, "items[3].embedding");
    assert_eq!(
        field_of(with("embedding", json!("1,2"))).0,
        "items[3].embedding"
    );
    let (f, m) = field_of(with("embedding", json!([1.0, "x", 2.0])));
    assert_eq!(f, "items[3].embedding[1]");
    assert!(m.contains("must be a number, not a string"), "{m}");
    assert_eq!(
        field_of(with("embedding", json!([1.0, 2.0, 1e39]))).0,
        "items[3].embedding[2]"
    );
    let (f, m) = field_of(with("embedding", json!([])));
    assert_eq!(f, "items[3].embedding");
    assert!(m.contains("has 0"), "{m}");
    let (_, m) = field_of(with("embedding", json!(vec![1.0; MAX_DIMS + 10])));
    assert!(m.contains(&format!("has {}", MAX_DIMS + 10)), "{m}");
    assert!(
        field_of(with("embedding", json!([0, 0])))
            .1
            .contains("all zeros")
    );
    for bad in [
        json!(NOW - 25 * 3_600_000),
        json!(NOW + 600_000),
        json!(1.5),
        json!("now"),
    ] {
        assert_eq!(
            field_of(with("timestamp_unix_ms", bad)).0,
            "items[3].timestamp_unix_ms"
        );
    }
}
