//! Sessions (`/session...`): a persistent shell in the sandbox, commands run one at a time in
//! it, so `cd` and `export` persist. Each run ends with a marker line on stdout (with `$?`)
//! and on stderr; its output is streamed as events.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrun_pool::lock;
use agentrun_telemetry::{ExecSpan, FrontEnd, RunFinish};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{delete, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::{ExecdRun, ExecdSandbox};
use crate::error::{found, ApiError, ApiResult, JsonBody};
use crate::events::{event, event_queue, stream_response};
pub use crate::held::Session;
use crate::params::segment;
use crate::process::shell;
use crate::{finish_span, random_token, Record, Server};
use agentrun_pool::process::InteractiveProcess;

/// The 404 code of a missing session.
const NOT_FOUND: &str = "SESSION_NOT_FOUND";

pub(super) fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route("/session", post(create))
        .route("/session/{ssid}", delete(delete_session))
        .route("/session/{ssid}/run", post(run))
        .with_state(server)
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
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_body(format!("invalid request body: {e}")))
}

async fn create(
    ExecdSandbox(rec): ExecdSandbox,
    State(server): State<Arc<Server>>,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<Value>> {
    let req = parse_create_session(&body)?;
    rec.check_not_paused()?;
    // The env file is read once: its variables expand cwd and start the shell.
    let env = crate::execd::envfile::load(&rec);
    let cwd = crate::process::expand_cwd(&rec, req.cwd.as_deref(), &env)?;
    let argv = vec![shell(&rec).into(), "--noprofile".into(), "--norc".into()];
    let cmd = agentrun_pool::process::StartCommand::new(argv, env, cwd);
    let process = InteractiveProcess::start(&server.output, &rec.sandbox, cmd).await?;
    let session = Arc::new(Session {
        id: random_token()?,
        shell: process,
        marker: format!("__agentrun_{}_", random_token()?),
    });
    lock(&rec.sessions).insert(session.id.clone(), session.clone());
    Ok(Json(json!({"session_id": session.id})))
}

fn find_session(rec: &Record, ssid: &str) -> ApiResult<Arc<Session>> {
    found(&lock(&rec.sessions), ssid, NOT_FOUND, "session")
}

async fn delete_session(
    ExecdSandbox(rec): ExecdSandbox,
    Path(p): Path<HashMap<String, String>>,
) -> ApiResult<StatusCode> {
    let ssid = segment(&p, "ssid");
    let s = lock(&rec.sessions)
        .remove(ssid)
        .ok_or_else(|| ApiError::no_such(NOT_FOUND, "session", ssid))?;
    // The shell may have exited already.
    let _ = rec.sandbox.signal(s.shell.id, libc::SIGKILL, true);
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
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_body(format!("invalid request body: {e}")))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

async fn run(
    ExecdRun(rec, trace): ExecdRun,
    Path(p): Path<HashMap<String, String>>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let session = find_session(&rec, segment(&p, "ssid"))?;
    let req = parse_run_in_session(&body)?;
    if session.shell.is_dead() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "SESSION_DEAD",
            "the session's shell has exited",
        ));
    }
    let mut script = String::new();
    if req.cwd.as_deref().is_some_and(|c| !c.is_empty()) {
        let cwd = crate::process::expand_cwd(&rec, req.cwd.as_deref(), &[])?;
        script.push_str(&format!("cd {} || true\n", shell_quote(&cwd)));
    }
    // The group keeps cd/export in this shell; its stdin is not the shell's script.
    script.push_str(&format!(
        "{{\n{}\n}} </dev/null\n__ar_rc=$?; printf '%s%d\\n' '{m}' \"$__ar_rc\"; printf '%s\\n' '{m}' >&2\n",
        req.command,
        m = session.marker
    ));
    let mut span = ExecSpan::new(trace.as_deref())
        .sandbox(&rec.id)
        .command_line(&req.command)
        .start();
    let (tx, rx) = event_queue();
    let _ = tx.try_send(event("init", json!({"text": session.id})));
    let sandbox = rec.sandbox.clone();
    let timeout = req.timeout.filter(|t| *t > 0).map(Duration::from_millis);
    tokio::spawn(async move {
        let started = Instant::now();
        let mut out = session.shell.output.lock().await;
        let mut stdin = session.shell.stdin.lock().await;
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
                    session.shell.dead.store(true, std::sync::atomic::Ordering::SeqCst);
                    // The shell may have exited already.
                    let _ = sandbox.signal(session.shell.id, libc::SIGKILL, true);
                }
            }
        }
        let code = code.unwrap_or(if timed_out { 137 } else { 1 });
        // The span's end as a command's (no counter, no audit record: a session's runs are
        // scripts fed to one long-lived shell, not processes of their own).
        RunFinish::exited(FrontEnd::OpenSandbox, code, timed_out, started.elapsed())
            .fill_span(&mut span);
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
