//! The web dashboard at `/ui` on `serve --listen`: the daemon's live picture
//! ([`agentrun_pool::observe::snapshot`]: pools, running commands with their CPU and memory,
//! runs/s and latency over the last minute) and its audit log, searchable, in a page whose
//! assets are built into the binary (`dashboard/index.html`, `app.js`, `app.css`: no CDN, no
//! build step, no inline script).
//!
//! - `GET /ui` (and `/ui/trace/{id}`, the same page showing one trace's records): the page,
//!   or a login form without a session.
//! - `POST /ui/login` (form fields `key` and `csrf`): the API key traded for a session cookie
//!   ([`session`]); `POST /ui/logout` (form field `csrf`, the session's token) ends it. Both
//!   refuse a missing or wrong CSRF token (403); a client address with
//!   [`session::LOGIN_FAILURES`] wrong keys in a minute is refused logins (429) for the rest
//!   of it.
//! - `GET /ui/api/snapshot`: the snapshot as JSON; `GET /ui/api/audit?...`: the records an
//!   [`filter::parse`] makes of its query selects (oldest first); `GET /ui/api/denials?limit=N`: the newest
//!   refused decisions of the current audit file's last 4 MiB.
//!
//! Access follows the API's rule: with an API key (always, unless `serve
//! --insecure-no-auth`), every path but the login form
//! and its stylesheet needs a live session cookie or the key in `OPEN-SANDBOX-API-KEY`
//! (compared in constant time); without one the dashboard is open like the API. Cross-site
//! requests are refused before they get here ([`agentrun_webguard::guard`]) and the cookies
//! are `SameSite=Strict`. Every answer carries a strict CSP (`default-src 'self'`,
//! `frame-ancestors 'none'`), `X-Content-Type-Options: nosniff` and `Cache-Control: no-store`.

pub mod filter;
pub mod session;

use std::sync::Arc;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use agentrun_pool::constant_time_eq;
use agentrun_telemetry::AuditQuery;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;

use crate::error::{ApiError, ApiResult};
use crate::Server;
use session::{LoginLimiter, Sessions};

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
    logins: LoginLimiter,
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

/// A request that may read data: the API key or a dashboard session checked
/// ([`Dashboard::require`]), the API's 401 JSON otherwise. Every data handler takes it.
struct Granted;

impl axum::extract::FromRequestParts<Arc<Dashboard>> for Granted {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        d: &Arc<Dashboard>,
    ) -> ApiResult<Self> {
        d.require(&parts.headers).map(|()| Granted)
    }
}

/// The `/ui` routes.
pub fn routes(server: Arc<Server>) -> axum::Router {
    let state = Arc::new(Dashboard {
        server,
        sessions: Sessions::default(),
        logins: LoginLimiter::default(),
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

/// The headers of every dashboard response.
const SECURITY_HEADERS: [(header::HeaderName, &str); 5] = [
    (header::CONTENT_SECURITY_POLICY, CSP),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::X_FRAME_OPTIONS, "DENY"),
    // `same-origin`, not `no-referrer`: under `no-referrer` a browser sends `Origin: null`
    // with the page's own form posts, which the Origin check refuses as it must (sandboxed
    // content sends it too). Nothing leaves for other origins either way.
    (header::REFERRER_POLICY, "same-origin"),
    (header::CACHE_CONTROL, "no-store"),
];

async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        h.insert(name, HeaderValue::from_static(value));
    }
    res
}

/// The login form, with `message` (a fixed text, never request data) above it and a new
/// CSRF token in it and in its cookie.
fn login_page(status: StatusCode, message: &str, secure: bool) -> Response {
    let token = match agentrun_runtime::random::hex(16) {
        Ok(t) => t,
        Err(e) => return ApiError::internal(e.to_string()).into_response(),
    };
    let html = LOGIN_HTML
        .replace("{{message}}", message)
        .replace("{{csrf}}", &token);
    let mut res = (status, Html(html)).into_response();
    if let Ok(c) = HeaderValue::from_str(&session::login_cookie(&token, secure)) {
        res.headers_mut().insert(header::SET_COOKIE, c);
    }
    res
}

