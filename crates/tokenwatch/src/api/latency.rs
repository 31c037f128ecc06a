// `/api/v1/latency`: percentiles of one latency metric from this instance's in-memory windows
// (`source=memory`), merged from the per-minute sketch roll-ups every instance stores
// (`source=store`), or from the runtimes' own scraped histograms (`source=runtime`, chosen by
// itself when no proxy or OTLP record holds the model), each percentile with its bucket bounds.
// Prefill and decode time (`metric=prefill|decode`) only a runtime's histograms measure: they are
// answered from the runtime (with or without `source=runtime`, empty without a scrape of it), and
// asking them of the records (`source=memory|store`) is a 400 that says so.

use super::ApiState;
use crate::kernel::params::{ParamError, Params};
use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokenwatch_core::aggregate::{Aggregator, LatencyGroup, LatencyQuery, ROLLUP_GRACE_MS};
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::histogram::BucketQuantile;
use tokenwatch_core::model::{GroupLabel, LatencyMetric};
use tokenwatch_core::runtime_latency::{RuntimeGroup, RuntimeQuery, RuntimeSummary};
use tokenwatch_core::signals::SignalBoard;
use tokenwatch_core::sketch::{LatencySketch, LatencySummary, RELATIVE_ACCURACY};
use tokenwatch_core::window::{TIER_1M_MS, Window};
use tokenwatch_store::StoreBackendKind;
use tokenwatch_store::{RollupQuery, RollupRow};

/// The windows of `source=store`: name and length. Each covers that many complete minutes.
const STORE_WINDOWS: [(&str, i64); 6] = [
    ("1m", 60_000),
    ("5m", 300_000),
    ("1h", 3_600_000),
    ("6h", 6 * 3_600_000),
    ("24h", 24 * 3_600_000),
    ("7d", 7 * 24 * 3_600_000),
];
const STORE_WINDOW_NAMES: &str = "1m, 5m, 1h, 6h, 24h, 7d";
const MEMORY_WINDOW_NAMES: &str = "1m, 5m, 1h (6h, 24h and 7d need source=store)";
const RUNTIME_WINDOW_NAMES: &str = "1m, 5m, 1h (the runtime windows keep one hour)";
const SOURCE_NAMES: &str = "memory, store, runtime";
const GROUP_LABEL_NAMES: &str =
    "model_id, runtime, instance, tenant, ab_group, model_version, context_bucket";
const RUNTIME_GROUP_LABEL_NAMES: &str =
    "model_id, runtime, instance (the runtime's histograms carry no other label)";
/// Why an answer without `source` came from the runtime.
const RUNTIME_CHOSEN: &str = "no proxy or OTLP record of this model in the window: answered from the runtime's own histograms (source=memory or source=store asks for the records)";
/// Every `metric` the API answers.
const METRIC_NAMES: &str = "ttft, itl, e2e, queue, prefill, decode";
/// Why prefill and decode come from the runtime, whatever the source asked for.
const RUNTIME_ONLY: &str = "prefill and decode time are measured only by the serving runtime's own histograms (vLLM's vllm:request_prefill_time_seconds and vllm:request_decode_time_seconds); no proxy or OTLP record holds them";

/// What `metric` names: a latency the records measure (and the runtime's histograms too), or a
/// phase of the request inside the runtime that only its histograms measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    Records(LatencyMetric),
    /// Prefill (scheduled → first token) or decode (first → last token) time.
    RuntimeOnly(&'static str),
}

impl Metric {
    fn parse(s: &str) -> Option<Metric> {
        match s {
            "prefill" => Some(Metric::RuntimeOnly("prefill")),
            "decode" => Some(Metric::RuntimeOnly("decode")),
            _ => LatencyMetric::parse(s).map(Metric::Records),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Metric::Records(m) => m.name(),
            Metric::RuntimeOnly(name) => name,
        }
    }

    /// The scraped histogram signal that measures it (`sources::scrape` tables).
    fn runtime_signal(self) -> &'static str {
        match self {
            Metric::Records(m) => runtime_signal(m),
            // The scrape tables name the two phases as the API does.
            Metric::RuntimeOnly(name) => name,
        }
    }
}

