//! Shared helpers for the end-to-end tests.
//!
//! The e2e tests drive the real `agentrun` binary (`$AGENTRUN_BIN`, else
//! `<workspace>/target/debug/agentrun`) and assert what a user sees: exit codes, output, files
//! on the host, and what is left behind on the host (processes, mounts, cgroups, state dirs).
//!
//! Rules every e2e test follows:
//! - every process it spawns runs under a deadline ([`run_with_timeout`], [`Running`]);
//! - tests that need root call [`require_root`] first: not root fails the test unless
//!   `AGENTRUN_E2E_ALLOW_SKIP=1`;
//! - every test holds the e2e lock: [`shared_lock`] for ordinary runs, [`exclusive_lock`] for
//!   tests that look at host-wide state (leftover processes, mounts, cgroups), so those never
//!   see another test's sandbox, whatever the test runner's parallelism (cargo test threads or
//!   nextest processes).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub mod cri;
pub mod ctr;
pub mod images;
pub mod mcp;
pub mod oci;
pub mod osb;
pub mod otlp;
pub mod snapshots;
pub mod tls_server;
pub mod users;

/// First host uid of the sandbox user namespace mapping: sandbox uid 0 is host uid
/// `SANDBOX_UID_BASE` (or above); nothing else on a test host runs with such uids.
pub const SANDBOX_UID_BASE: u32 = 100_000_000;

/// Default deadline for one `agentrun` invocation in the tests.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The cargo workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The agentrun binary under test: `$AGENTRUN_BIN`, else `<workspace>/target/debug/agentrun`
/// (honouring `$CARGO_TARGET_DIR`).
pub fn agentrun_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("AGENTRUN_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .map(|p| {
            if p.is_absolute() {
                p
            } else {
                workspace_root().join(p)
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("debug").join("agentrun")
}

/// agentrun's runtime state dir (`$AGENTRUN_STATE_DIR`, default `/run/agentrun`).
pub fn state_dir() -> PathBuf {
    std::env::var_os("AGENTRUN_STATE_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/agentrun"))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Call first in every test that needs root (all sandbox tests do). Returns true when the test
/// should go on. Not root: panics, unless `AGENTRUN_E2E_ALLOW_SKIP=1`, then prints a skip
/// notice and returns false.
pub fn require_root() -> bool {
    if is_root() {
        return true;
    }
    if std::env::var("AGENTRUN_E2E_ALLOW_SKIP").as_deref() == Ok("1") {
        eprintln!("SKIPPED: this e2e test needs root (AGENTRUN_E2E_ALLOW_SKIP=1)");
        return false;
    }
    panic!("this e2e test needs root; run as root, or set AGENTRUN_E2E_ALLOW_SKIP=1 to skip it");
}

/// Panics with a clear message when the binary is missing.
pub fn require_bin() {
    let bin = agentrun_bin();
    assert!(
        bin.is_file(),
        "agentrun binary not found at {}: build it with `cargo build -p agentrun` or set AGENTRUN_BIN",
        bin.display()
    );
}

// ---------------------------------------------------------------------------------------------
// Locks

/// A held e2e lock (flock on a file in the temp dir); released on drop.
pub struct TestLock {
    _file: File,
    exclusive: bool,
}

impl TestLock {
    /// Whether no other e2e test runs meanwhile ([`exclusive_lock`]).
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }
}

fn lock(kind: libc::c_int) -> TestLock {
    let path = std::env::temp_dir().join("agentrun-e2e.lock");
    // flock works on a read-only fd too: a non-root test can share a root-made lock file.
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .or_else(|_| File::open(&path))
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    loop {
        // SAFETY: flock on an fd we own.
        let r = unsafe { libc::flock(file.as_raw_fd(), kind) };
        if r == 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            panic!("flock {}: {err}", path.display());
        }
    }
    TestLock {
        _file: file,
        exclusive: kind == libc::LOCK_EX,
    }
}

/// Held by every ordinary e2e test: many may run at once.
pub fn shared_lock() -> TestLock {
    lock(libc::LOCK_SH)
}

/// Held by tests that inspect host-wide state (leftover processes, mounts, cgroups, state
/// dirs): no other e2e test runs a sandbox meanwhile.
pub fn exclusive_lock() -> TestLock {
    lock(libc::LOCK_EX)
}

/// The usual prologue: `let Some(_lock) = setup() else { return };`
/// Checks root (see [`require_root`]) and the binary, then takes the shared lock.
pub fn setup() -> Option<TestLock> {
    if !require_root() {
        return None;
    }
    require_bin();
    Some(shared_lock())
}

/// Like [`setup`] with the exclusive lock.
pub fn setup_exclusive() -> Option<TestLock> {
    if !require_root() {
        return None;
    }
    require_bin();
    Some(exclusive_lock())
}

// ---------------------------------------------------------------------------------------------
// Running processes with deadlines

#[derive(Default)]
struct Stream {
    data: Vec<u8>,
    /// (time since spawn, total bytes received by then), one entry per read.
    times: Vec<(Duration, usize)>,
}

/// What a finished process did.
#[derive(Clone)]
pub struct RunOutput {
    pub argv: String,
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// (time since spawn, cumulative stdout bytes) for each chunk read.
    pub stdout_times: Vec<(Duration, usize)>,
    /// Spawn to exit of the process (not of its pipes).
    pub elapsed: Duration,
    /// Its stdout/stderr were still held open by some other process 5 s after it exited
    /// (a leaked sandbox process, usually).
    pub pipes_left_open: bool,
}

impl RunOutput {
    /// Exit code; panics (with the output) when it was killed by a signal.
    pub fn code(&self) -> i32 {
        match self.status.code() {
            Some(c) => c,
            None => panic!(
                "{} was killed by signal {:?}\n{self}",
                self.argv,
                self.status.signal()
            ),
        }
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// Asserts exit code 0 and returns stdout.
    pub fn success(&self) -> String {
        assert_eq!(self.status.code(), Some(0), "expected success\n{self}");
        self.stdout()
    }
    /// Asserts the exit code.
    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.status.code(),
            Some(code),
            "expected exit code {code}\n{self}"
        );
        self
    }
    /// Asserts exit 125 with a one-line `agentrun: ...` message on stderr (besides the
    /// per-layer progress lines `image pull/import/export/build` print before it fails).
    pub fn assert_agentrun_error(&self) -> &Self {
        self.assert_code(125);
        let err = self.stderr();
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| !l.trim().is_empty() && !is_layer_progress(l))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "expected a one-line error on stderr\n{self}"
        );
        assert!(
            lines[0].starts_with("agentrun: "),
            "expected stderr to start with 'agentrun: '\n{self}"
        );
        self
    }
}

/// A line of `agentrun image`'s plain progress: `layer sha256:<12 hex>: <phase> ...` or
/// `layer <id>: already exists`.
pub fn is_layer_progress(line: &str) -> bool {
    let Some((id, what)) = line.strip_prefix("layer ").and_then(|l| l.split_once(": ")) else {
        return false;
    };
    !id.contains(' ')
        && [
            "downloading ",
            "copying ",
            "extracting ",
            "exporting ",
            "already exists",
        ]
        .iter()
        .any(|p| what.starts_with(p))
}

/// At most ~4000 bytes of an output: its start and its end (where a traceback says what
/// failed), with how much was left out between them.
fn clip(b: &[u8]) -> String {
    const HEAD: usize = 1500;
    const TAIL: usize = 2500;
    let s = String::from_utf8_lossy(b);
    if s.len() > HEAD + TAIL {
        let mut end = HEAD;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut start = s.len() - TAIL;
        while !s.is_char_boundary(start) {
            start += 1;
        }
        format!(
            "{}\n... [{} of {} bytes left out] ...\n{}",
            &s[..end],
            start - end,
            b.len(),
            &s[start..]
        )
    } else {
        s.into_owned()
    }
}

