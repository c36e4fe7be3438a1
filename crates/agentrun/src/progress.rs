//! How `agentrun image pull/import/export/build` show the progress of their layers on
//! stderr: one `indicatif` bar per layer (bytes, rate, ETA) when stderr is a terminal,
//! throttled plain lines when it is not, nothing with `--quiet`. Stdout is never written.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrun_image::{NoProgress, Phase, Progress};
use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The least time between two plain lines about one layer.
const PLAIN_EVERY: Duration = Duration::from_secs(1);

/// The progress reporter for stderr: bars on a terminal, plain lines otherwise, none when
/// `quiet`.
pub fn for_stderr(quiet: bool) -> Arc<dyn Progress> {
    if quiet {
        Arc::new(NoProgress)
    } else if std::io::stderr().is_terminal() {
        Arc::new(Bars::default())
    } else {
        Arc::new(Plain::default())
    }
}

/// A layer as progress names it: `sha256:` and 12 hex digits, like `docker pull`'s ids.
fn short(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &id[..id.len() - hex.len() + hex.len().min(12)]
}

/// One bar per layer phase in a [`MultiProgress`] while any runs. When none runs any more
/// (a layer downloaded, a build step's layer unpacked) the bars are cleared and each leaves a
/// one-line summary, so what the command prints next on stdout (a build's `Step` lines, the
/// image id) is never drawn over.
struct Bars {
    multi: MultiProgress,
    bars: Mutex<Vec<Bar>>,
}

/// A bar, and its summary once finished.
struct Bar {
    id: String,
    bar: ProgressBar,
    summary: Option<String>,
}

impl Default for Bars {
    fn default() -> Self {
        Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: Mutex::default(),
        }
    }
}

impl Bars {
    fn style(total: Option<u64>) -> ProgressStyle {
        let template = if total.is_some() {
            "{prefix} {msg:<11} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}"
        } else {
            "{prefix} {msg:<11} {spinner} {binary_bytes} {binary_bytes_per_sec}"
        };
        ProgressStyle::with_template(template)
            .expect("a valid template")
            .progress_chars("=> ")
    }

    fn bars(&self) -> std::sync::MutexGuard<'_, Vec<Bar>> {
        self.bars.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// With no bar running: clears them all and prints their summaries.
    fn flush_if_idle(&self, bars: &mut Vec<Bar>) {
        if bars.iter().any(|b| b.summary.is_none()) {
            return;
        }
        // Drawing on the terminal only: a terminal gone has nothing to clear.
        let _ = self.multi.clear();
        for b in bars.drain(..) {
            self.multi.remove(&b.bar);
            eprintln!("{}", b.summary.unwrap_or_default());
        }
    }
}

impl Drop for Bars {
    /// A command failing midway leaves bars that never finished: they are cleared, so its
    /// error starts a line of its own.
    fn drop(&mut self) {
        if !self.bars().is_empty() {
            // Drawing on the terminal only: a terminal gone has nothing to clear.
            let _ = self.multi.clear();
        }
    }
}

impl Progress for Bars {
    fn start(&self, id: &str, phase: Phase, total: Option<u64>) {
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::hidden())
            .with_style(Self::style(total))
            .with_prefix(format!("layer {}", short(id)))
            .with_message(phase.verb());
        let bar = self.multi.add(bar);
        self.bars().push(Bar {
            id: id.to_owned(),
            bar,
            summary: None,
        });
    }

    fn advance(&self, id: &str, n: u64) {
        let bars = self.bars();
        if let Some(b) = bars.iter().find(|b| b.id == id && b.summary.is_none()) {
            b.bar.inc(n);
        }
    }

    fn finish(&self, id: &str, phase: Phase) {
        let mut bars = self.bars();
        if let Some(b) = bars.iter_mut().find(|b| b.id == id && b.summary.is_none()) {
            b.bar.finish_with_message(format!("{} done", phase.verb()));
            b.summary = Some(summary(id, phase, b.bar.position(), b.bar.elapsed()));
        }
        self.flush_if_idle(&mut bars);
    }

    fn exists(&self, id: &str) {
        let mut bars = self.bars();
        let bar = self.multi.add(
            ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
                .with_style(
                    ProgressStyle::with_template("{prefix} {msg}").expect("a valid template"),
                )
                .with_prefix(format!("layer {}", short(id))),
        );
        bar.finish_with_message("already exists");
        bars.push(Bar {
            id: id.to_owned(),
            bar,
            summary: Some(format!("layer {}: already exists", short(id))),
        });
        self.flush_if_idle(&mut bars);
    }
}

/// The line a finished phase leaves: `layer sha256:abcd...: downloading done: 2.04 MiB in 0.3s`.
fn summary(id: &str, phase: Phase, bytes: u64, took: Duration) -> String {
    format!(
        "layer {}: {} done: {} in {:.1}s",
        short(id),
        phase.verb(),
        HumanBytes(bytes),
        took.as_secs_f64()
    )
}

/// A layer's phase as the plain reporter tracks it.
struct Line {
    phase: Phase,
    done: u64,
    total: Option<u64>,
    started: Instant,
    printed: Instant,
}

/// Plain lines: one when a phase starts, at most one a second while it runs, one when it
/// ends (`... done`).
#[derive(Default)]
struct Plain {
    lines: Mutex<HashMap<String, Line>>,
}

impl Plain {
    fn print(id: &str, l: &Line) {
        let rate = l.done as f64 / l.started.elapsed().as_secs_f64().max(0.001);
        let mut text = format!(
            "layer {}: {} {}",
            short(id),
            l.phase.verb(),
            HumanBytes(l.done)
        );
        if let Some(t) = l.total {
            text.push_str(&format!("/{}", HumanBytes(t)));
            if l.done > 0 && t > l.done {
                let eta = Duration::from_secs_f64((t - l.done) as f64 / rate.max(1.0));
                text.push_str(&format!(
                    " ({}/s, ETA {}s)",
                    HumanBytes(rate as u64),
                    eta.as_secs()
                ));
            }
        }
        eprintln!("{text}");
    }
}

impl Progress for Plain {
    fn start(&self, id: &str, phase: Phase, total: Option<u64>) {
        let now = Instant::now();
        let line = Line {
            phase,
            done: 0,
            total,
            started: now,
            printed: now,
        };
        Self::print(id, &line);
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned(), line);
    }

    fn advance(&self, id: &str, n: u64) {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = lines.get_mut(id) {
            l.done += n;
            if l.printed.elapsed() >= PLAIN_EVERY {
                l.printed = Instant::now();
                Self::print(id, l);
            }
        }
    }

    fn finish(&self, id: &str, phase: Phase) {
        let l = self
            .lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        let (done, took) = l.map(|l| (l.done, l.started.elapsed())).unwrap_or_default();
        eprintln!("{}", summary(id, phase, done, took));
    }

    fn exists(&self, id: &str) {
        eprintln!("layer {}: already exists", short(id));
    }
}

#[cfg(test)]
mod tests {
    use super::short;

    #[test]
    fn layers_are_named_by_twelve_hex_digits() {
        assert_eq!(
            short("sha256:0123456789abcdef0123456789abcdef"),
            "sha256:0123456789ab"
        );
        assert_eq!(short("abc"), "abc");
        assert_eq!(short("sha256:ab"), "sha256:ab");
    }
}
