//! How `agentrun top` draws a [`TopState`]: header, sparklines, the pools table, the running
//! commands, the denial feed and the status line, into a ratatui [`Buffer`] (the terminal's,
//! or a plain one printed as text by `--once`).

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Paragraph, Row, Sparkline, StatefulWidget, Table, TableState, Widget,
};

use super::state::{Mode, TopState};

/// Lines above the tables: three of text, then the sparklines (bordered, two rows of bars).
const HEADER: u16 = 3;
const SPARKS: u16 = 4;
/// Denials shown by `--once` at most.
const ONCE_DENIALS: usize = 20;

const KEYS: &str =
    "q quit · p pool filter · f or / profile filter · ↑↓ select · k kill selected · ? help";

/// Draws the whole view in `area`: the commands and the denials share what the rest leaves.
pub fn render(s: &TopState, area: Rect, buf: &mut Buffer) {
    render_in(s, area, buf, Constraint::Fill(1), Constraint::Fill(1));
}

/// The view as plain text, `width` columns wide and as tall as its content (`--once`).
pub fn render_text(s: &TopState, width: u16) -> String {
    let rows = |n: usize| n.max(1) as u16 + 3;
    let commands = rows(s.commands().len());
    let denials = rows(s.denials().len().min(ONCE_DENIALS));
    let height = HEADER + SPARKS + pools_height(s) + commands + denials + 1;
    let area = Rect::new(0, 0, width.max(40), height);
    let mut buf = Buffer::empty(area);
    render_in(
        s,
        area,
        &mut buf,
        Constraint::Length(commands),
        Constraint::Length(denials),
    );
    let mut out = String::new();
    for y in 0..area.height {
        let mut line = String::new();
        for x in 0..area.width {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The pools table's rows, its header, and its border.
fn pools_height(s: &TopState) -> u16 {
    s.pool_rows().len().max(1) as u16 + 3
}

fn render_in(
    s: &TopState,
    area: Rect,
    buf: &mut Buffer,
    commands: Constraint,
    denials: Constraint,
) {
    let [header, sparks, pools_area, commands, denials, status] = Layout::vertical([
        Constraint::Length(HEADER),
        Constraint::Length(SPARKS),
        Constraint::Length(pools_height(s)),
        commands,
        denials,
        Constraint::Length(1),
    ])
    .areas(area);
    render_header(s, header, buf);
    render_sparks(s, sparks, buf);
    render_pools(s, pools_area, buf);
    render_commands(s, commands, buf);
    render_denials(s, denials, buf);
    render_status(s, status, buf);
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

/// `12.3 MiB`, `-` when unknown.
fn bytes(b: Option<u64>) -> String {
    match b {
        None => "-".into(),
        Some(b) if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
    }
}

/// `4.2 ms`, `-` when unknown.
fn millis(ms: Option<f64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms >= 1000.0 => format!("{:.2} s", ms / 1000.0),
        Some(ms) => format!("{ms:.1} ms"),
    }
}

/// `42s`, `3m04s`, `2h05m`.
fn duration(ms: u64) -> String {
    let s = ms / 1000;
    if s < 60 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

fn render_header(s: &TopState, area: Rect, buf: &mut Buffer) {
    let mut lines = vec![Line::from(vec![
        Span::styled("agentrun top", bold()),
        Span::raw(format!("  daemon at {}", s.socket)),
    ])];
    match &s.snapshot {
        None => lines.push(Line::raw("waiting for the daemon's first answer")),
        Some(snap) => {
            let st = &snap.status;
            lines.push(Line::raw(format!(
                "daemon memory {} · shells {} (running {}, max {}) · cells served {} · \
                 shells created {}, failed {}",
                bytes(snap.daemon_memory_bytes),
                st.shells,
                st.running,
                st.max_sandboxes,
                st.cells,
                st.created,
                st.create_failures
            )));
            let w = &snap.window;
            lines.push(Line::raw(format!(
                "last {} s: {} runs · {:.2} runs/s · p50 {} · p99 {}",
                w.seconds,
                w.runs,
                w.runs_per_s,
                millis(w.p50_ms),
                millis(w.p99_ms)
            )));
        }
    }
    Paragraph::new(lines).render(area, buf);
}

fn render_sparks(s: &TopState, area: Rect, buf: &mut Buffer) {
    let [runs, latency] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let (per_s, p50): (Vec<u64>, Vec<Option<u64>>) = match &s.snapshot {
        Some(snap) => (
            snap.window
                .runs_per_second
                .iter()
                .map(|&n| u64::from(n))
                .collect(),
            snap.window
                .p50_ms_per_second
                .iter()
                .map(|ms| ms.map(|ms| ms.ceil() as u64))
                .collect(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    // A sparkline draws from the left and cuts what does not fit: keep the newest seconds.
    let fits = usize::from(runs.width.saturating_sub(2));
    let per_s = &per_s[per_s.len().saturating_sub(fits)..];
    let p50 = &p50[p50.len().saturating_sub(fits)..];
    let peak = per_s.iter().copied().max().unwrap_or(0);
    Sparkline::default()
        .block(Block::bordered().title(format!(" runs/s, last minute (peak {peak}) ")))
        .data(per_s)
        .style(Style::default().fg(Color::Green))
        .render(runs, buf);
    let worst = p50.iter().flatten().copied().max().unwrap_or(0);
    Sparkline::default()
        .block(Block::bordered().title(format!(" p50 ms per second (peak {worst}) ")))
        .data(p50)
        .style(Style::default().fg(Color::Yellow))
        .render(latency, buf);
}

fn pool_filter_label(s: &TopState) -> String {
    let pool = s
        .pool_filter
        .as_ref()
        .map_or_else(|| "all".to_string(), |k| k.to_string());
    if s.profile_filter.is_empty() {
        format!("pool: {pool}")
    } else {
        format!("pool: {pool}, profile ~ {:?}", s.profile_filter)
    }
}

fn render_pools(s: &TopState, area: Rect, buf: &mut Buffer) {
    let rows: Vec<Row> = s
        .pool_rows()
        .into_iter()
        .map(|r| {
            Row::new(vec![
                r.key.image.clone(),
                r.key.profile.clone(),
                match r.target {
                    Some(t) => format!("{}/{}", r.ready, t),
                    None => format!("{} (no pool)", r.ready),
                },
                r.running.to_string(),
                r.hits.to_string(),
                r.misses.to_string(),
                r.discarded.to_string(),
            ])
        })
        .collect();
    let discarded = match &s.snapshot {
        Some(snap) if !snap.status.discarded.is_empty() => snap
            .status
            .discarded
            .iter()
            .map(|(why, n)| format!("{why} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "none".into(),
    };
    let unpooled = s.snapshot.as_ref().map_or(0, |snap| snap.status.unpooled);
    let headers = "IMAGE, PROFILE, READY, RUNNING, HITS, MISSES, DISCARDED";
    let widths = [24, 24, 14, 8, 8, 8, 10];
    let table = table(rows, headers, widths).block(
        Block::bordered()
            .title(format!(" pools ({}) ", pool_filter_label(s)))
            .title_bottom(format!(
                " shells discarded: {discarded} · runs no pool kept: {unpooled} "
            )),
    );
    Widget::render(table, area, buf);
}

fn render_commands(s: &TopState, area: Rect, buf: &mut Buffer) {
    let commands = s.commands();
    let rows: Vec<Row> = commands
        .iter()
        .map(|c| {
            Row::new(vec![
                c.id.clone(),
                c.sandbox.clone(),
                c.profile.clone(),
                duration(c.elapsed_ms),
                s.cpu_percent
                    .get(&c.id)
                    .map_or_else(|| "-".into(), |p| format!("{p:.0}%")),
                c.cpu_ms.map_or_else(|| "-".into(), duration),
                bytes(c.memory_bytes),
                c.command.clone(),
            ])
        })
        .collect();
    // Ids of processes of long-lived sandboxes (`SANDBOX/PROCESS`) are longer than `run-N`.
    let id_width = fit(commands.iter().map(|c| c.id.as_str()), 8, 48);
    let sandbox_width = fit(commands.iter().map(|c| c.sandbox.as_str()), 16, 40);
    let mut state = TableState::default().with_selected(s.selected_index());
    let title = if commands.is_empty() {
        " running commands: none ".to_string()
    } else {
        format!(" running commands ({}) ", commands.len())
    };
    let headers = "ID, SANDBOX, PROFILE, ELAPSED, CPU, CPU TIME, MEMORY, COMMAND";
    let widths = [id_width, sandbox_width, 16, 8, 5, 8, 10, 0];
    StatefulWidget::render(
        table(rows, headers, widths)
            .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
            .highlight_symbol("> ")
            .block(Block::bordered().title(title)),
        area,
        buf,
        &mut state,
    );
}

fn render_denials(s: &TopState, area: Rect, buf: &mut Buffer) {
    let rows: Vec<Row> = s
        .denials()
        .into_iter()
        .map(|r| {
            // RFC 3339 with milliseconds: the time of day is what a feed needs.
            let time = r
                .time
                .split_once('T')
                .map_or(r.time.as_str(), |(_, t)| t.trim_end_matches('Z'));
            let decision = if r.decision == "escalate" {
                format!("escalate ({})", r.escalation)
            } else {
                r.decision.clone()
            };
            Row::new(vec![
                time.to_string(),
                if r.sandbox_id.is_empty() {
                    "-".into()
                } else {
                    r.sandbox_id.clone()
                },
                decision,
                r.action.clone(),
                r.rule.clone(),
                r.resource.clone(),
            ])
        })
        .collect();
    let headers = "TIME (UTC), SANDBOX, DECISION, ACTION, RULE, RESOURCE";
    let widths = [12, 22, 10, 12, 24, 0];
    let table =
        table(rows, headers, widths).block(Block::bordered().title(" denials, newest first "));
    Widget::render(table, area, buf);
}

/// A table of `rows` under a bold header of `headers` (separated by ", "), its columns
/// `widths` wide (0: the rest of the width).
fn table<'a, const N: usize>(rows: Vec<Row<'a>>, headers: &'a str, widths: [u16; N]) -> Table<'a> {
    let widths = widths.map(|w| match w {
        0 => Constraint::Fill(1),
        w => Constraint::Length(w),
    });
    Table::new(rows, widths).header(Row::new(headers.split(", ")).style(bold()))
}

/// The width of a column showing `values`: the longest one's, within `min..=max`.
fn fit<'a>(values: impl Iterator<Item = &'a str>, min: usize, max: usize) -> u16 {
    values
        .map(|v| v.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(min, max) as u16
}

fn render_status(s: &TopState, area: Rect, buf: &mut Buffer) {
    let line = match &s.mode {
        Mode::Filter(text) => Line::from(vec![
            Span::styled("profile filter (Enter to apply, Esc to cancel): ", bold()),
            Span::raw(format!("{text}_")),
        ]),
        Mode::ConfirmKill(id) => {
            let what = s
                .commands()
                .into_iter()
                .find(|c| &c.id == id)
                .map_or_else(String::new, |c| format!(" ({})", c.command));
            Line::from(Span::styled(
                format!("kill {id}{what}? y to confirm, any other key cancels"),
                bold().fg(Color::Red),
            ))
        }
        Mode::Normal if s.help => Line::raw(KEYS),
        Mode::Normal if s.error.is_some() => Line::from(Span::styled(
            s.error.clone().unwrap_or_default(),
            Style::default().fg(Color::Red),
        )),
        Mode::Normal if !s.status.is_empty() => Line::raw(s.status.clone()),
        Mode::Normal => Line::raw("? for keys"),
    };
    Paragraph::new(line).render(area, buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_read_like_top() {
        assert_eq!(duration(4_200), "4.2s");
        assert_eq!(duration(184_000), "3m04s");
        assert_eq!(duration(7_500_000), "2h05m");
        assert_eq!(bytes(Some(3 << 20)), "3.0 MiB");
        assert_eq!(bytes(None), "-");
        assert_eq!(millis(Some(4.25)), "4.2 ms");
    }
}
