//! The daemon's Prometheus metrics: the run and denial counters it keeps itself (one
//! process-wide [`Metrics`], [`global`]), and their text exposition (format 0.0.4, what
//! `agentrun serve --metrics ADDR` serves at `/metrics`) together with the pool's own
//! counters ([`PoolStatus`]) and the daemon's resident memory, read at scrape time.
//!
//! Hand-written rather than with `prometheus-client`: that crate writes OpenMetrics 1.0
//! (`# EOF`, counter families named without `_total`, `# UNIT`), while the endpoint serves
//! the classic `text/plain; version=0.0.4` every scraper reads; and most values already live
//! in the pool's counters ([`PoolStatus`]), so a registry would keep a second copy of them.
//! The format is small: `# HELP`, `# TYPE`, one `name{labels} value` line per sample, label
//! values escaped (`\\`, `\"`, `\n`).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::protocol::{PoolStatus, Window};

/// Upper bounds (seconds) of the run duration histogram's buckets (`+Inf` is added).
pub const DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

/// Label values of `agentrun_runs_total{outcome}` (how [`agentrun_telemetry::RunFinish`]
/// counts a run).
pub use agentrun_telemetry::finish::outcome;

/// Counters the daemon keeps beside the pool's.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    /// The last minute's run ends (what `agentrun top` and `/ui` show).
    recent: Recent,
}

#[derive(Debug, Default)]
struct Inner {
    runs: BTreeMap<String, u64>,
    /// Per bucket of [`DURATION_BUCKETS`] (not cumulative; summed when rendered).
    buckets: [u64; DURATION_BUCKETS.len()],
    duration_sum: f64,
    duration_count: u64,
    denials: BTreeMap<String, u64>,
}

/// The daemon's metrics (one per process).
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

impl Metrics {
    /// One run ended with `outcome` (see [`outcome`]) after `duration`.
    pub fn run(&self, outcome: &str, duration: Duration) {
        self.recent.record(duration);
        let mut g = crate::lock(&self.inner);
        *g.runs.entry(outcome.to_owned()).or_default() += 1;
        let secs = duration.as_secs_f64();
        if let Some(i) = DURATION_BUCKETS.iter().position(|b| secs <= *b) {
            g.buckets[i] += 1;
        }
        g.duration_sum += secs;
        g.duration_count += 1;
    }

    /// The ends of the last minute's runs.
    pub fn recent(&self) -> &Recent {
        &self.recent
    }

    /// A policy decision denied an action under `rule` (its rule id).
    pub fn denial(&self, rule: &str) {
        let rule = if rule.is_empty() { "unknown" } else { rule };
        *crate::lock(&self.inner)
            .denials
            .entry(rule.to_owned())
            .or_default() += 1;
    }

