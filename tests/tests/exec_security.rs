//! What a sandboxed command must not be able to do, checked through the real binary.

use std::fs;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
use std::time::Duration;

use agentrun_e2e::*;

#[test]
fn writes_outside_workspace_fail() {
    let Some(_l) = setup() else { return };
    let ws = tempdir();
    let marker = format!("agentrun-e2e-{}", std::process::id());
    let script = format!(
        r#"for p in /etc/{m} /usr/{m} /{m} /usr/bin/{m} /var/{m}; do
             if (echo x > "$p") 2>/dev/null; then echo "WROTE $p"; else echo "denied $p"; fi
           done
           if echo ok > /tmp/{m}; then echo "tmp ok"; fi
           if (echo ws > /workspace/{m}) 2>/dev/null; then echo "ws ok"; fi"#,
        m = marker
    );
    let out = exec_with(
        ["--workspace".as_ref(), ws.path().as_os_str()],
        ["sh", "-c", &script],
    )
    .run();
    let stdout = out.success();
    // What the profile denies fails (under `container` and `build` the whole root is
    // writable: those writes land in the run's own layer, never on the host).
    for p in ["/etc", "/usr", "/", "/usr/bin", "/var"] {
        let path = format!("{}/{marker}", p.trim_end_matches('/'));
        if !e2e_profile_allows("write", &path) {
            assert!(
                !stdout.contains(&format!("WROTE {path}")),
                "a write the profile denies succeeded\n{out}"
            );
        }
    }
    assert!(stdout.contains("tmp ok"), "/tmp must be writable\n{out}");
    let ws_writable = e2e_profile_allows("write", &format!("/workspace/{marker}"));
    assert_eq!(
        stdout.contains("ws ok"),
        ws_writable,
        "/workspace must be writable exactly when the profile says so\n{out}"
    );
    for p in ["/etc", "/usr", "/", "/usr/bin", "/var", "/tmp"] {
        let host = std::path::Path::new(p).join(&marker);
        assert!(!host.exists(), "{} appeared on the host", host.display());
    }
}

/// Host entries planted for one test: removed again when it ends, also when it fails.
struct Planted(Vec<std::path::PathBuf>);

impl Drop for Planted {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_dir_all(p);
        }
    }
}

