//! Containers: each one is an agentrun long-lived sandbox ([`LiveSandbox`]) whose main process
//! is the image's Entrypoint + Cmd (or the create request's), with the image's Env and
//! WorkingDir, live bind mounts (`HostConfig.Binds`), cgroup limits (`Memory`, `NanoCpus`,
//! `CpuQuota`, `PidsLimit`) and a real pty when `Tty` is set.
//!
//! Lifecycle as dockerd's: `created` (a record; its sandbox is made by the first start, or
//! by a `docker cp` before it) -> `running` (the main process runs in the sandbox) ->
//! `exited` (the main process ended: every other process in the sandbox is killed, as when
//! PID 1 of a container dies, but the sandbox's init stays and with it the container's
//! filesystem, its own overlay layer: `docker cp` works on it, and `start`/`restart` run the
//! main process again on the same files) -> removed (the sandbox is destroyed). Published
//! ports ([`crate::ports`]) are listened on while the main process runs. Output is kept per
//! container (`logs`) and fanned out to attached clients; `wait` watches the state.
//!
//! An exited container's sandbox is an ordinary sandbox of the daemon's factory: a daemon
//! that dies takes it with it like every other (the factory destroys what it made when the
//! daemon's channel closes; `gc` at the next start removes what a killed factory left).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use agentrun_image::ImageConfig;
use agentrun_pool::live::{LiveSandbox, LiveSpec, ProcessSpec};
use agentrun_pool::pool::REFILL_HOLDOFF;
use agentrun_runtime::rootfs::UserMount;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use crate::Context;

/// The built-in profile containers run under (`bundles/container.toml`: rootfs writable, no
/// network).
pub const CONTAINER_PROFILE: &str = "container";

/// How long an exit waits for the main process's output to be read to its end.
const OUTPUT_AFTER_EXIT: Duration = Duration::from_secs(2);

/// Output kept per container for `logs` (older output is dropped first).
const LOG_CAP: usize = 8 * 1024 * 1024;
/// What a kept chunk costs besides its bytes (its entry and allocation), counted against
/// [`LOG_CAP`]: a process writing a byte at a time cannot make 8 MiB of log cost 500 MiB.
const CHUNK_COST: usize = 64;

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What `POST /containers/create` asked for.
#[derive(Debug, Clone, Default)]
pub struct ContainerConfig {
    pub image: String,
    pub cmd: Option<Vec<String>>,
    pub entrypoint: Option<Vec<String>>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
    pub tty: bool,
    pub open_stdin: bool,
    pub stdin_once: bool,
    pub labels: serde_json::Map<String, Value>,
    pub binds: Vec<String>,
    pub auto_remove: bool,
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u32>,
    pub network_mode: String,
    /// `ExposedPorts` of the request.
    pub exposed: Vec<String>,
    /// The request's own `Config` fields, echoed by inspect.
    pub raw: Value,
    pub host_config_raw: Value,
}

fn strings(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Array(a) => Some(
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect(),
        ),
        Value::String(s) => Some(vec![s.clone()]),
        _ => None,
    }
}

