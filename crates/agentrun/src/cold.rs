//! The cold path of a run (`AGENTRUN_NO_DAEMON=1`, no daemon answering, or `--keep-bundle`):
//! one shell built in this process ([`Sandbox::create`], single-threaded), one cell run in it
//! ([`Sandbox::run_cell`], the same cell a pooled shell makes), its output pumped here, the
//! shell destroyed. A SIGKILL of this process leaves nothing behind for long
//! ([`agentrun_runtime::guard`]: the shell's mounts in this process's own mount namespace, a
//! janitor for the rest).

use std::os::fd::OwnedFd;

use agentrun_image::ImageStore;
use agentrun_pool::PoolError;
use agentrun_runtime::cellrun::{cell_request, MappingCache, RunMounts};
use agentrun_runtime::control::{CellCommand, CellWork};
use agentrun_runtime::{HostInfo, RuntimePaths, Sandbox, SandboxStdio};

use crate::plan::Plan;
use crate::run::{
    block_signals, landlock_subscribe, landlock_watch, record_kernel_denials, start_proxy,
    RunRecord,
};
use crate::trace::Recorder;
use crate::Paths;

/// Runs `plan` in a shell of its own; `keep_bundle` keeps the shell's config.json.
pub(crate) fn execute(
    plan: &Plan,
    paths: &Paths,
    keep_bundle: bool,
    recorder: &Recorder,
) -> RunRecord {
    let mut run = RunRecord::default();
    let store = match ImageStore::open(&paths.root) {
        Ok(s) => s,
        Err(e) => return run.fail("image", &e.into()),
    };
    let req = &plan.request;
    let (config, profile) = match req
        .recipe
        .to_config(&store, false)
        .and_then(|c| Ok((c, req.recipe.profile()?)))
    {
        Ok(c) => c,
        Err(e) => {
            let kind = match &e {
                PoolError::Image(agentrun_image::ImageError::NotFound(_)) => "image_not_found",
                _ => "invalid_input",
            };
            return run.fail(kind, &e.into());
        }
    };
    let runtime_paths = RuntimePaths::new(&paths.state_dir);
    // Clean up after runs that were killed; cheap when there is nothing to do.
    // Best effort: what it cannot clean now is tried again before the next run.
    let _ = agentrun_runtime::gc::collect_before_run(&runtime_paths);
    // From here on a SIGKILL of this process leaves nothing for the next run: the shell's
    // mounts live in this process's own mount namespace (they go with it), and a janitor
    // collects the rest (its state dir, cgroup and container dir) once it has died. Still
    // single-threaded here, as the janitor's fork needs.
    let _guard = agentrun_runtime::guard::Guard::start(&runtime_paths);
    let host = HostInfo::probe();
    if host.landlock_abi == 0 {
        eprintln!(
            "agentrun: warning: {}",
            agentrun_runtime::preflight::LANDLOCK_ABSENT
        );
    }

    let signals = block_signals();
    let stdin = match stdin_fd() {
        Ok(fd) => fd,
        Err(e) => return run.fail("io", &e),
    };
    let mut sandbox = match Sandbox::create(&config, &runtime_paths, &host, SandboxStdio::Shell)
        .and_then(|mut s| s.start().map(|()| s))
    {
        Ok(s) => s,
        Err(e) => {
            let kind = e.kind();
            // A host requirement's error is already the whole story: what to do.
            let e = match e {
                e @ agentrun_runtime::RuntimeError::Preflight(_) => anyhow::Error::new(e),
                e => anyhow::Error::new(e).context("creating sandbox"),
            };
            return run.fail(kind, &e);
        }
    };
    run.sandbox_id = Some(sandbox.id().to_string());
    // The run's mounts, made here (forks for the id mappings: before any thread starts).
    let user_mounts = req.recipe.user_mounts();
    let mounts = match RunMounts::prepare_for(
        &user_mounts,
        &mut MappingCache::new(),
        &host.privilege,
        sandbox.userns(),
    ) {
        Ok(m) => m,
        Err(e) => {
            // The run fails with the error below; a shell left behind is collected before the next run.
            let _ = sandbox.destroy();
            let kind = e.kind();
            return run.fail(kind, &anyhow::Error::new(e).context("creating sandbox"));
        }
    };
    let mut enforcement = sandbox.enforcement().clone();
    enforcement.idmapped_mounts &= mounts.idmapped;
    run.enforcement = Some(enforcement);
    // Nothing runs unless the decisions so far are on disk.
    if let Err(e) = recorder.set_sandbox(sandbox.id()) {
        // The run fails with the error below; a shell left behind is collected before the next run.
        let _ = sandbox.destroy();
        return run.fail("audit", &e.into());
    }
    // The shell exists (created single-threaded): the proxy's threads may start now.
    let proxy = if plan.network.needs_proxy() {
        match start_proxy(&sandbox.egress_socket(), plan, recorder) {
            Ok(p) => Some(p),
            Err(e) => {
                // The run fails with the error below; a shell left behind is collected before the next run.
                let _ = sandbox.destroy();
                return run.fail("egress", &e);
            }
        }
    } else {
        None
    };
    if keep_bundle {
        match sandbox.keep_bundle() {
            Ok(dir) => eprintln!("agentrun: bundle kept at {}", dir.display()),
            Err(e) => eprintln!("agentrun: could not keep the bundle: {e}"),
        }
    }
    let mut cell_req = cell_request(
        &profile,
        host.landlock_abi,
        &user_mounts,
        &mounts,
        req.recipe.egress_port,
        CellWork::Run(CellCommand {
            argv: req.args.clone(),
            env: req.environment(&profile, sandbox.image_config()),
            cwd: req.working_dir(sandbox.image_config()),
            zygote: false,
        }),
    );
    *cell_req.rlimits = sandbox.rlimit_fallback(&profile.resources, plan.timeout);
    if let Some(e) = run.enforcement.as_mut() {
        e.limits = sandbox.describe_limits(&cell_req.rlimits);
    }
    let watch = landlock_watch(landlock_subscribe(host.landlock_abi));
    run.landlock_audit = Some(watch.is_some());
    if profile.python.zygote {
        run.zygote = Some(false);
        run.zygote_fallback = Some("a one-run sandbox (the cold path) has no zygote".into());
    }
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let io = agentrun_runtime::RunIo {
        out: &mut stdout.lock(),
        err: &mut stderr.lock(),
        timeout: plan.timeout,
        signals: signals.as_ref(),
    };
    let result = sandbox.run_cell(&cell_req, mounts, stdin, io);
    if let Some(p) = proxy {
        p.stop();
    }
    if let (Some(w), Ok(o)) = (watch, &result) {
        run.kernel_denials = Some(record_kernel_denials(w.finish(o.init_pid), plan, recorder));
    }
    let destroyed = sandbox.destroy();
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            let kind = e.kind();
            return run.fail(kind, &anyhow::Error::new(e).context("running sandbox"));
        }
    };
    if let Err(e) = destroyed {
        eprintln!("agentrun: warning: cleanup incomplete ({e}); `agentrun gc` will retry");
    }
    run.ran(outcome, true)
}

/// The command's stdin: ours, duplicated (or /dev/null when we have none).
fn stdin_fd() -> anyhow::Result<OwnedFd> {
    use std::os::fd::AsFd;
    match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => Ok(fd),
        Err(_) => Ok(std::fs::File::open("/dev/null")?.into()),
    }
}
