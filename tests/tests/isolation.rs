//! The run-to-run isolation corpus (issue 29): nothing of one run is visible to the next, on
//! every path a run or a sandbox takes. Run as root, through the real binary and the real
//! clients (the official OpenSandbox, E2B and MCP SDKs, docker-py).
//!
//! Each case is an A/B pair. Run (or sandbox) A is given marked secrets, a fresh random marker
//! `AGENTRUN-ISO-<20 hex><4 hex of their SHA-256>` per case: in its environment, argv, stdin,
//! a file it reads (a workspace file or an upload), the code it runs; it plants the marker in
//! files it writes (`/tmp`, `/var/tmp`, `/dev/shm`, its working directory, `$HOME`,
//! `/workspace`, `/`, `/etc`, `/root`: wherever its profile lets it), its memory, SysV
//! shm/msg/sem, POSIX shm and mqueue, a kernel keyring key, and a background process that
//! holds abstract and path unix sockets, TCP/UDP listeners and a memfd with the marker and
//! answers every connection with it (tests/isolation/scan.py, role `plant`). Then B, later,
//! on the same shell (a pool of one, forced: the daemon's cap leaves no room for another
//! shell, and the test checks through `ps` / `pool status` that no other shell was made and
//! that B's shell is A's), runs the same program as a scanner: it plants its own marker
//! first (the positive control), then reads its own memory, every process it can see
//! (`/proc/*/{cmdline,environ,maps,mem,fd,...}`, its init's included), every file on a
//! writable mount, `/dev/shm`, `/dev/mqueue`, SysV IPC (`shmat`, `msgrcv`), abstract and
//! path sockets and loopback listeners (connecting to each), keyrings (`/proc/keys`,
//! `keyctl read`), its environment, argv, stdin and cgroup files, and prints a JSON verdict.
//!
//! A case passes when B saw no marker of anyone else (A's, a fragment of A's, or any
//! well-formed marker not B's own), no SysV/mqueue/POSIX-shm object it did not make, AND
//! found its own marker in every channel it planted it in: a scanner that silently reads
//! nothing fails. Timing side channels are out of scope. Every failing pair of a test is
//! reported, not only the first.
//!
//! Paths: cold `exec` (two cold runs); warm `exec` through a daemon on every shipped profile
//! (`default`, `strict`, `code-interpreter` with its Python zygote forking `python3 -c`,
//! `container`, `build`); the OpenSandbox API (commands, a bash session and a code context in
//! sandbox A, deleted; the same in sandbox B on A's shell), with the default profile and with
//! `code-interpreter` (code contexts forked from the zygote); the E2B API (the official `e2b`
//! SDKs: `commands.run` with the sandbox's and the command's env, a background command fed by
//! `send_stdin`, `run_code` in the default context and in a context of its own; B may not
//! run in A's context), with both profiles too; Docker containers and `exec`
//! (docker-py); MCP `run_python`/`run_shell` in sessions (`serve --mcp`, both profiles) and
//! one-shot (`agentrun mcp --one-shot`, as root and as a fresh ordinary user: rootless).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentrun_e2e::users;
use agentrun_e2e::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The probe: planter (A) and scanner (B), one program.
const PROBE: &str = include_str!("../isolation/scan.py");
/// Deadline of one probe run (debug build, 2 shared cores, a zygote with numpy to scan).
const RUN: Duration = Duration::from_secs(120);
const FILL: Duration = Duration::from_secs(90);
/// Every shipped (built-in) profile.
const PROFILES: [&str; 5] = [
    "default",
    "strict",
    "code-interpreter",
    "container",
    "build",
];

// ---------------------------------------------------------------------------------------------
// Markers, probes, verdicts

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A fresh marker: `AGENTRUN-ISO-`, 20 random hex digits, 4 hex digits of their SHA-256 (so
/// that a marker seen in memory is told apart from a fragment of one).
fn marker() -> String {
    let mut b = [0u8; 10];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("read /dev/urandom");
    let r = hex(&b);
    format!(
        "AGENTRUN-ISO-{r}{}",
        hex(&Sha256::digest(r.as_bytes())[..2])
    )
}

fn well_formed(m: &str) -> bool {
    let h = m.trim_start_matches("AGENTRUN-ISO-");
    h.len() == 24 && hex(&Sha256::digest(&h.as_bytes()[..20])[..2]) == h[20..]
}

/// The probe's code for `role` with `mark`; `carriers` says where the caller put the marker
/// besides the code (`env`, `argv`, `stdin`), `extra` adds to its configuration (`read`:
/// files A must find it in, `linger`: seconds to stay after the report, `since`).
///
/// A's code carries its marker in strings of several sizes besides (`copies`): what survives
/// in a heap can depend on a string's size class, and no attacker needs to know which.
fn probe(role: &str, mark: &str, carriers: &[&str], extra: Value) -> String {
    let mut cfg = json!({"role": role, "mark": mark, "carriers": carriers, "since": since()});
    if role == "plant" {
        cfg["copies"] = json!(copies(mark));
    }
    if let (Some(c), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    let text = serde_json::to_string(&cfg.to_string()).unwrap();
    format!("ISO = __import__(\"json\").loads({text})\n{PROBE}")
}

/// The marker repeated to several lengths (37 bytes to ~800).
fn copies(mark: &str) -> Vec<String> {
    [2, 3, 5, 8, 13, 21]
        .iter()
        .map(|k| mark.repeat(*k))
        .collect()
}

/// Files of an image older than this are the image's (the scanner does not read them): now
/// (the probes of a case are made before its run A), less a margin.
fn since() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        - 5.0
}

/// The JSON after `key` on a line of `out` (the probe prints `ISO-PLANTED {..}` /
/// `ISO-VERDICT {..}`).
fn report(out: &str, key: &str) -> Option<Value> {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|j| serde_json::from_str(j.trim()).ok())
}

/// One A/B case: who planted which marker, what each side reported.
#[derive(Default)]
struct Case {
    name: String,
    /// marker -> what A did with it
    a: BTreeMap<String, String>,
    /// B's own markers
    b: Vec<String>,
    /// (label, plant report)
    planted: Vec<(String, Value)>,
    /// (label, verdict)
    verdicts: Vec<(String, Value)>,
    /// What the harness found wrong (B not on A's shell, a run that failed, ...)
    problems: Vec<String>,
}

impl Case {
    fn new(name: &str) -> Case {
        Case {
            name: name.into(),
            ..Case::default()
        }
    }

