//! agentrun's egress proxy: the only way out of a sandbox's network namespace.
//!
//! A sandbox has no route outside its own loopback. When its profile allows hosts, agentrun
//! runs this proxy on the host side, listening on a unix socket in the sandbox's state dir;
//! the sandbox's init bridges `127.0.0.1:3128` inside the sandbox to that socket
//! (`agentrun_runtime::net`), and the command gets `HTTP_PROXY`/`HTTPS_PROXY` pointing there.
//!
//! For each connection the proxy reads one request head:
//! - `CONNECT host:port` (HTTPS and any TCP tunnel), or
//! - an absolute-form HTTP request (`GET http://host[:port]/path`), forwarded in origin form;
//!
//! asks the [`NetworkPolicy`] about `host:port` *before* resolving anything, reports the
//! decision to the caller's [`DecisionSink`], and then either answers `403` (naming the rule)
//! or resolves the name itself, refuses names that resolve to loopback, link-local,
//! multicast or unspecified addresses (rebinding to host-internal services), connects and
//! relays bytes both ways. Threads, not async: the cold path starts the proxy after the
//! sandbox exists, in a process that must otherwise stay single-threaded while it is created.
//!
//! The policy is shared ([`SharedPolicy`]) and may be replaced while the proxy runs
//! ([`Proxy::set_policy`], for the OpenSandbox egress endpoint's `PATCH`/`DELETE /policy`).
//! Each connection is decided by the policy in force when its request head arrives; on a
//! change, connections already relaying are decided again and those the new policy denies
//! are cut (and the denial reported).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use agentrun_policy::{Action, Decision, NetworkPolicy};

/// Port the sandbox's init listens on inside the sandbox.
pub const SANDBOX_PROXY_PORT: u16 = 3128;
/// Largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;
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
}

/// Receives every decision the proxy makes (to trace and audit it), before it acts on it.
/// Returns whether the decision was recorded: an allow that could not be recorded is not
/// acted on (the client gets 503).
pub type DecisionSink = Arc<dyn Fn(&Action, &Decision) -> bool + Send + Sync>;

/// A network policy that can be replaced while a proxy decides with it.
pub type SharedPolicy = Arc<RwLock<NetworkPolicy>>;

/// The environment that points a sandboxed command at the proxy.
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{SANDBOX_PROXY_PORT}");
    ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .iter()
        .map(|k| (k.to_string(), url.clone()))
        .collect()
}

