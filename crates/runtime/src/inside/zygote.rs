//! A Python zygote in a shell (profile `[python] zygote`): a `python3` the shell's init starts
//! ahead, with the profile's preload list imported, that forks the process of each eligible
//! `python3` run *into the run's cell* instead of the cell exec'ing `python3` (SOCK, USENIX
//! ATC '18). What this module owns:
//! - which runs may use it ([`invocation`]: the command line and the start-up environment;
//!   anything else is exec'd as always, with the reason recorded);
//! - the init's side ([`Zygote`]): starting it (`python3 -c <zygote.py> MODULE...`, the
//!   bootstrap shipped in this binary: nothing is installed into images), its readiness (a pipe
//!   whose write end it closes once its imports are done), restarting it when it dies;
//! - the cell's side ([`fork_run`], [`supervise`]): the request (the cell's pid, mount and ipc
//!   namespaces and root, the run's stdio, a copy of the cell's Landlock ruleset), and the
//!   run's end as the zygote, its parent, reports it.
//!
//! **The zygote never holds a run's data.** Every run it forks starts as a copy of its memory,
//! so nothing of one run (argv, environment, code, file names, working directory, stdin,
//! output) may ever be in it: a fork request is the fixed bytes [`FORK_GO`] and fds. The run's
//! request is written by the cell on a socket of its own, passed among those fds and read by
//! the forked child alone, after the fork. The zygote reads only the cell's signal requests
//! (a signal number) and its children's wait status.
//!
//! The zygote runs with the init's privileges (CAP_SYS_ADMIN, CAP_SETPCAP and CAP_SYS_CHROOT
//! in the shell's user namespace, under the shell's seccomp filter, which in a zygote shell
//! also allows `setns`): it must enter a cell's namespaces. Like the init it is out of every
//! cell's reach: not in any cell's pid namespace, no fd of it in a cell, its memory copied on
//! write. Its children confine themselves before anything of the run executes: rlimits,
//! capabilities (bounding set included), no_new_privs, the cell's own Landlock ruleset, the
//! run's seccomp filter on top of the shell's: the same as an exec'd command of that cell.
//! The image's Python code (site, the preload modules) runs in it with those privileges before
//! any run: a zygote trusts its image as the shell trusts its `/usr`.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use seccompiler::BpfProgram;
use serde::{Deserialize, Serialize};

use crate::confine::limits::Rlimits;
use crate::control::{self, InitResult, ResourceUsage};
use crate::inside::reaper;

/// The bootstrap the zygote runs (`python3 -c`).
const BOOTSTRAP: &str = include_str!("zygote.py");

/// The fds the zygote finds its channel and its ready pipe on.
const ZYGOTE_CHANNEL_FD: RawFd = 3;
const ZYGOTE_READY_FD: RawFd = 4;

/// How long a cell waits for the zygote's child to say it runs (or why not) before it execs
/// the command instead.
const FORK_WAIT: Duration = Duration::from_secs(2);

/// How often a shell's init starts its zygote again after it died.
const MAX_RESTARTS: u32 = 3;

/// A shell's zygote, as the profile and image ask for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZygoteConfig {
    /// Modules imported ahead (one that fails is reported and skipped).
    pub preload: Vec<String>,
    /// The environment it starts with: the pool's (profile defaults, then the image's `Env`),
    /// which a run's start-up variables must match to use it.
    pub env: Vec<String>,
}

/// How the zygote's child runs the code (`python3`'s modes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PythonMode {
    /// `python3 -c CODE`
    Command,
    /// `python3 FILE`
    File,
    /// `python3 -m MODULE`
    Module,
    /// `python3` or `python3 -` with the program on stdin.
    Stdin,
}

/// A run the zygote can take: `python3`'s mode, its target (code, file or module) and the
/// arguments after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub mode: PythonMode,
    pub target: Option<String>,
    pub args: Vec<String>,
}

/// Variables a fresh interpreter (or a preloaded module) reads when it starts: a run whose
/// value of one differs from the zygote's is exec'd. By name, then by prefix and suffix.
const STARTUP_VARIABLES: &[&str] = &[
    "PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
];
const STARTUP_PREFIXES: &[&str] = &[
    "PYTHON",
    "LC_",
    "OPENBLAS_",
    "OMP_",
    "MKL_",
    "NUMEXPR_",
    "MPL",
    "GOTO_",
];
const STARTUP_SUFFIXES: &[&str] = &["_NUM_THREADS"];

fn startup_variable(key: &str) -> bool {
    STARTUP_VARIABLES.contains(&key)
        || STARTUP_PREFIXES.iter().any(|p| key.starts_with(p))
        || STARTUP_SUFFIXES.iter().any(|s| key.ends_with(s))
}

