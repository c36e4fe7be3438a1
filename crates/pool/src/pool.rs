//! The pool: ready shells per configured (image, profile), each serving one cell per run and
//! reused run after run; shells made on demand for everything else. A shell is discarded,
//! never reused, when anything about it is in doubt ([`Verdict`]), and replaced off the
//! request path by the refill threads.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::factory::{FactoryClient, PooledShell};
use crate::protocol::{PoolInfo, PoolStatus, SandboxInfo};
use crate::recipe::SandboxRecipe;
use crate::run::Verdict;
use crate::PoolError;

/// How long an on-demand run waits for room under `max_sandboxes`.
const ROOM_WAIT: Duration = Duration::from_secs(30);

/// How long a run that finds its pool empty waits for a shell of that pool to come back from
/// its previous run (the cell's teardown and the checks: a few ms; the wait for the previous
/// client to hang up: at most 50 ms) before it has one made (~13 ms of CPU).
const RECYCLE_WAIT: Duration = Duration::from_millis(100);

/// Ready shells beyond a pool's target (made on demand under load) that stay unused this long
/// are destroyed.
const IDLE_TRIM: Duration = Duration::from_secs(30);

/// Default of [`PoolLimits::shell_max_runs`]: a shell is ~13 ms of CPU to make, so over 500
/// runs it costs ~0.03 ms a run (~1% of the 2 ms a run may cost); any slow leak a shell could
/// accumulate (kernel objects charged to its namespaces, the init's heap) is bounded by it.
pub const DEFAULT_SHELL_MAX_RUNS: u64 = 500;
/// Default of [`PoolLimits::shell_max_age`]: an idle pool is renewed every 5 minutes, so a
/// pool of a name serves a re-tagged image, and a changed host image (linker cache), within
/// that time.
pub const DEFAULT_SHELL_MAX_AGE: Duration = Duration::from_secs(300);

/// One kept pool: `target` ready shells of `image` with `profile`.
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

/// Pool sizing and shell lifetime.
#[derive(Debug, Clone)]
pub struct PoolLimits {
    /// The pools kept ready.
    pub pools: Vec<PoolSpec>,
    /// Cap on shells that exist at once (ready + running + being made or torn down).
    pub max_sandboxes: usize,
    /// A shell that served this many runs is discarded after the last.
    pub shell_max_runs: u64,
    /// A shell older than this is discarded after its run (or when idle).
    pub shell_max_age: Duration,
}

impl PoolLimits {
    pub fn new(pools: Vec<PoolSpec>, max_sandboxes: usize) -> Self {
        PoolLimits {
            pools,
            max_sandboxes,
            shell_max_runs: DEFAULT_SHELL_MAX_RUNS,
            shell_max_age: DEFAULT_SHELL_MAX_AGE,
        }
    }
}

struct Lent {
    pid: i32,
    image: String,
    profile: String,
    started: Instant,
    cells: u64,
    /// The pool it goes back to.
    home: Option<usize>,
    /// Its run is over; it is being checked for reuse.
    recycling: bool,
    /// The id of the long-lived sandbox it serves, if it serves one.
    sandbox: Option<String>,
}

/// A shell lent out for this long is not counted on to come back soon: its pool is refilled
/// as if it were gone (a long-lived sandbox, a long run).
const LENT_GRACE: Duration = Duration::from_secs(1);

/// The live state of one kept pool.
struct Keyed {
    spec: PoolSpec,
    ready: VecDeque<(PooledShell, Instant)>,
    creating: usize,
    /// Shells of this pool whose run is over and that are being checked for reuse.
    recycling: usize,
    /// Runs waiting for one of those.
    waiting: usize,
    /// Image id of the last shell made for it (requests by image id find it when empty, and
    /// count as its misses).
    image_id: String,
    hits: u64,
    misses: u64,
    /// Its shells discarded (for any reason).
    discarded: u64,
    /// Its shells retired after a run (`max_runs`, `max_age`) while it held at least its
    /// target without them: shells its runs were using, which the refill replaces ahead (a
    /// pool grown by demand keeps its size) instead of a later run making one on its path.
    owed: usize,
}

