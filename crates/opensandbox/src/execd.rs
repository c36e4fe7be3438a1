//! The execd API of one sandbox (served under `/execd/{sid}`): ping, commands (foreground
//! streaming, background with logs and status, interrupt, timeout), sessions (a persistent
//! bash), metrics; the egress sidecar's `/policy` (under `/egress/{sid}`). Code contexts are
//! in [`crate::code`].
//!
//! Output reaches agentrun through pipes whose write ends are passed into the sandbox; each
//! line becomes one bare-JSON event (`{"type":"stdout","text":...}` + blank line), as real
//! execd streams them.
//!
//! Every buffer between a process and a client is bounded. A run's event stream is a queue of
//! [`EVENT_QUEUE`] events: a client that reads slowly (or not at all) makes its process wait
//! on its pipe, as a terminal or `docker attach` does. A session's shell and a code context's
//! interpreter are read through a queue of [`LINE_QUEUE`] lines that only a run in progress
//! drains: output written between runs (`yes &`) waits there, then in the pipe, and then the
//! writer blocks until the next run reads it. A command's log keeps its newest 8 MiB, and a
//! sandbox's logs together at most [`crate::lines::SANDBOX_LOG_BUDGET`] (the oldest finished
//! commands are forgotten first).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrun_pool::live::{ProcessExit, ProcessSpec};
use agentrun_pool::PoolError;
use agentrun_telemetry::ExecSpan;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::{ApiError, ApiResult, JsonBody};
use crate::lifecycle::{constant_time_eq, finish_span};
use crate::lines::{LineLog, PipeLines, LOG_CAP_BYTES};
use crate::{lock, now_ms, random_token, rfc3339, Record, Server};

/// How long output is still waited for after a process exited (children may hold the pipes).
const OUTPUT_GRACE: Duration = Duration::from_millis(200);
/// After [`OUTPUT_GRACE`], output already in the pipe is still taken, this much at most
/// (children that keep writing would otherwise hold the run open forever). A count, not a
/// time: a starved daemon is late, and what the process wrote must not be lost for that.
const OUTPUT_AFTER_GRACE: usize = 1024 * 1024;
/// Keep-alive interval of event streams.
const PING_EVERY: Duration = Duration::from_secs(3);
/// Events a run's stream holds for its client (each at most one line, 64 KiB of text).
pub(crate) const EVENT_QUEUE: usize = 16;
/// Lines of a session's or code context's stdout (and as many of its stderr) held until a run
/// reads them.
pub(crate) const LINE_QUEUE: usize = 16;

pub fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route("/ping", get(ping))
        .route("/command", post(run_command).delete(interrupt))
        .route("/command/status/{cid}", get(command_status))
        .route("/command/{cid}/logs", get(command_logs))
        .route("/session", post(create_session))
        .route("/session/{ssid}", delete(delete_session))
        .route("/session/{ssid}/run", post(run_in_session))
        .route("/metrics", get(metrics))
        .route("/metrics/watch", get(metrics_watch))
        .with_state(server)
}

pub fn egress_routes(server: Arc<Server>) -> Router {
    Router::new()
        .route(
            "/policy",
            get(crate::egress::get_policy)
                .patch(crate::egress::patch_policy)
                .delete(crate::egress::delete_policy),
        )
        .route("/credential-vault", axum::routing::any(egress_unsupported))
        .route(
            "/credential-vault/{*rest}",
            axum::routing::any(egress_unsupported),
        )
        .with_state(server)
}

/// The sandbox a request is for, once its token checks out.
pub fn authorize(
    server: &Server,
    sid: &str,
    headers: &HeaderMap,
    header: &str,
) -> ApiResult<Arc<Record>> {
    let rec = server.record(sid)?;
    let want = if header == crate::EGRESS_TOKEN_HEADER {
        &rec.egress_token
    } else {
        &rec.token
    };
    let ok = headers
        .get(header)
        .is_some_and(|v| constant_time_eq(v.as_bytes(), want.as_bytes()));
    if !ok {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            format!("invalid or missing header {header}"),
        ));
    }
    Ok(rec)
}

pub(crate) fn execd(server: &Server, sid: &str, headers: &HeaderMap) -> ApiResult<Arc<Record>> {
    let rec = execd_any_state(server, sid, headers)?;
    rec.check_running()?;
    Ok(rec)
}

