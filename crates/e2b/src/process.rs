//! envd's `process.Process` service: `Start` (a process in the sandbox, its stdout and
//! stderr streamed as they come, raw bytes, then its end; with `stdin`, a pipe as its
//! stdin; with `pty`, a terminal of that size as its stdin, stdout and stderr, whose output
//! comes as `pty` data: the SDK's `pty.create`), `List` (the processes started here and
//! still running), `SendSignal` (SIGTERM or SIGKILL to its whole process group: the SDK's
//! `commands.kill`, `pty.kill`), `SendInput` and `CloseStdin` (the SDK's `send_stdin`,
//! `close_stdin`, `pty.send_stdin`), `StreamInput` (the same input as a client stream of
//! messages, written as they come: `stream_input`), `Update` (a terminal's new size:
//! `pty.resize`), `Connect` (another stream of a running process's events from then on: the
//! SDK's `commands.connect`, `pty.connect`, [`Feed`]).
//!
//! A process is a command of the sandbox in the OpenSandbox front end's sense
//! ([`agentrun_opensandbox::execd::Command`], id = its pid here), started by
//! [`agentrun_pool::process::spawn`] (a terminal: [`agentrun_pool::process::spawn_terminal`],
//! the pty machinery of the Docker front end) with the request's argv, env over the sandbox's, cwd
//! (default: root's home, `/` for another user) and user (`Authorization: Basic`). Its pid is agentrun's id of
//! the process in the sandbox (what signals name), not the kernel's.
//!
//! Output is read on the server's output runtime in chunks of at most
//! [`agentrun_pool::stdio::CHUNK`] through a bounded queue: a client that does not read makes
//! the process wait on its pipe. A `Connect-Timeout-Ms` deadline kills the process group and
//! ends the stream with `deadline_exceeded`; a keep-alive event goes out every
//! `Keepalive-Ping-Interval` seconds (default [`KEEPALIVE_DEFAULT`]).
//!
//! Every process is a run ([`agentrun_telemetry::RunFinish`], `FrontEnd::E2b`), finished as
//! an OpenSandbox command is ([`finish_run`]): its `sandbox.exec` span (child of the
//! request's `traceparent`, whose own `TRACEPARENT` the process gets unless the request sets
//! one), the runs counter and the `run` audit record, written before the client sees its end.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrun_opensandbox::execd::commands::{finish_run, remember};
use agentrun_opensandbox::execd::Command;
use agentrun_opensandbox::{Record, Server};
use agentrun_pool::process::{Spawned, SpawnedTerminal, StartCommand};
use agentrun_pool::stdio::StdioStream;
use agentrun_pool::{lock, PoolError};
use agentrun_telemetry::{ExecSpan, FrontEnd, RunFinish};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::{Extension, Router};
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;

use crate::connect::{self, Streamed, Unary};
use crate::error::{Code, RpcError, RpcResult};

/// Keep-alive interval when the request names none.
pub const KEEPALIVE_DEFAULT: Duration = Duration::from_secs(50);
/// How long output is still waited for after the process exited (children may hold its
/// pipes open).
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

/// The service's routes; [`crate::router`] puts them behind the sandbox's access token.
pub fn routes(server: Arc<Server>, processes: Arc<Processes>) -> Router {
    Router::new()
        .route("/process.Process/Start", post(start))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/Connect", post(connect_process))
        .route("/process.Process/SendInput", post(send_input))
        .route("/process.Process/StreamInput", post(stream_input))
        .route("/process.Process/CloseStdin", post(close_stdin))
        .route("/process.Process/Update", post(update))
        .layer(Extension(processes))
        .with_state(server)
}

/// Where a process's events go: its `Start` call's stream and every `Connect`'s. Once it
/// ended, its last envelopes are kept for a `Connect` that comes just then.
#[derive(Default)]
pub struct Feed {
    state: std::sync::Mutex<FeedState>,
}

#[derive(Default)]
struct FeedState {
    subscribers: Vec<mpsc::Sender<Bytes>>,
    end: Option<Vec<Bytes>>,
}

