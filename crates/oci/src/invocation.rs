//! Which command lines are runc-style: the dispatch that lets one `agentrun` binary be both
//! agentrun's own CLI and a runc drop-in (`BinaryName=/usr/bin/agentrun`,
//! `ctr run --runc-binary /usr/bin/agentrun`).
//!
//! A command line is runc-style ([`runc_args`] returns the arguments to parse) when:
//! 1. the program is invoked as `runc` or `agentrun-runc` (a symlink), or
//! 2. the first argument is `oci` (`agentrun oci create ...`; `oci` is dropped), or
//! 3. a runc-only global flag comes before the subcommand (`--log`, `--log-format`,
//!    `--systemd-cgroup`, `--debug`, `-l`, `-s`): containerd's shim always passes `--log`, or
//! 4. the subcommand exists only in runc: create, start, state, kill, delete, run, pause,
//!    resume, events, update, features, spec, list, checkpoint, restore, or
//! 5. `ps` with anything but `--json`/`--help` (runc's `ps` takes a container id), or
//! 6. `exec` with a runc-only flag before its first operand (`--process`/`-p`, `--detach`/`-d`,
//!    `--pid-file`, `--console-socket`, `--tty`/`-t`, `--user`/`-u`, `--preserve-fds`, ...),
//!    or whose first operand names an existing OCI container (`<root>/<ID>/state.json`,
//!    root being `--root` or [`crate::DEFAULT_ROOT`]): `agentrun --root R exec ID CMD`.
//!
//! Everything else is agentrun's own CLI: `agentrun exec -- CMD` keeps its meaning.

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// Program names that make every invocation runc-style.
const RUNC_NAMES: &[&str] = &["runc", "agentrun-runc"];

/// Subcommands agentrun's own CLI does not have.
const RUNC_ONLY_COMMANDS: &[&str] = &[
    "create",
    "start",
    "state",
    "kill",
    "delete",
    "run",
    "pause",
    "resume",
    "events",
    "update",
    "features",
    "spec",
    "list",
    "checkpoint",
    "restore",
];

/// Global flags only runc has (agentrun's own globals are `--root`, `--state-dir`, `--socket`).
const RUNC_ONLY_GLOBALS: &[&str] = &[
    "--log",
    "--log-format",
    "--systemd-cgroup",
    "--debug",
    "-l",
    "-s",
];

/// Global flags (of either CLI) that take a value as the next argument.
const GLOBALS_WITH_VALUE: &[&str] = &[
    "--root",
    "-r",
    "--log",
    "-l",
    "--log-format",
    "--state-dir",
    "--socket",
];

/// `exec` flags only runc's exec has.
const RUNC_ONLY_EXEC_FLAGS: &[&str] = &[
    "--process",
    "-p",
    "--detach",
    "-d",
    "--pid-file",
    "--console-socket",
    "--tty",
    "-t",
    "--user",
    "-u",
    "--additional-gids",
    "-g",
    "--preserve-fds",
    "--process-label",
    "--apparmor",
    "--no-new-privs",
    "--cap",
    "--ignore-paused",
    "--cgroup",
];

/// `exec` flags (of either CLI) that take a value as the next argument.
const EXEC_FLAGS_WITH_VALUE: &[&str] = &[
    "--image",
    "--profile",
    "--workspace",
    "--ro",
    "--rw",
    "--env",
    "-e",
    "--env-file",
    "--timeout",
    "--memory",
    "--pids",
    "--cpus",
    "--tmpfs-size",
    "--cwd",
    "--console-socket",
    "--user",
    "-u",
    "--additional-gids",
    "-g",
    "--process",
    "-p",
    "--pid-file",
    "--process-label",
    "--apparmor",
    "--cap",
    "--preserve-fds",
    "--cgroup",
];

/// The arguments to hand to the OCI parser (program name first) when `args` is a runc-style
/// command line, `None` when it is agentrun's own.
pub fn runc_args(args: &[OsString]) -> Option<Vec<OsString>> {
    let program = args.first()?;
    let name = Path::new(program)
        .file_name()
        .and_then(OsStr::to_str)
        .unwrap_or("");
    if RUNC_NAMES.contains(&name) {
        return Some(args.to_vec());
    }
    if args.get(1).map(OsString::as_os_str) == Some(OsStr::new("oci")) {
        let mut rest = vec![program.clone()];
        rest.extend_from_slice(&args[2..]);
        return Some(rest);
    }
    is_runc_style(args).then(|| args.to_vec())
}

