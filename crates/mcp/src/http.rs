//! `agentrun serve --mcp ADDR`: the MCP server over Streamable HTTP at `http://ADDR/mcp`,
//! one sandbox per MCP session (`Mcp-Session-Id`), behind the API key.
//!
//! With a key, every request must carry `Authorization: Bearer KEY`; the key is checked
//! (in constant time) before the body is read, and a missing or wrong one is a 401 JSON
//! error that closes the connection (its body unread, it cannot carry another request). A session idle for the idle timeout is closed by the session manager, which drops
//! its server and so tears down its sandbox. Before anything else, the `Host` header must
//! name this server and a POST's `Origin`, if any, must be its own
//! ([`agentrun_webguard::guard`], the checks of every agentrun listener: DNS rebinding and
//! cross-site requests are refused with a 403).

use std::net::SocketAddr;
use std::sync::Arc;

use agentrun_pool::daemon::{
    frontend_runtime, tcp_listener, Frontend, RunningFrontend, ServingThread,
};
use agentrun_pool::live::LiveManager;
use agentrun_pool::PoolError;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::handler::McpServer;
use crate::McpOptions;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";

/// The HTTP front end.
pub struct HttpFrontend {
    pub options: McpOptions,
    pub listen: SocketAddr,
    /// Required as `Authorization: Bearer KEY` when set (always, unless `serve
    /// --insecure-no-auth`).
    pub api_key: Option<String>,
    /// The `Host` names and origins answered.
    pub guard: agentrun_webguard::HostGuard,
    /// Worker threads of its runtime.
    pub workers: usize,
}

async fn require_key(key: Arc<String>, req: Request, next: Next) -> Response {
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if agentrun_pool::bearer_authorized(auth, &key) {
        return next.run(req).await;
    }
    let body = serde_json::json!({
        "code": "UNAUTHORIZED",
        "message": "missing or wrong API key: send it as `Authorization: Bearer KEY`",
    });
    // The body is never read, so the connection cannot carry another request: say so, or a
    // client that reuses it finds it closed under its next request.
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, "Bearer"),
            (header::CONNECTION, "close"),
        ],
        axum::Json(body),
    )
        .into_response()
}

impl Frontend for HttpFrontend {
    fn start(
        self: Box<Self>,
        live: Arc<LiveManager>,
    ) -> Result<Box<dyn RunningFrontend>, PoolError> {
        let runtime = frontend_runtime("mcp-http", self.workers.max(1))?;
        let listener = tcp_listener("--mcp", self.listen, &runtime)?;
        let idle = self.options.idle_timeout;
        let shared = crate::session::Shared::new(live, self.options, runtime.handle().clone())?;
        let cancel = CancellationToken::new();
        let mut config = StreamableHttpServerConfig::default();
        config.cancellation_token = cancel.child_token();
        // The Host check is agentrun_webguard's, on the whole app (the same on every
        // listener), not rmcp's.
        config = config.disable_allowed_hosts();
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(idle);
        let server_state = shared.clone();
        let service = StreamableHttpService::new(
            move || Ok(McpServer::new(shared.clone())),
            Arc::new(sessions),
            config,
        );
        let mut app = axum::Router::new().nest_service(MCP_PATH, service);
        if let Some(key) = self.api_key.filter(|k| !k.is_empty()) {
            let key = Arc::new(key);
            app = app.layer(axum::middleware::from_fn(move |req, next| {
                require_key(key.clone(), req, next)
            }));
        }
        let app = app.layer(axum::middleware::from_fn_with_state(
            Arc::new(self.guard),
            agentrun_webguard::guard,
        ));
        let ct = cancel.clone();
        let listen = self.listen;
        let serve = move || {
            runtime.block_on(async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { ct.cancelled().await })
                    .await;
                if let Err(e) = served {
                    tracing::error!(target: "agentrun::mcp", "MCP over HTTP: {e}");
                }
            });
            // The sessions (dropped with the runtime's tasks) have their sandboxes torn
            // down before the daemon's shutdown goes on.
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
            server_state.wait_for_teardowns(std::time::Duration::from_secs(30));
        };
        let running = ServingThread::spawn("mcp-http", serve, move || cancel.cancel())?;
        tracing::info!(target: "agentrun::mcp", "MCP server on http://{listen}{MCP_PATH}");
        Ok(running)
    }
}
