//! `agentrun mcp`: the MCP server on stdio, with its own warm pool (a daemon whose only
//! front end is the stdio session; see agentrun_mcp::stdio).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use agentrun_mcp::{McpOptions, StdioFrontend};
use agentrun_pool::daemon::{self, DaemonOptions};
use agentrun_pool::pool::{PoolLimits, PoolSpec};
use agentrun_pool::recipe::{SandboxRecipe, DEFAULT_IMAGE, DEFAULT_PROFILE};
use anyhow::{bail, Context};
use clap::Args;

use crate::Paths;

#[derive(Args, Debug)]
pub struct McpArgs {
    /// Image of every sandbox.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    image: String,
    /// Profile (built-in name or file) of every sandbox.
    #[arg(long, default_value = DEFAULT_PROFILE)]
    profile: String,
    /// Host directory mounted at /workspace (the working directory of runs and relative paths).
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// The sandboxes' egress flags, as for `agentrun exec`.
    #[command(flatten)]
    egress: crate::credential::EgressArgs,
    /// A fresh sandbox for every tool call (default: one per MCP session, whose files and
    /// Python variables persist between calls).
    #[arg(long)]
    one_shot: bool,
    /// Tear down the session's sandbox after this long without a call.
    #[arg(long, value_name = "DURATION", default_value = "10m")]
    idle_timeout: String,
    /// A call's time limit when it names none (at most the profile's).
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    timeout: String,
    /// How long an escalation waits for the user's answer before it is a deny.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    approval_timeout: String,
    /// Ready sandboxes kept (the warm pool).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pool_size: usize,
}

/// The most `agentrun mcp` servers at once (each has a state slot).
const SLOTS: usize = 256;

fn duration(s: &str, flag: &str) -> anyhow::Result<Duration> {
    let d = agentrun_policy::parse_duration(s).with_context(|| format!("--{flag}"))?;
    if d.is_zero() {
        bail!("--{flag}: must be more than 0");
    }
    Ok(d)
}

/// Takes the first free state slot under `state_dir/mcp` (held by an flock for the process's
/// life), so that any number of `agentrun mcp` run beside each other and beside a `serve`.
fn state_slot(state_dir: &std::path::Path) -> anyhow::Result<(PathBuf, std::fs::File)> {
    let base = state_dir.join("mcp");
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    for n in 0..SLOTS {
        let dir = base.join(n.to_string());
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("slot.lock"))
            .with_context(|| format!("open {}/slot.lock", dir.display()))?;
        // SAFETY: flock(2) on an fd we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok((dir, lock));
        }
    }
    bail!("{SLOTS} agentrun mcp servers already run on this state dir")
}

/// The protocol's fds, moved off 0 and 1: stdin becomes /dev/null and stdout a copy of
/// stderr, so that nothing printed by this process or anything it starts reaches the
/// protocol stream.
fn take_stdio() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let dup = |fd: i32| -> anyhow::Result<OwnedFd> {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) returns a new fd we own, or -1.
        let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
        if n < 0 {
            bail!("dup fd {fd}: {}", std::io::Error::last_os_error());
        }
        // SAFETY: n is a fresh fd nobody else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(n) })
    };
    let (input, output) = (dup(0)?, dup(1)?);
    let null = std::fs::File::open("/dev/null").context("/dev/null")?;
    // SAFETY: dup2 onto the standard fds; the sources are valid fds.
    let ok = unsafe { libc::dup2(null.as_raw_fd(), 0) >= 0 && libc::dup2(2, 1) >= 0 };
    if !ok {
        bail!("dup2: {}", std::io::Error::last_os_error());
    }
    Ok((input, output))
}

pub fn run(args: McpArgs, paths: &Paths) -> anyhow::Result<()> {
    let store = agentrun_image::ImageStore::open(&paths.root)?;
    store
        .resolve(&args.image)
        .with_context(|| format!("--image {}", args.image))?;
    let profile = if agentrun_policy::Profile::is_file_name(&args.profile) {
        std::fs::canonicalize(&args.profile)
            .with_context(|| format!("--profile {}", args.profile))?
            .to_string_lossy()
            .into_owned()
    } else {
        args.profile.clone()
    };
    let workspace = args
        .workspace
        .as_deref()
        .map(|w| crate::plan::check_dir(w, true, "--workspace"))
        .transpose()?;
    let mut allow = args.egress.allow_host.clone();
    let creds = crate::credential::parse_all(&args.egress.credential, &mut allow)?;
    let recipe = SandboxRecipe {
        image: args.image.clone(),
        profile: profile.clone(),
        workspace,
        allow_hosts: allow,
        ..SandboxRecipe::default()
    };
    let options = McpOptions::new(recipe, paths.audit_dir())
        .one_shot(args.one_shot)
        .idle_timeout(duration(&args.idle_timeout, "idle-timeout")?)
        .call_timeout(duration(&args.timeout, "timeout")?)
        .approval_timeout(duration(&args.approval_timeout, "approval-timeout")?);
    // Every mistake in the options is said now, not at the first call.
    let loaded = options
        .recipe
        .profile()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let vault = crate::credential::session_vault(creds, &loaded)?;
    let options = options.credentials(vault, args.egress.egress_upstream_ca.clone());
    let (state_dir, _slot) = state_slot(&paths.state_dir)?;
    let (input, output) = take_stdio()?;
    let pools = vec![PoolSpec {
        image: args.image.clone(),
        profile,
        target: args.pool_size,
    }];
    let opts = DaemonOptions {
        socket: daemon::default_socket(&state_dir),
        root: paths.root.clone(),
        state_dir,
        limits: PoolLimits::new(pools, 64.max(args.pool_size + 8)),
        drain: Duration::from_secs(2),
        factories: std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(2),
    };
    let frontend = StdioFrontend {
        options,
        input,
        output,
    };
    daemon::run(&opts, vec![Box::new(frontend)])?;
    Ok(())
}
