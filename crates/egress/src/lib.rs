//! agentrun's egress proxy: the only way out of a sandbox's network namespace.
//!
//! A sandbox has no route outside its own loopback. When its profile allows hosts, agentrun
//! runs this proxy on the host side, listening on a unix socket in the sandbox's state dir;
//! the sandbox's init bridges `127.0.0.1:3128` inside the sandbox to that socket
//! (`agentrun_runtime::net`), and the command gets `HTTP_PROXY`/`HTTPS_PROXY` pointing there.
//!
//! For each connection the proxy reads one request head ([`request`], parsed with
//! `httparse` and refused on anything two parsers could read two ways):
//! - `CONNECT host:port` (HTTPS and any TCP tunnel), or
//! - an absolute-form HTTP request (`GET http://host[:port]/path`), forwarded in origin form,
//!   one request per connection, its body re-framed by the proxy;
//!
//! asks the [`NetworkPolicy`] about `host:port` *before* resolving anything; if it allows,
//! resolves the name itself (a [`Resolve`]r: the system's unless a test gives another) and
//! asks the policy about every address it got ([`NetworkPolicy::check_address`]: a wildcard
//! or `mode = "all"` never reaches a private or host-internal address, a name never reaches a
//! host-internal one). The decision goes to the caller's [`DecisionSink`] before it is acted
//! on; a denial is answered `403` naming the rule. A name that does not resolve, or an
//! upstream that cannot be reached, is not a policy decision: it is answered `502` with the
//! reason and reported to the [`FailureSink`] as an error. Then the proxy connects (to the
//! addresses it checked: no second lookup to rebind) and relays bytes. Threads, not async:
//! the cold path starts the proxy after the sandbox exists, in a process that must
//! otherwise stay single-threaded while it is created.
//!
//! A connection whose decision is **escalate** (`[network] escalate`, or an address an escalate
//! rule names) is held while the proxy's [`Approver`] asks a person ([`ProxyBuilder::approver`];
//! the wait is bounded, [`ProxyBuilder::approval_timeout`], default 60 s), then allowed or
//! denied; without an approver it is denied "needs approval". An approval is remembered per
//! `host:port` in the proxy's [`Approvals`] ([`ProxyBuilder::approvals`]: share one per
//! sandbox so that it holds for the sandbox's life across its runs' proxies); concurrent
//! connections to one `host:port` share one question. The sink gets the settled decision
//! (verdict `escalate`, its outcome in [`Decision::escalation`]).
//!
//! The policy is shared ([`SharedPolicy`]) and may be replaced while the proxy runs
//! ([`Proxy::set_policy`], for the OpenSandbox egress endpoint's `PATCH`/`DELETE /policy`).
//! Each connection is decided by the policy in force when its request head arrives; on a
//! change, connections already relaying are decided again and those the new policy denies
//! are cut (and the denial reported).

pub mod java_trust;
pub mod mitm;
mod relay;
pub mod request;
pub mod subject_hash;
pub mod system_trust;
pub mod vault;

#[cfg(test)]
mod mitm_tests;
#[cfg(test)]
mod test_support;

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use agentrun_policy::{Action, Approvals, Approver, Decision, NetworkPolicy};

pub use mitm::{Interceptor, MitmError};
pub use relay::{relay, Duplex};
pub use request::{
    parse_origin_head, parse_request_head, Body, HeadError, OriginHead, RequestHead, MAX_HEAD,
};
pub use vault::{Secret, Vault, VaultError};

/// Port the sandbox's init listens on inside the sandbox.
pub const SANDBOX_PROXY_PORT: u16 = 3128;
/// How long a client may take to send its request head, and an upstream to accept.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once per proxy (each costs host-side threads, outside the
/// sandbox's pids limit); more are answered 503 at once.
pub const MAX_CONNECTIONS: usize = 256;

/// Errors starting the proxy.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("egress proxy: cannot listen on {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("egress proxy: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Mitm(#[from] MitmError),
    #[error("egress proxy: cannot add the interception CA to the sandbox's system bundles: {0}")]
    Trust(io::Error),
    #[error("egress proxy: cannot write {path}: {source}")]
    Preload { path: PathBuf, source: io::Error },
}

/// Receives every decision the proxy makes (to trace and audit it), before it acts on it.
/// Returns whether the decision was recorded: an allow that could not be recorded is not
/// acted on (the client gets 503).
pub type DecisionSink = Arc<dyn Fn(&Action, &Decision) -> bool + Send + Sync>;

/// Receives what went wrong with a connection the policy allowed (`decision`): an error to
/// record as one (span status, audit record kind), never a denial.
pub type FailureSink = Arc<dyn Fn(&Action, &Decision, &Failure) + Send + Sync>;

/// A connection the policy allowed that could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    /// One line: what failed and why.
    pub message: String,
}

/// What failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The name did not resolve (or resolved to nothing).
    Resolve,
    /// No address of it accepted the connection in time.
    Connect,
}

impl FailureKind {
    /// The `error.type` it is recorded with.
    pub fn error_type(self) -> &'static str {
        match self {
            FailureKind::Resolve => "resolve",
            FailureKind::Connect => "connect",
        }
    }
}

/// Turns a host name into addresses. The proxy resolves names itself (the sandbox has no
/// DNS); [`SystemResolver`] unless a caller (a test) gives another.
pub trait Resolve: Send + Sync {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>>;
}

/// The host's resolver (`getaddrinfo`: `/etc/hosts`, then DNS, as `nsswitch.conf` says).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        Ok((host, port).to_socket_addrs()?.collect())
    }
}

/// A network policy that can be replaced while a proxy decides with it.
pub type SharedPolicy = Arc<RwLock<NetworkPolicy>>;

/// The environment that points a sandboxed command at the proxy.
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{SANDBOX_PROXY_PORT}");
    let mut env: Vec<(String, String)> = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .iter()
        .map(|k| (k.to_string(), url.clone()))
        .collect();
    // Node's fetch and http(s) honour the variables above only when asked (Node >= 22.21
    // and >= 24.5; earlier versions ignore this one: see docs/credentials.md).
    env.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
    env
}

/// Writes [`NODE_PRELOAD_FILE`] (0644) into `dir` unless it is there: once per directory (a
/// pooled shell's directory, whose proxy is bound again at every run), and again in one made
/// anew (a wiped state dir). What is there is taken as written by this function when it is a
/// file of the preload's length and mode: only root writes the directory (the sandbox sees it
/// read-only), and a binary with another preload makes its sandboxes' directories anew.
fn write_preload(dir: &Path) -> Result<(), EgressError> {
    use std::os::unix::fs::PermissionsExt;
    let preload = dir.join(NODE_PRELOAD_FILE);
    let written = std::fs::symlink_metadata(&preload).is_ok_and(|m| {
        m.is_file()
            && m.len() == NODE_PRELOAD.len() as u64
            && m.permissions().mode() & 0o7777 == 0o644
    });
    if written {
        return Ok(());
    }
    std::fs::write(&preload, NODE_PRELOAD)
        .and_then(|()| std::fs::set_permissions(&preload, std::fs::Permissions::from_mode(0o644)))
        .map_err(|source| EgressError::Preload {
            path: preload,
            source,
        })
}

/// A preload for Node versions whose `fetch` ignores the proxy variables (Node 20, 22 before
/// 22.21): `NODE_OPTIONS=--require=/run/agentrun-egress/node-proxy.cjs` routes `fetch` for
/// `https` URLs through `HTTPS_PROXY` with the undici Node bundles (docs/credentials.md).
/// [`bind`] writes it beside the socket, where every sandbox with a proxy sees it.
pub const NODE_PRELOAD_FILE: &str = "node-proxy.cjs";
const NODE_PRELOAD: &str = include_str!("node-proxy.cjs");

/// Binds the proxy's unix socket (mode 0666: the sandbox's uid connects to it through a
/// read-only bind mount of its directory) and writes [`NODE_PRELOAD_FILE`] (0644) beside it
/// unless it is there already. No thread is started.
pub fn bind(path: &Path) -> Result<UnixListener, EgressError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        write_preload(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).map_err(|source| EgressError::Bind {
        path: path.to_owned(),
        source,
    })?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(|source| {
        EgressError::Bind {
            path: path.to_owned(),
            source,
        }
    })?;
    Ok(l)
}

