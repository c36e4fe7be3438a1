//! The OpenSandbox API served by `agentrun serve --listen ADDR`, so that the official
//! OpenSandbox SDKs work against agentrun unchanged (the API as the SDK 1.1.1 speaks it: the
//! `opensandbox` e2e tests drive it with the official SDKs).
//!
//! - [`lifecycle`]: `/v1/sandboxes...` (create, get, list, delete, pause/resume, renew,
//!   metadata, endpoints), `/v1/snapshots...`, `X-Request-ID` echo, TTL expiry; a sandbox's
//!   entrypoint.
//! - [`execd`]: the per-sandbox execd API (ping, commands, sessions, metrics) that OpenSandbox
//!   runs inside each container; here agentrun serves it itself under `/execd/{sid}`, guarded
//!   by a per-sandbox token handed out in the endpoint lookup's `headers`. Nothing runs inside
//!   the image besides what the user asked for.
//! - [`files`]: the execd file API, every path resolved inside the sandbox ([`agentrun_runtime::fsroot`]).
//! - [`code`]: code interpreting (Python contexts).
//! - [`proxy`]: execd's port proxy into the sandbox.
//! - [`server_proxy`]: `/v1/sandboxes/{id}/proxy/{port}`, every port's endpoint reached
//!   through the server (`use_server_proxy=true`), behind the API key.
//! - [`egress`]: the `networkPolicy`, enforced by a per-sandbox egress proxy, and the egress
//!   sidecar's API (under `/egress/{sid}`) that changes it live.
//! - [`auth`]: the API key and the per-sandbox tokens, one extractor per token.
//! - [`sandbox`]: the API's state, one [`Record`] a sandbox, and its [`SandboxState`];
//!   `held`: the types a [`Record`] holds for the APIs above it (code, commands, sessions,
//!   egress, snapshots being taken), below both.
//! - [`dashboard`]: not the OpenSandbox API but served beside it: the web dashboard at
//!   `/ui` (the daemon's live picture and its audit log), behind the same API key.
//! - [`prometheus`]: not the OpenSandbox API but served beside it: the daemon's Prometheus
//!   endpoint (`serve --metrics ADDR`), on a listener of its own.
//! - [`process`] / [`events`]: processes in a sandbox (pipes, the interactive ones of sessions
//!   and code contexts) and the event streams their output reaches clients by.
//!
//! Sandboxes come from [`agentrun_pool::live::LiveManager`]. The server runs on its own tokio
//! runtime in the daemon (started after the sandbox factories were forked).
//!
//! Who may call: every request's `Host` must name this server and a state-changing one's
//! `Origin`, if any, must be its own ([`agentrun_webguard::origin`]: DNS rebinding and
//! cross-site requests are refused before routing); JSON bodies are read only as
//! `application/json` ([`error::JsonBody`], 415 otherwise); `/v1` needs the API key, which
//! `agentrun serve` always has unless `--insecure-no-auth`.
//!
//! Nothing a client sends or a sandbox writes is held in memory without a bound: the API key
//! (`/v1`) and the per-sandbox tokens (`/execd`, `/egress`) are checked from the headers
//! before any body is read; JSON bodies are read up to [`Limits::max_request_body`], uploads
//! are streamed to the sandbox's files up to [`Limits::max_upload`] (413 above either);
//! downloads, `replace` and process output are streamed in bounded chunks and queues (see
//! [`files`], [`events`], [`process`] and [`execd::commands`]).

pub mod accounts;
pub mod auth;
pub mod body_tail;
pub mod code;
pub mod dashboard;
pub mod egress;
pub mod error;
pub mod events;
pub mod execd;
pub mod files;
pub mod filestream;
mod held;
pub mod lifecycle;
mod lines;
pub mod params;
pub mod process;
pub mod prometheus;
pub mod proxy;
pub mod sandbox;
pub mod server_proxy;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agentrun_pool::daemon::{
    frontend_runtime, tcp_listener, Frontend, RunningFrontend, ServingThread, Stopped,
};
use agentrun_pool::live::LiveManager;
use agentrun_pool::PoolError;
use chrono::{DateTime, SecondsFormat, Utc};

pub use error::{ApiError, ApiResult};
pub use sandbox::{Record, SandboxState, Server};

/// The execd port the SDK asks the endpoint of.
pub const EXECD_PORT: u16 = 44772;
/// The egress sidecar port the SDK also looks up.
pub const EGRESS_PORT: u16 = 18080;
/// Header carrying the per-sandbox execd token.
pub const EXECD_TOKEN_HEADER: &str = "X-EXECD-ACCESS-TOKEN";
/// Header carrying the per-sandbox egress token.
pub const EGRESS_TOKEN_HEADER: &str = "OPENSANDBOX-EGRESS-AUTH";

