//! Code interpreting (`/code`, `/code/context[s]`) for Python: each context is a persistent
//! `python3` process in the sandbox running agentrun's driver (`code_driver.py`), whose
//! globals survive between executions, like a Jupyter kernel. An execution streams `init`,
//! `execution_count`, `stdout`/`stderr` lines, a `result` (`results.text` = the `repr` of the
//! last expression) and ends with `execution_complete` or an `error` carrying the Python
//! exception (`ename`, `evalue`, `traceback`). Interrupting an execution sends SIGINT
//! (`KeyboardInterrupt`). Other languages answer 400.
//!
//! An interpreter's output is read through bounded queues ([`crate::execd::queued_lines`]):
//! what it prints between executions (a thread printing forever) waits there, then in its
//! pipe, and then the printing thread blocks until the next execution reads it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use agentrun_telemetry::ExecSpan;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::error::{ApiError, ApiResult, JsonBody};
use crate::execd::{event, event_queue, execd, pipe, queued_lines, sid_of, spawn, stream_response};
use crate::{lock, random_token, Record, Server};

const DRIVER: &str = include_str!("code_driver.py");

/// The code state of one sandbox.
#[derive(Default)]
pub struct CodeState {
    contexts: HashMap<String, Arc<Context>>,
    /// The context used when a request names none, per language.
    defaults: HashMap<String, String>,
    /// Execution id -> context id (for interrupts).
    executions: HashMap<String, String>,
}

/// One interpreter process.
pub struct Context {
    id: String,
    language: String,
    process: u64,
    stdin: tokio::sync::Mutex<tokio::net::unix::pipe::Sender>,
    /// Lines of its stdout and stderr, consumed by the execution in progress.
    lines: tokio::sync::Mutex<(mpsc::Receiver<String>, mpsc::Receiver<String>)>,
    marker: String,
    dead: Arc<AtomicBool>,
}

pub fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route("/code", post(run).delete(interrupt))
        .route("/code/context", post(create_context))
        .route(
            "/code/contexts",
            get(list_contexts).delete(delete_by_language),
        )
        .route(
            "/code/contexts/{ctx}",
            get(get_context).delete(delete_context),
        )
        .with_state(server)
}

fn bad_body(e: serde_json::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "INVALID_REQUEST_BODY",
        format!("invalid request body: {e}"),
    )
}

fn check_language(language: &str) -> ApiResult<String> {
    let l = language.trim().to_ascii_lowercase();
    if l == "python" || l == "python3" {
        Ok("python".into())
    } else {
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "NOT_SUPPORTED",
            format!("language {language:?} is not supported (python only)"),
        ))
    }
}