/// The (device, inode) of the socket file at `path`, taken right after [`bind`]: what
/// [`remove_socket_file`] checks before it removes the file.
pub fn socket_file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Removes the socket file at `path` if it is still the one `ours` identified: a later proxy
/// may have bound the same path since (the next run on a reused shell), and its file is not
/// ours to remove.
pub fn remove_socket_file(path: &Path, ours: Option<(u64, u64)>) {
    if ours.is_some() && socket_file_id(path) == ours {
        let _ = std::fs::remove_file(path);
    }
}

/// A running proxy. [`Proxy::stop`] (or dropping it) stops accepting connections.
pub struct Proxy {
    path: PathBuf,
    /// The socket file's (device, inode) when it was ours: a later proxy may bind the same
    /// path (the next run on a reused shell), and that one's file is not ours to remove.
    file: Option<(u64, u64)>,
    /// A duplicate of the listener, shut down to wake the accept loop (connecting to `path`
    /// could reach a later proxy bound there instead).
    waker: Option<UnixStream>,
    stopping: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// What every connection of a proxy uses.
struct Shared {
    policy: SharedPolicy,
    sink: DecisionSink,
    failures: Option<FailureSink>,
    resolver: Arc<dyn Resolve>,
    escalation: Escalation,
    open: Mutex<OpenConns>,
    /// TLS interception, when the sandbox opted in; the vault it injects from.
    interceptor: Option<Arc<Interceptor>>,
    vault: Vault,
    injections: Option<InjectionSink>,
}

/// Who is asked about escalate decisions, for how long, and what was approved.
#[derive(Clone)]
struct Escalation {
    approver: Option<Arc<dyn Approver>>,
    sandbox_id: String,
    timeout: Duration,
    approvals: Arc<Approvals>,
}

impl Default for Escalation {
    fn default() -> Self {
        Escalation {
            approver: None,
            sandbox_id: String::new(),
            timeout: agentrun_policy::DEFAULT_APPROVAL_TIMEOUT,
            approvals: Arc::default(),
        }
    }
}

impl Escalation {
    /// `d` on `action`, settled if it is an escalate decision (asking on this thread).
    fn settle(&self, action: &Action, d: Decision) -> Decision {
        self.approvals.settle_blocking(
            self.approver.as_deref(),
            &self.sandbox_id,
            action,
            d,
            self.timeout,
        )
    }

    /// `d` for a connection already open: an escalate decision is allowed when it was
    /// approved (nobody is asked again; an open connection was approved or allowed).
    fn recheck(&self, action: &Action, d: Decision) -> Decision {
        if d.needs_approval() && self.approvals.is_approved(&Approvals::key(action)) {
            return d.settle(&agentrun_policy::Answer::Approved);
        }
        d
    }
}

/// The connections relaying now: where they lead, and handles to cut them.
#[derive(Default)]
struct OpenConns {
    next: u64,
    conns: HashMap<u64, OpenConn>,
}

struct OpenConn {
    host: String,
    port: u16,
    client: UnixStream,
    upstream: TcpStream,
}

fn lock_open(m: &Mutex<OpenConns>) -> std::sync::MutexGuard<'_, OpenConns> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a proxy is set up: its policy and decision sink, and optionally where failures go
/// and how names are resolved. [`ProxyBuilder::start`] serves.
pub struct ProxyBuilder {
    policy: SharedPolicy,
    sink: DecisionSink,
    failures: Option<FailureSink>,
    resolver: Arc<dyn Resolve>,
    escalation: Escalation,
    interceptor: Option<Arc<Interceptor>>,
    vault: Vault,
    injections: Option<InjectionSink>,
}

/// Told about every request the proxy added a credential to: the connection's action, the
/// request's method and path (without the query), and the binding's name. Never the value.
/// Returns whether the use was recorded: a request whose credential use cannot be recorded
/// is not sent (the sandbox gets 503, the credential goes nowhere).
pub type InjectionSink = Arc<dyn Fn(&Action, &str, &str, &str) -> bool + Send + Sync>;

/// Tells `sink` (if any) that `binding`'s credential is added to `method path`; whether the
/// request may go (recorded, or nobody to record it).
fn injection_recorded(
    sink: Option<&InjectionSink>,
    action: &Action,
    method: &str,
    path: &str,
    binding: &str,
) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    sink.is_none_or(|sink| sink(action, method, path, binding))
}

/// The answer to a request whose credential use could not be recorded.
fn unrecorded_injection(action: &Action) -> String {
    format!(
        "agentrun: {}: the credential's use could not be recorded: request not sent",
        action.resource()
    )
}

impl ProxyBuilder {
    /// Intercepts TLS to the hosts `vault` binds a credential to (with `interceptor`'s CA)
    /// and adds the credential to their requests; every other tunnel is relayed untouched.
    pub fn intercept(mut self, interceptor: Arc<Interceptor>, vault: Vault) -> Self {
        self.interceptor = Some(interceptor);
        self.vault = vault;
        self
    }

    /// Adds credentials from `vault` to plain-HTTP requests only (no TLS interception).
    pub fn intercept_plain(mut self, vault: Vault) -> Self {
        self.vault = vault;
        self
    }

    /// Reports each injected request to `sink` (to trace and audit it).
    pub fn injections(mut self, sink: InjectionSink) -> Self {
        self.injections = Some(sink);
        self
    }

    /// Asks `approver` about connections whose decision is escalate (without one they are
    /// denied "needs approval").
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.escalation.approver = Some(approver);
        self
    }

    /// How long a person has to answer (default 60 s); then the connection is denied.
    pub fn approval_timeout(mut self, timeout: Duration) -> Self {
        self.escalation.timeout = timeout;
        self
    }

    /// Remembers approvals in `approvals` (share one per sandbox: an approval holds for the
    /// sandbox's life); default: the proxy's own.
    pub fn approvals(mut self, approvals: Arc<Approvals>) -> Self {
        self.escalation.approvals = approvals;
        self
    }

    /// The sandbox the proxy serves, named in the questions asked.
    pub fn sandbox_id(mut self, id: impl Into<String>) -> Self {
        self.escalation.sandbox_id = id.into();
        self
    }

    /// Reports connections the policy allowed but that failed (DNS, connect) to `sink`.
    pub fn failures(mut self, sink: FailureSink) -> Self {
        self.failures = Some(sink);
        self
    }

    /// Resolves names with `resolver` instead of the system's.
    pub fn resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// Serves `listener` (from [`bind`] at `path`) on a new thread.
    pub fn start(self, listener: UnixListener, path: &Path) -> Proxy {
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let active = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Shared {
            policy: self.policy,
            sink: self.sink,
            failures: self.failures,
            resolver: self.resolver,
            escalation: self.escalation,
            open: Mutex::default(),
            interceptor: self.interceptor,
            vault: self.vault,
            injections: self.injections,
        });
        let shared2 = shared.clone();
        let file = socket_file_id(path);
        // A socket fd the std types can shut down (`shutdown(2)` on a listening socket
        // makes a blocked `accept` fail at once).
        let waker = listener
            .try_clone()
            .ok()
            .map(|l| UnixStream::from(std::os::fd::OwnedFd::from(l)));
        let accept = std::thread::Builder::new()
            .name("egress-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(mut conn) = conn else { continue };
                    if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                        active.fetch_sub(1, Ordering::SeqCst);
                        let _ = respond(
                            &mut conn,
                            503,
                            "Service Unavailable",
                            "agentrun: too many proxy connections",
                        );
                        continue;
                    }
                    let (shared, done) = (shared2.clone(), active.clone());
                    let spawned = std::thread::Builder::new()
                        .name("egress-conn".into())
                        .spawn(move || {
                            let _ = handle(conn, &shared);
                            done.fetch_sub(1, Ordering::SeqCst);
                        });
                    if spawned.is_err() {
                        // The closure (and the count it would release) was dropped unrun.
                        active.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            })
            .ok();
        Proxy {
            path: path.to_owned(),
            file,
            waker,
            stopping,
            accept,
            shared,
        }
    }
}