#[test]
fn host_secrets_are_not_visible() {
    let Some(_l) = setup() else { return };
    // A name of this run's own in the host's /root and /home: a sandbox that saw either
    // directory would list it. (Comparing with the host's own names is not enough: a sandbox
    // makes names of its own there, e.g. the code-interpreter profile's preloaded matplotlib
    // writes /root/.config in the sandbox's writable layer.)
    let name = format!(
        "agentrun-e2e-secret-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let mut planted = Planted(Vec::new());
    for dir in ["/root", "/home"] {
        let p = std::path::Path::new(dir).join(&name);
        if fs::create_dir(&p).is_ok() {
            fs::write(p.join("secret"), &name).unwrap();
            planted.0.push(p);
        }
    }
    assert!(
        !planted.0.is_empty(),
        "could not plant an entry in /root or /home"
    );
    let out = exec([
        "sh",
        "-c",
        "cat /etc/shadow 2>/dev/null; echo; echo ---; ls -A /root /home 2>/dev/null; \
         cat /root/agentrun-e2e-secret-*/secret /home/agentrun-e2e-secret-*/secret 2>/dev/null; true",
    ])
    .run();
    let stdout = out.success();
    let (shadow, homes) = stdout.split_once("---").unwrap();
    if let Ok(host_shadow) = fs::read_to_string("/etc/shadow") {
        // Every host entry with a password hash must be absent.
        for line in host_shadow.lines() {
            let hash = line.split(':').nth(1).unwrap_or("");
            if hash.len() > 3 {
                assert!(
                    !shadow.contains(hash),
                    "host password hash visible in the sandbox's /etc/shadow\n{out}"
                );
            }
        }
        assert_ne!(
            shadow.trim(),
            host_shadow.trim(),
            "host /etc/shadow visible"
        );
    }
    assert!(
        !homes.contains(&name),
        "the host's /root or /home visible in the sandbox\n{out}"
    );
    // Host-only entries (a toolchain's, a shell's history) are not there either.
    for host_only in [".cargo", ".rustup", ".pyenv", ".bash_history", ".ssh"] {
        if std::path::Path::new("/root").join(host_only).exists() {
            assert!(
                !homes.lines().any(|l| l.trim() == host_only),
                "host /root/{host_only} visible in the sandbox\n{out}"
            );
        }
    }
    drop(planted);
}

#[test]
fn host_files_not_reachable_by_path() {
    let Some(_l) = setup() else { return };
    // A file the test makes on the host outside any mount it asks for.
    let dir = tempdir();
    let secret = dir.path().join("secret.txt");
    fs::write(&secret, "top-secret-agentrun-e2e\n").unwrap();
    let out = exec([
        "sh",
        "-c",
        &format!(
            "cat {} 2>&1; cat /proc/1/root{} 2>&1; true",
            secret.display(),
            secret.display()
        ),
    ])
    .run();
    out.assert_code(0);
    assert!(
        !out.stdout().contains("top-secret-agentrun-e2e"),
        "host temp file readable inside\n{out}"
    );
}

/// Calls raw syscalls through ctypes and prints {name: [ret, errno]} as JSON.
const SYSCALLS_PY: &str = r#"
import ctypes, json, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
arch = platform.machine()
NR = {
  'x86_64': dict(ptrace=101, mount=165, unshare=272, keyctl=250, bpf=321, setns=308,
                 add_key=248, pivot_root=155, init_module=175, kexec_load=246,
                 open_by_handle_at=304, swapon=167, umount2=166),
  'aarch64': dict(ptrace=117, mount=40, unshare=97, keyctl=219, bpf=280, setns=268,
                  add_key=217, pivot_root=41, init_module=105, kexec_load=104,
                  open_by_handle_at=265, swapon=224, umount2=39),
}[arch]
L = ctypes.c_long
buf = ctypes.create_string_buffer(256)
calls = {
  'ptrace': (L(0), L(0), L(0), L(0)),                       # PTRACE_TRACEME
  'mount': (b'none', b'/tmp', b'tmpfs', L(0), None),
  'unshare_user': (L(0x10000000),),                          # CLONE_NEWUSER
  'unshare_mnt': (L(0x00020000),),                           # CLONE_NEWNS
  'keyctl': (L(0), L(-3), L(0)),                             # GET_KEYRING_ID(session)
  'add_key': (b'user', b'agentrun-e2e', b'x', L(1), L(-3)),
  'bpf': (L(5), buf, L(128)),                                # BPF_PROG_LOAD, zeroed attr
  'setns': (L(-1), L(0)),
  'pivot_root': (b'/tmp', b'/tmp'),
  'init_module': (None, L(0), b''),
  'kexec_load': (L(0), L(0), None, L(0)),
  'open_by_handle_at': (L(-1), None, L(0)),
  'swapon': (b'/nonexistent', L(0)),
  'umount2': (b'/proc', L(2)),                               # MNT_DETACH
}
res = {}
for name, args in calls.items():
    nr = NR[name.split('_')[0] if name.startswith('unshare') else name]
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *args)
    res[name] = [r, ctypes.get_errno()]
print(json.dumps(res))
"#;

#[test]
fn dangerous_syscalls_return_eperm() {
    let Some(_l) = setup() else { return };
    let out = exec(["python3", "-c", SYSCALLS_PY]).run();
    let stdout = out.success();
    let res: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}\n{out}"));
    let get = |name: &str| -> (i64, i64) {
        let v = &res[name];
        (v[0].as_i64().unwrap(), v[1].as_i64().unwrap())
    };
    let mut failures = Vec::new();
    // The contract: these fail with EPERM.
    for name in [
        "ptrace",
        "mount",
        "unshare_user",
        "unshare_mnt",
        "keyctl",
        "bpf",
    ] {
        let (r, e) = get(name);
        if r != -1 || e != libc::EPERM as i64 {
            failures.push(format!("{name}: ret {r} errno {e} (want -1 EPERM)"));
        }
    }
    // These must fail (whatever the errno).
    for name in [
        "add_key",
        "setns",
        "pivot_root",
        "init_module",
        "kexec_load",
        "open_by_handle_at",
        "swapon",
        "umount2",
    ] {
        let (r, e) = get(name);
        if r != -1 {
            failures.push(format!("{name}: succeeded (ret {r} errno {e})"));
        }
    }
    assert!(failures.is_empty(), "{}\n{out}", failures.join("\n"));
}

