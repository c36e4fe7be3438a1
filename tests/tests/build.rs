//! `agentrun image build` through the real binary: the legacy Dockerfile builder over the image
//! store, RUN steps in sandboxes. The built image runs under agentrun and, exported, under real
//! containerd (runc), with the same files. Root required.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentrun_e2e::images::{busybox_store, run_in, Containerd};
use agentrun_e2e::*;

/// A store holding `busybox` (from images/busybox).
fn store_with_busybox() -> (tempfile::TempDir, PathBuf) {
    let dir = tempdir();
    let root = busybox_store(dir.path(), &[]);
    (dir, root)
}

fn build(root: &Path, args: &[&str]) -> RunOutput {
    let mut a = vec!["image", "build"];
    a.extend_from_slice(args);
    agentrun(a)
        .root(root)
        .env("AGENTRUN_NO_DAEMON", "1")
        .timeout(Duration::from_secs(300))
        .run()
}

const CHECK: &str = "cat built.txt; ls src; cat /opt/data.txt /opt/unpacked/inner.txt; \
    test -e /etc/os-release || echo os-release-gone; pwd; echo $MODE; stat -c %a /tmp; \
    stat -c %u:%g /opt/data.txt /app/owned.txt";

fn context(dir: &Path) -> PathBuf {
    let ctx = dir.join("ctx");
    fs::create_dir_all(ctx.join("src")).unwrap();
    fs::write(ctx.join("src/app.py"), "print('hi')\n").unwrap();
    fs::write(ctx.join("data.txt"), "data\n").unwrap();
    fs::write(ctx.join("owned.txt"), "owned\n").unwrap();
    // A tar that ADD unpacks.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(6);
    h.set_path("inner.txt").unwrap();
    h.set_cksum();
    b.append(&h, &b"inner\n"[..]).unwrap();
    fs::write(ctx.join("bundle.tar"), b.into_inner().unwrap()).unwrap();
    fs::write(
        ctx.join("Dockerfile"),
        format!(
            "FROM busybox\n\
             ARG GREETING=hello\n\
             ENV APP_HOME=/app MODE=test\n\
             WORKDIR $APP_HOME\n\
             RUN echo \"$GREETING built\" > built.txt && rm /etc/os-release && echo y > /tmp/y\n\
             COPY src/ ./src/\n\
             COPY data.txt /opt/\n\
             COPY --chown=1000:1001 owned.txt /app/\n\
             ADD bundle.tar /opt/unpacked/\n\
             LABEL org.example.k=v\n\
             EXPOSE 8888\n\
             CMD [\"sh\", \"-c\", \"{CHECK}\"]\n"
        ),
    )
    .unwrap();
    ctx
}

const EXPECTED: &str =
    "hey built\napp.py\ndata\ninner\nos-release-gone\n/app\ntest\n1777\n0:0\n1000:1001\n";

#[test]
fn dockerfile_builds_an_image_agentrun_and_containerd_run_alike() {
    let Some(_l) = setup() else { return };
    let (d, root) = store_with_busybox();
    let ctx = context(d.path());
    let out = build(
        &root,
        &[
            "-t",
            "demo:1",
            "--build-arg",
            "GREETING=hey",
            ctx.to_str().unwrap(),
        ],
    );
    let stdout = out.success();
    assert!(stdout.contains("Step 1/12 : FROM busybox"), "{out}");
    let id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Successfully built "))
        .unwrap_or_else(|| panic!("no 'Successfully built'\n{out}"))
        .to_owned();
    assert_eq!(id.len(), 12, "{out}");
    assert!(stdout.contains("Successfully tagged demo:1"), "{out}");

    // The image's Cmd, WorkingDir and Env apply; RUN's changes (a deleted file too), COPY,
    // --chown, ADD's unpacking and /tmp's mode survive.
    let out = agentrun(["exec", "--image", "demo:1"])
        .root(&root)
        .env("AGENTRUN_NO_DAEMON", "1")
        .run();
    assert_eq!(out.success(), EXPECTED, "{out}");
    // By the short id docker-py parses from the output, too.
    run_in(&root, &id, &["true"]).success();
    let v: serde_json::Value = serde_json::from_str(
        &agentrun(["image", "inspect", "demo:1"])
            .root(&root)
            .run()
            .success(),
    )
    .unwrap();
    assert_eq!(v[0]["config"]["labels"]["org.example.k"], "v");
    assert_eq!(v[0]["config"]["exposed_ports"][0], "8888/tcp");
    // Build args are not kept in the image.
    let out = run_in(&root, "demo:1", &["sh", "-c", "echo [$GREETING]"]);
    assert_eq!(out.success(), "[]\n", "{out}");

    // The same image under containerd + runc: the layers are real OCI layers.
    let tar = d.path().join("demo.tar");
    agentrun(["image", "export", "demo:1", "-o", tar.to_str().unwrap()])
        .root(&root)
        .run()
        .success();
    let ctd = Containerd::start();
    ctd.ctr(&["image", "import", tar.to_str().unwrap()])
        .success();
    let out = ctd.run(&["--rm", "docker.io/library/demo:1", "agentrun-e2e-build"]);
    assert_eq!(out.success(), EXPECTED, "{out}\n{}", ctd.log());
}

#[test]
fn build_errors_are_clear_and_name_nothing() {
    let Some(_l) = setup() else { return };
    let (d, root) = store_with_busybox();
    let ctx = d.path().join("bad");
    fs::create_dir_all(&ctx).unwrap();
    let cases: &[(&str, &str)] = &[
        (
            "FROM busybox\nRUN echo partial > /x; exit 3\n",
            "returned a non-zero code: 3",
        ),
        ("FROM busybox\nHEALTHCHECK CMD true\n", "line 2"),
        (
            "FROM busybox\nCOPY ../secret /x\n",
            "outside the build context",
        ),
        ("FROM busybox\nCOPY missing.txt /x\n", "missing.txt"),
        ("FROM nosuchimage\n", "nosuchimage"),
        (
            "FROM busybox\nRUN wget -q -T 2 http://1.1.1.1/ || exit 7\n",
            "non-zero code: 7",
        ),
    ];
    for (dockerfile, why) in cases {
        fs::write(ctx.join("Dockerfile"), dockerfile).unwrap();
        let out = build(&root, &["-t", "bad:1", ctx.to_str().unwrap()]);
        out.assert_agentrun_error();
        assert!(out.stderr().contains(why), "{dockerfile:?}: {out}");
        agentrun(["image", "inspect", "bad:1"])
            .root(&root)
            .run()
            .assert_agentrun_error();
    }
    // No sandbox, mount or layer left behind by the failed RUNs.
    let out = agentrun(["image", "prune"]).root(&root).run();
    assert!(out.success().contains("Removed 0 layer"), "{out}");
}
