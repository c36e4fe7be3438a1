//! agentrun's image builder: the legacy (non-BuildKit) Dockerfile builder the Docker clients
//! use (`docker build` with `DOCKER_BUILDKIT=0`, docker-py `images.build`), over agentrun's
//! image store.
//!
//! FROM takes an image from the store; RUN runs in a sandbox (the same cold path as
//! `agentrun exec`, with the `build` profile: rootfs writable, no network) over the layers so
//! far, and what
//! it changed (the overlay's upper directory) becomes the next layer (as an ordinary user: a
//! cell of a rootless shell, its upper kept open from its start, see `run_step_rootless`);
//! COPY/ADD write a layer
//! from the context; the other instructions change the image config. See [`dockerfile`] for
//! what is accepted and [`context`] for how sources are resolved.

pub mod context;
pub mod dockerfile;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use agentrun_image::{ImageConfig, ImageError, ImageRecord, ImageStore, LayerRecord};
use agentrun_policy::Profile;
use agentrun_runtime::idmap::{UID_BASE, UID_COUNT};
use agentrun_runtime::{HostInfo, RuntimePaths, Sandbox, SandboxConfig, SandboxStdio};

use crate::dockerfile::{expand, CommandForm, Step};

/// Build failures, each a message a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("Dockerfile: {0}")]
    Dockerfile(String),
    #[error("build context: {0}")]
    Context(String),
    #[error("The command '{command}' returned a non-zero code: {code}")]
    RunFailed { command: String, code: i32 },
    #[error("RUN {command}: {message}")]
    Sandbox { command: String, message: String },
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("{0}")]
    Profile(String),
}

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The context directory.
    pub context: PathBuf,
    /// The Dockerfile, relative to the context (default `Dockerfile`).
    pub dockerfile: PathBuf,
    /// Names for the result.
    pub tags: Vec<String>,
    /// `--build-arg` values.
    pub build_args: BTreeMap<String, String>,
    /// Profile RUN steps get (default `build`: the rootfs writable, no network).
    pub profile: String,
}

impl BuildOptions {
    pub fn new(context: impl Into<PathBuf>) -> Self {
        BuildOptions {
            context: context.into(),
            dockerfile: PathBuf::from("Dockerfile"),
            tags: Vec::new(),
            build_args: BTreeMap::new(),
            profile: "build".into(),
        }
    }
}

/// Progress, in the order it happens.
#[derive(Debug)]
pub enum BuildEvent<'a> {
    /// `Step i/N : INSTRUCTION ...`
    Step {
        index: usize,
        total: usize,
        text: &'a str,
    },
    /// Output of a RUN command (stdout and stderr).
    Output(&'a [u8]),
    /// A line about the step's result (` ---> Running in ...`, ` ---> <id>`).
    Note(String),
}

/// Where sandboxes for RUN steps live.
pub struct BuildHost<'a> {
    pub paths: &'a RuntimePaths,
    pub host: &'a HostInfo,
}

/// The image being built.
struct State {
    layers: Vec<LayerRecord>,
    config: ImageConfig,
    /// The OCI config document (the base's, changed as steps go).
    document: serde_json::Value,
    history: Vec<serde_json::Value>,
    args: BTreeMap<String, String>,
}

impl State {
    /// Variables visible to expansion: ARGs, then ENV.
    fn vars(&self) -> BTreeMap<String, String> {
        let mut v = self.args.clone();
        v.extend(self.config.env_pairs());
        v
    }

    fn set_env(&mut self, key: &str, value: &str) {
        let prefix = format!("{key}=");
        self.config
            .env
            .retain(|e| !e.starts_with(&prefix) && e != key);
        self.config.env.push(format!("{key}={value}"));
    }

    fn workdir_join(&self, p: &str) -> String {
        if p.starts_with('/') {
            p.to_owned()
        } else {
            let base = if self.config.working_dir.is_empty() {
                "/"
            } else {
                self.config.working_dir.as_str()
            };
            format!("{}/{p}", base.trim_end_matches('/'))
        }
    }
}

