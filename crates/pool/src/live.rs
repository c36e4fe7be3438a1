//! Long-lived sandboxes: the core the OpenSandbox API (and the Docker Engine API) is built on.
//!
//! A long-lived sandbox is one shell with one long-lived cell: a [`LiveManager`] takes a shell
//! from the warm pool kept for its image and profile (or has one made on demand when no pool
//! keeps them), whatever else the sandbox asks for: its limits are written to the shell's
//! cgroup, its mounts (Docker binds) are made on the host and attached in its cell, and a
//! network policy is the cell's egress relay to the proxy the caller serves on the shell's
//! egress socket, as for a run. It then makes a long-lived cell in the shell whose PID 1
//! speaks the persistent dialect on the cell's channel (see [`agentrun_runtime::control`]),
//! and keeps it until [`LiveManager::delete`], which kills the cell and gives the shell back
//! to its pool with the verdict a run's shell gets (the cell's end awaited, nothing left in
//! the shell's cgroup, nothing of the shell changed, no OOM kill; the pool's max runs and
//! age), unless anything the sandbox did outlives its cell ([`LiveSandbox::taint`]: it was
//! paused, expired, had sockets made in its network namespace, or its egress proxy still
//! listens): then the shell is discarded. A sandbox has an id of its own
//! ([`LiveSandbox::id`], random, the form of a shell's), apart from its shell's
//! ([`LiveSandbox::shell_id`]: the cgroup, state dir and egress socket it uses), so a shell
//! serving one sandbox after another never shows an id twice:
//!
//! - [`LiveSandbox::spawn`] starts any number of processes over time, each with its own argv,
//!   environment (over the sandbox's), working directory and stdio fds (passed, not copied:
//!   the caller owns the other ends of its pipes or pty), each in its own process group (or
//!   session, the hook for terminal processes); `on_exit` is called with the exit status
//!   (and the process's rusage) from the sandbox's event thread;
//! - [`LiveSandbox::signal`] signals a process's whole process group (or the process alone),
//!   [`LiveSandbox::signal_all`] every process but the sandbox's init;
//! - [`LiveSandbox::set_limits`] changes CPU and memory limits, [`LiveSandbox::pause`] and
//!   [`LiveSandbox::resume`] freeze and thaw it (cgroup freezer), [`LiveSandbox::usage`]
//!   reads its cgroup's CPU time and memory;
//! - [`LiveSandbox::root`] opens its root directory as its processes see it (with every mount
//!   inside), for file access that must resolve paths inside it (`openat2(RESOLVE_IN_ROOT)`).
//!
//! The API is synchronous and runtime-agnostic: async callers run the blocking calls
//! (`create`, `spawn`, `delete`) on a blocking thread and turn `on_exit` into a channel.
//! Nothing here knows HTTP: expiry, logs and protocol mapping belong to the front ends.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use agentrun_runtime::cellrun::{cell_request, CellRun, MappingCache, RunMounts};
use agentrun_runtime::cgroup::{CgroupMode, CgroupUsage};
use agentrun_runtime::control::{
    self, CellWork, LiveEvent, LiveRequest, ResourceUsage, SpawnRequest,
};
use agentrun_runtime::Enforcement;

use crate::factory::PooledShell;
use crate::factory::{apply_limits, RunLimits};
use crate::pool::Pool;
use crate::recipe::{SandboxRecipe, DEFAULT_PROFILE};
use crate::run::Verdict;
use crate::{lock, PoolError};

/// How long a spawn waits for the init's answer.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(10);

/// What a long-lived sandbox is made from. Build with [`LiveSpec::new`] and the setters.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveSpec {
    pub image: String,
    pub profile: String,
    /// CPU limit in cores (`None`: the profile's).
    pub cpus: Option<f64>,
    /// Memory limit in bytes (`None`: the profile's).
    pub memory_bytes: Option<u64>,
    /// Environment of every process, over the profile's defaults and the image's `Env`.
    pub env: Vec<(String, String)>,
    /// Host directories mounted in (live binds: Docker's `HostConfig.Binds`), made on the host
    /// and attached in the cell like a run's (a pooled shell serves it).
    pub mounts: Vec<agentrun_runtime::rootfs::UserMount>,
    /// Host directory mounted at `/workspace` (writable as far as the profile lets it be).
    pub workspace: Option<std::path::PathBuf>,
    /// Task limit (`None`: the profile's).
    pub pids: Option<u32>,
    /// Relay this loopback port inside the sandbox to an egress proxy the caller serves at
    /// [`LiveSandbox::egress_socket`] (a network policy). Every shell has that socket's
    /// directory, so a pooled shell serves it.
    pub egress_port: Option<u16>,
    /// The sandbox's id (`None`: a new random one): a sandbox brought back from disk keeps
    /// the id it had. The caller makes sure no live sandbox has it.
    pub id: Option<String>,
    /// Frozen layers its cell's overlay has over the image (a fork copy: the writable layer
    /// of the sandbox it was forked from, [`crate::snapshot::freeze`]), possibly still being
    /// made: the create takes its shell first, then waits for them. The sandbox holds them
    /// until its cell is gone. A pooled shell of its image serves it.
    pub frozen: Option<Arc<crate::frozen::PendingLayer>>,
}

