//! A shell's init: PID 1 of a shell, making a cell per request (see [`crate::inside::cell`]).
//!
//! A shell is the expensive part of a sandbox, made by libcontainer: user namespace and id
//! mapping, network namespace (only `lo`), uts, cgroup, the image's layers under an overlay,
//! `/proc`, `/dev`, `/sys`, image binds, masked paths, the egress socket's directory. Its
//! init does not run commands itself; it keeps what making cells needs, for its whole life:
//! CAP_SYS_ADMIN in the shell's user namespace (mounts, `pivot_root`, new pid/mount/ipc
//! namespaces) and CAP_SETPCAP (a cell drops its bounding set). So it must be out of every
//! cell's reach, and is:
//! - it is not in any cell's pid namespace (a cell is a *child* pid namespace of the shell's;
//!   the cell's processes cannot name it: no signals, no ptrace, no `/proc` entry), and no fd
//!   of it is inherited by a cell (a cell closes everything but its request's fds first);
//! - it is non-dumpable, dies with its creator (PDEATHSIG), has dropped CAP_NET_ADMIN (lo is
//!   up) and every capability it does not need, bounding set included;
//! - it runs under its own seccomp filter ([`shell_filter`]). A filter is inherited by the
//!   cells it clones and cannot be lifted there, so it cannot be an allowlist narrower than
//!   what a command may do: it is the run's deny list less exactly what making a cell needs
//!   (`mount`, `umount2`, `pivot_root`, `move_mount`, and `clone` with CLONE_NEWNS,
//!   CLONE_NEWPID or CLONE_NEWIPC); new user, network, uts, cgroup and time namespaces,
//!   `unshare`, `setns`, `open_tree`/`fsopen`/`fsmount`/`mount_setattr`, ptrace, bpf, keyctl,
//!   module loading and the rest of the run's deny list stay denied to it as well. A cell
//!   adds the run's full filter on top before anything of the run executes;
//! - it is not Landlock-restricted (Landlock forbids mounts and `pivot_root`), and runs no
//!   network code: a cell's egress relay runs in the cell, as confined as the command
//!   ([`crate::inside::cell`]), and the shell's network namespace has nothing but `lo`;
//! - it is single-threaded and does little: receive a request, clone, report, reap.
//!
//! Cells are cloned ahead of their runs: when the host asks ([`ShellRequest::Prepare`], which
//! the pool does each time the shell goes back to its pool), the init clones a *spare* cell
//! that builds its root (tmpfs, overlay, `/proc`, `/dev`, `pivot_root`) while the shell is idle
//! and then waits on a channel of its own. A run's request is handed to the spare as it came
//! (message and fds); the spare attaches the run's mounts, confines itself and runs it, so a
//! run's wait for its cell is the hand-over and the confinement, not the namespaces and
//! mounts. A spare is made after the previous cell has ended and the host has judged the
//! shell, so nothing of a run is in it; a request of another writable-layer size than the
//! spare's, or one that finds no spare (the cold path, a spare that died), has a cell cloned
//! for it then, the same way.
//!
//! Its protocol is in [`crate::control`]. Every cell is a clone of the init, so the init keeps
//! nothing of a run: of a run's request it parses only the cell's id and size, and zeroes the
//! message once it has handed it on. When the host closes the channel, it exits, which kills
//! every cell (they are in child pid namespaces of the shell's).
//!
//! [`ShellRequest`]: crate::control::ShellRequest
//! [`ShellRequest::Prepare`]: crate::control::ShellRequest::Prepare

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompOperator};

use crate::confine::seccomp::{self, SeccompError};
use crate::control::{self, ShellEvent};
use crate::error::RuntimeError;
use crate::exit::EXIT_SETUP_FAILED;
use crate::inside::cell::{self, CellTemplate};
use crate::inside::kernel::{Host, Kernel};
use crate::inside::reaper;
use crate::inside::zygote::Zygote;

/// Syscalls of the run's deny list that making a cell needs (allowed to the shell's init,
/// still denied in every cell by the run's own filter).
const CELL_MAKING: &[&str] = &["mount", "umount", "umount2", "pivot_root", "move_mount"];

/// The namespaces a cell gets; `clone` with these is allowed to the shell's init.
const CELL_NAMESPACES: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWIPC as u64,
];