    fn a_mark(&mut self, what: &str) -> String {
        let m = marker();
        self.a.insert(m.clone(), what.into());
        m
    }

    fn b_mark(&mut self) -> String {
        let m = marker();
        self.b.push(m.clone());
        m
    }

    /// A run's output: its plant report or verdict, or a problem saying why there is none.
    fn take(&mut self, label: &str, out: &RunOutput, key: &str) {
        match report(&out.stdout(), key) {
            Some(v) if out.status.code() == Some(0) => self.push(label, v),
            _ => self
                .problems
                .push(format!("{label}: the probe did not report\n{out}")),
        }
    }

    fn push(&mut self, label: &str, v: Value) {
        if label.starts_with("a.") || v.get("ok").is_some() {
            self.planted.push((label.into(), v));
        } else {
            self.verdicts.push((label.into(), v));
        }
    }

    /// `RESULT <label> <json>` lines of a client scenario.
    fn take_results(&mut self, stdout: &str) {
        for line in stdout.lines() {
            let Some(rest) = line.strip_prefix("RESULT ") else {
                continue;
            };
            let (label, j) = rest.split_once(' ').unwrap_or((rest, ""));
            match serde_json::from_str(j) {
                Ok(v) => self.push(label, v),
                Err(e) => self
                    .problems
                    .push(format!("{label}: bad RESULT ({e}): {j}")),
            }
        }
    }

    /// A marker B saw that is not B's: A's (whole or a fragment), an earlier case's (`all`:
    /// every case's A markers, by case) or any other run's.
    fn whose(&self, m: &str, all: &BTreeMap<String, String>) -> Option<String> {
        if let Some(what) = self.a.get(m) {
            return Some(format!("A's marker ({what})"));
        }
        if self.b.iter().any(|b| b == m) {
            return None;
        }
        if let Some(what) = all.get(m) {
            return Some(format!("the marker of another case's run A ({what})"));
        }
        if well_formed(m) {
            return Some("the marker of another run (not this test's)".into());
        }
        let h = m.trim_start_matches("AGENTRUN-ISO-");
        for (a, what) in &self.a {
            let ah = &a.trim_start_matches("AGENTRUN-ISO-")[..20];
            if (0..=h.len().saturating_sub(12)).any(|i| ah.contains(&h[i..i + 12])) {
                return Some(format!("a fragment of A's marker {a} ({what})"));
            }
        }
        None // a garbled copy of B's own (memory holds those)
    }

    /// Everything wrong with this case, one entry each.
    fn judge(&self, all: &BTreeMap<String, String>) -> Vec<String> {
        let mut out: Vec<String> = self
            .problems
            .iter()
            .map(|p| format!("[{}] {p}", self.name))
            .collect();
        let say = |out: &mut Vec<String>, s: String| out.push(format!("[{}] {s}", self.name));
        if self.planted.is_empty() || self.verdicts.is_empty() {
            say(
                &mut out,
                format!(
                    "incomplete: {} plant reports, {} verdicts",
                    self.planted.len(),
                    self.verdicts.len()
                ),
            );
        }
        for (label, p) in &self.planted {
            for need in ["memory", "file:/tmp", "sysv_shm", "background"] {
                if p["ok"].get(need).is_none() {
                    say(
                        &mut out,
                        format!(
                            "{label}: A could not plant {need}: {}",
                            p["failed"].get(need).unwrap_or(&Value::Null)
                        ),
                    );
                }
            }
        }
        for (label, v) in &self.verdicts {
            if let Some(crashed) = v.get("crashed") {
                say(
                    &mut out,
                    format!("{label}: scanner channels broke: {crashed}"),
                );
            }
            let missing = &v["missing"];
            if missing.as_object().is_some_and(|m| !m.is_empty()) {
                say(
                    &mut out,
                    format!(
                        "{label}: POSITIVE CONTROL: B did not find its own marker in {missing} \
                         (planted: {})",
                        v["expect"]
                    ),
                );
            }
            for need in ["self_mem", "procs", "proc_mem", "files", "sysv"] {
                if v["expect"].get(need).is_none() {
                    say(
                        &mut out,
                        format!(
                            "{label}: B could not plant its control for {need}: {}",
                            v["unplantable"]
                        ),
                    );
                }
            }
            let Some(channels) = v["channels"].as_object() else {
                say(&mut out, format!("{label}: no channels in the verdict"));
                continue;
            };
            for (ch, c) in channels {
                for (m, places) in c["seen"].as_object().into_iter().flatten() {
                    if let Some(whose) = self.whose(m, all) {
                        say(
                            &mut out,
                            format!("{label}: LEAK in {ch}: {whose} {m}, seen at {places}"),
                        );
                    }
                }
                for s in c["strangers"].as_array().into_iter().flatten() {
                    let s = s.as_str().unwrap_or_default();
                    if !self.b.iter().any(|b| s.contains(b.as_str())) {
                        say(
                            &mut out,
                            format!(
                                "{label}: LEAK in {ch}: an object B did not make: {s}{}",
                                self.sem_key_owner(s)
                            ),
                        );
                    }
                }
            }
        }
        out
    }

    /// A SysV object whose key is the one A's probe derives from its marker.
    fn sem_key_owner(&self, s: &str) -> String {
        let key = s
            .split_whitespace()
            .skip_while(|w| *w != "key")
            .nth(1)
            .and_then(|k| k.parse::<i64>().ok());
        for (m, what) in &self.a {
            let derived = i64::from_str_radix(&m[m.len() - 6..], 16).unwrap() + 1;
            if key == Some(derived) {
                return format!(" (A's: {what})");
            }
        }
        String::new()
    }

    /// One line per verdict: what B read and how long it took; and, for information (not a
    /// verdict: issue 29 leaves the choice to the zygote's design), whether B shares A's hash
    /// secret or address-space layout.
    fn summary(&self) -> String {
        let mut s = String::new();
        for (label, v) in &self.verdicts {
            for (a_label, a) in &self.planted {
                let shared: Vec<&str> = ["hash", "libc", "heap"]
                    .into_iter()
                    .filter(|k| !v["layout"][k].is_null() && v["layout"][k] == a["layout"][k])
                    .collect();
                if !shared.is_empty() {
                    s.push_str(&format!(
                        "  {} {label}: shares {shared:?} with {a_label}\n",
                        self.name
                    ));
                }
            }
            let checked: u64 = v["channels"]
                .as_object()
                .map(|c| c.values().filter_map(|x| x["checked"].as_u64()).sum())
                .unwrap_or(0);
            s.push_str(&format!(
                "  {} {label}: {checked} items read in {}s, ppid {}, unplantable {}\n",
                self.name,
                v["seconds"],
                v["ppid"],
                v["unplantable"]
                    .as_object()
                    .map(|o| o.keys().cloned().collect::<Vec<_>>().join(","))
                    .unwrap_or_default()
            ));
        }
        s
    }
}