impl Feed {
    /// Adds a stream (after its start event); one that comes after the end gets the end.
    fn subscribe(&self, tx: mpsc::Sender<Bytes>) {
        let mut st = lock(&self.state);
        match &st.end {
            Some(end) => {
                for b in end {
                    let _ = tx.try_send(b.clone());
                }
            }
            None => st.subscribers.push(tx),
        }
    }

    /// Sends `b` to every stream, waiting on each one's queue: a client that does not read
    /// holds the process back (its pipe fills), as one client did. Closed streams are dropped.
    async fn send(&self, b: Bytes) {
        let subs: Vec<_> = lock(&self.state).subscribers.clone();
        for s in subs {
            let _ = s.send(b.clone()).await;
        }
        lock(&self.state).subscribers.retain(|s| !s.is_closed());
    }

    /// `b` to every stream with room for it (keep-alives).
    fn offer(&self, b: Bytes) {
        for s in &lock(&self.state).subscribers {
            let _ = s.try_send(b.clone());
        }
    }

    /// The last envelopes: sent to every stream, and kept for late `Connect`s.
    async fn end(&self, last: Vec<Bytes>) {
        let subs = {
            let mut st = lock(&self.state);
            st.end = Some(last.clone());
            std::mem::take(&mut st.subscribers)
        };
        for s in subs {
            for b in &last {
                let _ = s.send(b.clone()).await;
            }
        }
    }
}

/// The running processes of a listener's sandboxes that `Connect` can reach, and the
/// terminals of those started on one, by (sandbox, pid).
#[derive(Default)]
pub struct Processes {
    feeds: std::sync::Mutex<HashMap<(String, u32), Arc<Feed>>>,
    ptys: std::sync::Mutex<HashMap<(String, u32), Arc<Terminal>>>,
}

/// Our end of a process's terminal: its input written here, its size set here.
struct Terminal {
    input: Arc<tokio::sync::Mutex<StdioStream>>,
    master: std::fs::File,
}

impl Processes {
    /// The terminal of running process `pid` of sandbox `rec`.
    fn pty(&self, rec: &Record, pid: u32) -> RpcResult<Arc<Terminal>> {
        lock(&self.ptys)
            .get(&(rec.id.clone(), pid))
            .cloned()
            .ok_or_else(|| {
                RpcError::new(
                    Code::NotFound,
                    format!("process {pid} not found, or not started with a pty"),
                )
            })
    }
}

/// `ConnectRequest`.
#[derive(Deserialize, Debug)]
pub struct ConnectRequest {
    pub process: Option<Selector>,
}

async fn connect_process(
    Extension(rec): Extension<Arc<Record>>,
    Extension(processes): Extension<Arc<Processes>>,
    headers: HeaderMap,
    Streamed(req): Streamed<ConnectRequest>,
) -> Response {
    match connect_inner(&rec, &processes, &headers, req) {
        Ok(r) => r,
        Err(e) => connect::stream_error(&e),
    }
}

fn connect_inner(
    rec: &Record,
    processes: &Processes,
    headers: &HeaderMap,
    req: ConnectRequest,
) -> RpcResult<Response> {
    let pid = pid_of(req.process)?;
    let feed = lock(&processes.feeds)
        .get(&(rec.id.clone(), pid))
        .cloned()
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("process {pid} not found")))?;
    let (keepalive, deadline) = stream_params(headers);
    let (tx, rx) = connect::stream_queue();
    let _ = tx.try_send(event(json!({"start": {"pid": pid}})));
    feed.subscribe(tx.clone());
    // This stream's own deadline ends it (the process runs on); keep-alives meanwhile.
    tokio::spawn(async move {
        let mut ping = tokio::time::interval(keepalive);
        ping.tick().await;
        let until = deadline.map(|d| tokio::time::Instant::now() + d);
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                _ = ping.tick() => { let _ = tx.try_send(event(json!({"keepalive": {}}))); }
                _ = async { tokio::time::sleep_until(until.unwrap_or_else(tokio::time::Instant::now)).await }, if until.is_some() => {
                    let err = RpcError::new(Code::DeadlineExceeded, "the connection's timeout passed (the process runs on)");
                    let _ = tx.send(connect::end_stream(Some(&err))).await;
                    return;
                }
            }
        }
    });
    Ok(connect::stream_response(rx))
}