/// The shell's init's seccomp filter, as an OCI section (see the module doc): the run's
/// profile for `denied` and `sockets` less what making a cell needs; with `zygote`, less
/// `setns` too (a Python zygote's child enters its cell's namespaces, see [`crate::inside::zygote`];
/// every cell's own filter denies it again).
pub fn shell_filter(
    denied: &[&str],
    sockets: &agentrun_policy::SocketPolicy,
    zygote: bool,
) -> Result<LinuxSeccomp, SeccompError> {
    let kept: Vec<&str> = denied
        .iter()
        .copied()
        .filter(|n| !(CELL_MAKING.contains(n) || (zygote && *n == "setns")))
        .collect();
    let mut section = seccomp::default_profile(&kept, sockets)?;
    if let Some(rules) = section.syscalls().clone() {
        let rules = rules
            .into_iter()
            .filter(|r| {
                let clone_of_cell_ns = r.names() == &["clone".to_string()]
                    && r.args().as_ref().is_some_and(|args| {
                        args.iter().any(|a| {
                            a.op() == LinuxSeccompOperator::ScmpCmpMaskedEq
                                && CELL_NAMESPACES.contains(&a.value())
                        })
                    });
                !clone_of_cell_ns
            })
            .collect();
        section.set_syscalls(Some(rules));
    }
    Ok(section)
}

/// What a shell's init is given (by [`crate::inside::executor`]).
pub(crate) struct ShellInit {
    pub template: CellTemplate,
    /// The shell's own filter, compiled ([`shell_filter`]).
    pub shell_filters: Vec<seccompiler::BpfProgram>,
    /// What of the shell a cell must not change.
    pub watch: ShellWatch,
}

/// The shell's scratch directory for cells: `/tmp` when the image has it as a directory (the
/// cell's overlay then shows the image's own `/tmp` under its tmpfs), else a directory made
/// for it.
pub(crate) fn scratch_dir() -> std::io::Result<PathBuf> {
    let tmp = Path::new("/tmp");
    if std::fs::symlink_metadata(tmp).is_ok_and(|m| m.is_dir()) {
        return Ok(tmp.to_path_buf());
    }
    let own = Path::new("/.agentrun-cell");
    match std::fs::create_dir(own) {
        Ok(()) => Ok(own.to_path_buf()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(own.to_path_buf()),
        Err(e) => Err(e),
    }
}

/// The top-level mounts of the shell's root but `/proc` (from /proc/self/mountinfo): each
/// cell moves them into its own root.
pub(crate) fn top_level_mounts() -> std::io::Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    // "ID PARENT MAJ:MIN ROOT MOUNTPOINT ..."
    let rows: Vec<(u64, u64, String)> = info
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let id = f.next()?.parse().ok()?;
            let parent = f.next()?.parse().ok()?;
            let point = f.nth(2)?;
            Some((id, parent, crate::mounts::rootfs::unescape_mountinfo(point)))
        })
        .collect();
    // The topmost mount on "/" is the root (later lines are mounted later).
    let Some(root) = rows.iter().rev().find(|(_, _, p)| p == "/").map(|r| r.0) else {
        return Err(std::io::Error::other("no root mount in mountinfo"));
    };
    let mut top: Vec<PathBuf> = rows
        .iter()
        .filter(|(id, parent, p)| *parent == root && *id != root && p != "/proc")
        .map(|(_, _, p)| PathBuf::from(p))
        .collect();
    top.dedup();
    Ok(top)
}

/// Unmounts what of the shell's own mount tree every cell covers with its own: the masks and
/// read-only binds under the shell's `/proc` (a cell mounts a `/proc` of its own pid namespace
/// and masks that one) and the shell's `/dev/shm`, `/dev/mqueue` and `/dev/pts` (a cell mounts
/// fresh ones). A cell starts as a copy of the init's mount namespace, so every mount kept
/// here would be copied and torn down again for each run. The bare `/proc` stays: the kernel
/// lets a cell mount a new proc only where one is already fully visible. Nothing of a cell
/// ever sees the shell's `/proc` (a cell pivots away from the shell's root and detaches it).
pub(crate) fn shed_covered_mounts() -> std::io::Result<()> {
    let proc_dir = Path::new("/proc");
    let dev_fresh = ["/dev/shm", "/dev/mqueue", "/dev/pts"].map(Path::new);
    // Deepest first.
    let covered = crate::mounts::rootfs::mounts_under(Path::new("/"))
        .into_iter()
        .filter(|p| (p.starts_with(proc_dir) && p != proc_dir) || dev_fresh.contains(&p.as_path()));
    for point in covered {
        nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH)
            .map_err(|e| std::io::Error::other(format!("unmounting {}: {e}", point.display())))?;
    }
    Ok(())
}

