//! A cell: what one run sees, made by a shell's init per request (see [`crate::inside::shell`]).
//!
//! The shell's init clones with new pid, mount and ipc namespaces, usually ahead of the run
//! (a *spare*, made while the shell waits in its pool; see [`crate::inside::shell`]); the child (the
//! cell's PID 1) runs [`prepare`], which does steps 1 and 2 before the run is known, then takes
//! the run's request (with the cell's channel, the run's stdio and its mounts) from the init:
//! 1. keeps only its channel to the init and dies with the shell's init (PDEATHSIG);
//! 2. builds its root: a tmpfs (the run's `tmpfs_size`) over the shell's scratch directory
//!    holding the overlay's upper and work dirs, an overlay with the shell's root as its lower
//!    layer (`userxattr`: whiteouts and opaque dirs as user xattrs on the tmpfs), a `/proc` of
//!    its own pid namespace with the shell's masked and read-only `/proc` paths applied again,
//!    the shell's other top-level mounts moved in (`/dev`, `/sys`, image binds such as the
//!    `host` image's `/usr`, the profile's hidden paths, the egress socket's directory), a
//!    `/dev/shm` that is a directory of the cell's tmpfs (bound: no superblock of its own),
//!    fresh `/dev/mqueue` and `/dev/pts`; `pivot_root`s into it and detaches the shell's root;
//! 3. attaches the run's own mounts: detached mounts made and idmapped on the host, passed as
//!    fds and attached with `move_mount` on a target opened inside the new root
//!    (`openat2(RESOLVE_IN_ROOT)`), never a path the host resolves;
//! 4. confines itself: rlimits, the command's capabilities (bounding set included), Landlock,
//!    the run's seccomp filter (on top of the shell's, which it inherited);
//! 5. becomes the run's PID 1 ([`crate::inside::reaper`]): starts the command, forwards signals, and
//!    writes the result on its channel *before* exiting (the cell's teardown, namespaces and
//!    mounts, happens in its exit, off the host's reply path); or, for a long-lived cell,
//!    serves the persistent dialect on the channel.
//!
//! Everything of the run (files, processes, IPC objects, mounts) is in the cell's own
//! namespaces and writable layer, and goes with them; the next cell of the same shell starts
//! from the shell again.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use caps::Capability;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use seccompiler::BpfProgram;

use crate::confine::landlock::LandlockRules;
use crate::control::{self, CellMount, CellRequest, CellWork, InitResult, ShellRequest};
use crate::exit::EXIT_SETUP_FAILED;
use crate::inside::kernel::{Host, Kernel};
use crate::inside::reaper::{self, Command};
use crate::inside::zygote::{self, CellPlace, Ineligible, Invocation, ZygoteConfig, ZygoteLink};

/// How long a cell's PID 1 waits, after reporting its result, for the host to close the
/// channel before it exits (and the cell is torn down). The host closes it once its client
/// has its answer, so the teardown's kernel work does not compete with the reply.
const LINGER: Duration = Duration::from_millis(200);

/// What every cell of a shell is made from: worked out once by the shell's init.
#[derive(Debug, Clone)]
pub(crate) struct CellTemplate {
    /// Capabilities the command keeps; everything else is dropped, bounding set included.
    pub command_caps: Vec<Capability>,
    /// The host's Landlock ABI.
    pub landlock_abi: u32,
    /// The run's seccomp filter beyond the shell's, which every cell inherits (compiled once,
    /// installed in each cell; see `seccomp::narrowing`).
    pub run_filters: Vec<BpfProgram>,
    /// A directory of the shell's root the cell's tmpfs goes over (it holds the overlay's
    /// upper, work and merged dirs; the overlay's lower layer shows what is under it).
    pub scratch: PathBuf,
    /// The shell's top-level mounts (but `/proc`), moved into every cell's root.
    pub moved: Vec<PathBuf>,
    /// `/proc` paths masked (empty read-only tmpfs over a directory (`true`), `/dev/null`
    /// over a file) and made read-only in each cell's own `/proc`: those this kernel has (the
    /// shell's `/proc` was checked once).
    pub proc_masked: Vec<(PathBuf, bool)>,
    pub proc_readonly: Vec<PathBuf>,
    /// Where the egress proxy's socket is, inside the sandbox.
    pub egress_socket: PathBuf,
    /// The shell's Python zygote, if its profile asks for one ([`crate::inside::zygote`]).
    pub zygote: Option<ZygoteConfig>,
}