impl ContainerConfig {
    /// Parses a create body; unknown fields are ignored (clients send many).
    pub fn from_body(body: &Value) -> Result<Self, String> {
        let image = body["Image"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or("config: Image is required")?
            .to_owned();
        let hc = &body["HostConfig"];
        let cpus = if let Some(n) = hc["NanoCpus"].as_u64().filter(|n| *n > 0) {
            Some(n as f64 / 1e9)
        } else if let Some(q) = hc["CpuQuota"].as_i64().filter(|q| *q > 0) {
            let period = hc["CpuPeriod"]
                .as_i64()
                .filter(|p| *p > 0)
                .unwrap_or(100_000);
            Some(q as f64 / period as f64)
        } else {
            None
        };
        let exposed: Vec<String> = body["ExposedPorts"]
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let network_mode = hc["NetworkMode"].as_str().unwrap_or("default").to_owned();
        // Checked now; the image's exposed ports join them at start (`PublishAllPorts`).
        let ports = crate::ports::bindings(hc, &exposed)?;
        if !ports.is_empty() && network_mode == "none" {
            return Err(
                "conflicting options: port publishing and the container type network mode".into(),
            );
        }
        Ok(ContainerConfig {
            image,
            cmd: strings(&body["Cmd"]),
            entrypoint: strings(&body["Entrypoint"]),
            env: strings(&body["Env"]).unwrap_or_default(),
            working_dir: body["WorkingDir"].as_str().unwrap_or("").to_owned(),
            user: body["User"].as_str().unwrap_or("").to_owned(),
            tty: body["Tty"].as_bool().unwrap_or(false),
            open_stdin: body["OpenStdin"].as_bool().unwrap_or(false),
            stdin_once: body["StdinOnce"].as_bool().unwrap_or(false),
            labels: body["Labels"].as_object().cloned().unwrap_or_default(),
            binds: strings(&hc["Binds"]).unwrap_or_default(),
            auto_remove: hc["AutoRemove"].as_bool().unwrap_or(false),
            memory: hc["Memory"].as_u64().filter(|m| *m > 0),
            cpus,
            pids: hc["PidsLimit"]
                .as_i64()
                .filter(|p| *p > 0)
                .map(|p| p as u32),
            network_mode,
            exposed,
            raw: body.clone(),
            host_config_raw: hc.clone(),
        })
    }

    /// `HostConfig.Binds` entries (`SRC:DST[:ro|rw]`) as mounts; a source must be an absolute
    /// host path (named volumes are not supported).
    pub fn mounts(&self) -> Result<Vec<UserMount>, String> {
        self.binds
            .iter()
            .map(|b| {
                let parts: Vec<&str> = b.split(':').collect();
                let (src, dst, opts) = match parts.as_slice() {
                    [s, d] => (*s, *d, ""),
                    [s, d, o] => (*s, *d, *o),
                    _ => return Err(format!("invalid bind {b:?}: expected SRC:DST[:ro|rw]")),
                };
                if !src.starts_with('/') {
                    return Err(format!(
                        "invalid bind {b:?}: named volumes are not supported, use an absolute host path"
                    ));
                }
                if !dst.starts_with('/') {
                    return Err(format!("invalid bind {b:?}: the destination must be absolute"));
                }
                let writable = !opts.split(',').any(|o| o == "ro");
                Ok(UserMount {
                    source: PathBuf::from(src),
                    target: PathBuf::from(dst),
                    writable,
                })
            })
            .collect()
    }
}

/// Where a container is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Exited,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Exited => "exited",
        }
    }
}

/// The changing part of a container.
pub struct State {
    pub status: Status,
    pub sandbox: Option<Arc<LiveSandbox>>,
    /// The main process (sandbox process id, pid inside).
    pub main: Option<(u64, i32)>,
    pub exit_code: i32,
    pub oom_killed: bool,
    pub error: String,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
    /// The main process's stdin (pipe or pty master), written by a thread of its own
    /// ([`crate::stream::stdin_writer`]: bounded, in order); `None` closes it.
    pub stdin: Option<tokio::sync::mpsc::Sender<Bytes>>,
    /// Stdin attached before start, kept for the process.
    pub pending_stdin: Vec<u8>,
    pub stdin_closed_early: bool,
    /// Bumped on every exit (for `wait?condition=next-exit`).
    pub exits: u64,
    pub removed: bool,
    /// The published ports, while the main process runs.
    pub ports: Option<crate::ports::Published>,
    /// A restart is under way: its stop does not remove an AutoRemove container.
    pub restarting: bool,
}

/// One container.
pub struct Container {
    pub id: String,
    pub name: String,
    pub created: SystemTime,
    pub config: ContainerConfig,
    pub image_id: String,
    pub image_config: ImageConfig,
    pub state: Mutex<State>,
    /// Held while the container's sandbox is being made (start, or `docker cp` before it).
    making: Mutex<()>,
    /// Every state change bumps it (wait, attach end).
    pub changed: watch::Sender<u64>,
    /// (stream: 1 stdout / 2 stderr, bytes), kept for logs.
    pub logs: Mutex<(std::collections::VecDeque<(u8, Bytes)>, usize)>,
    pub output: broadcast::Sender<(u8, Bytes)>,
    /// The main process's pty (`Tty`) and its window size.
    pub pty: crate::pty::Pty,
    /// Output pumps of the main process still reading (0: all its output is broadcast);
    /// `outputs_done` is notified as each one ends.
    open_outputs: Mutex<usize>,
    outputs_done: Condvar,
}

