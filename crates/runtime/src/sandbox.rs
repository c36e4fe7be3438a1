//! A sandbox container's life: create (state dir, rootfs, bundle, libcontainer container) and
//! destroy (nothing left behind). Almost always the container is a **shell**
//! ([`SandboxStdio::Shell`], see [`crate::inside::shell`]): its init makes a cell per run, driven from
//! the host through [`crate::cellrun`] (the cold path runs one cell with [`Sandbox::run_cell`],
//! the daemon's pool many over a shell's life). `image build` runs its RUN steps as the
//! container's own command instead ([`SandboxStdio::Piped`], [`Sandbox::run`]).
//!
//! Contract: [`Sandbox::create`] must be called while the process is single-threaded
//! (libcontainer clones and keeps running Rust in the child). The CLI calls it before any
//! thread exists; the daemon calls it from single-threaded factory processes.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentrun_image::Image;
use agentrun_policy::Profile;
use caps::Capability;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::syscall::syscall::SyscallType;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::confine::landlock::LandlockRules;
use crate::confine::limits::Rlimits;
use crate::error::RuntimeError;
use crate::host::cgroup::CgroupMode;
use crate::host::info::HostInfo;
use crate::inside::executor::{InitMode, SandboxExecutor};
use crate::inside::zygote::ZygoteConfig;
use crate::mounts::rootfs::{self, UserMount};
use crate::outcome::RunOutcome;
use crate::spec::{self, SpecInput};

/// Capabilities the sandboxed command keeps (all confined to its user namespace).
const COMMAND_CAPS: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_KILL,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_NET_BIND_SERVICE,
];
/// Extra capabilities only the init holds, to bring up loopback, then drops.
const INIT_ONLY_CAPS: &[Capability] = &[Capability::CAP_NET_ADMIN, Capability::CAP_SETPCAP];

/// Where agentrun keeps runtime state (`AGENTRUN_STATE_DIR`, default `/run/agentrun`).
#[derive(Debug, Clone)]
pub struct RuntimePaths {
    pub state_dir: PathBuf,
}

impl RuntimePaths {
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        RuntimePaths {
            state_dir: state_dir.into(),
        }
    }
    /// One directory per live sandbox.
    pub fn sandboxes(&self) -> PathBuf {
        self.state_dir.join("sandboxes")
    }
    /// libcontainer's container state root.
    pub fn containers(&self) -> PathBuf {
        self.state_dir.join("containers")
    }
    /// Bundles kept on request (`--keep-bundle`).
    pub fn kept(&self) -> PathBuf {
        self.state_dir.join("kept")
    }
}

/// Everything a sandbox is made from.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub image: Image,
    pub profile: Profile,
    pub args: Vec<String>,
    /// Extra environment (`-e`, `--env-file`, TRACEPARENT), over the profile's defaults.
    pub env: Vec<(String, String)>,
    pub workspace: Option<PathBuf>,
    pub mounts: Vec<UserMount>,
    pub cwd: Option<PathBuf>,
    /// The writable layer will be committed as an image layer (`image build`): the overlay
    /// records renames as copies (no redirect/metacopy xattrs a layer tar cannot carry), and no
    /// `/workspace` is added to it.
    pub for_commit: bool,
    /// A pooled shell: start the profile's Python zygote in it if the profile asks for one
    /// (`[python] zygote`; see [`crate::inside::zygote`]). A one-run shell (the cold path) has none: it
    /// would import the preload list for a single run.
    pub zygote: bool,
}

/// Where the egress proxy's socket directory appears inside the sandbox.
pub const EGRESS_DIR_IN_SANDBOX: &str = "/run/agentrun-egress";
/// The proxy socket's file name.
pub const EGRESS_SOCKET: &str = "proxy.sock";

/// Builder for [`SandboxConfig`].
#[derive(Debug)]
pub struct SandboxConfigBuilder {
    config: SandboxConfig,
}

impl SandboxConfig {
    pub fn builder(image: Image, profile: Profile, args: Vec<String>) -> SandboxConfigBuilder {
        SandboxConfigBuilder {
            config: SandboxConfig {
                image,
                profile,
                args,
                env: Vec::new(),
                workspace: None,
                mounts: Vec::new(),
                cwd: None,
                for_commit: false,
                zygote: false,
            },
        }
    }
}

impl SandboxConfigBuilder {
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.env.push((key.into(), value.into()));
        self
    }
    pub fn workspace(mut self, dir: Option<PathBuf>) -> Self {
        self.config.workspace = dir;
        self
    }
    pub fn mount(mut self, m: UserMount) -> Self {
        self.config.mounts.push(m);
        self
    }
    pub fn cwd(mut self, cwd: Option<PathBuf>) -> Self {
        self.config.cwd = cwd;
        self
    }
    /// See [`SandboxConfig::for_commit`].
    pub fn for_commit(mut self, yes: bool) -> Self {
        self.config.for_commit = yes;
        self
    }
    /// See [`SandboxConfig::zygote`].
    pub fn zygote(mut self, yes: bool) -> Self {
        self.config.zygote = yes;
        self
    }
    pub fn build(self) -> SandboxConfig {
        self.config
    }
}

/// The output pumps' part of an outcome.
impl RunOutcome {
    /// Takes the byte counts, the stderr preview and whether output was cut from the pumps.
    pub fn count_output(&mut self, streams: &mut [OutputStream; 2]) {
        self.output_truncated = streams.iter().any(|s| s.truncated);
        self.stdout_bytes = streams[0].bytes;
        self.stderr_bytes = streams[1].bytes;
        self.stderr_preview = std::mem::take(&mut streams[1].preview);
    }
}

