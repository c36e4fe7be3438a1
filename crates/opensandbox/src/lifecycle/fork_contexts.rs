//! The semantic fork of a sandbox's code contexts (a part of [`super::fork`]): not their
//! memory (docs/opensandbox-compat.md says why none can be), their globals, saved by each
//! context's driver and loaded by a new context of the same id in every copy.
//!
//! Before the parent's writable layer is frozen, each live context is held (no execution runs
//! in it until the freeze is done: the copies start where it stood) and its driver saves its
//! globals under `/tmp/.agentrun-fork-<layerId>/<context id>` in the parent (one global at a
//! time: pickle protocol 5, large buffers in a side file the copies map copy-on-write, modules
//! by name, functions of the context by value); the freeze carries the files in the frozen
//! layer like any other; then the parent's driver removes them and the context is let go.
//! Each copy gets a context of the same id, language and working directory (and the same
//! default contexts) whose driver loads them before any execution and removes them (a
//! whiteout in the copy's own upper). What a driver could not carry is named per context.
//!
//! The daemon never reads, follows nor writes these files from the host: the drivers do, in
//! their sandboxes, as the code of the context could itself. What a driver answers is taken
//! bounded (names and reasons only).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agentrun_pool::lock;
use agentrun_pool::python::{Exclusive, StateError, StateReport};
use serde_json::{json, Value};

use crate::code::CodeContext;
use crate::error::ApiResult;
use crate::Record;

/// How long a fork waits for an execution running in a context to end before it forks
/// without that context's state.
pub const BUSY_WAIT: Duration = Duration::from_secs(10);
/// How long a driver has to save (then it is interrupted) or to load its globals.
pub const SAVE_TIME: Duration = Duration::from_secs(120);
/// How long a parent's driver has to remove the saved files.
const DISCARD_TIME: Duration = Duration::from_secs(30);

/// The directory in the sandbox that holds fork `layer_id`'s saved contexts.
pub fn state_root(layer_id: &str) -> String {
    format!("/tmp/.agentrun-fork-{layer_id}")
}

/// What a fork did with one of the parent's contexts.
#[derive(Debug, Clone)]
pub struct ContextFork {
    pub id: String,
    pub language: String,
    pub cwd: String,
    /// Where its driver saved its globals (in the sandbox).
    pub dir: String,
    /// Whether each copy gets a context of this id (not when the parent's had exited).
    pub restored: bool,
    /// What the save (and the copies' loads) said; `None` when the save failed.
    pub report: Option<StateReport>,
    /// Why the context's state was not carried at all.
    pub error: Option<String>,
}

impl ContextFork {
    /// The answer's entry: `{"id", "language", "carried": [names], "notCarried": [{"name",
    /// "reason"}], "error"?}`.
    pub fn to_json(&self) -> Value {
        let r = self.report.clone().unwrap_or_default();
        let mut v = json!({
            "id": self.id,
            "language": self.language,
            "carried": r.carried,
            "notCarried": r.skipped.iter().map(|(n, why)| json!({"name": n, "reason": why})).collect::<Vec<_>>(),
        });
        if r.more > 0 {
            v["namesOmitted"] = json!(r.more);
        }
        if let Some(e) = &self.error {
            v["error"] = json!(e);
        }
        v
    }

    /// Whether its globals were saved (the copies load them) and, once the copies are made,
    /// loaded by every copy.
    pub fn saved(&self) -> bool {
        self.report.is_some() && self.error.is_none()
    }
}

/// The names not carried of `forks`, as `context/name` (for the span and the audit record),
/// a context not carried at all as `context/*`.
pub fn not_carried(forks: &[ContextFork]) -> Vec<String> {
    let mut out = Vec::new();
    for f in forks {
        match &f.report {
            None => out.push(format!("{}/*", f.id)),
            Some(r) => out.extend(r.skipped.iter().map(|(n, _)| format!("{}/{n}", f.id))),
        }
    }
    out
}

/// A context id usable as a path component (the ids agentrun hands out are hex).
fn plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The parent's contexts, held: each its [`ContextFork`] and, when held, its hold.
pub struct Held<'a> {
    pub forks: Vec<ContextFork>,
    holds: Vec<(usize, Exclusive<'a>)>,
}

