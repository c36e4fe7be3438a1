//! Hostile archives against the image store's unpack limits, through the real binary:
//! a gzip bomb and a zstd bomb (8 GiB of zeros each, from archives of a few MiB), 100,000 tiny
//! entries, whiteouts that name their own directory or its parent, and a build context bomb
//! sent to the Docker API, with the limits set by flag, by environment variable and by
//! `agentrun serve --config`. Each refusal is one line naming the limit and how to raise it,
//! and leaves nothing in the store. Root required.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentrun_e2e::images::{append_file, docker_save, layer_tar, sha256, Entry, SavedImage};
use agentrun_e2e::*;

/// What the bombs expand to.
const BOMB_SIZE: u64 = 8 << 30;

fn image(root: &Path, args: &[&str]) -> Agentrun {
    let mut a = vec!["image"];
    a.extend_from_slice(args);
    agentrun(a).root(root).timeout(Duration::from_secs(300))
}

/// A tar header for a regular file `name` of `size` bytes.
fn file_header(name: &str, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_path(name).unwrap();
    h.set_mode(0o644);
    h.set_size(size);
    h.set_cksum();
    h.as_bytes().to_vec()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A gzip stream of a tar holding one file of `size` zero bytes: gzip members concatenated
/// (as `cat a.gz b.gz` makes), each MiB of zeros ~1 KiB.
fn gzip_bomb(size: u64) -> Vec<u8> {
    let mib = gzip(&vec![0u8; 1 << 20]);
    let mut out = gzip(&file_header("zeros", size));
    for _ in 0..size >> 20 {
        out.extend_from_slice(&mib);
    }
    out.extend_from_slice(&gzip(&[0u8; 1024]));
    out
}

/// A zstd frame of a tar holding one file of `size` zero bytes: the header in a raw block,
/// the zeros in RLE blocks (4 bytes per 128 KiB). Written by hand: no zstd encoder needed.
fn zstd_bomb(size: u64) -> Vec<u8> {
    // Magic, frame header descriptor (no content size, no checksum), 1 MiB window.
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x50];
    let block = |f: &mut Vec<u8>, last: bool, kind: u32, len: u64| {
        let h = u32::from(last) | (kind << 1) | ((len as u32) << 3);
        f.extend_from_slice(&h.to_le_bytes()[..3]);
    };
    let header = file_header("zeros", size);
    block(&mut f, false, 0, header.len() as u64);
    f.extend_from_slice(&header);
    let mut left = size + 1024;
    while left > 0 {
        let n = left.min(128 << 10);
        left -= n;
        block(&mut f, left == 0, 1, n);
        f.push(0);
    }
    f
}

/// A `docker save` archive of one image whose one layer is `layer` (stored as it is; the
/// config's diff id is made up: the unpacker refuses the bomb before it could check it).
fn save_with_layer(path: &Path, tag: &str, layer: &[u8]) {
    let mut b = tar::Builder::new(Vec::new());
    let add = append_file;
    let layer_name = format!("{}/layer.tar", &sha256(layer)[7..]);
    add(&mut b, &layer_name, layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [sha256(b"made up")]},
    }))
    .unwrap();
    let config_name = format!("{}.json", &sha256(&config)[7..]);
    add(&mut b, &config_name, &config);
    let manifest = serde_json::json!([{
        "Config": config_name, "RepoTags": [tag], "Layers": [layer_name],
    }]);
    add(
        &mut b,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    fs::write(path, b.into_inner().unwrap()).unwrap();
}

/// An OCI image layout tar of one image whose one layer is `layer` (zstd media type).
fn oci_layout_with_layer(path: &Path, name: &str, layer: &[u8]) {
    let mut b = tar::Builder::new(Vec::new());
    let add = append_file;
    let blob = |b: &mut tar::Builder<Vec<u8>>, data: &[u8]| {
        let d = sha256(data);
        add(b, &format!("blobs/sha256/{}", &d[7..]), data);
        d
    };
    add(&mut b, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    let layer_digest = blob(&mut b, layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [sha256(b"made up")]},
    }))
    .unwrap();
    let config_digest = blob(&mut b, &config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd",
                    "digest": layer_digest, "size": layer.len()}],
    }))
    .unwrap();
    let manifest_digest = blob(&mut b, &manifest);
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest_digest, "size": manifest.len(),
                       "annotations": {"io.containerd.image.name": name}}],
    }))
    .unwrap();
    add(&mut b, "index.json", &index);
    fs::write(path, b.into_inner().unwrap()).unwrap();
}

fn count(p: &Path) -> usize {
    fs::read_dir(p).map(|r| r.count()).unwrap_or(0)
}