/// Where a latency query is answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// This instance's sliding windows (its own traffic, up to 1 h).
    Memory,
    /// The per-minute roll-ups in the store (every instance writing to it, complete minutes).
    Store,
    /// The scraped histograms of the serving runtimes (`runtime_latency::RuntimeWindows`).
    Runtime,
}

impl Source {
    fn parse(s: &str) -> Option<Source> {
        match s {
            "memory" => Some(Source::Memory),
            "store" => Some(Source::Store),
            "runtime" => Some(Source::Runtime),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Store => "store",
            Source::Runtime => "runtime",
        }
    }

    /// `store` when the backend is shared (ClickHouse), `memory` otherwise.
    fn default_for(backend: StoreBackendKind) -> Source {
        match backend {
            StoreBackendKind::ClickHouse => Source::Store,
            StoreBackendKind::Sqlite => Source::Memory,
        }
    }
}

fn backend_name(backend: StoreBackendKind) -> &'static str {
    match backend {
        StoreBackendKind::Sqlite => "sqlite",
        StoreBackendKind::ClickHouse => "clickhouse",
    }
}

/// Why a latency query was not answered: a bad parameter (400) or a store that failed (503).
#[derive(Debug, thiserror::Error)]
pub enum LatencyError {
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error("the {store} store did not answer the roll-up query: {detail}")]
    Store { store: &'static str, detail: String },
}

impl IntoResponse for LatencyError {
    fn into_response(self) -> Response {
        match self {
            LatencyError::Param(e) => e.into_response(),
            LatencyError::Store { store, .. } => {
                let body = json!({ "error": self.to_string(), "store": store });
                (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
            }
        }
    }
}

/// The end of the last minute whose roll-ups are complete at `now_unix_ms`: the aggregator
/// hands a minute out `ROLLUP_GRACE_MS` after it ends.
pub fn complete_through(now_unix_ms: i64) -> i64 {
    now_unix_ms
        .saturating_sub(ROLLUP_GRACE_MS)
        .div_euclid(TIER_1M_MS)
        .saturating_mul(TIER_1M_MS)
}

/// Latency merged from stored roll-ups.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredLatency {
    /// Every matching row merged (count 0 and `None` quantiles without data).
    pub total: LatencySummary,
    /// With `by`: one group per value among the rows, sorted by value, as `Aggregator::query`.
    pub groups: Option<Vec<LatencyGroup>>,
    /// Rows whose sketch bytes could not be decoded; left out of the figures.
    pub unreadable_rows: u64,
}

/// Merges the sketches of the `rows` of `metric` (and of `model`, when given) into one summary
/// and, with `by`, one per value of that label. Each sketch is decoded once; quantiles come from
/// the merged DDSketch, so they keep its relative-error bound whatever the number of rows.
pub fn merge_rollups(
    rows: &[RollupRow],
    metric: LatencyMetric,
    model: Option<&str>,
    by: Option<GroupLabel>,
) -> StoredLatency {
    let mut total = LatencySketch::new();
    let mut groups: BTreeMap<&str, LatencySketch> = BTreeMap::new();
    let mut unreadable_rows = 0u64;
    for row in rows {
        if row.metric != metric || model.is_some_and(|m| row.labels.model_id != m) {
            continue;
        }
        let sketch = match LatencySketch::from_bytes(&row.sketch) {
            Ok(s) => s,
            Err(e) => {
                unreadable_rows += 1;
                tracing::debug!(minute = row.minute_start_unix_ms, error = %e, "unreadable roll-up sketch");
                continue;
            }
        };
        total.merge(&sketch);
        if let Some(by) = by {
            groups
                .entry(by.value_of(&row.labels, row.bucket))
                .or_default()
                .merge(&sketch);
        }
    }
    let groups = by.map(|by| {
        groups
            .into_iter()
            .filter(|(_, s)| !s.is_empty())
            .map(|(value, s)| LatencyGroup {
                labels: Aggregator::group_labels(model, Some(by), Some(value)),
                summary: s.summary(),
            })
            .collect()
    });
    StoredLatency {
        total: total.summary(),
        groups,
        unreadable_rows,
    }
}