/// `agentrun serve --listen`: where and how to serve.
#[derive(Debug, Clone)]
pub struct OpenSandboxOptions {
    pub listen: SocketAddr,
    /// Required in `OPEN-SANDBOX-API-KEY` when set (always, unless `serve
    /// --insecure-no-auth`).
    pub api_key: Option<String>,
    /// The `Host` names and origins answered ([`agentrun_webguard::HostGuard`]).
    pub guard: agentrun_webguard::HostGuard,
    /// The image store root (`image.uri` resolves there).
    pub image_root: PathBuf,
    /// Worker threads of the HTTP runtime.
    pub workers: usize,
    /// The audit log's directory (egress decisions and policy changes).
    pub audit_dir: PathBuf,
    /// Request body limits.
    pub limits: Limits,
    /// The profile every sandbox runs under (built-in name or file; `serve
    /// --opensandbox-profile`, default `default`). One with a Python zygote has its code
    /// contexts and `python3` commands forked by it.
    pub profile: String,
    /// The host directories `host` volumes may come from (`serve --volume-root`; none: host
    /// volumes are refused). Named (`pvc`) volumes live under `image_root/volumes`.
    pub volume_roots: agentrun_runtime::volume::VolumeRoots,
    /// PEM bundles of roots the egress proxy also trusts for upstream certificates when it
    /// intercepts TLS (`serve --egress-upstream-ca`; the system's roots always).
    pub upstream_roots: Vec<PathBuf>,
}

/// How much of a request body the API reads (`agentrun serve --max-request-body`,
/// `--max-upload`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A JSON request body, read whole (413 above it).
    pub max_request_body: usize,
    /// A file upload's request body, streamed to the sandbox's files (413 above it; what was
    /// written is removed).
    pub max_upload: u64,
    /// Most bytes of changed files a snapshot may hold (400 above it, with the size).
    pub max_snapshot: u64,
}

/// Default of [`Limits::max_request_body`]: 4 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 4 << 20;
/// Default of [`Limits::max_upload`]: 1 GiB.
pub const DEFAULT_MAX_UPLOAD: u64 = 1 << 30;
/// Default of [`Limits::max_snapshot`]: 4 GiB.
pub const DEFAULT_MAX_SNAPSHOT: u64 = 4 << 30;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            max_upload: DEFAULT_MAX_UPLOAD,
            max_snapshot: DEFAULT_MAX_SNAPSHOT,
        }
    }
}

/// The HTTP app a front end serves over a [`Server`]: [`router`] (the OpenSandbox API), or
/// another API over the same sandboxes, commands, files and code contexts (the E2B API,
/// `agentrun-e2b`).
pub type App = fn(Arc<Server>) -> axum::Router;

/// An HTTP front end of the daemon over a [`Server`] of its own: the OpenSandbox API
/// ([`OpenSandboxFrontend::new`]), or another [`App`] on its own listener
/// ([`OpenSandboxFrontend::with_app`]).
pub struct OpenSandboxFrontend {
    pub options: OpenSandboxOptions,
    /// What it serves.
    pub app: App,
    /// Its name in logs and thread names (`"OpenSandbox API"`).
    pub name: &'static str,
}

impl OpenSandboxFrontend {
    /// The OpenSandbox API.
    pub fn new(options: OpenSandboxOptions) -> Self {
        Self::with_app(options, "OpenSandbox API", router)
    }

    /// `app` served as `name`.
    pub fn with_app(options: OpenSandboxOptions, name: &'static str, app: App) -> Self {
        OpenSandboxFrontend { options, app, name }
    }
}