impl LiveSpec {
    pub fn new(image: impl Into<String>) -> Self {
        LiveSpec {
            image: image.into(),
            profile: DEFAULT_PROFILE.into(),
            cpus: None,
            memory_bytes: None,
            env: Vec::new(),
            mounts: Vec::new(),
            workspace: None,
            pids: None,
            egress_port: None,
            id: None,
            frozen: None,
        }
    }
    pub fn workspace(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.workspace = dir;
        self
    }
    pub fn egress_port(mut self, port: Option<u16>) -> Self {
        self.egress_port = port;
        self
    }
    pub fn profile(mut self, p: impl Into<String>) -> Self {
        self.profile = p.into();
        self
    }
    pub fn cpus(mut self, c: Option<f64>) -> Self {
        self.cpus = c;
        self
    }
    pub fn memory_bytes(mut self, m: Option<u64>) -> Self {
        self.memory_bytes = m;
        self
    }
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    /// [`Self::env`] for each pair of `vars`, in order.
    pub fn envs(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        self.env.extend(vars);
        self
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessExit {
    /// Exit code, 128+N for signal N.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub usage: ResourceUsage,
    /// The sandbox went away (deleted, or its init died) before the process reported.
    pub lost: bool,
    /// The shell's Python zygote forked it (instead of an exec).
    pub zygote: bool,
}

/// Called once, from the sandbox's event thread, when a process has exited.
pub type ExitHook = Box<dyn FnOnce(ProcessExit) + Send>;

/// One process to start in a sandbox.
pub struct ProcessSpec {
    pub argv: Vec<String>,
    /// Over the sandbox's environment.
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// stdin, stdout, stderr.
    pub stdio: [OwnedFd; 3],
    /// Start it in a new session (terminal processes) rather than a new process group.
    pub new_session: bool,
    /// Run it as this user (a Docker `User` spec: `uid[:gid]`, `name[:group]`), resolved by
    /// the sandbox's init from the sandbox's own /etc/passwd and /etc/group; `None`: root.
    pub user: Option<String>,
    pub on_exit: ExitHook,
}

/// A started process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// The sandbox-unique id to signal it by.
    pub id: u64,
    /// Its pid inside the sandbox.
    pub pid: i32,
}

/// The init's answer to a spawn: the pid, or (exit code, why).
type StartReply = Result<i32, (i32, String)>;

#[derive(Default)]
struct Events {
    /// Spawns waiting for Started/Failed.
    starting: HashMap<u64, mpsc::Sender<StartReply>>,
    /// Processes started (or starting) and not yet ended: what to call at their end.
    exits: HashMap<u64, Running>,
    /// The init is gone (channel EOF).
    dead: bool,
}

/// A process of a sandbox until it ends.
struct Running {
    on_exit: ExitHook,
    command: String,
    started: SystemTime,
}

/// A process running in a long-lived sandbox, as [`LiveSandbox::processes`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningProcess {
    /// Its id ([`Process::id`]).
    pub id: u64,
    /// Its command line ([`agentrun_telemetry::argv_line`]).
    pub command: String,
    pub started: SystemTime,
}

/// A long-lived sandbox. Shared (`Arc`); it lives until [`LiveManager::delete`].
pub struct LiveSandbox {
    /// Its own id (random, the same form as a shell's), which the APIs show.
    id: String,
    /// The id of the shell it runs in (its cgroup's and state dir's name); the shell may
    /// serve other runs and sandboxes before and after it.
    shell_id: String,
    /// The number of its cell in the shell (awaited at the end).
    cell: u64,
    /// Why its shell must not be reused after it, if anything put it in doubt
    /// ([`LiveSandbox::taint`]).
    doubt: Mutex<Option<&'static str>>,
    /// Its cell was killed on purpose ([`LiveSandbox::kill`] or the delete).
    killed: AtomicBool,
    /// The shell's OOM-kill count when the sandbox was made.
    oom_base: u64,
    /// The shell's CPU time (ns) when the sandbox was made (the shell served others before).
    cpu_base_ns: u64,
    image: String,
    /// The id of the image it runs (empty for the built-in `host` image).
    image_id: String,
    profile: String,
    /// Host pid of the cell's PID 1.
    init_pid: i32,
    /// A pidfd of the cell's PID 1.
    pidfd: OwnedFd,
    enforcement: Enforcement,
    pool_hit: bool,
    created: SystemTime,
    /// Every process's base environment (`KEY=VALUE` resolved into a map).
    env: BTreeMap<String, String>,
    control: OwnedFd,
    events: Arc<Mutex<Events>>,
    next_id: AtomicU64,
    paused: AtomicBool,
    /// Held while its cgroup's freezer is changed or a snapshot reads its writable layer:
    /// a pause or resume asked during a snapshot waits for it.
    freezing: Mutex<()>,
    deleted: AtomicBool,
    cgroup: Option<CgroupMode>,
    /// An ordinary user's sandbox: no cgroup freezer (a snapshot stops it with SIGSTOP,
    /// [`crate::sigstop`]), and its files' owners are the user and its subordinate ids.
    rootless: bool,
    /// A rootless sandbox's writable layer as its cell sent it (`O_PATH`).
    upper: Option<OwnedFd>,
    swap_limit: bool,
    limits: Mutex<(f64, u64)>,
    /// Handed back to the pool on delete.
    pooled: Mutex<Option<PooledShell>>,
    egress_socket: Option<std::path::PathBuf>,
    /// The frozen layers of its cell's overlay ([`LiveSpec::frozen`]), let go once the cell
    /// is gone.
    frozen: Mutex<Option<Arc<crate::frozen::FrozenLayer>>>,
}

