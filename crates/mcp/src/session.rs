//! The sandbox of an MCP session.
//!
//! A [`Session`] is one MCP session's state: its sandbox ([`SessionSandbox`]), made on the
//! first call that needs one, kept between calls (files, the Python context), torn down when
//! the session ends (the handler is dropped), when it has been idle for
//! [`crate::McpOptions::idle_timeout`] (the next call makes a new one and says so), or, with
//! `--one-shot`, after every call (each call then has a sandbox of its own).
//!
//! A sandbox whose profile lets it reach hosts has its own egress proxy on the host, deciding
//! every connection by the profile (with `--allow-host`): each decision is a `policy.check`
//! span in the trace of the call being served and an audit record, and a denial is also
//! handed to that call's result ([`RunWatch`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrun_egress::{DecisionSink, Proxy};
use agentrun_policy::{Action, Approvals, Decision, Profile};
use agentrun_pool::live::{LiveManager, LiveSandbox, LiveSpec};
use agentrun_pool::lock;
use agentrun_pool::python::PythonContext;
use agentrun_telemetry::decision::POLICY_CHECK;
use agentrun_telemetry::{trace_id_of, AuditLog, DecisionScope, RunSpan};

use crate::denials::Denial;
use crate::escalation::{McpApprover, PeerSlot};
use crate::McpOptions;

/// What every session of a server shares.
pub struct Shared {
    pub live: Arc<LiveManager>,
    pub options: McpOptions,
    /// The profile (with `--allow-host`) every decision is made by.
    pub profile: Profile,
    pub audit: AuditLog,
    /// The runtime process output is read on.
    pub output: tokio::runtime::Handle,
    /// Teardowns under way on threads of their own (a session's end, `--one-shot`).
    teardowns: Teardowns,
}

/// Sandbox teardowns running off the async threads, awaited before the server stops (a
/// sandbox's egress proxy must stop before the daemon's shutdown removes its state dir).
#[derive(Default, Clone)]
struct Teardowns(Arc<(Mutex<usize>, std::sync::Condvar)>);

impl Teardowns {
    /// Destroys `sandbox` on a thread of its own.
    fn spawn(&self, sandbox: Arc<SessionSandbox>, live: Arc<LiveManager>) {
        *lock(&self.0 .0) += 1;
        let this = self.clone();
        let done = move || {
            *lock(&this.0 .0) -= 1;
            this.0 .1.notify_all();
        };
        let spawned = std::thread::Builder::new()
            .name("mcp-teardown".into())
            .spawn({
                let (sandbox, live) = (sandbox.clone(), live.clone());
                let done = done.clone();
                move || {
                    sandbox.destroy(&live);
                    done();
                }
            });
        if spawned.is_err() {
            sandbox.destroy(&live);
            done();
        }
    }

