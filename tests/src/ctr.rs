//! `ctr run` with the container's output kept whole, for the tests that run containers under
//! real containerd (tests/tests/build.rs, image.rs, oci.rs).
//!
//! Why not ctr's own stdout: Debian bookworm's `ctr` (containerd 1.6.20) loses the tail of a
//! container's output. When the task exits, `ctr run` calls the client's `Task.Delete`, which
//! closes ctr's ends of the stdio FIFOs *before* waiting for their copy to finish (containerd
//! commit b27f7da, "task: don't close() io before cancel()", fixed it in 1.6.22;
//! moby/moby#45689). Whatever the shim had not yet handed to ctr when the exit event arrived is
//! gone, and `ctr run` still exits with the container's code. Under load (or with a reader
//! that is slow to drain ctr's stdout) that is the last lines; it does not depend on the
//! OCI runtime (runc and agentrun alike).
//!
//! So the container's stdout and stderr go to a logging binary instead (`--log-uri
//! binary://...`, containerd's shim logging plugin): the shim hands the binary the read ends of
//! the container's pipes (fds 3 and 4) and, when the task is deleted, closes its write ends and
//! waits for the binary to exit. The binary ([`LOGGER`]) copies each pipe to a file until EOF, so
//! everything the container wrote is in the files when `ctr run` returns, whatever the load.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::{run_with_timeout, RunOutput};

/// The logging binary: `logger dir DIR` copies fd 3 (stdout) to DIR/stdout and fd 4 (stderr)
/// to DIR/stderr until EOF. SIGTERM (the shim's "flush and exit") is ignored: it exits at EOF,
/// which the shim gives it by closing the pipes first. Closing fd 5 says it is ready.
const LOGGER: &str = r#"#!/bin/sh
trap '' TERM
dir=$2
cat <&3 >"$dir/stdout" 4<&- 5>&- &
o=$!
cat <&4 >"$dir/stderr" 3<&- 5>&- &
e=$!
exec 3<&- 4<&- 5>&-
wait $o $e
"#;

/// Where one `ctr run`'s container output goes.
pub struct ContainerLog {
    dir: tempfile::TempDir,
}

impl Default for ContainerLog {
    fn default() -> Self {
        Self::new()
    }
}

impl ContainerLog {
    pub fn new() -> ContainerLog {
        let dir = crate::tempdir();
        let logger = dir.path().join("logger");
        fs::write(&logger, LOGGER).unwrap();
        fs::set_permissions(&logger, fs::Permissions::from_mode(0o755)).unwrap();
        ContainerLog { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The `--log-uri` value.
    pub fn uri(&self) -> String {
        format!(
            "binary://{}?dir={}",
            self.path("logger").display(),
            self.dir.path().display()
        )
    }

    /// What the container wrote on stdout so far.
    pub fn stdout(&self) -> String {
        fs::read_to_string(self.path("stdout")).unwrap_or_default()
    }

    /// What the container wrote on stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.path("stderr")).unwrap_or_default()
    }

    /// `args` (a `ctr` command line whose first word is `run`) with `--log-uri` added.
    pub fn args<I, S>(&self, args: I) -> Vec<std::ffi::OsString>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        assert_eq!(
            args.first().map(|a| a.as_os_str()),
            Some(OsStr::new("run")),
            "ContainerLog is for `ctr run`: {args:?}"
        );
        args.insert(1, "--log-uri".into());
        args.insert(2, self.uri().into());
        args
    }

    /// `out` (ctr's own) with the container's stdout as its stdout and the container's stderr
    /// before ctr's own stderr.
    pub fn output(&self, mut out: RunOutput) -> RunOutput {
        out.stdout = self.stdout().into_bytes();
        let mut stderr = self.stderr().into_bytes();
        stderr.extend_from_slice(&out.stderr);
        out.stderr = stderr;
        out
    }
}

/// Runs `ctr` (`cmd`: the program and its global options) with `args` (`run ...`), the
/// container's output through a [`ContainerLog`]: its stdout and stderr are the container's,
/// complete.
pub fn run(cmd: Command, args: &[&OsStr], timeout: Duration) -> RunOutput {
    let log = ContainerLog::new();
    let mut cmd = cmd;
    cmd.args(log.args(args));
    log.output(run_with_timeout(cmd, None, timeout))
}