/// [`execd`] for what still answers after the sandbox ended (command status and logs).
fn execd_any_state(server: &Server, sid: &str, headers: &HeaderMap) -> ApiResult<Arc<Record>> {
    authorize(server, sid, headers, crate::EXECD_TOKEN_HEADER)
}

/// Middleware of `/execd/{sid}/...`: the sandbox's execd token must be in the headers before
/// anything reads the request's body (401, or 404 for no such sandbox, having read none of
/// it). Handlers check it again where they need the record.
pub(crate) async fn require_execd_token(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    req: Request,
    next: Next,
) -> Response {
    match authorize(
        &server,
        sid_of(&p),
        req.headers(),
        crate::EXECD_TOKEN_HEADER,
    ) {
        Ok(_) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// [`require_execd_token`] for `/egress/{sid}/...` and its token.
pub(crate) async fn require_egress_token(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    req: Request,
    next: Next,
) -> Response {
    match authorize(
        &server,
        sid_of(&p),
        req.headers(),
        crate::EGRESS_TOKEN_HEADER,
    ) {
        Ok(_) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Extracts the first path segment (the sandbox id) of a nested route.
pub(crate) fn sid_of(p: &HashMap<String, String>) -> &str {
    p.get("sid").map(String::as_str).unwrap_or("")
}

async fn ping(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    if rec.sandbox.is_dead() {
        return Err(ApiError::internal("the sandbox is gone"));
    }
    Ok(StatusCode::OK)
}

async fn egress_unsupported(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    authorize(&server, sid_of(&p), &headers, crate::EGRESS_TOKEN_HEADER)?;
    Err(ApiError::not_supported(
        "the credential vault is not supported",
    ))
}

/// One event of a stream, as execd encodes it.
pub(crate) fn event(kind: &str, extra: Value) -> Bytes {
    let mut v = json!({"type": kind, "timestamp": now_ms()});
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    let mut s = serde_json::to_string(&v).expect("json");
    s.push_str("\n\n");
    Bytes::from(s)
}

/// The queue of a run's event stream: [`EVENT_QUEUE`] events, then senders wait for the client.
pub(crate) fn event_queue() -> (mpsc::Sender<Bytes>, mpsc::Receiver<Bytes>) {
    mpsc::channel(EVENT_QUEUE)
}

/// A streaming response of events.
pub(crate) fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body = Body::from_stream(tokio_stream::StreamExt::map(
        stream,
        Ok::<_, std::convert::Infallible>,
    ));
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            ("x-accel-buffering", "no"),
        ],
        body,
    )
        .into_response()
}

/// What execd knows about one command.
pub struct Command {
    pub id: String,
    pub content: String,
    pub process: Mutex<Option<u64>>,
    pub started_at: DateTime<Utc>,
    pub state: Mutex<CommandState>,
}

impl Command {
    /// A command now running, its log counting against `rec`'s log budget.
    fn running(rec: &Record, id: String, content: String, process: u64) -> Command {
        Command {
            id,
            content,
            process: Mutex::new(Some(process)),
            started_at: Utc::now(),
            state: Mutex::new(CommandState {
                running: true,
                exit_code: None,
                error: String::new(),
                finished_at: None,
                log: LineLog::new(LOG_CAP_BYTES, rec.log_budget.clone()),
            }),
        }
    }

    /// Marks it finished with `exit_code`.
    fn finish(&self, rec: &Record, exit_code: i32, error: String) {
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

pub struct CommandState {
    pub running: bool,
    pub exit_code: Option<i32>,
    pub error: String,
    pub finished_at: Option<DateTime<Utc>>,
    /// stdout and stderr lines, in arrival order (the newest [`LOG_CAP_BYTES`], less when its
    /// sandbox's logs are over their budget).
    pub log: LineLog,
}

/// The id of the sandbox's main process among its commands.
const ENTRYPOINT: &str = "entrypoint";

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

pub(crate) fn pipe() -> ApiResult<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ApiError::internal(format!("pipe: {e}")))
}

pub(crate) fn dev_null() -> ApiResult<OwnedFd> {
    std::fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| ApiError::internal(format!("/dev/null: {e}")))
}

/// The shell commands run under: bash if the image has it, else sh.
fn shell(rec: &Record) -> &'static str {
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

