//! The Docker Engine API subset (`agentrun serve --docker-socket`) driven by the real docker
//! CLI and docker-py (pip-installed in `.venv/test` by hack/test). This covers the system and
//! image endpoints (ping/version/info, images list/inspect/tag/rm, pull, legacy build);
//! container endpoints are not served yet. Root required.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::images::{busybox_store, Registry};
use agentrun_e2e::*;

/// A daemon with the Docker API on `<state>/docker.sock`, over a store holding `busybox`.
struct DockerDaemon {
    daemon: Daemon,
    socket: PathBuf,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

fn start() -> DockerDaemon {
    let dir = tempdir();
    let root = busybox_store(dir.path(), &["--cmd", "/bin/sh"]);
    let mut daemon = Daemon::unstarted().with_env("AGENTRUN_ROOT", &root);
    let socket = daemon.state().join("docker.sock");
    daemon.launch([
        "--pool-size".as_ref(),
        "1".as_ref(),
        "--docker-socket".as_ref(),
        socket.as_os_str(),
    ]);
    DockerDaemon {
        daemon,
        socket,
        root,
        _dir: dir,
    }
}

impl DockerDaemon {
    /// The docker CLI against this socket (legacy builder, no user config).
    fn docker(&self, args: &[&str]) -> RunOutput {
        let mut cmd = Command::new("docker");
        cmd.args(args)
            .env("DOCKER_HOST", format!("unix://{}", self.socket.display()))
            .env("DOCKER_BUILDKIT", "0")
            .env("DOCKER_CONFIG", self._dir.path().join("docker-config"));
        run_with_timeout(cmd, None, Duration::from_secs(300))
    }

    /// A docker-py script (`client = docker.from_env()` is set up) against this socket.
    fn python(&self, script: &str) -> RunOutput {
        let python = workspace_root().join(".venv/test/bin/python");
        assert!(
            python.exists(),
            "{} missing: hack/test creates it (python3 -m venv .venv/test; pip install docker)",
            python.display()
        );
        let mut cmd = Command::new(python);
        cmd.arg("-c")
            .arg(format!(
                "import docker, sys\nclient = docker.from_env()\n{script}"
            ))
            .env("DOCKER_HOST", format!("unix://{}", self.socket.display()));
        run_with_timeout(cmd, None, Duration::from_secs(300))
    }