impl Container {
    pub fn new(
        id: String,
        name: String,
        config: ContainerConfig,
        image_id: String,
        image_config: ImageConfig,
    ) -> Self {
        let pty = crate::pty::Pty::default();
        if let Some((h, w)) = crate::pty::console_size(&config.host_config_raw["ConsoleSize"]) {
            let _ = pty.resize(h, w);
        }
        Container {
            id,
            name,
            created: SystemTime::now(),
            config,
            image_id,
            image_config,
            state: Mutex::new(State {
                status: Status::Created,
                sandbox: None,
                main: None,
                exit_code: 0,
                oom_killed: false,
                error: String::new(),
                started_at: None,
                finished_at: None,
                stdin: None,
                pending_stdin: Vec::new(),
                stdin_closed_early: false,
                exits: 0,
                removed: false,
                ports: None,
                restarting: false,
            }),
            making: Mutex::new(()),
            changed: watch::channel(0).0,
            logs: Mutex::new(Default::default()),
            output: broadcast::channel(1024).0,
            pty,
            open_outputs: Mutex::new(0),
            outputs_done: Condvar::new(),
        }
    }

    /// Whether an output pump of the main process is still reading.
    pub fn outputs_open(&self) -> bool {
        *lock(&self.open_outputs) > 0
    }

