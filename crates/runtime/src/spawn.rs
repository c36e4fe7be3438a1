//! Starting the sandboxed command from the init with `posix_spawnp`.
//!
//! glibc's posix_spawn clones with `CLONE_VM|CLONE_VFORK`, so the init's address space is not
//! copied for every run (a fork of the init costs ~0.3 ms, and the exec after it as much again
//! to tear the copy down). std's `Command` would use it too, but it keeps the caller's signal
//! mask — the init blocks every signal — unless a `pre_exec` hook is set, which forces a fork;
//! and nix 0.29 has no posix_spawn. Hence this thin wrapper over the libc calls.

use std::ffi::CString;
use std::os::fd::RawFd;

use nix::sys::signal::{SigSet, Signal};
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
    /// process group.
    pub new_session: bool,
}

/// Starts the command in a new process group (or session), with an empty signal mask and every signal at
/// its default disposition. Returns the pid, or the errno of what failed (exec included).
pub fn spawn(spec: &SpawnSpec<'_>) -> Result<Pid, nix::Error> {
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
    let mut defaults = SigSet::all();
    defaults.remove(Signal::SIGKILL);
    defaults.remove(Signal::SIGSTOP);
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
            let group = if spec.new_session {
                libc::POSIX_SPAWN_SETSID as libc::c_int
            } else {
                libc::POSIX_SPAWN_SETPGROUP as libc::c_int
            };
            let flags = libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF | group;
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