/// Why a run does not go through the shell's zygote (the cell execs the command instead):
/// its text is the short reason the span and the run's report carry.
#[derive(Debug, thiserror::Error)]
pub enum Ineligible {
    #[error("no command")]
    NoCommand,
    #[error("not python3: {0}")]
    NotPython3(String),
    #[error("{0} without its argument")]
    MissingArgument(String),
    #[error("interpreter option {0}")]
    InterpreterOption(String),
    #[error("environment variable {0} differs from the zygote's")]
    EnvironmentDiffers(String),
    #[error("the shell has no zygote")]
    NoZygote,
    #[error(
        "the shell's zygote is not running (a shell made on demand starts it after a run that asks for it)"
    )]
    NotRunning,
    #[error("opening the cell's namespaces: {0}")]
    CellNamespaces(std::io::Error),
    #[error("runs as another user")]
    AnotherUser,
    #[error("a session of its own (a terminal)")]
    OwnSession,
    #[error("the zygote is not ready (still importing)")]
    NotReady,
    #[error("the run's request is too large to be forked ({0})")]
    RequestTooLarge(crate::error::RuntimeError),
    /// The zygote's own reason, sent back over its channel.
    #[error("{0}")]
    Declined(String),
}

/// Whether the zygote can run `argv` with `env` (`KEY=VALUE`), given the zygote's own
/// environment: the invocation, or why not.
pub fn invocation(
    argv: &[String],
    env: &[String],
    zygote_env: &[String],
) -> Result<Invocation, Ineligible> {
    match argv.first().map(String::as_str) {
        Some("python3") => {}
        Some(other) => return Err(Ineligible::NotPython3(other.to_string())),
        None => return Err(Ineligible::NoCommand),
    }
    let rest = &argv[1..];
    let inv = match rest.first().map(String::as_str) {
        None => Invocation {
            mode: PythonMode::Stdin,
            target: None,
            args: Vec::new(),
        },
        Some("-") => Invocation {
            mode: PythonMode::Stdin,
            target: None,
            args: rest.to_vec(),
        },
        Some(flag @ ("-c" | "-m")) => {
            let Some(target) = rest.get(1) else {
                return Err(Ineligible::MissingArgument(flag.to_string()));
            };
            Invocation {
                mode: if flag == "-c" {
                    PythonMode::Command
                } else {
                    PythonMode::Module
                },
                target: Some(target.clone()),
                args: rest[2..].to_vec(),
            }
        }
        Some(flag) if flag.starts_with('-') => {
            let shown: String = flag.chars().take(16).collect();
            return Err(Ineligible::InterpreterOption(shown));
        }
        Some(file) => Invocation {
            mode: PythonMode::File,
            target: Some(file.to_string()),
            args: rest[1..].to_vec(),
        },
    };
    let pairs = |e: &[String]| -> Vec<(String, String)> {
        e.iter()
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| startup_variable(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let (ours, theirs) = (pairs(env), pairs(zygote_env));
    let value = |list: &[(String, String)], key: &str| {
        list.iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    for (key, _) in ours.iter().chain(&theirs) {
        if value(&ours, key) != value(&theirs, key) {
            return Err(Ineligible::EnvironmentDiffers(key.clone()));
        }
    }
    Ok(inv)
}

// --- the shell's init ------------------------------------------------------------------------

/// What every child of the zygote installs: sent once, when it starts.
#[derive(Serialize)]
struct ZygoteSetup {
    /// The run's seccomp filter beyond the shell's (BPF programs, hex).
    filters: Vec<String>,
    /// Capabilities the command keeps (numbers).
    keep_caps: Vec<u8>,
}

/// A running zygote, held by the shell's init.
pub(crate) struct Zygote {
    process: Launched,
    config: ZygoteConfig,
    setup: Vec<u8>,
    restarts: u32,
}

impl Zygote {
    /// Starts the zygote (the init is single-threaded: it forks and execs `python3`). Its
    /// forked runs install `run_filters` (a cell's seccomp programs) and keep `command_caps`,
    /// as a cell's command does (see [`crate::inside::cell::CellTemplate`]).
    pub(crate) fn start(
        config: &ZygoteConfig,
        run_filters: &[BpfProgram],
        command_caps: &[caps::Capability],
    ) -> Result<Zygote, ZygoteError> {
        let setup = ZygoteSetup {
            filters: run_filters
                .iter()
                .map(|p| {
                    p.iter()
                        .flat_map(|i| {
                            let mut b = Vec::with_capacity(8);
                            b.extend_from_slice(&i.code.to_ne_bytes());
                            b.push(i.jt);
                            b.push(i.jf);
                            b.extend_from_slice(&i.k.to_ne_bytes());
                            b
                        })
                        .map(|b| format!("{b:02x}"))
                        .collect()
                })
                .collect(),
            keep_caps: command_caps.iter().map(|c| c.index()).collect(),
        };
        let setup = serde_json::to_vec(&setup).map_err(ZygoteError::Setup)?;
        Ok(Zygote {
            process: launch(config, &setup)?,
            config: config.clone(),
            setup,
            restarts: 0,
        })
    }

    /// Starts it again after it died (at most [`MAX_RESTARTS`] times in the shell's life);
    /// `false`: no more.
    pub(crate) fn restart(&mut self) -> bool {
        if self.restarts >= MAX_RESTARTS {
            return false;
        }
        self.restarts += 1;
        match launch(&self.config, &self.setup) {
            Ok(process) => {
                self.process = process;
                true
            }
            Err(_) => false,
        }
    }

    /// Its pid (in the shell's pid namespace).
    pub(crate) fn pid(&self) -> i32 {
        self.process.pid
    }

    /// The fds a cell keeps to reach it: its channel and its ready pipe.
    pub(crate) fn link(&self) -> (RawFd, RawFd) {
        (
            self.process.channel.as_raw_fd(),
            self.process.ready.as_raw_fd(),
        )
    }
}

/// A zygote process as [`launch`] started it.
struct Launched {
    pid: i32,
    /// The init's end of the zygote's channel; cells send their fork requests on copies.
    channel: OwnedFd,
    /// Read end of the pipe whose write end the zygote closes when its imports are done.
    ready: OwnedFd,
}

/// Why a shell has no zygote (the shell's init says so on its stderr and runs without one).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ZygoteError {
    #[error("no python3 on the image's PATH")]
    NoPython3,
    #[error("a NUL byte in the zygote's command")]
    Nul,
    #[error("{0}")]
    Setup(serde_json::Error),
    #[error("{0}")]
    Channel(crate::error::RuntimeError),
    #[error("pipe: {0}")]
    Pipe(nix::Error),
    #[error("fork: {0}")]
    Fork(std::io::Error),
}

/// Forks and execs the zygote. The setup message is waiting on its channel when it starts.
fn launch(config: &ZygoteConfig, setup: &[u8]) -> Result<Launched, ZygoteError> {
    let python = find_in_path("python3", &config.env).ok_or(ZygoteError::NoPython3)?;
    let cstr = |s: &str| CString::new(s).map_err(|_| ZygoteError::Nul);
    let mut argv = vec![cstr("python3")?, cstr("-c")?, cstr(BOOTSTRAP)?];
    for m in &config.preload {
        argv.push(cstr(m)?);
    }
    let env: Vec<CString> = config
        .env
        .iter()
        .map(|kv| cstr(kv))
        .collect::<Result<_, _>>()?;
    let program = cstr(&python.to_string_lossy())?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());

    let (ours, theirs) = control::seqpacket_pair().map_err(ZygoteError::Channel)?;
    let (ready_r, ready_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(ZygoteError::Pipe)?;
    control::send(ours.as_fd(), setup, &[]).map_err(ZygoteError::Channel)?;
    // SAFETY: the shell's init is single-threaded; the child only makes async-signal-safe
    // calls (fcntl, dup2, close_range, sigprocmask, signal, prctl, chdir, execve, _exit) on
    // data prepared above.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(ZygoteError::Fork(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; every pointer is to data owned by this (copied) stack frame.
        unsafe {
            let chan = libc::fcntl(theirs.as_raw_fd(), libc::F_DUPFD, 10);
            let ready = libc::fcntl(ready_w.as_raw_fd(), libc::F_DUPFD, 10);
            if chan < 0
                || ready < 0
                || libc::dup2(chan, ZYGOTE_CHANNEL_FD) < 0
                || libc::dup2(ready, ZYGOTE_READY_FD) < 0
            {
                libc::_exit(crate::exit::EXIT_SETUP_FAILED);
            }
            crate::inside::close_range(ZYGOTE_READY_FD as u32 + 1, u32::MAX);
            for sig in 1..libc::SIGRTMIN() {
                libc::signal(sig, libc::SIG_DFL);
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::chdir(c"/".as_ptr());
            libc::execve(program.as_ptr(), argv_ptrs.as_ptr(), env_ptrs.as_ptr());
            libc::_exit(crate::exit::EXIT_NOT_FOUND);
        }
    }
    drop(theirs);
    drop(ready_w);
    Ok(Launched {
        pid,
        channel: ours,
        ready: ready_r,
    })
}

/// `name` looked up in the `PATH` of `env` (`KEY=VALUE`) as a cell's spawn looks up the
/// run's `python3` ([`crate::inside::spawn::find_program`]).
fn find_in_path(name: &str, env: &[String]) -> Option<PathBuf> {
    let path = env
        .iter()
        .rev()
        .find_map(|kv| kv.strip_prefix("PATH="))
        .unwrap_or(crate::inside::spawn::DEFAULT_PATH);
    crate::inside::spawn::find_program(name, path)
}

/// A shell's zygote as the host sees it (`agentrun pool status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZygoteStatus {
    /// Its host pid; `None`: not running (not started yet, or it could not start).
    pub pid: Option<i32>,
    /// It has imported its preload list and serves.
    pub ready: bool,
    pub preloaded: Vec<String>,
    /// Modules it could not import, with why.
    pub skipped: std::collections::BTreeMap<String, String>,
    /// Its proportional set size (its share of the pages it shares with its children and
    /// other processes), bytes.
    pub pss_bytes: u64,
}

/// The status of the zygote of the shell whose init has host pid `init`, from `/proc` and the
/// report line the zygote writes to the shell's `init_log` once its imports are done.
pub fn status(init: i32, init_log: &Path) -> ZygoteStatus {
    let children =
        std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).unwrap_or_default();
    let pid = children
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|p| is_shell_helper(*p, init));
    let mut st = ZygoteStatus {
        pid,
        ..Default::default()
    };
    if let Some(pid) = pid {
        st.pss_bytes = pss_bytes(pid).unwrap_or(0);
    }
    #[derive(Deserialize)]
    struct Ready {
        preloaded: Vec<String>,
        skipped: std::collections::BTreeMap<String, String>,
    }
    let log = std::fs::read_to_string(init_log).unwrap_or_default();
    if let Some(r) = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("agentrun zygote: ready: "))
        .and_then(|j| serde_json::from_str::<Ready>(j).ok())
    {
        st.ready = pid.is_some();
        st.preloaded = r.preloaded;
        st.skipped = r.skipped;
    }
    st
}