impl fmt::Display for RunOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "command: {}", self.argv)?;
        match (self.status.code(), self.status.signal()) {
            (Some(c), _) => writeln!(f, "exit code: {c}")?,
            (_, Some(s)) => writeln!(f, "killed by signal {s}")?,
            _ => writeln!(f, "status: {:?}", self.status)?,
        }
        writeln!(f, "elapsed: {:.3}s", self.elapsed.as_secs_f64())?;
        if self.pipes_left_open {
            writeln!(
                f,
                "NOTE: stdout/stderr still open by another process after exit"
            )?;
        }
        writeln!(f, "--- stdout ---\n{}", clip(&self.stdout))?;
        write!(f, "--- stderr ---\n{}", clip(&self.stderr))
    }
}

impl fmt::Debug for RunOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        let k = k.to_string_lossy();
        if k.starts_with("AGENTRUN") || k == "OPENAI_API_KEY" || k == "TRACEPARENT" {
            match v {
                Some(v) => s.push_str(&format!("{k}={} ", v.to_string_lossy())),
                None => s.push_str(&format!("-u {k} ")),
            }
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$;|&<>()*?".contains(c)) {
            s.push_str(&format!(" '{}'", a.replace('\'', "'\\''")));
        } else {
            s.push(' ');
            s.push_str(&a);
        }
    }
    s
}

/// A spawned process with its stdout/stderr collected by threads. Dropping a `Running` that
/// has not finished sends it SIGTERM, then SIGKILL after 3 s, and reaps it.
pub struct Running {
    child: Child,
    argv: String,
    start: Instant,
    out: Arc<Mutex<Stream>>,
    err: Arc<Mutex<Stream>>,
    readers_done: Receiver<()>,
    readers: Vec<JoinHandle<()>>,
    readers_pending: usize,
    status: Option<(ExitStatus, Duration)>,
}

impl Running {
    /// Spawns `cmd` with piped stdout/stderr; stdin gets `stdin` (then EOF), or /dev/null.
    pub fn spawn(mut cmd: Command, stdin: Option<Vec<u8>>) -> Running {
        let argv = describe(&cmd);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let start = Instant::now();
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {argv}: {e}"));
        if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // Detached: it ends when the data is written or the reader closes the pipe.
            thread::spawn(move || {
                let _ = pipe.write_all(&data);
            });
        }
        let (tx, readers_done) = mpsc::channel();
        let out = Arc::new(Mutex::new(Stream::default()));
        let err = Arc::new(Mutex::new(Stream::default()));
        let mut readers = Vec::new();
        type Pipe = (Box<dyn Read + Send>, Arc<Mutex<Stream>>);
        let pipes: [Pipe; 2] = [
            (Box::new(child.stdout.take().unwrap()), out.clone()),
            (Box::new(child.stderr.take().unwrap()), err.clone()),
        ];
        for (mut pipe, stream) in pipes {
            let tx = tx.clone();
            readers.push(thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            let mut s = stream.lock().unwrap();
                            s.data.extend_from_slice(&buf[..n]);
                            let total = s.data.len();
                            s.times.push((start.elapsed(), total));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                let _ = tx.send(());
            }));
        }
        Running {
            child,
            argv,
            start,
            out,
            err,
            readers_done,
            readers_pending: readers.len(),
            readers,
            status: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn argv(&self) -> &str {
        &self.argv
    }

    pub fn stdout_so_far(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap().data).into_owned()
    }

    pub fn stderr_so_far(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap().data).into_owned()
    }

    /// Has it exited? (reaps it if so)
    pub fn exited(&mut self) -> bool {
        self.poll_exit();
        self.status.is_some()
    }

    fn poll_exit(&mut self) {
        if self.status.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.status = Some((st, self.start.elapsed()));
            }
        }
    }

    /// Waits up to `timeout` for the process to exit. None: still running (left running).
    pub fn wait_for(&mut self, timeout: Duration) -> Option<RunOutput> {
        let deadline = Instant::now() + timeout;
        loop {
            self.poll_exit();
            if self.status.is_some() {
                return Some(self.collect());
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits up to `timeout`; past that stops the process (SIGTERM, SIGKILL) and panics with
    /// what it printed.
    pub fn wait_or_kill(&mut self, timeout: Duration) -> RunOutput {
        if let Some(out) = self.wait_for(timeout) {
            return out;
        }
        self.stop();
        let out = self.collect();
        panic!(
            "timed out after {:.1}s (the process was stopped)\n{out}",
            timeout.as_secs_f64()
        );
    }

    /// Sends a signal to the process (not to its children).
    pub fn signal(&mut self, sig: libc::c_int) {
        self.poll_exit();
        if self.status.is_none() {
            // SAFETY: kill on our own unreaped child's pid.
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        }
    }

    /// SIGTERM, up to 3 s grace, SIGKILL; reaps it.
    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        if self.wait_for(Duration::from_secs(3)).is_none() {
            self.signal(libc::SIGKILL);
            let st = self.child.wait().expect("wait");
            self.status = Some((st, self.start.elapsed()));
        }
    }

    /// SIGKILL and reap, no grace.
    pub fn kill9(&mut self) -> ExitStatus {
        self.signal(libc::SIGKILL);
        let st = self.child.wait().expect("wait");
        if self.status.is_none() {
            self.status = Some((st, self.start.elapsed()));
        }
        self.status.unwrap().0
    }

    fn collect(&mut self) -> RunOutput {
        let (status, elapsed) = self.status.expect("collect before exit");
        // Wait for the pipes to reach EOF (both readers), at most 5 s.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut pipes_left_open = false;
        // Each reader sends one message when its pipe reaches EOF.
        while !self.readers.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.readers_done.recv_timeout(left) {
                Ok(()) => {
                    self.readers_pending -= 1;
                    if self.readers_pending == 0 {
                        for h in self.readers.drain(..) {
                            let _ = h.join();
                        }
                    }
                }
                Err(_) => {
                    pipes_left_open = true;
                    // Leave the threads; they end when the last writer goes away.
                    self.readers.clear();
                    break;
                }
            }
        }
        let out = self.out.lock().unwrap();
        let err = self.err.lock().unwrap();
        RunOutput {
            argv: self.argv.clone(),
            status,
            stdout: out.data.clone(),
            stderr: err.data.clone(),
            stdout_times: out.times.clone(),
            elapsed,
            pipes_left_open,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.poll_exit();
        if self.status.is_none() {
            self.stop();
        }
    }
}

/// Runs `cmd` to completion with a deadline; see [`Running::wait_or_kill`].
pub fn run_with_timeout(cmd: Command, stdin: Option<Vec<u8>>, timeout: Duration) -> RunOutput {
    Running::spawn(cmd, stdin).wait_or_kill(timeout)
}

/// Runs a host command (not in a sandbox) with a deadline.
pub fn host<I, S>(program: &str, args: I) -> RunOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(program);
    cmd.args(args);
    run_with_timeout(cmd, None, Duration::from_secs(30))
}

/// An `agentrun` invocation being set up.
pub struct Agentrun {
    args: Vec<OsString>,
    envs: Vec<(OsString, Option<OsString>)>,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
}

/// `agentrun ARGS...`
pub fn agentrun<I, S>(args: I) -> Agentrun
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Agentrun {
        args: args.into_iter().map(|a| a.as_ref().to_owned()).collect(),
        envs: Vec::new(),
        stdin: None,
        timeout: DEFAULT_TIMEOUT,
    }
}

/// `agentrun exec -- CMD...`
pub fn exec<I, S>(cmd: I) -> Agentrun
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    exec_with::<[&str; 0], &str, I, S>([], cmd)
}

/// The profile the suite runs under: `$AGENTRUN_E2E_PROFILE` (hack/test runs the escape suite
/// once per shipped profile), else none (agentrun's default, `default`).
pub fn e2e_profile() -> Option<String> {
    std::env::var("AGENTRUN_E2E_PROFILE")
        .ok()
        .filter(|p| !p.is_empty())
}

/// Does the suite's profile ([`e2e_profile`], else `default`) allow `action` (`write`,
/// `read`) on `path` inside a sandbox? Asked of `agentrun policy check`, the same decision
/// the run's Landlock rules are made from.
pub fn e2e_profile_allows(action: &str, path: &str) -> bool {
    let profile = e2e_profile().unwrap_or_else(|| "default".into());
    let out = agentrun(["policy", "check", &profile, &format!("--{action}"), path]).run();
    // (exit 1 when it denies)
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "agentrun policy check\n{out}"
    );
    let stdout = out.stdout();
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some(path))
        .unwrap_or_else(|| panic!("no decision on {action} {path}\n{out}"));
    line.starts_with("allow ")
}

