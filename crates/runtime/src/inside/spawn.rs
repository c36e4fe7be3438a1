//! Starting the sandboxed command from the init with `posix_spawnp`.
//!
//! glibc's posix_spawn clones with `CLONE_VM|CLONE_VFORK`, so the init's address space is not
//! copied for every run (a fork of the init costs ~0.3 ms, and the exec after it as much again
//! to tear the copy down). std's `Command` would use it too, but it keeps the caller's signal
//! mask — the init blocks every signal — unless a `pre_exec` hook is set, which forces a fork;
//! and nix 0.29 has no posix_spawn. Hence this thin wrapper over the libc calls.

use std::ffi::CString;
use std::os::fd::RawFd;

use nix::sys::signal::SigSet;
use nix::unistd::Pid;

/// What to start and how.
pub struct SpawnSpec<'a> {
    /// argv[0] is looked up in `PATH` of the *calling* process's environment.
    pub argv: &'a [CString],
    /// The command's whole environment (`KEY=VALUE`).
    pub env: &'a [CString],
    pub cwd: &'a CString,
    /// Fds to install as the command's stdin, stdout, stderr (`None`: inherit).
    pub stdio: Option<[RawFd; 3]>,
    /// A new session (`setsid`, which also makes a new process group) instead of only a new
    /// process group; when its stdin is a terminal, that terminal becomes the session's
    /// controlling terminal (job control, ^C, SIGWINCH), as a login on it would have it.
    pub new_session: bool,
    /// Rlimits set in the child before the exec (posix_spawn cannot: such a spawn forks).
    pub rlimits: crate::confine::limits::RlimitFallback,
}

/// Starts the command in a new process group (or session), with an empty signal mask and every signal at
/// its default disposition. Returns the pid, or the errno of what failed (exec included).
pub fn spawn(spec: &SpawnSpec<'_>) -> Result<Pid, nix::Error> {
    // posix_spawn can set neither rlimits nor a controlling terminal.
    if spec.rlimits != Default::default() || spec.new_session {
        return spawn_as(spec, None).map_err(|(_, e)| e);
    }
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(nix::Error::from_raw(rc))
        }
    };
    let mut argv: Vec<*mut libc::c_char> =
        spec.argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let mut envp: Vec<*mut libc::c_char> = spec.env.iter().map(|e| e.as_ptr().cast_mut()).collect();
    envp.push(std::ptr::null_mut());
    let defaults = ignored_signals();
    let empty = SigSet::empty();

    // SAFETY: attr and actions are initialised before use and destroyed on every path below;
    // every pointer passed to glibc points into data that outlives the calls (argv/envp
    // vectors of NUL-terminated strings ending in a null pointer, sigsets, the cwd string).
    unsafe {
        let mut attr = std::mem::MaybeUninit::<libc::posix_spawnattr_t>::uninit();
        check(libc::posix_spawnattr_init(attr.as_mut_ptr()))?;
        let mut actions = std::mem::MaybeUninit::<libc::posix_spawn_file_actions_t>::uninit();
        if let Err(e) = check(libc::posix_spawn_file_actions_init(actions.as_mut_ptr())) {
            libc::posix_spawnattr_destroy(attr.as_mut_ptr());
            return Err(e);
        }
        let attr_ptr = attr.as_mut_ptr();
        let actions_ptr = actions.as_mut_ptr();
        let result = (|| {
            // A new session goes through `spawn_as` (above): here, a new process group.
            let flags = libc::POSIX_SPAWN_SETSIGMASK
                | libc::POSIX_SPAWN_SETSIGDEF
                | libc::POSIX_SPAWN_SETPGROUP as libc::c_int;
            check(libc::posix_spawnattr_setflags(
                attr_ptr,
                flags as libc::c_short,
            ))?;
            check(libc::posix_spawnattr_setsigmask(attr_ptr, empty.as_ref()))?;
            check(libc::posix_spawnattr_setsigdefault(
                attr_ptr,
                defaults.as_ref(),
            ))?;
            check(libc::posix_spawnattr_setpgroup(attr_ptr, 0))?;
            if let Some(fds) = spec.stdio {
                for (target, fd) in fds.into_iter().enumerate() {
                    check(libc::posix_spawn_file_actions_adddup2(
                        actions_ptr,
                        fd,
                        target as libc::c_int,
                    ))?;
                }
            }
            check(libc::posix_spawn_file_actions_addchdir_np(
                actions_ptr,
                spec.cwd.as_ptr(),
            ))?;
            let mut pid: libc::pid_t = 0;
            check(libc::posix_spawnp(
                &mut pid,
                spec.argv[0].as_ptr(),
                actions_ptr,
                attr_ptr,
                argv.as_ptr(),
                envp.as_ptr(),
            ))?;
            Ok(Pid::from_raw(pid))
        })();
        libc::posix_spawn_file_actions_destroy(actions_ptr);
        libc::posix_spawnattr_destroy(attr_ptr);
        result
    }
}

