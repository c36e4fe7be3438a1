//! Python contexts: a persistent `python3` in a long-lived sandbox running agentrun's driver
//! (`python_driver.py`), whose globals survive between executions, like a Jupyter kernel.
//! The OpenSandbox API's code contexts and the MCP server's `run_python` are both these.
//!
//! An execution ([`PythonContext::execute`]) yields [`CodeEvent`]s: the execution's number
//! once the interpreter runs it, `stdout`/`stderr` lines, `Display` bundles (each matplotlib
//! figure open at its end, as `image/png`), a `result` (the `repr` of the last expression),
//! and then `Done` or an `Error` carrying the Python exception. Interrupting an
//! execution sends SIGINT (`KeyboardInterrupt`); the driver drops an interrupt that arrives
//! between executions, so an interrupt never ends a context. The interpreter's output is read
//! through bounded queues ([`crate::process::queued_lines`]): what it prints between
//! executions (a thread printing forever) waits there, then in its pipe, and then the
//! printing thread blocks until the next execution reads it.
//!
//! The driver's events share stdout with the code's raw output, told apart by a marker that
//! holds a random nonce drawn for each execution and sent with its code: the driver keeps it
//! in no global and no environment variable, and only the current execution's is taken. The
//! code runs in the driver's process, so it can still find the current nonce in the
//! interpreter's memory and fake events of its own execution (only its own context's client
//! sees them); docs/opensandbox.md says so.
//!
//! A semantic fork of a context (docs/opensandbox-compat.md, "What a fork carries"): while a
//! caller holds the context ([`PythonContext::exclusive`]: no execution runs), it asks the
//! driver to save its globals in a directory of the sandbox ([`Exclusive::save`]) and later
//! to remove them ([`Exclusive::discard`]); a copy's new context loads them before any
//! execution ([`Exclusive::load`]). What the driver answers is the sandbox's word, read as
//! such: bounded in time and size, names only reported, never a path the daemon follows.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::live::LiveSandbox;
use crate::process::InteractiveProcess;
use crate::PoolError;

const DRIVER: &str = include_str!("python_driver.py");

/// Events of one execution queued ahead of their reader.
const EVENT_QUEUE: usize = 16;
/// Largest display bundle taken (its JSON); a larger one is dropped, said on stderr.
pub const MAX_DISPLAY: usize = 16 << 20;

/// A Python exception, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeError {
    pub ename: String,
    pub evalue: String,
    pub traceback: Vec<String>,
}

/// What an execution says, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodeEvent {
    /// The interpreter runs the execution (its number in the context, from 1).
    Running(u64),
    /// A line the code printed (without its newline; a blank line is `"\n"`).
    Stdout(String),
    Stderr(String),
    /// The `repr` of the last expression's value.
    Result(String),
    /// Rich output (a matplotlib figure): a MIME bundle, `{"image/png": base64, "text/plain":
    /// repr}`.
    Display(serde_json::Map<String, serde_json::Value>),
    /// The last expression's value with rich forms (`_repr_html_` and the like): its MIME
    /// bundle, its `repr` as `"text/plain"`. Sent in place of [`CodeEvent::Result`].
    RichResult(serde_json::Map<String, serde_json::Value>),
    /// The execution ended.
    Done,
    /// The execution raised, or the interpreter died (`DeadKernelError`). The last event.
    Error(CodeError),
}

/// What a context's driver said of its globals in a save or a load: the names carried, and
/// those not carried with why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateReport {
    pub carried: Vec<String>,
    /// (name, reason).
    pub skipped: Vec<(String, String)>,
    /// Names left out of both lists (the driver reports [`MAX_NAMES`] of each).
    pub more: u64,
}

/// Most names of a [`StateReport`] list taken from a driver.
pub const MAX_NAMES: usize = 100;
/// Longest name or reason taken from a driver (characters).
const MAX_TEXT: usize = 200;

/// Why a save, load or discard of a context's state failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("the interpreter exited")]
    Dead,
    #[error("no answer within {0:?}")]
    TimedOut(std::time::Duration),
    /// The driver's own error (its exception).
    #[error("{ename}: {evalue}")]
    Driver { ename: String, evalue: String },
    #[error("no random nonce for the request: {0}")]
    Random(String),
}

