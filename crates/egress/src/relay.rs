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
}

impl Duplex for TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        TcpStream::try_clone(self)
    }
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl Duplex for UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        UnixStream::try_clone(self)
    }
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// Copies `a` to `b` (on a thread of its own) and `b` to `a` until both sides are done; each
/// side's end of stream becomes a half-close of the other. `Err` only when a stream cannot be
/// cloned (nothing was copied then).
pub fn relay<A: Duplex, B: Duplex>(a: A, b: B) -> io::Result<()> {
    let mut a_to = a.try_clone()?;
    let mut b_to = b.try_clone()?;
    let a_to_b = std::thread::spawn(move || {
        let mut from = a;
        let _ = io::copy(&mut from, &mut b_to);
        b_to.shutdown_write();
    });
    let mut from = b;
    let _ = io::copy(&mut from, &mut a_to);
    a_to.shutdown_write();
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
}
