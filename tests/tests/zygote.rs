//! The Python zygote (issue 14), end to end: the **differential corpus**.
//!
//! A profile with `[python] zygote = true` makes each pooled shell keep a pre-initialised
//! python3 (the image's own, its `preload` list imported) that forks the process of a run whose
//! command is exactly `python3 -c CODE [ARGS]`, `python3 FILE [ARGS]`, `python3 -m MOD [ARGS]`
//! or `python3` / `python3 - [ARGS]` reading a non-tty stdin, instead of an exec. Anything else
//! (other flags, other interpreters, start-up variables differing from the pool's: `PYTHON*`,
//! `LANG`, `LC_*`, `HOME`, `PATH`, and those a preloaded module reads at import, such as
//! `OPENBLAS_NUM_THREADS`) is exec'd as usual. The contract under test: **a program cannot tell**. Each
//! snippet of `tests/zygote/corpus/` runs through the zygote and then, back to back, with a
//! second profile identical but for `zygote = false`, on one `agentrun serve` (two pools of 2
//! shells), and stdout, stderr and the exit code (a death by signal N is 128+N) must be equal
//! byte for byte. Every zygote-side run's `sandbox.exec` span must say `sandbox.zygote=true`
//! (or, for a snippet that expects a fallback, `false` with `sandbox.zygote_fallback` naming the
//! flag or variable), else the comparison proves nothing. Every mismatch is reported in one
//! failure message.
//!
//! Corpus files (`tests/zygote/corpus/NNN-name.py`): the whole file is the program; it starts
//! with `# key: value` lines (the header ends at the first line that is not one):
//!
//! | key | meaning |
//! |---|---|
//! | `about` | what the snippet checks (shown in failures) |
//! | `mode` | `c` (`python3 -c FILE-CONTENT ARGS`), `file` (`python3 PATH ARGS`), `module` (`python3 -m MOD ARGS`), `stdin` (`python3`, the program on stdin), `stdin-dash` (`python3 - ARGS`, the program on stdin) |
//! | `path` | `file`/`module`: where the program is written in the workspace (`module` default: the module name's path + `.py`; `-`: nothing is written, e.g. a stdlib module) |
//! | `run` | `file`: the path given to python3 (default: `symlink`, else `path`) |
//! | `symlink` | `file`: a symlink made in the workspace to `path` |
//! | `module` | `module`: the module name |
//! | `args`, `flags` | JSON arrays: arguments after the program; interpreter options before it |
//! | `interpreter` | the command (default `python3`) |
//! | `env` | JSON object: `-e KEY=VALUE` for both sides |
//! | `cwd` | `--cwd` (default `/workspace`, the read-only workspace) |
//! | `stdin`, `stdin-hex` | the run's stdin: a JSON string (UTF-8), or hex bytes; default none (`/dev/null`) |
//! | `merge` | `true`: stdout and stderr are one pipe (their interleaving is compared) |
//! | `stdout` | `closed`: stdout is a pipe whose reader has exited (`agentrun ... \| true`) |
//! | `exit` | the exit code both sides must have (default 0) |
//! | `zygote` | what the zygote side's span must say: `yes` (default), `fallback [SUBSTRING of the reason]`, `any` |
//! | `differs` | an **expected difference**: both sides run, nothing is compared; the reason is the documentation |
//! | `zygote-stdout` | with `differs`: the zygote side's exact stdout (a JSON string) |
//!
//! The workspace (`--workspace`, read-only through the profiles' `workspace = "ro"`, so no run
//! leaves `__pycache__` for the next) holds `tests/zygote/workspace/` plus every `file` and
//! `module` snippet.
//!
//! Expected differences (the `differs` snippets: run, shown with `--nocapture`, not compared):
//! - the preload list is imported before the program starts: `'numpy' in sys.modules`
//!   (corpus/132, the zygote side's output is checked), and its import's side effects, such as
//!   the four warnings filters numpy adds (136; after the program's own `import numpy` both
//!   sides agree: 137); the path importer cache holds the zygote's lookups, not the run's (133);
//! - the zygote's own frames are below the program's (a pure-Python zygote cannot run code at
//!   depth 1): `sys._getframe().f_back`, `traceback.print_stack()` (051), RecursionError's
//!   "repeated N more times" (050), a warning whose stacklevel points past the program (147);
//! - `/proc/self/cmdline` is the zygote's (117): a fork keeps its parent's argv memory;
//! - OpenBLAS's worker threads do not survive the fork: 1 OS thread after `import numpy` (129);
//! - `hash()` of str/bytes: the seed is the zygote's, fixed when it started, so every run one
//!   zygote forks gets the same `hash('abc')` (an exec'd python3 draws a new seed per run);
//!   `each_zygote_run_gets_fresh_randomness` asserts exactly that, per shell.
//!
//! Values that must differ from run to run (random, secrets, uuid4, numpy.random,
//! tempfile names, urandom) are `each_zygote_run_gets_fresh_randomness`.
//!
//! `ZYGOTE_TEST_SHOW=1` prints every snippet's outputs (both sides) as it goes.
//!
//! `ZYGOTE_TEST_DRY=1`: both profiles leave out the `[python]` table (a binary without the
//! zygote refuses it), there is no warm-up and no `sandbox.zygote` assertion: both sides exec,
//! which checks the harness and that every snippet is deterministic.
//!
//! These tests need root (sandboxes) and the host's `/usr/bin/python3` with numpy
//! (`apt-get install python3-numpy`); they hold the exclusive e2e lock (a daemon).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use agentrun_e2e::otlp::{OtlpReceiver, ReceivedSpan};
use agentrun_e2e::*;