#[derive(Default)]
struct State {
    pools: Vec<Keyed>,
    lent: HashMap<String, Lent>,
    /// Shells being made on demand.
    creating: usize,
    /// Shells being destroyed: they exist until their destroy returns, so they count
    /// against the cap.
    destroying: usize,
    /// Runs no kept pool could serve.
    unpooled: u64,
    created: u64,
    create_failures: u64,
    /// Cells served (runs and long-lived sandboxes).
    cells: u64,
    discarded: BTreeMap<String, u64>,
    shutting_down: bool,
    /// Refills wait until then (see [`REFILL_HOLDOFF`]).
    refill_holdoff: Option<Instant>,
}

/// After a shell was taken from a pool that is then short of it, its replacement is made
/// when the run ends or after this long, whichever comes first, while that pool misses only
/// that one shell (when runs take shells faster than one at a time, it refills at once).
/// Making a shell is ~13 ms of mostly kernel work (namespaces, mounts, cgroups), which this
/// kind of host does not preempt (PREEMPT_NONE): started beside a short run, it delays the
/// wakeups the run's reply path needs on 2 cores. With reuse, a replacement is only needed
/// after a shell is discarded.
pub const REFILL_HOLDOFF: Duration = Duration::from_millis(20);

impl State {
    fn total(&self) -> usize {
        let pooled: usize = self.pools.iter().map(|p| p.ready.len() + p.creating).sum();
        // Shells being recycled are still lent.
        pooled + self.lent.len() + self.creating + self.destroying
    }

    /// The kept pool a recipe can be served from.
    fn pool_for(&self, recipe: &SandboxRecipe) -> Option<usize> {
        self.pools
            .iter()
            .position(|p| p.spec.image == recipe.image && p.spec.profile == recipe.profile)
            .or_else(|| {
                // A request by image id (the Docker API's containers) is served by the pool
                // of a name whose shells run that very image.
                self.pools.iter().position(|p| {
                    p.spec.profile == recipe.profile
                        && (same_image_id(&p.image_id, &recipe.image)
                            || p.ready
                                .iter()
                                .any(|(sh, _)| same_image_id(&sh.image_id, &recipe.image)))
                })
            })
    }

    /// Shells of pool `i` that are there or will be soon: ready, being made, and lent out
    /// for a short run (or already back from it and being checked).
    fn present(&self, i: usize) -> usize {
        let p = &self.pools[i];
        let returning = self
            .lent
            .values()
            .filter(|l| l.home == Some(i) && (l.recycling || l.started.elapsed() < LENT_GRACE))
            .count();
        p.ready.len() + p.creating + returning
    }

    /// The pool furthest below its target (or owed a retired shell's replacement), if any.
    fn neediest(&self) -> Option<usize> {
        let short = |i: usize| {
            self.pools[i].spec.target.saturating_sub(self.present(i)) + self.pools[i].owed
        };
        (0..self.pools.len())
            .filter(|&i| short(i) > 0)
            .max_by_key(|&i| short(i))
    }

    /// Takes a ready shell from any pool (to make room), the fullest first; counted as
    /// discarded (`room`).
    fn sacrifice(&mut self) -> Option<PooledShell> {
        let i = (0..self.pools.len()).max_by_key(|&i| self.pools[i].ready.len())?;
        let (sh, _) = self.pools[i].ready.pop_back()?;
        self.count_discard("room", Some(i));
        Some(sh)
    }

    /// A shell of pool `home` (if any) is discarded for `reason`.
    fn count_discard(&mut self, reason: &str, home: Option<usize>) {
        *self.discarded.entry(reason.to_owned()).or_default() += 1;
        if let Some(p) = home.and_then(|i| self.pools.get_mut(i)) {
            p.discarded += 1;
        }
    }
}

