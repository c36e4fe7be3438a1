//! `agentrun exec -- CMD`: the plan of a run (everything checked and decided before any
//! sandbox exists), then the warm path (the daemon's pooled shells, [`crate::warm`]) or the
//! cold path: one shell built in this process, one cell run in it (the same cell a pooled
//! shell makes), the shell torn down.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use std::sync::Arc;

use agentrun_egress::{DecisionSink, FailureSink, Proxy};
use agentrun_image::ImageStore;
use agentrun_policy::{
    format_bytes, parse_bytes, parse_duration, validate_env_key, Action, Decision, NetworkPolicy,
    Profile, ResourceOverrides, WORKSPACE,
};
use agentrun_pool::client::DaemonClient;
use agentrun_pool::recipe::{ExecRequest, SandboxRecipe};
use agentrun_pool::PoolError;
use agentrun_runtime::cellrun::{cell_request, MappingCache, RunMounts};
use agentrun_runtime::control::{CellCommand, CellWork};
use agentrun_runtime::kaudit;
use agentrun_runtime::rootfs::UserMount;
use agentrun_runtime::{Enforcement, HostInfo, RunOutcome, RuntimePaths, Sandbox, SandboxStdio};
use agentrun_telemetry::{AttrValue, AuditLog, RunSpan};
use anyhow::{bail, Context};
use clap::Args;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::trace::Recorder;
use crate::{one_line, Paths, EXIT_AGENTRUN_ERROR};