impl LiveSandbox {
    /// Its own id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// The id of the shell it runs in: the name of its cgroup and state dir (what
    /// `agentrun ps` lists, with this sandbox's id beside it).
    pub fn shell_id(&self) -> &str {
        &self.shell_id
    }
    /// Puts its shell in doubt: when the sandbox goes, the shell is discarded (counted
    /// under `reason`, the first one given) rather than given back to its pool. For what the
    /// caller did to the shell that a cell's end does not undo (sockets made in its network
    /// namespace, ports published into it) or that ended it badly (a timeout).
    pub fn taint(&self, reason: &'static str) {
        lock(&self.doubt).get_or_insert(reason);
    }
    pub fn image(&self) -> &str {
        &self.image
    }
    pub fn profile(&self) -> &str {
        &self.profile
    }
    /// The image it runs, as the store can find it now: its id, or `host` for the built-in
    /// image (a name may have been given to another image since).
    pub fn image_ref(&self) -> &str {
        if self.image_id.is_empty() {
            agentrun_image::HOST_IMAGE
        } else {
            &self.image_id
        }
    }
    /// Host pid of the sandbox's PID 1 (its cell's): `/proc/<pid>/root` and its namespaces
    /// are what its processes see.
    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }
    pub fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }
    /// Whether it came ready from the pool.
    pub fn pool_hit(&self) -> bool {
        self.pool_hit
    }
    pub fn created(&self) -> SystemTime {
        self.created
    }
    /// Where its egress proxy must listen (made with [`LiveSpec::egress_port`]); the
    /// directory is removed with the sandbox.
    pub fn egress_socket(&self) -> Option<&std::path::Path> {
        self.egress_socket.as_deref()
    }
    /// The environment every process starts with.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }
    /// (CPU cores, memory bytes) now in force.
    pub fn limits(&self) -> (f64, u64) {
        *lock(&self.limits)
    }
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }
    /// Whether the init is gone (deleted, or died).
    pub fn is_dead(&self) -> bool {
        self.deleted.load(Ordering::SeqCst) || lock(&self.events).dead
    }

    /// Starts a process; returns once it runs (or could not start:
    /// [`PoolError::Spawn`] with the code a shell would give).
    pub fn spawn(&self, spec: ProcessSpec) -> Result<Process, PoolError> {
        if self.is_paused() {
            return Err(PoolError::Invalid(format!("sandbox {} is paused", self.id)));
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let running = Running {
            on_exit: spec.on_exit,
            command: agentrun_telemetry::argv_line(&spec.argv),
            started: SystemTime::now(),
        };
        let mut env = self.env.clone();
        env.extend(spec.env);
        let req = LiveRequest::Spawn(SpawnRequest {
            id,
            argv: spec.argv,
            env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            cwd: spec.cwd,
            new_session: spec.new_session,
            user: spec.user,
        });
        let (tx, rx) = mpsc::channel();
        {
            let mut ev = lock(&self.events);
            if ev.dead || self.deleted.load(Ordering::SeqCst) {
                return Err(PoolError::Invalid(format!("sandbox {} is gone", self.id)));
            }
            ev.starting.insert(id, tx);
            ev.exits.insert(id, running);
        }
        let raw: Vec<i32> = spec.stdio.iter().map(|f| f.as_raw_fd()).collect();
        let sent = control::send_json(self.control.as_fd(), &req, &raw);
        drop(spec.stdio);
        let forget = || {
            let mut ev = lock(&self.events);
            ev.starting.remove(&id);
            ev.exits.remove(&id);
        };
        if let Err(e) = sent {
            forget();
            return Err(e.into());
        }
        match rx.recv_timeout(SPAWN_TIMEOUT) {
            Ok(Ok(pid)) => Ok(Process { id, pid }),
            Ok(Err((exit_code, message))) => Err(PoolError::Spawn { exit_code, message }),
            Err(_) => {
                forget();
                Err(PoolError::Invalid(format!(
                    "sandbox {} did not start the process",
                    self.id
                )))
            }
        }
    }

    /// Its shell's CPU time (ns) when it was made: what [`LiveSandbox::usage`]'s `cpu_ns`
    /// counted before it.
    pub fn cpu_base_ns(&self) -> u64 {
        self.cpu_base_ns
    }

    /// The processes started in it that have not ended, oldest first.
    pub fn processes(&self) -> Vec<RunningProcess> {
        let ev = lock(&self.events);
        let mut all: Vec<RunningProcess> = ev
            .exits
            .iter()
            .map(|(id, r)| RunningProcess {
                id: *id,
                command: r.command.clone(),
                started: r.started,
            })
            .collect();
        all.sort_by_key(|p| p.id);
        all
    }

    /// Kills every process in the sandbox now (SIGKILL to its cell's PID 1: the cell's pid
    /// namespace dies with it). It still has to be deleted, which may then happen off the
    /// caller's path.
    pub fn kill(&self) {
        let pooled = lock(&self.pooled);
        if pooled.is_some() {
            self.killed.store(true, Ordering::SeqCst);
            if self.is_paused() {
                if let Err(e) = self.resume() {
                    tracing::warn!(target: "agentrun::pool", "thawing a killed sandbox (its tasks die once thawed): {e}");
                }
            }
            // The dying PID 1 tears the cell's namespaces and mounts down itself: background
            // work, done where and as the factory does it (see `factory::background_cpus`).
            // (Its pidfd confirms the pid is still the cell's.)
            if agentrun_runtime::cellrun::pidfd_pid(self.pidfd.as_fd()) == Some(self.init_pid) {
                let pid = nix::unistd::Pid::from_raw(self.init_pid);
                if let Some(bg) = crate::factory::background_cpus() {
                    // A scheduling hint: if it fails, the dying cell keeps every CPU.
                    let _ = nix::sched::sched_setaffinity(pid, &bg);
                }
                // SAFETY: setpriority on the cell's PID 1, identified through its pidfd above.
                unsafe {
                    libc::setpriority(
                        libc::PRIO_PROCESS,
                        self.init_pid as libc::id_t,
                        crate::factory::FACTORY_NICE,
                    )
                };
            }
            agentrun_runtime::cellrun::pidfd_signal(self.pidfd.as_fd(), libc::SIGKILL);
        }
    }

    /// Sends `signal` to process `id`'s process group (`group`) or to the process only.
    /// Unknown or finished processes are ignored.
    pub fn signal(&self, id: u64, signal: i32, group: bool) -> Result<(), PoolError> {
        let req = LiveRequest::Signal { id, signal, group };
        control::send_json(self.control.as_fd(), &req, &[])?;
        Ok(())
    }

    /// Sends `signal` to every process in the sandbox but its init, which stays (and with it
    /// the sandbox, its filesystem and its network namespace): a container's stop.
    pub fn signal_all(&self, signal: i32) -> Result<(), PoolError> {
        let req = LiveRequest::SignalAll { signal };
        control::send_json(self.control.as_fd(), &req, &[])?;
        Ok(())
    }

    fn cgroup(&self) -> Result<CgroupMode, PoolError> {
        self.cgroup
            .ok_or_else(|| PoolError::Invalid("no cgroup filesystem on this host".into()))
    }

    /// Sets new CPU (cores) and memory (bytes) limits.
    pub fn set_limits(
        &self,
        cpus: Option<f64>,
        memory_bytes: Option<u64>,
    ) -> Result<(), PoolError> {
        if cpus.is_none() && memory_bytes.is_none() {
            return Ok(());
        }
        let mut pooled = lock(&self.pooled);
        let Some(shell) = pooled.as_mut() else {
            return Err(PoolError::Invalid(format!("sandbox {} is gone", self.id)));
        };
        let written =
            self.cgroup()?
                .set_limits(&self.shell_id, cpus, memory_bytes, self.swap_limit);
        // What the shell's cgroup holds now (the next run on the shell rewrites what differs
        // from its own, see `factory::apply_limits`); unknown after a failed write.
        if written.is_err() {
            self.taint("limits_unknown");
        }
        written?;
        if let Some(c) = cpus {
            shell.limits.cpus = c;
        }
        if let Some(m) = memory_bytes {
            shell.limits.memory_bytes = m;
        }
        drop(pooled);
        let mut l = lock(&self.limits);
        if let Some(c) = cpus {
            l.0 = c;
        }
        if let Some(m) = memory_bytes {
            l.1 = m;
        }
        Ok(())
    }

    /// Freezes every process (cgroup freezer).
    /// Its shell is not reused after a sandbox that was ever frozen.
    pub fn pause(&self) -> Result<(), PoolError> {
        let _freezing = lock(&self.freezing);
        self.taint("paused");
        self.cgroup()?.freeze(&self.shell_id, true)?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Thaws it.
    pub fn resume(&self) -> Result<(), PoolError> {
        let _freezing = lock(&self.freezing);
        self.cgroup()?.freeze(&self.shell_id, false)?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// The frozen layers under its writable layer (a fork copy's), if any.
    pub fn frozen_layer(&self) -> Option<Arc<crate::frozen::FrozenLayer>> {
        lock(&self.frozen).clone()
    }

    /// The directories of its frozen layers, top first (none for a sandbox that is no fork
    /// copy).
    pub fn frozen_dirs(&self) -> Vec<std::path::PathBuf> {
        lock(&self.frozen)
            .as_ref()
            .map(|l| l.dirs())
            .unwrap_or_default()
    }

    /// Runs `read` on the sandbox's writable layer (its cell's overlay upper directory, as a
    /// path the host can read: through a fd the cell's PID 1 holds, see
    /// [`agentrun_runtime::cell::UPPER_FD`]) with every process of the sandbox frozen
    /// meanwhile, so what is read is one moment's state; then thaws it, unless it was paused
    /// already (it stays paused). A pause or resume asked meanwhile waits. The shell is not
    /// reused after a sandbox that was frozen (as after a pause). What the sandbox has on
    /// other mounts (volumes, a workspace) is not in its writable layer.
    pub fn with_writable_layer<R>(
        &self,
        read: impl FnOnce(&agentrun_image::UpperDir<'_>) -> R,
    ) -> Result<R, PoolError> {
        let _freezing = lock(&self.freezing);
        if self.is_dead() {
            return Err(PoolError::NotFound(self.id.clone()));
        }
        if self.rootless {
            // No cgroup freezer: every process stopped (SIGSTOP) while the layer is read;
            // the owners are the user namespace's (the user is root, its subordinate ids 1..).
            let ids = self.id_map()?;
            let upper = self.open_upper()?;
            let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", upper.as_raw_fd()));
            self.taint("paused");
            let stopped = crate::sigstop::stop_all(self.init_pid)?;
            let result = read(&agentrun_image::UpperDir { path: &path, ids });
            drop(stopped);
            return Ok(result);
        }
        let cgroup = self.cgroup()?;
        let upper = self.open_upper()?;
        let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", upper.as_raw_fd()));
        let was_paused = self.is_paused();
        if !was_paused {
            self.taint("paused");
            cgroup.freeze(&self.shell_id, true)?;
        }
        let result = read(&agentrun_image::UpperDir {
            path: &path,
            ids: agentrun_image::IdMap::range(
                agentrun_runtime::idmap::UID_BASE,
                agentrun_runtime::idmap::UID_COUNT,
            ),
        });
        if !was_paused {
            cgroup.freeze(&self.shell_id, false)?;
        }
        Ok(result)
    }

    /// A rootless sandbox's id mapping as its user namespace has it (`/proc/PID/uid_map`
    /// and `gid_map` of its init: `inside host count` lines).
    fn id_map(&self) -> Result<agentrun_image::IdMap, PoolError> {
        let read = |what: &str| -> Result<Vec<(u32, u32, u32)>, PoolError> {
            let path = format!("/proc/{}/{what}", self.init_pid);
            let text =
                std::fs::read_to_string(&path).map_err(|e| PoolError::Io("read id map", e))?;
            Ok(text
                .lines()
                .filter_map(|l| {
                    let mut f = l.split_whitespace().map(|n| n.parse::<u32>().ok());
                    Some((f.next()??, f.next()??, f.next()??))
                })
                .collect())
        };
        let ids = agentrun_image::IdMap {
            uids: read("uid_map")?,
            gids: read("gid_map")?,
        };
        if !agentrun_runtime::cellrun::pidfd_exists(self.pidfd.as_fd()) {
            return Err(PoolError::NotFound(self.id.clone()));
        }
        Ok(ids)
    }

    /// Bytes of the files in the sandbox's writable layer now (not frozen: a first check of a
    /// size limit, which [`LiveSandbox::with_writable_layer`] then holds frozen).
    pub fn writable_layer_bytes(&self) -> Result<u64, PoolError> {
        if self.is_dead() {
            return Err(PoolError::NotFound(self.id.clone()));
        }
        let upper = self.open_upper()?;
        let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", upper.as_raw_fd()));
        Ok(agentrun_image::snapshot::tree_bytes(&path))
    }

    /// Opens the cell's upper directory (`O_PATH`) through its PID 1's fd, checked to be the
    /// cell's (its pidfd still alive after the open: the pid was never reused meanwhile).
    fn open_upper(&self) -> Result<OwnedFd, PoolError> {
        if let Some(fd) = &self.upper {
            return fd
                .try_clone()
                .map_err(|e| PoolError::Io("dup the writable layer", e));
        }
        let fd = self
            .open_init_dir(&format!("fd/{}", agentrun_runtime::cell::UPPER_FD))
            .map_err(|e| {
                PoolError::Invalid(format!(
                    "sandbox {}: its writable layer cannot be reached ({})",
                    self.id,
                    e.desc().to_lowercase()
                ))
            })?;
        if !agentrun_runtime::cellrun::pidfd_exists(self.pidfd.as_fd()) {
            return Err(PoolError::NotFound(self.id.clone()));
        }
        Ok(fd)
    }

    /// Opens the directory `/proc/<init pid>/<what>` (`O_PATH`). Whether it is the cell's is
    /// for the caller to confirm afterwards, through the pidfd (see [`LiveSandbox::root`]).
    fn open_init_dir(&self, what: &str) -> nix::Result<OwnedFd> {
        let path = format!("/proc/{}/{what}", self.init_pid);
        let fd = nix::fcntl::open(
            path.as_str(),
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?;
        // SAFETY: open returned a new fd that nobody else owns.
        Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }

    /// CPU time and memory of every process in it.
    pub fn usage(&self) -> Result<CgroupUsage, PoolError> {
        Ok(self.cgroup()?.usage(&self.shell_id)?)
    }

    /// Its root directory as its processes see it (`O_PATH`), for `openat2(RESOLVE_IN_ROOT)`.
    pub fn root(&self) -> Result<OwnedFd, PoolError> {
        if self.is_dead() {
            return Err(PoolError::Invalid(format!("sandbox {} is gone", self.id)));
        }
        // Opened by pid, then the pidfd (taken when the cell started) is asked whether its
        // process still exists: if it does now, it did throughout, so the pid was never free
        // to be reused and the root opened is the cell's (the check pidfd_open(2) describes).
        // Asked before the open instead, a cell that died and whose pid went to another
        // process in between would hand out that process's root.
        let root = self
            .open_init_dir("root")
            .map_err(|e| PoolError::Sys("open sandbox root", e))?;
        if !agentrun_runtime::cellrun::pidfd_exists(self.pidfd.as_fd()) {
            return Err(PoolError::Invalid(format!("sandbox {} is gone", self.id)));
        }
        Ok(root)
    }
}

/// The reader of a sandbox's events: dispatches starts and exits until the init is gone.
fn event_loop(id: &str, control: OwnedFd, events: Arc<Mutex<Events>>) {
    loop {
        let msg = control::recv_json::<LiveEvent>(control.as_fd());
        let mut ev = lock(&events);
        match msg {
            Ok(Some((LiveEvent::Started { id, pid }, _))) => {
                if let Some(tx) = ev.starting.remove(&id) {
                    let _ = tx.send(Ok(pid));
                }
            }
            Ok(Some((
                LiveEvent::Failed {
                    id,
                    exit_code,
                    message,
                },
                _,
            ))) => {
                ev.exits.remove(&id);
                if let Some(tx) = ev.starting.remove(&id) {
                    let _ = tx.send(Err((exit_code, message)));
                }
            }
            Ok(Some((LiveEvent::Exited { id, result }, _))) => {
                if let Some(running) = ev.exits.remove(&id) {
                    drop(ev);
                    (running.on_exit)(ProcessExit {
                        exit_code: result.exit_code,
                        signal: result.signal,
                        usage: result.usage,
                        lost: false,
                        zygote: result.zygote == Some(true),
                    });
                }
            }
            Ok(None) | Err(_) => {
                if let Err(e) = &msg {
                    // Not an end the sandbox's own exit explains (that is EOF): say it, as
                    // every later use of the sandbox answers only "is gone".
                    tracing::warn!(target: "agentrun::pool", "sandbox {id}: its control channel failed: {e}");
                }
                ev.dead = true;
                let starting: Vec<_> = ev.starting.drain().collect();
                let exits: Vec<_> = ev.exits.drain().collect();
                drop(ev);
                for (_, tx) in starting {
                    let _ = tx.send(Err((
                        agentrun_runtime::exit::EXIT_SETUP_FAILED,
                        "the sandbox is gone".into(),
                    )));
                }
                for (_, running) in exits {
                    (running.on_exit)(ProcessExit {
                        exit_code: 128 + libc::SIGKILL,
                        signal: Some(libc::SIGKILL),
                        usage: ResourceUsage::default(),
                        lost: true,
                        zygote: false,
                    });
                }
                return;
            }
        }
    }
}

/// Creates, finds and deletes long-lived sandboxes.
pub struct LiveManager {
    pool: Arc<Pool>,
    /// Root, or an ordinary user (rootless sandboxes).
    privilege: agentrun_runtime::Privilege,
    cgroup: Option<CgroupMode>,
    swap_limit: bool,
    landlock_abi: u32,
    mappings: Mutex<MappingCache>,
    sandboxes: Mutex<HashMap<String, Arc<LiveSandbox>>>,
    /// Where fork layers are kept ([`LiveManager::frozen_dir`]).
    frozen_dir: std::path::PathBuf,
}

impl LiveManager {
    pub fn new(pool: Arc<Pool>) -> Self {
        let privilege = agentrun_runtime::Privilege::detect();
        let cgroup = CgroupMode::for_sandboxes(&privilege);
        LiveManager {
            frozen_dir: std::env::temp_dir()
                .join(format!("agentrun-frozen-{}", std::process::id())),
            pool,
            privilege,
            cgroup,
            swap_limit: cgroup.is_some_and(|c| c.swap_limit_supported()),
            landlock_abi: agentrun_runtime::landlock::abi(),
            mappings: Mutex::new(MappingCache::new()),
            sandboxes: Mutex::new(HashMap::new()),
        }
    }

    /// The pool's counters (what `agentrun pool status` shows, without zygote details).
    /// Keeps fork layers ([`crate::snapshot::freeze`]) in `dir` (the daemon's
    /// `<state dir>/frozen`), emptied now: no sandbox of an earlier daemon uses one (its
    /// cells died with it).
    pub fn with_frozen_dir(mut self, dir: std::path::PathBuf) -> Self {
        // Absent on a first start; what cannot be removed is only stale layers.
        let _ = std::fs::remove_dir_all(&dir);
        self.frozen_dir = dir;
        self
    }

    /// Where fork layers are kept.
    pub fn frozen_dir(&self) -> &std::path::Path {
        &self.frozen_dir
    }

    pub fn pool_status(&self) -> crate::protocol::PoolStatus {
        self.pool.status()
    }

    /// Every shell of the pool, ready or lent (what `agentrun ps` shows).
    pub fn shells(&self) -> Vec<crate::protocol::SandboxInfo> {
        self.pool.sandboxes()
    }

    /// A new long-lived sandbox: a shell from the pool kept for its image and profile if
    /// there is one ready (whatever its limits, mounts and egress port), else made now, with
    /// a long-lived cell in it. Blocks while it is made.
    pub fn create(&self, spec: &LiveSpec) -> Result<Arc<LiveSandbox>, PoolError> {
        let mut recipe = SandboxRecipe {
            image: spec.image.clone(),
            profile: spec.profile.clone(),
            mounts: spec.mounts.clone(),
            workspace: spec.workspace.clone(),
            egress_port: spec.egress_port,
            ..SandboxRecipe::default()
        };
        recipe.overrides.pids = spec.pids;
        let profile = recipe.profile()?;
        // Its own id: the shell it runs in serves other runs and sandboxes before and after.
        let id = match &spec.id {
            Some(id) => id.clone(),
            None => agentrun_runtime::sandbox::random_id()?,
        };
        if lock(&self.sandboxes).contains_key(&id) {
            return Err(PoolError::Invalid(format!("sandbox {id} exists already")));
        }
        let (mut shell, hit) = self.pool.acquire(&recipe)?;
        // It is back only when the sandbox goes (see `release`): its pool may replace it now.
        self.pool.keep(&shell, &id);
        let mut limits = RunLimits::of(&profile);
        limits.cpus = spec.cpus.unwrap_or(limits.cpus);
        limits.memory_bytes = spec.memory_bytes.unwrap_or(limits.memory_bytes);
        if let Err(e) = apply_limits(&mut shell, limits, self.cgroup, self.swap_limit) {
            self.pool.release(shell, Verdict::Discard("init_error"));
            return Err(e);
        }
        // A fork copy's layers, once made (its shell was taken meanwhile).
        let frozen = match spec
            .frozen
            .as_deref()
            .map(crate::frozen::PendingLayer::wait)
        {
            None => None,
            Some(Ok(l)) => Some(l),
            Some(Err(e)) => {
                self.pool.release(shell, Verdict::Reuse);
                return Err(e);
            }
        };
        let user_mounts = recipe.user_mounts();
        let mounts = {
            let mut cache = lock(&self.mappings);
            let userns = shell.userns.as_ref().map(|f| f.as_fd());
            RunMounts::prepare_for(&user_mounts, &mut cache, &self.privilege, userns)
        };
        let mounts = mounts.and_then(|mut m| {
            // A fork copy's frozen layers, each a read-only detached mount for its cell's
            // overlay (the files keep the host ids of the sandbox range: no idmap).
            if let Some(layer) = &frozen {
                for dir in layer.dirs() {
                    m.layers
                        .push(agentrun_runtime::idmap::detached_clone(&dir, None, true)?);
                }
            }
            Ok(m)
        });
        let mounts = match mounts {
            Ok(m) => m,
            Err(e) => {
                self.pool.release(shell, Verdict::Reuse);
                return Err(e.into());
            }
        };
        let mut enforcement = shell.enforcement.clone();
        enforcement.idmapped_mounts &= mounts.idmapped;
        let mut req = cell_request(
            &profile,
            self.landlock_abi,
            &user_mounts,
            &mounts,
            spec.egress_port,
            CellWork::Live,
        );
        // Rootless: the daemon may not open /proc/<pid>/fd of the cell's (non-dumpable) PID 1:
        // the cell sends its writable layer, kept for snapshots.
        req.send_upper = !self.privilege.is_root();
        let mut cell = match CellRun::start(shell.control.as_fd(), &req, &[], mounts) {
            Ok(c) => c,
            Err(e) => {
                self.pool.release(shell, Verdict::Discard("cell_failed"));
                return Err(PoolError::Invalid(e.to_string()));
            }
        };
        let (cell_pid, cell_no) = (cell.pid, cell.cell);
        let upper = cell.take_upper();
        let (channel, pidfd) = cell.into_parts();
        let Some(control) = channel else {
            self.pool.release(shell, Verdict::Discard("cell_failed"));
            return Err(PoolError::Invalid("the cell has no channel".into()));
        };
        let env = agentrun_runtime::cellrun::environment(&profile, &shell.image, &spec.env)
            .into_iter()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        let events = Arc::new(Mutex::new(Events::default()));
        let reader = control.try_clone();
        let oom_base = self.cgroup.map_or(0, |cg| cg.stats(&shell.id).oom_kills);
        let cpu_base_ns = self.cgroup.and_then(|cg| cg.cpu_ns(&shell.id)).unwrap_or(0);
        let sandbox = Arc::new(LiveSandbox {
            id,
            shell_id: shell.id.clone(),
            cell: cell_no,
            doubt: Mutex::new(None),
            killed: AtomicBool::new(false),
            oom_base,
            cpu_base_ns,
            image: spec.image.clone(),
            image_id: shell.image_id.clone(),
            profile: spec.profile.clone(),
            init_pid: cell_pid,
            pidfd,
            enforcement,
            pool_hit: hit,
            created: SystemTime::now(),
            env,
            control,
            events: events.clone(),
            next_id: AtomicU64::new(1),
            paused: AtomicBool::new(false),
            freezing: Mutex::new(()),
            deleted: AtomicBool::new(false),
            cgroup: self.cgroup,
            rootless: !self.privilege.is_root(),
            upper,
            swap_limit: self.swap_limit,
            limits: Mutex::new((limits.cpus, limits.memory_bytes)),
            pooled: Mutex::new(None),
            egress_socket: shell.egress_socket.clone(),
            frozen: Mutex::new(frozen),
        });
        *lock(&sandbox.pooled) = Some(shell);
        let started = reader
            .map_err(|e| PoolError::Io("dup control channel", e))
            .and_then(|fd| {
                std::thread::Builder::new()
                    .name(format!("live-{}", sandbox.id))
                    .spawn({
                        let id = sandbox.id.clone();
                        move || event_loop(&id, fd, events)
                    })
                    .map_err(|e| PoolError::Io("spawn thread", e))
            });
        if let Err(e) = started {
            self.release(&sandbox);
            return Err(e);
        }
        lock(&self.sandboxes).insert(sandbox.id.clone(), sandbox.clone());
        Ok(sandbox)
    }

    /// Lets the pool replace what a create took from it now rather than after its holdoff
    /// ([`Pool::acquire`](crate::pool::Pool::acquire)): the caller's first process is under
    /// way (making a sandbox on a small machine slows a start that runs at the same time).
    pub fn refill(&self) {
        self.pool.refill();
    }

    pub fn get(&self, id: &str) -> Option<Arc<LiveSandbox>> {
        lock(&self.sandboxes).get(id).cloned()
    }

    /// Every live sandbox, oldest first.
    pub fn list(&self) -> Vec<Arc<LiveSandbox>> {
        let mut all: Vec<_> = lock(&self.sandboxes).values().cloned().collect();
        all.sort_by_key(|s| s.created);
        all
    }

    /// Kills everything in the sandbox and gives its shell back (see `release`).
    /// Blocks until its cell is gone.
    pub fn delete(&self, id: &str) -> Result<(), PoolError> {
        let sandbox = lock(&self.sandboxes)
            .remove(id)
            .ok_or_else(|| PoolError::NotFound(id.to_owned()))?;
        self.release(&sandbox);
        Ok(())
    }

    /// Tears `sandbox` down off the caller's path, as the API front ends do when a client
    /// removes one or its main process ends: every process in it is killed now
    /// ([`LiveSandbox::kill`]: gone for its clients at once), and on a thread of its own
    /// `before_delete` runs (what must go before the sandbox's state dir does: an egress proxy
    /// listening in it), then [`LiveManager::delete`] (the cell's end awaited, the shell given
    /// back to its pool or discarded), then `after_delete` (what may go only once nothing of
    /// the sandbox is left: the volumes it held). A sandbox deleted meanwhile by someone else
    /// (the daemon's shutdown) is left to them.
    pub fn tear_down(
        self: &Arc<Self>,
        sandbox: &LiveSandbox,
        before_delete: impl FnOnce() + Send + 'static,
        after_delete: impl FnOnce() + Send + 'static,
    ) {
        sandbox.kill();
        let live = self.clone();
        let id = sandbox.id().to_owned();
        let delete = move || {
            before_delete();
            match live.delete(&id) {
                Ok(()) | Err(PoolError::NotFound(_)) => {}
                Err(e) => tracing::warn!(
                    target: "agentrun::pool",
                    sandbox = %id,
                    "deleting the sandbox: {e}"
                ),
            }
            after_delete();
        };
        // Where no thread can be made, the delete runs here.
        let job = Arc::new(Mutex::new(Some(delete)));
        let on_thread = job.clone();
        let spawned = std::thread::Builder::new()
            .name("live-delete".into())
            .spawn(move || {
                let delete = lock(&on_thread).take();
                if let Some(delete) = delete {
                    delete();
                }
            });
        if spawned.is_err() {
            let delete = lock(&job).take();
            if let Some(delete) = delete {
                delete();
            }
        }
    }

    /// Ends the sandbox's cell and gives its shell back with the verdict a run's shell gets
    /// (see [`LiveManager::verdict`]).
    fn release(&self, sandbox: &LiveSandbox) {
        sandbox.deleted.store(true, Ordering::SeqCst);
        if sandbox.is_paused() {
            // Frozen tasks would not die until thawed (cgroup v1).
            if let Err(e) = sandbox.resume() {
                tracing::warn!(target: "agentrun::pool", "thawing a deleted sandbox (its tasks die once thawed): {e}");
            }
        }
        let shell = lock(&sandbox.pooled).take();
        if let Some(mut shell) = shell {
            // Its init died by itself, unless it was killed on purpose (checked before the
            // kill below).
            let died = lock(&sandbox.events).dead && !sandbox.killed.load(Ordering::SeqCst);
            // The cell ends (its PID 1 killed, and every process with it); the shell is
            // judged once the cell is gone.
            sandbox.killed.store(true, Ordering::SeqCst);
            agentrun_runtime::cellrun::pidfd_signal(sandbox.pidfd.as_fd(), libc::SIGKILL);
            self.pool.recycling(&mut shell);
            let verdict = if died {
                Verdict::Discard("cell_died")
            } else {
                self.verdict(sandbox, &shell)
            };
            self.pool.release(shell, verdict);
        }
        // Its cell is gone: the frozen layers its overlay had go with their last user.
        let frozen = lock(&sandbox.frozen).take();
        drop(frozen);
    }

    /// Whether the shell of a sandbox whose cell was just killed may serve again: not when
    /// anything put it in doubt ([`LiveSandbox::taint`]: sockets in its network namespace, a
    /// freeze, a timeout), an OOM kill happened in it, an egress proxy still listens on its
    /// socket (the caller stops it before the delete), or the checks after a run's cell fail
    /// ([`crate::run::cell_end_verdict`]: the cell's end reported, nothing of the shell
    /// changed, nothing left in its cgroup but its init). The pool then applies its own
    /// (max runs, max age, unpooled shells). Limits need no reset: the next run rewrites
    /// what differs from the shell's record of them, which [`LiveSandbox::set_limits`] keeps.
    fn verdict(&self, sandbox: &LiveSandbox, shell: &PooledShell) -> Verdict {
        if let Some(reason) = *lock(&sandbox.doubt) {
            return Verdict::Discard(reason);
        }
        if let Some(cg) = self.cgroup {
            if cg.stats(&shell.id).oom_kills > sandbox.oom_base {
                return Verdict::Discard("oom");
            }
        }
        if shell
            .egress_socket
            .as_deref()
            .is_some_and(|p| p.symlink_metadata().is_ok())
        {
            return Verdict::Discard("egress_bound");
        }
        crate::run::cell_end_verdict(shell, sandbox.cell, self.cgroup)
    }

    /// Deletes every live sandbox (daemon shutdown).
    pub fn shutdown(&self) {
        let all: Vec<_> = lock(&self.sandboxes).drain().map(|(_, s)| s).collect();
        for s in all {
            self.release(&s);
        }
    }
}