/// Builds the image `opts` describes; returns its record (named with `opts.tags`).
pub fn build(
    store: &ImageStore,
    host: &BuildHost<'_>,
    opts: &BuildOptions,
    on: &mut dyn FnMut(BuildEvent<'_>),
) -> Result<ImageRecord, BuildError> {
    let context = opts
        .context
        .canonicalize()
        .map_err(|e| BuildError::Context(format!("{}: {e}", opts.context.display())))?;
    let dockerfile = context.join(&opts.dockerfile);
    let text = std::fs::read_to_string(&dockerfile).map_err(|e| {
        BuildError::Context(format!("cannot read {}: {e}", opts.dockerfile.display()))
    })?;
    let steps = dockerfile::parse(&text)?;
    for t in &opts.tags {
        agentrun_image::reference::normalize(t)?;
    }
    let profile = Profile::load(&opts.profile).map_err(|e| BuildError::Profile(e.to_string()))?;
    let _guard = store.write_guard()?;
    let mut st = State {
        layers: Vec::new(),
        config: ImageConfig::default(),
        document: serde_json::json!({"architecture": "amd64", "os": "linux", "config": {}}),
        history: Vec::new(),
        args: BTreeMap::new(),
    };
    let total = steps.len();
    for (i, located) in steps.iter().enumerate() {
        on(BuildEvent::Step {
            index: i + 1,
            total,
            text: &located.text,
        });
        let vars = st.vars();
        let x = |s: &str| expand(s, &vars);
        let mut empty_layer = true;
        match &located.step {
            Step::From { image } => {
                let name = x(image);
                if name == "scratch" {
                    continue;
                }
                if name == agentrun_image::HOST_IMAGE {
                    return Err(BuildError::Dockerfile(format!(
                        "line {}: FROM host is not supported (the host image binds host directories); use an image from the store",
                        located.line
                    )));
                }
                let rec = store.find(&name)?;
                st.document = store.config_document(&rec)?;
                st.history = st.document["history"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                st.layers = rec.layers.clone();
                st.config = rec.config.clone();
                on(BuildEvent::Note(format!(
                    " ---> {}",
                    agentrun_image::short_id(&rec.id)
                )));
                continue;
            }
            Step::Arg { name, default } => {
                let v = opts
                    .build_args
                    .get(name)
                    .cloned()
                    .or_else(|| default.as_ref().map(|d| x(d)))
                    .unwrap_or_default();
                st.args.insert(name.clone(), v);
            }
            Step::Env(kvs) => {
                for (k, v) in kvs {
                    let v = x(v);
                    st.set_env(k, &v);
                }
            }
            Step::Label(kvs) => {
                for (k, v) in kvs {
                    st.config.labels.insert(x(k), x(v));
                }
            }
            Step::Expose(ports) => {
                for p in ports {
                    let p = x(p);
                    let p = if p.contains('/') {
                        p
                    } else {
                        format!("{p}/tcp")
                    };
                    if !st.config.exposed_ports.contains(&p) {
                        st.config.exposed_ports.push(p);
                    }
                }
            }
            Step::User(u) => st.config.user = x(u),
            Step::StopSignal(s) => st.config.stop_signal = Some(x(s)),
            Step::Cmd(c) => st.config.cmd = Some(c.argv()),
            Step::Entrypoint(e) => {
                st.config.entrypoint = Some(e.argv());
                // As Docker: a new ENTRYPOINT resets an inherited CMD.
                st.config.cmd = None;
            }
            Step::Workdir(w) => {
                let dir = st.workdir_join(&x(w));
                st.config.working_dir = dir.clone();
                let tops = top_first(store, &st)?;
                if context::lookup(&tops, Path::new(&dir)).is_none_or(|m| !m.is_dir()) {
                    let layer = store.put_layer(|w| {
                        context::CopyLayer {
                            context: &context,
                            layers: &tops,
                            owner: (0, 0),
                            unpack_archives: false,
                            limits: store.limits(),
                        }
                        .write(&[], &format!("{dir}/"), w)
                        .map_err(|e| std::io::Error::other(e.to_string()))
                    })?;
                    st.layers.push(layer);
                    empty_layer = false;
                }
            }
            Step::Copy {
                sources,
                dest,
                chown,
                add,
            } => {
                let owner = context::parse_chown(chown.as_deref())?;
                let sources: Vec<String> = sources.iter().map(|s| x(s)).collect();
                let dest = st.workdir_join(&x(dest));
                let tops = top_first(store, &st)?;
                let copy = context::CopyLayer {
                    context: &context,
                    layers: &tops,
                    owner,
                    unpack_archives: *add,
                    limits: store.limits(),
                };
                // A context error is reported as itself, not as the store's write error.
                let mut failure = None;
                let layer = store.put_layer(|w| {
                    copy.write(&sources, &dest, w).map_err(|e| {
                        let msg = e.to_string();
                        failure = Some(e);
                        std::io::Error::other(msg)
                    })
                });
                if let Some(e) = failure {
                    return Err(e);
                }
                st.layers.push(layer?);
                empty_layer = false;
            }
            Step::Run(form) => {
                if let Some(layer) = run_step(store, host, &profile, &st, form, on)? {
                    st.layers.push(layer);
                    empty_layer = false;
                }
            }
        }
        st.history.push(serde_json::json!({
            "created": now(),
            "created_by": located.text,
            "empty_layer": empty_layer,
        }));
        let note = match st.layers.last() {
            Some(l) if !empty_layer => format!(" ---> {}", agentrun_image::short_id(&l.diff_id)),
            _ => " ---> (config)".to_string(),
        };
        on(BuildEvent::Note(note));
    }
    let doc = finish_document(&st);
    let rec = store.commit_image(&doc, &st.layers, &opts.tags)?;
    Ok(rec)
}

/// The layer directories so far, topmost first.
fn top_first(store: &ImageStore, st: &State) -> Result<Vec<PathBuf>, BuildError> {
    Ok(store
        .image_from_layers("build", &st.layers, &st.config)?
        .layers)
}

/// Collects a RUN's output for the progress stream.
struct Forward<'a> {
    on: &'a mut dyn FnMut(BuildEvent<'_>),
}