/// Why a cell could not be made.
#[derive(Debug)]
struct SetupError(String);

impl SetupError {
    fn sys(what: impl std::fmt::Display, e: nix::Error) -> Self {
        SetupError(format!("{what}: {}", e.desc().to_lowercase()))
    }
}

type Setup<T> = Result<T, SetupError>;

/// A cell's PID 1, right after the shell's init cloned it (ahead of its run, or for a run
/// that came when no spare fitted; see [`crate::inside::shell`]): builds the cell's root for a
/// writable layer of `tmpfs_bytes`, then waits on `channel` for the run's request, which the
/// init hands on as the host sent it (message and fds), and runs it. The init's end of
/// `channel` closing first (the spare is not wanted, or the shell is going) ends it. `zygote`:
/// the fds of the shell's zygote's channel and ready pipe, which the cell keeps;
/// `zygote_ahead`: once its root is built, the cell has the zygote (if ready) fork a child
/// into it for its run ([`zygote::fork_ahead`]), which the run takes if it can be forked and
/// which ends unused otherwise. Never returns.
pub(crate) fn prepare(
    template: &CellTemplate,
    tmpfs_bytes: u64,
    channel: OwnedFd,
    zygote: Option<(RawFd, RawFd)>,
    layers: &[RawFd],
    zygote_ahead: bool,
) -> ! {
    let mut keep = vec![channel.as_raw_fd()];
    keep.extend(zygote.iter().flat_map(|(a, b)| [*a, *b]));
    keep.extend_from_slice(layers);
    keep_only(&keep);
    // SAFETY: the init's fds of the request's layers, copied into this process by the clone;
    // nothing else here owns them.
    let layers: Vec<OwnedFd> = layers
        .iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(*fd) })
        .collect();
    // SAFETY: the init's fds, copied into this process by the clone; nothing else here owns
    // them.
    let link = zygote.map(|fds| unsafe { ZygoteLink::adopt(fds) });
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag on this process: if the shell's init
    // dies, the cell dies with it.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let root = build_root(template, tmpfs_bytes, layers);
    let ahead = match (&root, &link) {
        (Ok(()), Some(link)) if zygote_ahead && template.zygote.is_some() => {
            zygote::fork_ahead(link)
        }
        _ => None,
    };
    let (bytes, fds) = match control::recv(channel.as_fd()) {
        Ok(Some(m)) => m,
        Ok(None) | Err(_) => reaper::exit_now(0),
    };
    drop(channel);
    match serde_json::from_slice::<ShellRequest>(&bytes) {
        Ok(ShellRequest::Cell(req)) if req.tmpfs_bytes == tmpfs_bytes => {
            run(template, root, req, fds, link, ahead)
        }
        Ok(_) => fail_early(
            fds.first().map(|f| f.as_fd()),
            None,
            "a spare cell got a request it was not made for",
        ),
        Err(e) => fail_early(
            fds.first().map(|f| f.as_fd()),
            None,
            &format!("bad cell request: {e}"),
        ),
    }
}

