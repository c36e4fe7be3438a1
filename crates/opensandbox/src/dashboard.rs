//! The web dashboard at `/ui` on `serve --listen`: the daemon's live picture
//! ([`agentrun_pool::observe::snapshot`]: pools, running commands with their CPU and memory,
//! runs/s and latency over the last minute) and its audit log, searchable, in a page whose
//! assets are built into the binary (`dashboard/index.html`, `app.js`, `app.css`: no CDN, no
//! build step, no inline script).
//!
//! - `GET /ui` (and `/ui/trace/{id}`, the same page showing one trace's records): the page,
//!   or a login form without a session.
//! - `POST /ui/login` (form field `key`): the API key traded for a session cookie
//!   ([`session`]); `POST /ui/logout` ends it.
//! - `GET /ui/api/snapshot`: the snapshot as JSON; `GET /ui/api/audit?...`: the records an
//!   [`filter::parse`] makes of its query selects (oldest first); `GET /ui/api/denials?limit=N`: the newest
//!   refused decisions of the current audit file's last 4 MiB.
//!
//! Access follows the API's rule: with an API key configured, every path but the login form
//! and its stylesheet needs a live session cookie or the key in `OPEN-SANDBOX-API-KEY`
//! (compared in constant time); without one (loopback, or `--insecure-no-auth`) the
//! dashboard is open like the API. Every answer carries a strict CSP (`default-src 'self'`,
//! `frame-ancestors 'none'`), `X-Content-Type-Options: nosniff` and `Cache-Control: no-store`.

pub mod filter;
pub mod session;

use std::sync::Arc;

use agentrun_pool::constant_time_eq;
use agentrun_telemetry::AuditQuery;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;

use crate::error::{ApiError, ApiResult};
use crate::Server;
use session::Sessions;

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const LOGIN_HTML: &str = include_str!("dashboard/login.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");

/// The Content-Security-Policy of every dashboard answer.
pub const CSP: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; \
                       base-uri 'none'; form-action 'self'";
/// The longest login form body read.
const MAX_LOGIN_BODY: usize = 4096;
/// The tail of the current audit file the denial feed looks through.
const DENIAL_SCAN_BYTES: u64 = 4 << 20;
/// Denials the feed shows by default and at most.
const DENIALS_DEFAULT: usize = 50;
const DENIALS_MAX: usize = 500;

/// The dashboard's state: the API's, and the browser sessions.
pub struct Dashboard {
    server: Arc<Server>,
    sessions: Sessions,
}

/// Who a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// A session, the right key, or no key configured.
    Granted,
    /// No session and no key header.
    Missing,
    /// A key header that is not the key.
    WrongKey,
}

impl Dashboard {
    fn access(&self, headers: &HeaderMap) -> Access {
        let Some(key) = &self.server.api_key else {
            return Access::Granted;
        };
        if let Some(v) = headers.get("open-sandbox-api-key") {
            return if constant_time_eq(v.as_bytes(), key.as_bytes()) {
                Access::Granted
            } else {
                Access::WrongKey
            };
        }
        match session::cookie_of(headers) {
            Some(id) if self.sessions.valid(&id) => Access::Granted,
            _ => Access::Missing,
        }
    }

    /// `Ok` for a request that may read data; the API's 401 JSON otherwise.
    fn require(&self, headers: &HeaderMap) -> ApiResult<()> {
        match self.access(headers) {
            Access::Granted => Ok(()),
            Access::Missing => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "MISSING_API_KEY",
                "missing OPEN-SANDBOX-API-KEY header or dashboard session (POST /ui/login)",
            )),
            Access::WrongKey => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "INVALID_API_KEY",
                "invalid API key",
            )),
        }
    }
}

/// The `/ui` routes.
pub fn routes(server: Arc<Server>) -> axum::Router {
    let state = Arc::new(Dashboard {
        server,
        sessions: Sessions::default(),
    });
    axum::Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/trace/{id}", get(page))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/app.css", get(css))
        .route("/ui/app.js", get(js))
        .route("/ui/api/snapshot", get(snapshot))
        .route("/ui/api/audit", get(audit))
        .route("/ui/api/denials", get(denials))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state)
}

