// `GET /api/v1/slos`: every SLO series (objective, target, SLI, budget remaining, burn rate per
// window) as the alert engine last computed it, with the state of its burn alerts.

use super::ApiState;
use crate::alerting::slo::SloStatus;
use crate::kernel::params::{ParamError, Params};
use axum::Json;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use tokenwatch_core::alert::{Alert, AlertState};

/// The `slo_burn` alerts (pending or firing) of one series: same SLO, same model and tenant.
fn alerts_of<'a>(st: &SloStatus, alerts: &'a [Alert]) -> Vec<&'a Alert> {
    alerts
        .iter()
        .filter(|a| a.state != AlertState::Resolved)
        .filter(|a| {
            a.last_event
                .as_ref()
                .is_some_and(|e| e.detector == "slo_burn")
        })
        .filter(|a| a.labels.get("slo") == Some(&st.slo))
        .filter(|a| {
            ["model_id", "tenant"]
                .iter()
                .all(|k| a.labels.get(*k) == st.labels.get(*k))
        })
        .collect()
}

pub async fn list(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(q.as_deref(), &["slo", "model", "tenant"])?;
    let snap = st.slos.snapshot();
    let alerts = st.alerts.list();
    let want = |k: &str, v: Option<&String>| p.get(k).is_none_or(|w| v.is_some_and(|v| v == w));
    let rows: Vec<Value> = snap
        .series
        .iter()
        .filter(|s| p.get("slo").is_none_or(|w| w == s.slo))
        .filter(|s| {
            want("model", s.labels.get("model_id")) && want("tenant", s.labels.get("tenant"))
        })
        .map(|s| {
            let mine = alerts_of(s, &alerts);
            let state = if mine.iter().any(|a| a.state == AlertState::Firing) {
                "firing"
            } else if mine.is_empty() {
                "ok"
            } else {
                "pending"
            };
            let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
            if let Some(o) = v.as_object_mut() {
                o.insert("alert_state".into(), json!(state));
                let list: Vec<Value> = mine
                    .iter()
                    .map(|a| {
                        json!({
                            "id": a.id,
                            "rule": a.rule,
                            "state": a.state.name(),
                            "severity": a.severity.name(),
                            "summary": a.annotations.get("summary"),
                        })
                    })
                    .collect();
                o.insert("alerts".into(), json!(list));
            }
            v
        })
        .collect();
    let mut body = json!({
        "computed": snap.computed,
        "at_unix_ms": snap.at_unix_ms,
        "count": rows.len(),
        "slos": rows,
    });
    if !snap.computed {
        body["note"] =
            json!("SLOs are computed by the alert engine, which is off (alerting.enabled: false)");
    }
    Ok(Json(body).into_response())
}