impl Frontend for OpenSandboxFrontend {
    fn start(
        self: Box<Self>,
        live: Arc<LiveManager>,
    ) -> Result<Box<dyn RunningFrontend>, PoolError> {
        let (opts, app, name) = (self.options, self.app, self.name);
        let runtime = frontend_runtime("opensandbox", opts.workers.max(1))?;
        let listener = tcp_listener("--listen", opts.listen, &runtime)?;
        let store = agentrun_image::ImageStore::open(&opts.image_root)?;
        // Process output is read on a runtime of its own: a sandbox flooding its pipes
        // keeps this thread busy, not the workers answering every other sandbox's requests
        // (the kernel shares the CPU between the threads).
        let output = frontend_runtime("opensandbox-output", 1)?;
        let server = Arc::new(Server {
            output: output.handle().clone(),
            live,
            store,
            api_key: opts.api_key.clone().filter(|k| !k.is_empty()),
            listen: opts.listen,
            guard: Arc::new(opts.guard.clone()),
            limits: opts.limits,
            profile: opts.profile.clone(),
            volume_roots: opts.volume_roots.clone(),
            upstream_roots: opts.upstream_roots.clone(),
            volume_store: agentrun_runtime::volume::VolumeStore::new(&opts.image_root),
            audit: agentrun_telemetry::AuditLog::new(&opts.audit_dir),
            records: Mutex::new(HashMap::new()),
            snapshots: Mutex::new(HashMap::new()),
            owner: opts
                .api_key
                .as_deref()
                .filter(|k| !k.is_empty())
                .map(agentrun_image::snapshot::owner_of_secret)
                .unwrap_or_default(),
        });
        tracing::info!(target: "agentrun::opensandbox", "{name} on http://{}", opts.listen);
        let serve = move |stopped: Stopped| {
            runtime.block_on(async move {
                use axum::serve::ListenerExt;
                // Events are small writes: never hold them back for an ACK (Nagle).
                let listener = listener.tap_io(|tcp| {
                    // Latency only: the connection works without it.
                    let _ = tcp.set_nodelay(true);
                });
                let expiry = tokio::spawn(lifecycle::expiry_loop(server.clone()));
                let app = app(server.clone());
                let app = app.into_make_service_with_connect_info::<SocketAddr>();
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(stopped.wait())
                    .await;
                if let Err(e) = served {
                    tracing::error!(target: "agentrun::opensandbox", "{name}: {e}");
                }
                expiry.abort();
                // Sandboxes are deleted by the daemon's LiveManager::shutdown; the named
                // volumes they made to go with them go now (their processes are being
                // killed), the others are let go.
                let records: Vec<_> = server.records_lock().drain().map(|(_, r)| r).collect();
                for rec in records {
                    let held = std::mem::take(&mut *agentrun_pool::lock(&rec.volumes));
                    lifecycle::volumes::release(held, false);
                }
            });
            runtime.shutdown_timeout(std::time::Duration::from_secs(2));
            output.shutdown_timeout(std::time::Duration::from_secs(2));
        };
        ServingThread::spawn_stoppable("opensandbox", serve)
    }
}

/// The whole HTTP app. The `Host` and `Origin` checks ([`agentrun_webguard::guard`]) come
/// first, on every route; tokens and the API key are checked by middleware, before any
/// extractor reads a body; bodies are read within [`Limits`].
pub fn router(server: Arc<Server>) -> axum::Router {
    let sandboxes = sandbox_apis(server.clone());
    let app = axum::Router::new()
        .merge(lifecycle::routes(server.clone()))
        .merge(server_proxy::routes(
            server.clone(),
            with_fallbacks(sandboxes.clone()),
        ))
        .merge(sandboxes)
        .merge(dashboard::routes(server.clone()));
    with_fallbacks(app)
        .layer(axum::extract::DefaultBodyLimit::max(
            server.limits.max_request_body,
        ))
        .layer(axum::middleware::from_fn(lifecycle::request_id))
        .layer(axum::middleware::from_fn_with_state(
            server.guard.clone(),
            agentrun_webguard::guard,
        ))
        // Outermost: a body left unread by any layer or handler (a refusal too) is finished.
        .layer(axum::middleware::from_fn(body_tail::finish_body))
}

/// A JSON 404 for no such route and a JSON 405 for a method a route does not take.
fn with_fallbacks(router: axum::Router) -> axum::Router {
    router
        .fallback(|uri: axum::http::Uri| async move {
            ApiError::not_found("NOT_FOUND", format!("no such endpoint {}", uri.path()))
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "METHOD_NOT_ALLOWED",
                "method not allowed on this endpoint",
            )
        })
}

/// The per-sandbox APIs, each behind its sandbox's token: execd's (`/execd/{sid}`) and the
/// egress sidecar's (`/egress/{sid}`). Reached directly or through [`server_proxy`].
fn sandbox_apis(server: Arc<Server>) -> axum::Router {
    use axum::middleware::from_fn_with_state;
    axum::Router::new()
        .nest(
            "/execd/{sid}",
            execd::routes(server.clone())
                .merge(files::routes(server.clone()))
                .merge(code::routes(server.clone()))
                .merge(proxy::routes(server.clone()))
                .route_layer(from_fn_with_state(
                    (server.clone(), auth::Token::Execd),
                    auth::require_token,
                )),
        )
        .nest(
            "/egress/{sid}",
            egress::routes(server.clone()).route_layer(from_fn_with_state(
                (server, auth::Token::Egress),
                auth::require_token,
            )),
        )
}

/// RFC 3339 with milliseconds and `Z`.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// 32 random hex digits (from [`agentrun_runtime::random`]: getrandom, never a predictable
/// fallback); a 500 when the kernel gives no randomness.
pub fn random_token() -> ApiResult<String> {
    agentrun_runtime::random::hex(16).map_err(|e| ApiError::internal(e.to_string()))
}

/// Runs a span's export off the async threads (it may block on the network).
pub fn finish_span(span: agentrun_telemetry::RunSpan) {
    if agentrun_telemetry::export_enabled() {
        tokio::task::spawn_blocking(move || span.finish());
    }
}