#[test]
fn seccomp_and_no_new_privs_are_on() {
    let Some(_l) = setup() else { return };
    let out = exec(["cat", "/proc/self/status"]).run();
    let stdout = out.success();
    let field = |k: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(
        field("Seccomp:"),
        "2",
        "seccomp filter mode expected\n{out}"
    );
    assert_eq!(field("NoNewPrivs:"), "1", "no_new_privs expected\n{out}");
}

#[test]
fn tcp_to_host_loopback_is_unreachable() {
    let Some(_l) = setup() else { return };
    let server = TcpServer::start("127.0.0.1");
    server.check_reachable_from_host("127.0.0.1");
    let before = server.accepted();
    assert_eq!(before, 1, "the host check connected once");
    let py = format!(
        r#"import socket
try:
    s = socket.create_connection(('127.0.0.1', {port}), timeout=3)
    print('CONNECTED', s.recv(100))
except OSError as e:
    print('blocked', type(e).__name__)
"#,
        port = server.port()
    );
    let out = exec(["python3", "-c", &py]).run();
    let stdout = out.success();
    assert!(
        stdout.starts_with("blocked"),
        "connected to the host's 127.0.0.1\n{out}"
    );
    assert_eq!(
        server.accepted(),
        before,
        "the host server saw a connection from the sandbox"
    );
}

#[test]
fn tcp_to_host_addresses_is_unreachable() {
    let Some(_l) = setup() else { return };
    let addrs = host_ipv4_addrs();
    if addrs.is_empty() {
        eprintln!("no non-loopback IPv4 address on this host; nothing to check");
        return;
    }
    let server = TcpServer::start("0.0.0.0");
    for a in &addrs {
        server.check_reachable_from_host(&a.to_string());
    }
    let before = server.accepted();
    let targets: Vec<String> = addrs.iter().map(|a| format!("'{a}'")).collect();
    let py = format!(
        r#"import socket
for ip in [{targets}]:
    try:
        s = socket.create_connection((ip, {port}), timeout=3)
        print('CONNECTED', ip)
    except OSError as e:
        print('blocked', ip, type(e).__name__)
"#,
        targets = targets.join(", "),
        port = server.port()
    );
    let out = exec(["python3", "-c", &py]).run();
    let stdout = out.success();
    assert!(!stdout.contains("CONNECTED"), "reached the host\n{out}");
    assert_eq!(
        server.accepted(),
        before,
        "the host server saw a connection from the sandbox"
    );
}

#[test]
fn only_loopback_interface() {
    let Some(_l) = setup() else { return };
    let out = exec([
        "python3",
        "-c",
        "import socket; print(' '.join(sorted(n for _, n in socket.if_nameindex())))",
    ])
    .run();
    assert_eq!(out.success(), "lo\n", "only lo expected inside\n{out}");
}

#[test]
fn host_abstract_unix_socket_is_unreachable() {
    let Some(_l) = setup() else { return };
    use std::os::linux::net::SocketAddrExt;
    let name = format!("agentrun-e2e-{}", std::process::id());
    let addr = UnixAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).expect("bind abstract socket");
    // Reachable from the host.
    let c = std::os::unix::net::UnixStream::connect_addr(&addr).expect("host connect");
    drop(c);
    listener.accept().expect("host accept");
    listener.set_nonblocking(true).unwrap();
    let py = format!(
        r#"import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect('\0{name}')
    print('CONNECTED')
except OSError as e:
    print('blocked', type(e).__name__)
"#
    );
    let out = exec(["python3", "-c", &py]).run();
    let stdout = out.success();
    assert!(
        stdout.starts_with("blocked"),
        "reached the host's abstract socket\n{out}"
    );
    assert!(listener.accept().is_err(), "host socket saw a connection");
}

#[test]
fn pid_namespace_hides_host_processes() {
    let Some(_l) = setup() else { return };
    let out = exec([
        "python3",
        "-c",
        "import os; print(' '.join(sorted((p for p in os.listdir('/proc') if p.isdigit()), key=int)))",
    ])
    .run();
    let pids: Vec<u32> = out
        .success()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(
        pids.len() <= 5 && pids.contains(&1),
        "only the sandbox's own processes expected in /proc: {pids:?}"
    );
}

