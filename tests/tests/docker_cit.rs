//! The Docker Engine API (`agentrun serve --docker-socket`) with what agent tools and users do
//! beyond the basic container flow (tests/tests/docker.rs): the real CrewAI
//! `CodeInterpreterTool` (crewai-tools 1.13.0, pip-installed in `.venv/test` by hack/test) on
//! a Python image, the container/exec `User` (and the image's `USER`), and pty window sizes
//! (`docker run/exec -t`, resize). Root required.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agentrun_e2e::images::{busybox_store, host_python_image};
use agentrun_e2e::*;

/// A daemon with the Docker API on `<state>/docker.sock`, over a store holding `busybox`.
struct DockerDaemon {
    daemon: Daemon,
    socket: PathBuf,
    root: PathBuf,
    dir: tempfile::TempDir,
}

fn start() -> DockerDaemon {
    let dir = tempdir();
    let root = busybox_store(dir.path(), &["--cmd", "/bin/sh"]);
    let mut daemon = Daemon::unstarted().with_env("AGENTRUN_ROOT", &root);
    let socket = daemon.state().join("docker.sock");
    daemon.launch([
        "--pool-size".as_ref(),
        "1".as_ref(),
        "--docker-socket".as_ref(),
        socket.as_os_str(),
    ]);
    DockerDaemon {
        daemon,
        socket,
        root,
        dir,
    }
}

impl DockerDaemon {
    fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The docker CLI against this socket (legacy builder, no user config).
    fn docker(&self, args: &[&str]) -> RunOutput {
        let mut cmd = Command::new("docker");
        cmd.args(args)
            .env("DOCKER_HOST", self.host())
            .env("DOCKER_BUILDKIT", "0")
            .env("DOCKER_CONFIG", self.dir.path().join("docker-config"));
        run_with_timeout(cmd, None, Duration::from_secs(300))
    }

    /// A Python script run by .venv/test's python (docker-py, crewai-tools) in `cwd`, with
    /// `client = docker.from_env()` set up and DOCKER_HOST pointing at this socket.
    fn python_in(&self, cwd: &Path, script: &str, timeout: Duration) -> RunOutput {
        let python = workspace_root().join(".venv/test/bin/python");
        assert!(
            python.exists(),
            "{} missing: hack/test creates it (python3 -m venv .venv/test; pip install ...)",
            python.display()
        );
        let mut cmd = Command::new(python);
        cmd.arg("-c")
            .arg(format!(
                "import docker, sys\nclient = docker.from_env()\n{script}"
            ))
            .current_dir(cwd)
            .env("DOCKER_HOST", self.host())
            .env("DOCKER_CONFIG", self.dir.path().join("docker-config"))
            // CrewAI: no telemetry or tracing calls out of the test.
            .env("CREWAI_DISABLE_TELEMETRY", "true")
            .env("CREWAI_TRACING_ENABLED", "false")
            .env("OTEL_SDK_DISABLED", "true")
            .env("HOME", self.dir.path());
        run_with_timeout(cmd, None, timeout)
    }

    fn python(&self, script: &str) -> RunOutput {
        self.python_in(self.dir.path(), script, Duration::from_secs(300))
    }
}

/// `code-interpreter:latest`: the host's own Python 3 ([`host_python_image`]), seeded in the
/// daemon's store as WIRE.md 5.1.2 allows, so CodeInterpreterTool finds it and builds nothing
/// (there is no network for its `FROM python:3.12-alpine`).
fn add_code_interpreter_image(d: &DockerDaemon) {
    host_python_image(
        &d.dir.path().join("python-rootfs"),
        &d.root,
        "code-interpreter:latest",
    );
}

