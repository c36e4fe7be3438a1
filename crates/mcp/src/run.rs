//! Running in a session's sandbox: a process with its output captured ([`capture`], what
//! `run_shell` and the file tools use), and Python code in the session's persistent context
//! ([`python`]). Both are bounded: in time (the process group is killed; an interpreter is
//! interrupted, then killed and replaced), and in output (the first [`OUTPUT_CAP`] bytes of
//! each stream are kept, the rest is read and counted, so a flood never blocks the writer or
//! grows memory).

use std::sync::Arc;
use std::time::Duration;

use agentrun_pool::process::{spawn, StartCommand};
use agentrun_pool::python::{CodeEvent, PythonContext};
use agentrun_pool::stdio::StdioStream;
use agentrun_pool::PoolError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::session::{SessionSandbox, Shared};

/// Bytes of each of stdout and stderr a result keeps.
pub const OUTPUT_CAP: usize = 256 * 1024;

/// How long output may still arrive once the process exited (a background child holding
/// the pipe open is not waited for beyond this).
const DRAIN: Duration = Duration::from_millis(200);

/// How long an interrupted Python execution has to stop before its interpreter is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// What a run gives back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    pub timed_out: bool,
    /// Some output was cut at [`OUTPUT_CAP`].
    pub truncated: bool,
    /// Something the model should know (the interpreter was restarted, ...).
    pub notes: Vec<String>,
}

impl RunOutput {
    /// A run's result from its two streams as kept; one stopped at its time limit
    /// (`limit`: what was done to it, and the limit) says so after the other `notes`.
    fn new(
        out: &Kept,
        err: &Kept,
        exit_code: i32,
        limit: Option<(&str, Duration)>,
        mut notes: Vec<String>,
    ) -> Self {
        if let Some((done, limit)) = limit {
            let secs = limit.as_secs_f64();
            notes.push(format!("{done} after {secs:.1}s (its time limit)"));
        }
        RunOutput {
            stdout: out.text(),
            stderr: err.text(),
            exit_code,
            timed_out: limit.is_some(),
            truncated: out.cut > 0 || err.cut > 0,
            notes,
        }
    }
}

/// One stream's kept bytes and how many were cut.
#[derive(Default)]
struct Kept {
    bytes: Vec<u8>,
    cut: u64,
}

impl Kept {
    fn push(&mut self, data: &[u8]) {
        let room = OUTPUT_CAP.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&data[..data.len().min(room)]);
        self.cut += data.len().saturating_sub(room) as u64;
    }

    fn text(&self) -> String {
        let mut s = String::from_utf8_lossy(&self.bytes).into_owned();
        if self.cut > 0 {
            s.push_str(&format!("\n[... {} more bytes cut ...]\n", self.cut));
        }
        s
    }
}

async fn read_all(fd: std::os::fd::OwnedFd) -> Kept {
    let mut kept = Kept::default();
    let Ok(mut rx) = StdioStream::new(fd) else {
        return kept;
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => kept.push(&buf[..n]),
        }
    }
}

/// A process's raw result.
pub struct Captured {
    pub stdout: Vec<u8>,
    pub output: RunOutput,
}

