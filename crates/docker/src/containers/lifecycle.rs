//! A container's lifecycle: its sandbox made once ([`ensure_sandbox`]), [`start`] (ports,
//! stdio, the main process, its output pumps and the exit that follows), [`signal`],
//! [`stop`] and [`remove`].

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentrun_pool::live::{LiveSandbox, LiveSpec};
use agentrun_pool::lock;
use agentrun_pool::pool::REFILL_HOLDOFF;
use agentrun_pool::process::StartCommand;
use agentrun_pool::stdio::pump;
use bytes::Bytes;

use super::model::{Container, Status};
use crate::error::DockerError;
use crate::stdio::Stdio;
use crate::{ApiState, TRACE};

/// The built-in profile containers run under (`bundles/container.toml`: rootfs writable, no
/// network).
pub const CONTAINER_PROFILE: &str = "container";

/// How long an exit waits for the main process's output to be read to its end.
const OUTPUT_AFTER_EXIT: Duration = Duration::from_secs(2);

/// The container's sandbox (its filesystem): the one it has, or a new one when it has none
/// yet (never started) or its init died (the files went with it). Made once, even when a
/// start and a `docker cp` ask at the same time.
pub fn ensure_sandbox(api: &ApiState, c: &Arc<Container>) -> Result<Arc<LiveSandbox>, DockerError> {
    let _making = lock(&c.making);
    let old = lock(&c.state).sandbox.clone();
    if let Some(sb) = old {
        if !sb.is_dead() {
            return Ok(sb);
        }
        lock(&c.state).sandbox = None;
        if let Err(e) = api.live.delete(sb.id()) {
            tracing::warn!(target: "agentrun::docker", "docker API: deleting an unused sandbox: {e}");
        }
    }
    let mounts = c.config.mounts().map_err(DockerError::bad_request)?;
    let mut spec = LiveSpec::new(c.image_id.clone())
        .profile(&api.profile)
        .memory_bytes(c.config.memory)
        .cpus(c.config.cpus);
    spec.mounts = mounts;
    spec.pids = c.config.pids;
    let sandbox = api
        .live
        .create(&spec)
        .map_err(|e| DockerError::internal(format!("creating the container's sandbox: {e}")))?;
    let mut st = lock(&c.state);
    if st.removed {
        drop(st);
        if let Err(e) = api.live.delete(sandbox.id()) {
            tracing::warn!(target: "agentrun::docker", "docker API: deleting the sandbox of a removed container: {e}");
        }
        return Err(DockerError::no_such_container(&c.id));
    }
    st.sandbox = Some(sandbox.clone());
    Ok(sandbox)
}

