//! The runs (`agentrun exec` through the daemon) running now, for the operators' views
//! ([`crate::observe`]): each run is put on the [`board`] for the time it runs
//! ([`Board::register`]) with what the views show of it, and a way to be asked to end
//! ([`Board::kill`], which the run's wait polls through [`BoardGuard::kill_fd`]).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use crate::PoolError;

/// The runs running now.
#[derive(Debug, Default)]
pub struct Board {
    next: AtomicU64,
    runs: Mutex<BTreeMap<u64, BoardEntry>>,
}

#[derive(Debug)]
struct BoardEntry {
    run: BoardRun,
    /// Written to when the run is to be killed (the run's wait polls the other end).
    kill: UnixStream,
}

/// A run on the [`Board`].
#[derive(Debug, Clone)]
pub struct BoardRun {
    pub id: u64,
    pub shell: String,
    pub image: String,
    pub profile: String,
    pub command: String,
    pub started: SystemTime,
    /// Its shell's CPU time (ns) when it started.
    pub cpu_base_ns: u64,
}

/// A run's place on the [`Board`]: taken off when dropped. Its [`BoardGuard::kill_fd`] turns
/// readable when a view asks for the run to be killed.
#[derive(Debug)]
pub struct BoardGuard {
    id: u64,
    killed: UnixStream,
}

/// The daemon's runs (one board per process).
pub fn board() -> &'static Board {
    static BOARD: OnceLock<Board> = OnceLock::new();
    BOARD.get_or_init(Board::default)
}

impl Board {
    /// Puts a run on the board until the guard is dropped.
    pub fn register(
        &'static self,
        shell: &str,
        image: &str,
        profile: &str,
        argv: &[String],
    ) -> Result<BoardGuard, PoolError> {
        let (kill, killed) = UnixStream::pair().map_err(|e| PoolError::Io("socketpair", e))?;
        killed
            .set_nonblocking(true)
            .map_err(|e| PoolError::Io("socketpair", e))?;
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let run = BoardRun {
            id,
            shell: shell.to_owned(),
            image: image.to_owned(),
            profile: profile.to_owned(),
            command: agentrun_telemetry::argv_line(argv),
            started: SystemTime::now(),
            cpu_base_ns: crate::cgroup_mode()
                .and_then(|cg| cg.cpu_ns(shell))
                .unwrap_or(0),
        };
        crate::lock(&self.runs).insert(id, BoardEntry { run, kill });
        Ok(BoardGuard { id, killed })
    }

    /// The runs on the board, oldest first.
    pub fn runs(&self) -> Vec<BoardRun> {
        crate::lock(&self.runs)
            .values()
            .map(|e| e.run.clone())
            .collect()
    }

    /// Asks run `id` to be killed; `false` if it is not on the board.
    pub fn kill(&self, id: u64) -> bool {
        match crate::lock(&self.runs).get(&id) {
            Some(e) => (&e.kill).write_all(b"k").is_ok(),
            None => false,
        }
    }
}

impl BoardGuard {
    /// Readable once the run is to be killed.
    pub fn kill_fd(&self) -> BorrowedFd<'_> {
        self.killed.as_fd()
    }

    /// Consumes a kill request (after [`BoardGuard::kill_fd`] polled readable): whether there
    /// was one.
    pub fn take_kill(&self) -> bool {
        let mut buf = [0u8; 16];
        matches!((&self.killed).read(&mut buf), Ok(n) if n > 0)
    }
}

impl Drop for BoardGuard {
    fn drop(&mut self) {
        crate::lock(&board().runs).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn board_lists_kills_and_forgets_runs() {
        let argv = vec!["sleep".to_owned(), "30".to_owned()];
        let guard = board().register("shell-x", "img", "prof", &argv).unwrap();
        let run = board()
            .runs()
            .into_iter()
            .find(|r| r.shell == "shell-x")
            .unwrap();
        assert_eq!(run.command, "sleep 30");
        assert!(!guard.take_kill());
        assert!(board().kill(run.id));
        assert!(guard.take_kill());
        drop(guard);
        assert!(!board().kill(run.id));
        assert!(board().runs().iter().all(|r| r.shell != "shell-x"));
    }
}
