//! A create request's `volumes`: parsed and checked without touching the host
//! ([`parse`], part of the request's validation), then opened for the sandbox ([`open`]):
//! `host` paths under the operator's `--volume-root`s, `pvc` claims as agentrun's named
//! volumes (`$AGENTRUN_ROOT/volumes`, made on first use when `createIfNotExists`), a
//! `subPath` inside either, never leaving it (see [`agentrun_runtime::volume`]). `ossfs` is
//! refused (no OSS here).

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use agentrun_runtime::rootfs::UserMount;
use agentrun_runtime::volume::{self, VolumeError, VolumeLease, VolumeRoots, VolumeStore};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};

/// A `volumes[]` entry as sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeRequest {
    name: String,
    host: Option<HostBackend>,
    pvc: Option<PvcBackend>,
    ossfs: Option<Value>,
    mount_path: String,
    #[serde(default)]
    read_only: bool,
    sub_path: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostBackend {
    path: String,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PvcBackend {
    claim_name: String,
    #[serde(default = "yes")]
    create_if_not_exists: bool,
    #[serde(default)]
    delete_on_sandbox_termination: bool,
    // Kubernetes provisioning hints: nothing to provision here.
    #[allow(dead_code)]
    storage_class: Option<Value>,
    #[allow(dead_code)]
    storage: Option<Value>,
    #[allow(dead_code)]
    access_modes: Option<Value>,
}

/// Where a checked volume comes from.
#[derive(Debug, Clone)]
enum Source {
    Host(String),
    Named {
        claim: String,
        create: bool,
        delete_on_termination: bool,
    },
}

/// A `volumes[]` entry, checked.
#[derive(Debug, Clone)]
pub struct VolumeSpec {
    name: String,
    source: Source,
    target: PathBuf,
    sub_path: PathBuf,
    read_only: bool,
}

fn bad(code: &'static str, message: String) -> ApiError {
    ApiError::new(axum::http::StatusCode::BAD_REQUEST, code, message)
}

/// Inside the sandbox these stay the kernel's: a volume is never mounted over them.
const RESERVED_TARGETS: [&str; 3] = ["/proc", "/sys", "/dev"];

fn check_target(name: &str, mount_path: &str) -> ApiResult<PathBuf> {
    let invalid = |why: &str| {
        bad(
            "VOLUME::INVALID_MOUNT_PATH",
            format!("volume {name:?}: mountPath {mount_path:?} {why}"),
        )
    };
    if mount_path.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    if !mount_path.starts_with('/') {
        return Err(invalid("must be an absolute path"));
    }
    let p = Path::new(mount_path);
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(invalid("must not contain '..'"));
    }
    let normal: PathBuf = p.components().collect();
    if normal == Path::new("/") {
        return Err(invalid("must not be the root"));
    }
    if RESERVED_TARGETS.iter().any(|r| normal.starts_with(r)) {
        return Err(invalid(
            "is under /proc, /sys or /dev, which stay the kernel's",
        ));
    }
    Ok(normal)
}

