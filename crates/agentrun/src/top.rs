//! `agentrun top`: a live terminal view of the daemon reached on its control socket (pools,
//! running commands, runs per second and latency over the last minute) and of the audit
//! log's newest denials, with keys to filter and to kill a run.
//!
//! This module owns the command: its arguments, where the data comes from (one
//! `DaemonClient::top` a refresh, the tail of the audit log), the terminal (raw mode and the
//! alternate screen, restored on every way out, panics included) and the refresh loop.
//! [`state`] is the model and the keys, [`view`] the drawing.

mod state;
mod view;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrun_pool::client::DaemonClient;
use agentrun_pool::observe::Snapshot;
use agentrun_telemetry::{AuditLog, AuditQuery, AuditRecord};
use anyhow::Context;
use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyEventKind};

use crate::{one_line, Paths};
use state::{Action, TopState};

/// The audit log's tail read each refresh (the denials in it are shown): about a thousand
/// records.
const AUDIT_TAIL_BYTES: u64 = 256 << 10;
/// Width of a `--once` frame when stdout is not a terminal.
const TEXT_WIDTH: u16 = 160;
/// The longest wait for a key before looking at the signal flag again.
const SIGNAL_CHECK: Duration = Duration::from_millis(200);

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Time between refreshes: 1s, 500ms, 2s, ... (at least 100ms).
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = parse_interval)]
    interval: Duration,
    /// Print one plain-text frame and exit (what `top` does anyway when stdout is not a
    /// terminal).
    #[arg(long)]
    once: bool,
}

/// A `--interval` that is not a duration of at least 100ms.
#[derive(Debug, thiserror::Error)]
enum IntervalError {
    #[error(transparent)]
    Unit(#[from] agentrun_policy::UnitError),
    #[error("{0}: at least 100ms")]
    TooShort(String),
}

fn parse_interval(s: &str) -> Result<Duration, IntervalError> {
    let d = agentrun_policy::parse_duration(s)?;
    if d < Duration::from_millis(100) {
        return Err(IntervalError::TooShort(s.into()));
    }
    Ok(d)
}

/// Why a kill the user asked for did not happen (shown on the status line).
#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("the daemon does not answer")]
    NoDaemon,
    #[error("{}", one_line(&.0.to_string()))]
    Daemon(agentrun_pool::PoolError),
}

/// Where the picture comes from.
struct Source {
    socket: PathBuf,
    audit: AuditLog,
}

/// Reaching the daemon failed.
enum FetchError {
    /// Nothing answers on the socket.
    NoDaemon,
    /// It answered with an error, or hung up.
    Daemon(String),
}

impl Source {
    fn client(&self) -> Result<DaemonClient, FetchError> {
        DaemonClient::connect(&self.socket).ok_or(FetchError::NoDaemon)
    }

    fn snapshot(&self) -> Result<Snapshot, FetchError> {
        self.client()?
            .top()
            .map_err(|e| FetchError::Daemon(e.to_string()))
    }

    /// The refused decisions of the log's tail, oldest first.
    fn refused(&self) -> Result<Vec<AuditRecord>, agentrun_telemetry::audit::AuditError> {
        let refused = AuditQuery {
            refused: true,
            ..AuditQuery::default()
        };
        self.audit.recent(AUDIT_TAIL_BYTES, &refused)
    }

    fn kill(&self, id: &str) -> Result<(), KillError> {
        match self.client() {
            Err(_) => Err(KillError::NoDaemon),
            Ok(c) => c.kill(id).map_err(KillError::Daemon),
        }
    }

    /// One refresh of `state`; `Err` only when nothing answers.
    fn refresh(&self, state: &mut TopState) -> Result<(), FetchError> {
        let snap = self.snapshot()?;
        match self.refused() {
            Ok(refused) => state.update(snap, refused),
            Err(e) => {
                state.update(snap, Vec::new());
                state.set_error(format!("audit log: {e}"));
            }
        }
        Ok(())
    }
}

pub fn run(args: TopArgs, paths: &Paths) -> ExitCode {
    let source = Source {
        socket: paths.socket(),
        audit: AuditLog::new(paths.audit_dir()),
    };
    let mut state = TopState::new(source.socket.display().to_string());
    // The first picture decides: no daemon is one line and exit 1, not a broken screen.
    match source.refresh(&mut state) {
        Ok(()) => {}
        Err(FetchError::NoDaemon) => {
            eprintln!(
                "agentrun top: no daemon at {} (start one with agentrun serve)",
                source.socket.display()
            );
            return ExitCode::from(1);
        }
        Err(FetchError::Daemon(e)) => {
            eprintln!("agentrun top: {}", one_line(&e));
            return ExitCode::from(1);
        }
    }
    let stdout = std::io::stdout();
    if args.once || !stdout.is_terminal() {
        let width = if stdout.is_terminal() {
            ratatui::crossterm::terminal::size().map_or(TEXT_WIDTH, |(w, _)| w)
        } else {
            TEXT_WIDTH
        };
        print!("{}", view::render_text(&state, width));
        return ExitCode::SUCCESS;
    }
    match live(&source, &mut state, args.interval) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentrun top: {}", one_line(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

/// Raw mode and the alternate screen for as long as it lives. `ratatui::try_init` also
/// installs a panic hook that restores the terminal before the panic message is printed.
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// The live view until `q` (exit 0) or SIGTERM, SIGHUP or SIGINT (exit 128 + the signal),
/// the terminal put back either way.
fn live(source: &Source, state: &mut TopState, interval: Duration) -> anyhow::Result<ExitCode> {
    let signalled = Arc::new(AtomicUsize::new(0));
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        signal_hook::flag::register_usize(sig, Arc::clone(&signalled), sig as usize)
            .context("cannot handle signals")?;
    }
    let _guard = TerminalGuard;
    // Dropped before the guard: shows the cursor again, then the guard leaves raw mode and
    // the alternate screen.
    let mut terminal = ratatui::try_init().context("cannot set up the terminal")?;
    let mut next = Instant::now() + interval;
    loop {
        let sig = signalled.load(Ordering::Relaxed);
        if sig != 0 {
            return Ok(ExitCode::from(128 + sig as u8));
        }
        terminal
            .draw(|f| {
                let area = f.area();
                view::render(state, area, f.buffer_mut());
            })
            .context("cannot draw")?;
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(SIGNAL_CHECK);
        let ready = match event::poll(wait) {
            Ok(ready) => ready,
            // A signal: looked at above.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("cannot read the terminal"),
        };
        if ready {
            if let Event::Key(key) = event::read().context("cannot read the terminal")? {
                if key.kind != KeyEventKind::Press {
                    continue;
                }
                match state.on_key(key) {
                    Action::None => {}
                    Action::Quit => return Ok(ExitCode::SUCCESS),
                    Action::Kill(id) => {
                        let result = source.kill(&id);
                        state.kill_result(&id, result);
                        next = Instant::now();
                    }
                }
            }
        }
        if Instant::now() >= next {
            match source.refresh(state) {
                Ok(()) => {}
                Err(FetchError::NoDaemon) => state.set_error(format!(
                    "no daemon at {} (start one with agentrun serve); retrying",
                    source.socket.display()
                )),
                Err(FetchError::Daemon(e)) => state.set_error(format!("daemon: {}", one_line(&e))),
            }
            next = Instant::now() + interval;
        }
    }
}
