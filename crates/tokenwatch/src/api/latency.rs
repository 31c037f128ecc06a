// `/api/v1/latency`: percentiles of one latency metric from this instance's in-memory windows
// (`source=memory`) or merged from the per-minute sketch roll-ups every instance stores (`source=store`).

use super::ApiState;
use crate::kernel::params::{ParamError, Params};
use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokenwatch_core::aggregate::{Aggregator, LatencyGroup, LatencyQuery, ROLLUP_GRACE_MS};
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::model::{GroupLabel, LatencyMetric};
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
const SOURCE_NAMES: &str = "memory, store";
const GROUP_LABEL_NAMES: &str =
    "model_id, runtime, instance, tenant, ab_group, model_version, context_bucket";

/// Where a latency query is answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// This instance's sliding windows (its own traffic, up to 1 h).
    Memory,
    /// The per-minute roll-ups in the store (every instance writing to it, complete minutes).
    Store,
}

impl Source {
    fn parse(s: &str) -> Option<Source> {
        match s {
            "memory" => Some(Source::Memory),
            "store" => Some(Source::Store),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Store => "store",
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
    let metric = p
        .parse_with("metric", LatencyMetric::parse, "ttft, itl, e2e, queue")?
        .unwrap_or(LatencyMetric::Ttft);
    let by = p.parse_with("by", GroupLabel::parse, GROUP_LABEL_NAMES)?;
    let source = p
        .parse_with("source", Source::parse, SOURCE_NAMES)?
        .unwrap_or_else(|| Source::default_for(st.store_backend));
    match source {
        Source::Memory => {
            let window = p
                .parse_with("window", Window::parse, MEMORY_WINDOW_NAMES)?
                .unwrap_or(Window::M5);
            Ok(from_memory(&st, model, metric, window, by))
        }
        Source::Store => {
            let window = p
                .parse_with(
                    "window",
                    |w| STORE_WINDOWS.into_iter().find(|(name, _)| *name == w),
                    STORE_WINDOW_NAMES,
                )?
                .unwrap_or(STORE_WINDOWS[1]);
            from_store(&st, model, metric, window, by).await
        }
    }
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
) -> serde_json::Map<String, serde_json::Value> {
    let mut body = serde_json::Map::new();
    body.insert("model".into(), json!(model));
    body.insert("metric".into(), json!(metric.name()));
    body.insert("window".into(), json!(window));
    body.insert("source".into(), json!(source.name()));
    body.insert("unit".into(), json!("seconds"));
    body.insert("relative_error".into(), json!(RELATIVE_ACCURACY));
    if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(&total) {
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
) -> Response {
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
    let body = body(
        model.as_deref(),
        metric,
        window.name(),
        Source::Memory,
        total,
        by,
        grouped,
    );
    Json(body).into_response()
}

async fn from_store(
    st: &ApiState,
    model: Option<String>,
    metric: LatencyMetric,
    (window, window_ms): (&str, i64),
    by: Option<GroupLabel>,
) -> Result<Response, LatencyError> {
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
    Ok(Json(body).into_response())
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
        assert!(e.to_string().contains("memory, store"), "{e}");
        assert_eq!(e.into_response().status(), StatusCode::BAD_REQUEST);
    }
}
