//! The interception CA in a sandbox's *system* trust bundles, for clients that ignore
//! `SSL_CERT_FILE` and the like ([`crate::mitm::trust_env`]) and read the distribution's
//! default paths: Python's `ssl.create_default_context()` (OpenSSL's default `cert.pem`), curl
//! built with the system bundle, Go's `crypto/x509`, a process started with `env -i`.
//!
//! [`install_in_root`] appends the CA certificate (never its key) to each bundle of
//! [`SYSTEM_BUNDLES`] the sandbox's root has, resolving every path inside that root
//! (`openat2(RESOLVE_IN_ROOT)`, so an image's symlinks never lead out of it), and writes the
//! result through the root's overlay: the copy lands in the cell's own writable layer, the
//! image is never written. A root with none of them gets the first, holding the CA alone.
//! A cell does it itself, before its command starts, when its run's proxy left [`CA_FILE`]
//! next to its socket ([`install_from_egress_dir`]); a long-lived cell made before its proxy
//! is done from the host through `/proc/PID/root` ([`install_for_pid`]).
//!
//! The CA is also filed in OpenSSL's hashed certificate directories ([`HASH_DIRS`]) as
//! `<subject hash>.<n>` ([`crate::subject_hash`]), for clients that look CAs up by name there
//! (`openssl s_client -CApath /etc/ssl/certs`, `curl --capath`, Python's
//! `load_verify_locations(capath=...)`, OpenSSL's default directory): a regular file holding
//! the CA, made in the same writable layer, at the first `n` that is free.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::mitm::CA_FILE;

/// The distributions' default bundle files (the list Go's `crypto/x509` reads), relative to
/// the sandbox's root. Symlinks among them (Alpine's `/etc/ssl/cert.pem`, RHEL's
/// `ca-bundle.crt`) resolve to one file, which gets the CA once.
pub const SYSTEM_BUNDLES: &[&str] = &[
    "etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine, Arch
    "etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
    "etc/ssl/ca-bundle.pem",             // openSUSE
    "etc/pki/tls/cacert.pem",            // OpenELEC
    "etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS, RHEL 7+
    "etc/ssl/cert.pem",                  // Alpine, macOS-like layouts
];

/// OpenSSL's hashed directories, relative to the sandbox's root: Debian's, Ubuntu's,
/// Alpine's and Arch's `OPENSSLDIR/certs` (and `-CApath` in every how-to), then Fedora's
/// and RHEL's. Only those that exist are written (the first is made along with the bundle
/// when the root has none); one that is a symlink to the other gets the CA once.
pub const HASH_DIRS: &[&str] = &["etc/ssl/certs", "etc/pki/tls/certs"];

/// Indices `<hash>.0` to `<hash>.15` are tried (OpenSSL stops at the first one missing).
const MAX_HASH_INDEX: u32 = 16;

/// A bundle larger than this is left alone (no distribution's is near it).
const MAX_BUNDLE: u64 = 16 << 20;