    /// Blocks until every output pump of the main process reached EOF, or until `deadline`.
    fn wait_outputs(&self, deadline: Instant) {
        let mut open = lock(&self.open_outputs);
        while *open > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            open = self
                .outputs_done
                .wait_timeout(open, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    pub fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    pub fn status(&self) -> Status {
        lock(&self.state).status
    }

    /// The main process's argv: the request's Entrypoint/Cmd over the image's (a request's
    /// Entrypoint resets the image's Cmd, as in Docker).
    pub fn argv(&self) -> Vec<String> {
        let c = &self.config;
        let (ep, cmd) = match &c.entrypoint {
            Some(ep) => (ep.clone(), c.cmd.clone().unwrap_or_default()),
            None => (
                self.image_config.entrypoint.clone().unwrap_or_default(),
                c.cmd
                    .clone()
                    .or_else(|| self.image_config.cmd.clone())
                    .unwrap_or_default(),
            ),
        };
        let mut v = ep;
        v.extend(cmd);
        v
    }

    /// Who the main process runs as: the request's `User`, else the image's; `None`: root.
    pub fn user(&self) -> Option<String> {
        [&self.config.user, &self.image_config.user]
            .into_iter()
            .find(|u| !u.is_empty())
            .cloned()
    }

    /// `HOME=` (empty) when the process runs as a user and neither the image's nor the
    /// request's environment set `HOME` (`extra` is an exec's own): the sandbox's init then
    /// takes the user's home from the container's /etc/passwd, as Docker does.
    pub fn home_from_passwd(&self, user: &Option<String>, extra: &[(String, String)]) -> bool {
        user.is_some()
            && !self
                .image_config
                .env
                .iter()
                .chain(&self.config.env)
                .any(|kv| kv.starts_with("HOME="))
            && !extra.iter().any(|(k, _)| k == "HOME")
    }

    /// Every exposed port (`8000/tcp`): the image's, the request's and the published ones.
    pub fn exposed_ports(&self) -> Vec<String> {
        let mut all: Vec<String> = self.image_config.exposed_ports.clone();
        all.extend(self.config.exposed.iter().cloned());
        if let Some(map) = self.config.host_config_raw["PortBindings"].as_object() {
            all.extend(map.keys().cloned());
        }
        let mut all: Vec<String> = all
            .into_iter()
            .map(|p| {
                if p.contains('/') {
                    p
                } else {
                    format!("{p}/tcp")
                }
            })
            .collect();
        all.sort();
        all.dedup();
        all
    }

    pub fn working_dir(&self) -> String {
        if !self.config.working_dir.is_empty() {
            self.config.working_dir.clone()
        } else if !self.image_config.working_dir.is_empty() {
            self.image_config.working_dir.clone()
        } else {
            "/".into()
        }
    }

    /// Keeps output for logs and sends it to attached clients.
    pub fn record_output(&self, stream: u8, data: Bytes) {
        {
            let mut logs = lock(&self.logs);
            logs.1 += data.len() + CHUNK_COST;
            logs.0.push_back((stream, data.clone()));
            while logs.1 > LOG_CAP && !logs.0.is_empty() {
                if let Some((_, first)) = logs.0.pop_front() {
                    logs.1 -= first.len() + CHUNK_COST;
                }
            }
        }
        let _ = self.output.send((stream, data));
    }

    /// `docker inspect`.
    pub fn inspect(&self) -> Value {
        let st = lock(&self.state);
        let argv = self.argv();
        let time = |t: Option<SystemTime>| {
            t.map(rfc3339)
                .unwrap_or_else(|| "0001-01-01T00:00:00Z".to_owned())
        };
        let mut config = self.config.raw.clone();
        if !config.is_object() {
            config = json!({});
        }
        config["Image"] = json!(self.config.image);
        config["Cmd"] = json!(self.config.cmd.clone().or(self.image_config.cmd.clone()));
        config["Entrypoint"] = json!(self
            .config
            .entrypoint
            .clone()
            .or(self.image_config.entrypoint.clone()));
        let mut env = self.image_config.env.clone();
        env.extend(self.config.env.iter().cloned());
        config["Env"] = json!(env);
        config["WorkingDir"] = json!(self.working_dir());
        config["Tty"] = json!(self.config.tty);
        config["User"] = json!(self.user().unwrap_or_default());
        config["Labels"] = Value::Object(self.config.labels.clone());
        let exposed = self.exposed_ports();
        if !exposed.is_empty() {
            config["ExposedPorts"] =
                Value::Object(exposed.iter().map(|p| (p.clone(), json!({}))).collect());
        }
        config.as_object_mut().map(|o| o.remove("HostConfig"));
        let mounts: Vec<Value> = self
            .config
            .mounts()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                json!({"Type": "bind", "Source": m.source, "Destination": m.target,
                       "Mode": if m.writable { "rw" } else { "ro" }, "RW": m.writable,
                       "Propagation": "rprivate"})
            })
            .collect();
        let pid = if st.status == Status::Running {
            st.sandbox.as_ref().map(|s| s.init_pid()).unwrap_or(0)
        } else {
            0
        };
        let mut host_config = self.config.host_config_raw.clone();
        if !host_config.is_object() {
            host_config = json!({});
        }
        for (k, v) in [
            ("LogConfig", json!({"Type": "json-file", "Config": {}})),
            ("NetworkMode", json!(self.config.network_mode)),
            ("AutoRemove", json!(self.config.auto_remove)),
            ("Binds", json!(self.config.binds)),
            (
                "RestartPolicy",
                json!({"Name": "no", "MaximumRetryCount": 0}),
            ),
        ] {
            if host_config[k].is_null() {
                host_config[k] = v;
            }
        }
        json!({
            "Id": self.id,
            "Created": rfc3339(self.created),
            "Path": argv.first().cloned().unwrap_or_default(),
            "Args": argv.iter().skip(1).cloned().collect::<Vec<_>>(),
            "State": {
                "Status": st.status.as_str(),
                "Running": st.status == Status::Running,
                "Paused": false,
                "Restarting": false,
                "OOMKilled": st.oom_killed,
                "Dead": false,
                "Pid": pid,
                "ExitCode": st.exit_code,
                "Error": st.error,
                "StartedAt": time(st.started_at),
                "FinishedAt": time(st.finished_at),
            },
            "Image": self.image_id,
            "Name": format!("/{}", self.name),
            "RestartCount": 0,
            "Driver": "overlay2",
            "Platform": "linux",
            "HostConfig": host_config,
            "Mounts": mounts,
            "Config": config,
            "NetworkSettings": {
                "Ports": crate::ports::inspect_ports(
                    &exposed,
                    st.ports.as_ref(),
                    st.status == Status::Running,
                ),
                "Networks": {},
            },
        })
    }