#[test]
fn crewai_code_interpreter_tool_runs_python_in_an_agentrun_container() {
    let Some(_l) = setup() else { return };
    let d = start();
    add_code_interpreter_image(&d);
    let ws = d.dir.path().join("workspace");
    fs::create_dir_all(&ws).unwrap();
    fs::write(ws.join("host.txt"), "from the host\n").unwrap();
    // The tool's own flow: `docker info` (CLI, 1 s timeout), images.get, containers.get,
    // containers.run(python3 REPL on a tty, cwd bound on /workspace), exec_run(python3 -c),
    // stop, remove. Each call prints what the agent would get back.
    let script = r#"
from crewai_tools import CodeInterpreterTool
tool = CodeInterpreterTool(unsafe_mode=False)
ok = tool.run(code='''
import os, sys
print("hello", 6 * 7, sorted(os.listdir(".")), open("host.txt").read().strip(), flush=True)
open("from-python.txt", "w").write("written by python in the container")
print("to-stderr", file=sys.stderr)
print(sys.version_info[:2] >= (3, 8))
''', libraries_used=[])
# stdout and stderr are two pipes: their relative order is not kept (nor by dockerd).
print("R1:", sorted(ok.splitlines()), ok.endswith("\n"))
bad = tool.run(code='print("before the error"); raise SystemExit(3)', libraries_used=[])
print("R2:", repr(bad))
exc = tool.run(code='1/0', libraries_used=[])
print("R3:", repr(exc))
"#;
    let t0 = Instant::now();
    let out = d.python_in(&ws, script, Duration::from_secs(240));
    let took = t0.elapsed();
    let stdout = out.stdout();
    let line = |tag: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(tag))
            .unwrap_or_else(|| panic!("no {tag} line\n{out}\n{}", d.daemon.log()))
            .to_owned()
    };
    assert_eq!(out.code(), 0, "{out}\n{}", d.daemon.log());
    assert_eq!(
        line("R1:"),
        r#"R1: ['True', "hello 42 ['host.txt'] from the host", 'to-stderr'] True"#,
        "{out}"
    );
    assert_eq!(
        line("R2:"),
        r#"R2: 'Something went wrong while running the code: \nbefore the error\n'"#,
        "{out}"
    );
    let r3 = line("R3:");
    assert!(
        r3.starts_with("R3: 'Something went wrong while running the code: \\nTraceback")
            && r3.contains("ZeroDivisionError: division by zero"),
        "{out}"
    );
    // The container's write went through the live bind mount of the cwd.
    assert_eq!(
        fs::read_to_string(ws.join("from-python.txt")).unwrap(),
        "written by python in the container"
    );
    // Three runs, each with a fresh container, a stop of a python3 REPL and a remove: no
    // 10 s stop timeout per run (the REPL is not PID 1 of its sandbox, SIGTERM ends it).
    assert!(took < Duration::from_secs(60), "took {took:?}\n{out}");
    // The tool removed its container.
    let ps = d.docker(&["ps", "-a", "--format", "{{.Names}}"]);
    assert_eq!(ps.success(), "", "{ps}");
}

