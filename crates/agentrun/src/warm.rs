//! `agentrun exec` through the daemon: the request and this process's stdio fds go to
//! `agentrun serve`, which runs the command in a cell of a pooled shell; the command writes
//! straight to our stdout/stderr, signals are forwarded, and the exit status comes back.
//!
//! Two run shapes need this process during the run: a network policy (the run's egress proxy
//! runs here, so its decisions are this run's spans and audit records: the daemon says on
//! which socket of the shell, we serve it and say so), and a profile's output cap (the
//! command then writes to pipes we pump, count and cap).

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use agentrun_egress::Proxy;
use agentrun_pool::client::DaemonClient;
use agentrun_pool::protocol::{ClientMessage, DaemonReply, ExecReply};
use agentrun_runtime::sandbox::OutputStream;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::plan::Plan;
use crate::run::{
    block_signals, landlock_subscribe, landlock_watch, record_kernel_denials, start_proxy,
    start_proxy_on, RunRecord,
};
use crate::trace::Recorder;

/// Runs `plan` in a cell of one of the daemon's shells, through `client`; `None` when the
/// daemon serves another image store than `store` (then nothing ran: the caller runs it cold).
pub(crate) fn execute(
    client: &DaemonClient,
    plan: &Plan,
    store: &Path,
    recorder: &Recorder,
) -> Option<RunRecord> {
    let mut run = RunRecord::default();
    let signals = block_signals();
    // The cell's PID 1 makes the run's Landlock domain; its denials during this run are
    // matched by that pid, which the reply carries. Subscribed before the request goes,
    // kept (audit on) or dropped once it went.
    let subscription = landlock_subscribe(agentrun_runtime::landlock::abi());
    let msg = ClientMessage::Exec {
        request: Box::new(plan.request.clone()),
        timeout_ms: plan.timeout.map(|t| t.as_millis() as u64),
        store: Some(store.to_path_buf()),
    };
    // Capped output goes through pipes we pump; else the command writes to our fds.
    let mut pumps = match plan.output_cap {
        Some(cap) => match OutputPipes::new(cap) {
            Ok(p) => Some(p),
            Err(e) => return Some(run.fail("io", &e.into())),
        },
        None => None,
    };
    let stdio = match &pumps {
        Some(p) => [0, p.out_w.as_raw_fd(), p.err_w.as_raw_fd()],
        None => [0, 1, 2],
    };
    if let Err(e) = client.send(&msg, &stdio) {
        return Some(run.fail(
            "daemon",
            &anyhow::Error::new(e).context("sending to the daemon"),
        ));
    }
    if let Some(p) = pumps.as_mut() {
        p.close_write_ends();
    }
    let watch = landlock_watch(subscription);
    run.landlock_audit = Some(watch.is_some());
    let mut proxy: Option<Proxy> = None;
    // The run's proxy bound but not started: its thread starts with the first connection
    // (most runs make none; its start and join were a part of what a network policy added
    // to every run).
    let mut idle_proxy: Option<IdleProxy> = None;
    let mut buf = vec![0u8; 64 * 1024];
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    // Wait for the answer; forward signals, pump capped output meanwhile.
    let reply = loop {
        let mut fds = vec![PollFd::new(client.fd(), PollFlags::POLLIN)];
        let sig_slot = signals.as_ref().map(|s| {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
        let pump_slots: Vec<(usize, usize)> = pumps
            .as_ref()
            .map(|p| {
                p.streams
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| s.fd.as_ref().map(|fd| (i, fd.as_fd())))
                    .map(|(i, fd)| {
                        fds.push(PollFd::new(fd, PollFlags::POLLIN));
                        (fds.len() - 1, i)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let idle_slot = idle_proxy
            .as_ref()
            .and_then(|p| p.listener.as_ref())
            .map(|l| {
                fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
                fds.len() - 1
            });
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Some(run.fail("daemon", &anyhow::Error::new(e).context("poll"))),
        }
        let ready = |i: usize| {
            fds.get(i)
                .and_then(|f| f.revents())
                .is_some_and(|r| !r.is_empty())
        };
        let reply_ready = ready(0);
        let sig_ready = sig_slot.is_some_and(ready);
        let connected = idle_slot.is_some_and(ready);
        let ready_pumps: Vec<usize> = pump_slots
            .iter()
            .filter(|(slot, _)| ready(*slot))
            .map(|(_, i)| *i)
            .collect();
        drop(fds);
        if connected {
            if let Some((listener, socket)) = idle_proxy.take().and_then(IdleProxy::take) {
                match start_proxy_on(listener, &socket, plan, recorder) {
                    Ok(p) => proxy = Some(p),
                    Err(e) => return Some(run.fail("egress", &e)),
                }
            }
        }
        if sig_ready {
            if let Some(Ok(Some(info))) = signals.as_ref().map(|s| s.read_signal()) {
                // A daemon that hung up ends the run; the outcome says so.
                let _ = client.send(
                    &ClientMessage::Signal {
                        signal: info.ssi_signo as i32,
                    },
                    &[],
                );
            }
        }
        if let Some(p) = pumps.as_mut() {
            for i in ready_pumps {
                let sink: &mut dyn Write = if i == 0 {
                    &mut stdout.lock()
                } else {
                    &mut stderr.lock()
                };
                p.streams[i].pump(&mut buf, sink);
            }
        }
        if !reply_ready {
            continue;
        }
        match client.recv() {
            Ok(DaemonReply::Egress { socket, sandbox_id }) => {
                // The run's proxy, in this process: its decisions are this run's, on disk
                // (with the sandbox's id) before any is acted on.
                if let Err(e) = recorder.set_sandbox(&sandbox_id) {
                    return Some(run.fail("audit", &e.into()));
                }
                // With credentials to inject, the proxy's CA must be beside the socket
                // before the cell starts: started now. Else bound now (connections wait in
                // its backlog) and started with the first.
                let started = if plan.credentials.is_some() {
                    start_proxy(&socket, plan, recorder).map(|p| proxy = Some(p))
                } else {
                    IdleProxy::bind(socket).map(|p| idle_proxy = Some(p))
                };
                if let Err(e) = started {
                    return Some(run.fail("egress", &e));
                }
                // A daemon that hung up ends the run; the outcome says so.
                let _ = client.send(&ClientMessage::EgressReady, &[]);
            }
            other => break other,
        }
    };
    // The rest of capped output: the command has exited, so what it wrote is in the pipes
    // now. Read that and no more: EOF comes only with the cell's teardown, which waits for
    // us to hang up (a background process of the run writing later is killed with the cell).
    if let Some(p) = pumps.as_mut() {
        p.drain(&mut buf, &mut stdout.lock(), &mut stderr.lock());
    }
    if let Some(p) = proxy {
        p.stop();
    }
    drop(idle_proxy);
    Some(match reply {
        Ok(DaemonReply::Exec(r)) => {
            if let Some(w) = watch {
                if r.init_pid > 0 {
                    let denials = w.finish(r.init_pid);
                    run.kernel_denials = Some(record_kernel_denials(denials, plan, recorder));
                }
            }
            finish(run, r, pumps)
        }
        Ok(DaemonReply::OtherStore { .. }) => return None,
        Ok(DaemonReply::Error { message }) => run.fail("daemon", &anyhow::anyhow!(message)),
        Ok(other) => run.fail("daemon", &anyhow::anyhow!("unexpected reply {other:?}")),
        Err(e) => run.fail("daemon", &anyhow::Error::new(e)),
    })
}

/// A run's egress proxy bound at the shell's socket and not started (no connection yet).
/// Dropped unused, it removes its socket file, as a stopped proxy does (a file left there
/// would have the shell discarded).
struct IdleProxy {
    listener: Option<std::os::unix::net::UnixListener>,
    socket: std::path::PathBuf,
    /// The socket file's identity (dev, inode): only ours is removed.
    file: Option<(u64, u64)>,
}

impl IdleProxy {
    fn bind(socket: std::path::PathBuf) -> anyhow::Result<Self> {
        let listener = agentrun_egress::bind(&socket)?;
        Ok(IdleProxy {
            listener: Some(listener),
            file: agentrun_egress::socket_file_id(&socket),
            socket,
        })
    }

    /// The listener and its path, for the proxy that takes them over (and their file).
    fn take(mut self) -> Option<(std::os::unix::net::UnixListener, std::path::PathBuf)> {
        self.file = None;
        let socket = std::mem::take(&mut self.socket);
        self.listener.take().map(|l| (l, socket))
    }
}

impl Drop for IdleProxy {
    fn drop(&mut self) {
        agentrun_egress::remove_socket_file(&self.socket, self.file);
    }
}

/// The pipes of a run whose output is capped.
struct OutputPipes {
    out_w: OwnedFd,
    err_w: OwnedFd,
    streams: [OutputStream; 2],
}

impl OutputPipes {
    fn new(cap: u64) -> std::io::Result<Self> {
        let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(OutputPipes {
            out_w,
            err_w,
            streams: [
                OutputStream::new(Some(out_r), Some(cap)),
                OutputStream::new(Some(err_r), Some(cap)),
            ],
        })
    }

    /// Once the daemon has its copies: ours would keep the pipes from ever reaching EOF.
    fn close_write_ends(&mut self) {
        for fd in [&mut self.out_w, &mut self.err_w] {
            if let Ok(null) = std::fs::File::open("/dev/null") {
                *fd = null.into();
            }
        }
    }

    /// Reads what is in the pipes now, without waiting for EOF: until a pipe has nothing
    /// to read (a zero-timeout poll), is at EOF, or its sink closed.
    fn drain(&mut self, buf: &mut [u8], out: &mut dyn Write, err: &mut dyn Write) {
        for (i, s) in self.streams.iter_mut().enumerate() {
            let sink: &mut dyn Write = if i == 0 { &mut *out } else { &mut *err };
            loop {
                let readable = match &s.fd {
                    Some(fd) => {
                        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
                    }
                    None => false,
                };
                if !readable {
                    break;
                }
                s.pump(buf, sink);
            }
        }
        // A reader that went away (a closed pipe) is not an error of the command.
        let _ = out.flush();
        let _ = err.flush();
    }
}

/// The daemon's reply on the run's record; capped output was counted here.
fn finish(mut run: RunRecord, r: ExecReply, pumps: Option<OutputPipes>) -> RunRecord {
    run.pool_hit = r.pool_hit;
    run.shell_runs = Some(r.shell_runs);
    run.zygote = r.zygote;
    run.zygote_fallback = r.zygote_fallback.clone();
    run.zygote_ahead = r.zygote_ahead;
    if !r.sandbox_id.is_empty() {
        run.sandbox_id = Some(r.sandbox_id.clone());
        run.enforcement = Some(r.enforcement.clone());
    }
    if let Some(e) = &r.error {
        return run.fail("daemon", &anyhow::anyhow!("{e}"));
    }
    // A cell that could not set itself up said so on the command's stderr.
    let mut outcome = r.outcome();
    let counted = pumps.is_some();
    if let Some(mut p) = pumps {
        outcome.count_output(&mut p.streams);
    }
    run.ran(outcome, counted)
}
