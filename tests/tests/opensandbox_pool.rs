//! The official SDK's client-side sandbox pool (`opensandbox.pool`, opensandbox==1.1.1)
//! against `agentrun serve --listen`, unchanged: `tests/opensandbox/sdk_pool.py`, with the
//! in-memory state store and with the Redis one (two pool nodes sharing a namespace), sync and
//! async clients. Warm-up with a preparer, acquire (FAIL_FAST / DIRECT_CREATE) renewed to the
//! caller's timeout, refill, stale idle ids, resize and release (the server's sandboxes are
//! killed), shutdown and restart, primary lock failover.
//!
//! The Redis tests start Debian's `redis-server` (hack/test installs it) on a free loopback
//! port, in a temp dir, with no persistence, under `timeout` (it dies within 10 minutes even
//! if this test is killed) and stop it at the end.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agentrun_e2e::osb::*;
use agentrun_e2e::*;

/// A `redis-server` on a loopback port, for one test; stopped (SIGTERM, forwarded by
/// `timeout`) when dropped.
struct Redis {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Redis {
    fn start() -> Redis {
        assert!(
            Path::new("/usr/bin/redis-server").exists(),
            "/usr/bin/redis-server is missing: run hack/test (it installs redis-server)"
        );
        let dir = tempdir();
        let port = free_port().to_string();
        let child = Command::new("timeout")
            .args(["-k", "5", "600", "/usr/bin/redis-server"])
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port,
                "--protected-mode",
                "yes",
            ])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(["--logfile", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let addr = format!("127.0.0.1:{port}");
        let up = wait_until(Duration::from_secs(20), || {
            std::net::TcpStream::connect(&addr).ok().map(|_| ())
        });
        let redis = Redis {
            child,
            url: format!("redis://{addr}/0"),
            _dir: dir,
        };
        assert!(up.is_some(), "redis-server did not listen on {addr}");
        redis
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of our own child (`timeout`, not yet reaped), which
        // forwards SIGTERM to redis-server.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn pool_scenario(name: &str, redis: bool) {
    let Some(_lock) = setup() else { return };
    let server = redis.then(Redis::start);
    let env: Vec<(&str, String)> = server
        .iter()
        .map(|r| ("OSB_REDIS_URL", r.url.clone()))
        .collect();
    let (d, domain) = start(&[], &[]);
    scenario(&d, &domain, &format!("pool:{name}"), &env);
    stop_clean(d);
}

#[test]
fn sdk_pool_in_memory_sync() {
    pool_scenario("memory_sync", false);
}

#[test]
fn sdk_pool_in_memory_async() {
    pool_scenario("memory_async", false);
}

#[test]
fn sdk_pool_redis_two_nodes_sync() {
    pool_scenario("redis_sync", true);
}

#[test]
fn sdk_pool_redis_two_nodes_async() {
    pool_scenario("redis_async", true);
}
