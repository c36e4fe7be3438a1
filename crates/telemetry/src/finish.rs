//! The end of a run, written in one place for every front end (the CLI's `agentrun exec`, the
//! daemon's pooled shells, OpenSandbox commands, sessions and code, E2B's processes, MCP's
//! `run_*` tools):
//! a front end says what its run produced in a [`RunFinish`] and hands it the places it
//! keeps runs in ([`Sinks`]); [`RunFinish::write`] then puts, once each,
//!
//! - the run's end on its `sandbox.exec` span ([`RunFinish::fill_span`]): exit code, signal,
//!   pid, duration, whether it timed out, the policy counts, the error status;
//! - a run on the runs counter and its denials on the denials counter ([`RunCounter`]: the
//!   daemon's Prometheus metrics, or the CLI's report of its denials to the daemon);
//! - the `run` audit record ([`RunFinish::audit_record`]);
//! - the OTLP `sandbox.violation_count` data point, when asked for.
//!
//! What differs between front ends and is kept as it was is said here and nowhere else: the
//! CLI's audit verdicts are `ran` / `error` / `denied`, the others' `ok` / `error`; only
//! OpenSandbox and E2B (whose processes are OpenSandbox commands) mark a command's own
//! non-zero exit as an error on its span.

use std::time::Duration;

use agentrun_policy::exit::EXIT_SETUP_FAILED;

use crate::audit::{now_rfc3339, AuditError};
use crate::{trace_id_of, AuditLog, AuditRecord, RunSpan};

/// Which front end ran the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontEnd {
    /// `agentrun exec` (cold or warm).
    Cli,
    /// The daemon serving a pooled shell to `agentrun exec`.
    Daemon,
    /// The OpenSandbox API's commands, sessions and code.
    OpenSandbox,
    /// MCP's `run_python` / `run_shell`.
    Mcp,
    /// The E2B API's processes (envd's `process.Process/Start`: the SDK's `commands.run`).
    E2b,
}

impl FrontEnd {
    /// Whether a command's own non-zero exit is an error on its span: for the API front ends
    /// whose clients are told it as one (OpenSandbox's `error` event, the E2B SDK's
    /// `CommandExitException`).
    fn non_zero_exit_is_error(self) -> bool {
        matches!(self, FrontEnd::OpenSandbox | FrontEnd::E2b)
    }
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The command ran to its exit (any code, or a signal: [`RunFinish::signal`]).
    Exited,
    /// The run's time limit killed it.
    TimedOut,
    /// The memory limit killed it.
    OutOfMemory,
    /// agentrun could not run it (or the sandbox failed under it): the span's `error.type`
    /// and the one-line message.
    Failed { kind: String, message: String },
    /// The policy refused it before anything ran: why.
    Denied(String),
}

/// Labels of the runs counter (`agentrun_runs_total{outcome}`).
pub mod outcome {
    /// The command exited 0.
    pub const OK: &str = "ok";
    /// The command exited non-zero (or was killed by a signal it got from its client).
    pub const ERROR: &str = "error";
    /// The run's time limit killed it.
    pub const TIMEOUT: &str = "timeout";
    /// The memory limit killed it.
    pub const OOM: &str = "oom";
    /// agentrun could not run it (no sandbox, setup failed: exit 125), or refused it.
    pub const FAILED: &str = "failed";
}

/// Where runs and denials are counted: the daemon's metrics, or (from the CLI) a report of
/// the run's denials to the daemon.
pub trait RunCounter {
    /// One run ended with `outcome` (see [`outcome`]) after `duration`.
    fn run(&self, outcome: &str, duration: Duration);
    /// The run's denied decisions, by rule id.
    fn denials(&self, rules: &[String]);
}

