//! A process's stdio: pipes (stdout and stderr apart, stdin when asked for) or a pty (one
//! stream, as stdout), the child's ends and ours. Used by a container's main process and by
//! exec instances.

use std::fs::File;
use std::os::fd::OwnedFd;

/// A pipe: (read end, write end), close-on-exec.
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

/// The stdio of a process: what it gets, and our ends (stdin writer, output readers with
/// their stream numbers).
pub struct Stdio {
    pub child: [OwnedFd; 3],
    pub stdin: Option<File>,
    pub outputs: Vec<(u8, File)>,
    /// The pty master (a handle of its own, for resizing) when there is a pty.
    pub pty: Option<File>,
}

impl Stdio {
    /// Pipes (stdout and stderr apart; stdin when `want_stdin`, else `/dev/null`) or, with
    /// `tty`, a pty (one stream, as stdout; stdin always).
    pub fn open(tty: bool, want_stdin: bool) -> std::io::Result<Stdio> {
        if tty {
            let pty = nix::pty::openpty(None, None).map_err(std::io::Error::from)?;
            let master = File::from(pty.master);
            let slave = pty.slave;
            nix::fcntl::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&master),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(std::io::Error::from)?;
            let reader = master.try_clone()?;
            let pty = Some(master.try_clone()?);
            return Ok(Stdio {
                child: [slave.try_clone()?, slave.try_clone()?, slave],
                stdin: Some(master),
                outputs: vec![(1, reader)],
                pty,
            });
        }
        let (stdin_child, stdin_ours) = if want_stdin {
            let (r, w) = pipe()?;
            (r, Some(File::from(w)))
        } else {
            (File::open("/dev/null")?.into(), None)
        };
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        Ok(Stdio {
            child: [stdin_child, out_w, err_w],
            stdin: stdin_ours,
            outputs: vec![(1, File::from(out_r)), (2, File::from(err_r))],
            pty: None,
        })
    }
}
