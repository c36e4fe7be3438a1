//! Who may call what: the control plane wants the API key in `X-API-Key` (when one is set:
//! always, unless `serve --insecure-no-auth`; `e2b_` and the key is taken too, for the SDK
//! releases that check a key's form on the client); envd and the code interpreter want the
//! sandbox's access token in `X-Access-Token` or `E2B-Traffic-Access-Token` (handed out by
//! create under both names, and by get: the sandbox's execd token of the OpenSandbox front
//! end; the code interpreter SDK sends only the traffic token on `/contexts`). The sandbox is the one `E2b-Sandbox-Id` names,
//! or the `{port}-{id}` first label of the `Host` (wildcard DNS). Both are checked by
//! middleware, in constant time, before anything reads a request's body; the sandbox's
//! [`Record`] is handed to the handler as a request extension (resumed first if it is paused
//! and was made with `autoResume`: [`crate::autopause`]).

use std::sync::Arc;

use agentrun_opensandbox::{Record, Server};
use agentrun_pool::constant_time_eq;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::{E2bError, E2bResult, RpcError};

/// The header naming the sandbox of an envd or code interpreter request.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// The header naming the port (envd's or the code interpreter's).
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
/// The header of the control plane's API key.
pub const API_KEY_HEADER: &str = "x-api-key";
/// The header of a sandbox's envd access token.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// The header of a sandbox's traffic access token (the same token here).
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// E2B's prefix of an API key. Some e2b SDK releases (2.31.0: the one `openai-agents[e2b]`
/// 0.24.0 pins) refuse, on the client, a key that is not `e2b_` and hex digits; the daemon's
/// generated key is hex digits, so `e2b_` + it passes that check.
pub const KEY_PREFIX: &[u8] = b"e2b_";

/// Whether an `X-API-Key` value is the API key `key`: the key itself, or the key after E2B's
/// `e2b_` prefix. Both compared in constant time.
pub fn key_matches(given: &[u8], key: &[u8]) -> bool {
    let bare = given.strip_prefix(KEY_PREFIX).unwrap_or(given);
    constant_time_eq(given, key) | constant_time_eq(bare, key)
}

/// Middleware of the control plane: `X-API-Key` must be the API key (or `e2b_` and the API
/// key: [`key_matches`]), when one is set.
pub async fn require_api_key(
    State(server): State<Arc<Server>>,
    req: Request,
    next: Next,
) -> Response {
    if let Some(key) = &server.api_key {
        let ok = req
            .headers()
            .get(API_KEY_HEADER)
            .is_some_and(|v| key_matches(v.as_bytes(), key.as_bytes()));
        if !ok {
            return E2bError::unauthorized("invalid or missing X-API-Key").into_response();
        }
    }
    next.run(req).await
}

/// The sandbox id a request names: `E2b-Sandbox-Id`, else the `{port}-{id}` first label of
/// its `Host`.
pub fn sandbox_id(headers: &HeaderMap) -> Option<String> {
    if let Some(id) = headers
        .get(SANDBOX_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
    {
        return Some(id.to_owned());
    }
    let host = headers.get("host")?.to_str().ok()?;
    let label = host.split('.').next()?;
    let (port, id) = label.split_once('-')?;
    (port.parse::<u16>().is_ok() && !id.is_empty()).then(|| id.to_owned())
}

/// The sandbox of an envd or code interpreter request, its access token checked (502 "was not
/// found" for no such sandbox, as E2B's proxy answers it and the SDK takes it: the sandbox
/// is not running; 401 for a missing or wrong token).
pub fn authorize(server: &Server, headers: &HeaderMap) -> E2bResult<Arc<Record>> {
    let id = sandbox_id(headers)
        .ok_or_else(|| E2bError::bad_request("no sandbox named: send the E2b-Sandbox-Id header"))?;
    let rec = server.record(&id).map_err(|_| {
        E2bError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            format!("sandbox {id} was not found"),
        )
    })?;
    // The code interpreter SDK sends the token only as the traffic access token on some of
    // its requests (`/contexts`): create hands out the same token under both names.
    let ok = [ACCESS_TOKEN_HEADER, TRAFFIC_TOKEN_HEADER].iter().any(|h| {
        headers
            .get(*h)
            .is_some_and(|v| constant_time_eq(v.as_bytes(), rec.execd_token.as_bytes()))
    });
    if !ok {
        return Err(E2bError::unauthorized(
            "invalid or missing X-Access-Token (or E2B-Traffic-Access-Token)",
        ));
    }
    Ok(rec)
}

