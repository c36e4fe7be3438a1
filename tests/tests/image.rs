//! The image store through the real binary: `image add/import/pull/export/ls/inspect/tag/rm/
//! prune`, runs on imported and pulled images, whiteouts, hostile archives, layer sharing,
//! concurrent pulls, and round trips through real containerd (`ctr image import` + `ctr run`)
//! and a real registry (Debian's `docker-registry`, pushed to with `skopeo`). Root required.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::images::{
    busybox_store, docker_save, layer_tar, run_in, Containerd, Entry, Registry, SavedImage,
};
use agentrun_e2e::*;
use base64::Engine as _;

/// A fresh store with the busybox image (built from images/busybox) added as `busybox`, with a
/// default command and an Env the tests check for.
fn store_with_busybox() -> (tempfile::TempDir, PathBuf) {
    let dir = tempdir();
    let root = busybox_store(
        dir.path(),
        &[
            "--cmd",
            "sh",
            "--cmd",
            "-c",
            "--cmd",
            "echo default command, FLAVOUR=$FLAVOUR",
            "--env",
            "FLAVOUR=vanilla",
        ],
    );
    (dir, root)
}

fn image(root: &Path, args: &[&str]) -> RunOutput {
    let mut a = vec!["image"];
    a.extend_from_slice(args);
    agentrun(a)
        .root(root)
        .timeout(Duration::from_secs(180))
        .run()
}

fn count_dirs(p: &Path) -> usize {
    fs::read_dir(p).map(|r| r.count()).unwrap_or(0)
}

#[test]
fn image_config_gives_default_command_and_env() {
    let Some(_l) = setup() else { return };
    let (_d, root) = store_with_busybox();
    // No command: the image's Cmd runs, with the image's Env.
    let out = agentrun(["exec", "--image", "busybox"])
        .root(&root)
        .env("AGENTRUN_NO_DAEMON", "1")
        .run();
    assert_eq!(out.success(), "default command, FLAVOUR=vanilla\n", "{out}");
    // -e overrides the image's Env; PATH defaults to Docker's.
    let out = exec_with(
        ["--image", "busybox", "-e", "FLAVOUR=chocolate"],
        ["sh", "-c", "echo $FLAVOUR $PATH"],
    )
    .root(&root)
    .env("AGENTRUN_NO_DAEMON", "1")
    .run();
    assert_eq!(
        out.success(),
        "chocolate /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
        "{out}"
    );
    // An image without Cmd and no command: a clear error.
    agentrun(["exec"]).root(&root).run().assert_agentrun_error();
}

#[test]
fn names_resolve_like_docker() {
    let Some(_l) = setup() else { return };
    let (_d, root) = store_with_busybox();
    let inspect = image(&root, &["inspect", "busybox"]).success();
    let v: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    let id = v[0]["id"].as_str().unwrap().to_owned();
    let digest = v[0]["manifest_digest"].as_str().unwrap().to_owned();
    assert_eq!(
        v[0]["names"][0], "docker.io/library/busybox:latest",
        "{inspect}"
    );
    assert_eq!(v[0]["config"]["cmd"][0], "sh", "{inspect}");
    image(
        &root,
        &["tag", "busybox", "registry.example:5000/team/bb:v1"],
    )
    .success();
    for name in [
        "busybox".to_string(),
        "busybox:latest".into(),
        "docker.io/library/busybox:latest".into(),
        "library/busybox".into(),
        id[7..19].to_string(),
        id.clone(),
        format!("busybox@{digest}"),
        "registry.example:5000/team/bb:v1".into(),
    ] {
        let out = run_in(&root, &name, &["cat", "/etc/os-release"]);
        assert!(out.success().contains("agentrun busybox"), "{name}: {out}");
    }
    let ls = image(&root, &["ls"]).success();
    assert!(
        ls.lines()
            .any(|l| l.starts_with("busybox ") && l.contains(&id[7..19])),
        "{ls}"
    );
    assert!(
        ls.lines()
            .any(|l| l.starts_with("registry.example:5000/team/bb ") && l.contains("v1")),
        "{ls}"
    );
    for bad in ["busybox:nope", "nosuchimage", "UPPER"] {
        let out = run_in(&root, bad, &["true"]);
        out.assert_agentrun_error();
    }
    // rm by name untags while another name remains; by id with two names needs --force.
    image(&root, &["rm", &id]).assert_agentrun_error();
    let out = image(&root, &["rm", "registry.example:5000/team/bb:v1"]).success();
    assert!(out.contains("Untagged"), "{out}");
    run_in(&root, "busybox", &["true"]).success();
}

