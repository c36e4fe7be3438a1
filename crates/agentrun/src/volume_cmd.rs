//! `agentrun volume`: the named volumes under `$AGENTRUN_ROOT/volumes` (what OpenSandbox
//! `pvc` volumes mount): create, ls, inspect, rm, prune.

use std::io::{IsTerminal, Write};

use agentrun_runtime::volume::{disk_usage, Creator, VolumeInfo, VolumeStore};
use anyhow::{bail, Context};
use clap::Subcommand;

use crate::Paths;

#[derive(Subcommand, Debug)]
pub enum VolumeCommand {
    /// Make a named volume (an empty directory, owned by you unless --owner: root's, or in
    /// rootless mode yours, which your sandboxes see as their root).
    Create {
        name: String,
        /// Host owner of its files, UID:GID: files a sandbox writes land owned by it (root only).
        #[arg(long, value_name = "UID:GID")]
        owner: Option<String>,
    },
    /// List the named volumes.
    #[command(alias = "list")]
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Also the bytes each one's files take (walks them).
        #[arg(long)]
        size: bool,
    },
    /// Show named volumes (JSON): where on the host, who made it, owner, in use, size.
    Inspect {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove named volumes and their files (refused for one a sandbox holds).
    #[command(alias = "remove")]
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove every named volume no sandbox holds.
    Prune {
        /// Do not ask (required when stdin is not a terminal).
        #[arg(short, long)]
        force: bool,
    },
}

fn parse_owner(s: &str) -> anyhow::Result<(u32, u32)> {
    let (u, g) = s
        .split_once(':')
        .with_context(|| format!("--owner {s:?}: expected UID:GID"))?;
    let id = |v: &str| {
        v.parse::<u32>()
            .with_context(|| format!("--owner {s:?}: {v:?} is not a numeric id"))
    };
    Ok((id(u)?, id(g)?))
}

fn json_of(v: &VolumeInfo, size: bool) -> serde_json::Value {
    let mut j = serde_json::to_value(v).unwrap_or_default();
    if size {
        j["size_bytes"] = disk_usage(&v.mountpoint).into();
    }
    j["created"] = created(v).into();
    j
}

fn created(v: &VolumeInfo) -> String {
    chrono::DateTime::from_timestamp(v.meta.created as i64, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

pub fn run(cmd: VolumeCommand, paths: &Paths) -> anyhow::Result<()> {
    let store = VolumeStore::new(&paths.root);
    match cmd {
        VolumeCommand::Create { name, owner } => {
            let owner = owner.as_deref().map(parse_owner).transpose()?;
            store.create(&name, owner, Creator::Cli)?;
            println!("{name}");
        }
        VolumeCommand::Ls { json, size } => {
            let all = store.list()?;
            if json {
                let v: Vec<_> = all.iter().map(|v| json_of(v, size)).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let mut out = String::from("NAME\tIN USE\tCREATED\tBY");
                if size {
                    out.push_str("\tSIZE");
                }
                for v in &all {
                    out.push_str(&format!(
                        "\n{}\t{}\t{}\t{}",
                        v.meta.name,
                        if v.in_use { "yes" } else { "no" },
                        created(v),
                        match v.meta.created_by {
                            Creator::Cli => "cli",
                            Creator::Api => "api",
                        }
                    ));
                    if size {
                        out.push_str(&format!("\t{}", disk_usage(&v.mountpoint)));
                    }
                }
                println!("{out}");
            }
        }
        VolumeCommand::Inspect { names } => {
            let mut out = Vec::new();
            for n in &names {
                out.push(json_of(&store.inspect(n)?, true));
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        VolumeCommand::Rm { names } => {
            if let [name] = names.as_slice() {
                store.remove(name)?;
                println!("{name}");
                return Ok(());
            }
            let mut failed = Vec::new();
            for n in &names {
                match store.remove(n) {
                    Ok(()) => println!("{n}"),
                    Err(e) => {
                        eprintln!("agentrun: {e}");
                        failed.push(n.clone());
                    }
                }
            }
            if !failed.is_empty() {
                bail!("not removed: {}", failed.join(", "));
            }
        }
        VolumeCommand::Prune { force } => {
            if !force {
                if !std::io::stdin().is_terminal() {
                    bail!("volume prune removes every volume no sandbox holds, with its files: pass --force");
                }
                let unused: Vec<String> = store
                    .list()?
                    .into_iter()
                    .filter(|v| !v.in_use)
                    .map(|v| v.meta.name)
                    .collect();
                if unused.is_empty() {
                    return Ok(());
                }
                eprint!("remove {} and their files? [y/N] ", unused.join(", "));
                std::io::stderr().flush()?;
                let mut answer = String::new();
                std::io::stdin().read_line(&mut answer)?;
                if !matches!(answer.trim(), "y" | "Y" | "yes") {
                    return Ok(());
                }
            }
            for n in store.prune()? {
                println!("{n}");
            }
        }
    }
    Ok(())
}