/// What the zygote imports ahead (the host has python3-numpy).
const PRELOAD: &[&str] = &["numpy"];
/// Shells per pool.
const POOL: usize = 2;
/// How long the first zygote may take to be ready (a debug build, numpy imported).
const WARMUP: Duration = Duration::from_secs(90);
/// One run's deadline.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the span of a finished run may take to arrive (the CLI exports before it exits).
const SPAN_WAIT: Duration = Duration::from_secs(10);
/// How often a zygote-side run that fell back with "not ready" (a fresh shell's zygote still
/// importing) is tried again, 250 ms apart.
const NOT_READY_RETRIES: usize = 60;

fn dry() -> bool {
    std::env::var("ZYGOTE_TEST_DRY").as_deref() == Ok("1")
}

// ---------------------------------------------------------------------------------------------
// The corpus

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    C,
    File,
    Module,
    Stdin,
    StdinDash,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    /// The zygote forked the run.
    Zygote,
    /// The run fell back to an exec, with a reason containing this (may be empty: any reason).
    Fallback(String),
    /// Not asserted.
    Any,
}

#[derive(Debug, Clone)]
struct Snippet {
    name: String,
    about: String,
    code: String,
    mode: Mode,
    /// Where the program is written in the workspace (`file`, `module`).
    path: Option<String>,
    /// `file`: the path given to python3.
    run: Option<String>,
    symlink: Option<String>,
    module: Option<String>,
    args: Vec<String>,
    flags: Vec<String>,
    interpreter: String,
    env: Vec<(String, String)>,
    cwd: String,
    stdin: Option<Vec<u8>>,
    merge: bool,
    /// stdout is a pipe with no reader.
    stdout_closed: bool,
    exit: Option<i32>,
    zygote: Expect,
    differs: Option<String>,
    zygote_stdout: Option<String>,
}

impl Snippet {
    /// A `-c` snippet with every default.
    fn c(name: &str, code: &str) -> Snippet {
        Snippet {
            name: name.to_owned(),
            about: String::new(),
            code: code.to_owned(),
            mode: Mode::C,
            path: None,
            run: None,
            symlink: None,
            module: None,
            args: Vec::new(),
            flags: Vec::new(),
            interpreter: "python3".into(),
            env: Vec::new(),
            cwd: "/workspace".into(),
            stdin: None,
            merge: false,
            stdout_closed: false,
            exit: Some(0),
            zygote: Expect::Zygote,
            differs: None,
            zygote_stdout: None,
        }
    }

