//! What `agentrun top` shows and how keys change it: the last snapshot of the daemon, the
//! denial feed, the filters, the selected command, the prompt and the status line. No
//! drawing (that is `view`) and no I/O (that is `top`): keys in, an [`Action`] out.

use std::collections::BTreeSet;
use std::collections::HashMap;

use agentrun_telemetry::AuditRecord;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use agentrun_pool::observe::{RunningCommand, Snapshot};

/// Denials kept for the feed (the newest).
pub const MAX_DENIALS: usize = 100;

/// What the caller does after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Kill this running command (`DaemonClient::kill`), then report with
    /// [`TopState::kill_result`].
    Kill(String),
}

/// What keys do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Typing a profile filter (the text so far).
    Filter(String),
    /// Asked "kill ID?": `y` kills it, any other key cancels.
    ConfirmKill(String),
}

/// An image and profile: one pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PoolKey {
    pub image: String,
    pub profile: String,
}

impl std::fmt::Display for PoolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.image, self.profile)
    }
}

/// One line of the pools table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    pub key: PoolKey,
    /// `None`: no kept pool of this image and profile (shells made on demand).
    pub target: Option<usize>,
    /// Ready shells (the pool's count; for shells without a pool, `ps`'s).
    pub ready: usize,
    /// Shells of this image and profile lent out (`ps` state `running`).
    pub running: usize,
    pub hits: u64,
    pub misses: u64,
    /// Its shells discarded (any reason).
    pub discarded: u64,
}

/// The model of the view.
#[derive(Debug)]
pub struct TopState {
    /// Where the daemon is (shown in the header).
    pub socket: String,
    pub snapshot: Option<Snapshot>,
    /// CPU use of each running command since the previous snapshot, percent of one core.
    pub cpu_percent: HashMap<String, f64>,
    prev_cpu: HashMap<String, (u64, u64)>,
    /// Refused decisions, newest first.
    pub denials: Vec<AuditRecord>,
    /// `None`: every pool.
    pub pool_filter: Option<PoolKey>,
    /// Substring of the profile; empty: every profile.
    pub profile_filter: String,
    pub mode: Mode,
    /// The selected running command's id.
    pub selected: Option<String>,
    /// What the user's last action came to (a kill's result, a cancelled kill).
    pub status: String,
    /// Why the picture is not fresh (the daemon did not answer, the audit log could not be
    /// read); cleared by the next [`TopState::update`].
    pub error: Option<String>,
    pub help: bool,
}

impl TopState {
    pub fn new(socket: impl Into<String>) -> TopState {
        TopState {
            socket: socket.into(),
            snapshot: None,
            cpu_percent: HashMap::new(),
            prev_cpu: HashMap::new(),
            denials: Vec::new(),
            pool_filter: None,
            profile_filter: String::new(),
            mode: Mode::Normal,
            selected: None,
            status: String::new(),
            error: None,
            help: false,
        }
    }

    /// A new snapshot of the daemon and the refused decisions of the audit log (oldest
    /// first, as the log returns them).
    pub fn update(&mut self, snap: Snapshot, refused: Vec<AuditRecord>) {
        let mut cpu = HashMap::new();
        let mut percent = HashMap::new();
        for c in &snap.commands {
            let Some(ms) = c.cpu_ms else { continue };
            if let Some(&(prev_ms, prev_at)) = self.prev_cpu.get(&c.id) {
                let wall = snap.unix_ms.saturating_sub(prev_at);
                if wall > 0 {
                    percent.insert(
                        c.id.clone(),
                        ms.saturating_sub(prev_ms) as f64 * 100.0 / wall as f64,
                    );
                }
            }
            cpu.insert(c.id.clone(), (ms, snap.unix_ms));
        }
        self.error = None;
        self.prev_cpu = cpu;
        self.cpu_percent = percent;
        self.denials = refused.into_iter().rev().take(MAX_DENIALS).collect();
        // A pool filter naming a pool that went away falls back to all.
        self.snapshot = Some(snap);
        if let Some(k) = &self.pool_filter {
            if !self.pool_keys().contains(k) {
                self.pool_filter = None;
            }
        }
        self.fix_selection();
    }

    /// The daemon could not be reached or answered an error: keep the last picture, say so.
    pub fn set_error(&mut self, message: impl Into<String>) {
        self.error = Some(message.into());
    }

    /// The end of a kill the user asked for.
    pub fn kill_result(&mut self, id: &str, result: Result<(), super::KillError>) {
        self.status = match result {
            Ok(()) => format!("killed {id}"),
            Err(e) => format!("kill {id}: {e}"),
        };
    }