/// Nothing of a refused import is in the store: no image, blob, layer or temporary file.
fn assert_store_empty(root: &Path) {
    for d in ["records", "blobs/sha256", "layers", "tmp"] {
        assert_eq!(count(&root.join(d)), 0, "{d} is not empty");
    }
    let ls = image(root, &["ls", "-q"]).run();
    assert_eq!(ls.success(), "", "{ls}");
}

/// A refusal: exit 125, one line naming `limit` and how to raise it.
fn assert_refused(out: &RunOutput, limit: &str, flag: &str, env: &str) {
    out.assert_agentrun_error();
    let err = out.stderr();
    assert!(err.contains(&format!("over {limit}")), "{out}");
    assert!(err.contains(flag) && err.contains(env), "{out}");
}

#[test]
fn gzip_and_zstd_bombs_are_refused_in_one_line_and_leave_nothing_behind() {
    let Some(_l) = setup() else { return };
    let d = tempdir();
    let root = d.path().join("root");
    let gz = d.path().join("gzip-bomb.tar");
    let bomb = gzip_bomb(BOMB_SIZE);
    assert!(bomb.len() < 16 << 20, "{}", bomb.len());
    save_with_layer(&gz, "bomb/gzip:1", &bomb);
    let zst = d.path().join("zstd-bomb.tar");
    let bomb = zstd_bomb(BOMB_SIZE);
    assert!(bomb.len() < 1 << 20, "{}", bomb.len());
    oci_layout_with_layer(&zst, "docker.io/bomb/zstd:1", &bomb);

    // Default limits: the expansion ratio stops both after 64 MiB.
    for archive in [&gz, &zst] {
        let t0 = Instant::now();
        let out = image(&root, &["import", archive.to_str().unwrap()]).run();
        assert_refused(&out, "max_ratio", "--max-ratio", "AGENTRUN_IMAGE_MAX_RATIO");
        assert!(out.stderr().contains("decompression bomb"), "{out}");
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{:?}",
            t0.elapsed()
        );
        assert_store_empty(&root);
    }
    // Ratio off (flag): the byte limit (flag) stops the gzip bomb.
    let out = image(
        &root,
        &[
            "import",
            "--max-ratio",
            "0",
            "--max-bytes",
            "256M",
            gz.to_str().unwrap(),
        ],
    )
    .run();
    assert_refused(&out, "max_bytes", "--max-bytes", "AGENTRUN_IMAGE_MAX_BYTES");
    assert!(out.stderr().contains("256.0 MiB"), "{out}");
    assert_store_empty(&root);
    // The same through the environment, for the zstd bomb.
    let out = image(&root, &["import", zst.to_str().unwrap()])
        .env("AGENTRUN_IMAGE_MAX_RATIO", "0")
        .env("AGENTRUN_IMAGE_MAX_BYTES", "128M")
        .run();
    assert_refused(&out, "max_bytes", "--max-bytes", "AGENTRUN_IMAGE_MAX_BYTES");
    assert!(out.stderr().contains("128.0 MiB"), "{out}");
    assert_store_empty(&root);
    // A bad value is refused before anything is read.
    let out = image(&root, &["import", zst.to_str().unwrap()])
        .env("AGENTRUN_IMAGE_MAX_RATIO", "lots")
        .run();
    out.assert_agentrun_error();
    assert!(out.stderr().contains("AGENTRUN_IMAGE_MAX_RATIO"), "{out}");
}

#[test]
fn add_of_a_gzip_bomb_in_a_build_context_is_refused() {
    let Some(_l) = setup() else { return };
    let d = tempdir();
    let root = d.path().join("root");
    let ctx = d.path().join("ctx");
    fs::create_dir_all(&ctx).unwrap();
    fs::write(
        ctx.join("Dockerfile"),
        "FROM scratch\nADD bomb.tar.gz /opt/\n",
    )
    .unwrap();
    fs::write(ctx.join("bomb.tar.gz"), gzip_bomb(BOMB_SIZE)).unwrap();
    let t0 = Instant::now();
    let out = image(&root, &["build", "-t", "bomb:add", ctx.to_str().unwrap()]).run();
    assert_ne!(out.status.code(), Some(0), "{out}");
    let err = out.stderr();
    assert!(
        err.contains("bomb.tar.gz: expands more than 100 times") && err.contains("over max_ratio"),
        "{out}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(120),
        "{:?}",
        t0.elapsed()
    );
    image(&root, &["inspect", "bomb:add"])
        .run()
        .assert_agentrun_error();
    assert_store_empty(&root);
}