/// What enforcement a sandbox got on this host (recorded on the span).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Enforcement {
    pub landlock: String,
    pub landlock_abi: u32,
    pub seccomp: bool,
    pub user_namespace: bool,
    pub idmapped_mounts: bool,
    pub cgroup: String,
    pub swap_limited: bool,
    pub loopback: bool,
    /// One line per limit: what enforces it (see [`crate::confine::limits::describe`]).
    #[serde(default)]
    pub limits: Vec<String>,
}

/// A created sandbox. Dropping it destroys it.
pub struct Sandbox {
    id: String,
    state: PathBuf,
    paths: RuntimePaths,
    container: Option<Container>,
    /// A rootless shell's PID 1 (made by [`crate::rootless`], not libcontainer).
    rootless_init: Option<Pid>,
    /// A rootless shell's user namespace (its runs' mounts are cloned in it).
    userns: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    /// Host end of a shell's control channel.
    control: Option<OwnedFd>,
    cgroup: Option<CgroupMode>,
    enforcement: Enforcement,
    /// Shared locks on the image's layers: `image prune` leaves them alone while we exist.
    image_lease: Option<agentrun_image::LayerLease>,
    /// The image's run configuration (a shell's commands get its Env and WorkingDir).
    image_config: agentrun_image::ImageConfig,
    /// The id of the image it runs (its config digest).
    image_id: String,
    /// The profile's output cap (bytes per stream, cold path).
    output_cap: Option<u64>,
    /// The writable layer of the last cell whose request asked for it
    /// ([`crate::control::CellRequest::send_upper`]; the tmpfs holding it outlives the cell).
    kept_upper: Option<OwnedFd>,
    destroyed: bool,
}

/// What the container's init is.
pub enum SandboxStdio {
    /// The spec's command runs at [`Sandbox::run`] with this stdin, its output pumped to the
    /// caller's writers (`image build`'s RUN steps).
    Piped { stdin: OwnedFd },
    /// A shell: its init makes a cell per request on a control channel
    /// ([`Sandbox::take_control`], see [`crate::control`]).
    Shell,
}

/// Placeholder `process.args` of a shell: commands come later, each in a cell.
const SHELL_ARGS: &str = "agentrun-shell";

/// A new sandbox id (`ar-` and 12 hex digits): shells' and long-lived sandboxes'.
pub fn random_id() -> Result<String, RuntimeError> {
    Ok(format!("ar-{}", crate::random::hex(6)?))
}

/// `pid starttime` of this process: identifies the owner of a state dir for `gc`.
pub(crate) fn owner_stamp(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; starttime is field 22 overall.
    let after = &stat[stat.rfind(')')? + 2..];
    let start = after.split(' ').nth(19)?;
    Some(format!("{pid} {start}"))
}

impl Sandbox {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    /// The rlimits a cell of this sandbox sets for `r` (and the run's `timeout`): none when
    /// its cgroup enforces them, the fallback when it has none (rootless).
    pub fn rlimit_fallback(
        &self,
        r: &agentrun_policy::Resources,
        timeout: Option<Duration>,
    ) -> crate::confine::limits::RlimitFallback {
        match self.cgroup {
            Some(_) => Default::default(),
            None => crate::confine::limits::RlimitFallback::for_resources(r, timeout),
        }
    }

    /// What enforces each limit of a run with `rl` (for the span).
    pub fn describe_limits(&self, rl: &crate::confine::limits::RlimitFallback) -> Vec<String> {
        let delegated = match self.cgroup {
            Some(_) => None,
            None => crate::confine::limits::probe_delegated_v2(nix::unistd::geteuid().as_raw()),
        };
        crate::confine::limits::describe(self.cgroup, rl, delegated.as_deref())
    }

    /// The image's run configuration.
    pub fn image_config(&self) -> &agentrun_image::ImageConfig {
        &self.image_config
    }

    /// The id of the image it runs.
    pub fn image_id(&self) -> &str {
        &self.image_id
    }

    /// The overlay's writable layer as the host sees it: what the sandbox changed. Valid
    /// until the sandbox is destroyed.
    pub fn upper_dir(&self) -> PathBuf {
        rootfs::upper_dir(&self.state)
    }

    /// Where the egress proxy must listen for this sandbox (when it has an egress bridge): a
    /// socket in a directory of its own under the state dir, bind-mounted read-only into the
    /// sandbox.
    pub fn egress_socket(&self) -> PathBuf {
        self.state.join("egress").join(EGRESS_SOCKET)
    }

    /// Path of the bundle's `config.json`.
    pub fn config_path(&self) -> PathBuf {
        self.state.join("bundle").join("config.json")
    }

