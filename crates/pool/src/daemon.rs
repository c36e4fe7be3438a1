//! `agentrun serve`: the daemon. One process: the factory is forked first (while single-
//! threaded), then a thread refills the pool, the main thread accepts clients on the control
//! socket and waits for SIGTERM/SIGINT, and each client gets a thread for its run.
//!
//! Shutdown (SIGTERM/SIGINT): stop accepting, remove the socket, wait up to `drain` for running
//! runs, destroy the pool, end the factory (which destroys anything left). After SIGKILL the
//! next start collects the leftovers with [`agentrun_runtime::gc`].

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrun_runtime::cellrun::{cell_request, CellRun, MappingCache, RunMounts};
use agentrun_runtime::cgroup::CgroupMode;
use agentrun_runtime::control::{self, CellCommand, CellRequest, CellWork};
use agentrun_runtime::{RunOutcome, RuntimePaths};
use agentrun_telemetry::{Ending, FrontEnd, RunFinish, Sinks};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{
    accept4, bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
};

use crate::factory::{apply_limits, RunLimits};
use crate::factory::{FactoryClient, FactoryPaths, PooledShell};
use crate::live::LiveManager;
use crate::pool::{Pool, PoolLimits};
use crate::protocol::{ClientMessage, DaemonReply, ExecReply};
use crate::recipe::ExecRequest;
use crate::run::Verdict;
use crate::PoolError;

/// Daemon settings.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub socket: PathBuf,
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub limits: PoolLimits,
    /// Factory processes (parallel sandbox creation).
    pub factories: usize,
    /// How long SIGTERM waits for running runs before killing them.
    pub drain: Duration,
}

/// The default socket path under a state dir.
pub fn default_socket(state_dir: &Path) -> PathBuf {
    state_dir.join("agentrun.sock")
}

struct Shared {
    pool: Arc<Pool>,
    /// Root, or an ordinary user (rootless sandboxes): detected once, at start.
    privilege: agentrun_runtime::Privilege,
    cgroup: Option<CgroupMode>,
    swap_limit: bool,
    landlock_abi: u32,
    /// The image store the factories serve (canonical when it could be resolved).
    store: PathBuf,
    /// Mapping namespaces of the runs' idmapped mounts (each costs a fork: made once).
    mappings: Mutex<MappingCache>,
    /// Where the shells' state is (their init logs hold their zygotes' reports).
    paths: RuntimePaths,
    /// The long-lived sandboxes (for `top` and `kill`); gone once the daemon stops.
    live: std::sync::Weak<LiveManager>,
}

/// A service the daemon runs beside its socket on the same pool (the OpenSandbox HTTP API,
/// ...). It is started once the factories exist and may then use threads freely.
pub trait Frontend: Send {
    /// Starts serving (binding its listener before returning, so that a bad address fails
    /// the daemon's start).
    fn start(
        self: Box<Self>,
        live: Arc<LiveManager>,
    ) -> Result<Box<dyn RunningFrontend>, PoolError>;
}

/// A started [`Frontend`].
pub trait RunningFrontend: Send {
    /// Stops serving; returns when it has.
    fn stop(self: Box<Self>);
}

/// A [`RunningFrontend`] serving on a thread of its own: stopping it asks the thread to end
/// (its `stop`) and joins it.
pub struct ServingThread {
    stop: Option<Box<dyn FnOnce() + Send>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServingThread {
    /// Thread `name` running `serve`; `stop` asks `serve` to return.
    pub fn spawn(
        name: &str,
        serve: impl FnOnce() + Send + 'static,
        stop: impl FnOnce() + Send + 'static,
    ) -> Result<Box<dyn RunningFrontend>, PoolError> {
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(serve)
            .map_err(|e| PoolError::Io("spawn thread", e))?;
        Ok(Box::new(ServingThread {
            stop: Some(Box::new(stop)),
            thread: Some(thread),
        }))
    }

    /// [`Self::spawn`] for a `serve` that ends when its [`Stopped`] resolves.
    pub fn spawn_stoppable(
        name: &str,
        serve: impl FnOnce(Stopped) + Send + 'static,
    ) -> Result<Box<dyn RunningFrontend>, PoolError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stop = move || {
            // Err: the server already stopped.
            let _ = tx.send(());
        };
        Self::spawn(name, move || serve(Stopped(rx)), stop)
    }
}

