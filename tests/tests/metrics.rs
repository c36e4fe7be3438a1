//! The daemon's Prometheus endpoint, end to end: `agentrun serve --metrics ADDR` (or
//! `metrics = "ADDR"` in its config file), `agentrun exec` runs through it, and
//! `GET /metrics` scraped over HTTP and parsed strictly (text format 0.0.4: every sample
//! under its family's `# HELP` and `# TYPE`, label values unescaped, values numbers).
//!
//! Contract under test (issue 19, metrics):
//! - `text/plain; version=0.0.4` with `agentrun_runs_total{outcome}`,
//!   `agentrun_run_duration_seconds` (histogram), `agentrun_pool_hits_total` /
//!   `agentrun_pool_misses_total`, `agentrun_shells_created_total`,
//!   `agentrun_shells_discarded_total{reason}`, `agentrun_policy_denials_total{rule}`,
//!   `agentrun_sandboxes{state}`, `process_resident_memory_bytes`.
//! - Counters move with the runs: ok, non-zero exit, timeout, and a run whose egress proxy
//!   denied a connection (`rule="network.default"`).
//! - The scrape needs `Authorization: Bearer KEY` (401 otherwise): the key given, or the
//!   one `serve` made in its state dir's key file.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use agentrun_e2e::osb::free_port;
use agentrun_e2e::*;

/// One sample's key: its name and its labels, sorted.
type Key = (String, Vec<(String, String)>);

struct Scrape {
    status: u16,
    content_type: String,
    body: String,
}

fn get(addr: &str, bearer: Option<&str>) -> Scrape {
    let mut s = TcpStream::connect(addr).expect("connect to --metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = bearer
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    // Bodies here are small: axum sends them with a content-length, not chunked.
    Scrape {
        status,
        content_type,
        body: body.to_string(),
    }
}

/// Unescapes a label value (`\\`, `\"`, `\n`); panics on anything else after a backslash.
fn unescape(v: &str) -> String {
    let mut out = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('\\') => out.push('\\'),
                Some('"') => out.push('"'),
                Some('n') => out.push('\n'),
                other => panic!("bad escape \\{other:?} in {v:?}"),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses `name{k="v",...}` into its key.
fn parse_key(s: &str) -> Key {
    let Some((name, rest)) = s.split_once('{') else {
        return (s.to_string(), Vec::new());
    };
    let inner = rest
        .strip_suffix('}')
        .unwrap_or_else(|| panic!("no }} in {s:?}"));
    let mut labels = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let (k, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad labels {s:?}"));
        // The value ends at the first unescaped quote.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end.unwrap_or_else(|| panic!("unterminated label in {s:?}"));
        labels.push((k.to_string(), unescape(&after[..end])));
        rest = after[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&after[end + 1..]);
    }
    labels.sort();
    (name.to_string(), labels)
}

/// Parses the text format strictly; returns the samples and each family's type.
fn parse(text: &str) -> (BTreeMap<Key, f64>, BTreeMap<String, String>) {
    let mut samples = BTreeMap::new();
    let mut types = BTreeMap::new();
    let mut helped = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    assert!(text.ends_with('\n'), "the text ends with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(!help.is_empty(), "{line}");
            assert!(
                helped.insert(name.to_string(), ()).is_none(),
                "HELP twice: {line}"
            );
            current = None;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(helped.contains_key(name), "TYPE without HELP: {line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "TYPE twice: {line}"
            );
            current = Some((name.to_string(), kind.to_string()));
        } else {
            assert!(!line.starts_with('#'), "unexpected comment {line:?}");
            let (key, value) = line.rsplit_once(' ').expect("sample value");
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            let key = parse_key(key);
            let (family, kind) = current
                .clone()
                .unwrap_or_else(|| panic!("sample before TYPE: {line}"));
            let ok = if kind == "histogram" {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| key.0 == format!("{family}{s}"))
            } else {
                key.0 == family
            };
            assert!(ok, "{line} is not of family {family} ({kind})");
            assert!(samples.insert(key, value).is_none(), "sample twice: {line}");
        }
    }
    (samples, types)
}

