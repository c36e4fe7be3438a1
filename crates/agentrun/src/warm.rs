//! `agentrun exec` through the daemon: the request and this process's stdio fds go to
//! `agentrun serve`, the command writes straight to our stdout/stderr, signals are forwarded,
//! and the exit status comes back.

use std::os::fd::AsFd;
use std::time::Duration;

use agentrun_pool::client::DaemonClient;
use agentrun_pool::protocol::{ClientMessage, DaemonReply, ExecReply};
use agentrun_runtime::cgroup::CgroupStats;
use agentrun_runtime::RunOutcome;
use agentrun_telemetry::RunSpan;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::exec::{
    block_signals, fail, landlock_subscribe, landlock_watch, record_enforcement,
    record_kernel_denials, report, Plan,
};
use crate::trace::Recorder;

pub fn execute(client: &DaemonClient, plan: &Plan, span: &mut RunSpan, recorder: &Recorder) -> i32 {
    let signals = block_signals();
    // The pooled sandbox's init made its Landlock domain; its denials during this run are
    // matched by the init's pid, which the reply carries. Subscribed before the request goes,
    // kept (audit on) or dropped once it went.
    let subscription = landlock_subscribe(agentrun_runtime::landlock::abi());
    let msg = ClientMessage::Exec {
        request: Box::new(plan.request.clone()),
        timeout_ms: plan.timeout.map(|t| t.as_millis() as u64),
    };
    let stdio = [0, 1, 2];
    if let Err(e) = client.send(&msg, &stdio) {
        return fail(
            span,
            "daemon",
            &anyhow::Error::new(e).context("sending to the daemon"),
        );
    }
    let watch = landlock_watch(subscription, span);
    // Wait for the answer; forward signals meanwhile.
    loop {
        let mut fds = vec![PollFd::new(client.fd(), PollFlags::POLLIN)];
        if let Some(s) = &signals {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => return fail(span, "daemon", &anyhow::Error::new(e).context("poll")),
        }
        let sig_ready = fds
            .get(1)
            .and_then(|f| f.revents())
            .is_some_and(|r| !r.is_empty());
        let reply_ready = fds[0].revents().is_some_and(|r| !r.is_empty());
        drop(fds);
        if sig_ready {
            if let Some(Ok(Some(info))) = signals.as_ref().map(|s| s.read_signal()) {
                let _ = client.send(
                    &ClientMessage::Signal {
                        signal: info.ssi_signo as i32,
                    },
                    &[],
                );
            }
        }
        if reply_ready {
            break;
        }
    }
    match client.recv() {
        Ok(DaemonReply::Exec(r)) => {
            if let Some(w) = watch {
                if r.init_pid > 0 {
                    record_kernel_denials(w.finish(r.init_pid), plan, recorder, span);
                }
            }
            finish(r, plan, span)
        }
        Ok(DaemonReply::Error { message }) => fail(span, "daemon", &anyhow::anyhow!(message)),
        Ok(other) => fail(
            span,
            "daemon",
            &anyhow::anyhow!("unexpected reply {other:?}"),
        ),
        Err(e) => fail(span, "daemon", &anyhow::Error::new(e)),
    }
}

fn finish(r: ExecReply, plan: &Plan, span: &mut RunSpan) -> i32 {
    span.set_attribute("sandbox.pool_hit", r.pool_hit);
    if !r.sandbox_id.is_empty() {
        span.set_attribute("sandbox.id", r.sandbox_id.clone());
        span.set_attribute("container.id", r.sandbox_id.clone());
        record_enforcement(span, &r.enforcement);
    }
    if let Some(e) = &r.error {
        return fail(span, "daemon", &anyhow::anyhow!("{e}"));
    }
    let outcome = RunOutcome {
        exit_code: r.exit_code,
        signal: r.signal,
        timed_out: r.timed_out,
        oom_killed: r.oom_killed,
        stats: CgroupStats {
            peak_memory_bytes: r.peak_memory_bytes,
            oom_kills: u64::from(r.oom_killed),
        },
        init_pid: r.init_pid,
        run_duration: Duration::from_millis(r.duration_ms),
        usage: r.usage,
        ..Default::default()
    };
    report(&outcome, plan, span, false);
    outcome.exit_code
}
