//! The exit codes agentrun reports, in one place (DESIGN.md's conventions): the command's own
//! code, or one of these when agentrun, not the command, decided how the run ended. Every
//! crate names them from here (the runtime re-exports it as `agentrun_runtime::exit`, where
//! `outcome::settle` is the one rule that picks among them for a run). It lives in this crate,
//! the lowest one the runtime and telemetry share, so that both name the same constants.

/// agentrun timed the run out.
pub const EXIT_TIMED_OUT: i32 = 124;
/// agentrun itself failed, or could not set up the run around the command (a shell, a cell),
/// or the run's process died without a report; a one-line message says why.
pub const EXIT_SETUP_FAILED: i32 = 125;
/// The command could not be executed (not executable, denied by policy).
pub const EXIT_NOT_EXECUTABLE: i32 = 126;
/// The command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;
/// A signal N ended the command: the run exits with `EXIT_SIGNAL_BASE + N`.
pub const EXIT_SIGNAL_BASE: i32 = 128;
/// The kernel's OOM killer ended the run (128 + SIGKILL).
pub const EXIT_OOM_KILLED: i32 = EXIT_SIGNAL_BASE + 9; // SIGKILL is 9 on every Linux arch

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_are_designs_conventions() {
        assert_eq!(
            [
                EXIT_TIMED_OUT,
                EXIT_SETUP_FAILED,
                EXIT_NOT_EXECUTABLE,
                EXIT_NOT_FOUND,
                EXIT_OOM_KILLED
            ],
            [124, 125, 126, 127, 137]
        );
    }
}
