//! Container endpoints: create, inspect, list, start, stop, restart, kill, wait, logs,
//! attach, resize, remove (the state machine itself is in [`crate::containers`]).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::containers::{self, generated_name, new_id, Container, ContainerConfig, Status};
use crate::error::{DockerError, DockerResult};
use crate::http::{empty, json, streaming, Query, Reply};
use crate::{lock, stream, ApiState, TRACE};

type Api = State<Arc<ApiState>>;
type Key = Path<String>;

/// How long an attach stream of an exited container waits for more output while the
/// process's pipes are still open (a background child may hold them).
const EXITED_DRAIN: Duration = Duration::from_millis(200);
/// Stdin an attached client may send a container before it starts (kept for its start).
const PENDING_STDIN: usize = 1024 * 1024;

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// `POST /containers/create?name=`
pub async fn create(State(ctx): Api, q: Query, req: Request) -> DockerResult {
    let body = crate::http::read_body(req.into_body(), &ctx.limits).await?;
    let config = ContainerConfig::parse(&body)?;
    let image = match ctx.store.find(&config.image) {
        Ok(r) => r,
        Err(agentrun_image::ImageError::NotFound(_))
        | Err(agentrun_image::ImageError::InvalidName(..)) => {
            return Err(DockerError::no_such_image(&config.image))
        }
        Err(e) => return Err(crate::images::image_error(&config.image, &e)),
    };
    let id = new_id().map_err(|e| DockerError::internal(e.to_string()))?;
    let name = match q.get("name").filter(|n| !n.is_empty()) {
        Some(n) => {
            let n = n.strip_prefix('/').unwrap_or(n);
            if !valid_name(n) {
                return Err(DockerError::bad_request(format!(
                    "Invalid container name ({n}), only [a-zA-Z0-9][a-zA-Z0-9_.-] are allowed"
                )));
            }
            n.to_owned()
        }
        None => generated_name(&id),
    };
    let c = Arc::new(Container::new(
        id.clone(),
        name.clone(),
        config,
        image.id.clone(),
        image.config.clone(),
    ));
    {
        let mut all = lock(&ctx.containers);
        if let Some(other) = all.name_taken(&name) {
            return Err(DockerError::conflict(format!("Conflict. The container name \"/{name}\" is already in use by container \"{other}\". You have to remove (or rename) that container to be able to reuse that name.")));
        }
        all.by_id.insert(id.clone(), c);
    }
    Ok(json(
        StatusCode::CREATED,
        &json!({"Id": id, "Warnings": []}),
    ))
}

/// The container `key` names (full id, unique id prefix or name), or the 404 to answer.
pub fn find(ctx: &ApiState, key: &str) -> Result<Arc<Container>, DockerError> {
    lock(&ctx.containers)
        .find(key)
        .ok_or_else(|| DockerError::no_such_container(key))
}

/// `GET /containers/{id}/json`
pub async fn inspect(State(ctx): Api, Path(key): Key) -> DockerResult {
    Ok(json(StatusCode::OK, &find(&ctx, &key)?.inspect()))
}

/// `GET /containers/json?all=&filters=`
pub async fn list(State(ctx): Api, q: Query) -> Reply {
    let all = q.bool("all");
    let filters: Value = q
        .get("filters")
        .and_then(|f| serde_json::from_str(f).ok())
        .unwrap_or(json!({}));
    let wanted = |key: &str| -> Vec<String> {
        match &filters[key] {
            Value::Array(a) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            Value::Object(o) => o.keys().cloned().collect(),
            _ => Vec::new(),
        }
    };
    let (names, ids, statuses, labels, ancestors) = (
        wanted("name"),
        wanted("id"),
        wanted("status"),
        wanted("label"),
        wanted("ancestor"),
    );
    let mut out: Vec<(std::time::SystemTime, Value)> = lock(&ctx.containers)
        .by_id
        .values()
        .filter(|c| all || !statuses.is_empty() || c.status() == Status::Running)
        .filter(|c| {
            names.is_empty()
                || names
                    .iter()
                    .any(|n| c.name.contains(n.trim_start_matches('/')))
        })
        .filter(|c| ids.is_empty() || ids.iter().any(|i| c.id.starts_with(i)))
        .filter(|c| statuses.is_empty() || statuses.iter().any(|s| s == c.status().as_str()))
        .filter(|c| {
            labels.iter().all(|l| match l.split_once('=') {
                Some((k, v)) => c.config.labels.get(k).and_then(|x| x.as_str()) == Some(v),
                None => c.config.labels.contains_key(l),
            })
        })
        .filter(|c| {
            ancestors.is_empty()
                || ancestors.iter().any(|a| {
                    *a == c.config.image || c.image_id.contains(a.trim_start_matches("sha256:"))
                })
        })
        .map(|c| (c.created, c.summary()))
        .collect();
    out.sort_by_key(|e| std::cmp::Reverse(e.0));
    json(
        StatusCode::OK,
        &Value::Array(out.into_iter().map(|(_, v)| v).collect()),
    )
}

