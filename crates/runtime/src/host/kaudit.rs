//! Landlock denials as the kernel reports them, read from the audit subsystem.
//!
//! On Landlock ABI 7+ the sandbox's ruleset asks for its command's denials to be logged
//! ([`crate::confine::landlock`]). The kernel then emits, while audit is enabled on the host:
//! - `AUDIT_LANDLOCK_ACCESS` (1423): `domain=<id> blockers=<rights> path="..."` (or other
//!   object fields), one per denied access;
//! - `AUDIT_LANDLOCK_DOMAIN` (1424): `domain=<id> status=allocated ... pid=<creator>` the
//!   first time a domain denies something, and `status=deallocated denials=<n>` when it is
//!   freed.
//!
//! [`LandlockWatch`] listens on the audit multicast group (`AUDIT_NLGRP_READLOG`, needs
//! CAP_AUDIT_READ) on a thread while a sandbox runs, and [`LandlockWatch::finish`] returns the
//! access records of the domain created by that sandbox's init (matched by its host pid).
//! It never changes the host's audit configuration; the one thing it writes is a sync record
//! per watched run (see [`LandlockWatch::finish`]). When audit is
//! disabled (`auditctl -e 0`, the default without auditd) the kernel emits nothing and there
//! is nothing to observe; [`audit_enabled`] says which case applies.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const NETLINK_AUDIT: libc::c_int = 9;
const AUDIT_GET: u16 = 1000;
const AUDIT_NLGRP_READLOG: u32 = 1;
/// "Trusted application" user record: the marker [`LandlockWatch::finish`] sends.
const AUDIT_TRUSTED_APP: u16 = 1121;
const AUDIT_LANDLOCK_ACCESS: u16 = 1423;
const AUDIT_LANDLOCK_DOMAIN: u16 = 1424;
const NLMSG_HDRLEN: usize = 16;

/// One denied access, as the kernel logged it.
#[derive(Debug, Clone, PartialEq)]
pub struct LandlockDenial {
    /// Seconds since the epoch (with milliseconds) from the record's `audit(...)` stamp.
    pub time: f64,
    /// The Landlock rights that blocked it, e.g. `fs.read_file`, `fs.write_file`.
    pub blockers: Vec<String>,
    /// The object: a path for filesystem accesses, otherwise the record's other fields.
    pub object: String,
    /// Whether `object` is a path.
    pub is_path: bool,
}

fn netlink_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned right below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_AUDIT,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn bind(fd: &OwnedFd, groups: u32) -> io::Result<()> {
    // SAFETY: sockaddr_nl is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_groups = groups;
    // SAFETY: bind with a valid sockaddr_nl of the right size.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits for a datagram on `fd` and reads it. `Ok(None)`: `timeout` passed (`None`: no
/// timeout), or `wake` became readable or was closed by its other end.
fn recv(
    fd: &OwnedFd,
    wake: Option<&UnixStream>,
    timeout: Option<Duration>,
    buf: &mut [u8],
) -> io::Result<Option<usize>> {
    let pollfd = |fd: RawFd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut pfds = vec![pollfd(fd.as_raw_fd())];
    pfds.extend(wake.map(|w| pollfd(w.as_raw_fd())));
    let ms = timeout.map_or(-1, |t| t.as_millis() as libc::c_int);
    // SAFETY: poll on valid pollfds we own, of their number.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 || pfds.get(1).is_some_and(|w| w.revents != 0) {
        return Ok(None);
    }
    // Non-blocking: a wake-up must never wait behind a recv (poll said readable; EAGAIN
    // would mean the datagram went away).
    let flags = nix::sys::socket::MsgFlags::MSG_DONTWAIT;
    let n = nix::sys::socket::recv(fd.as_raw_fd(), buf, flags).map_err(io::Error::from)?;
    Ok(Some(n))
}

/// Whether the host's audit subsystem is enabled (so Landlock denials are emitted at all).
pub fn audit_enabled() -> io::Result<bool> {
    let fd = request(AUDIT_GET, &[])?;
    let mut buf = vec![0u8; 8192];
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let Some(n) = recv(&fd, None, Some(Duration::from_millis(200)), &mut buf)? else {
            continue;
        };
        for (ty, payload) in messages(&buf[..n]) {
            if ty == AUDIT_GET && payload.len() >= 8 {
                // struct audit_status { u32 mask; u32 enabled; ... }
                let enabled = u32::from_ne_bytes(payload[4..8].try_into().unwrap_or_default());
                return Ok(enabled != 0);
            }
            if ty == libc::NLMSG_ERROR as u16 && payload.len() >= 4 {
                let err = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                if err != 0 {
                    return Err(io::Error::from_raw_os_error(-err));
                }
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "no AUDIT_GET reply",
    ))
}

