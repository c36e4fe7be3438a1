//! `write_file`, `read_file`, `list_files`.
//!
//! A path from a request is never resolved on the host. It is made absolute against the
//! working directory and judged by the profile ([`agentrun_policy::Profile::check`], lexically:
//! `..` resolved first), which gives a denial its rule and reason before anything runs. What
//! the profile allows is then done by a small POSIX sh script run *inside* the sandbox, as
//! the sandbox's own processes run: the kernel resolves the path there (symlinks included)
//! and Landlock judges the final file exactly as it judges the model's code, so a symlink
//! planted in the workspace cannot lead a file tool anywhere the sandbox could not go itself.
//! The scripts use only what both coreutils and busybox images have (`cat`, `sed`, `mkdir`,
//! `dirname`, `wc`, `printf`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentrun_policy::{normalize, Action, Decision};
use serde_json::{json, Value};

use crate::denials::{advice, Denial};
use crate::run::{capture, Captured};
use crate::session::{SessionSandbox, Shared};

/// A file operation's time limit.
const FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest `write_file` content.
pub const MAX_WRITE: usize = 16 << 20;

const WRITE: &str = r#"d=$(dirname "$1") && mkdir -p "$d" && cat > "$1""#;

const READ: &str = r#"if [ -d "$1" ]; then echo "$1: Is a directory" >&2; exit 21; fi
exec sed -n "$2,$3p" "$1""#;

const LIST: &str = r#"ls -a "$1" > /dev/null || exit
cd "$1" || exit
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  if [ -L "$f" ]; then t=symlink; elif [ -d "$f" ]; then t=dir; elif [ -f "$f" ]; then t=file; else t=other; fi
  s=0
  if [ "$t" = file ]; then s=$(wc -c < "$f" 2>/dev/null) || s=0; fi
  printf '%s\t%s\t%s\0' "$t" "$s" "$f"
done"#;

/// A file tool's failure: the error object of its result.
#[derive(Debug, Clone, PartialEq)]
pub enum FileError {
    /// The profile (or the kernel) refused.
    Denied(Denial),
    /// Anything else: (kind, message).
    Failed(&'static str, String),
}

impl FileError {
    pub fn to_value(&self) -> Value {
        match self {
            FileError::Denied(d) => json!({
                "error": "denied", "action": d.action, "resource": d.resource,
                "rule_id": d.rule_id, "reason": d.reason, "enforced_by": d.enforced_by,
            }),
            FileError::Failed(kind, message) => json!({"error": kind, "message": message}),
        }
    }

    /// The text a model reads.
    pub fn text(&self) -> String {
        match self {
            FileError::Denied(d) => d.line(),
            FileError::Failed(kind, message) => format!("error ({kind}): {message}"),
        }
    }
}

/// `path` made absolute against `workdir` and normalized (`..` resolved lexically).
pub fn absolute(workdir: &str, path: &str) -> Result<PathBuf, FileError> {
    let p = Path::new(path);
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        Path::new(workdir).join(p)
    };
    normalize(&joined)
        .ok_or_else(|| FileError::Failed("invalid_path", format!("{path}: not a valid path")))
}

/// The profile's decision on `action`, traced by `decide`; a refusal as a [`FileError`].
fn check(
    shared: &Shared,
    action: Action,
    decide: &mut (dyn FnMut(&Action, &Decision) + Send),
) -> Result<(), FileError> {
    let d = shared.profile.check(&action);
    decide(&action, &d);
    if d.allow {
        Ok(())
    } else {
        Err(FileError::Denied(Denial::of(
            &shared.profile,
            &action,
            &d,
            "policy",
        )))
    }
}

