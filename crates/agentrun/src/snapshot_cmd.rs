//! `agentrun snapshot`: snapshots of long-lived sandboxes (a sandbox's writable layer kept
//! as an image over its image; see `agentrun_image::snapshot`): create (through the
//! daemon, which runs the sandbox), ls, inspect, rm (on the image store). A snapshot's image
//! is `agentrun.local/snapshot:<id>`: `agentrun image ls/export` show and export it, and
//! OpenSandbox `snapshotId` or Docker `run` of that name start sandboxes from it.

use agentrun_image::snapshot::snapshot_ref;
use agentrun_image::{ImageStore, Snapshot};
use anyhow::{bail, Context};
use clap::Subcommand;

use crate::Paths;

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Snapshot a running sandbox of the daemon (its id as `agentrun ps` shows it under
    /// SANDBOX): its writable layer, read while it is frozen. Prints the snapshot's id.
    Create {
        sandbox: String,
        /// A human-readable name.
        #[arg(long)]
        name: Option<String>,
        /// Refuse a snapshot whose changed files hold more than SIZE (e.g. 512M).
        #[arg(long, value_name = "SIZE")]
        max_size: Option<String>,
    },
    /// List snapshots (every owner's: the OpenSandbox API's, by API key, and the CLI's).
    #[command(alias = "list")]
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show snapshots (JSON).
    Inspect {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Remove snapshots (sandboxes made from one keep running).
    #[command(alias = "remove")]
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

fn row(s: &Snapshot) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}",
        s.id,
        s.sandbox_id,
        s.name.as_deref().unwrap_or("-"),
        s.base_image,
        s.size,
        s.created
    )
}

/// "no snapshot ID" for a missing one (not the image store's wording).
fn not_found(id: &str, e: agentrun_image::ImageError) -> anyhow::Error {
    match e {
        agentrun_image::ImageError::NotFound(_) => {
            anyhow::anyhow!("no snapshot {id} (see `agentrun snapshot ls`)")
        }
        e => e.into(),
    }
}

pub fn run(cmd: SnapshotCommand, paths: &Paths) -> anyhow::Result<()> {
    match cmd {
        SnapshotCommand::Create {
            sandbox,
            name,
            max_size,
        } => {
            let max = max_size
                .as_deref()
                .map(agentrun_policy::parse_bytes)
                .transpose()
                .context("--max-size")?;
            let Some(client) = agentrun_pool::client::DaemonClient::connect(&paths.socket()) else {
                bail!(
                    "no daemon on {}: sandboxes live in `agentrun serve`",
                    paths.socket().display()
                );
            };
            let s = client.snapshot(&sandbox, name, max)?;
            println!("{}", s.id);
        }
        SnapshotCommand::Ls { json } => {
            let store = ImageStore::open(&paths.root)?;
            let all = store.snapshots(None)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                let mut out = String::from("ID\tSANDBOX\tNAME\tIMAGE\tSIZE\tCREATED");
                for s in &all {
                    out.push('\n');
                    out.push_str(&row(s));
                }
                println!("{out}");
            }
        }
        SnapshotCommand::Inspect { ids } => {
            let store = ImageStore::open(&paths.root)?;
            let mut out = Vec::new();
            for id in &ids {
                let s = store.snapshot(id, None).map_err(|e| not_found(id, e))?;
                let mut v = serde_json::to_value(&s)?;
                v["image"] = snapshot_ref(&s.id).into();
                out.push(v);
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        SnapshotCommand::Rm { ids } => {
            let store = ImageStore::open(&paths.root)?;
            for id in &ids {
                store
                    .remove_snapshot(id, None)
                    .map_err(|e| not_found(id, e))?;
                println!("{id}");
            }
        }
    }
    Ok(())
}
