//! Fixtures the proxy's tests share (`lib.rs`'s and `mitm_tests.rs`'s): a loopback upstream
//! port, a policy allowing it, a vault from JSON, and requests through the proxy's socket.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use agentrun_policy::NetworkPolicy;

use crate::vault::Vault;

/// A listener on a free loopback port, and the port.
pub(crate) fn upstream() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// A policy allowing `127.0.0.1` on each of `ports` (as `--allow-host` would).
pub(crate) fn allowing(ports: &[u16]) -> NetworkPolicy {
    let mut policy = NetworkPolicy::default();
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    policy.allow_hosts("cli.allow_host", &hosts).unwrap();
    policy
}

/// Sends `req` to the proxy at `path` and returns all it answers until it closes.
pub(crate) fn ask(path: &Path, req: &str) -> String {
    let mut c = UnixStream::connect(path).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}

/// Opens a tunnel through the proxy at `path` to `127.0.0.1:port` (asserting the proxy
/// established it) and returns the client's end.
pub(crate) fn tunnel(path: &Path, port: u16) -> UnixStream {
    let mut c = UnixStream::connect(path).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(c, "CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").unwrap();
    let mut head = [0u8; 39];
    c.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200 Connection established"));
    c
}

/// A vault holding what `spec` (the create request's JSON) declares.
pub(crate) fn vault_of(spec: serde_json::Value) -> Vault {
    let vault = Vault::new();
    vault.create(serde_json::from_value(spec).unwrap()).unwrap();
    vault
}

/// Applies `change` (the mutate request's JSON) to `vault`.
pub(crate) fn mutate(vault: &Vault, change: serde_json::Value) {
    vault
        .mutate(serde_json::from_value(change).unwrap())
        .unwrap();
}

/// Reads a request head from `s`: all read up to its blank line, or `None` if `s` closed
/// or failed first.
pub(crate) fn read_head(s: &mut impl Read) -> Option<String> {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&req).into_owned())
}

/// A `200 OK` response with `body`, and `Connection: close`.
pub(crate) fn closing(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// An upstream on a free loopback port serving `n` connections one after another: each
/// reads one request (one read) and is answered `answer(request)`. Its thread, and the port.
pub(crate) fn serving(
    n: usize,
    answer: impl Fn(&str) -> String + Send + 'static,
) -> (JoinHandle<()>, u16) {
    let (l, port) = upstream();
    let server = std::thread::spawn(move || {
        for _ in 0..n {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let got = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..got]);
            // The client may have gone already (a test that stopped reading).
            let _ = s.write_all(answer(&req).as_bytes());
        }
    });
    (server, port)
}