/// `agentrun exec OPTS... -- CMD...`; with `$AGENTRUN_E2E_PROFILE` set, `--profile` that
/// profile unless OPTS name one.
pub fn exec_with<O, OS, I, S>(opts: O, cmd: I) -> Agentrun
where
    O: IntoIterator<Item = OS>,
    OS: AsRef<OsStr>,
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut args: Vec<OsString> = vec!["exec".into()];
    args.extend(opts.into_iter().map(|a| a.as_ref().to_owned()));
    if let Some(p) = e2e_profile() {
        if !args.iter().any(|a| a == "--profile") {
            args.splice(1..1, ["--profile".into(), p.into()]);
        }
    }
    args.push("--".into());
    args.extend(cmd.into_iter().map(|a| a.as_ref().to_owned()));
    agentrun(args)
}

impl Agentrun {
    pub fn env(mut self, key: impl AsRef<OsStr>, val: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.as_ref().to_owned(), Some(val.as_ref().to_owned())));
        self
    }
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.envs.push((key.as_ref().to_owned(), None));
        self
    }
    /// Runs with `AGENTRUN_ROOT=root` (e.g. [`busybox_root`]).
    pub fn root(self, root: impl AsRef<Path>) -> Self {
        self.env("AGENTRUN_ROOT", root.as_ref())
    }
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    pub fn command(&self) -> Command {
        for (k, v) in &self.envs {
            let Some(v) = v
                .as_deref()
                .filter(|_| k == "AGENTRUN_STATE_DIR" || k == "AGENTRUN_ROOT")
            else {
                continue;
            };
            if let Some(gone) = removed_harness_dir(Path::new(v)) {
                panic!(
                    "{} is in {}, which was removed already (its Daemon or TempDir was dropped): \
                     `{}` would make it again and leave it behind; keep its owner alive until \
                     the command has run",
                    k.to_string_lossy(),
                    gone.display(),
                    describe(Command::new("agentrun").args(&self.args))
                );
            }
        }
        let mut cmd = Command::new(agentrun_bin());
        cmd.args(&self.args);
        // Keep the tests' own trace context out unless a test sets one.
        cmd.env_remove("TRACEPARENT");
        for (k, v) in &self.envs {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd
    }
    /// Runs to completion (panics past the deadline, 60 s unless set).
    pub fn run(self) -> RunOutput {
        let cmd = self.command();
        run_with_timeout(cmd, self.stdin, self.timeout)
    }
    /// Starts it in the background (in its own process group).
    pub fn spawn(self) -> Running {
        let mut cmd = self.command();
        cmd.process_group(0);
        Running::spawn(cmd, self.stdin)
    }
}

// ---------------------------------------------------------------------------------------------
// Temp dirs and images

/// A fresh temp dir (removed on drop) named agentrun-e2e-*.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("agentrun-e2e-")
        .tempdir()
        .expect("create temp dir")
}

static BUSYBOX_ROOT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
static ROOTS_TO_REMOVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_roots_at_exit() {
    if let Ok(roots) = ROOTS_TO_REMOVE.lock() {
        for r in roots.iter() {
            let _ = fs::remove_dir_all(r);
        }
    }
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes AGENTRUN_ROOTs of e2e test binaries that died before their at-exit cleanup.
fn remove_stale_roots() {
    let Ok(rd) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if let Some(rest) = name.strip_prefix("agentrun-e2e-root.") {
            // `agentrun-e2e-root.PID` or `agentrun-e2e-root.PID.NAME` (see binary_dir).
            if let Ok(pid) = rest.split('.').next().unwrap_or_default().parse::<i32>() {
                if !pid_alive(pid) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

/// An AGENTRUN_ROOT, private to this test binary, holding the `busybox` image built by
/// `images/busybox/build.sh` and imported with `agentrun image add`. Built once per test
/// binary; removed when the binary exits.
pub fn busybox_root() -> PathBuf {
    BUSYBOX_ROOT
        .get_or_init(build_busybox_root)
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A fresh directory private to this test binary (`agentrun-e2e-root.PID[.NAME]` in the temp
/// dir), removed when the binary exits, or by the next binary's start if this one was killed.
/// For what a `static` keeps for the whole binary (a `TempDir` in a static is never dropped).
pub fn binary_dir(name: Option<&str>) -> Result<PathBuf, String> {
    remove_stale_roots();
    let mut base = format!("agentrun-e2e-root.{}", std::process::id());
    if let Some(n) = name {
        base = format!("{base}.{n}");
    }
    let dir = std::env::temp_dir().join(base);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut roots = ROOTS_TO_REMOVE.lock().unwrap_or_else(|p| p.into_inner());
    if roots.is_empty() {
        // SAFETY: registering a plain extern "C" fn.
        unsafe { libc::atexit(remove_roots_at_exit) };
    }
    roots.push(dir.clone());
    Ok(dir)
}

fn build_busybox_root() -> Result<PathBuf, String> {
    let dir = binary_dir(None)?;
    let rootfs = dir.join("busybox-rootfs");
    let mut build = Command::new(workspace_root().join("images/busybox/build.sh"));
    build.arg(&rootfs);
    let out = run_with_timeout(build, None, Duration::from_secs(120));
    if out.status.code() != Some(0) {
        return Err(format!("building the busybox image failed\n{out}"));
    }
    let root = dir.join("root");
    let out = agentrun([
        "image".as_ref(),
        "add".as_ref(),
        "busybox".as_ref(),
        rootfs.as_os_str(),
    ])
    .root(&root)
    .timeout(Duration::from_secs(120))
    .run();
    if out.status.code() != Some(0) {
        return Err(format!("agentrun image add busybox failed\n{out}"));
    }
    let _ = fs::remove_dir_all(&rootfs);
    Ok(root)
}

// ---------------------------------------------------------------------------------------------
// Host inspection

/// One process, as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProcInfo {
    pub pid: i32,
    /// Real uid (first field of the Uid: line).
    pub uid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    pub cgroup: String,
    /// The State: letter (R, S, D, Z, ...).
    pub state: char,
}

impl fmt::Display for ProcInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} uid {} state {} ({}) {:?} cgroup {}",
            self.pid,
            self.uid,
            self.state,
            self.comm,
            self.cmdline,
            self.cgroup.replace('\n', " ")
        )
    }
}

pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let state = status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|s| s.trim().chars().next())
        .unwrap_or('?');
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim_end()
        .to_string();
    let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    Some(ProcInfo {
        pid,
        uid,
        comm,
        cmdline,
        cgroup,
        state,
    })
}

pub fn all_processes() -> Vec<ProcInfo> {
    let mut v: Vec<ProcInfo> = fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_info)
        .collect();
    v.sort();
    v
}

/// Does this process belong to a sandbox? (sandbox uid range, or an agentrun cgroup)
/// Zombies do not count: they hold nothing but a pid, and one whose parent (a killed CLI)
/// died is reaped by the host's init, on its own schedule.
pub fn is_sandbox_process(p: &ProcInfo) -> bool {
    p.state != 'Z' && is_sandbox_process_or_zombie(p)
}

fn is_sandbox_process_or_zombie(p: &ProcInfo) -> bool {
    p.uid >= SANDBOX_UID_BASE
        || p.cgroup.lines().any(|l| {
            l.split(':')
                .nth(2)
                .is_some_and(|path| path.contains("/agentrun/") || path == "/agentrun")
        })
}

pub fn sandbox_processes() -> Vec<ProcInfo> {
    all_processes()
        .into_iter()
        .filter(is_sandbox_process)
        .collect()
}