/// What a front end served by [`ServingThread::spawn_stoppable`] waits on: asked to stop.
pub struct Stopped(tokio::sync::oneshot::Receiver<()>);

impl Stopped {
    /// Resolves once the front end is asked to stop, or its handle is dropped.
    pub async fn wait(self) {
        // Err: the handle was dropped: stop as well.
        let _ = self.0.await;
    }
}

impl RunningFrontend for ServingThread {
    fn stop(mut self: Box<Self>) {
        if let Some(stop) = self.stop.take() {
            stop();
        }
        if let Some(t) = self.thread.take() {
            // A panic of the server thread was logged by the panic hook.
            let _ = t.join();
        }
    }
}

/// The TCP listener of a front end's `flag` (`--listen`, `--mcp`, `--metrics`) on `addr`:
/// bound now (a bad address fails the daemon's start), on the front end's `runtime`.
pub fn tcp_listener(
    flag: &str,
    addr: std::net::SocketAddr,
    runtime: &tokio::runtime::Runtime,
) -> Result<tokio::net::TcpListener, PoolError> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| PoolError::Invalid(format!("{flag} {addr}: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| PoolError::Io("listen", e))?;
    let _on = runtime.enter();
    tokio::net::TcpListener::from_std(listener).map_err(|e| PoolError::Io("listen", e))
}

/// A front end's multi-threaded tokio runtime: `workers` threads named `name`.
pub fn frontend_runtime(name: &str, workers: usize) -> Result<tokio::runtime::Runtime, PoolError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| PoolError::Io("tokio runtime", e))
}