async fn start_context(
    server: &Server,
    rec: &Record,
    language: &str,
    cwd: Option<String>,
) -> ApiResult<Arc<Context>> {
    if rec.state().0 == "Paused" {
        return Err(ApiError::conflict("the sandbox is paused"));
    }
    let (in_r, in_w) = pipe()?;
    let marker = format!("\u{1}agentrun-{}:", random_token()?);
    let argv = vec!["python3".into(), "-u".into(), "-c".into(), DRIVER.into()];
    let env = vec![
        ("AGENTRUN_CODE_MARKER".to_string(), marker.clone()),
        ("PYTHONIOENCODING".to_string(), "utf-8".to_string()),
    ];
    let cwd = cwd.filter(|c| !c.is_empty()).unwrap_or_else(|| "/".into());
    let (pid, out, err, exit) = match spawn(rec, argv, env, cwd, in_r).await {
        Ok(x) => x,
        Err(agentrun_pool::PoolError::Spawn { message, .. }) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "RUNTIME_ERROR",
                format!("cannot start a python context (the image needs python3): {message}"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let (orx, erx) = (queued_lines(server, out), queued_lines(server, err));
    let dead = Arc::new(AtomicBool::new(false));
    let d = dead.clone();
    tokio::spawn(async move {
        let _ = exit.await;
        d.store(true, Ordering::SeqCst);
    });
    let stdin = tokio::net::unix::pipe::Sender::from_owned_fd(in_w)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let ctx = Arc::new(Context {
        id: random_token()?,
        language: language.to_owned(),
        process: pid,
        stdin: tokio::sync::Mutex::new(stdin),
        lines: tokio::sync::Mutex::new((orx, erx)),
        marker,
        dead,
    });
    lock(&rec.code).contexts.insert(ctx.id.clone(), ctx.clone());
    Ok(ctx)
}

#[derive(Deserialize)]
struct CreateContext {
    language: Option<String>,
    cwd: Option<String>,
}

/// A create-context body: (the language, checked; the working directory asked for).
pub fn parse_create_context(body: &[u8]) -> ApiResult<(String, Option<String>)> {
    let req: CreateContext = serde_json::from_slice(body).map_err(bad_body)?;
    let language = check_language(req.language.as_deref().unwrap_or("python"))?;
    Ok((language, req.cwd))
}

async fn create_context(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<Value>> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let (language, cwd) = parse_create_context(&body)?;
    let ctx = start_context(&server, &rec, &language, cwd).await?;
    Ok(Json(json!({"id": ctx.id, "language": ctx.language})))
}

#[derive(Deserialize)]
struct LanguageQuery {
    language: Option<String>,
    id: Option<String>,
}

async fn list_contexts(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<LanguageQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let st = lock(&rec.code);
    let mut all: Vec<Value> = st
        .contexts
        .values()
        .filter(|c| {
            q.language
                .as_deref()
                .is_none_or(|l| check_language(l).is_ok_and(|l| l == c.language))
        })
        .map(|c| json!({"id": c.id, "language": c.language}))
        .collect();
    all.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    Ok(Json(Value::Array(all)))
}

fn find(rec: &Record, id: &str) -> ApiResult<Arc<Context>> {
    lock(&rec.code)
        .contexts
        .get(id)
        .cloned()
        .ok_or_else(|| ApiError::not_found("CONTEXT_NOT_FOUND", format!("no code context {id}")))
}

async fn get_context(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let ctx = find(&rec, p.get("ctx").map(String::as_str).unwrap_or(""))?;
    Ok(Json(json!({"id": ctx.id, "language": ctx.language})))
}

fn stop(rec: &Record, ctx: &Context) {
    let _ = rec.sandbox.signal(ctx.process, libc::SIGKILL, true);
}

async fn delete_context(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let id = p.get("ctx").map(String::as_str).unwrap_or("");
    let ctx = {
        let mut st = lock(&rec.code);
        st.defaults.retain(|_, v| v != id);
        st.contexts.remove(id)
    }
    .ok_or_else(|| ApiError::not_found("CONTEXT_NOT_FOUND", format!("no code context {id}")))?;
    stop(&rec, &ctx);
    Ok(StatusCode::OK)
}

async fn delete_by_language(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<LanguageQuery>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let language = check_language(q.language.as_deref().unwrap_or("python"))?;
    let gone: Vec<Arc<Context>> = {
        let mut st = lock(&rec.code);
        st.defaults.remove(&language);
        let ids: Vec<String> = st
            .contexts
            .values()
            .filter(|c| c.language == language)
            .map(|c| c.id.clone())
            .collect();
        ids.iter().filter_map(|i| st.contexts.remove(i)).collect()
    };
    for c in gone {
        stop(&rec, &c);
    }
    Ok(StatusCode::OK)
}

async fn interrupt(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<LanguageQuery>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let id = q.id.ok_or_else(|| ApiError::missing_query("id"))?;
    // An execution id, or a context id.
    let ctx_id = lock(&rec.code).executions.get(&id).cloned().unwrap_or(id);
    let ctx = find(&rec, &ctx_id)?;
    rec.sandbox.signal(ctx.process, libc::SIGINT, false)?;
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
pub struct RunCode {
    code: String,
    context: Option<ContextRef>,
}

/// A run-code body, checked: the code is not blank.
pub fn parse_run_code(body: &[u8]) -> ApiResult<RunCode> {
    let req: RunCode = serde_json::from_slice(body).map_err(bad_body)?;
    if req.code.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST_BODY",
            "code is empty",
        ));
    }
    Ok(req)
}

#[derive(Deserialize)]
struct ContextRef {
    id: Option<String>,
    language: Option<String>,
}

