//! The escalate decision end to end through the real binary: a profile marks hosts
//! `[network] escalate` and paths `[filesystem] escalate_write`.
//!
//! - Without a controlling terminal, an escalate host is denied "needs approval" (403 from the
//!   egress proxy), nothing reaches it, and the decision is a `policy.check` span and an audit
//!   record with decision `escalate` and outcome `no_approver`.
//! - On a terminal (a real pty the test drives, the run's controlling terminal while its stdio
//!   are pipes), `agentrun exec` asks one line naming the action, the resource and the rule;
//!   `y` allows, `n` denies, an approval is remembered for the sandbox's life (not asked
//!   again), no answer within `--approval-timeout` denies; each outcome on its span and record.
//!   On the daemon path too (the run's egress proxy runs in the client).
//! - Processes are never given write access to an `escalate_write` path (the kernel denies
//!   it), and a read-write mount over one is refused before anything runs.
//!
//! An escalate "host" is a real HTTP server on the host's loopback, reachable only through
//! agentrun's egress proxy.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrun_e2e::otlp::{OtlpReceiver, ReceivedSpan};
use agentrun_e2e::{
    agentrun, exec_with, setup, setup_exclusive, tempdir, wait_until, Agentrun, LoopbackServer,
    RunOutput, Running,
};
use serde_json::Value;

const BODY: &str = "hello from the escalate host";

/// An HTTP server on the host's loopback counting the requests it answered.
struct Upstream {
    port: u16,
    hits: Arc<Mutex<usize>>,
    _server: LoopbackServer,
}

impl Upstream {
    fn start() -> Upstream {
        let hits: Arc<Mutex<usize>> = Arc::default();
        let h = hits.clone();
        let server = LoopbackServer::start(move |mut c| {
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            *h.lock().unwrap() += 1;
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
                BODY.len()
            );
        });
        Upstream {
            port: server.port,
            hits,
            _server: server,
        }
    }

    fn target(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn hits(&self) -> usize {
        *self.hits.lock().unwrap()
    }
}

/// A profile whose only network rules are escalate rules for `hosts`.
fn escalate_profile(dir: &Path, hosts: &[String]) -> PathBuf {
    let list: Vec<String> = hosts.iter().map(|h| format!("{h:?}")).collect();
    let p = dir.join("escalate.toml");
    std::fs::write(
        &p,
        format!(
            "name = \"escalate-test\"\n[network]\nmode = \"allowlist\"\nescalate = [{}]\n",
            list.join(", ")
        ),
    )
    .unwrap();
    p
}

/// Python that GETs each URL through the proxy and prints `status body` per line.
fn fetch_script(urls: &[String]) -> String {
    format!(
        r#"
import urllib.request, urllib.error
for url in {urls:?}:
    try:
        r = urllib.request.urlopen(url, timeout=60)
        print(r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(e.code, e.read().decode().strip())
"#
    )
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

    /// `a` with this trail's audit dir and OTLP endpoint (and no daemon unless the suite runs
    /// its warm pass, `AGENTRUN_E2E_WARM=1`).
    fn wire(&self, mut a: Agentrun) -> Agentrun {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OTEL_") {
                a = a.env_remove(k);
            }
        }
        a = a.env("AGENTRUN_AUDIT_DIR", self.audit.path());
        for (k, v) in self.rx.otel_env() {
            a = a.env(k, v);
        }
        if std::env::var("AGENTRUN_E2E_WARM").as_deref() == Ok("1") {
            a
        } else {
            a.env("AGENTRUN_NO_DAEMON", "1")
        }
    }

    /// The decision records, through `agentrun audit --json [extra]`.
    fn decisions(&self, extra: &[&str]) -> Vec<Value> {
        let mut args = vec!["audit", "--json"];
        args.extend_from_slice(extra);
        agentrun(args)
            .env("AGENTRUN_AUDIT_DIR", self.audit.path())
            .run()
            .success()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["kind"] == "decision")
            .collect()
    }

    /// The run's `sandbox.exec` span and its `policy.check` children, in the order they ended.
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
            assert_eq!(c.parent_span_id, exec[0].span_id, "child of the run's span");
        }
        (exec[0].clone(), checks)
    }
}

