//! The pool: ready sandboxes per configured (image, profile), refilled in the background, and
//! on-demand sandboxes for everything else. Every sandbox is one-shot: it is destroyed after
//! its run.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::factory::{FactoryClient, PooledSandbox};
use crate::protocol::{PoolInfo, SandboxInfo};
use crate::recipe::SandboxRecipe;
use crate::PoolError;

/// How long an on-demand run waits for room under `max_sandboxes`.
const ROOM_WAIT: Duration = Duration::from_secs(30);

/// One kept pool: `target` ready sandboxes of `image` with `profile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub image: String,
    pub profile: String,
    pub target: usize,
}

impl PoolSpec {
    /// Parses `IMAGE[:PROFILE][=N]` (`N` defaults to `default_target`, PROFILE to `default`).
    pub fn parse(s: &str, default_target: usize) -> Result<Self, PoolError> {
        let bad = || PoolError::Invalid(format!("pool {s:?}: expected IMAGE[:PROFILE][=N]"));
        let (key, target) = match s.split_once('=') {
            Some((k, n)) => (k, n.trim().parse::<usize>().map_err(|_| bad())?),
            None => (s, default_target),
        };
        let (image, profile) = match key.split_once(':') {
            Some((i, p)) => (i, p),
            None => (key, crate::recipe::DEFAULT_PROFILE),
        };
        if image.is_empty() || profile.is_empty() {
            return Err(bad());
        }
        Ok(PoolSpec {
            image: image.to_owned(),
            profile: profile.to_owned(),
            target,
        })
    }

    fn recipe(&self) -> SandboxRecipe {
        SandboxRecipe {
            image: self.image.clone(),
            profile: self.profile.clone(),
            ..SandboxRecipe::default()
        }
    }
}

/// Pool sizing.
#[derive(Debug, Clone)]
pub struct PoolLimits {
    /// The pools kept ready.
    pub pools: Vec<PoolSpec>,
    /// Cap on sandboxes that exist at once (ready + running + being created).
    pub max_sandboxes: usize,
}

struct Running {
    pid: i32,
    image: String,
    profile: String,
    started: Instant,
}

/// The live state of one kept pool.
struct Keyed {
    spec: PoolSpec,
    ready: VecDeque<PooledSandbox>,
    creating: usize,
    /// Image id of the last sandbox made for it (requests by image id find it when empty, and
    /// count as its misses).
    image_id: String,
    hits: u64,
    misses: u64,
}

#[derive(Default)]
struct State {
    pools: Vec<Keyed>,
    running: HashMap<String, Running>,
    /// Sandboxes being made on demand.
    creating: usize,
    /// Ready sandboxes taken out of a pool to make room, still being torn down: they exist
    /// until their destroy returns, so they count against the cap.
    destroying: usize,
    /// Runs no kept pool could serve.
    unpooled: u64,
    created: u64,
    create_failures: u64,
    shutting_down: bool,
    /// Refills wait until then (see [`REFILL_HOLDOFF`]).
    refill_holdoff: Option<Instant>,
}

/// After a pool hit, the replacement is made when the run ends or after this long, whichever
/// comes first, while that pool misses only that one sandbox (when runs take sandboxes faster
/// than one at a time, it refills at once). Making a sandbox is ~10 ms of mostly kernel work
/// (namespaces, mounts, cgroups), which this kind of host does not preempt (PREEMPT_NONE):
/// started beside a short run, it delays the wakeups the run's reply path needs on 2 cores
/// (~1 ms of a warm `/bin/true`).
pub const REFILL_HOLDOFF: Duration = Duration::from_millis(20);

impl State {
    fn total(&self) -> usize {
        let pooled: usize = self.pools.iter().map(|p| p.ready.len() + p.creating).sum();
        pooled + self.running.len() + self.creating + self.destroying
    }

    /// The kept pool a recipe can be served from.
    fn pool_for(&self, recipe: &SandboxRecipe) -> Option<usize> {
        if !recipe.is_plain() {
            return None;
        }
        self.pools
            .iter()
            .position(|p| p.spec.image == recipe.image && p.spec.profile == recipe.profile)
            .or_else(|| {
                // A request by image id (the Docker API's containers) is served by the pool
                // of a name whose sandboxes run that very image.
                self.pools.iter().position(|p| {
                    p.spec.profile == recipe.profile
                        && (same_image_id(&p.image_id, &recipe.image)
                            || p.ready
                                .iter()
                                .any(|sb| same_image_id(&sb.image_id, &recipe.image)))
                })
            })
    }

    /// The pool furthest below its target, if any is below.
    fn neediest(&self) -> Option<usize> {
        self.pools
            .iter()
            .enumerate()
            .filter(|(_, p)| p.ready.len() + p.creating < p.spec.target)
            .max_by_key(|(_, p)| p.spec.target - p.ready.len() - p.creating)
            .map(|(i, _)| i)
    }

