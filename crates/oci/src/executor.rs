//! The libcontainer `Executor` of OCI mode: the last step of the container's init (and of
//! every `exec`'d process), after libcontainer has set up namespaces, mounts, cgroups,
//! capabilities, rlimits and the environment.
//!
//! It applies what libcontainer built without libseccomp leaves out, then execs exactly the
//! spec's `process.args`:
//! 1. Landlock, when an annotation asks for a profile ([`crate::annotations`]);
//! 2. the spec's seccomp section (or the profile's baseline), compiled with seccompiler by
//!    `agentrun_runtime::seccomp`, installed last so nothing after it needs a filtered call.
//!
//! The section's `SCMP_ACT_NOTIFY` rules are the exception: their filter is installed earlier,
//! in `setup_envs` (libcontainer's last step before the init reports ready, so during
//! `create`), and its listener handed to the seccomp agent ([`crate::seccomp_notify`]).
//!
//! Installing either without CAP_SYS_ADMIN needs no_new_privs: when the spec did not set it,
//! the executor does (runc can install seccomp before dropping capabilities; libcontainer's
//! executor runs after). A setuid program in such a container cannot gain privileges.

use std::collections::HashMap;
use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};

use caps::{CapSet, Capability};
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use oci_spec::runtime::Spec;

use crate::annotations::Hardening;
use crate::seccomp_notify::Handover;

/// Exit code when the process cannot be found (as a shell).
const EXIT_NOT_FOUND: i32 = 127;
/// Exit code when the process cannot be executed or confined.
const EXIT_CANNOT_EXEC: i32 = 126;

/// Executes the spec's process with the spec's seccomp and the annotations' hardening.
#[derive(Clone, Debug, Default)]
pub struct OciExecutor {
    /// The notify filter to install and hand over, when the spec has notify rules.
    notify: Option<Handover>,
}

impl OciExecutor {
    /// An executor that also installs the spec's notify filter and hands its listener over.
    pub fn with_notify(notify: Option<Handover>) -> Self {
        OciExecutor { notify }
    }
}

impl Executor for OciExecutor {
    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        let args = spec_args(spec).ok_or_else(|| {
            ExecutorValidationError::ArgValidationError("process.args is empty".into())
        })?;
        // Without PATH, execvp searches the C library's default path.
        let path_var = spec_env(spec, "PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
        if find_executable(&args[0], &path_var).is_none() {
            let msg = format!("exec: {:?}: executable file not found in $PATH", args[0]);
            say(&msg);
            return Err(ExecutorValidationError::ArgValidationError(msg));
        }
        Hardening::from_spec(spec)
            .map_err(|e| ExecutorValidationError::ArgValidationError(e.to_string()))?;
        Ok(())
    }

    fn setup_envs(&self, envs: HashMap<String, String>) -> Result<(), ExecutorSetEnvsError> {
        // What libcontainer's default does: the process environment is exactly `envs`.
        for (key, _) in std::env::vars_os() {
            std::env::remove_var(key);
        }
        for (key, value) in envs {
            std::env::set_var(key, value);
        }
        if let Some(notify) = &self.notify {
            // The filter needs no_new_privs without CAP_SYS_ADMIN, as in `confine`.
            allow_seccomp().map_err(|e| ExecutorSetEnvsError::Other(e.to_string()))?;
            notify.run().map_err(|e| {
                say(&format!("seccomp notify: {e}"));
                ExecutorSetEnvsError::Other(format!("seccomp notify: {e}"))
            })?;
        }
        Ok(())
    }

    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let Some(args) = spec_args(spec) else {
            return Err(ExecutorError::InvalidArg);
        };
        if let Err(msg) = confine(spec, self.notify.is_some()) {
            say(&format!("cannot confine the container process: {msg}"));
            std::process::exit(EXIT_CANNOT_EXEC);
        }
        let argv: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| ExecutorError::InvalidArg)?;
        // execvp searches the PATH libcontainer set from the spec's environment.
        let err = nix::unistd::execvp(&argv[0], &argv).unwrap_err();
        say(&format!(
            "exec {:?}: {}",
            args[0],
            err.desc().to_lowercase()
        ));
        let code = match err {
            nix::Error::ENOENT | nix::Error::ENOTDIR => EXIT_NOT_FOUND,
            _ => EXIT_CANNOT_EXEC,
        };
        std::process::exit(code)
    }
}