    /// Creates the sandbox; its command is ready to [`run`](Self::run).
    pub fn create(
        config: &SandboxConfig,
        paths: &RuntimePaths,
        host: &HostInfo,
        stdio: SandboxStdio,
    ) -> Result<Sandbox, RuntimeError> {
        let id = random_id()?;
        let state = paths.sandboxes().join(&id);
        for d in [paths.sandboxes(), paths.containers()] {
            fs::create_dir_all(&d).map_err(|e| RuntimeError::io("create", &d, e))?;
            // Dropped: EPERM on a dir another user made (its mode stays); creating it succeeded.
            let _ = fs::set_permissions(&d, fs::Permissions::from_mode(0o711));
        }
        if host.privilege.is_root() {
            check_searchable(&paths.sandboxes())?;
        }
        // Searchable (the sandbox uid walks it to its rootfs and mounts), not listable.
        fs::DirBuilder::new()
            .mode(0o711)
            .create(&state)
            .map_err(|e| RuntimeError::io("create", &state, e))?;
        let mut sandbox = Sandbox {
            id: id.clone(),
            state: state.clone(),
            paths: paths.clone(),
            container: None,
            rootless_init: None,
            userns: None,
            stdout: None,
            stderr: None,
            control: None,
            cgroup: host.cgroup,
            enforcement: Enforcement::default(),
            image_lease: None,
            image_config: Default::default(),
            image_id: String::new(),
            output_cap: config.profile.resources.output_cap,
            kept_upper: None,
            destroyed: false,
        };
        // From here on, dropping `sandbox` cleans up whatever exists.
        // Written whole then renamed: `gc` in a concurrent run must never read a partial stamp.
        let owner = owner_stamp(std::process::id()).unwrap_or_default();
        let tmp = state.join("owner.tmp");
        fs::write(&tmp, owner)
            .and_then(|()| fs::rename(&tmp, state.join("owner")))
            .map_err(|e| RuntimeError::io("write", &state, e))?;
        sandbox.build(config, host, stdio)?;
        Ok(sandbox)
    }