    /// The text exposition of these counters, the pool's (`status`) and the daemon's
    /// resident memory (`rss_bytes`, when known).
    pub fn render(&self, status: &PoolStatus, rss_bytes: Option<u64>) -> String {
        let g = crate::lock(&self.inner);
        let mut out = String::new();
        family(
            &mut out,
            "agentrun_runs_total",
            "counter",
            "Runs the daemon finished, by outcome (ok, error, timeout, oom, failed).",
        );
        for o in [
            outcome::OK,
            outcome::ERROR,
            outcome::TIMEOUT,
            outcome::OOM,
            outcome::FAILED,
        ] {
            let n = g.runs.get(o).copied().unwrap_or(0);
            sample(&mut out, "agentrun_runs_total", &[("outcome", o)], n as f64);
        }
        family(
            &mut out,
            "agentrun_run_duration_seconds",
            "histogram",
            "Wall time of the daemon's runs, from the cell's start to its end.",
        );
        let mut cumulative = 0;
        for (b, n) in DURATION_BUCKETS.iter().zip(g.buckets.iter()) {
            cumulative += n;
            let le = format!("{b}");
            sample(
                &mut out,
                "agentrun_run_duration_seconds_bucket",
                &[("le", &le)],
                cumulative as f64,
            );
        }
        sample(
            &mut out,
            "agentrun_run_duration_seconds_bucket",
            &[("le", "+Inf")],
            g.duration_count as f64,
        );
        sample(
            &mut out,
            "agentrun_run_duration_seconds_sum",
            &[],
            g.duration_sum,
        );
        sample(
            &mut out,
            "agentrun_run_duration_seconds_count",
            &[],
            g.duration_count as f64,
        );
        counters_by(
            &mut out,
            "agentrun_policy_denials_total",
            "Policy decisions that denied an action in the daemon's runs, by rule id.",
            "rule",
            &g.denials,
        );
        drop(g);
        for (name, help, value) in [
            (
                "agentrun_pool_hits_total",
                "Runs served by a ready shell of a pool.",
                (|p: &crate::protocol::PoolInfo| p.hits) as fn(&crate::protocol::PoolInfo) -> u64,
            ),
            (
                "agentrun_pool_misses_total",
                "Runs of a pool's image and profile that found it empty.",
                |p| p.misses,
            ),
        ] {
            family(&mut out, name, "counter", help);
            for p in &status.pools {
                let labels = [("image", p.image.as_str()), ("profile", p.profile.as_str())];
                sample(&mut out, name, &labels, value(p) as f64);
            }
        }
        family(
            &mut out,
            "agentrun_unpooled_runs_total",
            "counter",
            "Runs whose image and profile no pool keeps (a shell made for each).",
        );
        sample(
            &mut out,
            "agentrun_unpooled_runs_total",
            &[],
            status.unpooled as f64,
        );
        family(
            &mut out,
            "agentrun_shells_created_total",
            "counter",
            "Shells (pooled sandboxes) created since the daemon started.",
        );
        sample(
            &mut out,
            "agentrun_shells_created_total",
            &[],
            status.created as f64,
        );
        family(
            &mut out,
            "agentrun_shell_create_failures_total",
            "counter",
            "Shell creations that failed.",
        );
        sample(
            &mut out,
            "agentrun_shell_create_failures_total",
            &[],
            status.create_failures as f64,
        );
        counters_by(
            &mut out,
            "agentrun_shells_discarded_total",
            "Shells discarded, by reason (timeout, oom, max_runs, max_age, idle, ...).",
            "reason",
            &status.discarded,
        );
        family(
            &mut out,
            "agentrun_sandboxes",
            "gauge",
            "Shells by state: ready (in a pool) or running (a run or a long-lived sandbox in it).",
        );
        let ready: usize = status.pools.iter().map(|p| p.ready).sum();
        sample(
            &mut out,
            "agentrun_sandboxes",
            &[("state", "ready")],
            ready as f64,
        );
        sample(
            &mut out,
            "agentrun_sandboxes",
            &[("state", "running")],
            status.running as f64,
        );
        family(
            &mut out,
            "agentrun_sandboxes_max",
            "gauge",
            "Most shells that may exist at once (--max-sandboxes).",
        );
        sample(
            &mut out,
            "agentrun_sandboxes_max",
            &[],
            status.max_sandboxes as f64,
        );
        if let Some(rss) = rss_bytes {
            family(
                &mut out,
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size of the agentrun daemon in bytes.",
            );
            sample(&mut out, "process_resident_memory_bytes", &[], rss as f64);
        }
        out
    }
}

/// The daemon's resident memory (`VmRSS` of `/proc/self/status`), in bytes.
pub fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    // Writing to a String cannot fail (here and below).
    let _ = writeln!(out, "# HELP {name} {}", help.replace('\\', "\\\\"));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A counter family `name` with one sample per entry of `counts`, its key as label `label`.
fn counters_by(
    out: &mut String,
    name: &str,
    help: &str,
    label: &str,
    counts: &BTreeMap<String, u64>,
) {
    family(out, name, "counter", help);
    for (key, n) in counts {
        sample(out, name, &[(label, key)], *n as f64);
    }
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            // Writing to a String cannot fail.
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        out.push('}');
    }
    // Writing to a String cannot fail.
    let _ = writeln!(out, " {value}");
}

/// A label value as the text format quotes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Ended runs the window keeps at most (a daemon doing more than this a minute sees the
/// newest ones only).
const RECENT_MAX: usize = 1 << 16;
/// The length of the window of recent runs ([`Recent::window`]).
pub const WINDOW_SECONDS: u32 = 60;

/// The ends of recent runs (when, how long), for [`Window`].
#[derive(Debug, Default)]
pub struct Recent {
    ends: Mutex<VecDeque<(Instant, f64)>>,
}

