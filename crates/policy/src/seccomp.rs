//! The `default` seccomp baseline as data: the syscalls it denies, the `personality` values it
//! lets through, and the socket address families (and netlink protocols) a sandbox may open.
//! Pure: `agentrun_runtime::seccomp` turns this into an OCI seccomp section and BPF.
//!
//! Sockets: a sandbox gets `AF_UNIX`, `AF_INET`, `AF_INET6` and `AF_NETLINK` with
//! `NETLINK_ROUTE` only (glibc's `getaddrinfo` and `if_nameindex` use it; loopback itself is
//! brought up by agentrun's init before the filter exists). Every other family is refused:
//! `AF_VSOCK` above all, which on a VM host reaches the hypervisor's services from any network
//! namespace, and `AF_PACKET`, `AF_ALG`, `AF_KEY`, `AF_BLUETOOTH`, ... whose kernel code a
//! sandboxed program has no business exercising. A profile can allow more with
//! `[seccomp] allow_socket_families = ["alg", ...]` (names as in [`SOCKET_FAMILIES`]; listing
//! `"netlink"` allows every netlink protocol).

use serde::{Deserialize, Serialize};

/// Syscalls the `default` seccomp baseline denies with EPERM, in the spirit of Docker's default
/// profile: kernel-module and kexec loading, mounts and namespace changes, tracing and taking
/// other processes' fds (`pidfd_getfd`), keyrings, BPF, perf, userfaultfd, io_uring (it
/// bypasses seccomp's per-syscall view), handle-based opens, clock/time changes, swap,
/// reboot, accounting, NUMA policy and obsolete or dangerous calls. (`personality` is
/// restricted by value: [`PERSONALITY_ALLOWED`].)
pub fn seccomp_denied_syscalls() -> &'static [&'static str] {
    &[
        "acct",
        "add_key",
        "bpf",
        "clock_adjtime",
        "clock_settime",
        "create_module",
        "delete_module",
        "finit_module",
        "fsconfig",
        "fsmount",
        "fsopen",
        "fspick",
        "get_kernel_syms",
        "get_mempolicy",
        "init_module",
        "ioperm",
        "io_uring_enter",
        "io_uring_register",
        "io_uring_setup",
        "iopl",
        "kcmp",
        "kexec_file_load",
        "kexec_load",
        "keyctl",
        "lookup_dcookie",
        "mbind",
        "mount",
        "mount_setattr",
        "move_mount",
        "move_pages",
        "name_to_handle_at",
        "nfsservctl",
        "open_by_handle_at",
        "open_tree",
        "perf_event_open",
        "pidfd_getfd",
        "pivot_root",
        "process_vm_readv",
        "process_vm_writev",
        "ptrace",
        "query_module",
        "quotactl",
        "quotactl_fd",
        "reboot",
        "request_key",
        "set_mempolicy",
        "setns",
        "settimeofday",
        "swapoff",
        "swapon",
        "syslog",
        "umount",
        "umount2",
        "unshare",
        "uselib",
        "userfaultfd",
        "ustat",
        "vhangup",
        "vm86",
        "vm86old",
        "_sysctl",
    ]
}

/// The `personality(2)` arguments the baseline allows, as Docker's default profile does:
/// `PER_LINUX` (0), `PER_LINUX32` (8), `UNAME26` (0x20000), `PER_LINUX32|UNAME26` (0x20008)
/// and the query `0xffffffff`. Everything else (`READ_IMPLIES_EXEC`, `ADDR_NO_RANDOMIZE`,
/// `ADDR_COMPAT_LAYOUT`, other execution domains, ...) is denied with EPERM.
pub const PERSONALITY_ALLOWED: &[u64] = &[0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// Socket address families by name (the kernel's `AF_*` without the prefix, lower case), for
/// `[seccomp] allow_socket_families`.
pub const SOCKET_FAMILIES: &[(&str, u32)] = &[
    ("unix", 1),
    ("inet", 2),
    ("ax25", 3),
    ("ipx", 4),
    ("appletalk", 5),
    ("netrom", 6),
    ("bridge", 7),
    ("atmpvc", 8),
    ("x25", 9),
    ("inet6", 10),
    ("rose", 11),
    ("decnet", 12),
    ("netbeui", 13),
    ("security", 14),
    ("key", 15),
    ("netlink", 16),
    ("packet", 17),
    ("ash", 18),
    ("econet", 19),
    ("atmsvc", 20),
    ("rds", 21),
    ("sna", 22),
    ("irda", 23),
    ("pppox", 24),
    ("wanpipe", 25),
    ("llc", 26),
    ("ib", 27),
    ("mpls", 28),
    ("can", 29),
    ("tipc", 30),
    ("bluetooth", 31),
    ("iucv", 32),
    ("rxrpc", 33),
    ("isdn", 34),
    ("phonet", 35),
    ("ieee802154", 36),
    ("caif", 37),
    ("alg", 38),
    ("nfc", 39),
    ("vsock", 40),
    ("kcm", 41),
    ("qipcrtr", 42),
    ("smc", 43),
    ("xdp", 44),
    ("mctp", 45),
];

/// `AF_NETLINK`.
pub const AF_NETLINK: u32 = 16;
/// `NETLINK_ROUTE`: interfaces, addresses, routes (what `getaddrinfo` asks about).
pub const NETLINK_ROUTE: u32 = 0;

/// Families every sandbox may open: `unix`, `inet`, `inet6`, `netlink` (route only).
const BASELINE_FAMILIES: &[u32] = &[1, 2, 10, AF_NETLINK];

/// Which sockets the seccomp baseline lets a sandbox create (`socket(2)`, `socketpair(2)`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketPolicy {
    /// Address families allowed, sorted.
    pub families: Vec<u32>,
    /// Netlink protocols allowed when `AF_NETLINK` is; `None`: all of them.
    pub netlink_protocols: Option<Vec<u32>>,
}

