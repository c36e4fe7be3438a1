//! Read-only commands: `state`, `list`, `ps` and `events`, printed as runc prints them.

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use libcgroups::common::{create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager};
use libcgroups::stats::Stats;
use libcontainer::container::{Container, ContainerStatus};
use liboci_cli::{Events, List, Ps};
use serde_json::{json, Value};

use crate::container::{self, RuncState};
use crate::globals::Globals;
use crate::OciError;

/// `state ID`: the container's state as indented JSON.
pub fn state(globals: &Globals, id: &str) -> Result<(), OciError> {
    let c = container::load(&globals.root, id)?;
    // runc's `state` leaves the owner empty (its `list` fills it in).
    let state = RuncState {
        owner: String::new(),
        ..RuncState::of(&c)
    };
    crate::output(&serde_json::to_string_pretty(&state)?);
    Ok(())
}

/// `list`: a table (`--format table`, `-q` for ids only) or a JSON array (`null` when empty).
pub fn list(globals: &Globals, args: List) -> Result<(), OciError> {
    let states: Vec<RuncState> = container::ids(&globals.root)?
        .iter()
        .filter_map(|id| container::load(&globals.root, id).ok())
        .map(|c| RuncState::of(&c))
        .collect();
    if args.quiet {
        for s in &states {
            crate::output(&s.id);
        }
        return Ok(());
    }
    match args.format.as_str() {
        "json" => {
            let value = if states.is_empty() {
                Value::Null
            } else {
                serde_json::to_value(&states)?
            };
            crate::output(&value.to_string());
        }
        "table" => {
            let mut rows =
                vec![["ID", "PID", "STATUS", "BUNDLE", "CREATED", "OWNER"].map(String::from)];
            for s in &states {
                rows.push([
                    s.id.clone(),
                    s.pid.to_string(),
                    s.status.to_owned(),
                    s.bundle.display().to_string(),
                    s.created.clone(),
                    s.owner.clone(),
                ]);
            }
            crate::output(tabulate(&rows).trim_end_matches('\n'));
        }
        other => {
            return Err(OciError::Invalid(format!(
                "invalid format option {other:?}"
            )))
        }
    }
    Ok(())
}

/// Go's `tabwriter.NewWriter(w, 12, 1, 3, ' ', 0)` as runc uses it: every cell but the last
/// of a row padded to max(12, widest + 3).
fn tabulate<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|col| {
            let widest = rows
                .iter()
                .map(|r| r[col].chars().count())
                .max()
                .unwrap_or(0);
            (widest + 3).max(12)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        for (col, cell) in row.iter().enumerate() {
            if col + 1 == N {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}", width = widths[col]));
            }
        }
        out.push('\n');
    }
    out
}

