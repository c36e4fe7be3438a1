//! agentrun's libcontainer `Executor`: what the container's init does once libcontainer has
//! made the container.
//!
//! libcontainer calls [`SandboxExecutor::exec`] in the container's init process after it has
//! entered the namespaces and cgroups, pivoted into the rootfs, set rlimits, no_new_privs and
//! the spec's capabilities. From there agentrun takes over, in one of two modes:
//! - [`InitMode::Shell`] (every `agentrun exec`, the daemon's pool, the API's sandboxes): the
//!   container is a shell and this process its init ([`crate::inside::shell`]), which makes a cell
//!   per request ([`crate::inside::cell`]). It brings up loopback, drops what it does not need and
//!   serves its control channel.
//! - [`InitMode::Spec`] (`image build`'s RUN steps): runs the spec's `process` once: it brings
//!   up loopback, confines itself (capabilities, Landlock, the spec's seccomp section compiled
//!   with seccompiler: libcontainer without libseccomp ignores it) and becomes the command's
//!   PID 1 ([`crate::inside::reaper`]).
//!
//! Both modes make the init non-dumpable (`PR_SET_DUMPABLE` 0) first thing, rather than rely
//! on a side effect of libcontainer's setresuid: no process of the sandbox's user namespace
//! may ptrace it or open its `/proc/<pid>/mem`, `environ` or fds, and what it forks (cells,
//! their PID 1) inherits that.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use caps::Capability;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use oci_spec::runtime::Spec;

use crate::confine::landlock::{self, LandlockRules};
use crate::confine::seccomp;
use crate::control::INIT_CONTROL_FD;
use crate::inside::cell::CellTemplate;
use crate::inside::reaper::{self, Command};
use crate::inside::shell::{self, ShellInit};
use crate::inside::zygote::ZygoteConfig;

use crate::exit::EXIT_SETUP_FAILED;

/// What the init does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitMode {
    /// Run the spec's `process` (args, env, cwd) on the container's own stdio.
    Spec,
    /// Be a shell's init: make a cell per [`crate::control::CellRequest`] on
    /// [`INIT_CONTROL_FD`].
    Shell,
}

/// What the executor enforces besides what the spec says.
#[derive(Clone, Debug)]
pub struct SandboxExecutor {
    pub mode: InitMode,
    /// Landlock rules of a spec-mode command (a shell's cells get theirs per request);
    /// `None` in OCI mode without a profile annotation.
    pub landlock: Option<LandlockRules>,
    /// The host's Landlock ABI (probed before the container was created).
    pub landlock_abi: u32,
    /// Capabilities the command keeps; everything else is dropped, bounding set included.
    pub command_caps: Vec<Capability>,
    /// Bring `lo` up before dropping CAP_NET_ADMIN.
    pub loopback: bool,
    /// Program name for messages.
    pub program: String,
    /// Working directory of a spec-mode command (the spec's `process.cwd` stays `/`).
    pub cwd: String,
    /// Where the egress proxy's socket is inside the sandbox (a cell's relay connects there).
    pub egress_socket: PathBuf,
    /// The socket families the profile lets a command use (the shell's own filter, which its
    /// cells inherit, must not refuse them).
    pub sockets: agentrun_policy::SocketPolicy,
    /// The shell's Python zygote (shell mode only; see [`crate::inside::zygote`]).
    pub zygote: Option<ZygoteConfig>,
}

/// Capabilities a shell's init keeps for its whole life (besides the command's): mounts and
/// namespaces for cells, and dropping the bounding set in each.
pub const SHELL_CAPS: &[Capability] = &[Capability::CAP_SYS_ADMIN, Capability::CAP_SETPCAP];

impl Executor for SandboxExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        // libcontainer only logs an executor error (through `tracing`, unseen here): say it on
        // the sandbox's stderr and exit with agentrun's setup-failure code instead.
        // SAFETY: prctl(PR_SET_DUMPABLE, 0) only clears a flag of this process.
        let err = if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
            Err(fail(format!(
                "prctl(PR_SET_DUMPABLE): {}",
                std::io::Error::last_os_error()
            )))
        } else {
            match self.mode {
                InitMode::Shell => self.start_shell(spec),
                InitMode::Spec => self.start_spec(spec),
            }
        };
        if let Err(e) = err {
            // Dropped: stderr is the only place to say it; nothing is left if that fails.
            let _ = writeln!(
                std::io::stderr(),
                "{}: sandbox setup failed: {e}",
                self.program
            );
            std::process::exit(EXIT_SETUP_FAILED);
        }
        unreachable!("start_* returns only on error")
    }

    fn validate(&self, _spec: &Spec) -> Result<(), ExecutorValidationError> {
        // A missing command is reported by the init as exit 127, like a shell would.
        Ok(())
    }
}

fn fail(msg: impl Into<String>) -> ExecutorError {
    ExecutorError::Other(msg.into())
}

impl SandboxExecutor {
    /// The spec's seccomp section, compiled (before anything runs: a bad profile fails the
    /// setup, not the command).
    fn run_filters(&self, spec: &Spec) -> Result<Vec<seccompiler::BpfProgram>, ExecutorError> {
        match spec.linux().as_ref().and_then(|l| l.seccomp().as_ref()) {
            Some(section) => seccomp::compile(section).map_err(|e| fail(e.to_string())),
            None => Ok(Vec::new()),
        }
    }

    fn loopback_up(&self) -> Result<(), ExecutorError> {
        if self.loopback {
            crate::inside::net::loopback_up()
                .map_err(|e| fail(format!("bringing up loopback: {e}")))?;
        }
        Ok(())
    }