/// `ProcessConfig`.
#[derive(Deserialize, Serialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ProcessConfig {
    #[serde(default)]
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `StartRequest`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct StartRequest {
    #[serde(default)]
    pub process: Option<ProcessConfig>,
    #[serde(default)]
    pub pty: Option<Pty>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub stdin: Option<bool>,
}

/// `PTY`: a terminal's size.
#[derive(Deserialize, Debug)]
pub struct Pty {
    #[serde(default)]
    pub size: Option<PtySize>,
}

/// `PTY.Size`.
#[derive(Deserialize, Debug)]
pub struct PtySize {
    #[serde(default)]
    pub rows: u32,
    #[serde(default)]
    pub cols: u32,
}

impl Pty {
    /// Its (rows, cols): each 1 to 65535, else `invalid_argument`.
    pub fn rows_cols(&self) -> RpcResult<(u16, u16)> {
        let (rows, cols) = self.size.as_ref().map_or((0, 0), |s| (s.rows, s.cols));
        let dim = |n: u32| u16::try_from(n).ok().filter(|n| *n > 0);
        match (dim(rows), dim(cols)) {
            (Some(r), Some(c)) => Ok((r, c)),
            _ => Err(RpcError::invalid(format!(
                "pty.size {rows}x{cols}: rows and cols must be 1 to 65535"
            ))),
        }
    }
}

/// A process's stdio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdio {
    /// Pipes: stdout and stderr apart; stdin a pipe when `stdin`, else `/dev/null`.
    Pipes { stdin: bool },
    /// A terminal of (rows, cols).
    Pty(u16, u16),
}

/// A `StartRequest`, checked: its process config (a command is required) and its stdio (a
/// terminal of a valid size, or pipes with or without stdin).
pub fn check_start(req: StartRequest) -> RpcResult<(ProcessConfig, Stdio)> {
    let stdio = match &req.pty {
        Some(pty) => {
            let (rows, cols) = pty.rows_cols()?;
            Stdio::Pty(rows, cols)
        }
        None => Stdio::Pipes {
            stdin: req.stdin.unwrap_or(false),
        },
    };
    let p = req
        .process
        .ok_or_else(|| RpcError::invalid("process is required"))?;
    if p.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd is required"));
    }
    for s in std::iter::once(&p.cmd).chain(&p.args) {
        if s.contains('\0') {
            return Err(RpcError::invalid("process.cmd and args may not hold NUL"));
        }
    }
    for (k, v) in &p.envs {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(RpcError::invalid(format!("envs {k:?}: invalid variable")));
        }
    }
    Ok((p, stdio))
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn event(ev: serde_json::Value) -> Bytes {
    connect::message(&json!({ "event": ev }))
}

/// The client's keep-alive interval (`Keepalive-Ping-Interval`, seconds) and deadline
/// (`Connect-Timeout-Ms`).
pub(crate) fn stream_params(headers: &HeaderMap) -> (Duration, Option<Duration>) {
    let num = |h: &str| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let keepalive = num("keepalive-ping-interval")
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(KEEPALIVE_DEFAULT);
    let deadline = num("connect-timeout-ms")
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    (keepalive, deadline)
}

async fn start(
    State(server): State<Arc<Server>>,
    Extension(rec): Extension<Arc<Record>>,
    Extension(processes): Extension<Arc<Processes>>,
    headers: HeaderMap,
    Streamed(req): Streamed<StartRequest>,
) -> Response {
    match start_inner(&server, &rec, &processes, &headers, req).await {
        Ok(r) => r,
        Err(e) => connect::stream_error(&e),
    }
}