/// The signals this process ignores: the ones a spawn must set back to their default (exec
/// resets handled signals by itself; resetting every signal costs ~64 syscalls a spawn).
/// Worked out once; a shell's init calls it before it makes cells, which inherit it.
pub fn ignored_signals() -> SigSet {
    static IGNORED: std::sync::OnceLock<Vec<i32>> = std::sync::OnceLock::new();
    let list = IGNORED.get_or_init(|| {
        (1..=libc::SIGRTMAX())
            .filter(|&sig| sig != libc::SIGKILL && sig != libc::SIGSTOP)
            .filter(|&sig| {
                // SAFETY: sigaction with a null new action only reads the disposition into a
                // zeroed struct we own.
                unsafe {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                        && old.sa_sigaction == libc::SIG_IGN
                }
            })
            .collect()
    });
    // SAFETY: sigemptyset/sigaddset on a sigset_t we own (realtime signals have no nix
    // `Signal`), with signal numbers the kernel reported; the set is then a valid one.
    unsafe {
        let mut raw: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut raw);
        for &sig in list {
            libc::sigaddset(&mut raw, sig);
        }
        SigSet::from_sigset_t_unchecked(raw)
    }
}

/// Which step of [`spawn_as`] failed in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnStep {
    /// setgroups/setgid/setuid.
    Credentials,
    /// Entering the working directory (as the user).
    Chdir,
    /// Finding or executing the program.
    Exec,
}

/// The search path when the environment has no `PATH`.
pub(crate) const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Finds `argv0` in `PATH` of the calling process's environment, as `posix_spawnp` would.
fn lookup(argv0: &CString) -> Result<CString, nix::Error> {
    let bytes = argv0.as_bytes();
    if bytes.contains(&b'/') {
        return Ok(argv0.clone());
    }
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.into());
    let name = std::str::from_utf8(bytes).map_err(|_| nix::Error::ENOENT)?;
    let found = find_program(name, &path).ok_or(nix::Error::ENOENT)?;
    CString::new(found.into_os_string().into_encoded_bytes()).map_err(|_| nix::Error::ENOENT)
}

/// The first `DIR/name` that is a file, for the entries of the search path `path` in order
/// (an empty entry is the working directory).
pub(crate) fn find_program(name: &str, path: &str) -> Option<std::path::PathBuf> {
    path.split(':').find_map(|dir| {
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = std::path::Path::new(dir).join(name);
        candidate.is_file().then_some(candidate)
    })
}

