//! The pool: ready sandboxes of the default recipe, refilled in the background, and on-demand
//! sandboxes for everything else. Every sandbox is one-shot: it is destroyed after its run.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::factory::{FactoryClient, PooledSandbox};
use crate::protocol::{PoolInfo, SandboxInfo};
use crate::recipe::{SandboxRecipe, DEFAULT_IMAGE, DEFAULT_PROFILE};
use crate::PoolError;

/// How long an on-demand run waits for room under `max_sandboxes`.
const ROOM_WAIT: Duration = Duration::from_secs(30);

/// Pool sizing.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    /// Ready sandboxes kept for the default recipe.
    pub target: usize,
    /// Cap on sandboxes that exist at once (ready + running + being created).
    pub max_sandboxes: usize,
}

struct Running {
    pid: i32,
    image: String,
    profile: String,
    started: Instant,
}

#[derive(Default)]
struct State {
    ready: VecDeque<PooledSandbox>,
    running: HashMap<String, Running>,
    creating: usize,
    hits: u64,
    misses: u64,
    created: u64,
    create_failures: u64,
    shutting_down: bool,
}

impl State {
    fn total(&self) -> usize {
        self.ready.len() + self.running.len() + self.creating
    }
}

pub struct Pool {
    /// One or more factory processes; sandbox creation is spread over them (each is
    /// single-threaded, so one factory caps creation at one core).
    factories: Vec<FactoryClient>,
    next_factory: std::sync::atomic::AtomicUsize,
    limits: PoolLimits,
    state: Mutex<State>,
    changed: Condvar,
}

