//! Code interpreting (`/code`, `/code/context[s]`) for Python: each context is a persistent
//! `python3` process in the sandbox running agentrun's driver (`code_driver.py`), whose
//! globals survive between executions, like a Jupyter kernel. An execution streams `init`,
//! `execution_count`, `stdout`/`stderr` lines, a `result` (`results.text` = the `repr` of the
//! last expression) and ends with `execution_complete` or an `error` carrying the Python
//! exception (`ename`, `evalue`, `traceback`). Interrupting an execution sends SIGINT
//! (`KeyboardInterrupt`); `init` is sent once the interpreter runs the execution, and the
//! driver drops an interrupt between executions, so an interrupt never ends a context (as a
//! Jupyter kernel's). Other languages answer 400.
//!
//! The interpreters are [`agentrun_pool::python::PythonContext`]s (shared with the MCP
//! server); this module maps their events onto execd's stream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use agentrun_pool::lock;
use agentrun_telemetry::ExecSpan;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::{ExecdRun, ExecdSandbox};
use crate::error::{found, ApiError, ApiResult, JsonBody};
use crate::events::{event, event_queue, stream_response};
use crate::params::segment;
use agentrun_pool::python::{CodeEvent, PythonContext};

pub use crate::held::{CodeContext, CodeState};
use crate::{finish_span, random_token, Record, Server};

/// The 404 code of a missing code context.
const NOT_FOUND: &str = "CONTEXT_NOT_FOUND";

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
    ApiError::invalid_body(format!("invalid request body: {e}"))
}