#[test]
fn sandbox_root_is_unprivileged_on_host() {
    let Some(_l) = setup() else { return };
    let out = exec(["sh", "-c", "id -u; id -g"]).run();
    assert_eq!(out.success(), "0\n0\n", "uid/gid 0 inside\n{out}");

    let tag = format!("3.{}", 100 + std::process::id() % 900);
    let mut bg = exec(["sleep", &tag]).spawn();
    let procs = wait_until(Duration::from_secs(20), || {
        let v: Vec<ProcInfo> = all_processes()
            .into_iter()
            .filter(|p| p.cmdline == ["sleep", tag.as_str()])
            .collect();
        (!v.is_empty()).then_some(v)
    });
    let Some(procs) = procs else {
        let out = bg.wait_or_kill(Duration::from_secs(30));
        panic!("the sandboxed sleep never showed up on the host\n{out}");
    };
    let p = &procs[0];
    assert!(
        p.uid >= SANDBOX_UID_BASE,
        "sandbox uid 0 must be an unprivileged host uid (>= {SANDBOX_UID_BASE}): {p}"
    );
    assert!(
        p.cgroup.contains("/agentrun/"),
        "sandbox process must be in an agentrun cgroup: {p}"
    );
    // Everything else in its cgroup is unprivileged too (its init included).
    let cg_line = p
        .cgroup
        .lines()
        .find(|l| l.contains("/agentrun/"))
        .unwrap()
        .split(':')
        .nth(2)
        .unwrap()
        .to_string();
    for q in all_processes() {
        if q.cgroup.lines().any(|l| l.ends_with(&cg_line)) {
            assert!(
                q.uid >= SANDBOX_UID_BASE,
                "privileged process in the sandbox: {q}"
            );
        }
    }
    let out = bg.wait_or_kill(Duration::from_secs(30));
    out.assert_code(0);
}

#[test]
fn proc_and_sys_are_not_writable() {
    let Some(_l) = setup() else { return };
    let out = exec([
        "sh",
        "-c",
        r#"for p in /proc/sys/kernel/hostname /proc/sysrq-trigger /sys/kernel/mm/transparent_hugepage/enabled; do
             if [ -e "$p" ] && (echo x > "$p") 2>/dev/null; then echo "WROTE $p"; fi
           done; true"#,
    ])
    .run();
    assert!(!out.success().contains("WROTE"), "{out}");
}

#[test]
fn read_whole_host_fs_denied_via_devices() {
    let Some(_l) = setup() else { return };
    // No block devices or /dev/mem style access.
    let out = exec([
        "sh",
        "-c",
        r#"for d in /dev/vda /dev/sda /dev/nvme0n1 /dev/mem /dev/kmem /dev/port; do
             if [ -e "$d" ] && head -c 1 "$d" >/dev/null 2>&1; then echo "READ $d"; fi
           done; true"#,
    ])
    .run();
    assert!(!out.success().contains("READ"), "{out}");
}

#[test]
fn hostname_change_does_not_reach_host() {
    let Some(_l) = setup() else { return };
    let host_before = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let out = exec([
        "python3",
        "-c",
        "import socket\ntry:\n    socket.sethostname('agentrun-e2e-x')\nexcept OSError as e:\n    print('denied', e.errno)\nprint(socket.gethostname())",
    ])
    .run();
    out.assert_code(0);
    assert_eq!(
        fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        host_before,
        "the host's hostname changed\n{out}"
    );
}

#[test]
fn cgroup_limits_cannot_be_raised_from_inside() {
    let Some(_l) = setup() else { return };
    // Try to write every limit file visible under /sys/fs/cgroup (own cgroup included).
    let out = exec_with(
        ["--pids", "64", "--memory", "64M"],
        [
            "sh",
            "-c",
            r#"find /sys/fs/cgroup \( -name pids.max -o -name memory.max -o -name memory.limit_in_bytes -o -name memory.memsw.limit_in_bytes -o -name cpu.max -o -name cpu.cfs_quota_us -o -name cgroup.procs \) 2>/dev/null |
               while read -r f; do
                 case "$f" in *cgroup.procs) v=1 ;; *memory*) v=-1 ;; *) v=max ;; esac
                 if (echo "$v" > "$f") 2>/dev/null; then echo "WROTE $f"; fi
               done; true"#,
        ],
    )
    .run();
    assert!(!out.success().contains("WROTE"), "{out}");
}