/// Splits a netlink datagram into (type, payload).
fn messages(mut buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(buf[..4].try_into().unwrap_or_default()) as usize;
        let ty = u16::from_ne_bytes(buf[4..6].try_into().unwrap_or_default());
        if len < NLMSG_HDRLEN || len > buf.len() {
            break;
        }
        out.push((ty, &buf[NLMSG_HDRLEN..len]));
        let aligned = (len + 3) & !3;
        buf = &buf[aligned.min(buf.len())..];
    }
    out
}

/// A Landlock record, parsed.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    ty: u16,
    time: f64,
    fields: HashMap<String, String>,
    /// Field names in order (for rendering non-path objects).
    order: Vec<String>,
}

/// Parses `audit(1795309688.905:2): k=v k="quoted v" ...`; hex-encoded values of `path`
/// (used by the kernel for names with special characters) are decoded.
fn parse_record(ty: u16, text: &str) -> Option<Record> {
    let text = text.trim_end_matches('\0').trim();
    let rest = text.strip_prefix("audit(")?;
    let (stamp, rest) = rest.split_once("):")?;
    let time = stamp.split(':').next()?.parse::<f64>().ok()?;
    let mut fields = HashMap::new();
    let mut order = Vec::new();
    let mut s = rest.trim_start();
    while !s.is_empty() {
        let (key, after) = s.split_once('=')?;
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (q[..end].to_string(), &q[end + 1..])
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            let raw = &after[..end];
            let decoded = if key == "path" || key == "name" {
                hex_decode(raw).unwrap_or_else(|| raw.to_string())
            } else {
                raw.to_string()
            };
            (decoded, &after[end..])
        };
        order.push(key.to_string());
        fields.insert(key.to_string(), value);
        s = next.trim_start();
    }
    Some(Record {
        ty,
        time,
        fields,
        order,
    })
}

fn hex_decode(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) || s.is_empty() || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect();
    Some(String::from_utf8_lossy(&bytes?).into_owned())
}

/// Collects Landlock records while a sandbox runs.
pub struct LandlockWatch {
    shared: Arc<Collected>,
    /// Closing it wakes the collecting thread, which then exits.
    wake: UnixStream,
    thread: JoinHandle<()>,
    /// Text of the sync record [`LandlockWatch::finish`] sends (see there).
    marker: String,
}

/// What the collecting thread found, and a condvar signalled after each batch.
#[derive(Default)]
struct Collected {
    state: Mutex<CollectedState>,
    changed: Condvar,
}

#[derive(Default)]
struct CollectedState {
    records: Vec<Record>,
    marker_seen: bool,
}

/// A subscription to the audit multicast group whose records are not read yet: the kernel
/// queues them on the socket until [`LandlockSubscription::watch`] starts reading.
///
/// It lets a caller subscribe before a run starts (so no record is missed) and ask whether
/// audit is on ([`audit_enabled`], ~1 ms: the kernel answers AUDIT_GET from a kthread it
/// creates for the reply) while the run already goes.
pub struct LandlockSubscription {
    fd: OwnedFd,
}

impl LandlockSubscription {
    /// Subscribes to the audit multicast group (a socket and a bind, no thread).
    pub fn new() -> io::Result<LandlockSubscription> {
        let fd = netlink_socket()?;
        bind(&fd, 1 << (AUDIT_NLGRP_READLOG - 1))?;
        Ok(LandlockSubscription { fd })
    }

    /// Starts collecting on a thread, beginning with what was queued since the subscription
    /// (the process may be multi-threaded from here on).
    pub fn watch(self) -> io::Result<LandlockWatch> {
        LandlockWatch::collect(self.fd)
    }
}

impl LandlockWatch {
    /// Subscribes to the audit multicast group and starts collecting on a thread. Call after
    /// the sandbox was created (the process may be multi-threaded from here on).
    pub fn start() -> io::Result<LandlockWatch> {
        LandlockSubscription::new()?.watch()
    }