/// The places a front end keeps its runs in; [`RunFinish::write`] writes to those given.
#[derive(Default)]
pub struct Sinks<'a> {
    /// The run's `sandbox.exec` span.
    pub span: Option<&'a mut RunSpan>,
    /// The audit log the `run` record goes to.
    pub audit: Option<&'a AuditLog>,
    /// Append the record without waiting for the disk ([`AuditLog::append_written`]: in the
    /// file at once, on disk with the log's next synced append or the kernel's writeback),
    /// for a front end whose runs follow each other quickly (an `fdatasync` per OpenSandbox
    /// command cost its next command ~2 ms p50, ~5 ms p90 here).
    pub audit_unsynced: bool,
    /// The runs and denials counters.
    pub counter: Option<&'a dyn RunCounter>,
    /// Send the OTLP `sandbox.violation_count` data point (from the span's start) when the
    /// run had denials; needs `span`.
    pub violation_metric: bool,
}

/// What a run produced, as its front end knows it.
#[derive(Debug, Clone)]
pub struct RunFinish {
    pub front_end: FrontEnd,
    pub ending: Ending,
    /// The exit code the caller sees, when the run got to one.
    pub exit_code: Option<i32>,
    /// The signal that ended the command.
    pub signal: Option<i32>,
    /// How long the command ran (the runs counter's duration; the span's `sandbox.duration_ms`).
    pub duration: Option<Duration>,
    /// The command's pid.
    pub pid: Option<i64>,
    pub profile: String,
    pub sandbox_id: String,
    pub trace_id: String,
    /// The command line (the audit record's resource), cut by [`crate::command_line`].
    pub command_line: String,
    /// How many policy decisions the run had, when they were counted.
    pub decisions: Option<u64>,
    /// The rule ids of the run's denied decisions.
    pub denied_rules: Vec<String>,
}

impl RunFinish {
    /// A run of `front_end` that ended so; everything else unknown yet.
    pub fn new(front_end: FrontEnd, ending: Ending) -> Self {
        RunFinish {
            front_end,
            ending,
            exit_code: None,
            signal: None,
            duration: None,
            pid: None,
            profile: String::new(),
            sandbox_id: String::new(),
            trace_id: String::new(),
            command_line: String::new(),
            decisions: None,
            denied_rules: Vec::new(),
        }
    }

    /// The command exited with `code` after `duration`: [`Ending::Exited`], or
    /// [`Ending::TimedOut`] when `timed_out`.
    pub fn exited(front_end: FrontEnd, code: i32, timed_out: bool, duration: Duration) -> Self {
        let ending = if timed_out {
            Ending::TimedOut
        } else {
            Ending::Exited
        };
        RunFinish::new(front_end, ending)
            .exit(code)
            .duration(duration)
    }

    /// agentrun could not run it (`kind`: the span's `error.type`).
    pub fn failed(front_end: FrontEnd, kind: &str, message: impl Into<String>) -> Self {
        let ending = Ending::Failed {
            kind: kind.to_owned(),
            message: message.into(),
        };
        RunFinish::new(front_end, ending)
    }

    pub fn exit(mut self, code: i32) -> Self {
        self.exit_code = Some(code);
        self
    }

    pub fn duration(mut self, d: Duration) -> Self {
        self.duration = Some(d);
        self
    }

    pub fn pid(mut self, pid: i64) -> Self {
        self.pid = Some(pid);
        self
    }

    pub fn profile(mut self, profile: &str) -> Self {
        profile.clone_into(&mut self.profile);
        self
    }

    pub fn sandbox(mut self, id: &str) -> Self {
        id.clone_into(&mut self.sandbox_id);
        self
    }

    /// The trace of `traceparent` (the run's span's, or its parent's: the same trace).
    pub fn trace(mut self, traceparent: &str) -> Self {
        self.trace_id = trace_id_of(traceparent);
        self
    }

    /// The command line, cut by [`crate::command_line`].
    pub fn command(mut self, line: &str) -> Self {
        self.command_line = crate::command_line(line);
        self
    }

    /// The run's denied decisions, by rule id.
    pub fn denials(mut self, rules: Vec<String>) -> Self {
        self.denied_rules = rules;
        self
    }