    fn parse(name: &str, code: &str) -> Result<Snippet, String> {
        const KEYS: &[&str] = &[
            "about",
            "mode",
            "path",
            "run",
            "symlink",
            "module",
            "args",
            "flags",
            "interpreter",
            "env",
            "cwd",
            "stdin",
            "stdin-hex",
            "merge",
            "stdout",
            "exit",
            "zygote",
            "differs",
            "zygote-stdout",
        ];
        let mut s = Snippet::c(name, code);
        let mut mode = None;
        let mut seen = BTreeSet::new();
        for line in code.lines() {
            let Some(rest) = line.strip_prefix("# ") else {
                break;
            };
            let Some((key, value)) = rest.split_once(':') else {
                break;
            };
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
                break;
            }
            if !KEYS.contains(&key) {
                return Err(format!("unknown header key {key:?}"));
            }
            if !seen.insert(key) {
                return Err(format!("header key {key:?} given twice"));
            }
            let value = value.trim();
            let json = |what: &str| -> Result<serde_json::Value, String> {
                serde_json::from_str(value).map_err(|e| format!("{what}: {value:?}: {e}"))
            };
            let strings = |v: serde_json::Value, what: &str| -> Result<Vec<String>, String> {
                v.as_array()
                    .ok_or_else(|| format!("{what}: not a JSON array"))?
                    .iter()
                    .map(|a| {
                        a.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| format!("{what}: {a} is not a string"))
                    })
                    .collect()
            };
            match key {
                "about" => s.about = value.to_owned(),
                "mode" => {
                    mode = Some(match value {
                        "c" => Mode::C,
                        "file" => Mode::File,
                        "module" => Mode::Module,
                        "stdin" => Mode::Stdin,
                        "stdin-dash" => Mode::StdinDash,
                        other => return Err(format!("unknown mode {other:?}")),
                    })
                }
                "path" => s.path = Some(value.to_owned()),
                "run" => s.run = Some(value.to_owned()),
                "symlink" => s.symlink = Some(value.to_owned()),
                "module" => s.module = Some(value.to_owned()),
                "args" => s.args = strings(json("args")?, "args")?,
                "flags" => s.flags = strings(json("flags")?, "flags")?,
                "interpreter" => s.interpreter = value.to_owned(),
                "env" => {
                    let v = json("env")?;
                    let obj = v.as_object().ok_or("env: not a JSON object")?;
                    s.env = obj
                        .iter()
                        .map(|(k, v)| {
                            v.as_str()
                                .map(|v| (k.clone(), v.to_owned()))
                                .ok_or_else(|| format!("env: {k}: not a string"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                "cwd" => s.cwd = value.to_owned(),
                "stdin" => {
                    let v = json("stdin")?;
                    let text = v.as_str().ok_or("stdin: not a JSON string")?;
                    s.stdin = Some(text.as_bytes().to_vec());
                }
                "stdin-hex" => {
                    let bytes = value
                        .split_whitespace()
                        .map(|h| {
                            u8::from_str_radix(h, 16).map_err(|e| format!("stdin-hex {h:?}: {e}"))
                        })
                        .collect::<Result<Vec<u8>, String>>()?;
                    s.stdin = Some(bytes);
                }
                "merge" => {
                    s.merge = match value {
                        "true" => true,
                        "false" => false,
                        _ => return Err(format!("merge: {value:?} is not true or false")),
                    }
                }
                "stdout" => {
                    if value != "closed" {
                        return Err(format!("stdout: {value:?} is not closed"));
                    }
                    s.stdout_closed = true;
                }
                "exit" => s.exit = Some(value.parse().map_err(|e| format!("exit {value:?}: {e}"))?),
                "zygote" => {
                    s.zygote = match value.split_once(' ') {
                        _ if value == "yes" => Expect::Zygote,
                        _ if value == "any" => Expect::Any,
                        _ if value == "fallback" => Expect::Fallback(String::new()),
                        Some(("fallback", sub)) => Expect::Fallback(sub.trim().to_owned()),
                        _ => return Err(format!("zygote: {value:?}")),
                    }
                }
                "differs" => s.differs = Some(value.to_owned()),
                "zygote-stdout" => {
                    let v = json("zygote-stdout")?;
                    s.zygote_stdout = Some(
                        v.as_str()
                            .ok_or("zygote-stdout: not a JSON string")?
                            .to_owned(),
                    );
                }
                _ => unreachable!(),
            }
        }
        s.mode = mode.ok_or("no `# mode:` line")?;
        match s.mode {
            Mode::File => {
                if s.path.is_none() {
                    return Err("mode file needs `# path:`".into());
                }
            }
            Mode::Module => {
                let m = s.module.clone().ok_or("mode module needs `# module:`")?;
                if s.path.is_none() {
                    s.path = Some(format!("{}.py", m.replace('.', "/")));
                }
            }
            Mode::Stdin | Mode::StdinDash => {
                if s.stdin.is_some() {
                    return Err("the stdin modes read the program from stdin".into());
                }
                if s.mode == Mode::Stdin && !s.args.is_empty() {
                    return Err("mode stdin takes no args (use stdin-dash)".into());
                }
            }
            Mode::C => {}
        }
        if s.mode != Mode::File && (s.run.is_some() || s.symlink.is_some()) {
            return Err("`run` and `symlink` are for mode file".into());
        }
        if s.mode == Mode::C && s.path.is_some() {
            return Err("mode c takes no path".into());
        }
        if s.merge && s.stdout_closed {
            return Err("merge and stdout: closed do not go together".into());
        }
        if s.zygote_stdout.is_some() && s.differs.is_none() {
            return Err("zygote-stdout goes with differs".into());
        }
        Ok(s)
    }

    /// The command line in the sandbox.
    fn argv(&self) -> Vec<String> {
        let mut v = vec![self.interpreter.clone()];
        v.extend(self.flags.iter().cloned());
        match self.mode {
            Mode::C => {
                v.push("-c".into());
                v.push(self.code.clone());
            }
            Mode::File => v.push(
                self.run
                    .clone()
                    .or_else(|| self.symlink.clone())
                    .or_else(|| self.path.clone())
                    .unwrap(),
            ),
            Mode::Module => {
                v.push("-m".into());
                v.push(self.module.clone().unwrap());
            }
            Mode::Stdin => {}
            Mode::StdinDash => v.push("-".into()),
        }
        v.extend(self.args.iter().cloned());
        v
    }

    /// `agentrun exec` options (less the profile and workspace) and argv, for messages; a
    /// `-c` program is shown as `<program>`.
    fn command_line(&self) -> String {
        let mut v = vec!["agentrun exec".to_string(), format!("--cwd {}", self.cwd)];
        for (k, val) in &self.env {
            v.push(format!("-e {k}={val:?}"));
        }
        v.push("--".into());
        let mut argv = self.argv();
        if self.mode == Mode::C {
            let at = 1 + self.flags.len() + 1;
            argv[at] = "<program>".into();
        }
        v.push(format!("{argv:?}"));
        v.join(" ")
    }

    /// The run's stdin.
    fn stdin_data(&self) -> Option<Vec<u8>> {
        match self.mode {
            Mode::Stdin | Mode::StdinDash => Some(self.code.as_bytes().to_vec()),
            _ => self.stdin.clone(),
        }
    }

    /// What this snippet writes into the workspace: (relative path, content), and a symlink.
    fn files(&self) -> Vec<(String, Option<String>)> {
        let mut v = Vec::new();
        if let Some(p) = self.path.as_deref().filter(|p| *p != "-") {
            v.push((p.to_owned(), None));
            if let Some(link) = &self.symlink {
                v.push((link.clone(), Some(p.to_owned())));
            }
        }
        v
    }
}

fn zygote_dir() -> PathBuf {
    workspace_root().join("tests/zygote")
}

fn load_corpus() -> Vec<Snippet> {
    let dir = zygote_dir().join("corpus");
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect();
    paths.sort();
    let mut errors = Vec::new();
    let mut corpus = Vec::new();
    for p in paths {
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        let code = fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        match Snippet::parse(&name, &code) {
            Ok(s) => corpus.push(s),
            Err(e) => errors.push(format!("{}: {e}", p.display())),
        }
    }
    assert!(
        errors.is_empty(),
        "bad corpus files:\n{}",
        errors.join("\n")
    );
    corpus
}

#[test]
fn corpus_files_parse() {
    let corpus = load_corpus();
    assert!(
        corpus.len() >= 60,
        "the corpus has {} snippets, fewer than 60",
        corpus.len()
    );
    let mut written = BTreeMap::new();
    for s in &corpus {
        for (p, _) in s.files() {
            if let Some(other) = written.insert(p.clone(), s.name.clone()) {
                panic!("{} and {other} both write {p} in the workspace", s.name);
            }
        }
    }
    let modes: BTreeSet<String> = corpus.iter().map(|s| format!("{:?}", s.mode)).collect();
    assert_eq!(modes.len(), 5, "every mode is used: {modes:?}");
}

// ---------------------------------------------------------------------------------------------
// The harness: two profiles, one daemon with a pool of each, an OTLP receiver

fn profile_text(zygote: bool) -> String {
    let mut t = String::from(
        r#"# tests/tests/zygote.rs: the default profile with a read-only workspace and [python]
[filesystem]
workspace = "ro"
readable = ["/"]
writable = ["/tmp", "/var/tmp", "/dev/shm"]
hidden = []

[network]
mode = "none"

[resources]
memory = "1G"
pids = 512
cpus = 2.0
tmpfs_size = "256M"
nofile = 1024

[env]
defaults = { PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", HOME = "/root", LANG = "C.UTF-8" }

[seccomp]
baseline = "default"
"#,
    );
    if !dry() {
        let preload: Vec<String> = PRELOAD.iter().map(|m| format!("{m:?}")).collect();
        write!(
            t,
            "\n[python]\nzygote = {zygote}\npreload = [{}]\n",
            preload.join(", ")
        )
        .unwrap();
    }
    t
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// Copies `from` into `to` (files 0644, dirs 0755).
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    chmod(to, 0o755);
    for e in fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            copy_tree(&src, &dst);
        } else {
            fs::copy(&src, &dst).unwrap();
            chmod(&dst, 0o644);
        }
    }
}

/// Writes `rel` under `root` (parents 0755, the file 0644).
fn write_file(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    let mut dir = p.parent().unwrap().to_path_buf();
    fs::create_dir_all(&dir).unwrap();
    while dir.starts_with(root) {
        chmod(&dir, 0o755);
        if !dir.pop() {
            break;
        }
    }
    assert!(!p.exists(), "{} written twice", p.display());
    fs::write(&p, content).unwrap();
    chmod(&p, 0o644);
}

fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("read /dev/urandom");
    b[0] |= 1;
    agentrun_e2e::otlp::hex(&b)
}

/// A command writing stdout and stderr to one pipe (`sh -c 'exec "$@" 2>&1'`).
fn merged(cmd: Command) -> Command {
    wrapped("/bin/sh", "exec \"$@\" 2>&1", cmd)
}

/// A command whose stdout is a pipe to `true` (no reader once it exited); its exit status is
/// the command's (`bash -o pipefail`).
fn stdout_closed(cmd: Command) -> Command {
    wrapped("/bin/bash", "set -o pipefail; \"$@\" | true", cmd)
}

/// `cmd` run by `shell -c script` as `"$@"`, with `cmd`'s environment changes.
fn wrapped(shell: &str, script: &str, cmd: Command) -> Command {
    let mut sh = Command::new(shell);
    sh.arg("-c")
        .arg(script)
        .arg(shell)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    sh
}

/// One run and its span.
struct Run {
    out: RunOutput,
    span: Option<ReceivedSpan>,
}

impl Run {
    fn zygote(&self) -> Option<&str> {
        self.span
            .as_ref()?
            .attributes
            .get("sandbox.zygote")
            .map(String::as_str)
    }
    fn reason(&self) -> &str {
        self.span
            .as_ref()
            .and_then(|s| s.attributes.get("sandbox.zygote_fallback"))
            .map(String::as_str)
            .unwrap_or("")
    }
    fn sandbox_id(&self) -> String {
        self.span
            .as_ref()
            .and_then(|s| s.attributes.get("sandbox.id"))
            .cloned()
            .unwrap_or_default()
    }
    fn describe_span(&self) -> String {
        match &self.span {
            None => "no sandbox.exec span".into(),
            Some(s) => format!(
                "sandbox.zygote={:?} ({:?}) sandbox.zygote_fallback={:?} sandbox.id={:?} sandbox.pool_hit={:?}",
                s.attributes.get("sandbox.zygote"),
                s.attribute_types.get("sandbox.zygote"),
                s.attributes.get("sandbox.zygote_fallback"),
                s.attributes.get("sandbox.id"),
                s.attributes.get("sandbox.pool_hit"),
            ),
        }
    }
}

enum Verdict {
    Ok,
    /// Fell back because the shell's zygote is not ready yet: try again.
    NotReady,
    Bad(String),
}

/// What the zygote side's span says against what the snippet expects.
fn judge(expect: &Expect, run: &Run) -> Verdict {
    let Some(span) = &run.span else {
        return Verdict::Bad("no sandbox.exec span for the run".into());
    };
    if *expect == Expect::Any {
        return Verdict::Ok;
    }
    let ty = |k: &str| span.attribute_types.get(k).copied().unwrap_or("missing");
    if ty("sandbox.zygote") != "bool" {
        return Verdict::Bad(format!(
            "sandbox.zygote is not a bool attribute: {}",
            run.describe_span()
        ));
    }
    let reason = run.reason();
    if span.attributes.contains_key("sandbox.zygote_fallback")
        && ty("sandbox.zygote_fallback") != "string"
    {
        return Verdict::Bad(format!(
            "sandbox.zygote_fallback is not a string attribute: {}",
            run.describe_span()
        ));
    }
    // Not ready (still importing), or a pool miss's one-run shell (it starts no zygote):
    // the run is retried on a pooled shell.
    let not_ready = reason.contains("not ready") || reason.contains("not running");
    match (expect, run.zygote()) {
        (Expect::Zygote, Some("true")) if reason.is_empty() => Verdict::Ok,
        (Expect::Zygote, Some("true")) => Verdict::Bad(format!(
            "the zygote forked the run but a fallback reason is set: {}",
            run.describe_span()
        )),
        (Expect::Zygote, _) if not_ready => Verdict::NotReady,
        (Expect::Zygote, _) => Verdict::Bad(format!(
            "expected the zygote to fork the run: {}",
            run.describe_span()
        )),
        (Expect::Fallback(sub), Some("false"))
            if !reason.is_empty() && reason.contains(sub.as_str()) =>
        {
            Verdict::Ok
        }
        (Expect::Fallback(_), Some("false")) if not_ready => Verdict::NotReady,
        (Expect::Fallback(sub), _) => Verdict::Bad(format!(
            "expected a fallback whose reason names {sub:?}: {}",
            run.describe_span()
        )),
        (Expect::Any, _) => Verdict::Ok,
    }
}

struct Harness {
    // Dropped first: the daemon (its cells mount the workspace and read the profiles).
    d: Daemon,
    rx: OtlpReceiver,
    on: PathBuf,
    off: PathBuf,
    ws: PathBuf,
    _dirs: tempfile::TempDir,
}

impl Harness {
    /// Profiles, the workspace (support files plus the snippets' files), a daemon with a pool
    /// of each profile (`with_off`) or of the zygote profile only.
    fn start(corpus: &[Snippet], with_off: bool) -> Harness {
        let dirs = tempdir();
        chmod(dirs.path(), 0o755);
        let on = dirs.path().join("zygote-on.toml");
        let off = dirs.path().join("zygote-off.toml");
        fs::write(&on, profile_text(true)).unwrap();
        fs::write(&off, profile_text(false)).unwrap();
        chmod(&on, 0o644);
        chmod(&off, 0o644);
        let ws = dirs.path().join("ws");
        copy_tree(&zygote_dir().join("workspace"), &ws);
        for s in corpus {
            for (rel, link) in s.files() {
                match link {
                    None => write_file(&ws, &rel, &s.code),
                    Some(target) => {
                        let at = ws.join(&rel);
                        let target = pathdiff(&ws.join(&target), at.parent().unwrap());
                        std::os::unix::fs::symlink(&target, &at)
                            .unwrap_or_else(|e| panic!("symlink {}: {e}", at.display()));
                    }
                }
            }
        }
        let rx = OtlpReceiver::grpc();
        let mut d = Daemon::unstarted();
        for (k, v) in rx.otel_env() {
            d.set_env(k, v);
        }
        let mut args = vec![
            "--pool".to_string(),
            format!("host:{}={POOL}", on.display()),
        ];
        if with_off {
            args.push("--pool".into());
            args.push(format!("host:{}={POOL}", off.display()));
        }
        d.launch(args);
        Harness {
            d,
            rx,
            on,
            off,
            ws,
            _dirs: dirs,
        }
    }

