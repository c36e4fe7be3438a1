//! Installing agentrun like a service (issue 19): the daemon under socket activation (a
//! pre-bound control socket passed as fd 3 with `LISTEN_PID`/`LISTEN_FDS`, as systemd's
//! `agentrun.socket` does), and the shell completions and man pages the package ships.
//! The .deb itself is built and installed into a clean root by `hack/package-test`.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::*;

/// `systemd-socket-activate --seqpacket` binds the socket, and on the first connection execs
/// `agentrun serve` with it as fd 3: the first `agentrun exec` (queued on the socket while the
/// daemon starts) is served by that daemon, which neither rebinds nor removes the socket and
/// makes it root-only.
#[test]
fn serve_takes_the_socket_a_service_manager_bound() {
    let Some(_lock) = setup() else { return };
    let activator = which("systemd-socket-activate")
        .expect("systemd-socket-activate (package systemd) is needed for this test");
    let mut d = Daemon::unstarted();
    fs::create_dir_all(d.state()).unwrap();
    fs::set_permissions(d.state(), fs::Permissions::from_mode(0o700)).unwrap();
    let sock = d.socket();
    let mut cmd = Command::new(activator);
    cmd.arg("--seqpacket")
        .arg("-l")
        .arg(&sock)
        .arg(agentrun_bin())
        .args(["serve", "--pool-size", "1"])
        .env("AGENTRUN_STATE_DIR", d.state());
    d.adopt(Running::spawn(cmd, None));
    assert!(
        wait_until(Duration::from_secs(10), || sock.exists().then_some(())).is_some(),
        "the activator did not bind {}\n{}",
        sock.display(),
        d.log()
    );
    let inode = fs::metadata(&sock).unwrap().ino();

    // The first client starts the daemon and is served by it.
    let out = d
        .exec(["sh", "-c", "echo served by $0", "activation"])
        .timeout(Duration::from_secs(120))
        .run();
    assert_eq!(out.success(), "served by activation\n", "{}", d.log());
    let status = d.pool_status_json();
    let served: u64 = status["pools"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| p["hits"].as_u64().unwrap_or(0) + p["misses"].as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
        + status["unpooled"].as_u64().unwrap_or(0);
    assert!(
        served >= 1,
        "the daemon served no run: {status}\n{}",
        d.log()
    );
    assert!(
        d.log().contains("(socket-activated)"),
        "the daemon does not say it took the passed socket\n{}",
        d.log()
    );
    let meta = fs::metadata(&sock).unwrap();
    assert_eq!(meta.ino(), inode, "the daemon rebound the socket");
    assert_eq!(
        meta.mode() & 0o777,
        0o600,
        "the activated control socket is not root-only"
    );

    // SIGTERM: a clean exit that leaves the socket to whoever bound it.
    let mut proc = d.take_proc().unwrap();
    proc.signal(libc::SIGTERM);
    let out = proc.wait_or_kill(Duration::from_secs(30));
    assert_eq!(out.code(), 0, "serve after SIGTERM\n{out}");
    assert!(
        sock.exists(),
        "the daemon removed a socket it did not create"
    );
}

/// A service manager that passes the wrong kind of fd (a `.socket` unit with `ListenStream=`,
/// or no socket at all) gets a one-line error saying what to use, and no daemon.
#[test]
fn serve_refuses_a_passed_fd_that_is_not_a_seqpacket_listener() {
    let Some(_lock) = setup() else { return };
    let d = Daemon::unstarted();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" serve 3</etc/hostname"#)
        .arg(agentrun_bin())
        .env("AGENTRUN_STATE_DIR", d.state());
    let out = run_with_timeout(cmd, None, Duration::from_secs(30));
    out.assert_agentrun_error();
    let err = out.stderr();
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(
        err.contains("ListenSequentialPacket="),
        "the error does not say what to use: {err}"
    );
    assert!(!d.socket().exists(), "a socket was bound anyway");
}

/// The completion scripts are valid for their shell and know the subcommands; the man pages
/// render with man(1), one per subcommand.
#[test]
fn completions_and_man_pages_come_from_the_cli() {
    require_bin();
    let out = agentrun(["completions", "bash"]).run();
    let script = out.success();
    assert!(
        script.contains("agentrun__subcmd__serve"),
        "no serve in bash completions"
    );
    let dir = tempdir();
    let path = dir.path().join("agentrun.bash");
    fs::write(&path, &script).unwrap();
    // Sourced, then asked what follows `agentrun se`: the shell itself completes.
    let probe = format!(
        "source {}; COMP_WORDS=(agentrun se); COMP_CWORD=1; _agentrun agentrun se agentrun; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        path.display()
    );
    let out = host("bash", ["-c", probe.as_str()]);
    assert_eq!(out.success(), "serve\n", "bash completion of `agentrun se`");
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = agentrun(["completions", shell]).run();
        assert!(out.success().contains("agentrun"), "{shell}: {out}");
    }
    let out = agentrun(["completions", "tcsh"]).run();
    out.assert_agentrun_error();

    let man = dir.path().join("man");
    agentrun(["man".as_ref(), man.as_os_str()]).run().success();
    for page in [
        "agentrun.1",
        "agentrun-serve.1",
        "agentrun-exec.1",
        "agentrun-image-pull.1",
    ] {
        assert!(man.join(page).is_file(), "no {page}");
    }
    let out = host(
        "man",
        ["-l", man.join("agentrun-serve.1").to_str().unwrap()],
    );
    let text = out.success();
    assert!(text.contains("--pool-size"), "agentrun-serve(1): {text}");
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}