/// The longest command line recorded on a span.
const SPAN_COMMAND_MAX: usize = 256;

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Image to run (`host`: the host's programs read-only, no download).
    #[arg(long, default_value = "host")]
    image: String,
    /// Profile: a built-in name (default, strict, code-interpreter) or a TOML file.
    #[arg(long, default_value = "default")]
    profile: String,
    /// Allow connections to HOST[:PORT] (or *.DOMAIN[:PORT]) through the egress proxy, on top
    /// of the profile's rules (repeatable). Turns on the proxy for a profile without network.
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    allow_host: Vec<String>,
    /// Host directory mounted read-write at /workspace (the default working directory).
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Extra read-only mount, HOST[:SANDBOX] (repeatable).
    #[arg(long = "ro", value_name = "HOST[:SANDBOX]")]
    ro: Vec<String>,
    /// Extra read-write mount, HOST[:SANDBOX] (repeatable).
    #[arg(long = "rw", value_name = "HOST[:SANDBOX]")]
    rw: Vec<String>,
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
    keep_bundle: bool,
    /// The command and its arguments (default: the image's Entrypoint + Cmd).
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Everything exec needs, validated.
pub(crate) struct Plan {
    pub(crate) request: ExecRequest,
    pub(crate) timeout: Option<Duration>,
    pub(crate) memory_bytes: u64,
    /// The effective network policy (profile + `--allow-host`).
    pub(crate) network: NetworkPolicy,
    /// The profile caps output: only the cold path sees (and can cut) the bytes.
    pub(crate) output_cap: Option<u64>,
}

/// Exit code of a run the policy refused before anything ran (DESIGN.md).
const EXIT_DENIED: i32 = 126;

/// Why a run did not start.
enum PlanError {
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
    let mut span = RunSpan::start("sandbox.exec", std::env::var("TRACEPARENT").ok().as_deref());
    span.set_attribute("openinference.span.kind", "TOOL");
    span.set_attribute("sandbox.pool_hit", false);
    span.set_attribute("container.image.name", args.image.clone());
    span.set_attribute("sandbox.profile", args.profile.clone());
    record_command(&mut span, &args.command);
    let recorder = Recorder::new(&span, AuditLog::new(paths.audit_dir()), &args.profile);
    let command_line = truncate(&args.command.join(" "));
    let keep_bundle = args.keep_bundle;
    let code = match plan(args, &span, &recorder) {
        Ok(plan) => execute(plan, paths, keep_bundle, &mut span, &recorder),
        Err(PlanError::Invalid(e)) => fail(&mut span, "invalid_input", &e),
        Err(PlanError::Denied(msg)) => {
            eprintln!("agentrun: denied by policy: {msg}");
            span.set_attribute("sandbox.blocked", true);
            span.set_error("policy_denied", &msg);
            EXIT_DENIED
        }
    };
    if let Some(AttrValue::String(id)) = span.attribute("sandbox.id").cloned() {
        let _ = recorder.set_sandbox(&id);
    }
    let outcome = match code {
        EXIT_DENIED if span.attribute("sandbox.blocked").is_some() => "denied",
        125 => "error",
        _ => "ran",
    };
    if let Err(e) = recorder.run(&command_line, code, outcome) {
        eprintln!("agentrun: {e}");
    }
    let (children, decisions, denials) = recorder.take();
    span.set_attribute("sandbox.policy_decisions", decisions);
    span.set_attribute("sandbox.violation_count", denials);
    span.set_attribute("process.exit.code", i64::from(code));
    if denials > 0 {
        let mut attrs = vec![("sandbox.profile", recorder.profile())];
        if let Some(AttrValue::String(id)) = span.attribute("sandbox.id") {
            attrs.push(("sandbox.id", id.clone()));
        }
        agentrun_telemetry::metrics::export_violation_count(denials, span.start_time(), &attrs);
    }
    span.finish_with(children);
    ExitCode::from(code as u8)
}

/// The command an image runs when none is given: its Entrypoint + Cmd.
fn default_command(image: &str, paths: &Paths) -> anyhow::Result<Vec<String>> {
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

fn truncate(line: &str) -> String {
    let mut line = line.to_string();
    if line.len() > SPAN_COMMAND_MAX {
        let mut cut = SPAN_COMMAND_MAX;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    line
}

pub(crate) fn fail(span: &mut RunSpan, kind: &str, e: &anyhow::Error) -> i32 {
    let msg = one_line(&format!("{e:#}"));
    eprintln!("agentrun: {msg}");
    span.set_error(kind, &msg);
    i32::from(EXIT_AGENTRUN_ERROR)
}

fn record_command(span: &mut RunSpan, command: &[String]) {
    let Some(first) = command.first() else { return };
    let exe = Path::new(first)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| first.clone());
    span.set_attribute("process.executable.name", exe);
    span.set_attribute("process.command_line", truncate(&command.join(" ")));
}

/// Parses and checks everything before any sandbox exists, so bad input costs nothing.
fn plan(args: ExecArgs, span: &RunSpan, recorder: &Recorder) -> Result<Plan, PlanError> {
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
    let mut profile = Profile::load(&args.profile)
        .map_err(anyhow::Error::from)?
        .with_overrides(&overrides)
        .map_err(|(field, why)| {
            let flag = field.trim_start_matches("resources.").replace('_', "-");
            anyhow::anyhow!("--{flag}: {why}")
        })?;
    profile
        .network
        .allow_hosts("cli.allow_host", &args.allow_host)
        .map_err(|why| anyhow::anyhow!("--allow-host: {why}"))?;
    recorder.set_profile(&profile.name);
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
            return Err(anyhow::anyhow!("{flag} {spec}: the sandbox path must be absolute").into());
        }
        mounts.push(UserMount {
            source,
            target,
            writable,
        });
    }

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

    // The sandboxed process continues this trace under the sandbox.exec span.
    env.push(("TRACEPARENT".into(), span.traceparent()));
    if profile.network.needs_proxy() {
        env.extend(agentrun_egress::proxy_env());
    }

    Ok(Plan {
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
                allow_hosts: args.allow_host,
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

fn check_dir(p: &Path, writable: bool, flag: &str) -> anyhow::Result<PathBuf> {
    let abs = check_path(p, writable, flag)?;
    if !abs.is_dir() {
        bail!("{flag} {}: not a directory", p.display());
    }
    Ok(abs)
}

fn execute(
    plan: Plan,
    paths: &Paths,
    keep_bundle: bool,
    span: &mut RunSpan,
    recorder: &Recorder,
) -> i32 {
    let socket = paths.socket();
    let no_daemon = std::env::var("AGENTRUN_NO_DAEMON").is_ok_and(|v| v == "1");
    // Every run shape goes to the daemon when it answers; only a kept bundle (a shell's
    // config.json made for this run) needs this process to build the shell.
    if keep_bundle {
        span.set_attribute("sandbox.cold_reason", "keep_bundle");
    }
    if !no_daemon && !keep_bundle {
        if let Some(client) = DaemonClient::connect(&socket) {
            return crate::warm::execute(&client, &plan, span, recorder);
        }
    }
    execute_cold(plan, paths, keep_bundle, span, recorder)
}

/// The cold path: one shell built in this process, one cell run in it, the shell destroyed.
fn execute_cold(
    plan: Plan,
    paths: &Paths,
    keep_bundle: bool,
    span: &mut RunSpan,
    recorder: &Recorder,
) -> i32 {
    let store = match ImageStore::open(&paths.root) {
        Ok(s) => s,
        Err(e) => return fail(span, "image", &e.into()),
    };
    let req = &plan.request;
    let (config, profile) = match req
        .recipe
        .to_config(&store)
        .and_then(|c| Ok((c, req.recipe.profile()?)))
    {
        Ok(c) => c,
        Err(e) => {
            let kind = match &e {
                PoolError::Image(agentrun_image::ImageError::NotFound(_)) => "image_not_found",
                _ => "invalid_input",
            };
            return fail(span, kind, &e.into());
        }
    };
    let runtime_paths = RuntimePaths::new(&paths.state_dir);
    // Clean up after runs that were killed; cheap when there is nothing to do.
    let _ = agentrun_runtime::gc::collect_before_run(&runtime_paths);
    let host = HostInfo::probe();

    let signals = block_signals();
    let stdin = match stdin_fd() {
        Ok(fd) => fd,
        Err(e) => return fail(span, "io", &e),
    };
    let mut sandbox = match Sandbox::create(&config, &runtime_paths, &host, SandboxStdio::Shell)
        .and_then(|mut s| s.start().map(|()| s))
    {
        Ok(s) => s,
        Err(e) => {
            let kind = e.kind();
            return fail(
                span,
                kind,
                &anyhow::Error::new(e).context("creating sandbox"),
            );
        }
    };
    span.set_attribute("sandbox.id", sandbox.id().to_string());
    span.set_attribute("container.id", sandbox.id().to_string());
    // The run's mounts, made here (forks for the id mappings: before any thread starts).
    let user_mounts = req.recipe.user_mounts();
    let mounts = match RunMounts::prepare(&user_mounts, &mut MappingCache::new()) {
        Ok(m) => m,
        Err(e) => {
            let _ = sandbox.destroy();
            let kind = e.kind();
            return fail(
                span,
                kind,
                &anyhow::Error::new(e).context("creating sandbox"),
            );
        }
    };
    let mut enforcement = sandbox.enforcement().clone();
    enforcement.idmapped_mounts &= mounts.idmapped;
    record_enforcement(span, &enforcement);
    // Nothing runs unless the decisions so far are on disk.
    if let Err(e) = recorder.set_sandbox(sandbox.id()) {
        let _ = sandbox.destroy();
        return fail(span, "audit", &e.into());
    }
    // The shell exists (created single-threaded): the proxy's threads may start now.
    let proxy = if plan.network.needs_proxy() {
        match start_proxy(&sandbox.egress_socket(), &plan, recorder) {
            Ok(p) => Some(p),
            Err(e) => {
                let _ = sandbox.destroy();
                return fail(span, "egress", &e);
            }
        }
    } else {
        None
    };
    if keep_bundle {
        match sandbox.keep_bundle() {
            Ok(dir) => eprintln!("agentrun: bundle kept at {}", dir.display()),
            Err(e) => eprintln!("agentrun: could not keep the bundle: {e}"),
        }
    }
    let cell_req = cell_request(
        &profile,
        host.landlock_abi,
        &user_mounts,
        &mounts,
        req.recipe.egress_port,
        CellWork::Run(CellCommand {
            argv: req.args.clone(),
            env: req.environment(&profile, &sandbox.image_config().env_pairs()),
            cwd: req.working_dir(sandbox.image_config()),
        }),
    );
    let watch = landlock_watch(landlock_subscribe(host.landlock_abi), span);
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let result = sandbox.run_cell(
        &cell_req,
        mounts,
        stdin,
        &mut stdout.lock(),
        &mut stderr.lock(),
        plan.timeout,
        signals.as_ref(),
    );
    if let Some(p) = proxy {
        p.stop();
    }
    if let (Some(w), Ok(o)) = (watch, &result) {
        record_kernel_denials(w.finish(o.init_pid), &plan, recorder, span);
    }
    let destroyed = sandbox.destroy();
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            return fail(
                span,
                e.kind(),
                &anyhow::Error::new(e).context("running sandbox"),
            )
        }
    };
    if let Err(e) = destroyed {
        eprintln!("agentrun: warning: cleanup incomplete ({e}); `agentrun gc` will retry");
    }
    report(&outcome, &plan, span, true);
    if outcome.output_truncated {
        eprintln!("agentrun: output over the profile's output cap was dropped");
        span.set_attribute("sandbox.output_truncated", true);
    }
    outcome.exit_code
}

/// Starts the run's egress proxy on `socket` with the run's network rules; its decisions are
/// the run's (`policy.check` spans under its `sandbox.exec`, audit records).
pub(crate) fn start_proxy(
    socket: &Path,
    plan: &Plan,
    recorder: &Recorder,
) -> anyhow::Result<Proxy> {
    let listener = agentrun_egress::bind(socket)?;
    let (r, r2) = (recorder.clone(), recorder.clone());
    let sink: DecisionSink = Arc::new(move |a, d| r.decision_by(a, d, "egress-proxy", None));
    let failures: FailureSink = Arc::new(move |a, d, f| r2.failure(a, d, f));
    Ok(Proxy::builder(plan.network.clone(), sink)
        .failures(failures)
        .start(listener, socket))
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
    span: &mut RunSpan,
) -> Option<kaudit::LandlockWatch> {
    let watch = match subscription {
        Some(s) if kaudit::audit_enabled().unwrap_or(false) => s.watch().ok(),
        _ => None,
    };
    span.set_attribute("sandbox.enforce.landlock_audit", watch.is_some());
    watch
}

/// Records what the kernel (Landlock) denied during the run, each decided again by the
/// profile so that it carries the profile's rule id.
pub(crate) fn record_kernel_denials(
    denials: Vec<kaudit::LandlockDenial>,
    plan: &Plan,
    recorder: &Recorder,
    span: &mut RunSpan,
) {
    let profile = plan.request.recipe.profile().ok();
    let profile = profile.as_ref();
    span.set_attribute("sandbox.kernel_denials", denials.len());
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
            Some(d) if !d.allow => {
                Decision::deny(d.rule_id, format!("kernel denied {blockers}: {}", d.reason))
            }
            _ => Decision::deny("landlock", format!("kernel denied {blockers} (Landlock)")),
        };
        let time = chrono::DateTime::from_timestamp_millis((k.time * 1000.0) as i64)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        recorder.decision_by(&action, &decision, "landlock", time);
    }
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

