//! `agentrun top`, driven the way a person uses it: in a real terminal (tmux), keys sent with
//! `send-keys`, the screen read with `capture-pane`, against a real daemon.
//!
//! Contract under test (issue 19):
//! - no daemon: one line on stderr, `agentrun top: no daemon at SOCKET (start one with
//!   agentrun serve)`, exit 1, nothing on stdout;
//! - the screen shows each pool with its ready/target count, the running commands with their
//!   id, sandbox and command, and the audit log's refused decisions (sandbox, action, rule,
//!   resource), newest first;
//! - `p` cycles the pool filter (all, then each image:profile), `/` or `f` takes a profile
//!   filter (Enter applies it), `?` shows the keys, up/down
//!   select a command, `k` then `y` kills it (the `agentrun exec` client exits 137 and the run
//!   leaves the screen), `q` quits with the terminal restored (cooked mode, main screen);
//! - a daemon that stops answering leaves the last picture and a line saying so; SIGTERM
//!   ends `top` with exit 143, the terminal put back;
//! - `--once` prints one plain-text frame.
//!
//! Every test holds the exclusive e2e lock (a daemon: see tests/tests/pool.rs).

use std::process::Command;
use std::time::{Duration, Instant};

use agentrun_e2e::*;

/// How long a screen may take to show something (a refresh is 300 ms; a debug build on 2
/// shared cores).
const SHOW: Duration = Duration::from_secs(20);

/// A tmux server of its own (`-L`), one session running one command in a 160x48 window;
/// killed on drop.
struct Tmux {
    server: String,
}