impl Default for SocketPolicy {
    fn default() -> Self {
        SocketPolicy {
            families: BASELINE_FAMILIES.to_vec(),
            netlink_protocols: Some(vec![NETLINK_ROUTE]),
        }
    }
}

/// A socket family name that [`SOCKET_FAMILIES`] does not know.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("unknown socket family {name:?} (known: {known})")]
pub struct UnknownSocketFamily {
    pub name: String,
    /// The known names, comma-separated.
    pub known: String,
}

impl SocketPolicy {
    /// The baseline plus the families named in `extra` (see [`SOCKET_FAMILIES`]); naming
    /// `netlink` lifts the netlink protocol restriction. Errors name the unknown family.
    pub fn with_families<S: AsRef<str>>(extra: &[S]) -> Result<Self, UnknownSocketFamily> {
        let mut policy = SocketPolicy::default();
        for name in extra {
            let name = name.as_ref();
            let Some((_, nr)) = SOCKET_FAMILIES.iter().find(|(n, _)| *n == name) else {
                let known: Vec<&str> = SOCKET_FAMILIES.iter().map(|(n, _)| *n).collect();
                return Err(UnknownSocketFamily {
                    name: name.into(),
                    known: known.join(", "),
                });
            };
            if *nr == AF_NETLINK {
                policy.netlink_protocols = None;
            }
            policy.families.push(*nr);
        }
        policy.families.sort_unstable();
        policy.families.dedup();
        Ok(policy)
    }

    /// Whether `family` may be opened (with `protocol`, for netlink).
    pub fn allows(&self, family: u32, protocol: u32) -> bool {
        self.families.contains(&family)
            && (family != AF_NETLINK
                || self
                    .netlink_protocols
                    .as_ref()
                    .is_none_or(|p| p.contains(&protocol)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denylist_covers_the_dangerous_calls() {
        let d = seccomp_denied_syscalls();
        for s in [
            "ptrace",
            "mount",
            "unshare",
            "setns",
            "bpf",
            "keyctl",
            "kexec_load",
            "pidfd_getfd",
        ] {
            assert!(d.contains(&s), "{s}");
        }
        assert!(!d.contains(&"personality"), "restricted by value instead");
    }

    #[test]
    fn baseline_sockets() {
        let p = SocketPolicy::default();
        assert!(p.allows(1, 0) && p.allows(2, 0) && p.allows(10, 0));
        assert!(p.allows(AF_NETLINK, NETLINK_ROUTE));
        assert!(!p.allows(AF_NETLINK, 9), "NETLINK_AUDIT");
        for (name, nr) in SOCKET_FAMILIES {
            if !["unix", "inet", "inet6", "netlink"].contains(name) {
                assert!(!p.allows(*nr, 0), "{name}");
            }
        }
    }

    #[test]
    fn profile_can_allow_more_families() {
        let p = SocketPolicy::with_families(&["alg", "netlink", "alg"]).unwrap();
        assert_eq!(p.families, vec![1, 2, 10, 16, 38]);
        assert!(p.allows(38, 0) && p.allows(AF_NETLINK, 4));
        assert!(!p.allows(40, 0));
        let e = SocketPolicy::with_families(&["vsok"]).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("\"vsok\"") && e.contains("vsock"), "{e}");
    }
}