/// `Pss` of `/proc/PID/smaps_rollup`, bytes.
fn pss_bytes(pid: i32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kb = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

/// Whether host pid `pid` is one of a shell init's own helpers (its Python zygote): a child of
/// the init (host pid `init`) in the shell's own pid namespace. Every process of a run is in
/// its cell's pid namespace, one level further down, so none can pass for one.
pub fn is_shell_helper(pid: i32, init: i32) -> bool {
    let field = |pid: i32, name: &str| -> Option<String> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let depth = |pid: i32| field(pid, "NSpid:").map(|ns| ns.split_whitespace().count());
    field(pid, "PPid:").and_then(|p| p.parse::<i32>().ok()) == Some(init)
        && depth(pid).is_some()
        && depth(pid) == depth(init)
}

// --- the cell ---------------------------------------------------------------------------------

/// A cell's hold on its shell's zygote (copies of the init's fds, kept through the clone).
pub(crate) struct ZygoteLink {
    pub channel: OwnedFd,
    pub ready: OwnedFd,
}

impl ZygoteLink {
    /// Takes the fds the cell inherited from the init.
    ///
    /// # Safety
    /// `fds` must be open in this process and owned by nothing else in it.
    pub(crate) unsafe fn adopt(fds: (RawFd, RawFd)) -> ZygoteLink {
        // SAFETY: the caller's contract.
        unsafe {
            ZygoteLink {
                channel: OwnedFd::from_raw_fd(fds.0),
                ready: OwnedFd::from_raw_fd(fds.1),
            }
        }
    }

    /// Whether the zygote has done its imports (or is gone: then the request fails).
    fn ready(&self) -> bool {
        control::wait_readable(self.ready.as_fd(), Some(Duration::ZERO)).unwrap_or(false)
    }
}

/// The cell's namespaces and root, opened before it confines itself (for the zygote's child
/// to enter).
pub(crate) struct CellPlace {
    pidns: OwnedFd,
    mntns: OwnedFd,
    ipcns: OwnedFd,
    root: OwnedFd,
}

impl CellPlace {
    pub(crate) fn open() -> std::io::Result<CellPlace> {
        let open = |p: &str| std::fs::File::open(p).map(OwnedFd::from);
        Ok(CellPlace {
            pidns: open("/proc/self/ns/pid")?,
            mntns: open("/proc/self/ns/mnt")?,
            ipcns: open("/proc/self/ns/ipc")?,
            root: open("/")?,
        })
    }
}

/// What a cell sends the zygote to have a run forked: these bytes, fixed, and the fds
/// (report socket, run request socket, pid/mnt/ipc namespaces, root, stdin, stdout, stderr,
/// and the Landlock ruleset if the cell has one). Nothing of the run: the zygote's memory is
/// what every later run starts from.
const FORK_GO: &[u8] = b"go";

/// What a spare cell sends the zygote to have a child forked into it ahead of its run (see
/// [`fork_ahead`]): these bytes, fixed, and three fds (report socket, request socket, the
/// cell's pid namespace).
const FORK_AHEAD: &[u8] = b"ahead";

/// The run's request, which only the zygote's forked child reads, from a socket of its own
/// (the zygote passes it on unread).
#[derive(Serialize)]
struct RunRequest<'a> {
    mode: &'a PythonMode,
    target: Option<&'a str>,
    args: &'a [String],
    orig_argv: &'a [String],
    env: &'a [String],
    cwd: &'a str,
    limits: Rlimits,
}

