// `GET /api/v1/scaling` and `GET /api/v1/scaling/{model}`: the autoscaling recommendation per
// model as KEDA's metrics-api scaler reads it (`valueLocation: desired_replicas`, target 1).

use super::ApiState;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;

pub async fn all(State(st): State<Arc<ApiState>>) -> Response {
    let models = st.scaling.all();
    Json(json!({ "count": models.len(), "models": models })).into_response()
}

pub async fn one(State(st): State<Arc<ApiState>>, Path(model): Path<String>) -> Response {
    match st.scaling.get(&model) {
        Some(m) => Json(m).into_response(),
        None => {
            let known: Vec<String> = st.scaling.all().into_iter().map(|m| m.model).collect();
            let msg = format!(
                "no scaling recommendation for model {model:?} (computed once per scaling.period for models with recent requests, while alerting is enabled); known: {}",
                if known.is_empty() {
                    "none yet".to_string()
                } else {
                    known.join(", ")
                }
            );
            (StatusCode::NOT_FOUND, Json(json!({ "error": msg }))).into_response()
        }
    }
}
