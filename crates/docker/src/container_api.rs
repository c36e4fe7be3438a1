//! Container endpoints that answer at once: create, inspect, list, start, stop, restart,
//! kill, resize, remove (the state machine itself is in [`crate::containers`]; the streamed
//! ones, wait, logs and attach, in [`crate::container_streams`]).

use std::sync::Arc;
use std::time::Duration;

use agentrun_pool::lock;
use axum::extract::{Path, Request, State};
use hyper::StatusCode;
use serde_json::{json, Value};

use crate::containers::{self, generated_name, new_id, Container, ContainerConfig, Status};
use crate::error::DockerError;
use crate::http::{empty, json, DockerResult, Query, Reply};
use crate::ApiState;

type Api = State<Arc<ApiState>>;
type Key = Path<String>;

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// `POST /containers/create?name=`
pub async fn create(State(api): Api, q: Query, req: Request) -> DockerResult {
    let body = crate::http::read_body(req.into_body(), &api.limits).await?;
    let config = ContainerConfig::parse(&body)?;
    let image = match api.store.find(&config.image) {
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
        let mut all = lock(&api.containers);
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
pub fn find(api: &ApiState, key: &str) -> Result<Arc<Container>, DockerError> {
    lock(&api.containers)
        .find(key)
        .ok_or_else(|| DockerError::no_such_container(key))
}

/// `GET /containers/{id}/json`
pub async fn inspect(State(api): Api, Path(key): Key) -> DockerResult {
    Ok(json(StatusCode::OK, &find(&api, &key)?.inspect()))
}

/// `GET /containers/json?all=&filters=`
pub async fn list(State(api): Api, q: Query) -> Reply {
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
    let mut out: Vec<(std::time::SystemTime, Value)> = lock(&api.containers)
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
pub async fn start(State(api): Api, Path(key): Key) -> DockerResult {
    start_container(api, &key).await
}

/// Starts the container `key` names (on a blocking thread: the sandbox may be made now); a
/// failed start removes an AutoRemove container.
async fn start_container(api: Arc<ApiState>, key: &str) -> DockerResult {
    let c = find(&api, key)?;
    if c.status() == Status::Running {
        return Ok(empty(StatusCode::NOT_MODIFIED));
    }
    let api2 = api.clone();
    let c2 = c.clone();
    match tokio::task::spawn_blocking(move || containers::start(&api2, &c2))
        .await
        .map_err(DockerError::join)?
    {
        Ok(()) => Ok(empty(StatusCode::NO_CONTENT)),
        Err(e) => {
            if c.config.auto_remove {
                containers::remove(&api, &c);
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
pub async fn stop(State(api): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&api, &key)?;
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
pub async fn restart(State(api): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&api, &key)?;
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
    // Graceful or killed, the restart goes on; a panic was logged by the panic hook.
    let _ = tokio::task::spawn_blocking(move || containers::stop(&c2, t)).await;
    // (A failed start removes an AutoRemove container itself.)
    start_container(api, &c.id).await
}

/// `POST /containers/{id}/kill?signal=`
pub async fn kill(State(api): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&api, &key)?;
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
pub async fn delete(State(api): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&api, &key)?;
    if c.status() == Status::Running && !q.bool("force") {
        return Err(DockerError::conflict(format!("You cannot remove a running container {}. Stop the container before attempting removal or force remove", c.id)));
    }
    // A panic was logged by the panic hook; the container is gone from the list either way.
    let _ = tokio::task::spawn_blocking(move || containers::remove(&api, &c)).await;
    Ok(empty(StatusCode::NO_CONTENT))
}

/// `POST /containers/{id}/resize?h=&w=`
pub async fn resize(State(api): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&api, &key)?;
    c.pty.resize_to_query(&q)?;
    Ok(crate::http::empty(StatusCode::OK))
}

/// The run configuration keys a commit's body may change (Docker's container config).
const COMMIT_CONFIG_KEYS: [&str; 8] = [
    "Cmd",
    "Entrypoint",
    "Env",
    "WorkingDir",
    "User",
    "Labels",
    "ExposedPorts",
    "StopSignal",
];

/// `POST /commit?container=&repo=&tag=&comment=&author=&pause=` (`docker commit`, docker-py
/// `container.commit`): the running container's writable layer as a new image over its
/// image, taken with the container frozen (whatever `pause` says: a consistent copy). The
/// body, if any, is a container config whose run configuration keys replace the image's.
/// A container that is not running has no files left (its sandbox ends with its main
/// process): 409.
pub async fn commit(State(api): Api, q: Query, req: Request) -> DockerResult {
    let body = crate::http::read_body(req.into_body(), &api.limits).await?;
    let key = q
        .get("container")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| DockerError::bad_request("container is required"))?
        .to_owned();
    if q.get("changes").is_some_and(|c| !c.is_empty()) {
        return Err(DockerError::bad_request(
            "changes (Dockerfile instructions) are not supported: pass the config in the body",
        ));
    }
    let mut changes = serde_json::Map::new();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| DockerError::bad_request(format!("invalid config: {e}")))?;
        match v {
            Value::Null => {}
            Value::Object(o) => {
                for k in COMMIT_CONFIG_KEYS {
                    if let Some(v) = o.get(k).filter(|v| !v.is_null()) {
                        let v = match (k, v) {
                            // Docker takes a string Cmd/Entrypoint as a shell form.
                            ("Cmd" | "Entrypoint", Value::String(s)) => {
                                json!(["/bin/sh", "-c", s])
                            }
                            // Docker's Env: ["K=V"]; its ExposedPorts: {"80/tcp": {}}.
                            ("ExposedPorts", Value::Object(p)) => {
                                json!(p.keys().collect::<Vec<_>>())
                            }
                            _ => v.clone(),
                        };
                        changes.insert(k.to_owned(), v);
                    }
                }
            }
            _ => return Err(DockerError::bad_request("the config must be a JSON object")),
        }
    }
    let name = q.get("repo").filter(|r| !r.is_empty()).map(|repo| {
        match q.get("tag").filter(|t| !t.is_empty()) {
            Some(t) => format!("{repo}:{t}"),
            None => repo.to_owned(),
        }
    });
    if let Some(n) = &name {
        agentrun_image::reference::normalize(n)
            .map_err(|e| DockerError::bad_request(e.to_string()))?;
    }
    let c = find(&api, &key)?;
    let sandbox = {
        let st = lock(&c.state);
        match (&st.sandbox, st.status) {
            (Some(s), Status::Running) => s.clone(),
            _ => {
                return Err(DockerError::conflict(format!(
                    "container {key} is not running: agentrun keeps a container's files only while it runs"
                )))
            }
        }
    };
    let opts = agentrun_image::CommitOptions {
        names: name.iter().cloned().collect(),
        labels: Default::default(),
        max_bytes: Some(api.max_snapshot),
        config: (!changes.is_empty()).then_some(changes),
        created_by: format!("agentrun commit {}", c.id),
        comment: q
            .get("comment")
            .filter(|c| !c.is_empty())
            .map(str::to_owned),
        author: q.get("author").filter(|a| !a.is_empty()).map(str::to_owned),
    };
    let api2 = api.clone();
    let start = std::time::Instant::now();
    let committed = tokio::task::spawn_blocking(move || {
        agentrun_pool::snapshot::commit(&sandbox, &api2.store, &opts)
    })
    .await
    .map_err(DockerError::join)?;
    let (id, bytes, frozen, err) = match &committed {
        Ok(t) => (
            t.made.record.id.clone(),
            t.made.upper_bytes,
            Some(t.frozen),
            None,
        ),
        Err(e) => (String::new(), 0, None, Some(e.to_string())),
    };
    let span = agentrun_pool::snapshot::report(
        agentrun_pool::snapshot::SNAPSHOT_SPAN,
        Some(&api.audit),
        &agentrun_pool::snapshot::Report {
            sandbox_id: &c.id,
            snapshot_id: &id,
            image: name.as_deref().unwrap_or(&c.config.image),
            bytes,
            duration: start.elapsed(),
            frozen,
            error: err.as_deref().map(|m| ("commit_failed", m)),
            traceparent: None,
            profile: &api.profile,
        },
    );
    if agentrun_telemetry::export_enabled() {
        tokio::task::spawn_blocking(move || span.finish());
    }
    match committed {
        Ok(_) => Ok(json(StatusCode::CREATED, &json!({"Id": id}))),
        Err(agentrun_pool::PoolError::Image(
            e @ agentrun_image::ImageError::SnapshotTooLarge { .. },
        )) => Err(DockerError::bad_request(format!(
            "{e} (agentrun serve --max-snapshot)"
        ))),
        Err(agentrun_pool::PoolError::NotFound(_)) => Err(DockerError::conflict(format!(
            "container {key} is not running"
        ))),
        Err(e) => Err(DockerError::internal(e.to_string())),
    }
}