#[test]
fn export_then_import_round_trips_and_containerd_runs_it() {
    let Some(_l) = setup() else { return };
    let (d, root) = store_with_busybox();
    let tar = d.path().join("busybox-oci.tar");
    image(&root, &["export", "busybox", "-o", tar.to_str().unwrap()]).success();
    // Into an empty store, under another name.
    let root2 = d.path().join("root2");
    let out = image(
        &root2,
        &["import", tar.to_str().unwrap(), "--name", "copy:1"],
    )
    .success();
    assert!(out.contains("copy:1"), "{out}");
    let out = run_in(
        &root2,
        "copy:1",
        &["sh", "-c", "echo $FLAVOUR; cat /etc/os-release"],
    );
    assert!(out.success().starts_with("vanilla\n"), "{out}");
    // The same image id in both stores: the content is exact.
    let id = |r: &Path, n: &str| {
        let v: serde_json::Value =
            serde_json::from_str(&image(r, &["inspect", n]).success()).unwrap();
        v[0]["id"].as_str().unwrap().to_owned()
    };
    assert_eq!(id(&root, "busybox"), id(&root2, "copy:1"));

    // Real containerd imports the export and runs it with runc.
    let ctd = Containerd::start();
    let out = ctd.ctr(&["image", "import", tar.to_str().unwrap()]);
    assert!(
        out.success().contains("docker.io/library/busybox:latest"),
        "{out}\n{}",
        ctd.log()
    );
    let out = ctd.run(&[
        "--rm",
        "docker.io/library/busybox:latest",
        "agentrun-e2e-export",
        "/bin/sh",
        "-c",
        "echo from containerd $FLAVOUR; exit 3",
    ]);
    assert_eq!(out.code(), 3, "{out}\n{}", ctd.log());
    assert_eq!(out.stdout(), "from containerd vanilla\n", "{out}");
}

#[test]
fn pull_from_a_registry_on_loopback() {
    let Some(_l) = setup() else { return };
    let (d, root) = store_with_busybox();
    let tar = d.path().join("busybox-oci.tar");
    image(&root, &["export", "busybox", "-o", tar.to_str().unwrap()]).success();
    let reg = Registry::start();
    let src = format!("oci-archive:{}", tar.display());
    reg.push(&src, "agentrun/plain:1.0", &[]).success();
    reg.push(
        &src,
        "agentrun/gzip:1.0",
        &["--dest-compress-format", "gzip", "--dest-compress"],
    )
    .success();
    reg.push(
        &src,
        "agentrun/zstd:1.0",
        &["--dest-compress-format", "zstd", "--dest-compress"],
    )
    .success();

    let root2 = d.path().join("pulled");
    for name in ["plain", "gzip", "zstd"] {
        let r = format!("{}/agentrun/{name}:1.0", reg.host());
        let out = image(&root2, &["pull", &r]);
        assert!(out.success().contains("Pulled"), "{out}");
        let out = run_in(
            &root2,
            &r,
            &["sh", "-c", "echo $FLAVOUR; head -1 /etc/os-release"],
        );
        assert_eq!(
            out.success(),
            "vanilla\nNAME=\"agentrun busybox\"\n",
            "{name}: {out}"
        );
    }
    // Three encodings of one layer: one unpacked layer in the store.
    assert_eq!(count_dirs(&root2.join("layers")), 1);
    // Pulling again fetches nothing new and keeps working.
    image(
        &root2,
        &["pull", &format!("{}/agentrun/plain:1.0", reg.host())],
    )
    .success();
    // Unknown image / tag: a clear one-line error.
    image(
        &root2,
        &["pull", &format!("{}/agentrun/missing:1.0", reg.host())],
    )
    .assert_agentrun_error();
    // Concurrent pulls of the same image into one empty store all succeed.
    let root3 = d.path().join("concurrent");
    let r = format!("{}/agentrun/gzip:1.0", reg.host());
    let mut pulls: Vec<Running> = (0..4)
        .map(|_| {
            agentrun(["image", "pull", &r])
                .root(&root3)
                .timeout(Duration::from_secs(120))
                .spawn()
        })
        .collect();
    for p in pulls.iter_mut() {
        p.wait_or_kill(Duration::from_secs(120)).success();
    }
    assert_eq!(count_dirs(&root3.join("layers")), 1);
    assert_eq!(count_dirs(&root3.join("tmp")), 0, "pulls left temp files");
    run_in(&root3, &r, &["true"]).success();
}