/// One escalate decision on `target`, settled as `outcome`, in an audit record and on a span.
fn assert_escalation(r: &Value, s: &ReceivedSpan, target: &str, rule: &str, outcome: &str) {
    assert_eq!(r["action"], "net.connect", "{r}");
    assert_eq!(r["resource"], target, "{r}");
    assert_eq!(r["decision"], "escalate", "{r}");
    assert_eq!(r["escalation"], outcome, "{r}");
    assert_eq!(r["rule"], rule, "{r}");
    assert_eq!(s.typed_attr("sandbox.decision", "string"), "escalate");
    assert_eq!(
        s.typed_attr("sandbox.escalation.outcome", "string"),
        outcome
    );
    assert_eq!(s.typed_attr("sandbox.rule_id", "string"), rule);
    assert_eq!(s.typed_attr("sandbox.resource", "string"), target);
    assert_eq!(
        s.typed_attr("sandbox.blocked", "bool"),
        if outcome == "approved" {
            "false"
        } else {
            "true"
        }
    );
    assert_eq!(
        s.typed_attr("sandbox.enforced_by", "string"),
        "egress-proxy"
    );
}

/// A pseudo-terminal the test answers on: made the controlling terminal of the process it is
/// given to, which keeps its stdio as pipes (the question goes to `/dev/tty`).
struct Terminal {
    master: File,
    slave: OwnedFd,
    screen: Arc<Mutex<String>>,
}