pub struct Pool {
    /// One or more factory processes; shell creation is spread over them (each is
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
        let pools = limits
            .pools
            .iter()
            .cloned()
            .map(|spec| Keyed {
                spec,
                ready: VecDeque::new(),
                creating: 0,
                recycling: 0,
                waiting: 0,
                image_id: String::new(),
                hits: 0,
                misses: 0,
                discarded: 0,
                owed: 0,
            })
            .collect();
        Pool {
            factories,
            next_factory: std::sync::atomic::AtomicUsize::new(0),
            limits,
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
    fn create(&self, recipe: &SandboxRecipe) -> Result<PooledShell, PoolError> {
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
    ) -> Result<PooledShell, PoolError> {
        let mut sh = self.factories[n].create(recipe, background)?;
        sh.factory = n;
        Ok(sh)
    }

    /// Destroys on the factory that made the shell.
    fn destroy(&self, sh: PooledShell) {
        let (n, id) = (sh.factory, sh.id.clone());
        drop(sh);
        if let Err(e) = self.factories[n].destroy(&id) {
            tracing::warn!(target: "agentrun::pool", "destroying shell {id}: {e}");
        }
    }

    /// Destroys `sh` with the lock `st` released (counted in `destroying` meanwhile); returns
    /// the lock taken again.
    fn destroy_released<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        sh: PooledShell,
    ) -> MutexGuard<'a, State> {
        st.destroying += 1;
        drop(st);
        self.destroy(sh);
        let mut st = self.lock();
        st.destroying -= 1;
        st
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }

    /// A shell for `recipe`: a ready one from the pool kept for it (a hit), one of that pool
    /// coming back from its previous run, else one made now (a miss, or an unpooled run). The
    /// second value says whether it was a hit.
    ///
    /// A hit holds the pool's refill off for a while ([`REFILL_HOLDOFF`]): the caller ends it
    /// with [`Pool::refill`] once its command is under way; [`Pool::release`] ends it too.
    pub fn acquire(&self, recipe: &SandboxRecipe) -> Result<(PooledShell, bool), PoolError> {
        let mut st = self.lock();
        if st.shutting_down {
            return Err(PoolError::ShuttingDown);
        }
        let home = st.pool_for(recipe);
        match home {
            Some(i) => {
                let deadline = Instant::now() + RECYCLE_WAIT;
                loop {
                    if let Some(sh) = take_ready(&mut st.pools[i].ready, recipe) {
                        st.pools[i].hits += 1;
                        st.refill_holdoff = Some(Instant::now() + REFILL_HOLDOFF);
                        st.lent.insert(sh.id.clone(), lent(&sh, recipe, Some(i)));
                        drop(st);
                        self.changed.notify_all();
                        return Ok((sh, true));
                    }
                    // One coming back soon is worth waiting for: a shell costs far more.
                    let p = &st.pools[i];
                    let left = deadline.saturating_duration_since(Instant::now());
                    if p.recycling <= p.waiting || left.is_zero() || st.shutting_down {
                        break;
                    }
                    st.pools[i].waiting += 1;
                    st = crate::wait(&self.changed, st, left);
                    st.pools[i].waiting -= 1;
                }
                st.pools[i].misses += 1;
                // The shell this run makes joins the pool: it replaces a retired one.
                st.pools[i].owed = st.pools[i].owed.saturating_sub(1);
            }
            None => st.unpooled += 1,
        }
        let deadline = Instant::now() + ROOM_WAIT;
        while st.total() >= self.limits.max_sandboxes {
            // A shell of our own pool that came back meanwhile serves us after all.
            if let Some(i) = home {
                if let Some(sh) = take_ready(&mut st.pools[i].ready, recipe) {
                    st.pools[i].misses -= 1;
                    st.pools[i].hits += 1;
                    st.lent.insert(sh.id.clone(), lent(&sh, recipe, Some(i)));
                    drop(st);
                    self.changed.notify_all();
                    return Ok((sh, true));
                }
            }
            // Room comes from a finished run, or from a ready shell we may sacrifice.
            if let Some(sh) = st.sacrifice() {
                st = self.destroy_released(st, sh);
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PoolError::Busy(self.limits.max_sandboxes));
            }
            st = crate::wait(&self.changed, st, left);
        }
        st.creating += 1;
        drop(st);
        let made = self.create(recipe);
        let mut st = self.lock();
        st.creating -= 1;
        let result = match made {
            Ok(mut sh) => {
                st.created += 1;
                // A miss's shell joins its pool after the run (the pool grows with demand;
                // extra shells left idle are trimmed).
                sh.home = home;
                st.lent.insert(sh.id.clone(), lent(&sh, recipe, home));
                Ok((sh, false))
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

    /// Ends the refill holdoff of [`Pool::acquire`]: the run that took a shell is under way
    /// (or over), so the pool may replace it now.
    pub fn refill(&self) {
        self.lock().refill_holdoff = None;
        self.changed.notify_all();
    }

    /// `shell` serves the long-lived sandbox `sandbox` (shown beside it by `ps`) and is not
    /// counted on to come back soon: its pool is refilled now, as if it were gone, rather
    /// than after `LENT_GRACE` or the sandbox's end (a `docker run --rm` loop takes a shell
    /// every few ms). It stays counted against the cap while it exists; when the sandbox goes
    /// it comes back through [`Pool::release`] like a run's shell (ready shells beyond the
    /// target are trimmed when idle).
    pub fn keep(&self, shell: &PooledShell, sandbox: &str) {
        let mut st = self.lock();
        if let Some(l) = st.lent.get_mut(&shell.id) {
            l.home = None;
            l.sandbox = Some(sandbox.to_owned());
        }
        drop(st);
        self.changed.notify_all();
    }

    /// The run on `shell` is over and its shell is being checked for reuse: a run that finds
    /// the pool empty meanwhile waits for it rather than having one made.
    pub fn recycling(&self, shell: &mut PooledShell) {
        let mut st = self.lock();
        if let Some(i) = shell.home {
            st.pools[i].recycling += 1;
            shell.recycling = true;
        }
        if let Some(l) = st.lent.get_mut(&shell.id) {
            l.recycling = true;
        }
    }

    /// A shell's run is over: back to its pool when `verdict` allows and it is neither too old
    /// nor worn out, else destroyed (the refill loop notices the room).
    pub fn release(&self, mut shell: PooledShell, verdict: Verdict) {
        let id = shell.id.clone();
        let mut st = self.lock();
        st.refill_holdoff = None;
        st.cells += 1;
        shell.runs += 1;
        if let Some(l) = st.lent.get_mut(&id) {
            l.cells = shell.runs;
        }
        let home = shell.home;
        if shell.recycling {
            if let Some(i) = home {
                st.pools[i].recycling -= 1;
            }
            shell.recycling = false;
        }
        let verdict = match verdict {
            Verdict::Reuse if st.shutting_down => Verdict::Discard("shutdown"),
            Verdict::Reuse if home.is_none() => Verdict::Discard("unpooled"),
            Verdict::Reuse if shell.runs >= self.limits.shell_max_runs => {
                Verdict::Discard("max_runs")
            }
            Verdict::Reuse if shell.created.elapsed() >= self.limits.shell_max_age => {
                Verdict::Discard("max_age")
            }
            v => v,
        };
        match (verdict, home) {
            (Verdict::Reuse, Some(i)) => {
                st.lent.remove(&id);
                shell.prepare_spare();
                st.pools[i].ready.push_front((shell, Instant::now()));
                drop(st);
            }
            (Verdict::Discard(_), _) | (Verdict::Reuse, None) => {
                let reason = match verdict {
                    Verdict::Discard(r) => r,
                    Verdict::Reuse => "unpooled",
                };
                st.count_discard(reason, home);
                // Listed (and counted) until it is gone; its pool may be refilled meanwhile.
                if let Some(l) = st.lent.get_mut(&id) {
                    l.home = None;
                    l.recycling = false;
                }
                if let (Some(i), "max_runs" | "max_age") = (home, reason) {
                    // Worn out, not in doubt: a pool that keeps its target without it grew
                    // with its runs, and the refill replaces it ahead of them. (Extra shells
                    // left idle when the runs drop off are trimmed as before, after IDLE_TRIM.)
                    if st.present(i) >= st.pools[i].spec.target {
                        st.pools[i].owed += 1;
                    }
                }
                drop(st);
                self.changed.notify_all();
                self.destroy(shell);
                self.lock().lent.remove(&id);
            }
        }
        self.changed.notify_all();
    }

    /// Keeps every pool at its target until shutdown, creating on factory `n`; trims idle
    /// extra shells and renews old idle ones. Run one thread per factory.
    pub fn refill_loop(&self, n: usize) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let mut st = self.lock();
            let (pick, background) = loop {
                if st.shutting_down {
                    return;
                }
                if let Some(old) = self.expired(&mut st) {
                    st = self.destroy_released(st, old);
                    continue;
                }
                match st.neediest() {
                    Some(i) if st.total() < self.limits.max_sandboxes => {
                        // Only the replacement of the one shell a lone run took waits.
                        let p = &st.pools[i];
                        let comfortable = st.present(i) + 1 >= p.spec.target;
                        let wait = st
                            .refill_holdoff
                            .filter(|_| comfortable && !p.ready.is_empty())
                            .map(|t| t.saturating_duration_since(Instant::now()))
                            .filter(|d| !d.is_zero());
                        match wait {
                            // Made on the background CPUs only while the pool is
                            // comfortable: otherwise production must keep up.
                            None => break (i, comfortable),
                            Some(d) => st = crate::wait(&self.changed, st, d),
                        }
                    }
                    _ => st = crate::wait(&self.changed, st, LENT_GRACE),
                }
            };
            if st.present(pick) >= st.pools[pick].spec.target {
                // Only a debt makes a pool at its target needy.
                st.pools[pick].owed = st.pools[pick].owed.saturating_sub(1);
            }
            st.pools[pick].creating += 1;
            let recipe = st.pools[pick].spec.recipe();
            drop(st);
            let made = self.create_on(n, &recipe, background);
            let mut st = self.lock();
            st.pools[pick].creating -= 1;
            match made {
                Ok(mut sh) => {
                    st.created += 1;
                    sh.home = Some(pick);
                    if st.shutting_down {
                        drop(st);
                        self.destroy(sh);
                        return;
                    }
                    st.pools[pick].image_id.clone_from(&sh.image_id);
                    // Made for the pool's target: its zygote (if any) starts with its
                    // first spare, ready for the pool's first Python runs.
                    sh.start_zygote = true;
                    sh.prepare_spare();
                    st.pools[pick].ready.push_back((sh, Instant::now()));
                    backoff = Duration::from_millis(50);
                }
                Err(e) => {
                    st.create_failures += 1;
                    drop(st);
                    tracing::warn!(
                        target: "agentrun::pool",
                        "pool {}: creating a shell failed: {e}",
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

    /// A ready shell to destroy now: older than the maximum age, or beyond its pool's target
    /// and idle for [`IDLE_TRIM`] (the oldest-idle end of the queue).
    fn expired(&self, st: &mut State) -> Option<PooledShell> {
        let max_age = self.limits.shell_max_age;
        for n in 0..st.pools.len() {
            let p = &mut st.pools[n];
            if let Some(i) = p
                .ready
                .iter()
                .position(|(sh, _)| sh.created.elapsed() >= max_age)
            {
                let (sh, _) = p.ready.remove(i)?;
                st.count_discard("max_age", Some(n));
                return Some(sh);
            }
            let extra = p.ready.len() > p.spec.target;
            if extra
                && p.ready
                    .back()
                    .is_some_and(|(_, t)| t.elapsed() >= IDLE_TRIM)
            {
                let (sh, _) = p.ready.pop_back()?;
                st.count_discard("idle", Some(n));
                return Some(sh);
            }
        }
        None
    }

    /// Stops refilling and destroys the ready shells; waits (bounded) for running ones.
    pub fn shutdown(&self, drain: Duration) {
        let mut st = self.lock();
        st.shutting_down = true;
        let ready: Vec<PooledShell> = st
            .pools
            .iter_mut()
            .flat_map(|p| p.ready.drain(..))
            .map(|(sh, _)| sh)
            .collect();
        drop(st);
        self.changed.notify_all();
        for sh in ready {
            self.destroy(sh);
        }
        let deadline = Instant::now() + drain;
        let mut st = self.lock();
        while !st.lent.is_empty() || st.creating > 0 || st.pools.iter().any(|p| p.creating > 0) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = crate::wait(&self.changed, st, left);
        }
    }

    /// The factories, to end them (each destroys whatever it still has).
    pub fn into_factories(self) -> Vec<FactoryClient> {
        self.factories
    }

    pub fn sandboxes(&self) -> Vec<SandboxInfo> {
        let st = self.lock();
        let ready = st.pools.iter().flat_map(|p| {
            p.ready.iter().map(|(sh, _)| SandboxInfo {
                id: sh.id.clone(),
                state: "ready".into(),
                pid: sh.init_pid,
                image: p.spec.image.clone(),
                profile: p.spec.profile.clone(),
                age_ms: sh.created.elapsed().as_millis() as u64,
                cells: sh.runs,
                sandbox: None,
            })
        });
        let running = st.lent.iter().map(|(id, r)| SandboxInfo {
            id: id.clone(),
            state: "running".into(),
            pid: r.pid,
            image: r.image.clone(),
            profile: r.profile.clone(),
            age_ms: r.started.elapsed().as_millis() as u64,
            cells: r.cells,
            sandbox: r.sandbox.clone(),
        });
        ready.chain(running).collect()
    }

    /// Per-pool counters, runs no pool could serve, shells, cells, discards, the cap.
    /// A ready shell of pool `i`: its id and its init's host pid.
    pub fn ready_shell(&self, i: usize) -> Option<(String, i32)> {
        let st = self.lock();
        let (sh, _) = st.pools.get(i)?.ready.front()?;
        Some((sh.id.clone(), sh.init_pid))
    }

    pub fn status(&self) -> PoolStatus {
        let st = self.lock();
        let shells = st.total();
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
                    discarded: p.discarded,
                    zygote: None,
                })
                .collect(),
            unpooled: st.unpooled,
            created: st.created,
            create_failures: st.create_failures,
            running: st.lent.len(),
            max_sandboxes: self.limits.max_sandboxes,
            shells,
            cells: st.cells,
            discarded: st.discarded.clone(),
            shell_max_runs: self.limits.shell_max_runs,
            shell_max_age_s: self.limits.shell_max_age.as_secs(),
        }
    }
}

