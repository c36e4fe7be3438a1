//! The container model: a [`Container`] (what create asked for, the image it runs, its
//! changing [`ContainerState`], its output log and the channels that tell waiters and
//! attached clients about changes), its [`Status`], and [`Containers`], every container by
//! id and name, with the ids and generated names they get.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Instant, SystemTime};

use agentrun_image::ImageConfig;
use agentrun_pool::live::LiveSandbox;
use agentrun_pool::lock;
use agentrun_pool::output_log::OutputLog;
use bytes::Bytes;
use tokio::sync::{broadcast, watch};

use super::config::ContainerConfig;

/// Output kept per container for `logs` and `attach?logs=1` (older output is dropped first).
pub const OUTPUT_LOG_CAP: usize = 8 * 1024 * 1024;

/// Where a container is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Exited,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Exited => "exited",
        }
    }
}

/// The changing part of a container.
pub struct ContainerState {
    pub status: Status,
    pub sandbox: Option<Arc<LiveSandbox>>,
    /// The main process (sandbox process id, pid inside).
    pub main: Option<(u64, i32)>,
    pub exit_code: i32,
    pub oom_killed: bool,
    pub error: String,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
    /// The main process's stdin (pipe or pty master), written by a task of its own
    /// ([`crate::stream::stdin_writer`]: bounded, in order); `None` closes it.
    pub stdin: Option<tokio::sync::mpsc::Sender<Bytes>>,
    /// Stdin attached before start, kept for the process.
    pub pending_stdin: Vec<u8>,
    pub stdin_closed_early: bool,
    /// Bumped on every exit (for `wait?condition=next-exit`).
    pub exits: u64,
    pub removed: bool,
    /// The published ports, while the main process runs.
    pub ports: Option<crate::ports::Published>,
    /// A restart is under way: its stop does not remove an AutoRemove container.
    pub restarting: bool,
}

/// One container.
pub struct Container {
    pub id: String,
    pub name: String,
    pub created: SystemTime,
    pub config: ContainerConfig,
    pub image_id: String,
    pub image_config: ImageConfig,
    pub state: Mutex<ContainerState>,
    /// Held while the container's sandbox is being made (start, or `docker cp` before it).
    pub(super) making: Mutex<()>,
    /// Every state change bumps it (wait, attach end).
    pub changed: watch::Sender<u64>,
    /// Its main process's output (stream: 1 stdout / 2 stderr, bytes), kept for logs: the
    /// newest [`OUTPUT_LOG_CAP`] bytes.
    pub logs: Mutex<OutputLog>,
    pub output: broadcast::Sender<(u8, Bytes)>,
    /// The main process's pty (`Tty`) and its window size.
    pub pty: crate::pty::Pty,
    /// Output pumps of the main process still reading (0: all its output is broadcast);
    /// `outputs_done` is notified as each one ends.
    pub(super) open_outputs: Mutex<usize>,
    pub(super) outputs_done: Condvar,
}

impl Container {
    pub fn new(
        id: String,
        name: String,
        config: ContainerConfig,
        image_id: String,
        image_config: ImageConfig,
    ) -> Self {
        let pty = crate::pty::Pty::default();
        if let Some((h, w)) = crate::pty::console_size(&config.host_config_raw["ConsoleSize"]) {
            if let Err(e) = pty.resize(h, w) {
                tracing::debug!(target: "agentrun::docker", "docker API: resizing the pty: {e}");
            }
        }
        Container {
            id,
            name,
            created: SystemTime::now(),
            config,
            image_id,
            image_config,
            state: Mutex::new(ContainerState {
                status: Status::Created,
                sandbox: None,
                main: None,
                exit_code: 0,
                oom_killed: false,
                error: String::new(),
                started_at: None,
                finished_at: None,
                stdin: None,
                pending_stdin: Vec::new(),
                stdin_closed_early: false,
                exits: 0,
                removed: false,
                ports: None,
                restarting: false,
            }),
            making: Mutex::new(()),
            changed: watch::channel(0).0,
            logs: Mutex::new(OutputLog::new(OUTPUT_LOG_CAP)),
            output: broadcast::channel(1024).0,
            pty,
            open_outputs: Mutex::new(0),
            outputs_done: Condvar::new(),
        }
    }