fn value(samples: &BTreeMap<Key, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut l: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    *samples
        .get(&(name.to_string(), l))
        .unwrap_or_else(|| panic!("no sample {name}{labels:?} in {samples:#?}"))
}

/// Sum of every sample of `name` (whatever its labels).
fn total(samples: &BTreeMap<Key, f64>, name: &str) -> f64 {
    samples
        .iter()
        .filter(|((n, _), _)| n == name)
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn runs_denials_and_pool_counters_move_with_the_runs() {
    let Some(_lock) = setup_exclusive() else {
        return;
    };
    let addr = format!("127.0.0.1:{}", free_port());
    let mut d = Daemon::unstarted().with_env("AGENTRUN_API_KEY", "");
    d.launch(["--pool-size", "1", "--metrics", addr.as_str()]);
    // No key given: the one of the state dir's key file, made at start.
    let key = d.api_key();
    assert_eq!(get(&addr, None).status, 401);

    let first = get(&addr, Some(&key));
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        first.content_type.starts_with("text/plain; version=0.0.4"),
        "content type {:?}",
        first.content_type
    );
    let (before, types) = parse(&first.body);
    for (name, kind) in [
        ("agentrun_runs_total", "counter"),
        ("agentrun_run_duration_seconds", "histogram"),
        ("agentrun_pool_hits_total", "counter"),
        ("agentrun_pool_misses_total", "counter"),
        ("agentrun_shells_created_total", "counter"),
        ("agentrun_shells_discarded_total", "counter"),
        ("agentrun_policy_denials_total", "counter"),
        ("agentrun_sandboxes", "gauge"),
        ("process_resident_memory_bytes", "gauge"),
    ] {
        assert_eq!(
            types.get(name).map(String::as_str),
            Some(kind),
            "{name}\n{}",
            first.body
        );
    }
    assert_eq!(
        value(&before, "agentrun_runs_total", &[("outcome", "ok")]),
        0.0
    );
    assert_eq!(
        value(&before, "agentrun_run_duration_seconds_count", &[]),
        0.0
    );
    assert_eq!(total(&before, "agentrun_policy_denials_total"), 0.0);
    let rss = value(&before, "process_resident_memory_bytes", &[]);
    assert!(rss > (1 << 20) as f64, "daemon RSS {rss}");

    // ok, non-zero exit, timeout, and a run whose proxy denies a connection (exit 0).
    d.exec(["true"]).run().assert_code(0);
    d.exec(["sh", "-c", "exit 3"]).run().assert_code(3);
    let out = d
        .exec_with(["--timeout", "1s"], ["sleep", "30"])
        .timeout(Duration::from_secs(60))
        .run();
    assert_eq!(out.code(), 124, "{out}");
    d.provoke_egress_denial("evil.example");

    let after = get(&addr, Some(&key));
    assert_eq!(after.status, 200);
    let (s, _) = parse(&after.body);
    let runs = |o: &str| value(&s, "agentrun_runs_total", &[("outcome", o)]);
    assert_eq!(runs("ok"), 2.0, "{}", after.body);
    assert_eq!(runs("error"), 1.0, "{}", after.body);
    assert_eq!(runs("timeout"), 1.0, "{}", after.body);
    assert_eq!(runs("failed") + runs("oom"), 0.0, "{}", after.body);
    assert_eq!(value(&s, "agentrun_run_duration_seconds_count", &[]), 4.0);
    assert_eq!(
        value(
            &s,
            "agentrun_run_duration_seconds_bucket",
            &[("le", "+Inf")]
        ),
        4.0
    );
    // The timed-out run lasted its second; the others far less than 60 s.
    assert!(value(&s, "agentrun_run_duration_seconds_sum", &[]) >= 1.0);
    assert!(value(&s, "agentrun_run_duration_seconds_bucket", &[("le", "0.5")]) <= 3.0);
    assert_eq!(
        value(&s, "agentrun_run_duration_seconds_bucket", &[("le", "60")]),
        4.0
    );
    // Buckets are cumulative.
    let mut buckets: Vec<(f64, f64)> = s
        .iter()
        .filter(|((n, _), _)| n == "agentrun_run_duration_seconds_bucket")
        .map(|((_, l), v)| {
            let le = &l.iter().find(|(k, _)| k == "le").unwrap().1;
            (
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                },
                *v,
            )
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");

    assert_eq!(
        value(
            &s,
            "agentrun_policy_denials_total",
            &[("rule", "network.default")]
        ),
        1.0,
        "{}",
        after.body
    );
    // Every run was a pool hit, a miss or an unpooled run.
    let served = total(&s, "agentrun_pool_hits_total")
        + total(&s, "agentrun_pool_misses_total")
        + value(&s, "agentrun_unpooled_runs_total", &[]);
    assert_eq!(served, 4.0, "{}", after.body);
    assert!(value(&s, "agentrun_shells_created_total", &[]) >= 1.0);
    // The timed-out run's shell was discarded for it.
    assert!(
        value(
            &s,
            "agentrun_shells_discarded_total",
            &[("reason", "timeout")]
        ) >= 1.0,
        "{}",
        after.body
    );
    // The last run's shell is lent until its cell is torn down, just after the client ended.
    let mut last = String::new();
    let settled = wait_until(Duration::from_secs(20), || {
        last = get(&addr, Some(&key)).body;
        let (s, _) = parse(&last);
        let ready = value(&s, "agentrun_sandboxes", &[("state", "ready")]);
        let running = value(&s, "agentrun_sandboxes", &[("state", "running")]);
        // Ready shells are what `ps` lists as ready (a miss's shell joins its pool: the
        // pool may hold more than --pool-size).
        let listed = d.ps().iter().filter(|e| e.state == "ready").count() as f64;
        (running == 0.0 && ready >= 1.0 && ready == listed).then_some(())
    });
    assert!(settled.is_some(), "a shell still running:\n{last}");

    // What `pool status` says agrees.
    let pools = d.pool_status();
    assert_eq!(
        value(
            &s,
            "agentrun_pool_hits_total",
            &[("image", "host"), ("profile", "default")]
        ),
        pools[0].hits as f64
    );
    agentrun_e2e::osb::stop_clean(d);
}

#[test]
fn api_key_is_a_bearer_token_and_config_file_turns_it_on() {
    let Some(_lock) = setup() else { return };
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let dir = tempdir();
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, format!("metrics = \"{addr}\"\npool_size = 1\n")).unwrap();
    let mut d = Daemon::unstarted().with_env("AGENTRUN_API_KEY", "s3cret");
    d.launch(["--config", config.to_str().unwrap()]);

    let none = get(&addr, None);
    assert_eq!(none.status, 401, "{}", none.body);
    assert!(!none.body.contains("agentrun_runs_total"));
    let wrong = get(&addr, Some("s3cre"));
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    let right = get(&addr, Some("s3cret"));
    assert_eq!(right.status, 200, "{}", right.body);
    let (s, _) = parse(&right.body);
    assert_eq!(value(&s, "agentrun_sandboxes_max", &[]), 64.0);
    agentrun_e2e::osb::stop_clean(d);
}

