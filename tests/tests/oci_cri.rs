//! agentrun as a Kubernetes runtime handler, through containerd's CRI plugin, driven by a CRI
//! client (the generated gRPC client in tests/src/cri) the way the kubelet drives it:
//! RunPodSandbox with `runtime_handler = "agentrun"` (the runtime configured exactly as
//! docs/kubernetes.md says: runc shim, `BinaryName` = agentrun, annotations passed through),
//! CreateContainer/StartContainer, ContainerStatus (exit code), the container log, ExecSync,
//! UpdateContainerResources (`update --resources -`),
//! the pod's `run.agentrun.profile` annotation and the RuntimeDefault seccomp profile, then
//! Stop/Remove of containers and pod; one `container.lifetime` span per container (OTLP
//! settings in containerd's environment reach agentrun through the shim); nothing left behind.
//!
//! The images (a busybox one and a sleeping "pause" one) are built locally and imported with
//! `ctr -n k8s.io image import`; no registry. The pod uses the host network (no CNI here).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::cri::v1::runtime_service_client::RuntimeServiceClient;
use agentrun_e2e::cri::v1::{
    security_profile::ProfileType, ContainerConfig, ContainerMetadata, ContainerState,
    ContainerStatusRequest, CreateContainerRequest, ExecSyncRequest, ImageSpec,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, SecurityProfile, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest, UpdateContainerResourcesRequest, VersionRequest,
};
use agentrun_e2e::oci::{busybox_image_tar, CgroupParent, Containerd, IMAGE, PAUSE_IMAGE};
use agentrun_e2e::otlp::OtlpReceiver;
use agentrun_e2e::{agentrun_bin, all_processes, mounts_under, run_with_timeout, setup, tempdir};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// containerd's CRI plugin configuration: an `agentrun` runtime handler as in
/// docs/kubernetes.md (plus test-only paths).
fn cri_config(dir: &Path, bin: &Path) -> String {
    format!(
        r#"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  # This host lacks CAP_SYS_RESOURCE, which lowering oom_score_adj (pods get -998) needs;
  # runc fails the same way without it.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.agentrun]
      runtime_type = "io.containerd.runc.v2"
      pod_annotations = ["run.agentrun.*"]
      container_annotations = ["run.agentrun.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.agentrun.options]
        BinaryName = "{bin}"
        Root = "{root}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{dir}/cni/bin"
    conf_dir = "{dir}/cni/conf"
"#,
        bin = bin.display(),
        root = dir.join("agentrun-root").display(),
        dir = dir.display(),
    )
}

async fn connect(socket: PathBuf) -> RuntimeServiceClient<Channel> {
    let channel = Endpoint::try_from("http://localhost")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .expect("connect to containerd's CRI socket");
    RuntimeServiceClient::new(channel)
}

fn container_config(name: &str, cmd: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: IMAGE.into(),
            ..Default::default()
        }),
        command: cmd.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                seccomp: Some(SecurityProfile {
                    profile_type: ProfileType::RuntimeDefault as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the CRI scenario observed.
#[derive(Debug, Default)]
struct Seen {
    exit_code: i32,
    log: String,
    exec: (i32, String),
    exec_write_etc: (i32, String),
    exec_write_tmp: i32,
    exec_unshare: (i32, String),
    agentrun_state: String,
    memory_limit: String,
    pod_id: String,
    tool_id: String,
    sleeper_id: String,
}

/// The memory limit of container `id` under cgroup parent `parent` (v1 or v2).
fn memory_limit(parent: &str, id: &str) -> String {
    let v1 = Path::new("/sys/fs/cgroup/memory").join(parent).join(id);
    let file = if v1.is_dir() {
        v1.join("memory.limit_in_bytes")
    } else {
        Path::new("/sys/fs/cgroup")
            .join(parent)
            .join(id)
            .join("memory.max")
    };
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

async fn scenario(socket: PathBuf, dir: &Path, cg_parent: &str) -> Seen {
    let mut cri = connect(socket).await;
    let version = cri
        .version(VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(version.runtime_name, "containerd");
    let logs = dir.join("pod-logs");
    std::fs::create_dir_all(&logs).unwrap();
    let pod = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "agent-tool".into(),
            uid: "0f8a7c1e-agentrun-e2e".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        // No hostname: the pod shares the node's network and UTS namespaces (as the kubelet
        // does for host-network pods).
        log_directory: logs.to_string_lossy().into_owned(),
        annotations: HashMap::from([("run.agentrun.profile".into(), "strict".into())]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: format!("/{cg_parent}"),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod_id = cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(pod.clone()),
            runtime_handler: "agentrun".into(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;

    let create = |name: &str, cmd: &[&str]| CreateContainerRequest {
        pod_sandbox_id: pod_id.clone(),
        config: Some(container_config(name, cmd)),
        sandbox_config: Some(pod.clone()),
    };
    let mut seen = Seen::default();

    // A container that prints and exits 3.
    let tool = cri
        .create_container(create("tool", &["sh", "-c", "echo hello from cri; exit 3"]))
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id;
    cri.start_container(StartContainerRequest {
        container_id: tool.clone(),
    })
    .await
    .expect("StartContainer");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = cri
            .container_status(ContainerStatusRequest {
                container_id: tool.clone(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        if status.state == ContainerState::ContainerExited as i32 {
            seen.exit_code = status.exit_code;
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "tool never exited: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen.log = std::fs::read_to_string(logs.join("tool.log")).unwrap_or_default();

    // A long-running one, to exec into.
    let sleeper = cri
        .create_container(create("sleeper", &["sleep", "1000"]))
        .await
        .expect("CreateContainer sleeper")
        .into_inner()
        .container_id;
    cri.start_container(StartContainerRequest {
        container_id: sleeper.clone(),
    })
    .await
    .expect("StartContainer sleeper");
    let exec = |cmd: &[&str]| {
        let req = ExecSyncRequest {
            container_id: sleeper.clone(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 20,
        };
        let mut cri = cri.clone();
        async move {
            let r = cri.exec_sync(req).await.expect("ExecSync").into_inner();
            (
                r.exit_code,
                String::from_utf8_lossy(&r.stdout).into_owned()
                    + &String::from_utf8_lossy(&r.stderr),
            )
        }
    };
    seen.exec = exec(&["sh", "-c", "echo exec says hi; exit 7"]).await;
    seen.exec_write_etc = exec(&["sh", "-c", "echo x > /etc/f"]).await;
    seen.exec_write_tmp = exec(&["sh", "-c", "echo x > /tmp/f"]).await.0;
    seen.exec_unshare = exec(&["unshare", "-U", "true"]).await;
    // It is agentrun that runs it: its own `state`, in the root the shim was configured with.
    let out = run_with_timeout(
        {
            let mut c = Command::new(agentrun_bin());
            c.arg("--root")
                .arg(dir.join("agentrun-root/k8s.io"))
                .args(["state", &sleeper]);
            c
        },
        None,
        Duration::from_secs(20),
    );
    seen.agentrun_state = out.stdout();
    // UpdateContainerResources: the shim runs `update --resources -` with the JSON on stdin.
    cri.update_container_resources(UpdateContainerResourcesRequest {
        container_id: sleeper.clone(),
        linux: Some(LinuxContainerResources {
            memory_limit_in_bytes: 96 << 20,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("UpdateContainerResources");
    seen.memory_limit = memory_limit(cg_parent, &sleeper);

    for id in [&tool, &sleeper] {
        cri.stop_container(StopContainerRequest {
            container_id: id.clone(),
            timeout: 2,
        })
        .await
        .expect("StopContainer");
        cri.remove_container(RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("RemoveContainer");
    }
    seen.pod_id = pod_id.clone();
    seen.tool_id = tool.clone();
    seen.sleeper_id = sleeper.clone();
    cri.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: pod_id.clone(),
    })
    .await
    .expect("StopPodSandbox");
    cri.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: pod_id,
    })
    .await
    .expect("RemovePodSandbox");
    seen
}

#[test]
fn cri_pod_runs_with_agentrun_runtime_handler() {
    let Some(_lock) = setup() else { return };
    let work = tempdir();
    let dir = work.path().to_owned();
    let cgp = CgroupParent::new("agentrun-e2e-cri");
    // containerd's environment reaches the shim and agentrun: the lifetime spans come here.
    let otlp = OtlpReceiver::grpc();
    let cg_parent = cgp.name.clone();
    let seen = {
        let ctrd = Containerd::start_with(
            &dir,
            Some(&cri_config(&dir, &agentrun_bin())),
            &otlp.otel_env(),
        );
        let tar = busybox_image_tar();
        let out = ctrd.ctr_in(
            "k8s.io",
            [
                "image".as_ref(),
                "import".as_ref(),
                "--base-name".as_ref(),
                "agentrun.test/busybox".as_ref(),
                tar.as_os_str(),
            ],
        );
        assert!(out.status.success(), "import\n{out}");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let socket = ctrd.socket.clone();
        let seen = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(180), scenario(socket, &dir, &cg_parent)).await
        });
        let seen = seen.unwrap_or_else(|_| panic!("CRI scenario timed out\n{}", ctrd.log()));
        assert!(ctrd.tasks_in("k8s.io").is_empty(), "tasks left");
        seen
    };
    assert_eq!(seen.exit_code, 3, "{seen:?}");
    // CRI log format: "<time> stdout F <line>".
    assert!(seen.log.contains(" stdout F hello from cri"), "{seen:?}");
    assert_eq!(seen.exec, (7, "exec says hi\n".into()), "{seen:?}");
    // The pod's run.agentrun.profile=strict reached the container: Landlock.
    assert_ne!(seen.exec_write_etc.0, 0, "{seen:?}");
    assert_eq!(seen.exec_write_tmp, 0, "{seen:?}");
    // RuntimeDefault seccomp (containerd's default profile), enforced by agentrun.
    assert_ne!(seen.exec_unshare.0, 0, "{seen:?}");
    let state: serde_json::Value = serde_json::from_str(&seen.agentrun_state)
        .unwrap_or_else(|e| panic!("agentrun state: {e}: {seen:?}"));
    assert_eq!(state["status"], "running");
    assert_eq!(seen.memory_limit, (96u64 << 20).to_string(), "{seen:?}");
    assert_eq!(
        state["annotations"]["run.agentrun.profile"], "strict",
        "{state}"
    );

    // One container.lifetime span per container (the pod's sandbox container included),
    // exported by `agentrun delete` as the shim calls it, with the CRI image annotation.
    let spans: Vec<_> = otlp
        .wait_for_spans(3, Duration::from_secs(10))
        .into_iter()
        .filter(|s| s.name == "container.lifetime")
        .collect();
    let mut ids: Vec<&str> = spans.iter().map(|s| s.attr("container.id")).collect();
    ids.sort();
    let mut want = vec![
        seen.pod_id.as_str(),
        seen.tool_id.as_str(),
        seen.sleeper_id.as_str(),
    ];
    want.sort();
    assert_eq!(ids, want, "{spans:#?}");
    for s in &spans {
        assert_eq!(s.attr("container.runtime"), "agentrun");
        assert_eq!(s.attr("sandbox.profile"), "strict");
        if s.attr("container.id") != seen.pod_id {
            assert_eq!(s.attr("container.image.name"), IMAGE, "{s:#?}");
        }
    }

    // Nothing left: agentrun state, shims, mounts, cgroups.
    let left: Vec<_> = std::fs::read_dir(dir.join("agentrun-root/k8s.io"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "agentrun state left: {left:?}");
    let d = dir.to_string_lossy().into_owned();
    let procs: Vec<String> = all_processes()
        .into_iter()
        .filter(|p| p.cmdline.iter().any(|a| a.contains(&d)))
        .map(|p| p.to_string())
        .collect();
    assert!(procs.is_empty(), "processes left: {procs:?}");
    assert_eq!(mounts_under(&dir), Vec::<PathBuf>::new(), "mounts left");
    let leftover = cgp.children();
    assert!(leftover.is_empty(), "cgroups left: {leftover:?}");
}
