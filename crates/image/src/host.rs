//! The built-in `host` image: a read-only view of the host's programs with a synthesized `/etc`.
//!
//! The rootfs holds only what is safe to show a sandbox: mount points, symlinks that mirror the
//! host's merged-/usr layout, and an `/etc` made of generated files (`passwd`, `group`, `hosts`,
//! `resolv.conf`, ...) plus an allowlist of public host files the dynamic linker and common
//! runtimes need (`ld.so.cache`, `alternatives/`, CA certificates, ...). The host's `/usr` (and
//! any of `/bin`, `/sbin`, `/lib*` that are real directories) is bind-mounted read-only on top.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::{HostBind, Image, ImageConfig, ImageError};

/// Bumped whenever the synthesized layout changes, so old caches are rebuilt.
const LAYOUT_VERSION: u32 = 3;

/// Top-level host directories that carry programs and libraries.
const PROGRAM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Public `/etc` entries copied from the host when present (never credentials or keys).
const ETC_ALLOWLIST: &[&str] = &[
    "alternatives",
    "ca-certificates.conf",
    "debian_version",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    // Debian's matplotlib reads its defaults from here: without it `import matplotlib` fails.
    "matplotlibrc",
    "mime.types",
    "os-release",
    "protocols",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "timezone",
    "bash.bashrc",
    "profile",
    // Debian's and Ubuntu's OpenJDK keep their configuration here (`java.security`,
    // `jvm.cfg`, ...): without it every JVM stops at start ("Error loading java.security
    // file"). A JMX password file is owner-only, so never copied (copy_public).
    "java-11-openjdk",
    "java-17-openjdk",
    "java-21-openjdk",
    "java-25-openjdk",
];

/// Generated `/etc` files: (path, mode, contents).
const ETC_GENERATED: &[(&str, u32, &str)] = &[
    (
        "passwd",
        0o644,
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    ),
    ("group", 0o644, "root:x:0:\nnogroup:x:65534:\n"),
    ("hostname", 0o644, "sandbox\n"),
    (
        "hosts",
        0o644,
        "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    ),
    (
        "resolv.conf",
        0o644,
        "# agentrun: this sandbox has no network\n",
    ),
    (
        "nsswitch.conf",
        0o644,
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
    ),
];

/// Resolves the `host` image, (re)building its small rootfs under `dir` when missing or stale.
pub fn ensure(dir: &Path) -> Result<Image, ImageError> {
    let rootfs = dir.join("rootfs");
    let stamp = dir.join("layout");
    let want = stamp_value();
    let current = || fs::read_to_string(&stamp).ok();
    if current().as_deref() != Some(want.as_str()) {
        // Concurrent first runs: one builds, the others wait and then see its stamp.
        fs::create_dir_all(dir).map_err(ImageError::io("create", dir))?;
        let lock_path = dir.join("lock");
        let lock_file =
            fs::File::create(&lock_path).map_err(ImageError::io("create", &lock_path))?;
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| ImageError::io("lock", &lock_path)(e.into()))?;
        if current().as_deref() != Some(want.as_str()) {
            build(dir, &want)?;
        }
    }
    Ok(Image {
        name: "host".into(),
        id: String::new(),
        layers: vec![rootfs],
        host_binds: host_binds(),
        config: ImageConfig::default(),
    })
}

/// The stamp records the layout version and the host's linker cache, so an updated host
/// rebuilds the copy of `/etc` on next use.
fn stamp_value() -> String {
    let cache = fs::metadata("/etc/ld.so.cache")
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{LAYOUT_VERSION} {cache}\n")
}

/// The host directories bound into the sandbox: each program dir that is a real directory.
fn host_binds() -> Vec<HostBind> {
    PROGRAM_DIRS
        .iter()
        .map(|d| Path::new("/").join(d))
        .filter(|p| fs::symlink_metadata(p).map(|m| m.is_dir()).unwrap_or(false))
        .map(|p| HostBind {
            target: p.clone(),
            source: p,
        })
        .collect()
}

