//! What a container looks like from outside: `docker inspect` ([`Container::inspect`]) and
//! its row in `docker ps` ([`Container::summary`]), dockerd's JSON shapes.

use std::time::SystemTime;

use agentrun_pool::lock;
use serde_json::{json, Value};

use super::model::{Container, Status};

impl Container {
    /// `docker inspect`.
    pub fn inspect(&self) -> Value {
        let st = lock(&self.state);
        let argv = self.argv();
        let time = |t: Option<SystemTime>| {
            t.map(rfc3339)
                .unwrap_or_else(|| "0001-01-01T00:00:00Z".to_owned())
        };
        let mut config = self.config.raw.clone();
        if !config.is_object() {
            config = json!({});
        }
        config["Image"] = json!(self.config.image);
        config["Cmd"] = json!(self.config.cmd.clone().or(self.image_config.cmd.clone()));
        config["Entrypoint"] = json!(self
            .config
            .entrypoint
            .clone()
            .or(self.image_config.entrypoint.clone()));
        let mut env = self.image_config.env.clone();
        env.extend(self.config.env.iter().cloned());
        config["Env"] = json!(env);
        config["WorkingDir"] = json!(self.working_dir());
        config["Tty"] = json!(self.config.tty);
        config["User"] = json!(self.user().unwrap_or_default());
        config["Labels"] = Value::Object(self.config.labels.clone());
        let exposed = self.exposed_ports();
        if !exposed.is_empty() {
            config["ExposedPorts"] =
                Value::Object(exposed.iter().map(|p| (p.clone(), json!({}))).collect());
        }
        config.as_object_mut().map(|o| o.remove("HostConfig"));
        let mounts: Vec<Value> = self
            .config
            .mounts()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                json!({"Type": "bind", "Source": m.source, "Destination": m.target,
                       "Mode": if m.writable { "rw" } else { "ro" }, "RW": m.writable,
                       "Propagation": "rprivate"})
            })
            .collect();
        let pid = if st.status == Status::Running {
            st.sandbox.as_ref().map(|s| s.init_pid()).unwrap_or(0)
        } else {
            0
        };
        let mut host_config = self.config.host_config_raw.clone();
        if !host_config.is_object() {
            host_config = json!({});
        }
        for (k, v) in [
            ("LogConfig", json!({"Type": "json-file", "Config": {}})),
            ("NetworkMode", json!(self.config.network_mode)),
            ("AutoRemove", json!(self.config.auto_remove)),
            ("Binds", json!(self.config.binds)),
            (
                "RestartPolicy",
                json!({"Name": "no", "MaximumRetryCount": 0}),
            ),
        ] {
            if host_config[k].is_null() {
                host_config[k] = v;
            }
        }
        json!({
            "Id": self.id,
            "Created": rfc3339(self.created),
            "Path": argv.first().cloned().unwrap_or_default(),
            "Args": argv.iter().skip(1).cloned().collect::<Vec<_>>(),
            "State": {
                "Status": st.status.as_str(),
                "Running": st.status == Status::Running,
                "Paused": false,
                "Restarting": false,
                "OOMKilled": st.oom_killed,
                "Dead": false,
                "Pid": pid,
                "ExitCode": st.exit_code,
                "Error": st.error,
                "StartedAt": time(st.started_at),
                "FinishedAt": time(st.finished_at),
            },
            "Image": self.image_id,
            "Name": format!("/{}", self.name),
            "RestartCount": 0,
            "Driver": "overlay2",
            "Platform": "linux",
            "HostConfig": host_config,
            "Mounts": mounts,
            "Config": config,
            "NetworkSettings": {
                "Ports": crate::ports::inspect_ports(
                    &exposed,
                    st.ports.as_ref(),
                    st.status == Status::Running,
                ),
                "Networks": {},
            },
        })
    }

    /// A row of `GET /containers/json`.
    pub fn summary(&self) -> Value {
        let st = lock(&self.state);
        let status = match st.status {
            Status::Created => "Created".to_owned(),
            Status::Running => "Up".to_owned(),
            Status::Exited => format!("Exited ({})", st.exit_code),
        };
        json!({
            "Id": self.id,
            "Names": [format!("/{}", self.name)],
            "Image": self.config.image,
            "ImageID": self.image_id,
            "Command": self.argv().join(" "),
            "Created": self.created.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "Ports": crate::ports::summary_ports(
                &self.exposed_ports(),
                st.ports.as_ref(),
                st.status == Status::Running,
            ),
            "Labels": Value::Object(self.config.labels.clone()),
            "State": st.status.as_str(),
            "Status": status,
            "HostConfig": {"NetworkMode": self.config.network_mode},
            "NetworkSettings": {"Networks": {}},
            "Mounts": [],
        })
    }
}

/// A time as dockerd writes it (RFC 3339, nanoseconds, `Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let dt: chrono::DateTime<chrono::Utc> = t.into();
    dt.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}