pub(super) async fn latency(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, LatencyError> {
    let p = Params::parse(q.as_deref(), &["model", "metric", "window", "by", "source"])?;
    let model = p.get("model").map(str::to_string);
    let asked_metric = p
        .parse_with("metric", Metric::parse, METRIC_NAMES)?
        .unwrap_or(Metric::Records(LatencyMetric::Ttft));
    let by = p.parse_with("by", GroupLabel::parse, GROUP_LABEL_NAMES)?;
    let asked = p.parse_with("source", Source::parse, SOURCE_NAMES)?;
    let metric = match asked_metric {
        Metric::Records(m) => m,
        Metric::RuntimeOnly(name) => {
            let chosen = runtime_only_source(name, asked)?;
            let (_, mut body) = runtime_answer(&st, &p, model.as_deref(), asked_metric, by)?;
            if chosen {
                body.insert("source_chosen".into(), json!(RUNTIME_ONLY));
            }
            return Ok(Json(body).into_response());
        }
    };
    let (body, window) = match asked.unwrap_or_else(|| Source::default_for(st.store_backend)) {
        Source::Runtime => {
            let (_, body) = runtime_answer(&st, &p, model.as_deref(), asked_metric, by)?;
            return Ok(Json(body).into_response());
        }
        Source::Memory => {
            let window = p
                .parse_with("window", Window::parse, MEMORY_WINDOW_NAMES)?
                .unwrap_or(Window::M5);
            (
                from_memory(&st, model.clone(), metric, window, by),
                Some(window),
            )
        }
        Source::Store => {
            let window = p
                .parse_with(
                    "window",
                    |w| STORE_WINDOWS.into_iter().find(|(name, _)| *name == w),
                    STORE_WINDOW_NAMES,
                )?
                .unwrap_or(STORE_WINDOWS[1]);
            let body = from_store(&st, model.clone(), metric, window, by).await?;
            (body, Window::parse(window.0))
        }
    };
    // No source asked for and no record of the model: the runtime answers, when it can.
    let runtime_can_group = by.is_none_or(|g| runtime_group(g).is_some());
    let no_records = body.get("count").and_then(Value::as_u64) == Some(0);
    if let (None, Some(window), true, true) = (asked, window, runtime_can_group, no_records) {
        let board = st.signals.read().unwrap_or_else(|p| p.into_inner());
        let (count, mut runtime) = from_runtime(
            &board,
            model.as_deref(),
            asked_metric,
            window,
            by.and_then(runtime_group),
            now_unix_ms(),
        );
        if count > 0 {
            runtime.insert("source_chosen".into(), json!(RUNTIME_CHOSEN));
            return Ok(Json(runtime).into_response());
        }
    }
    Ok(Json(body).into_response())
}

/// Where a metric only the runtime measures is answered from: the runtime, chosen (`true`, no
/// source asked) or asked for; asking the records for it is a 400 that says why.
fn runtime_only_source(metric: &str, asked: Option<Source>) -> Result<bool, ParamError> {
    match asked {
        None => Ok(true),
        Some(Source::Runtime) => Ok(false),
        Some(source @ (Source::Memory | Source::Store)) => Err(ParamError::BadValue {
            name: "source".into(),
            value: source.name().into(),
            allowed: format!("runtime, or no source, for metric={metric} ({RUNTIME_ONLY})"),
        }),
    }
}

/// The answer from the runtime windows to the query's window (1m, 5m, 1h) and grouping (the
/// labels scrapes carry), with its observation count; a 400 for others.
fn runtime_answer(
    st: &ApiState,
    p: &Params,
    model: Option<&str>,
    metric: Metric,
    by: Option<GroupLabel>,
) -> Result<(u64, Map<String, Value>), ParamError> {
    let window = p
        .parse_with("window", Window::parse, RUNTIME_WINDOW_NAMES)?
        .unwrap_or(Window::M5);
    let by = match by {
        None => None,
        Some(g) => Some(runtime_group(g).ok_or_else(|| ParamError::BadValue {
            name: "by".into(),
            value: g.name().into(),
            allowed: RUNTIME_GROUP_LABEL_NAMES.into(),
        })?),
    };
    let board = st.signals.read().unwrap_or_else(|p| p.into_inner());
    Ok(from_runtime(
        &board,
        model,
        metric,
        window,
        by,
        now_unix_ms(),
    ))
}

/// The runtime histograms' grouping for a `by` label, if they carry it.
fn runtime_group(g: GroupLabel) -> Option<RuntimeGroup> {
    match g {
        GroupLabel::ModelId => Some(RuntimeGroup::ModelId),
        GroupLabel::Instance => Some(RuntimeGroup::Instance),
        GroupLabel::Runtime => Some(RuntimeGroup::Runtime),
        _ => None,
    }
}

/// The scraped histogram signal (`sources::scrape` tables) that measures `metric`: vLLM's
/// inter-token latency and time per output token are both `itl`.
pub fn runtime_signal(metric: LatencyMetric) -> &'static str {
    match metric {
        LatencyMetric::Ttft => "ttft",
        LatencyMetric::Itl => "itl",
        LatencyMetric::E2e => "e2e",
        LatencyMetric::Queue => "queue",
    }
}