/// [`spawn`] as another user: the same process group/session (and controlling terminal),
/// signal state, stdio and working directory, with `creds` (supplementary groups, gid, uid,
/// in that order) set before the working directory is entered and the program executed, and
/// the spec's rlimits set. `posix_spawn` can do none of that, so this forks; the child makes only raw system calls
/// (everything it needs is prepared before the fork) and reports a failure through a
/// close-on-exec pipe. `creds` `None`: as this process's user.
pub fn spawn_as(
    spec: &SpawnSpec<'_>,
    creds: Option<&crate::inside::user::Credentials>,
) -> Result<Pid, (SpawnStep, nix::Error)> {
    let program = lookup(&spec.argv[0]).map_err(|e| (SpawnStep::Exec, e))?;
    let mut argv: Vec<*const libc::c_char> = spec.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = spec.env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let groups: Vec<libc::gid_t> = creds.map(|c| c.groups.clone()).unwrap_or_default();
    let limits: Vec<(_, libc::rlimit)> = [
        (libc::RLIMIT_AS, spec.rlimits.address_space),
        (libc::RLIMIT_CPU, spec.rlimits.cpu_seconds),
    ]
    .into_iter()
    .filter_map(|(r, v)| {
        v.map(|v| {
            (
                r,
                libc::rlimit {
                    rlim_cur: v,
                    rlim_max: v,
                },
            )
        })
    })
    .collect();
    let last_signal = libc::SIGRTMAX();
    let (report_r, report_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| (SpawnStep::Exec, e))?;
    let (rfd, wfd) = (
        std::os::fd::AsRawFd::as_raw_fd(&report_r),
        std::os::fd::AsRawFd::as_raw_fd(&report_w),
    );
    // SAFETY: fork(2); the child below only makes async-signal-safe system calls on data
    // prepared before the fork, and leaves with execve or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err((SpawnStep::Exec, nix::Error::last()));
    }
    if pid == 0 {
        // SAFETY: the child of a fork: raw system calls on pointers that stay valid (they
        // point into the parent's copied memory), then execve or _exit.
        unsafe {
            let fail = |step: u8| -> ! {
                let errno = *libc::__errno_location();
                let mut msg = [0u8; 5];
                msg[0] = step;
                msg[1..].copy_from_slice(&errno.to_ne_bytes());
                libc::write(wfd, msg.as_ptr().cast(), msg.len());
                libc::_exit(crate::exit::EXIT_NOT_FOUND)
            };
            for sig in 1..=last_signal {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            let leader = if spec.new_session {
                libc::setsid()
            } else {
                libc::setpgid(0, 0)
            };
            if leader < 0 {
                fail(2);
            }
            if let Some(fds) = spec.stdio {
                for (target, fd) in fds.into_iter().enumerate() {
                    if libc::dup2(fd, target as libc::c_int) < 0 {
                        fail(2);
                    }
                }
            }
            // A session leader's terminal becomes its controlling terminal (best effort: a
            // process that is not on one, or whose terminal is another session's, goes on
            // without).
            if spec.new_session && libc::isatty(0) == 1 {
                libc::ioctl(0, libc::TIOCSCTTY, 0);
            }
            if let Some(creds) = creds {
                if libc::setgroups(groups.len(), groups.as_ptr()) < 0
                    || libc::setgid(creds.gid) < 0
                    || libc::setuid(creds.uid) < 0
                {
                    fail(0);
                }
            }
            for (res, lim) in &limits {
                if libc::setrlimit(*res, lim) < 0 {
                    fail(2);
                }
            }
            if libc::chdir(spec.cwd.as_ptr()) < 0 {
                fail(1);
            }
            let mut empty = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
            fail(2)
        }
    }
    drop(report_w);
    let mut msg = [0u8; 5];
    let mut got = 0;
    while got < msg.len() {
        // SAFETY: read(2) into a buffer we own.
        let n = unsafe { libc::read(rfd, msg[got..].as_mut_ptr().cast(), msg.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n == 0 || nix::Error::last() != nix::Error::EINTR {
            break;
        }
    }
    drop(report_r);
    if got < msg.len() {
        return Ok(Pid::from_raw(pid)); // the pipe closed on exec: it runs
    }
    // Dropped: reaps the child that failed before exec (ECHILD only if already reaped); the
    // step it reported is the error returned.
    let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), None);
    let step = match msg[0] {
        0 => SpawnStep::Credentials,
        1 => SpawnStep::Chdir,
        _ => SpawnStep::Exec,
    };
    let errno = i32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
    Err((step, nix::Error::from_raw(errno)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    /// The first line `sh -c script` prints, run by [`spawn`] in a new session on a new pty.
    fn on_a_pty(script: &str) -> String {
        let pty = nix::pty::openpty(None, None).unwrap();
        let s = pty.slave.as_raw_fd();
        let argv = ["/bin/sh", "-c", script].map(|a| CString::new(a).unwrap());
        let env = [CString::new("PATH=/usr/bin:/bin").unwrap()];
        let cwd = CString::new("/").unwrap();
        let pid = spawn(&SpawnSpec {
            argv: &argv,
            env: &env,
            cwd: &cwd,
            stdio: Some([s, s, s]),
            new_session: true,
            rlimits: Default::default(),
        })
        .unwrap();
        drop(pty.slave);
        // Its line, read before it is reaped (a session leader's exit hangs its terminal up),
        // or what came before the slave closed (EIO).
        let mut out = Vec::new();
        let mut master = std::fs::File::from(pty.master);
        let mut buf = [0u8; 256];
        while !out.contains(&b'\n') {
            match master.read(&mut buf) {
                Ok(n) if n > 0 => out.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        nix::sys::wait::waitpid(pid, None).unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn a_new_sessions_terminal_is_its_controlling_terminal() {
        // /dev/tty opens only for a process with a controlling terminal.
        let script = "if (: </dev/tty) 2>/dev/null; then echo ctty; else echo none; fi";
        assert_eq!(on_a_pty(script).trim(), "ctty");
    }
}
