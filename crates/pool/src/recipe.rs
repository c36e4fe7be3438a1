//! What a run is made from ([`SandboxRecipe`]) and what runs ([`ExecRequest`]).
//!
//! A recipe's image and profile make the shell ([`SandboxRecipe::to_config`]: the CLI's cold
//! path and the factory processes build shells the same way); everything else in it (resource
//! overrides, workspace, mounts, allowed hosts, egress port) is the run's, applied to its cell
//! and to the shell's cgroup for the run, so any run of an image and profile, and any
//! long-lived sandbox (Docker binds and limits, an OpenSandbox `networkPolicy`), can take a
//! pooled shell.

use std::path::PathBuf;

use agentrun_image::ImageStore;
use agentrun_policy::{Profile, ResourceOverrides};
use agentrun_runtime::rootfs::UserMount;
use agentrun_runtime::SandboxConfig;
use serde::{Deserialize, Serialize};

use crate::PoolError;

/// The image and profile the pool keeps sandboxes of by default.
pub const DEFAULT_IMAGE: &str = "host";
pub const DEFAULT_PROFILE: &str = "default";

/// Everything that shapes a sandbox before any command runs in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecipe {
    pub image: String,
    /// Built-in profile name or a profile file path.
    pub profile: String,
    pub overrides: ResourceOverrides,
    pub workspace: Option<PathBuf>,
    pub mounts: Vec<UserMount>,
    /// `--allow-host` entries added to the profile's network rules (`cli.allow_host[i]`).
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Relay this loopback port inside the cell to an egress proxy the caller serves
    /// (long-lived sandboxes with a network policy; CLI runs follow their profile).
    #[serde(default)]
    pub egress_port: Option<u16>,
}

impl Default for SandboxRecipe {
    fn default() -> Self {
        SandboxRecipe {
            image: DEFAULT_IMAGE.into(),
            profile: DEFAULT_PROFILE.into(),
            overrides: ResourceOverrides::default(),
            workspace: None,
            mounts: Vec::new(),
            allow_hosts: Vec::new(),
            egress_port: None,
        }
    }
}

impl SandboxRecipe {
    /// The profile with the overrides and extra allowed hosts applied.
    pub fn profile(&self) -> Result<Profile, PoolError> {
        let mut p = Profile::load(&self.profile)?
            .with_overrides(&self.overrides)
            .map_err(|(field, why)| PoolError::Invalid(format!("{field}: {why}")))?;
        p.network
            .allow_hosts("cli.allow_host", &self.allow_hosts)
            .map_err(|why| PoolError::Invalid(format!("--allow-host: {why}")))?;
        Ok(p)
    }

    /// The configuration of a shell for this recipe: its image and profile (overrides
    /// applied: a shell made for one run, as the cold path's, needs no limits changed).
    /// `pooled`: a shell for many runs (the daemon's), which starts the profile's Python
    /// zygote if it asks for one.
    pub fn to_config(&self, store: &ImageStore, pooled: bool) -> Result<SandboxConfig, PoolError> {
        let image = store.resolve(&self.image)?;
        Ok(SandboxConfig::builder(image, self.profile()?, Vec::new())
            .zygote(pooled)
            .build())
    }

    /// The run's mounts: the workspace (at `/workspace`) first, then `--ro`/`--rw`.
    pub fn user_mounts(&self) -> Vec<UserMount> {
        agentrun_runtime::cellrun::user_mounts(self.workspace.as_deref(), &self.mounts)
    }
}

/// One run: a recipe and the command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub recipe: SandboxRecipe,
    pub args: Vec<String>,
    /// `-e`/`--env-file` values and TRACEPARENT, over the profile's defaults.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
}

impl ExecRequest {
    /// The full environment of the command (see [`agentrun_runtime::cellrun::environment`]).
    pub fn environment(
        &self,
        profile: &Profile,
        image: &agentrun_image::ImageConfig,
    ) -> Vec<String> {
        agentrun_runtime::cellrun::environment(profile, image, &self.env)
    }

    /// The working directory: `--cwd`, else the image's default (see
    /// [`agentrun_image::ImageConfig::default_cwd`]).
    pub fn working_dir(&self, image: &agentrun_image::ImageConfig) -> String {
        self.cwd
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| image.default_cwd(self.recipe.workspace.is_some()))
    }
}
