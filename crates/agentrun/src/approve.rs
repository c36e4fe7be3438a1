//! `agentrun exec`'s approver: an escalate decision is asked about on the terminal.
//!
//! The question is one line on `/dev/tty` (the controlling terminal, whatever stdin and
//! stdout are), naming the action, the resource and the rule, ending `[y/N]`; only `y` or
//! `yes` approves, anything else, or no answer within the bound, denies. What was typed before
//! the question appeared is discarded first (`tcflush`), so type-ahead never answers it; the
//! sandbox cannot type into the terminal (TIOCSTI and TIOCLINUX are refused by its seccomp
//! filter). One question at a time: concurrent ones wait their turn, each within the same
//! bound, counted from when the proxy asked (a question whose time ran out while it waited is
//! never shown; one the proxy stopped waiting for is withdrawn). Without a controlling terminal (or with `--no-prompt`) there is no
//! approver, and escalate decisions are denied "needs approval".
//!
//! Both paths of `agentrun exec` run the egress proxy in this process (the warm path serves
//! the proxy of the daemon's shell here too: see [`crate::warm`]), so both ask here: no round
//! trip to the daemon.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use agentrun_policy::{Approval, ApprovalFuture, Approver, EscalationRequest};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// The controlling terminal.
const TTY: &str = "/dev/tty";

/// Asks on the controlling terminal.
pub(crate) struct TerminalApprover {
    /// How long the person has to answer once the question is on the screen.
    timeout: Duration,
    /// One question on the terminal at a time.
    turn: Arc<Mutex<()>>,
}

impl TerminalApprover {
    /// An approver on the controlling terminal, if this process has one.
    pub(crate) fn open(timeout: Duration) -> Option<Self> {
        open_tty().ok()?;
        Some(TerminalApprover {
            timeout,
            turn: Arc::default(),
        })
    }
}

fn open_tty() -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NOCTTY | nix::libc::O_CLOEXEC)
        .open(TTY)
}

impl Approver for TerminalApprover {
    fn ask(&self, request: EscalationRequest) -> ApprovalFuture {
        let slot = Arc::new(Mutex::new(Slot::default()));
        let (s, turn) = (slot.clone(), self.turn.clone());
        // The caller's wait started now: the question's time is counted from here too.
        let deadline = Instant::now() + self.timeout;
        let spawned = std::thread::Builder::new()
            .name("approve-tty".into())
            .spawn(move || {
                let _turn = turn.lock().unwrap_or_else(|p| p.into_inner());
                // Nobody waits for the answer any more (the future was dropped).
                let abandoned = || Arc::strong_count(&s) == 1;
                if let Some(answer) = ask_on_tty(&request, deadline, &abandoned) {
                    let mut g = s.lock().unwrap_or_else(|p| p.into_inner());
                    g.answer = Some(answer);
                    if let Some(w) = g.waker.take() {
                        w.wake();
                    }
                }
            });
        if spawned.is_err() {
            return Box::pin(std::future::ready(Approval::Unavailable {
                why: "the terminal could not be asked".into(),
            }));
        }
        Box::pin(Answered(slot))
    }
}

#[derive(Default)]
struct Slot {
    answer: Option<Approval>,
    waker: Option<Waker>,
}

/// Ready once the terminal's thread has an answer.
struct Answered(Arc<Mutex<Slot>>);

impl Future for Answered {
    type Output = Approval;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Approval> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match g.answer.take() {
            Some(a) => Poll::Ready(a),
            None => {
                g.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// How often an open question checks whether it is still wanted.
const WANTED_CHECK: Duration = Duration::from_millis(250);

/// Asks `request` on the terminal until `deadline`; `None` when nobody answered in time (said
/// so on the terminal), the question was `abandoned` (withdrawn) or the terminal went away.
fn ask_on_tty(
    request: &EscalationRequest,
    deadline: Instant,
    abandoned: &dyn Fn() -> bool,
) -> Option<Approval> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() || abandoned() {
        return None;
    }
    let mut tty = open_tty().ok()?;
    // Type-ahead must not answer a question it was not typed for.
    // Best effort: without it, type-ahead may answer the question.
    let _ = nix::sys::termios::tcflush(tty.as_fd(), nix::sys::termios::FlushArg::TCIFLUSH);
    let secs = left.as_secs_f64().round();
    write!(
        tty,
        "\r\nagentrun: {} [y/N, {secs:.0} s] ",
        request.question()
    )
    .ok()?;
    // A tty that cannot be written to cannot be asked: reading the answer fails too.
    let _ = tty.flush();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            // The caller's bound (it started first, so it ends just after) decides; this
            // only says so on the screen, in its words.
            // The question is over either way; a tty that cannot be written to has nobody to tell.
            let _ = write!(
                tty,
                "\r\nagentrun: {}: denied\r\n",
                agentrun_policy::no_answer_within(Duration::from_secs_f64(secs))
            );
            return None;
        }
        if abandoned() {
            // The question is over either way; a tty that cannot be written to has nobody to tell.
            let _ = write!(tty, "\r\nagentrun: question withdrawn: denied\r\n");
            return None;
        }
        let ms = u16::try_from(left.min(WANTED_CHECK).as_millis().max(1)).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(tty.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::Error::EINTR) => continue,
            Ok(_) => {}
            Err(_) => return None,
        }
        match tty.read(&mut byte) {
            Ok(0) | Err(_) => return None,
            Ok(_) if byte[0] == b'\n' || byte[0] == b'\r' => break,
            Ok(_) => line.push(byte[0]),
        }
    }
    let answer = String::from_utf8_lossy(&line).trim().to_ascii_lowercase();
    let approved = answer == "y" || answer == "yes";
    // The question is over either way; a tty that cannot be written to has nobody to tell.
    let _ = write!(
        tty,
        "agentrun: {}\r\n",
        if approved { "approved" } else { "denied" }
    );
    Some(if approved {
        Approval::Approved
    } else {
        Approval::Denied {
            why: "the user answered no".into(),
        }
    })
}
