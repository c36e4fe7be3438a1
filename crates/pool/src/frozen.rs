//! A fork's frozen layers: a [`FrozenLayer`] (a sandbox's upper directory copied as it is,
//! removed when the last sandbox over it is gone) and a [`PendingLayer`] (one being made,
//! which creates wait for). The types only: [`crate::snapshot::freeze`] makes them, and
//! [`crate::live`] mounts them under its sandboxes' cells.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::PoolError;

/// A sandbox's writable layer frozen for a fork ([`crate::snapshot::freeze`]): a directory of the daemon's
/// `<state dir>/frozen/` in overlayfs upper form, over the frozen layers of the sandbox it was
/// taken of, if that one was itself a fork copy (`below`). Each sandbox made over it holds
/// an `Arc` until its cell is gone; the directory is removed when the last one drops.
pub struct FrozenLayer {
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    pub(crate) bytes: u64,
    pub(crate) below: Option<Arc<FrozenLayer>>,
}

impl FrozenLayer {
    /// Its name (`frozen/<id>`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Apparent bytes of its own files.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Its directory and those of the layers under it, top first: a cell's overlay's
    /// layers above the shell's root.
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut out = vec![self.dir.clone()];
        let mut at = self.below.as_deref();
        while let Some(l) = at {
            out.push(l.dir.clone());
            at = l.below.as_deref();
        }
        out
    }
}

impl std::fmt::Debug for FrozenLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrozenLayer")
            .field("id", &self.id)
            .field("dir", &self.dir)
            .field("bytes", &self.bytes)
            .field("below", &self.below)
            .finish()
    }
}

impl PartialEq for FrozenLayer {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir
    }
}

impl Drop for FrozenLayer {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(target: "agentrun::pool::snapshot", layer = %self.id, "removing a frozen layer: {e}");
            }
        }
    }
}

/// A [`FrozenLayer`] being made, which sandboxes can be asked of before it is there
/// ([`crate::live::LiveSpec::frozen`]): their creates take their shells meanwhile and wait
/// for it only to make their cells, so that a fork's copying and its shells overlap.
#[derive(Default)]
pub struct PendingLayer {
    slot: std::sync::Mutex<Option<Result<Arc<FrozenLayer>, LayerNotMade>>>,
    ready: std::sync::Condvar,
}

/// Why a [`PendingLayer`] will not be made: the maker's own error, shared with every waiter.
pub type LayerNotMade = Arc<dyn std::error::Error + Send + Sync>;

/// How long a create waits for its [`PendingLayer`].
const PENDING_TIMEOUT: Duration = Duration::from_secs(120);

impl PendingLayer {
    pub fn new() -> Arc<PendingLayer> {
        Arc::new(PendingLayer::default())
    }

    /// A layer that is there already.
    pub fn of(layer: Arc<FrozenLayer>) -> Arc<PendingLayer> {
        let p = PendingLayer::new();
        p.set(Ok(layer));
        p
    }

    /// The layer is made (`Ok`) or will not be (`Err`: why); wakes every waiting create.
    pub fn set(&self, r: Result<Arc<FrozenLayer>, LayerNotMade>) {
        *crate::lock(&self.slot) = Some(r);
        self.ready.notify_all();
    }

    /// The layer, once it is made (bounded wait).
    pub fn wait(&self) -> Result<Arc<FrozenLayer>, PoolError> {
        let deadline = Instant::now() + PENDING_TIMEOUT;
        let mut slot = crate::lock(&self.slot);
        loop {
            if let Some(r) = slot.as_ref() {
                return r
                    .clone()
                    .map_err(|e| PoolError::Invalid(format!("the fork's layer: {e}")));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PoolError::Invalid(
                    "the fork's layer was not made in time".into(),
                ));
            }
            slot = crate::wait(&self.ready, slot, left);
        }
    }

    /// Forgets the layer (its last holders are then the sandboxes made over it).
    pub fn clear(&self) {
        crate::lock(&self.slot).take();
    }
}

impl std::fmt::Debug for PendingLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLayer")
            .field("slot", &*crate::lock(&self.slot))
            .finish()
    }
}

impl PartialEq for PendingLayer {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}