impl Write for Forward<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (self.on)(BuildEvent::Output(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs one RUN in a sandbox; its changes as a layer (`None` when it changed nothing).
fn run_step(
    store: &ImageStore,
    host: &BuildHost<'_>,
    profile: &Profile,
    st: &State,
    form: &CommandForm,
    on: &mut dyn FnMut(BuildEvent<'_>),
) -> Result<Option<LayerRecord>, BuildError> {
    let argv = form.argv();
    let command = argv.join(" ");
    if st.layers.is_empty() {
        return Err(BuildError::Sandbox {
            command,
            message: "RUN needs a base image (FROM scratch has no shell)".into(),
        });
    }
    let sandbox_err = |message: String| BuildError::Sandbox {
        command: command.clone(),
        message,
    };
    let image = store.image_from_layers("build", &st.layers, &st.config)?;
    let cwd = if st.config.working_dir.is_empty() {
        "/".to_string()
    } else {
        st.config.working_dir.clone()
    };
    let mut b = SandboxConfig::builder(image, profile.clone(), argv.clone())
        .cwd(Some(PathBuf::from(cwd)))
        .for_commit(true);
    // Build args are visible to RUN (not kept in the image), under the image's ENV.
    let env_keys: Vec<String> = st.config.env_pairs().into_iter().map(|(k, _)| k).collect();
    for (k, v) in &st.args {
        if !env_keys.contains(k) {
            b = b.env(k.clone(), v.clone());
        }
    }
    let config = b.build();
    let stdin: OwnedFd = std::fs::File::open("/dev/null")
        .map_err(|e| sandbox_err(e.to_string()))?
        .into();
    if !host.host.privilege.is_root() {
        return run_step_rootless(store, host, profile, &config, form, stdin, on).map_err(
            |e| match e {
                RootlessStepError::Build(b) => b,
                RootlessStepError::Sandbox(m) => sandbox_err(m),
            },
        );
    }
    let mut sandbox = Sandbox::create(
        &config,
        host.paths,
        host.host,
        SandboxStdio::Piped { stdin },
    )
    .map_err(|e| sandbox_err(e.to_string()))?;
    on(BuildEvent::Note(format!(
        " ---> Running in {}",
        agentrun_image::short_id(sandbox.id())
    )));
    let outcome = {
        let mut out = Forward { on: &mut *on };
        let mut sink = Vec::new();
        let r = sandbox.run(agentrun_runtime::RunIo {
            out: &mut out,
            err: &mut sink,
            timeout: profile.resources.timeout,
            signals: None,
        });
        (out.on)(BuildEvent::Output(&sink));
        r.map_err(|e| sandbox_err(e.to_string()))?
    };
    if outcome.exit_code != 0 {
        return Err(BuildError::RunFailed {
            command: match form {
                CommandForm::Shell(s) => format!("/bin/sh -c {s}"),
                CommandForm::Exec(v) => format!("{v:?}"),
            },
            code: outcome.exit_code,
        });
    }
    let upper = sandbox.upper_dir();
    let changed = std::fs::read_dir(&upper)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    let layer = if changed {
        Some(store.put_layer(|w| agentrun_image::tar_upper(&upper, UID_BASE, UID_COUNT, w))?)
    } else {
        None
    };
    sandbox.destroy().map_err(|e| sandbox_err(e.to_string()))?;
    Ok(layer)
}

/// Why a rootless RUN step failed: the builder's own error, or the sandbox's (its message).
enum RootlessStepError {
    Build(BuildError),
    Sandbox(String),
}

impl From<agentrun_runtime::RuntimeError> for RootlessStepError {
    fn from(e: agentrun_runtime::RuntimeError) -> Self {
        RootlessStepError::Sandbox(e.to_string())
    }
}

impl From<ImageError> for RootlessStepError {
    fn from(e: ImageError) -> Self {
        RootlessStepError::Build(e.into())
    }
}

/// A RUN step as an ordinary user: a rootless shell (as `agentrun exec`'s cold path makes)
/// and one cell running the command, whose writable layer (the cell overlay's upper
/// directory) the cell sends as it starts (`CellRequest::send_upper`) and is written
/// as the layer after the command ended, its owners shifted back through the shell's user
/// namespace mapping (the user is 0, its subordinate ids 1..), as root's build shifts its
/// sandbox uid range.
fn run_step_rootless(
    store: &ImageStore,
    host: &BuildHost<'_>,
    profile: &Profile,
    config: &SandboxConfig,
    form: &CommandForm,
    stdin: OwnedFd,
    on: &mut dyn FnMut(BuildEvent<'_>),
) -> Result<Option<LayerRecord>, RootlessStepError> {
    use agentrun_runtime::cellrun::{cell_request, MappingCache, RunMounts};
    use agentrun_runtime::control::{CellCommand, CellWork};
    let mut sandbox = Sandbox::create(config, host.paths, host.host, SandboxStdio::Shell)?;
    sandbox.start()?;
    on(BuildEvent::Note(format!(
        " ---> Running in {}",
        agentrun_image::short_id(sandbox.id())
    )));
    let mounts = RunMounts::prepare_for(
        &[],
        &mut MappingCache::new(),
        &host.host.privilege,
        sandbox.userns(),
    )?;
    let mut req = cell_request(
        profile,
        host.host.landlock_abi,
        &[],
        &mounts,
        None,
        CellWork::Run(CellCommand {
            argv: config.args.clone(),
            env: agentrun_runtime::cellrun::environment(
                profile,
                sandbox.image_config(),
                &config.env,
            ),
            cwd: config
                .cwd
                .as_ref()
                .map_or_else(|| "/".to_string(), |c| c.to_string_lossy().into_owned()),
            zygote: false,
        }),
    );
    *req.rlimits = sandbox.rlimit_fallback(&profile.resources, profile.resources.timeout);
    req.send_upper = true;
    let outcome = {
        let mut out = Forward { on: &mut *on };
        let mut sink = Vec::new();
        let r = sandbox.run_cell(
            &req,
            mounts,
            stdin,
            agentrun_runtime::RunIo {
                out: &mut out,
                err: &mut sink,
                timeout: profile.resources.timeout,
                signals: None,
            },
        );
        (out.on)(BuildEvent::Output(&sink));
        r?
    };
    if outcome.exit_code != 0 {
        return Err(RootlessStepError::Build(BuildError::RunFailed {
            command: match form {
                CommandForm::Shell(s) => format!("/bin/sh -c {s}"),
                CommandForm::Exec(v) => format!("{v:?}"),
            },
            code: outcome.exit_code,
        }));
    }
    let ids = sandbox
        .rootless_id_map()
        .ok_or_else(|| RootlessStepError::Sandbox("the shell's id mapping is unreadable".into()))?;
    let upper = sandbox.take_cell_upper().ok_or_else(|| {
        RootlessStepError::Sandbox("the cell's writable layer was not kept".into())
    })?;
    let upper_path = PathBuf::from(format!("/proc/self/fd/{}", upper.as_raw_fd()));
    let changed = std::fs::read_dir(&upper_path)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    let layer = if changed {
        Some(store.put_layer(|w| agentrun_image::tar_upper_mapped(&upper_path, &ids, w))?)
    } else {
        None
    };
    drop(upper);
    sandbox.destroy()?;
    Ok(layer)
}

/// The final OCI config document.
fn finish_document(st: &State) -> serde_json::Value {
    let mut doc = st.document.clone();
    let c = &st.config;
    let ports: serde_json::Map<String, serde_json::Value> = c
        .exposed_ports
        .iter()
        .map(|p| (p.clone(), serde_json::json!({})))
        .collect();
    let cfg = &mut doc["config"];
    if !cfg.is_object() {
        *cfg = serde_json::json!({});
    }
    cfg["Env"] = serde_json::json!(c.env);
    cfg["Cmd"] = serde_json::json!(c.cmd);
    cfg["Entrypoint"] = serde_json::json!(c.entrypoint);
    cfg["WorkingDir"] = serde_json::json!(c.working_dir);
    cfg["User"] = serde_json::json!(c.user);
    cfg["Labels"] = serde_json::json!(c.labels);
    cfg["ExposedPorts"] = serde_json::Value::Object(ports);
    if let Some(s) = &c.stop_signal {
        cfg["StopSignal"] = serde_json::json!(s);
    }
    doc["created"] = serde_json::json!(now());
    doc["rootfs"] = serde_json::json!({
        "type": "layers",
        "diff_ids": st.layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
    });
    doc["history"] = serde_json::json!(st.history);
    if doc["architecture"].is_null() {
        doc["architecture"] = serde_json::json!("amd64");
    }
    if doc["os"].is_null() {
        doc["os"] = serde_json::json!("linux");
    }
    doc
}

fn now() -> String {
    agentrun_image::rfc3339_now()
}
