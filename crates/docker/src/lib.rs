//! A Docker Engine API subset on a unix socket (`agentrun serve --docker-socket PATH`), so
//! docker-py and docker CLI based tools work against agentrun with `DOCKER_HOST` set.
//!
//! What clients really send is in `../shared/specs/docker/WIRE.md`; this crate serves it:
//! API 1.44 advertised, any `/v1.24`..`/v1.44` prefix or none accepted, dockerd's boolean
//! query rules, `{"message"}` errors ([`error::DockerError`]) with the texts clients match
//! on. The routes ([`routes`], axum over hyper's HTTP/1 with upgrades for the hijacked attach
//! and exec streams) serve system ([`system`]: ping, version, info), images ([`images`]:
//! list, inspect, tag, remove, pull, build), containers ([`container_api`],
//! [`container_streams`] over the model in
//! [`containers`]: each one an agentrun long-lived sandbox), exec ([`exec`]), archives
//! ([`archive`]: `docker cp`) and published ports ([`ports`]).
//!
//! Nothing a client sends is held whole without a bound: JSON bodies are read up to
//! [`http::Limits::max_request_body`], tar bodies (`put_archive`, build contexts) are
//! unpacked as they arrive up to [`http::Limits::max_upload`] (413 above either), and
//! `get_archive` streams its tar.
//!
//! Logging is `tracing`: every request with its answer and time, and the end of hijacked
//! streams, are `debug` events of the target [`TRACE`] (`agentrun::docker::http`); failures
//! that reach no client are `warn`/`error` events of the target `agentrun::docker`. The
//! binary sets up the subscriber.

pub mod archive;
pub mod container_api;
pub mod container_streams;
pub mod containers;
pub mod error;
pub mod exec;
pub mod http;
pub mod images;
pub mod ports;
pub mod pty;
pub mod pull_progress;
pub mod routes;
pub mod signals;
pub mod stdio;
pub mod stream;
pub mod system;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agentrun_image::ImageStore;
use agentrun_pool::daemon::{Frontend, RunningFrontend};
use agentrun_pool::live::LiveManager;
use agentrun_pool::lock;
use agentrun_pool::PoolError;
use agentrun_runtime::{HostInfo, RuntimePaths};
use tokio::sync::oneshot;

/// The `tracing` target of the request and stream trace (each request's answer and time,
/// how hijacked streams ended, the timings of a container's start).
pub const TRACE: &str = "agentrun::docker::http";