/// A bucket bound as JSON: +Inf (the last bucket) is `null`, unbounded.
fn bound(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { Value::Null }
}

/// The bucket a quantile lies in and the largest error that allows (`null`: unbounded).
pub fn bucket_json(e: &BucketQuantile) -> Value {
    json!({
        "lower": bound(e.bucket_lower),
        "upper": bound(e.bucket_upper),
        "max_abs_error": bound(e.max_abs_error()),
    })
}

/// A runtime summary in the fields of `LatencySummary`, plus each percentile's bucket bounds.
fn runtime_summary_fields(s: &RuntimeSummary) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("count".into(), json!(s.count));
    out.insert("mean".into(), json!(s.mean));
    let mut bounds = Map::new();
    for (name, _) in tokenwatch_core::runtime_latency::QUANTILES {
        let q = s.quantile(name);
        out.insert(name.into(), json!(q.map(|e| e.value)));
        if let Some(e) = q {
            bounds.insert(name.into(), bucket_json(e));
        }
    }
    out.insert("bucket_bounds".into(), Value::Object(bounds));
    if s.observations_left_out > 0 {
        out.insert(
            "observations_left_out".into(),
            json!(s.observations_left_out),
        );
    }
    out
}

/// The answer from the runtime windows, with its observation count.
fn from_runtime(
    board: &SignalBoard,
    model: Option<&str>,
    metric: Metric,
    window: Window,
    by: Option<RuntimeGroup>,
    now: i64,
) -> (u64, Map<String, Value>) {
    let answer = board.runtime_windows().latency(
        &RuntimeQuery {
            model,
            signal: metric.runtime_signal(),
            window_ms: window.duration_ms(),
            by,
        },
        now,
    );
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("metric".into(), json!(metric.name()));
    body.insert("window".into(), json!(window.name()));
    body.insert("source".into(), json!(Source::Runtime.name()));
    body.insert("unit".into(), json!("seconds"));
    // Not a sketch: the error of each percentile is its bucket (`bucket_bounds`).
    body.insert("relative_error".into(), Value::Null);
    body.extend(runtime_summary_fields(&answer.total));
    body.insert("instances".into(), json!(answer.total.instances));
    body.insert("runtimes".into(), json!(answer.total.runtimes));
    body.insert("from_unix_ms".into(), json!(answer.from_unix_ms));
    body.insert("through_unix_ms".into(), json!(now));
    if let (Some(by), Some(groups)) = (by, answer.groups) {
        let groups: Vec<Value> = groups
            .iter()
            .map(|(labels, s)| json!({ "labels": labels, "summary": runtime_summary_fields(s) }))
            .collect();
        body.insert("by".into(), json!(by.name()));
        body.insert("groups".into(), json!(groups));
    }
    (answer.total.count, body)
}

/// The fields every answer has, with the total summary's fields at the top level.
fn body(
    model: Option<&str>,
    metric: LatencyMetric,
    window: &str,
    source: Source,
    total: LatencySummary,
    by: Option<GroupLabel>,
    groups: Option<Vec<LatencyGroup>>,
) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("metric".into(), json!(metric.name()));
    body.insert("window".into(), json!(window));
    body.insert("source".into(), json!(source.name()));
    body.insert("unit".into(), json!("seconds"));
    body.insert("relative_error".into(), json!(RELATIVE_ACCURACY));
    if let Ok(Value::Object(fields)) = serde_json::to_value(&total) {
        body.extend(fields);
    }
    if let (Some(by), Some(groups)) = (by, groups) {
        body.insert("by".into(), json!(by.name()));
        body.insert("groups".into(), json!(groups));
    }
    body
}