    /// Every image and profile the daemon has a pool or a shell of, sorted.
    pub fn pool_keys(&self) -> Vec<PoolKey> {
        let Some(s) = &self.snapshot else {
            return Vec::new();
        };
        let mut keys: BTreeSet<PoolKey> = s
            .status
            .pools
            .iter()
            .map(|p| PoolKey {
                image: p.image.clone(),
                profile: p.profile.clone(),
            })
            .collect();
        keys.extend(s.shells.iter().map(|sh| PoolKey {
            image: sh.image.clone(),
            profile: sh.profile.clone(),
        }));
        keys.into_iter().collect()
    }

    fn profile_matches(&self, profile: &str) -> bool {
        self.profile_filter.is_empty() || profile.contains(&self.profile_filter)
    }

    fn key_matches(&self, image: &str, profile: &str) -> bool {
        self.pool_filter
            .as_ref()
            .is_none_or(|k| k.image == image && k.profile == profile)
            && self.profile_matches(profile)
    }

    /// The pools table: kept pools, then images and profiles with shells but no pool.
    pub fn pool_rows(&self) -> Vec<PoolRow> {
        let Some(s) = &self.snapshot else {
            return Vec::new();
        };
        let count = |key: &PoolKey, state: &str| {
            s.shells
                .iter()
                .filter(|sh| sh.image == key.image && sh.profile == key.profile)
                .filter(|sh| sh.state == state)
                .count()
        };
        let mut rows = Vec::new();
        for p in &s.status.pools {
            let key = PoolKey {
                image: p.image.clone(),
                profile: p.profile.clone(),
            };
            let running = count(&key, "running");
            rows.push(PoolRow {
                key,
                target: Some(p.target),
                ready: p.ready,
                running,
                hits: p.hits,
                misses: p.misses,
                discarded: p.discarded,
            });
        }
        for key in self.pool_keys() {
            if rows.iter().any(|r| r.key == key) {
                continue;
            }
            rows.push(PoolRow {
                target: None,
                ready: count(&key, "ready"),
                running: count(&key, "running"),
                hits: 0,
                misses: 0,
                discarded: 0,
                key,
            });
        }
        rows.retain(|r| self.key_matches(&r.key.image, &r.key.profile));
        rows
    }

    /// The running commands the filters let through, oldest first.
    pub fn commands(&self) -> Vec<&RunningCommand> {
        let Some(s) = &self.snapshot else {
            return Vec::new();
        };
        let mut v: Vec<&RunningCommand> = s
            .commands
            .iter()
            .filter(|c| self.key_matches(&c.image, &c.profile))
            .collect();
        v.sort_by(|a, b| {
            (a.started_unix_ms, a.id.as_str()).cmp(&(b.started_unix_ms, b.id.as_str()))
        });
        v
    }

    /// The denials the profile filter (and the pool filter's profile) lets through, newest
    /// first. A record without a profile passes only when no filter is set.
    pub fn denials(&self) -> Vec<&AuditRecord> {
        self.denials
            .iter()
            .filter(|r| {
                self.pool_filter
                    .as_ref()
                    .is_none_or(|k| k.profile == r.profile)
                    && self.profile_matches(&r.profile)
            })
            .collect()
    }

    /// Index of the selected command in [`TopState::commands`].
    pub fn selected_index(&self) -> Option<usize> {
        let id = self.selected.as_deref()?;
        self.commands().iter().position(|c| c.id == id)
    }

    /// Keeps a selection on a listed command: the first one if the selected one is gone.
    fn fix_selection(&mut self) {
        let ids: Vec<String> = self.commands().iter().map(|c| c.id.clone()).collect();
        if self
            .selected
            .as_ref()
            .is_none_or(|id| !ids.iter().any(|i| i == id))
        {
            self.selected = ids.first().cloned();
        }
    }

    fn move_selection(&mut self, down: bool) {
        let ids: Vec<String> = self.commands().iter().map(|c| c.id.clone()).collect();
        if ids.is_empty() {
            self.selected = None;
            return;
        }
        let next = match self.selected_index() {
            None => 0,
            Some(i) if down => (i + 1).min(ids.len() - 1),
            Some(i) => i.saturating_sub(1),
        };
        self.selected = Some(ids[next].clone());
    }

    fn cycle_pool_filter(&mut self) {
        let keys = self.pool_keys();
        self.pool_filter = match &self.pool_filter {
            None => keys.first().cloned(),
            Some(k) => keys
                .iter()
                .position(|x| x == k)
                .and_then(|i| keys.get(i + 1))
                .cloned(),
        };
        self.fix_selection();
    }