#[test]
fn a_hundred_thousand_tiny_entries_import_under_the_default_and_not_over_max_entries() {
    let Some(_l) = setup() else { return };
    let d = tempdir();
    let root = d.path().join("root");
    let mut b = tar::Builder::new(Vec::new());
    for dir in 0..100 {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, format!("d{dir}"), &[][..]).unwrap();
        for i in 0..999 {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(0);
            b.append_data(&mut h, format!("d{dir}/f{i}"), &[][..])
                .unwrap();
        }
    }
    let layer = b.into_inner().unwrap();
    let archive = d.path().join("many.tar");
    docker_save(
        &archive,
        &[SavedImage {
            repo_tags: vec!["many/entries:1".into()],
            layers: vec![layer],
            cmd: vec!["/bin/sh".into()],
            env: vec![],
        }],
        None,
    );
    let out = image(&root, &["import", archive.to_str().unwrap()])
        .env("AGENTRUN_IMAGE_MAX_ENTRIES", "50000")
        .run();
    assert_refused(
        &out,
        "max_entries",
        "--max-entries",
        "AGENTRUN_IMAGE_MAX_ENTRIES",
    );
    assert!(out.stderr().contains("more than 50000 entries"), "{out}");
    assert_store_empty(&root);
    // The default (1,000,000) takes a large but ordinary image.
    let out = image(&root, &["import", archive.to_str().unwrap()]).run();
    assert!(out.success().contains("many/entries:1"), "{out}");
    let layers = root.join("layers");
    let layer = fs::read_dir(&layers)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(count(&layer.join("fs")), 100);
    assert_eq!(count(&layer.join("fs/d99")), 999);
}

#[test]
fn whiteouts_naming_their_own_directory_or_its_parent_are_refused() {
    let Some(_l) = setup() else { return };
    let d = tempdir();
    let root = d.path().join("root");
    for (what, bad) in [
        ("dot", "keep/.wh.."),
        ("dotdot", "keep/.wh..."),
        ("empty", "keep/.wh."),
        ("top-dotdot", ".wh..."),
    ] {
        let archive = d.path().join(format!("{what}.tar"));
        docker_save(
            &archive,
            &[SavedImage {
                repo_tags: vec![format!("evil/whiteout-{what}:1")],
                layers: vec![layer_tar(&[
                    Entry::Dir("keep/"),
                    Entry::File("keep/file", "kept\n"),
                    Entry::File(bad, ""),
                ])],
                cmd: vec!["/bin/sh".into()],
                env: vec![],
            }],
            None,
        );
        let out = image(&root, &["import", archive.to_str().unwrap()]).run();
        out.assert_agentrun_error();
        assert!(
            out.stderr()
                .contains("does not name an entry of its directory"),
            "{what}: {out}"
        );
        assert_store_empty(&root);
    }
}

/// One HTTP/1.1 request with a body on a unix socket; the whole response.
fn post(socket: &Path, path: &str, body: &[u8]) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/x-tar\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn docker_build_contexts_are_unpacked_under_the_serve_config_limits() {
    let Some(_l) = setup_exclusive() else { return };
    let dir = tempdir();
    let root: PathBuf = dir.path().join("root");
    let config = dir.path().join("serve.toml");
    fs::write(&config, "[image_limits]\nmax_entries = 500\n").unwrap();
    let mut daemon = Daemon::unstarted().with_env("AGENTRUN_ROOT", &root);
    let socket = daemon.state().join("docker.sock");
    daemon.launch([
        "--pool-size".as_ref(),
        "1".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
        "--docker-socket".as_ref(),
        socket.as_os_str(),
    ]);
    // A gzip bomb as the context: the daemon refuses it by its expansion ratio while it
    // arrives (400, before any build output), and the client still reads the answer.
    let reply = post(&socket, "/v1.44/build?t=bomb:1", &gzip_bomb(BOMB_SIZE));
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(
        reply.contains("build context: expands more than 100 times"),
        "{reply}"
    );
    assert!(reply.contains("image_limits.max_ratio"), "{reply}");
    // 1000 files: over the config's max_entries.
    let mut b = tar::Builder::new(Vec::new());
    for i in 0..1000 {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(0);
        b.append_data(&mut h, format!("f{i}"), &[][..]).unwrap();
    }
    let reply = post(&socket, "/v1.44/build?t=many:1", &b.into_inner().unwrap());
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(
        reply.contains("build context: has more than 500 entries, over max_entries"),
        "{reply}"
    );
    // Nothing was left in the daemon's scratch space or the store.
    assert_eq!(count(&daemon.state().join("docker-tmp")), 0);
    assert_eq!(count(&root.join("layers")), 0);
    drop(daemon);
}