    /// A row of `GET /containers/json`.
    pub fn summary(&self) -> Value {
        let st = lock(&self.state);
        let status = match st.status {
            Status::Created => "Created".to_owned(),
            Status::Running => "Up".to_owned(),
            Status::Exited => format!("Exited ({})", st.exit_code),
        };
        json!({
            "Id": self.id,
            "Names": [format!("/{}", self.name)],
            "Image": self.config.image,
            "ImageID": self.image_id,
            "Command": self.argv().join(" "),
            "Created": self.created.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "Ports": crate::ports::summary_ports(
                &self.exposed_ports(),
                st.ports.as_ref(),
                st.status == Status::Running,
            ),
            "Labels": Value::Object(self.config.labels.clone()),
            "State": st.status.as_str(),
            "Status": status,
            "HostConfig": {"NetworkMode": self.config.network_mode},
            "NetworkSettings": {"Networks": {}},
            "Mounts": [],
        })
    }
}

pub fn rfc3339(t: SystemTime) -> String {
    let dt: chrono::DateTime<chrono::Utc> = t.into();
    dt.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// Every container, by id and by name.
#[derive(Default)]
pub struct Containers {
    pub by_id: HashMap<String, Arc<Container>>,
}

impl Containers {
    /// By full id, unique id prefix, or name (with or without the leading `/`).
    pub fn find(&self, key: &str) -> Option<Arc<Container>> {
        let key = key.strip_prefix('/').unwrap_or(key);
        if let Some(c) = self.by_id.get(key) {
            return Some(c.clone());
        }
        if let Some(c) = self.by_id.values().find(|c| c.name == key) {
            return Some(c.clone());
        }
        let hits: Vec<_> = self
            .by_id
            .values()
            .filter(|c| key.len() >= 4 && c.id.starts_with(key))
            .collect();
        (hits.len() == 1).then(|| hits[0].clone())
    }

    pub fn name_taken(&self, name: &str) -> Option<String> {
        self.by_id
            .values()
            .find(|c| c.name == name)
            .map(|c| c.id.clone())
    }
}

/// A new 64-hex id (from [`agentrun_runtime::random`]: getrandom, never a predictable
/// fallback).
pub fn new_id() -> Result<String, agentrun_runtime::random::RandomError> {
    agentrun_runtime::random::hex(32)
}

/// Docker-style generated names.
pub fn generated_name(id: &str) -> String {
    const ADJ: &[&str] = &[
        "brave", "calm", "eager", "keen", "quiet", "swift", "tidy", "wise",
    ];
    const NOUN: &[&str] = &[
        "turing", "hopper", "lovelace", "ritchie", "thompson", "knuth", "liskov", "dijkstra",
    ];
    let n = u64::from_str_radix(&id[..8], 16).unwrap_or(0) as usize;
    format!(
        "{}_{}_{}",
        ADJ[n % ADJ.len()],
        NOUN[(n / 8) % NOUN.len()],
        &id[..6]
    )
}

/// A pipe: (read end, write end), close-on-exec.
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

/// The stdio of a process: what it gets, and our ends (stdin writer, output readers with
/// their stream numbers).
pub struct Stdio {
    pub child: [OwnedFd; 3],
    pub stdin: Option<File>,
    pub outputs: Vec<(u8, File)>,
    /// The pty master (a handle of its own, for resizing) when there is a pty.
    pub pty: Option<File>,
}

/// Pipes (stdout and stderr apart) or a pty (one stream, as stdout).
pub fn make_stdio(tty: bool, want_stdin: bool) -> std::io::Result<Stdio> {
    if tty {
        let pty = nix::pty::openpty(None, None).map_err(std::io::Error::from)?;
        let master = File::from(pty.master);
        let slave = pty.slave;
        nix::fcntl::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&master),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(std::io::Error::from)?;
        let reader = master.try_clone()?;
        let pty = Some(master.try_clone()?);
        return Ok(Stdio {
            child: [slave.try_clone()?, slave.try_clone()?, slave],
            stdin: Some(master),
            outputs: vec![(1, reader)],
            pty,
        });
    }
    let (stdin_child, stdin_ours) = if want_stdin {
        let (r, w) = pipe()?;
        (r, Some(File::from(w)))
    } else {
        (File::open("/dev/null")?.into(), None)
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    Ok(Stdio {
        child: [stdin_child, out_w, err_w],
        stdin: stdin_ours,
        outputs: vec![(1, File::from(out_r)), (2, File::from(err_r))],
        pty: None,
    })
}

/// The container's sandbox (its filesystem): the one it has, or a new one when it has none
/// yet (never started) or its init died (the files went with it). Made once, even when a
/// start and a `docker cp` ask at the same time.
pub fn ensure_sandbox(
    ctx: &Context,
    c: &Arc<Container>,
) -> Result<Arc<LiveSandbox>, (u16, String)> {
    let _making = lock(&c.making);
    let old = lock(&c.state).sandbox.clone();
    if let Some(sb) = old {
        if !sb.is_dead() {
            return Ok(sb);
        }
        lock(&c.state).sandbox = None;
        let _ = ctx.live.delete(sb.id());
    }
    let mounts = c.config.mounts().map_err(|e| (400, e))?;
    let mut spec = LiveSpec::new(c.image_id.clone())
        .profile(CONTAINER_PROFILE)
        .memory_bytes(c.config.memory)
        .cpus(c.config.cpus);
    spec.mounts = mounts;
    spec.pids = c.config.pids;
    let sandbox = ctx
        .live
        .create(&spec)
        .map_err(|e| (500, format!("creating the container's sandbox: {e}")))?;
    let mut st = lock(&c.state);
    if st.removed {
        drop(st);
        let _ = ctx.live.delete(sandbox.id());
        return Err((404, format!("No such container: {}", c.id)));
    }
    st.sandbox = Some(sandbox.clone());
    Ok(sandbox)
}

/// Starts a container: its sandbox (kept from an earlier run, else made now), its published
/// ports, its main process, the pumps of its output.
pub fn start(ctx: &Context, c: &Arc<Container>) -> Result<(), (u16, String)> {
    let argv = c.argv();
    if argv.is_empty() {
        return Err((400, "no command specified".into()));
    }
    let t0 = Instant::now();
    // The pool holds off replacing a sandbox taken for this start (for REFILL_HOLDOFF at
    // most); the start lets it go on once the main process exited (or the start failed): on
    // a 2-core machine, making one at the same time slowed the spawn by ~1 ms, and the exit's
    // answer.
    let refill = Refill(ctx.live.clone());
    let sandbox = ensure_sandbox(ctx, c)?;
    let t_sandbox = t0.elapsed();
    let stdio =
        make_stdio(c.config.tty, c.config.open_stdin).map_err(|e| (500, format!("stdio: {e}")))?;
    let bindings = crate::ports::bindings(&c.config.host_config_raw, &c.exposed_ports())
        .map_err(|e| (400, e))?;
    if !bindings.is_empty() {
        // Listeners on the host that connect into the shell's network namespace: its shell
        // is not reused after the container.
        sandbox.taint("ports");
    }
    let published =
        crate::ports::publish(&c.name, &bindings, sandbox.init_pid()).map_err(|e| (500, e))?;
    let mut env: Vec<(String, String)> = c
        .config
        .env
        .iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (kv.clone(), std::env::var(kv).unwrap_or_default()),
        })
        .collect();
    let user = c.user();
    if c.home_from_passwd(&user, &[]) {
        env.push(("HOME".into(), String::new()));
    }
    let weak = Arc::downgrade(c);
    let weak_sandbox = Arc::downgrade(&sandbox);
    let live = ctx.live.clone();
    let auto_remove = c.config.auto_remove;
    let containers = ctx.containers.clone();
    let on_exit = Box::new(move |exit: agentrun_pool::live::ProcessExit| {
        let Some(c) = weak.upgrade() else { return };
        crate::trace!(
            "container {}: main process exited ({})",
            c.id,
            exit.exit_code
        );
        // As when PID 1 of a container dies: whatever else runs in it goes too (and with it
        // the last writers of the main process's output). Sent before the exit is recorded,
        // so it reaches the init before any later start's spawn.
        let sandbox = weak_sandbox.upgrade();
        if let Some(sb) = sandbox.as_ref().filter(|_| !exit.lost) {
            let _ = sb.signal_all(libc::SIGKILL);
        }
        // As dockerd: the exit is reported once the output is copied, so `logs` after `wait`
        // has all of it (bounded; the kill above ends the last writers).
        c.wait_outputs(Instant::now() + OUTPUT_AFTER_EXIT);
        // The exit and, for an AutoRemove container, its removal are one change of state
        // (`wait?condition=removed` is answered at once). The sandbox stays for a later start
        // or `docker cp`, unless the container goes or its init is dead (then its files are
        // gone anyway).
        let (ports, remove, gone) = {
            let mut st = lock(&c.state);
            st.status = Status::Exited;
            st.exit_code = exit.exit_code;
            st.finished_at = Some(SystemTime::now());
            st.stdin = None;
            st.exits += 1;
            let remove = auto_remove && !st.restarting;
            let ours = st
                .sandbox
                .as_ref()
                .is_some_and(|s| sandbox.as_ref().is_some_and(|mine| Arc::ptr_eq(s, mine)));
            if remove {
                st.removed = true;
            }
            let gone = if remove || (exit.lost && ours) {
                st.sandbox.take()
            } else {
                None
            };
            (st.ports.take(), remove, gone)
        };
        drop(ports);
        c.pty.set_master(None);
        if remove {
            lock(&containers).by_id.remove(&c.id);
        }
        c.bump();
        // The container is gone for the API (its waits are answered) before its sandbox is:
        // only the init is left in it (the SIGKILL above ended the rest). It dies now, and the
        // teardown (mounts, cgroups, state dir) finishes off this thread.
        if let Some(sb) = gone {
            sb.kill();
            let live = live.clone();
            std::thread::spawn(move || {
                let _ = live.delete(sb.id());
            });
        }
    });
    let Stdio {
        child,
        stdin,
        outputs,
        pty,
    } = stdio;
    c.pty.set_master(pty);
    // Running before the process exists: a fast process may exit (and its hook run) before
    // spawn even returns, and that exit must not be overwritten.
    let before = {
        let mut guard = lock(&c.state);
        let st = &mut *guard;
        let before = st.status;
        st.status = Status::Running;
        st.restarting = false;
        st.main = None;
        st.started_at = Some(SystemTime::now());
        st.finished_at = None;
        st.exit_code = 0;
        st.error.clear();
        st.ports = published;
        st.stdin = stdin.map(crate::stream::stdin_writer);
        if let Some(w) = st.stdin.as_ref() {
            // Its queue is empty: this never waits (the process may not even exist yet).
            let pending = std::mem::take(&mut st.pending_stdin);
            if !pending.is_empty() {
                let _ = w.try_send(Bytes::from(pending));
            }
        }
        if st.stdin_closed_early {
            st.stdin = None;
        }
        before
    };
    *lock(&c.open_outputs) = outputs.len();
    let exits_before = lock(&c.state).exits;
    let t_spawn = Instant::now();
    let spawned = sandbox.spawn(ProcessSpec {
        argv: argv.clone(),
        env,
        cwd: c.working_dir(),
        stdio: child,
        new_session: c.config.tty,
        user,
        on_exit,
    });
    match (&spawned, tokio::runtime::Handle::try_current()) {
        (Ok(_), Ok(rt)) => {
            let c = c.clone();
            let mut changed = c.changed.subscribe();
            rt.spawn(async move {
                let _refill = refill;
                let exited = async {
                    while lock(&c.state).exits == exits_before {
                        if changed.changed().await.is_err() {
                            break;
                        }
                    }
                };
                let _ = tokio::time::timeout(REFILL_HOLDOFF, exited).await;
            });
        }
        _ => drop(refill),
    }
    // The pumps start once the process runs (its output waits in the pipe or pty meanwhile):
    // their threads are not made on the way to it. An exit that comes first waits for them.
    for (stream, reader) in outputs {
        let weak = Arc::downgrade(c);
        let done = OutputDone(weak.clone());
        crate::stream::pump_with(reader, move |b| {
            let _ = &done; // dropped with the pump: at EOF
            match weak.upgrade() {
                Some(c) => {
                    c.record_output(stream, b);
                    true
                }
                None => false,
            }
        });
    }
    match spawned {
        Ok(p) => {
            crate::trace!(
                "start {}: sandbox {:.2} ms ({}), spawn {:.2} ms",
                c.id,
                t_sandbox.as_secs_f64() * 1e3,
                if sandbox.pool_hit() {
                    "pool hit"
                } else {
                    "made now"
                },
                t_spawn.elapsed().as_secs_f64() * 1e3
            );
            let mut st = lock(&c.state);
            if st.status == Status::Running {
                st.main = Some((p.id, p.pid));
            }
            drop(st);
            c.bump();
            Ok(())
        }
        Err(e) => {
            let msg = match &e {
                agentrun_pool::PoolError::Spawn { exit_code, message } if *exit_code == 127 => {
                    format!("failed to create task for container: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: \"{}\": executable file not found in $PATH: unknown ({message})", argv[0])
                }
                agentrun_pool::PoolError::Spawn { exit_code, message } if *exit_code == 126 => {
                    format!("failed to create task for container: OCI runtime create failed: unable to start container process: exec: \"{}\": permission denied: unknown ({message})", argv[0])
                }
                other => other.to_string(),
            };
            // The sandbox stays the container's (its files); it is back where it was.
            let ports = {
                let mut st = lock(&c.state);
                st.status = before;
                st.stdin = None;
                st.started_at = None;
                st.error = msg.clone();
                st.exit_code = 127;
                st.ports.take()
            };
            drop(ports);
            c.bump();
            Err((400, msg))
        }
    }
}