impl Proxy {
    /// A proxy deciding with a fixed `policy`, reporting decisions to `sink`.
    pub fn builder(policy: NetworkPolicy, sink: DecisionSink) -> ProxyBuilder {
        Self::builder_shared(Arc::new(RwLock::new(policy)), sink)
    }

    /// A proxy deciding every new connection with whatever `policy` holds at that moment.
    pub fn builder_shared(policy: SharedPolicy, sink: DecisionSink) -> ProxyBuilder {
        ProxyBuilder {
            policy,
            sink,
            failures: None,
            resolver: Arc::new(SystemResolver),
            escalation: Escalation::default(),
            interceptor: None,
            vault: Vault::default(),
            injections: None,
        }
    }

    /// Serves `listener` (from [`bind`] at `path`) on a new thread, with a fixed policy.
    pub fn start(
        listener: UnixListener,
        path: &Path,
        policy: NetworkPolicy,
        sink: DecisionSink,
    ) -> Proxy {
        Self::builder(policy, sink).start(listener, path)
    }

    /// Like [`Proxy::start`], deciding every new connection with whatever `policy` holds
    /// at that moment.
    pub fn start_shared(
        listener: UnixListener,
        path: &Path,
        policy: SharedPolicy,
        sink: DecisionSink,
    ) -> Proxy {
        Self::builder_shared(policy, sink).start(listener, path)
    }

    /// Puts `policy` in force: the next connection is decided by it, and every connection
    /// relaying now is decided again (its name, then the address it is connected to); those
    /// it denies are cut, each denial reported to the sink. Returns how many were cut.
    pub fn set_policy(&self, policy: NetworkPolicy) -> usize {
        let mut open = lock_open(&self.shared.open);
        *self
            .shared
            .policy
            .write()
            .unwrap_or_else(|p| p.into_inner()) = policy.clone();
        let mut cut = Vec::new();
        for (id, c) in &open.conns {
            let action = Action::Connect {
                host: c.host.clone(),
                port: c.port,
            };
            let peer = c.upstream.peer_addr().ok().map(|p| p.ip());
            let mut d = decide_open(&policy, &self.shared.escalation, &action, peer);
            if !d.allow {
                d.reason = format!("{} (open connection cut: the policy changed)", d.reason);
                (self.shared.sink)(&action, &d);
                let _ = c.client.shutdown(Shutdown::Both);
                let _ = c.upstream.shutdown(Shutdown::Both);
                cut.push(*id);
            }
        }
        for id in &cut {
            open.conns.remove(id);
        }
        cut.len()
    }