async fn start_inner(
    server: &Arc<Server>,
    rec: &Arc<Record>,
    processes: &Arc<Processes>,
    headers: &HeaderMap,
    req: StartRequest,
) -> RpcResult<Response> {
    let (p, stdio) = check_start(req)?;
    let user = crate::auth::user_of(headers).map_err(RpcError::invalid)?;
    rec.check_running()?;
    rec.check_not_paused()?;
    let mut env: Vec<(String, String)> = p.envs.into_iter().collect();
    // No cwd: root's home; another user's is not known here (its /etc/passwd entry may
    // name one it cannot enter), so `/`.
    let default_cwd = if user.is_none() { "~" } else { "/" };
    let cwd = agentrun_opensandbox::process::expand_cwd(
        rec,
        Some(
            p.cwd
                .as_deref()
                .filter(|c| !c.is_empty())
                .unwrap_or(default_cwd),
        ),
        &env,
    )?;
    let mut argv = vec![p.cmd];
    argv.extend(p.args);
    let content = argv.join(" ");
    let span = ExecSpan::new(crate::traceparent(headers))
        .sandbox(&rec.id)
        .executable(&argv[0])
        .command_line(&content)
        .start();
    if !env.iter().any(|(k, _)| k == "TRACEPARENT") {
        env.push(("TRACEPARENT".into(), span.traceparent()));
    }
    let cmd = StartCommand::new(argv, env, cwd).user(user);
    let started = Instant::now();
    let Started {
        id,
        stdin,
        outputs,
        pty,
        exit,
    } = match spawn(&rec.sandbox, cmd, stdio).await {
        Ok(s) => s,
        Err(PoolError::Spawn { exit_code, message }) => {
            let finish = RunFinish::failed(FrontEnd::E2b, "spawn", message.as_str())
                .exit(exit_code)
                .duration(started.elapsed());
            finish_run(server, rec, &content, finish, span);
            return Err(RpcError::new(Code::InvalidArgument, message));
        }
        Err(e) => return Err(RpcError::from(agentrun_opensandbox::ApiError::from(e))),
    };
    let pid = u32::try_from(id)
        .map_err(|_| RpcError::new(Code::Internal, "process id out of the pid range"))?;
    let cmd = Arc::new(Command::running(rec, pid.to_string(), content, id));
    remember(rec, &cmd);
    let key = (rec.id.clone(), pid);
    if let Some(fd) = stdin {
        let stream = StdioStream::new(fd)
            .map_err(|e| RpcError::new(Code::Internal, format!("stdin: {e}")))?;
        let input = Arc::new(tokio::sync::Mutex::new(stream));
        match pty {
            Some(master) => {
                lock(&processes.ptys).insert(key.clone(), Arc::new(Terminal { input, master }));
            }
            None => {
                lock(&rec.stdin).insert(id, input);
            }
        }
    }
    let (keepalive, deadline) = stream_params(headers);
    let (tx, rx) = connect::stream_queue();
    let _ = tx.try_send(event(json!({"start": {"pid": pid}})));
    let feed = Arc::new(Feed::default());
    feed.subscribe(tx);
    lock(&processes.feeds).insert(key.clone(), feed.clone());
    // The output readers: each chunk an event, waiting on the clients' queues (with no
    // client, output is read and dropped, and a later Connect gets what comes next).
    let readers = outputs.len();
    let (out_done_tx, mut out_done) = mpsc::channel::<()>(2);
    for (fd, kind) in outputs {
        let (feed, done) = (feed.clone(), out_done_tx.clone());
        server.output.spawn(async move {
            agentrun_pool::stdio::pump(fd, |chunk| {
                let feed = feed.clone();
                async move {
                    feed.send(event(json!({"data": {kind: b64(&chunk)}}))).await;
                    true
                }
            })
            .await;
            let _ = done.send(()).await;
        });
    }
    drop(out_done_tx);
    let (server, rec, sandbox, processes) = (
        server.clone(),
        rec.clone(),
        rec.sandbox.clone(),
        processes.clone(),
    );
    tokio::spawn(async move {
        let mut exit = exit;
        let mut ping = tokio::time::interval(keepalive);
        ping.tick().await;
        let until = deadline.map(|d| tokio::time::Instant::now() + d);
        let mut timed_out = false;
        let result = loop {
            tokio::select! {
                r = &mut exit => break r.unwrap_or_default(),
                _ = ping.tick() => feed.offer(event(json!({"keepalive": {}}))),
                _ = async { tokio::time::sleep_until(until.unwrap_or_else(tokio::time::Instant::now)).await }, if until.is_some() && !timed_out => {
                    timed_out = true;
                    // It may have exited already.
                    let _ = sandbox.signal(id, libc::SIGKILL, true);
                }
            }
        };
        // Output the process wrote before it exited is sent before its end; children that
        // hold the pipes open are not waited for past the grace.
        let grace = tokio::time::sleep(OUTPUT_GRACE);
        tokio::pin!(grace);
        for _ in 0..readers {
            tokio::select! {
                _ = out_done.recv() => {}
                _ = &mut grace => break,
            }
        }
        let status = match result.signal {
            Some(s) => format!("signal: {}", signal_name(s)),
            None => format!("exit status {}", result.exit_code),
        };
        lock(&rec.stdin).remove(&id);
        lock(&processes.ptys).remove(&key);
        cmd.finish(&rec, result.exit_code, status.clone());
        let mut finish = RunFinish::exited(
            FrontEnd::E2b,
            result.exit_code,
            timed_out,
            started.elapsed(),
        )
        .pid(id as i64);
        finish.signal = result.signal;
        finish_run(&server, &rec, &cmd.content, finish, span);
        let last = if timed_out {
            let err = RpcError::new(
                Code::DeadlineExceeded,
                "the command's timeout passed: it was killed",
            );
            vec![connect::end_stream(Some(&err))]
        } else {
            let mut end = json!({"exitCode": result.exit_code, "exited": result.signal.is_none(), "status": status});
            if result.signal.is_some() {
                end["error"] = json!(status);
            }
            vec![event(json!({ "end": end })), connect::end_stream(None)]
        };
        feed.end(last).await;
        lock(&processes.feeds).remove(&key);
    });
    Ok(connect::stream_response(rx))
}