/// A spawn failure about the `User` (from the sandbox's init, dockerd's texts).
pub fn is_user_error(message: &str) -> bool {
    message.starts_with("unable to find user")
        || message.starts_with("unable to find group")
        || message.starts_with("invalid user")
        || message.starts_with("cannot run as user")
}

/// Wakes the pool's refill when dropped (see [`LiveManager::refill`]).
///
/// [`LiveManager::refill`]: agentrun_pool::live::LiveManager::refill
struct Refill(Arc<agentrun_pool::live::LiveManager>);

impl Drop for Refill {
    fn drop(&mut self) {
        self.0.refill();
    }
}

/// Dropped when one output pump of a container's main process ends (its pipe or pty reached
/// EOF): everything it read has been recorded and broadcast by then.
struct OutputDone(std::sync::Weak<Container>);

impl Drop for OutputDone {
    fn drop(&mut self) {
        if let Some(c) = self.0.upgrade() {
            {
                let mut open = lock(&c.open_outputs);
                *open = open.saturating_sub(1);
            }
            c.outputs_done.notify_all();
            c.bump();
        }
    }
}

/// Signals the main process (its process group). `false` when it is not running.
pub fn signal(c: &Container, sig: i32) -> bool {
    let st = lock(&c.state);
    match (&st.sandbox, st.main, st.status) {
        (Some(sb), Some((pid_id, _)), Status::Running) => {
            let _ = sb.signal(pid_id, sig, true);
            true
        }
        _ => false,
    }
}