/// Cgroup mode of this host as agentrun should report it: "v2" (unified), "hybrid" (v1
/// controllers plus a cgroup2 mount at /sys/fs/cgroup/unified) or "v1".
pub fn host_cgroup_mode() -> &'static str {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    fn fs_type(p: &str) -> Option<i64> {
        let c = std::ffi::CString::new(p).unwrap();
        // SAFETY: statfs is plain old data; all zeroes is a valid value.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid path and out pointer.
        let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
        (r == 0).then_some(st.f_type as i64)
    }
    if fs_type("/sys/fs/cgroup") == Some(CGROUP2_SUPER_MAGIC) {
        "v2"
    } else if fs_type("/sys/fs/cgroup/unified") == Some(CGROUP2_SUPER_MAGIC) {
        "hybrid"
    } else {
        "v1"
    }
}

/// The Landlock ABI version the kernel offers (0: none).
pub fn host_landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns a number.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        0
    } else {
        r as i64
    }
}

/// Directories that can hold agentrun's cgroups: `<mount>/agentrun` for each cgroup mount.
fn agentrun_cgroup_parents() -> Vec<PathBuf> {
    let mut parents = Vec::new();
    let base = Path::new("/sys/fs/cgroup");
    parents.push(base.join("agentrun"));
    if let Ok(rd) = fs::read_dir(base) {
        for e in rd.flatten() {
            parents.push(e.path().join("agentrun"));
        }
    }
    let mut seen = Vec::new();
    parents
        .into_iter()
        .filter(|p| p.is_dir())
        .filter(|p| {
            let c = fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            if seen.contains(&c) {
                false
            } else {
                seen.push(c);
                true
            }
        })
        .collect()
}

/// What agentrun left on the host: sandbox processes, mounts under its state dir, cgroups
/// under `agentrun/`, and sandbox state dirs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    pub processes: Vec<ProcInfo>,
    /// mountinfo lines whose mount point is in agentrun's state dir or an agentrun dir.
    pub mounts: Vec<String>,
    pub cgroups: Vec<PathBuf>,
    pub state_dirs: Vec<PathBuf>,
}

impl Leftovers {
    pub fn snapshot() -> Leftovers {
        Self::snapshot_in(&state_dir())
    }

    /// What is in `self` and not in `before` (mounts compared as a multiset).
    pub fn new_since(&self, before: &Leftovers) -> Leftovers {
        let mut counts: BTreeMap<&String, usize> = BTreeMap::new();
        for m in &before.mounts {
            *counts.entry(m).or_default() += 1;
        }
        let mut mounts = Vec::new();
        for m in &self.mounts {
            match counts.get_mut(m) {
                Some(n) if *n > 0 => *n -= 1,
                _ => mounts.push(m.clone()),
            }
        }
        Leftovers {
            processes: self
                .processes
                .iter()
                .filter(|p| !before.processes.iter().any(|b| b.pid == p.pid))
                .cloned()
                .collect(),
            mounts,
            cgroups: self
                .cgroups
                .iter()
                .filter(|c| !before.cgroups.contains(c))
                .cloned()
                .collect(),
            state_dirs: self
                .state_dirs
                .iter()
                .filter(|c| !before.state_dirs.contains(c))
                .cloned()
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
            && self.mounts.is_empty()
            && self.cgroups.is_empty()
            && self.state_dirs.is_empty()
    }
}

impl fmt::Display for Leftovers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return write!(f, "nothing");
        }
        for p in &self.processes {
            writeln!(f, "  process: {p}")?;
        }
        for m in &self.mounts {
            writeln!(f, "  mount: {m}")?;
        }
        for c in &self.cgroups {
            writeln!(f, "  cgroup: {}", c.display())?;
        }
        for d in &self.state_dirs {
            writeln!(f, "  state dir: {}", d.display())?;
        }
        Ok(())
    }
}