/// A base layer (busybox's files would be large to write entry by entry: the base here is a
/// copy of the host's busybox binary, enough for sh/ls/cat).
fn base_layer() -> Vec<u8> {
    let busybox = fs::read("/bin/busybox").expect("busybox-static is installed");
    let mut b = tar::Builder::new(Vec::new());
    let add_dir = |b: &mut tar::Builder<Vec<u8>>, p: &str| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_path(p).unwrap();
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    };
    for d in ["bin", "etc", "opt", "opt/old", "tmp"] {
        add_dir(&mut b, d);
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o755);
    h.set_size(busybox.len() as u64);
    h.set_path("bin/busybox").unwrap();
    h.set_cksum();
    b.append(&h, &busybox[..]).unwrap();
    for applet in ["sh", "ls", "cat", "test", "echo"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        h.set_path(format!("bin/{applet}")).unwrap();
        h.set_link_name("busybox").unwrap();
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }
    for (p, data) in [
        ("etc/motd", "hello\n"),
        ("opt/old/file", "old\n"),
        ("etc/keep", "keep\n"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_path(p).unwrap();
        h.set_cksum();
        b.append(&h, data.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

fn saved(tags: &[&str], layers: Vec<Vec<u8>>) -> SavedImage {
    SavedImage {
        repo_tags: tags.iter().map(|s| s.to_string()).collect(),
        layers,
        cmd: vec!["/bin/sh".into()],
        env: vec!["PATH=/bin".into()],
    }
}

#[test]
fn docker_save_archives_import_with_whiteouts_and_shared_layers() {
    let Some(_l) = setup() else { return };
    let d = tempdir();
    let root = d.path().join("root");
    let base = base_layer();
    let top = layer_tar(&[
        Entry::File("etc/.wh.motd", ""),
        Entry::Dir("opt/"),
        Entry::File("opt/.wh..wh..opq", ""),
        Entry::Dir("opt/new/"),
        Entry::File("opt/new/file", "new\n"),
        Entry::HardLink("opt/new/link", "opt/new/file"),
    ]);
    let other = layer_tar(&[Entry::File("etc/other", "other\n")]);
    let archive = d.path().join("save.tar");
    docker_save(
        &archive,
        &[
            saved(&["demo/whiteout:1"], vec![base.clone(), top]),
            saved(&["demo/other:1"], vec![base, other]),
        ],
        None,
    );
    let out = image(&root, &["import", archive.to_str().unwrap()]).success();
    assert!(
        out.contains("demo/whiteout:1") && out.contains("demo/other:1"),
        "{out}"
    );

    // Whiteouts: motd deleted, /opt opaque (old gone, new there), hard link kept.
    let out = run_in(
        &root,
        "demo/whiteout:1",
        &[
            "sh",
            "-c",
            "test -e /etc/motd && echo motd-present; ls /opt; cat /etc/keep /opt/new/link",
        ],
    );
    assert_eq!(out.success(), "new\nkeep\nnew\n", "{out}");
    let out = run_in(
        &root,
        "demo/other:1",
        &["sh", "-c", "cat /etc/motd /etc/other; ls /opt"],
    );
    assert_eq!(out.success(), "hello\nother\nold\n", "{out}");

    // The shared base is stored once: 3 layers for 4 layer references.
    assert_eq!(count_dirs(&root.join("layers")), 3);
    // Removing one image keeps the shared layer for the other.
    image(&root, &["rm", "demo/whiteout:1"]).success();
    assert_eq!(count_dirs(&root.join("layers")), 2);
    run_in(&root, "demo/other:1", &["cat", "/etc/motd"]).success();
    image(&root, &["rm", "demo/other:1"]).success();
    assert_eq!(count_dirs(&root.join("layers")), 0);
    assert_eq!(count_dirs(&root.join("blobs/sha256")), 0);
}

#[test]
fn hostile_archives_are_refused_without_touching_the_host() {
    let Some(_l) = setup() else { return };
    let d = tempdir();
    let root = d.path().join("root");
    let victim = d.path().join("victim");
    fs::create_dir_all(&victim).unwrap();
    let escape_name = d.path().join("escaped-by-dotdot");
    let depth = d.path().components().count() + 8;
    let dotdot = format!(
        "{}{}",
        "../".repeat(depth),
        escape_name.to_str().unwrap().trim_start_matches('/')
    );
    let dotdot: &'static str = Box::leak(dotdot.into_boxed_str());
    let victim_str: &'static str = Box::leak(victim.to_str().unwrap().to_owned().into_boxed_str());
    let cases: Vec<(&str, Vec<Entry>, &str)> = vec![
        ("dotdot", vec![Entry::File(dotdot, "pwned")], "'..'"),
        (
            "symlink-escape",
            vec![
                Entry::Symlink("evil", victim_str),
                Entry::File("evil/pwned", "pwned"),
            ],
            "symlink",
        ),
        (
            "hardlink-to-host",
            vec![Entry::HardLink("shadow", "/etc/shadow")],
            "not in this layer",
        ),
    ];
    for (what, entries, why) in cases {
        let archive = d.path().join(format!("{what}.tar"));
        docker_save(
            &archive,
            &[saved(
                &[&format!("evil/{what}:1")],
                vec![layer_tar(&entries)],
            )],
            None,
        );
        let out = image(&root, &["import", archive.to_str().unwrap()]);
        out.assert_agentrun_error();
        assert!(out.stderr().contains(why), "{what}: {out}");
        assert!(!escape_name.exists(), "{what}: a file escaped the store");
        assert_eq!(count_dirs(&victim), 0, "{what}: wrote through a symlink");
        image(&root, &["inspect", &format!("evil/{what}:1")]).assert_agentrun_error();
    }
    // A manifest naming a file outside the archive.
    let archive = d.path().join("outside.tar");
    docker_save(
        &archive,
        &[saved(
            &["evil/outside:1"],
            vec![layer_tar(&[Entry::File("a", "a")])],
        )],
        Some("../../../../etc/passwd"),
    );
    let out = image(&root, &["import", archive.to_str().unwrap()]);
    out.assert_agentrun_error();
    assert!(out.stderr().contains("outside the archive"), "{out}");
    // Device nodes are neutralised: the image imports, the node is not created.
    let archive = d.path().join("device.tar");
    docker_save(
        &archive,
        &[saved(
            &["evil/device:1"],
            vec![base_layer(), layer_tar(&[Entry::CharDevice("etc/mem")])],
        )],
        None,
    );
    image(&root, &["import", archive.to_str().unwrap()]).success();
    let out = run_in(
        &root,
        "evil/device:1",
        &["sh", "-c", "test -e /etc/mem && echo present; echo ok"],
    );
    assert_eq!(out.success(), "ok\n", "{out}");
    // Nothing half-imported stays behind; prune leaves only the device image's content.
    assert_eq!(count_dirs(&root.join("tmp")), 0);
    image(&root, &["prune"]).success();
    assert_eq!(count_dirs(&root.join("layers")), 2);
    // Not an archive at all.
    let junk = d.path().join("junk.tar");
    fs::write(&junk, "not a tar").unwrap();
    image(&root, &["import", junk.to_str().unwrap()]).assert_agentrun_error();
    image(&root, &["import", "/no/such/file.tar"]).assert_agentrun_error();
}

#[test]
fn a_running_sandbox_keeps_its_layers_through_rm_and_prune() {
    let Some(_l) = setup() else { return };
    let (d, root) = store_with_busybox();
    let ws = d.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    let mut running = exec_with(
        ["--image", "busybox", "--workspace", ws.to_str().unwrap()],
        [
            "sh",
            "-c",
            "touch /workspace/started; sleep 2; cat /etc/os-release | head -1",
        ],
    )
    .root(&root)
    .env("AGENTRUN_NO_DAEMON", "1")
    .spawn();
    // Once its command runs, remove the image under it.
    assert!(
        wait_until(Duration::from_secs(30), || ws
            .join("started")
            .exists()
            .then_some(()))
        .is_some(),
        "the sandbox never started\n{}",
        running.stderr_so_far()
    );
    image(&root, &["rm", "busybox"]).success();
    let out = image(&root, &["prune"]).success();
    assert!(out.contains("in use"), "{out}");
    assert_eq!(count_dirs(&root.join("layers")), 1);
    let out = running.wait_or_kill(Duration::from_secs(60));
    assert_eq!(out.success(), "NAME=\"agentrun busybox\"\n", "{out}");
    let out = image(&root, &["prune"]).success();
    assert!(out.contains("Removed 1 layer"), "{out}");
    assert_eq!(count_dirs(&root.join("layers")), 0);
}

#[test]
fn python_recipe_builds_an_image_that_runs_python() {
    let Some(_l) = setup() else { return };
    let d = tempdir();
    let root = d.path().join("root");
    let mut build = Command::new(workspace_root().join("images/python/build.sh"));
    build
        .arg("--import")
        .arg(d.path().join("rootfs"))
        .env("AGENTRUN_ROOT", &root)
        .env("AGENTRUN_BIN", agentrun_bin());
    let out = run_with_timeout(build, None, Duration::from_secs(900));
    assert_eq!(
        out.code(),
        0,
        "images/python/build.sh --import failed\n{out}"
    );
    let out = run_in(
        &root,
        "python",
        &[
            "python3",
            "-c",
            "import sys, json; print(json.dumps([sys.version_info[0], 6*7]))",
        ],
    );
    assert_eq!(out.success(), "[3, 42]\n", "{out}");
    // Its default command is python3, reading the program from stdin.
    let out = agentrun(["exec", "--image", "python"])
        .root(&root)
        .env("AGENTRUN_NO_DAEMON", "1")
        .stdin("print('from stdin')\n")
        .run();
    assert_eq!(out.success(), "from stdin\n", "{out}");
}

#[test]
fn pull_uses_credentials_from_the_docker_config() {
    let Some(_l) = setup() else { return };
    let (d, root) = store_with_busybox();
    let tar = d.path().join("busybox-oci.tar");
    image(&root, &["export", "busybox", "-o", tar.to_str().unwrap()]).success();
    let reg = Registry::start_with_auth("agent", "s3cret-pw");
    reg.push(
        &format!("oci-archive:{}", tar.display()),
        "private/bb:1",
        &["--dest-creds", "agent:s3cret-pw"],
    )
    .success();
    let r = format!("{}/private/bb:1", reg.host());
    let root2 = d.path().join("pulled");
    // No credentials: refused by the registry, a clear one-line error.
    let empty_config = d.path().join("no-docker-config");
    fs::create_dir_all(&empty_config).unwrap();
    let out = agentrun(["image", "pull", &r])
        .root(&root2)
        .env("DOCKER_CONFIG", &empty_config)
        .run();
    out.assert_agentrun_error();
    // Credentials in $DOCKER_CONFIG/config.json, as `docker login` writes them.
    let docker_config = d.path().join("docker-config");
    fs::create_dir_all(&docker_config).unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(b"agent:s3cret-pw");
    fs::write(
        docker_config.join("config.json"),
        format!(r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#, reg.host()),
    )
    .unwrap();
    let out = agentrun(["image", "pull", &r])
        .root(&root2)
        .env("DOCKER_CONFIG", &docker_config)
        .run();
    assert!(out.success().contains("Pulled"), "{out}");
    let out = run_in(&root2, &r, &["cat", "/etc/os-release"]);
    assert!(out.success().contains("agentrun busybox"), "{out}");
}

#[test]
fn docker_archives_written_by_skopeo_import() {
    let Some(_l) = setup() else { return };
    let (d, root) = store_with_busybox();
    let oci = d.path().join("busybox-oci.tar");
    image(&root, &["export", "busybox", "-o", oci.to_str().unwrap()]).success();
    // skopeo writes the `docker save` format (manifest.json + layer tars + config).
    let archive = d.path().join("docker-save.tar");
    let mut cmd = Command::new("skopeo");
    cmd.args(["copy", "--quiet"])
        .arg(format!("oci-archive:{}", oci.display()))
        .arg(format!(
            "docker-archive:{}:saved/busybox:7",
            archive.display()
        ));
    run_with_timeout(cmd, None, Duration::from_secs(120)).success();
    let root2 = d.path().join("root2");
    let out = image(&root2, &["import", archive.to_str().unwrap()]).success();
    assert!(out.contains("saved/busybox:7"), "{out}");
    let out = run_in(&root2, "saved/busybox:7", &["sh", "-c", "echo $FLAVOUR"]);
    assert_eq!(out.success(), "vanilla\n", "{out}");
}

/// An OCI layout directory whose index points at an image index with an arm64 image first
/// (FLAVOUR=arm64) and the amd64 one second (FLAVOUR=vanilla), as Docker Hub serves
/// multi-platform images.
fn multi_platform_layout(single: &Path, dir: &Path) {
    use sha2::{Digest, Sha256};
    let mut cmd = Command::new("tar");
    cmd.arg("-xf").arg(single).arg("-C").arg(dir);
    fs::create_dir_all(dir).unwrap();
    run_with_timeout(cmd, None, Duration::from_secs(60)).success();
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("index.json")).unwrap()).unwrap();
    let amd64 = index["manifests"][0].clone();
    let blob = |d: &serde_json::Value| dir.join("blobs/sha256").join(&d.as_str().unwrap()[7..]);
    let put = |bytes: &[u8]| -> String {
        let hex: String = Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        fs::write(dir.join("blobs/sha256").join(&hex), bytes).unwrap();
        format!("sha256:{hex}")
    };
    // An arm64 variant: same layers, its own config (FLAVOUR=arm64) and manifest.
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(blob(&amd64["digest"])).unwrap()).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&fs::read(blob(&manifest["config"]["digest"])).unwrap()).unwrap();
    config["architecture"] = "arm64".into();
    config["config"]["Env"] = serde_json::json!(["FLAVOUR=arm64", "PATH=/bin"]);
    let config_bytes = serde_json::to_vec(&config).unwrap();
    manifest["config"]["digest"] = put(&config_bytes).into();
    manifest["config"]["size"] = config_bytes.len().into();
    let manifest_bytes = serde_json::to_vec(&manifest).unwrap();
    let arm64 = serde_json::json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": put(&manifest_bytes),
        "size": manifest_bytes.len(),
        "platform": {"architecture": "arm64", "os": "linux"},
    });
    let inner = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [arm64, {
            "mediaType": amd64["mediaType"], "digest": amd64["digest"], "size": amd64["size"],
            "platform": {"architecture": "amd64", "os": "linux"},
        }],
    });
    let bytes = serde_json::to_vec(&inner).unwrap();
    let inner_digest = put(&bytes);
    let outer = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": inner_digest,
            "size": bytes.len(),
            "annotations": {"io.containerd.image.name": "docker.io/multi/arch:1", "org.opencontainers.image.ref.name": "1"},
        }],
    });
    fs::write(dir.join("index.json"), serde_json::to_vec(&outer).unwrap()).unwrap();
}