/// Starts a process in the sandbox with stdout/stderr pipes. Returns the process id, the
/// read ends and the exit channel.
pub(crate) async fn spawn(
    rec: &Record,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    stdin: OwnedFd,
) -> Result<(u64, OwnedFd, OwnedFd, oneshot::Receiver<ProcessExit>), PoolError> {
    spawn_as(rec, argv, env, cwd, stdin, None).await
}

/// [`spawn`] as `user` (`uid[:gid]`, resolved by the sandbox's init; `None`: the sandbox's
/// root).
pub(crate) async fn spawn_as(
    rec: &Record,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    stdin: OwnedFd,
    user: Option<String>,
) -> Result<(u64, OwnedFd, OwnedFd, oneshot::Receiver<ProcessExit>), PoolError> {
    let (out_r, out_w) = pipe().map_err(|e| PoolError::Invalid(e.message))?;
    let (err_r, err_w) = pipe().map_err(|e| PoolError::Invalid(e.message))?;
    let (tx, rx) = oneshot::channel();
    let sandbox = rec.sandbox.clone();
    let spec = ProcessSpec {
        argv,
        env,
        cwd,
        stdio: [stdin, out_w, err_w],
        new_session: false,
        user,
        on_exit: Box::new(move |e| {
            let _ = tx.send(e);
        }),
    };
    let p = tokio::task::spawn_blocking(move || sandbox.spawn(spec))
        .await
        .map_err(|e| PoolError::Invalid(e.to_string()))??;
    Ok((p.id, out_r, err_r, rx))
}

/// The lines of a pipe (a session's shell, a code context's interpreter), read into a queue
/// of [`LINE_QUEUE`] lines: when nobody takes them the reading stops and the process blocks
/// on its pipe once that is full. Ends at EOF or when the receiver is dropped.
pub(crate) fn queued_lines(server: &Server, fd: OwnedFd) -> mpsc::Receiver<String> {
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

/// Adds `line` to `cmd`'s log. Over the sandbox's log budget, its oldest finished commands
/// are forgotten first; if that is not enough the log drops its own oldest lines.
fn keep(rec: &Record, cmd: &Command, line: &str) {
    if rec.log_budget.would_exceed(LineLog::cost(line))
        && rec.finished_commands.load(Ordering::SeqCst) > 0
    {
        forget_finished(rec, LineLog::cost(line));
    }
    lock(&cmd.state).log.push(line);
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
        keep(&rec, &cmd, &l);
    }
    if let Some(d) = done {
        let _ = d.send(());
    }
}

/// The sandbox's main process: the create request's entrypoint. Its output is kept as the
/// sandbox's log (last lines only).
pub async fn start_entrypoint(server: &Arc<Server>, rec: &Arc<Record>) -> ApiResult<()> {
    let (id, out, err, exit) = match spawn(
        rec,
        rec.entrypoint.clone(),
        Vec::new(),
        "/".into(),
        dev_null()?,
    )
    .await
    {
        Ok(x) => x,
        Err(PoolError::Spawn { message, .. }) => {
            return Err(ApiError::bad_request(format!("entrypoint: {message}")))
        }
        Err(e) => return Err(e.into()),
    };
    let cmd = Arc::new(Command::running(
        rec,
        ENTRYPOINT.into(),
        rec.entrypoint.join(" "),
        id,
    ));
    remember(rec, &cmd);
    let (exited_tx, exited) = watch::channel(false);
    for (fd, kind) in [(out, "stdout"), (err, "stderr")] {
        let (done, _) = oneshot::channel();
        server.output.spawn(pump_output(
            rec.clone(),
            cmd.clone(),
            fd,
            kind,
            None,
            exited.clone(),
            done,
        ));
    }
    let (live, rec) = (server.live.clone(), rec.clone());
    tokio::spawn(async move {
        let e = exit.await.unwrap_or_default();
        let _ = exited_tx.send(true);
        cmd.finish(&rec, e.exit_code, String::new());
        rec.entrypoint_exited(&live, e.exit_code);
    });
    Ok(())
}

fn invalid_body(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", message)
}