    /// Whether an output pump of the main process is still reading.
    pub fn outputs_open(&self) -> bool {
        *lock(&self.open_outputs) > 0
    }

    /// Blocks until every output pump of the main process reached EOF, or until `deadline`.
    pub(super) fn wait_outputs(&self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        let open = lock(&self.open_outputs);
        // The lock is let go at once; timed out or not, the caller goes on.
        drop(
            self.outputs_done
                .wait_timeout_while(open, left, |open| *open > 0)
                .unwrap_or_else(|p| p.into_inner()),
        );
    }

    pub fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    pub fn status(&self) -> Status {
        lock(&self.state).status
    }

    /// The main process's argv: the request's Entrypoint/Cmd over the image's (a request's
    /// Entrypoint resets the image's Cmd, as in Docker).
    pub fn argv(&self) -> Vec<String> {
        let c = &self.config;
        let (ep, cmd) = match &c.entrypoint {
            Some(ep) => (ep.clone(), c.cmd.clone().unwrap_or_default()),
            None => (
                self.image_config.entrypoint.clone().unwrap_or_default(),
                c.cmd
                    .clone()
                    .or_else(|| self.image_config.cmd.clone())
                    .unwrap_or_default(),
            ),
        };
        let mut v = ep;
        v.extend(cmd);
        v
    }

    /// Who the main process runs as: the request's `User`, else the image's; `None`: root.
    pub fn user(&self) -> Option<String> {
        [&self.config.user, &self.image_config.user]
            .into_iter()
            .find(|u| !u.is_empty())
            .cloned()
    }

    /// `HOME=` (empty) when the process runs as a user and neither the image's nor the
    /// request's environment set `HOME` (`extra` is an exec's own): the sandbox's init then
    /// takes the user's home from the container's /etc/passwd, as Docker does.
    pub fn home_from_passwd(&self, user: &Option<String>, extra: &[(String, String)]) -> bool {
        user.is_some()
            && !self
                .image_config
                .env
                .iter()
                .chain(&self.config.env)
                .any(|kv| kv.starts_with("HOME="))
            && !extra.iter().any(|(k, _)| k == "HOME")
    }

    /// Every exposed port (`8000/tcp`): the image's, the request's and the published ones.
    pub fn exposed_ports(&self) -> Vec<String> {
        let mut all: Vec<String> = self.image_config.exposed_ports.clone();
        all.extend(self.config.exposed.iter().cloned());
        if let Some(map) = self.config.host_config_raw["PortBindings"].as_object() {
            all.extend(map.keys().cloned());
        }
        let mut all: Vec<String> = all
            .into_iter()
            .map(|p| {
                if p.contains('/') {
                    p
                } else {
                    format!("{p}/tcp")
                }
            })
            .collect();
        all.sort();
        all.dedup();
        all
    }

    pub fn working_dir(&self) -> String {
        if !self.config.working_dir.is_empty() {
            self.config.working_dir.clone()
        } else if !self.image_config.working_dir.is_empty() {
            self.image_config.working_dir.clone()
        } else {
            "/".into()
        }
    }

    /// Keeps output for logs and sends it to attached clients.
    pub fn record_output(&self, stream: u8, data: Bytes) {
        lock(&self.logs).push(stream, &data);
        let _ = self.output.send((stream, data));
    }

    /// The output kept for logs, oldest first, as `(stream, bytes)`.
    pub fn kept_output(&self) -> Vec<(u8, Bytes)> {
        lock(&self.logs)
            .since(0)
            .map(|(stream, bytes)| (stream, bytes.copied().collect::<Vec<u8>>().into()))
            .collect()
    }
}

/// Every container, by id and by name.
#[derive(Default)]
pub struct Containers {
    pub by_id: HashMap<String, Arc<Container>>,
}

impl Containers {
    /// By full id, unique id prefix, or name (with or without the leading `/`).
    pub fn find(&self, key: &str) -> Option<Arc<Container>> {
        let key = key.strip_prefix('/').unwrap_or(key);
        if let Some(c) = self.by_id.get(key) {
            return Some(c.clone());
        }
        if let Some(c) = self.by_id.values().find(|c| c.name == key) {
            return Some(c.clone());
        }
        let hits: Vec<_> = self
            .by_id
            .values()
            .filter(|c| key.len() >= 4 && c.id.starts_with(key))
            .collect();
        (hits.len() == 1).then(|| hits[0].clone())
    }