/// A context held for agentrun's own requests: no execution runs until it is dropped.
pub struct Exclusive<'a> {
    lines: tokio::sync::MutexGuard<'a, (mpsc::Receiver<String>, mpsc::Receiver<String>)>,
    stdin: tokio::sync::MutexGuard<'a, crate::stdio::StdioStream>,
}

/// Grace after an interrupt for a late answer.
const GRACE: std::time::Duration = std::time::Duration::from_secs(5);

impl Exclusive<'_> {
    /// Saves the globals in `dir` (an absolute path in the sandbox, made by the driver; it
    /// must not exist). `interrupt` is called once `within` is over (it should SIGINT the
    /// interpreter: the save stops and answers an error).
    pub async fn save(
        &mut self,
        dir: &str,
        within: std::time::Duration,
        interrupt: impl FnOnce(),
    ) -> Result<StateReport, StateError> {
        let ev = self.request("save", dir, within, interrupt).await?;
        Ok(state_report(&ev))
    }

    /// Loads the globals saved in `dir` and removes it (a fork copy's new context, before
    /// any execution).
    pub async fn load(
        &mut self,
        dir: &str,
        within: std::time::Duration,
        interrupt: impl FnOnce(),
    ) -> Result<StateReport, StateError> {
        let ev = self.request("load", dir, within, interrupt).await?;
        Ok(state_report(&ev))
    }

    /// Removes `dir` (and its parent directory once empty).
    pub async fn discard(
        &mut self,
        dir: &str,
        within: std::time::Duration,
    ) -> Result<(), StateError> {
        self.request("drop", dir, within, || ()).await.map(|_| ())
    }

    /// Sends `{kind: dir}` and reads the answer: the last marked event before `done`.
    /// The interpreter's unmarked output meanwhile (its threads', or the code's own
    /// `__reduce__` printing) is dropped.
    async fn request(
        &mut self,
        kind: &str,
        dir: &str,
        within: std::time::Duration,
        interrupt: impl FnOnce(),
    ) -> Result<serde_json::Value, StateError> {
        let nonce =
            agentrun_runtime::random::hex(16).map_err(|e| StateError::Random(e.to_string()))?;
        let marker = format!("\u{1}agentrun-{nonce}:");
        let request = format!("{}\n", serde_json::json!({ kind: dir, "nonce": nonce }));
        let (out, err) = &mut *self.lines;
        let write = tokio::io::AsyncWriteExt::write_all(&mut *self.stdin, request.as_bytes());
        tokio::pin!(write);
        let mut writing = true;
        let mut err_open = true;
        let mut interrupt = Some(interrupt);
        let mut deadline = tokio::time::Instant::now() + within;
        let mut answer = serde_json::Value::Null;
        loop {
            tokio::select! {
                w = &mut write, if writing => {
                    writing = false;
                    if w.is_err() {
                        return Err(StateError::Dead);
                    }
                }
                l = out.recv() => match l {
                    None => return Err(StateError::Dead),
                    Some(l) => {
                        let Some(j) = l.strip_prefix(marker.as_str()) else { continue };
                        let ev: serde_json::Value = serde_json::from_str(j).unwrap_or_default();
                        match ev["t"].as_str().unwrap_or("") {
                            "done" => return Ok(answer),
                            "error" => {
                                return Err(StateError::Driver {
                                    ename: text(&ev["ename"]),
                                    evalue: text(&ev["evalue"]),
                                })
                            }
                            _ => answer = ev,
                        }
                    }
                },
                l = err.recv(), if err_open => err_open = l.is_some(),
                _ = tokio::time::sleep_until(deadline) => match interrupt.take() {
                    Some(i) => {
                        i();
                        deadline = tokio::time::Instant::now() + GRACE;
                    }
                    None => return Err(StateError::TimedOut(within)),
                },
            }
        }
    }
}

