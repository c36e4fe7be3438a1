//! A long-lived cell's PID 1: serves the persistent dialect (many processes over time, see
//! [`crate::control`]'s `LiveRequest`/`LiveEvent`), starting each process itself or through
//! the shell's Python zygote, with the PID-1 building blocks of [`crate::inside::reaper`].
//!
//! Confined like every cell's PID 1 (see [`crate::inside::reaper`]): what it starts inherits
//! the confinement, and its exit tears down the pid namespace.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};

use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;

use crate::control::{self, InitResult, LiveEvent, LiveRequest};
use crate::exit::EXIT_SETUP_FAILED;
use crate::inside::reaper::{
    decode_status, exit_now, reap_one, wait_readable_any, BadCommand, Command,
};
use crate::inside::zygote::{Forked, LiveZygote};

/// [`wait_either`](crate::inside::reaper::wait_either) for a long-lived PID 1, also over the
/// report sockets of the processes the
/// zygote forked: (control readable, signals readable, ids of forked processes that ended).
fn wait_live(
    control: std::os::fd::BorrowedFd<'_>,
    signals: &nix::sys::signalfd::SignalFd,
    forked: &HashMap<u64, Forked>,
) -> nix::Result<(bool, bool, Vec<u64>)> {
    let ids: Vec<u64> = forked.keys().copied().collect();
    let mut fds = vec![control, signals.as_fd()];
    fds.extend(ids.iter().map(|id| forked[id].report()));
    let ready = wait_readable_any(&fds)?;
    let ended = ids
        .iter()
        .zip(&ready[2..])
        .filter(|(_, r)| **r)
        .map(|(id, _)| *id)
        .collect();
    Ok((ready[0], ready[1], ended))
}

/// The long-lived PID 1: serves [`LiveRequest`]s until the host closes the channel, reports
/// every process's start and exit, reaps orphans. Never returns.
pub(crate) fn serve_live(control: OwnedFd, zygote: Option<LiveZygote>) -> ! {
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let all = SigSet::all();
    if sigprocmask(SigmaskHow::SIG_BLOCK, Some(&all), None).is_err() {
        exit_now(EXIT_SETUP_FAILED);
    }
    let Ok(signals) = SignalFd::with_flags(&all, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    else {
        exit_now(EXIT_SETUP_FAILED);
    };
    // pid -> id, and id -> pid (= its process group), of the processes still running.
    let mut by_pid: HashMap<i32, u64> = HashMap::new();
    let mut by_id: HashMap<u64, i32> = HashMap::new();
    // Processes the zygote forked (not our children: their end comes on their report socket).
    let mut forked: HashMap<u64, Forked> = HashMap::new();
    let send = |ev: &LiveEvent| {
        // A failed send means the host is gone; the next recv sees EOF and we exit.
        let _ = control::send_json(control.as_fd(), ev, &[]);
    };
    let handle = |req: LiveRequest,
                  fds: Vec<OwnedFd>,
                  by_pid: &mut HashMap<i32, u64>,
                  by_id: &mut HashMap<u64, i32>,
                  forked: &mut HashMap<u64, Forked>| match req {
        LiveRequest::Spawn(sp) => {
            let id = sp.id;
            let stdio: Result<[OwnedFd; 3], _> = fds.try_into();
            // Through the zygote if it takes it; else (and on any failure of it) exec'd.
            let stdio = match (stdio, &zygote) {
                (Ok(stdio), Some(z)) => match z.spawn(&sp, &stdio) {
                    Ok(child) => {
                        by_id.insert(id, child.pid());
                        send(&LiveEvent::Started {
                            id,
                            pid: child.pid(),
                        });
                        forked.insert(id, child);
                        return;
                    }
                    Err(_) => Ok(stdio),
                },
                (stdio, _) => stdio,
            };
            let cmd = match stdio {
                Ok(stdio) => Command::new(sp.argv, &sp.env, sp.cwd, Some(stdio)),
                Err(_) => Err(BadCommand("a process needs exactly 3 fds (stdio)".into())),
            };
            match cmd {
                Ok(mut cmd) => {
                    cmd.new_session = sp.new_session;
                    cmd.user = sp.user;
                    match cmd.spawn() {
                        Ok(pid) => {
                            by_pid.insert(pid.as_raw(), id);
                            by_id.insert(id, pid.as_raw());
                            send(&LiveEvent::Started {
                                id,
                                pid: pid.as_raw(),
                            });
                        }
                        Err((exit_code, message)) => send(&LiveEvent::Failed {
                            id,
                            exit_code,
                            message,
                        }),
                    }
                }
                Err(BadCommand(message)) => send(&LiveEvent::Failed {
                    id,
                    exit_code: EXIT_SETUP_FAILED,
                    message,
                }),
            }
        }
        LiveRequest::Signal { id, signal, group } => {
            if let Some(child) = forked.get(&id) {
                child.signal(signal, group);
            } else if let (Some(&pid), Ok(sig)) = (by_id.get(&id), Signal::try_from(signal)) {
                let target = if group { -pid } else { pid };
                // Dropped: ESRCH only, the process already ended; its end is reported when reaped.
                let _ = kill(Pid::from_raw(target), sig);
            }
        }
        LiveRequest::SignalAll { signal } => {
            // From PID 1, kill(-1) reaches every process of the pid namespace but PID 1
            // itself; a process forking meanwhile cannot leave a child behind (the kernel
            // refuses forks with a fatal signal pending).
            if let Ok(sig) = Signal::try_from(signal) {
                // Dropped: ESRCH when nothing is left to signal.
                let _ = kill(Pid::from_raw(-1), sig);
            }
            // The zygote's children are out of our reach (their own Landlock domains): it
            // signals them for us.
            for child in forked.values() {
                child.signal(signal, true);
            }
        }
    };
    loop {
        let Ok((control_ready, signal_ready, ended)) =
            wait_live(control.as_fd(), &signals, &forked)
        else {
            exit_now(EXIT_SETUP_FAILED)
        };
        for id in ended {
            if let Some(child) = forked.remove(&id) {
                by_id.remove(&id);
                send(&LiveEvent::Exited {
                    id,
                    result: child.end(),
                });
            }
        }
        if signal_ready {
            // Only SIGCHLD matters; other signals sent to PID 1 are dropped (the host talks
            // to processes through the channel).
            while let Ok(Some(_)) = signals.read_signal() {}
            while let Some((pid, status, usage)) = reap_one() {
                let Some(id) = by_pid.remove(&pid) else {
                    continue; // an orphan
                };
                by_id.remove(&id);
                let (exit_code, signal) = decode_status(status);
                send(&LiveEvent::Exited {
                    id,
                    result: InitResult {
                        exit_code,
                        signal,
                        usage: (&usage).into(),
                        ..Default::default()
                    },
                });
            }
        }
        if control_ready {
            match control::recv(control.as_fd()) {
                Ok(Some((bytes, fds))) => match serde_json::from_slice::<LiveRequest>(&bytes) {
                    Ok(req) => handle(req, fds, &mut by_pid, &mut by_id, &mut forked),
                    Err(_) => continue,
                },
                // The host closed the channel: the sandbox is over. Exiting PID 1 kills every
                // process in the namespace.
                Ok(None) | Err(_) => exit_now(0),
            }
        }
    }
}