    fn build(
        &mut self,
        config: &SandboxConfig,
        host: &HostInfo,
        stdio: SandboxStdio,
    ) -> Result<(), RuntimeError> {
        let rootless = match &host.privilege {
            crate::host::privilege::Privilege::Root => None,
            crate::host::privilege::Privilege::Rootless(ids) => Some(ids.clone()),
        };
        let cgroup = match &rootless {
            None => {
                // Root, user namespaces, cgroups and their controllers, each a one-line fix.
                crate::host::preflight::check(&crate::host::preflight::HostFacts::probe(host))?;
                let Some(cgroup) = host.cgroup else {
                    return Err(crate::host::preflight::PreflightError::NoCgroups.into());
                };
                Some(cgroup)
            }
            Some(_) => {
                if let Some(b) = crate::host::privilege::UsernsFacts::probe().blocker() {
                    return Err(RuntimeError::Unsupported(b.to_string()));
                }
                None
            }
        };
        if rootless.is_some() && !matches!(stdio, SandboxStdio::Shell) {
            return Err(RuntimeError::Unsupported(
                "a sandbox whose command is its init needs root (rootless sandboxes are shells: \
                 run the command in a cell, as `exec` and `image build` do)"
                    .into(),
            ));
        }
        let shell = matches!(stdio, SandboxStdio::Shell);
        if config.args.is_empty() && !shell {
            return Err(RuntimeError::InvalidInput("no command given".into()));
        }
        if shell && (config.workspace.is_some() || !config.mounts.is_empty()) {
            return Err(RuntimeError::InvalidInput(
                "a shell has no mounts of its own: each run brings its own to its cell".into(),
            ));
        }
        let profile = &config.profile;
        let mut mounts = Vec::new();
        if let Some(ws) = &config.workspace {
            mounts.push(UserMount {
                source: ws.clone(),
                target: "/workspace".into(),
                writable: true,
            });
        }
        mounts.extend(config.mounts.iter().cloned());
        if shell {
            // Where a run's egress proxy listens; its cell relays 127.0.0.1:<port> there.
            let dir = self.state.join("egress");
            fs::DirBuilder::new()
                .mode(0o755)
                .create(&dir)
                .map_err(|e| RuntimeError::io("create", &dir, e))?;
            mounts.push(UserMount {
                source: dir,
                target: EGRESS_DIR_IN_SANDBOX.into(),
                writable: false,
            });
        }
        for m in &mounts {
            m.check_target()?;
        }
        self.image_lease = Some(config.image.lease()?);
        let prepared = if rootless.is_some() {
            // Mounted by the sandbox's init in its own mount namespace (crate::rootless).
            for d in [
                self.state.join("rw"),
                self.state.join("bundle").join("rootfs"),
            ] {
                fs::create_dir_all(&d).map_err(|e| RuntimeError::io("create", &d, e))?;
            }
            rootfs::PreparedRootfs {
                // The image's host binds (the `host` image's /usr, ...), read-only, first.
                binds: config
                    .image
                    .host_binds
                    .iter()
                    .map(|b| spec::BindMount {
                        source: b.source.clone(),
                        target: b.target.clone(),
                        writable: false,
                    })
                    .chain(mounts.iter().map(|m| spec::BindMount {
                        source: m.source.clone(),
                        target: m.target.clone(),
                        writable: m.writable,
                    }))
                    .collect(),
                idmapped: false,
            }
        } else {
            rootfs::prepare(
                &self.state,
                &config.image,
                profile.resources.tmpfs_bytes,
                &mounts,
                config.for_commit,
            )?
        };

        let has = |c: &Capability| host.bounding_caps.contains(c);
        let command_caps: Vec<Capability> = COMMAND_CAPS.iter().copied().filter(has).collect();
        let loopback = INIT_ONLY_CAPS.iter().all(has);
        let mut init_caps = command_caps.clone();
        if loopback {
            init_caps.extend_from_slice(INIT_ONLY_CAPS);
        }
        if shell {
            if let Some(missing) = crate::inside::executor::SHELL_CAPS.iter().find(|c| !has(c)) {
                return Err(RuntimeError::Unsupported(format!(
                    "{missing} is not in this host's capability bounding set: a shell's init \
                     needs it (in the sandbox's own user namespace) to make a cell per run"
                )));
            }
            for c in crate::inside::executor::SHELL_CAPS {
                if !init_caps.contains(c) {
                    init_caps.push(*c);
                }
            }
        }
        // The zygote enters each cell's mount namespace (setns needs CAP_SYS_CHROOT too).
        let zygote = (shell && config.zygote && profile.python.zygote).then(|| ZygoteConfig {
            preload: profile.python.preload.clone(),
            env: crate::cellrun::environment(profile, &config.image.config, &[]),
        });
        if zygote.is_some() {
            let chroot = Capability::CAP_SYS_CHROOT;
            if !has(&chroot) {
                return Err(RuntimeError::Unsupported(format!(
                    "{chroot} is not in this host's capability bounding set: the profile's \
                     Python zygote needs it (in the sandbox's own user namespace)"
                )));
            }
            if !init_caps.contains(&chroot) {
                init_caps.push(chroot);
            }
        }

        self.image_config = config.image.config.clone();
        self.image_id = config.image.id.clone();
        let env = crate::cellrun::environment(profile, &self.image_config, &config.env);
        let cwd = config.cwd.clone().unwrap_or_else(|| {
            PathBuf::from(config.image.config.default_cwd(config.workspace.is_some()))
        });
        let spec = spec::build(&SpecInput {
            sandbox_id: self.id.clone(),
            image_name: config.image.name.clone(),
            args: if shell {
                vec![SHELL_ARGS.to_string()]
            } else {
                config.args.clone()
            },
            env,
            // The init enters the working directory itself when it spawns the command, so a
            // missing one is the command's error (a clear message), not a container failure.
            cwd: PathBuf::from("/"),
            resources: profile.resources.clone(),
            binds: prepared.binds.clone(),
            seccomp: crate::confine::seccomp::default_profile(
                agentrun_policy::seccomp_denied_syscalls(),
                &profile.seccomp_sockets,
            )?,
            init_caps: init_caps.clone(),
            // A shell's are the most a cell may get (raising is not possible in a cell); the
            // most we may set is our own hard limit.
            limits: if shell {
                Rlimits::ours()
            } else {
                Rlimits::for_resources(&profile.resources)
            },
            swap_limit: host.swap_limit,
            masked: profile.filesystem.hidden.clone(),
        })?;
        let config_path = self.config_path();
        spec.save(&config_path).map_err(|e| {
            RuntimeError::Container(format!("writing {}: {e}", config_path.display()))
        })?;
        // It holds the environment (-e values can be secrets): root only.
        fs::set_permissions(&config_path, fs::Permissions::from_mode(0o600))
            .map_err(|e| RuntimeError::io("chmod", &config_path, e))?;

        // Landlock rules come from the same profile that `Profile::check` decides with (a
        // build step's: a shell's cells get theirs per run).
        let crate::control::PathRules { readable, writable } =
            crate::cellrun::cell_rules(profile, &mounts);
        let executor = SandboxExecutor {
            mode: if shell {
                InitMode::Shell
            } else {
                InitMode::Spec
            },
            // A shell's cells get theirs per run.
            landlock: (host.landlock_abi > 0 && !shell)
                .then_some(LandlockRules { readable, writable }),
            landlock_abi: host.landlock_abi,
            command_caps,
            loopback,
            program: "agentrun".into(),
            cwd: cwd.to_string_lossy().into_owned(),
            egress_socket: PathBuf::from(EGRESS_DIR_IN_SANDBOX).join(EGRESS_SOCKET),
            sockets: profile.seccomp_sockets.clone(),
            zygote,
        };
        self.enforcement = Enforcement {
            landlock: host.landlock_enforcement(),
            landlock_abi: host.landlock_abi,
            seccomp: host.seccomp,
            user_namespace: true,
            idmapped_mounts: prepared.idmapped,
            cgroup: match cgroup {
                Some(cg) => cg.as_str().into(),
                None => "none (rootless: no delegated cgroup)".into(),
            },
            swap_limited: host.swap_limit,
            loopback,
            limits: Vec::new(),
        };
        self.enforcement.limits = self
            .describe_limits(&self.rlimit_fallback(&profile.resources, profile.resources.timeout));

        if let Some(ids) = &rootless {
            let (host_end, init_end) = crate::control::seqpacket_pair()?;
            let log_path = self.state.join("init.log");
            let layers: Vec<PathBuf> = config.image.layers.clone();
            let (pid, userns) = with_fd_at(init_end, crate::control::INIT_CONTROL_FD, || {
                let log: OwnedFd = fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log_path)
                    .map_err(|e| RuntimeError::io("create", &log_path, e))?
                    .into();
                let null: OwnedFd = fs::File::open("/dev/null")
                    .map_err(|e| RuntimeError::io("open", "/dev/null", e))?
                    .into();
                crate::rootless::spawn(&crate::rootless::RootlessShell {
                    state: &self.state,
                    layers: &layers,
                    tmpfs_bytes: profile.resources.tmpfs_bytes,
                    binds: &prepared.binds,
                    spec: &spec,
                    executor: &executor,
                    caps: &init_caps,
                    ids,
                    stdio: [&null, &log, &log],
                })
            })??;
            self.control = Some(host_end);
            self.rootless_init = Some(pid);
            self.userns = Some(userns);
            return Ok(());
        }
        let builder = ContainerBuilder::new(self.id.clone(), SyscallType::default())
            .with_root_path(self.paths.containers())
            .map_err(|e| RuntimeError::Container(e.to_string()))?
            .with_executor(executor);
        let container = match stdio {
            SandboxStdio::Piped { stdin } => {
                let (out_r, out_w) = cloexec_pipe()?;
                let (err_r, err_w) = cloexec_pipe()?;
                self.stdout = Some(out_r);
                self.stderr = Some(err_r);
                build_container(
                    builder
                        .with_stdin(stdin)
                        .with_stdout(out_w)
                        .with_stderr(err_w),
                    &self.state,
                )?
            }
            SandboxStdio::Shell => {
                let (host_end, init_end) = crate::control::seqpacket_pair()?;
                let log_path = self.state.join("init.log");
                // Every fd the builder gets is opened while the control end sits at fd 3,
                // so none of them can be (or alias) fd 3.
                let container = with_fd_at(init_end, crate::control::INIT_CONTROL_FD, || {
                    // The init's own messages (setup failures) go to a log in the state dir.
                    let log = fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&log_path)
                        .map_err(|e| RuntimeError::io("create", &log_path, e))?;
                    let log2 = log
                        .try_clone()
                        .map_err(|e| RuntimeError::io("dup", &log_path, e))?;
                    let null = fs::File::open("/dev/null")
                        .map_err(|e| RuntimeError::io("open", "/dev/null", e))?;
                    let builder = builder
                        .with_stdin(OwnedFd::from(null))
                        .with_stdout(OwnedFd::from(log2))
                        .with_stderr(OwnedFd::from(log))
                        .with_preserved_fds(1);
                    build_container(builder, &self.state)
                })??;
                self.control = Some(host_end);
                container
            }
        };
        self.container = Some(container);
        Ok(())
    }

    /// The writable layer of the last cell run with
    /// [`crate::control::CellRequest::send_upper`] (`O_PATH`; read it at
    /// `/proc/self/fd/N`): how a rootless `image build` RUN step's changes are read after its
    /// command ended.
    pub fn take_cell_upper(&mut self) -> Option<OwnedFd> {
        self.kept_upper.take()
    }

    /// A rootless shell's id mapping, `(inside, host, count)` lines of its init's
    /// `uid_map` and `gid_map` (the user is 0, its subordinate ids 1..); `None` for root's.
    pub fn rootless_id_map(&self) -> Option<agentrun_image::IdMap> {
        let pid = self.rootless_init?;
        let read = |what: &str| -> Option<Vec<(u32, u32, u32)>> {
            let text = fs::read_to_string(format!("/proc/{pid}/{what}")).ok()?;
            Some(
                text.lines()
                    .filter_map(|l| {
                        let mut f = l.split_whitespace().map(|n| n.parse::<u32>().ok());
                        Some((f.next()??, f.next()??, f.next()??))
                    })
                    .collect(),
            )
        };
        Some(agentrun_image::IdMap {
            uids: read("uid_map")?,
            gids: read("gid_map")?,
        })
    }

    /// The host end of a shell's control channel (once).
    pub fn take_control(&mut self) -> Option<OwnedFd> {
        self.control.take()
    }

    /// A rootless shell's user namespace (`None` for root's sandboxes).
    pub fn userns(&self) -> Option<BorrowedFd<'_>> {
        self.userns.as_ref().map(|f| f.as_fd())
    }

    /// Host pid of the sandbox's init, once started.
    pub fn init_pid(&self) -> Option<i32> {
        if let Some(pid) = self.rootless_init {
            return Some(pid.as_raw());
        }
        self.container
            .as_ref()
            .and_then(|c| c.pid())
            .map(|p| p.as_raw())
    }

    /// Lets the init proceed: a shell's init then waits for cell requests.
    pub fn start(&mut self) -> Result<(), RuntimeError> {
        if self.rootless_init.is_some() {
            // Its init serves its control channel as soon as it is set up.
            return Ok(());
        }
        let container = self
            .container
            .as_mut()
            .ok_or_else(|| RuntimeError::Container("sandbox was not created".into()))?;
        container
            .start()
            .map_err(|e| RuntimeError::Container(e.to_string()))
    }

    /// Runs one cell in this shell (the cold path: one shell, one cell) with `stdin` and its
    /// output pumped to `io`'s writers (so it is counted, previewed and capped), until the
    /// command exits, the timeout passes (the whole cell is killed: exit 124), or a signal
    /// arrives (forwarded; a second one kills the cell). `req`'s work must be a command;
    /// `mounts` are the run's, made with [`crate::cellrun::RunMounts::prepare`].
    pub fn run_cell(
        &mut self,
        req: &crate::control::CellRequest,
        mounts: crate::cellrun::RunMounts,
        stdin: OwnedFd,
        io: RunIo<'_>,
    ) -> Result<RunOutcome, RuntimeError> {
        use crate::cellrun::{CellError, CellRun};
        let started = Instant::now();
        let control = self
            .control
            .as_ref()
            .ok_or_else(|| RuntimeError::Container("not a shell".into()))?;
        let meter = self.cgroup.map(|cg| cg.meter(&self.id));
        let (out_r, out_w) = cloexec_pipe()?;
        let (err_r, err_w) = cloexec_pipe()?;
        let stdio = [stdin.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
        let mut cell = match CellRun::start(control.as_fd(), req, &stdio, mounts) {
            Ok(c) => c,
            Err(CellError::Runtime(e)) => return Err(e),
            Err(e) => return Err(RuntimeError::Container(e.to_string())),
        };
        drop((stdin, out_w, err_w));
        if req.send_upper {
            self.kept_upper = cell.take_upper();
        }
        let mut target = CellTarget {
            cell: &mut cell,
            result: None,
        };
        let output = [Some(out_r), Some(err_r)];
        self.pump(&mut target, output, io, started, |t, timed_out, ran| {
            let stats = meter.map(|m| m.finish()).unwrap_or_default();
            let mut outcome = RunOutcome::of_cell(t.result.take(), timed_out, stats, ran);
            outcome.init_pid = t.cell.pid;
            outcome
        })
    }

    /// Starts the command and pumps its output to `io`'s writers until it exits, the timeout
    /// passes (the whole sandbox is killed: exit 124), or a signal arrives (forwarded; a
    /// second one kills the sandbox).
    pub fn run(&mut self, io: RunIo<'_>) -> Result<RunOutcome, RuntimeError> {
        let started = Instant::now();
        self.start()?;
        let init = self
            .init_pid()
            .map(Pid::from_raw)
            .ok_or_else(|| RuntimeError::Container("container has no init pid".into()))?;
        let pidfd = pidfd_open(init)?;
        let mut target = InitTarget {
            init,
            pidfd,
            status: None,
            usage: None,
        };
        let output = [self.stdout.take(), self.stderr.take()];
        self.pump(&mut target, output, io, started, |t, timed_out, ran| {
            let stats = self.cgroup.map(|cg| cg.stats(&self.id)).unwrap_or_default();
            // The init's usage includes the command's and every child it reaped.
            let mut outcome = RunOutcome::of_init(t.status, t.usage, timed_out, stats, ran);
            outcome.init_pid = init.as_raw();
            outcome
        })
    }

    /// Pumps `output` (the run's stdout and stderr pipes, each capped at the output cap) to
    /// `io` until `target` ends (see [`pump_streams`]; `io.timeout` counts from `started`),
    /// then makes the run's outcome with `finish` (given the target, whether it timed out,
    /// and how long it ran) and counts the output into it.
    fn pump<T: RunTarget>(
        &self,
        target: &mut T,
        output: [Option<OwnedFd>; 2],
        io: RunIo<'_>,
        started: Instant,
        finish: impl FnOnce(&mut T, bool, Duration) -> RunOutcome,
    ) -> Result<RunOutcome, RuntimeError> {
        let mut streams = output.map(|fd| OutputStream::new(fd, self.output_cap));
        let deadline = io.timeout.map(|t| started + t);
        let end = pump_streams(target, &mut streams, io, deadline)?;
        let ran = end.ran.unwrap_or_else(|| started.elapsed());
        let mut outcome = finish(target, end.timed_out, ran);
        outcome.count_output(&mut streams);
        Ok(outcome)
    }

    /// Keeps a copy of the bundle's config.json under the state dir's `kept/`; returns it.
    pub fn keep_bundle(&self) -> Result<PathBuf, RuntimeError> {
        let dir = self.paths.kept().join(&self.id);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| RuntimeError::io("create", &dir, e))?;
        let dst = dir.join("config.json");
        fs::copy(self.config_path(), &dst).map_err(|e| RuntimeError::io("copy", &dst, e))?;
        Ok(dir)
    }

    /// Kills whatever still runs and removes the container, cgroups, mounts and state dir.
    pub fn destroy(mut self) -> Result<(), RuntimeError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), RuntimeError> {
        if self.destroyed {
            return Ok(());
        }
        self.destroyed = true;
        self.stdout = None;
        self.stderr = None;
        self.control = None;
        // libcontainer's `Container::delete` is not used: it builds a libcgroups v1 manager,
        // which re-reads /proc/self/mountinfo and /proc/self/cgroup through pathrs's hardened
        // procfs for each of ~12 controllers (~800 syscalls; ~1.5 of ~17 ms of CPU per pooled
        // sandbox's create + destroy here), to do what `destroy_leftovers` does anyway: kill
        // what is left in the cgroup, remove the cgroups, the mounts, the state dir and
        // libcontainer's container dir. We have no OCI hooks to run. One teardown then serves
        // every path: this one and `gc` for sandboxes whose owner died.
        // A frozen init would not die (nor be reaped) until thawed.
        if let Some(cg) = self.cgroup {
            cg.thaw_if_frozen(&self.id);
        }
        if let Some(pid) = self.rootless_init.take() {
            // Dropped: ESRCH/ECHILD only, the init is already gone and reaped.
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
        }
        if let Some(c) = self.container.take() {
            if let Some(pid) = c.pid() {
                // Dropped: ESRCH/ECHILD only, the container's init is already gone and reaped.
                let _ = kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
            }
        }
        let result = destroy_leftovers(&self.paths, &self.id, self.cgroup);
        // Only now that nothing has the layers mounted.
        self.image_lease = None;
        result
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Dropped: Drop cannot report; callers that care call teardown() themselves.
        let _ = self.teardown();
    }
}