/// What a failed script's stderr means.
fn failure(shared: &Shared, action: &Action, c: &Captured) -> FileError {
    let stderr = c.output.stderr.trim();
    let first = stderr.lines().next().unwrap_or("").to_string();
    if c.output.timed_out {
        return FileError::Failed(
            "timeout",
            "the file operation did not finish in time".into(),
        );
    }
    if [
        "Permission denied",
        "Read-only file system",
        "Operation not permitted",
    ]
    .iter()
    .any(|r| stderr.contains(r))
    {
        // The profile allowed the path as written: the kernel refused where it leads (a
        // symlink out of the allowed places, a hidden file, a read-only mount).
        return FileError::Denied(Denial {
            action: action.name().into(),
            resource: action.resource(),
            rule_id: "landlock".into(),
            reason: format!(
                "the kernel refused ({first}): the path leads outside what this sandbox may access; {}",
                advice(&shared.profile, action)
            ),
            enforced_by: "kernel",
        });
    }
    let path = action.resource();
    let (kind, message) = if stderr.contains("No such file or directory") {
        ("not_found", format!("{path}: no such file or directory"))
    } else if stderr.contains("Is a directory") {
        ("is_a_directory", format!("{path} is a directory"))
    } else if stderr.contains("Not a directory") {
        (
            "not_a_directory",
            format!("{path}: a part of the path is not a directory"),
        )
    } else if first.is_empty() {
        (
            "failed",
            format!("{path}: exit code {}", c.output.exit_code),
        )
    } else {
        ("failed", first)
    };
    FileError::Failed(kind, message)
}

async fn script(
    shared: &Shared,
    sandbox: &SessionSandbox,
    body: &str,
    args: &[&str],
    stdin: Option<Vec<u8>>,
) -> Result<Captured, FileError> {
    let mut argv = vec!["/bin/sh".to_string(), "-c".into(), body.into(), "sh".into()];
    argv.extend(args.iter().map(|a| a.to_string()));
    capture(
        sandbox,
        argv,
        Vec::new(),
        shared.workdir().into(),
        stdin,
        FILE_TIMEOUT,
    )
    .await
    .map_err(|e| FileError::Failed("failed", e.to_string()))
}

/// `write_file`. A path the profile marks `escalate_write` is asked of the user (`peer`)
/// first; an approved write is made from the host into the sandbox's root, as the sandbox's
/// root would make it ([`agentrun_runtime::fsroot`]: resolved inside the sandbox, never out
/// of it), since the kernel keeps the sandbox's own processes from writing there.
pub async fn write(
    shared: &Shared,
    sandbox: &SessionSandbox,
    path: &Path,
    content: String,
    peer: Option<&rmcp::service::Peer<rmcp::service::RoleServer>>,
    decide: &mut (dyn FnMut(&Action, &Decision) + Send),
) -> Result<Value, FileError> {
    let action = Action::Write(path.into());
    let mut d = shared.profile.check(&action);
    let escalated = d.needs_approval();
    if escalated {
        d = crate::escalation::settle(
            peer,
            sandbox.id(),
            &action,
            d,
            shared.options.approval_timeout,
        )
        .await;
    }
    decide(&action, &d);
    if !d.allow {
        return Err(FileError::Denied(Denial::of(
            &shared.profile,
            &action,
            &d,
            "policy",
        )));
    }
    if content.len() > MAX_WRITE {
        return Err(FileError::Failed(
            "too_large",
            format!("content is {} bytes; at most {MAX_WRITE}", content.len()),
        ));
    }
    let bytes = content.len();
    let p = path.display().to_string();
    if escalated {
        write_approved(sandbox, &p, content.into_bytes()).await?;
        return Ok(json!({"path": p, "bytes": bytes, "approved": true}));
    }
    let c = script(shared, sandbox, WRITE, &[&p], Some(content.into_bytes())).await?;
    if c.output.exit_code != 0 {
        return Err(failure(shared, &action, &c));
    }
    Ok(json!({"path": p, "bytes": bytes}))
}