/// Holds every context of `contexts` (of `rec`) and has its driver save its globals under
/// [`state_root`]`(layer_id)`. Never fails: a context not carried says why.
pub async fn save<'a>(rec: &Record, contexts: &'a [Arc<CodeContext>], layer_id: &str) -> Held<'a> {
    let root = state_root(layer_id);
    let mut held = Held {
        forks: Vec::new(),
        holds: Vec::new(),
    };
    for ctx in contexts {
        let mut f = ContextFork {
            id: ctx.id.clone(),
            language: ctx.language.clone(),
            cwd: ctx.cwd.clone(),
            dir: format!("{root}/{}", ctx.id),
            restored: true,
            report: None,
            error: None,
        };
        if ctx.python.is_dead() {
            f.restored = false;
            f.error = Some("the context's interpreter has exited".into());
            held.forks.push(f);
            continue;
        }
        if !plain_id(&ctx.id) {
            f.error = Some("the context's id is not a plain name".into());
            held.forks.push(f);
            continue;
        }
        let Ok(mut hold) = tokio::time::timeout(BUSY_WAIT, ctx.python.exclusive()).await else {
            f.error = Some(format!(
                "an execution was still running after {} s",
                BUSY_WAIT.as_secs()
            ));
            held.forks.push(f);
            continue;
        };
        let (sandbox, pid) = (rec.sandbox.clone(), ctx.python.interpreter.id);
        let interrupt = move || {
            let _ = sandbox.signal(pid, libc::SIGINT, false);
        };
        match hold.save(&f.dir, SAVE_TIME, interrupt).await {
            Ok(r) => f.report = Some(r),
            Err(e) => f.error = Some(format!("its globals were not saved: {e}")),
        }
        held.holds.push((held.forks.len(), hold));
        held.forks.push(f);
    }
    held
}

impl Held<'_> {
    /// After the freeze: the saved files removed from the parent, the contexts let go.
    pub async fn release(mut self) -> Vec<ContextFork> {
        for (i, hold) in &mut self.holds {
            let dir = &self.forks[*i].dir;
            if let Err(e) = hold.discard(dir, DISCARD_TIME).await {
                tracing::warn!(target: "agentrun::opensandbox::fork", "removing {dir} from a fork's parent: {e}");
            }
        }
        self.forks
    }
}

/// Gives copy `copy` its contexts: one per restored entry of `forks`, of the same id, that
/// loaded the saved globals before it is registered (and the parent's `defaults`). Answers
/// what each load said, in the order of `forks` (`None`: nothing to load).
pub async fn restore(
    server: &crate::Server,
    copy: &Record,
    forks: &[ContextFork],
    defaults: &HashMap<String, String>,
) -> ApiResult<Vec<Option<Result<StateReport, StateError>>>> {
    let mut loads = Vec::with_capacity(forks.len());
    for f in forks {
        if !f.restored {
            loads.push(None);
            continue;
        }
        let python = crate::code::spawn_python(server, copy, f.cwd.clone()).await?;
        let loaded = if plain_id(&f.id) {
            let (sandbox, pid) = (copy.sandbox.clone(), python.interpreter.id);
            let interrupt = move || {
                let _ = sandbox.signal(pid, libc::SIGINT, false);
            };
            // Loaded (and the files removed) even when the save failed: a half-written
            // directory goes too.
            let r = python
                .exclusive()
                .await
                .load(&f.dir, SAVE_TIME, interrupt)
                .await;
            f.saved().then_some(r)
        } else {
            None
        };
        loads.push(loaded);
        let ctx = Arc::new(CodeContext {
            id: f.id.clone(),
            language: f.language.clone(),
            cwd: f.cwd.clone(),
            python,
        });
        lock(&copy.code).contexts.insert(ctx.id.clone(), ctx);
    }
    let mut st = lock(&copy.code);
    for (language, id) in defaults {
        if st.contexts.contains_key(id) {
            st.defaults.insert(language.clone(), id.clone());
        }
    }
    Ok(loads)
}

