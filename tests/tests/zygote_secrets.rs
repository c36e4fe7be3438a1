//! The Python zygote never holds a run's data (issue 29), end to end.
//!
//! Every run a shell's zygote forks starts as a copy of the zygote's memory, and a pooled shell
//! serves one client after another: so nothing of a run may ever be in the zygote (nor in the
//! shell's init, which every cell is cloned from). Contract under test, on a pool of one shell
//! of the shipped `code-interpreter` profile (the shell and its zygote serve every run):
//! - runs A, forked by the zygote, carry secrets marked `zygsecret_<32 hex>` (random per test)
//!   in every way a run's data comes in: an environment variable, an argument, the `-c` code,
//!   stdin read by the code, a program read from stdin (`python3 -`), a script's file name and
//!   the working directory;
//! - a later run B, forked by the same zygote, scans its own memory (every readable region of
//!   `/proc/self/maps` that is writable or anonymous, through `/proc/self/mem`) and finds none,
//!   and cannot open its cell's PID 1's memory (`/proc/1/mem`: the PID 1 is non-dumpable);
//! - the test, as root on the host, scans the zygote's memory and the shell's init's the same
//!   way and finds none.
//!
//! The scanner looks for the pattern `zygsecret_` + 32 hex digits: its own code holds the
//! pattern, never a marker, so it finds only what a run left.
//!
//! Needs root and the host's `/usr/bin/python3`; holds the exclusive e2e lock (a daemon).

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::time::Duration;

use agentrun_e2e::*;

/// How long the pool's shell may take to be made and its zygote to import (debug build).
const READY: Duration = Duration::from_secs(120);

/// Prints `scanned BYTES` and `found MARKER` for every marker in the memory of process
/// `argv[1]` (default `self`): the readable regions that are writable or anonymous (a
/// read-only mapping of a file holds the file, not a run's data).
const SCANNER: &str = r#"
import re, sys
pid = sys.argv[1] if len(sys.argv) > 1 else "self"
pat = re.compile(rb"zygsecret_[0-9a-f]{32}")
with open("/proc/%s/maps" % pid) as f:
    maps = f.read().splitlines()
found, scanned = set(), 0
CHUNK = 16 << 20
with open("/proc/%s/mem" % pid, "rb", 0) as mem:
    for line in maps:
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        perms, path = f[1], (f[5] if len(f) > 5 else "")
        if perms[0] != "r" or path in ("[vvar]", "[vvar_vclock]", "[vsyscall]"):
            continue
        if perms[1] != "w" and path and not path.startswith("["):
            continue
        at = lo
        while at < hi:
            n = min(CHUNK + 64, hi - at)
            try:
                mem.seek(at)
                data = mem.read(n)
            except (OSError, ValueError, OverflowError):
                break
            scanned += len(data)
            for m in pat.finditer(data):
                if m.group().decode() not in found and pid != "self":
                    print("where", line, repr(data[max(0, m.start() - 160):m.end() + 40]))
                found.add(m.group().decode())
            at += CHUNK
print("scanned", scanned)
for m in sorted(found):
    print("found", m)
"#;

/// Prints `/proc/1/mem ERRNO` (or `opened`): whether the run can open its cell's PID 1's memory.
const PID1: &str = r#"
try:
    open("/proc/1/mem", "rb").close()
    print("/proc/1/mem opened")
except OSError as e:
    print("/proc/1/mem", e.errno)
"#;

fn marker() -> String {
    let mut b = [0u8; 16];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("read /dev/urandom");
    format!("zygsecret_{}", agentrun_e2e::otlp::hex(&b))
}

/// What the scanner found, or why its output is no scan.
fn scan_result(what: &str, out: &RunOutput) -> BTreeSet<String> {
    let stdout = out.stdout();
    let scanned: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("scanned "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{what}: the scanner did not run\n{out}"));
    assert!(
        scanned > 1 << 18,
        "{what}: scanned only {scanned} bytes\n{out}"
    );
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("found "))
        .map(str::to_string)
        .collect()
}

