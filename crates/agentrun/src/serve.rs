//! `agentrun serve`, `agentrun ps`, `agentrun pool status`.

use std::path::PathBuf;
use std::time::Duration;

use agentrun_pool::client::DaemonClient;
use agentrun_pool::daemon::{self, DaemonOptions};
use agentrun_pool::pool::{PoolLimits, PoolSpec};
use agentrun_pool::protocol::{ClientMessage, DaemonReply};
use agentrun_pool::recipe::{DEFAULT_IMAGE, DEFAULT_PROFILE};
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde::Deserialize;

use crate::Paths;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Ready sandboxes kept per pool (default 4).
    #[arg(long, value_name = "N")]
    pool_size: Option<usize>,
    /// A pool to keep: IMAGE[:PROFILE][=N] (repeatable; default: host:default).
    #[arg(long = "pool", value_name = "IMAGE[:PROFILE][=N]")]
    pools: Vec<String>,
    /// Most sandboxes that may exist at once (ready + running).
    #[arg(long, value_name = "N")]
    max_sandboxes: Option<usize>,
    /// How long SIGTERM waits for running commands before killing them.
    #[arg(long, value_name = "DURATION")]
    drain: Option<String>,
    /// A shell that served this many runs is discarded after the last (default 500).
    #[arg(long, value_name = "N")]
    shell_max_runs: Option<u64>,
    /// A shell older than this is discarded after its run or when idle (default 5m).
    #[arg(long, value_name = "DURATION")]
    shell_max_age: Option<String>,
    /// Shell factory processes (shells are created in parallel on them); default: CPUs.
    #[arg(long, value_name = "N")]
    factories: Option<usize>,
    /// Also serve the OpenSandbox API (lifecycle under /v1, execd per sandbox) on ADDR,
    /// e.g. 127.0.0.1:8080.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Also serve the E2B API on ADDR (control plane, envd and the code interpreter on one
    /// listener), e.g. 127.0.0.1:3000, for the `e2b` SDKs with E2B_API_URL=http://ADDR and
    /// E2B_SANDBOX_URL=http://ADDR; its X-API-Key is the API key.
    #[arg(long, value_name = "ADDR")]
    e2b: Option<std::net::SocketAddr>,
    /// API key every HTTP listener requires (OpenSandbox API and dashboard:
    /// OPEN-SANDBOX-API-KEY; E2B API: X-API-Key; MCP and metrics: `Authorization: Bearer KEY`). None given: the
    /// key of <state dir>/api-key, made on first start (`agentrun api-key` prints it).
    #[arg(
        long,
        value_name = "KEY",
        env = "AGENTRUN_API_KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// Serve the HTTP listeners with NO API KEY, on loopback too: anyone who reaches them
    /// (every local user, on loopback) can run code in every sandbox and read every
    /// sandbox's execd token.
    #[arg(long)]
    insecure_no_auth: bool,
    /// Also answer requests whose Host is NAME (repeatable; besides localhost, loopback
    /// addresses and the listen address), e.g. the name a reverse proxy serves agentrun at;
    /// `*`: any Host (no DNS-rebinding guard). Browsers from https://NAME may also POST.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Largest JSON request body either API reads (413 above it); default 4M.
    #[arg(long, value_name = "SIZE")]
    max_request_body: Option<String>,
    /// Largest upload (OpenSandbox /files/upload, Docker put_archive and build context),
    /// streamed to disk (413 above it); default 1G.
    #[arg(long, value_name = "SIZE")]
    max_upload: Option<String>,
    /// Most bytes of changed files a snapshot (OpenSandbox snapshot, Docker commit) may
    /// hold: a bigger one is refused (400, with its size); default 4G.
    #[arg(long, value_name = "SIZE")]
    max_snapshot: Option<String>,
    /// TOML file with `pool_size`, `pools`, `max_sandboxes`, `drain`, `factories`, `listen`, `e2b`,
    /// `api_key`, `insecure_no_auth`, `allowed_hosts` (a list), `max_request_body`, `max_upload`,
    /// `max_snapshot`, `docker_socket`,
    /// `shell_max_runs`, `shell_max_age`, `opensandbox_profile`, `docker_profile`,
    /// `volume_roots` (a list), `egress_upstream_ca` (a list), `metrics`, and an
    /// `[image_limits]` table (`max_bytes`,
    /// `max_entries`, `max_ratio`, `max_depth`: what the Docker API's pulls and builds may
    /// unpack; the `AGENTRUN_IMAGE_MAX_*` variables win) (flags win).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Also serve the Docker Engine API subset on this unix socket (mode 0600), for
    /// docker-py / docker CLI with DOCKER_HOST=unix://PATH.
    #[arg(long, value_name = "PATH")]
    docker_socket: Option<PathBuf>,
    /// The profile OpenSandbox sandboxes run under (built-in name or file; default
    /// `default`). One with `[python] zygote` forks their code contexts and `python3`
    /// commands from a preloaded interpreter.
    #[arg(long, value_name = "PROFILE")]
    opensandbox_profile: Option<String>,
    /// The profile Docker API containers run under (default `container`).
    #[arg(long, value_name = "PROFILE")]
    docker_profile: Option<String>,
    /// A host directory OpenSandbox `host` volumes may come from (repeatable; none: host
    /// volumes are refused with 400). Paths are resolved inside it, never leaving it.
    #[arg(long = "volume-root", value_name = "DIR")]
    volume_roots: Vec<PathBuf>,
    /// A PEM bundle of root certificates the egress proxy also trusts for upstream servers
    /// when it intercepts TLS for the credential vault (repeatable; the system's roots are
    /// always trusted), e.g. an internal CA.
    #[arg(long = "egress-upstream-ca", value_name = "FILE")]
    egress_upstream_ca: Vec<PathBuf>,
    /// Also serve MCP over Streamable HTTP at http://ADDR/mcp (one sandbox per MCP session;
    /// the API key, when set, as `Authorization: Bearer KEY`).
    #[arg(long, value_name = "ADDR")]
    mcp: Option<std::net::SocketAddr>,
    /// Image of the MCP sessions' sandboxes (default host).
    #[arg(long, value_name = "IMAGE")]
    mcp_image: Option<String>,
    /// Profile of the MCP sessions' sandboxes (default `default`).
    #[arg(long, value_name = "NAME|FILE")]
    mcp_profile: Option<String>,
    /// Host directory mounted at /workspace in every MCP session's sandbox.
    #[arg(long, value_name = "DIR")]
    mcp_workspace: Option<PathBuf>,
    /// Also allow HOST[:PORT] in MCP sessions' sandboxes (repeatable).
    #[arg(long = "mcp-allow-host", value_name = "HOST[:PORT]")]
    mcp_allow_host: Vec<String>,
    /// A credential the MCP sessions' egress proxies add to requests to one host, as for
    /// `agentrun exec --credential` (repeatable; its host is allowed; the value is read from
    /// this daemon's environment or a file, never given to a sandbox).
    #[arg(long = "mcp-credential", value_name = "SPEC")]
    mcp_credential: Vec<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464 (a listener of
    /// its own: scrapers need no OpenSandbox key; the API key, when set, is required as
    /// `Authorization: Bearer KEY`; beyond loopback only with a key or --insecure-no-auth).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

/// `agentrun serve --config FILE`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ServeConfig {
    pool_size: Option<usize>,
    pools: Option<Vec<String>>,
    max_sandboxes: Option<usize>,
    drain: Option<String>,
    factories: Option<usize>,
    docker_socket: Option<PathBuf>,
    listen: Option<std::net::SocketAddr>,
    e2b: Option<std::net::SocketAddr>,
    api_key: Option<String>,
    shell_max_runs: Option<u64>,
    shell_max_age: Option<String>,
    insecure_no_auth: Option<bool>,
    allowed_hosts: Option<Vec<String>>,
    max_request_body: Option<String>,
    max_upload: Option<String>,
    max_snapshot: Option<String>,
    image_limits: Option<crate::image::LimitConfig>,
    opensandbox_profile: Option<String>,
    docker_profile: Option<String>,
    volume_roots: Option<Vec<PathBuf>>,
    egress_upstream_ca: Option<Vec<PathBuf>>,
    mcp: Option<std::net::SocketAddr>,
    mcp_image: Option<String>,
    mcp_profile: Option<String>,
    mcp_workspace: Option<PathBuf>,
    mcp_allow_host: Option<Vec<String>>,
    mcp_credential: Option<Vec<String>>,
    metrics: Option<std::net::SocketAddr>,
}

