//! The `sandbox.exec` span of a run, built in one place ([`ExecSpan`]): every front end that
//! runs a command (the CLI's `agentrun exec`, OpenSandbox's commands, sessions and code
//! contexts) starts it here, so its common attributes and the cut of its command line
//! ([`command_line`]) are the same wherever a run comes from.

use std::path::Path;

use crate::RunSpan;

/// The name of a run's span.
pub const EXEC_SPAN: &str = "sandbox.exec";

/// The longest command line a span (or audit record) keeps, in bytes; a longer one is cut on
/// a character boundary and ends in `…`.
pub const COMMAND_LINE_MAX: usize = 256;

/// `line`, cut to [`COMMAND_LINE_MAX`] bytes (on a character boundary, then `…`).
pub fn command_line(line: &str) -> String {
    cut(line, COMMAND_LINE_MAX)
}

/// An argv as one command line (its words joined with spaces), cut by [`command_line`]: how a
/// command is shown where only its argv is known (`agentrun top`, the dashboard).
pub fn argv_line(argv: &[String]) -> String {
    command_line(&argv.join(" "))
}

/// `text` cut to at most `max` bytes on a character boundary, `…` marking a cut: how any
/// span attribute that carries what a caller sent (a command line, a tool's arguments) is
/// bounded.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Builder of a run's `sandbox.exec` span (`openinference.span.kind` `TOOL`, the process's
/// executable name and command line, the sandbox's id).
///
/// ```
/// use agentrun_telemetry::ExecSpan;
///
/// let argv = vec!["/bin/sh".to_string(), "-c".into(), "echo hi".into()];
/// let span = ExecSpan::new(None).argv(&argv).sandbox("3f2a").start();
/// assert_eq!(span.name(), "sandbox.exec");
/// ```
#[derive(Debug, Default)]
pub struct ExecSpan<'a> {
    parent_traceparent: Option<&'a str>,
    executable: Option<String>,
    command_line: Option<String>,
    sandbox_id: Option<String>,
}

impl<'a> ExecSpan<'a> {
    /// A span continuing `parent_traceparent` (the caller's `TRACEPARENT` or `traceparent`
    /// header), or starting a trace when it is `None` or not valid.
    pub fn new(parent_traceparent: Option<&'a str>) -> Self {
        ExecSpan {
            parent_traceparent,
            ..Default::default()
        }
    }

    /// The command as an argument vector: its executable's file name and the joined line.
    pub fn argv(self, argv: &[String]) -> Self {
        let Some(first) = argv.first() else {
            return self;
        };
        self.executable(first).command_line(&argv.join(" "))
    }

    /// The executable (a path or a name; its file name is recorded).
    pub fn executable(mut self, exe: &str) -> Self {
        let name = Path::new(exe)
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| exe.to_string());
        self.executable = Some(name);
        self
    }

    /// The command line as the caller gave it (a shell command, code): cut by
    /// [`command_line`].
    pub fn command_line(mut self, line: &str) -> Self {
        self.command_line = Some(command_line(line));
        self
    }

    /// The sandbox (`sandbox.id` and `container.id`) the run is in, when known up front.
    pub fn sandbox(mut self, id: &str) -> Self {
        self.sandbox_id = Some(id.to_string());
        self
    }

    /// Starts the span now.
    pub fn start(self) -> RunSpan {
        let mut span = RunSpan::start(EXEC_SPAN, self.parent_traceparent);
        span.set_attribute("openinference.span.kind", "TOOL");
        if let Some(id) = self.sandbox_id {
            span.set_attribute("sandbox.id", id.clone());
            span.set_attribute("container.id", id);
        }
        if let Some(exe) = self.executable {
            span.set_attribute("process.executable.name", exe);
        }
        if let Some(line) = self.command_line {
            span.set_attribute("process.command_line", line);
        }
        span
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_lines_are_joined_and_cut() {
        let line = argv_line(&["x".repeat(500)]);
        assert!(line.len() < 300 && line.ends_with('…'));
        assert_eq!(argv_line(&["a".into(), "b".into()]), "a b");
    }
    use crate::AttrValue;

    #[test]
    fn text_is_cut_on_a_character_boundary() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcd", 3), "abc…");
        assert_eq!(cut("aé", 2), "a…");
    }

    #[test]
    fn a_long_command_line_is_cut_on_a_character_boundary() {
        assert_eq!(command_line("echo hi"), "echo hi");
        let exact = "x".repeat(COMMAND_LINE_MAX);
        assert_eq!(command_line(&exact), exact);
        let long = format!("{}é{}", "x".repeat(COMMAND_LINE_MAX - 1), "y".repeat(10));
        let cut = command_line(&long);
        assert_eq!(cut, format!("{}…", "x".repeat(COMMAND_LINE_MAX - 1)));
    }

    #[test]
    fn the_span_names_the_executable_by_its_file_name() {
        let argv = vec!["/usr/bin/python3".to_string(), "-c".into(), "1".into()];
        let span = ExecSpan::new(None).argv(&argv).sandbox("ab").start();
        let s = |k| span.attribute(k).cloned();
        assert_eq!(
            s("process.executable.name"),
            Some(AttrValue::String("python3".into()))
        );
        assert_eq!(
            s("process.command_line"),
            Some(AttrValue::String("/usr/bin/python3 -c 1".into()))
        );
        assert_eq!(s("container.id"), Some(AttrValue::String("ab".into())));
        assert_eq!(
            s("openinference.span.kind"),
            Some(AttrValue::String("TOOL".into()))
        );
    }
}
