//! One run in a cell, from the host's side: the run's mounts made and idmapped here
//! ([`RunMounts`]), its Landlock rules ([`cell_rules`]), the request sent to a shell's init
//! with the fds it needs and the cell's pidfd received back ([`CellRun::start`]), signals and
//! kills through that pidfd, the result read from the cell's own channel, the cell's end
//! awaited ([`await_end`]); [`crate::outcome`] settles what it reported.
//!
//! The cold path (`agentrun exec` without a daemon: [`crate::Sandbox::run_cell`]) and the
//! daemon's pool both go through here, so a run is the same either way.

use std::collections::HashMap;
use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use agentrun_policy::Profile;

use crate::confine::limits::Rlimits;
use crate::control::{
    self, CellMount, CellRequest, CellWork, InitResult, PathRules, ShellEvent, ShellRequest,
};
use crate::error::RuntimeError;
use crate::mounts::idmap::{detached_clone_idmapped, MappingNamespace};
use crate::mounts::rootfs::UserMount;

/// How long a shell's init may take to answer a cell request (it only clones).
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The mapping namespaces of idmapped mounts, made once and kept (each costs a fork).
#[derive(Default)]
pub struct MappingCache {
    range: Option<MappingNamespace>,
    owners: HashMap<(u32, u32), MappingNamespace>,
}

impl MappingCache {
    pub fn new() -> Self {
        Self::default()
    }

    fn range(&mut self) -> Result<&MappingNamespace, RuntimeError> {
        if self.range.is_none() {
            self.range = Some(MappingNamespace::sandbox_range()?);
        }
        Ok(self.range.as_ref().expect("just made"))
    }

    fn owner(&mut self, uid: u32, gid: u32) -> Result<&MappingNamespace, RuntimeError> {
        Ok(match self.owners.entry((uid, gid)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(MappingNamespace::owner(uid, gid)?)
            }
        })
    }
}

/// A run's mounts, made on the host as detached mounts ready to travel to its cell.
#[derive(Default)]
pub struct RunMounts {
    pub mounts: Vec<CellMount>,
    pub fds: Vec<OwnedFd>,
    /// Whether every one could be idmapped (false: some ownership shows as nobody inside, and
    /// writes are owned by the sandbox uid on the host).
    pub idmapped: bool,
    /// Read-only layers for the cell's overlay, over the shell's root (top first): detached
    /// mounts ([`crate::mounts::idmap::detached_clone`]) of directories in overlayfs upper form
    /// (a fork copy's frozen layers). Sent after the mounts' fds ([`CellRequest::layers`]).
    pub layers: Vec<OwnedFd>,
}

impl RunMounts {
    /// Opens and idmaps `user` mounts (the workspace first, as `/workspace`): a host
    /// directory owned by root is mapped like the image (root inside is root outside); any
    /// other owner is mapped to the sandbox's root, so files the run writes land owned by the
    /// directory's owner. Paths are the host's, resolved here by root, never inside the
    /// sandbox; targets are checked (absolute, no `..`) and resolved later inside the cell's
    /// root.
    /// As [`RunMounts::prepare`] for a root caller, [`RunMounts::prepare_rootless`] in the
    /// shell's user namespace `userns` for an ordinary user.
    pub fn prepare_for(
        user: &[UserMount],
        cache: &mut MappingCache,
        privilege: &crate::host::privilege::Privilege,
        userns: Option<BorrowedFd<'_>>,
    ) -> Result<Self, RuntimeError> {
        if privilege.is_root() || user.is_empty() {
            return Self::prepare(user, cache);
        }
        match userns {
            Some(ns) => Self::prepare_rootless(user, ns),
            None => Err(RuntimeError::Unsupported(
                "a rootless sandbox of the daemon's pool takes no --workspace/--ro/--rw mounts \
                 yet: run with AGENTRUN_NO_DAEMON=1"
                    .into(),
            )),
        }
    }

    /// A rootless run's mounts: cloned (`open_tree`, recursive) by a helper that joins the
    /// shell's user namespace `userns` and makes a mount namespace of its own there, so the
    /// clones belong to that namespace and its cells may attach them.
    /// Nothing is idmapped: the caller's files are the sandbox root's, and what the caller
    /// cannot read it cannot mount (the kernel checks the path as the caller).
    pub fn prepare_rootless(
        user: &[UserMount],
        userns: BorrowedFd<'_>,
    ) -> Result<Self, RuntimeError> {
        let mut out = RunMounts::default();
        let mut sources = Vec::new();
        for m in user {
            let (entry, _) = cell_mount(m)?;
            out.mounts.push(entry);
            sources.push((
                std::ffi::CString::new(m.source.as_os_str().as_encoded_bytes()).map_err(|_| {
                    RuntimeError::InvalidInput(format!("path contains NUL: {}", m.source.display()))
                })?,
                !m.writable,
            ));
        }
        out.fds = crate::mounts::idmap::clone_in_userns(userns, &sources)?;
        Ok(out)
    }

