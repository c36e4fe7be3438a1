//! `agentrun`: run untrusted code in kernel-enforced sandboxes.
//!
//! A thin binary: it parses arguments and calls the library crates (`agentrun-runtime`,
//! `agentrun-image`, `agentrun-policy`, `agentrun-telemetry`, `agentrun-oci`).
//!
//! runc-style command lines (containerd's runc shim with `BinaryName` set to this binary,
//! `ctr run --runc-binary`, `agentrun oci ...`, or this binary invoked as `runc`) go to the
//! OCI runtime CLI; see `agentrun_oci::invocation` for how they are told apart.

mod approve;
mod audit_cmd;
mod cold;
mod credential;
mod exec;
mod fork_cmd;
mod gen_cmd;
mod image;
mod info;
mod landlock_only;
mod logging;
mod mcp_cmd;
mod plan;
mod policy_cmd;
mod progress;
mod run;
mod serve;
mod snapshot_cmd;
mod top;
mod trace;
mod volume_cmd;
mod warm;

use std::path::PathBuf;
use std::process::ExitCode;

use agentrun_runtime::preflight;
use clap::{Parser, Subcommand};

/// Exit code for agentrun's own failures ([`agentrun_runtime::exit::EXIT_SETUP_FAILED`], as
/// the `u8` a process exit code is).
pub const EXIT_AGENTRUN_ERROR: u8 = agentrun_runtime::exit::EXIT_SETUP_FAILED as u8;

#[derive(Parser, Debug)]
#[command(
    name = "agentrun",
    version,
    about = "Run untrusted, AI-generated code in kernel-enforced sandboxes",
    long_about = None
)]
struct Cli {
    #[command(flatten)]
    globals: Globals,
    #[command(subcommand)]
    command: Command,
}

/// The global options (paths), shared by [`Cli`] and [`ExecCli`].
#[derive(clap::Args, Debug)]
struct Globals {
    /// Persistent data (images) [default: /var/lib/agentrun; as an ordinary user
    /// $XDG_DATA_HOME/agentrun, else ~/.local/share/agentrun]
    #[arg(long, global = true, env = "AGENTRUN_ROOT")]
    root: Option<PathBuf>,
    /// Runtime state (live sandboxes) [default: /run/agentrun; as an ordinary user
    /// $XDG_RUNTIME_DIR/agentrun, else /tmp/agentrun-UID]
    #[arg(long, global = true, env = "AGENTRUN_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// The daemon's socket (default: <state dir>/agentrun.sock).
    #[arg(long, global = true, env = "AGENTRUN_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The audit log's directory (default: <root>/audit).
    #[arg(long, global = true, env = "AGENTRUN_AUDIT_DIR", value_name = "DIR")]
    audit_dir: Option<PathBuf>,
}

/// `agentrun exec ...` parsed without the rest of the CLI: building clap's whole command
/// tree (every subcommand's arguments) is a tenth of a warm run's client CPU. Only a command
/// line this parses completely takes it; anything else (`--help`, an error, global options
/// before `exec`) is parsed again by [`Cli`], so what the user sees is [`Cli`]'s.
#[derive(Parser, Debug)]
#[command(name = "agentrun")]
struct ExecCli {
    #[command(flatten)]
    globals: Globals,
    #[command(subcommand)]
    command: ExecOnly,
}

#[derive(Subcommand, Debug)]
enum ExecOnly {
    Exec(Box<plan::ExecArgs>),
}