impl Pool {
    pub fn new(factories: Vec<FactoryClient>, limits: PoolLimits) -> Self {
        assert!(!factories.is_empty(), "a pool needs a factory");
        Pool {
            factories,
            next_factory: std::sync::atomic::AtomicUsize::new(0),
            limits,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    /// Number of factory processes (= refill threads to run).
    pub fn factory_count(&self) -> usize {
        self.factories.len()
    }

    /// Creates on the next factory in turn.
    fn create(&self, recipe: &SandboxRecipe) -> Result<PooledSandbox, PoolError> {
        let n = self
            .next_factory
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % self.factories.len();
        self.create_on(n, recipe)
    }

    fn create_on(&self, n: usize, recipe: &SandboxRecipe) -> Result<PooledSandbox, PoolError> {
        let mut sb = self.factories[n].create(recipe)?;
        sb.factory = n;
        Ok(sb)
    }

    /// Destroys on the factory that made the sandbox.
    fn destroy(&self, sb: PooledSandbox) {
        let (n, id) = (sb.factory, sb.id.clone());
        drop(sb);
        let _ = self.factories[n].destroy(&id);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sandbox for `recipe`: a ready one when the recipe is the pooled one (a hit), else
    /// made now. The second value says whether it was a hit.
    pub fn acquire(&self, recipe: &SandboxRecipe) -> Result<(PooledSandbox, bool), PoolError> {
        let mut st = self.lock();
        if st.shutting_down {
            return Err(PoolError::ShuttingDown);
        }
        if recipe.is_poolable() {
            if let Some(sb) = st.ready.pop_front() {
                st.hits += 1;
                st.running.insert(sb.id.clone(), running(&sb, recipe));
                drop(st);
                self.changed.notify_all();
                return Ok((sb, true));
            }
        }
        st.misses += 1;
        let deadline = Instant::now() + ROOM_WAIT;
        while st.total() >= self.limits.max_sandboxes {
            // Room comes from a finished run, or from a ready sandbox we may sacrifice.
            if let Some(sb) = st.ready.pop_back() {
                drop(st);
                self.destroy(sb);
                st = self.lock();
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PoolError::Busy(self.limits.max_sandboxes));
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        st.creating += 1;
        drop(st);
        let made = self.create(recipe);
        let mut st = self.lock();
        st.creating -= 1;
        let result = match made {
            Ok(sb) => {
                st.created += 1;
                st.running.insert(sb.id.clone(), running(&sb, recipe));
                Ok((sb, false))
            }
            Err(e) => {
                st.create_failures += 1;
                Err(e)
            }
        };
        drop(st);
        self.changed.notify_all();
        result
    }

    /// Destroys a sandbox after its run; the refill loop notices the room.
    pub fn release(&self, sb: PooledSandbox) {
        let id = sb.id.clone();
        self.destroy(sb);
        self.lock().running.remove(&id);
        self.changed.notify_all();
    }

    /// Keeps `target` ready sandboxes until shutdown, creating on factory `n`. Run one thread
    /// per factory.
    pub fn refill_loop(&self, n: usize) {
        let recipe = SandboxRecipe::default();
        let mut backoff = Duration::from_millis(50);
        loop {
            let mut st = self.lock();
            while !st.shutting_down
                && (st.ready.len() + st.creating >= self.limits.target
                    || st.total() >= self.limits.max_sandboxes)
            {
                st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.shutting_down {
                return;
            }
            st.creating += 1;
            drop(st);
            let made = self.create_on(n, &recipe);
            let mut st = self.lock();
            st.creating -= 1;
            match made {
                Ok(sb) => {
                    st.created += 1;
                    if st.shutting_down {
                        drop(st);
                        self.destroy(sb);
                        return;
                    }
                    st.ready.push_back(sb);
                    backoff = Duration::from_millis(50);
                }
                Err(e) => {
                    st.create_failures += 1;
                    drop(st);
                    eprintln!("agentrun: pool: creating a sandbox failed: {e}");
                    // Don't spin on a persistent failure.
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
            self.changed.notify_all();
        }
    }

    /// Stops refilling and destroys the ready sandboxes; waits (bounded) for running ones.
    pub fn shutdown(&self, drain: Duration) {
        let mut st = self.lock();
        st.shutting_down = true;
        let ready: Vec<PooledSandbox> = st.ready.drain(..).collect();
        drop(st);
        self.changed.notify_all();
        for sb in ready {
            self.destroy(sb);
        }
        let deadline = Instant::now() + drain;
        let mut st = self.lock();
        while !st.running.is_empty() || st.creating > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The factories, to end them (each destroys whatever it still has).
    pub fn into_factories(self) -> Vec<FactoryClient> {
        self.factories
    }

    pub fn sandboxes(&self) -> Vec<SandboxInfo> {
        let st = self.lock();
        let ready = st.ready.iter().map(|sb| SandboxInfo {
            id: sb.id.clone(),
            state: "ready".into(),
            pid: sb.init_pid,
            image: DEFAULT_IMAGE.into(),
            profile: DEFAULT_PROFILE.into(),
            age_ms: sb.created.elapsed().as_millis() as u64,
        });
        let running = st.running.iter().map(|(id, r)| SandboxInfo {
            id: id.clone(),
            state: "running".into(),
            pid: r.pid,
            image: r.image.clone(),
            profile: r.profile.clone(),
            age_ms: r.started.elapsed().as_millis() as u64,
        });
        ready.chain(running).collect()
    }

    pub fn status(&self) -> (Vec<PoolInfo>, usize, usize) {
        let st = self.lock();
        let info = PoolInfo {
            image: DEFAULT_IMAGE.into(),
            profile: DEFAULT_PROFILE.into(),
            ready: st.ready.len(),
            target: self.limits.target,
            hits: st.hits,
            misses: st.misses,
            created: st.created,
            create_failures: st.create_failures,
        };
        (vec![info], st.running.len(), self.limits.max_sandboxes)
    }
}

fn running(sb: &PooledSandbox, recipe: &SandboxRecipe) -> Running {
    Running {
        pid: sb.init_pid,
        image: recipe.image.clone(),
        profile: recipe.profile.clone(),
        started: Instant::now(),
    }
}