    pub fn prepare(user: &[UserMount], cache: &mut MappingCache) -> Result<Self, RuntimeError> {
        let mut out = RunMounts {
            idmapped: true,
            ..Default::default()
        };
        for m in user {
            let (entry, meta) = cell_mount(m)?;
            let owner = (meta.uid(), meta.gid());
            let ns = if owner == (0, 0) {
                cache.range()?
            } else {
                cache.owner(owner.0, owner.1)?
            };
            // A file system that cannot be idmapped gets a plain bind.
            let (fd, mapped) = detached_clone_idmapped(&m.source, ns, !m.writable)?;
            out.idmapped &= mapped;
            out.mounts.push(entry);
            out.fds.push(fd);
        }
        Ok(out)
    }
}

/// `m`'s entry in a cell request, once its target is checked, and its source's metadata.
fn cell_mount(m: &UserMount) -> Result<(CellMount, fs::Metadata), RuntimeError> {
    m.check_target()?;
    let meta =
        fs::metadata(&m.source).map_err(|e| RuntimeError::io("cannot mount", &m.source, e))?;
    let entry = CellMount {
        target: m.target.clone(),
        directory: meta.is_dir(),
    };
    Ok((entry, meta))
}

/// The cell's Landlock rules, from the same profile `Profile::check` decides with: read (and
/// execute) under the profile's readable paths and every mount, write under the profile's
/// writable paths, rw mounts, and the workspace when the profile makes it writable (the
/// workspace mount itself is read-write so writable paths under it work).
pub fn cell_rules(profile: &Profile, mounts: &[UserMount]) -> PathRules {
    let writable = profile.landlock_writable(
        mounts
            .iter()
            .filter(|m| m.writable && m.target != Path::new(agentrun_policy::WORKSPACE))
            .map(|m| m.target.clone()),
    );
    let mut readable = profile.landlock_readable();
    readable.extend(mounts.iter().map(|m| m.target.clone()));
    PathRules { readable, writable }
}

/// A run's mounts as [`UserMount`]s: the workspace (at `/workspace`, read-write) first.
pub fn user_mounts(workspace: Option<&Path>, mounts: &[UserMount]) -> Vec<UserMount> {
    let mut all: Vec<UserMount> = workspace
        .map(|ws| UserMount {
            source: ws.to_path_buf(),
            target: agentrun_policy::WORKSPACE.into(),
            writable: true,
        })
        .into_iter()
        .collect();
    all.extend(mounts.iter().cloned());
    all
}

/// A run's whole environment (`KEY=VALUE`): the profile's defaults, then the image's `Env`,
/// then the run's own values (`-e`, an API request's env, TRACEPARENT, the egress proxy's);
/// later ones win, nothing comes from the host. Every run shape assembles it here.
pub fn environment(
    profile: &Profile,
    image: &agentrun_image::ImageConfig,
    run_env: &[(String, String)],
) -> Vec<String> {
    let mut over = image.env_pairs();
    over.extend(run_env.iter().cloned());
    profile.environment(&over)
}

/// The request for a cell running `work`, from the run's profile (overrides applied: tmpfs
/// size, nofile, pids as nproc), its mounts (`user`, made into `mounts`) and whether it
/// relays to an egress proxy.
pub fn cell_request(
    profile: &Profile,
    landlock_abi: u32,
    user: &[UserMount],
    mounts: &RunMounts,
    egress_port: Option<u16>,
    work: CellWork,
) -> CellRequest {
    CellRequest {
        cell: next_cell_id(),
        tmpfs_bytes: profile.resources.tmpfs_bytes,
        // A cell cannot raise a limit over its shell's, which is ours (see `Sandbox::create`).
        limits: Rlimits::for_resources(&profile.resources),
        rlimits: Default::default(),
        landlock: (landlock_abi > 0).then(|| cell_rules(profile, user)),
        mounts: mounts.mounts.clone(),
        egress_port,
        work,
        layers: mounts.layers.len(),
        send_upper: false,
    }
}