/// What the zygote or its child says on a run's report socket.
#[derive(Deserialize, Default)]
struct Report {
    started: Option<i32>,
    pong: Option<bool>,
    failed: Option<String>,
    fallback: Option<String>,
    exit: Option<i32>,
    #[serde(default)]
    user_us: u64,
    #[serde(default)]
    system_us: u64,
    #[serde(default)]
    max_rss_kb: u64,
}

/// A run the zygote's child has taken: its pid (in the cell) and the socket its end comes on.
pub(crate) struct Forked {
    pid: i32,
    report: OwnedFd,
}

/// What the cell's request says of the run (for [`fork_run`]).
pub(crate) struct RunParts<'a> {
    pub invocation: &'a Invocation,
    pub argv: &'a [String],
    pub env: &'a [String],
    pub cwd: &'a str,
    pub limits: Rlimits,
    pub stdio: &'a [OwnedFd; 3],
    pub landlock: Option<&'a OwnedFd>,
}

/// Why the zygote did not take a run (before anything of the run executed: the cell execs
/// the command instead).
#[derive(Debug)]
pub(crate) struct NotForked {
    pub reason: String,
    /// The zygote misbehaved (gone, silent, failing): the host replaces the shell.
    pub fault: bool,
}

impl NotForked {
    fn fault(reason: impl Into<String>) -> Self {
        NotForked {
            reason: reason.into(),
            fault: true,
        }
    }
}

