//! API errors: a status and the `{"code","message"}` body every OpenSandbox client expects,
//! with the 404 of a missing command, session or code context ([`found`]);
//! [`JsonBody`], a request body read whole within the server's limit (413 above it), and only
//! as `Content-Type: application/json` (415 otherwise; read by its extractor, which lives beside
//! the [`Server`](crate::Server) whose limit it reads).

use std::collections::HashMap;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error answer of the lifecycle or execd API.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_PARAMETER", message)
    }
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "SANDBOX::INVALID_STATE", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "GENERAL::UNKNOWN_ERROR",
            message,
        )
    }
    pub fn not_supported(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, "NOT_SUPPORTED", message)
    }
    /// A request body over a limit (413).
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "REQUEST_TOO_LARGE", message)
    }
    /// A request body that does not parse or says something impossible (400).
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", message)
    }
    /// The 404 `code` of a thing a sandbox holds (a command, session, code context):
    /// "no {what} {id}".
    pub fn no_such(code: &'static str, what: &str, id: &str) -> Self {
        Self::not_found(code, format!("no {what} {id}"))
    }
    /// A required query parameter is absent (400).
    pub fn missing_query(name: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "MISSING_QUERY",
            format!("missing query parameter {name}"),
        )
    }
}

impl From<agentrun_pool::PoolError> for ApiError {
    fn from(e: agentrun_pool::PoolError) -> Self {
        use agentrun_pool::PoolError as P;
        match e {
            P::Busy(_) => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "SANDBOX::BUSY",
                e.to_string(),
            ),
            P::NotFound(_) => ApiError::not_found("SANDBOX::NOT_FOUND", e.to_string()),
            P::Image(agentrun_image::ImageError::NotFound(_))
            | P::Image(agentrun_image::ImageError::SnapshotTooLarge { .. })
            | P::Policy(_)
            | P::Invalid(_) => ApiError::bad_request(e.to_string()),
            e => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.code, "message": self.message});
        (self.status, Json(body)).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// `table[id]` of a sandbox's commands, sessions or code contexts, or [`ApiError::no_such`].
pub fn found<T: Clone>(
    table: &HashMap<String, T>,
    id: &str,
    code: &'static str,
    what: &str,
) -> ApiResult<T> {
    table
        .get(id)
        .cloned()
        .ok_or_else(|| ApiError::no_such(code, what, id))
}

/// A request body (JSON), read whole: at most the server's `--max-request-body` bytes, else
/// a 413 JSON error and nothing more is read (axum's [`axum::extract::DefaultBodyLimit`], set
/// by [`crate::router`], bounds the read). A body that is not empty must come as
/// `Content-Type: application/json` (what every SDK sends), else a 415 JSON error and the
/// body is not read: a web page can make a browser POST cross-site without a preflight only
/// as `text/plain`, a form or multipart ([`agentrun_webguard::is_json`]).
pub struct JsonBody(pub Bytes);

/// The 415 of a body that is not `application/json`.
pub fn not_json() -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UNSUPPORTED_MEDIA_TYPE",
        "the request body must be JSON sent as Content-Type: application/json",
    )
}
