//! The API key file: `agentrun serve` with an HTTP listener and no key configured makes a
//! random key (getrandom, 192 bits as 48 hex digits) on its first start into
//! `<state dir>/api-key` (mode 0600, owned by the daemon's user) and uses the same key on
//! every later start. Whoever can read the file can use the API; nobody else can.
//!
//! A file that is not safe to trust is refused, never repaired or replaced (that would
//! lock out whoever holds the old key, or trust a key someone else chose): a symlink, not a
//! regular file, owned by another user, readable or writable by group or others, empty, or
//! not one line of URL-safe characters (16 to [`MAX_KEY_LEN`]). The error says what to do.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// The file's name in the state dir.
pub const FILE_NAME: &str = "api-key";
/// The longest key a file may hold.
pub const MAX_KEY_LEN: usize = 512;
/// The shortest.
pub const MIN_KEY_LEN: usize = 16;
/// Random bytes of a generated key.
const KEY_BYTES: usize = 24;

/// Why the key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("API key file {0}: is a symlink (remove it; agentrun makes a new key)")]
    Symlink(PathBuf),
    #[error("API key file {0}: not a regular file")]
    NotRegular(PathBuf),
    #[error("API key file {path}: owned by uid {owner}, not by this user (uid {me}): remove it or chown it")]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("API key file {path}: mode {mode:04o} lets group or others at it (chmod 600 it, or remove it and restart to make a new key)")]
    Mode { path: PathBuf, mode: u32 },
    #[error("API key file {0}: empty (remove it and restart to make a new key)")]
    Empty(PathBuf),
    #[error("API key file {path}: {why} (one line of 16 to 512 characters A-Z a-z 0-9 - _ . ~)")]
    Invalid { path: PathBuf, why: KeyError },
    #[error("API key file {0}: none yet (`agentrun serve` with --listen, --mcp or --metrics makes it on its first start)")]
    Missing(PathBuf),
    #[error("API key file {0}: not readable by this user (only the daemon's user may read it: e.g. `sudo agentrun api-key`)")]
    Unreadable(PathBuf),
    #[error("API key file {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("API key file {path}: no randomness from the kernel: {error}")]
    Random {
        path: PathBuf,
        error: getrandom::Error,
    },
}

/// What is wrong with a key's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("empty")]
    Empty,
    #[error("shorter than 16 characters")]
    TooShort,
    #[error("longer than 512 characters")]
    TooLong,
    #[error("more than one line")]
    Lines,
    #[error("a character that is not URL-safe")]
    Character,
}

/// A key read from or made into its file.
#[derive(Debug)]
pub struct KeyFile {
    pub path: PathBuf,
    pub key: String,
    /// Made now (first start), not read.
    pub created: bool,
}

/// The key file of state dir `state_dir`.
pub fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE_NAME)
}

/// The key in a file's bytes: one line (a final newline allowed), 16 to [`MAX_KEY_LEN`]
/// URL-safe characters (`A-Z a-z 0-9 - _ . ~`), so that it travels unchanged in a header, a
/// URL or a form.
pub fn parse(bytes: &[u8]) -> Result<&str, KeyError> {
    let text = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    if text.is_empty() {
        return Err(KeyError::Empty);
    }
    if text.contains(&b'\n') {
        return Err(KeyError::Lines);
    }
    if text.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    if !text
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'))
    {
        return Err(KeyError::Character);
    }
    if text.len() < MIN_KEY_LEN {
        return Err(KeyError::TooShort);
    }
    // All ASCII: valid UTF-8.
    std::str::from_utf8(text).map_err(|_| KeyError::Character)
}