impl Tmux {
    fn start(command: &str) -> Tmux {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let server = format!("agentrun-top-test-{}-{n}", std::process::id());
        let t = Tmux { server };
        let out = t.run(&[
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "48",
            "-s",
            "top",
            command,
        ]);
        assert!(out.status.success(), "tmux new-session: {out:?}");
        // The pane's command runs in sh; keep the window when it ends so its last screen can
        // be read.
        t.run(&["set-option", "-t", "top", "remain-on-exit", "on"]);
        t
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.server)
            .args(args)
            .output()
            .expect("run tmux (hack/test installs it)")
    }

    /// What the pane shows now.
    fn screen(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", "top"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Sends tmux key names (`q`, `Down`, `Enter`, ...).
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        let out = self.run(&args);
        assert!(out.status.success(), "tmux send-keys {keys:?}: {out:?}");
    }

    /// The pid of the pane's `agentrun top` (a child of the pane's shell).
    fn top_pid(&self) -> Option<i32> {
        let shell = self.var("pane_pid");
        let children =
            std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).ok()?;
        children.split_whitespace().find_map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (comm.trim() == "agentrun").then(|| pid.parse().ok())?
        })
    }

    /// A pane format variable (`#{alternate_on}`, ...).
    fn var(&self, name: &str) -> String {
        let out = self.run(&[
            "display-message",
            "-p",
            "-t",
            "top",
            &format!("#{{{name}}}"),
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Waits (at most `timeout`) for a screen that `pred` accepts; panics with the last one.
    fn wait_screen(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        let deadline = start + timeout;
        loop {
            let s = self.screen();
            if pred(&s) {
                eprintln!("screen showed {what} after {:?}", start.elapsed());
                return s;
            }
            if Instant::now() >= deadline {
                panic!(
                    "the screen never showed {what} within {:.0}s; last screen:\n{s}",
                    timeout.as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The screen's line containing every one of `parts`, if any.
fn line_with<'a>(screen: &'a str, parts: &[&str]) -> Option<&'a str> {
    screen.lines().find(|l| parts.iter().all(|p| l.contains(p)))
}

/// `sh -c` words for `agentrun top ARGS` with the daemon's state dir and audit dir, then a
/// line saying how it exited and whether the terminal is back in cooked mode with echo.
fn top_command(d: &Daemon, audit: &std::path::Path, args: &str) -> String {
    format!(
        "env AGENTRUN_STATE_DIR='{}' AGENTRUN_AUDIT_DIR='{}' '{}' top {args}; \
         echo \"top-exit=$? stty=$(stty -a | grep -o -- '-\\?icanon' | head -1)\
         $(stty -a | grep -o -- ' -\\?echo ' | head -1)\"; sleep 600",
        d.state().display(),
        audit.display(),
        agentrun_bin().display()
    )
}

/// Audit records (`agentrun audit --json`).
fn audit_records(dir: &std::path::Path) -> Vec<serde_json::Value> {
    agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", dir)
        .run()
        .success()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit --json line"))
        .collect()
}

#[test]
fn top_without_a_daemon_says_so_in_one_line_and_exits_1() {
    let Some(_lock) = setup() else { return };
    let d = Daemon::unstarted();
    let out = d.agentrun(["top"]).run();
    out.assert_code(1);
    assert_eq!(
        out.stderr(),
        format!(
            "agentrun top: no daemon at {} (start one with agentrun serve)\n",
            d.socket().display()
        ),
        "{out}"
    );
    assert_eq!(out.stdout(), "", "{out}");
}

#[test]
fn top_shows_pools_runs_and_denials_filters_and_kills_a_run() {
    let Some(_lock) = setup_exclusive() else {
        return;
    };
    let audit = tempdir();
    let mut d = Daemon::unstarted().with_env("AGENTRUN_AUDIT_DIR", audit.path());
    d.launch(["--pool", "host:default=2", "--pool", "host:strict=1"]);
    let full = wait_until(Duration::from_secs(60), || {
        let p = d.pool_status();
        p.iter().all(|p| p.ready == p.target).then_some(p)
    });
    assert!(full.is_some(), "pools never filled: {}", d.log());
    let t0 = Instant::now();

    // A run the egress proxy refuses a connection: a denial in the audit log.
    d.provoke_egress_denial("denied.example");
    let denial = audit_records(audit.path())
        .into_iter()
        .find(|r| r["decision"] == "deny" && r["resource"] == "denied.example:80")
        .expect("the denial in the audit log");
    let denied_in = denial["sandbox_id"].as_str().unwrap().to_string();
    eprintln!("denied run done after {:?}", t0.elapsed());

    // A long run to watch and kill.
    let mut sleeper = d.exec(["sleep", "30"]).spawn();
    let shell = wait_until(Duration::from_secs(20), || {
        d.ps().into_iter().find(|s| s.state == "running")
    })
    .unwrap_or_else(|| panic!("the sleep never ran: {}", d.log()));

    eprintln!("sleep running after {:?}", t0.elapsed());
    // --once: one plain frame with the same content.
    let once = d.agentrun(["top", "--once"]).run();
    let frame = once.success();
    assert!(
        line_with(&frame, &["host", "strict", "/1"]).is_some(),
        "{frame}"
    );
    assert!(
        line_with(&frame, &["denied.example:80", "net.connect"]).is_some(),
        "{frame}"
    );

    let tmux = Tmux::start(&top_command(&d, audit.path(), "--interval 300ms"));
    let screen = tmux.wait_screen("the pools, the sleep and the denial", SHOW, |s| {
        line_with(s, &["host", "default", "/2"]).is_some()
            && line_with(s, &["host", "strict", "1/1"]).is_some()
            && line_with(s, &["sleep 30", &shell.id]).is_some()
            && line_with(s, &["denied.example:80", "net.connect", "network.default"]).is_some()
    });
    assert_eq!(tmux.var("alternate_on"), "1", "{screen}");
    let denial_line = line_with(&screen, &["denied.example:80"]).unwrap();
    assert!(denial_line.contains(&denied_in), "{denial_line}\n{screen}");
    let run_line = line_with(&screen, &["sleep 30"]).unwrap().to_string();
    // Its sandbox's memory, and the profile it runs under.
    assert!(
        run_line.contains(" MiB") && run_line.contains("default"),
        "{run_line}\n{screen}"
    );
    eprintln!("{screen}");
    let run_id = run_line
        .split_whitespace()
        .find(|w| w.starts_with("run-"))
        .unwrap_or_else(|| panic!("no run id on the sleep's line: {run_line}"))
        .to_string();

    // The pool filter: host:default alone (the sleep stays), host:strict alone (the sleep
    // leaves: it runs in host:default), then all again.
    tmux.keys(&["p"]);
    tmux.wait_screen("only host:default", SHOW, |s| {
        s.contains("pool: host:default")
            && line_with(s, &["host", "strict", "1/1"]).is_none()
            && line_with(s, &["sleep 30"]).is_some()
    });
    tmux.keys(&["p"]);
    tmux.wait_screen("only host:strict", SHOW, |s| {
        s.contains("pool: host:strict")
            && line_with(s, &["host", "strict", "1/1"]).is_some()
            && line_with(s, &["host", "default", "/2"]).is_none()
            && line_with(s, &["sleep 30"]).is_none()
    });
    tmux.keys(&["p"]);
    tmux.wait_screen("every pool again", SHOW, |s| {
        s.contains("pool: all") && line_with(s, &["sleep 30"]).is_some()
    });

    // The profile filter: typed after `/`, applied on Enter; cleared the same way.
    tmux.keys(&["/", "s", "t", "r", "i", "c", "t"]);
    tmux.wait_screen("the filter prompt", SHOW, |s| {
        s.contains("profile filter") && s.contains("strict_")
    });
    tmux.keys(&["Enter"]);
    tmux.wait_screen("profile ~ strict", SHOW, |s| {
        s.contains("profile ~ \"strict\"")
            && line_with(s, &["host", "strict", "1/1"]).is_some()
            && line_with(s, &["host", "default", "/2"]).is_none()
            && line_with(s, &["sleep 30"]).is_none()
    });
    tmux.keys(&[
        "f", "BSpace", "BSpace", "BSpace", "BSpace", "BSpace", "BSpace", "Enter",
    ]);
    tmux.wait_screen("no profile filter", SHOW, |s| {
        s.contains("pool: all)") && line_with(s, &["sleep 30"]).is_some()
    });

    tmux.keys(&["?"]);
    tmux.wait_screen("the keys", SHOW, |s| s.contains("k kill selected"));

    // Select the sleep, ask to kill it, confirm.
    tmux.keys(&["Down"]);
    tmux.wait_screen("the sleep selected", SHOW, |s| {
        line_with(s, &["> ", "sleep 30"]).is_some()
    });
    tmux.keys(&["k"]);
    tmux.wait_screen("the kill prompt", SHOW, |s| {
        s.contains(&format!("kill {run_id} (sleep 30)? y to confirm"))
    });
    tmux.keys(&["y"]);
    let out = sleeper
        .wait_for(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the killed run's client still runs: {}", d.log()));
    out.assert_code(137);
    tmux.wait_screen("the run gone and the kill reported", SHOW, |s| {
        line_with(s, &["sleep 30"]).is_none() && s.contains(&format!("killed {run_id}"))
    });

    // The daemon goes away: the last picture stays, a line says so.
    let mut daemon = d.take_proc().expect("the daemon's process");
    daemon.stop();
    // Nothing of the killed run, or of the daemon, is left on the host.
    let mut left = Leftovers::default();
    let clean = wait_until(Duration::from_secs(15), || {
        left = Leftovers::snapshot_own(d.state()).new_since(d.before());
        left.is_empty().then_some(())
    });
    assert!(clean.is_some(), "left behind:\n{left}");
    tmux.wait_screen("the daemon gone", SHOW, |s| {
        s.contains(&format!(
            "no daemon at {} (start one with agentrun serve); retrying",
            d.socket().display()
        )) && line_with(s, &["host", "strict", "1/1"]).is_some()
    });

    // q: top exits 0 and the shell after it finds the terminal as it was.
    tmux.keys(&["q"]);
    let screen = tmux.wait_screen("top's exit", SHOW, |s| s.contains("top-exit="));
    assert!(
        screen.contains("top-exit=0 stty=icanon echo"),
        "exit code or terminal modes:\n{screen}"
    );
    assert_eq!(tmux.var("alternate_on"), "0", "{screen}");
}

#[test]
fn top_puts_the_terminal_back_on_sigterm() {
    let Some(_lock) = setup_exclusive() else {
        return;
    };
    let audit = tempdir();
    let mut d = Daemon::unstarted().with_env("AGENTRUN_AUDIT_DIR", audit.path());
    d.launch(["--pool-size", "1"]);
    let tmux = Tmux::start(&top_command(&d, audit.path(), ""));
    tmux.wait_screen("the pool", SHOW, |s| {
        line_with(s, &["host", "default", "/1"]).is_some()
    });
    assert_eq!(tmux.var("alternate_on"), "1");
    let pid = tmux.top_pid().expect("agentrun top's pid");
    // SAFETY: kill(2) on the pid of the process this test started in the pane.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let screen = tmux.wait_screen("top's exit", SHOW, |s| s.contains("top-exit="));
    assert!(
        screen.contains("top-exit=143 stty=icanon echo"),
        "exit code or terminal modes:\n{screen}"
    );
    assert_eq!(tmux.var("alternate_on"), "0", "{screen}");
}
