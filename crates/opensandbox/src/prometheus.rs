//! The daemon's Prometheus endpoint (`agentrun serve --metrics ADDR`): `GET /metrics` on a
//! listener of its own, the text of [`agentrun_pool::metrics`].
//!
//! Its own address rather than a route of `--listen`: a scraper then needs neither the
//! OpenSandbox API nor its key (Prometheus sends no `OPEN-SANDBOX-API-KEY`), and the metrics
//! can stay on loopback while the API is served further. What it shows is counts, not
//! secrets, but it is still only served beyond loopback with the API key (or
//! `--insecure-no-auth`, checked by `agentrun serve` as for `--listen`); when a key is set
//! it is required here too, as `Authorization: Bearer KEY` (Prometheus's `authorization`
//! / `bearer_token` scrape setting), compared in constant time. Its `Host` must name this
//! server ([`agentrun_webguard::guard`]), as on every listener.

use std::sync::Arc;

use agentrun_pool::daemon::{tcp_listener, Frontend, RunningFrontend, ServingThread, Stopped};
use agentrun_pool::live::LiveManager;
use agentrun_pool::PoolError;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The metrics front end of the daemon.
pub struct MetricsFrontend {
    pub listen: std::net::SocketAddr,
    /// Required as a bearer token when set.
    pub api_key: Option<String>,
    /// The `Host` names answered.
    pub guard: agentrun_webguard::HostGuard,
}

struct Endpoint {
    live: Arc<LiveManager>,
    api_key: Option<String>,
}

impl Frontend for MetricsFrontend {
    fn start(
        self: Box<Self>,
        live: Arc<LiveManager>,
    ) -> Result<Box<dyn RunningFrontend>, PoolError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| PoolError::Io("tokio runtime", e))?;
        let listener = tcp_listener("--metrics", self.listen, &runtime)?;
        let endpoint = Arc::new(Endpoint {
            live,
            api_key: self.api_key.filter(|k| !k.is_empty()),
        });
        let guard = Arc::new(self.guard);
        tracing::info!(target: "agentrun::metrics", "Prometheus metrics on http://{}/metrics", self.listen);
        let serve = move |stopped: Stopped| {
            runtime.block_on(async move {
                let app = axum::Router::new()
                    .route("/metrics", get(scrape))
                    .with_state(endpoint)
                    .layer(axum::middleware::from_fn_with_state(
                        guard,
                        agentrun_webguard::guard,
                    ));
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(stopped.wait())
                    .await;
                if let Err(e) = served {
                    tracing::error!(target: "agentrun::opensandbox", "metrics endpoint: {e}");
                }
            });
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        };
        ServingThread::spawn_stoppable("metrics", serve)
    }
}

async fn scrape(State(endpoint): State<Arc<Endpoint>>, headers: HeaderMap) -> Response {
    if let Some(key) = &endpoint.api_key {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if !agentrun_pool::bearer_authorized(given, key) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "missing or wrong API key (Authorization: Bearer KEY)\n",
            )
                .into_response();
        }
    }
    let status = endpoint.live.pool_status();
    let body = agentrun_pool::metrics::global()
        .render(&status, agentrun_pool::metrics::resident_memory_bytes());
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
}