const DEFAULT_POOL_SIZE: usize = 4;
const DEFAULT_MAX_SANDBOXES: usize = 64;
const DEFAULT_DRAIN: Duration = Duration::from_secs(10);

pub fn serve(args: ServeArgs, paths: &Paths) -> anyhow::Result<()> {
    let file: ServeConfig = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--config {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("--config {}", path.display()))?
        }
        None => ServeConfig::default(),
    };
    let target = args
        .pool_size
        .or(file.pool_size)
        .unwrap_or(DEFAULT_POOL_SIZE);
    let max = args
        .max_sandboxes
        .or(file.max_sandboxes)
        .unwrap_or(DEFAULT_MAX_SANDBOXES);
    let specs: Vec<String> = if !args.pools.is_empty() {
        args.pools.clone()
    } else {
        file.pools
            .clone()
            .unwrap_or_else(|| vec![format!("{DEFAULT_IMAGE}:{DEFAULT_PROFILE}")])
    };
    let pools = specs
        .iter()
        .map(|s| PoolSpec::parse(s, target))
        .collect::<Result<Vec<_>, _>>()?;
    // A pool of an image or profile that does not exist would only ever fail: say so now.
    let store = agentrun_image::ImageStore::open(&paths.root)?;
    for p in &pools {
        store
            .resolve(&p.image)
            .with_context(|| format!("--pool {}", p.image))?;
        agentrun_policy::Profile::load(&p.profile)
            .with_context(|| format!("--pool {}:{}", p.image, p.profile))?;
    }
    let image_limits = crate::image::LimitArgs::default().resolve(file.image_limits.as_ref())?;
    let kept: usize = pools.iter().map(|p| p.target).sum();
    if max == 0 || kept > max {
        bail!("the pools keep {kept} sandboxes ready: --max-sandboxes ({max}) must be at least that, and > 0");
    }
    let drain = match args.drain.as_deref().or(file.drain.as_deref()) {
        Some(d) => agentrun_policy::parse_duration(d).context("--drain")?,
        None => DEFAULT_DRAIN,
    };
    let mut limits = PoolLimits::new(pools, max);
    if let Some(n) = args.shell_max_runs.or(file.shell_max_runs) {
        if n == 0 {
            bail!("--shell-max-runs must be at least 1");
        }
        limits.shell_max_runs = n;
    }
    if let Some(d) = args
        .shell_max_age
        .as_deref()
        .or(file.shell_max_age.as_deref())
    {
        limits.shell_max_age = agentrun_policy::parse_duration(d).context("--shell-max-age")?;
    }
    let opts = DaemonOptions {
        socket: paths.socket(),
        root: paths.root.clone(),
        state_dir: paths.state_dir.clone(),
        limits,
        drain,
        factories: args
            .factories
            .or(file.factories)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .clamp(1, 64),
    };
    let size = |flag: &str, arg: &Option<String>, key: &Option<String>, default: u64| match arg
        .as_deref()
        .or(key.as_deref())
    {
        Some(s) => agentrun_policy::parse_bytes(s).with_context(|| format!("--{flag}")),
        None => Ok(default),
    };
    let max_request_body = size(
        "max-request-body",
        &args.max_request_body,
        &file.max_request_body,
        agentrun_opensandbox::DEFAULT_MAX_REQUEST_BODY as u64,
    )?;
    let max_upload = size(
        "max-upload",
        &args.max_upload,
        &file.max_upload,
        agentrun_opensandbox::DEFAULT_MAX_UPLOAD,
    )?;
    let max_snapshot = size(
        "max-snapshot",
        &args.max_snapshot,
        &file.max_snapshot,
        agentrun_opensandbox::DEFAULT_MAX_SNAPSHOT,
    )?;
    let limits = agentrun_opensandbox::Limits {
        max_request_body: usize::try_from(max_request_body).unwrap_or(usize::MAX),
        max_upload,
        max_snapshot,
    };
    // What a daemon killed mid-snapshot (or mid-pull) left in the image store goes now: no
    // half snapshot is ever listed, nothing stays in its temp dir.
    match agentrun_image::ImageStore::open(&paths.root).map(|s| s.collect_interrupted()) {
        Ok(Ok(_)) => {}
        Ok(Err(e)) | Err(e) => eprintln!("agentrun: warning: cleaning the image store: {e}"),
    }
    let mut frontends: Vec<Box<dyn daemon::Frontend>> = Vec::new();
    let api_profile = |flag: Option<String>, file: Option<String>, default: &str, what: &str| {
        let name = flag.or(file).unwrap_or_else(|| default.to_string());
        agentrun_policy::Profile::load(&name)
            .with_context(|| format!("--{what}-profile {name}"))
            .map(|_| name)
    };
    let opensandbox_profile = api_profile(
        args.opensandbox_profile.clone(),
        file.opensandbox_profile.clone(),
        agentrun_pool::recipe::DEFAULT_PROFILE,
        "opensandbox",
    )?;
    let docker_profile = api_profile(
        args.docker_profile.clone(),
        file.docker_profile.clone(),
        agentrun_docker::containers::CONTAINER_PROFILE,
        "docker",
    )?;
    let upstream_roots = listed(&args.egress_upstream_ca, &file.egress_upstream_ca);
    let volume_roots = listed(&args.volume_roots, &file.volume_roots);
    let volume_roots = agentrun_runtime::volume::VolumeRoots::new(&volume_roots)
        .map_err(|e| anyhow::anyhow!("--volume-root: {e}"))?;
    for w in volume_roots.warnings() {
        eprintln!("agentrun: warning: {w}");
    }
    // The one API key of the HTTP front ends: given, else the state dir's key file (made
    // on first start); none only with --insecure-no-auth.
    let listen = args.listen.or(file.listen);
    let metrics = args.metrics.or(file.metrics);
    let mcp = args.mcp.or(file.mcp);
    let e2b = args.e2b.or(file.e2b);
    let insecure = args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false);
    let api_key = resolve_api_key(
        args.api_key.clone().or(file.api_key.clone()),
        insecure,
        [listen, metrics, mcp, e2b].iter().any(Option::is_some),
        paths,
    )?;
    let allowed_hosts = listed(&args.allowed_hosts, &file.allowed_hosts);
    let guard = |addr: std::net::SocketAddr| {
        agentrun_webguard::HostGuard::new(addr, &allowed_hosts).map_err(anyhow::Error::from)
    };
    // The options of an HTTP front end over sandboxes (the OpenSandbox API, the E2B API).
    let http_options =
        |listen: std::net::SocketAddr,
         guard: agentrun_webguard::HostGuard,
         volume_roots: agentrun_runtime::volume::VolumeRoots| {
            agentrun_opensandbox::OpenSandboxOptions {
                listen,
                api_key: api_key.clone(),
                guard,
                limits,
                image_root: paths.root.clone(),
                audit_dir: paths.audit_dir(),
                workers: std::thread::available_parallelism()
                    .map_or(2, |n| n.get())
                    .min(8),
                profile: opensandbox_profile.clone(),
                volume_roots,
                upstream_roots: upstream_roots.clone(),
            }
        };
    if let Some(listen) = listen {
        check_exposure(
            "--listen",
            "the OpenSandbox API",
            listen,
            api_key.is_some(),
            insecure,
        )?;
        frontends.push(Box::new(agentrun_opensandbox::OpenSandboxFrontend::new(
            http_options(listen, guard(listen)?, volume_roots.clone()),
        )));
    }
    if let Some(listen) = e2b {
        check_exposure("--e2b", "the E2B API", listen, api_key.is_some(), insecure)?;
        frontends.push(Box::new(
            agentrun_opensandbox::OpenSandboxFrontend::with_app(
                http_options(listen, guard(listen)?, volume_roots.clone()),
                "E2B API",
                agentrun_e2b::router,
            ),
        ));
    }
    if let Some(socket) = args.docker_socket.or(file.docker_socket) {
        frontends.push(Box::new(agentrun_docker::DockerFrontend {
            options: agentrun_docker::DockerApiOptions {
                socket,
                root: paths.root.clone(),
                state_dir: paths.state_dir.clone(),
                mode: 0o600,
                max_request_body,
                max_upload,
                max_snapshot,
                audit_dir: paths.audit_dir(),
                image_limits,
                profile: docker_profile,
            },
        }));
    }
    if let Some(listen) = metrics {
        check_exposure(
            "--metrics",
            "the Prometheus metrics",
            listen,
            api_key.is_some(),
            insecure,
        )?;
        frontends.push(Box::new(
            agentrun_opensandbox::prometheus::MetricsFrontend {
                listen,
                api_key: api_key.clone(),
                guard: guard(listen)?,
            },
        ));
    }
    if let Some(listen) = mcp {
        check_exposure(
            "--mcp",
            "the MCP server",
            listen,
            api_key.is_some(),
            insecure,
        )?;
        let image = args
            .mcp_image
            .clone()
            .or(file.mcp_image.clone())
            .unwrap_or_else(|| DEFAULT_IMAGE.to_string());
        store
            .resolve(&image)
            .with_context(|| format!("--mcp-image {image}"))?;
        let profile = api_profile(
            args.mcp_profile.clone(),
            file.mcp_profile.clone(),
            DEFAULT_PROFILE,
            "mcp",
        )?;
        let workspace = args
            .mcp_workspace
            .clone()
            .or(file.mcp_workspace.clone())
            .map(|w| crate::plan::check_dir(&w, true, "--mcp-workspace"))
            .transpose()?;
        let allow = listed(&args.mcp_allow_host, &file.mcp_allow_host);
        let mut allow = allow;
        let specs = listed(&args.mcp_credential, &file.mcp_credential);
        let creds = crate::credential::parse_all(&specs, &mut allow)
            .map_err(|e| anyhow::anyhow!("--mcp-credential: {e:#}"))?;
        let recipe = agentrun_pool::recipe::SandboxRecipe {
            image,
            profile,
            workspace,
            allow_hosts: allow,
            ..Default::default()
        };
        let options = agentrun_mcp::McpOptions::new(recipe, paths.audit_dir());
        let loaded = options
            .recipe
            .profile()
            .map_err(|e| anyhow::anyhow!("--mcp: {e}"))?;
        // Values are read now, from this daemon's environment or files; its MCP sessions'
        // proxies inject them (TLS to their hosts intercepted, a CA per sandbox).
        let vault = crate::credential::session_vault(creds, &loaded)?;
        let options = options.credentials(vault, upstream_roots.clone());
        frontends.push(Box::new(agentrun_mcp::HttpFrontend {
            options,
            listen,
            guard: guard(listen)?,
            api_key,
            workers: std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .min(8),
        }));
    }
    daemon::run(&opts, frontends)?;
    Ok(())
}