/// Asserts that nothing new is left since `before`, allowing `grace` for asynchronous
/// teardown. Call with the exclusive lock held.
pub fn assert_no_new_leftovers(before: &Leftovers, grace: Duration, context: &str) {
    let deadline = Instant::now() + grace;
    loop {
        let new = Leftovers::snapshot().new_since(before);
        if new.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "{context}: agentrun left behind (after {:.1}s grace):\n{new}",
                grace.as_secs_f64()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Removes by force what is new since `before`: kills processes, detaches mounts, removes
/// cgroups and state dirs. So that one failing test does not poison the next.
pub fn force_cleanup(before: &Leftovers) {
    force_cleanup_with(Leftovers::snapshot, before)
}

/// The cleanup loop of [`force_cleanup`] and [`force_cleanup_in`], over what `snapshot` sees.
fn force_cleanup_with(snapshot: impl Fn() -> Leftovers, before: &Leftovers) {
    for _ in 0..20 {
        let new = snapshot().new_since(before);
        if new.is_empty() {
            return;
        }
        for p in &new.processes {
            // SAFETY: plain kill; these are sandbox processes started by this test.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
        }
        for m in new.mounts.iter().rev() {
            if let Some(mp) = m.split(' ').nth(4) {
                let mp = unescape_mountinfo(mp);
                if let Ok(c) = std::ffi::CString::new(mp.as_os_str().as_bytes()) {
                    // SAFETY: valid C string.
                    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                }
            }
        }
        thread::sleep(Duration::from_millis(100));
        for c in &new.cgroups {
            remove_cgroup_tree(c);
        }
        for d in &new.state_dirs {
            let _ = fs::remove_dir_all(d);
        }
    }
}

fn remove_cgroup_tree(p: &Path) {
    if let Ok(rd) = fs::read_dir(p) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(p);
}

fn unescape_mountinfo(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// Runs [`force_cleanup`] on drop if the test is panicking.
pub struct CleanupOnPanic {
    pub before: Leftovers,
}

impl Drop for CleanupOnPanic {
    fn drop(&mut self) {
        if thread::panicking() {
            force_cleanup(&self.before);
        }
    }
}

/// Waits until `f` returns Some, polling every 20 ms, at most `timeout`.
pub fn wait_until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The machine kept busy: one spinning thread per CPU (plus `extra`), for at most `limit`;
/// stops on drop. For tests that prove something holds under load; hold the exclusive lock
/// ([`setup_exclusive`]) so that no other test's timing pays for it.
pub struct CpuLoad {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl CpuLoad {
    pub fn start(extra: usize, limit: Duration) -> CpuLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let n = thread::available_parallelism().map_or(1, |n| n.get()) + extra;
        let deadline = Instant::now() + limit;
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                thread::spawn(move || {
                    let mut x: u64 = 1;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        for _ in 0..100_000 {
                            x = std::hint::black_box(x.wrapping_mul(6364136223846793005) + 1);
                        }
                    }
                })
            })
            .collect();
        CpuLoad { stop, threads }
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Network

/// A TCP server on the host that accepts and counts connections (writing a greeting). Stops
/// on drop.
pub struct TcpServer {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    /// Listens on `ip:0` (e.g. "127.0.0.1", "0.0.0.0").
    pub fn start(ip: &str) -> TcpServer {
        let listener = TcpListener::bind((ip, 0)).expect("bind test server");
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (accepted.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        a.fetch_add(1, Ordering::SeqCst);
                        let _ = conn.write_all(b"hello from the host\n");
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        TcpServer {
            addr,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connects from the host and reads the greeting: proves the server is reachable.
    pub fn check_reachable_from_host(&self, ip: &str) {
        let addr: SocketAddr = format!("{ip}:{}", self.port()).parse().unwrap();
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("host cannot reach its own test server at {addr}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("no greeting from test server at {addr}: {e}"));
        assert_eq!(&buf, b"hello");
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The host's non-loopback IPv4 addresses.
pub fn host_ipv4_addrs() -> Vec<std::net::Ipv4Addr> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs/freeifaddrs pair; we only read the list in between.
    unsafe {
        if libc::getifaddrs(&mut ifap) != 0 {
            return out;
        }
        let mut p = ifap;
        while !p.is_null() {
            let a = (*p).ifa_addr;
            if !a.is_null() && (*a).sa_family as i32 == libc::AF_INET {
                let sin = &*(a as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() && !out.contains(&ip) {
                    out.push(ip);
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(ifap);
    }
    out
}

/// A TCP server on the host's loopback standing in for a host a sandbox reaches through the
/// egress proxy: `serve` gets each connection, one at a time. Stops (and is joined) on
/// drop; never runs longer than a minute.
pub struct LoopbackServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LoopbackServer {
    pub fn start(mut serve: impl FnMut(TcpStream) + Send + 'static) -> LoopbackServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !s.load(Ordering::SeqCst) && Instant::now() < deadline {
                let Ok((c, _)) = l.accept() else {
                    thread::sleep(Duration::from_millis(10));
                    continue;
                };
                c.set_nonblocking(false).unwrap();
                serve(c);
            }
        });
        LoopbackServer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_with_timeout_collects_output_and_code() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = run_with_timeout(cmd, None, Duration::from_secs(10));
        assert_eq!(out.code(), 3);
        assert_eq!(out.stdout(), "out\n");
        assert_eq!(out.stderr(), "err\n");
        assert!(!out.pipes_left_open);
    }

    #[test]
    fn run_with_timeout_feeds_stdin() {
        let mut cmd = Command::new("wc");
        cmd.arg("-c");
        let out = run_with_timeout(cmd, Some(b"data\n".to_vec()), Duration::from_secs(10));
        assert_eq!(out.stdout().trim(), "5");
    }

    #[test]
    fn run_with_timeout_stops_and_panics_past_deadline() {
        let start = Instant::now();
        let r = std::panic::catch_unwind(|| {
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            run_with_timeout(cmd, None, Duration::from_millis(200))
        });
        assert!(r.is_err());
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn pipes_held_by_a_grandchild_are_reported() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 7 & echo started"]);
        let start = Instant::now();
        let out = run_with_timeout(cmd, None, Duration::from_secs(10));
        assert!(out.pipes_left_open);
        assert_eq!(out.stdout(), "started\n");
        assert!(start.elapsed() < Duration::from_secs(7));
    }

    #[test]
    fn host_probes_answer() {
        assert!(["v1", "v2", "hybrid"].contains(&host_cgroup_mode()));
        assert!(host_landlock_abi() >= 0);
        let l = Leftovers::snapshot();
        assert!(l.new_since(&l).is_empty());
    }

    #[test]
    fn tcp_server_counts_connections() {
        let s = TcpServer::start("127.0.0.1");
        s.check_reachable_from_host("127.0.0.1");
        assert_eq!(s.accepted(), 1);
    }

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape_mountinfo("/x\\"), PathBuf::from("/x\\"));
    }
}

// ---------------------------------------------------------------------------------------------
// The daemon (`agentrun serve`) and what it reports (`ps`, `pool status`)

impl Leftovers {
    /// Like [`Leftovers::snapshot`] for the state dir `state` (instead of `$AGENTRUN_STATE_DIR`).
    /// Processes and cgroups are host-wide (sandbox uids, `agentrun/` cgroups) whatever the
    /// state dir.
    pub fn snapshot_in(state: &Path) -> Leftovers {
        let state_s = state.to_string_lossy().into_owned();
        let mounts = fs::read_to_string("/proc/self/mountinfo")
            .expect("read mountinfo")
            .lines()
            .filter(|l| {
                let mp = l.split(' ').nth(4).unwrap_or("");
                mp.starts_with(&state_s) || mp.contains("/agentrun/")
            })
            .map(str::to_string)
            .collect();
        let mut cgroups = Vec::new();
        for parent in agentrun_cgroup_parents() {
            if let Ok(rd) = fs::read_dir(&parent) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        cgroups.push(e.path());
                    }
                }
            }
        }
        cgroups.sort();
        let mut state_dirs: Vec<PathBuf> = sandbox_state_parents(state)
            .into_iter()
            .filter_map(|d| fs::read_dir(d).ok())
            .flat_map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .collect();
        state_dirs.sort();
        Leftovers {
            processes: sandbox_processes(),
            mounts,
            cgroups,
            state_dirs,
        }
    }
}

/// Ids of sandboxes that have a state dir in another agentrun state dir than `mine`: the
/// default `/run/agentrun` and the runner's `$AGENTRUN_STATE_DIR` (a developer's daemon, say).
/// A sandbox's state dir exists before its cgroup and outlives it, so a cgroup or process of
/// such an id belongs to that other agentrun, not to `mine`.
pub fn foreign_sandbox_ids(mine: &Path) -> std::collections::BTreeSet<String> {
    let mut ids = std::collections::BTreeSet::new();
    let mut dirs = vec![PathBuf::from("/run/agentrun"), state_dir()];
    dirs.extend(agentrun_state_dirs_in_use());
    dirs.sort();
    dirs.dedup();
    for dir in dirs {
        if dir == mine {
            continue;
        }
        for sandboxes in sandbox_state_parents(&dir) {
            if let Ok(rd) = fs::read_dir(sandboxes) {
                for e in rd.flatten() {
                    ids.insert(e.file_name().to_string_lossy().into_owned());
                }
            }
        }
    }
    ids
}

/// The dirs holding sandbox state dirs under the agentrun state dir `state`: its own
/// `sandboxes/`, and those of the `agentrun mcp` servers' slots (`mcp/<n>/sandboxes/`: each
/// stdio MCP server runs its own pool in a slot of the state dir).
pub fn sandbox_state_parents(state: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![state.join("sandboxes")];
    if let Ok(rd) = fs::read_dir(state.join("mcp")) {
        let mut slots: Vec<PathBuf> = rd.flatten().map(|e| e.path().join("sandboxes")).collect();
        slots.sort();
        dirs.extend(slots);
    }
    dirs
}

/// State dirs of the agentrun processes running on the host (root-owned processes whose
/// program is named `agentrun`): their `--state-dir`, else `AGENTRUN_STATE_DIR`, else
/// `/run/agentrun`.
pub fn agentrun_state_dirs_in_use() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for p in all_processes() {
        let is_agentrun = p
            .cmdline
            .first()
            .is_some_and(|a| Path::new(a).file_name() == Some(OsStr::new("agentrun")));
        if p.uid != 0 || !is_agentrun {
            continue;
        }
        let from_args = p
            .cmdline
            .iter()
            .position(|a| a == "--state-dir")
            .and_then(|i| p.cmdline.get(i + 1).cloned())
            .or_else(|| {
                p.cmdline
                    .iter()
                    .find_map(|a| a.strip_prefix("--state-dir=").map(str::to_string))
            });
        let from_env = || {
            fs::read(format!("/proc/{}/environ", p.pid))
                .ok()?
                .split(|b| *b == 0)
                .find_map(|kv| kv.strip_prefix(b"AGENTRUN_STATE_DIR=").map(|v| v.to_vec()))
                .filter(|v| !v.is_empty())
                .map(|v| String::from_utf8_lossy(&v).into_owned())
        };
        let dir = from_args
            .or_else(from_env)
            .unwrap_or_else(|| "/run/agentrun".into());
        let dir = PathBuf::from(dir);
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// The sandbox id of a process, from its `agentrun/<id>` cgroup.
fn sandbox_id_of(p: &ProcInfo) -> Option<String> {
    p.cgroup.lines().find_map(|l| {
        let path = l.split(':').nth(2)?;
        let rest = path.split("/agentrun/").nth(1)?;
        rest.split('/').next().map(str::to_string)
    })
}

impl Leftovers {
    /// Without the processes and cgroups of sandboxes `ids`.
    pub fn without_ids(&self, ids: &std::collections::BTreeSet<String>) -> Leftovers {
        Leftovers {
            processes: self
                .processes
                .iter()
                .filter(|p| !sandbox_id_of(p).is_some_and(|id| ids.contains(&id)))
                .cloned()
                .collect(),
            mounts: self.mounts.clone(),
            cgroups: self
                .cgroups
                .iter()
                .filter(|c| {
                    !c.file_name()
                        .is_some_and(|n| ids.contains(n.to_string_lossy().as_ref()))
                })
                .cloned()
                .collect(),
            state_dirs: self.state_dirs.clone(),
        }
    }

    /// [`Leftovers::snapshot_in`] `state`, leaving out the sandboxes of other state dirs
    /// ([`foreign_sandbox_ids`], listed before and after the snapshot).
    pub fn snapshot_own(state: &Path) -> Leftovers {
        let mut foreign = foreign_sandbox_ids(state);
        let snap = Leftovers::snapshot_in(state);
        foreign.extend(foreign_sandbox_ids(state));
        snap.without_ids(&foreign)
    }
}

/// [`force_cleanup`] for the state dir `state` (sparing other state dirs' sandboxes).
pub fn force_cleanup_in(state: &Path, before: &Leftovers) {
    force_cleanup_with(|| Leftovers::snapshot_own(state), before)
}

/// Mount points (deepest last) at or under `dir`, from this process's mountinfo.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|mp| mp.starts_with(dir))
        .collect()
}

/// Mounts of sandbox `id` (a mount point under a `sandboxes/<id>/` dir) in any process's
/// mount namespace, not only the host's: `PID: mountinfo line` each.
pub fn sandbox_mounts_anywhere(id: &str) -> Vec<String> {
    let needle = format!("/sandboxes/{id}/");
    let mut found = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return found;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(info) = fs::read_to_string(e.path().join("mountinfo")) else {
            continue;
        };
        for l in info.lines() {
            let mp = l
                .split(' ')
                .nth(4)
                .map(unescape_mountinfo)
                .unwrap_or_default();
            if mp.to_string_lossy().contains(&needle) {
                found.push(format!("{pid}: {l}"));
            }
        }
    }
    found
}

/// Paths of the `agentrun/<id>` cgroups of sandbox `id` (in every controller).
pub fn sandbox_cgroups(id: &str) -> Vec<PathBuf> {
    agentrun_cgroup_parents()
        .into_iter()
        .map(|p| p.join(id))
        .filter(|p| p.is_dir())
        .collect()
}

/// Live (non-zombie) processes in the sandbox uid range whose command line is `cmdline`.
pub fn sandboxed_processes_running(cmdline: &[&str]) -> Vec<ProcInfo> {
    all_processes()
        .into_iter()
        .filter(|p| p.state != 'Z' && p.uid >= SANDBOX_UID_BASE && p.cmdline == cmdline)
        .collect()
}

/// Waits (at most `timeout`) until no sandboxed process runs `cmdline`; panics naming the
/// survivors otherwise.
pub fn assert_no_sandboxed_process(cmdline: &[&str], timeout: Duration, context: &str) {
    if wait_until(timeout, || {
        sandboxed_processes_running(cmdline)
            .is_empty()
            .then_some(())
    })
    .is_none()
    {
        let left: Vec<String> = sandboxed_processes_running(cmdline)
            .iter()
            .map(|p| p.to_string())
            .collect();
        panic!(
            "{context}: {cmdline:?} still runs on the host after {:.1}s:\n  {}",
            timeout.as_secs_f64(),
            left.join("\n  ")
        );
    }
}

/// One entry of `agentrun ps --json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsEntry {
    pub id: String,
    /// "ready" or "running".
    pub state: String,
    /// Host pid of the sandbox's init.
    pub pid: i32,
    pub image: String,
    pub profile: String,
    /// The whole JSON object.
    pub raw: serde_json::Value,
}

/// The counters of one pool in `agentrun pool status --json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCounts {
    pub image: String,
    pub profile: String,
    pub ready: u64,
    pub target: u64,
    pub hits: u64,
    pub misses: u64,
}