/// Adds what the copies' loads said to `forks`: a name a load did not carry is not carried
/// (with the load's reason), a load that failed makes its context not carried.
pub fn merge_loads(
    forks: &mut [ContextFork],
    loads: &[Vec<Option<Result<StateReport, StateError>>>],
) {
    for (i, f) in forks.iter_mut().enumerate() {
        for copy in loads {
            let Some(Some(load)) = copy.get(i) else {
                continue;
            };
            match load {
                Err(e) => {
                    if f.error.is_none() {
                        f.error = Some(format!("a copy did not load its globals: {e}"));
                    }
                    if let Some(r) = f.report.take() {
                        f.report = Some(StateReport {
                            carried: Vec::new(),
                            skipped: r
                                .carried
                                .into_iter()
                                .map(|n| (n, "not loaded".to_string()))
                                .chain(r.skipped)
                                .collect(),
                            more: r.more,
                        });
                    }
                }
                Ok(l) => {
                    if let Some(r) = &mut f.report {
                        for (name, why) in &l.skipped {
                            if r.carried.contains(name) {
                                r.carried.retain(|n| n != name);
                                r.skipped.push((name.clone(), format!("not loaded: {why}")));
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fork(id: &str, report: Option<StateReport>) -> ContextFork {
        ContextFork {
            id: id.into(),
            language: "python".into(),
            cwd: "/".into(),
            dir: format!("{}/{id}", state_root("fork-x")),
            restored: true,
            report,
            error: None,
        }
    }

    fn report(carried: &[&str], skipped: &[(&str, &str)]) -> StateReport {
        StateReport {
            carried: carried.iter().map(|s| s.to_string()).collect(),
            skipped: skipped
                .iter()
                .map(|(n, r)| (n.to_string(), r.to_string()))
                .collect(),
            more: 0,
        }
    }

    #[test]
    fn the_answer_names_what_was_not_carried() {
        let mut a = fork(
            "a1",
            Some(report(&["big", "np"], &[("fh", "TypeError: x")])),
        );
        a.report.as_mut().unwrap().more = 2;
        let mut b = fork("b2", None);
        b.error = Some("an execution was still running after 10 s".into());
        assert_eq!(
            a.to_json(),
            json!({"id": "a1", "language": "python", "carried": ["big", "np"],
                   "notCarried": [{"name": "fh", "reason": "TypeError: x"}], "namesOmitted": 2})
        );
        assert_eq!(
            b.to_json()["error"],
            "an execution was still running after 10 s"
        );
        assert_eq!(b.to_json()["carried"], json!([]));
        assert_eq!(not_carried(&[a, b]), vec!["a1/fh", "b2/*"]);
        assert_eq!(state_root("fork-ab"), "/tmp/.agentrun-fork-fork-ab");
    }

    #[test]
    fn a_name_a_copy_did_not_load_is_not_carried() {
        let mut forks = vec![
            fork("a", Some(report(&["x", "y"], &[]))),
            fork("b", Some(report(&["z"], &[]))),
            fork("c", None),
        ];
        let loads = vec![
            vec![
                Some(Ok(report(&["x"], &[("y", "ImportError: gone")]))),
                Some(Err(StateError::TimedOut(Duration::from_secs(1)))),
                None,
            ],
            vec![
                Some(Ok(report(&["x", "y"], &[]))),
                Some(Ok(report(&["z"], &[]))),
                None,
            ],
        ];
        merge_loads(&mut forks, &loads);
        assert_eq!(
            forks[0].report,
            Some(report(&["x"], &[("y", "not loaded: ImportError: gone")]))
        );
        assert_eq!(forks[1].report, Some(report(&[], &[("z", "not loaded")])));
        assert!(forks[1].error.as_deref().unwrap().contains("did not load"));
        assert_eq!(forks[2].report, None);
        assert!(forks[0].saved() && !forks[1].saved() && !forks[2].saved());
    }

    #[test]
    fn only_plain_ids_name_a_directory() {
        assert!(plain_id("0123abcdef"));
        for bad in ["", "..", "a/b", "a b", &"x".repeat(129)] {
            assert!(!plain_id(bad), "{bad:?}");
        }
    }
}