/// A process just started: our ends of its stdio (its stdin writer, its outputs with the
/// data field each is sent as, the pty master of a terminal) and its exit.
struct Started {
    id: u64,
    stdin: Option<OwnedFd>,
    outputs: Vec<(OwnedFd, &'static str)>,
    pty: Option<std::fs::File>,
    exit: tokio::sync::oneshot::Receiver<agentrun_pool::live::ProcessExit>,
}

/// Starts `cmd` in the sandbox on pipes or a terminal ([`Stdio`]).
async fn spawn(
    sandbox: &Arc<agentrun_pool::live::LiveSandbox>,
    cmd: StartCommand,
    stdio: Stdio,
) -> Result<Started, PoolError> {
    match stdio {
        Stdio::Pipes { stdin } => {
            let Spawned {
                id,
                stdin,
                stdout,
                stderr,
                exit,
            } = agentrun_pool::process::spawn(sandbox, cmd, stdin).await?;
            Ok(Started {
                id,
                stdin,
                outputs: vec![(stdout, "stdout"), (stderr, "stderr")],
                pty: None,
                exit,
            })
        }
        Stdio::Pty(rows, cols) => {
            let SpawnedTerminal { id, master, exit } =
                agentrun_pool::process::spawn_terminal(sandbox, cmd, (rows, cols)).await?;
            let clone = |what| {
                master
                    .try_clone()
                    .map(OwnedFd::from)
                    .map_err(|e| PoolError::Io(what, e))
            };
            Ok(Started {
                id,
                stdin: Some(clone("pty input")?),
                outputs: vec![(clone("pty output")?, "pty")],
                pty: Some(master),
                exit,
            })
        }
    }
}

fn signal_name(s: i32) -> String {
    match s {
        libc::SIGKILL => "killed".into(),
        libc::SIGTERM => "terminated".into(),
        libc::SIGINT => "interrupt".into(),
        n => format!("signal {n}"),
    }
}

async fn list(
    Extension(rec): Extension<Arc<Record>>,
    _: Unary<serde_json::Value>,
) -> RpcResult<Response> {
    let processes: Vec<serde_json::Value> = lock(&rec.commands)
        .values()
        .filter(|c| c.id.parse::<u32>().is_ok() && lock(&c.state).running)
        .map(|c| {
            let mut argv = c.content.split(' ');
            let cmd = argv.next().unwrap_or("");
            json!({"pid": c.id.parse::<u32>().unwrap_or(0), "config": {"cmd": cmd, "args": argv.collect::<Vec<_>>()}})
        })
        .collect();
    Ok(connect::unary_response(&json!({ "processes": processes })))
}

/// `ProcessSelector`.
#[derive(Deserialize, Debug)]
pub struct Selector {
    pub pid: Option<u32>,
    pub tag: Option<String>,
}

/// `SendSignalRequest`.
#[derive(Deserialize, Debug)]
pub struct SignalRequest {
    pub process: Option<Selector>,
    #[serde(default)]
    pub signal: serde_json::Value,
}

/// A `SendSignalRequest`, checked: the pid and the signal (SIGTERM or SIGKILL, by name or
/// number).
pub fn check_signal(req: SignalRequest) -> RpcResult<(u32, i32)> {
    let pid = pid_of(req.process)?;
    let signal = match &req.signal {
        serde_json::Value::String(s) if s == "SIGNAL_SIGKILL" => libc::SIGKILL,
        serde_json::Value::String(s) if s == "SIGNAL_SIGTERM" => libc::SIGTERM,
        serde_json::Value::Number(n) if n.as_i64() == Some(9) => libc::SIGKILL,
        serde_json::Value::Number(n) if n.as_i64() == Some(15) => libc::SIGTERM,
        other => {
            return Err(RpcError::invalid(format!(
                "signal {other}: expected SIGNAL_SIGKILL or SIGNAL_SIGTERM"
            )))
        }
    };
    Ok((pid, signal))
}

async fn send_signal(
    Extension(rec): Extension<Arc<Record>>,
    Unary(req): Unary<SignalRequest>,
) -> RpcResult<Response> {
    let (pid, signal) = check_signal(req)?;
    let cmd = lock(&rec.commands)
        .get(&pid.to_string())
        .cloned()
        .filter(|c| lock(&c.state).running)
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("process {pid} not found")))?;
    rec.sandbox
        .signal(cmd.process, signal, true)
        .map_err(|e| RpcError::from(agentrun_opensandbox::ApiError::from(e)))?;
    Ok(connect::unary_response(&json!({})))
}

