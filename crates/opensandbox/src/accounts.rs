//! A sandbox's users and groups, from its own `/etc/passwd` and `/etc/group` (read inside its
//! root, as every file of the API is: never the host's): names to ids for the file API's
//! `owner`/`group`, ids to names for its file info.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use agentrun_runtime::fsroot::SandboxFs;

/// Most bytes of `/etc/passwd` or `/etc/group` read: a sandbox cannot make the daemon hold
/// more than this.
const MAX_TABLE: u64 = 16 * 1024 * 1024;

/// Names and ids of one table (`name:x:id:...` lines).
#[derive(Debug, Default)]
struct Table {
    by_name: HashMap<String, u32>,
    by_id: HashMap<u32, String>,
}

impl Table {
    /// Parses `name:password:id:...` lines; malformed ones are skipped, the first of a name
    /// or id wins (as getpwnam/getpwuid).
    fn parse(r: impl Read) -> Table {
        let mut t = Table::default();
        for line in BufReader::new(r.take(MAX_TABLE)).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line);
            let mut fields = line.split(':');
            let (Some(name), Some(_), Some(id)) = (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(id) = id.trim().parse::<u32>() else {
                continue;
            };
            if name.is_empty() || name.starts_with('#') {
                continue;
            }
            t.by_name.entry(name.to_owned()).or_insert(id);
            t.by_id.entry(id).or_insert_with(|| name.to_owned());
        }
        t
    }

    fn read(fs: &SandboxFs, path: &str) -> Table {
        fs.open_regular(Path::new(path))
            .map(Table::parse)
            .unwrap_or_default()
    }
}

/// The users and groups of one sandbox.
#[derive(Debug, Default)]
pub struct Accounts {
    users: Table,
    groups: Table,
}

/// Why an `owner` or `group` cannot be given to a file.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{what} {name:?}: no such {kind} in the sandbox's {table}")]
pub struct UnknownName {
    what: &'static str,
    name: String,
    kind: &'static str,
    table: &'static str,
}

impl Accounts {
    /// Reads the sandbox's tables (a missing or unreadable one is empty).
    pub fn read(fs: &SandboxFs) -> Accounts {
        Accounts {
            users: Table::read(fs, "etc/passwd"),
            groups: Table::read(fs, "etc/group"),
        }
    }

    #[cfg(test)]
    fn from_text(passwd: &str, group: &str) -> Accounts {
        Accounts {
            users: Table::parse(passwd.as_bytes()),
            groups: Table::parse(group.as_bytes()),
        }
    }

    /// The sandbox uid of `owner`: a user's name, else a number taken as the id.
    pub fn uid(&self, owner: &str) -> Result<u32, UnknownName> {
        lookup(&self.users, owner).ok_or_else(|| UnknownName {
            what: "owner",
            name: owner.into(),
            kind: "user",
            table: "/etc/passwd",
        })
    }

    /// The sandbox gid of `group`: a group's name, else a number taken as the id.
    pub fn gid(&self, group: &str) -> Result<u32, UnknownName> {
        lookup(&self.groups, group).ok_or_else(|| UnknownName {
            what: "group",
            name: group.into(),
            kind: "group",
            table: "/etc/group",
        })
    }

    /// The name of sandbox user `uid`, or the number.
    pub fn user_name(&self, uid: u32) -> String {
        self.users
            .by_id
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    /// The name of sandbox group `gid`, or the number.
    pub fn group_name(&self, gid: u32) -> String {
        self.groups
            .by_id
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

fn lookup(t: &Table, name: &str) -> Option<u32> {
    t.by_name.get(name).copied().or_else(|| {
        (!name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()))
            .then(|| name.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_from_the_sandbox_tables() {
        let a = Accounts::from_text(
            "root:x:0:0:root:/root:/bin/bash\n# comment\nbroken\nnobody:x:65534:65534::/:/x\n\
             123:x:7:7::/:/x\nroot:x:5:5::/:/x\n",
            "root:x:0:\nnogroup:x:65534:\nstaff:x:50:alice,bob\n",
        );
        assert_eq!(a.uid("root"), Ok(0));
        assert_eq!(a.uid("nobody"), Ok(65534));
        // A name first, then a number.
        assert_eq!(a.uid("123"), Ok(7));
        assert_eq!(a.uid("1000"), Ok(1000));
        assert_eq!(a.gid("staff"), Ok(50));
        assert_eq!(
            a.uid("alice").unwrap_err().to_string(),
            "owner \"alice\": no such user in the sandbox's /etc/passwd"
        );
        assert_eq!(
            a.gid("wheel").unwrap_err().to_string(),
            "group \"wheel\": no such group in the sandbox's /etc/group"
        );
        assert!(a.uid("-1").is_err() && a.uid("").is_err() && a.uid("99999999999").is_err());
        assert_eq!(a.user_name(0), "root");
        assert_eq!(a.user_name(65534), "nobody");
        assert_eq!(a.user_name(1000), "1000");
        assert_eq!(a.group_name(65534), "nogroup");
    }
}
