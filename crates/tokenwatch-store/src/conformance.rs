// The conformance suite every `Store` backend passes: records and every RecordQuery filter the
// API uses, roll-ups, spans, logs, embeddings, annotations, alerts, markers, retention and stats.
//
// Each check takes a fresh, empty store opened with `StoreOptions` as `options()` returns and
// panics (assert) on the first difference from the behaviour the `Store` trait documents.

use crate::{
    AnnotationRow, EmbeddingRow, LogQuery, LogRow, MarkerQuery, MarkerRow, RecordOutcome,
    RecordQuery, RetentionReport, RollupQuery, RollupRow, ScoreRow, ScrapeTargetRow, SpanQuery,
    SpanRow, SpendQuery, SpendRow, Store, StoreOptions,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokenwatch_core::alert::{Alert, AlertState, AnomalyEvent, Severity};
use tokenwatch_core::model::{
    CapturedText, ContextBucket, ErrorClass, GapSummary, LatencyMetric, RequestRecord, SeriesLabels,
};

const MIN: i64 = 60_000;
const DAY: i64 = 24 * 3600 * 1000;
/// A "now" at a UTC midnight, so that day-granular retention (ClickHouse drops whole days) and
/// row-granular retention (SQLite) delete the same rows.
const NOW: i64 = 20_000 * DAY;

/// A named check of the suite.
pub type Check = (&'static str, fn(&dyn Store));

/// Every check, in the order `run_all` runs them.
pub const CHECKS: &[Check] = &[
    ("records_round_trip", records_round_trip),
    ("record_order_and_limits", record_order_and_limits),
    ("record_filters", record_filters),
    ("captured_text", captured_text),
    ("embeddings_fill_records", embeddings_fill_records),
    ("rollups_replace_and_filter", rollups_replace_and_filter),
    ("spans", spans),
    ("logs", logs),
    ("annotations", annotations),
    ("alerts", alerts),
    ("scrape_targets", scrape_targets),
    ("markers", markers),
    ("scores", scores),
    ("spend", spend),
    ("retention", retention),
    ("stats", stats),
];

/// The options the stores given to the checks must be opened with: the defaults (7 days of
/// raw records, 90 of roll-ups) plus a one-day retention of text in region `eu`.
pub fn options() -> StoreOptions {
    StoreOptions {
        text_retention: BTreeMap::from([("eu".to_string(), Duration::from_secs(24 * 3600))]),
        ..StoreOptions::default()
    }
}

/// Runs every check, each on a store from `open(check_name)` (fresh and empty, opened with
/// [`options`]).
pub fn run_all(open: &mut dyn FnMut(&str) -> Arc<dyn Store>) {
    for (name, check) in CHECKS {
        let store = open(name);
        eprintln!("conformance check {name}");
        check(store.as_ref());
    }
}

/// Labels of every fixture series, with `model`.
pub fn labels(model: &str) -> SeriesLabels {
    SeriesLabels {
        model_id: model.into(),
        runtime: "vllm".into(),
        instance: "gpu-0:8000".into(),
        tenant: "acme".into(),
        ab_group: "b".into(),
        model_version: "2024-06".into(),
    }
}

/// A record with every field set, including unusual values (u32::MAX offsets, a 64-bit key).
pub fn full_record() -> RequestRecord {
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
        cached_input_tokens: Some(600),
        // Not a sum of binary fractions: the backends must keep every bit of an f64.
        cost_usd: Some(0.001_234_567_89),
        tokens_from_usage: true,
        finish_reason: "stop".into(),
        status: 200,
        error_class: None,
        embedding: vec![0.25, -1.5, 3.0e-8],
        prefix_key: Some(0xfedc_ba98_7654_3210),
        text: None,
        span: Default::default(),
    }
}

/// A bare record: id, model and arrival time.
pub fn rec(id: &str, model: &str, arrival: i64) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        labels: labels(model),
        arrival_unix_ms: arrival,
        ..Default::default()
    }
}

/// A roll-up row whose sketch bytes encode `count`, so replacements can be told apart.
pub fn rollup(model: &str, metric: LatencyMetric, minute: i64, count: u64) -> RollupRow {
    RollupRow {
        labels: labels(model),
        bucket: ContextBucket::Le1024,
        metric,
        minute_start_unix_ms: minute,
        count,
        sketch: vec![0, 1, 2, 255, count as u8],
    }
}

/// The request ids of `v`, in order.
pub fn ids(v: &[RequestRecord]) -> Vec<&str> {
    v.iter().map(|r| r.request_id.as_str()).collect()
}