impl Recent {
    /// A run ended now after `duration`.
    pub fn record(&self, duration: Duration) {
        let now = Instant::now();
        let mut ends = crate::lock(&self.ends);
        prune(&mut ends, now);
        if ends.len() == RECENT_MAX {
            ends.pop_front();
        }
        ends.push_back((now, duration.as_secs_f64() * 1000.0));
    }

    /// The last [`WINDOW_SECONDS`] before `now`.
    pub fn window(&self, now: Instant) -> Window {
        let mut ends = crate::lock(&self.ends);
        prune(&mut ends, now);
        let seconds = WINDOW_SECONDS as usize;
        let mut per_second: Vec<Vec<f64>> = vec![Vec::new(); seconds];
        for (at, ms) in ends.iter() {
            let ago = now.saturating_duration_since(*at).as_secs() as usize;
            if ago < seconds {
                per_second[seconds - 1 - ago].push(*ms);
            }
        }
        drop(ends);
        let mut all: Vec<f64> = per_second.iter().flatten().copied().collect();
        all.sort_by(f64::total_cmp);
        let runs = all.len() as u64;
        Window {
            seconds: WINDOW_SECONDS,
            runs_per_second: per_second.iter().map(|s| s.len() as u32).collect(),
            p50_ms_per_second: per_second
                .into_iter()
                .map(|mut s| {
                    s.sort_by(f64::total_cmp);
                    percentile(&s, 50.0)
                })
                .collect(),
            runs,
            runs_per_s: runs as f64 / f64::from(WINDOW_SECONDS),
            p50_ms: percentile(&all, 50.0),
            p99_ms: percentile(&all, 99.0),
        }
    }
}

fn prune(ends: &mut VecDeque<(Instant, f64)>, now: Instant) {
    let span = Duration::from_secs(u64::from(WINDOW_SECONDS));
    while ends
        .front()
        .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= span)
    {
        ends.pop_front();
    }
}

/// The nearest-rank percentile `p` of sorted `values`.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Where [`agentrun_telemetry::RunFinish`] counts the daemon's runs and their denials.
impl agentrun_telemetry::RunCounter for Metrics {
    fn run(&self, outcome: &str, duration: Duration) {
        Metrics::run(self, outcome, duration);
    }

    fn denials(&self, rules: &[String]) {
        for rule in rules.iter().take(MAX_DENIALS_PER_RUN) {
            self.denial(rule);
        }
    }
}

