//! The plan of a run: `agentrun exec`'s arguments ([`ExecArgs`]) checked and decided into a
//! [`Plan`] before any sandbox exists (bad input costs nothing; every policy decision on the
//! request is made and recorded here; the first denial refuses the run). Both paths of a run,
//! cold ([`crate::cold`]) and warm ([`crate::warm`]), execute a plan.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentrun_image::ImageStore;
use agentrun_policy::{
    parse_bytes, parse_duration, validate_env_key, Action, Approver, NetworkPolicy, Profile,
    ResourceOverrides, RuleAction, DEFAULT_APPROVAL_TIMEOUT, WORKSPACE,
};
use agentrun_pool::recipe::{ExecRequest, SandboxRecipe};
use agentrun_runtime::rootfs::UserMount;
use agentrun_runtime::volume::{Creator, VolumeLease, VolumeStore};
use anyhow::{bail, Context};
use clap::Args;

use crate::trace::Recorder;
use crate::Paths;

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Image to run (`host`: the host's programs read-only, no download).
    #[arg(long, default_value = "host")]
    pub(crate) image: String,
    /// Profile: a built-in name (default, strict, code-interpreter) or a TOML file.
    #[arg(long, default_value = "default")]
    pub(crate) profile: String,
    #[command(flatten)]
    egress: crate::credential::EgressArgs,
    /// Host directory mounted read-write at /workspace (the default working directory).
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Extra read-only mount, HOST[:SANDBOX] (repeatable).
    #[arg(long = "ro", value_name = "HOST[:SANDBOX]")]
    ro: Vec<String>,
    /// Extra read-write mount, HOST[:SANDBOX] (repeatable).
    #[arg(long = "rw", value_name = "HOST[:SANDBOX]")]
    rw: Vec<String>,
    /// A named volume (`agentrun volume`) mounted at SANDBOX, read-write unless `:ro`; made
    /// when missing, kept after the run (repeatable).
    #[arg(long = "volume", value_name = "NAME:SANDBOX[:ro]")]
    volume: Vec<String>,
    /// Set an environment variable, KEY=VALUE (or KEY to pass the host's value) (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Read KEY=VALUE lines from a file (repeatable).
    #[arg(long, value_name = "FILE")]
    env_file: Vec<PathBuf>,
    /// Kill the sandbox after this long (e.g. 500ms, 2s, 1m); exit code 124.
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Memory limit (e.g. 64M, 1G); no swap on top.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Maximum number of processes and threads.
    #[arg(long, value_name = "N")]
    pids: Option<u32>,
    /// CPU quota in cores (e.g. 0.5, 2).
    #[arg(long, value_name = "CORES")]
    cpus: Option<f64>,
    /// Size cap of the sandbox's writable layer (tmpfs).
    #[arg(long, value_name = "SIZE")]
    tmpfs_size: Option<String>,
    /// Working directory inside the sandbox (default /workspace).
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// Keep the generated OCI config.json and print where it is.
    #[arg(long)]
    pub(crate) keep_bundle: bool,
    /// Run without the daemon even if one answers: a shell made for this run and torn down
    /// after it (as `AGENTRUN_NO_DAEMON=1`).
    #[arg(long)]
    pub(crate) no_daemon: bool,
    /// How the command is isolated: `namespaces` (a sandbox: the default), or
    /// `landlock-only`: Landlock + seccomp + rlimits with NO namespaces, on the host's file
    /// system (clearly weaker; for hosts without user namespaces; docs/rootless.md).
    #[arg(long, value_enum, default_value = "namespaces")]
    pub(crate) isolation: Isolation,
    /// Never ask on the terminal: what the profile marks escalate is denied ("needs
    /// approval"), as it is when there is no terminal.
    #[arg(long)]
    no_prompt: bool,
    /// How long a question on the terminal waits for an answer (default 60s); then denied.
    #[arg(long, value_name = "DURATION")]
    approval_timeout: Option<String>,
    /// The command and its arguments (default: the image's Entrypoint + Cmd).
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// Everything a run needs, validated.
pub(crate) struct Plan {
    pub(crate) request: ExecRequest,
    pub(crate) timeout: Option<Duration>,
    pub(crate) memory_bytes: u64,
    /// The effective network policy (profile + `--allow-host`).
    pub(crate) network: NetworkPolicy,
    /// The profile caps output: only the cold path sees (and can cut) the bytes.
    pub(crate) output_cap: Option<u64>,
    /// Who the run's egress proxy asks about escalate connections: the terminal, when there
    /// is one (and the profile has escalate rules); none: they are denied "needs approval".
    pub(crate) approver: Option<Arc<dyn Approver>>,
    /// How long the approver's answer is waited for.
    pub(crate) approval_timeout: Duration,
    /// `--credential`: the vault the run's proxy injects from (TLS to its hosts
    /// intercepted), and `--egress-upstream-ca`; also (with an empty vault) when the profile
    /// has HTTP rules, whose hosts' TLS is intercepted.
    pub(crate) credentials: Option<(agentrun_egress::Vault, Vec<PathBuf>)>,
    /// `--volume`: the named volumes the run mounts, held (not removable) until it ends.
    pub(crate) _volumes: Vec<VolumeLease>,
}

/// `agentrun exec --isolation`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isolation {
    /// A sandbox: namespaces, overlay rootfs, Landlock, seccomp, limits.
    Namespaces,
    /// Landlock + seccomp + rlimits only, no namespaces.
    LandlockOnly,
}