/// Serves cell requests on `control` until the host closes it. Never returns.
pub(crate) fn serve(init: ShellInit, control: OwnedFd) -> ! {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    if reaper::block_all_signals().is_err() {
        std::process::exit(EXIT_SETUP_FAILED);
    }
    let Ok(signals) = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    else {
        std::process::exit(EXIT_SETUP_FAILED);
    };
    // Worked out once here, inherited by every cell.
    // Only for its side effect: the list is computed and cached here, before any cell.
    let _ = crate::inside::spawn::ignored_signals();
    if seccomp::install(&init.shell_filters).is_err() {
        std::process::exit(EXIT_SETUP_FAILED);
    }
    init.watch.settle();
    // Started under the shell's filter, which it inherits, with the first request (a pooled
    // shell's first spare): by then the host has given the init its final priority and CPUs,
    // which the zygote and the runs it forks inherit. A cell finds it ready (its imports done)
    // or not by itself (see `crate::inside::zygote`).
    let mut zygote: Option<Zygote> = None;
    // The profile's zygote, until it is started.
    let mut zygote_to_start = init.template.zygote.as_ref();
    // Cell pid (in the shell's pid namespace) -> the host's id for it.
    let mut cells: HashMap<i32, u64> = HashMap::new();
    let mut spare: Option<Spare> = None;
    loop {
        let Ok((control_ready, signal_ready)) = reaper::wait_either(control.as_fd(), &signals)
        else {
            std::process::exit(EXIT_SETUP_FAILED)
        };
        if signal_ready {
            while let Ok(Some(_)) = signals.read_signal() {}
            while let Some((pid, status, _)) = reaper::reap_one() {
                if zygote.as_ref().is_some_and(|z| z.pid() == pid) {
                    // Started again (bounded); a spare holding the dead one's channel is made
                    // again, so the next run finds the new one.
                    let z = zygote.as_mut().expect("checked");
                    reaper::say_on(2, "the Python zygote ended; starting it again");
                    if !z.restart() {
                        zygote = None;
                    }
                    if let Some(old) = spare.take() {
                        let link = zygote.as_ref().map(Zygote::link);
                        spare = Spare::make(&init.template, old.tmpfs_bytes, link, false).ok();
                    }
                    continue;
                }
                if spare.as_ref().is_some_and(|s| s.pid == pid) {
                    // The spare died before a run took it: the next one makes another.
                    spare = None;
                }
                if let Some(cell) = cells.remove(&pid) {
                    let (code, _) = reaper::decode_status(status);
                    let changed = init.watch.changes();
                    let ev = ShellEvent::Ended {
                        cell,
                        code,
                        changed,
                    };
                    // Dropped: a failed send means the host is gone; the next recv sees EOF and the shell
                    // exits.
                    let _ = control::send_json(control.as_fd(), &ev, &[]);
                }
            }
        }
        if control_ready {
            let (bytes, fds) = match control::recv(control.as_fd()) {
                Ok(Some(m)) => m,
                // The host closed the channel: the shell is over. Exiting PID 1 kills every
                // cell.
                Ok(None) | Err(_) => std::process::exit(0),
            };
            // Only what the init needs is parsed (the rest of a run's request, its argv,
            // environment and paths, is skipped in place, never copied), and the message is
            // zeroed once handed on: every later cell is a clone of this process, so nothing
            // of a run may stay in its memory.
            let bytes = zeroize::Zeroizing::new(bytes);
            let view = serde_json::from_slice::<InitView>(&bytes);
            // The zygote starts with a spare (Prepare) the host asks it for, or a long-lived
            // cell: a shell made for one run (a pool miss) would pay its imports (~1 s of CPU
            // for numpy, pandas and matplotlib) for nothing: its run is exec'd before they
            // end; and one that stays in the pool after that starts it only once a run asked
            // for it (see `ShellRequest::Prepare`).
            let wants_zygote = match &view {
                Ok(InitView::Prepare { start_zygote, .. }) => *start_zygote,
                Ok(InitView::Cell(c)) => matches!(c.work, WorkView::Live),
                Err(_) => false,
            };
            if wants_zygote {
                if let Some(config) = zygote_to_start.take() {
                    zygote = Zygote::start(
                        config,
                        &init.template.run_filters,
                        &init.template.command_caps,
                    )
                    .map_err(|e| reaper::say_on(2, &format!("no Python zygote in this shell: {e}")))
                    .ok();
                }
            }
            let req = match view {
                Ok(InitView::Cell(r)) => r,
                Ok(InitView::Prepare {
                    tmpfs_bytes,
                    zygote_ahead,
                    ..
                }) => {
                    if !spare.as_ref().is_some_and(|s| s.fits(&Host, tmpfs_bytes)) {
                        // An unwanted spare ends when its channel closes.
                        let link = zygote.as_ref().map(Zygote::link);
                        spare = Spare::make(&init.template, tmpfs_bytes, link, zygote_ahead).ok();
                    }
                    continue;
                }
                Err(e) => {
                    // The error's kind and place, not serde's text (which may quote the input).
                    let ev = ShellEvent::Failed {
                        cell: 0,
                        message: format!(
                            "bad cell request: {:?} error at line {} column {}",
                            e.classify(),
                            e.line(),
                            e.column()
                        ),
                    };
                    // Dropped: as above, the host is gone and the shell ends on EOF.
                    let _ = control::send_json(control.as_fd(), &ev, &[]);
                    continue;
                }
            };
            let id = req.cell;
            // A cell with layers of its own is cloned with them (their fds are the
            // request's last; the cell builds its overlay over them before anything else).
            // Else the spare if it fits and lives, else one cloned now.
            let mut fds = fds;
            let layers = if req.layers > 0 && req.layers <= fds.len() {
                fds.split_off(fds.len() - req.layers)
            } else {
                Vec::new()
            };
            let choice = choose(
                &Host,
                req.layers,
                layers.len(),
                fds.len(),
                req.tmpfs_bytes,
                &mut spare,
            );
            let cell = match choice {
                Choice::Refused(e) => Err(e),
                Choice::Over => {
                    let raw: Vec<RawFd> = layers.iter().map(|f| f.as_raw_fd()).collect();
                    Spare::make_over(
                        &init.template,
                        req.tmpfs_bytes,
                        zygote.as_ref().map(Zygote::link),
                        &raw,
                        false,
                    )
                }
                Choice::Spare(s) => Ok(s),
                Choice::New => Spare::make(
                    &init.template,
                    req.tmpfs_bytes,
                    zygote.as_ref().map(Zygote::link),
                    false,
                ),
            };
            // The cell has its own copies of the layers' fds (cloned with them).
            drop(layers);
            match cell {
                Ok(cell) => {
                    // Started before the request is handed on: a cell that fails at once
                    // (a mount it cannot attach) must not be gone before the host sees it.
                    cells.insert(cell.pid, id);
                    let ev = ShellEvent::Started {
                        cell: id,
                        pid: cell.pid,
                    };
                    // Dropped: as above, the host is gone and the shell ends on EOF.
                    let _ = control::send_json(control.as_fd(), &ev, &[cell.pidfd.as_raw_fd()]);
                    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
                    // Should it fail, the cell's channel closes with `fds` unread: the host
                    // gets no result and discards the shell.
                    let _ = cell.hand(&bytes, &raw);
                }
                Err(e) => {
                    let ev = ShellEvent::Failed {
                        cell: id,
                        message: e.to_string(),
                    };
                    // Dropped: as above, the host is gone and the shell ends on EOF.
                    let _ = control::send_json(control.as_fd(), &ev, &[]);
                }
            }
        }
    }
}

