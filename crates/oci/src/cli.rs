//! Parsing a runc-style command line (argument definitions from `liboci-cli`) and running the
//! command: errors are logged runc's way ([`crate::log`]) and exit with 1.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use liboci_cli::{CommonCmd, GlobalOpts, StandardCmd};

use crate::globals::Globals;
use crate::log::{one_line, Logger};
use crate::OciError;

#[derive(Parser, Debug)]
#[command(
    name = "agentrun",
    version,
    about = "agentrun's runc-compatible OCI runtime (for containerd's runc shim and Kubernetes)"
)]
struct Cli {
    #[command(flatten)]
    global: GlobalOpts,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    #[command(flatten)]
    Standard(Box<StandardCmd>),
    #[command(flatten)]
    Common(Box<CommonCmd>),
    /// Checkpoint a running container (CRIU). liboci-cli spells it `checkpointt`: this is
    /// runc's name.
    Checkpoint(Box<liboci_cli::Checkpoint>),
    /// Restore a container from a checkpoint (CRIU)
    Restore(Box<crate::checkpoint::Restore>),
}

/// Go-style single-dash long flags that containerd's runc client (go-runc) passes and runc's
/// own parser accepts: `restore -no-subreaper`.
const GO_STYLE_FLAGS: &[&str] = &["-no-subreaper"];

pub(crate) fn main(args: Vec<OsString>, install_log: impl FnOnce(crate::LogLayer)) -> i32 {
    let args: Vec<OsString> = args
        .into_iter()
        .map(|a| match a.to_str() {
            Some(f) if GO_STYLE_FLAGS.contains(&f) => OsString::from(format!("-{f}")),
            _ => a,
        })
        .collect();
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            // --help, --version: a reader that went away (a closed pipe) is not an error of the command.
            let _ = e.print();
            return 0;
        }
        Err(e) => {
            // The parse error is the exit code; a reader that went away (a closed pipe) is not an error of the command.
            let _ = e.print();
            return 1;
        }
    };
    let logger = Logger {
        file: cli.global.log.clone(),
        json: cli.global.log_format.as_deref() == Some("json"),
        debug: cli.global.debug,
    };
    install_log(logger.layer());
    let globals = Globals {
        root: cli
            .global
            .root
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::DEFAULT_ROOT)),
        systemd_cgroup: cli.global.systemd_cgroup,
        logger,
    };
    match run(&globals, cli.command) {
        Ok(code) => code,
        Err(e) => {
            let mut msg = crate::error::chain(&e);
            // libcontainer's own errors are terse; its first logged error says what failed.
            if let (OciError::Container(_), Some(detail)) = (&e, crate::log::first_detail()) {
                if !msg.contains(&detail) {
                    msg = format!("{msg} ({detail})");
                }
            }
            globals.logger.error(&one_line(&msg));
            1
        }
    }
}

/// Runs one command; its exit code on success.
fn run(globals: &Globals, command: Command) -> Result<i32, OciError> {
    use crate::{describe, info, lifecycle, manage};
    match command {
        Command::Standard(cmd) => match *cmd {
            StandardCmd::Create(a) => lifecycle::create(globals, a).map(|()| 0),
            StandardCmd::Start(a) => lifecycle::start(globals, &a.container_id).map(|()| 0),
            StandardCmd::State(a) => info::state(globals, &a.container_id).map(|()| 0),
            StandardCmd::Kill(a) => lifecycle::kill(globals, a).map(|()| 0),
            StandardCmd::Delete(a) => {
                lifecycle::delete(globals, &a.container_id, a.force).map(|()| 0)
            }
        },
        Command::Common(cmd) => match *cmd {
            CommonCmd::Run(a) => lifecycle::run(globals, a),
            CommonCmd::Exec(a) => lifecycle::exec(globals, a),
            CommonCmd::Ps(a) => info::ps(globals, a).map(|()| 0),
            CommonCmd::List(a) => info::list(globals, a).map(|()| 0),
            CommonCmd::Events(a) => info::events(globals, a).map(|()| 0),
            CommonCmd::Pause(a) => manage::pause(globals, &a.container_id).map(|()| 0),
            CommonCmd::Resume(a) => manage::resume(globals, &a.container_id).map(|()| 0),
            CommonCmd::Update(a) => manage::update(globals, a).map(|()| 0),
            CommonCmd::Features(_) => describe::features().map(|()| 0),
            CommonCmd::Spec(a) => describe::spec(a).map(|()| 0),
            CommonCmd::Checkpointt(a) => crate::checkpoint::checkpoint(globals, a).map(|()| 0),
        },
        Command::Checkpoint(a) => crate::checkpoint::checkpoint(globals, *a).map(|()| 0),
        Command::Restore(a) => crate::checkpoint::restore(globals, *a),
    }
}