/// An approved write: the file made (parents too) in the sandbox's root with the sandbox
/// root's credentials, on a blocking thread.
async fn write_approved(
    sandbox: &SessionSandbox,
    path: &str,
    content: Vec<u8>,
) -> Result<(), FileError> {
    use agentrun_runtime::fsroot::{as_sandbox_root, relative, SandboxFs};
    use std::io::Write;
    let live = sandbox.live.clone();
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let rel = relative(&path).map_err(|e| FileError::Failed("invalid_path", e.into()))?;
        let fs = SandboxFs::new(
            live.root()
                .map_err(|e| FileError::Failed("failed", e.to_string()))?,
        );
        let mut f = as_sandbox_root(|| fs.create_file(&rel, 0o644))
            .map_err(|e| FileError::Failed("failed", format!("{path}: {e}")))?;
        f.write_all(&content)
            .map_err(|e| FileError::Failed("failed", format!("{path}: {e}")))
    })
    .await
    .map_err(|e| FileError::Failed("failed", e.to_string()))?
}

/// `read_file`: lines `offset..offset+limit` (1-based), or the whole file.
pub async fn read(
    shared: &Shared,
    sandbox: &SessionSandbox,
    path: &Path,
    offset: Option<u64>,
    limit: Option<u64>,
    decide: &mut (dyn FnMut(&Action, &Decision) + Send),
) -> Result<Value, FileError> {
    let action = Action::Read(path.into());
    check(shared, action.clone(), decide)?;
    let first = offset.unwrap_or(1);
    let last = match limit {
        Some(l) => first.saturating_add(l - 1).to_string(),
        None => "$".into(),
    };
    let p = path.display().to_string();
    let c = script(
        shared,
        sandbox,
        READ,
        &[&p, &first.to_string(), &last],
        None,
    )
    .await?;
    if c.output.exit_code != 0 {
        return Err(failure(shared, &action, &c));
    }
    let content = String::from_utf8_lossy(&c.stdout).into_owned();
    let lines = content.lines().count();
    let mut v = json!({"path": p, "content": content, "lines": lines});
    if c.output.truncated {
        v["truncated"] = json!(true);
        v["note"] = json!(format!(
            "only the first {} bytes are shown: read the rest with offset and limit",
            crate::run::OUTPUT_CAP
        ));
    }
    Ok(v)
}

/// `list_files`.
pub async fn list(
    shared: &Shared,
    sandbox: &SessionSandbox,
    path: &Path,
    decide: &mut (dyn FnMut(&Action, &Decision) + Send),
) -> Result<Value, FileError> {
    let action = Action::Read(path.into());
    check(shared, action.clone(), decide)?;
    let p = path.display().to_string();
    let c = script(shared, sandbox, LIST, &[&p], None).await?;
    if c.output.exit_code != 0 {
        return Err(failure(shared, &action, &c));
    }
    let mut entries = parse_listing(&c.stdout);
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let mut v = json!({"path": p, "entries": entries});
    if c.output.truncated {
        v["truncated"] = json!(true);
    }
    Ok(v)
}

/// The LIST script's `type \t size \t name \0` records.
pub fn parse_listing(raw: &[u8]) -> Vec<Value> {
    raw.split(|b| *b == 0)
        .filter_map(|rec| {
            let rec = String::from_utf8_lossy(rec);
            let mut parts = rec.splitn(3, '\t');
            let (t, s, name) = (parts.next()?, parts.next()?, parts.next()?);
            Some(json!({"name": name, "type": t, "size": s.trim().parse::<u64>().unwrap_or(0)}))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_absolute_and_normalized() {
        let a = |p| absolute("/workspace", p).unwrap();
        assert_eq!(a("x/y"), PathBuf::from("/workspace/x/y"));
        assert_eq!(a("../etc/passwd"), PathBuf::from("/etc/passwd"));
        assert_eq!(a("/workspace/../../etc"), PathBuf::from("/etc"));
        assert_eq!(a("/a/./b/"), PathBuf::from("/a/b"));
    }

    #[test]
    fn listings_parse() {
        let raw = b"file\t12\ta.txt\0dir\t0\tsub dir\0symlink\t0\tl\tx\0";
        let v = parse_listing(raw);
        assert_eq!(v.len(), 3);
        assert_eq!(v[0], json!({"name": "a.txt", "type": "file", "size": 12}));
        assert_eq!(v[1]["name"], "sub dir");
        // A tab in a name stays in the name.
        assert_eq!(v[2]["name"], "l\tx");
    }
}
