//! What both paths of a run (cold: [`crate::cold`], warm: [`crate::warm`]) share: the result
//! they return ([`RunRecord`], from which `exec` fills the run's span and audit record and
//! tells the user how the run ended), the run's egress proxy ([`start_proxy`]), the kernel's
//! Landlock denials ([`landlock_subscribe`], [`landlock_watch`], [`record_kernel_denials`])
//! and the signals taken synchronously ([`block_signals`]).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentrun_egress::{DecisionSink, FailureSink, Proxy};
use agentrun_policy::{format_bytes, Action, Decision};
use agentrun_runtime::kaudit;
use agentrun_runtime::{Enforcement, RunEnd, RunOutcome};
use agentrun_telemetry::{Ending, FrontEnd, RunFinish, RunSpan};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::plan::{Plan, EXIT_DENIED};
use crate::trace::Recorder;
use crate::{one_line, EXIT_AGENTRUN_ERROR};

/// What one run did, as the path that ran it returns it: the run's span and its audit record
/// are filled from it ([`RunRecord::fill_span`], [`RunRecord::finish`]).
#[derive(Debug, Default)]
pub(crate) struct RunRecord {
    /// The code agentrun exits with.
    pub exit_code: i32,
    /// The shell the run took, once known.
    pub sandbox_id: Option<String>,
    /// The shell came ready from the daemon's pool.
    pub pool_hit: bool,
    /// Cells the shell served before this run's (warm path).
    pub shell_runs: Option<u64>,
    /// What the shell enforces on this host (and the run's mounts: idmapped or not).
    pub enforcement: Option<Enforcement>,
    /// Why the run did not go to the daemon, when that was a choice.
    pub cold_reason: Option<&'static str>,
    /// Whether the kernel's Landlock denials were listened to.
    pub landlock_audit: Option<bool>,
    /// Landlock denials the kernel reported during the run.
    pub kernel_denials: Option<usize>,
    /// How the command ended, when it ran.
    pub outcome: Option<RunOutcome>,
    /// The output went through agentrun, so the outcome's byte counts are real.
    pub output_counted: bool,
    /// agentrun failed the run: the span's `error.type` and the one-line message.
    pub failure: Option<(&'static str, String)>,
    /// The policy refused the run before anything ran: why.
    pub denied: Option<String>,
    /// A run whose profile has a Python zygote: whether the zygote forked it, and if not why.
    pub zygote: Option<bool>,
    pub zygote_fallback: Option<String>,
    /// The zygote forked the run's process before the run came.
    pub zygote_ahead: bool,
}

impl RunRecord {
    /// A run agentrun failed (exit 125): says why on stderr, in one line.
    pub fn fail(mut self, kind: &'static str, e: &anyhow::Error) -> Self {
        let msg = one_line(&format!("{e:#}"));
        eprintln!("agentrun: {msg}");
        self.failure = Some((kind, msg));
        self.exit_code = i32::from(EXIT_AGENTRUN_ERROR);
        self
    }

    /// A run the policy refused (exit 126): says why on stderr.
    pub fn denied(msg: String) -> Self {
        eprintln!("agentrun: denied by policy: {msg}");
        RunRecord {
            exit_code: EXIT_DENIED,
            denied: Some(msg),
            ..Default::default()
        }
    }

    /// The command ran and ended so: its exit code is the run's.
    pub fn ran(mut self, outcome: RunOutcome, output_counted: bool) -> Self {
        self.exit_code = outcome.exit_code;
        self.outcome = Some(outcome);
        self.output_counted = output_counted;
        self
    }

    /// Tells the user why a run ended when agentrun ended it (timeout, OOM, output cut).
    pub fn tell(&self, plan: &Plan) {
        let Some(o) = &self.outcome else { return };
        let mut err = std::io::stderr().lock();
        match o.end() {
            RunEnd::TimedOut => {
                let t = plan.timeout.unwrap_or_default();
                // stderr gone (a closed pipe): the exit code still says it.
                let _ = writeln!(err, "agentrun: timed out after {}", human_duration(t));
            }
            RunEnd::OutOfMemory => {
                let limit = format_bytes(plan.memory_bytes);
                // stderr gone (a closed pipe): the exit code still says it.
                let _ = writeln!(err, "agentrun: out of memory (limit {limit})");
            }
            // The cell said why on the command's stderr already.
            RunEnd::SetupFailed(_) | RunEnd::Signaled(_) | RunEnd::Exited => {}
        }
        if o.output_truncated {
            // stderr gone (a closed pipe): the exit code still says it.
            let _ = writeln!(
                err,
                "agentrun: output over the profile's output cap was dropped"
            );
        }
    }