fn is_runc_style(args: &[OsString]) -> bool {
    let strs: Vec<&str> = args.iter().map(|a| a.to_str().unwrap_or("")).collect();
    let mut i = 1;
    let mut root = crate::DEFAULT_ROOT;
    // Global flags before the subcommand.
    while i < strs.len() && strs[i].starts_with('-') {
        let flag = strs[i].split('=').next().unwrap_or("");
        if RUNC_ONLY_GLOBALS.contains(&flag) {
            return true;
        }
        let takes_value = GLOBALS_WITH_VALUE.contains(&flag) && !strs[i].contains('=');
        if matches!(flag, "--root" | "-r") {
            root = match strs[i].split_once('=') {
                Some((_, v)) => v,
                None => strs.get(i + 1).copied().unwrap_or(root),
            };
        }
        i += if takes_value { 2 } else { 1 };
    }
    let Some(command) = strs.get(i) else {
        return false;
    };
    let rest = &strs[i + 1..];
    match *command {
        c if RUNC_ONLY_COMMANDS.contains(&c) => true,
        "ps" => rest
            .iter()
            .any(|a| !matches!(*a, "--json" | "-h" | "--help")),
        "exec" => {
            let (flags, operand) = exec_flags_and_operand(rest);
            flags
                .iter()
                .any(|a| RUNC_ONLY_EXEC_FLAGS.contains(&a.split('=').next().unwrap_or("")))
                || operand.is_some_and(|id| is_container(root, id))
        }
        _ => false,
    }
}

/// The flags of `exec` before its first operand, and that operand (not a flag nor a flag's
/// value; `None` when `--` or the end comes first).
fn exec_flags_and_operand<'a>(rest: &[&'a str]) -> (Vec<&'a str>, Option<&'a str>) {
    let mut flags = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        let a = rest[i];
        if a == "--" {
            return (flags, None);
        }
        if !a.starts_with('-') {
            return (flags, Some(a));
        }
        flags.push(a);
        let takes_value = EXEC_FLAGS_WITH_VALUE.contains(&a) && !a.contains('=');
        i += if takes_value { 2 } else { 1 };
    }
    (flags, None)
}

/// Is there an OCI container `id` under `root`?
fn is_container(root: &str, id: &str) -> bool {
    crate::container::validate_id(id).is_ok()
        && Path::new(root).join(id).join("state.json").is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(argv: &[&str]) -> Option<Vec<String>> {
        let args: Vec<OsString> = argv.iter().map(OsString::from).collect();
        runc_args(&args).map(|v| {
            v.into_iter()
                .map(|a| a.into_string().unwrap())
                .collect::<Vec<_>>()
        })
    }

    /// Whether `line` (words separated by one space) is a runc-style invocation.
    fn runc_style(line: &str) -> bool {
        check(&line.split(' ').collect::<Vec<_>>()).is_some()
    }

    #[test]
    fn shim_invocations_are_runc_style() {
        let create = "/usr/bin/agentrun --root /run/containerd/runc/k8s.io --log /run/x/log.json \
                      --log-format json create --bundle /b --pid-file /b/init.pid abc";
        let args = create.split(' ').collect::<Vec<_>>();
        assert_eq!(check(&args).unwrap().len(), args.len());
        assert!(check(&["agentrun", "--root", "/r", "state", "abc"]).is_some());
        // containerd's checkpoint and restore (go-runc).
        assert!(runc_style(
            "agentrun --root /r checkpoint --image-path /i abc"
        ));
        assert!(runc_style(
            "agentrun restore --detach -no-subreaper --bundle /b abc"
        ));
        assert!(check(&["agentrun", "--root=/r", "delete", "--force", "abc"]).is_some());
        assert!(runc_style(
            "agentrun --root /r exec --process /p.json --detach abc"
        ));
        assert!(check(&["agentrun", "ps", "--format", "json", "abc"]).is_some());
        assert!(check(&["agentrun", "features"]).is_some());
    }

    #[test]
    fn agentrun_own_commands_are_not() {
        assert!(check(&["agentrun", "exec", "--", "echo", "hi"]).is_none());
        assert!(check(&["agentrun", "exec", "--image", "busybox", "echo", "-d"]).is_none());
        assert!(check(&["agentrun", "--root", "/r", "exec", "--", "ls", "-p"]).is_none());
        assert!(check(&["agentrun", "ps"]).is_none());
        assert!(check(&["agentrun", "ps", "--json"]).is_none());
        assert!(check(&["agentrun", "--state-dir", "/s", "serve"]).is_none());
        assert!(check(&["agentrun", "info"]).is_none());
        assert!(check(&["agentrun"]).is_none());
    }

    #[test]
    fn exec_of_an_existing_container_is_runc_style() {
        let root = std::env::temp_dir().join(format!("agentrun-oci-inv-{}", std::process::id()));
        std::fs::create_dir_all(root.join("c1")).unwrap();
        std::fs::write(root.join("c1/state.json"), "{}").unwrap();
        let r = root.to_str().unwrap();
        assert!(check(&["agentrun", "--root", r, "exec", "c1", "sh"]).is_some());
        assert!(check(&["agentrun", "--root", r, "exec", "--cwd", "/tmp", "c1", "sh"]).is_some());
        assert!(check(&["agentrun", "--root", r, "exec", "c2", "sh"]).is_none());
        assert!(check(&["agentrun", "--root", r, "exec", "--", "c1"]).is_none());
        assert!(check(&["agentrun", "--root", r, "exec", "--image", "c1", "ls"]).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn oci_namespace_and_runc_name() {
        assert_eq!(
            check(&["agentrun", "oci", "exec", "abc", "ls"]).unwrap(),
            ["agentrun", "exec", "abc", "ls"]
        );
        assert!(check(&["/usr/local/bin/runc", "exec", "abc", "ls"]).is_some());
        assert!(check(&["agentrun-runc", "ps"]).is_some());
    }
}