/// Binds the proxy's unix socket (mode 0666: the sandbox's uid connects to it through a
/// read-only bind mount of its directory). No thread is started.
pub fn bind(path: &Path) -> Result<UnixListener, EgressError> {
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

/// A running proxy. [`Proxy::stop`] (or dropping it) stops accepting connections.
pub struct Proxy {
    path: PathBuf,
    stopping: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    policy: SharedPolicy,
    sink: DecisionSink,
    open: Arc<Mutex<OpenConns>>,
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

impl Proxy {
    /// Serves `listener` (from [`bind`] at `path`) on a new thread, with a fixed policy.
    pub fn start(
        listener: UnixListener,
        path: &Path,
        policy: NetworkPolicy,
        sink: DecisionSink,
    ) -> Proxy {
        Self::start_shared(listener, path, Arc::new(RwLock::new(policy)), sink)
    }

    /// Like [`Proxy::start`], deciding every new connection with whatever `policy` holds
    /// at that moment.
    pub fn start_shared(
        listener: UnixListener,
        path: &Path,
        policy: SharedPolicy,
        sink: DecisionSink,
    ) -> Proxy {
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let active = Arc::new(AtomicUsize::new(0));
        let open: Arc<Mutex<OpenConns>> = Arc::default();
        let (policy2, sink2, open2) = (policy.clone(), sink.clone(), open.clone());
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
                    let (policy, sink, done) = (policy2.clone(), sink2.clone(), active.clone());
                    let open = open2.clone();
                    let spawned = std::thread::Builder::new()
                        .name("egress-conn".into())
                        .spawn(move || {
                            let _ = handle(conn, &policy, &sink, &open);
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
            stopping,
            accept,
            policy,
            sink,
            open,
        }
    }

    /// Puts `policy` in force: the next connection is decided by it, and every connection
    /// relaying now is decided again; those it denies are cut, each denial reported to the
    /// sink. Returns how many were cut.
    pub fn set_policy(&self, policy: NetworkPolicy) -> usize {
        let mut open = lock_open(&self.open);
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = policy.clone();
        let mut cut = Vec::new();
        for (id, c) in &open.conns {
            let mut d = policy.check(&c.host, c.port);
            if d.allow && !explicit(&policy, &d) {
                // Only `mode = "all"` allows it now: an internal address needs a rule naming it.
                if let Ok(peer) = c.upstream.peer_addr() {
                    if internal(peer.ip()) || private(peer.ip()) {
                        d = Decision::deny(
                            "network.internal_address",
                            format!(
                                "{} is internal or private; only a rule naming it allows it",
                                peer.ip()
                            ),
                        );
                    }
                }
            }
            if !d.allow {
                d.reason = format!("{} (open connection cut: the policy changed)", d.reason);
                let action = Action::Connect {
                    host: c.host.clone(),
                    port: c.port,
                };
                (self.sink)(&action, &d);
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
        self.policy
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
        // Wake the accept loop. If the socket is gone already (its directory was removed),
        // nothing can wake it: leave the thread rather than block forever.
        let woken = UnixStream::connect(&self.path).is_ok();
        if let Some(h) = self.accept.take() {
            if woken {
                let _ = h.join();
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    connect: bool,
    host: String,
    port: u16,
    /// For forwarded HTTP: the head rewritten to origin form.
    forward: Vec<u8>,
}

/// Whether the rule that allowed `d` names a host (not only `mode = "all"` or `*`).
fn explicit(policy: &NetworkPolicy, d: &Decision) -> bool {
    policy
        .rules
        .iter()
        .any(|r| r.id == d.rule_id && r.host != "*")
}

fn handle(
    mut client: UnixStream,
    policy: &RwLock<NetworkPolicy>,
    sink: &DecisionSink,
    open: &Mutex<OpenConns>,
) -> io::Result<()> {
    client.set_read_timeout(Some(IO_TIMEOUT))?;
    let (head_bytes, rest) = match read_head(&mut client)? {
        Some(x) => x,
        None => return Ok(()),
    };
    let head = match parse_head(&head_bytes) {
        Ok(h) => h,
        Err(why) => return respond(&mut client, 400, "Bad Request", &format!("agentrun: {why}")),
    };
    let action = Action::Connect {
        host: head.host.clone(),
        port: head.port,
    };
    // The policy in force now decides this connection (it may be replaced at any time).
    let (mut decision, explicit) = {
        let policy = policy.read().unwrap_or_else(|p| p.into_inner());
        let d = policy.check(&head.host, head.port);
        // Allowed by a rule naming the host, or only by `mode = "all"`.
        let explicit = explicit(&policy, &d);
        (d, explicit)
    };
    let mut upstream = None;
    if decision.allow {
        match resolve(&head.host, head.port, explicit).map_err(|mut d| {
            d.reason = format!("{} (after rule {} allowed it)", d.reason, decision.rule_id);
            d
        }) {
            Ok(addrs) => match connect_any(&addrs) {
                Ok(s) => upstream = Some(s),
                Err(e) => {
                    sink(&action, &decision);
                    let msg = format!("agentrun: {}: {e}", action.resource());
                    return respond(&mut client, 502, "Bad Gateway", &msg);
                }
            },
            Err(d) => decision = d,
        }
    }
    let recorded = sink(&action, &decision);
    if decision.allow && !recorded {
        let msg = format!(
            "agentrun: {}: the decision could not be recorded",
            action.resource()
        );
        return respond(&mut client, 503, "Service Unavailable", &msg);
    }
    let Some(mut upstream) = upstream else {
        let msg = format!(
            "agentrun: {} denied by rule {}: {}",
            action.resource(),
            decision.rule_id,
            decision.reason
        );
        return respond(&mut client, 403, "Forbidden", &msg);
    };
    client.set_read_timeout(None)?;
    if head.connect {
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    } else {
        upstream.write_all(&head.forward)?;
    }
    upstream.write_all(&rest)?;
    // Registered so that a policy change can cut it. A change made since the decision (it
    // holds this lock while it swaps) is seen here: decide again under the lock.
    let id = {
        let mut o = lock_open(open);
        let now = policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .check(&head.host, head.port);
        if !now.allow {
            let mut d = now;
            d.reason = format!("{} (open connection cut: the policy changed)", d.reason);
            sink(&action, &d);
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
    let result = relay(client, upstream);
    lock_open(open).conns.remove(&id);
    result
}

/// Reads until the end of the head; returns (head, bytes read past it). `None` on EOF.
fn read_head(c: &mut UnixStream) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = c.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok(Some((buf, rest)));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
        }
    }
}

fn parse_head(head: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(head).map_err(|_| "request head is not UTF-8".to_string())?;
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v)) if v.starts_with("HTTP/") => (m, t, v),
        _ => return Err(format!("malformed request line {first:?}")),
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None)?;
        return Ok(Head {
            connect: true,
            host,
            port,
            forward: Vec::new(),
        });
    }
    let rest = target.strip_prefix("http://").ok_or_else(|| {
        format!("{target:?}: the proxy forwards http:// URLs; use CONNECT for anything else")
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = split_authority(authority, Some(80))?;
    let mut forward = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        if name.eq_ignore_ascii_case("proxy-connection")
            || name.eq_ignore_ascii_case("proxy-authorization")
        {
            continue;
        }
        forward.push_str(line);
        forward.push_str("\r\n");
    }
    forward.push_str("\r\n");
    Ok(Head {
        connect: false,
        host,
        port,
        forward: forward.into_bytes(),
    })
}

/// `host:port`, `[v6]:port` or (with a default port) `host`.
fn split_authority(a: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    let a = a.rsplit_once('@').map_or(a, |(_, h)| h);
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("bad authority {a:?}"))?;
        (h, after.strip_prefix(':'))
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("bad port in {a:?}"))?,
        None => default_port.ok_or_else(|| format!("{a:?}: CONNECT needs host:port"))?,
    };
    if host.is_empty() {
        return Err(format!("no host in {a:?}"));
    }
    Ok((host.to_ascii_lowercase(), port))
}

/// Whether an address is private to the host or its network (RFC 1918, CGNAT, unique local),
/// besides [`internal`].
fn private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_private() || (v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xfe00) == 0xfc00
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| private(IpAddr::V4(v4)))
        }
    }
}