/// A JSON string of the driver's, bounded.
fn text(v: &serde_json::Value) -> String {
    v.as_str()
        .unwrap_or_default()
        .chars()
        .take(MAX_TEXT)
        .collect()
}

/// A `saved`/`loaded` event as a [`StateReport`] (bounded: the driver is the sandbox's).
fn state_report(ev: &serde_json::Value) -> StateReport {
    let list = |k: &str| ev[k].as_array().cloned().unwrap_or_default();
    StateReport {
        carried: list("carried").iter().take(MAX_NAMES).map(text).collect(),
        skipped: list("skipped")
            .iter()
            .take(MAX_NAMES)
            .map(|s| (text(&s["name"]), text(&s["reason"])))
            .collect(),
        more: ev["more"].as_u64().unwrap_or(0),
    }
}

/// One persistent interpreter.
pub struct PythonContext {
    /// The interpreter (signal it by `interpreter.id`).
    pub interpreter: InteractiveProcess,
}

impl PythonContext {
    /// Starts an interpreter in `sandbox` in `cwd` (a path inside it) with `env` over the
    /// sandbox's environment; its output is read on `output`. No interpreter options nor
    /// PYTHON* variables are added (the driver sets its streams up itself), so a sandbox whose
    /// profile has a Python zygote forks the context from it. An image without python3 is a
    /// [`PoolError::Spawn`].
    pub async fn start(
        output: &tokio::runtime::Handle,
        sandbox: &Arc<LiveSandbox>,
        env: Vec<(String, String)>,
        cwd: String,
    ) -> Result<PythonContext, PoolError> {
        let argv = vec!["python3".into(), "-c".into(), DRIVER.into()];
        let cmd = crate::process::StartCommand::new(argv, env, cwd);
        let interpreter = InteractiveProcess::start(output, sandbox, cmd).await?;
        Ok(PythonContext { interpreter })
    }

