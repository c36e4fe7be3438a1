//! The env file (`commands.set_env` in the SDK): upstream's execd reads `KEY=VALUE` lines
//! from the file named by the sandbox's `EXECD_ENVS` for every command, and the SDK's
//! `set_env` appends to it from inside the sandbox. agentrun gives every sandbox
//! `EXECD_ENVS=`[`DEFAULT_PATH`] (a path it can write under the default profile; the
//! create request's `env` may name another) and reads the file, inside the sandbox as its
//! root and at most [`MAX_BYTES`], when a command, session or code context starts; its
//! variables come under the request's own `envs`.
//!
//! Lines: blank and `#` lines skipped, `KEY=VALUE` (a valid name), later lines win. A value
//! in single quotes is literal; in double quotes `\\`, `\"`, `\n`, `\r`, `\t` are unescaped
//! and `$VAR`/`${VAR}` expanded (the SDK writes these two forms); a bare value is expanded as
//! upstream's `os.ExpandEnv` does. Expansion uses the sandbox's environment.

use std::io::Read;
use std::path::Path;

use crate::Record;

/// Where `EXECD_ENVS` points unless the create request's `env` says otherwise.
pub const DEFAULT_PATH: &str = "/tmp/.opensandbox/env";
/// The variable naming the file.
pub const VARIABLE: &str = "EXECD_ENVS";
/// Most of the file read.
pub const MAX_BYTES: u64 = 1 << 20;

/// The variables of the sandbox's env file (none when it has no file).
pub fn load(rec: &Record) -> Vec<(String, String)> {
    let env = rec.sandbox.env();
    let Some(path) = env.get(VARIABLE).filter(|p| p.starts_with('/')) else {
        return Vec::new();
    };
    let Ok(rel) = agentrun_runtime::fsroot::relative(path) else {
        return Vec::new();
    };
    let Ok(root) = rec.sandbox.root() else {
        return Vec::new();
    };
    let fs = agentrun_runtime::fsroot::SandboxFs::new(root);
    let mut text = Vec::new();
    let read = agentrun_runtime::fsroot::as_sandbox_root(|| {
        fs.open_regular(Path::new(&rel))
            .map(|f| f.take(MAX_BYTES).read_to_end(&mut text).is_ok())
            .unwrap_or(false)
    });
    if !read {
        return Vec::new();
    }
    parse(&String::from_utf8_lossy(&text), |k| env.get(k).cloned())
}

fn valid_name(k: &str) -> bool {
    k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The file's variables, in order, a later line for a name replacing an earlier one.
pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, raw)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim();
        if !valid_name(k) || raw.contains('\0') {
            continue;
        }
        let value = if let Some(v) = raw.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
            v.to_string()
        } else if let Some(v) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
            expand(&unescape(v), &env)
        } else {
            expand(raw, &env)
        };
        out.retain(|(name, _)| name != k);
        out.push((k.to_string(), value));
    }
    out
}

fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// `$VAR`/`${VAR}` from `env`, an unknown one empty (as Go's `os.ExpandEnv`).
fn expand(v: &str, env: &impl Fn(&str) -> Option<String>) -> String {
    agentrun_pool::process::expand_vars_lenient(v, env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_as_the_sdk_writes_them() {
        let env = |k: &str| (k == "HOME").then(|| "/root".to_string());
        let got = parse(
            "# comment\n\nA='lit $HOME \"q\"'\nB=\"it's \\\"x\\\"\\n$HOME\"\nC=$HOME/bin:${NOPE}\nbad line\n1X=no\nA='again'\n",
            env,
        );
        assert_eq!(
            got,
            [
                ("B".to_string(), "it's \"x\"\n/root".to_string()),
                ("C".to_string(), "/root/bin:".to_string()),
                ("A".to_string(), "again".to_string()),
            ]
        );
    }
}