#[test]
fn metrics_beyond_loopback_need_the_generated_key() {
    let Some(_lock) = setup() else { return };
    let port = free_port();
    let addr = format!("0.0.0.0:{port}");
    let mut d = Daemon::unstarted().with_env("AGENTRUN_API_KEY", "");
    d.launch(["--pool-size", "1", "--metrics", addr.as_str()]);
    let local = format!("127.0.0.1:{port}");
    let none = get(&local, None);
    assert_eq!(none.status, 401, "{}", none.body);
    let right = get(&local, Some(&d.api_key()));
    assert_eq!(right.status, 200, "{}", right.body);
    agentrun_e2e::osb::stop_clean(d);

    // A bad address is one line.
    let d = Daemon::unstarted();
    let out = d
        .agentrun(["serve", "--metrics", "localhost"])
        .timeout(Duration::from_secs(30))
        .run();
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr().contains("--metrics"), "{out}");
}

/// Commands of OpenSandbox sandboxes, run with the official SDK, are the daemon's runs too.
#[test]
fn opensandbox_commands_are_counted() {
    let Some(_lock) = setup() else { return };
    let metrics = format!("127.0.0.1:{}", free_port());
    let (d, domain) = agentrun_e2e::osb::start_with_pool(
        "1",
        &[("AGENTRUN_API_KEY", String::new())],
        &["--metrics", metrics.as_str()],
    );
    let key = d.api_key();
    let script = r#"
import os
from datetime import timedelta
from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync
cfg = ConnectionConfigSync(domain=os.environ["OSB_DOMAIN"], api_key=os.environ["OSB_API_KEY"], protocol="http")
sbx = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
try:
    assert sbx.commands.run("true").exit_code == 0
    assert sbx.commands.run("exit 4").exit_code == 4
finally:
    sbx.kill()
print("OK")
"#;
    let mut cmd = std::process::Command::new(agentrun_e2e::osb::python());
    cmd.arg("-c")
        .arg(script)
        .env("OSB_DOMAIN", &domain)
        .env("OSB_API_KEY", &key)
        .env("OPENSANDBOX_DISABLE_METRICS", "1")
        .env_remove("OPEN_SANDBOX_API_KEY")
        .env_remove("OPEN_SANDBOX_DOMAIN");
    let out = run_with_timeout(cmd, None, Duration::from_secs(120));
    assert!(out.stdout().contains("OK"), "{out}\n{}", d.log());
    let scrape = get(&metrics, Some(&key));
    let (s, _) = parse(&scrape.body);
    let runs = |o: &str| value(&s, "agentrun_runs_total", &[("outcome", o)]);
    assert_eq!(runs("ok"), 1.0, "{}", scrape.body);
    assert_eq!(runs("error"), 1.0, "{}", scrape.body);
    assert_eq!(value(&s, "agentrun_run_duration_seconds_count", &[]), 2.0);
    agentrun_e2e::osb::stop_clean(d);
}