    /// Waits up to `timeout` for every teardown to end.
    fn wait(&self, timeout: Duration) {
        let (count, cv) = &*self.0;
        let mut n = lock(count);
        let deadline = Instant::now() + timeout;
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            n = cv
                .wait_timeout(n, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

impl Shared {
    /// A server's shared state; process output is read on `output`. Fails on a profile that
    /// does not load.
    pub fn new(
        live: Arc<LiveManager>,
        options: McpOptions,
        output: tokio::runtime::Handle,
    ) -> Result<Arc<Shared>, agentrun_pool::PoolError> {
        let profile = options.recipe.profile()?;
        Ok(Arc::new(Shared {
            live,
            profile,
            audit: AuditLog::new(&options.audit_dir),
            options,
            output,
            teardowns: Teardowns::default(),
        }))
    }

    /// Waits (up to `timeout`) for the sandboxes of ended sessions to be torn down.
    pub fn wait_for_teardowns(&self, timeout: Duration) {
        self.teardowns.wait(timeout);
    }

    /// The working directory of runs and the base of relative paths.
    pub fn workdir(&self) -> &'static str {
        if self.options.recipe.workspace.is_some() {
            agentrun_policy::WORKSPACE
        } else {
            "/root"
        }
    }

    /// What a tool description says about the sandbox.
    pub fn describe(&self) -> String {
        let persistence = if self.options.one_shot {
            "Every call runs in a fresh sandbox: nothing persists between calls"
        } else {
            "Files and Python variables persist between calls of this session"
        };
        let workspace = match &self.options.recipe.workspace {
            Some(_) if self.profile.filesystem.workspace_writable => {
                "; /workspace is the user's project directory (read-write)"
            }
            Some(_) => "; /workspace is the user's project directory (read-only)",
            None => "",
        };
        let network = match self.profile.network.mode {
            agentrun_policy::NetworkMode::None => "no network access",
            agentrun_policy::NetworkMode::Allowlist => {
                "network only to allowlisted hosts, through HTTP(S)_PROXY"
            }
            _ => "network through HTTP(S)_PROXY",
        };
        format!(
            "{persistence}{workspace}. The sandbox has {network}; the working directory is {}.",
            self.workdir()
        )
    }
}

/// The decisions of the call being served, for its result and its spans.
#[derive(Default)]
pub struct RunWatch {
    /// `traceparent` of the call's `mcp.tool` span.
    trace: Mutex<String>,
    denials: Mutex<Vec<Denial>>,
}

impl RunWatch {
    /// A call starts: its decisions go to the trace of `traceparent`.
    pub fn begin(&self, traceparent: String) {
        *lock(&self.trace) = traceparent;
        lock(&self.denials).clear();
    }

    /// The denials since [`RunWatch::begin`].
    pub fn take(&self) -> Vec<Denial> {
        std::mem::take(&mut *lock(&self.denials))
    }

    pub fn traceparent(&self) -> String {
        lock(&self.trace).clone()
    }
}

/// One sandbox of a session.
pub struct SessionSandbox {
    pub live: Arc<LiveSandbox>,
    /// The persistent interpreter of `run_python` (started on its first call, replaced when
    /// it died or had to be killed).
    pub python: tokio::sync::Mutex<Option<Arc<PythonContext>>>,
    proxy: Mutex<Option<Proxy>>,
    pub watch: Arc<RunWatch>,
    /// bash or sh.
    pub shell: &'static str,
}

/// Deletes a sandbox whose proxy did not start (the call fails with that error; a failed
/// delete is only logged).
fn delete_unstarted(shared: &Shared, id: &str) {
    if let Err(e) = shared.live.delete(id) {
        tracing::warn!(target: "agentrun::mcp", "deleting sandbox {id} after its proxy failed: {e}");
    }
}

/// Why a call got no sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Join(tokio::task::JoinError),
    #[error("cannot make a sandbox: {0}")]
    Create(agentrun_pool::PoolError),
    #[error("cannot start the sandbox's egress proxy: {0}")]
    Interceptor(agentrun_egress::MitmError),
    #[error("cannot start the sandbox's egress proxy: {0}")]
    Trust(std::io::Error),
    #[error("cannot start the sandbox's egress proxy: {0}")]
    Proxy(agentrun_egress::EgressError),
}

impl SessionSandbox {
    /// Makes a sandbox (on a blocking thread: the pool's calls block) and starts its egress
    /// proxy when its profile needs one.
    pub async fn create(
        shared: &Arc<Shared>,
        peer: &PeerSlot,
    ) -> Result<Arc<SessionSandbox>, SandboxError> {
        let (s, peer) = (shared.clone(), peer.clone());
        tokio::task::spawn_blocking(move || Self::create_blocking(&s, peer))
            .await
            .map_err(SandboxError::Join)?
    }