/// `POST /containers/{id}/start`
pub async fn start(State(ctx): Api, Path(key): Key) -> DockerResult {
    start_container(ctx, &key).await
}

/// Starts the container `key` names (on a blocking thread: the sandbox may be made now); a
/// failed start removes an AutoRemove container.
async fn start_container(ctx: Arc<ApiState>, key: &str) -> DockerResult {
    let c = find(&ctx, key)?;
    if c.status() == Status::Running {
        return Ok(empty(StatusCode::NOT_MODIFIED));
    }
    let ctx2 = ctx.clone();
    let c2 = c.clone();
    match tokio::task::spawn_blocking(move || containers::start(&ctx2, &c2))
        .await
        .map_err(DockerError::join)?
    {
        Ok(()) => Ok(empty(StatusCode::NO_CONTENT)),
        Err(e) => {
            if c.config.auto_remove {
                containers::remove(&ctx, &c);
            }
            Err(e)
        }
    }
}

/// `?t=` of stop and restart: seconds before the kill (default 10, as dockerd).
fn stop_timeout(q: &Query) -> Duration {
    let t = q.get("t").and_then(|t| t.parse::<i64>().ok()).unwrap_or(10);
    Duration::from_secs(t.max(0) as u64)
}

/// `POST /containers/{id}/stop?t=`
pub async fn stop(State(ctx): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&ctx, &key)?;
    let t = stop_timeout(&q);
    let stopped = tokio::task::spawn_blocking(move || containers::stop(&c, t))
        .await
        .unwrap_or(false);
    Ok(if stopped {
        empty(StatusCode::NO_CONTENT)
    } else {
        empty(StatusCode::NOT_MODIFIED)
    })
}

/// `POST /containers/{id}/restart?t=`
pub async fn restart(State(ctx): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&ctx, &key)?;
    let t = stop_timeout(&q);
    let c2 = c.clone();
    // Not removed by its stop even with AutoRemove (as dockerd); the main process runs again
    // in the same sandbox, on the same files.
    /// Ends the restart however this request ends (a client gone mid-way included).
    struct Restarting(Arc<Container>);
    impl Drop for Restarting {
        fn drop(&mut self) {
            lock(&self.0.state).restarting = false;
        }
    }
    lock(&c.state).restarting = true;
    let _restarting = Restarting(c.clone());
    let _ = tokio::task::spawn_blocking(move || containers::stop(&c2, t)).await;
    // (A failed start removes an AutoRemove container itself.)
    start_container(ctx, &c.id).await
}

/// `POST /containers/{id}/kill?signal=`
pub async fn kill(State(ctx): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&ctx, &key)?;
    let sig = match q.get("signal").filter(|s| !s.is_empty()) {
        Some(s) => crate::signals::parse(s)
            .ok_or_else(|| DockerError::bad_request(format!("Invalid signal: {s}")))?,
        None => libc::SIGKILL,
    };
    if containers::signal(&c, sig) {
        Ok(empty(StatusCode::NO_CONTENT))
    } else {
        Err(DockerError::conflict(format!(
            "Cannot kill container: {key}: Container {} is not running",
            c.id
        )))
    }
}

/// `DELETE /containers/{id}?force=`
pub async fn delete(State(ctx): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&ctx, &key)?;
    if c.status() == Status::Running && !q.bool("force") {
        return Err(DockerError::conflict(format!("You cannot remove a running container {}. Stop the container before attempting removal or force remove", c.id)));
    }
    let _ = tokio::task::spawn_blocking(move || containers::remove(&ctx, &c)).await;
    Ok(empty(StatusCode::NO_CONTENT))
}

/// `POST /containers/{id}/resize?h=&w=`
pub async fn resize(State(ctx): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&ctx, &key)?;
    crate::routes::resize(&c.pty, &q, StatusCode::OK)
}

