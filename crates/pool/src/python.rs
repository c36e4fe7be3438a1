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
