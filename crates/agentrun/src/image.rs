//! `agentrun image ...`: manage the local image store.

use std::path::PathBuf;

use agentrun_image::ImageStore;
use clap::Subcommand;

use crate::Paths;

#[derive(Subcommand, Debug)]
pub enum ImageCommand {
    /// Add a plain root filesystem directory as image NAME (copied into the store).
    Add { name: String, dir: PathBuf },
    /// List images.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an image.
    Rm { name: String },
}

pub fn run(cmd: ImageCommand, paths: &Paths) -> anyhow::Result<()> {
    let store = ImageStore::open(&paths.root)?;
    match cmd {
        ImageCommand::Add { name, dir } => {
            let info = store.add_dir(&name, &dir)?;
            println!("{}", info.name);
        }
        ImageCommand::Ls { json } => {
            let images = store.list()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&images)?);
            } else {
                println!("{:<24} {:<8} SOURCE", "NAME", "KIND");
                for i in images {
                    println!("{:<24} {:<8} {}", i.name, i.kind, i.source);
                }
            }
        }
        ImageCommand::Rm { name } => {
            store.remove(&name)?;
            println!("{name}");
        }
    }
    Ok(())
}
