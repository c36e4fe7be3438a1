//! What an image says about running it: [`ImageConfig`], the OCI config's `config` section
//! (entrypoint, command, environment, working directory, user, ports, labels). Below the
//! store, which reads it from a pulled image, and the built-in `host` image ([`crate::host`]).

use std::collections::BTreeMap;

use oci_spec::image::ImageConfiguration;
use serde::{Deserialize, Serialize};

/// What an image says about running it (the OCI config's `config` section).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: String,
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub exposed_ports: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
}

impl ImageConfig {
    /// Entrypoint followed by Cmd: what runs when no command is given.
    pub fn default_command(&self) -> Vec<String> {
        let mut v = self.entrypoint.clone().unwrap_or_default();
        v.extend(self.cmd.clone().unwrap_or_default());
        v
    }

    /// The working directory a command starts in when none is asked for: the image's
    /// `WorkingDir` when it has one and no workspace is mounted, else `/workspace`.
    pub fn default_cwd(&self, has_workspace: bool) -> String {
        if has_workspace || self.working_dir.is_empty() {
            "/workspace".into()
        } else {
            self.working_dir.clone()
        }
    }

    /// `Env` as (key, value) pairs.
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        self.env
            .iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (kv.clone(), String::new()),
            })
            .collect()
    }

    pub(crate) fn from_oci(c: &ImageConfiguration) -> Self {
        let Some(cfg) = c.config() else {
            return ImageConfig::default();
        };
        ImageConfig {
            entrypoint: cfg.entrypoint().clone(),
            cmd: cfg.cmd().clone(),
            env: cfg.env().clone().unwrap_or_default(),
            working_dir: cfg.working_dir().clone().unwrap_or_default(),
            user: cfg.user().clone().unwrap_or_default(),
            exposed_ports: cfg.exposed_ports().clone().unwrap_or_default(),
            labels: cfg
                .labels()
                .clone()
                .map(|l| l.into_iter().collect())
                .unwrap_or_default(),
            stop_signal: cfg.stop_signal().clone(),
        }
    }
}
