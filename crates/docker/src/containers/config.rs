//! Request parsing: what a `POST /containers/create` body asks for ([`ContainerConfig`]), and
//! its `HostConfig.Binds` as mounts. Unknown fields are ignored (clients send many); what is
//! malformed is a 400 with dockerd's text where clients match on it.

use std::path::PathBuf;

use agentrun_runtime::rootfs::UserMount;
use serde_json::Value;

use crate::error::DockerError;

/// What `POST /containers/create` asked for.
#[derive(Debug, Clone, Default)]
pub struct ContainerConfig {
    pub image: String,
    pub cmd: Option<Vec<String>>,
    pub entrypoint: Option<Vec<String>>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
    pub tty: bool,
    pub open_stdin: bool,
    pub stdin_once: bool,
    pub labels: serde_json::Map<String, Value>,
    pub binds: Vec<String>,
    pub auto_remove: bool,
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u32>,
    pub network_mode: String,
    /// `ExposedPorts` of the request.
    pub exposed: Vec<String>,
    /// The request's own `Config` fields, echoed by inspect.
    pub raw: Value,
    pub host_config_raw: Value,
}

/// A JSON array of strings (other items skipped) or one string, as dockerd's `StrSlice`.
fn strings(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Array(a) => Some(
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect(),
        ),
        Value::String(s) => Some(vec![s.clone()]),
        _ => None,
    }
}

/// CPUs from `HostConfig.NanoCpus`, else `CpuQuota` / `CpuPeriod` (default period 100 ms).
fn cpus(hc: &Value) -> Option<f64> {
    if let Some(n) = hc["NanoCpus"].as_u64().filter(|n| *n > 0) {
        Some(n as f64 / 1e9)
    } else if let Some(q) = hc["CpuQuota"].as_i64().filter(|q| *q > 0) {
        let period = hc["CpuPeriod"]
            .as_i64()
            .filter(|p| *p > 0)
            .unwrap_or(100_000);
        Some(q as f64 / period as f64)
    } else {
        None
    }
}

/// Why a create body is refused (a 400, in dockerd's words where it has them).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config: Image is required")]
    NoImage,
    #[error(transparent)]
    Ports(#[from] crate::ports::PortError),
    #[error("conflicting options: port publishing and the container type network mode")]
    PortsWithoutNetwork,
    #[error("invalid bind {0:?}: expected SRC:DST[:ro|rw]")]
    BindShape(String),
    #[error("invalid bind {0:?}: named volumes are not supported, use an absolute host path")]
    BindVolume(String),
    #[error("invalid bind {0:?}: the destination must be absolute")]
    BindDestination(String),
}

impl ContainerConfig {
    /// Parses a create request's body bytes, checking everything that can be checked without
    /// the image: JSON, `Image`, port bindings, binds. `Err` is the 400 to answer.
    pub fn parse(body: &[u8]) -> Result<Self, DockerError> {
        let body: Value = serde_json::from_slice(body)
            .map_err(|e| DockerError::bad_request(format!("invalid JSON: {e}")))?;
        let config = Self::from_body(&body).map_err(DockerError::bad_request)?;
        config.mounts().map_err(DockerError::bad_request)?;
        Ok(config)
    }

