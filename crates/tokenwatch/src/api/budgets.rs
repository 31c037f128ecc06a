// `GET /api/v1/budgets`: every spend budget (`budgets:`) as the stored records give it now — its
// period, amount, spent and remaining, the spend rate over its burn window, the burn rate and the
// time to exhaustion (the figures the `budget_burn` alert and the `tokenwatch_budget_*` gauges
// show, read from the store instead of the alert engine's counts).

use super::{ApiState, internal_error, rfc3339_ms};
use crate::alerting::budget::{BudgetStatus, status_from_spend};
use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use tokenwatch_store::SpendQuery;

/// A finite number, or null (an infinite burn rate, no time to exhaustion).
fn finite(v: Option<f64>) -> Value {
    v.filter(|x| x.is_finite())
        .map_or(Value::Null, |x| json!(x))
}

fn one(s: &BudgetStatus) -> Value {
    json!({
        "name": s.name,
        "period": s.period.name(),
        "model": s.labels.get("model_id"),
        "tenant": s.labels.get("tenant"),
        "amount_usd": s.amount_usd,
        "spent_usd": s.spent_usd,
        "remaining_usd": s.remaining_usd,
        "period_start": rfc3339_ms(s.period_start_ms),
        "period_end": rfc3339_ms(s.period_end_ms),
        "burn_window_s": s.burn_window_s,
        "burn_usd_per_hour": s.burn_usd_per_s * 3600.0,
        "burn_rate": finite(Some(s.burn_rate)),
        "spent": s.remaining_usd <= 0.0,
        "time_to_exhaustion_s": finite(s.time_to_exhaustion_s),
    })
}

pub(super) async fn list(State(st): State<Arc<ApiState>>) -> Response {
    let (store, budgets) = (st.store.clone(), st.budgets.clone());
    let now = tokenwatch_core::clock::now_unix_ms();
    let found = tokio::task::spawn_blocking(move || {
        budgets
            .iter()
            .map(|b| {
                status_from_spend(b, now, |since_unix_ms, until_unix_ms| {
                    store.query_spend(&SpendQuery {
                        since_unix_ms,
                        until_unix_ms,
                    })
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await;
    match found {
        Ok(Ok(statuses)) => Json(json!({
            "currency": "USD",
            "budgets": statuses.iter().map(one).collect::<Vec<_>>(),
        }))
        .into_response(),
        Ok(Err(e)) => internal_error(e.to_string()),
        Err(e) => internal_error(e.to_string()),
    }
}
