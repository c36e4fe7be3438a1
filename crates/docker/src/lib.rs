//! A Docker Engine API subset on a unix socket (`agentrun serve --docker-socket PATH`), so
//! docker-py and docker CLI based tools work against agentrun with `DOCKER_HOST` set.
//!
//! What clients really send is in `../shared/specs/docker/WIRE.md`; this crate serves it:
//! API 1.44 advertised, any `/v1.24`..`/v1.44` prefix or none accepted, dockerd's boolean
//! query rules, `{"message"}` errors with the texts clients match on. Served today: system
//! ([`system`]: ping, version, info) and images ([`images`]: list, inspect, tag, remove,
//! pull, build). Containers and exec come with agentrun's long-lived sandboxes.
//!
//! Nothing a client sends is held whole without a bound: JSON bodies are read up to
//! [`http::Limits::max_request_body`], tar bodies (`put_archive`, build contexts) are
//! unpacked as they arrive up to [`http::Limits::max_upload`] (413 above either), and
//! `get_archive` streams its tar.

pub mod archive;
pub mod container_api;
pub mod containers;
pub mod exec;
pub mod http;
pub mod images;
pub mod ports;
pub mod pty;
pub mod signals;
pub mod stream;
pub mod system;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentrun_image::ImageStore;
use agentrun_pool::daemon::{Frontend, RunningFrontend};
use agentrun_pool::live::LiveManager;
use agentrun_pool::PoolError;
use agentrun_runtime::{HostInfo, RuntimePaths};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::sync::oneshot;

use crate::http::{error, strip_version, Query, Reply};

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

/// What handlers share.
pub struct Context {
    /// The daemon's long-lived sandboxes (containers are made of them).
    pub live: Arc<LiveManager>,
    pub store: ImageStore,
    pub root: PathBuf,
    pub runtime_paths: RuntimePaths,
    pub host: HostInfo,
    /// Scratch space (build contexts).
    pub tmp_dir: PathBuf,
    pub containers: Arc<std::sync::Mutex<containers::Containers>>,
    pub execs: std::sync::Mutex<std::collections::HashMap<String, Arc<exec::Exec>>>,
    pub limits: http::Limits,
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
        let _ = std::fs::remove_file(&opts.socket);
        let std_listener = std::os::unix::net::UnixListener::bind(&opts.socket)
            .map_err(io("bind", &opts.socket))?;
        std::fs::set_permissions(&opts.socket, std::fs::Permissions::from_mode(opts.mode))
            .map_err(io("chmod", &opts.socket))?;
        std_listener
            .set_nonblocking(true)
            .map_err(io("listen", &opts.socket))?;
        let ctx = Arc::new(Context {
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
                        eprintln!("agentrun: docker API: {e}");
                        return;
                    }
                };
                rt.block_on(serve(std_listener, ctx.clone(), stop_rx));
                // Containers do not outlive the API that made them.
                let all: Vec<_> = containers::lock(&ctx.containers)
                    .by_id
                    .values()
                    .cloned()
                    .collect();
                for c in all {
                    containers::remove(&ctx, &c);
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
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
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
        eprintln!("agentrun: Docker API on {}", server.socket().display());
        Ok(Box::new(server))
    }
}

impl RunningFrontend for DockerServer {
    fn stop(self: Box<Self>) {
        DockerServer::stop(*self);
    }
}

async fn serve(
    listener: std::os::unix::net::UnixListener,
    ctx: Arc<Context>,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("agentrun: docker API: {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let ctx = ctx.clone();
                        async move { Ok::<_, std::convert::Infallible>(traced(ctx, req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                });
            }
        }
    }
}

/// [`route`], logging each request's answer and how long it took (`AGENTRUN_DOCKER_TRACE=1`;
/// a stream's time is the time to its headers).
async fn traced(ctx: Arc<Context>, req: Request<hyper::body::Incoming>) -> Reply {
    if !trace() {
        return route(ctx, req).await;
    }
    let t0 = std::time::Instant::now();
    let what = format!("{} {}", req.method(), req.uri());
    let reply = route(ctx, req).await;
    trace_line(format_args!(
        "{what}: {} in {:.2} ms",
        reply.status().as_u16(),
        t0.elapsed().as_secs_f64() * 1e3
    ));
    reply
}

/// The path a request's target names: without its `/vX.Y` prefix, percent-decoded (image
/// names may come encoded). `Err` is the 400 message for an API version not spoken.
pub fn request_path(raw_path: &str) -> Result<String, String> {
    let path = strip_version(raw_path)?;
    Ok(percent_encoding::percent_decode_str(path)
        .decode_utf8_lossy()
        .into_owned())
}