/// Middleware of envd's HTTP API and the code interpreter: [`authorized`], errors as
/// [`E2bError`]s.
pub async fn require_access_token(
    State(server): State<Arc<Server>>,
    req: Request,
    next: Next,
) -> Response {
    authorized(&server, req, next, IntoResponse::into_response).await
}

/// Middleware of envd's RPCs: [`authorized`], errors as Connect errors.
pub async fn require_access_token_rpc(
    State(server): State<Arc<Server>>,
    req: Request,
    next: Next,
) -> Response {
    authorized(&server, req, next, |e| RpcError::from(e).into_response()).await
}

/// [`authorize`], and a sandbox paused with auto-resume resumed
/// ([`crate::autopause::resume_if_asked`]): the request goes on with its record in its
/// extensions, or is answered `refuse(error)`.
async fn authorized(
    server: &Arc<Server>,
    mut req: Request,
    next: Next,
    refuse: impl FnOnce(E2bError) -> Response,
) -> Response {
    let rec = match authorize(server, req.headers()) {
        Ok(rec) => crate::autopause::resume_if_asked(server, rec).await,
        Err(e) => Err(e),
    };
    match rec {
        Ok(rec) => {
            req.extensions_mut().insert(rec);
            next.run(req).await
        }
        Err(e) => refuse(e),
    }
}

/// Why an envd request's `Authorization` header names no user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    #[error("Authorization: not ASCII")]
    NotAscii,
    #[error("Authorization: expected Basic")]
    NotBasic,
    #[error("Authorization: {0}")]
    Base64(base64::DecodeError),
    #[error("Authorization: not UTF-8")]
    NotUtf8,
    #[error("Authorization: invalid user name")]
    BadName,
}

/// The user an envd request runs as: `Authorization: Basic base64("USER:")` as the SDK sends
/// it (`None`: no header, the sandbox's root; `root` is root too).
pub fn user_of(headers: &HeaderMap) -> Result<Option<String>, UserError> {
    use base64::Engine;
    let Some(v) = headers.get("authorization") else {
        return Ok(None);
    };
    let v = v.to_str().map_err(|_| UserError::NotAscii)?;
    let Some(b64) = v.strip_prefix("Basic ") else {
        return Err(UserError::NotBasic);
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(UserError::Base64)?;
    let raw = String::from_utf8(raw).map_err(|_| UserError::NotUtf8)?;
    let user = raw.split(':').next().unwrap_or("").to_owned();
    if user.is_empty() || user == "root" {
        return Ok(None);
    }
    if user.contains(['\0', '\n']) {
        return Err(UserError::BadName);
    }
    Ok(Some(user))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_comes_from_the_header_or_the_host() {
        let mut h = HeaderMap::new();
        h.insert("host", "49983-abc123.e2b.local".parse().unwrap());
        assert_eq!(sandbox_id(&h).as_deref(), Some("abc123"));
        h.insert(SANDBOX_ID_HEADER, "xyz".parse().unwrap());
        assert_eq!(sandbox_id(&h).as_deref(), Some("xyz"));
        let mut plain = HeaderMap::new();
        plain.insert("host", "127.0.0.1:3000".parse().unwrap());
        assert_eq!(sandbox_id(&plain), None);
    }

    #[test]
    fn the_key_is_taken_bare_or_after_e2bs_prefix() {
        let key = b"0123abcd";
        assert!(key_matches(b"0123abcd", key));
        assert!(key_matches(b"e2b_0123abcd", key));
        assert!(!key_matches(b"e2b_0123abc", key));
        assert!(!key_matches(b"e2b_", key));
        assert!(!key_matches(b"", key));
        assert!(!key_matches(b"x2b_0123abcd", key));
        assert!(!key_matches(b"0123abcde2b_", key));
        // A key that itself begins with the prefix is taken as it is, and not without it.
        let prefixed = b"e2b_feed";
        assert!(key_matches(b"e2b_feed", prefixed));
        assert!(key_matches(b"e2b_e2b_feed", prefixed));
        assert!(!key_matches(b"feed", prefixed));
    }

    #[test]
    fn users_come_from_basic_auth() {
        let mut h = HeaderMap::new();
        assert_eq!(user_of(&h), Ok(None));
        // base64("user:")
        h.insert("authorization", "Basic dXNlcjo=".parse().unwrap());
        assert_eq!(user_of(&h), Ok(Some("user".into())));
        // base64("root:")
        h.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(user_of(&h), Ok(None));
        h.insert("authorization", "Bearer x".parse().unwrap());
        assert!(user_of(&h).is_err());
    }
}
