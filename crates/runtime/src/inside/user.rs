//! Who a sandboxed process runs as: a Docker-style user spec (`uid`, `uid:gid`, `name`,
//! `name:group`, `uid:group`, ...) resolved against the sandbox's *own* `/etc/passwd` and
//! `/etc/group` (read by the init, inside the sandbox's root, never the host's), as
//! runc/dockerd resolve a container's `User`.

use std::fmt;

/// The credentials a process gets: uid, primary gid, supplementary groups and home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The passwd entry's home, `/` when there is none (as Docker).
    pub home: String,
}

/// Why a user spec does not resolve (the texts are dockerd's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserError {
    NoUser(String),
    NoGroup(String),
    OutOfRange(String),
}

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserError::NoUser(u) => {
                write!(
                    f,
                    "unable to find user {u}: no matching entries in passwd file"
                )
            }
            UserError::NoGroup(g) => {
                write!(
                    f,
                    "unable to find group {g}: no matching entries in group file"
                )
            }
            UserError::OutOfRange(v) => {
                write!(
                    f,
                    "invalid user {v}: uids and gids must be in range 0-2147483647"
                )
            }
        }
    }
}

impl std::error::Error for UserError {}

/// Largest uid/gid Docker accepts.
const MAX_ID: u64 = i32::MAX as u64;

fn numeric(s: &str) -> Result<Option<u32>, UserError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    match s.parse::<u64>() {
        Ok(n) if n <= MAX_ID => Ok(Some(n as u32)),
        _ => Err(UserError::OutOfRange(s.to_owned())),
    }
}

/// `name:x:uid:gid:gecos:home:shell` lines (malformed ones skipped).
fn passwd_entries(passwd: &str) -> impl Iterator<Item = (&str, u32, u32, &str)> {
    passwd.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 7 || l.starts_with('#') {
            return None;
        }
        Some((f[0], f[2].parse().ok()?, f[3].parse().ok()?, f[5]))
    })
}

/// `name:x:gid:member,member` lines (malformed ones skipped).
fn group_entries(group: &str) -> impl Iterator<Item = (&str, u32, Vec<&str>)> {
    group.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 4 || l.starts_with('#') {
            return None;
        }
        let members = f[3].split(',').filter(|m| !m.is_empty()).collect();
        Some((f[0], f[2].parse().ok()?, members))
    })
}

/// Resolves `spec` against the contents of a passwd and a group file. A numeric uid or gid
/// needs no entry; a name must have one. Without an explicit group the user's primary group
/// is its passwd entry's (0 when there is none) and its supplementary groups are those that
/// list it as a member.
pub fn resolve(spec: &str, passwd: &str, group: &str) -> Result<Credentials, UserError> {
    let (user, grp) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let uid_num = numeric(user)?;
    let entry = passwd_entries(passwd).find(|(name, uid, _, _)| match uid_num {
        Some(n) => *uid == n,
        None => *name == user,
    });
    let (uid, mut gid, home, name) = match (entry, uid_num) {
        (Some((name, uid, gid, home)), _) => (uid, gid, home.to_owned(), Some(name)),
        (None, Some(n)) => (n, 0, "/".to_owned(), None),
        (None, None) if user.is_empty() => (0, 0, "/".to_owned(), None),
        (None, None) => return Err(UserError::NoUser(user.to_owned())),
    };
    let mut groups = Vec::new();
    match grp.filter(|g| !g.is_empty()) {
        Some(g) => {
            gid = match numeric(g)? {
                Some(n) => n,
                None => group_entries(group)
                    .find(|(n, _, _)| *n == g)
                    .map(|(_, gid, _)| gid)
                    .ok_or_else(|| UserError::NoGroup(g.to_owned()))?,
            };
        }
        None => {
            if let Some(name) = name {
                for (_, g, members) in group_entries(group) {
                    if members.contains(&name) && g != gid && !groups.contains(&g) {
                        groups.push(g);
                    }
                }
            }
        }
    }
    Ok(Credentials {
        uid,
        gid,
        groups,
        home: if home.is_empty() { "/".into() } else { home },
    })
}

/// [`resolve`] against `/etc/passwd` and `/etc/group` of the calling process's root (the
/// init calls it inside the sandbox). A missing file counts as empty.
pub fn resolve_here(spec: &str) -> Result<Credentials, UserError> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    resolve(spec, &read("/etc/passwd"), &read("/etc/group"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
        daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
        # a comment\n\
        broken line\n\
        app:x:1000:1000:App:/home/app:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nwheel:x:10:app,root\napp:x:1000:\nstaff:x:50:app\n";

    #[test]
    fn numeric_without_entries() {
        let c = resolve("4242", "", "").unwrap();
        assert_eq!((c.uid, c.gid, c.home.as_str()), (4242, 0, "/"));
        let c = resolve("4242:77", "", "").unwrap();
        assert_eq!((c.uid, c.gid), (4242, 77));
    }

    #[test]
    fn numeric_uid_takes_its_entry() {
        let c = resolve("1000", PASSWD, GROUP).unwrap();
        assert_eq!((c.uid, c.gid, c.home.as_str()), (1000, 1000, "/home/app"));
        assert_eq!(c.groups, vec![10, 50]);
    }

    #[test]
    fn names_resolve_from_the_files() {
        let c = resolve("app:wheel", PASSWD, GROUP).unwrap();
        assert_eq!((c.uid, c.gid), (1000, 10));
        assert!(
            c.groups.is_empty(),
            "an explicit group sets no supplementary ones"
        );
        let c = resolve("daemon", PASSWD, GROUP).unwrap();
        assert_eq!((c.uid, c.gid, c.home.as_str()), (1, 1, "/usr/sbin"));
        let c = resolve("1000:staff", PASSWD, GROUP).unwrap();
        assert_eq!((c.uid, c.gid), (1000, 50));
    }

    #[test]
    fn unknown_names_are_errors() {
        assert_eq!(
            resolve("nobody", PASSWD, GROUP).unwrap_err().to_string(),
            "unable to find user nobody: no matching entries in passwd file"
        );
        assert_eq!(
            resolve("app:nogroup", PASSWD, GROUP)
                .unwrap_err()
                .to_string(),
            "unable to find group nogroup: no matching entries in group file"
        );
        assert!(matches!(
            resolve("99999999999", PASSWD, GROUP),
            Err(UserError::OutOfRange(_))
        ));
    }
}