async fn run(
    State(server): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let rec = execd(&server, sid_of(&p), &headers)?;
    let req = parse_run_code(&body)?;
    let (id, language) = match &req.context {
        Some(c) => (c.id.clone().filter(|i| !i.is_empty()), c.language.clone()),
        None => (None, None),
    };
    let ctx = match id {
        Some(id) => find(&rec, &id)?,
        None => {
            let language = check_language(language.as_deref().unwrap_or("python"))?;
            let existing = {
                let st = lock(&rec.code);
                st.defaults
                    .get(&language)
                    .and_then(|i| st.contexts.get(i))
                    .cloned()
            };
            match existing.filter(|c| !c.dead.load(Ordering::SeqCst)) {
                Some(c) => c,
                None => {
                    let c = start_context(&server, &rec, &language, None).await?;
                    lock(&rec.code).defaults.insert(language, c.id.clone());
                    c
                }
            }
        }
    };
    if ctx.dead.load(Ordering::SeqCst) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "CONTEXT_DEAD",
            "the context's interpreter has exited",
        ));
    }
    let exec_id = random_token()?;
    lock(&rec.code)
        .executions
        .insert(exec_id.clone(), ctx.id.clone());
    let mut span = ExecSpan::new(headers.get("traceparent").and_then(|v| v.to_str().ok()))
        .sandbox(&rec.id)
        .executable("python3")
        .command_line(&req.code)
        .start();
    let (tx, rx) = event_queue();
    let _ = tx.try_send(event("init", json!({"text": exec_id})));
    let request = format!("{}\n", json!({"code": req.code}));
    let rec2 = rec.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let mut lines = ctx.lines.lock().await;
        let mut stdin = ctx.stdin.lock().await;
        // Written while the output is read: an interpreter blocked on a full pipe (output
        // from between executions) reads no request until that output is taken.
        let write = tokio::io::AsyncWriteExt::write_all(&mut *stdin, request.as_bytes());
        tokio::pin!(write);
        let mut writing = true;
        let mut err_open = true;
        let mut failed = None;
        let dead = || json!({"ename": "DeadKernelError", "evalue": "the interpreter exited", "traceback": []});
        let (out, err) = &mut *lines;
        loop {
            tokio::select! {
                w = &mut write, if writing => {
                    writing = false;
                    if w.is_err() {
                        failed = Some(dead());
                        break;
                    }
                }
                l = out.recv() => match l {
                    None => { failed = Some(dead()); break; }
                    Some(l) => match l.strip_prefix(ctx.marker.as_str()) {
                        None => { let _ = tx.send(event("stdout", json!({"text": l}))).await; }
                        Some(j) => {
                            let ev: Value = serde_json::from_str(j).unwrap_or(Value::Null);
                            let sent = match ev["t"].as_str().unwrap_or("") {
                                "count" => event("execution_count", json!({"execution_count": ev["n"]})),
                                "stdout" | "stderr" => event(ev["t"].as_str().unwrap_or("stdout"), json!({"text": ev["text"]})),
                                "result" => event("result", json!({"results": {"text": ev["text"]}})),
                                "done" => break,
                                _ => { failed = Some(json!({"ename": ev["ename"], "evalue": ev["evalue"], "traceback": ev["traceback"]})); break; }
                            };
                            let _ = tx.send(sent).await;
                        }
                    }
                },
                l = err.recv(), if err_open => match l {
                    Some(l) => { let _ = tx.send(event("stderr", json!({"text": l}))).await; }
                    None => err_open = false,
                },
            }
        }
        // Raw stderr that arrived before the end.
        while let Ok(l) = err.try_recv() {
            let _ = tx.send(event("stderr", json!({"text": l}))).await;
        }
        drop(lines);
        lock(&rec2.code).executions.remove(&exec_id);
        match failed {
            None => {
                let _ = tx
                    .send(event(
                        "execution_complete",
                        json!({"execution_time": started.elapsed().as_millis() as i64}),
                    ))
                    .await;
            }
            Some(e) => {
                span.set_error(
                    e["ename"].as_str().unwrap_or("error"),
                    e["evalue"].as_str().unwrap_or(""),
                );
                let _ = tx.send(event("error", json!({"error": e}))).await;
            }
        }
        span.set_attribute("sandbox.duration_ms", started.elapsed().as_millis() as i64);
        crate::lifecycle::finish_span(span);
    });
    Ok(stream_response(rx))
}
