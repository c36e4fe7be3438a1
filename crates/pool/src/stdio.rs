//! A process's stdio as the API front ends give it to [`LiveSandbox::spawn`]: pipes
//! ([`Pipes`]: stdout and stderr apart, stdin a pipe or `/dev/null`) or a terminal
//! ([`Terminal`]: a pty, one stream, its window size set with [`set_window_size`]), the
//! child's ends passed into the sandbox and ours kept; our ends read and written on tokio
//! ([`StdioStream`]), and a process's output read to its end chunk by chunk ([`pump`]).
//!
//! The Docker, OpenSandbox and E2B APIs all start their processes with these: one way to
//! make a process's pipes or terminal, one way to read its output (on the caller's tokio
//! runtime, no thread per stream), one way to write its stdin.
//!
//! [`LiveSandbox::spawn`]: crate::live::LiveSandbox::spawn

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// A pipe: (read end, write end), both close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// `/dev/null`, the stdin of a process that reads none.
pub fn dev_null() -> io::Result<OwnedFd> {
    File::open("/dev/null").map(OwnedFd::from)
}

/// A process's stdio as pipes: its stdout and stderr apart, its stdin a pipe or `/dev/null`.
pub struct Pipes {
    /// What the process gets: stdin, stdout, stderr ([`ProcessSpec::stdio`]); passed into the
    /// sandbox by the spawn, which closes them here.
    ///
    /// [`ProcessSpec::stdio`]: crate::live::ProcessSpec::stdio
    pub child: [OwnedFd; 3],
    /// Our end of its stdin (the pipe's write end); `None`: its stdin is `/dev/null`.
    pub stdin: Option<OwnedFd>,
    /// Our end of its stdout (the pipe's read end).
    pub stdout: OwnedFd,
    /// Our end of its stderr (the pipe's read end).
    pub stderr: OwnedFd,
}

impl Pipes {
    /// Pipes for stdout and stderr, and for stdin when `stdin`, else `/dev/null`.
    pub fn open(stdin: bool) -> io::Result<Pipes> {
        let (stdin_child, stdin_ours) = if stdin {
            let (r, w) = pipe()?;
            (r, Some(w))
        } else {
            (dev_null()?, None)
        };
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        Ok(Pipes {
            child: [stdin_child, out_w, err_w],
            stdin: stdin_ours,
            stdout: out_r,
            stderr: err_r,
        })
    }
}

/// A process's stdio as a terminal: a pty whose slave is its stdin, stdout and stderr (one
/// output stream), whose master is ours.
pub struct Terminal {
    /// The pty slave three times ([`Pipes::child`]).
    pub child: [OwnedFd; 3],
    /// The pty master: its stdin written here, its output read here, its window size set
    /// here (`try_clone` it for each).
    pub master: File,
}

impl Terminal {
    /// A new pty, both ends close-on-exec (the slave goes into the sandbox over the control
    /// channel, not by inheritance).
    pub fn open() -> io::Result<Terminal> {
        let pty = nix::pty::openpty(None, None).map_err(io::Error::from)?;
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(fd),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(io::Error::from)?;
        }
        let slave = pty.slave;
        Ok(Terminal {
            child: [slave.try_clone()?, slave.try_clone()?, slave],
            master: File::from(pty.master),
        })
    }
}

/// Sets the window size of the pty whose master is `master` to `rows` x `cols` (TIOCSWINSZ):
/// what `stty size` or `os.get_terminal_size()` report inside, and SIGWINCH to the
/// terminal's foreground process group.
pub fn set_window_size(master: impl AsFd, rows: u16, cols: u16) -> io::Result<()> {
    let size = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(master, size).map_err(io::Error::from)
}

/// Our end of a process's stdin, stdout or stderr (a pipe's end or a pty master), read or
/// written on the tokio runtime it was made in: the fd is made non-blocking (with a pty, the
/// master's other handles too: write its stdin through a [`StdioStream`] as well).
pub struct StdioStream {
    fd: AsyncFd<File>,
}

impl StdioStream {
    /// `fd` as a stream of the current tokio runtime (it must have IO enabled: else this
    /// panics).
    pub fn new(fd: OwnedFd) -> io::Result<StdioStream> {
        rustix::io::ioctl_fionbio(&fd, true)?;
        // SAFETY: the `File` owns its fd, which stays open and the same until the `AsyncFd`
        // that owns the `File` is dropped.
        let fd = unsafe { AsyncFd::register(File::from(fd)) }?;
        Ok(StdioStream { fd })
    }