/// The rest of a cell once its root is built (or failed, `root`): the run's mounts,
/// confinement, then the command or the long-lived dialect.
fn run(
    template: &CellTemplate,
    root: Setup<()>,
    req: CellRequest,
    fds: Vec<OwnedFd>,
    link: Option<ZygoteLink>,
    mut ahead: Option<zygote::Ahead>,
) -> ! {
    let fixed = req.fixed_fds();
    if fds.len() != fixed + req.mounts.len() {
        let msg = format!(
            "a cell request needs {} fds ({}), got {}",
            fixed + req.mounts.len(),
            req.fd_order(),
            fds.len()
        );
        fail_early(fds.first().map(|f| f.as_fd()), None, &msg);
    }
    let mut fds = fds.into_iter();
    let channel = fds.next().expect("counted above");
    let stdio: Option<[OwnedFd; 3]> = match req.work {
        CellWork::Run(_) => Some([
            fds.next().expect("counted"),
            fds.next().expect("counted"),
            fds.next().expect("counted"),
        ]),
        CellWork::Live => None,
    };
    let mounts: Vec<(CellMount, OwnedFd)> = req.mounts.iter().cloned().zip(fds).collect();
    let stderr = stdio.as_ref().map(|s| s[2].as_raw_fd());
    let mut plan = None;
    let mut live_plan = None;
    let confined = root
        .and_then(|()| attach_run_mounts(mounts))
        .and_then(|()| {
            // The run's interception CA (its proxy wrote it beside its socket) in the image's
            // system bundles, in this cell's writable layer (agentrun_egress::system_trust).
            let dir = template.egress_socket.parent().unwrap_or(Path::new("/"));
            agentrun_egress::system_trust::install_from_egress_dir(dir)
                .map(drop)
                .map_err(|e| SetupError(format!("the egress CA in the system bundles: {e}")))
        })
        .and_then(|()| {
            // The zygote's way in is opened while the cell's PID 1 still can.
            match &req.work {
                CellWork::Run(cmd) if cmd.zygote => plan = Some(zygote_plan(template, link, cmd)),
                CellWork::Live => live_plan = live_zygote_plan(template, link),
                CellWork::Run(_) => {}
            }
            confine(
                &Host,
                template,
                &req,
                matches!(plan, Some(Ok(_))) || live_plan.is_some(),
            )
        });
    let ruleset = match confined {
        Ok(r) => r,
        Err(SetupError(msg)) => fail_early(
            Some(channel.as_fd()),
            stderr,
            &format!("cannot make the cell: {msg}"),
        ),
    };
    if reaper::block_all_signals().is_err() {
        fail_early(Some(channel.as_fd()), stderr, "cannot block signals");
    }
    if let Some(port) = req.egress_port {
        // Listening before anything runs: the first connection finds the relay up. Its
        // threads inherit the blocked mask, so signals still reach only the PID 1's wait.
        let bridge = crate::inside::net::EgressBridge {
            port,
            socket: template.egress_socket.clone(),
        };
        // A run's relay thread starts with its first connection (most runs make none); a
        // long-lived cell's at once (its wait loop is not the one that hands the wake-up on).
        let started = match req.work {
            CellWork::Run(_) => bridge.listen_lazily(),
            CellWork::Live => bridge.start(),
        };
        if let Err(e) = started {
            let msg = format!("cannot make the cell: egress relay: {e}");
            fail_early(Some(channel.as_fd()), stderr, &msg);
        }
    }
    if req.send_upper {
        // Asked for by a rootless host (see CellRequest::send_upper), before anything runs.
        let sent = control::send_json(
            channel.as_fd(),
            &control::CellUpper { upper: true },
            &[UPPER_FD],
        );
        if sent.is_err() {
            fail_early(
                Some(channel.as_fd()),
                stderr,
                "cannot make the cell: its writable layer cannot be sent",
            );
        }
    }
    match req.work {
        CellWork::Live => {
            // A child forked ahead is for one run: it ends unused.
            if let Some(a) = ahead {
                a.dismiss();
            }
            let zygote = live_plan.map(|(link, place)| zygote::LiveZygote {
                link,
                place,
                ruleset,
                env: template
                    .zygote
                    .as_ref()
                    .map(|z| z.env.clone())
                    .unwrap_or_default(),
                limits: req.limits,
            });
            crate::inside::live::serve_live(channel, zygote)
        }
        CellWork::Run(cmd) => {
            // The command's stdio becomes ours: its spawn inherits it, and our messages about
            // it go to its stderr.
            if let Some(stdio) = &stdio {
                for (n, fd) in stdio.iter().enumerate() {
                    // SAFETY: dup2 onto 0, 1, 2 of fds we own.
                    unsafe { libc::dup2(fd.as_raw_fd(), n as RawFd) };
                }
            }
            let mut took_ahead = false;
            let not_started = matches!(plan, Some(Err(Ineligible::NotRunning)));
            let forked = match (plan, &stdio) {
                (Some(Ok((invocation, place, link))), Some(stdio)) => {
                    let parts = zygote::RunParts {
                        invocation: &invocation,
                        argv: &cmd.argv,
                        env: &cmd.env,
                        cwd: &cmd.cwd,
                        limits: req.limits,
                        stdio,
                        landlock: ruleset.as_ref(),
                    };
                    // The child forked ahead takes the run; gone before it took it (nothing
                    // of the run ran), a fork is asked for as usual.
                    let taken = match ahead.take().map(|a| zygote::start_ahead(a, &place, &parts)) {
                        Some(Ok(child)) => {
                            took_ahead = true;
                            Some(Ok(child))
                        }
                        Some(Err(Some(not))) => Some(Err(not)),
                        Some(Err(None)) | None => None,
                    };
                    Some(taken.unwrap_or_else(|| zygote::fork_run(&link, &place, &parts)))
                }
                (Some(Err(why)), _) => Some(Err(why.into())),
                (Some(Ok(_)), None) | (None, _) => None,
            };
            // Unused (the run is exec'd), the child forked ahead ends before the command
            // starts.
            if let Some(a) = ahead {
                a.dismiss();
            }
            drop(ruleset);
            let result = match forked {
                Some(Ok(child)) => InitResult {
                    zygote_ahead: took_ahead,
                    ..zygote::supervise(child)
                },
                Some(Err(not)) => InitResult {
                    zygote: Some(false),
                    zygote_fallback: Some(not.reason),
                    zygote_fault: not.fault,
                    zygote_not_started: not_started,
                    ..exec_command(cmd, *req.rlimits)
                },
                None => exec_command(cmd, *req.rlimits),
            };
            // Dropped: a failed send means the host is gone; we exit next either way.
            let _ = control::send_json(channel.as_fd(), &result, &[]);
            // Wait (bounded) for the host to take the result and let go: whatever the run
            // left running is killed when we exit.
            let _ = control::wait_readable(channel.as_fd(), Some(LINGER));
            reaper::exit_now(result.exit_code)
        }
    }
}