#[test]
fn crewai_code_interpreter_tool_library_install_fails_fast_without_network() {
    let Some(_l) = setup() else { return };
    let d = start();
    add_code_interpreter_image(&d);
    let ws = d.dir.path().join("workspace");
    fs::create_dir_all(&ws).unwrap();
    // The tool runs `pip install <lib>` in the container and ignores its result; containers
    // have no network, so pip fails (bounded: it cannot resolve the index) and the code's
    // import then fails with the error the agent sees.
    let script = r#"
import time
from crewai_tools import CodeInterpreterTool
tool = CodeInterpreterTool(unsafe_mode=False)
t0 = time.monotonic()
r = tool.run(code='import agentrun_no_such_module; print("imported")',
             libraries_used=["agentrun-no-such-module"])
print("R:", repr(r))
print("took", round(time.monotonic() - t0))
# What pip itself says in such a container.
c = client.containers.run("code-interpreter:latest", detach=True, tty=True)
t0 = time.monotonic()
res = c.exec_run(["pip", "install", "--retries", "0", "--timeout", "5", "agentrun-no-such-module"])
print("pip exit", res.exit_code, "took", round(time.monotonic() - t0))
print("PIP:", res.output.decode())
c.stop(timeout=1)
c.remove()
"#;
    let t0 = Instant::now();
    let out = d.python_in(&ws, script, Duration::from_secs(240));
    let took = t0.elapsed();
    eprintln!("{out}");
    assert_eq!(out.code(), 0, "{out}\n{}", d.daemon.log());
    let stdout = out.stdout();
    let r = stdout.lines().find(|l| l.starts_with("R:")).unwrap_or("");
    assert!(
        r.starts_with("R: 'Something went wrong while running the code: \\nTraceback")
            && r.contains("ModuleNotFoundError: No module named \\'agentrun_no_such_module\\'"),
        "{out}"
    );
    let pip = stdout.split("PIP:").nth(1).unwrap_or("");
    assert!(
        stdout.contains("pip exit 1 ")
            && pip.contains("ERROR: No matching distribution found for agentrun-no-such-module"),
        "{out}"
    );
    // Bounded: pip's default retries against an unresolvable index, not a hang.
    assert!(took < Duration::from_secs(180), "took {took:?}\n{out}");
}

/// A python3 helper that runs `argv` with its stdio on a new pty of `rows` x `cols` and
/// prints what it wrote there (the docker CLI takes its terminal size from its stdout).
fn on_a_pty(d: &DockerDaemon, rows: u16, cols: u16, argv: &[&str]) -> RunOutput {
    let script = format!(
        r#"
import fcntl, os, pty, struct, subprocess, sys, termios
m, s = pty.openpty()
fcntl.ioctl(s, termios.TIOCSWINSZ, struct.pack("HHHH", {rows}, {cols}, 0, 0))
p = subprocess.Popen({argv:?}, stdin=s, stdout=s, stderr=s, start_new_session=True)
os.close(s)
out = b""
while True:
    try:
        b = os.read(m, 4096)
    except OSError:
        break
    if not b:
        break
    out += b
# Two ptys each turn "\n" into "\r\n": compare without carriage returns.
print(repr(out.decode(errors="replace").replace("\r", "")), p.wait(timeout=60))
"#
    );
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg("-c")
        .arg(script)
        .env("DOCKER_HOST", d.host())
        .env("DOCKER_CONFIG", d.dir.path().join("docker-config"));
    run_with_timeout(cmd, None, Duration::from_secs(120))
}

#[test]
fn docker_tty_window_size_and_resize_reach_the_pty() {
    let Some(_l) = setup() else { return };
    let d = start();
    // The CLI sends its terminal's size as ConsoleSize and then resizes.
    let out = on_a_pty(
        &d,
        37,
        123,
        &["docker", "run", "--rm", "-t", "busybox", "stty", "size"],
    );
    assert_eq!(
        out.success(),
        "'37 123\\n' 0\n",
        "{out}\n{}",
        d.daemon.log()
    );
    d.docker(&["run", "-d", "--name", "t", "busybox", "sleep", "300"])
        .success();
    let out = on_a_pty(&d, 41, 97, &["docker", "exec", "-t", "t", "stty", "size"]);
    assert_eq!(out.success(), "'41 97\\n' 0\n", "{out}\n{}", d.daemon.log());
    // docker-py: resize of a running container and of a running exec.
    let out = d.python(
        r#"
import time
c = client.containers.run("busybox", ["sh", "-c", "sleep 1; stty size"], tty=True, detach=True)
c.resize(height=33, width=111)
c.wait(timeout=30)
print(repr(c.logs()))
c.remove()
api = client.api
t = client.containers.get("t")
e = api.exec_create(t.id, ["sh", "-c", "sleep 1; stty size"], tty=True)
sock = api.exec_start(e["Id"], tty=True, socket=True)
api.exec_resize(e["Id"], height=44, width=99)
sock._sock.settimeout(30)
out = b""
while True:
    b = sock._sock.recv(4096)
    if not b:
        break
    out += b
print(repr(out))
try:
    api.exec_resize(e["Id"], height="x", width=1)
except docker.errors.APIError as err:
    print(err.status_code)
"#,
    );
    assert_eq!(
        out.success(),
        "b'33 111\\r\\n'\nb'44 99\\r\\n'\n400\n",
        "{out}\n{}",
        d.daemon.log()
    );
    d.docker(&["rm", "-f", "t"]).success();
}

