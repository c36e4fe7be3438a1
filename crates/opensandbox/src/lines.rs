//! Command output as execd keeps it, in bounded memory: a bounded log per command
//! ([`command_log`], an [`OutputLog`] whose bytes also count against its sandbox's
//! [`LogBudget`]) that the logs API reads as text ([`text_since`]). Lines come from
//! [`agentrun_pool::lines`].

use std::sync::Arc;

use agentrun_pool::output_log::{LogBudget, OutputLog};

/// Bytes of command output one sandbox keeps in all its command logs together (their
/// [`LogBudget`]): when a push would go over, the oldest finished commands are forgotten first
/// (see `execd::commands`, which keeps each line), then the pushing log drops its own oldest
/// lines.
pub const SANDBOX_LOG_BUDGET: usize = 64 * 1024 * 1024;

/// What one command's log keeps at most (the newest lines).
pub const LOG_CAP_BYTES: usize = 8 * 1024 * 1024;

/// A command's log: its output lines (stream 1 stdout, 2 stderr) with absolute numbers (the
/// logs API's cursor), the newest [`LOG_CAP_BYTES`] at most, within its sandbox's budget.
pub fn command_log(budget: Arc<LogBudget>) -> OutputLog {
    OutputLog::with_budget(LOG_CAP_BYTES, budget)
}

/// The lines of `log` numbered `cursor` and later (from the oldest kept if `cursor` is
/// older), each followed by `\n` (a blank line, kept as `"\n"`, is just its `\n`), as the logs
/// API answers them.
pub fn text_since(log: &OutputLog, cursor: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (_, line) in log.since(cursor) {
        let blank = line.len() == 1 && line.clone().eq(b"\n");
        if !blank {
            out.extend(line);
        }
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_text_is_a_line_each_from_the_cursor() {
        let budget = Arc::new(LogBudget::with_cap(SANDBOX_LOG_BUDGET));
        let mut log = OutputLog::with_budget(15, budget.clone());
        for l in ["aaa", "bbb", "\n", "ddd"] {
            log.push(1, l.as_bytes());
        }
        // 3 + 4 bytes a line (1 + 4 for the blank one): the last two fit in 15, not three.
        assert_eq!(log.end(), 4);
        assert_eq!(text_since(&log, 0), b"\nddd\n");
        assert_eq!(text_since(&log, 3), b"ddd\n");
        assert_eq!(text_since(&log, 4), b"");
        assert_eq!(text_since(&log, 9), b"");
        assert_eq!(budget.used(), 5 + 7);
        drop(log);
        assert_eq!(budget.used(), 0);
    }
}
