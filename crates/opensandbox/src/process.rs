//! Processes in a sandbox, as execd starts them: with stdout and stderr pipes (and a stdin
//! pipe or `/dev/null`: [`agentrun_pool::stdio::Pipes`]) whose other ends are passed into the
//! sandbox ([`spawn`]), under the image's shell ([`shell`]); and the interactive ones that
//! stay between runs, a session's shell and a code context's interpreter
//! ([`InteractiveProcess`]), whose output is read through a queue of [`LINE_QUEUE`] lines that
//! only a run in progress drains: output written between runs (`yes &`) waits there, then in
//! the pipe, and then the writer blocks until the next run reads it.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use agentrun_pool::live::{ProcessExit, ProcessSpec};
use agentrun_pool::stdio::{Pipes, StdioStream};
use agentrun_pool::PoolError;
use tokio::sync::{mpsc, oneshot};

use crate::lines::PipeLines;
use crate::{Record, Server};

/// Lines of an interactive process's stdout (and as many of its stderr) held until a run
/// reads them.
pub const LINE_QUEUE: usize = 16;

/// The shell commands run under: bash if the image has it, else sh (found once per sandbox).
pub fn shell(rec: &Record) -> &'static str {
    rec.shell.get_or_init(|| find_shell(rec))
}

fn find_shell(rec: &Record) -> &'static str {
    let has_bash = rec
        .sandbox
        .root()
        .ok()
        .map(agentrun_runtime::fsroot::SandboxFs::new)
        .is_some_and(|fs| {
            agentrun_runtime::fsroot::as_sandbox_root(|| {
                fs.stat(std::path::Path::new("bin/bash")).is_ok()
            })
        });
    if has_bash {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

/// A process just started in a sandbox.
pub struct Spawned {
    /// Its id in the sandbox (what [`agentrun_pool::live::LiveSandbox::signal`] takes).
    pub id: u64,
    /// Our end of its stdin, when it has a pipe as stdin (else it reads `/dev/null`).
    pub stdin: Option<OwnedFd>,
    /// The read ends of its stdout and stderr.
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Fires once it exited.
    pub exit: oneshot::Receiver<ProcessExit>,
}

/// Starts a process in the sandbox with stdout/stderr pipes ([`Pipes`]), and a stdin pipe
/// when `stdin` (else `/dev/null`), as `user` (`uid[:gid]`, resolved by the sandbox's init;
/// `None`: the sandbox's root).
pub async fn spawn(
    rec: &Record,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    stdin: bool,
    user: Option<String>,
) -> Result<Spawned, PoolError> {
    let Pipes {
        child,
        stdin,
        stdout,
        stderr,
    } = Pipes::open(stdin).map_err(|e| PoolError::Io("pipes", e))?;
    let (tx, rx) = oneshot::channel();
    let sandbox = rec.sandbox.clone();
    let spec = ProcessSpec {
        argv,
        env,
        cwd,
        stdio: child,
        new_session: false,
        user,
        on_exit: Box::new(move |e| {
            let _ = tx.send(e);
        }),
    };
    let p = tokio::task::spawn_blocking(move || sandbox.spawn(spec))
        .await
        .map_err(|e| PoolError::Invalid(e.to_string()))??;
    Ok(Spawned {
        id: p.id,
        stdin,
        stdout,
        stderr,
        exit: rx,
    })
}

/// The lines of a pipe (an interactive process's output), read into a queue of
/// [`LINE_QUEUE`] lines on the server's output runtime: when nobody takes them the reading
/// stops and the process blocks on its pipe once that is full. Ends at EOF or when the
/// receiver is dropped.
pub fn queued_lines(server: &Server, fd: OwnedFd) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(LINE_QUEUE);
    server.output.spawn(async move {
        let mut lines = PipeLines::new(fd);
        while let Some(l) = lines.next().await {
            if tx.send(l).await.is_err() {
                break;
            }
        }
    });
    rx
}

/// A process that stays between runs and takes each run on its stdin: a session's shell, a
/// code context's interpreter. One run at a time holds its stdin and output.
pub struct InteractiveProcess {
    /// Its id in the sandbox.
    pub id: u64,
    pub stdin: tokio::sync::Mutex<StdioStream>,
    /// Its stdout and stderr lines, consumed by the run in progress ([`queued_lines`]).
    pub output: tokio::sync::Mutex<(mpsc::Receiver<String>, mpsc::Receiver<String>)>,
    /// Set once it exited (or was killed).
    pub dead: Arc<AtomicBool>,
}

impl InteractiveProcess {
    /// Starts `argv` in the sandbox with a pipe as its stdin.
    pub async fn start(
        server: &Server,
        rec: &Record,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: String,
    ) -> Result<InteractiveProcess, PoolError> {
        let p = spawn(rec, argv, env, cwd, true, None).await?;
        let output = (
            queued_lines(server, p.stdout),
            queued_lines(server, p.stderr),
        );
        let dead = Arc::new(AtomicBool::new(false));
        let d = dead.clone();
        let exit = p.exit;
        tokio::spawn(async move {
            let _ = exit.await;
            d.store(true, Ordering::SeqCst);
        });
        let stdin = p
            .stdin
            .ok_or_else(|| PoolError::Invalid("no stdin pipe".into()))
            .and_then(|fd| StdioStream::new(fd).map_err(|e| PoolError::Io("stdin pipe", e)))?;
        Ok(InteractiveProcess {
            id: p.id,
            stdin: tokio::sync::Mutex::new(stdin),
            output: tokio::sync::Mutex::new(output),
            dead,
        })
    }

    /// Whether it exited.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}