/// Dispatches one request. Image names contain `/`, so paths are matched by hand.
async fn route(ctx: Arc<Context>, req: Request<hyper::body::Incoming>) -> Reply {
    let method = req.method().clone();
    let raw_path = req.uri().path().to_owned();
    let query = Query::parse(req.uri().query());
    let decoded = match request_path(&raw_path) {
        Ok(p) => p,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg),
    };
    let path = decoded.as_str();
    match (&method, path) {
        (&Method::GET | &Method::HEAD, "/_ping") => system::ping(&method),
        (&Method::GET, "/version") => system::version(),
        (&Method::GET, "/info") => system::info(&ctx),
        (&Method::GET, "/images/json") => images::list(&ctx),
        (&Method::POST, "/images/create") => images::pull(&ctx, &query).await,
        (&Method::POST, "/build") => images::build(&ctx, &query, req.into_body()).await,
        (&Method::POST, "/containers/create") => container_api::create(&ctx, &query, req).await,
        (&Method::GET, "/containers/json") => container_api::list(&ctx, &query),
        (m, p) if p.starts_with("/images/") => {
            let rest = &p["/images/".len()..];
            if let (&Method::GET, Some(name)) = (m, rest.strip_suffix("/json")) {
                images::inspect(&ctx, name)
            } else if let (&Method::POST, Some(name)) = (m, rest.strip_suffix("/tag")) {
                images::tag(&ctx, name, &query)
            } else if m == Method::DELETE {
                images::remove(&ctx, rest, &query)
            } else {
                not_found_route(&method)
            }
        }
        (m, p) if p.starts_with("/containers/") => {
            let rest = &p["/containers/".len()..];
            let (key, action) = rest.split_once('/').unwrap_or((rest, ""));
            let key = key.to_owned();
            match (m, action) {
                (&Method::GET, "json") => container_api::inspect(&ctx, &key),
                (&Method::POST, "start") => container_api::start(ctx.clone(), &key).await,
                (&Method::POST, "stop") => container_api::stop(&ctx, &key, &query).await,
                (&Method::POST, "restart") => {
                    container_api::restart(ctx.clone(), &key, &query).await
                }
                (&Method::POST, "kill") => container_api::kill(&ctx, &key, &query),
                (&Method::POST, "wait") => container_api::wait(&ctx, &key, &query),
                (&Method::GET, "logs") => container_api::logs(&ctx, &key, &query),
                (&Method::POST, "attach") => container_api::attach(&ctx, &key, &query, req),
                (&Method::POST, "resize") => {
                    let Some(c) = containers::lock(&ctx.containers).find(&key) else {
                        return container_api::no_such(&key);
                    };
                    resize(&c.pty, &query, StatusCode::OK)
                }
                (&Method::DELETE, "") => container_api::delete(ctx.clone(), &key, &query).await,
                (&Method::POST, "exec") => {
                    let Some(c) = containers::lock(&ctx.containers).find(&key) else {
                        return container_api::no_such(&key);
                    };
                    let body: serde_json::Value =
                        match http::read_body(req.into_body(), &ctx.limits).await {
                            Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
                            Err(r) => return *r,
                        };
                    exec::create(&ctx, c, &body)
                }
                (&Method::GET | &Method::HEAD | &Method::PUT, "archive") => {
                    let Some(c) = containers::lock(&ctx.containers).find(&key) else {
                        return container_api::no_such(&key);
                    };
                    if m == Method::PUT {
                        archive::put(ctx.clone(), c, &query, req).await
                    } else {
                        archive::get(ctx.clone(), c, &query, m).await
                    }
                }
                _ => not_found_route(&method),
            }
        }
        (m, p) if p.starts_with("/exec/") => {
            let rest = &p["/exec/".len()..];
            let (id, action) = rest.split_once('/').unwrap_or((rest, ""));
            let id = id.to_owned();
            match (m, action) {
                (&Method::POST, "start") => exec::start(ctx.clone(), &id, req).await,
                (&Method::GET, "json") => exec::inspect(&ctx, &id),
                (&Method::POST, "resize") => {
                    let Some(e) = containers::lock(&ctx.execs).get(&id).cloned() else {
                        return error(
                            StatusCode::NOT_FOUND,
                            &format!("No such exec instance: {id}"),
                        );
                    };
                    resize(&e.pty, &query, StatusCode::CREATED)
                }
                _ => not_found_route(&method),
            }
        }
        _ => not_found_route(&method),
    }
}

/// `POST /containers/{id}/resize`, `POST /exec/{id}/resize`: `h` rows, `w` columns.
fn resize(pty: &pty::Pty, query: &Query, ok: StatusCode) -> Reply {
    match pty::query_size(query) {
        Ok((h, w)) => match pty.resize(h, w) {
            Ok(()) => http::empty(ok),
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("resizing the tty: {e}"),
            ),
        },
        Err(msg) => error(StatusCode::BAD_REQUEST, &msg),
    }
}

/// `AGENTRUN_DOCKER_TRACE=1`: log every request (its answer and time) and the end of streams
/// on stderr, each line stamped with CLOCK_MONOTONIC (seconds, as `perf record -k mono`).
pub fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var("AGENTRUN_DOCKER_TRACE").as_deref() == Ok("1"))
}

/// Writes one trace line (see [`trace`]); use the [`trace!`] macro.
pub fn trace_line(args: std::fmt::Arguments<'_>) {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the time into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    let now = t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9;
    eprintln!("agentrun: docker API: [{now:.6}] {args}");
}

/// Logs a line when `AGENTRUN_DOCKER_TRACE=1` (see [`trace`]).
#[macro_export]
macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::trace() {
            $crate::trace_line(format_args!($($arg)*));
        }
    };
}

fn not_found_route(method: &Method) -> Reply {
    if method == Method::HEAD {
        return http::empty(StatusCode::NOT_FOUND);
    }
    error(StatusCode::NOT_FOUND, "page not found")
}