#[test]
fn io_uring_is_blocked() {
    // Not in the written contract, but io_uring is a large kernel attack surface that
    // Docker's and containerd's default seccomp profiles block; a sandbox for untrusted code
    // should too.
    let Some(_l) = setup() else { return };
    let py = r#"
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)
nr = {'x86_64': 425, 'aarch64': 425}[platform.machine()]
r = libc.syscall(ctypes.c_long(nr), ctypes.c_long(4), params)
print(r, ctypes.get_errno())
"#;
    let out = exec(["python3", "-c", py]).run();
    let stdout = out.success();
    let r: i64 = stdout
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert_eq!(r, -1, "io_uring_setup succeeded inside the sandbox\n{out}");
}

/// Runs `py` in a sandbox (the default profile) and parses the JSON it prints last.
fn python_json(py: &str) -> (serde_json::Value, RunOutput) {
    let out = exec(["python3", "-c", py]).run();
    let stdout = out.success();
    let last = stdout.lines().last().unwrap_or_default().to_owned();
    let v = serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}\n{out}"));
    (v, out)
}

#[test]
fn vsock_and_other_socket_families_are_refused() {
    // On a VM host (this one), AF_VSOCK reaches the hypervisor from any network namespace:
    // before the fix `socket(40, 1)` worked and `connect((2, 1024))` got ECONNRESET from the
    // host. Families a sandbox does not need fail as if the kernel lacked them.
    let Some(_l) = setup() else { return };
    let py = r#"
import errno, json, socket
def try_socket(family, type_=socket.SOCK_STREAM, proto=0):
    try:
        s = socket.socket(family, type_, proto)
        s.close()
        return 0
    except OSError as e:
        return e.errno
def try_pair(family):
    try:
        a, b = socket.socketpair(family, socket.SOCK_STREAM)
        a.close(); b.close()
        return 0
    except OSError as e:
        return e.errno
res = {
  'vsock': try_socket(40),
  'vsock_dgram': try_socket(40, socket.SOCK_DGRAM),
  'packet': try_socket(17, socket.SOCK_RAW),
  'alg': try_socket(38, socket.SOCK_SEQPACKET),
  'key': try_socket(15, socket.SOCK_RAW, 2),
  'bluetooth': try_socket(31, socket.SOCK_STREAM),
  'vsock_pair': try_pair(40),
  'netlink_audit': try_socket(16, socket.SOCK_RAW, 9),
  'netlink_sock_diag': try_socket(16, socket.SOCK_RAW, 4),
  'netlink_generic': try_socket(16, socket.SOCK_RAW, 16),
  'unix': try_socket(socket.AF_UNIX),
  'unix_pair': try_pair(socket.AF_UNIX),
  'inet': try_socket(socket.AF_INET),
  'inet6': try_socket(socket.AF_INET6),
  'netlink_route': try_socket(16, socket.SOCK_RAW, 0),
  # (`strict` cannot read /etc/hosts: no name resolves there)
  'getaddrinfo': socket.getaddrinfo('127.0.0.1', 80)[0][4][1],
}
# The attack itself: a vsock connection to the host (CID 2).
try:
    s = socket.socket(40, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect((2, 1024))
    res['vsock_connect'] = 'connected'
except OSError as e:
    res['vsock_connect'] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(res))
"#;
    let (res, out) = python_json(py);
    let eafnosupport = libc::EAFNOSUPPORT as i64;
    let eprotonosupport = libc::EPROTONOSUPPORT as i64;
    let mut failures = Vec::new();
    for (name, want) in [
        ("vsock", eafnosupport),
        ("vsock_dgram", eafnosupport),
        ("packet", eafnosupport),
        ("alg", eafnosupport),
        ("key", eafnosupport),
        ("bluetooth", eafnosupport),
        ("vsock_pair", eafnosupport),
        ("netlink_audit", eprotonosupport),
        ("netlink_sock_diag", eprotonosupport),
        ("netlink_generic", eprotonosupport),
        ("unix", 0),
        ("unix_pair", 0),
        ("inet", 0),
        ("inet6", 0),
        ("netlink_route", 0),
        ("getaddrinfo", 80),
    ] {
        if res[name].as_i64() != Some(want) {
            failures.push(format!("{name}: got {} want {want}", res[name]));
        }
    }
    if res["vsock_connect"] != "EAFNOSUPPORT" {
        failures.push(format!("vsock connect: {}", res["vsock_connect"]));
    }
    assert!(failures.is_empty(), "{}\n{out}", failures.join("\n"));
}