/// Removes everything a sandbox may have left: processes in its cgroup, the cgroups, mounts
/// under its state dir, the state dir and libcontainer's container dir. Idempotent.
pub(crate) fn destroy_leftovers(
    paths: &RuntimePaths,
    id: &str,
    cgroup: Option<CgroupMode>,
) -> Result<(), RuntimeError> {
    if let Some(cg) = cgroup {
        cg.thaw_if_frozen(id);
        for _ in 0..50 {
            let pids = cg.pids(id);
            if pids.is_empty() {
                break;
            }
            for p in pids {
                // Dropped: ESRCH only, the process already ended.
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        cg.remove(id);
    }
    let state = paths.sandboxes().join(id);
    rootfs::unmount_all(&state)?;
    remove_dir(&state)?;
    remove_dir(&paths.containers().join(id))?;
    Ok(())
}

/// The container's init sets up mounts as the sandbox's unprivileged root, so every directory
/// above the state dir must be searchable by it: by others, or by its group (the state dir
/// itself, see [`crate::mounts::hostdirs`]). A `mktemp -d` parent, mode 0700, is not.
fn check_searchable(dir: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::MetadataExt;
    for d in dir.ancestors() {
        let Ok(meta) = fs::metadata(d) else { continue };
        if !crate::mounts::hostdirs::sandbox_root_can_search(&meta) {
            return Err(RuntimeError::InvalidInput(format!(
                "state dir {} is not usable: {} (mode {:o}) is not searchable by the sandbox's \
                 uid; use a directory whose parents are world-searchable (chmod o+x)",
                dir.display(),
                d.display(),
                meta.mode() & 0o7777
            )));
        }
    }
    Ok(())
}

fn remove_dir(p: &Path) -> Result<(), RuntimeError> {
    match fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RuntimeError::io("remove", p, e)),
    }
}