/// What the init reads of a [`ShellRequest`]: the cell's id and writable-layer size. Every
/// other field is skipped without being copied out of the message (serde's `IgnoredAny`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum InitView {
    Cell(CellView),
    Prepare {
        tmpfs_bytes: u64,
        #[serde(default)]
        zygote_ahead: bool,
        #[serde(default)]
        start_zygote: bool,
    },
}

#[derive(serde::Deserialize)]
struct CellView {
    cell: u64,
    tmpfs_bytes: u64,
    /// One run or a long-lived cell (the run's command is skipped, not copied).
    work: WorkView,
    /// Read-only layers over the shell's root (the request's last fds): the cell is cloned
    /// with them (a spare's root is built without).
    #[serde(default)]
    layers: usize,
}

/// What a cell is for, as the init reads it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum WorkView {
    Run(serde::de::IgnoredAny),
    Live,
}

/// A cell cloned ahead of its run, building its root while the shell is idle
/// ([`cell::prepare`]); a run's request is handed to it on its channel.
struct Spare {
    pid: i32,
    pidfd: OwnedFd,
    /// The init's end of the spare's channel (closing it ends an unused spare).
    channel: OwnedFd,
    tmpfs_bytes: u64,
}

/// Which cell a request gets.
enum Choice {
    /// None: its layers' fds do not match the count it gives.
    Refused(NoCell),
    /// One cloned now over its layers (the spare, built before any request, has none).
    Over,
    /// The spare: it fits and runs.
    Spare(Spare),
    /// One cloned now.
    New,
}

