// `GET /api/v1/fleet` (one row per model with sparklines, for the UI overview and `top`) and
// `GET /api/v1/timeseries` (one model's charts on one time axis), from the fleet timeline.

use super::ApiState;
use super::timeline::{Column, STEP_MS, Timeline, sample_fleet};
use crate::kernel::params::{ParamError, Params};
use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokenwatch_core::alert::{Alert, AlertState, Severity};
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::window::Window;

/// Points in a fleet sparkline: five minutes.
const SPARKLINE_POINTS: i64 = 60;
const SPARKLINE_COLUMNS: [Column; 5] = [
    Column::TtftP99,
    Column::ItlP99,
    Column::RequestsPerS,
    Column::KvCacheUsage,
    Column::GpuMemoryUsedBytes,
];

/// Chart ranges of `/api/v1/timeseries` (the timeline keeps one hour).
pub(super) fn parse_range(s: &str) -> Option<i64> {
    match s {
        "5m" => Some(5 * 60_000),
        "15m" => Some(15 * 60_000),
        "1h" => Some(3_600_000),
        _ => None,
    }
}
pub(super) const RANGES: &str = "5m, 15m, 1h";

pub(super) fn unix_s(ms: &[i64]) -> Vec<f64> {
    ms.iter().map(|t| *t as f64 / 1000.0).collect()
}

#[derive(Default)]
struct AlertCounts {
    firing: usize,
    pending: usize,
    worst: Option<Severity>,
}

fn alert_counts(alerts: &[Alert]) -> BTreeMap<String, AlertCounts> {
    let mut out: BTreeMap<String, AlertCounts> = BTreeMap::new();
    for a in alerts {
        let Some(model) = a.labels.get("model_id") else {
            continue;
        };
        let c = out.entry(model.clone()).or_default();
        match a.state {
            AlertState::Firing => {
                c.firing += 1;
                c.worst = Some(c.worst.map_or(a.severity, |w| w.min(a.severity)));
            }
            AlertState::Pending => c.pending += 1,
            AlertState::Resolved => {}
        }
    }
    out
}

