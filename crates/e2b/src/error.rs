//! The E2B API's errors: [`E2bError`], the `{"code": STATUS, "message"}` JSON of the control
//! plane, envd's HTTP API and the code interpreter; [`RpcError`], a Connect error
//! (`{"code": "not_found", "message"}`, or the end of a stream) of envd's RPCs. Both are made
//! from the OpenSandbox front end's [`ApiError`]s, whose status they keep.

use agentrun_opensandbox::ApiError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error answer of the control plane, envd's HTTP API or the code interpreter.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {message}")]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        E2bError {
            status,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn not_served(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, message)
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> Self {
        E2bError::new(e.status, e.message)
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, Json(body)).into_response()
    }
}

pub type E2bResult<T> = Result<T, E2bError>;

/// A control plane request's JSON body; 400 "invalid request body" naming what is wrong.
pub fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> E2bResult<T> {
    serde_json::from_slice(body)
        .map_err(|e| E2bError::bad_request(format!("invalid request body: {e}")))
}

/// [`json_body`], a blank body (empty or whitespace) being `T::default()`.
pub fn json_body_or_default<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> E2bResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        json_body(body)
    }
}

/// A Connect error code (the `connectrpc` crate's: its wire names and HTTP statuses).
pub use connectrpc::error::ErrorCode as Code;

/// The Connect code of an HTTP error status of the OpenSandbox front end.
pub fn code_of_status(status: StatusCode) -> Code {
    match status.as_u16() {
        400 | 415 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::AlreadyExists,
        413 | 429 | 507 => Code::ResourceExhausted,
        501 => Code::Unimplemented,
        502 | 503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Internal,
    }
}

/// A Connect error of one of envd's RPCs.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }
    /// `invalid_argument` with `message` (a string, or a typed error's words).
    pub fn invalid(message: impl std::fmt::Display) -> Self {
        Self::new(Code::InvalidArgument, message.to_string())
    }
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }

    /// Its JSON (`{"code","message"}`), as a unary error body and in a stream's end.
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(self.connect()).unwrap_or_else(
            |_| serde_json::json!({"code": self.code.as_str(), "message": self.message}),
        )
    }

    /// As the `connectrpc` crate's error (whose serialization is the Connect error JSON).
    pub fn connect(&self) -> connectrpc::error::ConnectError {
        connectrpc::error::ConnectError::new(self.code, self.message.clone())
    }
}

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> Self {
        // A conflict that is not a file already there (a paused sandbox): a precondition.
        let code = if e.status == StatusCode::CONFLICT && e.code != "INVALID_FILE" {
            Code::FailedPrecondition
        } else {
            code_of_status(e.status)
        };
        RpcError::new(code, e.message)
    }
}

impl From<E2bError> for RpcError {
    fn from(e: E2bError) -> Self {
        RpcError::new(code_of_status(e.status), e.message)
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (self.code.http_status(), Json(self.json())).into_response()
    }
}

pub type RpcResult<T> = Result<T, RpcError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_bodies_blank_or_bad() {
        #[derive(serde::Deserialize, Default, Debug, PartialEq)]
        struct B {
            n: Option<u8>,
        }
        assert_eq!(json_body_or_default::<B>(b" \n").unwrap(), B::default());
        assert_eq!(json_body_or_default::<B>(br#"{"n":3}"#).unwrap().n, Some(3));
        let e = json_body::<B>(b"").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.starts_with("invalid request body: "), "{e}");
        assert!(json_body_or_default::<B>(br#"{"n":300}"#).is_err());
    }

    #[test]
    fn api_errors_keep_their_meaning_as_rpc_codes() {
        let nf = RpcError::from(ApiError::not_found("FILE_NOT_FOUND", "/x: gone"));
        assert_eq!(nf.code, Code::NotFound);
        let exists = RpcError::from(ApiError::new(StatusCode::CONFLICT, "INVALID_FILE", "there"));
        assert_eq!(exists.code, Code::AlreadyExists);
        let paused = RpcError::from(ApiError::conflict("the sandbox is paused"));
        assert_eq!(paused.code, Code::FailedPrecondition);
        assert_eq!(Code::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(nf.json()["code"], "not_found");
    }
}