/// Whether an address is one a name must never resolve to through the proxy.
fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback() || v4.is_link_local() || v4.is_unspecified() || v4.is_multicast()
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| internal(IpAddr::V4(v4)))
        }
    }
}

/// Resolves `host` (the proxy does DNS, never the sandbox). A literal IP is used as is (the
/// policy allowed exactly it); a name resolving to an internal address is refused.
///
/// `explicit`: a rule named this host (not just `mode = "all"`). Without one, literal and
/// resolved addresses must also not be internal or private: "all" means the internet, not
/// the host's own services or its network.
fn resolve(host: &str, port: u16, explicit: bool) -> Result<Vec<SocketAddr>, Decision> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        if !explicit && (internal(ip) || private(ip)) {
            return Err(Decision::deny(
                "network.internal_address",
                format!("{ip} is internal or private; only a rule naming it allows it"),
            ));
        }
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Decision::deny("network.resolve", format!("cannot resolve {host}: {e}")))?
        .collect();
    if let Some(bad) = addrs
        .iter()
        .find(|a| internal(a.ip()) || (!explicit && private(a.ip())))
    {
        return Err(Decision::deny(
            "network.resolved_address",
            format!(
                "{host} resolves to internal address {} (allow the address itself to reach it)",
                bad.ip()
            ),
        ));
    }
    if addrs.is_empty() {
        return Err(Decision::deny(
            "network.resolve",
            format!("{host} has no address"),
        ));
    }
    Ok(addrs)
}

fn connect_any(addrs: &[SocketAddr]) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
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