impl From<Ineligible> for NotForked {
    /// A run the zygote cannot take: no fault of it.
    fn from(why: Ineligible) -> Self {
        NotForked {
            reason: why.to_string(),
            fault: false,
        }
    }
}

impl RunParts<'_> {
    fn request(&self) -> RunRequest<'_> {
        RunRequest {
            mode: &self.invocation.mode,
            target: self.invocation.target.as_deref(),
            args: &self.invocation.args,
            orig_argv: self.argv,
            env: self.env,
            cwd: self.cwd,
            limits: self.limits,
        }
    }

    /// The fds a child needs besides its sockets and pid namespace: the cell's mount and ipc
    /// namespaces and root, the run's stdio, the cell's Landlock ruleset if it has one.
    fn place_fds(&self, place: &CellPlace) -> Vec<RawFd> {
        let mut fds = vec![
            place.mntns.as_raw_fd(),
            place.ipcns.as_raw_fd(),
            place.root.as_raw_fd(),
            self.stdio[0].as_raw_fd(),
            self.stdio[1].as_raw_fd(),
            self.stdio[2].as_raw_fd(),
        ];
        if let Some(l) = self.landlock {
            fds.push(l.as_raw_fd());
        }
        fds
    }
}

/// Asks the zygote for a child in this cell running `run`; waits (bounded) until the child
/// says it runs.
pub(crate) fn fork_run(
    link: &ZygoteLink,
    place: &CellPlace,
    run: &RunParts<'_>,
) -> Result<Forked, NotForked> {
    if !link.ready() {
        return Err(Ineligible::NotReady.into());
    }
    let (ours, theirs) = control::seqpacket_pair().map_err(|e| NotForked::fault(e.to_string()))?;
    // The run's request waits on a socket of its own for the forked child (the zygote only
    // passes the fd on); queued before the fork is asked for, so the child's one read finds it.
    let (request, request_theirs) =
        control::seqpacket_pair().map_err(|e| NotForked::fault(e.to_string()))?;
    control::send_json(request.as_fd(), &run.request(), &[])
        .map_err(Ineligible::RequestTooLarge)?;
    drop(request);
    let mut fds = vec![
        theirs.as_raw_fd(),
        request_theirs.as_raw_fd(),
        place.pidns.as_raw_fd(),
    ];
    fds.extend(run.place_fds(place));
    control::send(link.channel.as_fd(), FORK_GO, &fds)
        .map_err(|_| NotForked::fault("the zygote is gone"))?;
    drop(theirs);
    drop(request_theirs);
    await_start(ours)
}

/// A child the zygote forked into this spare cell before its run came ([`fork_ahead`]),
/// waiting for the run's request. Dropped unused (the run is exec'd, or the spare ends), it
/// reads the end of its request socket and exits, having run nothing.
pub(crate) struct Ahead {
    report: OwnedFd,
    request: OwnedFd,
}