/// `SendInputRequest`.
#[derive(Deserialize, Debug)]
pub struct InputRequest {
    pub process: Option<Selector>,
    pub input: Option<Input>,
}

/// `ProcessInput`.
#[derive(Deserialize, Debug)]
pub struct Input {
    pub stdin: Option<String>,
    pub pty: Option<String>,
}

fn pid_of(sel: Option<Selector>) -> RpcResult<u32> {
    let sel = sel.ok_or_else(|| RpcError::invalid("process is required"))?;
    if sel.tag.is_some() {
        return Err(RpcError::unimplemented(
            "selecting a process by tag is not served by agentrun's envd yet",
        ));
    }
    sel.pid
        .ok_or_else(|| RpcError::invalid("process.pid is required"))
}

/// Where input goes: a process's stdin pipe or its terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Stdin,
    Pty,
}

impl Input {
    /// Its target and bytes (base64 in the message); `invalid_argument` for both or for bad
    /// base64. Neither is no bytes for stdin (an empty field may be left out).
    pub fn decode(self) -> RpcResult<(Target, Vec<u8>)> {
        let (target, field, b) = match (self.stdin, self.pty) {
            (b, None) => (Target::Stdin, "stdin", b.unwrap_or_default()),
            (None, Some(b)) => (Target::Pty, "pty", b),
            (Some(_), Some(_)) => {
                return Err(RpcError::invalid("input: expected one of stdin or pty"))
            }
        };
        let data = base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| RpcError::invalid(format!("input.{field}: {e}")))?;
        Ok((target, data))
    }
}

/// A `SendInputRequest`, checked: the pid, where the bytes go and the bytes.
pub fn check_input(req: InputRequest) -> RpcResult<(u32, Target, Vec<u8>)> {
    let pid = pid_of(req.process)?;
    let (target, data) = req
        .input
        .ok_or_else(|| RpcError::invalid("input is required"))?
        .decode()?;
    Ok((pid, target, data))
}

/// The stdin of process `pid`, if it runs and was started with one.
fn stdin_of(rec: &Record, pid: u32) -> RpcResult<Arc<tokio::sync::Mutex<StdioStream>>> {
    lock(&rec.stdin)
        .get(&u64::from(pid))
        .cloned()
        .ok_or_else(|| {
            RpcError::new(
                Code::NotFound,
                format!("process {pid} not found, or started without stdin"),
            )
        })
}