async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// The login form, with `message` (a fixed text, never request data) above it.
fn login_page(status: StatusCode, message: &str) -> Response {
    (status, Html(LOGIN_HTML.replace("{{message}}", message))).into_response()
}

async fn page(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    match d.access(&headers) {
        Access::Granted => Html(INDEX_HTML).into_response(),
        Access::Missing => login_page(StatusCode::OK, ""),
        Access::WrongKey => login_page(StatusCode::UNAUTHORIZED, "Wrong API key."),
    }
}

async fn login(State(d): State<Arc<Dashboard>>, body: Bytes) -> Response {
    let Some(key) = &d.server.api_key else {
        return see_other(None);
    };
    if body.len() > MAX_LOGIN_BODY {
        return login_page(StatusCode::PAYLOAD_TOO_LARGE, "Request too large.");
    }
    let given = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "key")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
        tracing::info!(target: "agentrun::opensandbox", "dashboard: a login with a wrong key");
        return login_page(StatusCode::UNAUTHORIZED, "Wrong API key.");
    }
    match d.sessions.create() {
        Ok(id) => see_other(Some(session::set_cookie(&id))),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

async fn logout(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    if let Some(id) = session::cookie_of(&headers) {
        d.sessions.remove(&id);
    }
    see_other(Some(session::clear_cookie()))
}

/// 303 to `/ui`, setting `cookie` if given.
fn see_other(cookie: Option<String>) -> Response {
    let mut res = (StatusCode::SEE_OTHER, [(header::LOCATION, "/ui")]).into_response();
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        res.headers_mut().insert(header::SET_COOKIE, c);
    }
    res
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
}

async fn js(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    if let Err(e) = d.require(&headers) {
        return e.into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
        .into_response()
}

/// Runs blocking work (cgroup and audit file reads) off the async threads; answers what it
/// found as JSON, or its error.
async fn json_from_blocking<T: serde::Serialize + Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> Response {
    let found = tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))
        .and_then(|r| r);
    match found {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// An audit log read that failed, as the API's 500.
fn audit_error(e: agentrun_telemetry::audit::AuditError) -> ApiError {
    ApiError::internal(e.to_string())
}

async fn snapshot(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    if let Err(e) = d.require(&headers) {
        return e.into_response();
    }
    let live = d.server.live.clone();
    json_from_blocking(move || Ok(agentrun_pool::observe::snapshot(&live))).await
}

async fn audit(
    State(d): State<Arc<Dashboard>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(e) = d.require(&headers) {
        return e.into_response();
    }
    let q = match filter::parse(query.as_deref(), chrono::Utc::now()) {
        Ok(q) => q,
        Err(e) => return ApiError::bad_request(e.to_string()).into_response(),
    };
    let log = d.server.audit.clone();
    json_from_blocking(move || log.query(&q).map_err(audit_error)).await
}

async fn denials(
    State(d): State<Arc<Dashboard>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(e) = d.require(&headers) {
        return e.into_response();
    }
    let mut limit = DENIALS_DEFAULT;
    for (k, v) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match (&*k, v.parse::<usize>()) {
            ("limit", Ok(n)) if (1..=DENIALS_MAX).contains(&n) => limit = n,
            ("limit", _) => {
                return ApiError::bad_request(format!(
                    "query parameter limit: {v:?} is not a number from 1 to {DENIALS_MAX}"
                ))
                .into_response()
            }
            (other, _) => {
                return ApiError::bad_request(format!("query parameter {other}: no such parameter"))
                    .into_response()
            }
        }
    }
    let log = d.server.audit.clone();
    let refused = AuditQuery {
        refused: true,
        limit,
        ..AuditQuery::default()
    };
    json_from_blocking(move || log.recent(DENIAL_SCAN_BYTES, &refused).map_err(audit_error)).await
}
