//! Processes in a long-lived sandbox as the API front ends start them, each a
//! [`StartCommand`] (argv, env, cwd, user) the front end builds from its request: with stdout and
//! stderr pipes (and a stdin pipe or `/dev/null`: [`Pipes`]) whose other ends are passed into
//! the sandbox ([`spawn`]), or on a terminal of their own ([`spawn_terminal`]), under the image's shell ([`find_shell`]); and the interactive ones
//! that stay between runs (an OpenSandbox session's shell, a Python context's interpreter:
//! [`InteractiveProcess`]), whose output is read through a queue of [`LINE_QUEUE`] lines that
//! only a run in progress drains: output written between runs (`yes &`) waits there, then in
//! the pipe, and then the writer blocks until the next run reads it. Also the `$VAR`
//! expansion the front ends apply to a request's working directory ([`expand_vars`]).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::lines::PipeLines;
use crate::live::{ExitHook, LiveSandbox, ProcessExit, ProcessSpec};
use crate::stdio::{set_window_size, Pipes, StdioStream, Terminal};
use crate::PoolError;

/// Lines of an interactive process's stdout (and as many of its stderr) held until a run
/// reads them.
pub const LINE_QUEUE: usize = 16;

/// The shell commands run under: bash if the sandbox's image has it, else sh.
pub fn find_shell(sandbox: &LiveSandbox) -> &'static str {
    let has_bash = sandbox
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

/// A command to start in a sandbox, as a front end (an E2B process, a Docker exec, an
/// OpenSandbox command or session, an MCP run) builds it from its request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartCommand {
    pub argv: Vec<String>,
    /// Over the sandbox's environment.
    pub env: Vec<(String, String)>,
    /// A path inside the sandbox, resolved there.
    pub cwd: String,
    /// Run it as this user (`uid[:gid]`, `name[:group]`), resolved by the sandbox's init;
    /// `None`: the sandbox's root.
    pub user: Option<String>,
}

impl StartCommand {
    /// `argv` with `env` in `cwd`, as the sandbox's root.
    pub fn new(argv: Vec<String>, env: Vec<(String, String)>, cwd: impl Into<String>) -> Self {
        StartCommand {
            argv,
            env,
            cwd: cwd.into(),
            user: None,
        }
    }
    /// Run as `user` (`None`: the sandbox's root).
    pub fn user(mut self, user: Option<String>) -> Self {
        self.user = user;
        self
    }
    /// The sandbox's spawn request for it: on `stdio` (passed into the sandbox), in a new
    /// session when `new_session` (terminals), `on_exit` called once it exited.
    pub fn into_spec(
        self,
        stdio: [OwnedFd; 3],
        new_session: bool,
        on_exit: ExitHook,
    ) -> ProcessSpec {
        ProcessSpec {
            argv: self.argv,
            env: self.env,
            cwd: self.cwd,
            stdio,
            new_session,
            user: self.user,
            on_exit,
        }
    }
}

/// A process just started in a sandbox.
pub struct Spawned {
    /// Its id in the sandbox (what [`LiveSandbox::signal`] takes).
    pub id: u64,
    /// Our end of its stdin, when it has a pipe as stdin (else it reads `/dev/null`).
    pub stdin: Option<OwnedFd>,
    /// The read ends of its stdout and stderr.
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Fires once it exited.
    pub exit: oneshot::Receiver<ProcessExit>,
}

/// Starts `cmd` in the sandbox with stdout/stderr pipes ([`Pipes`]), and a stdin pipe
/// when `stdin` (else `/dev/null`).
pub async fn spawn(
    sandbox: &Arc<LiveSandbox>,
    cmd: StartCommand,
    stdin: bool,
) -> Result<Spawned, PoolError> {
    let Pipes {
        child,
        stdin,
        stdout,
        stderr,
    } = Pipes::open(stdin).map_err(|e| PoolError::Io("pipes", e))?;
    let (id, exit) = start(sandbox, cmd, child, false).await?;
    Ok(Spawned {
        id,
        stdin,
        stdout,
        stderr,
        exit,
    })
}

/// A process just started in a sandbox on a terminal ([`spawn_terminal`]).
pub struct SpawnedTerminal {
    /// Its id in the sandbox (what [`LiveSandbox::signal`] takes).
    pub id: u64,
    /// The pty master: its input written here, its output (stdout and stderr as one) read
    /// here, its window size set here ([`set_window_size`]); `try_clone` it for each.
    pub master: File,
    /// Fires once it exited.
    pub exit: oneshot::Receiver<ProcessExit>,
}

/// Starts `cmd` in the sandbox on a new terminal ([`Terminal`]) of `rows` x `cols`, in a
/// session of its own, as [`spawn`] does otherwise.
pub async fn spawn_terminal(
    sandbox: &Arc<LiveSandbox>,
    cmd: StartCommand,
    (rows, cols): (u16, u16),
) -> Result<SpawnedTerminal, PoolError> {
    let Terminal { child, master } = Terminal::open().map_err(|e| PoolError::Io("pty", e))?;
    set_window_size(&master, rows, cols).map_err(|e| PoolError::Io("pty size", e))?;
    let (id, exit) = start(sandbox, cmd, child, true).await?;
    Ok(SpawnedTerminal { id, master, exit })
}