/// `ps ID`: the container's processes, as pids (`--format json`) or as `ps`'s own table
/// (`ps -ef` or the given ps options), filtered to them.
pub fn ps(globals: &Globals, args: Ps) -> Result<(), OciError> {
    let c = container::load(&globals.root, &args.container_id)?;
    let pids: Vec<i32> = cgroup_manager(&c)?
        .get_all_pids()
        .map_err(|e| OciError::Cgroup(e.to_string()))?
        .into_iter()
        .map(|p| p.as_raw())
        .collect();
    match args.format.as_str() {
        "json" => {
            crate::output(&serde_json::to_string(&pids)?);
            Ok(())
        }
        "table" => {
            let options = if args.ps_options.is_empty() {
                vec!["-ef".to_owned()]
            } else {
                args.ps_options
            };
            let out = Command::new("ps")
                .args(&options)
                .output()
                .map_err(|e| OciError::io("running", "ps", e))?;
            if !out.status.success() {
                return Err(OciError::Invalid(format!(
                    "ps {}: {}",
                    options.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let mut lines = text.lines();
            let header = lines.next().unwrap_or_default();
            let pid_col = header
                .split_whitespace()
                .position(|h| h == "PID")
                .ok_or_else(|| OciError::Invalid("couldn't find PID field in ps output".into()))?;
            let mut stdout = std::io::stdout().lock();
            // A reader that went away (a closed pipe) is not an error of the command.
            let _ = writeln!(stdout, "{header}");
            for line in lines {
                let pid = line
                    .split_whitespace()
                    .nth(pid_col)
                    .and_then(|p| p.parse().ok());
                if pid.is_some_and(|p: i32| pids.contains(&p)) {
                    let _ = writeln!(stdout, "{line}");
                }
            }
            Ok(())
        }
        other => Err(OciError::Invalid(format!(
            "invalid format option {other:?}"
        ))),
    }
}

/// `events ID`: the container's cgroup statistics as runc's `stats` events, once (`--stats`)
/// or every `--interval` seconds until the container stops.
pub fn events(globals: &Globals, args: Events) -> Result<(), OciError> {
    let mut c = container::load(&globals.root, &args.container_id)?;
    if c.status() == ContainerStatus::Stopped {
        return Err(OciError::NotRunning);
    }
    let manager = cgroup_manager(&c)?;
    loop {
        let stats = manager
            .stats()
            .map_err(|e| OciError::Cgroup(e.to_string()))?;
        let event = json!({"type": "stats", "id": c.id(), "data": runc_stats(&stats)});
        let mut stdout = std::io::stdout().lock();
        // A reader that went away (a closed pipe) is not an error of the command.
        let _ = writeln!(stdout, "{event}");
        let _ = stdout.flush();
        if args.stats {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(u64::from(args.interval.max(1))));
        c.refresh_status()?;
        if c.status() == ContainerStatus::Stopped {
            return Ok(());
        }
    }
}

fn cgroup_manager(c: &Container) -> Result<AnyCgroupManager, OciError> {
    let config = c.spec()?;
    create_cgroup_manager(CgroupConfig {
        cgroup_path: config.cgroup_path,
        systemd_cgroup: c.systemd(),
        container_name: c.id().to_owned(),
    })
    .map_err(|e| OciError::Cgroup(e.to_string()))
}

/// libcgroups' statistics in runc's `types.Stats` JSON shape.
fn runc_stats(s: &Stats) -> Value {
    let mem = |m: &libcgroups::stats::MemoryData| json!({"limit": m.limit, "usage": m.usage, "max": m.max_usage, "failcnt": m.fail_count});
    let blkio = |entries: &[libcgroups::stats::BlkioDeviceStat]| {
        entries
            .iter()
            .map(|e| {
                json!({"major": e.major, "minor": e.minor, "op": e.op_type.clone().unwrap_or_default(), "value": e.value})
            })
            .collect::<Vec<_>>()
    };
    let hugetlb: serde_json::Map<String, Value> = s
        .hugetlb
        .iter()
        .map(|(size, h)| {
            (
                size.clone(),
                json!({"usage": h.usage, "max": h.max_usage, "failcnt": h.fail_count}),
            )
        })
        .collect();
    json!({
        "cpu": {
            "usage": {
                "total": s.cpu.usage.usage_total,
                "percpu": s.cpu.usage.per_core_usage_total,
                "percpu_kernel": s.cpu.usage.per_core_usage_kernel,
                "percpu_user": s.cpu.usage.per_core_usage_user,
                "kernel": s.cpu.usage.usage_kernel,
                "user": s.cpu.usage.usage_user,
            },
            "throttling": {
                "periods": s.cpu.throttling.periods,
                "throttled_periods": s.cpu.throttling.throttled_periods,
                "throttled_time": s.cpu.throttling.throttled_time,
            },
        },
        "memory": {
            "cache": s.memory.cache,
            "usage": mem(&s.memory.memory),
            "swap": mem(&s.memory.memswap),
            "kernel": mem(&s.memory.kernel),
            "kernelTCP": mem(&s.memory.kernel_tcp),
            "raw": s.memory.stats,
        },
        "pids": {"current": s.pids.current, "limit": s.pids.limit},
        "blkio": {
            "ioServiceBytesRecursive": blkio(&s.blkio.service_bytes),
            "ioServicedRecursive": blkio(&s.blkio.serviced),
            "ioQueueRecursive": blkio(&s.blkio.queued),
            "ioServiceTimeRecursive": blkio(&s.blkio.service_time),
            "ioWaitTimeRecursive": blkio(&s.blkio.wait_time),
            "ioMergedRecursive": blkio(&s.blkio.merged),
            "ioTimeRecursive": blkio(&s.blkio.time),
            "sectorsRecursive": blkio(&s.blkio.sectors),
        },
        "hugetlb": hugetlb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_go_tabwriter() {
        let rows = vec![["ID", "PID", "STATUS", "BUNDLE", "CREATED", "OWNER"].map(String::from)];
        // runc list with no containers, byte for byte.
        assert_eq!(
            tabulate(&rows),
            "ID          PID         STATUS      BUNDLE      CREATED     OWNER\n"
        );
        let rows = vec![
            ["ID", "X"].map(String::from),
            ["a-long-container-id", "y"].map(String::from),
        ];
        assert_eq!(
            tabulate(&rows),
            format!("{:<22}X\n{:<22}y\n", "ID", "a-long-container-id")
        );
    }
}