/// Parses and checks `volumes` (names unique DNS labels, exactly one backend, absolute
/// distinct mount paths, relative `subPath`s without `..`): what needs no host access.
pub fn parse(raw: &[Value]) -> ApiResult<Vec<VolumeSpec>> {
    let mut out: Vec<VolumeSpec> = Vec::with_capacity(raw.len());
    for (i, v) in raw.iter().enumerate() {
        let req: VolumeRequest = serde_json::from_value(v.clone())
            .map_err(|e| ApiError::bad_request(format!("volumes[{i}]: {e}")))?;
        let name = req.name.clone();
        if name.len() > 63 || volume::check_name(&name).is_err() {
            return Err(bad(
                "VOLUME::INVALID_NAME",
                format!("volume name {name:?} is not a DNS label (lowercase letters, digits and '-', at most 63)"),
            ));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(bad(
                "VOLUME::DUPLICATE_NAME",
                format!("duplicate volume name {name:?}: each volume needs its own"),
            ));
        }
        let backends =
            req.host.is_some() as u8 + req.pvc.is_some() as u8 + req.ossfs.is_some() as u8;
        if backends != 1 {
            return Err(bad(
                "VOLUME::INVALID_BACKEND",
                format!("volume {name:?} must name exactly one backend (host, pvc, ossfs), not {backends}"),
            ));
        }
        let target = check_target(&name, &req.mount_path)?;
        if let Some(other) = out.iter().find(|o| o.target == target) {
            return Err(bad(
                "VOLUME::INVALID_MOUNT_PATH",
                format!(
                    "volumes {:?} and {name:?} are both mounted at {}",
                    other.name,
                    target.display()
                ),
            ));
        }
        let sub_path = volume::check_sub_path(req.sub_path.as_deref().unwrap_or(""))
            .map_err(|e| bad("VOLUME::INVALID_SUB_PATH", format!("volume {name:?}: {e}")))?;
        let source = match (req.host, req.pvc) {
            (Some(h), _) => {
                let p = Path::new(&h.path);
                if !h.path.starts_with('/')
                    || h.path.contains('\0')
                    || p.components().any(|c| c == Component::ParentDir)
                {
                    return Err(bad(
                        "VOLUME::INVALID_HOST_PATH",
                        format!(
                            "volume {name:?}: host.path {:?} must be an absolute path without '..'",
                            h.path
                        ),
                    ));
                }
                Source::Host(h.path)
            }
            (None, Some(p)) => {
                volume::check_name(&p.claim_name).map_err(|e| {
                    bad("VOLUME::INVALID_PVC_NAME", format!("volume {name:?}: {e}"))
                })?;
                Source::Named {
                    claim: p.claim_name,
                    create: p.create_if_not_exists,
                    delete_on_termination: p.delete_on_sandbox_termination,
                }
            }
            (None, None) => {
                return Err(bad(
                    "VOLUME::UNSUPPORTED_BACKEND",
                    format!("volume {name:?}: ossfs volumes are not supported by agentrun (no OSS here); use a host or pvc volume"),
                ))
            }
        };
        out.push(VolumeSpec {
            name,
            source,
            target,
            sub_path,
            read_only: req.read_only,
        });
    }
    Ok(out)
}

/// A named volume a sandbox holds (in use while it lives).
#[derive(Debug)]
pub struct HeldVolume {
    pub lease: VolumeLease,
    store: VolumeStore,
    /// Removed when the sandbox goes: made by this sandbox with `deleteOnSandboxTermination`.
    pub remove_after: bool,
}

/// A sandbox's volumes, opened: the mounts for its spec (sources are `/proc/self/fd/N` of
/// `fds`, so they must be mounted while this lives) and the named volumes it holds.
#[derive(Debug, Default)]
pub struct OpenedVolumes {
    pub mounts: Vec<UserMount>,
    pub fds: Vec<OwnedFd>,
    pub held: Vec<HeldVolume>,
}

fn volume_error(name: &str, e: VolumeError) -> ApiError {
    let code = match &e {
        VolumeError::NotAllowed { .. } => "VOLUME::HOST_PATH_NOT_ALLOWED",
        VolumeError::NotFound(_) => "VOLUME::PVC_NOT_FOUND",
        VolumeError::InUse(_) | VolumeError::Exists(_) => "VOLUME::CONFLICT",
        VolumeError::Invalid(_) => "VOLUME::INVALID_PATH",
        VolumeError::Io { .. } => "VOLUME::HOST_ERROR",
    };
    let message = match &e {
        VolumeError::NotFound(claim) => format!(
            "volume {name:?}: named volume {claim:?} does not exist (createIfNotExists is false; make it with `agentrun volume create {claim}`)"
        ),
        _ => format!("volume {name:?}: {e}"),
    };
    if e.is_client_error() {
        bad(code, message)
    } else {
        ApiError::internal(message)
    }
}

