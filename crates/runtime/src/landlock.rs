//! Landlock: the filesystem view of the sandboxed process, enforced by the kernel.
//!
//! Read and execute only under the profile's readable paths (default: the whole sandbox root)
//! and the writable ones; write only under the workspace (when the profile makes it writable),
//! the profile's writable paths and the rw mounts; plus the few device files programs write to.
//! Every path is inside the sandbox's own root, so `..`, symlinks to `/etc` and the like are
//! judged by the kernel on the path they resolve to.
//! Scoped (ABI 6+) so the process cannot signal or reach abstract sockets outside its domain,
//! which also keeps it from ptrace-style access to agentrun's init. Best effort by ABI: the
//! host's ABI is probed up front ([`abi`]) and reported, and [`restrict`] fails if the kernel
//! enforces less than that ABI promised.
//!
//! Observing denials: on ABI 7+ (Linux 6.15+) the ruleset asks the kernel to log the
//! command's denied accesses (`LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`). The kernel emits them
//! as `AUDIT_LANDLOCK_ACCESS` records (with the domain, pid, path and the blocked right) only
//! while the audit subsystem is enabled on the host (`auditctl -e 1` or `audit=1`); then they
//! are in the host's audit log (auditd, journald). agentrun does not turn audit on by itself
//! and does not yet collect these records into its own audit log.

use std::path::PathBuf;

use landlock::{
    path_beneath_rules, Access, AccessFs, RestrictionStatus, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The ABI that can log denials after exec (`LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`).
const LOG_NEW_EXEC_ABI: u32 = 7;

/// The newest ABI whose rights agentrun asks for.
const TARGET_ABI: ABI = ABI::V6;

/// Device files every program may write (and use terminal ioctls on).
const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
];

/// Paths a sandboxed process may write (inside the sandbox's root).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandlockRules {
    /// Read and execute (files and directory listings).
    pub readable: Vec<PathBuf>,
    /// Everything, including read.
    pub writable: Vec<PathBuf>,
}

/// Errors applying Landlock.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("landlock: the kernel enforced less than expected ({0:?})")]
    NotEnforced(RulesetStatus),
}

/// The Landlock ABI this kernel supports (0: none).
pub fn abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        v as u32
    }
}

/// Restricts the calling process (and its future children). Requires no_new_privs.
pub fn restrict(rules: &LandlockRules, host_abi: u32) -> Result<RestrictionStatus, LandlockError> {
    let abi = TARGET_ABI;
    let existing = |paths: Vec<PathBuf>| paths.into_iter().filter(|p| p.exists());
    let readable = existing(rules.readable.clone());
    let writable = existing(rules.writable.clone());
    let devices = existing(WRITABLE_DEVICES.iter().map(PathBuf::from).collect());
    let created = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?;
    // ABI 7+: denials of the command (a new exec after this call) are logged to the audit
    // subsystem too, which records them when the host has audit enabled (see module doc).
    let created = if host_abi >= LOG_NEW_EXEC_ABI {
        created.log_new_exec(true)?
    } else {
        created
    };
    let status = created
        .add_rules(path_beneath_rules(readable, AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(writable, AccessFs::from_all(abi)))?
        .add_rules(path_beneath_rules(
            devices,
            AccessFs::from_read(abi) | AccessFs::from_write(abi),
        ))?
        .restrict_self()?;
    let expected = if host_abi == 0 {
        RulesetStatus::NotEnforced
    } else if host_abi >= TARGET_ABI as u32 {
        RulesetStatus::FullyEnforced
    } else {
        RulesetStatus::PartiallyEnforced
    };
    if host_abi > 0 && status.ruleset == RulesetStatus::NotEnforced {
        return Err(LandlockError::NotEnforced(status.ruleset));
    }
    if expected == RulesetStatus::FullyEnforced && status.ruleset != RulesetStatus::FullyEnforced {
        return Err(LandlockError::NotEnforced(status.ruleset));
    }
    Ok(status)
}

/// How Landlock is enforced on a host with `host_abi`: "full", "partial (ABI n)" or "none".
pub fn describe(host_abi: u32) -> String {
    match host_abi {
        0 => "none".into(),
        n if n >= TARGET_ABI as u32 => "full".into(),
        n => format!("partial (ABI {n})"),
    }
}
