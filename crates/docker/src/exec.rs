//! Exec instances: `POST /containers/{id}/exec` records one, `POST /exec/{id}/start` runs it
//! in the container's sandbox over a hijacked connection (or detached), `GET /exec/{id}/json`
//! tells its exit code.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrun_pool::lock;
use agentrun_pool::process::StartCommand;
use axum::extract::{Path, Request, State};
use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::container_api::find;
use crate::containers::{new_id, Container, Status};
use crate::error::DockerError;
use crate::http::{json, DockerResult, Query};
use crate::stdio::Stdio;
use crate::stream::{self, HijackIo};
use crate::{ApiState, TRACE};

type Api = State<Arc<ApiState>>;

/// How long output is still forwarded after the process exited, waiting for its pipes to
/// close (a background child may hold them open forever; on a loaded host the pumps may lag
/// the exit report).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// One exec instance.
pub struct Exec {
    pub id: String,
    pub container: Arc<Container>,
    pub cmd: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: String,
    pub tty: bool,
    pub attach_stdin: bool,
    /// `User` of the exec, else the container's; `None`: root.
    pub user: Option<String>,
    /// Its pty (`Tty`) and window size.
    pub pty: crate::pty::Pty,
    pub state: Mutex<ExecState>,
}

#[derive(Default)]
pub struct ExecState {
    pub started: bool,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub pid: i32,
}

/// What a `POST /containers/{id}/exec` body asks for (Docker's `ExecConfig`, as
/// [`crate::containers::ContainerConfig`] is a create's; parsed without the container: the
/// defaults for `WorkingDir` and `User` come from it later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    pub cmd: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `None`: the container's working directory.
    pub working_dir: Option<String>,
    /// `None`: the container's user.
    pub user: Option<String>,
    pub tty: bool,
    pub attach_stdin: bool,
    /// `ConsoleSize` (rows, columns), if given and not 0x0.
    pub console_size: Option<(u16, u16)>,
}