impl Terminal {
    fn open() -> Terminal {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        nix::fcntl::fcntl(
            pty.master.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .unwrap();
        let master = File::from(pty.master);
        let screen: Arc<Mutex<String>> = Arc::default();
        let (mut reader, s) = (master.try_clone().unwrap(), screen.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once the last holder of the slave side is gone.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                s.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Terminal {
            master,
            slave: pty.slave,
            screen,
        }
    }

    /// Spawns `a` in a new session whose controlling terminal is this one. The test keeps the
    /// slave side open meanwhile (the child holds it only as its controlling terminal), so
    /// the screen is read until the terminal is dropped.
    fn spawn(&mut self, a: Agentrun) -> Running {
        let fd = self.slave.as_raw_fd();
        let mut cmd = a.command();
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 || libc::ioctl(fd, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
        Running::spawn(cmd, None)
    }

    fn screen(&self) -> String {
        self.screen.lock().unwrap().clone()
    }

    /// Waits for the `n`th question and returns its line.
    fn question(&self, n: usize) -> String {
        wait_until(Duration::from_secs(60), || {
            let s = self.screen();
            (s.matches("[y/N").count() >= n).then_some(s)
        })
        .unwrap_or_else(|| panic!("no question {n} on the terminal: {:?}", self.screen()))
        .split("agentrun: approve ")
        .nth(n)
        .and_then(|q| q.split("[y/N").next())
        .unwrap_or_default()
        .to_owned()
    }

    fn answer(&mut self, line: &str) {
        self.master
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
    }
}

/// Waits for `r` and returns its output.
fn finish(mut r: Running) -> RunOutput {
    r.wait_or_kill(Duration::from_secs(120))
}

#[test]
fn escalate_host_without_a_terminal_is_denied_needs_approval() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let up = Upstream::start();
    let dir = tempdir();
    let profile = escalate_profile(dir.path(), &[up.target()]);
    let profile = profile.to_str().unwrap();

    let check = agentrun(["policy", "check", profile, "--connect", &up.target()]).run();
    assert_eq!(check.code(), 1, "escalate is not allowed here: {check}");
    assert!(
        check.stdout().contains(&format!(
            "escalate net.connect {} rule=network.escalate[0] reason=\"needs approval: connecting to {} is allowed only when a person approves it\"",
            up.target(),
            up.target()
        )),
        "{check}"
    );

    // No controlling terminal: a new session, stdio not a terminal.
    let url = format!("http://{}/x", up.target());
    let a = trail.wire(exec_with(
        ["--profile", profile],
        ["python3", "-c", &fetch_script(&[url])],
    ));
    let mut cmd = a.command();
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = finish(Running::spawn(cmd, None));
    assert_eq!(
        out.success(),
        format!(
            "403 agentrun: {t} denied by rule network.escalate[0]: needs approval (no one can be asked here): connecting to {t} is allowed only when a person approves it\n",
            t = up.target()
        ),
        "{out}"
    );
    assert_eq!(up.hits(), 0, "nothing reached the escalate host");

    let d = trail.decisions(&[]);
    assert_eq!(d.len(), 1, "{d:?}");
    let (exec, checks) = trail.spans(1);
    assert_escalation(
        &d[0],
        &checks[0],
        &up.target(),
        "network.escalate[0]",
        "no_approver",
    );
    assert!(
        d[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("needs approval"),
        "{d:?}"
    );
    assert_eq!(d[0]["sandbox_id"], exec.attr("sandbox.id"));
    assert_eq!(exec.typed_attr("sandbox.violation_count", "int"), "1");
    // `audit --deny` lists it, and the plain listing names the outcome.
    assert_eq!(trail.decisions(&["--deny"]).len(), 1);
    let listing = agentrun(["audit", "--deny"])
        .env("AGENTRUN_AUDIT_DIR", trail.audit.path())
        .run()
        .success();
    assert!(
        listing.contains(&format!(
            " escalate net.connect {} rule=network.escalate[0] outcome=no_approver reason=\"needs approval",
            up.target()
        )),
        "{listing}"
    );
}

/// `y` to the first host, `n` to the second, the first again without a question.
fn terminal_yes_no(trail: &Trail, wire: impl Fn(Agentrun) -> Agentrun) {
    let (a, b) = (Upstream::start(), Upstream::start());
    let dir = tempdir();
    let profile = escalate_profile(dir.path(), &[a.target(), b.target()]);
    let urls = [
        format!("http://{}/first", a.target()),
        format!("http://{}/second", b.target()),
        format!("http://{}/again", a.target()),
    ];
    let mut tty = Terminal::open();
    let run = tty.spawn(wire(exec_with(
        ["--profile", profile.to_str().unwrap()],
        ["python3", "-c", &fetch_script(&urls)],
    )));
    let q = tty.question(1);
    assert!(
        q.starts_with(&format!("net.connect {} in sandbox ar-", a.target()))
            && q.contains("(rule network.escalate[0] needs a person's approval)"),
        "{q:?}"
    );
    assert_eq!(a.hits(), 0, "held while the question is open");
    tty.answer("y");
    let q = tty.question(2);
    assert!(
        q.starts_with(&format!("net.connect {} ", b.target()))
            && q.contains("rule network.escalate[1]"),
        "{q:?}"
    );
    tty.answer("n");
    let out = finish(run);
    assert_eq!(
        out.success(),
        format!(
            "200 {BODY}\n403 agentrun: {t} denied by rule network.escalate[1]: not approved (the user answered no): connecting to {t} is allowed only when a person approves it\n200 {BODY}\n",
            t = b.target()
        ),
        "{out}\nterminal: {:?}",
        tty.screen()
    );
    assert_eq!(
        tty.screen().matches("[y/N").count(),
        2,
        "the approval was remembered: {:?}",
        tty.screen()
    );
    assert_eq!((a.hits(), b.hits()), (2, 0));

    let d = trail.decisions(&[]);
    assert_eq!(d.len(), 3, "{d:?}");
    let (exec, checks) = trail.spans(3);
    let rules = [
        "network.escalate[0]",
        "network.escalate[1]",
        "network.escalate[0]",
    ];
    let targets = [a.target(), b.target(), a.target()];
    let outcomes = ["approved", "denied", "approved"];
    for i in 0..3 {
        // Spans arrive in any order: match each record with the span of its resource and outcome.
        let span = checks
            .iter()
            .filter(|s| s.attr("sandbox.resource") == targets[i])
            .find(|s| s.attr("sandbox.escalation.outcome") == outcomes[i])
            .unwrap_or_else(|| panic!("no span for {}: {checks:#?}", targets[i]));
        assert_escalation(&d[i], span, &targets[i], rules[i], outcomes[i]);
    }
    assert!(
        d[2]["reason"]
            .as_str()
            .unwrap()
            .contains("earlier in this sandbox's life"),
        "{d:?}"
    );
    assert_eq!(exec.typed_attr("sandbox.violation_count", "int"), "1");
    assert_eq!(trail.decisions(&["--deny"]).len(), 1);
}

#[test]
fn escalate_host_on_a_terminal_is_asked_yes_allows_no_denies() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    terminal_yes_no(&trail, |a| trail.wire(a));
}

/// The daemon path: the run's egress proxy runs in the `agentrun exec` client, which asks on
/// its terminal.
#[test]
fn escalate_on_the_daemon_path_asks_on_the_clients_terminal() {
    let Some(_lock) = setup_exclusive() else {
        return;
    };
    let trail = Trail::new();
    let mut d = agentrun_e2e::Daemon::unstarted();
    d.launch(["--pool-size", "1"]);
    let unpooled = d.unpooled();
    terminal_yes_no(&trail, |a| {
        trail
            .wire(a)
            .env("AGENTRUN_STATE_DIR", d.state())
            .env_remove("AGENTRUN_NO_DAEMON")
    });
    assert_eq!(
        d.unpooled(),
        unpooled + 1,
        "served by the daemon: {}",
        d.log()
    );
}

#[test]
fn unanswered_question_is_denied_after_the_approval_timeout() {
    let Some(_lock) = setup() else { return };
    let trail = Trail::new();
    let up = Upstream::start();
    let dir = tempdir();
    let profile = escalate_profile(dir.path(), &[up.target()]);
    let url = format!("http://{}/x", up.target());
    let mut tty = Terminal::open();
    let run = tty.spawn(trail.wire(exec_with(
        [
            "--profile",
            profile.to_str().unwrap(),
            "--approval-timeout",
            "1s",
        ],
        ["python3", "-c", &fetch_script(&[url])],
    )));
    let out = finish(run);
    assert!(
        out.success().starts_with(&format!(
            "403 agentrun: {} denied by rule network.escalate[0]: needs approval: no answer within 1 s: connecting to",
            up.target()
        )),
        "{out}"
    );
    let screen = tty.screen();
    assert!(screen.contains("[y/N, "), "{screen:?}");
    assert_eq!(up.hits(), 0);
    let d = trail.decisions(&[]);
    assert_eq!(d.len(), 1, "{d:?}");
    let (_, checks) = trail.spans(1);
    assert_escalation(
        &d[0],
        &checks[0],
        &up.target(),
        "network.escalate[0]",
        "timeout",
    );

    // --no-prompt: a terminal, and still nobody asked.
    let mut tty = Terminal::open();
    let out = finish(tty.spawn(trail.wire(exec_with(
        ["--profile", profile.to_str().unwrap(), "--no-prompt"],
        [
            "python3",
            "-c",
            &fetch_script(&[format!("http://{}/y", up.target())]),
        ],
    ))));
    assert!(
        out.success()
            .contains("needs approval (no one can be asked here)"),
        "{out}"
    );
    assert!(!tty.screen().contains("[y/N"), "{:?}", tty.screen());
}

/// Writes that need approval are never made by processes: the kernel denies them. A
/// read-write mount over such a path is refused before anything runs; `policy check` answers
/// escalate, and refuses profiles Landlock could not enforce.
#[test]
fn escalate_write_paths_are_not_writable_by_processes() {
    let Some(_lock) = setup() else { return };
    use std::os::unix::fs::PermissionsExt;
    let ws = tempdir();
    for d in ["", "out", "deploy"] {
        let p = ws.path().join(d);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let dir = tempdir();
    let profile = dir.path().join("supervised.toml");
    std::fs::write(
        &profile,
        "name = \"supervised-test\"\n[filesystem]\nworkspace = \"ro\"\nwritable = [\"/workspace/out\", \"/tmp\"]\nescalate_write = [\"/workspace\"]\n",
    )
    .unwrap();
    let profile = profile.to_str().unwrap();
    let check = agentrun([
        "policy",
        "check",
        profile,
        "--write",
        "/workspace/deploy/run.sh",
        "--write",
        "/workspace/out/r.txt",
    ])
    .run();
    assert_eq!(check.code(), 1, "{check}");
    let stdout = check.stdout();
    assert!(stdout.contains("1 escalate_write paths"), "{check}");
    assert!(
        stdout.contains("escalate fs.write /workspace/deploy/run.sh rule=filesystem.escalate_write[0] reason=\"needs approval: writing /workspace/deploy/run.sh is allowed only when a person approves it\""),
        "{check}"
    );
    assert!(
        stdout.contains("allow fs.write /workspace/out/r.txt rule=filesystem.writable[0]"),
        "{check}"
    );

    let out = exec_with(
        [
            "--profile",
            profile,
            "--workspace",
            ws.path().to_str().unwrap(),
        ],
        [
            "sh",
            "-c",
            "echo a > /workspace/deploy/run.sh && echo WROTE; echo b > /workspace/out/r.txt && echo OUT",
        ],
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .run();
    let stdout = out.stdout();
    assert!(!stdout.contains("WROTE"), "{out}");
    assert!(stdout.contains("OUT"), "{out}");
    assert!(out.stderr().contains("Permission denied"), "{out}");
    assert!(!ws.path().join("deploy/run.sh").exists());
    assert_eq!(
        std::fs::read_to_string(ws.path().join("out/r.txt")).unwrap(),
        "b\n"
    );

    // A read-write mount under it: refused before anything runs.
    let host = tempdir();
    let out = exec_with(
        [
            "--profile",
            profile,
            "--rw",
            &format!("{}:/workspace/deploy", host.path().display()),
        ],
        ["true"],
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .run();
    out.assert_code(126);
    assert!(
        out.stderr()
            .contains("fs.mount rw:/workspace/deploy (rule filesystem.escalate_write[0]: a read-write mount at /workspace/deploy would let processes write /workspace without approval)"),
        "{out}"
    );

    // What Landlock could not enforce is refused with line, field and why.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[filesystem]\nwritable = [\"/tmp\"]\nescalate_write = [\"/tmp/app\"]\n",
    )
    .unwrap();
    let out = agentrun(["policy", "check", bad.to_str().unwrap()]).run();
    assert_eq!(out.code(), 1, "{out}");
    assert!(
        out.stderr().contains("line 3: field `filesystem.escalate_write`: /tmp/app is under writable /tmp: Landlock cannot take write access back below a writable path"),
        "{out}"
    );
}
