//! The code interpreter (port 49999 in E2B): `POST /execute` runs Python in a context of the
//! sandbox and streams NDJSON, one event a line: `number_of_executions`, `stdout` / `stderr`
//! (each a line the code printed, with its newline), `result` (`text`: the `repr` of the last
//! expression, `is_main_result`) and, if it raised, `error` (`name`, `value`, `traceback`).
//! `POST /contexts`, `GET /contexts` and `DELETE /contexts/{id}` manage contexts; restart
//! answers 501. Only Python is served (400 naming it for another language).
//!
//! The contexts are the OpenSandbox front end's ([`agentrun_opensandbox::code`]): persistent
//! interpreters running agentrun's driver, forked from the profile's Python zygote when it has
//! one; an execution without a context runs in the sandbox's default Python context, so
//! state persists across calls. Every matplotlib figure open at an execution's end (a chart)
//! is a `result` with its `png` (and `text`), as E2B's display results; other rich reprs
//! (`_repr_html_`, ...) are not produced yet.

use std::collections::BTreeMap;
use std::sync::Arc;

use agentrun_opensandbox::code::{check_language, context_for};
use agentrun_opensandbox::{Record, Server};
use agentrun_pool::python::CodeEvent;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{E2bError, E2bResult};

/// Lines of an execution's stream queued ahead of a slow client.
const LINE_QUEUE: usize = 16;

pub fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{id}", delete(delete_context))
        .route("/contexts/{id}/restart", post(restart_context))
        .route_layer(axum::middleware::from_fn_with_state(
            server.clone(),
            crate::auth::require_access_token,
        ))
        .with_state(server)
}

/// An `/execute` body as sent.
#[derive(Deserialize, Debug)]
pub struct Execute {
    pub code: String,
    pub context_id: Option<String>,
    pub language: Option<String>,
    pub env_vars: Option<BTreeMap<String, String>>,
}

/// An `/execute` body, checked: a context or a language (not both); per-execution
/// environment variables are not served.
pub fn parse_execute(body: &[u8]) -> E2bResult<Execute> {
    let req: Execute = serde_json::from_slice(body)
        .map_err(|e| E2bError::bad_request(format!("invalid request body: {e}")))?;
    if req.context_id.is_some() && req.language.is_some() {
        return Err(E2bError::bad_request(
            "give a context or a language, not both",
        ));
    }
    if req.env_vars.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(E2bError::bad_request(
            "env_vars per execution are not served by agentrun yet: set them when creating the sandbox (envs=)",
        ));
    }
    if let Some(l) = &req.language {
        check_language(l).map_err(E2bError::from)?;
    }
    Ok(req)
}

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

fn line(v: Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

fn json_body(headers: &axum::http::HeaderMap, body: &[u8]) -> E2bResult<()> {
    let json = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(agentrun_webguard::is_json);
    if !json && !body.is_empty() {
        return Err(E2bError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the request body must be JSON sent as Content-Type: application/json",
        ));
    }
    Ok(())
}