/// `POST /containers/{id}/wait?condition=`: headers at once, the status when it is met.
pub async fn wait(State(ctx): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&ctx, &key)?;
    let condition = q.get("condition").unwrap_or("not-running").to_owned();
    if !["not-running", "next-exit", "removed"].contains(&condition.as_str()) {
        return Err(DockerError::bad_request(format!(
            "invalid condition: \"{condition}\""
        )));
    }
    let (reply, tx) = streaming("application/json");
    let mut rx = c.changed.subscribe();
    let exits_at_start = lock(&c.state).exits;
    tokio::spawn(async move {
        loop {
            let done = {
                let st = lock(&c.state);
                match condition.as_str() {
                    "next-exit" => st.exits > exits_at_start,
                    "removed" => st.removed,
                    _ => st.status != Status::Running,
                }
            };
            if done {
                break;
            }
            if rx.changed().await.is_err() {
                break;
            }
        }
        let code = lock(&c.state).exit_code;
        let _ = tx
            .send(crate::http::json_line(
                &json!({"StatusCode": code, "Error": null}),
            ))
            .await;
        tracing::debug!(target: TRACE, "wait {} ({condition}): answered", c.id);
    });
    Ok(reply)
}

/// `GET /containers/{id}/logs?stdout=&stderr=&follow=&tail=`
pub async fn logs(State(ctx): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&ctx, &key)?;
    let (want_out, want_err) = (q.bool("stdout"), q.bool("stderr"));
    if !want_out && !want_err {
        return Err(DockerError::bad_request(
            "You must choose at least one stream",
        ));
    }
    let tty = c.config.tty;
    let wanted = move |s: u8| (s == 1 && want_out) || (s == 2 && want_err);
    let tail = q.get("tail").and_then(|t| t.parse::<usize>().ok());
    let follow = q.bool("follow");
    let mut live = c.output.subscribe();
    let kept = lock(&c.logs).snapshot();
    let (reply, tx) = streaming(if tty {
        "application/vnd.docker.raw-stream"
    } else {
        "application/vnd.docker.multiplexed-stream"
    });
    tokio::spawn(async move {
        let mut chunks: Vec<(u8, Bytes)> = kept.into_iter().filter(|(s, _)| wanted(*s)).collect();
        if let Some(n) = tail {
            chunks = tail_lines(chunks, n);
        }
        for (s, b) in chunks {
            if tx
                .send(Bytes::from(stream::frame(s, &b, tty)))
                .await
                .is_err()
            {
                return;
            }
        }
        if !follow {
            return;
        }
        let mut changed = c.changed.subscribe();
        loop {
            if c.status() != Status::Running {
                // Whatever the pumps still deliver, briefly.
                while let Ok(Ok((s, b))) =
                    tokio::time::timeout(Duration::from_millis(100), live.recv()).await
                {
                    if wanted(s)
                        && tx
                            .send(Bytes::from(stream::frame(s, &b, tty)))
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
                return;
            }
            tokio::select! {
                got = live.recv() => match got {
                    Ok((s, b)) => {
                        if wanted(s) && tx.send(Bytes::from(stream::frame(s, &b, tty))).await.is_err() {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                },
                _ = changed.changed() => {}
            }
        }
    });
    Ok(reply)
}

/// The last `n` lines of a stream of chunks.
fn tail_lines(chunks: Vec<(u8, Bytes)>, n: usize) -> Vec<(u8, Bytes)> {
    let mut lines: Vec<(u8, Vec<u8>)> = Vec::new();
    for (s, b) in chunks {
        for piece in b.split_inclusive(|c| *c == b'\n') {
            match lines.last_mut() {
                Some((ls, l)) if *ls == s && !l.ends_with(b"\n") => l.extend_from_slice(piece),
                _ => lines.push((s, piece.to_vec())),
            }
        }
    }
    let skip = lines.len().saturating_sub(n);
    lines
        .into_iter()
        .skip(skip)
        .map(|(s, l)| (s, Bytes::from(l)))
        .collect()
}

/// `POST /containers/{id}/attach?stream=&stdin=&stdout=&stderr=&logs=`: a hijack that
/// carries the main process's output (and stdin to it), from before start if need be, until
/// the container exits.
pub async fn attach(State(ctx): Api, Path(key): Key, q: Query, mut req: Request) -> DockerResult {
    let c = find(&ctx, &key)?;
    if !stream::wants_upgrade(&req) {
        return Err(DockerError::bad_request(
            "attach needs an upgraded (hijacked) connection",
        ));
    }
    let tty = c.config.tty;
    let (want_out, want_err, want_in) = (q.bool("stdout"), q.bool("stderr"), q.bool("stdin"));
    let with_logs = q.bool("logs");
    let mut live = c.output.subscribe();
    // The run this attach is for: the current one, or the next (`docker start -a` attaches
    // to an exited container, then starts it).
    let exits_at_attach = lock(&c.state).exits;
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let up = match upgrade.await {
            Ok(up) => up,
            Err(e) => {
                tracing::debug!(target: TRACE, "attach {}: upgrade failed: {e}", c.id);
                return;
            }
        };
        let (mut rd, mut wr) = tokio::io::split(hyper_util::rt::TokioIo::new(up));
        let wanted = |s: u8| (s == 1 && want_out) || (s == 2 && want_err);
        if with_logs {
            let kept = lock(&c.logs).snapshot();
            for (s, b) in kept {
                if wanted(s) && !stream::send(&mut wr, s, &b, tty).await {
                    return;
                }
            }
        }
        // Stdin: to the process if it runs (through its bounded writer: a process not
        // reading its stdin holds up this client only), else kept for it (at most
        // PENDING_STDIN; then the client waits for the start).
        let c_in = c.clone();
        let input = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0u8; 16 * 1024];
            let mut changed = c_in.changed.subscribe();
            loop {
                while want_in && {
                    let st = lock(&c_in.state);
                    st.status == Status::Created && st.pending_stdin.len() >= PENDING_STDIN
                } {
                    if changed.changed().await.is_err() {
                        return;
                    }
                }
                let n = match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => 0,
                    Ok(n) => n,
                };
                if !want_in {
                    if n == 0 {
                        break;
                    }
                    continue;
                }
                let writer = {
                    let mut guard = lock(&c_in.state);
                    let st = &mut *guard;
                    if n == 0 {
                        if st.status == Status::Created {
                            st.stdin_closed_early = true;
                        } else if c_in.config.stdin_once || !c_in.config.tty {
                            st.stdin = None;
                        }
                        break;
                    }
                    match st.stdin.as_ref() {
                        Some(w) => Some(w.clone()),
                        None => {
                            if st.status == Status::Created {
                                st.pending_stdin.extend_from_slice(&buf[..n]);
                            }
                            None
                        }
                    }
                };
                if let Some(w) = writer {
                    let _ = w.send(Bytes::copy_from_slice(&buf[..n])).await;
                }
            }
        });
        let mut changed = c.changed.subscribe();
        loop {
            // Exited (a fast container may have run and exited between two looks): forward
            // the rest of its output, until its pumps reached EOF (then what is queued is all
            // there is) or, bounded, 200 ms without output.
            let ended = {
                let st = lock(&c.state);
                st.status == Status::Exited && st.exits > exits_at_attach
            };
            if ended {
                let mut deadline = tokio::time::Instant::now() + EXITED_DRAIN;
                loop {
                    if !c.outputs_open() {
                        loop {
                            match live.try_recv() {
                                Ok((s, b)) => {
                                    if wanted(s) && !stream::send(&mut wr, s, &b, tty).await {
                                        break;
                                    }
                                }
                                Err(TryRecvError::Lagged(_)) => {}
                                Err(_) => break,
                            }
                        }
                        break;
                    }
                    tokio::select! {
                        got = tokio::time::timeout_at(deadline, live.recv()) => match got {
                            Ok(Ok((s, b))) => {
                                deadline = tokio::time::Instant::now() + EXITED_DRAIN;
                                if wanted(s) && !stream::send(&mut wr, s, &b, tty).await {
                                    break;
                                }
                            }
                            Ok(Err(RecvError::Lagged(_))) => {}
                            _ => break,
                        },
                        _ = changed.changed() => {}
                    }
                }
                break;
            }
            tokio::select! {
                got = live.recv() => match got {
                    Ok((s, b)) => {
                        if wanted(s) && !stream::send(&mut wr, s, &b, tty).await {
                            break;
                        }
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => break,
                },
                _ = changed.changed() => {}
            }
        }
        input.abort();
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
        tracing::debug!(target: TRACE, "attach {} done", c.id);
    });
    Ok(stream::upgraded_reply(tty))
}
