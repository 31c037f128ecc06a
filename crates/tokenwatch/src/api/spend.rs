// `GET /api/v1/spend?by=model|tenant|model,tenant&since=…&until=…`: what the stored requests
// cost (their `cost_usd`, from the price table `pricing`), summed per model, per tenant (the
// tenant header's value or `key-<hash>` of the API key), or per both, with the requests of
// models the table leaves out counted (`unpriced_requests`, at no cost).

use super::{ApiState, internal_error, rfc3339_ms};
use crate::kernel::params::{ParamError, Params};
use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokenwatch_store::{SpendQuery, SpendRow};

/// How long back `since` reaches when not given.
const DEFAULT_SPAN_MS: i64 = 24 * 3600 * 1000;

/// What the groups are keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum By {
    Model,
    Tenant,
    ModelAndTenant,
}

impl By {
    fn parse(s: &str) -> Option<By> {
        match s {
            "model" => Some(By::Model),
            "tenant" => Some(By::Tenant),
            "model,tenant" | "tenant,model" => Some(By::ModelAndTenant),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            By::Model => "model",
            By::Tenant => "tenant",
            By::ModelAndTenant => "model,tenant",
        }
    }
}

/// One group's sums.
#[derive(Debug, Default, Clone, PartialEq)]
struct Sums {
    cost_usd: f64,
    requests: u64,
    priced_requests: u64,
}

impl Sums {
    fn add(&mut self, r: &SpendRow) {
        self.cost_usd += r.cost_usd;
        self.requests += r.requests;
        self.priced_requests += r.priced_requests;
    }
}

/// The answer's body for `rows` grouped `by`.
fn answer(by: By, since_ms: i64, until_ms: i64, rows: &[SpendRow]) -> serde_json::Value {
    let mut groups: BTreeMap<(String, String), Sums> = BTreeMap::new();
    let mut total = Sums::default();
    for r in rows {
        let key = match by {
            By::Model => (r.model.clone(), String::new()),
            By::Tenant => (String::new(), r.tenant.clone()),
            By::ModelAndTenant => (r.model.clone(), r.tenant.clone()),
        };
        groups.entry(key).or_default().add(r);
        total.add(r);
    }
    let groups: Vec<serde_json::Value> = groups
        .into_iter()
        .map(|((model, tenant), s)| {
            let mut g = serde_json::Map::new();
            if by != By::Tenant {
                g.insert("model".into(), json!(model));
            }
            if by != By::Model {
                g.insert("tenant".into(), json!(tenant));
            }
            g.insert("cost_usd".into(), json!(s.cost_usd));
            g.insert("requests".into(), json!(s.requests));
            g.insert(
                "unpriced_requests".into(),
                json!(s.requests - s.priced_requests),
            );
            serde_json::Value::Object(g)
        })
        .collect();
    json!({
        "by": by.name(),
        "since": rfc3339_ms(since_ms),
        "until": rfc3339_ms(until_ms),
        "currency": "USD",
        "cost_usd": total.cost_usd,
        "requests": total.requests,
        "unpriced_requests": total.requests - total.priced_requests,
        "groups": groups,
    })
}

pub(super) async fn spend(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ParamError> {
    let p = Params::parse(q.as_deref(), &["by", "since", "until"])?;
    let by = p
        .parse_with("by", By::parse, "model, tenant or model,tenant")?
        .unwrap_or(By::Model);
    let time = |name: &str| {
        p.parse_with(
            name,
            |s| {
                chrono::DateTime::parse_from_rfc3339(s)
                    .ok()
                    .map(|t| t.timestamp_millis())
            },
            "an RFC 3339 timestamp such as 2026-12-02T10:00:00Z",
        )
    };
    let now = tokenwatch_core::clock::now_unix_ms();
    let until = time("until")?.unwrap_or(now);
    let since = time("since")?.unwrap_or(until - DEFAULT_SPAN_MS);
    if since >= until {
        return Ok((
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": "since must be before until" })),
        )
            .into_response());
    }
    let store = st.store.clone();
    let query = SpendQuery {
        since_unix_ms: since,
        until_unix_ms: until,
    };
    let found = tokio::task::spawn_blocking(move || store.query_spend(&query)).await;
    Ok(match found {
        Ok(Ok(rows)) => Json(answer(by, since, until, &rows)).into_response(),
        Ok(Err(e)) => internal_error(e.to_string()),
        Err(e) => internal_error(e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(model: &str, tenant: &str, cost_usd: f64, requests: u64, priced: u64) -> SpendRow {
        SpendRow {
            model: model.into(),
            tenant: tenant.into(),
            cost_usd,
            requests,
            priced_requests: priced,
        }
    }

    #[test]
    fn groups_by_the_asked_key_and_totals_everything() {
        let rows = [
            row("m1", "t1", 0.5, 2, 2),
            row("m1", "t2", 0.25, 1, 1),
            row("m2", "t1", 1.0, 3, 2),
        ];
        let by_model = answer(By::Model, 0, 1000, &rows);
        assert_eq!(by_model["cost_usd"], 1.75);
        assert_eq!(by_model["unpriced_requests"], 1);
        assert_eq!(
            by_model["groups"],
            json!([
                {"model": "m1", "cost_usd": 0.75, "requests": 3, "unpriced_requests": 0},
                {"model": "m2", "cost_usd": 1.0, "requests": 3, "unpriced_requests": 1},
            ])
        );
        let by_tenant = answer(By::Tenant, 0, 1000, &rows);
        assert_eq!(
            by_tenant["groups"],
            json!([
                {"tenant": "t1", "cost_usd": 1.5, "requests": 5, "unpriced_requests": 1},
                {"tenant": "t2", "cost_usd": 0.25, "requests": 1, "unpriced_requests": 0},
            ])
        );
        let both = answer(By::ModelAndTenant, 0, 1000, &rows);
        assert_eq!(both["groups"].as_array().map(Vec::len), Some(3));
        assert_eq!(both["groups"][1]["tenant"], "t2");
        assert_eq!(both["since"], "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn by_names_parse_and_others_are_refused() {
        assert_eq!(By::parse("tenant,model"), Some(By::ModelAndTenant));
        assert_eq!(By::parse("instance"), None);
    }
}