/// MCP `run_python` / `run_shell` calls of `serve --mcp` (the official MCP Python SDK over
/// Streamable HTTP) are the daemon's runs too: one counted per audit record of kind `run`.
#[test]
fn mcp_tool_runs_are_counted() {
    use agentrun_e2e::mcp::{serve_http, McpEnv, SCENARIO_TIMEOUT, SDK};
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let key = "k-metrics";
    let metrics = format!("127.0.0.1:{}", free_port());
    let (d, url) = serve_http(&env, key, &["--metrics", metrics.as_str()]);
    // `basics` (run_python, run_shell, the file tools) over HTTP: MCP_URL is set.
    let mut cmd = env.command(SDK, "basics", &[]);
    cmd.env("MCP_URL", &url)
        .env("MCP_API_KEY", key)
        .env("AGENTRUN_STATE_DIR", d.state());
    let out = run_with_timeout(cmd, None, SCENARIO_TIMEOUT);
    assert!(
        out.status.code() == Some(0) && out.stdout().contains("OK basics"),
        "basics scenario failed\n{out}\n{}",
        d.log()
    );
    let runs = env
        .audit_records()
        .iter()
        .filter(|r| r["kind"] == "run")
        .count();
    assert!(runs >= 2, "{runs} run records");
    let scrape = get(&metrics, Some(key));
    assert_eq!(scrape.status, 200, "{}", scrape.body);
    let (s, _) = parse(&scrape.body);
    assert_eq!(
        total(&s, "agentrun_runs_total"),
        runs as f64,
        "{}",
        scrape.body
    );
    assert_eq!(
        value(&s, "agentrun_run_duration_seconds_count", &[]),
        runs as f64
    );
    agentrun_e2e::osb::stop_clean(d);
    env.assert_clean("serve --mcp --metrics");
}
