//! `POST /images/create`'s progress stream: the image store's layer events as the JSON
//! lines dockerd writes (`Pulling fs layer`, `Downloading` with `progressDetail` and a
//! `progress` bar, `Download complete`, `Extracting`, `Pull complete`, `Already exists`),
//! so the docker CLI draws its per-layer lines and SDKs get `current`/`total`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrun_image::{docker_size, short_id, Phase, Progress};
use bytes::Bytes;
use serde_json::json;
use tokio::sync::mpsc;

use crate::http::json_line;

/// The least time between two `Downloading`/`Extracting` lines of one layer.
const EVERY: Duration = Duration::from_millis(100);

/// A layer's phase in progress.
#[derive(Clone, Copy)]
struct Layer {
    phase: Phase,
    current: u64,
    total: Option<u64>,
    sent: Instant,
}

/// Sends a pull's progress as dockerd's JSON lines into a response stream. The channel is
/// unbounded because the store reports from inside the pull's own I/O runtime, where a
/// blocking send is not allowed; lines are throttled ([`EVERY`]), so it stays small. The first line
/// is `Pulling from REPO` (sent with the first layer event, so a pull failing before it has
/// a manifest is answered with an HTTP error instead of a stream).
pub struct PullStream {
    tx: mpsc::UnboundedSender<Bytes>,
    repo: String,
    tag: String,
    started: AtomicBool,
    downloaded: Arc<AtomicBool>,
    layers: Mutex<HashMap<String, Layer>>,
    /// Layers fetched and not yet ready.
    fetched: Mutex<HashSet<String>>,
}

impl PullStream {
    /// A stream for a pull of `repo` (familiar name, no tag) at `tag`.
    pub fn new(tx: mpsc::UnboundedSender<Bytes>, repo: String, tag: String) -> Self {
        PullStream {
            tx,
            repo,
            tag,
            started: AtomicBool::new(false),
            downloaded: Arc::default(),
            layers: Mutex::default(),
            fetched: Mutex::default(),
        }
    }

    /// Set once any layer is fetched (else the image was up to date). Read it through this
    /// flag, not by holding the stream: the line channel ends when the stream is dropped.
    pub fn downloaded_flag(&self) -> Arc<AtomicBool> {
        self.downloaded.clone()
    }

    fn send(&self, v: serde_json::Value) {
        if !self.started.swap(true, Ordering::SeqCst) {
            let head = json!({"status": format!("Pulling from {}", self.repo), "id": self.tag});
            let _ = self.tx.send(json_line(&head));
        }
        // A client gone away: the pull goes on (its content is kept), lines are dropped.
        let _ = self.tx.send(json_line(&v));
    }

    fn status(&self, id: &str, status: &str) {
        self.send(json!({"status": status, "progressDetail": {}, "id": short_id(id)}));
    }

    fn progress(&self, id: &str, l: &Layer) {
        let status = match l.phase {
            Phase::Extract => "Extracting",
            _ => "Downloading",
        };
        let total = l.total.unwrap_or(0);
        self.send(json!({
            "status": status,
            "progressDetail": {"current": l.current, "total": total},
            "progress": bar(l.current, total),
            "id": short_id(id),
        }));
    }

    fn layers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Layer>> {
        self.layers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Progress for PullStream {
    fn start(&self, id: &str, phase: Phase, total: Option<u64>) {
        if phase == Phase::Download {
            self.downloaded.store(true, Ordering::SeqCst);
            self.fetched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.to_owned());
            self.status(id, "Pulling fs layer");
        }
        let l = Layer {
            phase,
            current: 0,
            total,
            sent: Instant::now(),
        };
        if phase == Phase::Extract {
            self.progress(id, &l);
        }
        self.layers().insert(id.to_owned(), l);
    }

    fn advance(&self, id: &str, n: u64) {
        let mut layers = self.layers();
        let Some(l) = layers.get_mut(id) else { return };
        let first = l.current == 0;
        l.current += n;
        if first || l.sent.elapsed() >= EVERY {
            l.sent = Instant::now();
            let snapshot = *l;
            drop(layers);
            self.progress(id, &snapshot);
        }
    }

    fn finish(&self, id: &str, phase: Phase) {
        let last = self.layers().remove(id);
        if let Some(mut l) = last {
            // The last bytes, so a client's bar ends full.
            l.current = l.total.unwrap_or(l.current).max(l.current);
            self.progress(id, &l);
        }
        if phase == Phase::Download {
            self.status(id, "Verifying Checksum");
            self.status(id, "Download complete");
        }
    }

    fn ready(&self, id: &str) {
        // Layers this pull fetched (one unpacked before by another image is not extracted
        // again, but its pull is complete all the same).
        if self
            .fetched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
        {
            self.status(id, "Pull complete");
        }
    }

    fn exists(&self, id: &str) {
        self.status(id, "Already exists");
    }
}

/// dockerd's progress bar: `[=====>      ]  1.2MB/4MB` (50 columns).
fn bar(current: u64, total: u64) -> String {
    if total == 0 {
        return docker_size(current);
    }
    let width = 50;
    let filled = ((current.min(total) as f64 / total as f64) * width as f64) as usize;
    let mut b = "=".repeat(filled.saturating_sub(1));
    if filled > 0 {
        b.push(if filled == width { '=' } else { '>' });
    }
    b.push_str(&" ".repeat(width - filled));
    format!("[{b}] {:>8}/{}", docker_size(current), docker_size(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_bars_read_like_dockerd() {
        let b = bar(1_200_000, 4_000_000);
        assert!(b.starts_with("[==============>"), "{b}");
        assert!(b.ends_with("]    1.2MB/4MB"), "{b}");
        assert_eq!(bar(4, 4).matches('=').count(), 50);
        assert_eq!(short_id("sha256:0123456789abcdef"), "0123456789ab");
    }
}
