//! Progress of long store operations (pull, import, export, unpacking a layer), reported
//! to an observer the caller gives the store ([`crate::ImageStore::with_progress`]).
//!
//! The store only says what happens to which layer (by blob digest): starting a phase with
//! the bytes it will take (when known), bytes done, the phase's end, or that a layer is
//! already stored. Rendering (terminal bars, plain lines, Docker's JSON stream) is the
//! caller's: this crate draws nothing. Every method has a no-op default, and a store
//! without an observer reports to [`NoProgress`].

use std::io::{self, Read};
use std::sync::Arc;

/// What is being done to a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Fetching the blob from a registry (`image pull`).
    Download,
    /// Copying the blob from an archive into the store (`image import`).
    Copy,
    /// Unpacking the blob into the layer directory sandboxes mount.
    Extract,
    /// Writing the blob into an archive (`image export`).
    Export,
}

impl Phase {
    /// The phase as a lower-case verb (`downloading`, ...).
    pub fn verb(self) -> &'static str {
        match self {
            Phase::Download => "downloading",
            Phase::Copy => "copying",
            Phase::Extract => "extracting",
            Phase::Export => "exporting",
        }
    }
}

/// An observer of store progress. `id` is a layer's blob digest (`sha256:...`). Calls for
/// one id come in order `start`, `advance`..., `finish` (once per phase); calls for
/// different ids may interleave. Implementations must be cheap: `advance` is called per
/// chunk read or written.
pub trait Progress: Send + Sync {
    /// A phase starts; `total` is the bytes it will take, if known.
    fn start(&self, _id: &str, _phase: Phase, _total: Option<u64>) {}
    /// `n` more bytes are done.
    fn advance(&self, _id: &str, _n: u64) {}
    /// The phase ended well.
    fn finish(&self, _id: &str, _phase: Phase) {}
    /// The layer is already in the store: nothing to fetch or copy.
    fn exists(&self, _id: &str) {}
    /// The layer is unpacked and ready for the image being stored: after its extraction, or
    /// at once when another image had it unpacked already.
    fn ready(&self, _id: &str) {}
}

/// Reports nothing: what a store reports to unless given an observer.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// The observer a store holds (cloned with it).
#[derive(Clone)]
pub(crate) struct Observer(pub(crate) Arc<dyn Progress>);

impl Default for Observer {
    fn default() -> Self {
        Observer(Arc::new(NoProgress))
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

impl Observer {
    /// Runs one phase of `id`: `start`, then `f` (given a reporter of bytes done), then
    /// `finish` if `f` succeeded.
    pub(crate) fn phase<T, E>(
        &self,
        id: &str,
        phase: Phase,
        total: Option<u64>,
        f: impl FnOnce(&Tick<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.0.start(id, phase, total);
        let r = f(&Tick { obs: &*self.0, id });
        if r.is_ok() {
            self.0.finish(id, phase);
        }
        r
    }

    pub(crate) fn exists(&self, id: &str) {
        self.0.exists(id);
    }
}

/// Reports bytes done for one id.
pub(crate) struct Tick<'a> {
    obs: &'a dyn Progress,
    id: &'a str,
}

impl<'a> Tick<'a> {
    pub(crate) fn new(obs: &'a dyn Progress, id: &'a str) -> Self {
        Tick { obs, id }
    }

    pub(crate) fn advance(&self, n: u64) {
        if n > 0 {
            self.obs.advance(self.id, n);
        }
    }

    /// `r`, reporting every byte read from it.
    pub(crate) fn reader<R: Read>(&self, r: R) -> Counting<'_, R> {
        Counting {
            inner: r,
            tick: self,
        }
    }
}

/// A reader reporting the bytes read from it.
pub(crate) struct Counting<'a, T> {
    inner: T,
    tick: &'a Tick<'a>,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.tick.advance(n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Progress for Log {
        fn start(&self, id: &str, phase: Phase, total: Option<u64>) {
            self.0
                .lock()
                .unwrap()
                .push(format!("start {id} {} {total:?}", phase.verb()));
        }
        fn advance(&self, id: &str, n: u64) {
            self.0.lock().unwrap().push(format!("advance {id} {n}"));
        }
        fn finish(&self, id: &str, phase: Phase) {
            self.0
                .lock()
                .unwrap()
                .push(format!("finish {id} {}", phase.verb()));
        }
    }

    #[test]
    fn a_phase_reports_start_bytes_and_finish_only_on_success() {
        let log = Arc::new(Log::default());
        let obs = Observer(log.clone());
        let mut out = Vec::new();
        obs.phase("a", Phase::Copy, Some(5), |t| {
            io::copy(&mut t.reader(&b"hello"[..]), &mut out).map(drop)
        })
        .unwrap();
        let failed: Result<(), &str> = obs.phase("b", Phase::Download, None, |t| {
            io::copy(&mut t.reader(&b"xy"[..]), &mut io::sink()).unwrap();
            Err("broken")
        });
        assert!(failed.is_err());
        assert_eq!(
            *log.0.lock().unwrap(),
            vec![
                "start a copying Some(5)",
                "advance a 5",
                "finish a copying",
                "start b downloading None",
                "advance b 2",
            ]
        );
    }
}
