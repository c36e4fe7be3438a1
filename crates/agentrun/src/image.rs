//! `agentrun image ...`: manage the local image store.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use agentrun_image::reference::{familiar, repo_and_tag};
use agentrun_image::{ImageConfig, ImageStore, PullOptions, UnpackLimits};
use anyhow::{bail, Context};
use clap::Subcommand;
use serde::Deserialize;

use crate::Paths;

#[derive(Subcommand, Debug)]
pub enum ImageCommand {
    /// Import the images of an OCI image layout (directory or tar) or a `docker save` tar.
    Import {
        file: PathBuf,
        /// Name the image REF (the archive must hold one image).
        #[arg(long, value_name = "REF")]
        name: Option<String>,
        /// No progress on stderr.
        #[arg(short, long)]
        quiet: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Pull an image from a registry (Docker config credentials; loopback registries over HTTP).
    Pull {
        reference: String,
        /// A registry (HOST:PORT) to reach over plain HTTP (repeatable).
        #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
        insecure_registries: Vec<String>,
        /// Network timeout per request, in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// No progress on stderr.
        #[arg(short, long)]
        quiet: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Make a one-layer image NAME from a root filesystem directory (copied into the store).
    Add {
        name: String,
        dir: PathBuf,
        /// The image's default command (repeat for each argument).
        #[arg(long = "cmd", value_name = "ARG", allow_hyphen_values = true)]
        cmd: Vec<String>,
        /// The image's entrypoint (repeat for each argument).
        #[arg(long = "entrypoint", value_name = "ARG", allow_hyphen_values = true)]
        entrypoint: Vec<String>,
        /// KEY=VALUE in the image's environment (repeatable). Without a PATH, the image gets
        /// PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin.
        #[arg(long = "env", value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// The image's working directory.
        #[arg(long)]
        workdir: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Build an image from a Dockerfile (the legacy builder: FROM a stored image, RUN in a
    /// sandbox without network, COPY/ADD from the context, ENV/WORKDIR/CMD/...).
    Build {
        /// The build context directory.
        context: PathBuf,
        /// Name the result (repeatable).
        #[arg(short, long = "tag", value_name = "REF")]
        tag: Vec<String>,
        /// The Dockerfile, relative to the context.
        #[arg(short = 'f', long = "file", default_value = "Dockerfile")]
        file: PathBuf,
        /// KEY=VALUE for an ARG (repeatable).
        #[arg(long = "build-arg", value_name = "KEY=VALUE")]
        build_arg: Vec<String>,
        /// Profile the RUN steps run under.
        #[arg(long, default_value = "build")]
        profile: String,
        /// Print only the image id (and no progress on stderr).
        #[arg(short, long)]
        quiet: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// List images.
    #[command(alias = "list")]
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Print image ids only.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Show everything the store knows about images, as JSON.
    Inspect {
        #[arg(required = true)]
        images: Vec<String>,
    },
    /// Give an image another name.
    Tag { source: String, target: String },
    /// Remove names or images (content nothing needs any more is deleted).
    #[command(alias = "rmi")]
    Rm {
        #[arg(required = true)]
        images: Vec<String>,
        /// Remove an image by id even when several names point at it.
        #[arg(short, long)]
        force: bool,
    },
    /// Remove images without a name, and content no image needs.
    Prune,
    /// Write images as an OCI image layout tar (readable by `ctr image import`, skopeo, docker).
    Export {
        #[arg(required = true)]
        images: Vec<String>,
        /// Output file (default: stdout, which must not be a terminal).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// No progress on stderr.
        #[arg(short, long)]
        quiet: bool,
    },
}

/// What unpacking may cost (`--max-*` flags, else `AGENTRUN_IMAGE_MAX_*`, else defaults):
/// the defence against decompression bombs and archives made to fill the store.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LimitArgs {
    /// Most bytes an archive, or the layers of one import or pull together, may unpack to
    /// (e.g. 64G, the default; 0: no limit) [env: AGENTRUN_IMAGE_MAX_BYTES]
    #[arg(long, value_name = "SIZE", value_parser = parse_limit_size)]
    max_bytes: Option<u64>,
    /// Most tar entries one operation may unpack (default 1000000; 0: no limit)
    /// [env: AGENTRUN_IMAGE_MAX_ENTRIES]
    #[arg(long, value_name = "N")]
    max_entries: Option<u64>,
    /// Most a compressed stream may expand, uncompressed bytes per compressed byte, once it
    /// has unpacked 64 MiB (default 100; 0: no limit) [env: AGENTRUN_IMAGE_MAX_RATIO]
    #[arg(long, value_name = "N")]
    max_ratio: Option<u64>,
    /// Most path components an entry may have (default 128; 0: no limit)
    /// [env: AGENTRUN_IMAGE_MAX_DEPTH]
    #[arg(long, value_name = "N")]
    max_depth: Option<u64>,
}

/// `[image_limits]` in `agentrun serve --config`: the same limits for the Docker API's pulls
/// and build contexts.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    max_bytes: Option<SizeValue>,
    max_entries: Option<u64>,
    max_ratio: Option<u64>,
    max_depth: Option<u64>,
}

/// A size in a config file: `"64G"` or a number of bytes.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

fn parse_limit_size(s: &str) -> Result<u64, agentrun_policy::UnitError> {
    if s.trim() == "0" {
        return Ok(0);
    }
    agentrun_policy::parse_bytes(s)
}

impl LimitArgs {
    /// The limits in force: each flag, else its environment variable, else `config`, else
    /// the default.
    pub fn resolve(&self, config: Option<&LimitConfig>) -> anyhow::Result<UnpackLimits> {
        let d = UnpackLimits::default();
        let config = config.cloned().unwrap_or_default();
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str| -> anyhow::Result<Option<u64>> {
            env(name)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .with_context(|| format!("{name}={v:?}: expected a whole number"))
                })
                .transpose()
        };
        // The flag, else AGENTRUN_IMAGE_MAX_<name>, else the config file's, else the default.
        let pick = |flag: Option<u64>, name: &str, config: Option<u64>, default: u64| {
            let env = number(&format!("AGENTRUN_IMAGE_MAX_{name}"))?;
            anyhow::Ok(flag.or(env).or(config).unwrap_or(default))
        };
        let config_bytes = match config.max_bytes {
            Some(SizeValue::Bytes(b)) => Some(b),
            Some(SizeValue::Text(t)) => Some(
                parse_limit_size(&t).map_err(|e| anyhow::anyhow!("image_limits.max_bytes: {e}"))?,
            ),
            None => None,
        };
        let env_bytes = env("AGENTRUN_IMAGE_MAX_BYTES")
            .map(|v| {
                parse_limit_size(&v).map_err(|e| anyhow::anyhow!("AGENTRUN_IMAGE_MAX_BYTES: {e}"))
            })
            .transpose()?;
        Ok(UnpackLimits {
            max_bytes: self
                .max_bytes
                .or(env_bytes)
                .or(config_bytes)
                .unwrap_or(d.max_bytes),
            max_entries: pick(
                self.max_entries,
                "ENTRIES",
                config.max_entries,
                d.max_entries,
            )?,
            max_ratio: pick(self.max_ratio, "RATIO", config.max_ratio, d.max_ratio)?,
            max_depth: pick(self.max_depth, "DEPTH", config.max_depth, d.max_depth)?,
        })
    }
}

/// The PATH an image made by `image add` gets unless told otherwise (Docker's default).
const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub fn run(cmd: ImageCommand, paths: &Paths) -> anyhow::Result<()> {
    let limits = match &cmd {
        ImageCommand::Import { limits, .. }
        | ImageCommand::Pull { limits, .. }
        | ImageCommand::Add { limits, .. }
        | ImageCommand::Build { limits, .. } => limits.resolve(None)?,
        _ => UnpackLimits::default(),
    };
    // Long commands show their layers' progress on stderr (see crate::progress).
    let quiet = match &cmd {
        ImageCommand::Import { quiet, .. }
        | ImageCommand::Pull { quiet, .. }
        | ImageCommand::Build { quiet, .. }
        | ImageCommand::Export { quiet, .. } => *quiet,
        _ => true,
    };
    let store = ImageStore::open(&paths.root)?
        .with_limits(limits)
        .with_progress(crate::progress::for_stderr(quiet));
    match cmd {
        ImageCommand::Import { file, name, .. } => {
            for (rec, names) in store.import(&file, name.as_deref())? {
                if names.is_empty() {
                    println!("Loaded image ID: {}", rec.id);
                }
                for n in names {
                    println!(
                        "Loaded image: {} ({})",
                        familiar(&n),
                        agentrun_image::short_id(&rec.id)
                    );
                }
            }
        }
        ImageCommand::Pull {
            reference,
            insecure_registries,
            timeout,
            ..
        } => {
            let opts = PullOptions {
                insecure_registries,
                timeout: Some(Duration::from_secs(timeout)),
            };
            let rec = store.pull(&reference, &opts)?;
            let full = agentrun_image::reference::normalize(&reference)?;
            println!("Digest: {}", rec.manifest_digest);
            println!(
                "Pulled: {} ({})",
                familiar(&full),
                agentrun_image::short_id(&rec.id)
            );
        }
        ImageCommand::Add {
            name,
            dir,
            cmd,
            entrypoint,
            env,
            workdir,
            ..
        } => {
            let mut env = env;
            for e in &env {
                if !e.contains('=') || e.starts_with('=') {
                    bail!("--env {e:?}: expected KEY=VALUE");
                }
            }
            if !env.iter().any(|e| e.starts_with("PATH=")) {
                env.insert(0, DEFAULT_PATH.to_owned());
            }
            let config = ImageConfig {
                cmd: (!cmd.is_empty()).then_some(cmd),
                entrypoint: (!entrypoint.is_empty()).then_some(entrypoint),
                env,
                working_dir: workdir.unwrap_or_default(),
                ..ImageConfig::default()
            };
            let rec = store.add_dir(&name, &dir, &config)?;
            println!("{}", rec.id);
        }
        ImageCommand::Build {
            context,
            tag,
            file,
            build_arg,
            profile,
            quiet,
            ..
        } => {
            let mut opts = agentrun_build::BuildOptions::new(context);
            opts.dockerfile = file;
            opts.tags = tag;
            opts.profile = profile;
            for kv in build_arg {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--build-arg {kv:?}: expected KEY=VALUE"))?;
                opts.build_args.insert(k.to_owned(), v.to_owned());
            }
            let runtime_paths = agentrun_runtime::RuntimePaths::new(&paths.state_dir);
            let host = agentrun_runtime::HostInfo::probe();
            let build_host = agentrun_build::BuildHost {
                paths: &runtime_paths,
                host: &host,
            };
            let mut stdout = std::io::stdout();
            let rec = agentrun_build::build(&store, &build_host, &opts, &mut |ev| {
                if quiet {
                    return;
                }
                match ev {
                    agentrun_build::BuildEvent::Step { index, total, text } => {
                        // Progress lines: a reader that went away (a closed pipe) is not an error of the command.
                        let _ = writeln!(stdout, "Step {index}/{total} : {text}");
                    }
                    agentrun_build::BuildEvent::Output(b) => {
                        let _ = stdout.write_all(b);
                    }
                    agentrun_build::BuildEvent::Note(n) => {
                        let _ = writeln!(stdout, "{n}");
                    }
                }
                let _ = stdout.flush();
            })?;
            if quiet {
                println!("{}", rec.id);
            } else {
                println!("Successfully built {}", agentrun_image::short_id(&rec.id));
                for t in &opts.tags {
                    println!(
                        "Successfully tagged {}",
                        familiar(&agentrun_image::reference::normalize(t)?)
                    );
                }
            }
        }
        ImageCommand::Ls { json, quiet } => {
            let images = store.list()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&images)?);
            } else if quiet {
                for i in images.iter().filter(|i| !i.id.is_empty()) {
                    println!("{}", agentrun_image::short_id(&i.id));
                }
            } else {
                println!(
                    "{:<40} {:<16} {:<14} {:>6} {:>10}",
                    "REPOSITORY", "TAG", "IMAGE ID", "LAYERS", "SIZE"
                );
                for i in images {
                    let id = if i.kind == "builtin" {
                        "(built-in)".to_string()
                    } else {
                        agentrun_image::short_id(&i.id).to_string()
                    };
                    let rows: Vec<(String, String)> = if i.kind == "builtin" {
                        vec![("host".into(), "-".into())]
                    } else if i.names.is_empty() {
                        vec![("<none>".into(), "<none>".into())]
                    } else {
                        i.names.iter().map(|n| repo_and_tag(n)).collect()
                    };
                    let size = if i.kind == "builtin" {
                        "-".into()
                    } else {
                        agentrun_image::docker_size(i.size)
                    };
                    for (repo, tag) in rows {
                        println!("{repo:<40} {tag:<16} {id:<14} {:>6} {size:>10}", i.layers);
                    }
                }
            }
        }
        ImageCommand::Inspect { images } => {
            let mut out = Vec::new();
            for name in images {
                let rec = store.find(&name)?;
                let names = store.names_of(&rec.id)?;
                let mut v = serde_json::to_value(&rec)?;
                v["names"] = serde_json::json!(names);
                out.push(v);
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        ImageCommand::Tag { source, target } => {
            let full = store.tag(&source, &target)?;
            println!("{}", familiar(&full));
        }
        ImageCommand::Rm { images, force } => {
            for name in images {
                for line in store.remove(&name, force)? {
                    println!("{line}");
                }
            }
        }
        ImageCommand::Prune => {
            let r = store.prune()?;
            for id in &r.images {
                println!("Deleted: {id}");
            }
            println!(
                "Removed {} layer(s) and {} blob(s), freed {}{}",
                r.layers,
                r.blobs,
                agentrun_image::docker_size(r.bytes),
                if r.layers_in_use > 0 {
                    format!("; {} layer(s) kept: in use by sandboxes", r.layers_in_use)
                } else {
                    String::new()
                }
            );
        }
        ImageCommand::Export { images, output, .. } => match output {
            Some(path) if path.as_os_str() != "-" => {
                let tmp = path.with_extension("partial");
                let file = std::fs::File::create(&tmp)
                    .with_context(|| format!("cannot create {}", tmp.display()))?;
                let mut w = std::io::BufWriter::new(file);
                let result = store.export(&images, &mut w).map_err(anyhow::Error::from);
                let result = result.and_then(|()| {
                    w.into_inner()
                        .map_err(|e| anyhow::anyhow!("writing {}: {}", tmp.display(), e.error()))?
                        .sync_all()?;
                    std::fs::rename(&tmp, &path)
                        .with_context(|| format!("cannot write {}", path.display()))
                });
                if result.is_err() {
                    // The write failed (that error is reported); a temp file left is harmless.
                    let _ = std::fs::remove_file(&tmp);
                }
                result?;
            }
            _ => {
                let stdout = std::io::stdout();
                if stdout.is_terminal() {
                    bail!("refusing to write a tar to a terminal: use -o FILE or redirect stdout");
                }
                let mut lock = stdout.lock();
                store.export(&images, &mut lock)?;
                lock.flush()?;
            }
        },
    }
    Ok(())
}