    /// One raw HTTP/1.0 request; the whole response.
    fn raw(&self, request: &str) -> String {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }
}

fn context(dir: &Path, dockerfile: &str) -> PathBuf {
    let ctx = dir.join(format!("ctx-{}", dockerfile.len()));
    fs::create_dir_all(&ctx).unwrap();
    fs::write(ctx.join("Dockerfile"), dockerfile).unwrap();
    fs::write(ctx.join("hello.txt"), "hello from the context\n").unwrap();
    ctx
}

#[test]
fn docker_cli_info_version_images_and_legacy_build() {
    let Some(_l) = setup() else { return };
    let d = start();
    // CodeInterpreterTool runs `docker info` with a 1 s timeout.
    let mut info = Command::new("timeout");
    info.args(["1", "docker", "info"])
        .env("DOCKER_HOST", format!("unix://{}", d.socket.display()));
    let out = run_with_timeout(info, None, Duration::from_secs(10));
    assert!(out.success().contains("Server Version: agentrun"), "{out}");
    let out = d.docker(&["version", "--format", "{{.Server.APIVersion}}"]);
    assert_eq!(out.success().trim(), "1.44", "{out}");

    let ctx = context(
        d._dir.path(),
        "FROM busybox\nENV GREETING=hi\nCOPY hello.txt /srv/\nRUN cat /srv/hello.txt > /srv/copy.txt\nWORKDIR /workspace\nCMD [\"cat\", \"/srv/copy.txt\"]\n",
    );
    let out = d.docker(&["build", "-t", "app:1", ctx.to_str().unwrap()]);
    let stdout = out.success();
    assert!(stdout.contains("Successfully built "), "{out}");
    assert!(stdout.contains("Successfully tagged app:1"), "{out}");
    let out = d.docker(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
    let listed = out.success();
    assert!(listed.lines().any(|l| l == "app:1"), "{out}");
    assert!(listed.lines().any(|l| l == "busybox:latest"), "{out}");
    let out = d.docker(&[
        "image",
        "inspect",
        "app:1",
        "--format",
        "{{.Config.WorkingDir}} {{.Config.Cmd}} {{index .Config.Env 1}}",
    ]);
    assert_eq!(
        out.success().trim(),
        "/workspace [cat /srv/copy.txt] GREETING=hi",
        "{out}"
    );
    // The image runs under agentrun with its Cmd.
    let out = d
        .daemon
        .agentrun(["exec", "--image", "app:1"])
        .root(&d.root)
        .run();
    assert_eq!(out.success(), "hello from the context\n", "{out}");

    d.docker(&["tag", "app:1", "registry.example/team/app:2"])
        .success();
    let out = d.docker(&["rmi", "registry.example/team/app:2"]);
    assert!(
        out.success()
            .contains("Untagged: registry.example/team/app:2"),
        "{out}"
    );
    d.docker(&["image", "inspect", "app:1"]).success();
    let out = d.docker(&["image", "inspect", "nosuch:1"]);
    assert_ne!(out.status.code(), Some(0), "{out}");
    assert!(out.stderr().contains("No such image: nosuch:1"), "{out}");

    // A failing RUN fails the build with Docker's message and exit status.
    let bad = context(
        d._dir.path(),
        "FROM busybox\nRUN echo about to fail; exit 4\n",
    );
    let out = d.docker(&["build", "-t", "bad:1", bad.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0), "{out}");
    assert!(
        format!("{}{}", out.stdout(), out.stderr()).contains("returned a non-zero code: 4"),
        "{out}"
    );
    d.docker(&["image", "inspect", "bad:1"]);
    let out = d.docker(&["rmi", "app:1"]);
    assert!(out.success().contains("Deleted: sha256:"), "{out}");
}

#[test]
fn docker_py_image_flow_of_the_code_interpreter_tool() {
    let Some(_l) = setup() else { return };
    let d = start();
    // images.get -> ImageNotFound -> images.build(fileobj) -> images.get(short id).
    let out = d.python(
        r#"
import io
assert client.ping()
assert client.version()["ApiVersion"] == "1.44", client.version()
try:
    client.images.get("code-interpreter:latest")
    sys.exit("image unexpectedly present")
except docker.errors.ImageNotFound:
    print("not found")
dockerfile = b"FROM busybox\nRUN echo requests beautifulsoup4 > /installed.txt\nWORKDIR /workspace\n"
image, logs = client.images.build(fileobj=io.BytesIO(dockerfile), tag="code-interpreter:latest", rm=True)
print("built", image.short_id.startswith("sha256:"), image.tags)
again = client.images.get(image.id[7:19])
print("by short id", again.id == image.id)
print("workdir", image.attrs["Config"]["WorkingDir"])
print("listed", any("code-interpreter:latest" in i.tags for i in client.images.list()))
try:
    client.images.build(fileobj=io.BytesIO(b"FROM busybox\nRUN exit 9\n"), tag="broken:1")
    sys.exit("a failing build succeeded")
except docker.errors.BuildError as e:
    print("build error", "non-zero code: 9" in str(e))
client.images.remove("code-interpreter:latest")
try:
    client.images.get("code-interpreter:latest")
except docker.errors.ImageNotFound:
    print("removed")
"#,
    );
    assert_eq!(
        out.success(),
        "not found\nbuilt True ['code-interpreter:latest']\nby short id True\nworkdir /workspace\nlisted True\nbuild error True\nremoved\n",
        "{out}\n{}",
        d.daemon.log()
    );
}

#[test]
fn docker_pull_goes_through_the_registry_client() {
    let Some(_l) = setup() else { return };
    let d = start();
    let tar = d._dir.path().join("busybox.tar");
    agentrun(["image", "export", "busybox", "-o", tar.to_str().unwrap()])
        .root(&d.root)
        .run()
        .success();
    let reg = Registry::start();
    reg.push(&format!("oci-archive:{}", tar.display()), "lib/tiny:7", &[])
        .success();
    let name = format!("{}/lib/tiny:7", reg.host());
    let out = d.docker(&["pull", &name]);
    assert!(out.success().contains("Downloaded newer image"), "{out}");
    let out = d.docker(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
    assert!(out.success().lines().any(|l| l == name), "{out}");
    let out = d.docker(&["pull", &format!("{}/lib/missing:1", reg.host())]);
    assert_ne!(out.status.code(), Some(0), "{out}");
    let out = d.python(&format!(
        "img = client.images.pull('{}/lib/tiny', tag='7')\nprint(img.id.startswith('sha256:'))",
        reg.host()
    ));
    assert_eq!(out.success(), "True\n", "{out}");
}

#[test]
fn the_socket_is_root_only_and_speaks_dockerd_http() {
    let Some(_l) = setup() else { return };
    let d = start();
    let mode = fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode");
    let r = d.raw("HEAD /_ping HTTP/1.0\r\n\r\n");
    assert!(
        r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200"),
        "{r}"
    );
    assert!(r.to_ascii_lowercase().contains("api-version: 1.44"), "{r}");
    assert!(r.ends_with("\r\n\r\n"), "HEAD must have no body: {r:?}");
    let r = d.raw("GET /v1.99/info HTTP/1.0\r\n\r\n");
    assert!(r.contains(" 400 ") && r.contains("is too new"), "{r}");
    let r = d.raw("GET /v1.41/nonsense HTTP/1.0\r\n\r\n");
    assert!(r.contains(" 404 ") && r.contains("page not found"), "{r}");
    let r = d.raw("GET /v1.41/images/busybox/json HTTP/1.0\r\n\r\n");
    assert!(r.contains(" 200 ") && r.contains("\"Id\":\"sha256:"), "{r}");
    let r = d.raw("GET /images/nosuch%3Alatest/json HTTP/1.0\r\n\r\n");
    assert!(
        r.contains(" 404 ") && r.contains("No such image: nosuch:latest"),
        "{r}"
    );
}
