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
/// yet (or writes the first with the CA alone when there is none); returns the paths changed.
pub fn install_in_root(root: BorrowedFd<'_>, ca_pem: &str) -> io::Result<Vec<&'static str>> {
    let ca = ca_pem.trim_end();
    if !ca.starts_with("-----BEGIN CERTIFICATE-----") || ca.contains("PRIVATE KEY") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the CA file is not one PEM certificate",
        ));
    }
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
        changed.push(*rel);
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
        changed.push(rel);
    }
    Ok(changed)
}

/// In a cell (its `/` is the sandbox's root): when the run's proxy wrote [`CA_FILE`] into its
/// socket's directory (`egress_dir`, as the sandbox sees it), installs that CA in the system
/// bundles. No CA there (no interception for this run): nothing to do, `Ok(vec![])`.
pub fn install_from_egress_dir(egress_dir: &Path) -> io::Result<Vec<&'static str>> {
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
pub fn install_for_pid(pid: i32, egress_dir: &Path) -> io::Result<Vec<&'static str>> {
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
    install_in_root(root.as_fd(), &ca)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root_fd(p: &Path) -> OwnedFd {
        rustix::fs::open(p, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    const CA: &str = "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n";

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
        let changed = install_in_root(root_fd(r).as_fd(), CA).unwrap();
        assert_eq!(changed, ["etc/ssl/certs/ca-certificates.crt"]);
        let text = std::fs::read_to_string(r.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
        assert_eq!(text, format!("ROOTS\n{CA}"));
        assert_eq!(std::fs::read_to_string(outside.path()).unwrap(), "HOST");
        // Again (a fork's copy of the layer): nothing to add.
        assert!(install_in_root(root_fd(r).as_fd(), CA).unwrap().is_empty());
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
        // Returns (a blocking open would wait for a writer forever); nothing written.
        let changed = install_in_root(root_fd(d.path()).as_fd(), CA).unwrap();
        assert!(changed.is_empty(), "{changed:?}");
    }

    #[test]
    fn a_root_without_a_bundle_gets_one_and_a_key_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let changed = install_in_root(root_fd(d.path()).as_fd(), CA).unwrap();
        assert_eq!(changed, [SYSTEM_BUNDLES[0]]);
        let text = std::fs::read_to_string(d.path().join(SYSTEM_BUNDLES[0])).unwrap();
        assert_eq!(text, CA);
        let key = format!("{CA}-----BEGIN PRIVATE KEY-----\n");
        assert!(install_in_root(root_fd(d.path()).as_fd(), &key).is_err());
    }
}