/// A new cell id, unique in this process.
pub fn next_cell_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Why a cell run did not get going.
#[derive(Debug, thiserror::Error)]
pub enum CellError {
    /// The shell's init refused or failed (it is in doubt: discard it).
    #[error("the shell could not make the cell: {0}")]
    NotMade(String),
    /// The shell's init is gone.
    #[error("the shell's init is gone")]
    ShellGone,
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// A cell that was made: its PID 1 runs the request.
pub struct CellRun {
    pub cell: u64,
    /// Host pid of the cell's PID 1.
    pub pid: i32,
    pidfd: OwnedFd,
    /// The host's end of the cell's own channel (`None` once let go).
    channel: Option<OwnedFd>,
    /// The cell's writable layer (`O_PATH`), when its request asked for it
    /// ([`CellRequest::send_upper`]).
    upper: Option<OwnedFd>,
}

impl CellRun {
    /// Sends `req` to the shell's init on `control` with the cell's fds (`stdio` for a
    /// command, then `mounts`) and waits for the cell to exist.
    pub fn start(
        control: BorrowedFd<'_>,
        req: &CellRequest,
        stdio: &[RawFd],
        mounts: RunMounts,
    ) -> Result<CellRun, CellError> {
        let (host_end, cell_end) = control::seqpacket_pair()?;
        let mut raw: Vec<RawFd> = vec![cell_end.as_raw_fd()];
        raw.extend_from_slice(stdio);
        raw.extend(mounts.fds.iter().map(|f| f.as_raw_fd()));
        raw.extend(mounts.layers.iter().map(|f| f.as_raw_fd()));
        if req.layers != mounts.layers.len() {
            return Err(RuntimeError::InvalidInput(format!(
                "a cell request for {} layers made with {}",
                req.layers,
                mounts.layers.len()
            ))
            .into());
        }
        if raw.len() > control::MAX_FDS {
            return Err(RuntimeError::InvalidInput(format!(
                "too many mounts for one run (at most {})",
                control::MAX_FDS - 1 - stdio.len()
            ))
            .into());
        }
        control::send_json(control, &ShellRequest::Cell(req.clone()), &raw)
            .map_err(|_| CellError::ShellGone)?;
        // Ours are copies: the cell has its own now.
        drop(cell_end);
        drop(mounts);
        if !control::wait_readable(control, Some(START_TIMEOUT))? {
            return Err(CellError::NotMade("no answer from the shell's init".into()));
        }
        match control::recv_json::<ShellEvent>(control) {
            Ok(Some((ShellEvent::Started { cell, .. }, mut fds))) if cell == req.cell => {
                let pidfd = fds
                    .pop()
                    .ok_or_else(|| CellError::NotMade("no pidfd with the cell".into()))?;
                let Some(pid) = pidfd_pid(pidfd.as_fd()) else {
                    // It failed at once (a setup error): its report on its channel says why.
                    return Err(CellError::NotMade(early_failure(host_end.as_fd())));
                };
                let upper = if req.send_upper {
                    Some(receive_upper(host_end.as_fd())?)
                } else {
                    None
                };
                Ok(CellRun {
                    cell,
                    pid,
                    pidfd,
                    channel: Some(host_end),
                    upper,
                })
            }
            Ok(Some((ShellEvent::Failed { message, .. }, _))) => Err(CellError::NotMade(message)),
            Ok(Some((other, _))) => Err(CellError::NotMade(format!(
                "unexpected answer from the shell's init: {other:?}"
            ))),
            Ok(None) | Err(_) => Err(CellError::ShellGone),
        }
    }

    /// The cell's writable layer (`O_PATH`; read it at `/proc/self/fd/N`), once, when its
    /// request asked for it. The fd keeps the tmpfs holding it after the cell is gone.
    pub fn take_upper(&mut self) -> Option<OwnedFd> {
        self.upper.take()
    }

    /// The host's end of the cell's channel: readable when the result (or, for a long-lived
    /// cell, an event) is there, or the cell's PID 1 is gone.
    pub fn channel(&self) -> Option<BorrowedFd<'_>> {
        self.channel.as_ref().map(|c| c.as_fd())
    }

    /// Takes the channel and the pidfd (a long-lived cell's: the caller speaks the
    /// persistent dialect on the channel); the cell ends when that channel is closed.
    pub fn into_parts(self) -> (Option<OwnedFd>, OwnedFd) {
        (self.channel, self.pidfd)
    }

    /// Reads the cell's result; `None` if its PID 1 died without one (killed).
    pub fn result(&self) -> Option<InitResult> {
        let channel = self.channel.as_ref()?;
        match control::recv_json::<InitResult>(channel.as_fd()) {
            Ok(Some((r, _))) => Some(r),
            _ => None,
        }
    }

    /// Lets the cell end: its PID 1, which waits (bounded) for this after reporting, exits,
    /// and the kernel tears the cell down.
    pub fn let_go(&mut self) {
        self.channel = None;
    }

    /// The cell's pidfd (readable once its PID 1 has exited).
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// Sends `signal` to the cell's PID 1 (which forwards it to the command's group).
    pub fn signal(&self, signal: i32) {
        pidfd_signal(self.pidfd.as_fd(), signal);
    }

    /// Kills the cell: its PID 1 dies, and every process of its pid namespace with it.
    pub fn kill(&self) {
        self.signal(libc::SIGKILL);
    }
}

