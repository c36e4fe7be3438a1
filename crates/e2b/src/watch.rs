//! envd's directory watching (`files.watch_dir`): `WatchDir` (a server stream of events, the
//! async SDK's) and `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` (a watcher polled
//! for the events since the last call, the sync SDK's).
//!
//! A watch is an inotify instance of the daemon's (`rustix::fs::inotify`) on the sandbox's
//! directory, opened inside the sandbox by the OpenSandbox front end's file machinery (the
//! path resolved in the sandbox's root, never leaving it) and watched through its
//! `/proc/self/fd` name, so what the sandbox's processes and the file API do there is seen.
//! Recursive watches add every directory below, and directories made later. Events follow
//! envd's (fsnotify's) mapping: made or moved in = `CREATE`, written = `WRITE`, deleted =
//! `REMOVE`, moved away = `RENAME`, attributes = `CHMOD`; an event's `name` is relative to the
//! watched directory. A watch ends when its directory goes or its sandbox ends; a polled
//! watcher whose watch ended is dropped (at the next `CreateWatcher`) once its events were
//! fetched or its sandbox is gone.
//!
//! Bounds: [`MAX_WATCHERS`] polled watchers per sandbox, [`MAX_DIRS`] directories per watch,
//! [`MAX_PENDING`] events kept for a poll (older ones dropped first).

use std::collections::{HashMap, VecDeque};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agentrun_opensandbox::files::errno;
use agentrun_opensandbox::Record;
use agentrun_pool::lock;
use agentrun_runtime::fsroot::SandboxFs;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::{Extension, Router};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::OFlags;
use rustix::io::Errno;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::connect::{self, Streamed, Unary};
use crate::error::{Code, RpcError, RpcResult};

/// Polled watchers a sandbox may hold at once.
pub const MAX_WATCHERS: usize = 64;
/// Directories one watch covers (a recursive one stops adding past this).
pub const MAX_DIRS: usize = 8192;
/// Events a polled watcher keeps until the next poll.
pub const MAX_PENDING: usize = 10_000;
/// How often a watch checks that its sandbox still runs (it ends with it).
const ALIVE_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// What a watch asks inotify for.
fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::ONLYDIR
}

/// The polled watchers, by id.
#[derive(Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, Arc<Polled>>>,
}