/// The writer of `pid`'s stdin or terminal.
fn input_of(
    rec: &Record,
    processes: &Processes,
    pid: u32,
    target: Target,
) -> RpcResult<Arc<tokio::sync::Mutex<StdioStream>>> {
    match target {
        Target::Stdin => stdin_of(rec, pid),
        Target::Pty => Ok(processes.pty(rec, pid)?.input.clone()),
    }
}

/// Writes `data` to `pid`'s stdin or terminal.
async fn write_input(
    rec: &Record,
    processes: &Processes,
    pid: u32,
    target: Target,
    data: &[u8],
) -> RpcResult<()> {
    use tokio::io::AsyncWriteExt;
    let w = input_of(rec, processes, pid, target)?;
    let mut w = w.lock().await;
    w.write_all(data)
        .await
        .map_err(|e| RpcError::new(Code::FailedPrecondition, format!("input of {pid}: {e}")))
}

async fn send_input(
    Extension(rec): Extension<Arc<Record>>,
    Extension(processes): Extension<Arc<Processes>>,
    Unary(req): Unary<InputRequest>,
) -> RpcResult<Response> {
    let (pid, target, data) = check_input(req)?;
    write_input(&rec, &processes, pid, target, &data).await?;
    Ok(connect::unary_response(&json!({})))
}

/// `UpdateRequest`.
#[derive(Deserialize, Debug)]
pub struct UpdateRequest {
    pub process: Option<Selector>,
    pub pty: Option<Pty>,
}

/// `Update`: the terminal's new size (TIOCSWINSZ on its master; the process gets SIGWINCH).
/// Without `pty`, nothing to change (as envd).
async fn update(
    Extension(rec): Extension<Arc<Record>>,
    Extension(processes): Extension<Arc<Processes>>,
    Unary(req): Unary<UpdateRequest>,
) -> RpcResult<Response> {
    let pid = pid_of(req.process)?;
    let size = req.pty.as_ref().map(Pty::rows_cols).transpose()?;
    let terminal = processes.pty(&rec, pid)?;
    if let Some((rows, cols)) = size {
        agentrun_pool::stdio::set_window_size(&terminal.master, rows, cols).map_err(|e| {
            RpcError::new(Code::Internal, format!("resizing the pty of {pid}: {e}"))
        })?;
    }
    Ok(connect::unary_response(&json!({})))
}

/// `StreamInputRequest`: a `start` naming the process first, then `data` and `keepalive`
/// in any number.
#[derive(Deserialize, Debug)]
pub struct StreamInputRequest {
    pub start: Option<StreamInputStart>,
    pub data: Option<StreamInputData>,
    pub keepalive: Option<serde_json::Value>,
}

/// `StreamInputRequest.StartEvent`.
#[derive(Deserialize, Debug)]
pub struct StreamInputStart {
    pub process: Option<Selector>,
}

/// `StreamInputRequest.DataEvent`.
#[derive(Deserialize, Debug)]
pub struct StreamInputData {
    pub input: Option<Input>,
}

/// `StreamInput` (client streaming): each `data` message written to the process's stdin or
/// terminal as it comes, in order; then `{}`. The request's envelopes are read from the body
/// as they arrive (each within [`connect::MAX_MESSAGE`]); an error ends the stream with it.
async fn stream_input(
    Extension(rec): Extension<Arc<Record>>,
    Extension(processes): Extension<Arc<Processes>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let result = async {
        let mut messages = connect::ClientStream::new(&headers, body)?;
        let first: StreamInputRequest = messages
            .next()
            .await?
            .ok_or_else(|| RpcError::invalid("the input stream ended before its start"))?;
        let start = first.start.ok_or_else(|| {
            RpcError::invalid("the input stream's first message must be its start")
        })?;
        let pid = pid_of(start.process)?;
        while let Some(msg) = messages.next::<StreamInputRequest>().await? {
            if msg.start.is_some() {
                return Err(RpcError::invalid("the input stream has one start"));
            }
            let Some(data) = msg.data else { continue };
            let (target, bytes) = data
                .input
                .ok_or_else(|| RpcError::invalid("data.input is required"))?
                .decode()?;
            write_input(&rec, &processes, pid, target, &bytes).await?;
        }
        Ok(())
    }
    .await;
    connect::client_stream_response(result.err().as_ref())
}