/// In a spare cell whose shell's zygote is ready: asks it for a child in this cell's pid
/// namespace now, so that the fork (~1.5 ms of a preloaded interpreter's page tables and
/// CPython's fork handlers) is off the next run's path. Nothing of a run exists yet; the
/// child gets the run's request, stdio and the cell's namespaces only when the run comes
/// ([`start_ahead`]). None: no zygote ready, or it could not be asked (the run then asks for
/// its fork as usual).
pub(crate) fn fork_ahead(link: &ZygoteLink) -> Option<Ahead> {
    if !link.ready() {
        return None;
    }
    let pidns = std::fs::File::open("/proc/self/ns/pid").ok()?;
    let (report, report_theirs) = control::seqpacket_pair().ok()?;
    let (request, request_theirs) = control::seqpacket_pair().ok()?;
    let fds = [
        report_theirs.as_raw_fd(),
        request_theirs.as_raw_fd(),
        pidns.as_raw_fd(),
    ];
    control::send(link.channel.as_fd(), FORK_AHEAD, &fds).ok()?;
    Some(Ahead { report, request })
}

impl Ahead {
    /// Ends the child unused (the run is exec'd, or the cell is long-lived): it reads the end
    /// of its request socket and exits, having run nothing. Waits (bounded) until the zygote
    /// has reaped it, so that the command exec'd next is alone in the cell with its PID 1, as
    /// in a cell that never had one.
    pub(crate) fn dismiss(self) {
        drop(self.request);
        // Dropped: the zygote gone (EOF) or slow means the child goes with the cell anyway.
        let _ = control::wait_readable(self.report.as_fd(), Some(AHEAD_END_WAIT));
    }
}

/// How long [`Ahead::dismiss`] waits for the unused child's end.
const AHEAD_END_WAIT: Duration = Duration::from_secs(1);

/// Hands `run` to the child forked [`fork_ahead`]: its request, with the cell's namespaces,
/// root, the run's stdio and ruleset as fds, on its own socket (the zygote sees none of it);
/// waits (bounded) until the child says it runs. `Err(None)`: the child is gone before it
/// took the run (nothing of it ran): ask for a fork as usual.
pub(crate) fn start_ahead(
    ahead: Ahead,
    place: &CellPlace,
    run: &RunParts<'_>,
) -> Result<Forked, Option<NotForked>> {
    use crate::error::RuntimeError;
    // The zygote reports the child's end: it must still answer before the run is handed on
    // (a hung one fails no run: the run is exec'd, as when it does not fork).
    #[derive(Serialize)]
    struct Ping {
        ping: bool,
    }
    if control::send_json(ahead.report.as_fd(), &Ping { ping: true }, &[]).is_err() {
        return Err(None);
    }
    match answer(ahead.report.as_fd()).map_err(Some)? {
        Some(Report {
            pong: Some(true), ..
        }) => {}
        // The child ended before it took the run (its end reported), or the zygote is gone.
        _ => return Err(None),
    }
    match control::send_json(ahead.request.as_fd(), &run.request(), &run.place_fds(place)) {
        Ok(()) => {}
        Err(
            e @ RuntimeError::Sys {
                errno: nix::Error::EMSGSIZE,
                ..
            },
        ) => return Err(Some(Ineligible::RequestTooLarge(e).into())),
        Err(_) => return Err(None),
    }
    drop(ahead.request);
    await_start(ahead.report).map_err(Some)
}

/// The next message on a run's report socket, waited for at most [`FORK_WAIT`] (a zygote
/// silent that long is at fault). `Ok(None)`: the socket's other ends are gone, or it sent
/// something unreadable.
fn answer(report: BorrowedFd<'_>) -> Result<Option<Report>, NotForked> {
    if !control::wait_readable(report, Some(FORK_WAIT)).unwrap_or(false) {
        return Err(NotForked::fault(format!(
            "the zygote did not answer within {} s",
            FORK_WAIT.as_secs()
        )));
    }
    Ok(control::recv_json::<Report>(report)
        .ok()
        .flatten()
        .map(|(r, _)| r))
}

/// Waits (bounded) on a run's report socket until the zygote's child says it runs (or falls
/// back, or failed).
fn await_start(ours: OwnedFd) -> Result<Forked, NotForked> {
    match answer(ours.as_fd())? {
        Some(Report {
            started: Some(pid), ..
        }) => Ok(Forked { pid, report: ours }),
        Some(Report {
            fallback: Some(why),
            ..
        }) => Err(Ineligible::Declined(why).into()),
        Some(Report {
            failed: Some(why), ..
        }) => Err(NotForked::fault(format!(
            "the zygote's child failed: {why}"
        ))),
        Some(_) => Err(NotForked::fault("the zygote sent something else")),
        None => Err(NotForked::fault("the zygote is gone")),
    }
}