/// Stops a running container: `StopSignal` (default SIGTERM) to the main process, then after
/// `timeout` SIGKILL to every process in it (the sandbox and its files stay). Returns false
/// when it was not running.
pub fn stop(c: &Arc<Container>, timeout: Duration) -> bool {
    let sig = c
        .image_config
        .stop_signal
        .as_deref()
        .and_then(crate::signals::parse)
        .unwrap_or(libc::SIGTERM);
    if !signal(c, sig) {
        return false;
    }
    let sandbox = || lock(&c.state).sandbox.clone();
    let deadline = std::time::Instant::now() + timeout;
    while c.status() == Status::Running {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            if let Some(sb) = sandbox() {
                let _ = sb.signal_all(libc::SIGKILL);
            }
            break;
        }
        // Poll in small steps: this runs on a blocking thread.
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
    // Wait (bounded) for the exit to be recorded; an init that does not answer is killed
    // (the container's files go with it).
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while c.status() == Status::Running && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    if c.status() == Status::Running {
        if let Some(sb) = sandbox() {
            sb.kill();
        }
    }
    true
}

/// Kills and forgets a container (its processes and published ports first; its sandbox's
/// teardown in the background).
pub fn remove(ctx: &Context, c: &Arc<Container>) {
    let (sb, ports) = {
        let mut st = lock(&c.state);
        st.removed = true;
        (st.sandbox.take(), st.ports.take())
    };
    drop(ports);
    // Every process dies now; the container is gone for the API at once, and its sandbox's
    // teardown (mounts, cgroups, state dir) finishes off the request, as a delete does in
    // the OpenSandbox API.
    if let Some(sb) = &sb {
        sb.kill();
    }
    lock(&ctx.containers).by_id.remove(&c.id);
    c.bump();
    if let Some(sb) = sb {
        let live = ctx.live.clone();
        std::thread::spawn(move || {
            let _ = live.delete(sb.id());
        });
    }
}