/// A new random key: 48 hex digits (192 bits from getrandom).
pub fn generate() -> Result<String, getrandom::Error> {
    let mut b = [0u8; KEY_BYTES];
    getrandom::fill(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn io(path: &Path, e: impl Into<std::io::Error>) -> KeyFileError {
    KeyFileError::Io {
        path: path.to_owned(),
        error: e.into(),
    }
}

/// Opens `path` for reading without following a symlink and checks that it is a regular
/// file of this user that nobody else may read or write.
fn open_checked(path: &Path) -> Result<OwnedFd, KeyFileError> {
    let fd = match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) => return Err(KeyFileError::Symlink(path.to_owned())),
        Err(rustix::io::Errno::NOENT) => return Err(KeyFileError::Missing(path.to_owned())),
        Err(rustix::io::Errno::ACCESS) => return Err(KeyFileError::Unreadable(path.to_owned())),
        Err(e) => return Err(io(path, e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| io(path, e))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(KeyFileError::NotRegular(path.to_owned()));
    }
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(KeyFileError::Owner {
            path: path.to_owned(),
            owner: st.st_uid,
            me,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Mode {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(fd)
}

/// Reads the key of an existing file, checked as the module says.
pub fn read(path: &Path) -> Result<KeyFile, KeyFileError> {
    let fd = open_checked(path)?;
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_KEY_LEN as u64 + 3)
        .read_to_end(&mut bytes)
        .map_err(|e| io(path, e))?;
    match parse(&bytes) {
        Ok(key) => Ok(KeyFile {
            path: path.to_owned(),
            key: key.to_owned(),
            created: false,
        }),
        Err(KeyError::Empty) => Err(KeyFileError::Empty(path.to_owned())),
        Err(why) => Err(KeyFileError::Invalid {
            path: path.to_owned(),
            why,
        }),
    }
}

/// The key of `path`: read if the file exists, else made now (mode 0600, created
/// exclusively: a file that appears meanwhile is read instead).
pub fn load_or_create(path: &Path) -> Result<KeyFile, KeyFileError> {
    match read(path) {
        Err(KeyFileError::Missing(_)) => {}
        other => return other,
    }
    let key = generate().map_err(|error| KeyFileError::Random {
        path: path.to_owned(),
        error,
    })?;
    let fd = match rustix::fs::open(
        path,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    ) {
        Ok(fd) => fd,
        // Another start made it first: use its key.
        Err(rustix::io::Errno::EXIST) => return read(path),
        Err(e) => return Err(io(path, e)),
    };
    // The umask may have taken bits away, never added them; set exactly 0600 anyway.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o600)).map_err(|e| io(path, e))?;
    let mut f = std::fs::File::from(fd);
    let written = f
        .write_all(format!("{key}\n").as_bytes())
        .and_then(|()| f.sync_all());
    if let Err(e) = written {
        // The write error is what the caller hears; a half-written key file must not stay.
        let _ = std::fs::remove_file(path);
        return Err(io(path, e));
    }
    Ok(KeyFile {
        path: path.to_owned(),
        key,
        created: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn parses_one_line_of_url_safe_characters() {
        assert_eq!(parse(b"0123456789abcdef\n"), Ok("0123456789abcdef"));
        assert_eq!(parse(b"0123456789abcdef\r\n"), Ok("0123456789abcdef"));
        assert_eq!(parse(b"A-_.~56789abcdefXYZ"), Ok("A-_.~56789abcdefXYZ"));
        assert_eq!(parse(b""), Err(KeyError::Empty));
        assert_eq!(parse(b"\n"), Err(KeyError::Empty));
        assert_eq!(parse(b"short\n"), Err(KeyError::TooShort));
        assert_eq!(parse(b"0123456789abcdef\n\n"), Err(KeyError::Lines));
        assert_eq!(parse(b"0123456789abcdef\nx"), Err(KeyError::Lines));
        assert_eq!(parse(b"0123456789 abcdef"), Err(KeyError::Character));
        assert_eq!(
            parse("0123456789abcdéf".as_bytes()),
            Err(KeyError::Character)
        );
        assert_eq!(parse(&[b'a'; 513]), Err(KeyError::TooLong));
        assert!(parse(&[b'a'; 512]).is_ok());
    }

    #[test]
    fn generated_keys_are_long_random_and_parse() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 48);
        assert_eq!(parse(a.as_bytes()), Ok(a.as_str()));
    }

    #[test]
    fn made_once_then_read_back_and_unsafe_files_refused() {
        let dir = std::env::temp_dir().join(format!("webguard-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = path_in(&dir);
        let first = load_or_create(&p).unwrap();
        assert!(first.created);
        let meta = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        let again = load_or_create(&p).unwrap();
        assert!(!again.created);
        assert_eq!(again.key, first.key);

        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create(&p).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();

        std::fs::write(&p, "").unwrap();
        assert!(matches!(load_or_create(&p), Err(KeyFileError::Empty(_))));
        std::fs::write(&p, "not a key at all, spaces\n").unwrap();
        assert!(matches!(
            load_or_create(&p),
            Err(KeyFileError::Invalid { .. })
        ));
        std::fs::remove_file(&p).unwrap();

        let target = dir.join("elsewhere");
        std::fs::write(&target, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert!(matches!(load_or_create(&p), Err(KeyFileError::Symlink(_))));
        std::fs::remove_file(&p).unwrap();

        std::fs::create_dir(&p).unwrap();
        assert!(matches!(
            load_or_create(&p),
            Err(KeyFileError::NotRegular(_))
        ));
        std::fs::remove_dir(&p).unwrap();
        assert!(matches!(read(&p), Err(KeyFileError::Missing(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
