//! What a sandbox is made from ([`SandboxRecipe`]) and what runs in it ([`ExecRequest`]).
//!
//! The CLI's cold path, the factory process and the daemon all turn a recipe into a
//! [`SandboxConfig`] here, so a pooled sandbox and a cold one are built the same way.

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
    /// Bridge this loopback port inside the sandbox to an egress proxy the caller serves
    /// (long-lived sandboxes with a network policy; the cold path sets it on its own).
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
    /// Whether a sandbox made from just the image and profile can serve this recipe: no
    /// mounts, no resource changes (a timeout is enforced from outside).
    pub fn is_plain(&self) -> bool {
        self.overrides.shapes_nothing()
            && self.workspace.is_none()
            && self.mounts.is_empty()
            && self.allow_hosts.is_empty()
            && self.egress_port.is_none()
    }

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

    /// The sandbox configuration (with `args` as the command of a cold run; pooled sandboxes
    /// get theirs over the control channel).
    pub fn to_config(
        &self,
        store: &ImageStore,
        args: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<PathBuf>,
    ) -> Result<SandboxConfig, PoolError> {
        let image = store.resolve(&self.image)?;
        let mut b = SandboxConfig::builder(image, self.profile()?, args)
            .workspace(self.workspace.clone())
            .cwd(cwd);
        for (k, v) in env {
            b = b.env(k, v);
        }
        for m in &self.mounts {
            b = b.mount(m.clone());
        }
        Ok(b.egress_port(self.egress_port).build())
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
    /// The full environment of the command: profile defaults, then the image's `Env`, then
    /// the request's values.
    pub fn environment(&self, profile: &Profile, image_env: &[(String, String)]) -> Vec<String> {
        let mut over = image_env.to_vec();
        over.extend(self.env.iter().cloned());
        profile.environment(&over)
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