    /// A shell's init: sets up and serves cell requests; returns only on a setup error.
    fn start_shell(&self, spec: &Spec) -> Result<(), ExecutorError> {
        // Nothing of the creating process may stay open in the shell: libcontainer only marks
        // these close-on-exec, and this process never execs.
        // SAFETY: close_range on fds this process owns; none of them is used past this point.
        unsafe { crate::inside::close_range(INIT_CONTROL_FD as u32 + 1, u32::MAX) };
        let shell_section = shell::shell_filter(
            agentrun_policy::seccomp_denied_syscalls(),
            &self.sockets,
            self.zygote.is_some(),
        )
        .map_err(|e| fail(e.to_string()))?;
        let shell_filters = seccomp::compile(&shell_section).map_err(|e| fail(e.to_string()))?;
        // A cell inherits the shell's filter: it adds only what the run's has beyond it (see
        // `seccomp::narrowing`), or the whole run filter when that cannot be said exactly.
        let run_section = spec.linux().as_ref().and_then(|l| l.seccomp().as_ref());
        let run_filters = match run_section.and_then(|s| seccomp::narrowing(s, &shell_section)) {
            Some(rest) => seccomp::compile_on_top(&rest).map_err(|e| fail(e.to_string()))?,
            None => self.run_filters(spec)?,
        };
        self.loopback_up()?;
        // Watched from now on (opened while CAP_NET_ADMIN is still held).
        let watch = shell::ShellWatch::start();
        // The shell's /dev is read-only: no cell can leave a file in it for the next one (its
        // own /dev/shm, /dev/mqueue and /dev/pts are mounted over it per cell).
        crate::mounts::remount(
            "/dev",
            nix::mount::MsFlags::MS_BIND
                | nix::mount::MsFlags::MS_REMOUNT
                | nix::mount::MsFlags::MS_RDONLY
                | nix::mount::MsFlags::MS_NOSUID,
        )
        .map_err(|e| fail(format!("making /dev read-only: {e}")))?;
        let scratch = shell::scratch_dir().map_err(|e| fail(format!("cell scratch dir: {e}")))?;
        let moved = shell::top_level_mounts().map_err(|e| fail(format!("mountinfo: {e}")))?;
        let linux = spec.linux().as_ref();
        // Those this kernel has, and whether each is a directory: a cell's /proc has the
        // same entries as the shell's.
        let under_proc = |paths: Option<&Vec<String>>| -> Vec<(PathBuf, bool)> {
            paths
                .into_iter()
                .flatten()
                .filter(|p| p.starts_with("/proc/"))
                .filter_map(|p| {
                    let meta = std::fs::symlink_metadata(p).ok()?;
                    Some((PathBuf::from(p), meta.is_dir()))
                })
                .collect()
        };
        let template = CellTemplate {
            command_caps: self.command_caps.clone(),
            landlock_abi: self.landlock_abi,
            run_filters,
            scratch,
            moved,
            proc_masked: under_proc(linux.and_then(|l| l.masked_paths().as_ref())),
            proc_readonly: under_proc(linux.and_then(|l| l.readonly_paths().as_ref()))
                .into_iter()
                .map(|(p, _)| p)
                .collect(),
            egress_socket: self.egress_socket.clone(),
            zygote: self.zygote.clone(),
        };
        shell::shed_covered_mounts().map_err(|e| fail(e.to_string()))?;
        let mut keep = self.command_caps.clone();
        keep.extend_from_slice(SHELL_CAPS);
        if self.zygote.is_some() {
            keep.push(Capability::CAP_SYS_CHROOT);
        }
        reaper::narrow_capabilities(&keep).map_err(|e| fail(format!("capabilities: {e}")))?;
        // SAFETY: prctl on this process only. PDEATHSIG is set after every credential change
        // (they clear it): if agentrun dies, the shell dies with it. Non-dumpable: no process
        // of the shell's user namespace may ptrace it or open its /proc files; cells inherit
        // it.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::prctl(libc::PR_SET_DUMPABLE, 0);
        }
        // SAFETY: fd 3 was preserved by libcontainer for us and nothing else owns it.
        let control = unsafe { OwnedFd::from_raw_fd(INIT_CONTROL_FD) };
        // Dropped: F_SETFD on an fd we own cannot fail but for EBADF, and then serve fails
        // on its first read.
        let _ = nix::fcntl::fcntl(
            control.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
        shell::serve(
            ShellInit {
                template,
                shell_filters,
                watch,
            },
            control,
        )
    }

    /// Spec mode: confines itself, runs the spec's command, exits with its status.
    fn start_spec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        // SAFETY: close_range on fds this process owns; none of them is used past this point.
        unsafe { crate::inside::close_range(3, u32::MAX) };
        let filters = self.run_filters(spec)?;
        self.loopback_up()?;
        reaper::narrow_capabilities(&self.command_caps)
            .map_err(|e| fail(format!("capabilities: {e}")))?;
        // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag on this process.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        if let Some(rules) = &self.landlock {
            landlock::restrict(rules, self.landlock_abi).map_err(|e| fail(e.to_string()))?;
        }
        seccomp::install(&filters).map_err(|e| fail(e.to_string()))?;
        let process = spec.process().as_ref().ok_or(ExecutorError::InvalidArg)?;
        // libcontainer already set the spec's environment on this process.
        let env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
        let cmd = Command::new(
            process.args().clone().unwrap_or_default(),
            &env,
            self.cwd.clone(),
            None,
        )
        .map_err(|e| fail(e.0))?;
        reaper::block_all_signals().map_err(|e| fail(format!("sigprocmask: {e}")))?;
        let result = reaper::run_to_end(&cmd);
        std::process::exit(result.exit_code)
    }
}
