//! The approval hook: how a front end asks a person about an escalate decision.
//!
//! A profile marks rules `escalate` (`[network] escalate`, `[filesystem] escalate_write`);
//! [`crate::Profile::check`] answers them with [`Decision::escalate`], which is a deny until
//! someone approves. Every front end that can ask a person implements [`Approver`]
//! (`agentrun exec` on a terminal, the MCP server through elicitation); the caller bounds the
//! wait ([`DEFAULT_APPROVAL_TIMEOUT`], then deny "no answer within 60 s") and settles the
//! decision with the [`Answer`] ([`Decision::settle`]). Without an approver the decision is a
//! deny whose reason starts "needs approval".
//!
//! One clock: the caller's bound is the only timer that decides "no answer". An approver has
//! no timeout of its own that could answer: its future stays pending until a person answers
//! or the caller drops it at the bound (the approver then withdraws its question). So the
//! same event is always worded the same way, by [`Decision::settle`] with
//! [`Answer::TimedOut`], whichever front end asked.
//!
//! [`Approvals`] remembers what was approved for one sandbox (an approval holds for the
//! sandbox's life: a model is not asked 50 times for one host) and makes concurrent asks
//! about the same thing share one question.
//!
//! Std only: the future an [`Approver`] returns may be polled by a plain thread
//! ([`ask_blocking`], the egress proxy's threads) outside any async runtime.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crate::decision::{Action, Decision, EscalationOutcome, NEEDS_APPROVAL};

/// How long a person is given to answer, unless the front end says otherwise.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(60);

/// What a person is asked about: one escalate decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EscalationRequest {
    /// The sandbox that wants it (may be empty when it does not exist yet).
    pub sandbox_id: String,
    /// [`Action::name`]: `net.connect`, `fs.write`, ...
    pub action: String,
    /// [`Action::resource`]: `api.github.com:443`, `/etc/app/config.toml`, ...
    pub resource: String,
    /// The escalate rule (`network.escalate[0]`, `filesystem.escalate_write[1]`).
    pub rule_id: String,
    /// The decision's reason ("needs approval: connecting to ... is allowed only when ...").
    pub reason: String,
}

impl EscalationRequest {
    /// The request for escalate decision `d` on `action` in sandbox `sandbox_id`.
    pub fn new(sandbox_id: &str, action: &Action, d: &Decision) -> Self {
        EscalationRequest {
            sandbox_id: sandbox_id.to_owned(),
            action: action.name().to_owned(),
            resource: action.resource(),
            rule_id: d.rule_id.clone(),
            reason: d.reason.clone(),
        }
    }

    /// One line for a person: what, on what, by which rule, in which sandbox (no prompt
    /// suffix: the front end adds its own, e.g. ` [y/N] `).
    pub fn question(&self) -> String {
        let sandbox = if self.sandbox_id.is_empty() {
            String::new()
        } else {
            format!(" in sandbox {}", self.sandbox_id)
        };
        format!(
            "approve {} {}{sandbox}? (rule {} needs a person's approval)",
            self.action, self.resource, self.rule_id
        )
    }
}

/// A person's answer, or why nobody can give one. Never "no answer in time": that is the
/// caller's to decide (the future stays pending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Approved,
    /// Not approved; `why` in a few words ("the user answered no", "the client declined").
    Denied {
        why: String,
    },
    /// Nobody can be asked through this approver now; `why` ("the client cannot be asked: it
    /// does not support MCP elicitation").
    Unavailable {
        why: String,
    },
}

/// The future an [`Approver`] returns.
pub type ApprovalFuture = Pin<Box<dyn Future<Output = Approval> + Send>>;

/// A front end that can ask a person. `ask` returns at once with a future; the caller bounds
/// the wait and drops the future when the bound passes (an implementation should then stop
/// asking, e.g. withdraw its prompt). The future must not resolve because time ran out (no
/// timer of the approver's may answer): the caller's bound is the one that decides, and
/// words it. The future may be polled by a plain thread outside any
/// async runtime ([`ask_blocking`]): an implementation that needs its runtime (tokio, for an
/// MCP peer's request) spawns the work on its runtime's handle and returns a future that
/// only waits on a channel (e.g. a oneshot receiver).
pub trait Approver: Send + Sync {
    fn ask(&self, request: EscalationRequest) -> ApprovalFuture;
}

/// How asking ended: what [`Decision::settle`] turns into an allow or a deny.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A person approved (now or earlier for this sandbox).
    Approved,
    /// A person (or their client) said no: why.
    Denied(String),
    /// Nobody answered within the bound.
    TimedOut(Duration),
    /// Nobody can be asked here: why ("no terminal to ask on", "the client cannot be asked").
    NoApprover(String),
}