/// Builds the rootfs in a temporary directory and renames it into place, so concurrent users
/// never see a half-built image.
fn build(dir: &Path, stamp: &str) -> Result<(), ImageError> {
    fs::create_dir_all(dir).map_err(ImageError::io("create", dir))?;
    let tmp = dir.join(format!("rootfs.tmp.{}", std::process::id()));
    // A leftover of a build that died; absent is the usual case.
    let _ = fs::remove_dir_all(&tmp);
    populate(&tmp)?;
    let rootfs = dir.join("rootfs");
    if rootfs.exists() {
        // Running sandboxes and pooled shells have the old tree bound as their lower layer:
        // move it aside under a name of its own, never empty it under them.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let old = dir.join(format!("{OLD_TREE}{}.{nanos}", std::process::id()));
        fs::rename(&rootfs, &old).map_err(ImageError::io("rename", &rootfs))?;
    }
    fs::rename(&tmp, &rootfs).map_err(ImageError::io("rename", &tmp))?;
    remove_unused_old_trees(dir);
    fs::write(dir.join("layout"), stamp).map_err(ImageError::io("write", dir.join("layout")))
}

/// The name prefix of a tree an update moved aside.
const OLD_TREE: &str = "rootfs.old.";

/// Removes the trees earlier builds moved aside that no mount uses any more, in any mount
/// namespace (a daemon's shells bind the tree in the daemon's). One still mounted stays for a
/// later build (or `agentrun gc`) to remove. Best effort: a tree that cannot be checked stays.
pub(crate) fn remove_unused_old_trees(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let old: Vec<_> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(OLD_TREE))
        .collect();
    if old.is_empty() {
        return;
    }
    let Some(mounts) = all_mounts() else {
        return;
    };
    let Some(dir_name) = dir.file_name() else {
        return;
    };
    for entry in old {
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let dev = format!(
            "{}:{}",
            nix::sys::stat::major(meta.dev()),
            nix::sys::stat::minor(meta.dev())
        );
        // A mount of the tree (or of anything in it) has a root on the same device whose path
        // goes through `<image dir>/<tree>`; a false match only keeps a tree.
        let name = entry.file_name();
        let in_use = mounts.iter().any(|(majmin, root)| {
            *majmin == dev
                && root
                    .components()
                    .collect::<Vec<_>>()
                    .windows(2)
                    .any(|w| w[0].as_os_str() == dir_name && w[1].as_os_str() == name)
        });
        if !in_use {
            // An old, unused rootfs: what cannot be removed now is tried again at the next build.
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// (device, root) of every mount of every mount namespace on the host; `None` if this
/// process cannot read them all (then nothing is removed).
fn all_mounts() -> Option<Vec<(String, std::path::PathBuf)>> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for proc in procfs::process::all_processes().ok()?.flatten() {
        // A process that exits meanwhile is skipped; any other failure fails the check.
        let Ok(ns) = fs::metadata(format!("/proc/{}/ns/mnt", proc.pid)) else {
            continue;
        };
        if !seen.insert(ns.ino()) {
            continue;
        }
        match proc.mountinfo() {
            Ok(info) => out.extend(info.into_iter().map(|m| (m.majmin, m.root.into()))),
            Err(procfs::ProcError::NotFound(_)) => continue,
            Err(_) => return None,
        }
    }
    Some(out)
}

fn populate(root: &Path) -> Result<(), ImageError> {
    let mkdir = |rel: &str, mode: u32| -> Result<(), ImageError> {
        let p = root.join(rel);
        fs::create_dir_all(&p).map_err(ImageError::io("create", &p))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))
            .map_err(ImageError::io("chmod", &p))
    };
    mkdir("", 0o755)?;
    for d in [
        "proc",
        "sys",
        "dev",
        "run",
        "etc",
        "var",
        "var/lib",
        "var/cache",
        "opt",
        "mnt",
    ] {
        mkdir(d, 0o755)?;
    }
    mkdir("workspace", 0o755)?;
    mkdir("root", 0o700)?;
    mkdir("tmp", 0o1777)?;
    mkdir("var/tmp", 0o1777)?;
    // Mirror the host's layout: symlinks stay symlinks, directories become mount points.
    for d in PROGRAM_DIRS {
        let host = Path::new("/").join(d);
        let Ok(meta) = fs::symlink_metadata(&host) else {
            continue;
        };
        let target = root.join(d);
        if meta.file_type().is_symlink() {
            let link = fs::read_link(&host).map_err(ImageError::io("readlink", &host))?;
            symlink(&link, &target).map_err(ImageError::io("symlink", &target))?;
        } else if meta.is_dir() {
            mkdir(d, 0o755)?;
        }
    }
    for (rel, mode, text) in ETC_GENERATED {
        let p = root.join("etc").join(rel);
        fs::write(&p, text).map_err(ImageError::io("write", &p))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(*mode))
            .map_err(ImageError::io("chmod", &p))?;
    }
    for rel in ETC_ALLOWLIST {
        let src = Path::new("/etc").join(rel);
        if fs::symlink_metadata(&src).is_ok() {
            copy_public(&src, &root.join("etc").join(rel))?;
        }
    }
    Ok(())
}