/// Runs `argv` in the sandbox in `cwd` with `env` (over the sandbox's), `stdin` written to it
/// (else it reads `/dev/null`), until it exits or `timeout` passes (then its process group is
/// killed). `stdout` keeps the raw bytes (up to the cap) for callers that parse them.
pub async fn capture(
    sandbox: &SessionSandbox,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Captured, PoolError> {
    let p = spawn(
        &sandbox.live,
        StartCommand::new(argv, env, cwd),
        stdin.is_some(),
    )
    .await?;
    let writer = match (p.stdin, stdin) {
        (Some(fd), Some(data)) => Some(tokio::spawn(async move {
            if let Ok(mut tx) = StdioStream::new(fd) {
                // The process may have exited without reading its stdin: its outcome says what happened.
                let _ = tx.write_all(&data).await;
                let _ = tx.shutdown().await;
            }
        })),
        _ => None,
    };
    let mut out = tokio::spawn(read_all(p.stdout));
    let mut err = tokio::spawn(read_all(p.stderr));
    let mut timed_out = false;
    let exit = match tokio::time::timeout(timeout, p.exit).await {
        Ok(e) => e.ok(),
        Err(_) => {
            timed_out = true;
            // It may have exited already.
            let _ = sandbox.live.signal(p.id, libc::SIGKILL, true);
            None
        }
    };
    let exit_code = exit.map_or(137, |e| e.exit_code);
    let drained = Instant::now() + DRAIN;
    let stdout = tokio::time::timeout_at(drained, &mut out).await;
    let stderr = tokio::time::timeout_at(drained, &mut err).await;
    out.abort();
    err.abort();
    if let Some(w) = writer {
        w.abort();
    }
    let stdout = stdout.ok().and_then(Result::ok).unwrap_or_default();
    let stderr = stderr.ok().and_then(Result::ok).unwrap_or_default();
    let limit = timed_out.then_some(("the command was killed", timeout));
    Ok(Captured {
        output: RunOutput::new(&stdout, &stderr, exit_code, limit, Vec::new()),
        stdout: stdout.bytes,
    })
}

/// `run_shell`: `command` under the sandbox's shell.
pub async fn shell(
    shared: &Shared,
    sandbox: &SessionSandbox,
    command: &str,
    env: Vec<(String, String)>,
    timeout: Duration,
) -> Result<RunOutput, PoolError> {
    let argv = vec![sandbox.shell.to_string(), "-c".into(), command.to_string()];
    let c = capture(sandbox, argv, env, shared.workdir().into(), None, timeout).await?;
    Ok(c.output)
}

/// Lines as a text: each followed by `\n` (a blank line from a raw pipe is `"\n"`).
fn push_line(kept: &mut Kept, line: &str) {
    if line != "\n" {
        kept.push(line.as_bytes());
    }
    kept.push(b"\n");
}

/// `run_python`: `code` in the session's persistent interpreter (started on first use, or
/// again when it died). The value of a last bare expression is printed. At the time limit
/// the execution is interrupted (`KeyboardInterrupt`); an interpreter that does not stop
/// within [`INTERRUPT_GRACE`] is killed, and the next call starts a new one (the result says
/// its variables are gone).
pub async fn python(
    shared: &Shared,
    sandbox: &SessionSandbox,
    code: &str,
    env: Vec<(String, String)>,
    timeout: Duration,
) -> Result<RunOutput, PoolError> {
    let mut slot = sandbox.python.lock().await;
    let mut notes = Vec::new();
    let ctx = match slot.as_ref().filter(|c| !c.is_dead()) {
        Some(c) => c.clone(),
        None => {
            if slot.is_some() {
                notes.push("the Python interpreter had exited: this is a new one (variables from before are gone)".to_string());
            }
            let c = Arc::new(
                PythonContext::start(&shared.output, &sandbox.live, env, shared.workdir().into())
                    .await?,
            );
            *slot = Some(c.clone());
            c
        }
    };
    let mut events = ctx.execute(code);
    let (mut out, mut err) = (Kept::default(), Kept::default());
    let mut exit_code = 0;
    let mut timed_out = false;
    let mut deadline = Instant::now() + timeout;
    let mut interrupted = false;
    loop {
        let ev = match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(ev) => ev,
            Err(_) if !interrupted => {
                timed_out = true;
                interrupted = true;
                // It may have exited already.
                let _ = sandbox.live.signal(ctx.interpreter.id, libc::SIGINT, false);
                deadline = Instant::now() + INTERRUPT_GRACE;
                continue;
            }
            Err(_) => {
                // It may have exited already.
                let _ = sandbox.live.signal(ctx.interpreter.id, libc::SIGKILL, true);
                *slot = None;
                exit_code = 137;
                notes.push("the Python interpreter did not stop when interrupted and was killed: the next call starts a new one (variables are gone)".into());
                break;
            }
        };
        match ev {
            None | Some(CodeEvent::Done) => break,
            Some(CodeEvent::Running(_)) => {}
            Some(CodeEvent::Stdout(l)) => push_line(&mut out, &l),
            Some(CodeEvent::Stderr(l)) => push_line(&mut err, &l),
            Some(CodeEvent::Result(r)) => push_line(&mut out, &r),
            // A chart, a value with rich forms: its text form (the tool's answer is text).
            Some(CodeEvent::Display(d) | CodeEvent::RichResult(d)) => {
                if let Some(t) = d.get("text/plain").and_then(|t| t.as_str()) {
                    push_line(&mut out, t);
                }
            }
            Some(CodeEvent::Error(e)) => {
                exit_code = 1;
                if e.ename == "DeadKernelError" {
                    exit_code = 137;
                    *slot = None;
                    notes.push("the Python interpreter exited (killed, out of memory, or os._exit): the next call starts a new one (variables are gone)".into());
                }
                if e.traceback.is_empty() {
                    push_line(&mut err, &format!("{}: {}", e.ename, e.evalue));
                } else {
                    err.push(e.traceback.concat().as_bytes());
                }
                break;
            }
        }
    }
    let limit = timed_out.then_some(("the execution was interrupted", timeout));
    Ok(RunOutput::new(&out, &err, exit_code, limit, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_kept_up_to_the_cap_and_the_rest_counted() {
        let mut k = Kept::default();
        k.push(&vec![b'a'; OUTPUT_CAP - 1]);
        k.push(b"bcd");
        assert_eq!(k.bytes.len(), OUTPUT_CAP);
        assert_eq!(k.cut, 2);
        assert!(k.text().ends_with("[... 2 more bytes cut ...]\n"));
        let mut k = Kept::default();
        push_line(&mut k, "x");
        push_line(&mut k, "\n");
        push_line(&mut k, "");
        assert_eq!(k.text(), "x\n\n\n");
    }
}