    /// The context held for agentrun's own requests (once the execution running, if any,
    /// has ended).
    pub async fn exclusive(&self) -> Exclusive<'_> {
        // The order an execution takes them in.
        let lines = self.interpreter.output.lock().await;
        let stdin = self.interpreter.stdin.lock().await;
        Exclusive { lines, stdin }
    }

    /// Whether the interpreter exited.
    pub fn is_dead(&self) -> bool {
        self.interpreter.is_dead()
    }

    /// Runs `code`; its events arrive on the receiver (which ends after `Done` or `Error`).
    /// Executions of one context run one after the other.
    pub fn execute(self: &Arc<Self>, code: &str) -> mpsc::Receiver<CodeEvent> {
        self.execute_with_env(code, &std::collections::BTreeMap::new())
    }

    /// [`PythonContext::execute`] with `env` set in the interpreter's `os.environ` for this
    /// execution only (the values before it are put back after it).
    pub fn execute_with_env(
        self: &Arc<Self>,
        code: &str,
        env: &std::collections::BTreeMap<String, String>,
    ) -> mpsc::Receiver<CodeEvent> {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let ctx = self.clone();
        // The driver marks this execution's events with a nonce of its own (see the module
        // doc): a line with any other marker is the code's output.
        let nonce = match agentrun_runtime::random::hex(16) {
            Ok(n) => n,
            Err(e) => {
                let _ = tx.try_send(CodeEvent::Error(CodeError {
                    ename: "RandomError".into(),
                    evalue: format!("no random nonce for the execution: {e}"),
                    traceback: Vec::new(),
                }));
                return rx;
            }
        };
        let marker = format!("\u{1}agentrun-{nonce}:");
        let request = if env.is_empty() {
            format!("{}\n", serde_json::json!({ "code": code, "nonce": nonce }))
        } else {
            format!(
                "{}\n",
                serde_json::json!({ "code": code, "nonce": nonce, "env": env })
            )
        };
        tokio::spawn(async move { ctx.run(request, marker, tx).await });
        rx
    }

    async fn run(&self, request: String, marker: String, tx: mpsc::Sender<CodeEvent>) {
        let mut lines = self.interpreter.output.lock().await;
        let mut stdin = self.interpreter.stdin.lock().await;
        // Written while the output is read: an interpreter blocked on a full pipe (output
        // from between executions) reads no request until that output is taken.
        let write = tokio::io::AsyncWriteExt::write_all(&mut *stdin, request.as_bytes());
        tokio::pin!(write);
        let mut writing = true;
        let mut err_open = true;
        let dead = || {
            CodeEvent::Error(CodeError {
                ename: "DeadKernelError".into(),
                evalue: "the interpreter exited".into(),
                traceback: Vec::new(),
            })
        };
        let (out, err) = &mut *lines;
        // The display bundle being received (its JSON, in parts), and whether it went over
        // MAX_DISPLAY.
        let mut display = String::new();
        let mut display_dropped = false;
        let last = loop {
            tokio::select! {
                w = &mut write, if writing => {
                    writing = false;
                    if w.is_err() {
                        break dead();
                    }
                }
                l = out.recv() => match l {
                    None => break dead(),
                    Some(l) => match l.strip_prefix(marker.as_str()) {
                        None => { let _ = tx.send(CodeEvent::Stdout(l)).await; }
                        Some(j) => match display_line(j) {
                            Some(Display::Part(p)) => {
                                if display.len() + p.len() > MAX_DISPLAY {
                                    display_dropped = true;
                                } else {
                                    display.push_str(&p);
                                }
                            }
                            Some(Display::End { main }) => {
                                let bundle = std::mem::take(&mut display);
                                let e = if std::mem::take(&mut display_dropped) {
                                    CodeEvent::Stderr(format!("agentrun: a display output larger than {MAX_DISPLAY} bytes was dropped"))
                                } else {
                                    match serde_json::from_str(&bundle) {
                                        Ok(serde_json::Value::Object(m)) if main => CodeEvent::RichResult(m),
                                        Ok(serde_json::Value::Object(m)) => CodeEvent::Display(m),
                                        _ => CodeEvent::Stderr("agentrun: a display output did not parse".into()),
                                    }
                                };
                                let _ = tx.send(e).await;
                            }
                            None => match driver_event(j) {
                                e @ (CodeEvent::Done | CodeEvent::Error(_)) => break e,
                                e => { let _ = tx.send(e).await; }
                            },
                        },
                    },
                },
                l = err.recv(), if err_open => match l {
                    Some(l) => { let _ = tx.send(CodeEvent::Stderr(l)).await; }
                    None => err_open = false,
                },
            }
        };
        // Raw stderr that arrived before the end.
        while let Ok(l) = err.try_recv() {
            let _ = tx.send(CodeEvent::Stderr(l)).await;
        }
        let _ = tx.send(last).await;
    }
}

/// A marked line of a display bundle's.
#[derive(Debug, PartialEq, Eq)]
enum Display {
    /// A part of the bundle's JSON.
    Part(String),
    /// The bundle is complete; `main`: the last expression's value (else a display).
    End { main: bool },
}

/// A display line (`display_part`, `display`), if that is what `json` is.
fn display_line(json: &str) -> Option<Display> {
    // Cheap test first: most lines are not display lines.
    if !json.contains("\"display") {
        return None;
    }
    let ev: serde_json::Value = serde_json::from_str(json).ok()?;
    match ev["t"].as_str()? {
        "display_part" => Some(Display::Part(ev["data"].as_str()?.to_string())),
        "display" => Some(Display::End {
            main: ev["main"].as_bool().unwrap_or(false),
        }),
        _ => None,
    }
}