fn from_memory(
    st: &ApiState,
    model: Option<String>,
    metric: LatencyMetric,
    window: Window,
    by: Option<GroupLabel>,
) -> Map<String, Value> {
    let query = LatencyQuery {
        model: model.clone(),
        metric,
        window,
        by,
    };
    let (total, grouped) = {
        let agg = st.aggregator.lock().unwrap_or_else(|p| p.into_inner());
        let now = now_unix_ms();
        let total = agg.query(
            &LatencyQuery {
                by: None,
                ..query.clone()
            },
            now,
        );
        (total, by.map(|_| agg.query(&query, now)))
    };
    let total = total
        .into_iter()
        .next()
        .map_or_else(|| LatencySketch::new().summary(), |g| g.summary);
    body(
        model.as_deref(),
        metric,
        window.name(),
        Source::Memory,
        total,
        by,
        grouped,
    )
}

async fn from_store(
    st: &ApiState,
    model: Option<String>,
    metric: LatencyMetric,
    (window, window_ms): (&str, i64),
    by: Option<GroupLabel>,
) -> Result<Map<String, Value>, LatencyError> {
    let through = complete_through(now_unix_ms());
    let from = through.saturating_sub(window_ms);
    let query = RollupQuery {
        model: model.clone(),
        metric: Some(metric),
        from_unix_ms: from,
        to_unix_ms: through,
    };
    let store = st.store.clone();
    let store_name = backend_name(st.store_backend);
    let failed = |detail: String| LatencyError::Store {
        store: store_name,
        detail,
    };
    let rows = tokio::task::spawn_blocking(move || store.query_rollups(&query))
        .await
        .map_err(|e| failed(e.to_string()))?
        .map_err(|e| failed(e.to_string()))?;
    let merged = merge_rollups(&rows, metric, model.as_deref(), by);
    let mut body = body(
        model.as_deref(),
        metric,
        window,
        Source::Store,
        merged.total,
        by,
        merged.groups,
    );
    body.insert("from_unix_ms".into(), json!(from));
    body.insert("through_unix_ms".into(), json!(through));
    if merged.unreadable_rows > 0 {
        body.insert("unreadable_rollups".into(), json!(merged.unreadable_rows));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwatch_core::model::{ContextBucket, SeriesLabels};

    /// Deterministic, spread-out latencies in seconds (a log-uniform-ish walk over 5 ms – 20 s).
    fn values(seed: u64, n: usize) -> Vec<f64> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                0.005 * (4000f64).powf(u)
            })
            .collect()
    }

    fn labels(instance: &str) -> SeriesLabels {
        SeriesLabels {
            model_id: "m".into(),
            instance: instance.into(),
            runtime: "vllm".into(),
            ..Default::default()
        }
    }

    /// One row per minute of `vals`, spread over `minutes` minutes, as one instance would store.
    fn rows_of(
        instance: &str,
        bucket: ContextBucket,
        vals: &[f64],
        minutes: usize,
    ) -> Vec<RollupRow> {
        (0..minutes)
            .map(|minute| {
                let mut s = LatencySketch::new();
                for v in vals.iter().skip(minute).step_by(minutes) {
                    s.add(*v);
                }
                RollupRow {
                    labels: labels(instance),
                    bucket,
                    metric: LatencyMetric::Ttft,
                    minute_start_unix_ms: 1_700_000_040_000 + minute as i64 * 60_000,
                    count: s.count(),
                    sketch: s.to_bytes(),
                }
            })
            .collect()
    }

    fn exact(v: &[f64], q: f64) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[(q * (v.len() - 1) as f64).floor() as usize]
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs())
    }

    #[test]
    fn two_instances_rows_merge_to_the_quantiles_of_one_sketch_of_every_value() {
        let (a, b) = (values(1, 700), values(2, 1300));
        let mut rows = rows_of("a", ContextBucket::Le512, &a, 7);
        rows.extend(rows_of("b", ContextBucket::Le1024, &b, 11));
        let all: Vec<f64> = a.iter().chain(&b).copied().collect();
        let mut one = LatencySketch::new();
        for v in &all {
            one.add(*v);
        }
        let merged = merge_rollups(&rows, LatencyMetric::Ttft, Some("m"), None);
        assert_eq!(merged.total.count, 2000);
        assert_eq!(merged.groups, None);
        assert_eq!(merged.unreadable_rows, 0);
        let single = one.summary();
        for (name, q, got, want) in [
            ("p50", 0.5, merged.total.p50, single.p50),
            ("p90", 0.9, merged.total.p90, single.p90),
            ("p99", 0.99, merged.total.p99, single.p99),
        ] {
            let (got, want) = (got.unwrap(), want.unwrap());
            assert!(
                close(got, want, 1e-12),
                "{name}: merged {got} vs one sketch {want}"
            );
            let exact = exact(&all, q);
            assert!(
                close(got, exact, RELATIVE_ACCURACY * 1.0001),
                "{name}: merged {got} vs exact {exact}"
            );
        }
        assert!(close(
            merged.total.mean.unwrap(),
            all.iter().sum::<f64>() / 2000.0,
            1e-9
        ));
    }

    #[test]
    fn by_instance_groups_each_instance_and_names_the_model() {
        let (a, b) = (values(3, 400), values(4, 900));
        let mut rows = rows_of("b", ContextBucket::Le512, &b, 5);
        rows.extend(rows_of("a", ContextBucket::Le512, &a, 3));
        rows.extend(rows_of("a", ContextBucket::Gt4096, &a, 2));
        let merged = merge_rollups(
            &rows,
            LatencyMetric::Ttft,
            Some("m"),
            Some(GroupLabel::Instance),
        );
        let groups = merged.groups.unwrap();
        let names: Vec<_> = groups.iter().map(|g| g.labels.clone()).collect();
        let label = |i: &str| {
            BTreeMap::from([
                ("instance".to_string(), i.to_string()),
                ("model_id".to_string(), "m".to_string()),
            ])
        };
        assert_eq!(names, [label("a"), label("b")]);
        assert_eq!(groups[0].summary.count, 800, "both buckets of instance a");
        assert_eq!(groups[1].summary.count, 900);
        let a2: Vec<f64> = a.iter().chain(&a).copied().collect();
        for (g, vals) in [(&groups[0], &a2), (&groups[1], &b)] {
            let (got, want) = (g.summary.p99.unwrap(), exact(vals, 0.99));
            assert!(
                close(got, want, RELATIVE_ACCURACY * 1.0001),
                "{:?}: {got} vs {want}",
                g.labels
            );
        }
        assert_eq!(merged.total.count, 1700);
        // By context bucket: the same rows, split the other way.
        let by_bucket = merge_rollups(
            &rows,
            LatencyMetric::Ttft,
            None,
            Some(GroupLabel::ContextBucket),
        )
        .groups
        .unwrap();
        let buckets: Vec<(String, u64)> = by_bucket
            .iter()
            .map(|g| (g.labels["context_bucket"].clone(), g.summary.count))
            .collect();
        assert_eq!(
            buckets,
            [("gt4096".to_string(), 400), ("le512".to_string(), 1300)]
        );
        assert!(
            !by_bucket[0].labels.contains_key("model_id"),
            "no model asked for"
        );
    }

    #[test]
    fn other_metrics_models_and_unreadable_rows_are_left_out() {
        let a = values(5, 50);
        let mut rows = rows_of("a", ContextBucket::Le512, &a, 1);
        let mut other_metric = rows[0].clone();
        other_metric.metric = LatencyMetric::E2e;
        let mut other_model = rows[0].clone();
        other_model.labels.model_id = "n".into();
        let mut corrupt = rows[0].clone();
        corrupt.sketch = vec![0xff, 0x01, 0x02];
        rows.extend([other_metric, other_model, corrupt]);
        let merged = merge_rollups(
            &rows,
            LatencyMetric::Ttft,
            Some("m"),
            Some(GroupLabel::Runtime),
        );
        assert_eq!(merged.total.count, 50);
        assert_eq!(merged.unreadable_rows, 1);
        assert_eq!(merged.groups.as_ref().map(Vec::len), Some(1));
        let none = merge_rollups(&[], LatencyMetric::Ttft, Some("m"), None);
        assert_eq!(none.total.count, 0);
        assert_eq!(none.total.p50, None);
        assert_eq!(
            merge_rollups(&[], LatencyMetric::Ttft, None, Some(GroupLabel::Tenant)).groups,
            Some(vec![])
        );
    }

    #[test]
    fn complete_minutes_end_a_grace_after_the_minute() {
        let minute = 1_700_000_040_000; // a minute boundary
        assert_eq!(complete_through(minute + ROLLUP_GRACE_MS), minute);
        assert_eq!(
            complete_through(minute + ROLLUP_GRACE_MS - 1),
            minute - 60_000
        );
        assert_eq!(complete_through(minute + 59_999), minute);
    }

    #[test]
    fn a_store_failure_is_a_503_naming_the_store() {
        let e = LatencyError::Store {
            store: "clickhouse",
            detail: "connection refused".into(),
        };
        assert_eq!(
            e.to_string(),
            "the clickhouse store did not answer the roll-up query: connection refused"
        );
        assert_eq!(e.into_response().status(), StatusCode::SERVICE_UNAVAILABLE);
        let p = Params::parse(Some("source=bogus"), &["source"]).unwrap();
        let e = LatencyError::from(
            p.parse_with("source", Source::parse, SOURCE_NAMES)
                .unwrap_err(),
        );
        assert!(e.to_string().contains("memory, store, runtime"), "{e}");
        assert_eq!(e.into_response().status(), StatusCode::BAD_REQUEST);
    }

    fn board_with_ttft(instance_buckets: &[(&str, [f64; 3])], at: i64) -> SignalBoard {
        use tokenwatch_core::histogram::CumulativeHistogram;
        let mut board = SignalBoard::default();
        for (instance, per_bucket) in instance_buckets {
            let ttft =
                CumulativeHistogram::from_bucket_counts(&[0.1, 0.5, f64::INFINITY], per_bucket);
            board.record_counts(tokenwatch_core::counts::ScrapeCounts {
                model_id: "m".into(),
                instance: (*instance).into(),
                runtime: "vllm".into(),
                at_unix_ms: at,
                interval_ms: 5_000,
                finished: Some(ttft.count),
                failed: Some(0.0),
                prompt_tokens: None,
                output_tokens: None,
                latency: vec![("ttft".into(), ttft)],
            });
        }
        board
    }

    #[test]
    fn the_runtime_answers_in_the_latency_shape_with_bucket_bounds() {
        let now = 1_700_000_070_000;
        let board = board_with_ttft(&[("a", [10.0, 0.0, 0.0]), ("b", [0.0, 8.0, 2.0])], now);
        let (count, body) = from_runtime(
            &board,
            Some("m"),
            Metric::Records(LatencyMetric::Ttft),
            Window::M5,
            Some(RuntimeGroup::Instance),
            now,
        );
        assert_eq!(count, 20);
        assert_eq!(body["source"], "runtime");
        assert_eq!(body["count"], 20);
        assert_eq!(body["relative_error"], Value::Null);
        assert_eq!(body["instances"], json!(["a", "b"]));
        assert_eq!(body["from_unix_ms"], json!(1_700_000_040_000_i64));
        for q in ["p50", "p90", "p95", "p99"] {
            let v = body[q].as_f64().unwrap();
            let b = &body["bucket_bounds"][q];
            let lower = b["lower"].as_f64().unwrap();
            match b["upper"].as_f64() {
                Some(upper) => assert!(lower <= v && v <= upper, "{q}: {body:?}"),
                None => assert_eq!(b["max_abs_error"], Value::Null, "+Inf is unbounded"),
            }
        }
        // P50: the 10th of 20, the top of (0, 0.1]; P99 in the +Inf bucket (unbounded).
        assert_eq!(body["bucket_bounds"]["p50"]["upper"], json!(0.1));
        assert_eq!(body["bucket_bounds"]["p99"]["upper"], Value::Null);
        assert_eq!(
            body["p99"],
            json!(0.5),
            "the largest finite bound, as PromQL"
        );
        let groups = body["groups"].as_array().unwrap();
        assert_eq!(body["by"], "instance");
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[1]["labels"]["instance"], "b");
        assert_eq!(groups[1]["summary"]["count"], 10);
        // Another metric, another model, or a window ending before the data: nothing.
        for (model, metric) in [
            (Some("m"), Metric::Records(LatencyMetric::Itl)),
            (Some("x"), Metric::Records(LatencyMetric::Ttft)),
            (Some("m"), Metric::RuntimeOnly("prefill")),
        ] {
            let (count, body) = from_runtime(&board, model, metric, Window::M5, None, now);
            assert_eq!(count, 0);
            assert_eq!(body["p50"], Value::Null);
            assert_eq!(body["bucket_bounds"], json!({}));
        }
    }

    #[test]
    fn runtime_groups_are_the_labels_scrapes_carry() {
        assert_eq!(
            runtime_group(GroupLabel::Instance),
            Some(RuntimeGroup::Instance)
        );
        assert_eq!(
            runtime_group(GroupLabel::ModelId),
            Some(RuntimeGroup::ModelId)
        );
        assert_eq!(
            runtime_group(GroupLabel::Runtime),
            Some(RuntimeGroup::Runtime)
        );
        assert_eq!(runtime_group(GroupLabel::Tenant), None);
        for m in LatencyMetric::ALL {
            assert_eq!(
                runtime_signal(m),
                m.name(),
                "the scrape tables use the API's names"
            );
        }
    }

    #[test]
    fn prefill_and_decode_come_from_the_runtime_histograms_only() {
        use tokenwatch_core::histogram::CumulativeHistogram;
        // vLLM's own prefill and decode buckets: per request, 6 prefills in (0, 0.3] and 2 in
        // (0.3, 0.5]; 5 decodes in (0.8, 1.0] and 3 in (1.5, 2.0].
        let bounds = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, f64::INFINITY];
        let prefill =
            CumulativeHistogram::from_bucket_counts(&bounds, &[6.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let decode =
            CumulativeHistogram::from_bucket_counts(&bounds, &[0.0, 0.0, 0.0, 5.0, 0.0, 3.0, 0.0]);
        let now = 1_700_000_070_000;
        let mut board = SignalBoard::default();
        board.record_counts(tokenwatch_core::counts::ScrapeCounts {
            model_id: "m".into(),
            instance: "a".into(),
            runtime: "vllm".into(),
            at_unix_ms: now,
            interval_ms: 5_000,
            finished: Some(8.0),
            failed: Some(0.0),
            prompt_tokens: None,
            output_tokens: None,
            latency: vec![("prefill".into(), prefill), ("decode".into(), decode)],
        });
        for (name, want) in [
            (
                "prefill",
                [("p50", 0.2, 0.0, 0.3), ("p99", 0.492, 0.3, 0.5)],
            ),
            (
                "decode",
                [
                    ("p50", 0.96, 0.8, 1.0),
                    ("p99", 1.5 + 0.5 * 2.92 / 3.0, 1.5, 2.0),
                ],
            ),
        ] {
            let metric = Metric::parse(name).unwrap();
            assert_eq!(metric, Metric::RuntimeOnly(name));
            assert_eq!((metric.name(), metric.runtime_signal()), (name, name));
            let (count, body) = from_runtime(&board, Some("m"), metric, Window::M5, None, now);
            assert_eq!(count, 8, "{name}");
            assert_eq!(body["metric"], name);
            assert_eq!(body["source"], "runtime");
            for (q, value, lower, upper) in want {
                assert!(
                    (body[q].as_f64().unwrap() - value).abs() < 1e-9,
                    "{name} {q}: {body:?}"
                );
                assert_eq!(
                    body["bucket_bounds"][q]["lower"],
                    json!(lower),
                    "{name} {q}"
                );
                assert_eq!(
                    body["bucket_bounds"][q]["upper"],
                    json!(upper),
                    "{name} {q}"
                );
            }
        }
        // The records' metrics parse as before; the two phases are no records' metric.
        for m in LatencyMetric::ALL {
            assert_eq!(Metric::parse(m.name()), Some(Metric::Records(m)));
        }
        assert_eq!(Metric::parse("ttfb"), None);
        // Without a source the runtime is chosen; asked for, it answers; the records: a 400.
        assert!(runtime_only_source("prefill", None).unwrap());
        assert!(!runtime_only_source("decode", Some(Source::Runtime)).unwrap());
        for source in [Source::Memory, Source::Store] {
            let e = LatencyError::from(runtime_only_source("prefill", Some(source)).unwrap_err());
            let text = e.to_string();
            assert!(
                text.contains("runtime, or no source, for metric=prefill")
                    && text.contains("only by the serving runtime's own histograms"),
                "{text}"
            );
            assert_eq!(e.into_response().status(), StatusCode::BAD_REQUEST);
        }
    }
}