fn json_str(v: &serde_json::Value, key: &str, ctx: &str) -> String {
    v.get(key)
        .and_then(|x| x.as_str())
        .unwrap_or_else(|| panic!("{ctx}: no string {key:?} in {v}"))
        .to_string()
}

fn json_u64(v: &serde_json::Value, key: &str, ctx: &str) -> u64 {
    v.get(key)
        .and_then(|x| x.as_u64())
        .unwrap_or_else(|| panic!("{ctx}: no unsigned integer {key:?} in {v}"))
}

/// Parses `agentrun ps --json` output.
pub fn parse_ps(json: &str) -> Vec<PsEntry> {
    let v: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("`agentrun ps --json` is not JSON ({e}): {json:?}"));
    let arr = v
        .as_array()
        .unwrap_or_else(|| panic!("`agentrun ps --json` is not an array: {v}"));
    arr.iter()
        .map(|e| {
            let ctx = "agentrun ps --json";
            let pid = e
                .get("pid")
                .and_then(|p| p.as_i64())
                .unwrap_or_else(|| panic!("{ctx}: no integer \"pid\" in {e}"));
            PsEntry {
                id: json_str(e, "id", ctx),
                state: json_str(e, "state", ctx),
                pid: pid as i32,
                image: json_str(e, "image", ctx),
                profile: json_str(e, "profile", ctx),
                raw: e.clone(),
            }
        })
        .collect()
}

/// Parses `agentrun pool status --json` output: the entries of its "pools" array.
pub fn parse_pool_status(json: &str) -> Vec<PoolCounts> {
    let v: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("`agentrun pool status --json` is not JSON ({e}): {json:?}"));
    let pools = v
        .get("pools")
        .and_then(|p| p.as_array())
        .unwrap_or_else(|| panic!("`agentrun pool status --json` has no \"pools\" array: {v}"));
    pools
        .iter()
        .map(|p| {
            let ctx = "agentrun pool status --json";
            PoolCounts {
                image: json_str(p, "image", ctx),
                profile: json_str(p, "profile", ctx),
                ready: json_u64(p, "ready", ctx),
                target: json_u64(p, "target", ctx),
                hits: json_u64(p, "hits", ctx),
                misses: json_u64(p, "misses", ctx),
            }
        })
        .collect()
}

/// A private `AGENTRUN_STATE_DIR` and, once started, an `agentrun serve` using it.
///
/// The state dir is `<tmp>/agentrun-e2e-XXXX/state`, every parent searchable (0755) as the
/// sandbox's unprivileged uid needs. Every client made through the daemon ([`Daemon::exec`],
/// [`Daemon::agentrun`]) gets the same `AGENTRUN_STATE_DIR` (so it finds the daemon's
/// default socket `$AGENTRUN_STATE_DIR/agentrun.sock`), the daemon's extra env, no
/// `AGENTRUN_NO_DAEMON` and none of the runner's `OTEL_*` variables.
///
/// Dropping it stops the daemon (SIGTERM, 20 s grace, SIGKILL), runs `agentrun gc` on the state
/// dir, removes by force whatever is still left if the test is failing (sandbox processes,
/// mounts under the state dir, new cgroups, state dirs), then unmounts what is left under the
/// state dir and removes it. Tests using a daemon hold the exclusive e2e lock: garbage
/// collection (a daemon's start, any cold run) looks at every `agentrun/` cgroup on the host,
/// whatever its state dir, and the tests count host-wide leftovers.
pub struct Daemon {
    root: Option<tempfile::TempDir>,
    state: PathBuf,
    env: Vec<(OsString, OsString)>,
    proc: Option<Running>,
    before: Leftovers,
}

/// How long a daemon is given to come up (socket answering) after it was spawned.
pub const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(60);