#[derive(Deserialize, Debug)]
struct CloseRequest {
    process: Option<Selector>,
}

async fn close_stdin(
    Extension(rec): Extension<Arc<Record>>,
    Unary(req): Unary<CloseRequest>,
) -> RpcResult<Response> {
    let pid = pid_of(req.process)?;
    // The process sees EOF once the last handle goes (a write in flight holds one).
    lock(&rec.stdin)
        .remove(&u64::from(pid))
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("process {pid} has no stdin open")))?;
    Ok(connect::unary_response(&json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_requests_are_checked() {
        let ok: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false}"#,
        )
        .unwrap();
        let (p, _) = check_start(ok).unwrap();
        assert_eq!(p.args, vec!["-l", "-c", "echo hi"]);
        assert_eq!(p.cwd.as_deref(), Some("/tmp"));
        let pty: StartRequest =
            serde_json::from_str(r#"{"process":{"cmd":"x"},"pty":{"size":{"cols":80,"rows":24}}}"#)
                .unwrap();
        assert_eq!(check_start(pty).unwrap().1, Stdio::Pty(24, 80));
        for bad in [
            r#"{"process":{"cmd":"x"},"pty":{"size":{"cols":0,"rows":24}}}"#,
            r#"{"process":{"cmd":"x"},"pty":{"size":{"cols":80,"rows":70000}}}"#,
            r#"{"process":{"cmd":"x"},"pty":{}}"#,
        ] {
            let r: StartRequest = serde_json::from_str(bad).unwrap();
            assert_eq!(
                check_start(r).unwrap_err().code,
                Code::InvalidArgument,
                "{bad}"
            );
        }
        let with_stdin: StartRequest =
            serde_json::from_str(r#"{"process":{"cmd":"cat"},"stdin":true}"#).unwrap();
        assert_eq!(
            check_start(with_stdin).unwrap().1,
            Stdio::Pipes { stdin: true }
        );
        let none: StartRequest = serde_json::from_str(r#"{}"#).unwrap();
        assert_eq!(check_start(none).unwrap_err().code, Code::InvalidArgument);
        let bad_env: StartRequest =
            serde_json::from_str(r#"{"process":{"cmd":"x","envs":{"A=B":"1"}}}"#).unwrap();
        assert_eq!(
            check_start(bad_env).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn signals_by_name_or_number() {
        let r: SignalRequest =
            serde_json::from_str(r#"{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(check_signal(r).unwrap(), (7, libc::SIGKILL));
        let r: SignalRequest =
            serde_json::from_str(r#"{"process":{"pid":7},"signal":15}"#).unwrap();
        assert_eq!(check_signal(r).unwrap(), (7, libc::SIGTERM));
        let r: SignalRequest =
            serde_json::from_str(r#"{"process":{"pid":7},"signal":"SIGNAL_SIGHUP"}"#).unwrap();
        assert_eq!(check_signal(r).unwrap_err().code, Code::InvalidArgument);
    }

    #[test]
    fn input_is_base64() {
        let r: InputRequest =
            serde_json::from_str(r#"{"process":{"pid":3},"input":{"stdin":"aGkK"}}"#).unwrap();
        assert_eq!(
            check_input(r).unwrap(),
            (3, Target::Stdin, b"hi\n".to_vec())
        );
        let r: InputRequest =
            serde_json::from_str(r#"{"process":{"pid":3},"input":{"pty":"aGkK"}}"#).unwrap();
        assert_eq!(check_input(r).unwrap(), (3, Target::Pty, b"hi\n".to_vec()));
        let r: InputRequest = serde_json::from_str(r#"{"process":{"pid":3},"input":{}}"#).unwrap();
        assert_eq!(check_input(r).unwrap(), (3, Target::Stdin, vec![]));
        for bad in [
            r#"{"process":{"pid":3},"input":{"stdin":"%%"}}"#,
            r#"{"process":{"pid":3},"input":{"stdin":"","pty":""}}"#,
        ] {
            let r: InputRequest = serde_json::from_str(bad).unwrap();
            assert_eq!(
                check_input(r).unwrap_err().code,
                Code::InvalidArgument,
                "{bad}"
            );
        }
    }
}