impl Answer {
    /// The answer for what an approver's future gave within `bound` (`None`: it did not).
    pub fn from_approval(approval: Option<Approval>, bound: Duration) -> Answer {
        match approval {
            Some(Approval::Approved) => Answer::Approved,
            Some(Approval::Denied { why }) => Answer::Denied(why),
            Some(Approval::Unavailable { why }) => Answer::NoApprover(why),
            None => Answer::TimedOut(bound),
        }
    }

    /// The outcome recorded for it.
    pub fn outcome(&self) -> EscalationOutcome {
        match self {
            Answer::Approved => EscalationOutcome::Approved,
            Answer::Denied(_) => EscalationOutcome::Denied,
            Answer::TimedOut(_) => EscalationOutcome::Timeout,
            Answer::NoApprover(_) => EscalationOutcome::NoApprover,
        }
    }
}

/// How every front end says that nobody answered within `bound`: `no answer within 60 s`
/// (the decision's reason, through [`Decision::settle`]; a terminal's own line).
pub fn no_answer_within(bound: Duration) -> String {
    format!("no answer within {}", human(bound))
}

/// `60 s`, `1.5 s`, `500 ms`.
fn human(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else if d >= Duration::from_secs(1) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

impl Decision {
    /// This escalate decision once asking ended with `answer`: allowed only when approved;
    /// the verdict stays `escalate`, [`Decision::escalation`] says how it ended and the reason
    /// says it in words ("needs approval: no answer within 60 s: ..."). A decision that is
    /// not an escalate one is returned unchanged.
    pub fn settle(mut self, answer: &Answer) -> Decision {
        if !self.escalate {
            return self;
        }
        let prefix = format!("{NEEDS_APPROVAL}: ");
        let subject = self
            .reason
            .strip_prefix(&prefix)
            .unwrap_or(&self.reason)
            .to_owned();
        self.allow = *answer == Answer::Approved;
        self.escalation = Some(answer.outcome());
        self.reason = match answer {
            Answer::Approved => format!("approved by a person: {subject}"),
            Answer::Denied(why) => format!("not approved ({why}): {subject}"),
            Answer::TimedOut(d) => {
                format!("{NEEDS_APPROVAL}: {}: {subject}", no_answer_within(*d))
            }
            Answer::NoApprover(why) => format!("{NEEDS_APPROVAL} ({why}): {subject}"),
        };
        self
    }
}

/// Wakes the thread that polls a future.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `fut` on this thread until it is ready or `timeout` passed (then drops it).
pub fn block_on_timeout<F: Future>(fut: F, timeout: Duration) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + timeout;
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::park_timeout(deadline - now);
    }
}

/// Asks `approver` (none: [`Answer::NoApprover`] "no one can be asked here") and waits at
/// most `timeout`, on this thread.
pub fn ask_blocking(
    approver: Option<&dyn Approver>,
    request: EscalationRequest,
    timeout: Duration,
) -> Answer {
    match approver {
        None => Answer::NoApprover("no one can be asked here".into()),
        Some(a) => Answer::from_approval(block_on_timeout(a.ask(request), timeout), timeout),
    }
}

/// One question being asked: the askers after the first wait for its answer.
#[derive(Default)]
struct Pending {
    answer: Mutex<Option<Answer>>,
    done: Condvar,
}

enum Entry {
    Approved,
    Asking(Arc<Pending>),
}

/// What was approved for one sandbox, for its life (keyed by [`Approvals::key`]: the action
/// and the resource, e.g. `net.connect api.github.com:443`). Denials and timeouts are not
/// remembered: the next attempt asks again. Share one per sandbox (`Arc`).
#[derive(Default)]
pub struct Approvals {
    entries: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals").finish_non_exhaustive()
    }
}