    /// One key press.
    pub fn on_key(&mut self, key: KeyEvent) -> Action {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        // The keys line stays until the next key.
        if key.code != KeyCode::Char('?') {
            self.help = false;
        }
        match std::mem::replace(&mut self.mode, Mode::Normal) {
            Mode::Filter(mut text) => {
                match key.code {
                    KeyCode::Enter => {
                        self.profile_filter = text;
                        self.fix_selection();
                    }
                    KeyCode::Esc => {}
                    KeyCode::Backspace => {
                        text.pop();
                        self.mode = Mode::Filter(text);
                    }
                    KeyCode::Char(c) => {
                        text.push(c);
                        self.mode = Mode::Filter(text);
                    }
                    _ => self.mode = Mode::Filter(text),
                }
                Action::None
            }
            Mode::ConfirmKill(id) => {
                if matches!(key.code, KeyCode::Char('y') | KeyCode::Char('Y')) {
                    Action::Kill(id)
                } else {
                    self.status = format!("not killed: {id}");
                    Action::None
                }
            }
            Mode::Normal => match key.code {
                KeyCode::Char('q') | KeyCode::Esc => Action::Quit,
                KeyCode::Char('p') => {
                    self.cycle_pool_filter();
                    Action::None
                }
                KeyCode::Char('f') | KeyCode::Char('/') => {
                    self.mode = Mode::Filter(self.profile_filter.clone());
                    Action::None
                }
                KeyCode::Up => {
                    self.move_selection(false);
                    Action::None
                }
                KeyCode::Down => {
                    self.move_selection(true);
                    Action::None
                }
                KeyCode::Char('k') => {
                    match self.selected_index() {
                        Some(_) => {
                            self.mode = Mode::ConfirmKill(self.selected.clone().unwrap_or_default())
                        }
                        None => self.status = "no running command selected".into(),
                    }
                    Action::None
                }
                KeyCode::Char('?') => {
                    self.help = !self.help;
                    Action::None
                }
                _ => Action::None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrun_pool::observe::Window;
    use agentrun_pool::protocol::{PoolInfo, PoolStatus, SandboxInfo};

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    fn cmd(id: &str, profile: &str, started: u64, cpu: u64) -> RunningCommand {
        RunningCommand {
            id: id.into(),
            kind: "run".into(),
            sandbox: format!("ar-{id}"),
            shell: format!("ar-{id}"),
            image: "host".into(),
            profile: profile.into(),
            command: "sleep 30".into(),
            started_unix_ms: started,
            elapsed_ms: 0,
            cpu_ms: Some(cpu),
            memory_bytes: Some(1 << 20),
        }
    }

    fn shell(id: &str, state: &str, profile: &str) -> SandboxInfo {
        SandboxInfo {
            id: id.into(),
            state: state.into(),
            pid: 1,
            image: "host".into(),
            profile: profile.into(),
            age_ms: 0,
            cells: 0,
            sandbox: None,
        }
    }

    /// A snapshot at 0 of `run-1` (profile default) and `run-2` (profile `second`).
    fn two_runs(second: &str) -> Snapshot {
        let runs = vec![cmd("run-1", "default", 1, 0), cmd("run-2", second, 2, 0)];
        snap(0, runs)
    }

    fn snap(at: u64, commands: Vec<RunningCommand>) -> Snapshot {
        Snapshot {
            unix_ms: at,
            status: PoolStatus {
                pools: vec![PoolInfo {
                    image: "host".into(),
                    profile: "default".into(),
                    ready: 2,
                    target: 3,
                    hits: 5,
                    misses: 1,
                    discarded: 0,
                    zygote: None,
                }],
                ..Default::default()
            },
            shells: vec![
                shell("ar-a", "ready", "default"),
                shell("ar-b", "ready", "default"),
                shell("ar-run-1", "running", "default"),
                shell("ar-run-2", "running", "strict"),
            ],
            commands,
            window: Window::default(),
            daemon_memory_bytes: None,
        }
    }

    fn denial(profile: &str, resource: &str) -> AuditRecord {
        AuditRecord {
            kind: "decision".into(),
            decision: "deny".into(),
            profile: profile.into(),
            resource: resource.into(),
            ..Default::default()
        }
    }

    #[test]
    fn pools_count_running_shells_and_list_shells_without_a_pool() {
        let mut s = TopState::new("sock");
        s.update(snap(0, vec![]), vec![]);
        let rows = s.pool_rows();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(
            (rows[0].key.to_string(), rows[0].ready, rows[0].target),
            ("host:default".into(), 2, Some(3))
        );
        assert_eq!(rows[0].running, 1);
        assert_eq!(
            (rows[1].key.to_string(), rows[1].target, rows[1].running),
            ("host:strict".into(), None, 1)
        );
    }

    #[test]
    fn p_cycles_the_pool_filter_through_every_pool_and_back_to_all() {
        let mut s = TopState::new("sock");
        s.update(
            two_runs("strict"),
            vec![denial("default", "a"), denial("strict", "b")],
        );
        assert_eq!(s.commands().len(), 2);
        s.on_key(key(KeyCode::Char('p')));
        assert_eq!(s.pool_filter.as_ref().unwrap().to_string(), "host:default");
        assert_eq!(s.commands().len(), 1);
        assert_eq!(s.pool_rows().len(), 1);
        assert_eq!(s.denials().len(), 1);
        s.on_key(key(KeyCode::Char('p')));
        assert_eq!(s.pool_filter.as_ref().unwrap().to_string(), "host:strict");
        assert_eq!(s.commands()[0].id, "run-2");
        assert_eq!(s.selected.as_deref(), Some("run-2"));
        s.on_key(key(KeyCode::Char('p')));
        assert_eq!(s.pool_filter, None);
        assert_eq!(s.commands().len(), 2);
    }

    #[test]
    fn profile_filter_is_typed_and_applied_on_enter_esc_cancels() {
        let mut s = TopState::new("sock");
        s.update(two_runs("strict"), vec![]);
        s.on_key(key(KeyCode::Char('/')));
        for c in "strx".chars() {
            s.on_key(key(KeyCode::Char(c)));
        }
        s.on_key(key(KeyCode::Backspace));
        assert_eq!(s.mode, Mode::Filter("str".into()));
        assert_eq!(s.commands().len(), 2, "not applied before Enter");
        s.on_key(key(KeyCode::Enter));
        assert_eq!(s.profile_filter, "str");
        assert_eq!(s.commands().len(), 1);
        s.on_key(key(KeyCode::Char('f')));
        s.on_key(key(KeyCode::Char('z')));
        assert_eq!(
            s.on_key(key(KeyCode::Esc)),
            Action::None,
            "Esc leaves the prompt, not top"
        );
        assert_eq!(s.profile_filter, "str");
    }

    #[test]
    fn kill_needs_a_selection_and_a_y() {
        let mut s = TopState::new("sock");
        s.update(snap(0, vec![]), vec![]);
        assert_eq!(s.on_key(key(KeyCode::Char('k'))), Action::None);
        assert_eq!(s.status, "no running command selected");
        s.update(two_runs("default"), vec![]);
        assert_eq!(s.selected.as_deref(), Some("run-1"));
        s.on_key(key(KeyCode::Down));
        s.on_key(key(KeyCode::Down));
        assert_eq!(s.selected.as_deref(), Some("run-2"));
        s.on_key(key(KeyCode::Char('k')));
        assert_eq!(s.mode, Mode::ConfirmKill("run-2".into()));
        assert_eq!(s.on_key(key(KeyCode::Char('n'))), Action::None);
        assert_eq!(s.mode, Mode::Normal);
        s.on_key(key(KeyCode::Up));
        s.on_key(key(KeyCode::Char('k')));
        assert_eq!(
            s.on_key(key(KeyCode::Char('y'))),
            Action::Kill("run-1".into())
        );
        s.kill_result("run-1", Ok(()));
        assert_eq!(s.status, "killed run-1");
    }

    #[test]
    fn the_keys_line_stays_until_the_next_key() {
        let mut s = TopState::new("sock");
        s.on_key(key(KeyCode::Char('?')));
        assert!(s.help);
        s.on_key(key(KeyCode::Down));
        assert!(!s.help);
        s.on_key(key(KeyCode::Char('?')));
        s.on_key(key(KeyCode::Char('?')));
        assert!(!s.help);
    }

    #[test]
    fn a_gone_selection_moves_to_the_first_command() {
        let mut s = TopState::new("sock");
        s.update(two_runs("default"), vec![]);
        s.on_key(key(KeyCode::Down));
        s.update(snap(0, vec![cmd("run-1", "default", 1, 0)]), vec![]);
        assert_eq!(s.selected.as_deref(), Some("run-1"));
        s.update(snap(0, vec![]), vec![]);
        assert_eq!(s.selected, None);
    }

    #[test]
    fn cpu_percent_is_the_share_of_one_core_since_the_last_snapshot() {
        let mut s = TopState::new("sock");
        s.update(snap(1_000, vec![cmd("run-1", "default", 1, 100)]), vec![]);
        assert!(s.cpu_percent.is_empty());
        s.update(snap(3_000, vec![cmd("run-1", "default", 1, 1_100)]), vec![]);
        assert_eq!(s.cpu_percent.get("run-1").copied(), Some(50.0));
    }

    #[test]
    fn denials_are_newest_first_and_quit_keys_quit() {
        let mut s = TopState::new("sock");
        s.update(
            snap(0, vec![]),
            vec![denial("default", "old"), denial("default", "new")],
        );
        assert_eq!(s.denials()[0].resource, "new");
        assert_eq!(s.on_key(key(KeyCode::Char('q'))), Action::Quit);
        assert_eq!(s.on_key(key(KeyCode::Esc)), Action::Quit);
        assert_eq!(
            s.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Action::Quit
        );
    }
}
