//! Commands (`/command...`): a command runs in the sandbox under its shell (or as an argv),
//! in the foreground (its output streamed as events, a keep-alive `ping` every few seconds)
//! or in the background (status and logs asked for later); interrupt and timeout kill its
//! whole process group. The sandbox's entrypoint is a command too (started by
//! [`crate::lifecycle`]), its output kept as the sandbox's log.
//!
//! A command's log keeps its newest 8 MiB (`LOG_CAP_BYTES`), and a sandbox's logs together
//! at most `SANDBOX_LOG_BUDGET` (the oldest finished commands are forgotten first); at most
//! `KEPT_FINISHED_COMMANDS` (256) finished commands are kept.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrun_pool::live::ProcessExit;
use agentrun_pool::output_log::OutputLog;
use agentrun_pool::{lock, PoolError};
use agentrun_telemetry::{ExecSpan, FrontEnd, RunFinish, RunSpan, Sinks};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};

use crate::auth::{ExecdRun, ExecdSandbox, ExecdSandboxAnyState};
use crate::error::{found, ApiError, ApiResult, JsonBody};
use crate::events::{event, event_queue, stream_response};
pub use crate::held::{Command, CommandState};
use crate::lines::{command_log, text_since};
use crate::params::segment;
use crate::process::shell;
use crate::{finish_span, random_token, rfc3339, Record, Server};
use agentrun_pool::lines::PipeLines;
use agentrun_pool::process::{Spawned, StartCommand};

/// How long output is still waited for after a process exited (children may hold the pipes).
const OUTPUT_GRACE: Duration = Duration::from_millis(200);
/// After [`OUTPUT_GRACE`], output already in the pipe is still taken, this much at most
/// (children that keep writing would otherwise hold the run open forever). A count, not a
/// time: a starved daemon is late, and what the process wrote must not be lost for that.
const OUTPUT_AFTER_GRACE: usize = 1024 * 1024;
/// Keep-alive interval of event streams.
const PING_EVERY: Duration = Duration::from_secs(3);

pub(super) fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route("/command", post(run).delete(interrupt))
        .route("/command/status/{cid}", get(status))
        .route("/command/{cid}/logs", get(logs))
        .with_state(server)
}

impl Command {
    /// A command now running, its log counting against `rec`'s log budget.
    pub fn running(rec: &Record, id: String, content: String, process: u64) -> Command {
        Command {
            id,
            content,
            process,
            started_at: Utc::now(),
            state: Mutex::new(CommandState {
                running: true,
                exit_code: None,
                error: String::new(),
                finished_at: None,
                log: command_log(rec.log_budget.clone()),
            }),
        }
    }