/// The init's choice of a cell for a request that says it has `wanted_layers` layers, came
/// with `layer_fds` of them (split from its `fds` fds) and wants a writable layer of
/// `tmpfs_bytes`. The spare is taken unless the request has layers; a spare that does not
/// fit is dropped (it ends when its channel closes).
fn choose(
    k: &impl Kernel,
    wanted_layers: usize,
    layer_fds: usize,
    fds: usize,
    tmpfs_bytes: u64,
    spare: &mut Option<Spare>,
) -> Choice {
    if wanted_layers > 0 && layer_fds != wanted_layers {
        return Choice::Refused(NoCell::LayerFds {
            wanted: wanted_layers,
            fds,
        });
    }
    if layer_fds > 0 {
        return Choice::Over;
    }
    match spare.take().filter(|s| s.fits(k, tmpfs_bytes)) {
        Some(s) => Choice::Spare(s),
        None => Choice::New,
    }
}

/// Why the init could not make a cell for a request (the host is told, and fails the run).
#[derive(Debug, thiserror::Error)]
enum NoCell {
    #[error("{0}")]
    Channel(RuntimeError),
    #[error("clone: {}", .0.desc().to_lowercase())]
    Clone(nix::Error),
    #[error("a cell request with {wanted} layers came with {fds} fds")]
    LayerFds { wanted: usize, fds: usize },
}

impl Spare {
    /// Clones a spare cell with a writable layer of `tmpfs_bytes` (keeping the zygote's
    /// `link` fds, if any; `zygote_ahead`: the cell has the zygote fork its run's process
    /// as soon as its root is built, see [`cell::prepare`]).
    fn make(
        template: &CellTemplate,
        tmpfs_bytes: u64,
        link: Option<(RawFd, RawFd)>,
        zygote_ahead: bool,
    ) -> Result<Spare, NoCell> {
        Spare::make_over(template, tmpfs_bytes, link, &[], zygote_ahead)
    }

    /// [`Spare::make`] of a cell whose overlay has `layers` (detached mounts, top first)
    /// between its writable layer and the shell's root.
    fn make_over(
        template: &CellTemplate,
        tmpfs_bytes: u64,
        link: Option<(RawFd, RawFd)>,
        layers: &[RawFd],
        zygote_ahead: bool,
    ) -> Result<Spare, NoCell> {
        let (ours, theirs) = control::seqpacket_pair().map_err(NoCell::Channel)?;
        match clone_cell() {
            Ok(Cloned::Child) => {
                // The cell's PID 1. Nothing here returns; a panic must not unwind into the
                // copy of the shell's loop. `ours` is closed with every other fd of the init.
                std::mem::forget(ours);
                let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    cell::prepare(template, tmpfs_bytes, theirs, link, layers, zygote_ahead)
                }));
                // The cell's PID 1 never returns from prepare; a panic (Err) exits like a failure.
                let _ = prepared;
                reaper::exit_now(EXIT_SETUP_FAILED)
            }
            Ok(Cloned::Parent { pid, pidfd }) => Ok(Spare {
                pid,
                pidfd,
                channel: ours,
                tmpfs_bytes,
            }),
            Err(e) => Err(NoCell::Clone(e)),
        }
    }

    /// Whether it can take a run with a writable layer of `tmpfs_bytes`: that size, and
    /// still running.
    fn fits(&self, k: &impl Kernel, tmpfs_bytes: u64) -> bool {
        self.tmpfs_bytes == tmpfs_bytes && !k.exited(self.pidfd.as_fd())
    }

    /// Hands a run's request (the host's message and fds, as they came) to the spare, which
    /// becomes that run's cell.
    fn hand(self, request: &[u8], fds: &[i32]) -> Result<(), RuntimeError> {
        control::send(self.channel.as_fd(), request, fds)
    }
}