/// Whether an address is reachable from this host only.
fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// The API key of the HTTP front ends: `given` (flag, `AGENTRUN_API_KEY`, config; an empty
/// one counts as none), else, when there is an HTTP listener (`listening`), the key of
/// `<state dir>/api-key`, made on the first start ([`agentrun_webguard::keyfile`]). None
/// only with `--insecure-no-auth`, said loudly.
fn resolve_api_key(
    given: Option<String>,
    insecure: bool,
    listening: bool,
    paths: &Paths,
) -> anyhow::Result<Option<String>> {
    if let Some(k) = given.filter(|k| !k.is_empty()) {
        if insecure {
            bail!("--insecure-no-auth and an API key (--api-key, AGENTRUN_API_KEY or api_key) contradict each other: drop one");
        }
        return Ok(Some(k));
    }
    if !listening {
        return Ok(None);
    }
    if insecure {
        tracing::warn!(
            target: "agentrun::serve",
            "WARNING: --insecure-no-auth: the HTTP listeners have NO API KEY. Anyone who can \
             reach them (on loopback: every local user and every process of this host) can \
             create sandboxes, run code in them and read their secrets."
        );
        return Ok(None);
    }
    let path = agentrun_webguard::keyfile::path_in(&paths.state_dir);
    let file = agentrun_webguard::keyfile::load_or_create(&path)?;
    tracing::info!(
        target: "agentrun::serve",
        "API key: {} {} (mode 0600; `agentrun api-key` prints it)",
        if file.created { "made in" } else { "read from" },
        file.path.display()
    );
    Ok(Some(file.key))
}

