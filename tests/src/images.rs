//! Image test fixtures: `docker save` style archives built entry by entry (so tests control
//! whiteouts and hostile entries), a Docker registry on loopback (Debian's `docker-registry`),
//! and a private containerd (own socket, root and state dirs). Servers stop on drop.

use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::{run_with_timeout, wait_until, RunOutput};

/// One entry of a layer tar.
#[derive(Clone, Debug)]
pub enum Entry {
    Dir(&'static str),
    File(&'static str, &'static str),
    Symlink(&'static str, &'static str),
    HardLink(&'static str, &'static str),
    CharDevice(&'static str),
}

/// A layer tarball (uncompressed) made of `entries`, paths written raw: `..` survives.
pub fn layer_tar(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let (kind, path, data, link): (tar::EntryType, &str, &str, Option<&str>) = match *e {
            Entry::Dir(p) => (tar::EntryType::Directory, p, "", None),
            Entry::File(p, d) => (tar::EntryType::Regular, p, d, None),
            Entry::Symlink(p, t) => (tar::EntryType::Symlink, p, "", Some(t)),
            Entry::HardLink(p, t) => (tar::EntryType::Link, p, "", Some(t)),
            Entry::CharDevice(p) => (tar::EntryType::Char, p, "", None),
        };
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        let name = &mut h.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(t) = link {
            h.set_link_name(t).unwrap();
        }
        if kind == tar::EntryType::Char {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        b.append(&h, data.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Appends a regular file `name` (mode 0644) holding `data` to an archive being built.
pub fn append_file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_path(name).unwrap();
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// An image for a `docker save` archive.
pub struct SavedImage {
    pub repo_tags: Vec<String>,
    pub layers: Vec<Vec<u8>>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
}

/// Writes a `docker save` tar (manifest.json, <id>.json configs, <hex>/layer.tar) holding
/// `images`; layers with the same content are written once, as docker does. `layer_path`
/// overrides the path manifest.json names for a layer (hostile-archive tests).
pub fn docker_save(path: &Path, images: &[SavedImage], layer_path: Option<&str>) {
    let mut b = tar::Builder::new(Vec::new());
    let mut written = std::collections::BTreeSet::new();
    let mut manifest = Vec::new();
    let add = append_file;
    for img in images {
        let diff_ids: Vec<String> = img.layers.iter().map(|l| sha256(l)).collect();
        let mut layer_names = Vec::new();
        for (l, d) in img.layers.iter().zip(&diff_ids) {
            let name = format!("{}/layer.tar", &d[7..]);
            if written.insert(name.clone()) {
                add(&mut b, &name, l);
            }
            layer_names.push(layer_path.map(str::to_owned).unwrap_or(name));
        }
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": img.cmd, "Env": img.env},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let config = serde_json::to_vec(&config).unwrap();
        let config_name = format!("{}.json", &sha256(&config)[7..]);
        add(&mut b, &config_name, &config);
        manifest.push(serde_json::json!({
            "Config": config_name,
            "RepoTags": img.repo_tags,
            "Layers": layer_names,
        }));
    }
    add(
        &mut b,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    fs::write(path, b.into_inner().unwrap()).unwrap();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().unwrap(),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// Debian's `docker-registry` (distribution) serving on 127.0.0.1, storage in a temp dir.
pub struct Registry {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        Self::start_with(None)
    }

    /// A registry that wants HTTP basic auth for `user`/`password` (htpasswd, bcrypt).
    pub fn start_with_auth(user: &str, password: &str) -> Registry {
        Self::start_with(Some((user, password)))
    }

    fn start_with(auth: Option<(&str, &str)>) -> Registry {
        let dir = crate::tempdir();
        let port = free_port();
        let config = dir.path().join("config.yml");
        let mut yml = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        if let Some((user, password)) = auth {
            let mut cmd = Command::new("htpasswd");
            cmd.args(["-Bbn", user, password]);
            let out = run_with_timeout(cmd, None, Duration::from_secs(30));
            let htpasswd = dir.path().join("htpasswd");
            fs::write(&htpasswd, out.success().trim()).unwrap();
            yml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: agentrun-e2e\n    path: {}\n",
                htpasswd.display()
            ));
        }
        fs::write(&config, yml).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .expect("start docker-registry (apt-get install docker-registry; hack/test does)");
        let reg = Registry {
            child,
            port,
            _dir: dir,
        };
        assert!(
            wait_until(Duration::from_secs(20), || port_open(port).then_some(())).is_some(),
            "docker-registry did not listen on 127.0.0.1:{port}"
        );
        reg
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `skopeo copy SRC docker://<registry>/<name>` (plain HTTP), extra flags first (e.g.
    /// `--dest-creds user:pass`).
    pub fn push(&self, src: &str, name: &str, flags: &[&str]) -> RunOutput {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--quiet", "--dest-tls-verify=false"]);
        cmd.args(flags);
        cmd.arg(src);
        cmd.arg(format!("docker://{}/{name}", self.host()));
        run_with_timeout(cmd, None, Duration::from_secs(120))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A containerd of its own: socket, root and state under a temp dir; CRI disabled.
pub struct Containerd {
    child: Child,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
}

impl Containerd {
    pub fn start() -> Containerd {
        let dir = crate::tempdir();
        let socket = dir.path().join("containerd.sock");
        let config = dir.path().join("config.toml");
        let mut f = fs::File::create(&config).unwrap();
        write!(
            f,
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n",
            root = dir.path().join("root").display(),
            state = dir.path().join("state").display(),
            sock = socket.display(),
        )
        .unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .expect("start containerd (apt-get install containerd; hack/test does)");
        let c = Containerd { child, dir, socket };
        let up = wait_until(Duration::from_secs(30), || {
            (c.ctr(&["version"]).status.code() == Some(0)).then_some(())
        });
        assert!(up.is_some(), "containerd did not come up\n{}", c.log());
        c
    }

    /// `ctr -a SOCK -n agentrun-e2e ARGS`.
    pub fn ctr(&self, args: &[&str]) -> RunOutput {
        let mut cmd = Command::new("ctr");
        cmd.arg("-a").arg(&self.socket).args(["-n", "agentrun-e2e"]);
        cmd.args(args);
        run_with_timeout(cmd, None, Duration::from_secs(120))
    }

    /// `ctr ... run ARGS` (`args` without the `run`), 120 s at most; its stdout and stderr are
    /// the container's, complete ([`crate::ctr`]: ctr's own stdout can lose the tail).
    pub fn run(&self, args: &[&str]) -> RunOutput {
        let mut cmd = Command::new("ctr");
        cmd.arg("-a").arg(&self.socket).args(["-n", "agentrun-e2e"]);
        let mut a = vec![std::ffi::OsStr::new("run")];
        a.extend(args.iter().map(std::ffi::OsStr::new));
        crate::ctr::run(cmd, &a, Duration::from_secs(120))
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let stopped = wait_until(Duration::from_secs(10), || {
            self.child.try_wait().ok().flatten()
        });
        if stopped.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // containerd leaves its snapshot mounts and shims' dirs: unmount what is under us.
        let base = self.dir.path().to_string_lossy().into_owned();
        if let Ok(mi) = fs::read_to_string("/proc/self/mountinfo") {
            let mut points: Vec<&str> = mi
                .lines()
                .filter_map(|l| l.split_whitespace().nth(4))
                .filter(|p| p.starts_with(&base))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                let c = std::ffi::CString::new(p).unwrap();
                // SAFETY: unmounting a path under our own temp dir.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// A fresh image store under `dir` (`dir/root`, returned) holding the busybox image built by
/// `images/busybox/build.sh` and added as `busybox` with `add_args` (e.g. `--cmd /bin/sh`).
pub fn busybox_store(dir: &Path, add_args: &[&str]) -> PathBuf {
    let rootfs = dir.join("rootfs");
    let mut build = Command::new(crate::workspace_root().join("images/busybox/build.sh"));
    build.arg(&rootfs);
    run_with_timeout(build, None, Duration::from_secs(120)).success();
    let root = dir.join("root");
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["image".as_ref(), "add".as_ref(), "busybox".as_ref()];
    args.push(rootfs.as_os_str());
    args.extend(add_args.iter().map(|a| std::ffi::OsStr::new(*a)));
    crate::agentrun(args).root(&root).run().success();
    fs::remove_dir_all(&rootfs).unwrap();
    root
}

/// `agentrun exec --image IMG -- CMD...` on the cold path, over the store at `root`.
pub fn run_in(root: &Path, img: &str, cmd: &[&str]) -> RunOutput {
    crate::exec_with(["--image", img], cmd)
        .root(root)
        .env("AGENTRUN_NO_DAEMON", "1")
        .run()
}

/// Adds to the store at `root` an image `name` made from the busybox rootfs (built under
/// `dir`) after `mutate` changed it: for images a test needs hostile or odd (a `/tmp` that
/// links to `/`, a setuid binary).
pub fn busybox_variant(dir: &Path, root: &Path, name: &str, mutate: impl FnOnce(&Path)) {
    let rootfs = dir.join(format!("{name}-rootfs"));
    let mut build = Command::new(crate::workspace_root().join("images/busybox/build.sh"));
    build.arg(&rootfs);
    run_with_timeout(build, None, Duration::from_secs(120)).success();
    mutate(&rootfs);
    let args: Vec<&std::ffi::OsStr> = vec![
        "image".as_ref(),
        "add".as_ref(),
        name.as_ref(),
        rootfs.as_os_str(),
    ];
    crate::agentrun(args)
        .root(root)
        .timeout(Duration::from_secs(120))
        .run()
        .success();
    fs::remove_dir_all(&rootfs).unwrap();
}

/// Adds `name` to the store at `root`: the host's own Python 3 (/usr/bin/python3.11, its
/// standard library, Debian's pip and the shared libraries they load) copied into a rootfs at
/// `rootfs` (removed afterwards) and added with `agentrun image add` (CMD python3, WORKDIR
/// /workspace): a Python image for the Docker API's tests, made offline.
pub fn host_python_image(rootfs: &Path, root: &Path, name: &str) {
    host_python_rootfs(rootfs);
    crate::agentrun([
        "image".as_ref(),
        "add".as_ref(),
        name.as_ref(),
        rootfs.as_os_str(),
        "--cmd".as_ref(),
        "python3".as_ref(),
        "--workdir".as_ref(),
        "/workspace".as_ref(),
    ])
    .root(root)
    .run()
    .success();
    fs::remove_dir_all(rootfs).unwrap();
}

/// The rootfs of [`host_python_image`] (the host's Python 3 and what it loads), at `rootfs`.
pub fn host_python_rootfs(rootfs: &Path) {
    let script = r#"
set -euo pipefail
r=$1
mkdir -p "$r/usr/bin" "$r/usr/lib/python3/dist-packages" "$r/etc" "$r/tmp" "$r/workspace"
chmod 1777 "$r/tmp"
ln -s usr/bin "$r/bin"; ln -s usr/lib "$r/lib"; mkdir -p "$r/usr/lib64"; ln -s usr/lib64 "$r/lib64"
cp -a /usr/bin/python3.11 /usr/bin/pip "$r/usr/bin/"
ln -s python3.11 "$r/usr/bin/python3"; ln -s python3.11 "$r/usr/bin/python"
cp -a /usr/lib/python3.11 "$r/usr/lib/"
# Debian's PEP 668 marker: the tool's image (python:3.12-alpine) has none, pip installs there.
rm -f "$r/usr/lib/python3.11/EXTERNALLY-MANAGED"
cp -a /usr/lib/python3/dist-packages/pip "$r/usr/lib/python3/dist-packages/"
cp -a /etc/ld.so.cache "$r/etc/"
mkdir -p "$r/etc/ssl/certs"; cp -L /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
printf 'root:x:0:\n' >"$r/etc/group"
for f in /usr/bin/python3.11 /usr/lib/python3.11/lib-dynload/*.so; do ldd "$f"; done |
    awk '/=> \//{ print $3 } /^\t\/.*ld-linux/{ print $1 }' | sort -u |
    while read -r lib; do
        real=$(readlink -f "$lib")
        for p in "$lib" "$real"; do
            p=${p#/usr}
            mkdir -p "$r/usr$(dirname "$p")"
            cp -an "/usr$p" "$r/usr$p" 2>/dev/null || cp -an "$p" "$r/usr$p"
        done
    done
"#;
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(script).arg("bash").arg(rootfs);
    run_with_timeout(cmd, None, Duration::from_secs(120)).success();
}