impl Cli {
    /// Parses `args` as the CLI: `exec` through [`ExecCli`] when it parses there (the same
    /// options, the same result), everything else (and every error) through [`Cli`].
    fn parse_args(args: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
        if args.get(1).is_some_and(|a| a == "exec") {
            if let Ok(ExecCli {
                globals,
                command: ExecOnly::Exec(exec),
            }) = ExecCli::try_parse_from(&args)
            {
                return Ok(Cli {
                    globals,
                    command: Command::Exec(exec),
                });
            }
        }
        Cli::try_parse_from(args)
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command in a fresh sandbox and tear it down afterwards.
    Exec(Box<plan::ExecArgs>),
    /// Show what this host can enforce.
    Info(info::InfoArgs),
    /// Print the API key `agentrun serve` made for its HTTP listeners (<state dir>/api-key;
    /// readable by the daemon's user only).
    ApiKey,
    /// Manage images.
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// Remove what killed runs left behind (processes, mounts, cgroups, state dirs) and host
    /// image trees an update replaced that nothing uses any more.
    Gc,
    /// Run the daemon: a warm pool of ready sandboxes that `agentrun exec` uses.
    Serve(Box<serve::ServeArgs>),
    /// List the daemon's shells (ID) and the long-lived sandbox each serves (SANDBOX).
    Ps {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// A live view of the daemon: pools, running commands (kill one with k), runs/s and
    /// latency over the last minute, and the newest policy denials.
    Top(top::TopArgs),
    /// The daemon's pool.
    #[command(subcommand)]
    Pool(serve::PoolCommand),
    /// Profiles (policy as code).
    #[command(subcommand)]
    Policy(policy_cmd::PolicyCommand),
    /// Serve MCP on stdio: tools that run code and touch files in sandboxes (run_python,
    /// run_shell, write_file, read_file, list_files), with a warm pool of its own.
    Mcp(Box<mcp_cmd::McpArgs>),
    /// Named volumes (what OpenSandbox `pvc` volumes mount).
    #[command(subcommand)]
    Volume(volume_cmd::VolumeCommand),
    /// Copy a live OpenSandbox sandbox of the daemon into N new sandboxes that start with its
    /// files (an agentrun extension of the OpenSandbox API: POST /v1/sandboxes/ID/fork).
    Fork(fork_cmd::ForkArgs),
    /// Snapshots of the daemon's sandboxes: create, ls, inspect, rm.
    #[command(subcommand)]
    Snapshot(snapshot_cmd::SnapshotCommand),
    /// Show the audit log: every run and every policy decision.
    Audit(audit_cmd::AuditArgs),
    /// Print the shell completion script for SHELL (e.g. to
    /// /usr/share/bash-completion/completions/agentrun).
    #[command(hide = true)]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages (agentrun.1, agentrun-serve.1, ...) into DIR.
    #[command(hide = true)]
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// The runc-compatible OCI runtime (create, start, state, kill, delete, exec, ...), for
    /// containerd's runc shim and Kubernetes RuntimeClasses: see docs/kubernetes.md.
    Oci {
        /// runc's command line, e.g. `--root DIR create --bundle B ID`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

/// Global paths, shared by the subcommands.
pub struct Paths {
    pub root: PathBuf,
    pub state_dir: PathBuf,
    socket: Option<PathBuf>,
    audit_dir: Option<PathBuf>,
}

impl Paths {
    /// Where `agentrun serve` listens and clients connect.
    pub fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| agentrun_pool::daemon::default_socket(&self.state_dir))
    }

    /// Where the audit log is kept.
    pub fn audit_dir(&self) -> PathBuf {
        self.audit_dir
            .clone()
            .unwrap_or_else(|| self.root.join("audit"))
    }
}

/// Why `agentrun oci ...` (and runc-style invocations) refuse as an ordinary user.
const OCI_NEEDS_ROOT: &str = "the OCI runtime (containerd/RuntimeClass) needs root: rootless \
                              mode covers exec, serve, mcp, image, volume, snapshot, gc and info";

fn main() -> ExitCode {
    // Errors are printed as one line and never with a backtrace, so anyhow need not capture
    // one. It would when RUST_BACKTRACE is set: the first capture in this static binary sorts
    // every unwind table entry (~4 ms, four times a whole failed `exec`).
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // Still single-threaded: nothing reads the environment concurrently.
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Root, or an ordinary user (rootless mode): decided once, here, by the effective uid.
    let privilege = agentrun_runtime::Privilege::detect();
    if let Some(oci_args) = agentrun_oci::invocation::runc_args(&args) {
        if !privilege.is_root() {
            eprintln!("agentrun: {OCI_NEEDS_ROOT}");
            return ExitCode::from(EXIT_AGENTRUN_ERROR);
        }
        let code = agentrun_oci::main(oci_args, |log| {
            logging::init(logging::Mode::OciRuntime, Some(log))
        });
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = match Cli::parse_args(args) {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            // --help, --version: a reader that went away (a closed pipe) is not an error of the command.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("agentrun: {}", clap_error_line(&e));
            return ExitCode::from(EXIT_AGENTRUN_ERROR);
        }
    };
    if !matches!(cli.command, Command::Oci { .. }) {
        let mode = match cli.command {
            Command::Serve(_) | Command::Mcp(_) => logging::Mode::Daemon,
            _ => logging::Mode::Command,
        };
        logging::init(mode, None);
    }
    if matches!(cli.command, Command::Oci { .. }) && !privilege.is_root() {
        eprintln!("agentrun: {OCI_NEEDS_ROOT}");
        return ExitCode::from(EXIT_AGENTRUN_ERROR);
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let paths = Paths {
        root: cli
            .globals
            .root
            .unwrap_or_else(|| privilege.default_root(&env)),
        state_dir: cli
            .globals
            .state_dir
            .unwrap_or_else(|| privilege.default_state_dir(&env)),
        socket: cli.globals.socket,
        audit_dir: cli.globals.audit_dir,
    };
    // Commands that keep images or sandboxes under the store and the state dir make both
    // private first (creating or repairing them; see agentrun_runtime::hostdirs).
    if matches!(
        cli.command,
        Command::Exec(_)
            | Command::Serve(_)
            | Command::Mcp(_)
            | Command::Gc
            | Command::Image(_)
            | Command::Volume(_)
            | Command::Snapshot(_)
    ) {
        match agentrun_runtime::hostdirs::secure(&paths.root, &paths.state_dir) {
            Ok(repairs) => {
                for line in repairs {
                    eprintln!("agentrun: {line}");
                }
            }
            Err(e) => {
                eprintln!("agentrun: {}", one_line(&e.to_string()));
                return ExitCode::from(EXIT_AGENTRUN_ERROR);
            }
        }
    }
    // The daemons check every host requirement at start, not at their first sandbox.
    if matches!(cli.command, Command::Serve(_) | Command::Mcp(_)) {
        let host = agentrun_runtime::HostInfo::probe();
        let checked = match &host.privilege {
            agentrun_runtime::Privilege::Root => {
                preflight::check(&preflight::HostFacts::probe(&host))
            }
            // Rootless: no cgroups to check; user namespaces are (their blocker named).
            agentrun_runtime::Privilege::Rootless(_) => {
                match agentrun_runtime::privilege::UsernsFacts::probe().blocker() {
                    Some(b) => {
                        eprintln!("agentrun: {b}");
                        return ExitCode::from(EXIT_AGENTRUN_ERROR);
                    }
                    None => Ok(Vec::new()),
                }
            }
        };
        match checked {
            Ok(warnings) => {
                for w in warnings {
                    eprintln!("agentrun: warning: {w}");
                }
            }
            Err(e) => {
                eprintln!("agentrun: {e}");
                return ExitCode::from(EXIT_AGENTRUN_ERROR);
            }
        }
    }
    if matches!(
        cli.command,
        Command::Audit(_)
            | Command::Info(_)
            | Command::ApiKey
            | Command::Ps { .. }
            | Command::Pool(_)
            | Command::Policy(_)
            | Command::Completions { .. }
            | Command::Man { .. }
    ) {
        // A report piped into `head` ends as coreutils' do, quietly at its reader's hangup,
        // not with a panic of `println!` ("failed printing to stdout: Broken pipe"). Only
        // these commands: they write to stdout and talk to the daemon on its socket only
        // (sent with MSG_NOSIGNAL); `exec` forwards a run's output and handles EPIPE itself,
        // and the daemons and HTTP clients keep SIGPIPE ignored.
        // SAFETY: sets this process's disposition of one signal before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        Command::Exec(args) => return exec::run(*args, &paths),
        Command::Top(args) => return top::run(args, &paths),
        Command::Policy(cmd) => return policy_cmd::run(cmd),
        Command::Audit(args) => audit_cmd::run(args, &paths),
        Command::Volume(cmd) => volume_cmd::run(cmd, &paths),
        Command::Snapshot(cmd) => snapshot_cmd::run(cmd, &paths),
        Command::Fork(args) => fork_cmd::run(args, &paths),
        Command::Info(args) => info::run(args, &paths),
        Command::ApiKey => serve::print_api_key(&paths),
        Command::Image(cmd) => image::run(cmd, &paths),
        Command::Gc => gc(&paths),
        Command::Serve(args) => serve::serve(*args, &paths),
        Command::Mcp(args) => mcp_cmd::run(*args, &paths),
        Command::Ps { json } => serve::ps(json, &paths),
        Command::Completions { shell } => gen_cmd::completions(shell),
        Command::Man { dir } => gen_cmd::man(&dir),
        Command::Pool(cmd) => serve::pool(cmd, &paths),
        Command::Oci { args } => {
            let mut argv = vec![std::ffi::OsString::from("agentrun")];
            argv.extend(args);
            let code = agentrun_oci::main(argv, |log| {
                logging::init(logging::Mode::OciRuntime, Some(log))
            });
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentrun: {}", one_line(&format!("{e:#}")));
            ExitCode::from(EXIT_AGENTRUN_ERROR)
        }
    }
}

fn gc(paths: &Paths) -> anyhow::Result<()> {
    let report =
        agentrun_runtime::gc::collect(&agentrun_runtime::RuntimePaths::new(&paths.state_dir));
    for id in &report.removed {
        println!("removed {id}");
    }
    for (id, why) in &report.failed {
        eprintln!("agentrun: could not remove {id}: {why}");
    }
    if paths.root.is_dir() {
        if let Ok(store) = agentrun_image::ImageStore::open(&paths.root) {
            store.collect_host_image();
        }
    }
    if report.failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{} sandbox(es) could not be removed", report.failed.len())
    }
}

/// Errors are printed on one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// clap's error as one line, like every other agentrun error (its usage block is noise here).
fn clap_error_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines
        .next()
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ")
        .to_string();
    let detail = lines
        .find(|l| !l.starts_with("Usage:") && !l.starts_with("For more"))
        .map(|l| {
            let sep = if first.ends_with(':') { " " } else { "; " };
            format!("{sep}{}", l.trim_start_matches("tip: "))
        })
        .unwrap_or_default();
    format!("{first}{detail} (see --help)")
}

#[cfg(test)]
mod cli_tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(std::ffi::OsString::from).collect()
    }

