//! A Docker process's stdio, made by [`agentrun_pool::stdio`]: pipes (stdout and stderr apart,
//! stdin when asked for) or, with `Tty`, a pty (one stream, as stdout), in the shape a
//! container's main process and exec instances use: our ends of its output numbered as
//! Docker's streams.

use std::fs::File;
use std::os::fd::OwnedFd;

use agentrun_pool::stdio::{Pipes, Terminal};

/// The stdio of a process: what it gets, and our ends (stdin writer, output readers with
/// their stream numbers: 1 stdout, 2 stderr).
pub struct Stdio {
    pub child: [OwnedFd; 3],
    pub stdin: Option<OwnedFd>,
    pub outputs: Vec<(u8, OwnedFd)>,
    /// The pty master (a handle of its own, for resizing) when there is a pty.
    pub pty: Option<File>,
}

impl Stdio {
    /// Pipes (stdout and stderr apart; stdin when `want_stdin`, else `/dev/null`) or, with
    /// `tty`, a pty (one stream, as stdout; stdin always).
    pub fn open(tty: bool, want_stdin: bool) -> std::io::Result<Stdio> {
        if tty {
            let Terminal { child, master } = Terminal::open()?;
            return Ok(Stdio {
                child,
                stdin: Some(master.try_clone()?.into()),
                outputs: vec![(1, master.try_clone()?.into())],
                pty: Some(master),
            });
        }
        let Pipes {
            child,
            stdin,
            stdout,
            stderr,
        } = Pipes::open(want_stdin)?;
        Ok(Stdio {
            child,
            stdin,
            outputs: vec![(1, stdout), (2, stderr)],
            pty: None,
        })
    }
}
