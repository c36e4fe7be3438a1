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
    /// Sandbox factory processes (sandboxes are created in parallel on them); default: CPUs.
    #[arg(long, value_name = "N")]
    factories: Option<usize>,
    /// Also serve the OpenSandbox API (lifecycle under /v1, execd per sandbox) on ADDR,
    /// e.g. 127.0.0.1:8080.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// API key the OpenSandbox API requires in OPEN-SANDBOX-API-KEY (none: no check).
    #[arg(
        long,
        value_name = "KEY",
        env = "AGENTRUN_API_KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// TOML file with `pool_size`, `pools`, `max_sandboxes`, `drain`, `factories`, `listen`,
    /// `api_key`, `docker_socket`, and an `[image_limits]` table (`max_bytes`, `max_entries`,
    /// `max_ratio`, `max_depth`: what the Docker API's pulls and builds may unpack; the
    /// `AGENTRUN_IMAGE_MAX_*` variables win) (flags win).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Also serve the Docker Engine API subset on this unix socket (mode 0600), for
    /// docker-py / docker CLI with DOCKER_HOST=unix://PATH.
    #[arg(long, value_name = "PATH")]
    docker_socket: Option<PathBuf>,
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
    api_key: Option<String>,
    image_limits: Option<crate::image::LimitConfig>,
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
        let profile = agentrun_policy::Profile::load(&p.profile)
            .with_context(|| format!("--pool {}:{}", p.image, p.profile))?;
        if profile.network.needs_proxy() {
            bail!(
                "--pool {}:{}: the profile has a network policy; pooled sandboxes have no egress proxy (runs with it use the cold path)",
                p.image,
                p.profile
            );
        }
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
    let opts = DaemonOptions {
        socket: paths.socket(),
        root: paths.root.clone(),
        state_dir: paths.state_dir.clone(),
        limits: PoolLimits {
            pools,
            max_sandboxes: max,
        },
        drain,
        factories: args
            .factories
            .or(file.factories)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .clamp(1, 64),
    };
    let mut frontends: Vec<Box<dyn daemon::Frontend>> = Vec::new();
    if let Some(listen) = args.listen.or(file.listen) {
        frontends.push(Box::new(agentrun_opensandbox::OpenSandboxFrontend {
            options: agentrun_opensandbox::OpenSandboxOptions {
                listen,
                api_key: args.api_key.clone().or(file.api_key.clone()),
                image_root: paths.root.clone(),
                audit_dir: paths.audit_dir(),
                workers: std::thread::available_parallelism()
                    .map_or(2, |n| n.get())
                    .min(8),
            },
        }));
    }
    if let Some(socket) = args.docker_socket.or(file.docker_socket) {
        frontends.push(Box::new(agentrun_docker::DockerFrontend {
            options: agentrun_docker::DockerApiOptions {
                socket,
                root: paths.root.clone(),
                state_dir: paths.state_dir.clone(),
                mode: 0o600,
                image_limits,
            },
        }));
    }
    daemon::run(&opts, frontends)?;
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
    println!(
        "{:<16} {:<8} {:>8} {:<10} {:<10} {:>8}",
        "ID", "STATE", "PID", "IMAGE", "PROFILE", "AGE"
    );
    for s in sandboxes {
        println!(
            "{:<16} {:<8} {:>8} {:<10} {:<10} {:>7.1}s",
            s.id,
            s.state,
            s.pid,
            s.image,
            s.profile,
            s.age_ms as f64 / 1000.0
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
            "{} / {}: {} ready of {}; {} hits, {} misses",
            p.image, p.profile, p.ready, p.target, p.hits, p.misses
        );
    }
    println!(
        "unpooled runs: {}; created: {}, failed: {}; running: {}; max sandboxes: {}",
        status.unpooled,
        status.created,
        status.create_failures,
        status.running,
        status.max_sandboxes
    );
    Ok(())
}
