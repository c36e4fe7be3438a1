//! Progress of `agentrun image pull/import/export/build` on stderr, through the real binary:
//! plain per-layer lines (at most one a second, then `done`) when stderr is a pipe, indicatif
//! bars (bytes, rate, ETA) under a pty (`script`), nothing with `-q`; stdout as before.
//! Pulls go to Debian's `docker-registry` on loopback, slowed by a proxy so the download
//! lasts seconds. Root required.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrun_e2e::images::{busybox_store, docker_save, Registry, SavedImage};
use agentrun_e2e::*;

fn image(root: &Path, args: &[&str]) -> RunOutput {
    let mut a = vec!["image"];
    a.extend_from_slice(args);
    agentrun(a)
        .root(root)
        .env("AGENTRUN_NO_DAEMON", "1")
        .timeout(Duration::from_secs(300))
        .run()
}

/// A store with `busybox`, and that image exported as an OCI layout tar.
fn busybox_and_tar() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempdir();
    let root = busybox_store(dir.path(), &["--cmd", "/bin/sh"]);
    let tar = dir.path().join("busybox-oci.tar");
    image(
        &root,
        &["export", "-q", "busybox", "-o", tar.to_str().unwrap()],
    )
    .success();
    (dir, root, tar)
}

/// The `sha256:` + 12 hex digits naming each layer of `name` in progress lines.
fn layer_ids(root: &Path, name: &str) -> Vec<String> {
    let out = image(root, &["inspect", name]);
    let v: serde_json::Value = serde_json::from_str(&out.success()).unwrap();
    v[0]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap()[..19].to_owned())
        .collect()
}

/// The stderr lines about `layer`.
fn lines_of<'a>(stderr: &'a str, layer: &str) -> Vec<&'a str> {
    let prefix = format!("layer {layer}: ");
    stderr.lines().filter(|l| l.starts_with(&prefix)).collect()
}

/// A TCP proxy on loopback to `upstream` sending answers back at about 512 KiB/s, so a
/// download lasts long enough for progress to be seen. Stops on drop.
struct SlowProxy {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl SlowProxy {
    fn start(upstream: u16) -> SlowProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                let Ok((client, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(std::net::Shutdown::Write);
                });
                let (mut s_in, mut c_out) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 << 10];
                    loop {
                        match s_in.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if c_out.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                                std::thread::sleep(Duration::from_millis(30));
                            }
                        }
                    }
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        SlowProxy { port, stop }
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[test]
fn pull_shows_each_layer_on_stderr_as_lines_as_bars_or_not_at_all() {
    let Some(_l) = setup() else { return };
    let (d, _root, tar) = busybox_and_tar();
    let reg = Registry::start();
    reg.push(
        &format!("oci-archive:{}", tar.display()),
        "agentrun/bb:1",
        &[],
    )
    .success();
    let proxy = SlowProxy::start(reg.port);
    let name = format!("127.0.0.1:{}/agentrun/bb:1", proxy.port);
    // stderr a pipe: plain lines, throttled, then `done`; stdout as before.
    let pulled = d.path().join("pulled");
    let started = Instant::now();
    let out = image(&pulled, &["pull", &name]);
    let took = started.elapsed();
    let stdout = out.success();
    assert!(stdout.starts_with("Digest: sha256:"), "{out}");
    assert!(stdout.contains("Pulled: "), "{out}");
    assert!(!stdout.contains("layer "), "progress on stdout: {out}");
    // skopeo pushed the layer gzipped: the pulled blob is named in the pulled store.
    let layers = layer_ids(&pulled, &name);
    assert_eq!(layers.len(), 1);
    let layer = &layers[0];
    let stderr = out.stderr();
    let lines = lines_of(&stderr, layer);
    let downloading: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains(": downloading ") && !l.contains(" done"))
        .collect();
    assert!(
        downloading.len() >= 2,
        "a download of {took:?} reported fewer than 2 progress lines:\n{stderr}"
    );
    // At most one line a second (and the first at the start): never one per chunk.
    assert!(
        downloading.len() as u64 <= took.as_secs() + 2,
        "more than one line a second over {took:?}:\n{stderr}"
    );
    assert!(
        downloading
            .iter()
            .any(|l| l.contains("iB/") && l.contains("iB (") && l.contains("/s, ETA ")),
        "no bytes/total, rate and ETA:\n{stderr}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains(": downloading done: "))
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains(": extracting done: "))
            .count(),
        1,
        "{stderr}"
    );
    // Again: nothing to fetch, and it says so.
    let out = image(&pulled, &["pull", &name]);
    out.success();
    assert_eq!(
        lines_of(&out.stderr(), layer),
        vec![format!("layer {layer}: already exists")],
        "{out}"
    );

    // -q: stderr empty, stdout unchanged.
    let quiet = d.path().join("quiet");
    let out = image(&quiet, &["pull", "-q", &name]);
    assert!(out.success().contains("Pulled: "), "{out}");
    assert_eq!(out.stderr(), "", "{out}");

    // Under a pty: indicatif's bar, with bytes/total, rate and ETA.
    let tty = d.path().join("tty");
    let mut cmd = Command::new("script");
    cmd.args(["-qfec"])
        .arg(format!("{} image pull {name}", agentrun_bin().display()))
        .arg("/dev/null")
        .env("AGENTRUN_ROOT", &tty)
        .env("AGENTRUN_NO_DAEMON", "1")
        .env("TERM", "xterm");
    let out = run_with_timeout(cmd, None, Duration::from_secs(300));
    let screen = out.success();
    let bar = format!("layer {layer} downloading");
    assert!(screen.contains(&bar), "no bar {bar:?}:\n{screen}");
    assert!(screen.contains("] "), "no bar:\n{screen}");
    assert!(
        screen.contains("iB/") && screen.contains("iB/s ETA "),
        "no rate/ETA:\n{screen}"
    );
    assert!(
        screen.contains("\x1b["),
        "not drawn as a terminal bar:\n{screen}"
    );
    // When no bar runs any more, the bars leave a summary line each.
    assert!(
        screen.contains(&format!("layer {layer}: downloading done: ")),
        "{screen}"
    );
    assert!(screen.contains("Pulled: "), "{screen}");
    drop(proxy);
}