/// Judges every case; panics listing every problem of every case.
fn verdict(cases: &[Case]) {
    let marks: BTreeMap<String, String> = cases
        .iter()
        .flat_map(|c| {
            c.a.iter()
                .map(|(m, w)| (m.clone(), format!("{}: {w}", c.name)))
        })
        .collect();
    let mut all = Vec::new();
    for c in cases {
        eprint!("{}", c.summary());
        all.extend(c.judge(&marks));
    }
    assert!(
        all.is_empty(),
        "{} problem(s):\n{}",
        all.len(),
        all.join("\n")
    );
}

/// A world-accessible directory holding `iso-read.txt` = `mark` (A's workspace).
fn workspace_with(mark: Option<&str>) -> tempfile::TempDir {
    let ws = tempdir();
    fs::set_permissions(ws.path(), fs::Permissions::from_mode(0o777)).unwrap();
    if let Some(m) = mark {
        let f = ws.path().join("iso-read.txt");
        fs::write(&f, format!("{m}\n")).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
    }
    ws
}

// ---------------------------------------------------------------------------------------------
// exec: cold and warm

/// The variable a profile lets `-e` pass (strict allows only a few names).
fn env_name(profile: &str) -> &'static str {
    if profile == "strict" {
        "TZ"
    } else {
        "ISO_SECRET"
    }
}

/// Runs A then B as `agentrun exec` (`client` makes the command: cold or through a daemon);
/// `between` runs after A (the shell checks).
fn exec_pair(
    case: &mut Case,
    profile: &str,
    client: &dyn Fn(Vec<String>) -> Agentrun,
    between: &mut dyn FnMut(&mut Case),
) {
    let ma = case.a_mark(&format!(
        "exec --profile {profile}: env, argv, stdin, code, workspace file"
    ));
    let ws = workspace_with(Some(&ma));
    let code = probe(
        "plant",
        &ma,
        &["env", "argv", "stdin"],
        json!({"read": ["/workspace/iso-read.txt"]}),
    );
    let var = env_name(profile);
    let mut args: Vec<String> = vec!["exec".into(), "--profile".into(), profile.into()];
    args.extend(["--workspace".into(), ws.path().display().to_string()]);
    args.extend(["-e".into(), format!("{var}={ma}")]);
    if var != "TZ" {
        for (i, c) in copies(&ma).into_iter().enumerate() {
            args.extend(["-e".into(), format!("{var}_{i}={c}")]);
        }
    }
    args.extend(["--", "python3", "-c"].map(String::from));
    args.extend([code, ma.clone()]);
    args.extend(copies(&ma));
    let out = client(args).stdin(format!("{ma}\n")).timeout(RUN).run();
    case.take("a.exec", &out, "ISO-PLANTED ");
    between(case);
    let mb = case.b_mark();
    let wsb = workspace_with(None);
    let code = probe("scan", &mb, &["env", "argv", "stdin"], json!({}));
    let mut args: Vec<String> = vec!["exec".into(), "--profile".into(), profile.into()];
    args.extend(["--workspace".into(), wsb.path().display().to_string()]);
    args.extend(["-e".into(), format!("{var}={mb}")]);
    args.extend(["--", "python3", "-c"].map(String::from));
    args.extend([code, mb.clone()]);
    let out = client(args).stdin(format!("{mb}\n")).timeout(RUN).run();
    case.take("b.exec", &out, "ISO-VERDICT ");
}

#[test]
fn cold_exec_runs_see_nothing_of_each_other() {
    let Some(_l) = setup() else { return };
    let mut case = Case::new("cold exec");
    let client = |args: Vec<String>| agentrun(args).env("AGENTRUN_NO_DAEMON", "1");
    exec_pair(&mut case, "default", &client, &mut |_| {});
    verdict(&[case]);
}

/// The ids of the ready shells of `profile`, once no shell of it is running.
fn idle_shells(d: &Daemon, profile: &str) -> Vec<String> {
    let mut last = Vec::new();
    wait_until(FILL, || {
        last = d.ps();
        let mine: Vec<&PsEntry> = last.iter().filter(|e| e.profile == profile).collect();
        (!mine.is_empty() && mine.iter().all(|e| e.state == "ready"))
            .then(|| mine.iter().map(|e| e.id.clone()).collect())
    })
    .unwrap_or_else(|| panic!("no idle shell of {profile}: {last:#?}\n{}", d.log()))
}

/// `pool status --json`'s shells made so far and discards by reason.
fn made_and_discarded(d: &Daemon) -> (u64, Value) {
    let s = d.pool_status_json();
    (s["created"].as_u64().unwrap_or(0), s["discarded"].clone())
}

/// Checks that a pair ran on `shells` (the one idle shell of its pool before A): it is still
/// the only one, none was made or discarded meanwhile.
fn same_shell(case: &mut Case, d: &Daemon, profile: &str, shells: &[String], made: &(u64, Value)) {
    let now = idle_shells(d, profile);
    let after = made_and_discarded(d);
    if now != shells || after != *made {
        case.problems.push(format!(
            "B did not provably run on A's shell: shells of {profile} {shells:?} -> {now:?}, \
             (created, discarded) {made:?} -> {after:?}"
        ));
    }
}

/// Waits until the zygote of `profile`'s pool has imported its preload list (runs are forked
/// only then).
fn wait_zygote(d: &Daemon, profile: &str) {
    let ready = wait_until(FILL, || {
        let s = d.pool_status_json();
        s["pools"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["profile"] == profile && p["zygote"]["ready"] == true)
            .then_some(())
    });
    assert!(
        ready.is_some(),
        "the zygote of {profile} never got ready: {}\n{}",
        d.pool_status_json(),
        d.log()
    );
}