fn lent(sh: &PooledShell, recipe: &SandboxRecipe, home: Option<usize>) -> Lent {
    Lent {
        pid: sh.init_pid,
        image: recipe.image.clone(),
        profile: recipe.profile.clone(),
        started: Instant::now(),
        cells: sh.runs,
        home,
        recycling: false,
        sandbox: None,
    }
}

/// Whether `id` (a store image id) is the image `wanted` names by id (`sha256:` optional).
fn same_image_id(id: &str, wanted: &str) -> bool {
    let wanted = wanted.strip_prefix("sha256:").unwrap_or(wanted);
    !id.is_empty() && id.strip_prefix("sha256:").unwrap_or(id) == wanted
}

/// The most recently used ready shell of a pool that runs what `recipe` asks for (its pages
/// are the warmest): any, when asked by the pool's image name; when asked by image id, one of
/// that id (after a re-tag a pool of a name may still hold shells of the name's old image).
/// But a shell back for less than [`AHEAD_SETTLE`] whose zygote is forking the next run's
/// process ahead is passed over for another that fits, if there is one: its spare cell and
/// that fork are still under way, and the run would wait for them.
fn take_ready(
    ready: &mut VecDeque<(PooledShell, Instant)>,
    recipe: &SandboxRecipe,
) -> Option<PooledShell> {
    let fits = |sh: &PooledShell| {
        !is_image_id_request(recipe) || same_image_id(&sh.image_id, &recipe.image)
    };
    let settled =
        |(sh, back): &(PooledShell, Instant)| !sh.zygote_ahead || back.elapsed() >= AHEAD_SETTLE;
    let i = pick(ready, |e| fits(&e.0), settled)?;
    ready.remove(i).map(|(sh, _)| sh)
}