    /// Takes a ready sandbox from any pool (to make room), the fullest first.
    fn sacrifice(&mut self) -> Option<PooledSandbox> {
        self.pools
            .iter_mut()
            .max_by_key(|p| p.ready.len())
            .and_then(|p| p.ready.pop_back())
    }
}

pub struct Pool {
    /// One or more factory processes; sandbox creation is spread over them (each is
    /// single-threaded, so one factory caps creation at one core).
    factories: Vec<FactoryClient>,
    next_factory: std::sync::atomic::AtomicUsize,
    max_sandboxes: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl Pool {
    pub fn new(factories: Vec<FactoryClient>, limits: PoolLimits) -> Self {
        assert!(!factories.is_empty(), "a pool needs a factory");
        let pools = limits
            .pools
            .into_iter()
            .map(|spec| Keyed {
                spec,
                ready: VecDeque::new(),
                creating: 0,
                image_id: String::new(),
                hits: 0,
                misses: 0,
            })
            .collect();
        Pool {
            factories,
            next_factory: std::sync::atomic::AtomicUsize::new(0),
            max_sandboxes: limits.max_sandboxes,
            state: Mutex::new(State {
                pools,
                ..State::default()
            }),
            changed: Condvar::new(),
        }
    }

    /// Number of factory processes (= refill threads to run).
    pub fn factory_count(&self) -> usize {
        self.factories.len()
    }

    /// Creates on the next factory in turn, for a run waiting for it.
    fn create(&self, recipe: &SandboxRecipe) -> Result<PooledSandbox, PoolError> {
        let n = self
            .next_factory
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % self.factories.len();
        self.create_on(n, recipe, false)
    }

    /// `background`: made ahead for a pool (see [`crate::factory::background_cpus`]).
    fn create_on(
        &self,
        n: usize,
        recipe: &SandboxRecipe,
        background: bool,
    ) -> Result<PooledSandbox, PoolError> {
        let mut sb = self.factories[n].create(recipe, background)?;
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

    /// A sandbox for `recipe`: a ready one from the pool kept for it (a hit), else made now.
    /// The second value says whether it was a hit.
    ///
    /// A hit holds the pool's refill off for a while ([`REFILL_HOLDOFF`]): the caller ends it
    /// with [`Pool::refill`] once its command is under way, [`Pool::release`] ends it too.
    pub fn acquire(&self, recipe: &SandboxRecipe) -> Result<(PooledSandbox, bool), PoolError> {
        let mut st = self.lock();
        if st.shutting_down {
            return Err(PoolError::ShuttingDown);
        }
        match st.pool_for(recipe) {
            Some(i) => match take_ready(&mut st.pools[i].ready, recipe) {
                Some(sb) => {
                    st.pools[i].hits += 1;
                    st.refill_holdoff = Some(Instant::now() + REFILL_HOLDOFF);
                    st.running.insert(sb.id.clone(), running(&sb, recipe));
                    drop(st);
                    self.changed.notify_all();
                    return Ok((sb, true));
                }
                None => st.pools[i].misses += 1,
            },
            None => st.unpooled += 1,
        }
        let deadline = Instant::now() + ROOM_WAIT;
        while st.total() >= self.max_sandboxes {
            // Room comes from a finished run, or from a ready sandbox we may sacrifice.
            if let Some(sb) = st.sacrifice() {
                st.destroying += 1;
                drop(st);
                self.destroy(sb);
                st = self.lock();
                st.destroying -= 1;
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PoolError::Busy(self.max_sandboxes));
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

    /// Ends the refill holdoff of [`Pool::acquire`]: the run that took a sandbox is under way
    /// (or over), so the pool may replace it now.
    pub fn refill(&self) {
        self.lock().refill_holdoff = None;
        self.changed.notify_all();
    }

    /// Destroys a sandbox after its run; the refill loop notices the room.
    pub fn release(&self, sb: PooledSandbox) {
        let id = sb.id.clone();
        self.refill();
        self.destroy(sb);
        self.lock().running.remove(&id);
        self.changed.notify_all();
    }

    /// Keeps every pool at its target until shutdown, creating on factory `n`. Run one thread
    /// per factory.
    pub fn refill_loop(&self, n: usize) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let mut st = self.lock();
            let (pick, background) = loop {
                if st.shutting_down {
                    return;
                }
                match st.neediest() {
                    Some(i) if st.total() < self.max_sandboxes => {
                        // Only the replacement of the one sandbox a lone run took waits.
                        let comfortable = st.pools[i].ready.len() + 1 >= st.pools[i].spec.target;
                        let wait = st
                            .refill_holdoff
                            .filter(|_| comfortable && !st.pools[i].ready.is_empty())
                            .map(|t| t.saturating_duration_since(Instant::now()))
                            .filter(|d| !d.is_zero());
                        match wait {
                            // Made on the background CPUs only while the pool is
                            // comfortable: otherwise production must keep up.
                            None => break (i, comfortable),
                            Some(d) => {
                                st = self
                                    .changed
                                    .wait_timeout(st, d)
                                    .unwrap_or_else(|p| p.into_inner())
                                    .0
                            }
                        }
                    }
                    _ => st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner()),
                }
            };
            st.pools[pick].creating += 1;
            let recipe = st.pools[pick].spec.recipe();
            drop(st);
            let made = self.create_on(n, &recipe, background);
            let mut st = self.lock();
            st.pools[pick].creating -= 1;
            match made {
                Ok(sb) => {
                    st.created += 1;
                    if st.shutting_down {
                        drop(st);
                        self.destroy(sb);
                        return;
                    }
                    st.pools[pick].image_id.clone_from(&sb.image_id);
                    st.pools[pick].ready.push_back(sb);
                    backoff = Duration::from_millis(50);
                }
                Err(e) => {
                    st.create_failures += 1;
                    drop(st);
                    eprintln!(
                        "agentrun: pool {}: creating a sandbox failed: {e}",
                        recipe.image
                    );
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
        let ready: Vec<PooledSandbox> = st
            .pools
            .iter_mut()
            .flat_map(|p| p.ready.drain(..))
            .collect();
        drop(st);
        self.changed.notify_all();
        for sb in ready {
            self.destroy(sb);
        }
        let deadline = Instant::now() + drain;
        let mut st = self.lock();
        while !st.running.is_empty() || st.creating > 0 || st.pools.iter().any(|p| p.creating > 0) {
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
        let ready = st.pools.iter().flat_map(|p| {
            p.ready.iter().map(|sb| SandboxInfo {
                id: sb.id.clone(),
                state: "ready".into(),
                pid: sb.init_pid,
                image: p.spec.image.clone(),
                profile: p.spec.profile.clone(),
                age_ms: sb.created.elapsed().as_millis() as u64,
            })
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

    /// Per-pool counters, runs no pool could serve, running runs, the cap.
    pub fn status(&self) -> PoolStatus {
        let st = self.lock();
        PoolStatus {
            pools: st
                .pools
                .iter()
                .map(|p| PoolInfo {
                    image: p.spec.image.clone(),
                    profile: p.spec.profile.clone(),
                    ready: p.ready.len(),
                    target: p.spec.target,
                    hits: p.hits,
                    misses: p.misses,
                })
                .collect(),
            unpooled: st.unpooled,
            created: st.created,
            create_failures: st.create_failures,
            running: st.running.len(),
            max_sandboxes: self.max_sandboxes,
        }
    }
}

/// What `agentrun pool status` shows.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct PoolStatus {
    pub pools: Vec<PoolInfo>,
    /// Runs whose recipe no pool keeps (mounts, resource flags, other image/profile).
    pub unpooled: u64,
    /// Sandboxes created, and creations that failed, since the daemon started.
    pub created: u64,
    pub create_failures: u64,
    pub running: usize,
    pub max_sandboxes: usize,
}

fn running(sb: &PooledSandbox, recipe: &SandboxRecipe) -> Running {
    Running {
        pid: sb.init_pid,
        image: recipe.image.clone(),
        profile: recipe.profile.clone(),
        started: Instant::now(),
    }
}

/// Whether `id` (a store image id) is the image `wanted` names by id (`sha256:` optional).
fn same_image_id(id: &str, wanted: &str) -> bool {
    let wanted = wanted.strip_prefix("sha256:").unwrap_or(wanted);
    !id.is_empty() && id.strip_prefix("sha256:").unwrap_or(id) == wanted
}

/// The oldest ready sandbox of a pool that runs what `recipe` asks for: any, when asked by
/// the pool's image name; when asked by image id, one of that id (after a re-tag a pool of a
/// name may still hold sandboxes of the name's old image).
fn take_ready(
    ready: &mut VecDeque<PooledSandbox>,
    recipe: &SandboxRecipe,
) -> Option<PooledSandbox> {
    let i = ready.iter().position(|sb| {
        !is_image_id_request(recipe) || same_image_id(&sb.image_id, &recipe.image)
    })?;
    ready.remove(i)
}

fn is_image_id_request(recipe: &SandboxRecipe) -> bool {
    let hex = recipe
        .image
        .strip_prefix("sha256:")
        .unwrap_or(&recipe.image);
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_ids_match_with_or_without_the_algorithm() {
        let id = "a".repeat(64);
        assert!(same_image_id(&id, &format!("sha256:{id}")));
        assert!(same_image_id(&format!("sha256:{id}"), &id));
        assert!(!same_image_id("", ""));
        assert!(!same_image_id(&id, &"b".repeat(64)));
        let by_id = |image: &str| SandboxRecipe {
            image: image.into(),
            ..SandboxRecipe::default()
        };
        assert!(is_image_id_request(&by_id(&id)));
        assert!(is_image_id_request(&by_id(&format!("sha256:{id}"))));
        assert!(!is_image_id_request(&by_id("busybox")));
        assert!(!is_image_id_request(&by_id(&"g".repeat(64))));
    }
}