fn open_in(root: BorrowedFd<'_>, rel: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
    openat2(
        root,
        rel,
        flags | OFlags::CLOEXEC,
        // openat2 refuses a mode without O_CREAT.
        if flags.contains(OFlags::CREATE) {
            Mode::from_raw_mode(0o644)
        } else {
            Mode::empty()
        },
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
}

fn absent(e: Errno) -> bool {
    matches!(e, Errno::NOENT | Errno::NOTDIR | Errno::LOOP)
}

/// A bundle that cannot be written where it is (a read-only bind over it) is left as it is.
fn unwritable(e: Errno) -> bool {
    matches!(e, Errno::ROFS | Errno::ACCESS | Errno::PERM)
}

/// Appends `ca_pem` to every bundle of [`SYSTEM_BUNDLES`] under `root` that does not hold it
/// yet (or writes the first with the CA alone when there is none), and files it in each of
/// [`HASH_DIRS`] that exists; returns the paths made or changed.
pub fn install_in_root(root: BorrowedFd<'_>, ca_pem: &str) -> io::Result<Vec<String>> {
    let ca = ca_pem.trim_end();
    let not_one = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the CA file is not one PEM certificate",
        )
    };
    if !ca.starts_with("-----BEGIN CERTIFICATE-----") || ca.contains("PRIVATE KEY") {
        return Err(not_one());
    }
    let hash = crate::subject_hash::subject_hash(ca).map_err(|_| not_one())?;
    let mut changed = Vec::new();
    let mut found = false;
    for rel in SYSTEM_BUNDLES {
        // Non-blocking: a FIFO where a bundle should be (a fork's copy of a layer the
        // sandbox changed) must not hang us; only a regular file is read and written.
        let f = match open_in(
            root,
            rel,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        ) {
            Ok(f) => f,
            Err(e) if absent(e) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut f = std::fs::File::from(f);
        let meta = f.metadata()?;
        // Something is there: never made anew, changed only if a regular file.
        found = true;
        if !meta.is_file() || meta.len() > MAX_BUNDLE {
            continue;
        }
        let mut text = String::new();
        if f.read_to_string(&mut text).is_err() || text.contains(ca) {
            // Not text (left alone), or a path that resolved to a bundle done already.
            continue;
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(ca);
        text.push('\n');
        let w = match open_in(
            root,
            rel,
            OFlags::WRONLY | OFlags::TRUNC | OFlags::NONBLOCK | OFlags::NOCTTY,
        ) {
            Ok(w) => w,
            Err(e) if unwritable(e) => continue,
            Err(e) => return Err(e.into()),
        };
        std::fs::File::from(w).write_all(text.as_bytes())?;
        changed.push((*rel).to_owned());
    }
    if !found {
        let rel = SYSTEM_BUNDLES[0];
        let dir = Path::new(rel)
            .parent()
            .and_then(|p| p.to_str())
            .unwrap_or("");
        let mut at = String::new();
        for part in dir.split('/') {
            at = if at.is_empty() {
                part.into()
            } else {
                format!("{at}/{part}")
            };
            match open_in(root, &at, OFlags::PATH | OFlags::DIRECTORY) {
                Ok(_) => continue,
                Err(e) if absent(e) => {}
                Err(e) => return Err(e.into()),
            }
            // The parent exists (made or found a step earlier), resolved inside the root.
            let (parent, name) = at.rsplit_once('/').unwrap_or(("", at.as_str()));
            let parent = if parent.is_empty() {
                rustix::io::dup(root)?
            } else {
                open_in(root, parent, OFlags::PATH | OFlags::DIRECTORY)?
            };
            match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let w = open_in(root, rel, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL)?;
        std::fs::File::from(w).write_all(format!("{ca}\n").as_bytes())?;
        changed.push(rel.to_owned());
    }
    for dir in HASH_DIRS {
        if let Some(path) = file_by_hash(root, dir, &hash, ca)? {
            changed.push(path);
        }
    }
    Ok(changed)
}

/// Files `ca` in the hashed directory `dir` (when it exists) as `<hash>.<n>`, `n` the first
/// index free; `None` when the directory is absent or unwritable or already holds the CA.
/// OpenSSL reads `<hash>.0`, `.1`, ... and stops at the first name that is missing or does
/// not load, so the CA must come before any such: a dangling symlink is replaced (it holds
/// nothing), and a name that holds no PEM certificate ends the search without the CA.
fn file_by_hash(
    root: BorrowedFd<'_>,
    dir: &str,
    hash: &str,
    ca: &str,
) -> io::Result<Option<String>> {
    let dirfd = match open_in(root, dir, OFlags::PATH | OFlags::DIRECTORY) {
        Ok(d) => d,
        Err(e) if absent(e) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    for n in 0..MAX_HASH_INDEX {
        let name = format!("{hash}.{n}");
        let rel = format!("{dir}/{name}");
        match open_in(
            root,
            &rel,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        ) {
            Ok(f) => {
                // Taken: by this CA already (a fork's copy, a symlinked directory), or by
                // another certificate with the same hash (OpenSSL reads on past it).
                let mut f = std::fs::File::from(f);
                let mut text = String::new();
                if !f.metadata()?.is_file()
                    || (&mut f).take(MAX_BUNDLE).read_to_string(&mut text).is_err()
                {
                    return Ok(None);
                }
                if text.contains(ca) {
                    return Ok(None);
                }
                if !text.contains("-----BEGIN CERTIFICATE-----")
                    && !text.contains("-----BEGIN TRUSTED CERTIFICATE-----")
                {
                    return Ok(None);
                }
                continue;
            }
            Err(e) if absent(e) => {}
            Err(e) => return Err(e.into()),
        }
        // Absent as a file; a dangling symlink may still hold the name (this layer's to
        // change, as the bundles are).
        match rustix::fs::unlinkat(&dirfd, name.as_str(), rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) if unwritable(e) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let w = match open_in(
            root,
            &rel,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOCTTY,
        ) {
            Ok(w) => w,
            Err(e) if unwritable(e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        std::fs::File::from(w).write_all(format!("{ca}\n").as_bytes())?;
        return Ok(Some(rel));
    }
    Ok(None)
}

/// In a cell (its `/` is the sandbox's root): when the run's proxy wrote [`CA_FILE`] into its
/// socket's directory (`egress_dir`, as the sandbox sees it), installs that CA in the system
/// bundles. No CA there (no interception for this run): nothing to do, `Ok(vec![])`.
pub fn install_from_egress_dir(egress_dir: &Path) -> io::Result<Vec<String>> {
    let root = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let rel = egress_dir.join(CA_FILE);
    let rel = rel.to_string_lossy();
    let rel = rel.trim_start_matches('/');
    let ca = match open_in(root.as_fd(), rel, OFlags::RDONLY) {
        Ok(f) => {
            let mut s = String::new();
            std::fs::File::from(f)
                .take(MAX_BUNDLE)
                .read_to_string(&mut s)?;
            s
        }
        Err(e) if absent(e) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    install_in_root(root.as_fd(), &ca)
}

/// From the host: when a proxy wrote [`CA_FILE`] into `egress_dir` (its socket's directory,
/// on the host), installs that CA in the system bundles of the root process `pid` sees (a
/// long-lived cell's PID 1, made before its proxy's CA existed), through `/proc/PID/root`.
/// The writes are made as the owner of that root (the sandbox's root user as the host sees
/// it), on a thread of their own whose fsuid/fsgid are switched: a file the daemon's root
/// made there could not be owned by an id the sandbox maps (`EOVERFLOW`), and the sandbox's
/// files are changed with the sandbox's rights only.
pub fn install_for_pid(pid: i32, egress_dir: &Path) -> io::Result<Vec<String>> {
    let ca = match std::fs::read_to_string(egress_dir.join(CA_FILE)) {
        Ok(ca) => ca,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let root = rustix::fs::open(
        format!("/proc/{pid}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let owner = rustix::fs::fstat(&root)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setfsgid/setfsuid change this thread's filesystem ids only (the thread
            // ends with this closure); they take plain integers and cannot fail unsafely.
            unsafe {
                libc::setfsgid(owner.st_gid);
                libc::setfsuid(owner.st_uid);
            }
            install_in_root(root.as_fd(), &ca)
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the trust installer panicked")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root_fd(p: &Path) -> OwnedFd {
        rustix::fs::open(p, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    /// A real CA certificate (its subject is hashed), made once.
    fn ca() -> &'static str {
        static CA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        CA.get_or_init(|| {
            crate::mitm::Interceptor::new("trust-test", &[])
                .unwrap()
                .ca_pem()
                .to_owned()
        })
    }

    fn hash() -> String {
        crate::subject_hash::subject_hash(ca()).unwrap()
    }

    #[test]
    fn appends_once_through_symlinks_and_stays_inside_the_root() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join("etc/ssl/certs")).unwrap();
        std::fs::write(r.join("etc/ssl/certs/ca-certificates.crt"), "ROOTS").unwrap();
        // Alpine's layout: cert.pem -> certs/ca-certificates.crt (absolute, as images have it).
        symlink(
            "/etc/ssl/certs/ca-certificates.crt",
            r.join("etc/ssl/cert.pem"),
        )
        .unwrap();
        // A link that would lead out of the root on the host resolves inside it: absent.
        std::fs::create_dir_all(r.join("etc/pki/tls/certs")).unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(outside.path(), "HOST").unwrap();
        symlink(outside.path(), r.join("etc/pki/tls/certs/ca-bundle.crt")).unwrap();
        let changed = install_in_root(root_fd(r).as_fd(), ca()).unwrap();
        let h = hash();
        assert_eq!(
            changed,
            [
                "etc/ssl/certs/ca-certificates.crt".to_owned(),
                format!("etc/ssl/certs/{h}.0"),
                format!("etc/pki/tls/certs/{h}.0"),
            ]
        );
        let text = std::fs::read_to_string(r.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
        assert_eq!(text, format!("ROOTS\n{}", ca()));
        assert_eq!(std::fs::read_to_string(outside.path()).unwrap(), "HOST");
        // Again (a fork's copy of the layer): nothing to add.
        assert!(install_in_root(root_fd(r).as_fd(), ca())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_fifo_where_a_bundle_should_be_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc/ssl/certs")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.path().join(SYSTEM_BUNDLES[0]),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        // Returns (a blocking open would wait for a writer forever); no bundle written
        // (the hashed directory still gets the CA).
        let changed = install_in_root(root_fd(d.path()).as_fd(), ca()).unwrap();
        assert_eq!(changed, [format!("etc/ssl/certs/{}.0", hash())]);
    }

    #[test]
    fn a_root_without_a_bundle_gets_one_and_a_key_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let changed = install_in_root(root_fd(d.path()).as_fd(), ca()).unwrap();
        assert_eq!(
            changed,
            [
                SYSTEM_BUNDLES[0].to_owned(),
                format!("etc/ssl/certs/{}.0", hash())
            ]
        );
        let text = std::fs::read_to_string(d.path().join(SYSTEM_BUNDLES[0])).unwrap();
        assert_eq!(text, ca());
        let key = format!("{}-----BEGIN PRIVATE KEY-----\n", ca());
        assert!(install_in_root(root_fd(d.path()).as_fd(), &key).is_err());
        let fake = "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n";
        assert!(install_in_root(root_fd(d.path()).as_fd(), fake).is_err());
    }

    /// OpenSSL itself finds the CA by name in the directory (`openssl verify -CApath`, the
    /// test's reference), past a taken index, in place of a dangling link.
    #[test]
    fn openssl_finds_the_ca_in_the_hashed_directory() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        let certs = r.join("etc/ssl/certs");
        std::fs::create_dir_all(&certs).unwrap();
        let h = hash();
        let other = crate::mitm::Interceptor::new("other", &[]).unwrap();
        std::fs::write(certs.join(format!("{h}.0")), other.ca_pem()).unwrap();
        symlink("/nowhere/x.pem", certs.join(format!("{h}.1"))).unwrap();
        let changed = install_in_root(root_fd(r).as_fd(), ca()).unwrap();
        assert!(
            changed.contains(&format!("etc/ssl/certs/{h}.1")),
            "{changed:?}"
        );
        let leaf = r.join("ca.pem");
        std::fs::write(&leaf, ca()).unwrap();
        let verify = |dir: &Path| {
            std::process::Command::new("openssl")
                .args(["verify", "-no-CAfile", "-no-CAstore", "-CApath"])
                .arg(dir)
                .arg(&leaf)
                .output()
                .expect("the openssl command (the test's reference)")
        };
        let out = verify(&certs);
        assert!(out.status.success(), "{out:?}");
        // The same directory without the file: not found (the check can fail).
        std::fs::remove_file(certs.join(format!("{h}.1"))).unwrap();
        assert!(!verify(&certs).status.success());
    }
}