fn all(store: &dyn Store) -> Vec<RequestRecord> {
    store
        .query_records(&RecordQuery {
            limit: usize::MAX,
            ..Default::default()
        })
        .unwrap()
}

fn all_rollups(store: &dyn Store) -> Vec<RollupRow> {
    store
        .query_rollups(&RollupQuery {
            model: None,
            metric: None,
            from_unix_ms: i64::MIN,
            to_unix_ms: i64::MAX,
        })
        .unwrap()
}

/// Every field survives, NaN and infinity included; newest first.
pub fn records_round_trip(store: &dyn Store) {
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
    let got = all(store);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0], full);
    assert_eq!(got[1], bare);
    assert_eq!(got[2].error_class, Some(ErrorClass::Upstream5xx));
    assert_eq!(got[2].status, 502);
    assert!(got[2].gaps.mean_s.is_nan(), "NaN survives as NaN");
    assert_eq!(got[2].gaps.max_s, f64::INFINITY);
    assert!(got.iter().all(|r| r.text.is_none()), "lists leave text out");
}

/// Newest arrival first, ties by insertion (also across batches); model, since and limit.
pub fn record_order_and_limits(store: &dyn Store) {
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
        ids(&all(store)),
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
    assert_eq!(all(store).len(), 5);
    // Records sharing a request id (a caller reused it): the oldest first, so a later record
    // cannot shadow the first one's answer to a lookup by id.
    let mut later = rec("dup", "b", 300);
    later.labels.tenant = "second".into();
    let mut first = rec("dup", "a", 120);
    first.labels.tenant = "first".into();
    store.insert_records(&[later, first]).unwrap();
    let by_id = RecordQuery {
        request_id: Some("dup".into()),
        limit: 1,
        ..RecordQuery::default()
    };
    let got = store.query_records(&by_id).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].labels.tenant, "first",
        "the oldest record of an id answers"
    );
}

/// Tenant, outcome (ok, error, one class), minimum end-to-end time, request id, trace id,
/// annotated, and combinations; quotes in values are data, not SQL.
pub fn record_filters(store: &dyn Store) {
    let mk = |id: &str, tenant: &str, end_s: f64, status: u16, class: Option<ErrorClass>| {
        RequestRecord {
            request_id: id.into(),
            trace_id: format!("trace-{id}"),
            labels: SeriesLabels {
                tenant: tenant.into(),
                ..labels("m")
            },
            arrival_unix_ms: 1000,
            end_s,
            status,
            error_class: class,
            ..Default::default()
        }
    };
    store
        .insert_records(&[
            mk("ok-fast", "t1", 0.2, 200, None),
            mk("ok-slow", "t2", 4.0, 200, None),
            mk("bad-5xx", "t1", 1.0, 502, Some(ErrorClass::Upstream5xx)),
            mk("client-4xx", "t2", 0.1, 404, None),
            mk("it's", "o'brien\\", 0.3, 200, None),
        ])
        .unwrap();
    store
        .insert_annotations(&[AnnotationRow {
            request_id: "ok-slow".into(),
            model_id: "m".into(),
            at_unix_ms: 1000,
            detector: "output_length_outlier".into(),
            ..Default::default()
        }])
        .unwrap();
    let q = |f: &dyn Fn(&mut RecordQuery)| {
        let mut q = RecordQuery {
            limit: 10,
            ..Default::default()
        };
        f(&mut q);
        let mut got: Vec<String> = store
            .query_records(&q)
            .unwrap()
            .into_iter()
            .map(|r| r.request_id)
            .collect();
        got.sort();
        got
    };
    assert_eq!(q(&|q| q.tenant = Some("t1".into())), ["bad-5xx", "ok-fast"]);
    assert_eq!(q(&|q| q.tenant = Some("o'brien\\".into())), ["it's"]);
    assert_eq!(
        q(&|q| q.outcome = Some(RecordOutcome::Ok)),
        ["it's", "ok-fast", "ok-slow"]
    );
    assert_eq!(
        q(&|q| q.outcome = Some(RecordOutcome::Error)),
        ["bad-5xx", "client-4xx"]
    );
    assert_eq!(
        q(&|q| q.outcome = RecordOutcome::parse("upstream_5xx")),
        ["bad-5xx"]
    );
    assert_eq!(q(&|q| q.min_e2e_s = Some(1.0)), ["bad-5xx", "ok-slow"]);
    assert_eq!(q(&|q| q.request_id = Some("ok-slow".into())), ["ok-slow"]);
    assert_eq!(q(&|q| q.request_id = Some("it's".into())), ["it's"]);
    assert_eq!(
        q(&|q| q.trace_id = Some("trace-bad-5xx".into())),
        ["bad-5xx"]
    );
    assert_eq!(q(&|q| q.annotated = true), ["ok-slow"]);
    assert_eq!(
        q(&|q| {
            q.tenant = Some("t2".into());
            q.min_e2e_s = Some(1.0);
        }),
        ["ok-slow"]
    );
    assert_eq!(
        q(&|q| {
            q.annotated = true;
            q.tenant = Some("t1".into());
        }),
        Vec::<String>::new()
    );
}