#[test]
fn x32_syscall_numbers_are_refused() {
    // x32 syscalls are x86_64 numbers with bit 30 set; seccompiler's rules match exact
    // numbers, so on a kernel with x32 `syscall(0x40000000 | 272, CLONE_NEWUSER)` passed every
    // deny rule. This kernel has no x32 (CONFIG_X86_X32_ABI unset) and would answer ENOSYS by
    // itself: the filter's EPERM is what shows the number was refused before the kernel saw it.
    let Some(_l) = setup() else { return };
    if std::env::consts::ARCH != "x86_64" {
        eprintln!("x32 exists only on x86_64; nothing to check");
        return;
    }
    let py = r#"
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
X32 = 0x40000000
res = {}
for name, nr, args in [('unshare_newuser', X32 | 272, (L(0x10000000),)),
                       ('getpid', X32 | 39, ()),
                       ('read', X32 | 0, (L(0), None, L(0)))]:
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *args)
    res[name] = [r, ctypes.get_errno()]
print(json.dumps(res))
"#;
    let (res, out) = python_json(py);
    for name in ["unshare_newuser", "getpid", "read"] {
        assert_eq!(
            (res[name][0].as_i64(), res[name][1].as_i64()),
            (Some(-1), Some(libc::EPERM as i64)),
            "{name} through its x32 number: want -1 EPERM (ENOSYS means the filter let it \
             through to the kernel)\n{out}"
        );
    }
}

#[test]
fn i386_syscalls_kill_the_process() {
    // `int 0x80` from a 64-bit process makes an i386 syscall (this kernel has
    // IA32_EMULATION): its numbers differ from x86_64's, so a filter that did not check the
    // audit architecture would let `mount`, `unshare`, ... through under other numbers.
    // seccompiler's filters and agentrun's ABI guard kill the process (SIGSYS).
    let Some(_l) = setup() else { return };
    if std::env::consts::ARCH != "x86_64" {
        eprintln!("int 0x80 is x86 only; nothing to check");
        return;
    }
    let py = r#"
import ctypes, mmap, sys
# mov eax, 20 (i386 getpid); int 0x80; ret
code = bytes([0xb8, 0x14, 0, 0, 0, 0xcd, 0x80, 0xc3])
m = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
f = ctypes.CFUNCTYPE(ctypes.c_int)(addr)
print('before', flush=True)
print('i386 getpid returned', f(), flush=True)
"#;
    let out = exec(["python3", "-c", py]).run();
    assert!(
        out.stdout().contains("before"),
        "the helper did not run\n{out}"
    );
    assert!(
        !out.stdout().contains("returned"),
        "an i386 syscall ran inside the sandbox\n{out}"
    );
    out.assert_code(128 + libc::SIGSYS);
}

#[test]
fn ioctl_personality_and_pidfd_getfd_are_refused() {
    let Some(_l) = setup() else { return };
    let py = r#"
import ctypes, json, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
NR = {'x86_64': dict(ioctl=16, personality=135, pidfd_open=434, pidfd_getfd=438),
      'aarch64': dict(ioctl=29, personality=92, pidfd_open=434, pidfd_getfd=438)}[platform.machine()]
def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(NR[name]), *args)
    return [r, ctypes.get_errno()]
c = ctypes.c_char(b'x')
res = {}
# TIOCSTI / TIOCLINUX with garbage in the upper 32 bits: the kernel uses the low 32.
res['tiocsti_hi'] = call('ioctl', L(0), L(0x100005412), ctypes.byref(c))
res['tioclinux_hi'] = call('ioctl', L(0), L(0xffffffff0000541c), ctypes.byref(c))
res['tiocsti'] = call('ioctl', L(0), L(0x5412), ctypes.byref(c))
# personality: Docker's values pass, READ_IMPLIES_EXEC and ADDR_NO_RANDOMIZE do not.
res['personality_query'] = call('personality', L(0xffffffff))
res['personality_linux'] = call('personality', L(0))
res['personality_read_implies_exec'] = call('personality', L(0x0400000))
res['personality_no_randomize'] = call('personality', L(0x0040000))
# pidfd_getfd: take an fd from a process (here our own, which ptrace rules allow).
pidfd = call('pidfd_open', L(os.getpid()), L(0))
res['pidfd_open'] = pidfd
res['pidfd_getfd'] = call('pidfd_getfd', L(pidfd[0]), L(1), L(0))
print(json.dumps(res))
"#;
    let (res, out) = python_json(py);
    let get = |k: &str| (res[k][0].as_i64().unwrap(), res[k][1].as_i64().unwrap());
    let eperm = (-1, libc::EPERM as i64);
    let mut failures = Vec::new();
    for k in [
        "tiocsti_hi",
        "tioclinux_hi",
        "tiocsti",
        "personality_read_implies_exec",
        "personality_no_randomize",
        "pidfd_getfd",
    ] {
        if get(k) != eperm {
            failures.push(format!("{k}: {:?}, want -1 EPERM", get(k)));
        }
    }
    for k in ["personality_query", "personality_linux", "pidfd_open"] {
        if get(k).0 < 0 {
            failures.push(format!("{k}: {:?}, want success", get(k)));
        }
    }
    assert!(failures.is_empty(), "{}\n{out}", failures.join("\n"));
}

