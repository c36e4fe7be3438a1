//! API errors: a status and the `{"message"}` body every dockerd error has, with the texts
//! clients match on (`No such container: X`, `No such image: X`, ...).

use axum::response::{IntoResponse, Response};
use hyper::header::CONTENT_TYPE;
use hyper::StatusCode;

/// An error answer of the Docker API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct DockerError {
    pub status: StatusCode,
    pub message: String,
}

impl DockerError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        DockerError {
            status,
            message: message.into(),
        }
    }
    /// 400 with `message` (a string, or a typed error's words).
    pub fn bad_request(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message.to_string())
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }
    /// 500 with `message` (a string, or a typed error's words).
    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message.to_string())
    }
    /// 404 with the text the docker CLI and docker-py map to "no such container".
    pub fn no_such_container(key: &str) -> Self {
        Self::not_found(format!("No such container: {key}"))
    }
    /// 404 with the text docker-py maps to `ImageNotFound`.
    pub fn no_such_image(name: &str) -> Self {
        Self::not_found(format!("No such image: {name}"))
    }
    /// 404 for an exec id nobody made.
    pub fn no_such_exec(id: &str) -> Self {
        Self::not_found(format!("No such exec instance: {id}"))
    }
    /// 413, naming the limit and the flag that sets it.
    pub fn too_large(limit: u64, flag: &str) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {limit} bytes (agentrun serve --{flag})"),
        )
    }
    /// A blocking task that panicked or was cancelled.
    pub fn join(e: tokio::task::JoinError) -> Self {
        Self::internal(e.to_string())
    }
}

/// The answer: `{"message": ...}` with the status, as every dockerd error.
impl IntoResponse for DockerError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&serde_json::json!({ "message": self.message }))
            .expect("a JSON string");
        (self.status, [(CONTENT_TYPE, "application/json")], body).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn an_error_is_dockerds_message_object() {
        let r = DockerError::no_such_container("web").into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(r.headers()["content-type"], "application/json");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, serde_json::json!({"message": "No such container: web"}));
        let e = DockerError::too_large(4096, "max-request-body");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            e.message,
            "request body larger than 4096 bytes (agentrun serve --max-request-body)"
        );
    }
}