#[test]
fn multi_platform_indexes_resolve_to_linux_amd64_in_imports_and_pulls() {
    let Some(_l) = setup() else { return };
    let (d, root) = store_with_busybox();
    let tar = d.path().join("busybox-oci.tar");
    image(&root, &["export", "busybox", "-o", tar.to_str().unwrap()]).success();
    let layout = d.path().join("layout");
    multi_platform_layout(&tar, &layout);
    // An OCI layout directory (not a tar) with a nested index.
    let root2 = d.path().join("imported");
    let out = image(&root2, &["import", layout.to_str().unwrap()]).success();
    assert!(out.contains("multi/arch:1"), "{out}");
    let out = run_in(&root2, "multi/arch:1", &["sh", "-c", "echo $FLAVOUR"]);
    assert_eq!(out.success(), "vanilla\n", "{out}");
    // The same index served by a registry (skopeo pushes the list as it is).
    let reg = Registry::start();
    let mut cmd = Command::new("skopeo");
    cmd.args([
        "copy",
        "--quiet",
        "--multi-arch",
        "all",
        "--dest-tls-verify=false",
    ])
    .arg(format!("oci:{}", layout.display()))
    .arg(format!("docker://{}/multi/arch:1", reg.host()));
    run_with_timeout(cmd, None, Duration::from_secs(120)).success();
    let root3 = d.path().join("pulled");
    let r = format!("{}/multi/arch:1", reg.host());
    image(&root3, &["pull", &r]).success();
    let out = run_in(&root3, &r, &["sh", "-c", "echo $FLAVOUR"]);
    assert_eq!(out.success(), "vanilla\n", "{out}");
}