/// One output stream of a run, pumped from a pipe to a sink: counted, its first bytes kept
/// for the span, capped (the cold path here; the warm client for runs whose profile caps
/// output).
pub struct OutputStream {
    /// The pipe's read end (`None` once at EOF or when the sink closed).
    pub fd: Option<OwnedFd>,
    /// Bytes read.
    pub bytes: u64,
    /// The first [`PREVIEW_BYTES`] of them.
    pub preview: Vec<u8>,
    sink_closed: bool,
    /// Bytes passed on at most; the rest is read and dropped.
    cap: Option<u64>,
    /// More than the cap came.
    pub truncated: bool,
}

/// How much of stderr a run's span keeps.
pub const PREVIEW_BYTES: usize = 512;

impl OutputStream {
    pub fn new(fd: Option<OwnedFd>, cap: Option<u64>) -> Self {
        OutputStream {
            fd,
            bytes: 0,
            preview: Vec::new(),
            sink_closed: false,
            cap,
            truncated: false,
        }
    }

    /// Reads what is available and writes it on. EOF closes the stream; a closed sink closes
    /// it too, so the writer inside gets SIGPIPE as it would writing to that sink directly.
    pub fn pump(&mut self, buf: &mut [u8], sink: &mut dyn Write) {
        let Some(fd) = &self.fd else { return };
        match nix::unistd::read(fd.as_raw_fd(), buf) {
            Ok(0) => self.fd = None,
            Ok(n) => {
                let before = self.bytes;
                self.bytes += n as u64;
                // Over the cap: pass on what fits, drop the rest (the writer is not blocked).
                let pass = match self.cap {
                    Some(cap) if self.bytes > cap => {
                        self.truncated = true;
                        cap.saturating_sub(before) as usize
                    }
                    _ => n,
                };
                if self.preview.len() < PREVIEW_BYTES {
                    let take = n.min(PREVIEW_BYTES - self.preview.len());
                    self.preview.extend_from_slice(&buf[..take]);
                }
                if !self.sink_closed
                    && pass > 0
                    && (sink.write_all(&buf[..pass]).is_err() || sink.flush().is_err())
                {
                    self.sink_closed = true;
                    self.fd = None;
                }
            }
            Err(nix::Error::EINTR) | Err(nix::Error::EAGAIN) => {}
            Err(_) => self.fd = None,
        }
    }
}

