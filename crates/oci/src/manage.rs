//! Commands that change a running container: `pause`, `resume` (the freezer cgroup) and
//! `update` (its cgroup limits: `--resources FILE|-` in the spec's `linux.resources` JSON,
//! plus runc's individual flags).

use std::io::Read;

use libcgroups::common::{create_cgroup_manager, CgroupConfig, CgroupManager, ControllerOpt};
use libcontainer::container::ContainerStatus;
use liboci_cli::Update;
use oci_spec::runtime::LinuxResources;
use serde_json::{Map, Value};

use crate::container;
use crate::globals::Globals;
use crate::OciError;

/// `pause ID`.
pub fn pause(globals: &Globals, id: &str) -> Result<(), OciError> {
    let mut c = container::load(&globals.root, id)?;
    match c.status() {
        ContainerStatus::Running => Ok(c.pause()?),
        _ => Err(OciError::NotRunning),
    }
}

/// `resume ID`.
pub fn resume(globals: &Globals, id: &str) -> Result<(), OciError> {
    let mut c = container::load(&globals.root, id)?;
    match c.status() {
        ContainerStatus::Paused => Ok(c.resume()?),
        _ => Err(OciError::Invalid("container not paused".into())),
    }
}

/// `update ID`.
pub fn update(globals: &Globals, args: Update) -> Result<(), OciError> {
    let c = container::load(&globals.root, &args.container_id)?;
    if c.status() == ContainerStatus::Stopped {
        return Err(OciError::NotRunning);
    }
    let resources = resources(&args)?;
    let config = c.spec()?;
    let manager = create_cgroup_manager(CgroupConfig {
        cgroup_path: config.cgroup_path,
        systemd_cgroup: c.systemd(),
        container_name: c.id().to_owned(),
    })
    .map_err(|e| OciError::Cgroup(e.to_string()))?;
    manager
        .apply(&ControllerOpt {
            resources: &resources,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        })
        .map_err(|e| OciError::Cgroup(e.to_string()))
}

/// The resources to apply: the `--resources` JSON (a file, or `-` for stdin) with the flags
/// on top.
fn resources(args: &Update) -> Result<LinuxResources, OciError> {
    let mut value: Value = match &args.resources {
        None => Value::Object(Map::new()),
        Some(path) if path.as_os_str() == "-" => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| OciError::io("reading", "stdin", e))?;
            serde_json::from_str(&text)?
        }
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| OciError::io("reading", path, e))?;
            serde_json::from_str(&text)?
        }
    };
    let mut set = |section: &str, key: &str, v: Value| {
        if let Some(obj) = value.as_object_mut() {
            let entry = obj
                .entry(section.to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(s) = entry.as_object_mut() {
                s.insert(key.to_owned(), v);
            }
        }
    };
    // Each flag given: (section, key, value).
    for (section, key, v) in [
        ("blockIO", "weight", json(args.blkio_weight)),
        ("cpu", "period", json(args.cpu_period)),
        ("cpu", "quota", json(args.cpu_quota)),
        ("cpu", "realtimePeriod", json(args.cpu_rt_period)),
        ("cpu", "realtimeRuntime", json(args.cpu_rt_runtime)),
        ("cpu", "shares", json(args.cpu_share)),
        ("cpu", "cpus", json(args.cpuset_cpus.clone())),
        ("cpu", "mems", json(args.cpuset_mems.clone())),
        ("memory", "limit", json(args.memory)),
        ("memory", "reservation", json(args.memory_reservation)),
        ("memory", "swap", json(args.memory_swap)),
        ("pids", "limit", json(args.pids_limit)),
    ] {
        if let Some(v) = v {
            set(section, key, v);
        }
    }
    serde_json::from_value(value).map_err(|e| OciError::Invalid(format!("invalid resources: {e}")))
}

/// `v` as a JSON value.
fn json<T: Into<Value>>(v: Option<T>) -> Option<Value> {
    v.map(Into::into)
}