impl Approvals {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key an action's approval is remembered under.
    pub fn key(action: &Action) -> String {
        format!("{} {}", action.name(), action.resource())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `key` was approved.
    pub fn is_approved(&self, key: &str) -> bool {
        matches!(self.lock().get(key), Some(Entry::Approved))
    }

    /// Remembers that `key` was approved (for a caller that asked by itself, e.g. async).
    pub fn remember(&self, key: &str) {
        self.lock().insert(key.to_owned(), Entry::Approved);
    }

    /// The answer for `key`: [`Answer::Approved`] if it was approved before; the answer of a
    /// question about it being asked now; else `ask()`'s (remembered if approved). The flag
    /// is true when no question was asked for this call.
    pub fn decide(&self, key: &str, ask: impl FnOnce() -> Answer) -> (Answer, bool) {
        let pending = {
            let mut g = self.lock();
            match g.get(key) {
                Some(Entry::Approved) => return (Answer::Approved, true),
                Some(Entry::Asking(p)) => Some(p.clone()),
                None => {
                    g.insert(key.to_owned(), Entry::Asking(Arc::default()));
                    None
                }
            }
        };
        if let Some(p) = pending {
            let mut a = p.answer.lock().unwrap_or_else(|e| e.into_inner());
            while a.is_none() {
                a = p.done.wait(a).unwrap_or_else(|e| e.into_inner());
            }
            return (a.clone().unwrap_or(Answer::TimedOut(Duration::ZERO)), true);
        }
        // Whatever happens to `ask` (a panic included), the waiters get an answer.
        struct Finish<'a> {
            approvals: &'a Approvals,
            key: &'a str,
            answer: Answer,
        }
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                let mut g = self.approvals.lock();
                let entry = if self.answer == Answer::Approved {
                    g.insert(self.key.to_owned(), Entry::Approved)
                } else {
                    g.remove(self.key)
                };
                drop(g);
                if let Some(Entry::Asking(p)) = entry {
                    *p.answer.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.answer.clone());
                    p.done.notify_all();
                }
            }
        }
        let mut finish = Finish {
            approvals: self,
            key,
            answer: Answer::Denied("the question failed".into()),
        };
        finish.answer = ask();
        let answer = finish.answer.clone();
        drop(finish);
        (answer, false)
    }

    /// Settles escalate decision `d` on `action`: approved earlier, or asked now through
    /// `approver` (bounded by `timeout`, on this thread; one question at a time per action).
    /// Any other decision is returned unchanged.
    pub fn settle_blocking(
        &self,
        approver: Option<&dyn Approver>,
        sandbox_id: &str,
        action: &Action,
        d: Decision,
        timeout: Duration,
    ) -> Decision {
        if !d.needs_approval() {
            return d;
        }
        let key = Self::key(action);
        let (answer, shared) = self.decide(&key, || {
            ask_blocking(
                approver,
                EscalationRequest::new(sandbox_id, action, &d),
                timeout,
            )
        });
        let mut settled = d.settle(&answer);
        if shared && answer == Answer::Approved {
            settled.reason = settled.reason.replacen(
                "approved by a person",
                "approved by a person earlier in this sandbox's life",
                1,
            );
        }
        settled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn connect(host: &str) -> Action {
        Action::Connect {
            host: host.into(),
            port: 443,
        }
    }

    /// Answers with a fixed approval after `delay` (on a thread of its own), counting asks.
    struct Fixed {
        answer: Option<Approval>,
        delay: Duration,
        asked: AtomicUsize,
    }

    impl Approver for Fixed {
        fn ask(&self, _q: EscalationRequest) -> ApprovalFuture {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let (tx, rx) = std::sync::mpsc::channel();
            let (answer, delay) = (self.answer.clone(), self.delay);
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                if let Some(a) = answer {
                    let _ = tx.send(a);
                }
            });
            Box::pin(ChannelFuture(Arc::new(Mutex::new(rx))))
        }
    }

    /// A future over an mpsc receiver, polled by busy re-waking (test only).
    struct ChannelFuture(Arc<Mutex<std::sync::mpsc::Receiver<Approval>>>);

    impl Future for ChannelFuture {
        type Output = Approval;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Approval> {
            match self.0.lock().unwrap().try_recv() {
                Ok(a) => Poll::Ready(a),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => Poll::Pending,
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    let w = cx.waker().clone();
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(5));
                        w.wake();
                    });
                    Poll::Pending
                }
            }
        }
    }

    fn fixed(answer: Option<Approval>, delay_ms: u64) -> Fixed {
        Fixed {
            answer,
            delay: Duration::from_millis(delay_ms),
            asked: AtomicUsize::new(0),
        }
    }

    #[test]
    fn settling_table() {
        let d = Decision::escalate("network.escalate[0]", "connecting to api.github.com:443");
        assert!(!d.allow && d.escalate && d.needs_approval());
        assert_eq!(d.verdict(), "escalate");
        assert_eq!(
            d.reason,
            "needs approval: connecting to api.github.com:443 is allowed only when a person approves it"
        );
        let cases: &[(Answer, bool, EscalationOutcome, &str)] = &[
            (
                Answer::Approved,
                true,
                EscalationOutcome::Approved,
                "approved by a person: connecting to api.github.com:443 is allowed only when",
            ),
            (
                Answer::Denied("the user answered no".into()),
                false,
                EscalationOutcome::Denied,
                "not approved (the user answered no): connecting to api.github.com:443",
            ),
            (
                Answer::TimedOut(Duration::from_secs(60)),
                false,
                EscalationOutcome::Timeout,
                "needs approval: no answer within 60 s: connecting to",
            ),
            (
                Answer::NoApprover("the client cannot be asked".into()),
                false,
                EscalationOutcome::NoApprover,
                "needs approval (the client cannot be asked): connecting to",
            ),
        ];
        for (answer, allow, outcome, reason) in cases {
            let s = d.clone().settle(answer);
            assert_eq!(s.allow, *allow, "{answer:?}");
            assert_eq!(s.escalation, Some(*outcome), "{answer:?}");
            assert_eq!(s.verdict(), "escalate", "{answer:?}");
            assert!(!s.needs_approval());
            assert!(s.reason.starts_with(reason), "{answer:?}: {}", s.reason);
            assert_eq!(s.rule_id, "network.escalate[0]");
        }
        // Other decisions are left alone.
        let allow = Decision::allow("r", "ok");
        assert_eq!(allow.clone().settle(&Answer::Denied("x".into())), allow);
        assert_eq!(EscalationOutcome::NoApprover.as_str(), "no_approver");
        assert_eq!(human(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(human(Duration::from_millis(200)), "200 ms");
    }

    #[test]
    fn asking_is_bounded_and_no_approver_denies() {
        let q = EscalationRequest::new(
            "ar-1",
            &connect("a.com"),
            &Decision::escalate("network.escalate[0]", "connecting to a.com:443"),
        );
        assert_eq!(
            q.question(),
            "approve net.connect a.com:443 in sandbox ar-1? (rule network.escalate[0] needs a person's approval)"
        );
        assert_eq!(
            ask_blocking(None, q.clone(), Duration::from_secs(1)),
            Answer::NoApprover("no one can be asked here".into())
        );
        let yes = fixed(Some(Approval::Approved), 10);
        assert_eq!(
            ask_blocking(Some(&yes), q.clone(), Duration::from_secs(5)),
            Answer::Approved
        );
        let no = fixed(
            Some(Approval::Denied {
                why: "declined".into(),
            }),
            10,
        );
        assert_eq!(
            ask_blocking(Some(&no), q.clone(), Duration::from_secs(5)),
            Answer::Denied("declined".into())
        );
        let silent = fixed(None, 0);
        let t = Instant::now();
        assert_eq!(
            ask_blocking(Some(&silent), q.clone(), Duration::from_millis(200)),
            Answer::TimedOut(Duration::from_millis(200))
        );
        assert!(t.elapsed() >= Duration::from_millis(200));
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn approvals_are_remembered_and_concurrent_asks_share_one_question() {
        let approvals = Arc::new(Approvals::new());
        let yes = Arc::new(fixed(Some(Approval::Approved), 150));
        let action = connect("api.github.com");
        let d = Decision::escalate("network.escalate[0]", "connecting to api.github.com:443");
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (approvals, yes, action, d) =
                    (approvals.clone(), yes.clone(), action.clone(), d.clone());
                std::thread::spawn(move || {
                    approvals.settle_blocking(
                        Some(yes.as_ref()),
                        "ar-1",
                        &action,
                        d,
                        Duration::from_secs(5),
                    )
                })
            })
            .collect();
        for t in threads {
            let s = t.join().unwrap();
            assert!(s.allow, "{s:?}");
            assert_eq!(s.escalation, Some(EscalationOutcome::Approved));
        }
        assert_eq!(yes.asked.load(Ordering::SeqCst), 1, "one question for four");
        assert!(approvals.is_approved("net.connect api.github.com:443"));
        let later = approvals.settle_blocking(None, "ar-1", &action, d.clone(), Duration::ZERO);
        assert!(later.allow, "remembered: {later:?}");
        assert!(later.reason.contains("earlier"), "{later:?}");

        // A denial is not remembered: the next attempt asks again.
        let no = fixed(
            Some(Approval::Denied {
                why: "the user answered no".into(),
            }),
            0,
        );
        let other = connect("gist.github.com");
        for _ in 0..2 {
            let s = approvals.settle_blocking(
                Some(&no),
                "ar-1",
                &other,
                Decision::escalate("network.escalate[0]", "connecting to gist.github.com:443"),
                Duration::from_secs(5),
            );
            assert!(!s.allow);
            assert_eq!(s.escalation, Some(EscalationOutcome::Denied));
        }
        assert_eq!(no.asked.load(Ordering::SeqCst), 2);
        // Not an escalate decision: untouched, nobody asked.
        let plain = Decision::deny("network.default", "no");
        assert_eq!(
            approvals.settle_blocking(Some(&no), "", &other, plain.clone(), Duration::ZERO),
            plain
        );
        assert_eq!(no.asked.load(Ordering::SeqCst), 2);
    }
}
