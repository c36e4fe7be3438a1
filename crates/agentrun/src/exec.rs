//! `agentrun exec -- CMD`, read forward: the run's `sandbox.exec` span and its recorder of
//! decisions, the [`Plan`] (everything checked and decided before any sandbox exists), one of
//! the two paths that execute it ([`crate::warm`]: the daemon's pooled shells, when it
//! answers; [`crate::cold`]: a shell built in this process), which returns a
//! [`RunRecord`]; then the user told how the run ended, the audit record of the run written
//! and the span filled from the record and exported.

use std::process::ExitCode;

use agentrun_pool::client::DaemonClient;
use agentrun_telemetry::{AuditLog, ExecSpan, RunCounter, Sinks};

use crate::plan::{default_command, ExecArgs, Plan, PlanError};
use crate::run::RunRecord;
use crate::trace::Recorder;
use crate::{one_line, Paths, EXIT_AGENTRUN_ERROR};

pub fn run(mut args: ExecArgs, paths: &Paths) -> ExitCode {
    if args.command.is_empty() {
        match default_command(&args.image, paths) {
            Ok(cmd) => args.command = cmd,
            Err(e) => {
                eprintln!("agentrun: {}", one_line(&format!("{e:#}")));
                return ExitCode::from(EXIT_AGENTRUN_ERROR);
            }
        }
    }
    let parent = std::env::var("TRACEPARENT").ok();
    let mut span = ExecSpan::new(parent.as_deref()).argv(&args.command).start();
    span.set_attribute("container.image.name", args.image.clone());
    span.set_attribute("sandbox.profile", args.profile.clone());
    let recorder = Recorder::new(&span, AuditLog::new(paths.audit_dir()), &args.profile);
    let command_line = args.command.join(" ");
    let keep_bundle = args.keep_bundle;
    let landlock_only = args.isolation == crate::plan::Isolation::LandlockOnly;
    let no_daemon = landlock_only
        || args.no_daemon
        || std::env::var("AGENTRUN_NO_DAEMON").is_ok_and(|v| v == "1");
    let record = match Plan::new(args, &span.traceparent(), &recorder, &paths.root) {
        Ok(plan) if landlock_only => {
            let record = crate::landlock_only::execute(&plan, &recorder);
            record.tell(&plan);
            record
        }
        Ok(plan) => {
            let record = execute(&plan, paths, keep_bundle, no_daemon, &recorder);
            record.tell(&plan);
            record
        }
        Err(PlanError::Invalid(e)) => RunRecord::default().fail("invalid_input", &e),
        Err(PlanError::Denied(msg)) => RunRecord::denied(msg),
    };
    if let Some(id) = &record.sandbox_id {
        // Held decisions not written now are written by the flush before the run's record, which reports its failure.
        let _ = recorder.set_sandbox(id);
    }
    let code = record.exit_code;
    record.fill_span(&mut span);
    let (children, decisions, _) = recorder.take();
    let mut finish = record
        .finish()
        .profile(&recorder.profile())
        .trace(&span.traceparent())
        .command(&command_line)
        .denials(recorder.denied_rules());
    finish.decisions = Some(decisions);
    // The daemon counts the denials of the runs it served, and of those denied before any
    // sandbox; cold runs beside a daemon (`cold_reason`) are not its own.
    let daemon = (!no_daemon && record.cold_reason.is_none()).then_some(DaemonDenials(paths));
    let audit = recorder.audit();
    let written = recorder.flush().and_then(|()| {
        finish.write(Sinks {
            span: Some(&mut span),
            audit: Some(&audit),
            counter: daemon.as_ref().map(|d| d as &dyn RunCounter),
            violation_metric: true,
            ..Default::default()
        })
    });
    if let Err(e) = written {
        eprintln!("agentrun: {e}");
    }
    span.finish_with(children);
    ExitCode::from(code as u8)
}

/// The daemon's metrics (`agentrun_policy_denials_total`), as a CLI run reaches them: its
/// denials are reported to the daemon when one answers; its run the daemon counted itself
/// (it served it) or is not the daemon's. Never fails the run.
struct DaemonDenials<'a>(&'a Paths);

impl RunCounter for DaemonDenials<'_> {
    fn run(&self, _outcome: &str, _duration: std::time::Duration) {}

    fn denials(&self, rules: &[String]) {
        report_denials(self.0, rules);
    }
}

/// The run's denials, to the daemon's metrics, when a daemon answers.
fn report_denials(paths: &Paths, rules: &[String]) {
    if rules.is_empty() {
        return;
    }
    if let Some(client) = DaemonClient::connect(&paths.socket()) {
        let msg = agentrun_pool::protocol::ClientMessage::Denials {
            rules: rules.to_vec(),
        };
        // Metrics only: a daemon that does not take them misses a count, nothing else.
        let _ = client.call(&msg);
    }
}

/// Every run shape goes to the daemon when it answers, unless asked not to (`no_daemon`);
/// a kept bundle (a shell's config.json made for this run) needs this process to build the
/// shell.
fn execute(
    plan: &Plan,
    paths: &Paths,
    keep_bundle: bool,
    no_daemon: bool,
    recorder: &Recorder,
) -> RunRecord {
    let mut cold_reason = keep_bundle.then_some("keep_bundle");
    if !no_daemon && !keep_bundle {
        if let Some(client) = DaemonClient::connect(&paths.socket()) {
            match crate::warm::execute(&client, plan, &paths.root, recorder) {
                Some(record) => return record,
                // The daemon serves another store: this run's image is not among its own.
                None => cold_reason = Some("daemon_store"),
            }
        }
    }
    let mut record = crate::cold::execute(plan, paths, keep_bundle, recorder);
    if cold_reason.is_some() {
        record.cold_reason = cold_reason;
    }
    record
}
