//! A sandbox's cgroup, read and written: what it reports after a run and what a killed run
//! left behind.
//!
//! libcontainer's libcgroups creates the cgroup, applies `linux.resources` and removes it on
//! delete; this module reads results back (peak memory, OOM kills) and finds what a killed
//! run left behind. One manager per cgroup: what a long-lived sandbox changes after its start
//! is freezing and reading stats through libcgroups ([`CgroupMode::freeze`],
//! [`CgroupMode::usage`]) and new cpu/memory limits written to the same files libcgroups
//! writes ([`CgroupMode::set_limits`], fast enough for a sandbox's creation). A shell's cgroup
//! outlives its runs: each run's limits are written to it ([`CgroupMode::set_limits`],
//! [`CgroupMode::set_pids`]) and each run measured on its own ([`CgroupMode::meter`]: its
//! peak memory and OOM kills, not an earlier run's). Where the cgroup lives and the host's
//! layout are [`crate::host::cgroup`].

use std::fs;
use std::path::{Path, PathBuf};

use libcgroups::common::{
    create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager, FreezerState,
};

use crate::error::RuntimeError;
use crate::host::cgroup::{CgroupMode, CGROUP_ROOT, PARENT};

/// CPU quota period (µs) of limits set on a running sandbox.
const CPU_PERIOD: u64 = 100_000;

impl CgroupMode {
    /// Reads peak memory and the OOM-kill count of a sandbox cgroup.
    pub fn stats(self, id: &str) -> CgroupStats {
        let mem = self.dir("memory", id);
        let read_u64 = |f: &str| {
            fs::read_to_string(mem.join(f))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        let (peak, events) = if self.unified() {
            (read_u64("memory.peak"), "memory.events")
        } else {
            (read_u64("memory.max_usage_in_bytes"), "memory.oom_control")
        };
        let oom_kills = fs::read_to_string(mem.join(events))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0);
        CgroupStats {
            peak_memory_bytes: peak,
            oom_kills,
        }
    }