/// [`take_ready`]'s rule: the first entry that fits and has settled, else the first that fits.
fn pick<T>(
    entries: &VecDeque<T>,
    fits: impl Fn(&T) -> bool,
    settled: impl Fn(&T) -> bool,
) -> Option<usize> {
    entries
        .iter()
        .position(|e| fits(e) && settled(e))
        .or_else(|| entries.iter().position(&fits))
}

/// How long a shell's spare cell and its zygote's fork ahead take after the shell is back
/// (a clone, the cell's root, a fork of the preloaded interpreter: a few ms on 2 cores).
const AHEAD_SETTLE: Duration = Duration::from_millis(10);

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

    /// Entries are (fits, settled): a settled shell that fits is taken before an unsettled
    /// one ahead of it; with none settled, the first that fits; none that fits, none.
    #[test]
    fn a_settled_shell_is_taken_before_one_still_forking_ahead() {
        let q = |v: &[(bool, bool)]| v.iter().copied().collect::<VecDeque<_>>();
        let take = |v: &[(bool, bool)]| pick(&q(v), |e| e.0, |e| e.1);
        assert_eq!(take(&[(true, false), (true, true)]), Some(1));
        assert_eq!(take(&[(true, true), (true, false)]), Some(0));
        assert_eq!(
            take(&[(false, true), (true, false), (true, false)]),
            Some(1)
        );
        assert_eq!(take(&[(false, true), (false, false)]), None);
        assert_eq!(take(&[]), None);
    }
}