/// Opens `specs` for a new sandbox (blocking: makes directories, takes locks). On an error,
/// what this call made (named volumes it created) is removed again.
pub fn open(
    specs: &[VolumeSpec],
    roots: &VolumeRoots,
    store: &VolumeStore,
) -> ApiResult<OpenedVolumes> {
    let mut out = OpenedVolumes::default();
    let result = (|| {
        for s in specs {
            let fd = match &s.source {
                Source::Host(path) => roots
                    .open(path, &s.sub_path)
                    .map_err(|e| volume_error(&s.name, e))?,
                Source::Named {
                    claim,
                    create,
                    delete_on_termination,
                } => {
                    let lease = store
                        .lease(claim, *create)
                        .map_err(|e| volume_error(&s.name, e))?;
                    let fd = lease.open(&s.sub_path);
                    out.held.push(HeldVolume {
                        store: store.clone(),
                        remove_after: lease.created && *delete_on_termination,
                        lease,
                    });
                    fd.map_err(|e| volume_error(&s.name, e))?
                }
            };
            out.mounts.push(UserMount {
                source: volume::fd_path(&fd),
                target: s.target.clone(),
                writable: !s.read_only,
            });
            out.fds.push(fd);
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(out),
        Err(e) => {
            release(std::mem::take(&mut out.held), true);
            Err(e)
        }
    }
}

/// Lets go of a sandbox's named volumes; removes those it made to be removed (or, when
/// `failed`, every one it made: the sandbox never existed).
pub fn release(held: Vec<HeldVolume>, failed: bool) {
    for h in held {
        let doomed = h.remove_after || (failed && h.lease.created);
        let name = h.lease.name.clone();
        drop(h.lease);
        if !doomed {
            continue;
        }
        match h.store.remove(&name) {
            Ok(()) | Err(VolumeError::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(target: "agentrun::opensandbox", "removing volume {name}: {e}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> ApiError {
        parse(&[v]).expect_err("a 400")
    }

    #[test]
    fn what_a_request_may_ask() {
        let ok = parse(&[
            json!({"name": "work", "host": {"path": "/srv/v"}, "mountPath": "/mnt/work"}),
            json!({"name": "data", "pvc": {"claimName": "shared", "createIfNotExists": false,
                   "deleteOnSandboxTermination": true, "storageClass": null, "storage": null,
                   "accessModes": null}, "mountPath": "/data/", "readOnly": true, "subPath": "a/./b"}),
        ])
        .unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[1].target, Path::new("/data"));
        assert_eq!(ok[1].sub_path, Path::new("a/b"));
        assert!(ok[1].read_only);
        // Each case changes a good volume's top-level fields (null: removes it).
        let good = json!({"name": "a", "host": {"path": "/x"}, "mountPath": "/m"});
        let cases = [
            (json!({"name": "A"}), "VOLUME::INVALID_NAME"),
            (json!({"host": null}), "VOLUME::INVALID_BACKEND"),
            (
                json!({"pvc": {"claimName": "c"}}),
                "VOLUME::INVALID_BACKEND",
            ),
            (json!({"mountPath": "m"}), "VOLUME::INVALID_MOUNT_PATH"),
            (json!({"mountPath": "/"}), "VOLUME::INVALID_MOUNT_PATH"),
            (
                json!({"mountPath": "/m/../etc"}),
                "VOLUME::INVALID_MOUNT_PATH",
            ),
            (
                json!({"mountPath": "/proc/x"}),
                "VOLUME::INVALID_MOUNT_PATH",
            ),
            (json!({"subPath": "../x"}), "VOLUME::INVALID_SUB_PATH"),
            (json!({"subPath": "/x"}), "VOLUME::INVALID_SUB_PATH"),
            (json!({"host": {"path": "x"}}), "VOLUME::INVALID_HOST_PATH"),
            (
                json!({"host": {"path": "/srv/../etc"}}),
                "VOLUME::INVALID_HOST_PATH",
            ),
            (
                json!({"host": null, "pvc": {"claimName": "Bad_Name"}}),
                "VOLUME::INVALID_PVC_NAME",
            ),
            (
                json!({"host": null, "ossfs": {"bucket": "b"}}),
                "VOLUME::UNSUPPORTED_BACKEND",
            ),
        ];
        for (change, code) in cases {
            let mut v = good.clone();
            for (k, x) in change.as_object().unwrap() {
                match x {
                    Value::Null => v.as_object_mut().unwrap().remove(k),
                    x => v.as_object_mut().unwrap().insert(k.clone(), x.clone()),
                };
            }
            let e = err(v.clone());
            assert_eq!(e.code, code, "{v}: {e}");
        }
        // Unknown fields are typos, not silently dropped.
        assert_eq!(
            err(json!({"name": "a", "host": {"path": "/x"}, "mountPath": "/m", "readonly": true}))
                .status,
            axum::http::StatusCode::BAD_REQUEST
        );
        let dup = parse(&[
            json!({"name": "a", "host": {"path": "/x"}, "mountPath": "/m"}),
            json!({"name": "a", "host": {"path": "/y"}, "mountPath": "/n"}),
        ])
        .unwrap_err();
        assert_eq!(dup.code, "VOLUME::DUPLICATE_NAME");
        let same_target = parse(&[
            json!({"name": "a", "host": {"path": "/x"}, "mountPath": "/m"}),
            json!({"name": "b", "host": {"path": "/y"}, "mountPath": "/m/"}),
        ])
        .unwrap_err();
        assert_eq!(same_target.code, "VOLUME::INVALID_MOUNT_PATH");
    }
}
