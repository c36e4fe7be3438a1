//! runc's global options (`--root`, `--systemd-cgroup`, `--log`, `--log-format`, `--debug`)
//! as the commands use them.

use std::path::PathBuf;

use crate::log::Logger;

/// runc's global options as every command uses them: where state lives, the cgroup driver,
/// how to log.
pub(crate) struct Globals {
    pub root: PathBuf,
    pub systemd_cgroup: bool,
    pub logger: Logger,
}