    /// How the runs counter counts it (`agentrun_runs_total{outcome}`).
    pub fn counter_outcome(&self) -> &'static str {
        match &self.ending {
            Ending::TimedOut => outcome::TIMEOUT,
            Ending::OutOfMemory => outcome::OOM,
            Ending::Failed { .. } | Ending::Denied(_) => outcome::FAILED,
            Ending::Exited if self.exit_code == Some(0) => outcome::OK,
            Ending::Exited => outcome::ERROR,
        }
    }

    /// The `run` audit record's verdict: the CLI's `denied` / `error` (exit 125: agentrun
    /// failed it) / `ran`; the other front ends' `ok` (exit 0) / `error`.
    pub fn audit_verdict(&self) -> &'static str {
        match (self.front_end, &self.ending) {
            (FrontEnd::Cli, Ending::Denied(_)) => "denied",
            (FrontEnd::Cli, _) if self.exit_code.is_none_or(|c| c == EXIT_SETUP_FAILED) => "error",
            (FrontEnd::Cli, _) => "ran",
            (_, Ending::Exited) if self.exit_code == Some(0) => "ok",
            _ => "error",
        }
    }

    /// The run's `run` audit record, timestamped now. A run without an exit code (agentrun
    /// failed it) is recorded with 125.
    pub fn audit_record(&self) -> AuditRecord {
        AuditRecord {
            time: now_rfc3339(),
            kind: "run".into(),
            sandbox_id: self.sandbox_id.clone(),
            trace_id: self.trace_id.clone(),
            action: "exec".into(),
            resource: self.command_line.clone(),
            decision: self.audit_verdict().into(),
            exit: Some(self.exit_code.unwrap_or(EXIT_SETUP_FAILED)),
            profile: self.profile.clone(),
            ..Default::default()
        }
    }

    /// Puts the run's end on its span.
    pub fn fill_span(&self, span: &mut RunSpan) {
        if let Some(code) = self.exit_code {
            span.set_attribute("process.exit.code", i64::from(code));
        }
        if let Some(sig) = self.signal {
            span.set_attribute("process.signal", i64::from(sig));
        }
        if let Some(pid) = self.pid {
            span.set_attribute("process.pid", pid);
        }
        if let Some(d) = self.duration {
            // The command ran: to its end, or to its limit.
            span.set_attribute("sandbox.duration_ms", d.as_millis() as i64);
            span.set_attribute("sandbox.timed_out", self.ending == Ending::TimedOut);
        }
        if let Some(n) = self.decisions {
            span.set_attribute("sandbox.policy_decisions", n);
        }
        if self.decisions.is_some() || !self.denied_rules.is_empty() {
            span.set_attribute("sandbox.violation_count", self.denied_rules.len() as u64);
        }
        match &self.ending {
            Ending::TimedOut => span.set_error("timeout", "timed out"),
            Ending::OutOfMemory => span.set_error("oom", "out of memory"),
            Ending::Failed { kind, message } => span.set_error(kind, message),
            Ending::Denied(why) => {
                span.set_attribute("sandbox.blocked", true);
                span.set_error("policy_denied", why);
            }
            Ending::Exited => match self.exit_code {
                Some(code) if code != 0 && self.front_end.non_zero_exit_is_error() => {
                    span.set_error("exit_code", &format!("exit status {code}"))
                }
                _ => {}
            },
        }
    }

    /// Writes the run to every sink given, once each. The span is filled, not ended (its
    /// front end exports it, with its children). Returns the audit log's error, if appending
    /// failed; everything else is written regardless.
    pub fn write(&self, to: Sinks<'_>) -> Result<(), AuditError> {
        let audited = match to.audit {
            Some(log) if to.audit_unsynced => log.append_written(&self.audit_record()),
            Some(log) => log.append(&self.audit_record()),
            None => Ok(()),
        };
        if let Some(counter) = to.counter {
            counter.run(self.counter_outcome(), self.duration.unwrap_or_default());
            if !self.denied_rules.is_empty() {
                counter.denials(&self.denied_rules);
            }
        }
        if let Some(span) = to.span {
            self.fill_span(span);
            if to.violation_metric && !self.denied_rules.is_empty() {
                let mut attrs = vec![("sandbox.profile", self.profile.clone())];
                if !self.sandbox_id.is_empty() {
                    attrs.push(("sandbox.id", self.sandbox_id.clone()));
                }
                crate::metrics::export_violation_count(
                    self.denied_rules.len() as u64,
                    span.start_time(),
                    &attrs,
                );
            }
        }
        audited
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::span::AttrValue;
    use crate::AuditQuery;

    #[derive(Default)]
    struct Counted {
        runs: Mutex<Vec<(String, Duration)>>,
        denials: Mutex<Vec<String>>,
    }

    impl RunCounter for Counted {
        fn run(&self, outcome: &str, duration: Duration) {
            self.runs.lock().unwrap().push((outcome.into(), duration));
        }
        fn denials(&self, rules: &[String]) {
            self.denials.lock().unwrap().extend_from_slice(rules);
        }
    }

    /// Writes `f` to a fresh span, audit log and counter; returns what each got.
    fn written(f: &RunFinish) -> (RunSpan, AuditRecord, Counted) {
        let dir = std::env::temp_dir().join(format!(
            "agentrun-finish-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let log = AuditLog::new(&dir);
        let counted = Counted::default();
        let mut span = RunSpan::start(crate::EXEC_SPAN, None);
        f.write(Sinks {
            span: Some(&mut span),
            audit: Some(&log),
            counter: Some(&counted),
            ..Default::default()
        })
        .unwrap();
        let mut records = log.query(&AuditQuery::default()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(records.len(), 1, "{records:?}");
        (span, records.remove(0), counted)
    }

    fn int(span: &RunSpan, key: &str) -> Option<i64> {
        match span.attribute(key) {
            Some(AttrValue::I64(n)) => Some(*n),
            None => None,
            other => panic!("{key}: {other:?}"),
        }
    }

    fn boolean(span: &RunSpan, key: &str) -> Option<bool> {
        match span.attribute(key) {
            Some(AttrValue::Bool(b)) => Some(*b),
            None => None,
            other => panic!("{key}: {other:?}"),
        }
    }

    fn error_type(span: &RunSpan) -> Option<String> {
        match span.attribute("error.type") {
            Some(AttrValue::String(s)) => Some(s.clone()),
            _ => None,
        }
    }

    #[test]
    fn an_ok_run_is_counted_ok_and_audited_with_its_exit_profile_and_sandbox() {
        let f = RunFinish::exited(FrontEnd::OpenSandbox, 0, false, Duration::from_millis(42))
            .pid(7)
            .profile("default")
            .sandbox("sb1")
            .trace("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .command("echo hi");
        let (span, r, c) = written(&f);
        assert_eq!(
            (r.kind.as_str(), r.action.as_str(), r.decision.as_str()),
            ("run", "exec", "ok")
        );
        assert_eq!(r.exit, Some(0));
        assert_eq!(
            (
                r.profile.as_str(),
                r.sandbox_id.as_str(),
                r.resource.as_str()
            ),
            ("default", "sb1", "echo hi")
        );
        assert_eq!(r.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(int(&span, "process.exit.code"), Some(0));
        assert_eq!(int(&span, "process.pid"), Some(7));
        assert_eq!(int(&span, "sandbox.duration_ms"), Some(42));
        assert_eq!(boolean(&span, "sandbox.timed_out"), Some(false));
        assert_eq!(error_type(&span), None);
        assert_eq!(
            *c.runs.lock().unwrap(),
            vec![("ok".to_string(), Duration::from_millis(42))]
        );
        assert!(c.denials.lock().unwrap().is_empty());
    }

    #[test]
    fn a_non_zero_exit_is_an_error_run_but_a_span_error_for_opensandbox_and_e2b_only() {
        for front_end in [FrontEnd::OpenSandbox, FrontEnd::E2b] {
            let f = RunFinish::exited(front_end, 4, false, Duration::ZERO);
            let (span, r, c) = written(&f);
            assert_eq!((r.decision.as_str(), r.exit), ("error", Some(4)));
            assert_eq!(error_type(&span).as_deref(), Some("exit_code"));
            assert_eq!(c.runs.lock().unwrap()[0].0, "error");
        }
        let mcp = RunFinish::exited(FrontEnd::Mcp, 4, false, Duration::ZERO);
        assert_eq!(error_type(&written(&mcp).0), None);
        // The CLI's own non-zero exit is no agentrun error, and its verdict is `ran`.
        let cli = RunFinish::exited(FrontEnd::Cli, 4, false, Duration::ZERO);
        let (span, r, _) = written(&cli);
        assert_eq!((r.decision.as_str(), r.exit), ("ran", Some(4)));
        assert_eq!(error_type(&span), None);
    }

    #[test]
    fn a_killed_run_times_out_or_runs_out_of_memory_or_carries_its_signal() {
        let t = RunFinish::exited(FrontEnd::Mcp, 137, true, Duration::from_secs(1));
        let (span, r, c) = written(&t);
        assert_eq!((r.decision.as_str(), r.exit), ("error", Some(137)));
        assert_eq!(boolean(&span, "sandbox.timed_out"), Some(true));
        assert_eq!(error_type(&span).as_deref(), Some("timeout"));
        assert_eq!(c.runs.lock().unwrap()[0].0, "timeout");

        let mut oom = RunFinish::new(FrontEnd::Daemon, Ending::OutOfMemory).exit(137);
        oom.signal = Some(9);
        let (span, _, c) = written(&oom);
        assert_eq!(error_type(&span).as_deref(), Some("oom"));
        assert_eq!(int(&span, "process.signal"), Some(9));
        assert_eq!(c.runs.lock().unwrap()[0].0, "oom");

        let mut killed = RunFinish::exited(FrontEnd::Daemon, 137, false, Duration::ZERO);
        killed.signal = Some(9);
        let (span, _, c) = written(&killed);
        assert_eq!(int(&span, "process.signal"), Some(9));
        assert_eq!(error_type(&span), None);
        assert_eq!(c.runs.lock().unwrap()[0].0, "error");
    }

    #[test]
    fn a_failed_run_is_recorded_with_125_and_its_error() {
        let f = RunFinish::failed(FrontEnd::Mcp, "spawn", "no such file");
        let (span, r, c) = written(&f);
        assert_eq!((r.decision.as_str(), r.exit), ("error", Some(125)));
        assert_eq!(error_type(&span).as_deref(), Some("spawn"));
        assert!(span.attribute("process.exit.code").is_none());
        // It never ran: no duration, no timed_out.
        assert!(span.attribute("sandbox.timed_out").is_none());
        assert_eq!(c.runs.lock().unwrap()[0].0, "failed");
        let cli = RunFinish::failed(FrontEnd::Cli, "invalid_input", "bad").exit(125);
        assert_eq!(written(&cli).1.decision, "error");
    }

    #[test]
    fn a_denied_run_is_blocked_and_its_denials_are_counted_once() {
        let mut f = RunFinish::new(FrontEnd::Cli, Ending::Denied("env.set X".into()))
            .exit(126)
            .denials(vec!["env.allow".into()]);
        f.decisions = Some(2);
        let (span, r, c) = written(&f);
        assert_eq!((r.decision.as_str(), r.exit), ("denied", Some(126)));
        assert_eq!(boolean(&span, "sandbox.blocked"), Some(true));
        assert_eq!(error_type(&span).as_deref(), Some("policy_denied"));
        assert_eq!(int(&span, "sandbox.policy_decisions"), Some(2));
        assert_eq!(int(&span, "sandbox.violation_count"), Some(1));
        assert_eq!(*c.denials.lock().unwrap(), vec!["env.allow".to_string()]);
        assert_eq!(c.runs.lock().unwrap()[0].0, "failed");
    }

    #[test]
    fn only_the_sinks_given_are_written() {
        let counted = Counted::default();
        let f = RunFinish::exited(FrontEnd::Daemon, 0, false, Duration::ZERO);
        f.write(Sinks {
            counter: Some(&counted),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(counted.runs.lock().unwrap().len(), 1);
    }
}