/// Most denials one run counts (a rule id is a label value: one run, or one client's
/// message, cannot grow the daemon's metrics without bound).
pub const MAX_DENIALS_PER_RUN: usize = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn window_counts_runs_per_second_and_forgets_old_ones() {
        let recent = Recent::default();
        for ms in [10, 20, 30] {
            recent.record(Duration::from_millis(ms));
        }
        let w = recent.window(Instant::now());
        assert_eq!(w.seconds, 60);
        assert_eq!(w.runs_per_second.len(), 60);
        assert_eq!(*w.runs_per_second.last().unwrap(), 3);
        assert_eq!(w.runs, 3);
        assert_eq!(w.p50_ms, Some(20.0));
        assert_eq!(w.p99_ms, Some(30.0));
        assert_eq!(*w.p50_ms_per_second.last().unwrap(), Some(20.0));
        assert_eq!(w.p50_ms_per_second[0], None);
        let later = recent.window(Instant::now() + Duration::from_secs(61));
        assert_eq!(later.runs, 0);
        assert_eq!(later.p50_ms, None);
        assert!(later.runs_per_second.iter().all(|n| *n == 0));
    }
    use crate::protocol::PoolInfo;

    fn status() -> PoolStatus {
        PoolStatus {
            pools: vec![PoolInfo {
                image: "host".into(),
                profile: "default".into(),
                ready: 3,
                target: 4,
                hits: 7,
                misses: 2,
                discarded: 0,
                zygote: None,
            }],
            unpooled: 1,
            created: 9,
            create_failures: 0,
            running: 1,
            max_sandboxes: 64,
            shells: 4,
            cells: 10,
            discarded: [("max_runs".to_string(), 2), ("timeout".to_string(), 1)].into(),
            shell_max_runs: 500,
            shell_max_age_s: 300,
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in\n{text}"))
    }

    #[test]
    fn counters_histogram_and_pool_values() {
        let m = Metrics::default();
        m.run(outcome::OK, Duration::from_millis(3));
        m.run(outcome::OK, Duration::from_millis(30));
        m.run(outcome::ERROR, Duration::from_secs(2));
        m.run(outcome::TIMEOUT, Duration::from_secs(100));
        m.denial("fs.read.deny");
        m.denial("fs.read.deny");
        m.denial("");
        let t = m.render(&status(), Some(4096));
        assert_eq!(
            line(&t, "agentrun_runs_total{outcome=\"ok\"}"),
            "agentrun_runs_total{outcome=\"ok\"} 2"
        );
        assert_eq!(
            line(&t, "agentrun_runs_total{outcome=\"error\"}"),
            "agentrun_runs_total{outcome=\"error\"} 1"
        );
        assert_eq!(
            line(&t, "agentrun_runs_total{outcome=\"oom\"}"),
            "agentrun_runs_total{outcome=\"oom\"} 0"
        );
        // Cumulative buckets; 100 s only in +Inf.
        assert!(
            t.contains("agentrun_run_duration_seconds_bucket{le=\"0.005\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("agentrun_run_duration_seconds_bucket{le=\"0.05\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("agentrun_run_duration_seconds_bucket{le=\"2.5\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("agentrun_run_duration_seconds_bucket{le=\"60\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("agentrun_run_duration_seconds_bucket{le=\"+Inf\"} 4\n"),
            "{t}"
        );
        assert!(t.contains("agentrun_run_duration_seconds_count 4\n"), "{t}");
        assert!(
            t.contains("agentrun_run_duration_seconds_sum 102.033\n"),
            "{t}"
        );
        assert!(t.contains("agentrun_policy_denials_total{rule=\"fs.read.deny\"} 2\n"));
        assert!(t.contains("agentrun_policy_denials_total{rule=\"unknown\"} 1\n"));
        assert!(t.contains("agentrun_pool_hits_total{image=\"host\",profile=\"default\"} 7\n"));
        assert!(t.contains("agentrun_pool_misses_total{image=\"host\",profile=\"default\"} 2\n"));
        assert!(t.contains("agentrun_shells_created_total 9\n"));
        assert!(t.contains("agentrun_shells_discarded_total{reason=\"max_runs\"} 2\n"));
        assert!(t.contains("agentrun_sandboxes{state=\"ready\"} 3\n"));
        assert!(t.contains("agentrun_sandboxes{state=\"running\"} 1\n"));
        assert!(t.contains("process_resident_memory_bytes 4096\n"));
    }

    #[test]
    fn every_family_has_help_and_type_once_and_its_samples_follow_it() {
        let m = Metrics::default();
        m.run(outcome::FAILED, Duration::from_millis(1));
        m.denial("net.deny");
        let t = m.render(&status(), Some(1));
        let mut seen = std::collections::BTreeSet::new();
        let mut current: Option<(String, String)> = None;
        for l in t.lines() {
            if let Some(rest) = l.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(seen.insert(name.clone()), "{name} twice in\n{t}");
                current = Some((name, String::new()));
            } else if let Some(rest) = l.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                let (cur, _) = current.clone().unwrap();
                assert_eq!(name, cur, "TYPE right after HELP");
                assert!(["counter", "gauge", "histogram"].contains(&kind));
                current = Some((cur, kind.to_string()));
            } else {
                let (cur, kind) = current.clone().expect("sample before any HELP");
                let name = l.split(['{', ' ']).next().unwrap();
                let ok = match kind.as_str() {
                    "histogram" => [
                        format!("{cur}_bucket"),
                        format!("{cur}_sum"),
                        format!("{cur}_count"),
                    ]
                    .contains(&name.to_string()),
                    _ => name == cur,
                };
                assert!(ok, "{name} under {cur} ({kind})");
                let value = l.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok(), "{l}");
                if kind == "counter" {
                    assert!(cur.ends_with("_total"), "{cur}");
                }
            }
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        m.denial("a\"b\\c\nd");
        let t = m.render(&PoolStatus::default(), None);
        assert!(
            t.contains("agentrun_policy_denials_total{rule=\"a\\\"b\\\\c\\nd\"} 1\n"),
            "{t}"
        );
        assert!(!t.contains("process_resident_memory_bytes"));
    }

    #[test]
    fn resident_memory_is_read() {
        let rss = resident_memory_bytes().expect("VmRSS");
        assert!(rss > 1 << 20, "{rss}");
    }
}