/// Copies a file, symlink or directory tree of world-readable host files. Anything not
/// world-readable is skipped: the allowlist is for public files, and this keeps a key that
/// ends up in an allowed directory out of the image.
fn copy_public(src: &Path, dst: &Path) -> Result<(), ImageError> {
    let meta = fs::symlink_metadata(src).map_err(ImageError::io("stat", src))?;
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(ImageError::io("create", parent))?;
    }
    let ft = meta.file_type();
    if ft.is_symlink() {
        let link = fs::read_link(src).map_err(ImageError::io("readlink", src))?;
        symlink(&link, dst).map_err(ImageError::io("symlink", dst))?;
    } else if ft.is_dir() {
        if meta.permissions().mode() & 0o005 != 0o005 {
            return Ok(());
        }
        fs::create_dir_all(dst).map_err(ImageError::io("create", dst))?;
        for entry in fs::read_dir(src).map_err(ImageError::io("read", src))? {
            let entry = entry.map_err(ImageError::io("read", src))?;
            copy_public(&entry.path(), &dst.join(entry.file_name()))?;
        }
    } else if ft.is_file() && meta.permissions().mode() & 0o004 != 0 {
        fs::copy(src, dst).map_err(ImageError::io("copy", src))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_image_has_no_secrets_and_a_usable_etc() {
        let dir = std::env::temp_dir().join(format!("agentrun-host-image-{}", std::process::id()));
        let img = ensure(&dir).unwrap();
        let etc = img.layers[0].join("etc");
        assert!(etc.join("passwd").is_file());
        assert!(!etc.join("shadow").exists());
        assert!(!etc.join("ssl/private").exists());
        assert!(!etc.join("sudoers").exists());
        assert!(fs::read_dir(img.layers[0].join("root"))
            .unwrap()
            .next()
            .is_none());
        assert!(!img.layers[0].join("home").exists());
        assert!(img.host_binds.iter().any(|b| b.target == Path::new("/usr")));
        // A JVM's configuration, when the host has one (Debian's OpenJDK 17 here).
        if Path::new("/etc/java-17-openjdk/security/java.security").exists() {
            assert!(etc.join("java-17-openjdk/security/java.security").is_file());
        }
        // Idempotent: a second call keeps the same tree.
        let again = ensure(&dir).unwrap();
        assert_eq!(again, img);
        fs::remove_dir_all(&dir).unwrap();
    }
}