/// The `tracing` target of failures no client sees (a port listener, the server itself).
pub const LOG: &str = "agentrun::docker";

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum DockerApiError {
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Image(#[from] agentrun_image::ImageError),
}

/// What the handlers share: the daemon's long-lived sandboxes, the image store, every
/// container and exec instance, the request limits.
pub struct ApiState {
    /// The daemon's long-lived sandboxes (containers are made of them).
    pub live: Arc<LiveManager>,
    pub store: ImageStore,
    pub root: PathBuf,
    pub runtime_paths: RuntimePaths,
    pub host: HostInfo,
    /// Scratch space (build contexts).
    pub tmp_dir: PathBuf,
    pub containers: Arc<Mutex<containers::Containers>>,
    pub execs: Mutex<std::collections::HashMap<String, Arc<exec::Exec>>>,
    pub limits: http::Limits,
    /// The profile containers run under ([`DockerApiOptions::profile`]).
    pub profile: String,
    /// [`DockerApiOptions::max_snapshot`].
    pub max_snapshot: u64,
    pub audit: agentrun_telemetry::AuditLog,
}

/// Where and over what to serve.
#[derive(Debug, Clone)]
pub struct DockerApiOptions {
    pub socket: PathBuf,
    /// Image store root (`AGENTRUN_ROOT`).
    pub root: PathBuf,
    /// Runtime state dir (`AGENTRUN_STATE_DIR`).
    pub state_dir: PathBuf,
    /// Socket mode (default 0600: root only, like dockerd's socket without a docker group).
    pub mode: u32,
    /// Largest JSON request body (413 above it).
    pub max_request_body: u64,
    /// Largest tar body (`put_archive`, build context), unpacked as it arrives (413 above).
    pub max_upload: u64,
    /// What pulls and build contexts may unpack.
    pub image_limits: agentrun_image::UnpackLimits,
    /// Most bytes of changed files a `commit` may hold (400 above it, with the size).
    pub max_snapshot: u64,
    /// The audit log's directory (commits and the containers run from them are recorded).
    pub audit_dir: PathBuf,
    /// The profile containers run under (built-in name or file; `serve --docker-profile`,
    /// default [`containers::CONTAINER_PROFILE`]). One with a Python zygote has the `python3`
    /// processes of `docker exec` (a code interpreter's shape) forked by it.
    pub profile: String,
}

/// A running server; [`DockerServer::stop`] ends it and removes its socket.
pub struct DockerServer {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    socket: PathBuf,
}

impl DockerServer {
    /// Binds the socket and serves on a thread of its own (a tokio runtime with 2 workers).
    pub fn start(
        opts: &DockerApiOptions,
        live: Arc<LiveManager>,
    ) -> Result<DockerServer, DockerApiError> {
        let io = |context: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| DockerApiError::Io {
                context,
                path,
                source,
            }
        };
        if let Some(dir) = opts.socket.parent() {
            std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        }
        // A stale socket of an earlier server, if any (bind says what else is wrong).
        let _ = std::fs::remove_file(&opts.socket);
        let std_listener = std::os::unix::net::UnixListener::bind(&opts.socket)
            .map_err(io("bind", &opts.socket))?;
        std::fs::set_permissions(&opts.socket, std::fs::Permissions::from_mode(opts.mode))
            .map_err(io("chmod", &opts.socket))?;
        std_listener
            .set_nonblocking(true)
            .map_err(io("listen", &opts.socket))?;
        let api = Arc::new(ApiState {
            live,
            store: ImageStore::open(&opts.root)?.with_limits(opts.image_limits),
            root: opts.root.clone(),
            runtime_paths: RuntimePaths::new(&opts.state_dir),
            host: HostInfo::probe(),
            tmp_dir: opts.state_dir.join("docker-tmp"),
            containers: Default::default(),
            execs: Default::default(),
            limits: http::Limits {
                max_request_body: opts.max_request_body,
                max_upload: opts.max_upload,
            },
            profile: opts.profile.clone(),
            max_snapshot: opts.max_snapshot,
            audit: agentrun_telemetry::AuditLog::new(&opts.audit_dir),
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        let socket = opts.socket.clone();
        let thread = std::thread::Builder::new()
            .name("docker-api".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(target: LOG, "docker API: tokio runtime: {e}");
                        return;
                    }
                };
                rt.block_on(routes::serve(std_listener, api.clone(), stop_rx));
                // Containers do not outlive the API that made them.
                let all: Vec<_> = lock(&api.containers).by_id.values().cloned().collect();
                for c in all {
                    containers::remove(&api, &c);
                }
                rt.shutdown_timeout(std::time::Duration::from_secs(5));
            })
            .map_err(io("spawn thread for", &opts.socket))?;
        Ok(DockerServer {
            stop: Some(stop_tx),
            thread: Some(thread),
            socket,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops accepting, lets running requests end (bounded), removes the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            // A panic of the server thread was logged by the panic hook.
            let _ = t.join();
        }
        if let Err(e) = std::fs::remove_file(&self.socket) {
            tracing::debug!(target: "agentrun::docker", "docker API: removing the socket: {e}");
        }
    }
}

impl Drop for DockerServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `agentrun serve --docker-socket`: the server as a daemon front end.
pub struct DockerFrontend {
    pub options: DockerApiOptions,
}

impl Frontend for DockerFrontend {
    fn start(
        self: Box<Self>,
        live: Arc<LiveManager>,
    ) -> Result<Box<dyn RunningFrontend>, PoolError> {
        let server = DockerServer::start(&self.options, live)
            .map_err(|e| PoolError::Invalid(format!("docker API: {e}")))?;
        tracing::info!(target: LOG, "Docker API on {}", server.socket().display());
        Ok(Box::new(server))
    }
}

impl RunningFrontend for DockerServer {
    fn stop(self: Box<Self>) {
        DockerServer::stop(*self);
    }
}