#[test]
fn import_and_export_show_layers_and_q_silences_them() {
    let Some(_l) = setup() else { return };
    let (d, root, tar) = busybox_and_tar();
    let layer = &layer_ids(&root, "busybox")[0];

    // export -o: one `exporting` line, then done; the file is the image.
    let out_tar = d.path().join("again.tar");
    let out = image(
        &root,
        &["export", "busybox", "-o", out_tar.to_str().unwrap()],
    );
    assert_eq!(out.success(), "", "{out}");
    let stderr = out.stderr();
    let lines = lines_of(&stderr, layer);
    assert!(lines[0].contains(": exporting 0 B/"), "{stderr}");
    assert!(
        lines.last().unwrap().contains(": exporting done: "),
        "{stderr}"
    );
    assert_eq!(fs::read(&out_tar).unwrap(), fs::read(&tar).unwrap());
    // export to stdout: the tar alone on stdout, progress on stderr.
    let out = image(&root, &["export", "busybox"]);
    assert_eq!(out.stdout, fs::read(&tar).unwrap(), "stdout is not the tar");
    assert!(out.stderr().contains(": exporting done: "), "{out}");
    let out = image(&root, &["export", "-q", "busybox"]);
    assert_eq!(out.stdout, fs::read(&tar).unwrap());
    assert_eq!(out.stderr(), "", "{out}");

    // import of the OCI layout: copying, then extracting.
    let imported = d.path().join("imported");
    let out = image(&imported, &["import", tar.to_str().unwrap()]);
    assert!(
        out.success().starts_with("Loaded image: busybox:latest"),
        "{out}"
    );
    let stderr = out.stderr();
    let lines = lines_of(&stderr, layer);
    assert!(
        lines.iter().any(|l| l.contains(": copying done: ")),
        "{stderr}"
    );
    assert!(
        lines.iter().any(|l| l.contains(": extracting done: ")),
        "{stderr}"
    );
    // Again: already stored.
    let out = image(&imported, &["import", tar.to_str().unwrap()]);
    assert_eq!(
        lines_of(&out.stderr(), layer),
        vec![format!("layer {layer}: already exists")],
        "{out}"
    );
    // -q: nothing on stderr.
    let quiet = d.path().join("quiet");
    let out = image(&quiet, &["import", "-q", tar.to_str().unwrap()]);
    assert!(
        out.success().starts_with("Loaded image: busybox:latest"),
        "{out}"
    );
    assert_eq!(out.stderr(), "", "{out}");

    // A `docker save` archive: its layers named by diff id.
    let saved = d.path().join("saved.tar");
    let layer_tar = agentrun_e2e::images::layer_tar(&[agentrun_e2e::images::Entry::File(
        "hello.txt",
        "hello\n",
    )]);
    let diff_id = agentrun_e2e::images::sha256(&layer_tar);
    docker_save(
        &saved,
        &[SavedImage {
            repo_tags: vec!["saved:1".into()],
            layers: vec![layer_tar],
            cmd: vec!["/hello".into()],
            env: vec![],
        }],
        None,
    );
    let out = image(
        &d.path().join("saved"),
        &["import", saved.to_str().unwrap()],
    );
    out.success();
    let stderr = out.stderr();
    assert!(
        lines_of(&stderr, &diff_id[..19])
            .iter()
            .any(|l| l.contains(": copying done: ")),
        "{stderr}"
    );
}

#[test]
fn build_shows_its_new_layers_on_stderr_and_steps_on_stdout() {
    let Some(_l) = setup() else { return };
    let (d, root, _) = busybox_and_tar();
    let ctx = d.path().join("ctx");
    fs::create_dir_all(&ctx).unwrap();
    fs::write(ctx.join("data.bin"), vec![7u8; 3 << 20]).unwrap();
    fs::write(
        ctx.join("Dockerfile"),
        "FROM busybox\nCOPY data.bin /opt/\n",
    )
    .unwrap();
    let out = image(&root, &["build", "-t", "big:1", ctx.to_str().unwrap()]);
    let stdout = out.success();
    assert!(stdout.contains("Step 2/2 : COPY data.bin /opt/"), "{out}");
    assert!(stdout.contains("Successfully tagged big:1"), "{out}");
    assert!(
        !stdout.contains("layer sha256:"),
        "progress on stdout: {out}"
    );
    let layers = layer_ids(&root, "big:1");
    let new = layers.last().unwrap();
    let stderr = out.stderr();
    let lines = lines_of(&stderr, new);
    assert!(
        lines.iter().any(|l| l.contains(": extracting done: 3.")),
        "{stderr}"
    );
    // -q: the id alone on stdout, nothing on stderr.
    fs::write(ctx.join("more.txt"), "more\n").unwrap();
    fs::write(
        ctx.join("Dockerfile"),
        "FROM busybox\nCOPY data.bin more.txt /opt/\n",
    )
    .unwrap();
    let out = image(
        &root,
        &["build", "-q", "-t", "big:2", ctx.to_str().unwrap()],
    );
    assert!(out.success().trim().starts_with("sha256:"), "{out}");
    assert_eq!(out.stderr(), "", "{out}");
}