async fn execute(
    State(server): State<Arc<Server>>,
    Extension(rec): Extension<Arc<Record>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> E2bResult<Response> {
    json_body(&headers, &body)?;
    let req = parse_execute(&body)?;
    rec.check_running()?;
    let ctx = context_for(
        &server,
        &rec,
        req.context_id.filter(|c| !c.is_empty()),
        req.language.as_deref(),
    )
    .await
    .map_err(|e| {
        if e.status == StatusCode::NOT_FOUND {
            E2bError::not_found(e.message)
        } else {
            E2bError::from(e)
        }
    })?;
    let mut events = ctx.python.execute(&req.code);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(LINE_QUEUE);
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            let out = match ev {
                CodeEvent::Running(n) => {
                    json!({"type": "number_of_executions", "execution_count": n})
                }
                CodeEvent::Stdout(t) => {
                    json!({"type": "stdout", "text": with_newline(t), "timestamp": now_us()})
                }
                CodeEvent::Stderr(t) => {
                    json!({"type": "stderr", "text": with_newline(t), "timestamp": now_us()})
                }
                CodeEvent::Result(t) => {
                    json!({"type": "result", "text": t, "is_main_result": true})
                }
                CodeEvent::Display(bundle) => display_result(&bundle),
                CodeEvent::RichResult(bundle) => {
                    let mut r = display_result(&bundle);
                    r["is_main_result"] = json!(true);
                    r
                }
                CodeEvent::Done => break,
                CodeEvent::Error(e) => {
                    let _ = tx
                        .send(line(json!({
                            "type": "error",
                            "name": e.ename,
                            "value": e.evalue,
                            // Each line of it ends with its newline already.
                            "traceback": e.traceback.concat(),
                        })))
                        .await;
                    break;
                }
            };
            if tx.send(line(out)).await.is_err() {
                break;
            }
        }
    });
    let stream = tokio_stream_from(rx);
    Ok((
        [("content-type", "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// A display bundle (a chart) as E2B's `result` of a display call: a field per MIME type
/// (`image/png` -> `png`, `text/plain` -> `text`, ...), `is_main_result` false (a rich last
/// expression's is made the main result by its caller).
pub fn display_result(bundle: &serde_json::Map<String, Value>) -> Value {
    let mut out = json!({"type": "result", "is_main_result": false});
    for (mime, v) in bundle {
        let field = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "text/latex" => "latex",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "image/svg+xml" => "svg",
            "application/pdf" => "pdf",
            "application/json" => "json",
            "application/javascript" => "javascript",
            _ => continue,
        };
        out[field] = v.clone();
    }
    out
}

/// The driver's lines come without their newline (a blank line is `"\n"`); E2B's carry it.
fn with_newline(t: String) -> String {
    if t.ends_with('\n') {
        t
    } else {
        t + "\n"
    }
}

fn tokio_stream_from(
    rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    futures_util::stream::unfold(rx, |mut rx| async move {
        let b = rx.recv().await?;
        Some((Ok(b), rx))
    })
}

#[derive(Deserialize)]
struct NewContext {
    language: Option<String>,
    cwd: Option<String>,
}

fn context_json(id: &str, language: &str, cwd: &str) -> Value {
    json!({"id": id, "language": language, "cwd": cwd})
}

async fn create_context(
    State(server): State<Arc<Server>>,
    Extension(rec): Extension<Arc<Record>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> E2bResult<Json<Value>> {
    json_body(&headers, &body)?;
    let req: NewContext = if body.is_empty() {
        NewContext {
            language: None,
            cwd: None,
        }
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| E2bError::bad_request(format!("invalid request body: {e}")))?
    };
    let body = json!({"language": req.language.as_deref().unwrap_or("python"), "cwd": req.cwd});
    let (language, cwd) =
        agentrun_opensandbox::code::parse_create_context(body.to_string().as_bytes())?;
    let ctx =
        agentrun_opensandbox::code::start_context(&server, &rec, &language, cwd.clone()).await?;
    Ok(Json(context_json(
        &ctx.id,
        &ctx.language,
        cwd.as_deref().unwrap_or("/"),
    )))
}

async fn list_contexts(Extension(rec): Extension<Arc<Record>>) -> Json<Value> {
    let all: Vec<Value> = agentrun_opensandbox::code::contexts(&rec)
        .iter()
        .map(|c| context_json(&c.id, &c.language, "/"))
        .collect();
    Json(Value::Array(all))
}

async fn delete_context(
    Extension(rec): Extension<Arc<Record>>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    agentrun_opensandbox::code::remove_context(&rec, &id).map_err(|e| {
        if e.status == StatusCode::NOT_FOUND {
            E2bError::not_found(e.message)
        } else {
            E2bError::from(e)
        }
    })?;
    Ok(StatusCode::NO_CONTENT)
}

async fn restart_context() -> E2bError {
    E2bError::not_served(
        "restarting a context is not served by agentrun yet: delete it and create another",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execute_bodies() {
        let r =
            parse_execute(br#"{"code":"1+1","context_id":null,"language":null,"env_vars":null}"#)
                .unwrap();
        assert_eq!(r.code, "1+1");
        assert!(parse_execute(br#"{"code":"1","language":"javascript"}"#).is_err());
        assert!(parse_execute(br#"{"code":"1","language":"python","context_id":"x"}"#).is_err());
        assert!(parse_execute(br#"{"code":"1","env_vars":{"A":"1"}}"#).is_err());
        assert!(parse_execute(b"{").is_err());
    }

    #[test]
    fn charts_are_png_results() {
        let mut b = serde_json::Map::new();
        b.insert("image/png".into(), json!("iVBOR"));
        b.insert("text/plain".into(), json!("<Figure>"));
        b.insert("application/x-unknown".into(), json!("x"));
        let r = display_result(&b);
        assert_eq!(r["png"], "iVBOR");
        assert_eq!(r["text"], "<Figure>");
        assert_eq!(r["is_main_result"], false);
        assert!(r.get("application/x-unknown").is_none());
    }

    #[test]
    fn lines_carry_their_newline() {
        assert_eq!(with_newline("hi".into()), "hi\n");
        assert_eq!(with_newline("\n".into()), "\n");
    }
}