/// An HTTP front end (`flag`: `--listen`, `--mcp`, `--metrics`) always has an API key unless
/// `--insecure-no-auth` ([`resolve_api_key`]); this says once more, per listener beyond
/// loopback, what serving it without one means.
fn check_exposure(
    flag: &str,
    what: &str,
    listen: std::net::SocketAddr,
    has_key: bool,
    insecure: bool,
) -> anyhow::Result<()> {
    if has_key || is_loopback(listen.ip()) {
        return Ok(());
    }
    if !insecure {
        bail!("{flag} {listen}: no API key (this cannot happen: report it)");
    }
    tracing::warn!(
        target: "agentrun::serve",
        "WARNING: --insecure-no-auth: {what} on {listen} has NO API KEY. \
         Anyone who can reach this address can create sandboxes and run code in them. \
         Drop --insecure-no-auth unless the network itself is trusted."
    );
    Ok(())
}

/// `agentrun api-key`: prints the daemon's generated API key (for whoever may read its file:
/// the daemon's user).
pub fn print_api_key(paths: &Paths) -> anyhow::Result<()> {
    let path = agentrun_webguard::keyfile::path_in(&paths.state_dir);
    let file = agentrun_webguard::keyfile::read(&path)?;
    println!("{}", file.key);
    Ok(())
}

