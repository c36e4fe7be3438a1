//! `agentrun info`: what this host enforces.

use agentrun_runtime::HostInfo;
use clap::Args;
use serde_json::json;

use crate::Paths;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InfoArgs, paths: &Paths) -> anyhow::Result<()> {
    std::fs::create_dir_all(&paths.root)?;
    let host = HostInfo::probe_full(&paths.root);
    let caps: Vec<String> = host.bounding_caps.iter().map(|c| c.to_string()).collect();
    let missing: Vec<String> = caps::all()
        .into_iter()
        .filter(|c| !host.bounding_caps.contains(c))
        .map(|c| c.to_string())
        .collect();
    let cgroup = host.cgroup.map(|c| c.as_str()).unwrap_or("none");
    let idmapped = host.idmapped_mounts.unwrap_or(false);
    let favordynmods = host.cgroup.is_some() && agentrun_runtime::cgroup::favordynmods();
    // The controllers a sandbox's limits need that this host lacks.
    let controllers_missing: Vec<&str> = match host.cgroup {
        Some(mode) => {
            let have = agentrun_runtime::preflight::controllers(mode);
            agentrun_runtime::preflight::REQUIRED_CONTROLLERS
                .iter()
                .copied()
                .filter(|c| !have.iter().any(|h| h == c))
                .collect()
        }
        None => Vec::new(),
    };
    // What enforces each limit of a run with the default profile (and a timeout, if any).
    let resources = agentrun_policy::Profile::builtin("default")?.resources;
    let rl = if host.cgroup.is_some() {
        Default::default()
    } else {
        agentrun_runtime::limits::RlimitFallback::for_resources(&resources, resources.timeout)
    };
    let delegated = match &host.privilege {
        agentrun_runtime::Privilege::Root => None,
        agentrun_runtime::Privilege::Rootless(ids) => {
            agentrun_runtime::limits::probe_delegated_v2(ids.uid)
        }
    };
    let limits = agentrun_runtime::limits::describe(host.cgroup, &rl, delegated.as_deref());
    if args.json {
        let v = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "mode": host.privilege.as_str(),
            "limits": limits,
            "kernel": host.kernel,
            "landlock_abi": host.landlock_abi,
            "landlock": host.landlock_enforcement(),
            "seccomp": host.seccomp,
            "user_namespaces": host.user_namespaces,
            "idmapped_mounts": idmapped,
            "cgroup": cgroup,
            "swap_limit": host.swap_limit,
            "cgroup_favordynmods": favordynmods,
            "cgroup_controllers_missing": controllers_missing,
            "bounding_capabilities_missing": missing,
            "root": paths.root,
            "state_dir": paths.state_dir,
            "api_key_file": agentrun_webguard::keyfile::path_in(&paths.state_dir),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let yes = |b: bool| if b { "yes" } else { "NO" };
    println!("agentrun {}", env!("CARGO_PKG_VERSION"));
    println!("kernel:            {}", host.kernel);
    println!(
        "mode:              {}",
        match host.privilege {
            agentrun_runtime::Privilege::Root => "root",
            agentrun_runtime::Privilege::Rootless(_) =>
                "rootless (a user namespace of your own; no idmapped mounts, no cgroup limits)",
        }
    );
    println!(
        "landlock:          {} (ABI {})",
        host.landlock_enforcement(),
        host.landlock_abi
    );
    if host.landlock_abi == 0 {
        println!(
            "                   {}",
            agentrun_runtime::preflight::LANDLOCK_ABSENT
        );
    }
    println!("seccomp:           {}", yes(host.seccomp));
    println!("user namespaces:   {}", yes(host.user_namespaces));
    println!(
        "idmapped mounts:   {}{}",
        yes(idmapped),
        if idmapped {
            ""
        } else {
            " (workspace files are owned by the sandbox uid on the host)"
        }
    );
    println!("cgroups:           {cgroup}");
    if !controllers_missing.is_empty() {
        println!(
            "cgroup controllers missing: {} (sandboxes cannot start; `agentrun exec` says how to fix it)",
            controllers_missing.join(", ")
        );
    }
    println!("no-swap limit:     {}", yes(host.swap_limit));
    for (i, l) in limits.iter().enumerate() {
        println!(
            "{}{l}",
            if i == 0 {
                "limits:            "
            } else {
                "                   "
            }
        );
    }
    if host.cgroup.is_some() {
        println!(
            "favordynmods:      {}",
            if favordynmods {
                "yes"
            } else {
                "no (each new sandbox waits an RCU grace period to join its cgroups; see docs/benchmarks.md, \"Host tuning\")"
            }
        );
    }
    if !missing.is_empty() {
        println!("caps not in bounding set: {}", missing.join(", "));
    }
    println!("capabilities:      {} in bounding set", caps.len());
    println!("root:              {}", paths.root.display());
    println!("state dir:         {}", paths.state_dir.display());
    let key = agentrun_webguard::keyfile::path_in(&paths.state_dir);
    println!(
        "API key file:      {} ({}; `agentrun api-key` prints the key of `serve --listen/--mcp/--metrics`)",
        key.display(),
        match std::fs::symlink_metadata(&key) {
            Ok(_) => "present",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "none yet: made by the first `agentrun serve` with an HTTP listener",
            Err(_) => "not readable by this user",
        }
    );
    Ok(())
}