/// What [`pump_streams`] waits on: a run that ends, and can be signalled.
trait RunTarget {
    /// Readable when the run has ended (`None`: done).
    fn done_fd(&self) -> Option<BorrowedFd<'_>>;
    /// Takes note of the end (reads the status or result). Returns whether it has ended.
    fn ended(&mut self) -> Result<bool, RuntimeError>;
    fn signal(&mut self, signal: i32);
}

/// How [`pump_streams`] ended.
struct PumpEnd {
    timed_out: bool,
    /// Time from the first poll to the run's end, when it ended.
    ran: Option<Duration>,
}

/// Where a run's output goes and what ends it early: the terms [`Sandbox::run`] and
/// [`Sandbox::run_cell`] share.
pub struct RunIo<'a> {
    /// Where the command's stdout goes.
    pub out: &'a mut dyn Write,
    /// Where the command's stderr goes.
    pub err: &'a mut dyn Write,
    /// Past it the whole run is killed (exit 124).
    pub timeout: Option<Duration>,
    /// Signals to forward to the run (a second one kills it).
    pub signals: Option<&'a SignalFd>,
}

/// Pumps `streams` to `io`'s writers until `target` has ended and its output reached EOF (at
/// most 2 s after the end: never hang on a pipe someone else holds), the deadline passes (the
/// target is killed) or a signal arrives on `io.signals` (forwarded; a second one kills).
fn pump_streams(
    target: &mut dyn RunTarget,
    streams: &mut [OutputStream; 2],
    io: RunIo<'_>,
    deadline: Option<Instant>,
) -> Result<PumpEnd, RuntimeError> {
    let RunIo {
        out, err, signals, ..
    } = io;
    let started = Instant::now();
    let mut end = PumpEnd {
        timed_out: false,
        ran: None,
    };
    let mut done_at: Option<Instant> = None;
    let mut signals_seen = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let open = streams.iter().any(|s| s.fd.is_some());
        if done_at.is_some() && !open {
            break;
        }
        if done_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
            break;
        }
        let now = Instant::now();
        let wait_ms = match (done_at.is_some(), deadline) {
            (true, _) => 100,
            (false, Some(d)) if d <= now => {
                if !end.timed_out {
                    end.timed_out = true;
                    target.signal(libc::SIGKILL);
                }
                100
            }
            (false, Some(d)) => (d - now).as_millis().min(60_000) as i32 + 1,
            (false, None) => 60_000,
        };
        let mut fds: Vec<PollFd> = Vec::with_capacity(4);
        let mut which: Vec<usize> = Vec::with_capacity(4);
        for (i, s) in streams.iter().enumerate() {
            if let Some(fd) = &s.fd {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                which.push(i);
            }
        }
        let done_slot = match (done_at, target.done_fd()) {
            (None, Some(fd)) => {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                Some(fds.len() - 1)
            }
            _ => None,
        };
        let sig_slot = signals.map(|s| {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
        match poll(
            &mut fds,
            PollTimeout::try_from(wait_ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(RuntimeError::sys("poll", e)),
        }
        let ready = |i: usize| {
            fds[i].revents().is_some_and(|r| {
                r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            })
        };
        let ready_streams: Vec<usize> = (0..which.len())
            .filter(|i| ready(*i))
            .map(|i| which[i])
            .collect();
        let done_ready = done_slot.is_some_and(ready);
        let sig_ready = sig_slot.is_some_and(ready);
        drop(fds);
        for i in ready_streams {
            let sink: &mut dyn Write = if i == 0 { &mut *out } else { &mut *err };
            streams[i].pump(&mut buf, sink);
        }
        if sig_ready {
            if let Some(Ok(Some(info))) = signals.map(|s| s.read_signal()) {
                signals_seen += 1;
                target.signal(if signals_seen > 1 {
                    libc::SIGKILL
                } else {
                    info.ssi_signo as i32
                });
            }
        }
        if done_ready && target.ended()? {
            done_at = Some(Instant::now());
            end.ran = Some(started.elapsed());
        }
    }
    // Dropped: the run's outcome does not depend on its output reaching a closed reader.
    let _ = out.flush();
    let _ = err.flush();
    Ok(end)
}

/// A build step's container init (its pidfd).
struct InitTarget {
    init: Pid,
    pidfd: OwnedFd,
    status: Option<WaitStatus>,
    usage: Option<crate::control::ResourceUsage>,
}

impl RunTarget for InitTarget {
    fn done_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.pidfd.as_fd())
    }

    fn ended(&mut self) -> Result<bool, RuntimeError> {
        let mut raw = 0;
        // SAFETY: rusage is plain old data that wait4 fills in.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child with valid out-pointers.
        let pid = unsafe { libc::wait4(self.init.as_raw(), &mut raw, libc::WNOHANG, &mut usage) };
        if pid < 0 {
            return Err(RuntimeError::sys("wait4", nix::Error::last()));
        }
        if pid == 0 {
            return Ok(false);
        }
        self.status =
            Some(WaitStatus::from_raw(self.init, raw).map_err(|e| RuntimeError::sys("wait4", e))?);
        self.usage = Some((&usage).into());
        Ok(true)
    }

    fn signal(&mut self, signal: i32) {
        if let Ok(sig) = Signal::try_from(signal) {
            // Dropped: ESRCH only, the init already ended; its end is reported by the run.
            let _ = kill(self.init, sig);
        }
    }
}