#[test]
fn sandbox_init_is_not_dumpable() {
    // The command shares the init's uid and Landlock domain; only the init being
    // non-dumpable keeps its memory, environment and fds out of the command's reach.
    let Some(_l) = setup() else { return };
    let py = r#"
import json
res = {}
for f in ['environ', 'mem', 'fd/0']:
    try:
        open('/proc/1/' + f, 'rb').close()
        res[f] = 'opened'
    except OSError as e:
        res[f] = e.errno
print(json.dumps(res))
"#;
    let (res, out) = python_json(py);
    for f in ["environ", "mem", "fd/0"] {
        assert_eq!(
            res[f].as_i64(),
            Some(libc::EACCES as i64),
            "/proc/1/{f} of the init must not open from the command\n{out}"
        );
    }
}

#[test]
fn landlock_rules_do_not_follow_links_in_the_image() {
    // An image whose /tmp links to /: the default profile's write rule on /tmp, opened
    // following the link, made the whole root writable (`echo x > /etc/x` worked).
    let Some(_l) = setup() else { return };
    if host_landlock_abi() < 1 {
        panic!("this host has no Landlock; the test needs it");
    }
    let dir = tempdir();
    let root = dir.path().join("root");
    agentrun_e2e::images::busybox_variant(dir.path(), &root, "tmplink", |rootfs| {
        let tmp = rootfs.join("tmp");
        if tmp.exists() {
            fs::remove_dir_all(&tmp).unwrap();
        }
        std::os::unix::fs::symlink("/", &tmp).unwrap();
    });
    // The suite's profile, when it has such a rule: one that lets a run write /etc anyway
    // (`container`, `build`: the whole root) has no /tmp rule to follow, and is tested
    // with `default`.
    let profile = if e2e_profile_allows("write", "/etc/x") {
        "default".to_string()
    } else {
        e2e_profile().unwrap_or_else(|| "default".into())
    };
    let run_in = |img: &str, cmd: &str| {
        exec_with(["--profile", &profile, "--image", img], ["sh", "-c", cmd])
            .root(&root)
            .env("AGENTRUN_NO_DAEMON", "1")
            .run()
    };
    let out = run_in(
        "tmplink",
        "echo x > /etc/x && echo WROTE-ETC; ls /etc/x 2>/dev/null",
    );
    assert!(
        !out.stdout().contains("WROTE-ETC"),
        "the image's /tmp -> / link made /etc writable\n{out}"
    );
    out.assert_code(125);
    assert!(
        out.stderr().contains("/tmp") && out.stderr().contains("symlink"),
        "the refusal must name the path and say why\n{out}"
    );
    // The same image with /tmp a real directory runs, and /etc stays read-only.
    agentrun_e2e::images::busybox_variant(dir.path(), &root, "plain", |_| {});
    let out = run_in(
        "plain",
        "echo x > /tmp/x && echo tmp-ok; (echo x > /etc/x) 2>/dev/null && echo WROTE-ETC; true",
    );
    let stdout = out.success();
    assert!(
        stdout.contains("tmp-ok") && !stdout.contains("WROTE-ETC"),
        "{out}"
    );
}

#[test]
fn merged_usr_links_still_work_under_strict() {
    // Readable rules follow the image's links inside the root when the target is already
    // readable: the host image's /bin -> usr/bin under `strict` (readable /usr, /bin, ...).
    let Some(_l) = setup() else { return };
    let out = exec_with(
        ["--profile", "strict"],
        ["sh", "-c", "ls /bin/sh /lib >/dev/null && echo ok"],
    )
    .run();
    assert_eq!(out.success(), "ok\n", "{out}");
}