/// One marked line of the driver's, as an event.
fn driver_event(json: &str) -> CodeEvent {
    let ev: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let text = || ev["text"].as_str().unwrap_or_default().to_string();
    match ev["t"].as_str().unwrap_or("") {
        "count" => CodeEvent::Running(ev["n"].as_u64().unwrap_or(0)),
        "stdout" => CodeEvent::Stdout(text()),
        "stderr" => CodeEvent::Stderr(text()),
        "result" => CodeEvent::Result(text()),
        "done" => CodeEvent::Done,
        _ => CodeEvent::Error(CodeError {
            ename: ev["ename"].as_str().unwrap_or("error").to_string(),
            evalue: ev["evalue"].as_str().unwrap_or_default().to_string(),
            traceback: ev["traceback"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(|l| l.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_lines_are_told_apart() {
        assert_eq!(
            display_line(r#"{"t": "display_part", "data": "{\"a"}"#),
            Some(Display::Part("{\"a".into()))
        );
        assert_eq!(
            display_line(r#"{"t": "display"}"#),
            Some(Display::End { main: false })
        );
        assert_eq!(
            display_line(r#"{"t": "display", "main": true}"#),
            Some(Display::End { main: true })
        );
        assert_eq!(display_line(r#"{"t": "stdout", "text": "display"}"#), None);
        assert_eq!(display_line(r#"{"t": "count", "n": 1}"#), None);
    }

    #[test]
    fn state_reports_are_bounded() {
        let long = "n".repeat(5000);
        let ev = serde_json::json!({
            "t": "saved",
            "carried": (0..500).map(|i| format!("v{i}")).chain([long.clone()]).collect::<Vec<_>>(),
            "skipped": [{"name": "fh", "reason": "TypeError: cannot pickle"}, {"name": long, "reason": 7}],
            "more": 3,
        });
        let r = state_report(&ev);
        assert_eq!(r.carried.len(), MAX_NAMES);
        assert_eq!(r.carried[0], "v0");
        assert_eq!(
            r.skipped[0],
            ("fh".into(), "TypeError: cannot pickle".into())
        );
        assert_eq!(r.skipped[1].0.len(), MAX_TEXT);
        assert_eq!(r.skipped[1].1, "");
        assert_eq!(r.more, 3);
        // Not a report at all (never from the driver): empty, not a panic.
        assert_eq!(
            state_report(&serde_json::json!("x")),
            StateReport::default()
        );
    }

    /// The driver run as a plain `python3` (no sandbox): its requests, one JSON line each,
    /// and its marked answers until `done`/`error` (30 s at most).
    struct Driver(std::process::Child, std::sync::mpsc::Receiver<String>);

    impl Driver {
        fn start() -> Driver {
            use std::io::BufRead;
            let mut c = std::process::Command::new("python3")
                .args(["-c", DRIVER])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("python3");
            let out = std::io::BufReader::new(c.stdout.take().unwrap());
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for l in out.lines().map_while(Result::ok) {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            });
            Driver(c, rx)
        }

        fn ask(&mut self, req: serde_json::Value) -> Vec<serde_json::Value> {
            use std::io::Write;
            let mut req = req;
            req["nonce"] = "t".into();
            let stdin = self.0.stdin.as_mut().unwrap();
            writeln!(stdin, "{req}").unwrap();
            stdin.flush().unwrap();
            let mut evs = Vec::new();
            loop {
                let line = self
                    .1
                    .recv_timeout(std::time::Duration::from_secs(30))
                    .unwrap_or_else(|e| panic!("no answer to {req}: {e}; so far {evs:?}"));
                if let Some(j) = line.strip_prefix("\u{1}agentrun-t:") {
                    let ev: serde_json::Value = serde_json::from_str(j).unwrap();
                    let end = ev["t"] == "done" || ev["t"] == "error";
                    evs.push(ev);
                    if end {
                        return evs;
                    }
                }
            }
        }
    }

    impl Drop for Driver {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_drivers_globals_saved_are_loaded_by_another_and_the_unpicklable_named() {
        let root = std::env::temp_dir().join(format!("agentrun-ctxfork-{}", std::process::id()));
        let dir = root.join("ctx").display().to_string();
        let mut parent = Driver::start();
        let code = "import json as j\n\
            d = {'a': 1, 'b': [1, 2]}\n\
            ba = bytearray(b'x' * 200000)\n\
            mv = memoryview(bytearray(b'y' * 100000)).cast('B', (1000, 100))\n\
            def f(x, y=2):\n    return x + y + d['a']\n\
            lam = lambda z: z * 3\n\
            def outer():\n    k = 5\n    def inner():\n        return k\n    return inner\n\
            clo = outer()\n\
            fh = open('/dev/null')\n\
            gen = (i for i in range(3))\n";
        let run = parent.ask(serde_json::json!({ "code": code }));
        assert_eq!(run.last().unwrap()["t"], "done", "{run:?}");
        let saved = parent.ask(serde_json::json!({ "save": dir }));
        assert_eq!(saved.last().unwrap()["t"], "done", "{saved:?}");
        let r = state_report(&saved[0]);
        for n in ["j", "d", "ba", "mv", "f", "lam", "outer", "clo"] {
            assert!(r.carried.contains(&n.to_string()), "{n}: {r:?}");
        }
        let skipped: Vec<&str> = r.skipped.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(skipped, ["fh", "gen"], "{r:?}");
        assert!(r.skipped[0].1.contains("pickle"), "{r:?}");
        // Large buffers out of band: the side file holds them, the pickle does not.
        let side = std::fs::metadata(root.join("ctx/buffers.bin"))
            .unwrap()
            .len();
        let data = std::fs::metadata(root.join("ctx/globals.pickle"))
            .unwrap()
            .len();
        assert!(side >= 300_000 && data < 50_000, "{side} {data}");
        // A second save into the same directory is refused (it must not exist).
        let again = parent.ask(serde_json::json!({ "save": dir }));
        assert_eq!(
            again.last().unwrap()["ename"],
            "FileExistsError",
            "{again:?}"
        );

        let mut copy = Driver::start();
        let loaded = copy.ask(serde_json::json!({ "load": dir }));
        assert_eq!(loaded.last().unwrap()["t"], "done", "{loaded:?}");
        assert_eq!(state_report(&loaded[0]).carried, r.carried);
        assert!(!root.exists(), "the state is removed once loaded");
        let check = "print(j.dumps(d), len(ba), mv.tobytes()[-2:], mv.shape, f(1), lam(2), clo(), 'fh' in globals())";
        let out = copy.ask(serde_json::json!({ "code": check }));
        assert_eq!(
            out[1]["text"], "{\"a\": 1, \"b\": [1, 2]} 200000 b'yy' (1000, 100) 4 6 5 False",
            "{out:?}"
        );
        // Its own from then on: a write in the copy is not the parent's.
        copy.ask(serde_json::json!({ "code": "d['a'] = 9" }));
        let p = parent.ask(serde_json::json!({ "code": "print(d['a'], f(1))" }));
        assert_eq!(p[1]["text"], "1 4", "{p:?}");
        // Nothing to load: an error, and the driver lives on.
        let none = copy.ask(serde_json::json!({ "load": dir }));
        assert_eq!(
            none.last().unwrap()["ename"],
            "FileNotFoundError",
            "{none:?}"
        );
        let after = copy.ask(serde_json::json!({ "code": "d['a']" }));
        assert_eq!(after[1]["text"], "9", "{after:?}");
        parent.ask(serde_json::json!({ "drop": dir }));
        assert!(!root.exists());
    }

    #[test]
    fn driver_lines_become_events() {
        assert_eq!(
            driver_event(r#"{"t":"count","n":3}"#),
            CodeEvent::Running(3)
        );
        assert_eq!(
            driver_event(r#"{"t":"stderr","text":"w"}"#),
            CodeEvent::Stderr("w".into())
        );
        assert_eq!(
            driver_event(r#"{"t":"result","text":"42"}"#),
            CodeEvent::Result("42".into())
        );
        assert_eq!(driver_event(r#"{"t":"done"}"#), CodeEvent::Done);
        assert_eq!(
            driver_event(
                r#"{"t":"error","ename":"ZeroDivisionError","evalue":"division by zero","traceback":["a","b"]}"#
            ),
            CodeEvent::Error(CodeError {
                ename: "ZeroDivisionError".into(),
                evalue: "division by zero".into(),
                traceback: vec!["a".into(), "b".into()],
            })
        );
        // Not JSON (never from the driver): an error, not a hang.
        assert!(matches!(driver_event("garbage"), CodeEvent::Error(_)));
    }
}