    /// Marks it finished with `exit_code`.
    pub fn finish(&self, rec: &Record, exit_code: i32, error: String) {
        {
            let mut st = lock(&self.state);
            st.running = false;
            st.exit_code = Some(exit_code);
            st.finished_at = Some(Utc::now());
            st.error = error;
        }
        if self.id != ENTRYPOINT {
            rec.finished_commands.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The id of the sandbox's main process among its commands.
pub(crate) const ENTRYPOINT: &str = "entrypoint";

/// A `POST .../command` body as sent.
#[derive(Deserialize)]
pub struct RunCommand {
    command: Option<String>,
    argv: Option<Vec<String>>,
    cwd: Option<String>,
    #[serde(default)]
    background: bool,
    timeout: Option<u64>,
    uid: Option<u32>,
    gid: Option<u32>,
    #[serde(default)]
    envs: HashMap<String, String>,
}

/// Adds `line` of `stream` (1 stdout, 2 stderr) to `cmd`'s log. Over the sandbox's log
/// budget, its oldest finished commands are forgotten first; if that is not enough the log
/// drops its own oldest lines.
fn keep(rec: &Record, cmd: &Command, stream: u8, line: &str) {
    let cost = OutputLog::cost(line.len());
    if rec.log_budget.would_exceed(cost) && rec.finished_commands.load(Ordering::SeqCst) > 0 {
        forget_finished(rec, cost);
    }
    lock(&cmd.state).log.push(stream, line.as_bytes());
}

/// Forwards one output stream of a command: every line into its log and, while a client
/// follows the run (`live`), as an event to it, waiting while the client's queue is full.
/// Once the process exited (`exited`), output is still waited for during [`OUTPUT_GRACE`],
/// and what is already in the pipe is taken until it would wait (at most
/// [`OUTPUT_AFTER_GRACE`] more; time spent waiting on the client does not count): then `done`
/// fires and the client is let go, as children may hold the pipe open forever; the log keeps
/// taking what comes until EOF.
async fn pump_output(
    rec: Arc<Record>,
    cmd: Arc<Command>,
    fd: OwnedFd,
    kind: &'static str,
    mut live: Option<mpsc::Sender<Bytes>>,
    mut exited: watch::Receiver<bool>,
    done: oneshot::Sender<()>,
) {
    let stream = if kind == "stderr" { 2 } else { 1 };
    let mut lines = PipeLines::new(fd);
    let mut done = Some(done);
    let mut stop_at: Option<tokio::time::Instant> = None;
    let mut after_grace = 0usize;
    loop {
        let line = match (done.is_some(), stop_at) {
            (false, _) => lines.next().await,
            (true, None) => tokio::select! {
                l = lines.next() => l,
                _ = exited.wait_for(|e| *e) => {
                    stop_at = Some(tokio::time::Instant::now() + OUTPUT_GRACE);
                    continue;
                }
            },
            (true, Some(at)) => {
                // Within the grace, wait for output; past it, take what is in the pipe
                // already (a busy daemon may look late: that is not lost), up to a cap
                // (children that never stop writing).
                let now = tokio::time::Instant::now();
                let next = if now < at {
                    tokio::select! {
                        l = lines.next() => Some(l),
                        // Then what is in the pipe, below.
                        _ = tokio::time::sleep_until(at) => continue,
                    }
                } else if after_grace < OUTPUT_AFTER_GRACE && lines.has_pending() {
                    let l = lines.next().await;
                    after_grace += l.as_ref().map_or(0, |l| l.len() + 1);
                    Some(l)
                } else {
                    None
                };
                match next {
                    Some(l) => l,
                    None => {
                        live = None;
                        if let Some(d) = done.take() {
                            let _ = d.send(());
                        }
                        continue;
                    }
                }
            }
        };
        let Some(l) = line else { break };
        if let Some(t) = &live {
            let waited = tokio::time::Instant::now();
            if t.send(event(kind, json!({ "text": &l }))).await.is_err() {
                live = None; // the client went away: the log still gets everything
            }
            if let Some(at) = stop_at.as_mut() {
                *at += waited.elapsed();
            }
        }
        keep(&rec, &cmd, stream, &l);
    }
    if let Some(d) = done {
        let _ = d.send(());
    }
}

/// Forwards a command's stdout and stderr ([`pump_output`]) on the server's output runtime,
/// as events to `live` while a client follows the run. Returns what tells them the process
/// exited and, per stream, what fires once its client is let go.
pub(crate) fn pump_outputs(
    server: &Server,
    rec: &Arc<Record>,
    cmd: &Arc<Command>,
    stdout: OwnedFd,
    stderr: OwnedFd,
    live: Option<mpsc::Sender<Bytes>>,
) -> (watch::Sender<bool>, Vec<oneshot::Receiver<()>>) {
    let (exited_tx, exited) = watch::channel(false);
    let readers = [(stdout, "stdout"), (stderr, "stderr")]
        .into_iter()
        .map(|(fd, kind)| {
            let (done, done_rx) = oneshot::channel();
            server.output.spawn(pump_output(
                rec.clone(),
                cmd.clone(),
                fd,
                kind,
                live.clone(),
                exited.clone(),
                done,
            ));
            done_rx
        })
        .collect();
    (exited_tx, readers)
}

/// A `POST .../command` body, checked without the sandbox: exactly one of a non-empty
/// `command` or `argv`, `gid` only with `uid`. Returns it with the command's user (`UID[:GID]`,
/// numeric ids inside the sandbox, whose root is 0; without `gid`, the group is the user's
/// primary group from the sandbox's /etc/passwd).
pub fn parse_run_command(body: &[u8]) -> ApiResult<(RunCommand, Option<String>)> {
    let req: RunCommand = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_body(format!("invalid request body: {e}")))?;
    let user = match (req.uid, req.gid) {
        (None, None) => None,
        (Some(u), None) => Some(u.to_string()),
        (Some(u), Some(g)) => Some(format!("{u}:{g}")),
        (None, Some(_)) => return Err(ApiError::invalid_body("gid needs uid")),
    };
    match (&req.command, &req.argv) {
        (Some(c), None) if !c.trim().is_empty() => {}
        (None, Some(a)) if !a.is_empty() => {}
        _ => {
            return Err(ApiError::invalid_body(
                "give exactly one of a non-empty command or argv",
            ))
        }
    }
    Ok((req, user))
}

/// `POST .../command`: the command checked and prepared ([`prepare`]), its span started, its
/// process spawned (a refusal there is an `error` event: [`spawn_failed`]), its output
/// forwarded, then supervised to its end ([`supervise`]) and finished ([`finish_command`]).
async fn run(
    ExecdRun(rec, trace): ExecdRun,
    State(server): State<Arc<Server>>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let (req, user) = parse_run_command(&body)?;
    rec.check_not_paused()?;
    let Prepared {
        argv,
        content,
        mut env,
        cwd,
    } = prepare(&rec, &req)?;
    let span = ExecSpan::new(trace.as_deref())
        .sandbox(&rec.id)
        .executable(&argv[0])
        .command_line(&content)
        .start();
    env.push(("TRACEPARENT".into(), span.traceparent()));
    let cmd = StartCommand::new(argv, env, cwd).user(user);
    let started = Instant::now();
    let Spawned {
        id: pid,
        stdout,
        stderr,
        exit,
        ..
    } = match agentrun_pool::process::spawn(&rec.sandbox, cmd, false).await {
        Ok(p) => p,
        Err(PoolError::Spawn { exit_code, message }) => {
            let ran = Ran {
                server: &server,
                rec: &rec,
                content: &content,
                started,
            };
            return spawn_failed(ran, span, exit_code, message);
        }
        Err(e) => return Err(e.into()),
    };
    let cmd = Arc::new(Command::running(&rec, random_token()?, content, pid));
    remember(&rec, &cmd);
    let (tx, rx) = event_queue();
    let _ = tx.try_send(event("init", json!({"text": cmd.id})));
    let live_tx = if req.background {
        let _ = tx.try_send(event("execution_complete", json!({"execution_time": 0})));
        None
    } else {
        Some(tx)
    };
    let (exited_tx, readers) = pump_outputs(&server, &rec, &cmd, stdout, stderr, live_tx.clone());
    let timeout = req.timeout.filter(|t| *t > 0).map(Duration::from_millis);
    tokio::spawn(async move {
        let (result, timed_out) = supervise(&rec, pid, exit, timeout, live_tx.as_ref()).await;
        let _ = exited_tx.send(true);
        for r in readers {
            let _ = r.await;
        }
        let ran = Ran {
            server: &server,
            rec: &rec,
            content: &cmd.content,
            started,
        };
        let last = finish_command(ran, &cmd, span, pid, &result, timed_out, timeout);
        if let Some(t) = live_tx {
            let _ = t.send(last).await;
        }
    });
    Ok(stream_response(rx))
}

/// A command as it will run: its argv (a `command` runs under the sandbox's shell), the
/// content it is known by, its environment and working directory.
struct Prepared {
    argv: Vec<String>,
    content: String,
    env: Vec<(String, String)>,
    cwd: String,
}

/// The argv, environment (the env file's variables, `set_env`, under the request's own) and
/// working directory of a checked request.
fn prepare(rec: &Record, req: &RunCommand) -> ApiResult<Prepared> {
    let (argv, content) = match (&req.command, &req.argv) {
        (Some(c), _) => (
            vec![shell(rec).to_string(), "-c".into(), c.clone()],
            c.clone(),
        ),
        (None, a) => {
            let a = a.clone().unwrap_or_default();
            let content = a.join(" ");
            (a, content)
        }
    };
    let mut env = crate::execd::envfile::load(rec);
    env.retain(|(k, _)| !req.envs.contains_key(k));
    env.extend(req.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
    let cwd = crate::process::expand_cwd(rec, req.cwd.as_deref(), &env)?;
    Ok(Prepared {
        argv,
        content,
        env,
        cwd,
    })
}

/// Waits for a command's exit, sending keep-alives to its live client and killing its process
/// group at `timeout`. Returns how it exited and whether the timeout killed it.
async fn supervise(
    rec: &Record,
    pid: u64,
    mut exit: oneshot::Receiver<ProcessExit>,
    timeout: Option<Duration>,
    live: Option<&mpsc::Sender<Bytes>>,
) -> (ProcessExit, bool) {
    let mut timed_out = false;
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let result = loop {
        tokio::select! {
            r = &mut exit => break r.unwrap_or_default(),
            _ = ping.tick() => {
                // A keep-alive: not needed (so not waited for) while output queues up.
                if let Some(t) = live {
                    let _ = t.try_send(event("ping", json!({"text": "pong"})));
                }
            }
            _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() && !timed_out => {
                timed_out = true;
                // It may have exited already.
                let _ = rec.sandbox.signal(pid, libc::SIGKILL, true);
            }
        }
    };
    (result, timed_out)
}

/// What a command's end is written with: its server (audit log), sandbox, content and start.
struct Ran<'a> {
    server: &'a Server,
    rec: &'a Record,
    content: &'a str,
    started: Instant,
}

impl Ran<'_> {
    /// Writes the run's end: [`finish_run`].
    fn finish(&self, finish: RunFinish, span: RunSpan) {
        finish_run(self.server, self.rec, self.content, finish, span);
    }
}

/// Writes the end of a command of `rec` known by `content` ([`RunFinish`]: span, runs
/// counter, `run` audit record with the sandbox's profile, id and the span's trace) before
/// the client sees it, and exports the span off the async threads. The record is written
/// unsynced (in the file at once, on disk with the log's next synced append or the
/// kernel's writeback): an `fdatasync` per command slowed the next command down. Also what
/// the E2B front end's processes (commands of the sandbox) end with.
pub fn finish_run(
    server: &Server,
    rec: &Record,
    content: &str,
    finish: RunFinish,
    mut span: RunSpan,
) {
    let finish = finish
        .profile(rec.sandbox.profile())
        .sandbox(&rec.id)
        .trace(&span.traceparent())
        .command(content);
    let written = finish.write(Sinks {
        span: Some(&mut span),
        audit: Some(&server.audit),
        audit_unsynced: true,
        counter: Some(agentrun_pool::metrics::global()),
        violation_metric: false,
    });
    if let Err(e) = written {
        tracing::error!(target: "agentrun::opensandbox", sandbox = %rec.id, "audit log: {e}");
    }
    finish_span(span);
}

/// A command the sandbox refused to start (`exit_code`, `message`): its run finished as
/// failed, and a stream of its `init` and `error` events.
fn spawn_failed(
    ran: Ran<'_>,
    span: RunSpan,
    exit_code: i32,
    message: String,
) -> ApiResult<Response> {
    let finish = RunFinish::failed(FrontEnd::OpenSandbox, "spawn", message.as_str())
        .exit(exit_code)
        .duration(ran.started.elapsed());
    ran.finish(finish, span);
    let id = random_token()?;
    let (tx, rx) = event_queue();
    let _ = tx.try_send(event("init", json!({"text": id})));
    let _ = tx.try_send(event(
        "error",
        json!({"error": {"ename": "CommandExecError", "evalue": exit_code.to_string(), "traceback": [message]}}),
    ));
    Ok(stream_response(rx))
}

/// A command's end: its state (status, error), its run finished ([`Ran::finish`]); returns
/// the last event of its stream (`execution_complete`, or `error` saying why).
fn finish_command(
    ran: Ran<'_>,
    cmd: &Command,
    span: RunSpan,
    pid: u64,
    result: &ProcessExit,
    timed_out: bool,
    timeout: Option<Duration>,
) -> Bytes {
    let elapsed = ran.started.elapsed();
    let why = if timed_out {
        format!(
            "timed out after {} ms",
            timeout.unwrap_or_default().as_millis()
        )
    } else if result.exit_code != 0 {
        format!("exit status {}", result.exit_code)
    } else {
        String::new()
    };
    cmd.finish(ran.rec, result.exit_code, why.clone());
    let finish = RunFinish::exited(FrontEnd::OpenSandbox, result.exit_code, timed_out, elapsed)
        .pid(pid as i64);
    ran.finish(finish, span);
    if result.exit_code == 0 {
        event(
            "execution_complete",
            json!({"execution_time": elapsed.as_millis() as i64}),
        )
    } else {
        event(
            "error",
            json!({"error": {"ename": "CommandExecError", "evalue": result.exit_code.to_string(), "traceback": [why]}}),
        )
    }
}

#[derive(Deserialize)]
struct IdQuery {
    id: Option<String>,
}

async fn interrupt(
    ExecdSandbox(rec): ExecdSandbox,
    Query(q): Query<IdQuery>,
) -> ApiResult<StatusCode> {
    let id = q.id.ok_or_else(|| ApiError::missing_query("id"))?;
    let cmd = find_command(&rec, &id)?;
    // The whole process group: everything the command started.
    rec.sandbox.signal(cmd.process, libc::SIGKILL, true)?;
    Ok(StatusCode::OK)
}

/// Finished commands a sandbox keeps (status and logs); older finished ones are forgotten.
const KEPT_FINISHED_COMMANDS: usize = 256;

/// Adds `cmd` to the sandbox's commands, forgetting the oldest finished ones beyond
/// [`KEPT_FINISHED_COMMANDS`] (the entrypoint is always kept): with each command's log
/// capped and all of them within the sandbox's log budget, what a long-lived sandbox holds in
/// memory is bounded.
pub fn remember(rec: &Record, cmd: &Arc<Command>) {
    lock(&rec.commands).insert(cmd.id.clone(), cmd.clone());
    forget_finished(rec, 0);
}

/// Forgets the oldest finished commands (never the entrypoint) while more than
/// [`KEPT_FINISHED_COMMANDS`] are kept or `incoming` more log bytes would go over the
/// sandbox's log budget.
fn forget_finished(rec: &Record, incoming: usize) {
    let mut commands = lock(&rec.commands);
    let mut finished: Vec<(DateTime<Utc>, String)> = commands
        .values()
        .filter(|c| c.id != ENTRYPOINT && !lock(&c.state).running)
        .map(|c| (c.started_at, c.id.clone()))
        .collect();
    finished.sort();
    let mut excess = finished.len().saturating_sub(KEPT_FINISHED_COMMANDS);
    for (_, id) in finished {
        if excess == 0 && !rec.log_budget.would_exceed(incoming) {
            break;
        }
        // Its log goes with the last reference (a logs request may still hold one).
        drop(commands.remove(&id));
        rec.finished_commands.fetch_sub(1, Ordering::SeqCst);
        excess = excess.saturating_sub(1);
    }
}

fn find_command(rec: &Record, cid: &str) -> ApiResult<Arc<Command>> {
    found(&lock(&rec.commands), cid, "COMMAND_NOT_FOUND", "command")
}

async fn status(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    Path(p): Path<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let cmd = find_command(&rec, segment(&p, "cid"))?;
    let st = lock(&cmd.state);
    Ok(Json(json!({
        "id": cmd.id,
        "content": cmd.content,
        "running": st.running,
        "exit_code": st.exit_code,
        "error": st.error,
        "started_at": rfc3339(cmd.started_at),
        "finished_at": st.finished_at.map(rfc3339),
    })))
}

#[derive(Deserialize)]
struct CursorQuery {
    cursor: Option<usize>,
}

async fn logs(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<CursorQuery>,
) -> ApiResult<Response> {
    let cmd = find_command(&rec, segment(&p, "cid"))?;
    let st = lock(&cmd.state);
    let text = text_since(&st.log, q.cursor.unwrap_or(0));
    Ok((
        [
            ("content-type", "text/plain; charset=utf-8".to_string()),
            ("EXECD-COMMANDS-TAIL-CURSOR", st.log.end().to_string()),
        ],
        text,
    )
        .into_response())
}