    pub fn name_taken(&self, name: &str) -> Option<String> {
        self.by_id
            .values()
            .find(|c| c.name == name)
            .map(|c| c.id.clone())
    }
}

/// A new 64-hex id (from [`agentrun_runtime::random`]: getrandom, never a predictable
/// fallback).
pub fn new_id() -> Result<String, agentrun_runtime::random::RandomError> {
    agentrun_runtime::random::hex(32)
}

/// Docker-style generated names.
pub fn generated_name(id: &str) -> String {
    const ADJ: &[&str] = &[
        "brave", "calm", "eager", "keen", "quiet", "swift", "tidy", "wise",
    ];
    const NOUN: &[&str] = &[
        "turing", "hopper", "lovelace", "ritchie", "thompson", "knuth", "liskov", "dijkstra",
    ];
    let n = u64::from_str_radix(&id[..8], 16).unwrap_or(0) as usize;
    format!(
        "{}_{}_{}",
        ADJ[n % ADJ.len()],
        NOUN[(n / 8) % NOUN.len()],
        &id[..6]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(id: &str, name: &str, config: ContainerConfig, image: ImageConfig) -> Container {
        Container::new(id.into(), name.into(), config, "sha256:img".into(), image)
    }

    #[test]
    fn found_by_id_unique_prefix_or_name() {
        let mut all = Containers::default();
        for (id, name) in [
            ("abcd1234", "web"),
            ("abcd9999", "db"),
            ("ffff0000", "cache"),
        ] {
            let c = container(id, name, ContainerConfig::default(), ImageConfig::default());
            all.by_id.insert(id.into(), Arc::new(c));
        }
        let id_of = |key: &str| all.find(key).map(|c| c.id.clone());
        assert_eq!(id_of("abcd1234").as_deref(), Some("abcd1234"));
        assert_eq!(id_of("/web").as_deref(), Some("abcd1234"));
        assert_eq!(id_of("db").as_deref(), Some("abcd9999"));
        assert_eq!(id_of("ffff").as_deref(), Some("ffff0000"));
        assert_eq!(id_of("abcd"), None, "an ambiguous prefix");
        assert_eq!(id_of("fff"), None, "a prefix under 4 characters");
        assert_eq!(all.name_taken("cache").as_deref(), Some("ffff0000"));
        assert_eq!(all.name_taken("nope"), None);
    }

    #[test]
    fn argv_user_and_working_dir_fall_back_to_the_image() {
        let image = ImageConfig {
            entrypoint: Some(vec!["/init".into()]),
            cmd: Some(vec!["serve".into()]),
            user: "app".into(),
            working_dir: "/srv".into(),
            ..Default::default()
        };
        let c = container("1", "a", ContainerConfig::default(), image.clone());
        assert_eq!(c.argv(), vec!["/init", "serve"]);
        assert_eq!(c.user().as_deref(), Some("app"));
        assert_eq!(c.working_dir(), "/srv");
        // A request's Cmd replaces the image's; its Entrypoint resets the image's Cmd too.
        let cmd = ContainerConfig {
            cmd: Some(vec!["echo".into(), "hi".into()]),
            ..Default::default()
        };
        assert_eq!(
            container("2", "b", cmd, image.clone()).argv(),
            vec!["/init", "echo", "hi"]
        );
        let ep = ContainerConfig {
            entrypoint: Some(vec!["sh".into()]),
            user: "0".into(),
            working_dir: "/w".into(),
            ..Default::default()
        };
        let c = container("3", "c", ep, image);
        assert_eq!(c.argv(), vec!["sh"]);
        assert_eq!(c.user().as_deref(), Some("0"));
        assert_eq!(c.working_dir(), "/w");
    }

    #[test]
    fn generated_names_come_from_the_id() {
        let n = generated_name("0123456789abcdef");
        assert!(n.ends_with("_012345"), "{n}");
        assert_eq!(n, generated_name("0123456789abcdef"));
    }
}
