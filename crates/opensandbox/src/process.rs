//! Processes in a sandbox as execd starts them, over [`agentrun_pool::process`] (the pipes,
//! the interactive processes, the shell): the sandbox's shell found once per [`Record`], and
//! a request's `cwd` expanded as upstream's execd expands it ([`expand_cwd`]).

use agentrun_pool::process::expand_vars;

use crate::error::{ApiError, ApiResult};
use crate::Record;

/// The shell commands run under: bash if the image has it, else sh (found once per sandbox).
pub fn shell(rec: &Record) -> &'static str {
    rec.shell
        .get_or_init(|| agentrun_pool::process::find_shell(&rec.sandbox))
}

/// A request's `cwd` as upstream's execd takes it (`pathutil.ExpandPathWithEnv`): `$VAR` and
/// `${VAR}` from the sandbox's environment with `overrides` (the command's `envs`) over it, a
/// variable that is not set being a 400 naming it; then a leading `~` is `$HOME` (`/root`
/// without one). Empty or absent: `/`. The result is a path inside the sandbox, resolved
/// there by its init (never on the host).
pub fn expand_cwd(
    rec: &Record,
    cwd: Option<&str>,
    overrides: &[(String, String)],
) -> ApiResult<String> {
    let Some(cwd) = cwd.filter(|c| !c.is_empty()) else {
        return Ok("/".into());
    };
    let env = rec.sandbox.env();
    let lookup = |name: &str| {
        overrides
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| env.get(name).cloned())
    };
    let expanded = expand_vars(cwd, lookup).map_err(|missing| {
        ApiError::bad_request(format!(
            "cwd {cwd:?}: path references undefined environment variables: {}",
            missing.join(",")
        ))
    })?;
    let home = || {
        lookup("HOME")
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "/root".into())
    };
    Ok(if expanded == "~" {
        home()
    } else if let Some(rest) = expanded.strip_prefix("~/") {
        format!("{}/{rest}", home().trim_end_matches('/'))
    } else {
        expanded
    })
}