/// Starts a container: its sandbox (kept from an earlier run, else made now), its published
/// ports, its main process, the pumps of its output and the writer of its stdin (tasks of the
/// API's runtime: called on one of its blocking threads). `Err` is the answer to the start
/// (the container is back in the state it was in).
pub fn start(api: &ApiState, c: &Arc<Container>) -> Result<(), DockerError> {
    let argv = c.argv();
    if argv.is_empty() {
        return Err(DockerError::bad_request("no command specified"));
    }
    let t0 = Instant::now();
    // The pool holds off replacing a sandbox taken for this start (for REFILL_HOLDOFF at
    // most); the start lets it go on once the main process exited (or the start failed): on
    // a 2-core machine, making one at the same time slowed the spawn by ~1 ms, and the exit's
    // answer.
    let refill = Refill(api.live.clone());
    let sandbox = ensure_sandbox(api, c)?;
    let t_sandbox = t0.elapsed();
    let Stdio {
        child,
        stdin,
        outputs,
        pty,
    } = Stdio::open(c.config.tty, c.config.open_stdin)
        .map_err(|e| DockerError::internal(format!("stdio: {e}")))?;
    let published = publish_ports(c, &sandbox)?;
    let (env, user) = main_env(c);
    let on_exit = exit_hook(api, c, &sandbox);
    c.pty.set_master(pty);
    let before = mark_running(c, stdin, published);
    *lock(&c.open_outputs) = outputs.len();
    let exits_before = lock(&c.state).exits;
    let t_spawn = Instant::now();
    let spawned = sandbox.spawn(
        StartCommand::new(argv.clone(), env, c.working_dir())
            .user(user)
            .into_spec(child, c.config.tty, on_exit),
    );
    if spawned.is_ok() {
        hold_refill_until_exit(refill, c, exits_before);
    } else {
        drop(refill);
    }
    // The pumps start once the process runs (its output waits in the pipe or pty meanwhile):
    // nothing of them is on the way to it. An exit that comes first waits for them.
    start_output_pumps(c, outputs);
    match spawned {
        Ok(p) => {
            tracing::debug!(
                target: TRACE,
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
            record_main(c, p);
            Ok(())
        }
        Err(e) => Err(start_failed(c, before, &argv[0], &e)),
    }
}

/// The main process runs: its ids are recorded (unless it already exited).
fn record_main(c: &Container, p: agentrun_pool::live::Process) {
    let mut st = lock(&c.state);
    if st.status == Status::Running {
        st.main = Some((p.id, p.pid));
    }
    drop(st);
    c.bump();
}

/// The container's published ports (its `PortBindings`, or every exposed port with
/// `PublishAllPorts`), listening from now on.
fn publish_ports(
    c: &Container,
    sandbox: &LiveSandbox,
) -> Result<Option<crate::ports::Published>, DockerError> {
    let bindings = crate::ports::bindings(&c.config.host_config_raw, &c.exposed_ports())
        .map_err(DockerError::bad_request)?;
    if !bindings.is_empty() {
        // Listeners on the host that connect into the shell's network namespace: its shell
        // is not reused after the container.
        sandbox.taint("ports");
    }
    crate::ports::publish(&c.name, &bindings, sandbox.init_pid()).map_err(DockerError::internal)
}

/// The main process's environment over the sandbox's (the request's `Env`; a bare `KEY`
/// takes the daemon's value, as dockerd does) and the user it runs as.
fn main_env(c: &Container) -> (Vec<(String, String)>, Option<String>) {
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
    (env, user)
}

/// Marks the container running before its main process exists (a fast process may exit, and
/// its hook run, before spawn even returns, and that exit must not be overwritten), with its
/// ports and stdin (the stdin an attach kept before start goes first). Returns the status it
/// had, for a start that fails.
fn mark_running(
    c: &Container,
    stdin: Option<OwnedFd>,
    published: Option<crate::ports::Published>,
) -> Status {
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
}

/// What runs when the main process exits: every other process in the container is killed,
/// its output read to its end (bounded), the exit recorded, and an AutoRemove container
/// removed.
fn exit_hook(
    api: &ApiState,
    c: &Arc<Container>,
    sandbox: &Arc<LiveSandbox>,
) -> agentrun_pool::live::ExitHook {
    let weak = Arc::downgrade(c);
    let weak_sandbox = Arc::downgrade(sandbox);
    let live = api.live.clone();
    let containers = api.containers.clone();
    Box::new(move |exit: agentrun_pool::live::ProcessExit| {
        let Some(c) = weak.upgrade() else { return };
        tracing::debug!(
            target: TRACE,
            "container {}: main process exited ({})",
            c.id,
            exit.exit_code
        );
        // As when PID 1 of a container dies: whatever else runs in it goes too (and with it
        // the last writers of the main process's output). Sent before the exit is recorded,
        // so it reaches the init before any later start's spawn.
        let sandbox = weak_sandbox.upgrade();
        if let Some(sb) = sandbox.as_ref().filter(|_| !exit.lost) {
            // The processes may be gone already.
            let _ = sb.signal_all(libc::SIGKILL);
        }
        // As dockerd: the exit is reported once the output is copied, so `logs` after `wait`
        // has all of it (bounded; the kill above ends the last writers).
        c.wait_outputs(Instant::now() + OUTPUT_AFTER_EXIT);
        let (remove, gone) = record_exit(&c, sandbox.as_ref(), &exit);
        c.pty.set_master(None);
        if remove {
            lock(&containers).by_id.remove(&c.id);
        }
        c.bump();
        // The container is gone for the API (its waits are answered) before its sandbox is:
        // only the init is left in it (the SIGKILL above ended the rest). It dies now, and the
        // teardown (mounts, cgroups, state dir) finishes off this thread.
        if let Some(sb) = gone {
            live.tear_down(&sb, || {}, || {});
        }
    })
}

/// Records the main process's exit and, for an AutoRemove container, its removal: one change
/// of state (`wait?condition=removed` is answered at once). The sandbox stays for a later
/// start or `docker cp`, unless the container goes or its init is dead (then its files are
/// gone anyway): returns whether the container goes, and the sandbox to tear down.
fn record_exit(
    c: &Container,
    sandbox: Option<&Arc<LiveSandbox>>,
    exit: &agentrun_pool::live::ProcessExit,
) -> (bool, Option<Arc<LiveSandbox>>) {
    let (ports, remove, gone) = {
        let mut st = lock(&c.state);
        st.status = Status::Exited;
        st.exit_code = exit.exit_code;
        st.finished_at = Some(SystemTime::now());
        st.stdin = None;
        st.exits += 1;
        let remove = c.config.auto_remove && !st.restarting;
        let ours = st
            .sandbox
            .as_ref()
            .is_some_and(|s| sandbox.is_some_and(|mine| Arc::ptr_eq(s, mine)));
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
    (remove, gone)
}

/// Lets the pool's refill go on once the main process exited (at most [`REFILL_HOLDOFF`]
/// after the start).
fn hold_refill_until_exit(refill: Refill, c: &Arc<Container>, exits_before: u64) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
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
        // Elapsed is an answer too: the refill goes on after the hold-off.
        let _ = tokio::time::timeout(REFILL_HOLDOFF, exited).await;
    });
}