impl ExecConfig {
    /// Parses an exec create body; `Err` is the 400 message.
    pub fn from_body(body: &Value) -> Result<Self, &'static str> {
        let cmd = body["Cmd"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .filter(|c| !c.is_empty())
            .ok_or("No exec command specified")?;
        let env = body["Env"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str())
                    .filter_map(|kv| {
                        kv.split_once('=')
                            .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let nonempty = |key: &str| {
            body[key]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Ok(ExecConfig {
            cmd,
            env,
            working_dir: nonempty("WorkingDir"),
            user: nonempty("User"),
            tty: body["Tty"].as_bool().unwrap_or(false),
            attach_stdin: body["AttachStdin"].as_bool().unwrap_or(false),
            console_size: crate::pty::console_size(&body["ConsoleSize"]),
        })
    }
}

/// `POST /containers/{id}/exec`
pub async fn create(State(api): Api, Path(key): Path<String>, req: Request) -> DockerResult {
    let c = find(&api, &key)?;
    let body = crate::http::read_body(req.into_body(), &api.limits).await?;
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    if c.status() != Status::Running {
        return Err(DockerError::conflict(format!(
            "Container {} is not running",
            c.id
        )));
    }
    let req = ExecConfig::from_body(&body).map_err(DockerError::bad_request)?;
    let working_dir = req.working_dir.unwrap_or_else(|| c.working_dir());
    let user = req.user.or_else(|| c.user());
    let id = new_id().map_err(|e| DockerError::internal(e.to_string()))?;
    let pty = crate::pty::Pty::default();
    if let Some((h, w)) = req.console_size {
        if let Err(e) = pty.resize(h, w) {
            tracing::debug!(target: "agentrun::docker", "docker API: resizing the pty: {e}");
        }
    }
    let exec = Arc::new(Exec {
        id,
        container: c,
        cmd: req.cmd,
        env: req.env,
        working_dir,
        tty: req.tty,
        attach_stdin: req.attach_stdin,
        user,
        pty,
        state: Mutex::new(ExecState::default()),
    });
    let id = exec.id.clone();
    lock(&api.execs).insert(id.clone(), exec);
    Ok(json(StatusCode::CREATED, &json!({ "Id": id })))
}

/// The exec instance `id` names, or the 404 to answer.
fn find_exec(api: &ApiState, id: &str) -> Result<Arc<Exec>, DockerError> {
    lock(&api.execs)
        .get(id)
        .cloned()
        .ok_or_else(|| DockerError::no_such_exec(id))
}

/// `GET /exec/{id}/json`
pub async fn inspect(State(api): Api, Path(id): Path<String>) -> DockerResult {
    let e = find_exec(&api, &id)?;
    let st = lock(&e.state);
    Ok(json(
        StatusCode::OK,
        &json!({
            "ID": e.id,
            "Running": st.running,
            "ExitCode": st.exit_code,
            "ProcessConfig": {
                "tty": e.tty,
                "entrypoint": e.cmd.first(),
                "arguments": e.cmd.iter().skip(1).collect::<Vec<_>>(),
                "privileged": false,
                "user": e.user.clone().unwrap_or_default(),
            },
            "OpenStdin": e.attach_stdin,
            "OpenStderr": true,
            "OpenStdout": true,
            "CanRemove": false,
            "ContainerID": e.container.id,
            "DetachKeys": "",
            "Pid": st.pid,
        }),
    ))
}

/// `POST /exec/{id}/resize?h=&w=`
pub async fn resize(State(api): Api, Path(id): Path<String>, q: Query) -> DockerResult {
    let e = find_exec(&api, &id)?;
    e.pty.resize_to_query(&q)?;
    Ok(crate::http::empty(StatusCode::CREATED))
}

/// `POST /exec/{id}/start`
pub async fn start(State(api): Api, Path(id): Path<String>, req: Request) -> DockerResult {
    // The body is read here; the request (its upgrade) goes on without it.
    let (parts, body) = req.into_parts();
    let mut req = hyper::Request::from_parts(parts, ());
    let body = crate::http::read_body(body, &api.limits).await?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
    let exec = find_exec(&api, &id)?;
    {
        let mut st = lock(&exec.state);
        if st.started {
            return Err(DockerError::conflict(format!(
                "Exec command {id} has already run"
            )));
        }
        st.started = true;
    }
    if exec.container.status() != Status::Running {
        return Err(DockerError::conflict(format!(
            "Container {} is not running",
            exec.container.id
        )));
    }
    let tty = body["Tty"].as_bool().unwrap_or(exec.tty);
    if let Some((h, w)) = crate::pty::console_size(&body["ConsoleSize"]) {
        if let Err(e) = exec.pty.resize(h, w) {
            tracing::debug!(target: "agentrun::docker", "docker API: resizing the pty: {e}");
        }
    }
    if body["Detach"].as_bool().unwrap_or(false) {
        tokio::spawn(run_detached(exec, tty));
        return Ok(crate::http::empty(StatusCode::OK));
    }
    if stream::wants_upgrade(&req) {
        let upgrade = hyper::upgrade::on(&mut req);
        let conn = req.extensions().get::<stream::ConnFd>().copied();
        tokio::spawn(async move {
            if let Ok(up) = upgrade.await {
                session(exec, tty, hyper_util::rt::TokioIo::new(up), conn).await;
            }
        });
        return Ok(stream::upgraded_reply(tty));
    }
    // No hijack: output only, as a streamed body.
    let (reply, tx) = stream::body_sender();
    tokio::spawn(async move {
        let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(64);
        let (exit_tx, exit_rx) = oneshot::channel();
        if let Err(e) = spawn(&exec, tty, false, out_tx, exit_tx).await {
            let _ = tx
                .send(Bytes::from(stream::frame(1, e.to_string().as_bytes(), tty)))
                .await;
            return;
        }
        drop(exit_rx);
        while let Some((s, b)) = out_rx.recv().await {
            if tx
                .send(Bytes::from(stream::frame(s, &b, tty)))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    Ok(reply)
}

/// A detached exec: its output read and thrown away until it ends.
async fn run_detached(exec: Arc<Exec>, tty: bool) {
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(64);
    let (exit_tx, _exit_rx) = oneshot::channel();
    if spawn(&exec, tty, false, out_tx, exit_tx).await.is_ok() {
        while out_rx.recv().await.is_some() {}
    }
}

/// Why an exec's process did not start; the words are what Docker prints to the client.
#[derive(Debug, thiserror::Error)]
enum SpawnError {
    #[error(transparent)]
    Stdio(std::io::Error),
    #[error("Container {0} is not running")]
    NotRunning(String),
    #[error(transparent)]
    Join(tokio::task::JoinError),
    /// A mistake of the user's (a bad working directory, user, ...), said as it is.
    #[error("{0}\r\n")]
    User(String),
    #[error(
        "OCI runtime exec failed: exec failed: unable to start container process: exec: \"{cmd}\": {why}: unknown\r\n"
    )]
    Exec { cmd: String, why: String },
}

/// Starts the process; output goes to `out`, the exit code to `exit`. On failure to start,
/// the message Docker prints (and the exit code is recorded as 126, as dockerd does).
async fn spawn(
    exec: &Arc<Exec>,
    tty: bool,
    want_stdin: bool,
    out: mpsc::Sender<(u8, Bytes)>,
    exit: oneshot::Sender<i32>,
) -> Result<Option<mpsc::Sender<Bytes>>, SpawnError> {
    let stdio = Stdio::open(tty, want_stdin).map_err(SpawnError::Stdio)?;
    // An exited container keeps its sandbox (its files): only a running one takes execs.
    let (sandbox, exits) = {
        let st = lock(&exec.container.state);
        match (&st.sandbox, st.status) {
            (Some(sb), Status::Running) => (sb.clone(), st.exits),
            _ => return Err(SpawnError::NotRunning(exec.container.id.clone())),
        }
    };
    let sandbox2 = sandbox.clone();
    let Stdio {
        child,
        stdin,
        outputs,
        pty,
    } = stdio;
    exec.pty.set_master(pty);
    let weak = Arc::downgrade(exec);
    let on_exit = Box::new(move |x: agentrun_pool::live::ProcessExit| {
        if let Some(e) = weak.upgrade() {
            let mut st = lock(&e.state);
            st.running = false;
            st.exit_code = Some(x.exit_code);
            drop(st);
            e.pty.set_master(None);
        }
        let _ = exit.send(x.exit_code);
    });
    let mut env = exec.env.clone();
    if exec.container.home_from_passwd(&exec.user, &env) {
        env.push(("HOME".into(), String::new()));
    }
    let spec = StartCommand::new(exec.cmd.clone(), env, exec.working_dir.clone())
        .user(exec.user.clone())
        .into_spec(child, tty, on_exit);
    lock(&exec.state).running = true;
    let spawned = tokio::task::spawn_blocking(move || sandbox.spawn(spec))
        .await
        .map_err(SpawnError::Join)?;
    match spawned {
        Ok(p) => {
            // The main process ended while this one started (after its stop killed what ran
            // then): it goes too. The exit hook has run by now (events come in order).
            let stopped = {
                let st = lock(&exec.container.state);
                st.status != Status::Running || st.exits != exits
            };
            if stopped {
                // It may have exited already.
                let _ = sandbox2.signal(p.id, libc::SIGKILL, true);
            }
            lock(&exec.state).pid = p.pid;
            for (s, fd) in outputs {
                stream::pump_to(fd, s, out.clone());
            }
            Ok(stdin.map(stream::stdin_writer))
        }
        Err(e) => {
            let mut st = lock(&exec.state);
            st.running = false;
            st.exit_code = Some(126);
            let why = match &e {
                agentrun_pool::PoolError::Spawn { exit_code: 127, .. } => {
                    "executable file not found in $PATH".to_owned()
                }
                agentrun_pool::PoolError::Spawn { exit_code: 126, .. } => {
                    "permission denied".to_owned()
                }
                agentrun_pool::PoolError::Spawn { message, .. }
                    if crate::containers::is_user_error(message) =>
                {
                    return Err(SpawnError::User(message.clone()));
                }
                other => other.to_string(),
            };
            Err(SpawnError::Exec {
                cmd: exec.cmd[0].clone(),
                why,
            })
        }
    }
}

/// A hijacked exec: stdin from the client, frames to it, closed once the process exited and
/// its output is drained.
async fn session(exec: Arc<Exec>, tty: bool, io: HijackIo, conn: Option<stream::ConnFd>) {
    // docker-py reads the 101 answer through a buffered reader and then the raw socket: output
    // that arrives in the same read as the answer is lost to it. So the process starts once
    // the client has read the answer (the socket's send queue is empty).
    stream::answer_read(conn).await;
    let (rd, mut wr) = tokio::io::split(io);
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(64);
    let (exit_tx, mut exit_rx) = oneshot::channel();
    let stdin = match spawn(&exec, tty, exec.attach_stdin, out_tx, exit_tx).await {
        Ok(s) => s,
        Err(e) => {
            // The client may be gone; nothing else to tell.
            let _ = stream::send(&mut wr, 1, e.to_string().as_bytes(), tty).await;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
            return;
        }
    };
    let input = tokio::spawn(stream::client_to_stdin(rd, stdin));
    let mut sent = 0usize;
    let mut how = "eof";
    loop {
        tokio::select! {
            got = out_rx.recv() => match got {
                Some((s, b)) => {
                    sent += b.len();
                    if !stream::send(&mut wr, s, &b, tty).await {
                        how = "client gone";
                        break;
                    }
                }
                None => {
                    // Output closed: the exit follows (bounded, the sandbox may be gone).
                    // Elapsed: the exit code stays unknown, as when the sandbox is gone.
                    let _ = tokio::time::timeout(Duration::from_secs(5), &mut exit_rx).await;
                    break;
                }
            },
            _ = &mut exit_rx => {
                how = "exit";
                // Drain what is left, bounded.
                let deadline = tokio::time::Instant::now() + DRAIN_AFTER_EXIT;
                while let Ok(Some((s, b))) = tokio::time::timeout_at(deadline, out_rx.recv()).await {
                    sent += b.len();
                    if !stream::send(&mut wr, s, &b, tty).await {
                        break;
                    }
                }
                break;
            }
        }
    }
    input.abort();
    // The client may be gone already.
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
    tracing::debug!(
        target: TRACE,
        "exec {} {:?}: {sent} bytes, ended by {how}",
        exec.id,
        exec.cmd
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_bodies() {
        let r = ExecConfig::from_body(&json!({
            "Cmd": ["sh", "-c", "id", 5], "Env": ["A=1", "NOEQ"], "WorkingDir": "",
            "User": "nobody", "Tty": true, "ConsoleSize": [24, 80],
        }))
        .unwrap();
        assert_eq!(r.cmd, vec!["sh", "-c", "id"]);
        assert_eq!(r.env, vec![("A".to_string(), "1".to_string())]);
        assert_eq!(r.working_dir, None);
        assert_eq!(r.user.as_deref(), Some("nobody"));
        assert!(r.tty && !r.attach_stdin);
        assert_eq!(r.console_size, Some((24, 80)));
        for bad in [
            json!({}),
            json!({"Cmd": []}),
            json!({"Cmd": "ls"}),
            json!(null),
        ] {
            assert_eq!(
                ExecConfig::from_body(&bad),
                Err("No exec command specified")
            );
        }
    }
}
