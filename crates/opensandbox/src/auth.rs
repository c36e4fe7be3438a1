//! Who may call what: the API key of `/v1` (`OPEN-SANDBOX-API-KEY`, when one is set) and each
//! sandbox's own tokens, `X-EXECD-ACCESS-TOKEN` for `/execd/{sid}` and
//! `OPENSANDBOX-EGRESS-AUTH` for `/egress/{sid}` (handed out by the endpoint lookup).
//!
//! Every secret is compared in constant time and checked from the headers before anything
//! reads a request's body: by middleware on the routes ([`require_api_key`],
//! [`require_token`]), then by the extractor a handler takes its sandbox with
//! ([`ExecdSandbox`], [`ExecdSandboxAnyState`], [`ExecdRun`], [`EgressSandbox`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use agentrun_pool::constant_time_eq;

use crate::error::{ApiError, ApiResult};
use crate::{Record, Server};

/// Which of its sandbox's tokens a request must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// `X-EXECD-ACCESS-TOKEN`: the execd API (commands, sessions, files, code, the port proxy).
    Execd,
    /// `OPENSANDBOX-EGRESS-AUTH`: the egress sidecar's API.
    Egress,
}

impl Token {
    /// The header it travels in.
    pub fn header(self) -> &'static str {
        match self {
            Token::Execd => crate::EXECD_TOKEN_HEADER,
            Token::Egress => crate::EGRESS_TOKEN_HEADER,
        }
    }

    /// The sandbox's value of this token.
    pub(crate) fn of(self, rec: &Record) -> &str {
        match self {
            Token::Execd => &rec.execd_token,
            Token::Egress => &rec.egress_token,
        }
    }
}

/// The sandbox `sid` a request is for, once its `token` checks out (404 for no such sandbox,
/// 401 for a missing or wrong token).
pub fn authorize(
    server: &Server,
    sid: &str,
    headers: &HeaderMap,
    token: Token,
) -> ApiResult<Arc<Record>> {
    let rec = server.record(sid)?;
    let ok = headers
        .get(token.header())
        .is_some_and(|v| constant_time_eq(v.as_bytes(), token.of(&rec).as_bytes()));
    if !ok {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            format!("invalid or missing header {}", token.header()),
        ));
    }
    Ok(rec)
}

/// The sandbox id of a route nested under `/execd/{sid}` or `/egress/{sid}`.
fn sid_of(p: &HashMap<String, String>) -> &str {
    p.get("sid").map(String::as_str).unwrap_or("")
}

/// The sandbox of a request's `{sid}`, its `token` checked.
async fn sandbox_of(
    parts: &mut Parts,
    server: &Arc<Server>,
    token: Token,
) -> ApiResult<Arc<Record>> {
    let Path(p) = Path::<HashMap<String, String>>::from_request_parts(parts, server)
        .await
        .map_err(|r| ApiError::new(r.status(), "INVALID_PATH", r.body_text()))?;
    authorize(server, sid_of(&p), &parts.headers, token)
}

/// The sandbox of an `/execd/{sid}/...` request: its execd token checked, and still running
/// (409 once it ended by itself).
pub struct ExecdSandbox(pub Arc<Record>);

impl FromRequestParts<Arc<Server>> for ExecdSandbox {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, server: &Arc<Server>) -> ApiResult<Self> {
        let rec = sandbox_of(parts, server, Token::Execd).await?;
        rec.check_running()?;
        Ok(ExecdSandbox(rec))
    }
}

/// An execd request that starts a run (a command, code, a session's command): its sandbox as
/// [`ExecdSandbox`] takes it, and the caller's `traceparent` header, which the run's span
/// continues.
pub struct ExecdRun(pub Arc<Record>, pub Option<String>);

impl FromRequestParts<Arc<Server>> for ExecdRun {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, server: &Arc<Server>) -> ApiResult<Self> {
        let ExecdSandbox(rec) = ExecdSandbox::from_request_parts(parts, server).await?;
        let trace = parts
            .headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok());
        Ok(ExecdRun(rec, trace.map(str::to_owned)))
    }
}

/// [`ExecdSandbox`] for what still answers after the sandbox ended (files, command status and
/// logs).
pub struct ExecdSandboxAnyState(pub Arc<Record>);

impl FromRequestParts<Arc<Server>> for ExecdSandboxAnyState {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, server: &Arc<Server>) -> ApiResult<Self> {
        sandbox_of(parts, server, Token::Execd)
            .await
            .map(ExecdSandboxAnyState)
    }
}

/// The sandbox of an `/egress/{sid}/...` request, its egress token checked.
pub struct EgressSandbox(pub Arc<Record>);

impl FromRequestParts<Arc<Server>> for EgressSandbox {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, server: &Arc<Server>) -> ApiResult<Self> {
        sandbox_of(parts, server, Token::Egress)
            .await
            .map(EgressSandbox)
    }
}

/// Middleware of `/v1`: `OPEN-SANDBOX-API-KEY`, when a key is configured.
pub async fn require_api_key(
    State(server): State<Arc<Server>>,
    req: Request,
    next: Next,
) -> Response {
    match api_key_error(&server, req.headers()) {
        None => next.run(req).await,
        Some(e) => e.into_response(),
    }
}

/// The 401 of a request whose `OPEN-SANDBOX-API-KEY` is missing or wrong (none when no key
/// is configured).
fn api_key_error(server: &Server, headers: &HeaderMap) -> Option<ApiError> {
    let key = server.api_key.as_ref()?;
    let (code, message) = match headers.get("open-sandbox-api-key") {
        None => ("MISSING_API_KEY", "missing OPEN-SANDBOX-API-KEY header"),
        Some(v) if !constant_time_eq(v.as_bytes(), key.as_bytes()) => {
            ("INVALID_API_KEY", "invalid API key")
        }
        Some(_) => return None,
    };
    Some(ApiError::new(StatusCode::UNAUTHORIZED, code, message))
}

/// Middleware of `/execd/{sid}/...` and `/egress/{sid}/...` (its state: the server and the
/// route's [`Token`]): the sandbox's token must be in the headers before anything reads the
/// request's body (401, or 404 for no such sandbox, having read none of it). Handlers check
/// it again with the extractor they take the sandbox with.
pub async fn require_token(
    State((server, token)): State<(Arc<Server>, Token)>,
    Path(p): Path<HashMap<String, String>>,
    req: Request,
    next: Next,
) -> Response {
    match authorize(&server, sid_of(&p), req.headers(), token) {
        Ok(_) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}
