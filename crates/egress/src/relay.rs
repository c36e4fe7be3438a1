//! [`relay`]: copies bytes both ways between two connected streams (TCP or unix) until both
//! directions are done, passing each side's end of stream on as a half-close. The egress
//! proxy's CONNECT tunnels use it, and so does the sandbox's egress bridge
//! (`agentrun_runtime::net::EgressBridge`), which carries a sandboxed program's connection to
//! the proxy's socket.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;

/// A connected stream that can be cloned (one handle a direction) and half-closed.
pub trait Duplex: Read + Write + Send + Sized + 'static {
    fn try_clone(&self) -> io::Result<Self>;
    fn shutdown_write(&self);
    /// Sends each write at once (a relay forwards what it reads as it comes; coalescing is
    /// the endpoints' business).
    fn send_at_once(&self) {}
}

impl Duplex for TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        TcpStream::try_clone(self)
    }
    /// TCP_NODELAY: without it, a relayed TLS handshake (the tunnel's "200" answer, then the
    /// server's flight in several reads) waited on Nagle for the peer's delayed ACK, ~40 ms
    /// per new connection through the proxy.
    fn send_at_once(&self) {
        // Latency only: the connection works without it.
        let _ = self.set_nodelay(true);
    }
    fn shutdown_write(&self) {
        // The peer may be gone already: nothing is left to end.
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl Duplex for UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        UnixStream::try_clone(self)
    }
    fn shutdown_write(&self) {
        // The peer may be gone already: nothing is left to end.
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// Copies `a` to `b` (on a thread of its own) and `b` to `a` until both sides are done; each
/// side's end of stream becomes a half-close of the other. `Err` only when a stream cannot be
/// cloned (nothing was copied then).
pub fn relay<A: Duplex, B: Duplex>(a: A, b: B) -> io::Result<()> {
    a.send_at_once();
    b.send_at_once();
    let mut a_to = a.try_clone()?;
    let mut b_to = b.try_clone()?;
    let a_to_b = std::thread::spawn(move || {
        let mut from = a;
        // Ends at EOF or at either side's error: both mean this direction is over.
        let _ = io::copy(&mut from, &mut b_to);
        b_to.shutdown_write();
    });
    let mut from = b;
    // Ends at EOF or at either side's error: both mean this direction is over.
    let _ = io::copy(&mut from, &mut a_to);
    a_to.shutdown_write();
    // A JoinHandle of a thread that cannot panic.
    let _ = a_to_b.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_both_ways_and_passes_end_of_stream_on() {
        let (mut client, near) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let far = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let relayed = std::thread::spawn(move || relay(near, far));
        client.write_all(b"ping").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut got = String::new();
        server.read_to_string(&mut got).unwrap();
        assert_eq!(got, "ping");
        server.write_all(b"pong").unwrap();
        server.shutdown(Shutdown::Write).unwrap();
        let mut back = String::new();
        client.read_to_string(&mut back).unwrap();
        assert_eq!(back, "pong");
        relayed.join().unwrap().unwrap();
    }

    /// The relay's TCP sides send at once (TCP_NODELAY): with Nagle, a relayed TLS handshake
    /// waited for the peer's delayed ACK, ~45 ms per new HTTPS connection through the proxy.
    #[test]
    fn tcp_sides_send_at_once() {
        let (mut client, near) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let far = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let seen = far.try_clone().unwrap();
        assert!(!seen.nodelay().unwrap(), "a new socket has Nagle on");
        let (mut server, _) = listener.accept().unwrap();
        let relayed = std::thread::spawn(move || relay(near, far));
        client.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        server.read_exact(&mut one).unwrap();
        assert!(
            seen.nodelay().unwrap(),
            "the relay's TCP side has TCP_NODELAY"
        );
        client.shutdown(Shutdown::Write).unwrap();
        server.shutdown(Shutdown::Write).unwrap();
        relayed.join().unwrap().unwrap();
    }
}