/// A `POST .../command` body, checked without the sandbox: exactly one of a non-empty
/// `command` or `argv`, `gid` only with `uid`. Returns it with the command's user (`UID[:GID]`,
/// numeric ids inside the sandbox, whose root is 0; without `gid`, the group is the user's
/// primary group from the sandbox's /etc/passwd).
pub fn parse_run_command(body: &[u8]) -> ApiResult<(RunCommand, Option<String>)> {
    let req: RunCommand = serde_json::from_slice(body)
        .map_err(|e| invalid_body(format!("invalid request body: {e}")))?;
    let user = match (req.uid, req.gid) {
        (None, None) => None,
        (Some(u), None) => Some(u.to_string()),
        (Some(u), Some(g)) => Some(format!("{u}:{g}")),
        (None, Some(_)) => return Err(invalid_body("gid needs uid".into())),
    };
    match (&req.command, &req.argv) {
        (Some(c), None) if !c.trim().is_empty() => {}
        (None, Some(a)) if !a.is_empty() => {}
        _ => {
            return Err(invalid_body(
                "give exactly one of a non-empty command or argv".into(),
            ))
        }
    }
    Ok((req, user))
}

async fn run_command(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let (req, user) = parse_run_command(&body)?;
    if rec.state().0 == "Paused" {
        return Err(ApiError::conflict("the sandbox is paused"));
    }
    let (argv, content) = match (&req.command, &req.argv) {
        (Some(c), _) => (
            vec![shell(&rec).to_string(), "-c".into(), c.clone()],
            c.clone(),
        ),
        (None, a) => {
            let a = a.clone().unwrap_or_default();
            let content = a.join(" ");
            (a, content)
        }
    };
    let cwd = req
        .cwd
        .clone()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "/".into());
    let mut span = ExecSpan::new(headers.get("traceparent").and_then(|v| v.to_str().ok()))
        .sandbox(&rec.id)
        .executable(&argv[0])
        .command_line(&content)
        .start();
    let mut env: Vec<(String, String)> = req.envs.into_iter().collect();
    env.push(("TRACEPARENT".into(), span.traceparent()));
    let started = Instant::now();
    let (pid, out, err, exit) = match spawn_as(&rec, argv, env, cwd, dev_null()?, user).await {
        Ok(x) => x,
        Err(PoolError::Spawn { exit_code, message }) => {
            span.set_attribute("process.exit.code", exit_code as i64);
            span.set_error("spawn", &message);
            finish_span(span);
            let id = random_token()?;
            let (tx, rx) = event_queue();
            let _ = tx.try_send(event("init", json!({"text": id})));
            let _ = tx.try_send(event(
                "error",
                json!({"error": {"ename": "CommandExecError", "evalue": exit_code.to_string(), "traceback": [message]}}),
            ));
            return Ok(stream_response(rx));
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
    let (exited_tx, exited) = watch::channel(false);
    let readers: Vec<oneshot::Receiver<()>> = [(out, "stdout"), (err, "stderr")]
        .into_iter()
        .map(|(fd, kind)| {
            let (done, done_rx) = oneshot::channel();
            server.output.spawn(pump_output(
                rec.clone(),
                cmd.clone(),
                fd,
                kind,
                live_tx.clone(),
                exited.clone(),
                done,
            ));
            done_rx
        })
        .collect();
    let sandbox = rec.sandbox.clone();
    let timeout = req.timeout.filter(|t| *t > 0).map(Duration::from_millis);
    tokio::spawn(async move {
        let mut exit = exit;
        let mut timed_out = false;
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.tick().await;
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let result = loop {
            tokio::select! {
                r = &mut exit => break r.unwrap_or_default(),
                _ = ping.tick() => {
                    // A keep-alive: not needed (so not waited for) while output queues up.
                    if let Some(t) = &live_tx {
                        let _ = t.try_send(event("ping", json!({"text": "pong"})));
                    }
                }
                _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() && !timed_out => {
                    timed_out = true;
                    let _ = sandbox.signal(pid, libc::SIGKILL, true);
                }
            }
        };
        let _ = exited_tx.send(true);
        for r in readers {
            let _ = r.await;
        }
        let elapsed = started.elapsed().as_millis() as i64;
        let error = if timed_out {
            format!(
                "timed out after {} ms",
                timeout.unwrap_or_default().as_millis()
            )
        } else if result.exit_code != 0 {
            format!("exit status {}", result.exit_code)
        } else {
            String::new()
        };
        cmd.finish(&rec, result.exit_code, error);
        span.set_attribute("process.exit.code", result.exit_code as i64);
        span.set_attribute("process.pid", pid as i64);
        span.set_attribute("sandbox.timed_out", timed_out);
        span.set_attribute("sandbox.duration_ms", elapsed);
        if result.exit_code != 0 {
            span.set_error(
                if timed_out { "timeout" } else { "exit_code" },
                &format!("exit status {}", result.exit_code),
            );
        }
        finish_span(span);
        if let Some(t) = live_tx {
            let last = if result.exit_code == 0 {
                event("execution_complete", json!({"execution_time": elapsed}))
            } else {
                let why = if timed_out {
                    format!(
                        "timed out after {} ms",
                        timeout.unwrap_or_default().as_millis()
                    )
                } else {
                    format!("exit status {}", result.exit_code)
                };
                event(
                    "error",
                    json!({"error": {"ename": "CommandExecError", "evalue": result.exit_code.to_string(), "traceback": [why]}}),
                )
            };
            let _ = t.send(last).await;
        }
    });
    Ok(stream_response(rx))
}

#[derive(Deserialize)]
struct IdQuery {
    id: Option<String>,
}

async fn interrupt(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<IdQuery>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let id = q.id.ok_or_else(|| ApiError::missing_query("id"))?;
    let cmd = find_command(&rec, &id)?;
    if let Some(pid) = *lock(&cmd.process) {
        // The whole process group: everything the command started.
        rec.sandbox.signal(pid, libc::SIGKILL, true)?;
    }
    Ok(StatusCode::OK)
}

/// Finished commands a sandbox keeps (status and logs); older finished ones are forgotten.
const KEPT_FINISHED_COMMANDS: usize = 256;

/// Adds `cmd` to the sandbox's commands, forgetting the oldest finished ones beyond
/// [`KEPT_FINISHED_COMMANDS`] (the entrypoint is always kept): with each command's log
/// capped and all of them within the sandbox's log budget, what a long-lived sandbox holds in
/// memory is bounded.
fn remember(rec: &Record, cmd: &Arc<Command>) {
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
    lock(&rec.commands)
        .get(cid)
        .cloned()
        .ok_or_else(|| ApiError::not_found("COMMAND_NOT_FOUND", format!("no command {cid}")))
}

async fn command_status(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let rec = execd_any_state(&server, sid_of(&p), &headers)?;
    let cmd = find_command(&rec, p.get("cid").map(String::as_str).unwrap_or(""))?;
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

async fn command_logs(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<CursorQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let rec = execd_any_state(&server, sid_of(&p), &headers)?;
    let cmd = find_command(&rec, p.get("cid").map(String::as_str).unwrap_or(""))?;
    let st = lock(&cmd.state);
    let text = st.log.text_since(q.cursor.unwrap_or(0));
    Ok((
        [
            ("content-type", "text/plain; charset=utf-8".to_string()),
            ("EXECD-COMMANDS-TAIL-CURSOR", st.log.end().to_string()),
        ],
        text,
    )
        .into_response())
}

/// A persistent shell: commands run one at a time in the same bash, so `cd` and `export`
/// persist. Each run ends with a marker line on stdout (with `$?`) and on stderr.
pub struct Session {
    pub id: String,
    process: u64,
    stdin: tokio::sync::Mutex<tokio::net::unix::pipe::Sender>,
    /// Output lines (stdout, stderr) of the shell, consumed by the run in progress
    /// ([`queued_lines`]: bounded, the shell waits when nobody reads).
    out: tokio::sync::Mutex<(mpsc::Receiver<String>, mpsc::Receiver<String>)>,
    marker: String,
    dead: Arc<std::sync::atomic::AtomicBool>,
}

/// A create-session body (empty: all defaults).
#[derive(Deserialize, Default)]
pub struct CreateSession {
    cwd: Option<String>,
}

/// Parses a create-session body; an empty or blank body means the defaults.
pub fn parse_create_session(body: &[u8]) -> ApiResult<CreateSession> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(CreateSession::default());
    }
    serde_json::from_slice(body).map_err(|e| invalid_body(format!("invalid request body: {e}")))
}