/// Exit code of a run the policy refused before anything ran (DESIGN.md).
pub(crate) const EXIT_DENIED: i32 = 126;

/// Why a run did not start.
pub(crate) enum PlanError {
    /// Bad input (exit 125).
    Invalid(anyhow::Error),
    /// The policy denied part of the request (exit 126); every decision is recorded.
    Denied(String),
}

impl From<anyhow::Error> for PlanError {
    fn from(e: anyhow::Error) -> Self {
        PlanError::Invalid(e)
    }
}

/// The command an image runs when none is given: its Entrypoint + Cmd.
pub(crate) fn default_command(image: &str, paths: &Paths) -> anyhow::Result<Vec<String>> {
    let missing = || {
        anyhow::anyhow!(
            "no command given, and image {image:?} has no Entrypoint or Cmd \
             (usage: agentrun exec [OPTIONS] -- CMD [ARGS...])"
        )
    };
    if image == agentrun_image::HOST_IMAGE {
        return Err(missing());
    }
    let cmd = ImageStore::open(&paths.root)?
        .resolve(image)?
        .config
        .default_command();
    if cmd.is_empty() {
        return Err(missing());
    }
    Ok(cmd)
}

impl Plan {
    /// Parses and checks everything before any sandbox exists, so bad input costs nothing.
    /// Every policy decision on the request is recorded with `recorder`; `traceparent` (the
    /// run's span) is handed to the command.
    pub(crate) fn new(
        mut args: ExecArgs,
        traceparent: &str,
        recorder: &Recorder,
        root: &Path,
    ) -> Result<Plan, PlanError> {
        let mut creds =
            crate::credential::parse_all(&args.egress.credential, &mut args.egress.allow_host)?;
        let overrides = ResourceOverrides {
            memory_bytes: args
                .memory
                .as_deref()
                .map(parse_bytes)
                .transpose()
                .context("--memory")?,
            pids: args.pids,
            cpus: args.cpus,
            tmpfs_bytes: args
                .tmpfs_size
                .as_deref()
                .map(parse_bytes)
                .transpose()
                .context("--tmpfs-size")?,
            timeout_ms: args
                .timeout
                .as_deref()
                .map(parse_duration)
                .transpose()
                .context("--timeout")?
                .map(|d| d.as_millis() as u64),
        };
        let approval_timeout = args
            .approval_timeout
            .as_deref()
            .map(parse_duration)
            .transpose()
            .context("--approval-timeout")?
            .unwrap_or(DEFAULT_APPROVAL_TIMEOUT);
        let mut profile = Profile::load(&args.profile)
            .map_err(anyhow::Error::from)?
            .with_overrides(&overrides)
            .map_err(|(field, why)| {
                let flag = field.trim_start_matches("resources.").replace('_', "-");
                anyhow::anyhow!("--{flag}: {why}")
            })?;
        profile
            .network
            .allow_hosts("cli.allow_host", &args.egress.allow_host)
            .map_err(|why| anyhow::anyhow!("--allow-host: {why}"))?;
        recorder.set_profile(&profile.name);
        // The profile's credentials: their values read here, from this process's environment
        // or files, like --credential's.
        creds.extend(crate::credential::from_profile(&profile)?);
        let mut credentials = if creds.is_empty() {
            None
        } else {
            Some((
                crate::credential::vault(creds)?,
                args.egress.egress_upstream_ca.clone(),
            ))
        };
        // HTTP rules are decided per request: the proxy intercepts TLS to their hosts.
        if credentials.is_none() && !profile.network.http.is_empty() {
            credentials = Some((
                agentrun_egress::Vault::new(),
                args.egress.egress_upstream_ca.clone(),
            ));
        }
        // A profile file is passed on by absolute path (the daemon has another working directory).
        let profile_arg = if Profile::is_file_name(&args.profile) {
            std::fs::canonicalize(&args.profile)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or(args.profile.clone())
        } else {
            args.profile.clone()
        };

        let workspace = match &args.workspace {
            Some(dir) => Some(check_dir(dir, true, "--workspace")?),
            None => None,
        };
        let mut mounts = Vec::new();
        for (spec, writable) in args
            .ro
            .iter()
            .map(|s| (s, false))
            .chain(args.rw.iter().map(|s| (s, true)))
        {
            let flag = if writable { "--rw" } else { "--ro" };
            let (host, target) = match spec.split_once(':') {
                Some((h, t)) => (PathBuf::from(h), PathBuf::from(t)),
                None => (PathBuf::from(spec), PathBuf::from(spec)),
            };
            let source = check_path(&host, writable, flag)?;
            if !target.is_absolute() {
                return Err(
                    anyhow::anyhow!("{flag} {spec}: the sandbox path must be absolute").into(),
                );
            }
            mounts.push(UserMount {
                source,
                target,
                writable,
            });
        }
        let volume_specs = args
            .volume
            .iter()
            .map(|spec| parse_volume(spec).map(|(n, t, w)| (spec, n, t, w)))
            .collect::<anyhow::Result<Vec<_>>>()?;

        let mut env: Vec<(String, String)> = Vec::new();
        for file in &args.env_file {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("--env-file {}", file.display()))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let kv = parse_env(line)
                    .with_context(|| format!("--env-file {}:{}", file.display(), n + 1))?;
                env.push(kv);
            }
        }
        for e in &args.env {
            env.push(parse_env(e).context("-e")?);
        }

        // Every part of the request the profile rules on is decided (and recorded) here, before
        // any sandbox exists; the first denial refuses the run.
        let mut actions: Vec<Action> = env.iter().map(|(k, _)| Action::SetEnv(k.clone())).collect();
        if workspace.is_some() {
            actions.push(Action::Mount {
                target: WORKSPACE.into(),
                writable: profile.filesystem.workspace_writable,
            });
        }
        actions.extend(mounts.iter().map(|m| Action::Mount {
            target: m.target.clone(),
            writable: m.writable,
        }));
        actions.extend(volume_specs.iter().map(|(_, _, t, w)| Action::Mount {
            target: t.clone(),
            writable: *w,
        }));
        let mut denied = None;
        for a in &actions {
            let d = profile.check(a);
            recorder.decision(a, &d);
            if !d.allow && denied.is_none() {
                denied = Some(format!(
                    "{} {} (rule {}: {})",
                    a.name(),
                    a.resource(),
                    d.rule_id,
                    d.reason
                ));
            }
        }
        if let Some(msg) = denied {
            return Err(PlanError::Denied(msg));
        }
        // Named volumes, allowed: leased now (the lease makes one that is missing) and held
        // until the run ends, mounted by their data directory's path like --rw/--ro (the
        // warm path's daemon mounts them by path).
        let mut volumes = Vec::new();
        let store = VolumeStore::new(root);
        for (spec, name, target, writable) in volume_specs {
            let lease = store
                .lease_or_make(name, Some(Creator::Cli))
                .map_err(|e| anyhow::anyhow!("--volume {spec}: {e}"))?;
            let source = store
                .inspect(name)
                .map_err(|e| anyhow::anyhow!("--volume {spec}: {e}"))?
                .mountpoint;
            volumes.push(lease);
            mounts.push(UserMount {
                source,
                target,
                writable,
            });
        }

        // The sandboxed process continues this trace under the sandbox.exec span.
        env.push(("TRACEPARENT".into(), traceparent.to_owned()));
        // Credentials (and HTTP rules) are allowed with a proxy only (the profile's check and
        // --credential's allow-host): TLS is intercepted by the run's proxy.
        if profile.network.needs_proxy() {
            // A JAVA_TOOL_OPTIONS of the caller's (-e) is kept, ours not added (a JVM would
            // read only one of the two).
            let java_set = env.iter().any(|(k, _)| k == "JAVA_TOOL_OPTIONS");
            env.extend(
                agentrun_pool::egress_route::egress_env(credentials.is_some())
                    .into_iter()
                    .filter(|(k, _)| !(java_set && k == "JAVA_TOOL_OPTIONS")),
            );
        }

        // Escalate decisions are made by the run's egress proxy, which runs in this process on
        // both paths (cold and warm): the terminal is asked from here.
        let escalates = profile
            .network
            .rules
            .iter()
            .any(|r| r.action == RuleAction::Escalate);
        let approver = (escalates && !args.no_prompt)
            .then(|| crate::approve::TerminalApprover::open(approval_timeout))
            .flatten()
            .map(|a| Arc::new(a) as Arc<dyn Approver>);

        Ok(Plan {
            _volumes: volumes,
            approver,
            approval_timeout,
            credentials,
            timeout: profile.resources.timeout,
            memory_bytes: profile.resources.memory_bytes,
            network: profile.network.clone(),
            output_cap: profile.resources.output_cap,
            request: ExecRequest {
                recipe: SandboxRecipe {
                    image: args.image,
                    profile: profile_arg,
                    overrides,
                    workspace,
                    mounts,
                    allow_hosts: args.egress.allow_host,
                    // The proxy's port inside the sandbox, which HTTP(S)_PROXY point at.
                    egress_port: profile
                        .network
                        .needs_proxy()
                        .then_some(agentrun_egress::SANDBOX_PROXY_PORT),
                },
                args: args.command,
                env,
                cwd: args.cwd,
            },
        })
    }
}