/// Runs the command the usual way: spawned (the exec) by this PID 1, which waits for it,
/// with `rlimits` set on the command (not on this PID 1, whose address space is the shell
/// init's).
fn exec_command(
    cmd: crate::control::CellCommand,
    rlimits: crate::confine::limits::RlimitFallback,
) -> InitResult {
    match Command::new(cmd.argv, &cmd.env, cmd.cwd, None) {
        Ok(mut cmd) => {
            cmd.rlimits = rlimits;
            reaper::run_to_end(&cmd)
        }
        Err(reaper::BadCommand(msg)) => {
            reaper::say_on(2, &msg);
            InitResult {
                exit_code: EXIT_SETUP_FAILED,
                error: Some(msg),
                ..Default::default()
            }
        }
    }
}

/// Whether the run can go through the shell's zygote, and what the zygote's child needs to
/// enter this cell; else why not.
fn zygote_plan(
    template: &CellTemplate,
    link: Option<ZygoteLink>,
    cmd: &crate::control::CellCommand,
) -> Result<(Invocation, CellPlace, ZygoteLink), Ineligible> {
    let Some(config) = &template.zygote else {
        return Err(Ineligible::NoZygote);
    };
    // Whether the run could use a zygote first: "not running" then says that it could, and
    // the host starts the shell's zygote for the next one (`Prepare`'s `start_zygote`).
    let invocation = zygote::invocation(&cmd.argv, &cmd.env, &config.env)?;
    let Some(link) = link else {
        return Err(Ineligible::NotRunning);
    };
    let place = CellPlace::open().map_err(Ineligible::CellNamespaces)?;
    Ok((invocation, place, link))
}

/// A long-lived cell's hold on the shell's zygote, if it has one (its processes that can be
/// forked are; see [`zygote::LiveZygote`]).
fn live_zygote_plan(
    template: &CellTemplate,
    link: Option<ZygoteLink>,
) -> Option<(ZygoteLink, CellPlace)> {
    template.zygote.as_ref()?;
    let link = link?;
    let place = CellPlace::open().ok()?;
    Some((link, place))
}

/// Reports a cell that could not be made (on its channel and, for a command, its stderr)
/// and exits.
fn fail_early(channel: Option<BorrowedFd<'_>>, stderr: Option<RawFd>, msg: &str) -> ! {
    if let Some(fd) = stderr {
        reaper::say_on(fd, msg);
    }
    if let Some(ch) = channel {
        let result = InitResult {
            exit_code: EXIT_SETUP_FAILED,
            error: Some(msg.to_owned()),
            ..Default::default()
        };
        // Dropped: as above, the host is gone; we exit next either way.
        let _ = control::send_json(ch, &result, &[]);
        // As after a run: the host takes the report and lets go (bounded). A cell failing the
        // moment its request comes (its root was built ahead) is then still there when the
        // host looks at the cell it was told of, and its report reads like any run's.
        let _ = control::wait_readable(ch, Some(LINGER));
    }
    reaper::exit_now(EXIT_SETUP_FAILED)
}