    /// The policy in force.
    pub fn policy(&self) -> NetworkPolicy {
        self.shared
            .policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops accepting; connections in flight are left to finish or die with the process.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop through the listener itself. Without a duplicate of it,
        // nothing can wake it: leave the thread rather than block forever.
        let woken = self
            .waker
            .take()
            .is_some_and(|w| w.shutdown(Shutdown::Both).is_ok());
        if let Some(h) = self.accept.take() {
            if woken {
                let _ = h.join();
            }
        }
        // Our socket file only: another proxy may have been bound at the path since.
        remove_socket_file(&self.path, self.file);
        // Its CA's files beside the socket, if they are still its own: a later run of a
        // reused shell must not find a CA (a cell installs what it finds there).
        if let (Some(i), Some(dir)) = (&self.shared.interceptor, self.path.parent()) {
            let ca = dir.join(mitm::CA_FILE);
            if std::fs::read_to_string(&ca).is_ok_and(|t| t == i.ca_pem()) {
                let _ = std::fs::remove_file(dir.join(mitm::BUNDLE_FILE));
                let _ = std::fs::remove_file(ca);
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The addresses `host` leads to: itself if it is an address, else what the resolver says.
fn addresses(resolver: &dyn Resolve, host: &str, port: u16) -> Result<Vec<SocketAddr>, Failure> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let failed = |why: String| Failure {
        kind: FailureKind::Resolve,
        message: format!("cannot resolve {host}: {why}"),
    };
    let addrs = resolver
        .resolve(host, port)
        .map_err(|e| failed(e.to_string()))?;
    if addrs.is_empty() {
        return Err(failed("no address".into()));
    }
    Ok(addrs)
}

fn handle(mut client: UnixStream, shared: &Shared) -> io::Result<()> {
    client.set_read_timeout(Some(IO_TIMEOUT))?;
    let (head, rest) = match read_head(&mut client)? {
        Ok(Some(x)) => x,
        Ok(None) => return Ok(()),
        Err(e) => {
            return respond(&mut client, e.status, e.reason(), &format!("agentrun: {e}"));
        }
    };
    let action = Action::Connect {
        host: head.host.clone(),
        port: head.port,
    };
    // The policy in force now decides this connection (it may be replaced at any time):
    // the name first, then every address it leads to.
    let mut decision = shared
        .policy
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .check(&head.host, head.port);
    let mut addrs = Vec::new();
    let mut failure = None;
    if decision.allow || decision.escalate {
        match addresses(shared.resolver.as_ref(), &head.host, head.port) {
            Ok(list) => {
                let policy = shared.policy.read().unwrap_or_else(|p| p.into_inner());
                for a in &list {
                    let d = policy.check_address(&head.host, head.port, &decision, a.ip());
                    if d.allow {
                        continue;
                    }
                    if d.escalate {
                        // An address behind an escalate rule: the connection needs approval.
                        decision = d;
                        continue;
                    }
                    let verb = if decision.escalate {
                        "escalated"
                    } else {
                        "allowed"
                    };
                    let reason =
                        format!("{} (after rule {} {verb} it)", d.reason, decision.rule_id);
                    decision = Decision { reason, ..d };
                    break;
                }
                addrs = list;
            }
            Err(f) => failure = Some(f),
        }
    }
    // Held while a person is asked (bounded); the settled decision is the one recorded.
    let decision = shared.escalation.settle(&action, decision);
    let recorded = (shared.sink)(&action, &decision);
    if !decision.allow {
        let msg = denied(&action, &decision);
        return respond(&mut client, 403, "Forbidden", &msg);
    }
    if !recorded {
        let msg = format!(
            "agentrun: {}: the decision could not be recorded",
            action.resource()
        );
        return respond(&mut client, 503, "Service Unavailable", &msg);
    }
    let mut upstream = match failure.map_or_else(|| connect_any(&addrs, &head.host), Err) {
        Ok(s) => s,
        Err(f) => {
            if let Some(failures) = &shared.failures {
                failures(&action, &decision, &f);
            }
            let msg = format!("agentrun: {}: {}", action.resource(), f.message);
            return respond(&mut client, 502, "Bad Gateway", &msg);
        }
    };
    client.set_read_timeout(None)?;
    let http_rules = shared
        .policy
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .has_http_rules(&head.host, head.port);
    let intercepting = shared.interceptor.is_some()
        && head.connect
        && (http_rules || shared.vault.binds("https", &head.host, head.port));
    if head.connect && http_rules && shared.interceptor.is_none() {
        // Requests to this host are decided one by one, which this proxy cannot see into.
        let d = Decision::deny(
            "network.http_intercept",
            format!(
                "{} has HTTP rules, and this sandbox's proxy does not intercept TLS",
                action.resource()
            ),
        );
        (shared.sink)(&action, &d);
        let msg = denied(&action, &d);
        return respond(&mut client, 403, "Forbidden", &msg);
    }
    if !head.connect {
        if let Some(o) = &head.origin {
            if let Err((status, text, msg)) = decide_http(shared, &head.host, head.port, o) {
                return respond(&mut client, status, text, &msg);
            }
        }
    }
    if intercepting {
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    } else if head.connect {
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
        upstream.write_all(&rest)?;
    } else {
        // A plain-HTTP request to a host the vault binds: the credential added here, once
        // its use is on record.
        let injected = head
            .origin
            .clone()
            .filter(|_| shared.vault.binds("http", &head.host, head.port))
            .and_then(|mut o| {
                let binding = shared.vault.inject("http", &head.host, head.port, &mut o)?;
                let recorded = injection_recorded(
                    shared.injections.as_ref(),
                    &action,
                    &o.method,
                    &o.path,
                    &binding,
                );
                Some(
                    recorded.then(|| zeroize::Zeroizing::new(o.forward(&head.host, head.port, 80))),
                )
            });
        match injected {
            Some(Some(fwd)) => upstream.write_all(&fwd)?,
            Some(None) => {
                let msg = unrecorded_injection(&action);
                return respond(&mut client, 503, "Service Unavailable", &msg);
            }
            None => upstream.write_all(&head.forward)?,
        }
    }
    // Registered so that a policy change can cut it. A change made since the decision (it
    // holds this lock while it swaps) is seen here: decide again under the lock.
    let id = {
        let mut o = lock_open(&shared.open);
        let policy = shared.policy.read().unwrap_or_else(|p| p.into_inner());
        let peer = upstream.peer_addr().ok().map(|p| p.ip());
        let now = decide_open(&policy, &shared.escalation, &action, peer);
        if !now.allow {
            let mut d = now;
            d.reason = format!("{} (open connection cut: the policy changed)", d.reason);
            (shared.sink)(&action, &d);
            let _ = client.shutdown(Shutdown::Both);
            let _ = upstream.shutdown(Shutdown::Both);
            return Ok(());
        }
        o.next += 1;
        let id = o.next;
        if let (Ok(c), Ok(u)) = (client.try_clone(), upstream.try_clone()) {
            o.conns.insert(
                id,
                OpenConn {
                    host: head.host.clone(),
                    port: head.port,
                    client: c,
                    upstream: u,
                },
            );
        }
        id
    };
    let intercept = shared.interceptor.as_ref().filter(|_| intercepting);
    let result = if let Some(i) = intercept {
        intercept_tls(
            client,
            upstream,
            rest,
            &head,
            (&action, &decision),
            i,
            shared,
        )
    } else if head.connect {
        relay(client, upstream)
    } else {
        forward(client, upstream, head.body, rest)
    };
    lock_open(&shared.open).conns.remove(&id);
    result
}

/// The start of HTTP/2's connection preface (RFC 9113 section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";
/// The answer to it on an intercepted connection.
const H2_REFUSED: &str = "agentrun: HTTP/2 is not served on intercepted connections (the proxy \
     reads HTTP/1.1 requests; ALPN offers http/1.1 only): use HTTP/1.1";

/// Closes a connection to the sandbox gracefully once our last bytes are written: our side
/// shut for writing, then what the sandbox still sends is read and dropped (for at most 200
/// ms) until it closes too. Closing with its bytes unread would reset the connection, and a
/// reset can reach the sandbox before the answer it was sent.
fn linger_close(sock: &std::os::unix::net::UnixStream) {
    let _ = sock.shutdown(Shutdown::Write);
    let _ = sock.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    // At most 256 KiB (64 reads): a sandbox that keeps sending is closed on anyway.
    for _ in 0..64 {
        if !matches!((&*sock).read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
}
/// Serves one request inside a tunnel the proxy intercepts: TLS with the sandbox (a leaf
/// for the CONNECT host), the request head read and checked (its SNI and `Host` must name
/// the CONNECT host: 421 otherwise), the credential added, and the request sent over the
/// proxy's own TLS to the upstream, whose certificate must be valid for that host (502
/// otherwise). One request per connection (`Connection: close` both ways).
fn intercept_tls(
    client: UnixStream,
    upstream: TcpStream,
    rest: Vec<u8>,
    head: &RequestHead,
    (action, decision): (&Action, &Decision),
    interceptor: &Interceptor,
    shared: &Shared,
) -> io::Result<()> {
    let host = head.host.as_str();
    let cfg = interceptor.server_config(host).map_err(io::Error::other)?;
    let conn = rustls::ServerConnection::new(cfg).map_err(io::Error::other)?;
    client.set_read_timeout(Some(IO_TIMEOUT))?;
    let mut tls = rustls::StreamOwned::new(conn, mitm::Prefixed::new(rest, client));
    while tls.conn.is_handshaking() {
        if tls.conn.complete_io(&mut tls.sock).is_err() {
            // The sandbox did not trust our CA, went away, or offered only protocols we do
            // not speak (ALPN `h2` alone): nothing to answer but rustls's alert, which must
            // reach it before we close (closing with its bytes unread would reset it).
            while tls.conn.wants_write() {
                if !matches!(tls.conn.write_tls(&mut tls.sock), Ok(n) if n > 0) {
                    break;
                }
            }
            linger_close(tls.sock.inner());
            return Ok(());
        }
    }
    let reply = |tls: &mut rustls::StreamOwned<
        rustls::ServerConnection,
        mitm::Prefixed<std::os::unix::net::UnixStream>,
    >,
                 status: u16,
                 text: &str,
                 body: &str| {
        let body = format!("{body}\n");
        let msg = format!(
            "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tls.write_all(msg.as_bytes());
        tls.conn.send_close_notify();
        let _ = tls.flush();
        // What the sandbox sent and we did not read (a request after a refused name) would
        // reset the connection at close, and the reset can overtake the answer.
        linger_close(tls.sock.inner());
    };
    if let Some(sni) = tls.conn.server_name() {
        if !sni.eq_ignore_ascii_case(host) {
            let msg = format!(
                "agentrun: TLS server name {sni:?} is not {host}, the host this tunnel was opened to"
            );
            reply(&mut tls, 421, "Misdirected Request", &msg);
            return Ok(());
        }
    }
    // Requests one after another on this connection (keep-alive, as the client asks), each
    // decided, injected and sent on one upstream connection made for the first.
    let mut pending: Vec<u8> = Vec::new();
    let mut upstream = Some(upstream);
    let mut up: Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> = None;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        // The request head (what was read past the last request comes first).
        let mut buf = std::mem::take(&mut pending);
        let (mut req, body_start) = loop {
            match parse_origin_head(&buf, host, head.port, 443) {
                Ok(Some((h, len))) => break (h, buf.split_off(len)),
                Ok(None) => {}
                Err(_) if buf.starts_with(H2_PREFACE) => {
                    // A client that speaks HTTP/2 without asking (ALPN offers http/1.1 only;
                    // one that offers only h2 is refused in the handshake).
                    reply(&mut tls, 505, "HTTP Version Not Supported", H2_REFUSED);
                    return Ok(());
                }
                Err(e) => {
                    reply(&mut tls, e.status, e.reason(), &format!("agentrun: {e}"));
                    return Ok(());
                }
            }
            let n = match tls.read(&mut chunk) {
                Ok(0) | Err(_) => {
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                    return Ok(());
                }
                Ok(n) => n,
            };
            buf.extend_from_slice(&chunk[..n]);
        };
        if let Err((status, text, msg)) = decide_http(shared, host, head.port, &req) {
            reply(&mut tls, status, text, &msg);
            return Ok(());
        }
        if up.is_none() {
            let Some(tcp) = upstream.take() else {
                return Ok(());
            };
            match connect_upstream_tls(interceptor, host, tcp) {
                Ok(u) => up = Some(u),
                Err(e) => {
                    let f = Failure {
                        kind: FailureKind::Connect,
                        message: e.to_string(),
                    };
                    if let Some(failures) = &shared.failures {
                        failures(action, decision, &f);
                    }
                    reply(
                        &mut tls,
                        502,
                        "Bad Gateway",
                        &format!("agentrun: {}", f.message),
                    );
                    return Ok(());
                }
            }
        }
        let u = up.as_mut().expect("made above");
        // Only now, with the upstream verified, is the credential added; the request goes
        // only once that use is on record.
        if let Some(binding) = shared.vault.inject("https", host, head.port, &mut req) {
            let recorded = injection_recorded(
                shared.injections.as_ref(),
                action,
                &req.method,
                &req.path,
                &binding,
            );
            if !recorded {
                drop(req);
                reply(
                    &mut tls,
                    503,
                    "Service Unavailable",
                    &unrecorded_injection(action),
                );
                return Ok(());
            }
        }
        // `Expect: 100-continue` is answered here (the body is relayed before the upstream's
        // answer is read): the client need not wait for a 100 that would come too late.
        let continues = req
            .field("expect")
            .is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"));
        if continues {
            req.remove_field("expect");
            if req.body != Body::None
                && (tls.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err()
                    || tls.flush().is_err())
            {
                return Ok(());
            }
        }
        let keep = !req.close;
        let mut fwd = zeroize::Zeroizing::new(req.forward_with(host, head.port, 443, !keep));
        let sent = {
            // Head and body go out together (one TLS record where they fit): a head written
            // alone would wait out the peer's delayed ACK before the body.
            let mut to = io::BufWriter::with_capacity(64 * 1024, &mut *u);
            to.write_all(&fwd)?;
            zeroize::Zeroize::zeroize(&mut *fwd);
            let mut from = BufReader::new(io::Cursor::new(body_start).chain(&mut tls));
            let sent =
                request::relay_body(req.body, &mut from, &mut to).is_ok() && to.flush().is_ok();
            // Read past the body: the start of the next request (buffered first, then what
            // the cursor still holds).
            pending = from.buffer().to_vec();
            let (cursor, _) = from.into_inner().into_inner();
            let at = (cursor.position() as usize).min(cursor.get_ref().len());
            pending.extend_from_slice(&cursor.get_ref()[at..]);
            sent
        };
        if !sent {
            return Ok(());
        }
        u.flush()?;
        // The response head (1xx ones passed on as they are).
        let mut rbuf = Vec::new();
        let resp = loop {
            match request::parse_response_head(&rbuf, req.method.eq_ignore_ascii_case("HEAD")) {
                Ok(Some(r)) if r.code < 200 => {
                    if tls.write_all(&rbuf[..r.len]).is_err() {
                        return Ok(());
                    }
                    rbuf.drain(..r.len);
                    continue;
                }
                Ok(Some(r)) => break r,
                Ok(None) => {}
                Err(e) => {
                    reply(
                        &mut tls,
                        502,
                        "Bad Gateway",
                        &format!("agentrun: {host}: {e}"),
                    );
                    return Ok(());
                }
            }
            match u.read(&mut chunk) {
                Ok(0) | Err(_) => {
                    reply(
                        &mut tls,
                        502,
                        "Bad Gateway",
                        &format!("agentrun: {host} closed the connection without a response"),
                    );
                    return Ok(());
                }
                Ok(n) => rbuf.extend_from_slice(&chunk[..n]),
            }
        };
        let closing = !keep || resp.close || resp.body == request::ResponseBody::UntilClose;
        let head_out = if closing {
            match request::close_response_head(&rbuf) {
                Ok(Some((h, _))) => h,
                _ => return Ok(()),
            }
        } else {
            rbuf[..resp.len].to_vec()
        };
        let body_rest = rbuf.split_off(resp.len);
        // Head and body to the client together too (see above).
        let mut to = io::BufWriter::with_capacity(64 * 1024, &mut tls);
        if to.write_all(&head_out).is_err() {
            return Ok(());
        }
        let relayed = match resp.body {
            request::ResponseBody::None => true,
            request::ResponseBody::Length(n) => {
                let mut from = BufReader::new(io::Cursor::new(body_rest).chain(&mut *u));
                copy_flushing(&mut from, &mut to, n).is_ok()
            }
            request::ResponseBody::Chunked => {
                let mut from = BufReader::new(io::Cursor::new(body_rest).chain(&mut *u));
                request::relay_body(Body::Chunked, &mut from, &mut to).is_ok()
            }
            request::ResponseBody::UntilClose => {
                if to.write_all(&body_rest).is_err() {
                    return Ok(());
                }
                // Streamed as it comes (a long-lived stream must not wait for 64 KiB).
                let _ = to.flush();
                loop {
                    match u.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if to.write_all(&chunk[..n]).is_err() || to.flush().is_err() {
                                break;
                            }
                        }
                    }
                }
                true
            }
        };
        let relayed = to.flush().is_ok() && relayed;
        drop(to);
        if !relayed || closing {
            break;
        }
        let _ = tls.flush();
    }
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

/// Copies `n` bytes, each piece as soon as it is there (the first joins what `to` holds: a
/// response head and the start of its body go out together).
fn copy_flushing(from: &mut impl io::BufRead, to: &mut impl Write, mut n: u64) -> io::Result<()> {
    while n > 0 {
        let buf = from.fill_buf()?;
        if buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the upstream closed before the end of the body",
            ));
        }
        let k = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        to.write_all(&buf[..k])?;
        from.consume(k);
        n -= k as u64;
        to.flush()?;
    }
    Ok(())
}

/// Why TLS to an intercepted connection's upstream was not set up (a 502 to the sandbox).
#[derive(Debug, thiserror::Error)]
enum UpstreamTlsError {
    #[error("{host}: {source}")]
    Name { host: String, source: io::Error },
    #[error("TLS to {host} failed: {source}")]
    Setup { host: String, source: rustls::Error },
    #[error("TLS to {host} failed: {source}")]
    Io { host: String, source: io::Error },
}

/// TLS to the upstream over `tcp` (from [`connect_any`]: TCP_NODELAY set), its certificate
/// verified for `host`; `Err`: why not.
fn connect_upstream_tls(
    interceptor: &Interceptor,
    host: &str,
    tcp: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, UpstreamTlsError> {
    let name = mitm::server_name(host).map_err(|source| UpstreamTlsError::Name {
        host: host.into(),
        source,
    })?;
    let conn =
        rustls::ClientConnection::new(interceptor.upstream_config(), name).map_err(|source| {
            UpstreamTlsError::Setup {
                host: host.into(),
                source,
            }
        })?;
    let io_failed = |source| UpstreamTlsError::Io {
        host: host.into(),
        source,
    };
    tcp.set_read_timeout(Some(IO_TIMEOUT)).map_err(io_failed)?;
    let mut up = rustls::StreamOwned::new(conn, tcp);
    while up.conn.is_handshaking() {
        up.conn.complete_io(&mut up.sock).map_err(io_failed)?;
    }
    Ok(up)
}

/// Decides one request by the policy's L7 rules (none naming the host: sent as it is). The
/// decision is settled (escalate: a person asked) and recorded like a connection's; `Err`:
/// the status, reason phrase and one line to answer instead of sending it.
fn decide_http(
    shared: &Shared,
    host: &str,
    port: u16,
    req: &OriginHead,
) -> Result<(), (u16, &'static str, String)> {
    let d = shared
        .policy
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .check_http(&agentrun_policy::HttpRequest {
            method: &req.method,
            host,
            port,
            path: &req.path,
            fields: &req.fields,
        });
    let Some(d) = d else { return Ok(()) };
    let action = Action::Http {
        method: req.method.clone(),
        host: host.to_owned(),
        port,
        path: req.path.split('?').next().unwrap_or_default().to_owned(),
    };
    let d = shared.escalation.settle(&action, d);
    let recorded = (shared.sink)(&action, &d);
    if !d.allow {
        return Err((403, "Forbidden", denied(&action, &d)));
    }
    if !recorded {
        return Err((
            503,
            "Service Unavailable",
            format!(
                "agentrun: {}: the decision could not be recorded",
                action.resource()
            ),
        ));
    }
    Ok(())
}

/// Decides an open connection for `action` again (its name, then `peer`, the address it is
/// connected to); an escalate decision stands if it was approved. Nobody is asked.
fn decide_open(
    policy: &NetworkPolicy,
    escalation: &Escalation,
    action: &Action,
    peer: Option<IpAddr>,
) -> Decision {
    let Action::Connect { host, port } = action else {
        return Decision::deny("network.default", "not a connection");
    };
    let mut d = policy.check(host, *port);
    if d.allow || d.escalate {
        if let Some(ip) = peer {
            d = policy.check_address(host, *port, &d, ip);
        }
    }
    escalation.recheck(action, d)
}

/// Reads a request head: `Ok(Ok(Some((head, bytes read past it))))`, `Ok(Ok(None))` on EOF
/// before anything was sent, `Ok(Err(_))` for a head to refuse.
#[allow(clippy::type_complexity)]
fn read_head(c: &mut UnixStream) -> io::Result<Result<Option<(RequestHead, Vec<u8>)>, HeadError>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = c.read(&mut chunk)?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(Ok(None));
            }
            return Ok(Err(HeadError {
                status: 400,
                message: "the request head ends early".into(),
            }));
        }
        buf.extend_from_slice(&chunk[..n]);
        match parse_request_head(&buf) {
            Ok(Some((head, len))) => return Ok(Ok(Some((head, buf.split_off(len))))),
            Ok(None) => {}
            Err(e) => return Ok(Err(e)),
        }
    }
}

