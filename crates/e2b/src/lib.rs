//! The E2B API served by `agentrun serve --e2b ADDR`, so that the official `e2b` and
//! `e2b-code-interpreter` SDKs work against agentrun with `E2B_API_URL=http://ADDR` and
//! `E2B_SANDBOX_URL=http://ADDR` (docs/e2b.md says what is served and what differs).
//!
//! One listener answers all three of E2B's APIs; a request for a sandbox's envd or code
//! interpreter carries the `E2b-Sandbox-Id` header (and `E2b-Sandbox-Port`), as the SDK sends
//! it when `sandbox_url` is set:
//! - [`control`]: the control plane (`/v2/sandboxes`, `/sandboxes/{id}`, `.../timeout`),
//!   behind `X-API-Key` (the daemon's API key, [`auth`]).
//! - [`process`], [`filesystem`] and [`watch`]: envd's Connect-RPC services (`/process.Process/...`,
//!   `/filesystem.Filesystem/...`) in the JSON codec the SDK speaks, framed by [`connect`].
//! - [`files`]: envd's HTTP `/files` (download and upload) and `/health`.
//! - [`code`]: the code interpreter's `/execute` (NDJSON stream).
//! - [`record`]: a sandbox's record as E2B sees it (lookup, template, end, the created answer),
//!   below the control plane, snapshots and metrics.
//! - [`snapshots`] (snapshots, fork) and [`metrics`]: control plane routes on the OpenSandbox
//!   front end's snapshot, fork and cgroup metrics machinery.
//! - `paging`: a list's `limit` and `nextToken` (sandboxes, snapshots).
//!
//! Behind the envd and code interpreter routes is the sandbox's envd access token
//! (`X-Access-Token`, handed out by create), which is the sandbox's execd token of the
//! OpenSandbox front end: one token per sandbox, whichever API reaches it.
//!
//! Everything runs on the OpenSandbox front end's machinery: its [`Server`] and
//! [`agentrun_opensandbox::Record`]s (a sandbox made here is one of its records, with its own
//! listener and so its own set of records), its commands' processes, its file resolution
//! inside the sandbox ([`agentrun_runtime::fsroot`]) and its Python code contexts.

pub mod auth;
pub mod autopause;
pub mod code;
pub mod connect;
pub mod control;
pub mod error;
pub mod files;
pub mod filesystem;
pub mod metrics;
mod paging;
pub mod process;
mod record;
pub mod snapshots;
pub mod watch;

use std::sync::Arc;

use agentrun_opensandbox::Server;
use axum::http::StatusCode;

pub use error::{E2bError, RpcError};

/// The port of envd in a sandbox, as the SDK names it in `E2b-Sandbox-Port`.
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port.
pub const JUPYTER_PORT: u16 = 49999;
/// The envd version create and get answer: the SDK turns features on by it (0.5.7: stdin
/// choice, no default-user header, multipart and octet-stream uploads).
pub const ENVD_VERSION: &str = "0.5.7";
/// The `clientID` of every sandbox (E2B's is the node's).
pub const CLIENT_ID: &str = "agentrun";

/// The request's W3C `traceparent`, if it has one (the parent of the spans it makes).
pub(crate) fn traceparent(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get("traceparent").and_then(|v| v.to_str().ok())
}

/// envd's Connect-RPC services ([`process`], [`filesystem`], [`watch`]), each route behind
/// the sandbox's access token, refused with a Connect error
/// ([`auth::require_access_token_rpc`]).
fn envd_rpc(server: &Arc<Server>) -> axum::Router {
    axum::Router::new()
        .merge(process::routes(
            server.clone(),
            Arc::new(process::Processes::default()),
        ))
        .merge(filesystem::routes())
        .merge(watch::routes(Arc::new(watch::Watchers::default())))
        .route_layer(axum::middleware::from_fn_with_state(
            server.clone(),
            auth::require_access_token_rpc,
        ))
}

/// The whole E2B app: control plane, envd and code interpreter on one listener. The `Host`
/// and `Origin` checks ([`agentrun_webguard::guard`]) come first on every route; the API key
/// and the envd token are checked before any body is read; JSON bodies are read within the
/// server's limit.
pub fn router(server: Arc<Server>) -> axum::Router {
    // Auto-pause sandboxes are paused at their end by a loop of the listener's runtime.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(autopause::pause_loop(server.clone()));
    }
    let app = axum::Router::new()
        .merge(control::routes(server.clone()))
        .merge(envd_rpc(&server))
        .merge(files::routes(server.clone()))
        .merge(code::routes(server.clone()))
        .fallback(|uri: axum::http::Uri| async move {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("no such endpoint {}", uri.path()),
            )
        })
        .method_not_allowed_fallback(|| async {
            E2bError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this endpoint",
            )
        });
    app.layer(axum::extract::DefaultBodyLimit::max(
        server.limits.max_request_body,
    ))
    .layer(axum::middleware::from_fn_with_state(
        server.guard.clone(),
        agentrun_webguard::guard,
    ))
    .layer(axum::middleware::from_fn(
        agentrun_opensandbox::body_tail::finish_body,
    ))
}