#[test]
fn docker_user_runs_processes_as_that_user_resolved_in_the_image() {
    let Some(_l) = setup() else { return };
    let d = start();
    // Numeric, with no passwd entry: uid as given, gid 0.
    let out = d.docker(&["run", "--rm", "--user", "1000", "busybox", "id", "-u"]);
    assert_eq!(out.success(), "1000\n", "{out}\n{}", d.daemon.log());
    let out = d.docker(&[
        "run",
        "--rm",
        "--user",
        "1000:1001",
        "busybox",
        "sh",
        "-c",
        "id -u; id -g; touch /etc/x",
    ]);
    assert_eq!(out.code(), 1, "{out}");
    assert_eq!(out.stdout(), "1000\n1001\n", "{out}");
    assert!(out.stderr().contains("Permission denied"), "{out}");
    // Names come from the image's /etc/passwd and /etc/group, never the host's: `daemon`
    // exists on every Debian host but not in the busybox image.
    let out = d.docker(&["run", "--rm", "--user", "daemon", "busybox", "id"]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(
        out.stderr()
            .contains("unable to find user daemon: no matching entries in passwd file"),
        "{out}"
    );
    // An image with a USER made by `docker build`: its user and groups exist only in it.
    let ctx = d.dir.path().join("ctx");
    fs::create_dir_all(&ctx).unwrap();
    fs::write(
        ctx.join("Dockerfile"),
        "FROM busybox\n\
         RUN echo 'app:x:4321:4322:App:/home/app:/bin/sh' >> /etc/passwd && \
         echo 'app:x:4322:' >> /etc/group && echo 'extra:x:4323:app' >> /etc/group && \
         mkdir -p /home/app && chown 4321:4322 /home/app\n\
         USER app\n",
    )
    .unwrap();
    d.docker(&["build", "-q", "-t", "withuser", ctx.to_str().unwrap()])
        .success();
    let out = d.docker(&[
        "run",
        "--rm",
        "withuser",
        "sh",
        "-c",
        "id -u; id -g; id -G; echo $HOME; touch $HOME/ok && echo home-writable",
    ]);
    assert_eq!(
        out.success(),
        "4321\n4322\n4322 4323\n/home/app\nhome-writable\n",
        "{out}\n{}",
        d.daemon.log()
    );
    // exec: the container's user by default, `-u` over it (name, uid:group).
    d.docker(&["run", "-d", "--name", "u", "withuser", "sleep", "300"])
        .success();
    let out = d.docker(&["exec", "u", "id", "-un"]);
    assert_eq!(out.success(), "app\n", "{out}");
    let out = d.docker(&["exec", "-u", "root", "u", "id", "-u"]);
    assert_eq!(out.success(), "0\n", "{out}");
    let out = d.docker(&["exec", "-u", "4321:extra", "u", "sh", "-c", "id -u; id -g"]);
    assert_eq!(out.success(), "4321\n4323\n", "{out}");
    let out = d.docker(&["exec", "-u", "nosuchuser", "u", "true"]);
    assert_eq!(out.code(), 126, "{out}");
    assert!(
        format!("{}{}", out.stdout(), out.stderr())
            .contains("unable to find user nosuchuser: no matching entries in passwd file"),
        "{out}"
    );
    // Inspect shows the user the container runs as (the image's here), as dockerd.
    let out = d.docker(&["inspect", "-f", "{{.Config.User}}", "u"]);
    assert_eq!(out.success(), "app\n", "{out}");
    d.docker(&["rm", "-f", "u"]).success();
}