/// Why the container process could not be confined (it then exits with 126).
#[derive(Debug, thiserror::Error)]
enum ConfineError {
    #[error(transparent)]
    Hardening(crate::OciError),
    #[error(transparent)]
    Seccomp(agentrun_runtime::seccomp::SeccompError),
    #[error("the spec's SCMP_ACT_NOTIFY rules were not installed")]
    NotifyNotInstalled,
    #[error("no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
    #[error(transparent)]
    Landlock(agentrun_runtime::landlock::LandlockError),
}

/// Applies Landlock and seccomp to the calling process; `notified`: the notify filter was
/// installed by `setup_envs`.
fn confine(spec: &Spec, notified: bool) -> Result<(), ConfineError> {
    let hardening = Hardening::from_spec(spec).map_err(ConfineError::Hardening)?;
    let filters = match &hardening.seccomp {
        Some(section) => {
            let (filters, notify) = agentrun_runtime::seccomp::compile_with_notify(section)
                .map_err(ConfineError::Seccomp)?;
            if notify.is_some() && !notified {
                return Err(ConfineError::NotifyNotInstalled);
            }
            filters
        }
        None => Vec::new(),
    };
    let landlock_abi = agentrun_runtime::landlock::abi();
    let landlock = hardening.landlock.as_ref().filter(|_| landlock_abi > 0);
    if filters.is_empty() && landlock.is_none() {
        return Ok(());
    }
    let nnp = spec
        .process()
        .as_ref()
        .and_then(|p| p.no_new_privileges())
        .unwrap_or(false);
    if !nnp {
        allow_seccomp()?;
    }
    if let Some(rules) = landlock {
        agentrun_runtime::landlock::restrict(rules, landlock_abi)
            .map_err(ConfineError::Landlock)?;
    }
    agentrun_runtime::seccomp::install(&filters).map_err(ConfineError::Seccomp)
}

/// Sets no_new_privs unless the process has CAP_SYS_ADMIN: installing a seccomp filter (or a
/// Landlock ruleset) needs one or the other.
fn allow_seccomp() -> Result<(), ConfineError> {
    let sys_admin =
        caps::has_cap(None, CapSet::Effective, Capability::CAP_SYS_ADMIN).unwrap_or(false);
    if sys_admin {
        return Ok(());
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(ConfineError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn spec_args(spec: &Spec) -> Option<&Vec<String>> {
    spec.process()
        .as_ref()
        .and_then(|p| p.args().as_ref())
        .filter(|a| !a.is_empty())
}

fn spec_env(spec: &Spec, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    spec.process()
        .as_ref()?
        .env()
        .as_ref()?
        .iter()
        .find_map(|kv| kv.strip_prefix(&prefix).map(str::to_owned))
}

/// `name` resolved like execvp would: as is when it has a `/`, else in `path_var`.
fn find_executable(name: &str, path_var: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).exists().then(|| PathBuf::from(name));
    }
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Writes `agentrun: <msg>` on the process's stderr (the container's).
fn say(msg: &str) {
    // The container's stderr is the only place to say it; if it is closed, nobody can hear.
    let _ = writeln!(std::io::stderr(), "agentrun: {msg}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_are_found_like_execvp() {
        assert_eq!(
            find_executable("sh", "/nonexistent:/bin"),
            Some("/bin/sh".into())
        );
        assert_eq!(find_executable("/bin/sh", ""), Some("/bin/sh".into()));
        assert_eq!(find_executable("no-such-program-x", "/bin:/usr/bin"), None);
        assert_eq!(find_executable("sh", ""), None);
    }
}