/// Watches what a run could change of the shell if it were not denied (it is: no cell has
/// CAP_NET_ADMIN or CAP_SYS_ADMIN, nor a way to get them): the hostname and domain name, and
/// the network namespace's links, addresses, routes and nftables rules, through netlink
/// notifications (the kernel sends one for every change; reading none costs a syscall).
pub(crate) struct ShellWatch {
    uts: Option<(String, String)>,
    /// Netlink sockets subscribed to change notifications (rtnetlink: links, IPv4 and IPv6
    /// addresses and routes; nfnetlink: nftables), opened while the init could.
    netlink: Vec<OwnedFd>,
}

impl ShellWatch {
    /// Starts watching (needs CAP_NET_ADMIN for nftables; what cannot be watched is not).
    pub(crate) fn start() -> ShellWatch {
        let groups = [
            (
                libc::NETLINK_ROUTE,
                (libc::RTMGRP_LINK
                    | libc::RTMGRP_IPV4_IFADDR
                    | libc::RTMGRP_IPV6_IFADDR
                    | libc::RTMGRP_IPV4_ROUTE
                    | libc::RTMGRP_IPV6_ROUTE) as u32,
            ),
            // NFNLGRP_NFTABLES = 7: bit 6.
            (libc::NETLINK_NETFILTER, 1 << 6),
        ];
        let netlink = groups
            .into_iter()
            .filter_map(|(proto, groups)| subscribe(proto, groups))
            .collect();
        ShellWatch {
            uts: uts(),
            netlink,
        }
    }

    /// Drops notifications of what happened so far (the shell's own setup).
    pub(crate) fn settle(&self) {
        // Only for its side effect: reading the notifications drains them.
        let _ = self.changes();
    }

    /// What changed since the last call, if anything, in one line.
    pub(crate) fn changes(&self) -> Option<String> {
        let mut what = Vec::new();
        if uts() != self.uts {
            what.push("hostname".to_string());
        }
        let mut buf = [0u8; 8192];
        for fd in &self.netlink {
            loop {
                let flags = nix::sys::socket::MsgFlags::MSG_DONTWAIT;
                match nix::sys::socket::recv(fd.as_raw_fd(), &mut buf, flags) {
                    Ok(n) if n > 0 => {}
                    _ => break,
                }
                let kind = u16::from_ne_bytes([buf[4], buf[5]]);
                let name = match kind {
                    16..=19 => "links",                 // RTM_NEWLINK..RTM_SETLINK
                    20..=22 => "addresses",             // RTM_NEWADDR..RTM_GETADDR
                    24..=26 => "routes",                // RTM_NEWROUTE..RTM_GETROUTE
                    _ if kind >> 8 == 10 => "nftables", // NFNL_SUBSYS_NFTABLES
                    _ => "network settings",
                };
                if !what.iter().any(|w| w == name) {
                    what.push(name.to_string());
                }
            }
        }
        (!what.is_empty()).then(|| format!("the shell's {} changed", what.join(", ")))
    }
}

fn uts() -> Option<(String, String)> {
    nix::sys::utsname::uname().ok().map(|u| {
        (
            u.nodename().to_string_lossy().into_owned(),
            u.domainname().to_string_lossy().into_owned(),
        )
    })
}

/// A netlink socket of `proto` subscribed to `groups` (non-blocking); `None` if not allowed.
fn subscribe(proto: libc::c_int, groups: u32) -> Option<OwnedFd> {
    // SAFETY: socket(2); the fd is owned right below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            proto,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh fd nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain old data; zeroed is valid.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr.nl_groups = groups;
    // SAFETY: bind with a properly sized sockaddr_nl.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    (rc == 0).then_some(sock)
}

enum Cloned {
    Child,
    Parent { pid: i32, pidfd: OwnedFd },
}