#[test]
fn warm_exec_runs_on_one_shell_see_nothing_of_each_other_on_every_shipped_profile() {
    let Some(_l) = setup() else { return };
    let mut d = Daemon::unstarted();
    let mut args: Vec<String> = Vec::new();
    for p in PROFILES {
        args.extend(["--pool".into(), format!("host:{p}=1")]);
    }
    // No room for a second shell of any pool: B can only run on A's.
    args.extend(["--max-sandboxes".into(), PROFILES.len().to_string()]);
    d.launch(args);
    wait_zygote(&d, "code-interpreter");
    let mut cases = Vec::new();
    for profile in PROFILES {
        let mut case = Case::new(&format!("warm exec {profile}"));
        let shells = idle_shells(&d, profile);
        let made = made_and_discarded(&d);
        let client = |args: Vec<String>| d.agentrun(args);
        exec_pair(&mut case, profile, &client, &mut |case| {
            let back = idle_shells(&d, profile);
            if back != shells {
                case.problems.push(format!(
                    "A's shell {shells:?} did not come back for B: {back:?}, {:?}",
                    made_and_discarded(&d)
                ));
            }
        });
        same_shell(&mut case, &d, profile, &shells, &made);
        if profile == "code-interpreter" {
            // The zygote path: both runs forked by the shell's zygote (their parent is
            // outside their pid namespace).
            for (label, v) in case.planted.iter().chain(case.verdicts.iter()) {
                if v["ppid"] != 0 {
                    case.problems.push(format!(
                        "{label}: not forked by the zygote (ppid {})",
                        v["ppid"]
                    ));
                }
            }
        }
        cases.push(case);
    }
    verdict(&cases);
}

// ---------------------------------------------------------------------------------------------
// The APIs: OpenSandbox, Docker, MCP

/// A daemon serving the OpenSandbox API (with an explicit API key), the E2B API, MCP over
/// HTTP and, given a store, the Docker API.
struct Apis {
    d: Daemon,
    domain: String,
    key: String,
    mcp_url: String,
    /// host:port of the E2B listener (`--e2b`)
    e2b: String,
    docker_socket: Option<std::path::PathBuf>,
    dir: tempfile::TempDir,
}

fn start_apis(profile: &str, docker: bool) -> Apis {
    start_apis_with(profile, docker, 0)
}

/// [`start_apis`] with room for `more` sandboxes besides the pools' shells (a sandbox made
/// from a snapshot runs in a shell of its own image).
fn start_apis_with(profile: &str, docker: bool, more: usize) -> Apis {
    let dir = tempdir();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mut d = Daemon::unstarted();
    let key = marker().replace("AGENTRUN-ISO-", "key-");
    let domain = format!("127.0.0.1:{}", osb::free_port());
    let mcp = format!("127.0.0.1:{}", osb::free_port());
    let e2b = format!("127.0.0.1:{}", osb::free_port());
    let mut args: Vec<String> = vec![
        "--listen".into(),
        domain.clone(),
        "--e2b".into(),
        e2b.clone(),
        "--api-key".into(),
        key.clone(),
        "--mcp".into(),
        mcp.clone(),
        "--mcp-profile".into(),
        profile.into(),
        "--opensandbox-profile".into(),
        profile.into(),
        "--pool".into(),
        format!("host:{profile}=1"),
    ];
    let mut docker_socket = None;
    if docker {
        let root = dir.path().join("root");
        python_image(&dir.path().join("py-rootfs"), &root);
        d.set_env("AGENTRUN_ROOT", &root);
        let socket = d.state().join("docker.sock");
        args.extend([
            "--docker-socket".into(),
            socket.display().to_string(),
            "--pool".into(),
            "isopy:container=1".into(),
        ]);
        docker_socket = Some(socket);
    }
    let pools = if docker { 2 } else { 1 } + more;
    args.extend(["--max-sandboxes".into(), pools.to_string()]);
    d.launch(args);
    Apis {
        d,
        domain,
        key,
        mcp_url: format!("http://{mcp}/mcp"),
        e2b,
        docker_socket,
        dir,
    }
}