/// One pump per output of the main process (a task of the API's runtime), each keeping what
/// it reads in the container's log and sending it to attached clients until EOF.
fn start_output_pumps(c: &Arc<Container>, outputs: Vec<(u8, OwnedFd)>) {
    for (stream, fd) in outputs {
        let weak = Arc::downgrade(c);
        let done = OutputDone(weak.clone());
        tokio::spawn(pump(fd, move |b| {
            let _ = &done; // dropped with the pump: at EOF
            std::future::ready(match weak.upgrade() {
                Some(c) => {
                    c.record_output(stream, b);
                    true
                }
                None => false,
            })
        }));
    }
}

/// A main process that could not be spawned: the container is back in the state it was in
/// (its sandbox stays, with its files), and the answer carries dockerd's text for a missing
/// or non-executable command (what the docker CLI turns into exit codes 127 and 126).
fn start_failed(
    c: &Container,
    before: Status,
    command: &str,
    e: &agentrun_pool::PoolError,
) -> DockerError {
    let msg = match e {
        agentrun_pool::PoolError::Spawn { exit_code, message } if *exit_code == 127 => {
            format!("failed to create task for container: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: \"{command}\": executable file not found in $PATH: unknown ({message})")
        }
        agentrun_pool::PoolError::Spawn { exit_code, message } if *exit_code == 126 => {
            format!("failed to create task for container: OCI runtime create failed: unable to start container process: exec: \"{command}\": permission denied: unknown ({message})")
        }
        other => other.to_string(),
    };
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
    DockerError::bad_request(msg)
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
            // It may have exited already (then the signal has nothing to do).
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
    if !wait_not_running(c, timeout) {
        if let Some(sb) = sandbox() {
            // The processes may be gone already.
            let _ = sb.signal_all(libc::SIGKILL);
        }
        // Wait (bounded) for the exit to be recorded; an init that does not answer is
        // killed (the container's files go with it).
        wait_not_running(c, Duration::from_secs(10));
    }
    if c.status() == Status::Running {
        if let Some(sb) = sandbox() {
            sb.kill();
        }
    }
    true
}

/// Waits until the container is no longer running, for `limit` at most; whether it stopped.
/// Woken by the container's state changes (`changed`), not by polling: a stop's answer comes
/// as soon as the exit is recorded. Off a runtime (never, today: callers run on its blocking
/// threads), it polls every 10 ms.
fn wait_not_running(c: &Arc<Container>, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        while c.status() == Status::Running && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        return c.status() != Status::Running;
    };
    // Subscribed before the status is read: a change in between is seen by `changed`.
    let mut changed = c.changed.subscribe();
    rt.block_on(async {
        let stopped = async {
            while c.status() == Status::Running {
                if changed.changed().await.is_err() {
                    break;
                }
            }
        };
        // Elapsed is an answer too: the caller checks the status.
        let _ = tokio::time::timeout_at(deadline.into(), stopped).await;
    });
    c.status() != Status::Running
}

/// Kills and forgets a container (its processes and published ports first; its sandbox's
/// teardown in the background).
pub fn remove(api: &ApiState, c: &Arc<Container>) {
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
        api.live.tear_down(sb, || {}, || {});
    }
    lock(&api.containers).by_id.remove(&c.id);
    c.bump();
}