    /// CPU time every process of a sandbox cgroup has used so far (ns): one file read, cheap
    /// enough to take at a run's start (`cpuacct.usage`; v2: `usage_usec` of `cpu.stat`).
    pub fn cpu_ns(self, id: &str) -> Option<u64> {
        if self.unified() {
            let stat = fs::read_to_string(self.dir("cpu", id).join("cpu.stat")).ok()?;
            stat.lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|us| us * 1000)
        } else {
            fs::read_to_string(self.dir("cpuacct", id).join("cpuacct.usage"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
        }
    }

    /// The pids of every process in a sandbox cgroup.
    pub fn pids(self, id: &str) -> Vec<i32> {
        fs::read_to_string(self.dir("pids", id).join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// How long ago a sandbox's cgroup was created (its pids-controller dir's mtime).
    pub fn age(self, id: &str) -> Option<std::time::Duration> {
        let modified = fs::metadata(self.dir("pids", id)).ok()?.modified().ok()?;
        std::time::SystemTime::now().duration_since(modified).ok()
    }

    /// Sandbox ids that have a cgroup (in any controller), for garbage collection.
    pub fn sandbox_ids(self) -> Vec<String> {
        let parents: Vec<PathBuf> = if self.unified() {
            vec![Path::new(CGROUP_ROOT).join(PARENT)]
        } else {
            fs::read_dir(CGROUP_ROOT)
                .map(|rd| rd.flatten().map(|e| e.path().join(PARENT)).collect())
                .unwrap_or_default()
        };
        let mut ids: Vec<String> = parents
            .iter()
            .filter_map(|p| fs::read_dir(p).ok())
            .flat_map(|rd| rd.flatten())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    fn manager(self, id: &str) -> Result<AnyCgroupManager, RuntimeError> {
        create_cgroup_manager(CgroupConfig {
            cgroup_path: Self::spec_path(id),
            systemd_cgroup: false,
            container_name: id.to_owned(),
        })
        .map_err(|e| RuntimeError::Container(format!("cgroup of {id}: {e}")))
    }

    /// Sets new CPU (cores) and memory (bytes, no swap on top when `swap_limit`) limits on a
    /// running sandbox. These few files are written directly: building a libcgroups manager
    /// parses mountinfo once per controller (~5 ms), too slow for a sandbox's creation. The
    /// values are the ones libcgroups would write for the same `linux.resources`.
    pub fn set_limits(
        self,
        id: &str,
        cpus: Option<f64>,
        memory_bytes: Option<u64>,
        swap_limit: bool,
    ) -> Result<(), RuntimeError> {
        let write = |dir: PathBuf, file: &str, value: String| {
            let path = dir.join(file);
            fs::write(&path, value).map_err(|e| RuntimeError::io("write", &path, e))
        };
        if let Some(c) = cpus {
            let quota = (c * CPU_PERIOD as f64).round() as u64;
            if self.unified() {
                write(
                    self.dir("cpu", id),
                    "cpu.max",
                    format!("{quota} {CPU_PERIOD}"),
                )?;
            } else {
                write(
                    self.dir("cpu", id),
                    "cpu.cfs_period_us",
                    CPU_PERIOD.to_string(),
                )?;
                write(self.dir("cpu", id), "cpu.cfs_quota_us", quota.to_string())?;
            }
        }
        if let Some(m) = memory_bytes {
            if self.unified() {
                write(self.dir("memory", id), "memory.max", m.to_string())?;
                if swap_limit {
                    write(self.dir("memory", id), "memory.swap.max", "0".into())?;
                }
            } else {
                let dir = self.dir("memory", id);
                let limit = |f: &str| write(dir.clone(), f, m.to_string());
                if !swap_limit {
                    limit("memory.limit_in_bytes")?;
                } else {
                    // memory.limit_in_bytes <= memory.memsw.limit_in_bytes at every step: raise
                    // memsw first, lower memory first.
                    let current: u64 = fs::read_to_string(dir.join("memory.limit_in_bytes"))
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if m >= current {
                        limit("memory.memsw.limit_in_bytes")?;
                        limit("memory.limit_in_bytes")?;
                    } else {
                        limit("memory.limit_in_bytes")?;
                        limit("memory.memsw.limit_in_bytes")?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets the task limit of a sandbox.
    pub fn set_pids(self, id: &str, pids: u32) -> Result<(), RuntimeError> {
        let path = self.dir("pids", id).join("pids.max");
        fs::write(&path, pids.to_string()).map_err(|e| RuntimeError::io("write", &path, e))
    }

    /// Starts measuring one run in a shell's cgroup, which outlives the run: the memory
    /// high-water mark is reset to the usage now (v1: `memory.max_usage_in_bytes`; v2: a
    /// per-fd reset of `memory.peak`, Linux 6.12+) and the OOM-kill count so far is noted, so
    /// [`RunMeter::finish`] reports this run's peak and OOM kills, not an earlier run's.
    pub fn meter(self, id: &str) -> RunMeter {
        let mem = self.dir("memory", id);
        let peak_fd = if self.unified() {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(mem.join("memory.peak"))
                .ok()
                .filter(|mut f| std::io::Write::write_all(&mut f, b"reset\n").is_ok())
        } else {
            // Dropped: if the reset fails, the peak reported also covers the shell's earlier runs (a
            // report, not a limit).
            let _ = fs::write(mem.join("memory.max_usage_in_bytes"), "0");
            None
        };
        RunMeter {
            mode: self,
            id: id.to_owned(),
            oom_base: self.stats(id).oom_kills,
            peak_fd,
        }
    }

    /// Freezes (`true`) or thaws every process of a sandbox.
    pub fn freeze(self, id: &str, frozen: bool) -> Result<(), RuntimeError> {
        let state = if frozen {
            FreezerState::Frozen
        } else {
            FreezerState::Thawed
        };
        self.manager(id)?
            .freeze(state)
            .map_err(|e| RuntimeError::Container(format!("freezer of {id}: {e}")))
    }

    /// Thaws a sandbox's cgroup if it is frozen (or freezing), by its freezer file: frozen
    /// tasks do not die of SIGKILL until thawed (cgroup v1), so a teardown thaws first (a
    /// daemon killed while a sandbox was paused or being snapshotted). A read when it is not.
    pub fn thaw_if_frozen(self, id: &str) {
        let (file, frozen, thawed) = if self.unified() {
            (self.dir("", id).join("cgroup.freeze"), "1", "0")
        } else {
            (
                self.dir("freezer", id).join("freezer.state"),
                "FROZEN",
                "THAWED",
            )
        };
        let Ok(state) = fs::read_to_string(&file) else {
            return;
        };
        let state = state.trim();
        if state == frozen || state == "FREEZING" {
            // Dropped: thawing on the way out; the next freeze or removal reports a stuck cgroup.
            let _ = fs::write(&file, thawed);
        }
    }

    /// CPU time used so far and memory in use / limit.
    pub fn usage(self, id: &str) -> Result<CgroupUsage, RuntimeError> {
        let stats = self
            .manager(id)?
            .stats()
            .map_err(|e| RuntimeError::Container(format!("stats of {id}: {e}")))?;
        Ok(CgroupUsage {
            cpu_ns: stats.cpu.usage.usage_total,
            memory_bytes: stats.memory.memory.usage,
            memory_limit_bytes: stats.memory.memory.limit,
        })
    }

    /// Removes a sandbox's (empty) cgroup directories in every controller.
    pub fn remove(self, id: &str) {
        if self.unified() {
            // Dropped: EBUSY while processes remain, ENOENT if gone; gc removes what stays.
            let _ = fs::remove_dir(self.dir("", id));
            return;
        }
        if let Ok(rd) = fs::read_dir(CGROUP_ROOT) {
            for e in rd.flatten() {
                let d = e.path().join(PARENT).join(id);
                if d.is_dir() {
                    // Dropped: as above; gc removes what stays.
                    let _ = fs::remove_dir(&d);
                }
            }
        }
    }
}

/// Measures one run in a shell's cgroup ([`CgroupMode::meter`]).
#[derive(Debug)]
pub struct RunMeter {
    mode: CgroupMode,
    id: String,
    oom_base: u64,
    /// v2: the `memory.peak` fd the reset was written to (its reads give the peak since).
    peak_fd: Option<fs::File>,
}

impl RunMeter {
    /// This run's peak memory and OOM kills.
    pub fn finish(mut self) -> CgroupStats {
        let mut stats = self.mode.stats(&self.id);
        stats.oom_kills = stats.oom_kills.saturating_sub(self.oom_base);
        if let Some(f) = self.peak_fd.as_mut() {
            use std::io::{Read, Seek};
            let mut s = String::new();
            if f.rewind().is_ok() && f.read_to_string(&mut s).is_ok() {
                stats.peak_memory_bytes = s.trim().parse().ok().or(stats.peak_memory_bytes);
            }
        }
        stats
    }
}

/// A running sandbox's consumption ([`CgroupMode::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// CPU time of every process so far (ns).
    pub cpu_ns: u64,
    pub memory_bytes: u64,
    pub memory_limit_bytes: u64,
}

/// What a sandbox's cgroup recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// High-water mark of memory use, when the kernel reports it.
    pub peak_memory_bytes: Option<u64>,
    /// Processes killed by the OOM killer inside the cgroup.
    pub oom_kills: u64,
}
