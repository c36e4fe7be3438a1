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
           echo ws > /workspace/{m} && echo "ws ok""#,
        m = marker
    );
    let out = exec_with(
        ["--workspace".as_ref(), ws.path().as_os_str()],
        ["sh", "-c", &script],
    )
    .run();
    let stdout = out.success();
    assert!(
        !stdout.contains("WROTE"),
        "write outside workspace succeeded\n{out}"
    );
    assert!(stdout.contains("tmp ok"), "/tmp must be writable\n{out}");
    assert!(
        stdout.contains("ws ok"),
        "/workspace must be writable\n{out}"
    );
    for p in ["/etc", "/usr", "/", "/usr/bin", "/var", "/tmp"] {
        let host = std::path::Path::new(p).join(&marker);
        assert!(!host.exists(), "{} appeared on the host", host.display());
    }
}

#[test]
fn host_secrets_are_not_visible() {
    let Some(_l) = setup() else { return };
    let out = exec([
        "sh",
        "-c",
        "cat /etc/shadow 2>/dev/null; echo; echo ---; ls -A /root /home 2>/dev/null; true",
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
    // Whatever /root and /home list must not be the host's.
    for dir in ["/root", "/home"] {
        if let Ok(rd) = fs::read_dir(dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') && name.len() < 4 {
                    continue;
                }
                assert!(
                    !homes.lines().any(|l| l.trim() == name),
                    "host {dir}/{name} visible in the sandbox\n{out}"
                );
            }
        }
    }
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