    fn collect(fd: OwnedFd) -> io::Result<LandlockWatch> {
        static WATCHES: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let marker = format!(
            "agentrun-landlock-sync={}.{}.{}",
            std::process::id(),
            now.as_nanos(),
            WATCHES.fetch_add(1, Ordering::Relaxed)
        );
        let shared = Arc::new(Collected::default());
        let (wake, wake_rx) = UnixStream::pair()?;
        let (shared2, marker2) = (shared.clone(), marker.clone());
        let thread = std::thread::Builder::new()
            .name("landlock-audit".into())
            .spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                // Until the watch's end closes the other side of `wake_rx`.
                loop {
                    let n = match recv(&fd, Some(&wake_rx), None, &mut buf) {
                        Ok(Some(n)) => n,
                        Ok(None) => break,
                        // EINTR, EAGAIN, or ENOBUFS (records were dropped): keep listening.
                        Err(e)
                            if matches!(
                                e.raw_os_error(),
                                Some(libc::EINTR | libc::EAGAIN | libc::ENOBUFS)
                            ) =>
                        {
                            continue
                        }
                        Err(_) => break,
                    };
                    let mut parsed = Vec::new();
                    let mut marker_seen = false;
                    for (ty, p) in messages(&buf[..n]) {
                        let text = String::from_utf8_lossy(p);
                        if ty == AUDIT_LANDLOCK_ACCESS || ty == AUDIT_LANDLOCK_DOMAIN {
                            parsed.extend(parse_record(ty, &text));
                        } else if ty == AUDIT_TRUSTED_APP && text.contains(marker2.as_str()) {
                            marker_seen = true;
                        }
                    }
                    let mut st = shared2.state.lock().unwrap_or_else(|e| e.into_inner());
                    st.records.extend(parsed);
                    st.marker_seen |= marker_seen;
                    shared2.changed.notify_all();
                }
            })?;
        Ok(LandlockWatch {
            shared,
            wake,
            thread,
            marker,
        })
    }

    /// Stops collecting and returns the denials of the domain created by the init whose host
    /// pid is `init_pid` (call after it exited).
    ///
    /// Records reach listeners asynchronously, through kauditd's queue. To know that every
    /// record of the run was delivered, it sends one user-space record of its own
    /// (`AUDIT_TRUSTED_APP`, `agentrun-landlock-sync=<pid>.<ns>.<n>`, so one line per run in
    /// the host's audit log) and waits until it comes back: kauditd delivers in order, so
    /// everything the run logged came before it (~1 ms). If the marker cannot be sent or
    /// does not come back (a host audit rule may drop user records), it waits 50 ms instead.
    /// Once the domain is known to have denied something, it waits up to 1 s for the
    /// domain's deallocation record, which comes after all of its access records.
    pub fn finish(self, init_pid: i32) -> Vec<LandlockDenial> {
        let started = Instant::now();
        let synced = send_user_record(&self.marker).is_ok();
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let elapsed = started.elapsed();
            let ours = domains_of(&st.records, init_pid);
            let freed = !ours.is_empty()
                && ours.iter().all(|d| {
                    st.records.iter().any(|r| {
                        r.ty == AUDIT_LANDLOCK_DOMAIN
                            && r.fields.get("domain") == Some(*d)
                            && r.fields.get("status").is_some_and(|s| s == "deallocated")
                    })
                });
            let delivered = (synced && st.marker_seen) || elapsed >= Duration::from_millis(50);
            if elapsed >= Duration::from_secs(1) || freed || (ours.is_empty() && delivered) {
                break;
            }
            let left = Duration::from_secs(1).saturating_sub(elapsed);
            st = self
                .shared
                .changed
                .wait_timeout(st, left.min(Duration::from_millis(10)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let denials = denials_of(&st.records, init_pid);
        drop(st);
        drop(self.wake);
        // Dropped: the thread's panic is not ours to surface on the way out (it only reads).
        let _ = self.thread.join();
        denials
    }
}

/// Sends `text` as a user-space audit record (`AUDIT_TRUSTED_APP`; needs CAP_AUDIT_WRITE and
/// the initial pid namespace). The kernel logs it, and multicasts it, in order with every
/// other record.
fn send_user_record(text: &str) -> io::Result<()> {
    let mut payload = text.as_bytes().to_vec();
    payload.push(0);
    request(AUDIT_TRUSTED_APP, &payload).map(drop)
}

/// Sends one audit netlink request (no ACK asked) from a fresh socket, which it returns for
/// the reply, if any.
fn request(ty: u16, payload: &[u8]) -> io::Result<OwnedFd> {
    let fd = netlink_socket()?;
    bind(&fd, 0)?;
    let len = NLMSG_HDRLEN + payload.len();
    let mut req = Vec::with_capacity(len);
    req.extend_from_slice(&(len as u32).to_ne_bytes());
    req.extend_from_slice(&ty.to_ne_bytes());
    req.extend_from_slice(&((libc::NLM_F_REQUEST) as u16).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(payload);
    // SAFETY: send of a buffer we own.
    if unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The ids of the domains `init_pid` allocated (their first denial logs the allocation).
fn domains_of(records: &[Record], init_pid: i32) -> Vec<&String> {
    let pid = init_pid.to_string();
    records
        .iter()
        .filter(|r| {
            r.ty == AUDIT_LANDLOCK_DOMAIN
                && r.fields.get("status").is_some_and(|s| s == "allocated")
                && r.fields.get("pid") == Some(&pid)
        })
        .filter_map(|r| r.fields.get("domain"))
        .collect()
}

/// The access records of the domain(s) allocated by `init_pid`.
fn denials_of(records: &[Record], init_pid: i32) -> Vec<LandlockDenial> {
    let domains = domains_of(records, init_pid);
    records
        .iter()
        .filter(|r| r.ty == AUDIT_LANDLOCK_ACCESS)
        .filter(|r| r.fields.get("domain").is_some_and(|d| domains.contains(&d)))
        .map(|r| {
            let blockers = r
                .fields
                .get("blockers")
                .map(|b| b.split(',').map(str::to_string).collect())
                .unwrap_or_default();
            let (object, is_path) = match r.fields.get("path") {
                Some(p) => (p.clone(), true),
                None => (
                    r.order
                        .iter()
                        .filter(|k| *k != "domain" && *k != "blockers")
                        .map(|k| format!("{k}={}", r.fields[k]))
                        .collect::<Vec<_>>()
                        .join(" "),
                    false,
                ),
            };
            LandlockDenial {
                time: r.time,
                blockers,
                object,
                is_path,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_landlock_records_and_matches_the_domain() {
        let recs: Vec<Record> = [
            (1423, "audit(1795309688.905:2): domain=15e76d2f2 blockers=fs.read_file path=\"/etc/ld.so.cache\" dev=\"overlay\" ino=10135600"),
            (1424, "audit(1795309688.905:2): domain=15e76d2f2 status=allocated mode=enforcing pid=4600 uid=100000000 exe=\"/x/agentrun\" comm=\"youki:[2:INIT]\""),
            (1423, "audit(1795309688.909:6): domain=15e76d2f2 blockers=fs.read_dir path=2F726F6F742F61206220 dev=\"overlay\" ino=10"),
            (1423, "audit(1795309688.909:7): domain=99 blockers=fs.write_file,fs.truncate path=\"/other\""),
            (1424, "audit(1795309688.909:7): domain=99 status=allocated mode=enforcing pid=1 uid=0"),
            (1423, "audit(1795309688.909:8): domain=15e76d2f2 blockers=scope.signal opid=1 ocomm=\"x\""),
        ]
        .iter()
        .map(|(t, s)| parse_record(*t, s).unwrap())
        .collect();
        let d = denials_of(&recs, 4600);
        assert_eq!(d.len(), 3, "{d:?}");
        assert_eq!(d[0].object, "/etc/ld.so.cache");
        assert_eq!(d[0].blockers, vec!["fs.read_file"]);
        assert!((d[0].time - 1795309688.905).abs() < 1e-6);
        assert_eq!(d[1].object, "/root/a b ", "hex path decoded");
        assert!(!d[2].is_path);
        assert_eq!(d[2].object, "opid=1 ocomm=x");
        assert!(denials_of(&recs, 1234).is_empty());
    }

    #[test]
    fn splits_netlink_messages() {
        let mut buf = Vec::new();
        for (ty, payload) in [(1423u16, &b"abc"[..]), (1424, &b"defgh"[..])] {
            let len = NLMSG_HDRLEN + payload.len();
            buf.extend_from_slice(&(len as u32).to_ne_bytes());
            buf.extend_from_slice(&ty.to_ne_bytes());
            buf.extend_from_slice(&[0u8; 10]);
            buf.extend_from_slice(payload);
            while buf.len() % 4 != 0 {
                buf.push(0);
            }
        }
        let m = messages(&buf);
        assert_eq!(m, vec![(1423, &b"abc"[..]), (1424, &b"defgh"[..])]);
    }
}