/// The command's stdin: ours, duplicated (or /dev/null when we have none).
fn stdin_fd() -> anyhow::Result<OwnedFd> {
    use std::os::fd::AsFd;
    match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => Ok(fd),
        Err(_) => Ok(std::fs::File::open("/dev/null")?.into()),
    }
}

pub(crate) fn record_enforcement(span: &mut RunSpan, e: &Enforcement) {
    span.set_attribute("sandbox.enforce.landlock", e.landlock.clone());
    span.set_attribute("sandbox.enforce.landlock_abi", i64::from(e.landlock_abi));
    span.set_attribute("sandbox.enforce.seccomp", e.seccomp);
    span.set_attribute("sandbox.enforce.user_namespace", e.user_namespace);
    span.set_attribute("sandbox.enforce.idmapped_mounts", e.idmapped_mounts);
    span.set_attribute("sandbox.enforce.cgroup", e.cgroup.clone());
    span.set_attribute("sandbox.enforce.no_swap", e.swap_limited);
    span.set_attribute("sandbox.enforce.loopback", e.loopback);
}

/// Tells the user why a run ended when agentrun ended it, and records the outcome on the span.
/// `output_counted`: the bytes went through agentrun (cold path), so the counts are real.
pub(crate) fn report(o: &RunOutcome, plan: &Plan, span: &mut RunSpan, output_counted: bool) {
    let mut err = std::io::stderr().lock();
    if o.timed_out {
        let t = plan.timeout.unwrap_or_default();
        let _ = writeln!(err, "agentrun: timed out after {}", human_duration(t));
        span.set_error("timeout", "timed out");
    } else if o.oom_killed && o.exit_code == 137 {
        let _ = writeln!(
            err,
            "agentrun: out of memory (limit {})",
            format_bytes(plan.memory_bytes)
        );
        span.set_error("oom", "out of memory");
    } else if let Some(e) = &o.error {
        // The cell said why on the command's stderr already.
        span.set_error("sandbox_setup", e);
    } else if let Some(sig) = o.signal {
        span.set_attribute("process.signal", i64::from(sig));
    }
    span.set_attribute("process.pid", i64::from(o.init_pid));
    span.set_attribute("sandbox.timed_out", o.timed_out);
    span.set_attribute("sandbox.oom_killed", o.oom_killed);
    span.set_attribute("sandbox.duration_ms", o.run_duration.as_millis() as i64);
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