    fn create_blocking(
        shared: &Shared,
        peer: PeerSlot,
    ) -> Result<Arc<SessionSandbox>, SandboxError> {
        let network = &shared.profile.network;
        let recipe = &shared.options.recipe;
        let mut spec = LiveSpec::new(&recipe.image)
            .profile(&recipe.profile)
            .workspace(recipe.workspace.clone());
        // TLS is intercepted for credentials and HTTP rules (a CA per sandbox).
        let intercept = network.needs_proxy()
            && (shared.options.credentials.is_some() || !network.http.is_empty());
        if network.needs_proxy() {
            spec = spec.through_egress_proxy(intercept);
        }
        let live = shared.live.create(&spec).map_err(SandboxError::Create)?;
        let watch = Arc::new(RunWatch::default());
        let proxy = match (network.needs_proxy(), live.egress_socket()) {
            (true, Some(socket)) => {
                let interceptor = if intercept {
                    let made = agentrun_egress::Interceptor::new(
                        live.id(),
                        &shared.options.upstream_roots,
                    )
                    .map_err(SandboxError::Interceptor)
                    .and_then(|i| match socket.parent() {
                        Some(dir) => i.write_trust(dir).map(|()| i).map_err(SandboxError::Trust),
                        None => Ok(i),
                    });
                    match made {
                        Ok(i) => Some(Arc::new(i)),
                        Err(e) => {
                            delete_unstarted(shared, live.id());
                            return Err(e);
                        }
                    }
                } else {
                    None
                };
                let started = agentrun_egress::bind(socket).map(|listener| {
                    let sink = decision_sink(shared, live.id(), watch.clone());
                    let inject_sink = sink.clone();
                    // An escalate rule asks the session's client (approvals last the
                    // sandbox's life).
                    let approver = McpApprover {
                        peer,
                        runtime: shared.output.clone(),
                    };
                    let mut builder = Proxy::builder(network.clone(), sink)
                        .sandbox_id(live.id())
                        .approver(Arc::new(approver))
                        .approval_timeout(shared.options.approval_timeout)
                        .approvals(Arc::new(Approvals::new()));
                    if let Some(i) = interceptor {
                        let vault = shared.options.credentials.clone().unwrap_or_default();
                        builder = builder.intercept(i, vault).injections(Arc::new(
                            move |a, method, path, binding| {
                                let d = agentrun_policy::Decision::allow(
                                    binding,
                                    format!("credential injected: {method} {path}"),
                                );
                                inject_sink(a, &d)
                            },
                        ));
                    }
                    builder.start(listener, socket)
                });
                // The CA in the image's system bundles too, in the sandbox's cell (made
                // before the CA): clients that ignore the trust environment trust it.
                let started = started.and_then(|p| {
                    let dir = socket.parent().unwrap_or(std::path::Path::new("/"));
                    match agentrun_egress::system_trust::install_for_pid(live.init_pid(), dir) {
                        Ok(_) => Ok(p),
                        Err(e) => {
                            p.stop();
                            Err(agentrun_egress::EgressError::Trust(e))
                        }
                    }
                });
                match started {
                    Ok(p) => Some(p),
                    Err(e) => {
                        delete_unstarted(shared, live.id());
                        return Err(SandboxError::Proxy(e));
                    }
                }
            }
            _ => None,
        };
        let shell = agentrun_pool::process::find_shell(&live);
        Ok(Arc::new(SessionSandbox {
            live,
            python: tokio::sync::Mutex::new(None),
            proxy: Mutex::new(proxy),
            watch,
            shell,
        }))
    }

    /// Stops its proxy and deletes it (blocking).
    pub fn destroy(&self, live: &LiveManager) {
        if let Some(p) = lock(&self.proxy).take() {
            p.stop();
        }
        match live.delete(self.live.id()) {
            // Already gone: the daemon's shutdown deleted it first.
            Ok(()) | Err(agentrun_pool::PoolError::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(target: "agentrun::mcp", sandbox = %self.live.id(), "delete: {e}")
            }
        }
    }

    pub fn id(&self) -> &str {
        self.live.id()
    }
}

/// Traces, audits and reports each of the proxy's decisions for sandbox `id`: a
/// `policy.check` span in the trace of the call being served, an audit record (an allow is
/// acted on only once it is on disk), and a denial in the call's result.
fn decision_sink(shared: &Shared, id: &str, watch: Arc<RunWatch>) -> DecisionSink {
    let (id, audit, profile) = (id.to_owned(), shared.audit.clone(), shared.profile.clone());
    Arc::new(move |action: &Action, d: &Decision| {
        let trace = watch.traceparent();
        let trace_id = trace_id_of(&trace);
        let mut span = RunSpan::start(POLICY_CHECK, Some(&trace));
        let scope = DecisionScope {
            profile: &profile.name,
            sandbox_id: Some(&id),
            trace_id: &trace_id,
        };
        let record = scope.decision(&mut span, action, d, "egress-proxy");
        let recorded = match audit.append(&record) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(target: "agentrun::mcp", sandbox = %id, "audit log: {e}");
                false
            }
        };
        if !d.allow {
            lock(&watch.denials).push(Denial::of(&profile, action, d, "egress-proxy"));
        }
        // Not on the connection's path: the export may block on the network.
        span.finish_detached("mcp-span");
        recorded
    })
}

