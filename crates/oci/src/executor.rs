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
//! Installing either without CAP_SYS_ADMIN needs no_new_privs: when the spec did not set it,
//! the executor does (runc can install seccomp before dropping capabilities; libcontainer's
//! executor runs after). A setuid program in such a container cannot gain privileges.

use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};

use caps::{CapSet, Capability};
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use oci_spec::runtime::Spec;

use crate::annotations::Hardening;

/// Exit code when the process cannot be found (as a shell).
const EXIT_NOT_FOUND: i32 = 127;
/// Exit code when the process cannot be executed or confined.
const EXIT_CANNOT_EXEC: i32 = 126;

/// Executes the spec's process with the spec's seccomp and the annotations' hardening.
#[derive(Clone, Debug, Default)]
pub struct OciExecutor;

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

    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let Some(args) = spec_args(spec) else {
            return Err(ExecutorError::InvalidArg);
        };
        if let Err(msg) = confine(spec) {
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

/// Applies Landlock and seccomp to the calling process.
fn confine(spec: &Spec) -> Result<(), String> {
    let hardening = Hardening::from_spec(spec).map_err(|e| e.to_string())?;
    let filters = match &hardening.seccomp {
        Some(section) => agentrun_runtime::seccomp::compile(section).map_err(|e| e.to_string())?,
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
    let sys_admin =
        caps::has_cap(None, CapSet::Effective, Capability::CAP_SYS_ADMIN).unwrap_or(false);
    if !nnp && !sys_admin {
        // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) only sets a flag on this process.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
        }
    }
    if let Some(rules) = landlock {
        agentrun_runtime::landlock::restrict(rules, landlock_abi).map_err(|e| e.to_string())?;
    }
    agentrun_runtime::seccomp::install(&filters).map_err(|e| e.to_string())
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