/// A cell run (the cold path's): its channel says when it ended.
struct CellTarget<'a> {
    cell: &'a mut crate::cellrun::CellRun,
    result: Option<crate::control::InitResult>,
}

impl RunTarget for CellTarget<'_> {
    fn done_fd(&self) -> Option<BorrowedFd<'_>> {
        self.cell.channel()
    }

    fn ended(&mut self) -> Result<bool, RuntimeError> {
        // The result, or EOF: the cell's PID 1 died without one. Then the cell may end: the
        // rest of its output comes with its teardown.
        self.result = self.cell.result();
        self.cell.let_go();
        Ok(true)
    }

    fn signal(&mut self, signal: i32) {
        self.cell.signal(signal);
    }
}

fn build_container(
    builder: libcontainer::container::builder::ContainerBuilder,
    state: &Path,
) -> Result<Container, RuntimeError> {
    builder
        .validate_id()
        .map_err(|e| RuntimeError::Container(e.to_string()))?
        .as_init(state.join("bundle"))
        .with_systemd(false)
        .with_detach(true)
        .build()
        .map_err(|e| RuntimeError::Container(e.to_string()))
}

/// Runs `f` with `fd` installed at number `at` (libcontainer passes fds by number), then puts
/// back whatever was there. The caller must be single-threaded (see the module doc), and must
/// not use an fd it already owns at number `at` inside `f`; fds that `f` opens never get `at`.
fn with_fd_at<T>(fd: OwnedFd, at: RawFd, f: impl FnOnce() -> T) -> Result<T, RuntimeError> {
    use nix::fcntl::{fcntl, FcntlArg};
    // Keep what occupies `at` aside, above it.
    let saved = match fcntl(at, FcntlArg::F_DUPFD_CLOEXEC(at + 1)) {
        // SAFETY: F_DUPFD_CLOEXEC returned a new fd that we own.
        Ok(n) => Some(unsafe { OwnedFd::from_raw_fd(n) }),
        Err(_) => None,
    };
    // dup2 clears close-on-exec on the target, which is what passing it on needs.
    nix::unistd::dup2(fd.as_raw_fd(), at).map_err(|e| RuntimeError::sys("dup2", e))?;
    drop(fd);
    let out = f();
    match saved {
        Some(s) => {
            // Dropped: restoring the caller's fd on the way out; nothing to return it to.
            let _ = nix::unistd::dup2(s.as_raw_fd(), at);
            let _ = fcntl(at, FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC));
        }
        None => {
            // Dropped: EBADF only, when `at` was not open before either.
            let _ = nix::unistd::close(at);
        }
    }
    Ok(out)
}

pub(crate) fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::sys("pipe", e))
}

/// A pidfd for `pid` (it stays valid however the process ends; used to wait on inits).
pub fn pidfd_open(pid: Pid) -> Result<OwnedFd, RuntimeError> {
    // SAFETY: pidfd_open(pid, 0) returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(RuntimeError::io(
            "pidfd_open",
            format!("/proc/{pid}"),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: the fd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