pub(super) async fn fleet(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(q.as_deref(), &["window"])?;
    let window = p
        .parse_with("window", Window::parse, "1m, 5m, 1h")?
        .unwrap_or(Window::M1);
    let now = now_unix_ms();
    // Before any lock is taken: the guards below are not held across an await.
    let (targets, targets_error) = scrape_targets(&st, now).await;
    let samples = {
        let agg = st.aggregator.lock().unwrap_or_else(|p| p.into_inner());
        let board = st.signals.read().unwrap_or_else(|p| p.into_inner());
        sample_fleet(&agg, &board, window, now)
    };
    let alerts = alert_counts(&st.alerts.list());
    let timeline = st.timeline.read().unwrap_or_else(|p| p.into_inner());
    let mut names: BTreeSet<String> = samples.keys().cloned().collect();
    names.extend(timeline.models().map(str::to_string));
    names.extend(alerts.keys().cloned());
    let models: Vec<Value> = names
        .iter()
        .map(|model| {
            let mut row = Map::new();
            row.insert("model_id".into(), json!(model));
            let sample = samples.get(model);
            row.insert("runtimes".into(), json!(sample.map(|s| &s.runtimes)));
            row.insert("instances".into(), json!(sample.map(|s| &s.instances)));
            for c in Column::ALL {
                row.insert(c.name().into(), json!(sample.and_then(|s| s.get(c))));
            }
            // Where the latency / rate / error figures come from, and the runtime's bucket error.
            row.insert(
                "figure_source".into(),
                json!(sample.and_then(|s| s.figure_source.name())),
            );
            let bounds: Map<String, Value> = sample
                .map(|s| {
                    s.bucket_bounds
                        .iter()
                        .map(|(c, (lower, upper))| {
                            let upper = upper.is_finite().then_some(*upper);
                            (
                                c.name().to_string(),
                                json!({ "lower": lower, "upper": upper }),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            row.insert("bucket_bounds".into(), Value::Object(bounds));
            // Proxy and runtime both see the model: the runtime's own percentiles beside the
            // client-felt ones, and what lies in front of the runtime (network, gateways,
            // queueing before it): the difference, within the runtime's bucket.
            if let Some(s) = sample.filter(|s| !s.runtime_view.is_empty()) {
                let mut view = Map::new();
                let mut gap = Map::new();
                for (c, (v, lower, upper)) in &s.runtime_view {
                    view.insert(
                        c.name().into(),
                        json!({
                            "value": v,
                            "bucket": {"lower": lower, "upper": upper.is_finite().then_some(*upper)},
                        }),
                    );
                    // The runtime's percentile is known to its bucket only: so is the gap.
                    if let Some(client) = s.get(*c) {
                        gap.insert(
                            c.name().into(),
                            json!({
                                "value": client - v,
                                "at_least": upper.is_finite().then_some(client - upper),
                                "at_most": client - lower,
                            }),
                        );
                    }
                }
                row.insert("runtime_view".into(), Value::Object(view));
                row.insert("client_minus_runtime".into(), Value::Object(gap));
            }
            let ratio = sample.and_then(|s| {
                let used = s.get(Column::GpuMemoryUsedBytes)?;
                let total = s.get(Column::GpuMemoryTotalBytes).filter(|t| *t > 0.0)?;
                Some(used / total)
            });
            row.insert("gpu_memory_used_ratio".into(), json!(ratio));
            let a = alerts.get(model);
            row.insert("alerts_firing".into(), json!(a.map_or(0, |a| a.firing)));
            row.insert("alerts_pending".into(), json!(a.map_or(0, |a| a.pending)));
            row.insert(
                "worst_severity".into(),
                json!(a.and_then(|a| a.worst).map(Severity::name)),
            );
            row.insert("sparklines".into(), sparklines(&timeline, model, now));
            Value::Object(row)
        })
        .collect();
    let body = json!({
        "window": window.name(),
        "generated_at_unix_ms": now,
        "step_s": STEP_MS / 1000,
        "models": models,
        "targets": targets,
        "targets_error": targets_error,
    });
    Ok(Json(body).into_response())
}

/// Scrape targets published to the store in the last 5 minutes (by every collector sharing it,
/// each its own shard); a row older than 30 s is `stale` (its collector stopped publishing).
const TARGETS_SINCE_MS: i64 = 5 * 60_000;
const TARGET_STALE_MS: i64 = 30_000;

/// Every collector's scrape targets, as published to the shared store by `scrape::publish::publish`.
async fn scrape_targets(st: &ApiState, now: i64) -> (Vec<Value>, Option<String>) {
    let store = st.store.clone();
    let loaded =
        tokio::task::spawn_blocking(move || store.load_scrape_targets(now - TARGETS_SINCE_MS))
            .await;
    let rows = match loaded {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => return (Vec::new(), Some(e.to_string())),
        Err(e) => return (Vec::new(), Some(e.to_string())),
    };
    let targets = rows
        .into_iter()
        .map(|t| {
            json!({
                "url": t.url,
                "instance": t.instance,
                "runtime": t.runtime,
                "health": t.health,
                "last_error": t.last_error,
                "last_scrape_unix_ms": t.last_scrape_unix_ms,
                "shard": format!("{}/{}", t.shard_index, t.shard_count),
                "updated_unix_ms": t.updated_unix_ms,
                "stale": now - t.updated_unix_ms > TARGET_STALE_MS,
            })
        })
        .collect();
    (targets, None)
}

fn sparklines(timeline: &Timeline, model: &str, now: i64) -> Value {
    let since = now - SPARKLINE_POINTS * STEP_MS;
    let Some(view) = timeline.view(model, since, &SPARKLINE_COLUMNS) else {
        return json!({ "t": [] });
    };
    let mut out = Map::new();
    out.insert("t".into(), json!(unix_s(&view.t_ms)));
    for (c, values) in view.columns {
        out.insert(c.name().into(), json!(values));
    }
    Value::Object(out)
}

pub(super) async fn timeseries(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(q.as_deref(), &["model", "range"])?;
    let range_ms = p
        .parse_with("range", parse_range, RANGES)?
        .unwrap_or(15 * 60_000);
    let range = p.get("range").unwrap_or("15m");
    let Some(model) = p.get("model").filter(|m| !m.is_empty()) else {
        return Ok(bad_request(
            "query parameter \"model\" is required (a model_id, as listed by /api/v1/fleet)",
        ));
    };
    let now = now_unix_ms();
    let since = now - range_ms;
    let view = {
        let timeline = st.timeline.read().unwrap_or_else(|p| p.into_inner());
        timeline.view(model, since, &Column::ALL)
    };
    // Where the model's latency, rate and error figures come from now (the last minute).
    let figure_source = {
        let agg = st.aggregator.lock().unwrap_or_else(|p| p.into_inner());
        let board = st.signals.read().unwrap_or_else(|p| p.into_inner());
        sample_fleet(&agg, &board, Window::M1, now)
            .get(model)
            .and_then(|s| s.figure_source.name())
    };
    let signals: Vec<Value> = {
        let board = st.signals.read().unwrap_or_else(|p| p.into_inner());
        board
            .series_where(since, |p| p.model_id == model)
            .into_iter()
            .map(|(latest, hist)| {
                json!({
                    "signal": latest.signal,
                    "unit": signal_unit(&latest.signal),
                    "instance": latest.instance,
                    "device_id": latest.device_id,
                    "source": latest.source,
                    "t": hist.iter().map(|(t, _)| *t as f64 / 1000.0).collect::<Vec<_>>(),
                    "v": hist.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
                })
            })
            .collect()
    };
    if view.is_none() && signals.is_empty() {
        let msg = format!(
            "no data for model {model:?} in the last hour; models with data are listed by /api/v1/fleet"
        );
        return Ok((StatusCode::NOT_FOUND, Json(json!({ "error": msg }))).into_response());
    }
    let mut series = Map::new();
    let mut units = Map::new();
    let mut buckets: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    let t = match view {
        Some(v) => {
            for (c, values) in v.columns {
                series.insert(c.name().into(), json!(values));
                units.insert(c.name().into(), json!(c.unit()));
            }
            for ((bucket, metric), values) in v.buckets {
                buckets
                    .entry(bucket.name())
                    .or_default()
                    .insert(format!("{}_p99_s", metric.name()), json!(values));
            }
            unix_s(&v.t_ms)
        }
        None => Vec::new(),
    };
    let body = json!({
        "model_id": model,
        "range": range,
        "step_s": STEP_MS / 1000,
        "t": t,
        "series": series,
        "units": units,
        "by_context_bucket": buckets,
        "signals": signals,
        "figure_source": figure_source,
    });
    Ok(Json(body).into_response())
}

pub(super) fn bad_request(msg: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": msg }))).into_response()
}

/// The unit of a normalised signal, from the naming conventions of `signals::names`.
pub(super) fn signal_unit(signal: &str) -> &'static str {
    if signal.ends_with("_bytes") {
        "bytes"
    } else if signal.ends_with("_seconds") {
        "seconds"
    } else if signal.ends_with("_celsius") {
        "celsius"
    } else if signal.ends_with("_watts") {
        "watts"
    } else if signal.contains("tokens_per_second") {
        "tokens/s"
    } else if signal.ends_with("_per_second") {
        "per second"
    } else if signal.starts_with("requests_") {
        "requests"
    } else if signal.ends_with("_ratio")
        || signal.ends_with("_usage")
        || signal.ends_with("_rate")
        || signal.ends_with("utilization")
    {
        "ratio"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwatch_core::signals::names;

    #[test]
    fn units_follow_signal_names() {
        assert_eq!(signal_unit(names::GPU_MEMORY_USED_BYTES), "bytes");
        assert_eq!(signal_unit(names::KV_CACHE_USAGE), "ratio");
        assert_eq!(signal_unit(names::GPU_UTILIZATION), "ratio");
        assert_eq!(signal_unit(names::PREFIX_CACHE_HIT_RATE), "ratio");
        assert_eq!(signal_unit(names::REQUESTS_WAITING), "requests");
        assert_eq!(signal_unit(names::REQUESTS_PER_SECOND), "per second");
        assert_eq!(signal_unit(names::OUTPUT_TOKENS_PER_SECOND), "tokens/s");
        assert_eq!(signal_unit("ttft_p99_seconds"), "seconds");
        assert_eq!(signal_unit(names::GPU_TEMPERATURE_CELSIUS), "celsius");
    }

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("15m"), Some(900_000));
        assert_eq!(parse_range("2h"), None);
    }
}
