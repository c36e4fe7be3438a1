//! `agentrun policy check FILE|NAME`: validates a profile (errors give line, field and why)
//! and, with `--connect`/`--read`/`--write`/`--env`, shows what it decides (`allow`, `deny`
//! or `escalate`: allowed only when a person approves; not allowed here).

use agentrun_policy::{Action, NetworkMode, Profile, RuleAction};
use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Validate a profile and summarise it; optionally decide actions under it.
    Check(CheckArgs),
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// A profile file (TOML) or a built-in profile name.
    profile: String,
    /// Decide a connection to HOST:PORT (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    connect: Vec<String>,
    /// Decide reading PATH (repeatable).
    #[arg(long, value_name = "PATH")]
    read: Vec<String>,
    /// Decide writing PATH (repeatable).
    #[arg(long, value_name = "PATH")]
    write: Vec<String>,
    /// Decide setting environment variable KEY (repeatable).
    #[arg(long, value_name = "KEY")]
    env: Vec<String>,
}

/// Exit code when the profile is invalid (or a decided action is denied).
const EXIT_INVALID: u8 = 1;

pub fn run(cmd: PolicyCommand) -> std::process::ExitCode {
    let PolicyCommand::Check(args) = cmd;
    let profile = match Profile::load(&args.profile) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("agentrun: {}", crate::one_line(&e.to_string()));
            return std::process::ExitCode::from(EXIT_INVALID);
        }
    };
    let escalate_rules = profile
        .network
        .rules
        .iter()
        .filter(|r| r.action == RuleAction::Escalate)
        .count();
    let rules = match escalate_rules {
        0 => format!("{} rules", profile.network.rules.len()),
        n => format!("{} rules, {n} escalate", profile.network.rules.len()),
    };
    let net = match profile.network.mode {
        NetworkMode::None => "none".to_string(),
        NetworkMode::Allowlist => format!("allowlist ({rules})"),
        NetworkMode::All => format!("all, through the egress proxy ({rules})"),
    };
    let escalate_write = match profile.filesystem.escalate_write.len() {
        0 => String::new(),
        n => format!(", {n} escalate_write"),
    };
    println!(
        "{}: ok (profile {:?}; workspace {}; {} readable, {} writable, {} hidden{escalate_write} paths; network {})",
        args.profile,
        profile.name,
        if profile.filesystem.workspace_writable {
            "rw"
        } else {
            "ro"
        },
        profile.filesystem.readable.len(),
        profile.filesystem.writable.len(),
        profile.filesystem.hidden.len(),
        net
    );
    let mut actions = Vec::new();
    for c in &args.connect {
        let Some((host, port)) = c
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
        else {
            eprintln!("agentrun: --connect {c}: expected HOST:PORT");
            return std::process::ExitCode::from(crate::EXIT_AGENTRUN_ERROR);
        };
        actions.push(Action::Connect {
            host: host.to_string(),
            port,
        });
    }
    actions.extend(args.read.iter().map(|p| Action::Read(p.into())));
    actions.extend(args.write.iter().map(|p| Action::Write(p.into())));
    actions.extend(args.env.iter().map(|k| Action::SetEnv(k.clone())));
    let mut all_allowed = true;
    for a in &actions {
        let d = profile.check(a);
        all_allowed &= d.allow;
        println!(
            "{} {} {} rule={} reason={:?}",
            d.verdict(),
            a.name(),
            a.resource(),
            d.rule_id,
            d.reason
        );
    }
    if all_allowed {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(EXIT_INVALID)
    }
}