fn call(paths: &Paths, msg: &ClientMessage) -> anyhow::Result<DaemonReply> {
    let socket = paths.socket();
    let client = DaemonClient::connect(&socket).with_context(|| {
        format!(
            "no daemon answers on {} (start `agentrun serve`)",
            socket.display()
        )
    })?;
    Ok(client.call(msg)?)
}

pub fn ps(json: bool, paths: &Paths) -> anyhow::Result<()> {
    let DaemonReply::Ps { sandboxes } = call(paths, &ClientMessage::Ps)? else {
        bail!("unexpected reply from the daemon");
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&sandboxes)?);
        return Ok(());
    }
    // One line a shell: ID is the shell's (its cgroup's and state dir's name), SANDBOX the
    // long-lived sandbox (OpenSandbox sandbox, Docker container) it serves now, if any.
    println!(
        "{:<16} {:<8} {:>8} {:<10} {:<10} {:>8} {:<16}",
        "ID", "STATE", "PID", "IMAGE", "PROFILE", "AGE", "SANDBOX"
    );
    for s in sandboxes {
        println!(
            "{:<16} {:<8} {:>8} {:<10} {:<10} {:>7.1}s {:<16}",
            s.id,
            s.state,
            s.pid,
            s.image,
            s.profile,
            s.age_ms as f64 / 1000.0,
            s.sandbox.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Ready sandboxes and counters of the daemon's pool.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn pool(cmd: PoolCommand, paths: &Paths) -> anyhow::Result<()> {
    let PoolCommand::Status { json } = cmd;
    let DaemonReply::PoolStatus(status) = call(paths, &ClientMessage::PoolStatus)? else {
        bail!("unexpected reply from the daemon");
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(());
    }
    for p in &status.pools {
        println!(
            "{} / {}: {} ready of {}; {} hits, {} misses, {} discarded",
            p.image, p.profile, p.ready, p.target, p.hits, p.misses, p.discarded
        );
        if let Some(z) = &p.zygote {
            let skipped: Vec<String> = z
                .skipped
                .iter()
                .map(|(m, why)| format!("{m} ({why})"))
                .collect();
            println!(
                "  python zygote: {}; preloaded: {}; skipped: {}; PSS {:.1} MiB",
                if z.ready {
                    "ready"
                } else if z.pid.is_some() {
                    "importing"
                } else {
                    "not running"
                },
                if z.preloaded.is_empty() {
                    "none".into()
                } else {
                    z.preloaded.join(", ")
                },
                if skipped.is_empty() {
                    "none".into()
                } else {
                    skipped.join(", ")
                },
                z.pss_bytes as f64 / (1 << 20) as f64
            );
        }
    }
    println!(
        "shells: {} (running {}, max {}); cells served: {}; unpooled runs: {}; created: {}, \
         failed: {}",
        status.shells,
        status.running,
        status.max_sandboxes,
        status.cells,
        status.unpooled,
        status.created,
        status.create_failures,
    );
    let discarded: Vec<String> = status
        .discarded
        .iter()
        .map(|(why, n)| format!("{why} {n}"))
        .collect();
    println!(
        "shells discarded: {}; a shell serves at most {} runs and {} s",
        if discarded.is_empty() {
            "none".into()
        } else {
            discarded.join(", ")
        },
        status.shell_max_runs,
        status.shell_max_age_s
    );
    Ok(())
}

/// A list flag's values when it was given, else the config file's list (none if absent).
fn listed<T: Clone>(flag: &[T], file: &Option<Vec<T>>) -> Vec<T> {
    if flag.is_empty() {
        file.clone().unwrap_or_default()
    } else {
        flag.to_vec()
    }
}