/// Copies both ways until both sides are done.
fn relay(client: UnixStream, upstream: TcpStream) -> io::Result<()> {
    let mut c2 = client.try_clone()?;
    let mut u2 = upstream.try_clone()?;
    let up = std::thread::spawn(move || {
        let mut c = client;
        let _ = io::copy(&mut c, &mut u2);
        let _ = u2.shutdown(Shutdown::Write);
    });
    let mut u = upstream;
    let _ = io::copy(&mut u, &mut c2);
    let _ = c2.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::Mutex;

    #[test]
    fn parses_connect_and_absolute_form() {
        let h = parse_head(b"CONNECT PyPI.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n").unwrap();
        assert!(h.connect);
        assert_eq!((h.host.as_str(), h.port), ("pypi.org", 443));
        let h = parse_head(
            b"GET http://127.0.0.1:8080/a?b=1 HTTP/1.1\r\nHost: x\r\nProxy-Connection: keep-alive\r\n\r\n",
        )
        .unwrap();
        assert!(!h.connect);
        assert_eq!((h.host.as_str(), h.port), ("127.0.0.1", 8080));
        assert_eq!(
            String::from_utf8(h.forward).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        );
        let h = parse_head(b"GET http://[::1]/ HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!((h.host.as_str(), h.port), ("::1", 80));
        assert!(parse_head(b"GET /relative HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_head(b"CONNECT host HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn internal_addresses() {
        for a in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(internal(a.parse().unwrap()), "{a}");
        }
        for a in ["151.101.0.223", "10.1.2.3", "2a04:4e42::223"] {
            assert!(!internal(a.parse().unwrap()), "{a}");
        }
        let d = resolve("localhost", 80, true).unwrap_err();
        assert_eq!(d.rule_id, "network.resolved_address");
        assert!(resolve("127.0.0.1", 80, true).is_ok(), "a rule named it");
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.169.254",
            "fd00::1",
        ] {
            let d = resolve(ip, 80, false).unwrap_err();
            assert_eq!(d.rule_id, "network.internal_address", "{ip}");
        }
        assert!(resolve("151.101.0.223", 443, false).is_ok());
    }

    /// A real proxy on a unix socket in front of a real loopback HTTP server.
    #[test]
    fn proxy_allows_denies_and_reports() {
        let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = upstream.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut s, _) = upstream.accept().unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).unwrap();
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let first = req.lines().next().unwrap_or_default().to_string();
                let body = format!("hello {first}");
                write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
        });
        let dir = std::env::temp_dir().join(format!("agentrun-egress-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("proxy.sock");
        let mut policy = NetworkPolicy::default();
        policy
            .allow_hosts("cli.allow_host", &[format!("127.0.0.1:{port}")])
            .unwrap();
        let seen: Arc<Mutex<Vec<(String, Decision)>>> = Arc::default();
        let s2 = seen.clone();
        let sink: DecisionSink = Arc::new(move |a, d| {
            s2.lock().unwrap().push((a.resource(), d.clone()));
            true
        });
        let proxy = Proxy::start(bind(&path).unwrap(), &path, policy, sink);
        let ask = |req: String| {
            let mut c = UnixStream::connect(&path).unwrap();
            c.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out
        };
        let r = ask(format!(
            "GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
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
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Replacing the shared policy decides the next connection with the new one.
    #[test]
    fn policy_swaps_take_effect_on_the_next_connection() {
        let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = upstream.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = upstream.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
                .unwrap();
        });
        let dir = std::env::temp_dir().join(format!("agentrun-egress-swap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("proxy.sock");
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
        let ask = || {
            let mut c = UnixStream::connect(&path).unwrap();
            write!(
                c,
                "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out
        };
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
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A policy change cuts the open tunnels it denies, and keeps the ones it still allows.
    #[test]
    fn policy_change_cuts_open_connections_it_denies() {
        let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = upstream.local_addr().unwrap().port();
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
        let dir = std::env::temp_dir().join(format!("agentrun-egress-cut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("proxy.sock");
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
            let mut c = UnixStream::connect(&path).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            write!(c, "CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").unwrap();
            let mut head = [0u8; 39];
            c.read_exact(&mut head).unwrap();
            assert!(head.starts_with(b"HTTP/1.1 200 Connection established"));
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
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