/// Captured text comes back with `with_text` only, matched by request id and arrival.
pub fn captured_text(store: &dyn Store) {
    let text = CapturedText {
        region: "eu".into(),
        prompt: "hello <EMAIL_1>".into(),
        completion: "hi".into(),
        masked: BTreeMap::from([("email".to_string(), 1)]),
        truncated: true,
    };
    let with = RequestRecord {
        text: Some(Box::new(text.clone())),
        ..rec("t-1", "m", 10)
    };
    store
        .insert_records(&[with.clone(), rec("t-2", "m", 11)])
        .unwrap();
    let listed = all(store);
    assert!(listed.iter().all(|r| r.text.is_none()));
    let got = store
        .query_records(&RecordQuery {
            with_text: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(ids(&got), ["t-2", "t-1"]);
    assert_eq!(got[1], with);
    assert_eq!(got[0].text, None);
}

/// A record without its own embedding is read with the latest one posted for its request id
/// and model; a record's own embedding wins.
pub fn embeddings_fill_records(store: &dyn Store) {
    let own = RequestRecord {
        embedding: vec![9.0],
        ..rec("e-own", "m", 2)
    };
    store
        .insert_records(&[rec("e-1", "m", 1), own.clone(), rec("e-3", "m", 3)])
        .unwrap();
    let emb = |id: &str, model: &str, at: i64, v: Vec<f32>| EmbeddingRow {
        request_id: id.into(),
        model_id: model.into(),
        at_unix_ms: at,
        embedding: v,
    };
    store
        .insert_embeddings(&[
            emb("e-1", "m", 5, vec![1.0, 2.0]),
            emb("e-own", "m", 5, vec![0.5]),
        ])
        .unwrap();
    store
        .insert_embeddings(&[
            emb("e-1", "m", 6, vec![3.0, 4.0]),
            emb("e-3", "other", 6, vec![7.0]),
        ])
        .unwrap();
    let got = all(store);
    let by = |id: &str| {
        got.iter()
            .find(|r| r.request_id == id)
            .unwrap()
            .embedding
            .clone()
    };
    assert_eq!(by("e-1"), [3.0, 4.0], "the latest posted");
    assert_eq!(by("e-own"), [9.0], "the record's own wins");
    assert!(
        by("e-3").is_empty(),
        "another model's embedding is not this record's"
    );
}

/// A re-emitted (labels, bucket, metric, minute) replaces the stored row; `[from, to)` range,
/// model and metric filters; oldest minute first.
pub fn rollups_replace_and_filter(store: &dyn Store) {
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
    assert_eq!(got[2], rollup("b", Ttft, MIN, 3));
    assert_eq!(got[3], rollup("a", Ttft, 2 * MIN, 4));
    let got = store
        .query_rollups(&q(Some("a"), Some(Ttft), 0, 10 * MIN))
        .unwrap();
    assert_eq!(got.iter().map(|r| r.count).collect::<Vec<_>>(), [9, 4]);
    let got = store
        .query_rollups(&q(None, Some(Ttft), MIN, 2 * MIN))
        .unwrap();
    assert_eq!(got, [rollup("b", Ttft, MIN, 3)], "range is [from, to)");
    // Replacing again, in a later batch, still leaves one row per key.
    store.insert_rollups(&[rollup("a", Ttft, 0, 11)]).unwrap();
    let got = store
        .query_rollups(&q(Some("a"), Some(Ttft), 0, MIN))
        .unwrap();
    assert_eq!(got, [rollup("a", Ttft, 0, 11)]);
    assert_eq!(store.stats().unwrap().rollups, 4);
}

/// A span of `trace` starting at `start` (ns).
pub fn span(trace: &str, id: &str, start: i64) -> SpanRow {
    SpanRow {
        trace_id: trace.into(),
        span_id: id.into(),
        name: "chat m".into(),
        kind: 3,
        start_unix_nano: start,
        end_unix_nano: start + 10,
        status_code: 2,
        status_message: "boom".into(),
        service_name: "svc".into(),
        attributes_json: r#"{"gen_ai.request.model":"m"}"#.into(),
        events_count: 2,
        ..Default::default()
    }
}

/// By trace (ids are matched lowercase) and by `[from, to)`; oldest start first; a re-sent span
/// is ignored (the first copy stays); limit.
pub fn spans(store: &dyn Store) {
    let a = span("aa", "01", 100);
    let mut b = span("aa", "02", 50);
    b.parent_span_id = "01".into();
    let other = span("bb", "01", 300);
    store
        .insert_spans(&[a.clone(), b.clone(), other.clone()])
        .unwrap();
    let mut resent = a.clone();
    resent.name = "changed".into();
    store.insert_spans(&[resent]).unwrap();
    let q = SpanQuery {
        trace_id: Some("AA".into()),
        ..Default::default()
    };
    assert_eq!(store.query_spans(&q).unwrap(), vec![b.clone(), a.clone()]);
    let q = SpanQuery {
        from_unix_nano: Some(100),
        to_unix_nano: Some(301),
        ..Default::default()
    };
    assert_eq!(store.query_spans(&q).unwrap(), vec![a.clone(), other]);
    let q = SpanQuery {
        limit: 1,
        ..Default::default()
    };
    assert_eq!(store.query_spans(&q).unwrap(), vec![b]);
    span_attributes_come_back_as_written(store);
}

/// Attributes JSON comes back byte for byte: the proxy's span (well-known keys), keys in values,
/// escapes, non-ASCII, control characters, and text that is not JSON at all.
fn span_attributes_come_back_as_written(store: &dyn Store) {
    let texts = [
        r#"{"gen_ai.operation.name":"chat","gen_ai.provider.name":"vllm","gen_ai.request.model":"llama","gen_ai.response.model":"llama-3.1-8b","gen_ai.request.stream":true,"gen_ai.usage.input_tokens":12,"gen_ai.usage.output_tokens":30,"gen_ai.response.finish_reasons":["stop"],"gen_ai.response.time_to_first_chunk":0.25,"server.address":"127.0.0.1","server.port":8000,"http.request.method":"POST","url.path":"/v1/chat/completions","http.response.status_code":200,"tokenwatch.request_id":"req-1","tokenwatch.tenant":"acme"}"#,
        r#"{"custom":"gen_ai.request.model","x":"\"server.port\":1","é":"🦀"}"#,
        "{\"tab\":\"a\tb\",\"nl\":\"\n\"}",
        "{\"raw\":\"\u{1}\u{1f}\"}",
        "not json",
        "",
    ];
    let rows: Vec<SpanRow> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| SpanRow {
            attributes_json: (*t).to_string(),
            ..span("cc", &format!("{i:02}"), 1_000 + i as i64)
        })
        .collect();
    store.insert_spans(&rows).unwrap();
    let q = SpanQuery {
        trace_id: Some("cc".into()),
        ..Default::default()
    };
    assert_eq!(store.query_spans(&q).unwrap(), rows);
}

/// Log records by trace and time, oldest first; identical records are both kept.
pub fn logs(store: &dyn Store) {
    let l = |t: i64, trace: &str, body: &str| LogRow {
        time_unix_nano: t,
        severity_number: 9,
        severity_text: "INFO".into(),
        body: body.into(),
        trace_id: trace.into(),
        span_id: "01".into(),
        service_name: "svc".into(),
        attributes_json: "{}".into(),
    };
    store
        .insert_logs(&[l(5, "aa", "hello"), l(5, "aa", "hello"), l(3, "bb", "x")])
        .unwrap();
    store.insert_logs(&[l(9, "aa", "later")]).unwrap();
    let q = LogQuery {
        trace_id: Some("AA".into()),
        ..Default::default()
    };
    assert_eq!(
        store.query_logs(&q).unwrap(),
        vec![
            l(5, "aa", "hello"),
            l(5, "aa", "hello"),
            l(9, "aa", "later")
        ]
    );
    let q = LogQuery {
        from_unix_nano: Some(3),
        to_unix_nano: Some(9),
        limit: 2,
        ..Default::default()
    };
    assert_eq!(
        store.query_logs(&q).unwrap(),
        vec![l(3, "bb", "x"), l(5, "aa", "hello")]
    );
}

/// Annotations of the asked requests only, oldest first, evidence as JSON.
pub fn annotations(store: &dyn Store) {
    let a = |id: &str, at: i64, score: f64| AnnotationRow {
        request_id: id.into(),
        model_id: "m".into(),
        instance: "i".into(),
        at_unix_ms: at,
        detector: "output_length_outlier".into(),
        score,
        joint_grade: "high".into(),
        value: 4096.0,
        summary: "long".into(),
        evidence: serde_json::json!({"median": 200, "sigma": 3.5}),
    };
    store
        .insert_annotations(&[a("r1", 20, 2.0), a("r2", 10, 1.5), a("r3", 5, 1.0)])
        .unwrap();
    store.insert_annotations(&[a("r1", 30, f64::NAN)]).unwrap();
    let got = store
        .query_annotations(&["r1".to_string(), "r2".to_string()])
        .unwrap();
    let mut nan_stored = a("r1", 30, 0.0);
    nan_stored.score = 0.0;
    assert_eq!(got, vec![a("r2", 10, 1.5), a("r1", 20, 2.0), nan_stored]);
    assert!(store.query_annotations(&[]).unwrap().is_empty());
}

/// Scores of the asked request ids or trace ids, oldest first, each once; NaN stored as 0;
/// retained like raw records.
pub fn scores(store: &dyn Store) {
    let s = |rid: &str, tid: &str, at: i64, name: &str, value: f64| ScoreRow {
        request_id: rid.into(),
        trace_id: tid.into(),
        at_unix_ms: at,
        name: name.into(),
        value,
        source: "scores".into(),
    };
    let tid = "0af7651916cd43dd8448eb211c80319c";
    store
        .insert_scores(&[
            s("r1", tid, NOW - 10, "toxicity", 0.75),
            s("r2", "", NOW - 30, "thumbs", 0.0),
            s("", tid, NOW - 20, "guardrail", 1.0),
            s("r3", "", NOW - 5, "bleu", 0.5),
        ])
        .unwrap();
    store
        .insert_scores(&[s("r1", "", NOW - 1, "factuality", f64::NAN)])
        .unwrap();
    let got = store
        .query_scores(&["r1".to_string(), "r2".to_string()], &[tid.to_string()])
        .unwrap();
    assert_eq!(
        got,
        vec![
            s("r2", "", NOW - 30, "thumbs", 0.0),
            s("", tid, NOW - 20, "guardrail", 1.0),
            s("r1", tid, NOW - 10, "toxicity", 0.75),
            s("r1", "", NOW - 1, "factuality", 0.0),
        ],
        "r1's toxicity matches both ids and is listed once"
    );
    assert!(store.query_scores(&[], &[]).unwrap().is_empty());
    assert!(
        store
            .query_scores(&[String::new()], &[String::new()])
            .unwrap()
            .is_empty(),
        "an empty id matches nothing"
    );
    store
        .insert_scores(&[s("old", "", NOW - 8 * DAY, "thumbs", 1.0)])
        .unwrap();
    store.apply_retention(NOW).unwrap();
    assert!(
        store
            .query_scores(&["old".to_string()], &[])
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.query_scores(&["r3".to_string()], &[]).unwrap().len(),
        1
    );
}

/// An alert with a last event and an incident.
/// `query_spend`: costs summed per model and tenant within the arrival range, unpriced records
/// counted as requests at no cost, groups ordered by model then tenant.
pub fn spend(store: &dyn Store) {
    let costed = |id: &str, model: &str, tenant: &str, at: i64, cost: Option<f64>| {
        let mut r = rec(id, model, NOW + at);
        r.labels.tenant = tenant.into();
        r.cost_usd = cost;
        r
    };
    store
        .insert_records(&[
            costed("a", "m1", "t1", 0, Some(0.125)),
            costed("b", "m1", "t1", MIN, Some(0.25)),
            costed("c", "m1", "t2", MIN, Some(1.5)),
            costed("d", "m2", "t1", 2 * MIN, None),
            costed("e", "m2", "t1", 3 * MIN, Some(0.0)),
            // Outside the range on either side.
            costed("early", "m1", "t1", -1, Some(100.0)),
            costed("late", "m1", "t1", 10 * MIN, Some(100.0)),
        ])
        .unwrap();
    let row =
        |model: &str, tenant: &str, cost_usd: f64, requests: u64, priced_requests: u64| SpendRow {
            model: model.into(),
            tenant: tenant.into(),
            cost_usd,
            requests,
            priced_requests,
        };
    let q = SpendQuery {
        since_unix_ms: NOW,
        until_unix_ms: NOW + 10 * MIN,
    };
    assert_eq!(
        store.query_spend(&q).unwrap(),
        [
            row("m1", "t1", 0.375, 2, 2),
            row("m1", "t2", 1.5, 1, 1),
            row("m2", "t1", 0.0, 2, 1),
        ]
    );
    let empty = SpendQuery {
        since_unix_ms: NOW + 20 * MIN,
        until_unix_ms: NOW + 30 * MIN,
    };
    assert_eq!(store.query_spend(&empty).unwrap(), []);
}

pub fn alert(id: &str, state: AlertState, active_at: i64, resolved_at: Option<i64>) -> Alert {
    Alert {
        id: id.into(),
        fingerprint: format!("fp-{id}"),
        rule: "ttft_high".into(),
        labels: BTreeMap::from([("model".to_string(), "m".to_string())]),
        annotations: BTreeMap::from([("summary".to_string(), "TTFT is high".to_string())]),
        severity: Severity::Warning,
        grade: Some("L2".into()),
        state,
        active_at_unix_ms: active_at,
        fired_at_unix_ms: (state != AlertState::Pending).then_some(active_at + 1),
        resolved_at_unix_ms: resolved_at,
        last_event: Some(AnomalyEvent {
            detector: "d".into(),
            signal: "ttft".into(),
            labels: BTreeMap::new(),
            score: 1.5,
            at_unix_ms: active_at,
            evidence: BTreeMap::new(),
            summary: "x".into(),
        }),
        root_cause: Vec::new(),
        incident_id: Some("inc-1".into()),
        snapshot: None,
    }
}

/// Upsert by id (the newest version wins), delete, load: active ones always, resolved ones
/// resolved at or after the bound; newest first (by resolution, else activation).
pub fn alerts(store: &dyn Store) {
    use AlertState::*;
    let pending = alert("p", Pending, 100, None);
    let firing = alert("f", Pending, 200, None);
    let old = alert("old", Resolved, 10, Some(50));
    store
        .upsert_alerts(&[pending.clone(), firing.clone(), old.clone()])
        .unwrap();
    let firing = alert("f", Firing, 200, None);
    store.upsert_alerts(std::slice::from_ref(&firing)).unwrap();
    let resolved = alert("r", Resolved, 20, Some(300));
    store
        .upsert_alerts(std::slice::from_ref(&resolved))
        .unwrap();
    assert_eq!(
        store.load_alerts(60).unwrap(),
        vec![resolved.clone(), firing.clone(), pending.clone()]
    );
    assert_eq!(
        store.load_alerts(0).unwrap(),
        vec![resolved.clone(), firing.clone(), pending.clone(), old]
    );
    store.delete_alerts(&["p".to_string()]).unwrap();
    assert_eq!(
        store.load_alerts(60).unwrap(),
        vec![resolved.clone(), firing.clone()]
    );
    // A deleted id can come back (a new alert with the same id).
    let again = alert("p", Firing, 400, None);
    store.upsert_alerts(std::slice::from_ref(&again)).unwrap();
    assert_eq!(
        store.load_alerts(60).unwrap(),
        vec![again, resolved, firing]
    );
    store.delete_alerts(&[]).unwrap();
    store.upsert_alerts(&[]).unwrap();
}

/// A scrape target of shard `shard` of 2.
pub fn scrape_target(url: &str, shard: u64, health: &str, updated: i64) -> ScrapeTargetRow {
    ScrapeTargetRow {
        url: url.into(),
        instance: url.trim_start_matches("http://").replace("/metrics", ""),
        runtime: "vllm".into(),
        health: health.into(),
        last_error: (health == "down").then(|| "connection failed: refused".to_string()),
        last_scrape_unix_ms: Some(updated - 500),
        shard_index: shard,
        shard_count: 2,
        updated_unix_ms: updated,
    }
}

/// Upsert by URL (the newest `updated_unix_ms` wins, an older row never replaces it); load
/// those updated at or after the bound, by URL; retained like raw records.
pub fn scrape_targets(store: &dyn Store) {
    let a = scrape_target("http://a:1/metrics", 0, "up", NOW - 2_000);
    let b = scrape_target("http://b:1/metrics", 1, "unknown", NOW - 3_000);
    let old = scrape_target("http://c:1/metrics", 1, "up", NOW - 8 * DAY);
    store
        .upsert_scrape_targets(&[a.clone(), b.clone(), old.clone()])
        .unwrap();
    let b2 = scrape_target("http://b:1/metrics", 1, "down", NOW - 1_000);
    store
        .upsert_scrape_targets(std::slice::from_ref(&b2))
        .unwrap();
    // A late publication of an older status loses.
    store
        .upsert_scrape_targets(std::slice::from_ref(&b))
        .unwrap();
    assert_eq!(
        store.load_scrape_targets(NOW - 60_000).unwrap(),
        vec![a.clone(), b2.clone()]
    );
    assert_eq!(
        store.load_scrape_targets(0).unwrap(),
        vec![a.clone(), b2.clone(), old]
    );
    store.apply_retention(NOW).unwrap();
    assert_eq!(store.load_scrape_targets(0).unwrap(), vec![a, b2]);
    store.upsert_scrape_targets(&[]).unwrap();
}

/// A deploy marker of `model` at `at`.
pub fn marker(id: &str, model: &str, at: i64) -> MarkerRow {
    MarkerRow {
        id: id.into(),
        kind: "model_version".into(),
        model: model.into(),
        from_version: "v1".into(),
        to_version: "v2 \"ünï\"\n".into(),
        source: "proxy".into(),
        at_unix_ms: at,
        note: String::new(),
    }
}

/// Markers round-trip, come back oldest first, filter by id, model and time, keep the newest
/// `limit`, ignore a re-inserted id, and go with the roll-up retention (90 days).
pub fn markers(store: &dyn Store) {
    let a = marker("mk-a", "m1", NOW - 3 * MIN);
    let b = MarkerRow {
        kind: "deploy".into(),
        source: "api".into(),
        from_version: String::new(),
        to_version: String::new(),
        note: "helm upgrade 1.2.3".into(),
        ..marker("mk-b", "", NOW - 2 * MIN)
    };
    let c = marker("mk-c", "m2", NOW - MIN);
    let old = marker("mk-old", "m1", NOW - 91 * DAY);
    let kept = marker("mk-kept", "m1", NOW - 89 * DAY);
    store
        .insert_markers(&[c.clone(), a.clone(), old.clone(), kept.clone()])
        .unwrap();
    store.insert_markers(std::slice::from_ref(&b)).unwrap();
    // A retried insert of a stored id changes nothing.
    store
        .insert_markers(&[MarkerRow {
            note: "again".into(),
            ..a.clone()
        }])
        .unwrap();
    store.insert_markers(&[]).unwrap();
    let q = |f: fn(&mut MarkerQuery)| {
        let mut q = MarkerQuery::default();
        f(&mut q);
        store.query_markers(&q).unwrap()
    };
    assert_eq!(
        q(|_| {}),
        vec![old.clone(), kept.clone(), a.clone(), b.clone(), c.clone()]
    );
    assert_eq!(
        q(|q| q.model = Some("m1".into())),
        vec![old, kept.clone(), a.clone()]
    );
    assert_eq!(
        q(|q| q.since_unix_ms = Some(NOW - 2 * MIN)),
        vec![b.clone(), c.clone()]
    );
    assert_eq!(q(|q| q.id = Some("mk-c".into())), vec![c.clone()]);
    assert_eq!(
        q(|q| q.limit = 2),
        vec![b.clone(), c.clone()],
        "the newest two"
    );
    assert!(q(|q| q.limit = 0).is_empty());
    store.apply_retention(NOW).unwrap();
    assert_eq!(q(|_| {}), vec![kept, a, b, c]);
}

/// Raw records, spans, logs, embeddings, annotations, resolved alerts and captured text go
/// after the raw retention (7 days), roll-ups after theirs (90 days); text of region `eu`
/// after one day; what is newer stays.
pub fn retention(store: &dyn Store) {
    let text = |region: &str| CapturedText {
        region: region.into(),
        prompt: "p".into(),
        completion: "c".into(),
        masked: BTreeMap::new(),
        truncated: false,
    };
    let with_text = |id: &str, arrival: i64, region: &str| RequestRecord {
        text: Some(Box::new(text(region))),
        ..rec(id, "m", arrival)
    };
    store
        .insert_records(&[
            with_text("old", NOW - 8 * DAY, "us"),
            rec("edge", "m", NOW - 7 * DAY),
            with_text("eu-2d", NOW - 2 * DAY, "eu"),
            with_text("us-2d", NOW - 2 * DAY, "us"),
            with_text("new", NOW - DAY / 2, "eu"),
        ])
        .unwrap();
    use LatencyMetric::*;
    store
        .insert_rollups(&[
            rollup("m", E2e, NOW - 91 * DAY, 1),
            rollup("m", E2e, NOW - 8 * DAY, 2),
            rollup("m", Queue, NOW - 89 * DAY, 3),
        ])
        .unwrap();
    let ns = |ms: i64| ms * 1_000_000;
    store
        .insert_spans(&[
            span("aa", "01", ns(NOW - 8 * DAY)),
            span("aa", "02", ns(NOW - DAY)),
        ])
        .unwrap();
    let log = |t| LogRow {
        time_unix_nano: t,
        body: "x".into(),
        ..Default::default()
    };
    store
        .insert_logs(&[log(ns(NOW - 8 * DAY)), log(ns(NOW))])
        .unwrap();
    let annotation = |id: &str, at| AnnotationRow {
        request_id: id.into(),
        at_unix_ms: at,
        evidence: serde_json::json!({}),
        ..Default::default()
    };
    store
        .insert_annotations(&[
            annotation("old", NOW - 8 * DAY),
            annotation("new", NOW - DAY),
        ])
        .unwrap();
    store
        .insert_embeddings(&[EmbeddingRow {
            request_id: "old".into(),
            model_id: "m".into(),
            at_unix_ms: NOW - 8 * DAY,
            embedding: vec![1.0],
        }])
        .unwrap();
    let gone = alert(
        "gone",
        AlertState::Resolved,
        NOW - 9 * DAY,
        Some(NOW - 8 * DAY),
    );
    let kept = alert("kept", AlertState::Resolved, NOW - 9 * DAY, Some(NOW - DAY));
    let firing = alert("firing", AlertState::Firing, NOW - 30 * DAY, None);
    store
        .upsert_alerts(&[gone, kept.clone(), firing.clone()])
        .unwrap();

    let report = store.apply_retention(NOW).unwrap();
    assert_eq!(
        report,
        RetentionReport {
            records_deleted: 1,
            rollups_deleted: 1,
            texts_deleted: 2,
        },
        "the old record and its text, the 91-day roll-up, eu text older than a day"
    );
    assert_eq!(ids(&all(store)), ["new", "us-2d", "eu-2d", "edge"]);
    let texts: Vec<(String, bool)> = store
        .query_records(&RecordQuery {
            with_text: true,
            ..Default::default()
        })
        .unwrap()
        .into_iter()
        .map(|r| (r.request_id, r.text.is_some()))
        .collect();
    assert_eq!(
        texts,
        [
            ("new".to_string(), true),
            ("us-2d".to_string(), true),
            ("eu-2d".to_string(), false),
            ("edge".to_string(), false),
        ]
    );
    let left = all_rollups(store);
    assert_eq!(left.iter().map(|r| r.count).collect::<Vec<_>>(), [3, 2]);
    let spans_left = store.query_spans(&SpanQuery::default()).unwrap();
    assert_eq!(
        spans_left
            .iter()
            .map(|s| s.span_id.as_str())
            .collect::<Vec<_>>(),
        ["02"]
    );
    assert_eq!(
        store.query_logs(&LogQuery::default()).unwrap(),
        vec![log(ns(NOW))]
    );
    let left = store
        .query_annotations(&["old".to_string(), "new".to_string()])
        .unwrap();
    assert_eq!(
        left.iter()
            .map(|a| a.request_id.as_str())
            .collect::<Vec<_>>(),
        ["new"]
    );
    assert_eq!(store.load_alerts(0).unwrap(), vec![kept, firing]);
    assert_eq!(
        store.apply_retention(NOW).unwrap(),
        RetentionReport::default(),
        "a second pass finds nothing"
    );
}

/// Row counts (roll-ups counted once per key) and a size on disk once something is stored.
pub fn stats(store: &dyn Store) {
    let empty = store.stats().unwrap();
    assert_eq!((empty.records, empty.rollups), (0, 0));
    store
        .insert_records(&[rec("x", "m", 1), rec("y", "m", 2)])
        .unwrap();
    store
        .insert_rollups(&[rollup("m", LatencyMetric::Ttft, 0, 1)])
        .unwrap();
    store
        .insert_rollups(&[rollup("m", LatencyMetric::Ttft, 0, 2)])
        .unwrap();
    let s = store.stats().unwrap();
    assert_eq!((s.records, s.rollups), (2, 1));
    assert!(s.file_bytes > 0);
}