impl Daemon {
    /// A private state dir, no daemon yet.
    pub fn unstarted() -> Daemon {
        let root = tempdir();
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755))
                .expect("chmod 755 the state dir's parent");
        }
        let state = root.path().join("state");
        let before = Leftovers::snapshot_in(&state);
        Daemon {
            root: Some(root),
            state,
            env: Vec::new(),
            proc: None,
            before,
        }
    }

    /// `agentrun serve --pool-size N`, up and answering (not necessarily with a full pool).
    pub fn start(pool_size: usize) -> Daemon {
        let mut d = Daemon::unstarted();
        d.launch(["--pool-size".to_string(), pool_size.to_string()]);
        d
    }

    /// Adds a variable for the daemon and every client made through it (call before
    /// [`Daemon::launch`]).
    pub fn with_env(mut self, key: impl AsRef<OsStr>, val: impl AsRef<OsStr>) -> Daemon {
        self.env
            .push((key.as_ref().to_owned(), val.as_ref().to_owned()));
        self
    }

    /// Adds a variable for the daemon and every client made through it.
    pub fn set_env(&mut self, key: impl AsRef<OsStr>, val: impl AsRef<OsStr>) {
        self.env
            .push((key.as_ref().to_owned(), val.as_ref().to_owned()));
    }

    /// The private `AGENTRUN_STATE_DIR`.
    pub fn state(&self) -> &Path {
        &self.state
    }

    /// The API key file `agentrun serve` makes for its HTTP listeners when given no key.
    pub fn api_key_file(&self) -> PathBuf {
        self.state.join("api-key")
    }

    /// The key of [`Daemon::api_key_file`] (panics if there is none: the daemon was given a
    /// key, or has no HTTP listener).
    pub fn api_key(&self) -> String {
        let p = self.api_key_file();
        fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_string()
    }

    /// The daemon's default socket, `$AGENTRUN_STATE_DIR/agentrun.sock`.
    pub fn socket(&self) -> PathBuf {
        self.state.join("agentrun.sock")
    }

    /// What was on the host (in this state dir's terms) before anything ran in it.
    pub fn before(&self) -> &Leftovers {
        &self.before
    }

    /// `agentrun ARGS...` with this state dir and env.
    pub fn agentrun<I, S>(&self, args: I) -> Agentrun
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut a = agentrun(args)
            .env("AGENTRUN_STATE_DIR", &self.state)
            .env_remove("AGENTRUN_NO_DAEMON");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OTEL_") {
                a = a.env_remove(k);
            }
        }
        for (k, v) in &self.env {
            a = a.env(k, v);
        }
        a
    }

    /// `agentrun exec -- CMD...` as a client of this daemon.
    pub fn exec<I, S>(&self, cmd: I) -> Agentrun
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.exec_with::<[&str; 0], &str, I, S>([], cmd)
    }

    /// A run through this daemon whose egress proxy refuses a connection to `host` (port
    /// 80, rule `network.default`): one denial in the audit log and the metrics. Asserts the
    /// command saw the proxy's 403.
    pub fn provoke_egress_denial(&self, host: &str) {
        let script = format!(
            "import urllib.request, urllib.error\n\
             try:\n    urllib.request.urlopen('http://{host}/', timeout=10)\n    print('OPEN')\n\
             except urllib.error.HTTPError as e:\n    print(e.code)\n"
        );
        let out = self
            .exec_with(["--allow-host", "127.0.0.1:9"], ["python3", "-c", &script])
            .run();
        assert_eq!(out.success().trim(), "403", "{out}");
    }

    /// `agentrun exec OPTS... -- CMD...` as a client of this daemon.
    pub fn exec_with<O, OS, I, S>(&self, opts: O, cmd: I) -> Agentrun
    where
        O: IntoIterator<Item = OS>,
        OS: AsRef<OsStr>,
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut args: Vec<OsString> = vec!["exec".into()];
        args.extend(opts.into_iter().map(|a| a.as_ref().to_owned()));
        args.push("--".into());
        args.extend(cmd.into_iter().map(|a| a.as_ref().to_owned()));
        self.agentrun(args)
    }

    /// Spawns `agentrun serve ARGS...` and waits until its socket answers
    /// (`agentrun pool status --json` exits 0), at most [`DAEMON_START_TIMEOUT`]. Panics with
    /// the daemon's output if it exits or never answers.
    pub fn launch<I, S>(&mut self, args: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        assert!(self.proc.is_none(), "daemon already running");
        let mut all: Vec<OsString> = vec!["serve".into()];
        all.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self.proc = Some(self.agentrun(all).spawn());
        let deadline = Instant::now() + DAEMON_START_TIMEOUT;
        loop {
            if let Some(p) = self.proc.as_mut() {
                if p.exited() {
                    let out = self
                        .proc
                        .take()
                        .unwrap()
                        .wait_or_kill(Duration::from_secs(5));
                    panic!("`agentrun serve` exited while starting\n{out}");
                }
            }
            if self.socket().exists() {
                let out = self
                    .agentrun(["pool", "status", "--json"])
                    .timeout(Duration::from_secs(30))
                    .run();
                if out.status.code() == Some(0) {
                    return;
                }
            }
            if Instant::now() >= deadline {
                let mut p = self.proc.take().unwrap();
                p.stop();
                let out = p.wait_or_kill(Duration::from_secs(5));
                panic!(
                    "`agentrun serve` did not answer on {} within {:.0}s\n{out}",
                    self.socket().display(),
                    DAEMON_START_TIMEOUT.as_secs_f64()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Takes `proc` as this daemon's process (one started another way than
    /// [`Daemon::launch`], e.g. under a socket activator): stopped and cleaned up on drop.
    pub fn adopt(&mut self, proc: Running) {
        assert!(self.proc.is_none(), "daemon already running");
        self.proc = Some(proc);
    }

    /// Takes the daemon's process back (the caller stops it).
    pub fn take_proc(&mut self) -> Option<Running> {
        self.proc.take()
    }

    /// Is the daemon process still running?
    pub fn is_running(&mut self) -> bool {
        match self.proc.as_mut() {
            Some(p) => !p.exited(),
            None => false,
        }
    }

    /// The daemon's host pid.
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().expect("daemon not started").pid()
    }

    /// The daemon's stdout and stderr so far (for failure messages).
    pub fn log(&self) -> String {
        match &self.proc {
            Some(p) => format!(
                "--- daemon ({}) stdout ---\n{}\n--- daemon stderr ---\n{}",
                p.argv(),
                clip(p.stdout_so_far().as_bytes()),
                clip(p.stderr_so_far().as_bytes())
            ),
            None => "(daemon not running)".into(),
        }
    }

    /// `agentrun pool status --json`, parsed.
    pub fn pool_status(&self) -> Vec<PoolCounts> {
        let out = self
            .agentrun(["pool", "status", "--json"])
            .timeout(Duration::from_secs(30))
            .run();
        assert_eq!(
            out.status.code(),
            Some(0),
            "agentrun pool status --json\n{out}\n{}",
            self.log()
        );
        parse_pool_status(&out.stdout())
    }

    /// `agentrun pool status --json` as JSON (it must succeed).
    pub fn pool_status_json(&self) -> serde_json::Value {
        let out = self
            .agentrun(["pool", "status", "--json"])
            .timeout(Duration::from_secs(30))
            .run();
        serde_json::from_str(&out.success())
            .unwrap_or_else(|e| panic!("`agentrun pool status --json` is not JSON ({e}): {out}"))
    }

    /// The top-level `unpooled` counter: runs no kept pool could serve (made on demand).
    pub fn unpooled(&self) -> u64 {
        json_u64(
            &self.pool_status_json(),
            "unpooled",
            "agentrun pool status --json",
        )
    }

    /// Shells discarded so far, by reason (`pool status --json`'s `discarded`).
    pub fn discarded(&self) -> std::collections::BTreeMap<String, u64> {
        self.pool_status_json()["discarded"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The pool for the default key (image `host`, profile `default`).
    pub fn default_pool(&self) -> PoolCounts {
        let pools = self.pool_status();
        pools
            .iter()
            .find(|p| p.image == "host" && p.profile == "default")
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "no pool for image host, profile default in `pool status`: {pools:#?}\n{}",
                    self.log()
                )
            })
    }

    /// `agentrun ps --json`, parsed.
    pub fn ps(&self) -> Vec<PsEntry> {
        let out = self
            .agentrun(["ps", "--json"])
            .timeout(Duration::from_secs(30))
            .run();
        assert_eq!(
            out.status.code(),
            Some(0),
            "agentrun ps --json\n{out}\n{}",
            self.log()
        );
        parse_ps(&out.stdout())
    }

    /// Waits until the default pool is full (ready == target, and `ps` shows that many ready
    /// sandboxes), at most `timeout`; returns its counters.
    pub fn wait_pool_full(&self, timeout: Duration) -> PoolCounts {
        let mut last = None;
        let full = wait_until(timeout, || {
            let p = self.default_pool();
            let ps = self.ps();
            let ready = ps.iter().filter(|e| e.state == "ready").count() as u64;
            let full = p.ready == p.target && p.target > 0 && ready >= p.target;
            last = Some((p.clone(), ps));
            full.then_some(p)
        });
        full.unwrap_or_else(|| {
            panic!(
                "the pool did not fill within {:.0}s; last status and ps: {last:#?}\n{}",
                timeout.as_secs_f64(),
                self.log()
            )
        })
    }

    /// SIGTERM to the daemon; waits up to `timeout` for it to exit and returns what it did.
    /// Panics (after SIGKILL) if it does not exit in time.
    pub fn terminate(&mut self, timeout: Duration) -> RunOutput {
        let mut p = self.proc.take().expect("daemon not started");
        p.signal(libc::SIGTERM);
        match p.wait_for(timeout) {
            Some(out) => out,
            None => {
                let tree = process_tree(p.pid() as i32);
                p.kill9();
                let out = p.wait_or_kill(Duration::from_secs(5));
                panic!(
                    "`agentrun serve` did not exit within {:.0}s of SIGTERM (killed); its \
                     processes before the kill:\n{tree}{out}",
                    timeout.as_secs_f64()
                );
            }
        }
    }

    /// SIGKILL to the daemon (reaped); nothing is cleaned up.
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }
}

