//! The shell factory: a single-threaded child process that owns every libcontainer call.
//!
//! libcontainer clones and keeps running Rust in the child, which is unsound in a
//! multi-threaded process (a lock held by another thread at fork time stays held forever). The
//! daemon therefore forks this process before it starts any thread; the factory creates,
//! starts and destroys shells (see `agentrun_runtime::shell`) on request over a SEQPACKET
//! socketpair and hands the host end of each shell's control channel back with `SCM_RIGHTS`.
//! Shell inits are its children (it reaps them on destroy) and die with it (PDEATHSIG). When
//! the daemon goes away (EOF), the factory destroys everything it made and exits.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Mutex;

use agentrun_image::ImageStore;
use agentrun_policy::Profile;
use agentrun_runtime::cgroup::CgroupMode;
use agentrun_runtime::control::{self, recv_json, send_json, ShellRequest};
use agentrun_runtime::{Enforcement, HostInfo, RuntimePaths, Sandbox, SandboxStdio};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult, Pid};
use serde::{Deserialize, Serialize};

use crate::recipe::SandboxRecipe;
use crate::PoolError;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum FactoryRequest {
    Create {
        recipe: SandboxRecipe,
        /// Made ahead for a pool (on the background CPUs), not for a run waiting for it.
        #[serde(default)]
        background: bool,
    },
    Destroy {
        id: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
enum FactoryReply {
    /// The control channel's host end travels with this message.
    Created {
        id: String,
        init_pid: i32,
        enforcement: Enforcement,
        image: Box<agentrun_image::ImageConfig>,
        /// The id of its image (a pool of a name also serves requests by that id).
        #[serde(default)]
        image_id: String,
        /// Where a run's egress proxy must listen.
        #[serde(default)]
        egress_socket: Option<PathBuf>,
        /// A rootless shell's user namespace travels after the control channel.
        #[serde(default)]
        userns: bool,
    },
    Destroyed,
    Error {
        message: String,
    },
}

/// A started shell whose init waits for cell requests.
#[derive(Debug)]
pub struct PooledShell {
    pub id: String,
    pub init_pid: i32,
    /// Host end of the init's control channel.
    pub control: OwnedFd,
    /// pidfd of the init (opened while the factory cannot have reaped it yet).
    pub pidfd: OwnedFd,
    /// A rootless shell's user namespace (its runs' mounts are cloned in it).
    pub userns: Option<OwnedFd>,
    pub enforcement: Enforcement,
    /// The image's run configuration (its Env and WorkingDir apply to the command).
    pub image: agentrun_image::ImageConfig,
    /// The image's id.
    pub image_id: String,
    pub created: std::time::Instant,
    /// Where a run's egress proxy must listen, see
    /// [`agentrun_runtime::Sandbox::egress_socket`].
    pub egress_socket: Option<PathBuf>,
    /// Index of the factory that made it (and must destroy it).
    pub factory: usize,
    /// Cells it has served.
    pub runs: u64,
    /// The cgroup limits in force (each run sets its own when they differ).
    pub limits: RunLimits,
    /// The size of its cells' writable layer under its profile (a spare cell is made ahead
    /// with it, see [`PooledShell::prepare_spare`]).
    pub tmpfs_bytes: u64,
    /// The kept pool it goes back to after a run (`None`: destroyed after its run).
    pub home: Option<usize>,
    /// Its run is over and it is being checked for reuse ([`crate::pool::Pool::recycling`]).
    pub recycling: bool,
    /// Its last run was forked by its Python zygote: its next spare cell has the zygote fork
    /// the next run's process ahead ([`ShellRequest::Prepare`]).
    pub zygote_ahead: bool,
    /// Its next spare starts the shell's Python zygote, if its profile has one
    /// ([`ShellRequest::Prepare`]'s `start_zygote`): set for the shells the pool makes for its
    /// target, and for a shell made on demand once one of its runs could have used the
    /// zygote. A shell a burst of other commands grew the pool by never imports the preload
    /// list (~1 s of CPU each for numpy, pandas and matplotlib, which under that burst is CPU
    /// its runs wait for).
    pub start_zygote: bool,
}

impl PooledShell {
    /// Asks its init to make a spare cell ([`ShellRequest::Prepare`]) while the shell waits in
    /// its pool, so that the next run finds its cell's root built. Best effort: without one, a
    /// run has its cell made when it comes.
    pub fn prepare_spare(&self) {
        let prepare = ShellRequest::Prepare {
            tmpfs_bytes: self.tmpfs_bytes,
            zygote_ahead: self.zygote_ahead,
            start_zygote: self.start_zygote,
        };
        // A hint: with the request lost, the next shell is made when it is asked for.
        let _ = send_json(self.control.as_fd(), &prepare, &[]);
    }
}

/// The cgroup limits of one run (the shell's cgroup is rewritten when they differ from the
/// last run's: ~30 µs; a cgroup per cell would cost ~0.2 ms and up to several ms of waiting
/// to move its first process in, see docs/daemon.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunLimits {
    pub memory_bytes: u64,
    pub pids: u32,
    pub cpus: f64,
}

impl RunLimits {
    pub fn of(profile: &Profile) -> Self {
        RunLimits {
            memory_bytes: profile.resources.memory_bytes,
            pids: profile.resources.pids,
            cpus: profile.resources.cpus,
        }
    }
}

/// Puts `want` in force on the shell's cgroup (only what differs from what is).
pub fn apply_limits(
    shell: &mut PooledShell,
    want: RunLimits,
    cgroup: Option<CgroupMode>,
    swap_limit: bool,
) -> Result<(), PoolError> {
    let Some(cg) = cgroup else { return Ok(()) };
    let have = shell.limits;
    if have == want {
        return Ok(());
    }
    let cpus = (have.cpus != want.cpus).then_some(want.cpus);
    let memory = (have.memory_bytes != want.memory_bytes).then_some(want.memory_bytes);
    cg.set_limits(&shell.id, cpus, memory, swap_limit)?;
    if have.pids != want.pids {
        cg.set_pids(&shell.id, want.pids)?;
    }
    shell.limits = want;
    Ok(())
}

/// The daemon's handle on the factory process. Requests are serialized.
pub struct FactoryClient {
    sock: Mutex<OwnedFd>,
    pid: Pid,
}

/// Where the factory finds images and keeps state.
#[derive(Debug, Clone)]
pub struct FactoryPaths {
    pub root: PathBuf,
    pub state_dir: PathBuf,
}

impl FactoryClient {
    /// Forks the factory. Must be called while the process is single-threaded.
    pub fn spawn(paths: FactoryPaths) -> Result<Self, PoolError> {
        let (ours, theirs) = control::seqpacket_pair()?;
        // SAFETY: documented precondition: no other thread exists yet, so the child may run
        // ordinary Rust code.
        match unsafe { fork() }.map_err(|e| PoolError::Sys("fork", e))? {
            ForkResult::Child => {
                drop(ours);
                // Forked, not exec'd: close-on-exec does nothing here, so close every fd but
                // stdio and our channel. Otherwise a later factory keeps an earlier one's
                // channel open, and that one never sees the daemon hang up.
                let keep = theirs.as_raw_fd() as u32;
                // SAFETY: close_range on fds of this fresh process; nothing here uses them.
                // (The raw syscall: musl has no close_range wrapper.)
                unsafe {
                    libc::syscall(libc::SYS_close_range, 3u32, keep.saturating_sub(1), 0u32);
                    libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
                }
                let code = match serve(theirs, &paths) {
                    Ok(()) => 0,
                    Err(e) => {
                        tracing::error!(target: "agentrun::pool", "sandbox factory: {e}");
                        1
                    }
                };
                std::process::exit(code)
            }
            ForkResult::Parent { child } => {
                drop(theirs);
                Ok(FactoryClient {
                    sock: Mutex::new(ours),
                    pid: child,
                })
            }
        }
    }

    fn call(&self, req: &FactoryRequest) -> Result<(FactoryReply, Vec<OwnedFd>), PoolError> {
        let sock = crate::lock(&self.sock);
        send_json(sock.as_fd(), req, &[])?;
        recv_json::<FactoryReply>(sock.as_fd())?
            .ok_or_else(|| PoolError::Factory("the sandbox factory exited".into()))
    }

    /// Creates and starts a sandbox; its init waits on the returned control channel.
    /// `background`: made ahead for a pool, on the background CPUs ([`background_cpus`]).
    pub fn create(
        &self,
        recipe: &SandboxRecipe,
        background: bool,
    ) -> Result<PooledShell, PoolError> {
        let (reply, mut fds) = self.call(&FactoryRequest::Create {
            recipe: recipe.clone(),
            background,
        })?;
        match reply {
            FactoryReply::Created {
                id,
                init_pid,
                enforcement,
                image,
                image_id,
                egress_socket,
                userns,
            } => {
                let userns = if userns { fds.pop() } else { None };
                let control = fds
                    .pop()
                    .ok_or_else(|| PoolError::Factory("no control channel received".into()))?;
                let pidfd = agentrun_runtime::sandbox::pidfd_open(Pid::from_raw(init_pid))?;
                let profile = recipe.profile()?;
                Ok(PooledShell {
                    id,
                    init_pid,
                    control,
                    pidfd,
                    userns,
                    enforcement,
                    image: *image,
                    image_id,
                    created: std::time::Instant::now(),
                    egress_socket,
                    factory: 0,
                    runs: 0,
                    limits: RunLimits::of(&profile),
                    tmpfs_bytes: profile.resources.tmpfs_bytes,
                    home: None,
                    recycling: false,
                    zygote_ahead: false,
                    start_zygote: false,
                })
            }
            FactoryReply::Error { message } => Err(PoolError::Factory(message)),
            other => Err(PoolError::Factory(format!("unexpected reply {other:?}"))),
        }
    }

    /// Destroys a sandbox (kills what runs in it, removes cgroups, mounts, state).
    pub fn destroy(&self, id: &str) -> Result<(), PoolError> {
        match self.call(&FactoryRequest::Destroy { id: id.to_owned() })?.0 {
            FactoryReply::Destroyed => Ok(()),
            FactoryReply::Error { message } => Err(PoolError::Factory(message)),
            other => Err(PoolError::Factory(format!("unexpected reply {other:?}"))),
        }
    }

    /// Closes every factory's channel (each destroys what it still has and exits), then
    /// reaps them: all are told before any is waited for.
    pub fn shutdown_all(factories: Vec<FactoryClient>) {
        let pids: Vec<Pid> = factories.iter().map(|f| f.pid).collect();
        drop(factories);
        for pid in pids {
            // Reaps each factory; one that was reaped already (ECHILD) is no error.
            let _ = waitpid(pid, None);
        }
    }
}

/// Nice value of the factories: making and destroying sandboxes is background work, and must
/// not take the CPU from runs in progress (on 2 cores it otherwise competes with every run).
pub(crate) const FACTORY_NICE: libc::c_int = 10;

/// The factory's nice value for a request: [`FACTORY_NICE`] for background work (a shell made
/// ahead for a pool, a destroy), the normal 0 for a shell a run is waiting for.
fn nice_for(background: bool) -> libc::c_int {
    if background {
        FACTORY_NICE
    } else {
        0
    }
}

/// The CPUs background work (making sandboxes ahead for a pool, destroying them) is kept on:
/// every CPU the calling thread may use but the first, when it may use more than one (`None`
/// otherwise). A sandbox a run waits for is made on every CPU.
///
/// Most of that work is kernel work (namespaces, mounts, cgroups), which a nice value does not
/// hold back on a kernel without full preemption: a CPU in the middle of it is not given to a
/// waking run until the work reaches a preemption point. Keeping one CPU clear of it leaves
/// runs (and their clients) a CPU to wake up on; on a 2-core VM the docker CLI's
/// `docker run --rm` against a pool got 2-3 ms faster (median of ~25 ms).
pub(crate) fn background_cpus() -> Option<nix::sched::CpuSet> {
    let all = nix::sched::sched_getaffinity(Pid::from_raw(0)).ok()?;
    let allowed: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| all.is_set(c).unwrap_or(false))
        .collect();
    if allowed.len() < 2 {
        return None;
    }
    let mut bg = nix::sched::CpuSet::new();
    for &c in &allowed[1..] {
        bg.set(c).ok()?;
    }
    Some(bg)
}