    #[test]
    fn exec_parses_the_same_without_the_rest_of_the_cli() {
        for line in [
            &["agentrun", "exec", "--", "/bin/true"][..],
            &[
                "agentrun",
                "exec",
                "--profile",
                "strict",
                "--",
                "python3",
                "-c",
                "1",
            ],
            &[
                "agentrun",
                "exec",
                "--root",
                "/r",
                "--memory",
                "64M",
                "--workspace",
                "/w",
                "--ro",
                "/a:/b",
                "--",
                "sh",
                "-c",
                "echo --root",
            ],
            &[
                "agentrun",
                "exec",
                "--state-dir",
                "/s",
                "--",
                "ls",
                "--help",
            ],
        ] {
            let fast = ExecCli::try_parse_from(os(line)).expect("exec parses");
            let full = Cli::try_parse_from(os(line)).expect("the CLI parses");
            let ExecOnly::Exec(fast_args) = fast.command;
            let Command::Exec(full_args) = full.command else {
                panic!("not exec: {line:?}")
            };
            assert_eq!(
                format!("{fast_args:?}"),
                format!("{full_args:?}"),
                "{line:?}"
            );
            assert_eq!(
                format!("{:?}", fast.globals),
                format!("{:?}", full.globals),
                "{line:?}"
            );
        }
    }

    #[test]
    fn help_and_errors_of_exec_are_the_full_clis() {
        for line in [
            &["agentrun", "exec", "--help"][..],
            &["agentrun", "exec", "--no-such-flag", "--", "true"],
            &["agentrun", "exec", "--memory"],
        ] {
            let ours = Cli::parse_args(os(line)).expect_err("not a run");
            let full = Cli::try_parse_from(os(line)).expect_err("not a run");
            assert_eq!(ours.kind(), full.kind(), "{line:?}");
            assert_eq!(ours.to_string(), full.to_string(), "{line:?}");
        }
        // Global options before the subcommand take the full CLI, and parse.
        let cli = Cli::parse_args(os(&["agentrun", "--root", "/r", "exec", "--", "true"]))
            .expect("parses");
        assert!(matches!(cli.command, Command::Exec(_)));
        assert_eq!(cli.globals.root, Some(PathBuf::from("/r")));
    }
}