/// Runs the daemon until SIGTERM/SIGINT. Must be called while single-threaded.
pub fn run(opts: &DaemonOptions, frontends: Vec<Box<dyn Frontend>>) -> Result<(), PoolError> {
    // One daemon per state dir, for its whole life (a daemon that is still shutting down has
    // removed its socket but not yet its sandboxes).
    let _lock = lock_state_dir(&opts.state_dir)?;
    // A socket a service manager bound for us (socket activation): it owns the socket file,
    // and connecting to it would reach our own queue.
    let activated = crate::activation::take_listener()?;
    let socket_activated = activated.is_some();
    if !socket_activated && crate::client::DaemonClient::connect(&opts.socket).is_some() {
        return Err(PoolError::Invalid(format!(
            "a daemon already serves {}",
            opts.socket.display()
        )));
    }
    let paths = RuntimePaths::new(&opts.state_dir);
    // What a killed daemon left behind goes first.
    let report = agentrun_runtime::gc::collect(&paths);
    if !report.removed.is_empty() {
        tracing::info!(
            target: "agentrun::pool",
            "removed {} leftover sandbox(es)",
            report.removed.len()
        );
    }
    // Signals are taken synchronously; blocking them before any thread or the factory starts
    // makes all of them inherit the mask. The factory thus never dies of a SIGTERM meant for
    // the daemon (e.g. `pkill`, or a service manager signalling the whole cgroup): it ends
    // when the daemon closes its channel, after destroying what it made.
    let mut mask = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        mask.add(s);
    }
    mask.thread_block()
        .map_err(|e| PoolError::Sys("sigprocmask", e))?;
    let factories = (0..opts.factories.max(1))
        .map(|_| {
            FactoryClient::spawn(FactoryPaths {
                root: opts.root.clone(),
                state_dir: opts.state_dir.clone(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC)
        .map_err(|e| PoolError::Sys("signalfd", e))?;

    let listener = match activated {
        Some(fd) => fd,
        None => listen_on(&opts.socket)?,
    };
    let privilege = agentrun_runtime::Privilege::detect();
    let cgroup = CgroupMode::for_sandboxes(&privilege);
    let pool = Arc::new(Pool::new(factories, opts.limits.clone()));
    let live =
        Arc::new(LiveManager::new(pool.clone()).with_frozen_dir(opts.state_dir.join("frozen")));
    let shared = Arc::new(Shared {
        pool,
        privilege,
        cgroup,
        swap_limit: cgroup.is_some_and(|c| c.swap_limit_supported()),
        landlock_abi: agentrun_runtime::landlock::abi(),
        store: std::fs::canonicalize(&opts.root).unwrap_or_else(|_| opts.root.clone()),
        mappings: Mutex::new(MappingCache::new()),
        paths: paths.clone(),
        live: Arc::downgrade(&live),
    });
    let mut running_frontends = Vec::new();
    for f in frontends {
        match f.start(live.clone()) {
            Ok(r) => running_frontends.push(r),
            Err(e) => {
                for r in running_frontends {
                    r.stop();
                }
                shared.pool.shutdown(Duration::ZERO);
                return Err(e);
            }
        }
    }
    let refills = (0..shared.pool.factory_count())
        .map(|n| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name("pool-refill".into())
                .spawn(move || s.pool.refill_loop(n))
                .map_err(|e| PoolError::Io("spawn thread", e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pools: Vec<String> = opts
        .limits
        .pools
        .iter()
        .map(|p| format!("{}:{}={}", p.image, p.profile, p.target))
        .collect();
    tracing::info!(
        target: "agentrun::pool",
        "serving on {}{} (pools {}; at most {} sandboxes)",
        opts.socket.display(),
        if socket_activated { " (socket-activated)" } else { "" },
        if pools.is_empty() {
            "none".into()
        } else {
            pools.join(", ")
        },
        opts.limits.max_sandboxes
    );
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(PoolError::Sys("poll", e)),
        }
        let sig = fds[1].revents().is_some_and(|r| !r.is_empty());
        let conn = fds[0].revents().is_some_and(|r| !r.is_empty());
        if sig {
            // The signal is why the daemon stops; which one it was does not matter.
            let _ = signals.read_signal();
            break;
        }
        if conn {
            match accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
                Ok(fd) => {
                    // SAFETY: accept4 returned a new fd that we own.
                    let conn = unsafe { OwnedFd::from_raw_fd(fd) };
                    let s = shared.clone();
                    let spawned = std::thread::Builder::new()
                        .name("client".into())
                        .spawn(move || serve_client(&s, conn));
                    if let Err(e) = spawned {
                        // The connection is dropped: the client sees it closed.
                        tracing::warn!(target: "agentrun::pool", "a client's thread: {e}");
                    }
                }
                Err(nix::Error::EINTR) | Err(nix::Error::ECONNABORTED) => {}
                Err(e) => tracing::warn!(target: "agentrun::pool", "accept: {e}"),
            }
        }
    }
    tracing::info!(target: "agentrun::pool", "shutting down");
    drop(listener);
    if !socket_activated {
        // Gone already, or replaced by the next start (a stale socket is removed then).
        let _ = std::fs::remove_file(&opts.socket);
    }
    for r in running_frontends {
        r.stop();
    }
    live.shutdown();
    drop(live);
    shared.pool.shutdown(opts.drain);
    for r in refills {
        let _ = r.join();
    }
    // Client threads still holding `shared` only finish replies; the factory ends with us.
    match Arc::try_unwrap(shared).map(|s| Arc::try_unwrap(s.pool)) {
        Ok(Ok(pool)) => FactoryClient::shutdown_all(pool.into_factories()),
        _ => {
            // A client thread is still finishing: give it a moment, then go (the factory
            // sees EOF when this process exits and destroys what is left).
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// Takes `<state dir>/daemon.lock` (flock), or says who has it.
fn lock_state_dir(state_dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, PoolError> {
    std::fs::create_dir_all(state_dir).map_err(|e| PoolError::Io("create state dir", e))?;
    let path = state_dir.join("daemon.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| PoolError::Io("open daemon.lock", e))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
        PoolError::Invalid(format!(
            "another agentrun serve is running on state dir {}",
            state_dir.display()
        ))
    })
}

fn listen_on(path: &Path) -> Result<OwnedFd, PoolError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| PoolError::Io("create socket dir", e))?;
    }
    // A stale socket of a dead daemon (we checked that nobody answers).
    let _ = std::fs::remove_file(path);
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| PoolError::Sys("socket", e))?;
    let addr = UnixAddr::new(path).map_err(|e| PoolError::Sys("socket path", e))?;
    // Root-only from the first moment: umask while binding, chmod to be sure.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = bind(fd.as_raw_fd(), &addr);
    nix::sys::stat::umask(old);
    bound.map_err(|e| PoolError::Sys("bind", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| PoolError::Io("chmod socket", e))?;
    listen(&fd, Backlog::new(128).unwrap_or(Backlog::MAXCONN))
        .map_err(|e| PoolError::Sys("listen", e))?;
    Ok(fd)
}

fn reply(conn: BorrowedFd<'_>, r: &DaemonReply) {
    // A client that hung up gets no answer; its request is over either way.
    let _ = control::send_json(conn, r, &[]);
}

fn serve_client(shared: &Shared, conn: OwnedFd) {
    let msg = match control::recv_json::<ClientMessage>(conn.as_fd()) {
        Ok(Some(m)) => m,
        Ok(None) => return,
        Err(e) => {
            reply(
                conn.as_fd(),
                &DaemonReply::Error {
                    message: e.to_string(),
                },
            );
            return;
        }
    };
    match msg {
        (
            ClientMessage::Exec {
                request,
                timeout_ms,
                store,
            },
            fds,
        ) => match store.filter(|s| !same_store(s, &shared.store)) {
            Some(_) => reply(
                conn.as_fd(),
                &DaemonReply::OtherStore {
                    store: shared.store.clone(),
                },
            ),
            None => run_in_pooled_shell(shared, conn.as_fd(), *request, timeout_ms, fds),
        },
        (ClientMessage::Ps, _) => reply(
            conn.as_fd(),
            &DaemonReply::Ps {
                sandboxes: shared.pool.sandboxes(),
            },
        ),
        (ClientMessage::PoolStatus, _) => {
            let mut status = shared.pool.status();
            for (i, info) in status.pools.iter_mut().enumerate() {
                let has_zygote =
                    agentrun_policy::Profile::load(&info.profile).is_ok_and(|p| p.python.zygote);
                if !has_zygote {
                    continue;
                }
                // One of its ready shells' (not running: none ready, or it could not start).
                info.zygote = Some(shared.pool.ready_shell(i).map_or_else(
                    Default::default,
                    |(id, init)| {
                        let log = shared.paths.sandboxes().join(id).join("init.log");
                        agentrun_runtime::zygote::status(init, &log)
                    },
                ));
            }
            reply(conn.as_fd(), &DaemonReply::PoolStatus(status))
        }
        (ClientMessage::Denials { rules }, _) => {
            // A CLI run's denials, reported by its client (see `RunFinish::write`).
            agentrun_telemetry::RunCounter::denials(crate::metrics::global(), &rules);
            reply(conn.as_fd(), &DaemonReply::Ok)
        }
        (ClientMessage::Top, _) => match shared.live.upgrade() {
            Some(live) => reply(
                conn.as_fd(),
                &DaemonReply::Top(Box::new(crate::observe::snapshot(&live))),
            ),
            None => reply(conn.as_fd(), &shutting_down()),
        },
        (ClientMessage::Kill { id }, _) => match shared.live.upgrade() {
            Some(live) => match crate::observe::kill(&live, &id) {
                Ok(()) => {
                    tracing::info!(target: "agentrun::pool", "killed {id} on request");
                    reply(conn.as_fd(), &DaemonReply::Ok)
                }
                Err(e) => reply(
                    conn.as_fd(),
                    &DaemonReply::Error {
                        message: e.to_string(),
                    },
                ),
            },
            None => reply(conn.as_fd(), &shutting_down()),
        },
        (
            ClientMessage::Snapshot {
                sandbox,
                name,
                max_bytes,
            },
            _,
        ) => match shared.live.upgrade() {
            Some(live) => {
                let answer = snapshot_of(&live, &shared.store, &sandbox, name, max_bytes);
                match answer {
                    Ok(s) => reply(conn.as_fd(), &DaemonReply::Snapshot(Box::new(s))),
                    Err(e) => reply(
                        conn.as_fd(),
                        &DaemonReply::Error {
                            message: e.to_string(),
                        },
                    ),
                }
            }
            None => reply(conn.as_fd(), &shutting_down()),
        },
        (ClientMessage::Signal { .. } | ClientMessage::EgressReady, _) => reply(
            conn.as_fd(),
            &DaemonReply::Error {
                message: "no run to signal".into(),
            },
        ),
    }
}

fn shutting_down() -> DaemonReply {
    DaemonReply::Error {
        message: "the daemon is shutting down".into(),
    }
}

/// `agentrun snapshot create`: a snapshot of live sandbox `id` (owner: none, the local
/// root's), with its span and audit record.
fn snapshot_of(
    live: &LiveManager,
    store: &Path,
    id: &str,
    name: Option<String>,
    max_bytes: Option<u64>,
) -> Result<agentrun_image::Snapshot, PoolError> {
    let sandbox = live
        .get(id)
        .ok_or_else(|| PoolError::NotFound(id.to_owned()))?;
    let store = agentrun_image::ImageStore::open(store)?;
    let meta = agentrun_image::SnapshotMeta {
        id: format!(
            "snap-{}",
            agentrun_runtime::random::hex(16).map_err(|e| PoolError::Runtime(e.into()))?
        ),
        sandbox_id: id.to_owned(),
        name,
        owner: String::new(),
        entrypoint: None,
        max_bytes,
    };
    let start = std::time::Instant::now();
    let taken = crate::snapshot::take(&sandbox, &store, &meta);
    let err = taken.as_ref().err().map(|e| e.to_string());
    let span = crate::snapshot::report(
        crate::snapshot::SNAPSHOT_SPAN,
        None,
        &crate::snapshot::Report {
            sandbox_id: id,
            snapshot_id: &meta.id,
            image: sandbox.image(),
            bytes: taken.as_ref().map_or(0, |t| t.made.size),
            duration: start.elapsed(),
            frozen: taken.as_ref().ok().map(|t| t.frozen),
            error: err.as_deref().map(|m| ("snapshot_capture_failed", m)),
            traceparent: None,
            profile: sandbox.profile(),
        },
    );
    span.finish_detached("snapshot-span");
    Ok(taken?.made)
}

/// Whether a client's store path names the daemon's (canonical) store.
fn same_store(client: &Path, ours: &Path) -> bool {
    client == ours || std::fs::canonicalize(client).is_ok_and(|c| c == ours)
}

/// Serves a client's `Exec` message: runs its request in a fresh cell of a pooled shell and
/// replies with how it ended. The shell goes back to the pool in one place, whatever
/// happened ([`ShellRun::serve`] says with which verdict).
fn run_in_pooled_shell(
    shared: &Shared,
    conn: BorrowedFd<'_>,
    request: ExecRequest,
    timeout_ms: Option<u64>,
    stdio: Vec<OwnedFd>,
) {
    let started = std::time::Instant::now();
    let fail = |message: String| {
        count(
            &RunFinish::failed(FrontEnd::Daemon, "sandbox", message.as_str())
                .duration(started.elapsed()),
        );
        reply(
            conn,
            &DaemonReply::Exec(ExecReply {
                exit_code: agentrun_runtime::exit::EXIT_SETUP_FAILED,
                error: Some(message),
                ..Default::default()
            }),
        )
    };
    if stdio.len() != 3 {
        return fail("exec needs stdin, stdout and stderr".into());
    }
    let profile = match request.recipe.profile() {
        Ok(p) => p,
        Err(e) => return fail(e.to_string()),
    };
    let (mut shell, hit) = match shared.pool.acquire(&request.recipe) {
        Ok(s) => s,
        Err(e) => return fail(format!("creating sandbox: {e}")),
    };
    let mut out = ExecReply {
        sandbox_id: shell.id.clone(),
        pool_hit: hit,
        shell_runs: shell.runs,
        init_pid: shell.init_pid,
        enforcement: shell.enforcement.clone(),
        memory_limit_bytes: profile.resources.memory_bytes,
        ..Default::default()
    };
    let run = ShellRun {
        shared,
        conn,
        profile: &profile,
        request: &request,
        timeout_ms,
    };
    let verdict = match run.serve(&mut shell, &mut out, stdio) {
        Ok(verdict) => verdict,
        Err(NotRun { message, verdict }) => {
            count(
                &RunFinish::failed(FrontEnd::Daemon, "sandbox", message.as_str())
                    .duration(started.elapsed()),
            );
            out.exit_code = agentrun_runtime::exit::EXIT_SETUP_FAILED;
            out.error = Some(message);
            reply(conn, &DaemonReply::Exec(out));
            verdict
        }
    };
    shared.pool.release(shell, verdict);
}

/// A run that did not get to its end in its shell: what the client is told, and what becomes
/// of the shell.
struct NotRun {
    message: String,
    verdict: Verdict,
}

impl NotRun {
    /// The shell is as it was: it serves the next run.
    fn reuse(message: impl Into<String>) -> Self {
        NotRun {
            message: message.into(),
            verdict: Verdict::Reuse,
        }
    }

    /// The shell is not fit for another run (`why`).
    fn discard(message: impl Into<String>, why: &'static str) -> Self {
        NotRun {
            message: message.into(),
            verdict: Verdict::Discard(why),
        }
    }
}

/// One client's run in an acquired shell.
struct ShellRun<'a> {
    shared: &'a Shared,
    conn: BorrowedFd<'a>,
    profile: &'a agentrun_policy::Profile,
    request: &'a ExecRequest,
    timeout_ms: Option<u64>,
}

impl ShellRun<'_> {
    /// Runs the request in a fresh cell of `shell` ([`Self::prepare`], then
    /// [`Self::run_cell`]). Returns how the shell goes back.
    fn serve(
        &self,
        shell: &mut PooledShell,
        out: &mut ExecReply,
        stdio: Vec<OwnedFd>,
    ) -> Result<Verdict, NotRun> {
        let (cell_req, mounts, timeout) = self.prepare(shell, out)?;
        self.run_cell(shell, out, stdio, cell_req, mounts, timeout)
    }

    /// Before anything of the run: its egress proxy (the client's), its limits and its
    /// mounts (a failure there leaves the shell as it was, unless its limits could not be
    /// set); then the cell's request and the run's time limit.
    fn prepare(
        &self,
        shell: &mut PooledShell,
        out: &mut ExecReply,
    ) -> Result<(CellRequest, RunMounts, Option<Duration>), NotRun> {
        let (shared, profile, request) = (self.shared, self.profile, self.request);
        // The client says on which port its command expects the proxy (HTTP_PROXY).
        let egress_port = match (profile.network.needs_proxy(), request.recipe.egress_port) {
            (true, Some(port)) => Some(port),
            (true, None) => {
                return Err(NotRun::reuse(
                    "the run's network policy needs an egress port",
                ))
            }
            (false, _) => None,
        };
        if egress_port.is_some() {
            egress_handshake(self.conn, shell).map_err(|e| NotRun::reuse(e.to_string()))?;
        }
        apply_limits(
            shell,
            RunLimits::of(profile),
            shared.cgroup,
            shared.swap_limit,
        )
        .map_err(|e| NotRun::discard(format!("setting the run's limits: {e}"), "init_error"))?;
        let user_mounts = request.recipe.user_mounts();
        let mounts = {
            let mut cache = crate::lock(&shared.mappings);
            let userns = shell.userns.as_ref().map(|f| f.as_fd());
            RunMounts::prepare_for(&user_mounts, &mut cache, &shared.privilege, userns)
        }
        .map_err(|e| NotRun::reuse(e.to_string()))?;
        out.enforcement.idmapped_mounts &= mounts.idmapped;
        let mut cell_req = cell_request(
            profile,
            shared.landlock_abi,
            &user_mounts,
            &mounts,
            egress_port,
            CellWork::Run(CellCommand {
                argv: request.args.clone(),
                env: request.environment(profile, &shell.image),
                cwd: request.working_dir(&shell.image),
                zygote: profile.python.zygote,
            }),
        );
        let timeout = self
            .timeout_ms
            .map(Duration::from_millis)
            .or(profile.resources.timeout);
        if shared.cgroup.is_none() {
            // No cgroup enforces the profile's limits (rootless): rlimits on the command.
            *cell_req.rlimits = agentrun_runtime::limits::RlimitFallback::for_resources(
                &profile.resources,
                timeout,
            );
            out.enforcement.limits =
                agentrun_runtime::limits::describe(None, &cell_req.rlimits, None);
        }
        Ok((cell_req, mounts, timeout))
    }

    /// The run itself: the cell started, waited for (at most `timeout`) and its end counted
    /// and replied; once the client hung up, the cell let go.
    fn run_cell(
        &self,
        shell: &mut PooledShell,
        out: &mut ExecReply,
        stdio: Vec<OwnedFd>,
        cell_req: CellRequest,
        mounts: RunMounts,
        timeout: Option<Duration>,
    ) -> Result<Verdict, NotRun> {
        let (shared, request) = (self.shared, self.request);
        let meter = shared.cgroup.map(|cg| cg.meter(&shell.id));
        let on_board = crate::board::board()
            .register(
                &shell.id,
                &request.recipe.image,
                &request.recipe.profile,
                &request.args,
            )
            .map_err(|e| NotRun::reuse(e.to_string()))?;
        let raw: Vec<i32> = stdio.iter().map(|f| f.as_raw_fd()).collect();
        let mut cell = CellRun::start(shell.control.as_fd(), &cell_req, &raw, mounts)
            .map_err(|e| NotRun::discard(e.to_string(), "cell_failed"))?;
        // The client's stdio must not stay open here: it would hold the client's pipes open.
        drop(stdio);
        out.init_pid = cell.pid;
        let result = crate::run::wait(&cell, timeout, self.conn, meter, &on_board);
        drop(on_board);
        let r = match result {
            Ok(r) => r,
            Err(e) => {
                cell.kill();
                return Err(NotRun::discard(
                    format!("running sandbox: {e}"),
                    "init_error",
                ));
            }
        };
        let outcome = RunOutcome::of_cell(r.init.clone(), r.timed_out, r.stats, r.duration);
        out.record(&outcome);
        if let Some(init) = &r.init {
            out.zygote = init.zygote;
            out.zygote_fallback = init.zygote_fallback.clone();
            out.zygote_ahead = init.zygote_ahead;
            if init.zygote_not_started {
                // A Python run the zygote could have taken: the shell starts it now.
                shell.start_zygote = true;
            }
        }
        shell.zygote_ahead = out.zygote == Some(true);
        let explained = r.timed_out || outcome.oom_killed || r.client_gone || r.killed;
        if r.init.is_none() && !explained {
            out.error = Some("the sandbox's cell died before reporting".into());
        }
        if r.killed && r.init.is_none() {
            // Killed on an operator's request: as a SIGKILL would end the command.
            out.exit_code = 128 + libc::SIGKILL;
            out.signal = Some(libc::SIGKILL);
        }
        count(&finish_of(out, r.duration));
        if !r.client_gone {
            reply(self.conn, &DaemonReply::Exec(out.clone()));
        }
        // The cell waits for us to let go before it ends (and its teardown starts): after
        // the client's own end, which comes right after our reply (see await_hangup).
        await_hangup(self.conn, CLIENT_EXIT_WAIT);
        shared.pool.recycling(shell);
        cell.let_go();
        Ok(crate::run::verdict(shell, cell.cell, &r, shared.cgroup))
    }
}

/// Counts a run of the daemon's (`agentrun_runs_total{outcome}`, the duration histogram):
/// its client writes the rest of the run's end (span, audit record).
fn count(finish: &RunFinish) {
    let _audit_not_asked_for = finish.write(Sinks {
        counter: Some(crate::metrics::global()),
        ..Default::default()
    });
}

/// How a run that went to its end ends, as the daemon counts it.
fn finish_of(out: &ExecReply, duration: Duration) -> RunFinish {
    let ending = if out.timed_out {
        Ending::TimedOut
    } else if out.oom_killed {
        Ending::OutOfMemory
    } else if let Some(e) = out.error.as_ref().or(out.cell_error.as_ref()) {
        Ending::Failed {
            kind: "sandbox".into(),
            message: e.clone(),
        }
    } else {
        Ending::Exited
    };
    let mut f = RunFinish::new(FrontEnd::Daemon, ending)
        .exit(out.exit_code)
        .duration(duration)
        .sandbox(&out.sandbox_id);
    f.signal = out.signal;
    f
}

/// Tells the client where to serve the run's egress proxy and waits until it does.
/// Why a run's egress proxy was not started by its client (the shell serves the next run).
#[derive(Debug, thiserror::Error)]
enum EgressHandshakeError {
    #[error("the shell has no egress socket")]
    NoSocket,
    #[error("the client did not start the egress proxy")]
    NotStarted,
}

fn egress_handshake(conn: BorrowedFd<'_>, shell: &PooledShell) -> Result<(), EgressHandshakeError> {
    let socket = shell
        .egress_socket
        .clone()
        .ok_or(EgressHandshakeError::NoSocket)?;
    let reply = DaemonReply::Egress {
        socket,
        sandbox_id: shell.id.clone(),
    };
    // A failed send shows as a client that does not answer, below.
    let _ = control::send_json(conn, &reply, &[]);
    if !control::wait_readable(conn, Some(EGRESS_WAIT)).unwrap_or(false) {
        return Err(EgressHandshakeError::NotStarted);
    }
    match control::recv_json::<ClientMessage>(conn) {
        Ok(Some((ClientMessage::EgressReady, _))) => Ok(()),
        _ => Err(EgressHandshakeError::NotStarted),
    }
}

/// How long the client may take to start a run's egress proxy.
const EGRESS_WAIT: Duration = Duration::from_secs(10);

/// How long a cell's teardown waits for its client to hang up after the reply: a backstop
/// for a client that does not hang up; ours never waits on the cell after the reply (capped
/// output is read up to what is in the pipes, not to their EOF, which comes with teardown).
const CLIENT_EXIT_WAIT: Duration = Duration::from_millis(50);

/// Waits (bounded) until the client closed its connection or sent something. The client's
/// own end of a run (its audit record, its exit) comes right after our reply; the cell's
/// teardown is kernel work this kind of host does not preempt (PREEMPT_NONE), so it starts
/// once the client is gone instead of delaying it. A client must not wait for anything of
/// the cell's teardown before it hangs up: each would wait for the other until the limit.
fn await_hangup(conn: BorrowedFd<'_>, limit: Duration) {
    let mut fds = [PollFd::new(conn, PollFlags::POLLIN)];
    let ms = u16::try_from(limit.as_millis()).unwrap_or(u16::MAX);
    // A bounded wait: an error (EINTR) only starts the teardown sooner.
    let _ = poll(&mut fds, PollTimeout::from(ms));
}
