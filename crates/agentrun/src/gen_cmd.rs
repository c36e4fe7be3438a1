//! `agentrun completions SHELL` and `agentrun man DIR` (both hidden): shell completions and
//! man pages generated from the CLI's clap definition, for packages (`hack/package`) and for
//! `cargo install` users.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use crate::Cli;

/// Writes the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    // Into a buffer first: clap_complete panics on a write error (e.g. `| head`).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "agentrun", &mut script);
    match std::io::stdout().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("write stdout"),
        _ => Ok(()),
    }
}

/// Writes `agentrun.1` and one page per subcommand (`agentrun-serve.1`, ...) into `dir`.
pub fn man(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("write man pages to {}", dir.display()))?;
    Ok(())
}