/// The factory's loop.
fn serve(sock: OwnedFd, paths: &FactoryPaths) -> Result<(), PoolError> {
    // SAFETY: setpriority on this process only.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, FACTORY_NICE) };
    let mut niced = FACTORY_NICE;
    // Background requests run on the background CPUs; the inits of sandboxes made there get
    // every CPU back once started.
    let all_cpus = nix::sched::sched_getaffinity(Pid::from_raw(0)).ok();
    let bg_cpus = background_cpus();
    let mut on_bg = false;
    let store = ImageStore::open(&paths.root)?;
    let runtime_paths = RuntimePaths::new(&paths.state_dir);
    let host = HostInfo::probe();
    let mut live: HashMap<String, Sandbox> = HashMap::new();
    loop {
        let Some((req, _)) = recv_json::<FactoryRequest>(sock.as_fd())? else {
            break;
        };
        let background = match &req {
            FactoryRequest::Create { background, .. } => *background,
            FactoryRequest::Destroy { .. } => true,
        };
        let nice = nice_for(background);
        if nice != niced {
            // A run waits for a shell made on its path (a pool miss, an unpooled run): that
            // is the run's own work, at the run's priority. Niced, it got a sliver of a CPU
            // beside 16 busy clients (its ~13 ms of CPU: the 0.1% of runs at 210-280 ms).
            // SAFETY: setpriority on this (single-threaded) process only.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
            niced = nice;
        }
        if let (Some(bg), Some(all)) = (&bg_cpus, &all_cpus) {
            if background != on_bg {
                // A scheduling hint: if it fails, the factory runs on every CPU.
                let _ = nix::sched::sched_setaffinity(
                    Pid::from_raw(0),
                    if background { bg } else { all },
                );
                on_bg = background;
            }
        }
        let (reply, fds) = match req {
            FactoryRequest::Create { recipe, .. } => {
                match create(&store, &runtime_paths, &host, &recipe, all_cpus.as_ref()) {
                    Ok((sandbox, control)) => {
                        let reply = FactoryReply::Created {
                            id: sandbox.id().to_owned(),
                            init_pid: sandbox.init_pid().unwrap_or(0),
                            enforcement: sandbox.enforcement().clone(),
                            image: Box::new(sandbox.image_config().clone()),
                            image_id: sandbox.image_id().to_owned(),
                            egress_socket: Some(sandbox.egress_socket()),
                            userns: false,
                        };
                        let mut reply = reply;
                        let mut fds = vec![control];
                        if let Some(ns) = sandbox.userns().and_then(|f| f.try_clone_to_owned().ok())
                        {
                            fds.push(ns);
                            if let FactoryReply::Created { userns, .. } = &mut reply {
                                *userns = true;
                            }
                        }
                        live.insert(sandbox.id().to_owned(), sandbox);
                        (reply, fds)
                    }
                    Err(e) => (
                        FactoryReply::Error {
                            message: e.to_string(),
                        },
                        Vec::new(),
                    ),
                }
            }
            FactoryRequest::Destroy { id } => match live.remove(&id) {
                Some(sandbox) => match sandbox.destroy() {
                    Ok(()) => (FactoryReply::Destroyed, Vec::new()),
                    Err(e) => (
                        FactoryReply::Error {
                            message: e.to_string(),
                        },
                        Vec::new(),
                    ),
                },
                None => (
                    FactoryReply::Error {
                        message: format!("no sandbox {id}"),
                    },
                    Vec::new(),
                ),
            },
        };
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        send_json(sock.as_fd(), &reply, &raw)?;
    }
    for (_, sandbox) in live.drain() {
        if let Err(e) = sandbox.destroy() {
            tracing::warn!(target: "agentrun::pool", "destroying a sandbox of the closing factory: {e}");
        }
    }
    Ok(())
}

fn create(
    store: &ImageStore,
    paths: &RuntimePaths,
    host: &HostInfo,
    recipe: &SandboxRecipe,
    all_cpus: Option<&nix::sched::CpuSet>,
) -> Result<(Sandbox, OwnedFd), PoolError> {
    let config = recipe.to_config(store, true)?;
    let mut sandbox = Sandbox::create(&config, paths, host, SandboxStdio::Shell)?;
    sandbox.start()?;
    // The init was born with the factory's niceness and CPUs; the command must run at normal
    // priority on every CPU. (Root may raise another process's priority; the sandbox itself
    // could not.)
    if let Some(pid) = sandbox.init_pid() {
        // SAFETY: setpriority on the sandbox's init, our child.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, 0) };
        if let Some(all) = all_cpus {
            // A scheduling hint: if it fails, the sandbox keeps the background CPUs.
            let _ = nix::sched::sched_setaffinity(Pid::from_raw(pid), all);
        }
    }
    let control = sandbox
        .take_control()
        .ok_or_else(|| PoolError::Factory("pooled sandbox without control channel".into()))?;
    Ok((sandbox, control))
}