/// The cell's PID 1 while the zygote's child runs (every signal blocked by the caller):
/// forwards signals to the child's process group, reaps orphans (the child's own children
/// that outlive it are the cell's PID 1's), and returns how the child ended as its parent,
/// the zygote, reports it.
pub(crate) fn supervise(forked: Forked) -> InitResult {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let gone = |msg: &str| InitResult {
        exit_code: crate::exit::EXIT_SETUP_FAILED,
        error: Some(msg.to_string()),
        zygote: Some(true),
        zygote_fault: true,
        ..Default::default()
    };
    let Ok(signals) = SignalFd::with_flags(
        &SigSet::all(),
        SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
    ) else {
        return gone("cannot watch signals");
    };
    loop {
        let Ok((report_ready, signal_ready)) = reaper::wait_either(forked.report.as_fd(), &signals)
        else {
            return gone("cannot wait for the run");
        };
        if signal_ready {
            while let Ok(Some(info)) = signals.read_signal() {
                if crate::inside::net::woken(info.ssi_signo as i32, info.ssi_code) {
                    continue;
                }
                let Ok(sig) = Signal::try_from(info.ssi_signo as i32) else {
                    continue;
                };
                if sig == Signal::SIGCHLD {
                    while reaper::reap_one().is_some() {}
                } else {
                    forked.signal(sig as i32, true);
                }
            }
        }
        if report_ready {
            let mut result = forked.end();
            if result.error.is_none() {
                while reaper::reap_one().is_some() {}
                let orphans = reaper::children_usage();
                result.usage.user_us += orphans.user_us;
                result.usage.system_us += orphans.system_us;
                result.usage.max_rss_kb = result.usage.max_rss_kb.max(orphans.max_rss_kb);
            } else {
                reaper::say_on(2, result.error.as_deref().unwrap_or_default());
            }
            return result;
        }
    }
}

impl Forked {
    /// Sends `signal` to the child (its process group with `group`) through the zygote: the
    /// child restricted itself into a Landlock domain of its own, into which Landlock lets no
    /// process of the cell signal (its PID 1 included); the zygote is in none.
    pub(crate) fn signal(&self, signal: i32, group: bool) {
        #[derive(Serialize)]
        struct SignalRequest {
            signal: i32,
            group: bool,
        }
        // Dropped: a failed send means the process already ended; its end is reported on the
        // same socket.
        let _ = control::send_json(self.report.as_fd(), &SignalRequest { signal, group }, &[]);
    }

    /// The child's pid in the cell.
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// The socket the child's end is reported on (readable once it has ended, or the zygote
    /// is gone).
    pub(crate) fn report(&self) -> BorrowedFd<'_> {
        self.report.as_fd()
    }

    /// How the child ended, as the zygote reports it once [`Forked::report`] is readable. The
    /// zygote gone instead: the child is killed and the result is a setup failure (its status
    /// is lost).
    pub(crate) fn end(&self) -> InitResult {
        match control::recv_json::<Report>(self.report.as_fd()) {
            Ok(Some((
                Report {
                    exit: Some(status),
                    user_us,
                    system_us,
                    max_rss_kb,
                    ..
                },
                _,
            ))) => {
                let (exit_code, signal) = reaper::decode_status(status);
                InitResult {
                    exit_code,
                    signal,
                    usage: ResourceUsage {
                        user_us,
                        system_us,
                        max_rss_kb,
                    },
                    zygote: Some(true),
                    ..Default::default()
                }
            }
            _ => {
                // Dropped: ESRCH at most (the zygote is already gone), which is what this arm reports.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                InitResult {
                    exit_code: crate::exit::EXIT_SETUP_FAILED,
                    error: Some("the zygote ended during the run: its exit status is lost".into()),
                    zygote: Some(true),
                    zygote_fault: true,
                    ..Default::default()
                }
            }
        }
    }
}

/// What a long-lived cell keeps to have its processes forked by the shell's zygote: the
/// zygote, the cell's namespaces and root, its Landlock ruleset, its limits.
pub(crate) struct LiveZygote {
    pub link: ZygoteLink,
    pub place: CellPlace,
    pub ruleset: Option<OwnedFd>,
    /// The zygote's environment (a process's start-up variables must match it).
    pub env: Vec<String>,
    pub limits: Rlimits,
}