/// `--volume NAME:SANDBOX[:ro]`: the name, the absolute sandbox path, and whether writable.
fn parse_volume(spec: &str) -> anyhow::Result<(&str, PathBuf, bool)> {
    let mut parts = spec.split(':');
    let (Some(name), Some(target)) = (parts.next(), parts.next()) else {
        bail!("--volume {spec}: expected NAME:SANDBOX[:ro]");
    };
    let writable = match parts.next() {
        None | Some("rw") => true,
        Some("ro") => false,
        Some(other) => bail!("--volume {spec}: {other:?} is neither ro nor rw"),
    };
    if parts.next().is_some() {
        bail!("--volume {spec}: expected NAME:SANDBOX[:ro]");
    }
    agentrun_runtime::volume::check_name(name).with_context(|| format!("--volume {spec}"))?;
    let target = PathBuf::from(target);
    if !target.is_absolute() {
        bail!("--volume {spec}: the sandbox path must be absolute");
    }
    Ok((name, target, writable))
}

fn parse_env(s: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = match s.split_once('=') {
        Some((k, v)) => (k.to_string(), v.to_string()),
        None => (
            s.to_string(),
            std::env::var(s).with_context(|| format!("{s} is not set on the host"))?,
        ),
    };
    validate_env_key(&k).map_err(anyhow::Error::msg)?;
    Ok((k, v))
}