    /// How the run ended, for [`RunFinish::write`] (which puts the exit code, signal, pid,
    /// duration, timeout, policy counts and error status on the span and writes the audit
    /// record); the caller adds the profile, trace, command line and decisions.
    pub fn finish(&self) -> RunFinish {
        let end = self.outcome.as_ref().map(RunOutcome::end);
        // As the span always had it: a refusal first, then the command's own end when a limit
        // or the sandbox's setup ended it, then agentrun's failure.
        let ending = match (&self.denied, &end, &self.failure) {
            (Some(why), _, _) => Ending::Denied(why.clone()),
            (_, Some(RunEnd::TimedOut), _) => Ending::TimedOut,
            (_, Some(RunEnd::OutOfMemory), _) => Ending::OutOfMemory,
            (_, Some(RunEnd::SetupFailed(e)), _) => Ending::Failed {
                kind: "sandbox_setup".into(),
                message: e.to_string(),
            },
            (_, _, Some((kind, msg))) => Ending::Failed {
                kind: (*kind).into(),
                message: msg.clone(),
            },
            _ => Ending::Exited,
        };
        let mut f = RunFinish::new(FrontEnd::Cli, ending).exit(self.exit_code);
        if let Some(id) = &self.sandbox_id {
            f = f.sandbox(id);
        }
        if let Some(o) = &self.outcome {
            f = f.duration(o.run_duration).pid(i64::from(o.init_pid));
        }
        if let Some(RunEnd::Signaled(sig)) = end {
            f.signal = Some(sig);
        }
        f
    }