/// A polled watcher: its sandbox and the events not yet fetched.
struct Polled {
    sandbox: String,
    /// the sandbox (not kept alive by its watchers)
    rec: std::sync::Weak<Record>,
    pending: Arc<Mutex<VecDeque<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watchers {
    /// The pending events of watcher `id` of `rec`'s sandbox (`not_found` for another's).
    fn queue_of(&self, rec: &Record, id: &str) -> RpcResult<Arc<Mutex<VecDeque<Value>>>> {
        lock(&self.map)
            .get(id)
            .filter(|w| w.sandbox == rec.id)
            .map(|w| w.pending.clone())
            .ok_or_else(|| RpcError::new(Code::NotFound, format!("no watcher {id:?}")))
    }
}

impl Drop for Polled {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watch RPCs' routes; [`crate::router`] puts them behind the sandbox's access token.
pub fn routes(watchers: Arc<Watchers>) -> Router {
    Router::new()
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(create_watcher))
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            post(get_watcher_events),
        )
        .route("/filesystem.Filesystem/RemoveWatcher", post(remove_watcher))
        .with_state(watchers)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherRequest {
    #[serde(default, alias = "watcher_id")]
    watcher_id: String,
}

/// One inotify instance over a directory (and, recursive, those below).
struct Watch {
    fd: AsyncFd<Arc<OwnedFd>>,
    /// watch descriptor -> the directory's path relative to the watched one ("" for it)
    dirs: HashMap<i32, String>,
    root_wd: i32,
    /// the watched directory, relative to the sandbox's root
    root: PathBuf,
    recursive: bool,
    rec: Arc<Record>,
}

/// Adds a watch on directory `rel` (resolved inside the sandbox) to `ino`.
fn add_dir(fs: &SandboxFs, ino: &OwnedFd, rel: &Path) -> Result<i32, Errno> {
    let dir = fs.open(rel, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW, 0)?;
    inotify::add_watch(ino, format!("/proc/self/fd/{}", dir.as_raw_fd()), mask())
}

/// The directories below `rel` (to the walk's depth), as paths relative to it.
fn subdirs(fs: &SandboxFs, rel: &Path, shown: &str) -> Vec<String> {
    fs.walk(rel, 64)
        .map(|entries| {
            entries
                .iter()
                .filter(|e| e.is_dir())
                .filter_map(|e| {
                    let p = e.path.strip_prefix(shown.trim_end_matches('/'))?;
                    Some(p.trim_start_matches('/').to_owned())
                })
                .filter(|p| !p.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

impl Watch {
    /// Starts watching `path` (as the request names it) in `rec`'s sandbox.
    async fn start(
        rec: Arc<Record>,
        headers: &HeaderMap,
        path: &str,
        recursive: bool,
    ) -> RpcResult<Watch> {
        let (shown, root) = crate::filesystem::resolve(path, headers)?;
        let ino = Arc::new(
            inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
                .map_err(|e| RpcError::new(Code::Internal, format!("inotify: {e}")))?,
        );
        let (ino2, root2) = (ino.clone(), root.clone());
        let dirs = agentrun_opensandbox::files::with_fs(&rec, move |fs| {
            let wd = add_dir(fs, &ino2, &root2).map_err(|e| match e {
                Errno::NOTDIR => {
                    agentrun_opensandbox::ApiError::bad_request(format!("{shown}: not a directory"))
                }
                e => errno(e, &shown),
            })?;
            let mut dirs = vec![(wd, String::new())];
            if recursive {
                for sub in subdirs(fs, &root2, &shown) {
                    if dirs.len() >= MAX_DIRS {
                        break;
                    }
                    if let Ok(wd) = add_dir(fs, &ino2, &root2.join(&sub)) {
                        dirs.push((wd, sub));
                    }
                }
            }
            Ok(dirs)
        })
        .await
        .map_err(RpcError::from)?;
        let root_wd = dirs[0].0;
        // SAFETY: the `Arc` owns the inotify fd, which stays open and the same until the
        // `AsyncFd` holding one of its references is dropped (the other references only add
        // watches to it).
        let fd = unsafe { AsyncFd::register(ino) }
            .map_err(|e| RpcError::new(Code::Internal, format!("inotify: {e}")))?;
        Ok(Watch {
            fd,
            dirs: dirs.into_iter().collect(),
            root_wd,
            root,
            recursive,
            rec,
        })
    }

    /// Sends every event to `tx` until the watched directory goes, the sandbox ends (seen
    /// within [`ALIVE_CHECK`]) or `tx` is closed.
    async fn run(mut self, tx: mpsc::Sender<Value>) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
        let mut alive = tokio::time::interval(ALIVE_CHECK);
        loop {
            let mut guard = tokio::select! {
                g = self.fd.readable() => match g { Ok(g) => g, Err(_) => return },
                _ = tx.closed() => return,
                _ = alive.tick() => {
                    if ended(&self.rec) {
                        return;
                    }
                    continue;
                }
            };
            let mut raw = Vec::new();
            {
                let mut reader = inotify::Reader::new(guard.get_inner().as_fd(), &mut buf);
                loop {
                    match reader.next() {
                        Ok(e) => raw.push((
                            e.wd(),
                            e.events(),
                            e.file_name().map(|n| n.to_string_lossy().into_owned()),
                        )),
                        Err(Errno::AGAIN) => break,
                        Err(_) => return,
                    }
                }
            }
            guard.clear_ready();
            for (wd, flags, name) in raw {
                if flags.contains(ReadFlags::IGNORED) {
                    self.dirs.remove(&wd);
                    if wd == self.root_wd {
                        return;
                    }
                    continue;
                }
                let (Some(dir), Some(name)) = (self.dirs.get(&wd), name) else {
                    continue;
                };
                let name = if dir.is_empty() {
                    name
                } else {
                    format!("{dir}/{name}")
                };
                if self.recursive
                    && flags.contains(ReadFlags::ISDIR)
                    && flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO)
                {
                    self.add_later(&name).await;
                }
                if let Some(kind) = kind(flags) {
                    if tx.send(json!({"name": name, "type": kind})).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Watches `name` (relative to the watched directory), made after the watch started.
    async fn add_later(&mut self, name: &str) {
        if self.dirs.len() >= MAX_DIRS {
            return;
        }
        let ino = self.fd.get_ref().clone();
        let rel = self.root.join(name);
        if let Ok(Ok(wd)) =
            agentrun_opensandbox::files::with_fs(&self.rec, move |fs| Ok(add_dir(fs, &ino, &rel)))
                .await
        {
            self.dirs.insert(wd, name.to_owned());
        }
    }
}

/// Has the sandbox ended (deleted, expired, or its entrypoint exited)?
fn ended(rec: &Record) -> bool {
    rec.torn_down.load(std::sync::atomic::Ordering::SeqCst) || rec.check_running().is_err()
}

/// envd's event type of inotify's flags (fsnotify's mapping); `None` for what it ignores.
fn kind(flags: ReadFlags) -> Option<&'static str> {
    if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
        Some("EVENT_TYPE_CREATE")
    } else if flags.contains(ReadFlags::MODIFY) {
        Some("EVENT_TYPE_WRITE")
    } else if flags.contains(ReadFlags::DELETE) {
        Some("EVENT_TYPE_REMOVE")
    } else if flags.contains(ReadFlags::MOVED_FROM) {
        Some("EVENT_TYPE_RENAME")
    } else if flags.contains(ReadFlags::ATTRIB) {
        Some("EVENT_TYPE_CHMOD")
    } else {
        None
    }
}

/// `WatchDir`: `start`, then each event as `filesystem`, keep-alives between; the stream
/// ends (`{}`) when the directory goes, or at the client's `Connect-Timeout-Ms`.
async fn watch_dir(
    Extension(rec): Extension<Arc<Record>>,
    headers: HeaderMap,
    Streamed(req): Streamed<WatchRequest>,
) -> Response {
    let watch = match Watch::start(rec, &headers, &req.path, req.recursive).await {
        Ok(w) => w,
        Err(e) => return connect::stream_error(&e),
    };
    let (keepalive, deadline) = crate::process::stream_params(&headers);
    let (tx, rx) = connect::stream_queue();
    let _ = tx.try_send(connect::message(&json!({"start": {}})));
    let (ev_tx, mut ev_rx) = mpsc::channel::<Value>(connect::STREAM_QUEUE);
    let task = tokio::spawn(watch.run(ev_tx));
    tokio::spawn(async move {
        let mut ping = tokio::time::interval(keepalive);
        ping.tick().await;
        let until = deadline.map(|d| tokio::time::Instant::now() + d);
        let end = loop {
            tokio::select! {
                ev = ev_rx.recv() => match ev {
                    Some(ev) => {
                        if tx.send(connect::message(&json!({"filesystem": ev}))).await.is_err() {
                            break None;
                        }
                    }
                    None => break Some(connect::end_stream(None)),
                },
                _ = ping.tick() => {
                    if tx.send(connect::message(&json!({"keepalive": {}}))).await.is_err() {
                        break None;
                    }
                }
                _ = async { tokio::time::sleep_until(until.unwrap_or_else(tokio::time::Instant::now)).await }, if until.is_some() => {
                    break Some(connect::end_stream(Some(&RpcError::new(
                        Code::DeadlineExceeded,
                        "the watch's timeout passed",
                    ))));
                }
                _ = tx.closed() => break None,
            }
        };
        task.abort();
        if let Some(end) = end {
            let _ = tx.send(end).await;
        }
    });
    connect::stream_response(rx)
}

async fn create_watcher(
    State(watchers): State<Arc<Watchers>>,
    Extension(rec): Extension<Arc<Record>>,
    headers: HeaderMap,
    Unary(req): Unary<WatchRequest>,
) -> RpcResult<Response> {
    let sandbox = rec.id.clone();
    let weak = Arc::downgrade(&rec);
    {
        let mut map = lock(&watchers.map);
        // Watchers whose watch ended go once their events were fetched, or with their
        // sandbox.
        map.retain(|_, w| {
            let gone = w.rec.upgrade().is_none_or(|r| ended(&r));
            !(w.task.is_finished() && (gone || lock(&w.pending).is_empty()))
        });
        if map.values().filter(|w| w.sandbox == sandbox).count() >= MAX_WATCHERS {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("{MAX_WATCHERS} watchers in this sandbox: remove one first"),
            ));
        }
    }
    let watch = Watch::start(rec, &headers, &req.path, req.recursive).await?;
    let id = agentrun_runtime::random::hex(12)
        .map_err(|e| RpcError::new(Code::Internal, format!("watcher id: {e}")))?;
    let (tx, mut rx) = mpsc::channel::<Value>(connect::STREAM_QUEUE);
    let pending = Arc::new(Mutex::new(VecDeque::new()));
    let run = tokio::spawn(watch.run(tx));
    let queue = pending.clone();
    let task = tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let mut q = lock(&queue);
            if q.len() >= MAX_PENDING {
                q.pop_front();
            }
            q.push_back(ev);
        }
        run.abort();
    });
    let polled = Arc::new(Polled {
        sandbox,
        rec: weak,
        pending,
        task,
    });
    lock(&watchers.map).insert(id.clone(), polled);
    Ok(connect::unary_response(&json!({ "watcherId": id })))
}

async fn get_watcher_events(
    State(watchers): State<Arc<Watchers>>,
    Extension(rec): Extension<Arc<Record>>,
    Unary(req): Unary<WatcherRequest>,
) -> RpcResult<Response> {
    let queue = watchers.queue_of(&rec, &req.watcher_id)?;
    let events: Vec<Value> = lock(&queue).drain(..).collect();
    Ok(connect::unary_response(&json!({ "events": events })))
}

async fn remove_watcher(
    State(watchers): State<Arc<Watchers>>,
    Extension(rec): Extension<Arc<Record>>,
    Unary(req): Unary<WatcherRequest>,
) -> RpcResult<Response> {
    watchers.queue_of(&rec, &req.watcher_id)?;
    lock(&watchers.map).remove(&req.watcher_id);
    Ok(connect::unary_response(&json!({})))
}
