// `GET /v1/models` when no upstream takes requests without a model: the proxy answers with the
// models its routes serve (OpenAI's list shape), as a gateway in front of several upstreams does.

use super::route::Router;
use axum::response::{IntoResponse, Response};

/// The path OpenAI clients list models on.
pub const MODELS_PATH: &str = "/v1/models";

/// The models `router` routes by name (split models first, then those the upstreams list),
/// each owned by the runtime of the first upstream serving it. `created` is when these routes
/// were loaded (Unix seconds): the list is the configuration's, not a model's release.
pub fn list(router: &Router, created: i64) -> Response {
    let data: Vec<serde_json::Value> = router
        .named_models()
        .into_iter()
        .map(|(id, runtime)| serde_json::json!({ "id": id, "object": "model", "created": created, "owned_by": runtime }))
        .collect();
    axum::Json(serde_json::json!({ "object": "list", "data": data })).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::proxy::config::UpstreamConfig;

    fn up(url: &str, runtime: &str, models: &[&str]) -> UpstreamConfig {
        UpstreamConfig {
            url: url.into(),
            runtime: runtime.into(),
            models: models.iter().map(|s| s.to_string()).collect(),
            instance: None,
            tls: None,
        }
    }

    #[tokio::test]
    async fn lists_each_routed_model_once_with_its_runtime() {
        let router = Router::new(&[
            up("http://127.0.0.1:1", "vllm", &["llama", "qwen"]),
            up("http://127.0.0.1:2", "tgi", &["qwen", "mistral"]),
        ])
        .unwrap();
        let resp = list(&router, 1_765_000_000);
        assert_eq!(resp.status(), http::StatusCode::OK);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["object"], "list");
        let ids: Vec<(&str, &str)> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["id"].as_str().unwrap(), m["owned_by"].as_str().unwrap()))
            .collect();
        assert_eq!(
            ids,
            [("llama", "vllm"), ("qwen", "vllm"), ("mistral", "tgi")]
        );
        assert!(
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["object"] == "model" && m["created"] == 1_765_000_000)
        );
    }
}