/// `clone(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_PIDFD)`, fork-like (the child gets
/// a copy of the address space). The shell's init is single-threaded, so no lock can be held
/// by another thread at that moment.
fn clone_cell() -> nix::Result<Cloned> {
    let flags = libc::CLONE_NEWPID
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWIPC
        | libc::CLONE_PIDFD
        | libc::SIGCHLD;
    let mut pidfd: libc::c_int = -1;
    // SAFETY: a fork-like clone (no new stack, no CLONE_VM) of a single-threaded process;
    // CLONE_PIDFD stores the pidfd through the parent_tid pointer, valid for the call. The
    // argument order (flags, stack, parent_tid, ...) is the same on x86_64 and aarch64 for
    // the three used here.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong,
            0usize,
            &mut pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    match pid {
        p if p < 0 => Err(nix::Error::last()),
        0 => Ok(Cloned::Child),
        p => Ok(Cloned::Parent {
            pid: p as i32,
            // SAFETY: the kernel installed this pidfd for us (CLONE_PIDFD); nobody else owns it.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inside::kernel::Recorder;

    fn spare(tmpfs_bytes: u64) -> Spare {
        let fd = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        Spare {
            pid: 42,
            pidfd: fd(),
            channel: fd(),
            tmpfs_bytes,
        }
    }

    const MB: u64 = 1 << 20;

    #[test]
    fn a_request_takes_the_spare_when_it_fits_and_runs() {
        let k = Recorder::default();
        let mut slot = Some(spare(64 * MB));
        let choice = choose(&k, 0, 0, 4, 64 * MB, &mut slot);
        assert!(matches!(choice, Choice::Spare(ref s) if s.pid == 42));
        assert!(slot.is_none());
    }

    #[test]
    fn a_spare_that_exited_or_has_another_size_is_dropped_for_a_new_cell() {
        let dead = spare(64 * MB);
        let k = Recorder {
            exited: vec![dead.pidfd.as_raw_fd()],
            ..Default::default()
        };
        let mut slot = Some(dead);
        assert!(matches!(
            choose(&k, 0, 0, 4, 64 * MB, &mut slot),
            Choice::New
        ));
        assert!(slot.is_none(), "the dead spare is let go");

        let k = Recorder::default();
        let mut slot = Some(spare(64 * MB));
        assert!(matches!(
            choose(&k, 0, 0, 4, 128 * MB, &mut slot),
            Choice::New
        ));
        assert!(slot.is_none(), "the spare of another size is let go");

        assert!(matches!(
            choose(&k, 0, 0, 4, 64 * MB, &mut None),
            Choice::New
        ));
    }

    #[test]
    fn a_request_with_layers_gets_a_cell_over_them_and_the_spare_stays() {
        let k = Recorder::default();
        let mut slot = Some(spare(64 * MB));
        assert!(matches!(
            choose(&k, 2, 2, 4, 64 * MB, &mut slot),
            Choice::Over
        ));
        assert!(slot.is_some());
    }

    #[test]
    fn a_request_whose_layer_fds_are_missing_is_refused() {
        let k = Recorder::default();
        let mut slot = Some(spare(64 * MB));
        let Choice::Refused(e) = choose(&k, 3, 0, 2, 64 * MB, &mut slot) else {
            panic!("a request short of its layers' fds got a cell");
        };
        assert_eq!(
            e.to_string(),
            "a cell request with 3 layers came with 2 fds"
        );
        assert!(slot.is_some(), "the spare is kept for the next request");
    }

    #[test]
    fn the_init_reads_only_a_requests_cell_id_and_size() {
        use crate::control::{CellCommand, CellRequest, CellWork, PathRules, ShellRequest};
        let req = ShellRequest::Cell(CellRequest {
            cell: 7,
            tmpfs_bytes: 1 << 20,
            limits: crate::confine::limits::Rlimits {
                nofile: 64,
                nproc: 32,
            },
            rlimits: Default::default(),
            landlock: Some(PathRules {
                readable: vec!["/".into()],
                writable: vec!["/tmp/\"secret\"".into()],
            }),
            mounts: Vec::new(),
            egress_port: Some(3128),
            work: CellWork::Run(CellCommand {
                argv: vec!["python3".into(), "-c".into(), "k = 'sk-\\n\\u00e9'".into()],
                env: vec!["OPENAI_API_KEY=sk-secret".into()],
                cwd: "/workspace".into(),
                zygote: true,
            }),
            layers: 2,
            send_upper: false,
        });
        let bytes = serde_json::to_vec(&req).unwrap();
        match serde_json::from_slice::<InitView>(&bytes).unwrap() {
            InitView::Cell(c) => {
                assert_eq!((c.cell, c.tmpfs_bytes, c.layers), (7, 1 << 20, 2));
                assert!(matches!(c.work, WorkView::Run(_)));
            }
            InitView::Prepare { .. } => panic!("a cell request read as a prepare"),
        }
        let live = ShellRequest::Cell(CellRequest {
            work: CellWork::Live,
            ..match req {
                ShellRequest::Cell(r) => r,
                ShellRequest::Prepare { .. } => unreachable!(),
            }
        });
        match serde_json::from_slice::<InitView>(&serde_json::to_vec(&live).unwrap()).unwrap() {
            InitView::Cell(c) => assert!(matches!(c.work, WorkView::Live)),
            InitView::Prepare { .. } => panic!("a cell request read as a prepare"),
        }
        for (ahead, start) in [(false, false), (true, false), (false, true), (true, true)] {
            let prepare = serde_json::to_vec(&ShellRequest::Prepare {
                tmpfs_bytes: 5,
                zygote_ahead: ahead,
                start_zygote: start,
            })
            .unwrap();
            assert!(matches!(
                serde_json::from_slice::<InitView>(&prepare).unwrap(),
                InitView::Prepare { tmpfs_bytes: 5, zygote_ahead, start_zygote }
                    if zygote_ahead == ahead && start_zygote == start
            ));
        }
    }

    #[test]
    fn the_shell_filter_allows_cell_making_and_nothing_more() {
        let denied = agentrun_policy::seccomp_denied_syscalls();
        let section = shell_filter(denied, &Default::default(), false).unwrap();
        let rules = section.syscalls().clone().unwrap();
        let names: Vec<&String> = rules.iter().flat_map(|r| r.names()).collect();
        for n in CELL_MAKING {
            assert!(!names.iter().any(|x| x == n), "{n} must be allowed");
        }
        for n in [
            "unshare",
            "setns",
            "ptrace",
            "bpf",
            "open_tree",
            "mount_setattr",
            "fsopen",
        ] {
            assert!(names.iter().any(|x| *x == n), "{n} must stay denied");
        }
        // clone: new user/net/uts/cgroup/time namespaces denied, the cell's allowed.
        let clone_flags: Vec<u64> = rules
            .iter()
            .filter(|r| r.names() == &["clone".to_string()])
            .flat_map(|r| r.args().clone().unwrap_or_default())
            .map(|a| a.value())
            .collect();
        for f in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
        ] {
            assert!(
                clone_flags.contains(&(f as u64)),
                "clone flag {f:#x} must stay denied"
            );
        }
        for f in CELL_NAMESPACES {
            assert!(
                !clone_flags.contains(f),
                "clone flag {f:#x} must be allowed"
            );
        }
        assert!(!seccomp::compile(&section).unwrap().is_empty());
    }

    #[test]
    fn a_zygote_shell_also_allows_setns_and_its_cells_deny_it_again() {
        let denied = agentrun_policy::seccomp_denied_syscalls();
        let sockets = Default::default();
        let names = |s: &LinuxSeccomp| -> Vec<String> {
            s.syscalls()
                .iter()
                .flatten()
                .flat_map(|r| r.names().clone())
                .collect()
        };
        let plain = shell_filter(denied, &sockets, false).unwrap();
        let zygote = shell_filter(denied, &sockets, true).unwrap();
        assert!(names(&plain).iter().any(|n| n == "setns"));
        assert!(!names(&zygote).iter().any(|n| n == "setns"));
        for n in ["unshare", "ptrace", "bpf", "open_tree"] {
            assert!(
                names(&zygote).iter().any(|x| x == n),
                "{n} must stay denied"
            );
        }
        // What a cell adds on top of the zygote shell's filter denies setns again.
        let run = seccomp::default_profile(denied, &sockets).unwrap();
        let rest = seccomp::narrowing(&run, &zygote).expect("the run's filter narrows the shell's");
        assert!(names(&rest).iter().any(|n| n == "setns"));
    }
}