    /// Puts what only a CLI run knows on its `sandbox.exec` span: the shell it took, what
    /// that enforces, the zygote, the output counts and resource usage ([`Self::finish`]
    /// carries the rest).
    pub fn fill_span(&self, span: &mut RunSpan) {
        span.set_attribute("sandbox.pool_hit", self.pool_hit);
        if let Some(reason) = self.cold_reason {
            span.set_attribute("sandbox.cold_reason", reason);
        }
        if let Some(n) = self.shell_runs {
            span.set_attribute("sandbox.shell_runs", n as i64);
        }
        if let Some(used) = self.zygote {
            span.set_attribute("sandbox.zygote", used);
        }
        if let Some(why) = &self.zygote_fallback {
            span.set_attribute("sandbox.zygote_fallback", why.clone());
        }
        if self.zygote == Some(true) {
            span.set_attribute("sandbox.zygote_ahead", self.zygote_ahead);
        }
        if let Some(id) = &self.sandbox_id {
            span.set_attribute("sandbox.id", id.clone());
            span.set_attribute("container.id", id.clone());
        }
        if let Some(e) = &self.enforcement {
            record_enforcement(span, e);
        }
        if let Some(on) = self.landlock_audit {
            span.set_attribute("sandbox.enforce.landlock_audit", on);
        }
        if let Some(n) = self.kernel_denials {
            span.set_attribute("sandbox.kernel_denials", n);
        }
        if let Some(o) = &self.outcome {
            record_outcome(span, o, self.output_counted);
        }
    }
}

fn record_enforcement(span: &mut RunSpan, e: &Enforcement) {
    span.set_attribute("sandbox.enforce.landlock", e.landlock.clone());
    span.set_attribute("sandbox.enforce.landlock_abi", i64::from(e.landlock_abi));
    span.set_attribute("sandbox.enforce.seccomp", e.seccomp);
    span.set_attribute("sandbox.enforce.user_namespace", e.user_namespace);
    span.set_attribute("sandbox.enforce.idmapped_mounts", e.idmapped_mounts);
    span.set_attribute("sandbox.enforce.cgroup", e.cgroup.clone());
    span.set_attribute("sandbox.enforce.no_swap", e.swap_limited);
    span.set_attribute("sandbox.enforce.loopback", e.loopback);
    if !e.limits.is_empty() {
        span.set_attribute("sandbox.enforce.limits", e.limits.join("; "));
    }
}

/// What the command used and wrote. `output_counted`: the bytes went through agentrun, so
/// the counts are real.
fn record_outcome(span: &mut RunSpan, o: &RunOutcome, output_counted: bool) {
    span.set_attribute("sandbox.oom_killed", o.oom_killed);
    if output_counted {
        span.set_attribute("sandbox.stdout_bytes", o.stdout_bytes as i64);
        span.set_attribute("sandbox.stderr_bytes", o.stderr_bytes as i64);
    }
    if let Some(u) = &o.usage {
        span.set_attribute("sandbox.cpu_user_ms", (u.user_us / 1000) as i64);
        span.set_attribute("sandbox.cpu_system_ms", (u.system_us / 1000) as i64);
        span.set_attribute("sandbox.max_rss_kb", u.max_rss_kb as i64);
    }
    if let Some(peak) = o.stats.peak_memory_bytes {
        span.set_attribute("sandbox.memory_peak_bytes", peak as i64);
    }
    if o.output_truncated {
        span.set_attribute("sandbox.output_truncated", true);
    }
    if !o.stderr_preview.is_empty() {
        span.set_attribute(
            "sandbox.stderr_preview",
            String::from_utf8_lossy(&o.stderr_preview).into_owned(),
        );
    }
}

fn human_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Starts the run's egress proxy on `socket` with the run's network rules; its decisions are
/// the run's (`policy.check` spans under its `sandbox.exec`, audit records).
pub(crate) fn start_proxy(
    socket: &Path,
    plan: &Plan,
    recorder: &Recorder,
) -> anyhow::Result<Proxy> {
    let listener = agentrun_egress::bind(socket)?;
    start_proxy_on(listener, socket, plan, recorder)
}

/// [`start_proxy`] on a listener bound at `socket` already.
pub(crate) fn start_proxy_on(
    listener: std::os::unix::net::UnixListener,
    socket: &Path,
    plan: &Plan,
    recorder: &Recorder,
) -> anyhow::Result<Proxy> {
    let (r, r2) = (recorder.clone(), recorder.clone());
    let sink: DecisionSink = Arc::new(move |a, d| r.decision_by(a, d, "egress-proxy", None));
    let failures: FailureSink = Arc::new(move |a, d, f| r2.failure(a, d, f));
    let mut builder = Proxy::builder(plan.network.clone(), sink)
        .failures(failures)
        .approval_timeout(plan.approval_timeout)
        .sandbox_id(recorder.sandbox_id().unwrap_or_default());
    if let Some(a) = &plan.approver {
        builder = builder.approver(a.clone());
    }
    if let Some((vault, roots)) = &plan.credentials {
        // A CA for this run only; its certificate next to the socket, where the sandbox's
        // trust environment points.
        let id = recorder.sandbox_id().unwrap_or_default();
        let interceptor = agentrun_egress::Interceptor::new(&id, roots)?;
        if let Some(dir) = socket.parent() {
            interceptor.write_trust(dir)?;
        }
        let r3 = recorder.clone();
        builder = builder
            .intercept(Arc::new(interceptor), vault.clone())
            .injections(Arc::new(move |a, method, path, binding| {
                let d = agentrun_policy::Decision::allow(
                    binding,
                    format!("credential injected: {method} {path}"),
                );
                r3.decision_by(a, &d, "egress-proxy", None)
            }));
    }
    Ok(builder.start(listener, socket))
}

/// Subscribes to the run's kernel-level denials (Landlock audit records) when Landlock can
/// log them (ABI 7+); both paths, cold and warm, call it before the command starts. Records
/// queue on the socket until [`landlock_watch`] decides whether to read them.
pub(crate) fn landlock_subscribe(landlock_abi: u32) -> Option<kaudit::LandlockSubscription> {
    if landlock_abi >= 7 {
        kaudit::LandlockSubscription::new().ok()
    } else {
        None
    }
}

/// Keeps listening when the host's audit is on (the kernel logs Landlock denials only then).
/// The audit status query costs ~1 ms, so the warm path asks it while its run already goes.
pub(crate) fn landlock_watch(
    subscription: Option<kaudit::LandlockSubscription>,
) -> Option<kaudit::LandlockWatch> {
    match subscription {
        Some(s) if kaudit::audit_enabled().unwrap_or(false) => s.watch().ok(),
        _ => None,
    }
}

/// Records what the kernel (Landlock) denied during the run, each decided again by the
/// profile so that it carries the profile's rule id; returns how many there were.
pub(crate) fn record_kernel_denials(
    denials: Vec<kaudit::LandlockDenial>,
    plan: &Plan,
    recorder: &Recorder,
) -> usize {
    let profile = plan.request.recipe.profile().ok();
    let profile = profile.as_ref();
    let count = denials.len();
    for k in denials {
        let write = k
            .blockers
            .iter()
            .any(|b| !matches!(b.as_str(), "fs.read_file" | "fs.read_dir" | "fs.execute"));
        let action = match (k.is_path, write) {
            (true, false) => Action::Read(k.object.clone().into()),
            (true, true) => Action::Write(k.object.clone().into()),
            (false, _) => Action::Kernel {
                right: k.blockers.join(","),
                target: k.object.clone(),
            },
        };
        let by_profile = profile.map(|p| p.check(&action));
        let blockers = k.blockers.join(",");
        let decision = match by_profile {
            // A process cannot be asked: a write that needs approval is denied in the kernel.
            Some(d) if d.escalate => Decision::deny(
                d.rule_id,
                format!(
                    "kernel denied {blockers}: {} (a process in the sandbox cannot be asked)",
                    d.reason
                ),
            ),
            Some(d) if !d.allow => {
                Decision::deny(d.rule_id, format!("kernel denied {blockers}: {}", d.reason))
            }
            _ => Decision::deny("landlock", format!("kernel denied {blockers} (Landlock)")),
        };
        let time = chrono::DateTime::from_timestamp_millis((k.time * 1000.0) as i64)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        recorder.decision_by(&action, &decision, "landlock", time);
    }
    count
}

/// Takes SIGINT/SIGTERM/SIGHUP/SIGQUIT synchronously from here on, so they are forwarded to
/// the sandbox and the sandbox is always torn down.
pub(crate) fn block_signals() -> Option<SignalFd> {
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        mask.add(s);
    }
    mask.thread_block()
        .ok()
        .and_then(|_| SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).ok())
}