async fn page(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    let secure = session::came_over_tls(&headers);
    match d.access(&headers) {
        Access::Granted => {
            // The session's CSRF token for the page's forms (none without a key: nothing
            // to protect, the dashboard is open).
            let csrf = session::cookie_of(&headers)
                .and_then(|id| d.sessions.lookup(&id))
                .unwrap_or_default();
            Html(INDEX_HTML.replace("{{csrf}}", &csrf)).into_response()
        }
        Access::Missing => login_page(StatusCode::OK, "", secure),
        Access::WrongKey => login_page(StatusCode::UNAUTHORIZED, "Wrong API key.", secure),
    }
}

/// The form fields of a small urlencoded body.
fn form_field(body: &[u8], name: &str) -> String {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// The client's address (loopback when the router runs without connect info).
fn client_ip(info: Option<&ConnectInfo<SocketAddr>>) -> IpAddr {
    info.map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |c| c.0.ip())
}

async fn login(
    State(d): State<Arc<Dashboard>>,
    headers: HeaderMap,
    ext: axum::http::Extensions,
    body: Bytes,
) -> Response {
    let secure = session::came_over_tls(&headers);
    let Some(key) = &d.server.api_key else {
        return see_other(None);
    };
    let ip = client_ip(ext.get::<ConnectInfo<SocketAddr>>());
    if let Err(wait) = d.logins.check(ip) {
        let mut res = login_page(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many wrong keys from this address: wait a minute.",
            secure,
        );
        if let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            res.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return res;
    }
    if body.len() > MAX_LOGIN_BODY {
        return login_page(StatusCode::PAYLOAD_TOO_LARGE, "Request too large.", secure);
    }
    let csrf = form_field(&body, "csrf");
    let expected = session::named_cookie(&headers, session::LOGIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !constant_time_eq(csrf.as_bytes(), expected.as_bytes()) {
        return login_page(
            StatusCode::FORBIDDEN,
            "The sign-in form expired: sign in again.",
            secure,
        );
    }
    let given = form_field(&body, "key");
    if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
        d.logins.failed(ip);
        tracing::info!(target: "agentrun::opensandbox", "dashboard: a login with a wrong key from {ip}");
        return login_page(StatusCode::UNAUTHORIZED, "Wrong API key.", secure);
    }
    d.logins.succeeded(ip);
    match d.sessions.create() {
        Ok((id, _)) => see_other(Some(session::set_cookie(&id, secure))),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

async fn logout(State(d): State<Arc<Dashboard>>, headers: HeaderMap, body: Bytes) -> Response {
    let secure = session::came_over_tls(&headers);
    if let Some(id) = session::cookie_of(&headers) {
        if body.len() > MAX_LOGIN_BODY || !d.sessions.csrf_ok(&id, &form_field(&body, "csrf")) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "CSRF_TOKEN",
                "missing or wrong CSRF token (sign out from the dashboard's page)",
            )
            .into_response();
        }
        d.sessions.remove(&id);
    }
    see_other(Some(session::clear_cookie(secure)))
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

async fn js(_: Granted) -> Response {
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

async fn snapshot(_: Granted, State(d): State<Arc<Dashboard>>) -> Response {
    let live = d.server.live.clone();
    json_from_blocking(move || Ok(agentrun_pool::observe::snapshot(&live))).await
}

async fn audit(_: Granted, State(d): State<Arc<Dashboard>>, RawQuery(query): RawQuery) -> Response {
    let q = match filter::parse(query.as_deref(), chrono::Utc::now()) {
        Ok(q) => q,
        Err(e) => return ApiError::bad_request(e.to_string()).into_response(),
    };
    let log = d.server.audit.clone();
    json_from_blocking(move || log.query(&q).map_err(audit_error)).await
}

async fn denials(
    _: Granted,
    State(d): State<Arc<Dashboard>>,
    RawQuery(query): RawQuery,
) -> Response {
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