fn check_path(p: &Path, writable: bool, flag: &str) -> anyhow::Result<PathBuf> {
    let abs = std::fs::canonicalize(p)
        .with_context(|| format!("{flag} {}: cannot access", p.display()))?;
    if writable {
        nix::unistd::access(&abs, nix::unistd::AccessFlags::W_OK)
            .with_context(|| format!("{flag} {}: not writable", p.display()))?;
    }
    Ok(abs)
}

pub fn check_dir(p: &Path, writable: bool, flag: &str) -> anyhow::Result<PathBuf> {
    let abs = check_path(p, writable, flag)?;
    if !abs.is_dir() {
        bail!("{flag} {}: not a directory", p.display());
    }
    Ok(abs)
}

#[cfg(test)]
mod volume_spec_tests {
    use super::parse_volume;
    use std::path::Path;

    #[test]
    fn volume_specs_name_a_volume_and_an_absolute_path() {
        let (n, t, w) = parse_volume("data:/data").unwrap();
        assert_eq!((n, t.as_path(), w), ("data", Path::new("/data"), true));
        assert!(!parse_volume("data:/d:ro").unwrap().2);
        assert!(parse_volume("data:/d:rw").unwrap().2);
        for bad in [
            "data",
            "data:rel",
            "Bad_Name:/x",
            "d:/x:rx",
            "d:/x:ro:more",
            ":/x",
        ] {
            let e = parse_volume(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--volume {bad}")), "{bad}: {e}");
        }
    }
}
