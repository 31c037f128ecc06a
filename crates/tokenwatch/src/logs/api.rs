// `GET /api/v1/logs/templates`: the mined log templates per source — count, rate, first/last
// seen, examples and field values, the last anomaly — filtered by level, runtime, instance.

use super::{Severity, SharedMiner};
use crate::kernel::params::{ParamError, Params};
use axum::Json;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

const DEFAULT_LIMIT: usize = 500;
const MAX_LIMIT: usize = 10_000;

#[derive(Clone)]
struct ApiState {
    miner: SharedMiner,
    enabled: bool,
}

pub fn router(miner: SharedMiner, enabled: bool) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/logs/templates", get(templates))
        .with_state(ApiState { miner, enabled })
}

async fn templates(
    State(st): State<ApiState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(
        q.as_deref(),
        &["min_severity", "runtime", "instance", "class", "limit"],
    )?;
    let min_severity = p
        .parse_with(
            "min_severity",
            Severity::parse,
            "trace, debug, info, warn, warning, error, fatal, unspecified",
        )?
        .unwrap_or(Severity::Unspecified);
    let limit = p
        .parse_with(
            "limit",
            |s| {
                s.parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
            },
            "1 to 10000",
        )?
        .unwrap_or(DEFAULT_LIMIT);
    let class = p.parse_with(
        "class",
        |s| {
            matches!(s, "cuda_oom" | "nccl_timeout" | "preemption" | "other").then(|| s.to_string())
        },
        "cuda_oom, nccl_timeout, preemption, other",
    )?;
    let runtime = p.get("runtime").map(str::to_string);
    let instance = p.get("instance").map(str::to_string);
    let now = tokenwatch_core::clock::now_unix_ms();
    let (mut rows, total_templates, refused) = {
        let m = st.miner.lock().unwrap_or_else(|p| p.into_inner());
        let rows = m.list(now, &|v| {
            v.severity >= min_severity
                && runtime.as_ref().is_none_or(|r| &v.source.runtime == r)
                && instance.as_ref().is_none_or(|i| &v.source.instance == i)
                && class.as_ref().is_none_or(|c| v.class.name() == c)
        });
        (rows, m.template_count(), m.refused)
    };
    let matched = rows.len();
    rows.truncate(limit);
    Ok(Json(json!({
        "enabled": st.enabled,
        "templates_known": total_templates,
        "lines_refused": refused,
        "count": matched,
        "templates": rows,
    }))
    .into_response())
}
