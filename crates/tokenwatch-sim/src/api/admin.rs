// Admin endpoints: list / enable / disable faults at run time, and per-model
// engine state (queue, KV blocks, GPU memory, preemptions, active faults).

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::AppState;
use super::error::ApiError;
use crate::fault::{ActiveFault, FaultSpec, fault_doc, fault_names, parse_fault};
use crate::gpu::reading;
use crate::metrics::FinishReason;

fn fault_json(a: &ActiveFault, now: Instant) -> Value {
    json!({
        "name": a.spec.name(),
        "model": a.spec.model,
        "params": a.spec.params(),
        "since_unix": a.since_unix,
        "remaining_s": a.remaining_s(now),
    })
}

fn faults_json(app: &AppState) -> Vec<Value> {
    let now = Instant::now();
    app.board()
        .list()
        .iter()
        .map(|a| fault_json(a, now))
        .collect()
}

pub async fn list_faults(State(app): State<AppState>) -> Json<Value> {
    Json(json!({ "faults": faults_json(&app) }))
}

/// `{"spec":"kv_leak:blocks=64"}` or `{"fault":"kv_leak","params":{"blocks":"64"},"model":"m"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnableBody {
    spec: Option<String>,
    fault: Option<String>,
    #[serde(default)]
    params: BTreeMap<String, Value>,
    model: Option<String>,
}

fn spec_of(body: EnableBody) -> Result<FaultSpec, ApiError> {
    let bad = |e: crate::SimError| ApiError::bad_request(e.to_string());
    let mut spec = match (body.spec, body.fault) {
        (Some(s), None) if body.params.is_empty() => parse_fault(&s).map_err(bad)?,
        (None, Some(name)) => {
            let mut params = Vec::new();
            for (k, v) in body.params {
                let v = match v {
                    Value::String(s) => s,
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "parameter `{k}` must be a string or a number, got {other}"
                        )));
                    }
                };
                params.push((k, v));
            }
            FaultSpec::from_parts(&name, &params).map_err(bad)?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give either {\"spec\":\"NAME[:k=v,...]\"} or {\"fault\":\"NAME\",\"params\":{...}}, \
                 optionally with \"model\"",
            ));
        }
    };
    if let Some(m) = body.model {
        spec.model = Some(m);
    }
    Ok(spec)
}

pub async fn enable_fault(
    State(app): State<AppState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: EnableBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid fault body: {e}")))?;
    let spec = spec_of(body)?;
    if let Some(m) = &spec.model {
        app.engine(Some(m))
            .map_err(|e| ApiError::bad_request(e.message))?;
    }
    let active = app.board().enable(spec);
    app.faults_changed();
    tracing::info!(fault = active.spec.name(), model = ?active.spec.model, "fault enabled");
    Ok(Json(
        json!({ "enabled": fault_json(&active, Instant::now()), "faults": faults_json(&app) }),
    ))
}

#[derive(Debug, Deserialize)]
pub struct DisableQuery {
    model: Option<String>,
}

pub async fn disable_fault(
    State(app): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<DisableQuery>,
) -> Result<Json<Value>, ApiError> {
    if fault_doc(&name).is_none() {
        return Err(ApiError::bad_request(format!(
            "unknown fault `{name}`; allowed: {}",
            fault_names().join(", ")
        )));
    }
    let removed = app.board().disable(&name, q.model.as_deref());
    app.faults_changed();
    tracing::info!(fault = %name, removed, "fault disabled");
    Ok(Json(
        json!({ "removed": removed, "faults": faults_json(&app) }),
    ))
}

pub async fn state(State(app): State<AppState>) -> Json<Value> {
    let now = Instant::now();
    let faults = app.board().list();
    let models: Vec<Value> = app
        .engines()
        .iter()
        .map(|e| {
            let cfg = e.config();
            let st = e.stats();
            let gpu = reading(cfg, &st);
            let finished: BTreeMap<&str, u64> = FinishReason::ALL
                .iter()
                .map(|r| (r.as_str(), st.finished(*r)))
                .collect();
            let active: Vec<Value> = faults
                .iter()
                .filter(|a| a.spec.model.as_deref().is_none_or(|m| m == cfg.model))
                .map(|a| fault_json(a, now))
                .collect();
            json!({
                "model": cfg.model,
                "running": st.running,
                "waiting": st.waiting,
                "max_num_seqs": cfg.max_num_seqs,
                "kv": {
                    "used_blocks": st.kv_used_blocks,
                    "leaked_blocks": st.kv_leaked_blocks,
                    "total_blocks": st.kv_total_blocks,
                    "block_size": cfg.block_size,
                    "usage": st.kv_usage(),
                },
                "gpu": gpu,
                "preemptions": st.preemptions,
                "prompt_tokens": st.prompt_tokens,
                "generation_tokens": st.generation_tokens,
                "finished": finished,
                "faults": active,
            })
        })
        .collect();
    Json(json!({ "instance": app.hostname(), "models": models }))
}