/// One MCP session's sandbox, made when first needed.
pub struct Session {
    shared: Arc<Shared>,
    sandbox: tokio::sync::Mutex<Option<Arc<SessionSandbox>>>,
    /// When the last call ended (for the idle timeout) and how many are in progress.
    last_used: Mutex<Instant>,
    busy: AtomicUsize,
    /// Why the session's previous sandbox went (said to the next call).
    ended: Mutex<Option<String>>,
    /// The client of the latest call, whom escalations ask.
    pub peer: PeerSlot,
}

/// A call's hold on its session's sandbox: released (and, with `--one-shot`, the sandbox
/// destroyed) when dropped.
pub struct Lease {
    session: Arc<Session>,
    pub sandbox: Arc<SessionSandbox>,
    /// The call made it (it did not exist, or the previous one had gone: `note` says why).
    pub fresh: bool,
    pub note: Option<String>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        *lock(&self.session.last_used) = Instant::now();
        self.session.busy.fetch_sub(1, Ordering::SeqCst);
        if self.session.shared.options.one_shot {
            let shared = &self.session.shared;
            shared
                .teardowns
                .spawn(self.sandbox.clone(), shared.live.clone());
        }
    }
}

impl Session {
    /// A session; with an idle timeout its sandbox is reaped by a task on the current runtime
    /// (and by the next call, if it comes first).
    pub fn new(shared: Arc<Shared>) -> Arc<Session> {
        let session = Arc::new(Session {
            shared,
            sandbox: tokio::sync::Mutex::new(None),
            last_used: Mutex::new(Instant::now()),
            busy: AtomicUsize::new(0),
            ended: Mutex::new(None),
            peer: PeerSlot::default(),
        });
        if !session.shared.options.one_shot {
            let weak = Arc::downgrade(&session);
            let idle = session.shared.options.idle_timeout;
            let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(tick).await;
                    let Some(s) = weak.upgrade() else { break };
                    s.reap_if_idle(idle).await;
                }
            });
        }
        session
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The sandbox for a call: the session's (made if it has none), or with `--one-shot` a
    /// fresh one.
    pub async fn lease(self: &Arc<Self>) -> Result<Lease, SandboxError> {
        // Idle past the timeout: torn down now, whether or not the reaper's tick came yet
        // (on a busy machine it may be late), so a late call never gets the old sandbox.
        if !self.shared.options.one_shot {
            self.reap_if_idle(self.shared.options.idle_timeout).await;
        }
        self.busy.fetch_add(1, Ordering::SeqCst);
        let release = |e| {
            self.busy.fetch_sub(1, Ordering::SeqCst);
            e
        };
        if self.shared.options.one_shot {
            let sandbox = SessionSandbox::create(&self.shared, &self.peer)
                .await
                .map_err(release)?;
            return Ok(Lease {
                session: self.clone(),
                sandbox,
                fresh: true,
                note: None,
            });
        }
        let mut slot = self.sandbox.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| !s.live.is_dead()) {
            return Ok(Lease {
                session: self.clone(),
                sandbox: s.clone(),
                fresh: false,
                note: None,
            });
        }
        let gone = slot.take();
        let sandbox = SessionSandbox::create(&self.shared, &self.peer)
            .await
            .map_err(release)?;
        *slot = Some(sandbox.clone());
        let note = lock(&self.ended).take().or_else(|| {
            gone.map(|_| "the session's previous sandbox had ended: this is a new one".into())
        });
        Ok(Lease {
            session: self.clone(),
            sandbox,
            fresh: true,
            note,
        })
    }

    async fn reap_if_idle(&self, idle: Duration) {
        if self.busy.load(Ordering::SeqCst) > 0 || lock(&self.last_used).elapsed() < idle {
            return;
        }
        let Some(s) = self.sandbox.lock().await.take() else {
            return;
        };
        *lock(&self.ended) = Some(format!(
            "the session's sandbox was idle for {}s and was torn down: this is a new one (files and Python variables from before are gone)",
            idle.as_secs()
        ));
        tracing::info!(target: "agentrun::mcp", sandbox = %s.id(), "idle: torn down");
        let live = self.shared.live.clone();
        // A JoinHandle: destroy logs its own failures.
        let _ = tokio::task::spawn_blocking(move || s.destroy(&live)).await;
    }
}

impl Drop for Session {
    /// The MCP session ended: its sandbox goes.
    fn drop(&mut self) {
        if let Some(s) = self.sandbox.get_mut().take() {
            // Not on the async threads: a delete blocks until the sandbox's end is awaited.
            self.shared.teardowns.spawn(s, self.shared.live.clone());
        }
    }
}
