// HTTP error responses in the OpenAI/vLLM JSON shape:
// {"error":{"message":..,"type":..,"param":null,"code":<status>}}.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to an HTTP client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequestError", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(404, "NotFoundError", message)
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(503, "ServiceUnavailableError", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": null,
                "code": self.status.as_u16(),
            }
        });
        (self.status, Json(body)).into_response()
    }
}
