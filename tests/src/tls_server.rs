//! A TLS server of the test's own, for the egress proxy and credential vault tests: its CA
//! and certificate (made with `openssl`), the server process (killed when dropped), the wait
//! for its port, `agentrun` run inside private namespaces (where the server's private
//! addresses exist), and the scan of a directory's files for a secret.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use crate::{run_with_timeout, wait_until, Agentrun, RunOutput};

/// `openssl ARGS` in `dir`; panics with its stderr if it fails.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`ca.pem`, `ca.key`) and a server certificate it signed for `alt_names` (an
/// openssl subjectAltName value, e.g. `IP:127.0.0.1`): `server.pem`, `server.key`, in `dir`.
pub fn certs(dir: &Path, alt_names: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=e2e upstream CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=e2e upstream",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        format!("subjectAltName={alt_names}\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

/// A server process of the test's, killed and reaped when dropped (also when the test
/// panics).
pub struct Server(Child);

impl Server {
    /// Spawns `cmd`, then waits (20 s at most, else panics) until each of `ports` on
    /// 127.0.0.1 accepts a connection.
    pub fn start(mut cmd: Command, ports: &[u16]) -> Server {
        let server = Server(cmd.spawn().expect("the test's server"));
        for &port in ports {
            let up = wait_until(Duration::from_secs(20), || {
                // Closed at once: a server may do its TLS handshakes one at a time.
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .ok()
                    .map(drop)
            });
            assert!(up.is_some(), "the test's server on {port} did not start");
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `a`, run inside `unshare --mount [--net]` after `setup` (sh) ran there; `after` (sh)
/// runs once it exits, whose status is kept. 180 s at most.
pub fn in_namespaces(a: Agentrun, net: bool, setup: &str, after: &str) -> RunOutput {
    let inner = a.command();
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private"]);
    if net {
        cmd.arg("--net");
    }
    cmd.args([
        "--",
        "sh",
        "-c",
        &format!("set -e\n{setup}\nset +e\n\"$@\"\nrc=$?\n{after}\nexit $rc"),
        "sh",
    ]);
    cmd.arg(inner.get_program()).args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    run_with_timeout(cmd, None, Duration::from_secs(180))
}

/// The text of every file in `dir` (not in its subdirectories; bytes that are not UTF-8 replaced), one
/// after the other: what a test looks for a secret in (an audit log directory).
pub fn dir_text(dir: &Path) -> String {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned())
        .collect()
}

/// The TLS server of the credential tests (`python3 server.py ADDR PORT CERT KEY`,
/// `E2E_SECRET` in its environment): answers `auth=ok` when the request carries
/// `Authorization: Bearer $E2E_SECRET`, else `auth=missing`; then the path. Never echoes a
/// header back. The file `tests/src/bearer_server.py`, which `hack/bench egress` runs too.
pub const BEARER_SERVER: &str = include_str!("bearer_server.py");

/// [`BEARER_SERVER`], written to `d/server.py`, on 127.0.0.1 at a free port with the
/// certificate [`certs`] made in `d`, answering `auth=ok` to `Bearer {secret}`; up once this
/// returns.
pub fn bearer_server(d: &Path, secret: &str) -> (u16, Server) {
    std::fs::write(d.join("server.py"), BEARER_SERVER).expect("server.py");
    let port = crate::osb::free_port();
    let mut cmd = Command::new("python3");
    cmd.args([
        "server.py",
        "127.0.0.1",
        &port.to_string(),
        "server.pem",
        "server.key",
    ])
    .current_dir(d)
    .env("E2E_SECRET", secret);
    (port, Server::start(cmd, &[port]))
}