/// `isopy`: the host's python3 and its standard library (less its tests, tkinter and the
/// static libpython), in `root`'s store, for Docker containers.
fn python_image(rootfs: &Path, root: &Path) {
    let script = r#"
set -euo pipefail
r=$1
mkdir -p "$r/usr/bin" "$r/usr/lib" "$r/etc" "$r/tmp" "$r/var/tmp" "$r/workspace" "$r/root"
chmod 1777 "$r/tmp" "$r/var/tmp"
ln -s usr/bin "$r/bin"; ln -s usr/lib "$r/lib"; mkdir -p "$r/usr/lib64"; ln -s usr/lib64 "$r/lib64"
py=$(readlink -f /usr/bin/python3)
cp -a "$py" "$r/usr/bin/"; ln -s "$(basename "$py")" "$r/usr/bin/python3"
lib=/usr/lib/$(basename "$py")
tar -C /usr/lib --exclude='*/test' --exclude='*/tkinter' --exclude='*/idlelib' \
    --exclude='*/config-*' --exclude='*/ensurepip' -cf - "$(basename "$lib")" | tar -C "$r/usr/lib" -xf -
cp -a /etc/ld.so.cache "$r/etc/"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
printf 'root:x:0:\n' >"$r/etc/group"
for f in "$py" "$lib"/lib-dynload/*.so; do ldd "$f"; done |
    awk '/=> \//{ print $3 } /^\t\/.*ld-linux/{ print $1 }' | sort -u |
    while read -r l; do
        real=$(readlink -f "$l")
        for p in "$l" "$real"; do
            p=${p#/usr}
            mkdir -p "$r/usr$(dirname "$p")"
            cp -an "/usr$p" "$r/usr$p" 2>/dev/null || cp -an "$p" "$r/usr$p"
        done
    done
"#;
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(script).arg("bash").arg(rootfs);
    run_with_timeout(cmd, None, Duration::from_secs(120)).success();
    agentrun([
        "image".as_ref(),
        "add".as_ref(),
        "isopy".as_ref(),
        rootfs.as_os_str(),
        "--cmd".as_ref(),
        "python3".as_ref(),
    ])
    .root(root)
    .run()
    .success();
}

impl Apis {
    /// The manifest file a client scenario reads.
    fn manifest(&self, name: &str, m: &Value) -> std::path::PathBuf {
        let p = self.dir.path().join(format!("{name}.json"));
        fs::write(&p, m.to_string()).unwrap();
        p
    }

    /// `tests/opensandbox/sdk_e2e.py isolation:NAME` (OpenSandbox SDK, docker-py).
    fn sdk(&self, case: &mut Case, name: &str, m: &Value) {
        let manifest = self.manifest(name, m);
        let mut cmd = Command::new(osb::python());
        cmd.arg(workspace_root().join("tests/opensandbox/sdk_e2e.py"))
            .arg(format!("isolation:{name}"))
            .env("OSB_DOMAIN", &self.domain)
            .env("OSB_API_KEY", &self.key)
            .env("OSB_AGENTRUN", agentrun_bin())
            .env("AGENTRUN_STATE_DIR", self.d.state())
            .env("OPENSANDBOX_DISABLE_METRICS", "1")
            .env("ISO_MANIFEST", manifest)
            .env_remove("OPEN_SANDBOX_API_KEY")
            .env_remove("OPEN_SANDBOX_DOMAIN");
        if let Some(s) = &self.docker_socket {
            cmd.env("DOCKER_HOST", format!("unix://{}", s.display()));
        }
        self.client(case, name, cmd);
    }

    /// `tests/isolation/mcp_pairs.py session` against `serve --mcp`.
    fn mcp_session(&self, case: &mut Case, m: &Value) {
        let manifest = self.manifest("mcp", m);
        let mut cmd = mcp_client("session", &manifest, self.d.state());
        cmd.env("MCP_URL", &self.mcp_url)
            .env("MCP_API_KEY", &self.key);
        self.client(case, "session", cmd);
    }

    /// `tests/e2b/sdk_isolation.py e2b` (the official E2B SDKs) against `serve --e2b`.
    fn e2b_sdk(&self, case: &mut Case, m: &Value) {
        let manifest = self.manifest("e2b", m);
        let python = workspace_root().join(".venv/e2b/bin/python");
        assert!(
            python.exists(),
            "{} is missing: run hack/test (it creates .venv/e2b)",
            python.display()
        );
        let mut cmd = Command::new(python);
        cmd.arg(workspace_root().join("tests/e2b/sdk_isolation.py"))
            .arg("e2b")
            .env("E2B_ADDR", &self.e2b)
            .env("E2B_API_KEY", &self.key)
            .env("ISO_MANIFEST", manifest)
            .env("ISO_AGENTRUN", agentrun_bin())
            .env("ISO_STATE", self.d.state())
            .env_remove("E2B_API_URL")
            .env_remove("E2B_SANDBOX_URL")
            .env_remove("E2B_ACCESS_TOKEN");
        self.client(case, "e2b", cmd);
    }

    fn client(&self, case: &mut Case, name: &str, cmd: Command) {
        let out = run_with_timeout(cmd, None, Duration::from_secs(300));
        if out.status.code() != Some(0) || !out.stdout().contains("OK ") {
            case.problems
                .push(format!("scenario {name} failed\n{out}\n{}", self.d.log()));
        }
        case.take_results(&out.stdout());
    }
}

/// The MCP SDK client (`.venv/mcp`) running `tests/isolation/mcp_pairs.py SCENARIO`; `state`
/// is the state dir of the server whose shells it checks.
fn mcp_client(scenario: &str, manifest: &Path, state: &Path) -> Command {
    let mut cmd = Command::new(mcp::Venv::Mcp.python());
    cmd.arg(workspace_root().join("tests/isolation/mcp_pairs.py"))
        .arg(scenario)
        .current_dir(workspace_root().join("tests/mcp"))
        .env("PYTHONPATH", workspace_root().join("tests/mcp"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("ISO_MANIFEST", manifest)
        .env("ISO_AGENTRUN", agentrun_bin())
        .env("ISO_STATE", state)
        .env("MCP_AGENTRUN", agentrun_bin())
        .env_remove("MCP_URL")
        .env_remove("MCP_API_KEY")
        .env_remove("AGENTRUN_NO_DAEMON");
    cmd
}

/// The OpenSandbox pair: sandbox A plants through a command (env of the sandbox, argv, an
/// uploaded file, code), a bash session and a code context; B (on A's shell) scans through
/// the same three.
fn osb_case(apis: &Apis, profile: &str) -> Case {
    let mut case = Case::new(&format!("opensandbox {profile}"));
    let a_cmd = case.a_mark("OpenSandbox command: sandbox env, argv, uploaded file, code");
    let a_session = case.a_mark("OpenSandbox bash session: argv, code");
    let a_code = case.a_mark("OpenSandbox code context: code");
    let upload = "/tmp/iso-upload.txt";
    let (b_cmd, b_session, b_code) = (case.b_mark(), case.b_mark(), case.b_mark());
    let mut env = json!({"ISO_SECRET": a_cmd});
    for (i, c) in copies(&a_cmd).into_iter().enumerate() {
        env[format!("ISO_SECRET_{i}")] = json!(c);
    }
    let m = json!({
        "a": {
            "env": env,
            "upload": [upload, format!("{a_cmd}\n")],
            "cmd": [probe("plant", &a_cmd, &["env", "argv"], json!({"read": [upload]})), a_cmd],
            "session": [probe("plant", &a_session, &["argv"], json!({})), a_session],
            "code": probe("plant", &a_code, &[], json!({})),
        },
        "b": {
            "env": {"ISO_MARK": b_cmd},
            "cmd": [probe("scan", &b_cmd, &["env", "argv"], json!({})), b_cmd],
            "session": [probe("scan", &b_session, &["argv"], json!({})), b_session],
            "code": probe("scan", &b_code, &[], json!({})),
        },
    });
    apis.sdk(&mut case, "osb", &m);
    case
}

/// The E2B pair: sandbox A (the official SDK, made with marked `envs`) plants through
/// `commands.run` (the sandbox's and the command's env, argv, an uploaded file, code), a
/// background command fed by `send_stdin` (argv, stdin), `run_code` in the default context
/// and in a context of its own; A is killed. B (on A's shell) cannot run code in A's context
/// and scans through the same four.
fn e2b_case(apis: &Apis, profile: &str) -> Case {
    let mut case = Case::new(&format!("e2b {profile}"));
    let a_cmd =
        case.a_mark("E2B commands.run: sandbox env, command env, argv, uploaded file, code");
    let a_stdin = case.a_mark("E2B background command: argv, send_stdin, code");
    let a_code = case.a_mark("E2B run_code, default context: code");
    let a_ctx = case.a_mark("E2B run_code, a context of its own: code");
    let (b_cmd, b_stdin, b_code, b_ctx) =
        (case.b_mark(), case.b_mark(), case.b_mark(), case.b_mark());
    let upload = "/tmp/iso-upload.txt";
    let mut env = json!({"ISO_SECRET": a_cmd});
    let mut cmd_env = json!({});
    for (i, c) in copies(&a_cmd).into_iter().enumerate() {
        env[format!("ISO_SECRET_{i}")] = json!(c);
        cmd_env[format!("ISO_CMD_SECRET_{i}")] = json!(c);
    }
    let m = json!({
        "a": {
            "env": env,
            "cmd_env": cmd_env,
            "upload": [upload, format!("{a_cmd}\n")],
            "cmd": [probe("plant", &a_cmd, &["env", "argv"], json!({"read": [upload]})), a_cmd],
            "stdin": [probe("plant", &a_stdin, &["argv", "stdin"], json!({})), a_stdin],
            "code": probe("plant", &a_code, &[], json!({})),
            "ctx": probe("plant", &a_ctx, &[], json!({})),
        },
        "b": {
            "env": {"ISO_MARK": b_cmd},
            "cmd_env": {"ISO_CMD_MARK": b_cmd},
            "cmd": [probe("scan", &b_cmd, &["env", "argv"], json!({})), b_cmd],
            "stdin": [probe("scan", &b_stdin, &["argv", "stdin"], json!({})), b_stdin],
            "code": probe("scan", &b_code, &[], json!({})),
            "ctx": probe("scan", &b_ctx, &[], json!({})),
        },
    });
    apis.e2b_sdk(&mut case, &m);
    case
}

/// The snapshot pair: sandbox A plants (commands, a bash session) and is deleted; sandbox P
/// runs next on A's shell, writes the carried marker into `/workspace` and `/tmp` and is
/// snapshotted; B, made from P's snapshot (a shell of the snapshot's image), scans. A
/// snapshot carries its sandbox's files by design (the carried marker is B's to see),
/// nothing of other runs.
fn osb_snapshot_case(apis: &Apis) -> Case {
    let mut case = Case::new("opensandbox from a snapshot");
    let a_cmd = case.a_mark("OpenSandbox command before the snapshot's sandbox: env, argv, upload");
    let a_session = case.a_mark("OpenSandbox bash session before the snapshot's sandbox");
    let (b_cmd, b_session) = (case.b_mark(), case.b_mark());
    // P's marker is carried into B by design: B may see it.
    let carried = case.b_mark();
    let upload = "/tmp/iso-upload.txt";
    let mut env = json!({"ISO_SECRET": a_cmd});
    for (i, c) in copies(&a_cmd).into_iter().enumerate() {
        env[format!("ISO_SECRET_{i}")] = json!(c);
    }
    let m = json!({
        "carried": carried,
        "a": {
            "env": env,
            "upload": [upload, format!("{a_cmd}\n")],
            "cmd": [probe("plant", &a_cmd, &["env", "argv"], json!({"read": [upload]})), a_cmd],
            "session": [probe("plant", &a_session, &["argv"], json!({})), a_session],
        },
        "b": {
            "env": {"ISO_MARK": b_cmd},
            "cmd": [probe("scan", &b_cmd, &["env", "argv"], json!({})), b_cmd],
            "session": [probe("scan", &b_session, &["argv"], json!({})), b_session],
        },
    });
    apis.sdk(&mut case, "osb_snapshot", &m);
    case
}

/// The fork pair: as [`osb_snapshot_case`], with B a fork copy of P (`POST .../fork`) made
/// while P runs, and code contexts too: A's plants; P's holds the carried marker in a global;
/// B's copy of P's context (the semantic fork of contexts) has it, and scans.
fn osb_fork_case(apis: &Apis) -> Case {
    let mut case = Case::new("opensandbox fork copy");
    let a_cmd = case.a_mark("OpenSandbox command before the forked sandbox: env, argv, upload");
    let a_session = case.a_mark("OpenSandbox bash session before the forked sandbox");
    let a_code = case.a_mark("OpenSandbox code context before the forked sandbox: code");
    let (b_cmd, b_session, b_code) = (case.b_mark(), case.b_mark(), case.b_mark());
    // P's marker is carried into B by design: B may see it.
    let carried = case.b_mark();
    let upload = "/tmp/iso-upload.txt";
    let mut env = json!({"ISO_SECRET": a_cmd});
    for (i, c) in copies(&a_cmd).into_iter().enumerate() {
        env[format!("ISO_SECRET_{i}")] = json!(c);
    }
    let m = json!({
        "carried": carried,
        "a": {
            "env": env,
            "upload": [upload, format!("{a_cmd}\n")],
            "cmd": [probe("plant", &a_cmd, &["env", "argv"], json!({"read": [upload]})), a_cmd],
            "session": [probe("plant", &a_session, &["argv"], json!({})), a_session],
            "code": probe("plant", &a_code, &[], json!({})),
        },
        "b": {
            "env": {"ISO_MARK": b_cmd},
            "cmd": [probe("scan", &b_cmd, &["env", "argv"], json!({})), b_cmd],
            "session": [probe("scan", &b_session, &["argv"], json!({})), b_session],
            "code": probe("scan", &b_code, &[], json!({})),
        },
    });
    apis.sdk(&mut case, "osb_fork", &m);
    case
}

/// A fork copy sees its parent's files and its contexts' globals (carried by design) and
/// nothing of the runs before the parent on its shell.
#[test]
fn a_fork_copy_sees_its_parents_files_and_nothing_of_other_runs() {
    let Some(_l) = setup() else { return };
    let apis = start_apis_with("default", false, 1);
    let case = osb_fork_case(&apis);
    verdict(&[case]);
}

/// A sandbox made from a snapshot sees its snapshot's files and nothing of the runs before
/// the snapshotted sandbox on its shell.
#[test]
fn a_sandbox_from_a_snapshot_sees_its_files_and_nothing_of_other_runs() {
    let Some(_l) = setup() else { return };
    let apis = start_apis_with("default", false, 1);
    let case = osb_snapshot_case(&apis);
    verdict(&[case]);
}

/// The MCP session pair: session A's `run_python` and `run_shell` plant, the session ends;
/// session B (on A's shell) scans through both.
fn mcp_session_case(apis: &Apis, profile: &str) -> Case {
    let mut case = Case::new(&format!("mcp session {profile}"));
    let m = mcp_manifest(&mut case, "MCP session");
    apis.mcp_session(&mut case, &m);
    case
}

fn mcp_manifest(case: &mut Case, what: &str) -> Value {
    let a_py = case.a_mark(&format!("{what} run_python: code"));
    let a_sh = case.a_mark(&format!("{what} run_shell: command line, code"));
    let (b_py, b_sh) = (case.b_mark(), case.b_mark());
    let sh = |role: &str, m: &str| {
        let code = probe(role, m, &["argv"], json!({}));
        format!("python3 -c '{}' {m}", code.replace('\'', r"'\''"))
    };
    json!({
        "a": {"py": probe("plant", &a_py, &[], json!({})), "sh": sh("plant", &a_sh)},
        "b": {"py": probe("scan", &b_py, &[], json!({})), "sh": sh("scan", &b_sh)},
    })
}

/// The Docker pair: container A's main process and an `exec` in it plant; container B (on A's
/// shell) scans through its main process and an `exec`.
fn docker_case(apis: &Apis) -> Case {
    let mut case = Case::new("docker");
    let a_main = case.a_mark("Docker container: env, argv, code");
    let a_exec = case.a_mark("docker exec: env, argv, code");
    let (b_main, b_exec) = (case.b_mark(), case.b_mark());
    let side = |role: &str, main: &str, exec: &str| {
        let linger = json!({"linger": 600});
        json!({
            "env": {"ISO_SECRET": main},
            "main": ["python3", "-c", probe(role, main, &["env", "argv"], linger), main],
            "exec": {
                "env": {"ISO_SECRET": exec},
                "argv": ["python3", "-c", probe(role, exec, &["env", "argv"], json!({})), exec],
            },
        })
    };
    let m = json!({
        "image": "isopy",
        "a": side("plant", &a_main, &a_exec),
        "b": side("scan", &b_main, &b_exec),
    });
    let shells = idle_shells(&apis.d, "container");
    let made = made_and_discarded(&apis.d);
    apis.sdk(&mut case, "docker", &m);
    same_shell(&mut case, &apis.d, "container", &shells, &made);
    case
}

/// The default profile's APIs on one daemon (its pools: one shell each, no room for more):
/// OpenSandbox, MCP sessions, E2B, Docker.
#[test]
fn api_sandboxes_on_one_shell_see_nothing_of_each_other() {
    let Some(_l) = setup() else { return };
    let apis = start_apis("default", true);
    let mut cases = Vec::new();
    for (name, f) in [
        (
            "osb",
            &(|a: &Apis| osb_case(a, "default")) as &dyn Fn(&Apis) -> Case,
        ),
        ("mcp", &|a: &Apis| mcp_session_case(a, "default")),
        ("e2b", &|a: &Apis| e2b_case(a, "default")),
        ("docker", &docker_case),
    ] {
        let shells = idle_shells(&apis.d, "default");
        let made = made_and_discarded(&apis.d);
        let mut case = f(&apis);
        if name != "docker" {
            same_shell(&mut case, &apis.d, "default", &shells, &made);
        }
        cases.push(case);
    }
    verdict(&cases);
}

/// The same with `code-interpreter` as the APIs' profile: code contexts (OpenSandbox's and
/// E2B's `run_code`) and MCP `run_python` sessions are forked from the shell's Python zygote.
#[test]
fn api_sandboxes_of_the_zygote_profile_see_nothing_of_each_other() {
    let Some(_l) = setup() else { return };
    let profile = "code-interpreter";
    let apis = start_apis(profile, false);
    wait_zygote(&apis.d, profile);
    let mut cases = Vec::new();
    for f in [osb_case, mcp_session_case, e2b_case] {
        let shells = idle_shells(&apis.d, profile);
        let made = made_and_discarded(&apis.d);
        let mut case = f(&apis, profile);
        same_shell(&mut case, &apis.d, profile, &shells, &made);
        // Code contexts and MCP's run_python: forked by the shell's zygote (their parent is
        // outside their pid namespace), else this is not the zygote path.
        for (label, v) in case.planted.iter().chain(case.verdicts.iter()) {
            if (label.ends_with(".code") || label.ends_with(".py")) && v["ppid"] != 0 {
                case.problems.push(format!(
                    "{label}: not forked by the zygote (ppid {})",
                    v["ppid"]
                ));
            }
        }
        cases.push(case);
    }
    verdict(&cases);
}

/// `agentrun mcp --one-shot` (stdio, its own pool of none: the first call's shell is made for
/// it and every later call takes it): run_python A, run_python B, run_shell A, run_shell B,
/// with the default profile and with `code-interpreter` (run_python forked by the zygote).
#[test]
fn mcp_one_shot_calls_see_nothing_of_each_other() {
    let Some(_l) = setup() else { return };
    let mut cases = Vec::new();
    for profile in ["default", "code-interpreter"] {
        let mut case = one_shot_case(profile);
        if profile == "code-interpreter" {
            for (label, v) in case.planted.iter().chain(case.verdicts.iter()) {
                if label.ends_with(".py") && v["ppid"] != 0 {
                    case.problems.push(format!(
                        "{label}: not forked by the zygote (ppid {})",
                        v["ppid"]
                    ));
                }
            }
        }
        cases.push(case);
    }
    verdict(&cases);
}

fn one_shot_case(profile: &str) -> Case {
    one_shot_case_as(profile, None)
}

/// [`one_shot_case`], as root or (`user`) as an ordinary user: then the client and the
/// server run as that user (`runuser`, a clean environment), rootless.
fn one_shot_case_as(profile: &str, user: Option<&IsoUser>) -> Case {
    let dir = tempdir();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    let who = if user.is_some() { " (rootless)" } else { "" };
    let mut case = Case::new(&format!("mcp one-shot {profile}{who}"));
    let m = mcp_manifest(&mut case, "MCP one-shot");
    let manifest = dir.path().join("mcp.json");
    fs::write(&manifest, m.to_string()).unwrap();
    let before = Leftovers::snapshot_own(&state);
    let mut cmd = mcp_client("oneshot", &manifest, &state.join("mcp/0"));
    cmd.env("AGENTRUN_STATE_DIR", &state).env(
        "MCP_ARGS",
        json!(["--one-shot", "--pool-size", "0", "--profile", profile]).to_string(),
    );
    if let Some(u) = user {
        host(
            "chown",
            ["-R", u.name.as_str(), dir.path().to_str().unwrap()],
        )
        .success();
        cmd = u.wrap(&cmd);
    }
    let out = run_with_timeout(cmd, None, Duration::from_secs(300));
    if out.status.code() != Some(0) || !out.stdout().contains("OK oneshot") {
        case.problems
            .push(format!("scenario oneshot failed\n{out}"));
    }
    case.take_results(&out.stdout());
    let mut left = Leftovers::default();
    let clean = wait_until(Duration::from_secs(20), || {
        left = Leftovers::snapshot_own(&state).new_since(&before);
        left.is_empty().then_some(())
    });
    if clean.is_none() {
        force_cleanup_in(&state, &before);
        case.problems
            .push(format!("agentrun mcp left behind:\n{left}"));
    }
    if let Some(u) = user {
        // Rootless sandboxes run as the user: none of its processes outlive the client.
        if wait_until(Duration::from_secs(20), || {
            u.pids().is_empty().then_some(())
        })
        .is_none()
        {
            case.problems
                .push(format!("processes of the user left: {:?}", u.pids()));
        }
    }
    case
}

/// A fresh `useradd` user (removed with its processes and home when the binary exits) with
/// a copy of the binary under test in its home, as in tests/tests/rootless.rs.
struct IsoUser {
    name: String,
    uid: u32,
    home: std::path::PathBuf,
    bin: std::path::PathBuf,
}

impl IsoUser {
    fn make() -> IsoUser {
        let users::Throwaway { name, uid, home } =
            users::make_user(&format!("ari{}", std::process::id()));
        let bin = home.join("agentrun");
        fs::copy(agentrun_bin(), &bin).expect("copy the binary under test");
        host("chown", [name.as_str(), bin.to_str().unwrap()]).success();
        IsoUser {
            name,
            uid,
            home,
            bin,
        }
    }

    fn pids(&self) -> Vec<i32> {
        users::pids_of(self.uid)
    }

    /// `cmd` (an MCP client command) run as the user with only its own environment: the
    /// host's `/usr/bin/python3` with `.venv/mcp`'s packages (the venv's interpreter is under
    /// root's private home) and the user's copy of agentrun.
    fn wrap(&self, cmd: &Command) -> Command {
        let site = agentrun_e2e::mcp::venv_site_packages();
        let tests = workspace_root().join("tests/mcp");
        let mut out = Command::new("runuser");
        out.args(["-u", &self.name, "--", "env", "-i"])
            .arg(format!("HOME={}", self.home.display()))
            .arg("PATH=/usr/bin:/bin")
            .arg(format!("USER={}", self.name))
            .arg(format!("PYTHONPATH={}:{}", site.display(), tests.display()));
        for (k, v) in cmd.get_envs() {
            let (Some(k), Some(v)) = (k.to_str(), v.and_then(|v| v.to_str())) else {
                continue;
            };
            let v = match k {
                "PYTHONPATH" => continue,
                "ISO_AGENTRUN" | "MCP_AGENTRUN" => self.bin.to_str().unwrap(),
                _ => v,
            };
            out.arg(format!("{k}={v}"));
        }
        out.arg("/usr/bin/python3").args(cmd.get_args());
        if let Some(d) = cmd.get_current_dir() {
            out.current_dir(d);
        }
        out
    }
}

/// `agentrun mcp --one-shot` started by the MCP SDK client as an ordinary user (rootless,
/// docs/rootless.md): run_python A, run_python B, run_shell A, run_shell B on one rootless
/// shell, each call a sandbox of its own; with the default profile and `code-interpreter`.
#[test]
fn mcp_one_shot_calls_of_an_ordinary_user_see_nothing_of_each_other() {
    let Some(_l) = setup() else { return };
    let user = IsoUser::make();
    let cases: Vec<Case> = ["default", "code-interpreter"]
        .iter()
        .map(|p| {
            let mut case = one_shot_case_as(p, Some(&user));
            // code-interpreter's run_python: forked by the shell's zygote, as for root.
            for (label, v) in case.planted.iter().chain(case.verdicts.iter()) {
                if *p == "code-interpreter" && label.ends_with(".py") && v["ppid"] != 0 {
                    case.problems.push(format!(
                        "{label}: not forked by the zygote (ppid {})",
                        v["ppid"]
                    ));
                }
            }
            case
        })
        .collect();
    verdict(&cases);
}

/// The corpus's own negative control: A and B in one cell (one cold run, `A; B`), where
/// everything A left is B's to see. The scanner must report A's marker in every channel A
/// planted it in that outlives A's process (files, POSIX shm, mqueue, SysV IPC, its
/// background process's argv/env/memory/memfd, its sockets): a channel the scanner reads
/// wrong would pass every other test of this file silently.
#[test]
fn the_scanner_finds_what_a_run_left_in_its_own_cell() {
    let Some(_l) = setup() else { return };
    let mut case = Case::new("control: A and B in one cell");
    let ma = case.a_mark("run A of the same cell");
    let mb = case.b_mark();
    let ws = workspace_with(None);
    let a = probe("plant", &ma, &[], json!({}));
    let b = probe("scan", &mb, &[], json!({}));
    let out = agentrun([
        "exec",
        "--workspace",
        &ws.path().display().to_string(),
        "--",
        "sh",
        "-c",
        "python3 -c \"$1\" && python3 -c \"$2\"",
        "sh",
        &a,
        &b,
    ])
    .env("AGENTRUN_NO_DAEMON", "1")
    .timeout(RUN)
    .run();
    case.take("a.cell", &out, "ISO-PLANTED ");
    case.take("b.cell", &out, "ISO-VERDICT ");
    let problems = case.judge(&BTreeMap::new());
    let leaked: Vec<&str> = [
        "files",
        "posix_shm",
        "mqueue",
        "sysv",
        "procs",
        "proc_mem",
        "sockets",
    ]
    .into_iter()
    .filter(|ch| {
        problems
            .iter()
            .any(|p| p.contains(&format!("LEAK in {ch}: A's marker")))
    })
    .collect();
    let others: Vec<&String> = problems.iter().filter(|p| !p.contains("LEAK")).collect();
    assert!(others.is_empty(), "{others:#?}\n{out}");
    assert_eq!(
        leaked,
        [
            "files",
            "posix_shm",
            "mqueue",
            "sysv",
            "procs",
            "proc_mem",
            "sockets"
        ],
        "the scanner must see A's marker in each channel; it reported:\n{}",
        problems.join("\n")
    );
}