async fn create_session(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<Value>> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let req = parse_create_session(&body)?;
    if rec.state().0 == "Paused" {
        return Err(ApiError::conflict("the sandbox is paused"));
    }
    let (in_r, in_w) = pipe()?;
    let sh = shell(&rec);
    let cwd = req
        .cwd
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "/".into());
    let (pid, out, err, exit) = spawn(
        &rec,
        vec![sh.into(), "--noprofile".into(), "--norc".into()],
        Vec::new(),
        cwd,
        in_r,
    )
    .await
    .map_err(ApiError::from)?;
    let (orx, erx) = (queued_lines(&server, out), queued_lines(&server, err));
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = dead.clone();
    tokio::spawn(async move {
        let _ = exit.await;
        d.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let stdin = tokio::net::unix::pipe::Sender::from_owned_fd(in_w)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let session = Arc::new(Session {
        id: random_token()?,
        process: pid,
        stdin: tokio::sync::Mutex::new(stdin),
        out: tokio::sync::Mutex::new((orx, erx)),
        marker: format!("__agentrun_{}_", random_token()?),
        dead,
    });
    lock(&rec.sessions).insert(session.id.clone(), session.clone());
    Ok(Json(json!({"session_id": session.id})))
}

fn find_session(rec: &Record, ssid: &str) -> ApiResult<Arc<Session>> {
    lock(&rec.sessions)
        .get(ssid)
        .cloned()
        .ok_or_else(|| ApiError::not_found("SESSION_NOT_FOUND", format!("no session {ssid}")))
}

async fn delete_session(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let ssid = p.get("ssid").map(String::as_str).unwrap_or("");
    let s = lock(&rec.sessions)
        .remove(ssid)
        .ok_or_else(|| ApiError::not_found("SESSION_NOT_FOUND", format!("no session {ssid}")))?;
    let _ = rec.sandbox.signal(s.process, libc::SIGKILL, true);
    Ok(StatusCode::OK)
}

/// A run-in-session body.
#[derive(Deserialize)]
pub struct RunInSession {
    command: String,
    cwd: Option<String>,
    timeout: Option<u64>,
}

/// Parses a run-in-session body.
pub fn parse_run_in_session(body: &[u8]) -> ApiResult<RunInSession> {
    serde_json::from_slice(body).map_err(|e| invalid_body(format!("invalid request body: {e}")))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

async fn run_in_session(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let session = find_session(&rec, p.get("ssid").map(String::as_str).unwrap_or(""))?;
    let req = parse_run_in_session(&body)?;
    if session.dead.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "SESSION_DEAD",
            "the session's shell has exited",
        ));
    }
    let mut script = String::new();
    if let Some(cwd) = req.cwd.as_deref().filter(|c| !c.is_empty()) {
        script.push_str(&format!("cd {} || true\n", shell_quote(cwd)));
    }
    // The group keeps cd/export in this shell; its stdin is not the shell's script.
    script.push_str(&format!(
        "{{\n{}\n}} </dev/null\n__ar_rc=$?; printf '%s%d\\n' '{m}' \"$__ar_rc\"; printf '%s\\n' '{m}' >&2\n",
        req.command,
        m = session.marker
    ));
    let mut span = ExecSpan::new(headers.get("traceparent").and_then(|v| v.to_str().ok()))
        .sandbox(&rec.id)
        .command_line(&req.command)
        .start();
    let (tx, rx) = event_queue();
    let _ = tx.try_send(event("init", json!({"text": session.id})));
    let sandbox = rec.sandbox.clone();
    let timeout = req.timeout.filter(|t| *t > 0).map(Duration::from_millis);
    tokio::spawn(async move {
        let started = Instant::now();
        let mut out = session.out.lock().await;
        let mut stdin = session.stdin.lock().await;
        // The script is written while the output is read: a shell blocked on a full pipe
        // (output from before this run) reads no script until that output is taken.
        let write = tokio::io::AsyncWriteExt::write_all(&mut *stdin, script.as_bytes());
        tokio::pin!(write);
        let mut writing = true;
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let (mut code, mut out_done, mut err_done) = (None::<i32>, false, false);
        let mut timed_out = false;
        let (o, e) = &mut *out;
        while !(out_done && err_done) {
            tokio::select! {
                w = &mut write, if writing => {
                    writing = false;
                    if w.is_err() {
                        let _ = tx.send(event("error", json!({"error": {"ename": "CommandExecError", "evalue": "1", "traceback": ["the session's shell has exited"]}}))).await;
                        return;
                    }
                }
                l = o.recv(), if !out_done => match l {
                    Some(l) => match l.find(&session.marker) {
                        Some(i) => {
                            if i > 0 { let _ = tx.send(event("stdout", json!({"text": &l[..i]}))).await; }
                            code = l[i + session.marker.len()..].trim().parse().ok();
                            out_done = true;
                        }
                        None => { let _ = tx.send(event("stdout", json!({"text": l}))).await; }
                    },
                    None => { out_done = true; err_done = true; }
                },
                l = e.recv(), if !err_done => match l {
                    Some(l) => match l.find(&session.marker) {
                        Some(i) => {
                            if i > 0 { let _ = tx.send(event("stderr", json!({"text": &l[..i]}))).await; }
                            err_done = true;
                        }
                        None => { let _ = tx.send(event("stderr", json!({"text": l}))).await; }
                    },
                    None => { out_done = true; err_done = true; }
                },
                _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() && !timed_out => {
                    timed_out = true;
                    session.dead.store(true, std::sync::atomic::Ordering::SeqCst);
                    let _ = sandbox.signal(session.process, libc::SIGKILL, true);
                }
            }
        }
        let code = code.unwrap_or(if timed_out { 137 } else { 1 });
        span.set_attribute("process.exit.code", code as i64);
        span.set_attribute("sandbox.timed_out", timed_out);
        if code != 0 {
            span.set_error("exit_code", &format!("exit status {code}"));
        }
        finish_span(span);
        let last = if code == 0 {
            event(
                "execution_complete",
                json!({"execution_time": started.elapsed().as_millis() as i64}),
            )
        } else {
            let why = if timed_out {
                "timed out".to_string()
            } else {
                format!("exit status {code}")
            };
            event(
                "error",
                json!({"error": {"ename": "CommandExecError", "evalue": code.to_string(), "traceback": [why]}}),
            )
        };
        let _ = tx.send(last).await;
    });
    Ok(stream_response(rx))
}

