//! `agentrun mcp`: one MCP session over the process's standard streams, served as a daemon
//! front end (so its sandboxes come from the daemon's warm pool).
//!
//! The caller hands over the protocol's two fds and points the process's own fd 0 and 1
//! elsewhere before the daemon forks anything (see `agentrun mcp`), so that nothing the
//! daemon, its factories or its sandboxes print can reach the protocol stream. When the
//! client closes the input the session ends (its sandbox is torn down) and the daemon is
//! asked to stop, as a SIGTERM would ask it.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use agentrun_pool::daemon::{frontend_runtime, Frontend, RunningFrontend, ServingThread};
use agentrun_pool::live::LiveManager;
use agentrun_pool::PoolError;
use rmcp::ServiceExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::handler::McpServer;
use crate::session::Shared;
use crate::McpOptions;

/// The stdio front end: serves one session on `input`/`output`.
pub struct StdioFrontend {
    pub options: McpOptions,
    pub input: OwnedFd,
    pub output: OwnedFd,
}

fn is_fifo(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd.as_raw_fd())
        .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFIFO)
        .unwrap_or(false)
}

/// The protocol's input: on the reactor when it is a pipe (what MCP clients give), else a
/// blocking file read on tokio's blocking pool.
fn reader(fd: OwnedFd) -> std::io::Result<Box<dyn AsyncRead + Send + Unpin>> {
    if is_fifo(&fd) {
        return Ok(Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd(
            fd,
        )?));
    }
    Ok(Box::new(tokio::fs::File::from_std(File::from(fd))))
}

fn writer(fd: OwnedFd) -> std::io::Result<Box<dyn AsyncWrite + Send + Unpin>> {
    if is_fifo(&fd) {
        return Ok(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(fd)?));
    }
    Ok(Box::new(tokio::fs::File::from_std(File::from(fd))))
}

impl Frontend for StdioFrontend {
    fn start(
        self: Box<Self>,
        live: Arc<LiveManager>,
    ) -> Result<Box<dyn RunningFrontend>, PoolError> {
        let runtime = frontend_runtime("mcp", 2)?;
        let shared = Shared::new(live, self.options, runtime.handle().clone())?;
        let cancel = CancellationToken::new();
        let ct = cancel.clone();
        let (input, output) = (self.input, self.output);
        let server_state = shared.clone();
        let serve = move || {
            runtime.block_on(async move {
                let transport = match (reader(input), writer(output)) {
                    (Ok(r), Ok(w)) => (r, w),
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::error!(target: "agentrun::mcp", "stdio: {e}");
                        return;
                    }
                };
                match McpServer::new(shared).serve_with_ct(transport, ct).await {
                    Ok(running) => {
                        // The session ended (client gone or cancelled); a panic was logged by the panic hook.
                        let _ = running.waiting().await;
                    }
                    Err(e) => {
                        tracing::error!(target: "agentrun::mcp", "MCP session: {e}")
                    }
                }
            });
            // The session ended: its server (dropped with the runtime's tasks) has its
            // sandbox torn down, and once that is done the daemon is asked to stop.
            // Every thread blocks SIGTERM and the daemon takes it from its signalfd, as
            // it takes one sent by anyone else.
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
            server_state.wait_for_teardowns(std::time::Duration::from_secs(30));
            // SAFETY: kill(2) on our own pid with a valid signal number.
            unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
        };
        let running = ServingThread::spawn("mcp-stdio", serve, move || cancel.cancel())?;
        tracing::info!(target: "agentrun::mcp", "MCP server on stdio");
        Ok(running)
    }
}
