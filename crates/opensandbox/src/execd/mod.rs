//! The execd API of one sandbox, served under `/execd/{sid}`: ping, [`commands`], [`sessions`]
//! and [`metrics`] (the files API is [`crate::files`], code contexts [`crate::code`], the port
//! proxy [`crate::proxy`]).
//!
//! Output reaches agentrun through pipes whose write ends are passed into the sandbox
//! ([`crate::process`]); each line becomes one event of the run's stream
//! ([`crate::events`]). Every buffer between a process and a client is bounded: a run's
//! stream holds [`crate::events::EVENT_QUEUE`] events, an interactive process's output
//! [`agentrun_pool::process::LINE_QUEUE`] lines, a command's log its newest 8 MiB.

pub mod commands;
pub mod envfile;
pub mod metrics;
pub mod sessions;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::auth::ExecdSandbox;
use crate::error::{ApiError, ApiResult};
use crate::Server;

pub use commands::{parse_run_command, Command, CommandState, RunCommand};
pub use sessions::{parse_create_session, parse_run_in_session, Session};

pub fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route("/ping", get(ping))
        .route("/pty", axum::routing::any(unsupported_pty))
        .route("/pty/{*rest}", axum::routing::any(unsupported_pty))
        .with_state(server.clone())
        .merge(commands::routes(server.clone()))
        .merge(sessions::routes(server.clone()))
        .merge(metrics::routes(server))
}

async fn unsupported_pty() -> ApiError {
    ApiError::not_supported(
        "PTY sessions are not served by agentrun: use a session (/session) or a command",
    )
}

async fn ping(ExecdSandbox(rec): ExecdSandbox) -> ApiResult<StatusCode> {
    if rec.sandbox.is_dead() {
        return Err(ApiError::internal("the sandbox is gone"));
    }
    Ok(StatusCode::OK)
}