async fn metrics(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let mut sample = lock(&rec.cpu_sample);
    Ok(Json(metrics_sample(&rec, &mut sample)?))
}

/// `/metrics/watch`: the metrics JSON every second (each followed by a blank line, as the
/// command streams), until the client goes away or the sandbox ends. CPU use is measured
/// over each interval of this stream.
async fn metrics_watch(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let mut sample = (Instant::now(), rec.sandbox.usage()?.cpu_ns);
    let (tx, rx) = event_queue();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if rec.check_running().is_err() {
                break;
            }
            let Ok(m) = metrics_sample(&rec, &mut sample) else {
                break;
            };
            let mut line = m.to_string();
            line.push_str("\n\n");
            if tx.send(Bytes::from(line)).await.is_err() {
                break; // the client went away
            }
        }
    });
    Ok(stream_response(rx))
}

/// The sandbox's metrics now; CPU use since `sample` (wall time, cgroup CPU ns), which is
/// updated.
fn metrics_sample(rec: &Record, sample: &mut (Instant, u64)) -> ApiResult<Value> {
    let usage = rec.sandbox.usage()?;
    let (cpus, mem_limit) = rec.sandbox.limits();
    let now = Instant::now();
    let pct = {
        let wall = now.duration_since(sample.0).as_nanos() as f64;
        let used = usage.cpu_ns.saturating_sub(sample.1) as f64;
        *sample = (now, usage.cpu_ns);
        if wall > 0.0 {
            (used / wall / cpus * 100.0).clamp(0.0, 100.0)
        } else {
            0.0
        }
    };
    let limit = if usage.memory_limit_bytes > 0 && usage.memory_limit_bytes < u64::MAX / 2 {
        usage.memory_limit_bytes
    } else {
        mem_limit
    };
    Ok(json!({
        "cpu_count": cpus,
        "cpu_used_pct": (pct * 100.0).round() / 100.0,
        "mem_total_mib": limit as f64 / (1u64 << 20) as f64,
        "mem_used_mib": ((usage.memory_bytes as f64 / (1u64 << 20) as f64) * 100.0).round() / 100.0,
        "timestamp": now_ms(),
    }))
}