/// Why a cell that is gone before it was seen running failed: the error its PID 1 reported on
/// its channel (without the "cannot make the cell: " it starts with), if it did.
fn early_failure(channel: BorrowedFd<'_>) -> String {
    let report = control::wait_readable(channel, Some(EARLY_REPORT_WAIT))
        .ok()
        .filter(|readable| *readable)
        .and_then(|_| control::recv_json::<InitResult>(channel).ok().flatten())
        .and_then(|(r, _)| r.error);
    match report {
        Some(e) => e
            .strip_prefix("cannot make the cell: ")
            .map(str::to_owned)
            .unwrap_or(e),
        None => "the cell is gone already".into(),
    }
}

/// How long [`early_failure`] waits for the report of a cell already gone (it is written
/// before the cell's PID 1 exits: normally there at once).
const EARLY_REPORT_WAIT: Duration = Duration::from_millis(200);

/// The cell's first message when asked for its writable layer: the upper directory's fd
/// (else why it failed: its early report).
fn receive_upper(channel: BorrowedFd<'_>) -> Result<OwnedFd, CellError> {
    let none = || CellError::NotMade("the cell sent no writable layer".into());
    if !control::wait_readable(channel, Some(START_TIMEOUT))? {
        return Err(none());
    }
    match control::recv_json::<control::CellUpper>(channel) {
        Ok(Some((_, mut fds))) => fds.pop().ok_or_else(none),
        _ => Err(none()),
    }
}

/// Sends `signal` through a pidfd.
pub fn pidfd_signal(pidfd: BorrowedFd<'_>, signal: i32) {
    // SAFETY: pidfd_send_signal(pidfd, sig, NULL, 0) on a pidfd we hold.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// Whether the process of a pidfd still exists (running, or exited and not yet reaped: its
/// pid is not free for reuse either way): `pidfd_send_signal` with signal 0.
pub fn pidfd_exists(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: pidfd_send_signal(pidfd, 0, NULL, 0) on a pidfd we hold: checks only.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0
}

/// The pid (in our pid namespace) a pidfd refers to, from its fdinfo; `None` once it exited.
pub fn pidfd_pid(pidfd: BorrowedFd<'_>) -> Option<i32> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|p| *p > 0)
}

/// How a cell ended, as its shell's init saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellEnd {
    /// Reaped; `changed` says what of the shell a run changed, if anything.
    Ended { changed: Option<String> },
    /// Not reported within the time given.
    Late,
}

/// Waits (at most `timeout`) for the shell's init to report that cell `cell` has ended (its
/// PID 1 reaped, its namespaces torn down). An error: the shell's init is gone or said
/// something else (it is in doubt).
pub fn await_end(
    control: BorrowedFd<'_>,
    cell: u64,
    timeout: Duration,
) -> Result<CellEnd, CellError> {
    if !control::wait_readable(control, Some(timeout))? {
        return Ok(CellEnd::Late);
    }
    match control::recv_json::<ShellEvent>(control) {
        Ok(Some((
            ShellEvent::Ended {
                cell: c, changed, ..
            },
            _,
        ))) if c == cell => Ok(CellEnd::Ended { changed }),
        Ok(Some((other, _))) => Err(CellError::NotMade(format!(
            "unexpected message from the shell's init: {other:?}"
        ))),
        Ok(None) | Err(_) => Err(CellError::ShellGone),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_cell_gone_at_once_is_explained_by_its_report() {
        let (host, cell) = control::seqpacket_pair().unwrap();
        let report = InitResult {
            exit_code: crate::exit::EXIT_SETUP_FAILED,
            error: Some("cannot make the cell: landlock: /tmp is a symlink".into()),
            ..Default::default()
        };
        control::send_json(cell.as_fd(), &report, &[]).unwrap();
        drop(cell);
        assert_eq!(early_failure(host.as_fd()), "landlock: /tmp is a symlink");
        // No report at all (killed before it could write one).
        let (host, cell) = control::seqpacket_pair().unwrap();
        drop(cell);
        assert_eq!(early_failure(host.as_fd()), "the cell is gone already");
    }

    #[test]
    fn workspace_comes_first_and_rules_cover_mounts() {
        let ro = UserMount {
            source: "/etc".into(),
            target: "/data".into(),
            writable: false,
        };
        let all = user_mounts(Some(Path::new("/tmp")), std::slice::from_ref(&ro));
        assert_eq!(all[0].target, Path::new("/workspace"));
        assert_eq!(all[1], ro);
        let p = Profile::builtin("default").unwrap();
        let rules = cell_rules(&p, &all);
        assert!(rules.readable.contains(&PathBuf::from("/data")));
        assert!(!rules.writable.contains(&PathBuf::from("/data")));
    }
}