impl LiveZygote {
    /// Forks `sp` from the zygote if it can take it (see [`invocation`]; not as another user,
    /// nor in a session of its own: a terminal's process is exec'd).
    pub(crate) fn spawn(
        &self,
        sp: &control::SpawnRequest,
        stdio: &[OwnedFd; 3],
    ) -> Result<Forked, NotForked> {
        if sp.user.as_deref().is_some_and(|u| !u.is_empty()) {
            return Err(Ineligible::AnotherUser.into());
        }
        if sp.new_session {
            return Err(Ineligible::OwnSession.into());
        }
        let invocation = invocation(&sp.argv, &sp.env, &self.env)?;
        fork_run(
            &self.link,
            &self.place,
            &RunParts {
                invocation: &invocation,
                argv: &sp.argv,
                env: &sp.env,
                cwd: &sp.cwd,
                limits: self.limits,
                stdio,
                landlock: self.ruleset.as_ref(),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_command_line_shapes_python3_runs_are_recognised() {
        let env = v(&["PATH=/usr/bin", "HOME=/root"]);
        let ok = |argv: &[&str]| invocation(&v(argv), &env, &env);
        let inv = ok(&["python3", "-c", "print(1)", "a", "-x"]).unwrap();
        assert_eq!(inv.mode, PythonMode::Command);
        assert_eq!(inv.target.as_deref(), Some("print(1)"));
        assert_eq!(inv.args, v(&["a", "-x"]));
        let inv = ok(&["python3", "-m", "http.server", "8000"]).unwrap();
        assert_eq!((inv.mode, inv.args), (PythonMode::Module, v(&["8000"])));
        let inv = ok(&["python3", "x.py", "-c", "y"]).unwrap();
        assert_eq!(inv.mode, PythonMode::File);
        assert_eq!(inv.target.as_deref(), Some("x.py"));
        assert_eq!(inv.args, v(&["-c", "y"]));
        assert_eq!(ok(&["python3"]).unwrap().mode, PythonMode::Stdin);
        let inv = ok(&["python3", "-", "a"]).unwrap();
        assert_eq!((inv.mode, inv.args), (PythonMode::Stdin, v(&["-", "a"])));
        for (argv, why) in [
            (&["python3", "-I", "-c", "1"][..], "interpreter option -I"),
            (&["python3", "-u", "x.py"][..], "interpreter option -u"),
            (&["python3", "-cprint(1)"][..], "interpreter option"),
            (&["python3", "-c"][..], "-c without"),
            (&["python3", "--", "x.py"][..], "interpreter option --"),
            (&["python", "-c", "1"][..], "not python3"),
            (&["/usr/bin/python3", "-c", "1"][..], "not python3"),
            (&["sh", "-c", "python3 -c 1"][..], "not python3"),
        ] {
            let err = ok(argv).unwrap_err();
            assert!(err.to_string().contains(why), "{argv:?}: {err}");
        }
    }

    #[test]
    fn start_up_variables_must_match_the_zygotes_and_others_may_differ() {
        let zyg = v(&[
            "PATH=/usr/bin",
            "HOME=/root",
            "LANG=C.UTF-8",
            "PYTHONUNBUFFERED=1",
        ]);
        let argv = v(&["python3", "-c", "1"]);
        let mut run = zyg.clone();
        run.extend(v(&[
            "TRACEPARENT=00-abc",
            "FOO=bar",
            "HTTP_PROXY=http://127.0.0.1:3128",
        ]));
        assert!(invocation(&argv, &run, &zyg).is_ok());
        for (extra, key) in [
            ("PYTHONPATH=/x", "PYTHONPATH"),
            ("PYTHONHASHSEED=0", "PYTHONHASHSEED"),
            ("PYTHONUNBUFFERED=0", "PYTHONUNBUFFERED"),
            ("LC_ALL=C", "LC_ALL"),
            ("HOME=/tmp", "HOME"),
            ("OMP_NUM_THREADS=1", "OMP_NUM_THREADS"),
            ("MPLBACKEND=agg", "MPLBACKEND"),
        ] {
            let mut r = zyg.clone();
            r.push(extra.to_string());
            let err = invocation(&argv, &r, &zyg).unwrap_err();
            assert!(err.to_string().contains(key), "{extra}: {err}");
        }
        // A variable the zygote has and the run lacks.
        let less: Vec<String> = zyg
            .iter()
            .filter(|kv| !kv.starts_with("PYTHONUNBUFFERED"))
            .cloned()
            .collect();
        assert!(invocation(&argv, &less, &zyg)
            .unwrap_err()
            .to_string()
            .contains("PYTHONUNBUFFERED"));
    }

    #[test]
    fn python3_is_found_on_the_environments_path() {
        let env = v(&["PATH=/nonexistent:/usr/bin:/bin"]);
        if Path::new("/usr/bin/python3").exists() {
            assert_eq!(
                find_in_path("python3", &env),
                Some(PathBuf::from("/usr/bin/python3"))
            );
        }
        assert_eq!(find_in_path("no-such-program-xyz", &env), None);
    }
}