/// Closes every fd but 0, 1, 2 and `keep`: nothing of the shell's init (its control channel
/// above all) stays open in the cell.
fn keep_only(keep: &[RawFd]) {
    let mut raw: Vec<u32> = keep.iter().map(|f| *f as u32).collect();
    raw.sort_unstable();
    let mut next = 3u32;
    for fd in raw {
        if fd > next {
            // SAFETY: close_range on fds of this fresh process that nothing here uses.
            unsafe { crate::inside::close_range(next, fd - 1) };
        }
        next = next.max(fd + 1);
    }
    // SAFETY: as above.
    unsafe { crate::inside::close_range(next, u32::MAX) };
}

fn mnt(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Setup<()> {
    mount(source, target, fstype, flags, data).map_err(|e| {
        SetupError::sys(
            format!(
                "mounting {} on {}",
                fstype.or(source).unwrap_or("it"),
                target.display()
            ),
            e,
        )
    })
}

fn mkdir(p: &Path, mode: u32) -> Setup<()> {
    match nix::unistd::mkdir(p, nix::sys::stat::Mode::from_bits_truncate(mode)) {
        Ok(()) | Err(nix::Error::EEXIST) => Ok(()),
        Err(e) => Err(SetupError::sys(format!("creating {}", p.display()), e)),
    }
}

/// `root` joined with an absolute in-sandbox path.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Builds the cell's root and pivots into it (see the module doc); the run's own mounts are
/// attached afterwards ([`attach_run_mounts`]), so that a spare cell can be built before its
/// run is known.
fn build_root(t: &CellTemplate, tmpfs_bytes: u64, layers: Vec<OwnedFd>) -> Setup<()> {
    let scratch = &t.scratch;
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mnt(
        Some("tmpfs"),
        scratch,
        Some("tmpfs"),
        nosuid_nodev,
        Some(&format!("size={tmpfs_bytes},mode=0755")),
    )?;
    let upper = scratch.join("upper");
    let work = scratch.join("work");
    let root = scratch.join("root");
    mkdir(&upper, 0o755)?;
    mkdir(&work, 0o700)?;
    mkdir(&root, 0o755)?;
    keep_upper(&upper);
    // A fork copy's layers (read-only detached mounts the host made of frozen upper
    // directories, top first) are attached under the scratch tmpfs, where the overlay takes
    // them as its upper lower layers; they leave this mount namespace with the shell's root
    // (the overlay keeps its own private clones). Their whiteouts (0/0 character devices)
    // and opaque directories (`user.overlay.opaque`) read as they did in the upper.
    let mut lowerdir = String::new();
    for (n, layer) in layers.into_iter().enumerate() {
        let at = scratch.join(format!("layer{n}"));
        mkdir(&at, 0o700)?;
        let target = open_path(&at)?;
        crate::mounts::idmap::move_detached(layer.as_fd(), target.as_fd())
            .map_err(|e| SetupError(format!("attaching layer {n}: {e}")))?;
        lowerdir.push_str(&format!("{}:", at.display()));
    }
    lowerdir.push('/');
    // userxattr: the overlay keeps its whiteout/opaque markers as user.overlay.* xattrs,
    // which an unprivileged mounter may set on the tmpfs (trusted.* ones it may not: the
    // kernel would fall back, and log it for every cell). It rules out redirect_dir and
    // metacopy, which a cell does not need.
    mnt(
        Some("overlay"),
        &root,
        Some("overlay"),
        nosuid_nodev,
        Some(&format!(
            "lowerdir={lowerdir},upperdir={},workdir={},userxattr",
            upper.display(),
            work.display()
        )),
    )?;
    // Its own /proc, mounted while the shell's is still in this mount namespace (a new proc
    // mount must not reveal more than one already visible).
    let proc_dir = root.join("proc");
    mnt(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        nosuid_nodev | MsFlags::MS_NOEXEC,
        None,
    )?;
    for m in &t.moved {
        mnt(
            Some(&m.to_string_lossy()),
            &under(&root, m),
            None,
            MsFlags::MS_MOVE,
            None,
        )?;
    }
    mask_proc(t, &root)?;
    let dev = root.join("dev");
    // `/dev/shm`: a directory of the cell's own tmpfs (the writable layer's), bound there: no
    // superblock of its own to make and tear down per cell. It is the cell's like the rest of
    // that tmpfs (gone with it), its files count against the run's `tmpfs_size`, and only the
    // directory is reachable through the bind (a bind's `..` is its mount point's parent).
    let shm_target = dev.join("shm");
    if shm_target.is_dir() {
        let shm = scratch.join("shm");
        mkdir(&shm, 0o1777)?;
        // mkdir's mode is masked by the umask; the sticky, world-writable mode is set exactly.
        nix::sys::stat::fchmodat(
            None,
            &shm,
            nix::sys::stat::Mode::from_bits_truncate(0o1777),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| SetupError::sys("chmod the cell's /dev/shm", e))?;
        mnt(
            Some(&shm.to_string_lossy()),
            &shm_target,
            None,
            MsFlags::MS_BIND,
            None,
        )?;
        mnt(
            None,
            &shm_target,
            None,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC,
            None,
        )?;
    }
    let fresh = [
        ("mqueue", "mqueue", "", true),
        (
            "pts",
            "devpts",
            "newinstance,ptmxmode=0666,mode=0620,gid=5",
            false,
        ),
    ];
    for (name, fstype, opts, nodev) in fresh {
        let target = dev.join(name);
        if !target.is_dir() {
            continue;
        }
        let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
        if nodev {
            flags |= MsFlags::MS_NODEV;
        }
        let first = mnt(
            Some(fstype),
            &target,
            Some(fstype),
            flags,
            (!opts.is_empty()).then_some(opts),
        );
        match first {
            // A rootless sandbox without subordinate ids maps no gid 5 (tty): its ptys get
            // the mounter's group instead.
            Err(_) if fstype == "devpts" => {
                let opts = opts.trim_end_matches(",gid=5");
                mnt(Some(fstype), &target, Some(fstype), flags, Some(opts))?
            }
            r => r?,
        }
    }
    nix::unistd::chdir(&root).map_err(|e| SetupError::sys("entering the cell's root", e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| SetupError::sys("pivot_root", e))?;
    umount2(".", MntFlags::MNT_DETACH)
        .map_err(|e| SetupError::sys("detaching the shell's root", e))?;
    nix::unistd::chdir("/").map_err(|e| SetupError::sys("chdir /", e))
}

/// Keeps the cell's upper directory open at [`UPPER_FD`] in its PID 1 for the cell's life
/// (close-on-exec: no command inherits it), so the host can read the cell's writable layer
/// at `/proc/<pid>/fd/<UPPER_FD>` (a snapshot) once the tmpfs holding it is out of every
/// mount namespace's reach. Where that number is taken, the cell just has no such fd.
fn keep_upper(upper: &Path) {
    let Ok(fd) = open_path(upper) else {
        return;
    };
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) makes a new fd (the lowest free one >= UPPER_FD) of an
    // fd we own; it borrows nothing.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, UPPER_FD) };
    if dup >= 0 && dup != UPPER_FD {
        // SAFETY: closing the fd fcntl just made, which nothing else knows of.
        unsafe { libc::close(dup) };
    }
}

/// The fd number at which a cell's PID 1 holds its overlay's upper directory (`O_PATH`; see
/// `keep_upper`): the host reads the cell's writable layer at `/proc/<pid>/fd/99`.
pub const UPPER_FD: RawFd = 99;

/// The shell's masked and read-only `/proc` paths, applied to the cell's own `/proc`.
fn mask_proc(t: &CellTemplate, root: &Path) -> Setup<()> {
    let null = root.join("dev/null");
    for (p, dir) in &t.proc_masked {
        let target = under(root, p);
        if *dir {
            mnt(
                Some("tmpfs"),
                &target,
                Some("tmpfs"),
                MsFlags::MS_RDONLY,
                Some("size=0"),
            )?;
        } else {
            mnt(
                Some(&null.to_string_lossy()),
                &target,
                None,
                MsFlags::MS_BIND,
                None,
            )?;
        }
    }
    for p in &t.proc_readonly {
        let target = under(root, p);
        let src = target.to_string_lossy().into_owned();
        mnt(
            Some(&src),
            &target,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )?;
        mnt(
            None,
            &target,
            None,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC,
            None,
        )?;
    }
    Ok(())
}

fn open_path(p: &Path) -> Setup<OwnedFd> {
    let fd = nix::fcntl::open(
        p,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| SetupError::sys(format!("opening {}", p.display()), e))?;
    // SAFETY: open returned a new fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Attaches the run's mounts in the cell's root (the process's `/` by now).
fn attach_run_mounts(mounts: Vec<(CellMount, OwnedFd)>) -> Setup<()> {
    if mounts.is_empty() {
        return Ok(());
    }
    let root_fd = open_path(Path::new("/"))?;
    for (m, fd) in mounts {
        attach_run_mount(&root_fd, &m, fd)?;
    }
    Ok(())
}

/// `openat2(root, rel, O_PATH, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: symlinks of the image
/// resolve inside the cell's root, never outside it.
fn open_in_root(root: &OwnedFd, rel: &Path) -> Result<OwnedFd, rustix::io::Errno> {
    use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};
    openat2(
        root,
        rel,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
}

/// Attaches one of the run's mounts: its target is created inside the cell's root when
/// missing (directories, and an empty file for a file mount), then the detached mount the host
/// made is moved onto it.
fn attach_run_mount(root: &OwnedFd, m: &CellMount, tree: OwnedFd) -> Setup<()> {
    use rustix::fs::{mkdirat, openat, Mode, OFlags};
    let rel: PathBuf = m
        .target
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    let bad = |what: &str, e: rustix::io::Errno| {
        SetupError(format!(
            "mount target {}: {what}: {}",
            m.target.display(),
            std::io::Error::from(e)
        ))
    };
    if rel.as_os_str().is_empty() || m.target.components().any(|c| c == Component::ParentDir) {
        return Err(SetupError(format!(
            "mount target {} must be an absolute path without '..'",
            m.target.display()
        )));
    }
    let parts: Vec<&std::ffi::OsStr> = rel.iter().collect();
    let mut at = PathBuf::new();
    for (i, part) in parts.iter().enumerate() {
        let parent = if at.as_os_str().is_empty() {
            root.try_clone()
                .map_err(|e| SetupError(format!("dup: {e}")))?
        } else {
            open_in_root(root, &at).map_err(|e| bad("opening its parent", e))?
        };
        at.push(part);
        if open_in_root(root, &at).is_ok() {
            continue;
        }
        let last = i + 1 == parts.len();
        if last && !m.directory {
            let f = openat(
                &parent,
                *part,
                OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::from_raw_mode(0o644),
            )
            .map_err(|e| bad("creating it", e))?;
            drop(f);
        } else {
            match mkdirat(&parent, *part, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(bad("creating it", e)),
            }
        }
    }
    let target = open_in_root(root, &rel).map_err(|e| bad("opening it", e))?;
    crate::mounts::idmap::move_detached(tree.as_fd(), target.as_fd())
        .map_err(|e| SetupError(format!("attaching {}: {e}", m.target.display())))
}

/// Rlimits, capabilities, Landlock, seccomp: after this, the cell's PID 1 can do no more than
/// the command may (it keeps no_new_privs from the shell). With `share_ruleset`, returns a
/// copy of the cell's Landlock ruleset (for the zygote's child; `None` without Landlock).
fn confine(
    k: &impl Kernel,
    t: &CellTemplate,
    req: &CellRequest,
    share_ruleset: bool,
) -> Setup<Option<OwnedFd>> {
    for (res, value, name) in req.limits.settings() {
        k.setrlimit(res, value)
            .map_err(|e| SetupError::sys(format!("rlimit {name}"), e))?;
    }

    k.narrow_capabilities(&t.command_caps)
        .map_err(|e| SetupError(format!("capabilities: {e}")))?;
    let mut shared = None;
    if let Some(rules) = &req.landlock {
        let rules = LandlockRules {
            readable: rules.readable.clone(),
            writable: rules.writable.clone(),
        };
        shared = k
            .landlock(&rules, t.landlock_abi, share_ruleset)
            .map_err(|e| SetupError(e.to_string()))?;
    }
    k.seccomp(&t.run_filters)
        .map_err(|e| SetupError(e.to_string()))?;
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::PathRules;
    use crate::inside::kernel::{Call, Recorder};
    use nix::sys::resource::Resource;

    fn template() -> CellTemplate {
        CellTemplate {
            command_caps: vec![Capability::CAP_CHOWN, Capability::CAP_KILL],
            landlock_abi: 6,
            run_filters: vec![Vec::new(), Vec::new()],
            scratch: PathBuf::from("/.agentrun/scratch"),
            moved: Vec::new(),
            proc_masked: Vec::new(),
            proc_readonly: Vec::new(),
            egress_socket: PathBuf::from("/.agentrun/egress.sock"),
            zygote: None,
        }
    }

    fn request(landlock: Option<PathRules>) -> CellRequest {
        CellRequest {
            cell: 7,
            tmpfs_bytes: 1 << 20,
            limits: crate::confine::limits::Rlimits {
                nofile: 1024,
                nproc: 256,
            },
            rlimits: Box::default(),
            landlock,
            mounts: Vec::new(),
            egress_port: None,
            work: CellWork::Live,
            layers: 0,
            send_upper: false,
        }
    }

    fn rules() -> PathRules {
        PathRules {
            readable: vec![PathBuf::from("/")],
            writable: vec![PathBuf::from("/tmp"), PathBuf::from("/workspace")],
        }
    }

    fn rlimits() -> Vec<Call> {
        vec![
            Call::Setrlimit(Resource::RLIMIT_NOFILE, 1024),
            Call::Setrlimit(Resource::RLIMIT_NPROC, 256),
            Call::Setrlimit(Resource::RLIMIT_CORE, 0),
        ]
    }

    #[test]
    fn a_cell_is_confined_rlimits_then_capabilities_then_landlock_then_seccomp() {
        let k = Recorder::default();
        let shared = confine(&k, &template(), &request(Some(rules())), false).unwrap();
        assert!(
            shared.is_none(),
            "no ruleset copy unless the zygote needs one"
        );
        let mut want = rlimits();
        want.extend([
            Call::NarrowCapabilities(vec![Capability::CAP_CHOWN, Capability::CAP_KILL]),
            Call::Landlock {
                readable: rules().readable,
                writable: rules().writable,
                abi: 6,
                share: false,
            },
            Call::Seccomp(2),
        ]);
        assert_eq!(*k.calls.borrow(), want);
    }

    #[test]
    fn without_landlock_rules_a_cell_still_gets_its_capabilities_and_seccomp() {
        let k = Recorder::default();
        confine(&k, &template(), &request(None), false).unwrap();
        let mut want = rlimits();
        want.extend([
            Call::NarrowCapabilities(vec![Capability::CAP_CHOWN, Capability::CAP_KILL]),
            Call::Seccomp(2),
        ]);
        assert_eq!(*k.calls.borrow(), want);
    }

    #[test]
    fn a_cell_whose_run_goes_to_the_zygote_keeps_a_copy_of_its_ruleset() {
        let k = Recorder::default();
        let shared = confine(&k, &template(), &request(Some(rules())), true).unwrap();
        assert!(shared.is_some());
        assert!(k
            .calls
            .borrow()
            .iter()
            .any(|c| matches!(c, Call::Landlock { share: true, .. })));
    }

    #[test]
    fn a_failing_confinement_step_stops_the_rest_and_says_which() {
        for (fail, says, last) in [
            ("setrlimit", "rlimit nofile: ", 1),
            ("capabilities", "capabilities: ", 4),
            ("landlock", "landlock: ", 5),
            ("seccomp", "SCMP_ACT_NOTIFY", 6),
        ] {
            let k = Recorder {
                fail: vec![fail],
                ..Default::default()
            };
            let Err(SetupError(msg)) = confine(&k, &template(), &request(Some(rules())), false)
            else {
                panic!("{fail} failed but the cell was confined");
            };
            assert!(msg.starts_with(says), "{fail}: {msg}");
            // Nothing runs after the failing call: the cell is not left half confined and
            // going on.
            assert_eq!(
                k.calls.borrow().len(),
                last,
                "{fail}: {:?}",
                k.calls.borrow()
            );
        }
    }

    #[test]
    fn in_sandbox_paths_join_under_the_root() {
        assert_eq!(
            under(Path::new("/tmp/root"), Path::new("/dev/shm")),
            PathBuf::from("/tmp/root/dev/shm")
        );
        assert_eq!(
            under(Path::new("/s/root"), Path::new("/proc/sys")),
            PathBuf::from("/s/root/proc/sys")
        );
    }
}