    /// Whether bytes wait to be read: asked of the kernel (`FIONREAD`), not of the reactor,
    /// which may not have looked yet.
    pub fn has_pending(&self) -> bool {
        rustix::io::ioctl_fionread(self.fd.get_ref().as_fd()).is_ok_and(|n| n > 0)
    }
}

impl AsyncRead for StdioStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|f| io::Read::read(&mut f.get_ref(), unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for StdioStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|f| io::Write::write(&mut f.get_ref(), data)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Nothing to do: the process sees EOF when the stream is dropped.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What one read of a process's output takes at most.
pub const CHUNK: usize = 32 * 1024;

/// Reads a process's output (`fd`, our end) on the current tokio runtime until EOF or a read
/// error (a pty whose slave is closed), handing each chunk (at most [`CHUNK`]) to `sink` and
/// waiting for it: a sink that waits (a full queue) stops the reading, and the process blocks
/// on its pipe once that is full. Stops early when `sink` answers false.
///
/// Each read is preceded by a yield: a pipe that never runs dry (`yes`) is always ready, and
/// another process's output gets its turn after every chunk, not after tokio's budget of 128.
pub async fn pump<F, Fut>(fd: OwnedFd, mut sink: F)
where
    F: FnMut(Bytes) -> Fut,
    Fut: Future<Output = bool>,
{
    let Ok(mut stream) = StdioStream::new(fd) else {
        return;
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        tokio::task::yield_now().await;
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if !sink(Bytes::copy_from_slice(&buf[..n])).await {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_pump_reads_a_pipe_to_its_end() {
        runtime().block_on(async {
            let (r, w) = pipe().unwrap();
            let writer = std::thread::spawn(move || {
                let mut w = File::from(w);
                for _ in 0..100 {
                    io::Write::write_all(&mut w, &[b'x'; 1000]).unwrap();
                }
            });
            let mut got = Vec::new();
            pump(r, |chunk| {
                assert!(chunk.len() <= CHUNK);
                got.extend_from_slice(&chunk);
                std::future::ready(true)
            })
            .await;
            writer.join().unwrap();
            assert_eq!(got.len(), 100_000);
        });
    }

    #[test]
    fn a_pump_stops_when_its_sink_says_so() {
        runtime().block_on(async {
            let (r, w) = pipe().unwrap();
            io::Write::write_all(&mut File::from(w.try_clone().unwrap()), b"one").unwrap();
            let mut calls = 0;
            pump(r, |_| {
                calls += 1;
                std::future::ready(false)
            })
            .await;
            assert_eq!(
                calls, 1,
                "returned after the first chunk, the pipe still open"
            );
            drop(w);
        });
    }

    #[test]
    fn pipes_connect_the_childs_ends_to_ours() {
        runtime().block_on(async {
            let Pipes {
                child: [child_in, child_out, child_err],
                stdin,
                stdout,
                stderr,
            } = Pipes::open(true).unwrap();
            let mut ours_in = StdioStream::new(stdin.unwrap()).unwrap();
            ours_in.write_all(b"in").await.unwrap();
            drop(ours_in);
            let mut read = String::new();
            io::Read::read_to_string(&mut File::from(child_in), &mut read).unwrap();
            assert_eq!(read, "in");
            io::Write::write_all(&mut File::from(child_out), b"out").unwrap();
            io::Write::write_all(&mut File::from(child_err), b"err").unwrap();
            for (fd, want) in [(stdout, "out"), (stderr, "err")] {
                let mut s = StdioStream::new(fd).unwrap();
                assert!(s.has_pending());
                let mut got = String::new();
                s.read_to_string(&mut got).await.unwrap();
                assert_eq!(got, want);
            }
            let no_stdin = Pipes::open(false).unwrap();
            assert!(no_stdin.stdin.is_none());
        });
    }

    #[test]
    fn a_terminal_reads_back_what_its_process_writes_until_the_slave_closes() {
        runtime().block_on(async {
            let Terminal { child, master } = Terminal::open().unwrap();
            let [slave, other, another] = child;
            drop((other, another));
            let mut ours = StdioStream::new(master.into()).unwrap();
            io::Write::write_all(&mut File::from(slave), b"hi\n").unwrap();
            // The slave closed: what it wrote (with the line discipline's \r), then EIO.
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            while let Ok(n) = ours.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, b"hi\r\n");
        });
    }

    #[test]
    fn a_terminals_window_size_is_set_on_its_master() {
        let Terminal { child, master } = Terminal::open().unwrap();
        set_window_size(&master, 33, 121).unwrap();
        let got = rustix::termios::tcgetwinsize(&child[0]).unwrap();
        assert_eq!((got.ws_row, got.ws_col), (33, 121));
    }
}
