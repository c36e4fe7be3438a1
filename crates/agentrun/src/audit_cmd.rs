//! `agentrun audit [--since T] [--deny] [--json]`: the audit log, one line per record.

use agentrun_telemetry::{AuditLog, AuditQuery, AuditRecord};
use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;

#[derive(Args, Debug)]
pub struct AuditArgs {
    /// Only records at or after T: an RFC 3339 time (2026-11-22T01:00:00Z) or a duration ago
    /// (30s, 10m, 2h).
    #[arg(long, value_name = "T")]
    since: Option<String>,
    /// Only refused decisions (denials, and escalations nobody approved).
    #[arg(long)]
    deny: bool,
    /// Print the records as JSON lines.
    #[arg(long)]
    json: bool,
}

fn parse_since(s: &str) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = agentrun_policy::parse_duration(s)
        .with_context(|| format!("--since {s:?}: not an RFC 3339 time or a duration"))?;
    Ok(Utc::now() - chrono::Duration::from_std(ago).context("--since")?)
}

pub fn run(args: AuditArgs, paths: &crate::Paths) -> anyhow::Result<()> {
    let since = args.since.as_deref().map(parse_since).transpose()?;
    let log = AuditLog::new(paths.audit_dir());
    let records = log.query(&AuditQuery {
        since,
        refused: args.deny,
        ..AuditQuery::default()
    })?;
    let mut out = std::io::stdout().lock();
    for r in records {
        let line = if args.json {
            serde_json::to_string(&r)?
        } else {
            format_line(&r)
        };
        use std::io::Write;
        if writeln!(out, "{line}").is_err() {
            break; // stdout closed (| head)
        }
    }
    Ok(())
}

/// `TIME SANDBOX DECISION ACTION RESOURCE rule=... [outcome=...] reason="..."` or, for runs,
/// `TIME SANDBOX run exec "CMD" exit=N outcome`.
fn format_line(r: &AuditRecord) -> String {
    let id = if r.sandbox_id.is_empty() {
        "-"
    } else {
        &r.sandbox_id
    };
    if r.kind == "run" {
        format!(
            "{} {} run exec {:?} exit={} {} trace={}",
            r.time,
            id,
            r.resource,
            r.exit.map_or("-".into(), |c| c.to_string()),
            r.decision,
            r.trace_id
        )
    } else {
        let outcome = if r.escalation.is_empty() {
            String::new()
        } else {
            format!(" outcome={}", r.escalation)
        };
        format!(
            "{} {} {} {} {} rule={}{outcome} reason={:?} trace={}",
            r.time, id, r.decision, r.action, r.resource, r.rule, r.reason, r.trace_id
        )
    }
}