struct Setup {
    d: Daemon,
    ws: tempfile::TempDir,
}

impl Setup {
    /// Runs `cmd` on the pool's shell; asserts the zygote forked it (its parent, the zygote,
    /// is outside the cell's pid namespace: `os.getppid()` is 0, where an exec'd python3's
    /// parent is the cell's PID 1) through the first line of its output, `ppid N`.
    fn run(&self, opts: &[String], cmd: &[String], stdin: Option<&str>) -> RunOutput {
        let mut all = vec![
            "--profile".to_string(),
            "code-interpreter".into(),
            "--workspace".into(),
            self.ws.path().display().to_string(),
        ];
        all.extend(opts.iter().cloned());
        let a = self.d.exec_with(all, cmd).timeout(Duration::from_secs(120));
        match stdin {
            Some(s) => a.stdin(s.as_bytes().to_vec()).run(),
            None => a.run(),
        }
    }

    fn forked(&self, what: &str, out: &RunOutput) {
        let stdout = out.success();
        assert!(
            stdout.starts_with("ppid 0\n"),
            "{what}: not forked by the zygote (or failed)\n{out}\n{}",
            self.d.log()
        );
    }

    /// The pool's zygote's host pid (`pool status --json`), once its shell is back in the
    /// pool (a shell out serving a run, or being judged after one, shows none).
    fn zygote_pid(&self) -> i32 {
        let pid = wait_until(Duration::from_secs(30), || {
            let st = self.d.pool_status_json();
            st["pools"]
                .as_array()?
                .iter()
                .find_map(|p| p["zygote"]["pid"].as_i64())
        });
        pid.unwrap_or_else(|| {
            panic!(
                "no zygote pid in pool status within 30 s: {}",
                self.d.pool_status_json()
            )
        }) as i32
    }
}

/// A process's command line, pids and parent, for failure messages.
fn describe(pid: i32) -> String {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline: String = String::from_utf8_lossy(&cmdline)
        .replace('\0', " ")
        .chars()
        .take(80)
        .collect();
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or("?")
            .trim()
            .to_string()
    };
    format!(
        "`{cmdline}`, NSpid {}, parent {}",
        field("NSpid:"),
        field("PPid:")
    )
}