/// `pid` and its descendants, one line per thread with its state and kernel wait channel
/// (for reports about hangs).
pub fn process_tree(pid: i32) -> String {
    fn ppid(pid: i32) -> Option<i32> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(1)?.parse().ok()
    }
    let all: Vec<ProcInfo> = all_processes();
    let mut out = String::new();
    let mut stack = vec![(pid, 0usize)];
    while let Some((p, depth)) = stack.pop() {
        let Some(info) = all.iter().find(|i| i.pid == p) else {
            continue;
        };
        out.push_str(&format!("{}{info}\n", "  ".repeat(depth + 1)));
        if let Ok(rd) = fs::read_dir(format!("/proc/{p}/task")) {
            for t in rd.flatten() {
                let t = t.path();
                let read = |f: &str| {
                    fs::read_to_string(t.join(f))
                        .unwrap_or_default()
                        .trim()
                        .to_string()
                };
                let state = read("status")
                    .lines()
                    .find_map(|l| l.strip_prefix("State:").map(|s| s.trim().to_string()))
                    .unwrap_or_default();
                out.push_str(&format!(
                    "{}  thread {} ({}) {state} wchan={}\n",
                    "  ".repeat(depth + 1),
                    t.file_name().unwrap_or_default().to_string_lossy(),
                    read("comm"),
                    read("wchan")
                ));
            }
        }
        for c in all.iter().filter(|c| ppid(c.pid) == Some(p)) {
            stack.push((c.pid, depth + 1));
        }
    }
    out
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.signal(libc::SIGTERM);
            if p.wait_for(Duration::from_secs(20)).is_none() {
                eprintln!("agentrun serve did not exit within 20 s of SIGTERM: killing it");
                p.kill9();
            }
        }
        // What is left is agentrun's own to clean (its gc is scoped to this state dir); the
        // forced cleanup (which kills every sandbox process new since the daemon's creation,
        // whoever made it) only when the test failed.
        if self.state.exists() {
            let mut gc = self.agentrun(["gc"]).spawn();
            if gc.wait_for(Duration::from_secs(30)).is_none() {
                gc.kill9();
            }
        }
        if thread::panicking() {
            force_cleanup_in(&self.state, &self.before);
        }
        if let Some(root) = self.root.take() {
            remove_state_root(root, "the daemon stopped and `agentrun gc` ran");
        }
    }
}

/// Removes `root`, a harness temp dir holding an agentrun state dir, once agentrun is done
/// with it (`after`: what has been done to make it so, for the message). A mount still under
/// it is agentrun's leak: it is detached, and the test fails naming it (a panic in the
/// caller's drop; only reported when the test is failing already). So does a removal that
/// fails. Never recurses into something still mounted (it could be a workspace).
pub fn remove_state_root(root: tempfile::TempDir, after: &str) {
    let dir = root.path().to_path_buf();
    let leaked = mounts_under(&dir);
    for mp in leaked.iter().rev() {
        if let Ok(c) = std::ffi::CString::new(mp.as_os_str().as_bytes()) {
            // SAFETY: umount2 with a valid C string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let still = mounts_under(&dir);
    let removed = if still.is_empty() {
        root.close()
            .map_err(|e| format!("removing {}: {e}", dir.display()))
    } else {
        let _ = root.keep();
        Err(format!(
            "{} left behind: still mounted after a lazy unmount: {still:#?}",
            dir.display()
        ))
    };
    let mut problems = Vec::new();
    if !leaked.is_empty() {
        problems.push(format!(
            "agentrun left {} mount(s) under {} after {after}: {leaked:#?}",
            leaked.len(),
            dir.display()
        ));
    }
    if let Err(e) = removed {
        problems.push(e);
    }
    if problems.is_empty() {
        return;
    }
    let msg = problems.join("\n");
    if thread::panicking() {
        eprintln!("{msg}");
    } else {
        panic!("{msg}");
    }
}

/// The harness temp dir (`<tmp>/agentrun-e2e-XXXX`, made by [`tempdir`]) that `p` is in, if
/// it no longer exists: a command given such a path would make it again (agentrun creates a
/// missing state dir and its parents) and leave it behind. The usual cause is a temporary,
/// `Daemon::unstarted().agentrun(...)`: the `Daemon` is dropped, its dir removed, before
/// the command runs.
fn removed_harness_dir(p: &Path) -> Option<PathBuf> {
    let tmp = std::env::temp_dir();
    let top = p.ancestors().find(|a| a.parent() == Some(tmp.as_path()))?;
    let name = top.file_name()?.to_string_lossy();
    let harness = name.starts_with("agentrun-e2e-") && !name.starts_with("agentrun-e2e-root.");
    (harness && !top.exists()).then(|| top.to_path_buf())
}

#[cfg(test)]
mod daemon_helper_tests {
    use super::*;

    #[test]
    fn ps_and_pool_status_json_parse() {
        let ps = parse_ps(
            r#"[{"id":"ar-1","state":"ready","pid":12,"image":"host","profile":"default","age_ms":3}]"#,
        );
        assert_eq!(ps.len(), 1);
        assert_eq!(
            (ps[0].id.as_str(), ps[0].state.as_str(), ps[0].pid),
            ("ar-1", "ready", 12)
        );
        let pools = parse_pool_status(
            r#"{"pools":[{"image":"host","profile":"default","ready":2,"target":3,"hits":4,"misses":5}],"running":0}"#,
        );
        assert_eq!(
            pools,
            vec![PoolCounts {
                image: "host".into(),
                profile: "default".into(),
                ready: 2,
                target: 3,
                hits: 4,
                misses: 5
            }]
        );
    }

    #[test]
    fn a_command_into_a_removed_harness_dir_is_refused() {
        let d = Daemon::unstarted();
        let state = d.state().to_path_buf();
        assert_eq!(removed_harness_dir(&state), None);
        drop(d);
        let root = state.parent().unwrap().to_path_buf();
        assert_eq!(removed_harness_dir(&state), Some(root.clone()));
        assert_eq!(removed_harness_dir(Path::new("/run/agentrun")), None);
        let r = std::panic::catch_unwind(|| {
            agentrun(["gc"]).env("AGENTRUN_STATE_DIR", &state).command()
        });
        assert!(r.is_err(), "the command was made");
        assert!(!root.exists(), "{} was made again", root.display());
    }

    #[test]
    fn foreign_sandboxes_are_left_out() {
        let p = |pid, cgroup: &str| ProcInfo {
            pid,
            uid: SANDBOX_UID_BASE,
            comm: "x".into(),
            cmdline: vec![],
            cgroup: cgroup.into(),
            state: 'S',
        };
        let l = Leftovers {
            processes: vec![
                p(1, "4:memory:/agentrun/ar-foreign\n0::/"),
                p(2, "0::/agentrun/ar-mine"),
                p(3, "0::/"),
            ],
            mounts: vec![],
            cgroups: vec![
                PathBuf::from("/sys/fs/cgroup/memory/agentrun/ar-foreign"),
                PathBuf::from("/sys/fs/cgroup/memory/agentrun/ar-mine"),
            ],
            state_dirs: vec![],
        };
        let ids = ["ar-foreign".to_string()].into_iter().collect();
        let kept = l.without_ids(&ids);
        assert_eq!(
            kept.processes.iter().map(|p| p.pid).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(
            kept.cgroups,
            vec![PathBuf::from("/sys/fs/cgroup/memory/agentrun/ar-mine")]
        );
    }
}