/// Starts `cmd` with `stdio` (passed into the sandbox, closed here): its id and exit.
async fn start(
    sandbox: &Arc<LiveSandbox>,
    cmd: StartCommand,
    stdio: [OwnedFd; 3],
    new_session: bool,
) -> Result<(u64, oneshot::Receiver<ProcessExit>), PoolError> {
    let (tx, rx) = oneshot::channel();
    let sandbox = sandbox.clone();
    let spec = cmd.into_spec(
        stdio,
        new_session,
        Box::new(move |e| {
            let _ = tx.send(e);
        }),
    );
    let p = tokio::task::spawn_blocking(move || sandbox.spawn(spec))
        .await
        .map_err(|e| PoolError::Invalid(e.to_string()))??;
    Ok((p.id, rx))
}

/// The lines of a pipe (an interactive process's output), read into a queue of
/// [`LINE_QUEUE`] lines on `output` (the front end's output runtime): when nobody takes them
/// the reading stops and the process blocks on its pipe once that is full. Ends at EOF or
/// when the receiver is dropped.
pub fn queued_lines(output: &tokio::runtime::Handle, fd: OwnedFd) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(LINE_QUEUE);
    output.spawn(async move {
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
    /// Starts `argv` in the sandbox with a pipe as its stdin; its output is read on `output`.
    pub async fn start(
        output: &tokio::runtime::Handle,
        sandbox: &Arc<LiveSandbox>,
        cmd: StartCommand,
    ) -> Result<InteractiveProcess, PoolError> {
        let p = spawn(sandbox, cmd, true).await?;
        let lines = (
            queued_lines(output, p.stdout),
            queued_lines(output, p.stderr),
        );
        let dead = Arc::new(AtomicBool::new(false));
        let d = dead.clone();
        let exit = p.exit;
        tokio::spawn(async move {
            // Err: the exit hook was dropped without a send: the process is gone either way.
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
            output: tokio::sync::Mutex::new(lines),
            dead,
        })
    }

    /// Whether it exited.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

/// [`expand_vars`] with an unknown name expanded to nothing (Go's `os.ExpandEnv`).
pub fn expand_vars_lenient(s: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    expand_vars(s, |k| Some(lookup(k).unwrap_or_default())).unwrap_or_default()
}

/// `$NAME` and `${NAME}` (NAME = `[A-Za-z_][A-Za-z0-9_]*`) in `s` replaced by `lookup`'s
/// value; `Err` lists (sorted, once each) the names `lookup` does not know. A `$` not
/// starting a name stays as it is.
pub fn expand_vars(
    s: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, Vec<String>> {
    let mut out = String::with_capacity(s.len());
    let mut missing: Vec<String> = Vec::new();
    let name_len = |t: &str| {
        let b = t.as_bytes();
        if b.first()
            .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
        {
            b.iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                .count()
        } else {
            0
        }
    };
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, consumed) = if let Some(inner) = after.strip_prefix('{') {
            let n = name_len(inner);
            if n > 0 && inner[n..].starts_with('}') {
                (&inner[..n], n + 2)
            } else {
                ("", 0)
            }
        } else {
            let n = name_len(after);
            (&after[..n], n)
        };
        if consumed == 0 {
            out.push('$');
            rest = after;
            continue;
        }
        match lookup(name) {
            Some(v) => out.push_str(&v),
            None => {
                if !missing.iter().any(|m| m == name) {
                    missing.push(name.to_string());
                }
            }
        }
        rest = &after[consumed..];
    }
    out.push_str(rest);
    if missing.is_empty() {
        Ok(out)
    } else {
        missing.sort();
        Err(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::{expand_vars, StartCommand};

    #[test]
    fn a_start_command_becomes_the_spawn_request_field_for_field() {
        let null = || std::os::fd::OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let cmd = StartCommand::new(
            vec!["ls".into(), "-l".into()],
            vec![("A".into(), "1".into())],
            "/w",
        )
        .user(Some("1000:1000".into()));
        let spec = cmd
            .clone()
            .into_spec([null(), null(), null()], true, Box::new(|_| {}));
        assert_eq!(spec.argv, cmd.argv);
        assert_eq!(spec.env, cmd.env);
        assert_eq!(spec.cwd, "/w");
        assert_eq!(spec.user.as_deref(), Some("1000:1000"));
        assert!(spec.new_session);
        assert_eq!(StartCommand::new(Vec::new(), Vec::new(), "/").user, None);
    }

    #[test]
    fn variables_expand_as_execd_expands_them() {
        let env = |n: &str| {
            match n {
                "HOME" => Some("/home/u"),
                "W" => Some("work"),
                "EMPTY" => Some(""),
                _ => None,
            }
            .map(str::to_string)
        };
        let ok = |s: &str| expand_vars(s, env).unwrap();
        assert_eq!(ok("/plain/path"), "/plain/path");
        assert_eq!(ok("$HOME/$W"), "/home/u/work");
        assert_eq!(ok("${HOME}/x${W}y"), "/home/u/xworky");
        assert_eq!(ok("/a$EMPTY/b"), "/a/b");
        assert_eq!(ok("/cost$5/$/x$"), "/cost$5/$/x$");
        assert_eq!(ok("/${unclosed"), "/${unclosed");
        assert_eq!(
            expand_vars("$NOPE/${ALSO}/$NOPE", env),
            Err(vec!["ALSO".to_string(), "NOPE".to_string()])
        );
    }
}