/// Connects to the first address that answers.
fn connect_any(addrs: &[SocketAddr], host: &str) -> Result<TcpStream, Failure> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => {
                // The proxy forwards what it has as it has it (a request's head, then its
                // body; a tunnel's reads): no Nagle wait on the upstream's delayed ACK.
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(Failure {
        kind: FailureKind::Connect,
        message: format!("cannot connect to {host}: {last}"),
    })
}

/// What the sandbox is told when `d` denies `action`.
fn denied(action: &Action, d: &Decision) -> String {
    format!(
        "agentrun: {} denied by rule {}: {}",
        action.resource(),
        d.rule_id,
        d.reason
    )
}

fn respond(c: &mut UnixStream, code: u16, text: &str, body: &str) -> io::Result<()> {
    let body = format!("{body}\n");
    let msg = format!(
        "HTTP/1.1 {code} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(msg.as_bytes())?;
    let _ = c.shutdown(Shutdown::Write);
    Ok(())
}

/// A forwarded request: its body (framed by the proxy) upstream, then nothing more from
/// the client; the response back until the upstream closes (the head asked it to).
fn forward(client: UnixStream, upstream: TcpStream, body: Body, rest: Vec<u8>) -> io::Result<()> {
    let mut to_client = client.try_clone()?;
    let mut up = upstream.try_clone()?;
    let waker = client.try_clone()?;
    let sender = std::thread::spawn(move || {
        let mut from = BufReader::new(io::Cursor::new(rest).chain(client));
        if request::relay_body(body, &mut from, &mut up).is_err() {
            // A body that ends early or breaks its framing: the request is void.
            let _ = up.shutdown(Shutdown::Both);
        }
    });
    let mut u = upstream;
    let _ = io::copy(&mut u, &mut to_client);
    let _ = waker.shutdown(Shutdown::Both);
    let _ = sender.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{allowing, ask, closing, serving, tunnel, upstream};
    use std::sync::Mutex;

    /// A resolver from a table (a name missing from it does not resolve).
    struct TableResolver(Vec<(&'static str, Vec<&'static str>)>);

    impl Resolve for TableResolver {
        fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
            let (_, ips) = self
                .0
                .iter()
                .find(|(h, _)| *h == host)
                .ok_or_else(|| io::Error::other("Name or service not known"))?;
            Ok(ips
                .iter()
                .map(|ip| SocketAddr::new(ip.parse().unwrap(), port))
                .collect())
        }
    }

    type Seen = Arc<Mutex<Vec<String>>>;

    /// The Node preload is written at the first bind in a directory, not at every one, and
    /// again when the directory was wiped (or the file is not what was written).
    #[test]
    fn the_node_preload_is_written_once_per_directory() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("egress");
        std::fs::create_dir(&dir).unwrap();
        let sock = dir.join("proxy.sock");
        let preload = dir.join(NODE_PRELOAD_FILE);
        let inode = || {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&preload).unwrap();
            (
                m.ino(),
                m.modified().unwrap(),
                m.permissions().mode() & 0o7777,
            )
        };
        drop(bind(&sock).unwrap());
        assert_eq!(std::fs::read_to_string(&preload).unwrap(), NODE_PRELOAD);
        // An old mtime: a rewrite would show as a new one.
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
        std::fs::File::options()
            .write(true)
            .open(&preload)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let first = inode();
        assert_eq!(first.2, 0o644);
        drop(bind(&sock).unwrap());
        assert_eq!(inode(), first, "rewritten at the second bind");
        // Wiped: written again.
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        drop(bind(&sock).unwrap());
        assert_eq!(std::fs::read_to_string(&preload).unwrap(), NODE_PRELOAD);
        // Not what was written (cut short, or another mode): written again.
        std::fs::write(&preload, "x").unwrap();
        drop(bind(&sock).unwrap());
        assert_eq!(std::fs::read_to_string(&preload).unwrap(), NODE_PRELOAD);
        std::fs::set_permissions(&preload, std::fs::Permissions::from_mode(0o600)).unwrap();
        drop(bind(&sock).unwrap());
        assert_eq!(inode().2, 0o644);
    }

    /// A proxy with `policy`, a table resolver, and sinks writing what they get to `seen`.
    fn proxy_with(
        tag: &str,
        policy: NetworkPolicy,
        table: TableResolver,
    ) -> (Proxy, PathBuf, Seen, tempfile::TempDir) {
        let dir = tempfile::Builder::new()
            .prefix(&format!("agentrun-egress-{tag}-"))
            .tempdir()
            .unwrap();
        let path = dir.path().join("proxy.sock");
        let seen: Seen = Arc::default();
        let (s1, s2) = (seen.clone(), seen.clone());
        let sink: DecisionSink = Arc::new(move |a, d| {
            s1.lock().unwrap().push(format!(
                "{} {} {} {}",
                d.verdict(),
                a.resource(),
                d.rule_id,
                d.reason
            ));
            true
        });
        let failures: FailureSink = Arc::new(move |a, d, f| {
            s2.lock().unwrap().push(format!(
                "error {} {} {} {}",
                a.resource(),
                d.rule_id,
                f.kind.error_type(),
                f.message
            ));
        });
        let proxy = Proxy::builder(policy, sink)
            .failures(failures)
            .resolver(Arc::new(table))
            .start(bind(&path).unwrap(), &path);
        (proxy, path, seen, dir)
    }

    /// A shell's proxy socket path serves one run after another: a proxy stopped after the
    /// next one was bound at its path (a slow client of the previous run) leaves the next
    /// one's socket file and listener alone, and makes no connection to it.
    #[test]
    fn a_stopped_proxy_leaves_a_later_one_at_its_path_alone() {
        let table = || TableResolver(Vec::new());
        let (first, path, seen1, _dir) = proxy_with("reuse", NetworkPolicy::default(), table());
        let seen2: Seen = Arc::default();
        let s2 = seen2.clone();
        let sink: DecisionSink = Arc::new(move |a, d| {
            s2.lock()
                .unwrap()
                .push(format!("{} {}", d.verdict(), a.resource()));
            true
        });
        let second = Proxy::builder(NetworkPolicy::default(), sink)
            .resolver(Arc::new(table()))
            .start(bind(&path).unwrap(), &path);
        first.stop();
        assert!(path.exists(), "the later proxy's socket file was removed");
        let r = ask(&path, "CONNECT denied.test:443 HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 403 Forbidden"), "{r}");
        assert_eq!(*seen2.lock().unwrap(), ["deny denied.test:443"]);
        assert!(seen1.lock().unwrap().is_empty());
        second.stop();
        assert!(!path.exists(), "a proxy removes its own socket file");
    }

    /// Names are resolved by the proxy and every address is checked: a wildcard never
    /// reaches a private or host-internal address; a name that does not resolve and an
    /// upstream that refuses are errors (502), not denials.
    #[test]
    fn resolved_addresses_are_checked_and_failures_are_errors_not_denials() {
        let (closed, closed_port) = upstream();
        drop(closed);
        let mut policy = NetworkPolicy::default();
        policy
            .allow_hosts(
                "cli.allow_host",
                &[
                    "*.wild.test".into(),
                    format!("127.0.0.1:{closed_port}"),
                    "exact.test".into(),
                ],
            )
            .unwrap();
        let table = TableResolver(vec![
            ("metadata.wild.test", vec!["169.254.169.254"]),
            ("private.wild.test", vec!["93.184.216.34", "10.1.2.3"]),
            ("nat64.wild.test", vec!["64:ff9b::a9fe:a9fe"]),
            ("loop.wild.test", vec!["127.0.0.1"]),
            ("exact.test", vec!["127.0.0.1"]),
        ]);
        let (proxy, path, seen, _dir) = proxy_with("resolve", policy, table);
        for (host, ip) in [
            ("metadata.wild.test", "169.254.169.254"),
            ("private.wild.test", "10.1.2.3"),
            ("nat64.wild.test", "64:ff9b::a9fe:a9fe"),
            ("loop.wild.test", "127.0.0.1"),
            ("exact.test", "127.0.0.1"),
        ] {
            let r = ask(&path, &format!("CONNECT {host}:443 HTTP/1.1\r\n\r\n"));
            assert!(r.starts_with("HTTP/1.1 403 Forbidden"), "{host}: {r}");
            assert!(
                r.contains("network.resolved_address") && r.contains(ip),
                "{host}: {r}"
            );
        }
        let r = ask(
            &path,
            "GET http://nosuch.wild.test/ HTTP/1.1\r\nHost: nosuch.wild.test\r\n\r\n",
        );
        assert!(r.starts_with("HTTP/1.1 502 Bad Gateway"), "{r}");
        assert!(
            r.contains("cannot resolve nosuch.wild.test: Name or service not known"),
            "{r}"
        );
        let r = ask(
            &path,
            &format!("CONNECT 127.0.0.1:{closed_port} HTTP/1.1\r\n\r\n"),
        );
        assert!(r.starts_with("HTTP/1.1 502 Bad Gateway"), "{r}");
        assert!(r.contains("cannot connect to 127.0.0.1"), "{r}");
        proxy.stop();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 9, "{seen:#?}");
        for s in &seen[..5] {
            assert!(
                s.starts_with("deny ") && s.contains(" network.resolved_address "),
                "{s}"
            );
        }
        assert!(
            seen[5].starts_with("allow nosuch.wild.test:80 cli.allow_host[0]"),
            "{seen:#?}"
        );
        assert!(
            seen[6]
                .starts_with("error nosuch.wild.test:80 cli.allow_host[0] resolve cannot resolve"),
            "{seen:#?}"
        );
        assert!(seen[7].starts_with(&format!("allow 127.0.0.1:{closed_port} cli.allow_host[1]")));
        assert!(seen[8].starts_with(&format!(
            "error 127.0.0.1:{closed_port} cli.allow_host[1] connect"
        )));
    }

    /// Answers from a queue (a missing answer: never answers), keeping every question.
    struct Scripted {
        answers: Mutex<Vec<Option<agentrun_policy::Approval>>>,
        asked: Mutex<Vec<agentrun_policy::EscalationRequest>>,
    }

    impl agentrun_policy::Approver for Scripted {
        fn ask(&self, q: agentrun_policy::EscalationRequest) -> agentrun_policy::ApprovalFuture {
            self.asked.lock().unwrap().push(q);
            let next = self.answers.lock().unwrap().remove(0);
            match next {
                Some(a) => Box::pin(std::future::ready(a)),
                None => Box::pin(std::future::pending()),
            }
        }
    }

    /// An escalate host: held while the approver is asked, then relayed (approved; the
    /// approval is remembered for the next connections), refused 403 (denied, no answer in
    /// time, no approver); every decision reaches the sink as `escalate` with its outcome.
    #[test]
    fn escalate_asks_the_approver_and_remembers_approvals() {
        let (server, port) = serving(2, |_| {
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".into()
        });
        let policy = |port: u16| {
            agentrun_policy::Profile::parse(
                &format!(
                    "[network]\nmode = \"allowlist\"\nescalate = [\"127.0.0.1:{port}\", \"127.0.0.2:{port}\"]\n"
                ),
                "t",
            )
            .unwrap()
            .network
        };
        let scripted = Arc::new(Scripted {
            answers: Mutex::new(vec![
                Some(agentrun_policy::Approval::Denied {
                    why: "the user answered no".into(),
                }),
                Some(agentrun_policy::Approval::Approved),
                None,
            ]),
            asked: Mutex::default(),
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.sock");
        let seen: Seen = Arc::default();
        let s1 = seen.clone();
        let sink: DecisionSink = Arc::new(move |a, d| {
            s1.lock().unwrap().push(format!(
                "{} {} {} {} {}",
                d.verdict(),
                d.escalation.map_or("-", |o| o.as_str()),
                a.resource(),
                d.rule_id,
                d.reason
            ));
            true
        });
        let proxy = Proxy::builder(policy(port), sink)
            .approver(scripted.clone())
            .approval_timeout(Duration::from_millis(300))
            .sandbox_id("ar-test")
            .start(bind(&path).unwrap(), &path);
        let get = |host: &str| {
            ask(
                &path,
                &format!("GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"),
            )
        };
        let r = get("127.0.0.1");
        assert!(r.starts_with("HTTP/1.1 403 Forbidden"), "{r}");
        assert!(r.contains("not approved (the user answered no)"), "{r}");
        for _ in 0..2 {
            let r = get("127.0.0.1");
            assert!(r.starts_with("HTTP/1.1 200 OK") && r.ends_with("ok"), "{r}");
        }
        let r = get("127.0.0.2");
        assert!(r.contains("needs approval: no answer within 300 ms"), "{r}");
        proxy.stop();
        server.join().unwrap();
        let asked = scripted.asked.lock().unwrap();
        assert_eq!(asked.len(), 3, "the approval was remembered: {asked:?}");
        assert_eq!(asked[0].sandbox_id, "ar-test");
        assert_eq!(asked[0].action, "net.connect");
        assert_eq!(asked[0].resource, format!("127.0.0.1:{port}"));
        assert_eq!(asked[0].rule_id, "network.escalate[0]");
        let seen = seen.lock().unwrap();
        let outcomes: Vec<String> = seen
            .iter()
            .map(|s| s.split(' ').take(4).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(
            outcomes,
            [
                format!("escalate denied 127.0.0.1:{port} network.escalate[0]"),
                format!("escalate approved 127.0.0.1:{port} network.escalate[0]"),
                format!("escalate approved 127.0.0.1:{port} network.escalate[0]"),
                format!("escalate timeout 127.0.0.2:{port} network.escalate[1]"),
            ]
        );
        assert!(
            seen[2].contains("earlier in this sandbox's life"),
            "{seen:?}"
        );

        // No approver: denied, "needs approval".
        let (proxy, path, seen, _dir) =
            proxy_with("noapprover", policy(port), TableResolver(Vec::new()));
        let r = ask(&path, &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"));
        assert!(r.starts_with("HTTP/1.1 403 Forbidden"), "{r}");
        assert!(
            r.contains("needs approval (no one can be asked here): connecting to 127.0.0.1"),
            "{r}"
        );
        proxy.stop();
        assert!(seen.lock().unwrap()[0].starts_with("escalate "), "{seen:?}");
    }

    /// Hostile heads through the real proxy: each refused with its status, nothing reaches
    /// the upstream; a chunked body arrives re-framed, and what follows it is dropped.
    #[test]
    fn smuggling_attempts_never_reach_the_upstream() {
        let (upstream, port) = upstream();
        let got: Seen = Arc::default();
        let g2 = got.clone();
        let server = std::thread::spawn(move || {
            let (mut s, _) = upstream.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            // Read until the proxy has sent the whole re-framed body (the last chunk).
            while !req.ends_with(b"0\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            // Anything more the proxy sends after the body would be a smuggled request.
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .unwrap();
            g2.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&req).into_owned());
        });
        let policy = allowing(&[port]);
        let (proxy, path, seen, _dir) = proxy_with("smuggle", policy, TableResolver(Vec::new()));
        let a = format!("127.0.0.1:{port}");
        let hostile = [
            (format!("POST http://{a}/ HTTP/1.1\r\nHost: {a}\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX"), 400),
            (format!("POST http://{a}/ HTTP/1.1\r\nHost: {a}\r\nContent-Length: 1\r\nContent-Length: 40\r\n\r\n"), 400),
            (format!("GET http://{a}/ HTTP/1.1\r\nHost: {a}\r\nX: 1\r\n Transfer-Encoding: chunked\r\n\r\n"), 400),
            (format!("GET http://{a}/ HTTP/1.1\nHost: {a}\nTransfer-Encoding: chunked\n\n"), 400),
            (format!("GET http://{a}/ HTTP/1.1\r\nHost: evil.example\r\n\r\n"), 400),
            (format!("GET http://{a}/ HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000)), 431),
            (format!("POST http://{a}/ HTTP/1.1\r\nHost: {a}\r\nTransfer-Encoding: identity\r\n\r\n"), 501),
        ];
        for (req, status) in &hostile {
            let r = ask(&path, req);
            assert!(
                r.starts_with(&format!("HTTP/1.1 {status} ")),
                "{req:?}: {r}"
            );
        }
        let r = ask(
            &path,
            &format!(
                "POST http://{a}/upload HTTP/1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n3;x=y\r\nabc\r\n0\r\nTrailer: t\r\n\r\nGET http://{a}/smuggled HTTP/1.1\r\nHost: {a}\r\n\r\n"
            ),
        );
        assert!(r.starts_with("HTTP/1.1 200 OK") && r.ends_with("ok"), "{r}");
        server.join().unwrap();
        proxy.stop();
        let got = got.lock().unwrap();
        assert_eq!(
            got.as_slice(),
            [format!(
                "POST /upload HTTP/1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            )]
        );
        // Refused heads are not decisions: only the one request was decided.
        assert_eq!(seen.lock().unwrap().len(), 1, "{:?}", seen.lock().unwrap());
    }

    /// A real proxy on a unix socket in front of a real loopback HTTP server.
    #[test]
    fn proxy_allows_denies_and_reports() {
        let (server, port) = serving(2, |req| {
            let first = req.lines().next().unwrap_or_default();
            closing(&format!("hello {first}"))
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.sock");
        let policy = allowing(&[port]);
        let seen: Arc<Mutex<Vec<(String, Decision)>>> = Arc::default();
        let s2 = seen.clone();
        let sink: DecisionSink = Arc::new(move |a, d| {
            s2.lock().unwrap().push((a.resource(), d.clone()));
            true
        });
        let proxy = Proxy::start(bind(&path).unwrap(), &path, policy, sink);
        let ask = |req: String| ask(&path, &req);
        let r = ask(format!(
            "GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
        ));
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        assert!(r.ends_with("hello GET /x HTTP/1.1"), "{r}");
        let r = ask(format!(
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET /tunnel HTTP/1.1\r\n\r\n"
        ));
        assert!(r.starts_with("HTTP/1.1 200 Connection established"), "{r}");
        assert!(r.ends_with("hello GET /tunnel HTTP/1.1"), "{r}");
        let r = ask("CONNECT evil.example:443 HTTP/1.1\r\n\r\n".into());
        assert!(r.starts_with("HTTP/1.1 403"), "{r}");
        assert!(r.contains("network.default"), "{r}");
        server.join().unwrap();
        proxy.stop();
        assert!(!path.exists());
        let seen = seen.lock().unwrap();
        let got: Vec<(String, bool, String)> = seen
            .iter()
            .map(|(r, d)| (r.clone(), d.allow, d.rule_id.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    format!("127.0.0.1:{port}"),
                    true,
                    "cli.allow_host[0]".into()
                ),
                (
                    format!("127.0.0.1:{port}"),
                    true,
                    "cli.allow_host[0]".into()
                ),
                ("evil.example:443".into(), false, "network.default".into()),
            ]
        );
    }

    /// Replacing the shared policy decides the next connection with the new one.
    #[test]
    fn policy_swaps_take_effect_on_the_next_connection() {
        let (server, port) = serving(1, |_| closing("hi"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.sock");
        let policy: SharedPolicy = Arc::new(RwLock::new(
            NetworkPolicy::from_opensandbox(r#"{"defaultAction":"deny"}"#).unwrap(),
        ));
        let rules: Arc<Mutex<Vec<String>>> = Arc::default();
        let r2 = rules.clone();
        let sink: DecisionSink = Arc::new(move |_, d| {
            r2.lock()
                .unwrap()
                .push(format!("{} {}", d.verdict(), d.rule_id));
            true
        });
        let proxy = Proxy::start_shared(bind(&path).unwrap(), &path, policy.clone(), sink);
        let req =
            format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
        let ask = || ask(&path, &req);
        assert!(ask().starts_with("HTTP/1.1 403"));
        proxy.set_policy(
            NetworkPolicy::from_opensandbox(
                r#"{"defaultAction":"deny","egress":[{"action":"allow","target":"127.0.0.1"}]}"#,
            )
            .unwrap(),
        );
        let r = ask();
        assert!(r.starts_with("HTTP/1.1 200 OK") && r.ends_with("hi"), "{r}");
        server.join().unwrap();
        *policy.write().unwrap() = NetworkPolicy::from_opensandbox(
            r#"{"defaultAction":"allow","egress":[{"action":"deny","target":"127.0.0.1"}]}"#,
        )
        .unwrap();
        assert!(ask().starts_with("HTTP/1.1 403"));
        proxy.stop();
        assert_eq!(
            *rules.lock().unwrap(),
            vec![
                "deny network.default",
                "allow networkPolicy.egress[0]",
                "deny networkPolicy.egress[0]"
            ]
        );
    }

    /// A policy change cuts the open tunnels it denies, and keeps the ones it still allows.
    #[test]
    fn policy_change_cuts_open_connections_it_denies() {
        let (upstream, port) = upstream();
        // Echoes every byte back until the client goes away.
        let server = std::thread::spawn(move || {
            let mut handlers = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = upstream.accept().unwrap();
                handlers.push(std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }));
            }
            for h in handlers {
                h.join().unwrap();
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.sock");
        let allow_ip = |extra: &str| {
            NetworkPolicy::from_opensandbox(&format!(
                r#"{{"defaultAction":"deny","egress":[{extra}{{"action":"allow","target":"127.0.0.1"}}]}}"#
            ))
            .unwrap()
        };
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s2 = seen.clone();
        let sink: DecisionSink = Arc::new(move |_, d| {
            s2.lock()
                .unwrap()
                .push(format!("{} {} {}", d.verdict(), d.rule_id, d.reason));
            true
        });
        let proxy = Proxy::start(bind(&path).unwrap(), &path, allow_ip(""), sink);
        let tunnel = || {
            let mut c = tunnel(&path, port);
            c.write_all(b"ping").unwrap();
            let mut echo = [0u8; 4];
            c.read_exact(&mut echo).unwrap();
            assert_eq!(&echo, b"ping");
            c
        };
        let mut t = tunnel();
        // Still allowed (another rule first): the tunnel stays.
        assert_eq!(
            proxy.set_policy(allow_ip(r#"{"action":"allow","target":"a.com"},"#)),
            0
        );
        t.write_all(b"more").unwrap();
        let mut echo = [0u8; 4];
        t.read_exact(&mut echo).unwrap();
        assert_eq!(&echo, b"more");
        let mut t2 = tunnel();
        // Denied now: both tunnels are cut, each denial reported.
        let deny = NetworkPolicy::from_opensandbox(
            r#"{"defaultAction":"allow","egress":[{"action":"deny","target":"127.0.0.1"}]}"#,
        )
        .unwrap();
        assert_eq!(proxy.set_policy(deny.clone()), 2);
        assert_eq!(proxy.policy(), deny);
        for c in [&mut t, &mut t2] {
            let mut rest = Vec::new();
            let _ = c.read_to_end(&mut rest);
            assert!(rest.is_empty(), "{rest:?}");
        }
        server.join().unwrap();
        proxy.stop();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert!(
            seen[0].starts_with("allow networkPolicy.egress[0]"),
            "{seen:?}"
        );
        assert!(
            seen[1].starts_with("allow networkPolicy.egress[1]"),
            "{seen:?}"
        );
        for s in &seen[2..] {
            assert!(
                s.starts_with("deny networkPolicy.egress[0]")
                    && s.ends_with("(open connection cut: the policy changed)"),
                "{seen:?}"
            );
        }
    }
}