    /// The span of the run whose trace is `trace`.
    fn span(&self, trace: &str) -> Option<ReceivedSpan> {
        let deadline = Instant::now() + SPAN_WAIT;
        loop {
            let found: Vec<ReceivedSpan> = self
                .rx
                .spans()
                .into_iter()
                .filter(|s| s.name == "sandbox.exec" && s.trace_id == trace)
                .collect();
            if let Some(s) = found.into_iter().next() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Runs `s` once with `profile`.
    fn run(&self, profile: &Path, s: &Snippet) -> Run {
        let trace = random_hex(16);
        let mut opts: Vec<String> = vec![
            "--profile".into(),
            profile.display().to_string(),
            "--workspace".into(),
            self.ws.display().to_string(),
            "--cwd".into(),
            s.cwd.clone(),
        ];
        for (k, v) in &s.env {
            opts.push("-e".into());
            opts.push(format!("{k}={v}"));
        }
        let a = self
            .d
            .exec_with(opts, s.argv())
            .env("TRACEPARENT", format!("00-{trace}-{}-01", random_hex(8)))
            .timeout(RUN_TIMEOUT);
        let out = if s.merge {
            run_with_timeout(merged(a.command()), s.stdin_data(), RUN_TIMEOUT)
        } else if s.stdout_closed {
            run_with_timeout(stdout_closed(a.command()), s.stdin_data(), RUN_TIMEOUT)
        } else {
            match s.stdin_data() {
                Some(data) => a.stdin(data).run(),
                None => a.run(),
            }
        };
        let span = self.span(&trace);
        Run { out, span }
    }

    /// Runs `s` through the zygote profile; a run that fell back because its shell's zygote
    /// was not ready yet is tried again. Returns the run and how many were tried again, or
    /// what is wrong with it.
    fn run_zygote(&self, s: &Snippet) -> (Run, usize, Option<String>) {
        let mut retries = 0;
        loop {
            let run = self.run(&self.on, s);
            if dry() {
                let bad = run
                    .span
                    .is_none()
                    .then(|| "no sandbox.exec span for the run".into());
                return (run, retries, bad);
            }
            match judge(&s.zygote, &run) {
                Verdict::Ok => return (run, retries, None),
                Verdict::Bad(why) => return (run, retries, Some(why)),
                Verdict::NotReady if retries < NOT_READY_RETRIES => {
                    retries += 1;
                    thread::sleep(Duration::from_millis(250));
                }
                Verdict::NotReady => {
                    let why = format!(
                        "still \"not ready\" after {retries} retries: {}",
                        run.describe_span()
                    );
                    return (run, retries, Some(why));
                }
            }
        }
    }

    /// Runs `print(1)` through the zygote profile until the zygote forks one (at most
    /// [`WARMUP`]).
    fn warm_up(&self) {
        if dry() {
            return;
        }
        let s = Snippet::c("warm-up", "print(1)");
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < WARMUP {
            let run = self.run(&self.on, &s);
            assert_eq!(run.out.success(), "1\n", "warm-up run\n{}", self.d.log());
            if run.zygote() == Some("true") {
                eprintln!("zygote ready after {:.1}s", start.elapsed().as_secs_f64());
                return;
            }
            last = run.describe_span();
            thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "no run was forked by the zygote within {:.0}s; the last run's span: {last}\n{}",
            WARMUP.as_secs_f64(),
            self.d.log()
        );
    }
}

/// `to` relative to the directory `from` (both under one root, no `..` in either).
fn pathdiff(to: &Path, from: &Path) -> PathBuf {
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut p = PathBuf::new();
    for _ in common..from.len() {
        p.push("..");
    }
    for c in &to[common..] {
        p.push(c);
    }
    p
}

// ---------------------------------------------------------------------------------------------
// Reporting

/// Bytes as text, invalid UTF-8 as `\xNN`, clipped.
fn show_bytes(b: &[u8]) -> String {
    const MAX: usize = 3000;
    let mut s = String::new();
    for chunk in b.utf8_chunks() {
        s.push_str(chunk.valid());
        for x in chunk.invalid() {
            write!(s, "\\x{x:02x}").unwrap();
        }
    }
    if s.len() > MAX {
        let mut end = MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}... [{} bytes in all]", &s[..end], b.len())
    } else {
        s
    }
}

fn status(out: &RunOutput) -> String {
    match (out.status.code(), out.status.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (_, Some(sig)) => format!("killed by signal {sig}"),
        _ => format!("{:?}", out.status),
    }
}

fn show(out: &RunOutput) -> String {
    format!(
        "{}{}\n  --- stdout ---\n{}\n  --- stderr ---\n{}",
        status(out),
        if out.pipes_left_open {
            " (stdout/stderr still open after exit)"
        } else {
            ""
        },
        show_bytes(&out.stdout),
        show_bytes(&out.stderr)
    )
}

/// Where two byte strings first differ: "byte N, line L".
fn first_difference(a: &[u8], b: &[u8]) -> Option<String> {
    let n = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    if n == a.len() && n == b.len() {
        return None;
    }
    let line = a[..n].iter().filter(|c| **c == b'\n').count() + 1;
    Some(format!("first difference at byte {n}, line {line}"))
}

/// A line diff of `off` (`-`) against `zygote` (`+`), at most `max` lines shown; None when the
/// outputs are too long to diff here.
fn line_diff(zygote: &[u8], off: &[u8], max: usize) -> Option<String> {
    let z: Vec<&[u8]> = zygote.split_inclusive(|b| *b == b'\n').collect();
    let o: Vec<&[u8]> = off.split_inclusive(|b| *b == b'\n').collect();
    if z.len() * o.len() > 4_000_000 {
        return None;
    }
    // lcs[i][j]: longest common subsequence of o[i..] and z[j..].
    let mut lcs = vec![vec![0u32; z.len() + 1]; o.len() + 1];
    for i in (0..o.len()).rev() {
        for j in (0..z.len()).rev() {
            lcs[i][j] = if o[i] == z[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out, mut shown) = (0, 0, String::new(), 0);
    let mut line = |sign: char, l: &[u8], out: &mut String| {
        if shown < max {
            let text = show_bytes(l);
            writeln!(
                out,
                "    {sign} {}",
                text.strip_suffix('\n').unwrap_or(&text)
            )
            .unwrap();
        }
        shown += 1;
    };
    while i < o.len() || j < z.len() {
        if i < o.len() && j < z.len() && o[i] == z[j] {
            i += 1;
            j += 1;
        } else if i < o.len() && (j == z.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            line('-', o[i], &mut out);
            i += 1;
        } else {
            line('+', z[j], &mut out);
            j += 1;
        }
    }
    if shown > max {
        writeln!(out, "    ... {} more lines differ", shown - max).unwrap();
    }
    Some(out)
}

fn same(a: &RunOutput, b: &RunOutput) -> bool {
    a.status.code() == b.status.code()
        && a.status.signal() == b.status.signal()
        && a.stdout == b.stdout
        && a.stderr == b.stderr
}

// ---------------------------------------------------------------------------------------------
// The tests

#[test]
fn corpus_is_identical_with_and_without_the_zygote() {
    let Some(_l) = setup_exclusive() else { return };
    let corpus = load_corpus();
    assert!(corpus.len() >= 60, "only {} snippets", corpus.len());
    let h = Harness::start(&corpus, true);
    let start = Instant::now();
    h.warm_up();
    let warm = start.elapsed();

    let mut failures: Vec<String> = Vec::new();
    let mut documented: Vec<String> = Vec::new();
    let mut retries = 0;
    let (mut forked, mut fell_back) = (0, 0);
    let corpus_start = Instant::now();
    for s in &corpus {
        let (z, tried_again, bad) = h.run_zygote(s);
        retries += tried_again;
        let o = h.run(&h.off, s);
        let head = format!(
            "{} ({})\n  command: {}{}",
            s.name,
            s.about,
            s.command_line(),
            if s.merge {
                " (stdout+stderr merged)"
            } else if s.stdout_closed {
                " (stdout: a pipe with no reader)"
            } else {
                ""
            }
        );
        match z.zygote() {
            Some("true") => forked += 1,
            Some("false") => fell_back += 1,
            _ => {}
        }
        if let Some(why) = bad {
            failures.push(format!("{head}\n  ZYGOTE SIDE: {why}\n  {}", show(&z.out)));
        }
        if o.span.is_none() {
            failures.push(format!(
                "{head}\n  no sandbox.exec span for the zygote-off run"
            ));
        }
        for (side, r) in [("zygote", &z), ("zygote-off", &o)] {
            if r.out.pipes_left_open {
                failures.push(format!(
                    "{head}\n  {side} side: pipes left open\n  {}",
                    show(&r.out)
                ));
            }
        }
        if std::env::var_os("ZYGOTE_TEST_SHOW").is_some() {
            eprintln!(
                "{head}\n  zygote side ({}): {}\n  zygote-off side: {}\n",
                z.describe_span(),
                show(&z.out),
                show(&o.out)
            );
        }
        if let Some(reason) = &s.differs {
            let mut note = format!(
                "{head}\n  EXPECTED DIFFERENCE: {reason}\n  zygote side: {}\n  zygote-off side: {}",
                show(&z.out),
                show(&o.out)
            );
            if let (Some(want), false) = (&s.zygote_stdout, dry()) {
                if z.out.stdout != want.as_bytes() {
                    failures.push(format!(
                        "{head}\n  the zygote side's stdout is not the documented {want:?}\n  {}",
                        show(&z.out)
                    ));
                }
            }
            note.push('\n');
            documented.push(note);
            continue;
        }
        if let Some(code) = s.exit {
            for (side, r) in [("zygote", &z), ("zygote-off", &o)] {
                if r.out.status.code() != Some(code) {
                    failures.push(format!(
                        "{head}\n  {side} side: expected exit {code}\n  {}",
                        show(&r.out)
                    ));
                }
            }
        }
        if !same(&z.out, &o.out) {
            let mut diff = Vec::new();
            if status(&z.out) != status(&o.out) {
                diff.push(format!("status {} vs {}", status(&z.out), status(&o.out)));
            }
            if let Some(d) = first_difference(&z.out.stdout, &o.out.stdout) {
                diff.push(format!("stdout: {d}"));
            }
            if let Some(d) = first_difference(&z.out.stderr, &o.out.stderr) {
                diff.push(format!("stderr: {d}"));
            }
            let mut lines = String::new();
            for (what, zo, oo) in [
                ("stdout", &z.out.stdout, &o.out.stdout),
                ("stderr", &z.out.stderr, &o.out.stderr),
            ] {
                if zo != oo {
                    if let Some(d) = line_diff(zo, oo, 40) {
                        write!(lines, "  {what} (- zygote-off, + zygote):\n{d}").unwrap();
                    }
                }
            }
            failures.push(format!(
                "{head}\n  MISMATCH ({})\n{lines}  zygote side ({}): {}\n  zygote-off side: {}",
                diff.join("; "),
                z.describe_span(),
                show(&z.out),
                show(&o.out)
            ));
        }
    }
    let corpus_time = corpus_start.elapsed();
    let unpooled = h.d.unpooled();
    if unpooled != 0 {
        failures.push(format!(
            "{unpooled} runs were not served by the two pools (unpooled): the profile paths \
             did not match the pools' ({}, {})",
            h.on.display(),
            h.off.display()
        ));
    }
    eprintln!(
        "zygote corpus: {} snippets{}, warm-up {:.1}s, corpus {:.1}s; zygote side: {forked} \
         forked, {fell_back} fell back, {retries} runs tried again (not ready)",
        corpus.len(),
        if dry() {
            " (ZYGOTE_TEST_DRY: both sides exec)"
        } else {
            ""
        },
        warm.as_secs_f64(),
        corpus_time.as_secs_f64()
    );
    for n in &documented {
        eprintln!("{n}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} snippets failed{}:\n\n{}\n\n{}",
        failures.len(),
        corpus.len(),
        if dry() { " (ZYGOTE_TEST_DRY)" } else { "" },
        failures.join("\n\n"),
        h.d.log()
    );
}

/// Every zygote run must draw fresh random state (what a fresh interpreter would seed anew),
/// while `hash()` keeps the zygote's seed: the documented difference, asserted per shell.
#[test]
fn each_zygote_run_gets_fresh_randomness() {
    let Some(_l) = setup_exclusive() else { return };
    let code = fs::read_to_string(zygote_dir().join("fresh-values.py")).unwrap();
    let s = Snippet::c("fresh-values", &code);
    let h = Harness::start(&[], false);
    h.warm_up();

    let mut runs: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    let mut failures = Vec::new();
    let shared_shell = |runs: &[(String, BTreeMap<String, String>)]| {
        let ids: BTreeSet<&String> = runs.iter().map(|(id, _)| id).collect();
        ids.len() < runs.len()
    };
    while runs.len() < 3 || (!shared_shell(&runs) && runs.len() < 10) {
        let (run, _, bad) = h.run_zygote(&s);
        if let Some(why) = bad {
            failures.push(format!("run {}: {why}", runs.len() + 1));
        }
        let out = run.out.success();
        assert!(run.out.stderr.is_empty(), "{}", run.out);
        let values: BTreeMap<String, String> = out
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(values.len(), 11, "{}", run.out);
        runs.push((run.sandbox_id(), values));
    }
    let table: String = runs
        .iter()
        .enumerate()
        .map(|(i, (id, v))| format!("  run {} on {id}: {v:?}\n", i + 1))
        .collect();
    if !dry() && !shared_shell(&runs) {
        failures.push(format!(
            "no two of {} runs were on one shell: fresh values per fork are not told apart \
             from fresh values per zygote",
            runs.len()
        ));
    }
    for key in runs[0].1.keys() {
        let values: Vec<&String> = runs.iter().map(|(_, v)| &v[key]).collect();
        if key == "hash" {
            // The documented difference: one zygote, one hash seed.
            if !dry() {
                let mut by_shell: BTreeMap<&String, BTreeSet<&String>> = BTreeMap::new();
                for (id, v) in &runs {
                    by_shell.entry(id).or_default().insert(&v[key]);
                }
                for (id, hashes) in by_shell {
                    if hashes.len() != 1 {
                        failures.push(format!(
                            "hash('abc') differs between runs of one shell {id} (documented: the \
                             zygote's seed): {hashes:?}"
                        ));
                    }
                }
            }
            continue;
        }
        let distinct: BTreeSet<&&String> = values.iter().collect();
        if distinct.len() != values.len() {
            failures.push(format!("{key}: a value repeats across runs: {values:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\nruns:\n{table}\n{}",
        failures.join("\n"),
        h.d.log()
    );
    eprintln!(
        "fresh values{}:\n{table}",
        if dry() { " (ZYGOTE_TEST_DRY)" } else { "" }
    );
}

#[test]
fn parse_examples() {
    let s = Snippet::parse(
        "x",
        "# about: t\n# mode: file\n# path: a/b.py\n# symlink: l.py\n# args: [\"1\", \"\"]\n# env: {\"A\": \"b\"}\n# zygote: fallback -I\n# stdin-hex: ff 00\n# a comment, not a header\n# mode: c\nprint(1)\n",
    )
    .unwrap();
    assert_eq!(s.argv(), ["python3", "l.py", "1", ""]);
    assert_eq!(s.zygote, Expect::Fallback("-I".into()));
    assert_eq!(s.stdin, Some(vec![0xff, 0]));
    assert_eq!(s.env, [("A".to_string(), "b".to_string())]);
    assert_eq!(
        s.files(),
        [
            ("a/b.py".to_string(), None),
            ("l.py".to_string(), Some("a/b.py".to_string()))
        ]
    );
    let m = Snippet::parse(
        "m",
        "# mode: module\n# module: p.q\n# flags: [\"-X\", \"dev\"]\n",
    )
    .unwrap();
    assert_eq!(m.argv(), ["python3", "-X", "dev", "-m", "p.q"]);
    assert_eq!(m.path.as_deref(), Some("p/q.py"));
    let d = Snippet::parse("d", "# mode: stdin-dash\n# args: [\"a\"]\nprint(2)\n").unwrap();
    assert_eq!(d.argv(), ["python3", "-", "a"]);
    assert_eq!(d.stdin_data().unwrap(), d.code.as_bytes());
    assert!(Snippet::parse("e", "# mode: c\n# bogus: 1\n").is_err());
    assert!(Snippet::parse("e", "# mode: stdin\n# args: [\"a\"]\n").is_err());
    assert!(Snippet::parse("e", "print(1)\n").is_err());
    assert_eq!(
        pathdiff(Path::new("/w/real/x.py"), Path::new("/w")),
        PathBuf::from("real/x.py")
    );
    assert_eq!(
        pathdiff(Path::new("/w/x.py"), Path::new("/w/sub")),
        PathBuf::from("../x.py")
    );
}

#[test]
fn line_diff_examples() {
    assert_eq!(line_diff(b"a\nb\nc\n", b"a\nb\nc\n", 10).unwrap(), "");
    assert_eq!(
        line_diff(b"a\nx\nc\nextra", b"a\nb\nc\n", 10).unwrap(),
        "    - b\n    + x\n    + extra\n"
    );
    assert_eq!(
        line_diff(b"1\n2\n3\n", b"", 2).unwrap(),
        "    + 1\n    + 2\n    ... 1 more lines differ\n"
    );
}

#[test]
fn judge_examples() {
    let run = |attrs: &[(&str, &str, &'static str)]| Run {
        out: RunOutput {
            argv: String::new(),
            status: std::process::ExitStatus::from_raw(0),
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_times: Vec::new(),
            elapsed: Duration::ZERO,
            pipes_left_open: false,
        },
        span: Some(ReceivedSpan {
            name: "sandbox.exec".into(),
            trace_id: String::new(),
            span_id: String::new(),
            parent_span_id: String::new(),
            kind: 1,
            attributes: attrs
                .iter()
                .map(|(k, v, _)| (k.to_string(), v.to_string()))
                .collect(),
            attribute_types: attrs.iter().map(|(k, _, t)| (k.to_string(), *t)).collect(),
            status_code: 0,
            status_message: String::new(),
            resource: Default::default(),
            scope_name: String::new(),
            start_time_unix_nano: 0,
            end_time_unix_nano: 0,
        }),
    };
    let forked = run(&[("sandbox.zygote", "true", "bool")]);
    let not_ready = run(&[
        ("sandbox.zygote", "false", "bool"),
        (
            "sandbox.zygote_fallback",
            "zygote not ready (importing numpy)",
            "string",
        ),
    ]);
    let flag = run(&[
        ("sandbox.zygote", "false", "bool"),
        ("sandbox.zygote_fallback", "interpreter option -I", "string"),
    ]);
    let string_bool = run(&[("sandbox.zygote", "true", "string")]);
    let ok = |v: Verdict| matches!(v, Verdict::Ok);
    let retry = |v: Verdict| matches!(v, Verdict::NotReady);
    assert!(ok(judge(&Expect::Zygote, &forked)));
    assert!(retry(judge(&Expect::Zygote, &not_ready)));
    assert!(!ok(judge(&Expect::Zygote, &flag)) && !retry(judge(&Expect::Zygote, &flag)));
    assert!(!ok(judge(&Expect::Zygote, &string_bool)));
    assert!(ok(judge(&Expect::Fallback("-I".into()), &flag)));
    assert!(ok(judge(&Expect::Fallback(String::new()), &flag)));
    assert!(retry(judge(&Expect::Fallback("-I".into()), &not_ready)));
    assert!(!ok(judge(&Expect::Fallback("-u".into()), &flag)));
    assert!(!ok(judge(&Expect::Fallback("-I".into()), &forked)));
    assert!(ok(judge(&Expect::Any, &not_ready)));
    let no_span = Run {
        span: None,
        ..forked
    };
    assert!(!ok(judge(&Expect::Any, &no_span)));
}