    /// Parses a create body; unknown fields are ignored (clients send many). `Err` is the
    /// 400.
    pub fn from_body(body: &Value) -> Result<Self, ConfigError> {
        let image = body["Image"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or(ConfigError::NoImage)?
            .to_owned();
        let hc = &body["HostConfig"];
        let exposed: Vec<String> = body["ExposedPorts"]
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let network_mode = hc["NetworkMode"].as_str().unwrap_or("default").to_owned();
        // Checked now; the image's exposed ports join them at start (`PublishAllPorts`).
        let ports = crate::ports::bindings(hc, &exposed)?;
        if !ports.is_empty() && network_mode == "none" {
            return Err(ConfigError::PortsWithoutNetwork);
        }
        Ok(ContainerConfig {
            image,
            cmd: strings(&body["Cmd"]),
            entrypoint: strings(&body["Entrypoint"]),
            env: strings(&body["Env"]).unwrap_or_default(),
            working_dir: body["WorkingDir"].as_str().unwrap_or("").to_owned(),
            user: body["User"].as_str().unwrap_or("").to_owned(),
            tty: body["Tty"].as_bool().unwrap_or(false),
            open_stdin: body["OpenStdin"].as_bool().unwrap_or(false),
            stdin_once: body["StdinOnce"].as_bool().unwrap_or(false),
            labels: body["Labels"].as_object().cloned().unwrap_or_default(),
            binds: strings(&hc["Binds"]).unwrap_or_default(),
            auto_remove: hc["AutoRemove"].as_bool().unwrap_or(false),
            memory: hc["Memory"].as_u64().filter(|m| *m > 0),
            cpus: cpus(hc),
            pids: hc["PidsLimit"]
                .as_i64()
                .filter(|p| *p > 0)
                .map(|p| p as u32),
            network_mode,
            exposed,
            raw: body.clone(),
            host_config_raw: hc.clone(),
        })
    }

    /// `HostConfig.Binds` entries (`SRC:DST[:ro|rw]`) as mounts; a source must be an absolute
    /// host path (named volumes are not supported).
    pub fn mounts(&self) -> Result<Vec<UserMount>, ConfigError> {
        self.binds
            .iter()
            .map(|b| {
                let parts: Vec<&str> = b.split(':').collect();
                let (src, dst, opts) = match parts.as_slice() {
                    [s, d] => (*s, *d, ""),
                    [s, d, o] => (*s, *d, *o),
                    _ => return Err(ConfigError::BindShape(b.clone())),
                };
                if !src.starts_with('/') {
                    return Err(ConfigError::BindVolume(b.clone()));
                }
                if !dst.starts_with('/') {
                    return Err(ConfigError::BindDestination(b.clone()));
                }
                let writable = !opts.split(',').any(|o| o == "ro");
                Ok(UserMount {
                    source: PathBuf::from(src),
                    target: PathBuf::from(dst),
                    writable,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;
    use serde_json::json;

    fn parse(v: Value) -> Result<ContainerConfig, DockerError> {
        ContainerConfig::parse(&serde_json::to_vec(&v).unwrap())
    }

    fn bad_request(v: Value) -> String {
        let e = parse(v).expect_err("a 400");
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e}");
        e.message
    }

    #[test]
    fn a_docker_py_create_body() {
        // As docker-py 7.1.0 sends it for CrewAI's CodeInterpreterTool (WIRE.md, section 2).
        let c = parse(json!({
            "Tty": true, "OpenStdin": false, "StdinOnce": false, "AttachStdin": false,
            "Image": "code-interpreter:latest", "Volumes": {"/workspace": {}},
            "NetworkDisabled": false, "WorkingDir": "/workspace",
            "HostConfig": {"NetworkMode": "default", "Binds": ["/tmp/cwd:/workspace:rw"]},
        }))
        .unwrap();
        assert_eq!(c.image, "code-interpreter:latest");
        assert!(c.tty && !c.open_stdin && !c.stdin_once && !c.auto_remove);
        assert_eq!(c.cmd, None);
        assert_eq!(c.entrypoint, None);
        assert_eq!(c.working_dir, "/workspace");
        assert_eq!(c.network_mode, "default");
        assert_eq!(c.binds, vec!["/tmp/cwd:/workspace:rw"]);
        let m = c.mounts().unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].source, PathBuf::from("/tmp/cwd"));
        assert_eq!(m[0].target, PathBuf::from("/workspace"));
        assert!(m[0].writable);
        assert_eq!((c.memory, c.cpus, c.pids), (None, None, None));
    }

    #[test]
    fn cmd_entrypoint_env_and_the_rest() {
        let c = parse(json!({
            "Image": "busybox", "Cmd": ["sh", "-c", "echo hi", 7], "Entrypoint": "/bin/env",
            "Env": ["A=1", "B"], "User": "1000:1000", "OpenStdin": true, "StdinOnce": true,
            "Labels": {"k": "v"}, "ExposedPorts": {"8000/tcp": {}},
            "HostConfig": {"AutoRemove": true, "Memory": 67108864, "NanoCpus": 1500000000u64,
                           "PidsLimit": 64},
        }))
        .unwrap();
        // A non-string item of Cmd is skipped; a string Entrypoint is one argument.
        assert_eq!(
            c.cmd.as_deref(),
            Some(&["sh".into(), "-c".into(), "echo hi".into()][..])
        );
        assert_eq!(c.entrypoint.as_deref(), Some(&["/bin/env".to_owned()][..]));
        assert_eq!(c.env, vec!["A=1", "B"]);
        assert_eq!(c.user, "1000:1000");
        assert!(c.open_stdin && c.stdin_once && !c.tty && c.auto_remove);
        assert_eq!(c.labels["k"], "v");
        assert_eq!(c.exposed, vec!["8000/tcp"]);
        assert_eq!(c.memory, Some(64 << 20));
        assert_eq!(c.cpus, Some(1.5));
        assert_eq!(c.pids, Some(64));
        assert_eq!(c.raw["Labels"]["k"], "v");
        assert_eq!(c.host_config_raw["PidsLimit"], 64);
    }

    #[test]
    fn cpus_from_quota_and_limits_that_mean_none() {
        let c = parse(json!({"Image": "i", "HostConfig": {"CpuQuota": 50000}})).unwrap();
        assert_eq!(c.cpus, Some(0.5));
        let c =
            parse(json!({"Image": "i", "HostConfig": {"CpuQuota": 50000, "CpuPeriod": 200000}}))
                .unwrap();
        assert_eq!(c.cpus, Some(0.25));
        // 0 and -1 are dockerd's "unlimited"; NanoCpus wins over a quota.
        let c = parse(json!({"Image": "i", "HostConfig": {
            "Memory": 0, "PidsLimit": -1, "NanoCpus": 0, "CpuQuota": -1}}))
        .unwrap();
        assert_eq!((c.memory, c.cpus, c.pids), (None, None, None));
        let c =
            parse(json!({"Image": "i", "HostConfig": {"NanoCpus": 2000000000u64, "CpuQuota": 1}}))
                .unwrap();
        assert_eq!(c.cpus, Some(2.0));
    }

    #[test]
    fn binds_read_only_and_rejected() {
        let c = parse(
            json!({"Image": "i", "HostConfig": {"Binds": ["/a:/b:ro", "/c:/d:z,ro", "/e:/f"]}}),
        )
        .unwrap();
        let w: Vec<bool> = c.mounts().unwrap().iter().map(|m| m.writable).collect();
        assert_eq!(w, vec![false, false, true]);
        for (bind, why) in [
            ("vol:/data", "named volumes are not supported"),
            ("/a:rel", "the destination must be absolute"),
            ("/a", "expected SRC:DST[:ro|rw]"),
            ("/a:/b:ro:x", "expected SRC:DST[:ro|rw]"),
        ] {
            let msg = bad_request(json!({"Image": "i", "HostConfig": {"Binds": [bind]}}));
            assert!(msg.contains(why), "{bind}: {msg}");
        }
    }

    #[test]
    fn malformed_bodies_are_400s() {
        assert!(bad_request(json!({})).contains("Image is required"));
        assert!(bad_request(json!({"Image": ""})).contains("Image is required"));
        assert!(bad_request(json!({"Image": 5})).contains("Image is required"));
        assert!(bad_request(json!(null)).contains("Image is required"));
        let e = ContainerConfig::parse(b"{\"Image\": ").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.starts_with("invalid JSON"), "{}", e.message);
        let e = ContainerConfig::parse(b"").unwrap_err();
        assert!(e.message.starts_with("invalid JSON"), "{}", e.message);
    }

    #[test]
    fn ports_are_checked_at_create() {
        let c = parse(json!({"Image": "i", "HostConfig": {
            "PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8001"}]}}}))
        .unwrap();
        assert_eq!(
            c.host_config_raw["PortBindings"]["8000/tcp"][0]["HostPort"],
            "8001"
        );
        let msg = bad_request(json!({"Image": "i", "HostConfig": {"NetworkMode": "none",
            "PortBindings": {"8000/tcp": [{"HostPort": "8001"}]}}}));
        assert!(msg.contains("conflicting options"), "{msg}");
        let msg = bad_request(json!({"Image": "i", "HostConfig": {
            "PortBindings": {"notaport/tcp": [{"HostPort": "1"}]}}}));
        assert!(msg.contains("invalid port specification"), "{msg}");
        let msg = bad_request(json!({"Image": "i", "HostConfig": {
            "PortBindings": {"80/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8080"}]}}}));
        assert!(msg.contains("loopback addresses only"), "{msg}");
    }
}
