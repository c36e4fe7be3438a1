//! TCP sockets inside a sandbox's network namespace, made from the host side.
//!
//! A sandbox's network namespace holds only loopback. To reach a server the sandbox runs on
//! `127.0.0.1:P` (Docker port publishing, the OpenSandbox port proxy), the daemon makes the
//! socket inside that namespace: one thread enters it once (`setns`) and makes sockets there
//! on request; a socket keeps the namespace it was made in, so the daemon then connects and
//! copies through a plain fd of its own. No other thread of the daemon ever changes
//! namespace, nothing runs in the sandbox for it, and the sandbox gets no route out.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::mpsc;

use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
use nix::sys::stat::Mode;

type Reply = Box<dyn FnOnce(io::Result<OwnedFd>) + Send>;

/// A handle on the thread that makes sockets in one network namespace. Cloning shares the
/// thread; it ends when the last handle is dropped.
#[derive(Clone)]
pub struct NetnsSockets {
    requests: mpsc::Sender<Reply>,
}

impl NetnsSockets {
    /// Enters the network namespace of process `pid` (a sandbox's init) on a new thread.
    pub fn of_process(pid: i32) -> io::Result<NetnsSockets> {
        let netns = nix::fcntl::open(
            format!("/proc/{pid}/ns/net").as_str(),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        // SAFETY: open returned a new fd that nobody else owns.
        let netns = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(netns) };
        let (requests, rx) = mpsc::channel::<Reply>();
        let (entered_tx, entered_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("netns-sockets".into())
            .spawn(move || {
                let entered = nix::sched::setns(&netns, CloneFlags::CLONE_NEWNET);
                drop(netns);
                let ok = entered.is_ok();
                // Dropped: the requester gave up waiting (its receiver is gone).
                let _ = entered_tx.send(entered);
                if !ok {
                    return;
                }
                while let Ok(reply) = rx.recv() {
                    let made = socket(
                        AddressFamily::Inet,
                        SockType::Stream,
                        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                        None,
                    );
                    reply(made.map_err(io::Error::from));
                }
            })?;
        entered_rx
            .recv()
            .map_err(|_| io::Error::other("the namespace thread ended"))??;
        Ok(NetnsSockets { requests })
    }

    /// Asks for a new non-blocking IPv4 TCP socket in the namespace; `reply` gets it (on the
    /// namespace's thread: it should only hand it on, e.g. through a channel).
    pub fn request(&self, reply: impl FnOnce(io::Result<OwnedFd>) + Send + 'static) {
        if let Err(mpsc::SendError(reply)) = self.requests.send(Box::new(reply)) {
            reply(Err(io::Error::other("the namespace thread ended")));
        }
    }

    /// A new non-blocking IPv4 TCP socket in the namespace, for async callers (any executor).
    pub async fn socket(&self) -> io::Result<OwnedFd> {
        let (tx, rx) = futures_channel::oneshot::channel();
        self.request(move |s| {
            // Dropped: the caller gave up waiting (its receiver is gone).
            let _ = tx.send(s);
        });
        rx.await
            .map_err(|_| io::Error::other("the namespace thread ended"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr, TcpListener};

    #[test]
    fn sockets_of_our_own_namespace_connect() {
        // Our own namespace: a socket made there reaches a listener of ours.
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr: SocketAddr = l.local_addr().unwrap();
        let ns = NetnsSockets::of_process(std::process::id() as i32).unwrap();
        let (tx, rx) = mpsc::channel();
        ns.request(move |s| tx.send(s).unwrap());
        let fd = rx.recv().unwrap().unwrap();
        let s = std::net::TcpStream::from(fd);
        s.set_nonblocking(false).unwrap();
        // Not checked: the test's connect result is read from the socket below.
        let _ = nix::sys::socket::connect(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            &nix::sys::socket::SockaddrIn::from(match addr {
                SocketAddr::V4(a) => a,
                SocketAddr::V6(_) => unreachable!(),
            }),
        );
        let (_, peer) = l.accept().unwrap();
        assert_eq!(peer, s.local_addr().unwrap());
    }
}
