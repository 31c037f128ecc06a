// `GET /api/v1/gpus/history`: every device-level signal (DCGM scrape, NVML, OTLP) over a range,
// grouped by device, plus per-process GPU memory with its container/pod, for the UI's GPU page.

use super::ApiState;
use super::fleet::{RANGES, parse_range, signal_unit};
use crate::kernel::params::{ParamError, Params};
use crate::sources::gpu::points::GPU_PROCESS_MEMORY_BYTES;
use axum::Json;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::signals::SignalPoint;

fn series_json(p: &SignalPoint, hist: &[(i64, f64)]) -> Value {
    json!({
        "signal": p.signal,
        "unit": signal_unit(&p.signal),
        "source": p.source,
        "t": hist.iter().map(|(t, _)| *t as f64 / 1000.0).collect::<Vec<_>>(),
        "v": hist.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
    })
}

pub(super) async fn gpu_history(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(q.as_deref(), &["range"])?;
    let range_ms = p
        .parse_with("range", parse_range, RANGES)?
        .unwrap_or(15 * 60_000);
    let since = now_unix_ms() - range_ms;
    let series = {
        let board = st.signals.read().unwrap_or_else(|p| p.into_inner());
        board.series_where(since, |p| !p.device_id.is_empty())
    };
    // (instance, device) → (model, series); processes separately.
    let mut devices: BTreeMap<(String, String), (String, Vec<Value>)> = BTreeMap::new();
    let mut processes = Vec::new();
    for (latest, hist) in &series {
        if latest.signal == GPU_PROCESS_MEMORY_BYTES {
            let device = latest.notes.get("device_uuid").cloned().unwrap_or_else(|| {
                latest
                    .device_id
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            });
            processes.push(json!({
                "device_id": device,
                "model_id": latest.model_id,
                "instance": latest.instance,
                "pid": latest.notes.get("pid"),
                "notes": latest.notes,
                "t": hist.iter().map(|(t, _)| *t as f64 / 1000.0).collect::<Vec<_>>(),
                "used_bytes": hist.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
            }));
            continue;
        }
        let entry = devices
            .entry((latest.instance.clone(), latest.device_id.clone()))
            .or_insert_with(|| (latest.model_id.clone(), Vec::new()));
        if entry.0.is_empty() {
            entry.0.clone_from(&latest.model_id);
        }
        entry.1.push(series_json(latest, hist));
    }
    let devices: Vec<Value> = devices
        .into_iter()
        .map(|((instance, device_id), (model_id, series))| {
            json!({ "device_id": device_id, "instance": instance, "model_id": model_id, "series": series })
        })
        .collect();
    let body = json!({
        "range": p.get("range").unwrap_or("15m"),
        "devices": devices,
        "processes": processes,
    });
    Ok(Json(body).into_response())
}