/// `python`/`python3` (any case) as `"python"`; any other language is a 400 saying so.
pub fn check_language(language: &str) -> ApiResult<String> {
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

/// A new context of `language` (checked) in `cwd` (expanded as a command's; default `/`),
/// its interpreter running; 400 if the image has no python3.
pub async fn start_context(
    server: &Server,
    rec: &Record,
    language: &str,
    cwd: Option<String>,
) -> ApiResult<Arc<CodeContext>> {
    rec.check_not_paused()?;
    let env = crate::execd::envfile::load(rec);
    let cwd = crate::process::expand_cwd(rec, cwd.as_deref(), &env)?;
    let python = spawn_python(server, rec, cwd.clone()).await?;
    let ctx = Arc::new(CodeContext {
        id: random_token()?,
        language: language.to_owned(),
        cwd,
        python,
    });
    lock(&rec.code).contexts.insert(ctx.id.clone(), ctx.clone());
    Ok(ctx)
}

/// A context's interpreter started in `rec` in `cwd` (expanded), not registered; 400 if the
/// image has no python3.
pub(crate) async fn spawn_python(
    server: &Server,
    rec: &Record,
    cwd: String,
) -> ApiResult<Arc<PythonContext>> {
    let env = crate::execd::envfile::load(rec);
    match PythonContext::start(&server.output, &rec.sandbox, env, cwd).await {
        Ok(p) => Ok(Arc::new(p)),
        Err(agentrun_pool::PoolError::Spawn { message, .. }) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "RUNTIME_ERROR",
            format!("cannot start a python context (the image needs python3): {message}"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Restarts context `id` (the E2B API's `restart_code_context`): a fresh interpreter in its
/// working directory under the same id, its state gone, the old interpreter killed. 404 if
/// there is none.
pub async fn restart_context(
    server: &Server,
    rec: &Record,
    id: &str,
) -> ApiResult<Arc<CodeContext>> {
    let old = find(rec, id)?;
    let fresh = start_context(server, rec, &old.language, Some(old.cwd.clone())).await?;
    let ctx = Arc::new(CodeContext {
        id: old.id.clone(),
        language: old.language.clone(),
        cwd: old.cwd.clone(),
        python: fresh.python.clone(),
    });
    {
        let mut st = lock(&rec.code);
        st.contexts.remove(&fresh.id);
        st.contexts.insert(ctx.id.clone(), ctx.clone());
    }
    stop(rec, &old);
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
    ExecdSandbox(rec): ExecdSandbox,
    State(server): State<Arc<Server>>,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<Value>> {
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
    ExecdSandbox(rec): ExecdSandbox,
    Query(q): Query<LanguageQuery>,
) -> ApiResult<Json<Value>> {
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

fn find(rec: &Record, id: &str) -> ApiResult<Arc<CodeContext>> {
    found(&lock(&rec.code).contexts, id, NOT_FOUND, "code context")
}

async fn get_context(
    ExecdSandbox(rec): ExecdSandbox,
    Path(p): Path<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let ctx = find(&rec, segment(&p, "ctx"))?;
    Ok(Json(json!({"id": ctx.id, "language": ctx.language})))
}

fn stop(rec: &Record, ctx: &CodeContext) {
    // The interpreter may have exited already.
    let _ = rec
        .sandbox
        .signal(ctx.python.interpreter.id, libc::SIGKILL, true);
}

/// The sandbox's contexts, by id.
pub fn contexts(rec: &Record) -> Vec<Arc<CodeContext>> {
    let mut all: Vec<_> = lock(&rec.code).contexts.values().cloned().collect();
    all.sort_by(|a, b| a.id.cmp(&b.id));
    all
}

/// Ends context `id` (its interpreter killed); 404 if there is none.
pub fn remove_context(rec: &Record, id: &str) -> ApiResult<()> {
    let ctx = {
        let mut st = lock(&rec.code);
        st.defaults.retain(|_, v| v != id);
        st.contexts.remove(id)
    }
    .ok_or_else(|| ApiError::no_such(NOT_FOUND, "code context", id))?;
    stop(rec, &ctx);
    Ok(())
}

async fn delete_context(
    ExecdSandbox(rec): ExecdSandbox,
    Path(p): Path<HashMap<String, String>>,
) -> ApiResult<StatusCode> {
    remove_context(&rec, segment(&p, "ctx"))?;
    Ok(StatusCode::OK)
}

async fn delete_by_language(
    ExecdSandbox(rec): ExecdSandbox,
    Query(q): Query<LanguageQuery>,
) -> ApiResult<StatusCode> {
    let language = check_language(q.language.as_deref().unwrap_or("python"))?;
    let gone: Vec<Arc<CodeContext>> = {
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
    ExecdSandbox(rec): ExecdSandbox,
    Query(q): Query<LanguageQuery>,
) -> ApiResult<StatusCode> {
    let id = q.id.ok_or_else(|| ApiError::missing_query("id"))?;
    // An execution id, or a context id.
    let ctx_id = lock(&rec.code).executions.get(&id).cloned().unwrap_or(id);
    let ctx = find(&rec, &ctx_id)?;
    rec.sandbox
        .signal(ctx.python.interpreter.id, libc::SIGINT, false)?;
    Ok(StatusCode::OK)
}

/// The context an execution runs in: context `id` if given (404 if none), else the
/// sandbox's default context of `language` (default `python`), started on first use and again
/// after its interpreter died. 409 if the context's interpreter has exited.
pub async fn context_for(
    server: &Server,
    rec: &Record,
    id: Option<String>,
    language: Option<&str>,
) -> ApiResult<Arc<CodeContext>> {
    let ctx = match id {
        Some(id) => find(rec, &id)?,
        None => {
            let language = check_language(language.unwrap_or("python"))?;
            let existing = {
                let st = lock(&rec.code);
                st.defaults
                    .get(&language)
                    .and_then(|i| st.contexts.get(i))
                    .cloned()
            };
            match existing.filter(|c| !c.python.is_dead()) {
                Some(c) => c,
                None => {
                    let c = start_context(server, rec, &language, None).await?;
                    lock(&rec.code).defaults.insert(language, c.id.clone());
                    c
                }
            }
        }
    };
    if ctx.python.is_dead() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "CONTEXT_DEAD",
            "the context's interpreter has exited",
        ));
    }
    Ok(ctx)
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
        return Err(ApiError::invalid_body("code is empty"));
    }
    Ok(req)
}

#[derive(Deserialize)]
struct ContextRef {
    id: Option<String>,
    language: Option<String>,
}

async fn run(
    ExecdRun(rec, trace): ExecdRun,
    State(server): State<Arc<Server>>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let req = parse_run_code(&body)?;
    let (id, language) = match &req.context {
        Some(c) => (c.id.clone().filter(|i| !i.is_empty()), c.language.clone()),
        None => (None, None),
    };
    let ctx = context_for(&server, &rec, id, language.as_deref()).await?;
    let execution_id = random_token()?;
    lock(&rec.code)
        .executions
        .insert(execution_id.clone(), ctx.id.clone());
    let mut span = ExecSpan::new(trace.as_deref())
        .sandbox(&rec.id)
        .executable("python3")
        .command_line(&req.code)
        .start();
    let (tx, rx) = event_queue();
    // `init` hands the client the execution's id, which an interrupt names: it is sent once
    // the interpreter runs the execution (its `count` event), so an interrupt never reaches
    // it between executions (or before anything else it says).
    let mut init = Some(event("init", json!({"text": execution_id.clone()})));
    let mut events = ctx.python.execute(&req.code);
    let rec2 = rec.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let mut failed = None;
        while let Some(ev) = events.recv().await {
            if let Some(i) = init.take() {
                let _ = tx.send(i).await;
            }
            let sent = match ev {
                CodeEvent::Running(n) => event("execution_count", json!({"execution_count": n})),
                CodeEvent::Stdout(text) => event("stdout", json!({"text": text})),
                CodeEvent::Stderr(text) => event("stderr", json!({"text": text})),
                CodeEvent::Result(text) => event("result", json!({"results": {"text": text}})),
                // Rich output (a chart, a value with rich forms): its MIME bundle, with its
                // text as `text`.
                CodeEvent::Display(mut bundle) | CodeEvent::RichResult(mut bundle) => {
                    if let Some(t) = bundle.get("text/plain").cloned() {
                        bundle.insert("text".into(), t);
                    }
                    event("result", json!({ "results": bundle }))
                }
                CodeEvent::Done => break,
                CodeEvent::Error(e) => {
                    failed = Some(
                        json!({"ename": e.ename, "evalue": e.evalue, "traceback": e.traceback}),
                    );
                    break;
                }
            };
            let _ = tx.send(sent).await;
        }
        if let Some(i) = init.take() {
            let _ = tx.send(i).await;
        }
        lock(&rec2.code).executions.remove(&execution_id);
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
        finish_span(span);
    });
    Ok(stream_response(rx))
}