fn ppid_field(pid: i32) -> i32 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[test]
fn the_zygote_never_holds_a_runs_data() {
    let Some(_l) = setup_exclusive() else { return };
    let ws = tempdir();
    let mut d = Daemon::unstarted();
    d.launch(["--pool", "host:code-interpreter=1"]);
    let s = Setup { d, ws };
    let ppid = "import os; print('ppid', os.getppid())".to_string();

    // The zygote of the pool's one shell imports in the background: wait until it forks.
    let ready = wait_until(READY, || {
        let out = s.run(&[], &["python3".into(), "-c".into(), ppid.clone()], None);
        (out.stdout() == "ppid 0\n").then_some(())
    });
    assert!(
        ready.is_some(),
        "no run was forked by the zygote within {READY:?}\n{}",
        s.d.log()
    );
    let zygote = s.zygote_pid();

    // Runs A: a secret in each way a run's data comes in.
    let m: Vec<String> = (0..8).map(|_| marker()).collect();
    let (env, arg, code, stdin, program, file, cwd, out) =
        (&m[0], &m[1], &m[2], &m[3], &m[4], &m[5], &m[6], &m[7]);
    fs::write(s.ws.path().join(format!("{file}.py")), format!("{ppid}\n")).unwrap();
    fs::create_dir(s.ws.path().join(cwd)).unwrap();
    let a = s.run(
        &["-e".into(), format!("OPENAI_API_KEY={env}")],
        &[
            "python3".into(),
            "-c".into(),
            format!(
                "{ppid}\nimport os, sys\nk = '{code}'\nassert os.environ['OPENAI_API_KEY'] \
                 and sys.argv[1]\nprint(sys.argv[1][::-1])"
            ),
            arg.clone(),
        ],
        None,
    );
    s.forked("A: env, argv, code", &a);
    assert!(
        a.stdout().contains(&arg.chars().rev().collect::<String>()),
        "{a}"
    );
    let a = s.run(
        &[],
        &[
            "python3".into(),
            "-c".into(),
            format!("{ppid}\nimport sys\nprint(len(sys.stdin.read()))"),
        ],
        Some(stdin),
    );
    s.forked("A: stdin", &a);
    let a = s.run(
        &[],
        &["python3".into(), "-".into()],
        Some(&format!("{ppid}\np = '{program}'\n")),
    );
    s.forked("A: a program on stdin", &a);
    let a = s.run(
        &["--cwd".into(), format!("/workspace/{cwd}")],
        &["python3".into(), format!("/workspace/{file}.py")],
        None,
    );
    s.forked("A: a script's name, the working directory", &a);
    // The run's output too (it goes to the client's pipe, never through the zygote).
    let a = s.run(
        &[],
        &[
            "python3".into(),
            "-c".into(),
            format!("{ppid}\nprint(bytes.fromhex('{}').decode())", {
                out.bytes().map(|b| format!("{b:02x}")).collect::<String>()
            }),
        ],
        None,
    );
    s.forked("A: output", &a);
    assert!(a.stdout().contains(out.as_str()), "{a}");

    let secrets: BTreeSet<&String> = m.iter().collect();
    let mut failures = Vec::new();

    // (a) A later run on the same shell, forked by the same zygote, scans its own memory.
    let b = s.run(
        &[],
        &[
            "python3".into(),
            "-c".into(),
            format!("{ppid}\n{PID1}\n{SCANNER}"),
        ],
        None,
    );
    s.forked("B: the scan", &b);
    // The cell's PID 1 (a clone of the init, holding this run's request) is out of its reach.
    assert!(
        b.stdout()
            .contains(&format!("/proc/1/mem {}\n", libc::EACCES)),
        "the run could open its cell's PID 1's memory\n{b}"
    );
    let found = scan_result("B's scan of itself", &b);
    let leaked: Vec<&String> = found.iter().filter(|f| secrets.contains(f)).collect();
    if !leaked.is_empty() {
        failures.push(format!(
            "run B found runs A's secrets in its own memory: {leaked:?}"
        ));
    }
    assert_eq!(
        s.zygote_pid(),
        zygote,
        "the runs were not all forked by one zygote (the premise)\n{}",
        s.d.log()
    );

    // (b) The host scans the zygote's memory, and (c) the shell's init's (its parent).
    for (what, pid) in [
        ("the zygote", zygote),
        ("the shell's init", ppid_field(zygote)),
    ] {
        let scan = host("/usr/bin/python3", ["-c", SCANNER, &pid.to_string()]);
        assert_eq!(scan.code(), 0, "scanning {what} (pid {pid}):\n{scan}");
        let found = scan_result(what, &scan);
        let leaked: Vec<&String> = found.iter().filter(|f| secrets.contains(f)).collect();
        if !leaked.is_empty() {
            failures.push(format!(
                "{what}'s memory (host pid {pid}: {}) holds runs A's secrets: {leaked:?}\n{}",
                describe(pid),
                scan.stdout()
            ));
        }
    }
    let named = |v: &String| {
        let kind = [
            "env",
            "argv",
            "code",
            "stdin",
            "stdin program",
            "file name",
            "cwd",
            "output",
        ];
        format!("{v} = {}", kind[m.iter().position(|x| x == v).unwrap()])
    };
    assert!(
        failures.is_empty(),
        "{}\nsecrets: {:?}",
        failures.join("\n"),
        m.iter().map(named).collect::<Vec<_>>()
    );
}
