"""agentrun.run and agentrun.Sandbox against the real binary: outputs, exit codes, the
keyword arguments' effects, typed errors, timeouts, and the daemon (warm) path."""

import os
import time

import pytest

import agentrun


def test_run_gives_exit_code_stdout_stderr():
    r = agentrun.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert r == agentrun.Result(3, "out\n", "err\n")
    assert not r.ok


def test_a_string_runs_under_sh():
    r = agentrun.run("echo $((6 * 7)) | tr 4 X")
    assert r.exit_code == 0, r
    assert r.stdout == "X2\n"


def test_the_run_is_sandboxed():
    # The host's root is not writable in the sandbox (the default profile writes only
    # under /workspace and /tmp).
    r = agentrun.run(["sh", "-c", "echo x > /etc/agentrun-pytest-evil"])
    assert r.exit_code != 0
    assert not os.path.exists("/etc/agentrun-pytest-evil")


def test_the_callers_own_files_outside_the_mounts_stay_untouched(tmp_path):
    # What the caller may write on the host (as root, anything; as a user, its own files) is
    # not writable from the sandbox unless mounted: /etc above proves little for a user.
    target = tmp_path / "evil"
    # (The sandbox may make that path in its own /tmp: the host's must stay as it was.)
    r = agentrun.run(["sh", "-c", f"mkdir -p {tmp_path} && echo x > {target}"])
    assert not target.exists(), r
    assert list(tmp_path.iterdir()) == [], r


def test_env_is_set_in_the_sandbox():
    r = agentrun.run(["sh", "-c", 'printf "%s|%s" "$GREETING" "$OTHER"'],
                     env={"GREETING": "hello world", "OTHER": "a=b"})
    assert r.stdout == "hello world|a=b", r


def test_workspace_is_mounted_read_write(tmp_path):
    (tmp_path / "in.txt").write_text("from the host\n")
    r = agentrun.run(["sh", "-c", "cat in.txt; pwd; echo from the sandbox > out.txt"],
                     workspace=tmp_path)
    assert r.exit_code == 0, r
    assert r.stdout == "from the host\n/workspace\n"
    assert (tmp_path / "out.txt").read_text() == "from the sandbox\n"


def test_readable_path_is_read_only(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    (d / "f").write_text("data\n")
    r = agentrun.run(["sh", "-c", f"cat {d}/f; echo y > {d}/g"], readable=[str(d)])
    assert r.stdout == "data\n", r
    assert r.exit_code != 0
    assert not (d / "g").exists()


def test_stdin_is_fed():
    r = agentrun.run(["python3", "-c", "import sys; print(sys.stdin.read().upper())"], stdin="abc")
    assert r.stdout == "ABC\n", r


def test_a_missing_command_is_a_result_127():
    r = agentrun.run(["no-such-command-xyz"])
    assert r.exit_code == 127, r
    assert "no-such-command-xyz" in r.stderr


def test_bad_profile_raises_sandbox_error_with_the_cli_line():
    with pytest.raises(agentrun.SandboxError) as e:
        agentrun.run(["true"], profile="no-such-profile")
    assert e.value.exit_code == 125
    assert "no-such-profile" in e.value.message
    assert "\n" not in e.value.message
    assert not e.value.message.startswith("agentrun:")


def test_policy_denial_raises_policy_denied(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(agentrun.PolicyDeniedError) as e:
        agentrun.run(["touch", str(marker)], profile="strict", env={"AWS_SECRET_ACCESS_KEY": "x"})
    assert e.value.exit_code == 126
    assert e.value.message.startswith("denied by policy: env.set AWS_SECRET_ACCESS_KEY"), e.value.message
    assert not marker.exists()


def test_bad_memory_raises_sandbox_error():
    with pytest.raises(agentrun.SandboxError) as e:
        agentrun.run(["true"], memory="lots")
    assert "lots" in e.value.message


def test_memory_limit_is_enforced():
    code = "b = bytearray(400 * 1024 * 1024); print('allocated')"
    r = agentrun.run(["python3", "-c", code], memory="64M")
    assert "allocated" not in r.stdout
    assert r.exit_code != 0
    # The same program runs without the limit.
    assert agentrun.run(["python3", "-c", code]).stdout == "allocated\n"


def test_missing_binary_raises(monkeypatch):
    with pytest.raises(agentrun.BinaryNotFoundError) as e:
        agentrun.run(["true"], binary="/nonexistent/agentrun")
    assert "/nonexistent/agentrun" in str(e.value)
    monkeypatch.setenv("AGENTRUN_BIN", "/nonexistent/agentrun2")
    with pytest.raises(agentrun.BinaryNotFoundError):
        agentrun.run(["true"])
    with pytest.raises(agentrun.AgentrunError):
        agentrun.Sandbox()


def test_timeout_kills_and_raises():
    t0 = time.monotonic()
    with pytest.raises(agentrun.TimeoutError) as e:
        agentrun.run("echo before; exec sleep 60", timeout=1)
    took = time.monotonic() - t0
    assert took < 10, took
    assert e.value.timeout == 1
    assert e.value.message == "timed out after 1s", e.value.message
    assert e.value.stdout == "before\n"


def test_a_run_within_its_timeout_is_a_result():
    assert agentrun.run(["true"], timeout=30).exit_code == 0
    # Exiting 124 by itself is not a timeout.
    assert agentrun.run("exit 124", timeout=30).exit_code == 124


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError):
        agentrun.run(["true"], timeout=0)
    with pytest.raises(ValueError):
        agentrun.run([])
    with pytest.raises(ValueError):
        agentrun.run(["true"], env={"A=B": "x"})


def test_sandbox_files_persist_across_runs():
    with agentrun.Sandbox() as sb:
        ws = sb.workspace
        sb.write("data.txt", "1\n2\n3\n")
        r = sb.run(["python3", "-c", "print(sum(int(l) for l in open('data.txt')))"])
        assert r.stdout == "6\n", r
        sb.run("echo made > made.txt")
        assert sb.read("made.txt") == "made\n"
        assert sb.read_bytes("data.txt") == b"1\n2\n3\n"
        with pytest.raises(agentrun.AgentrunError) as e:
            sb.read("missing.txt")
        assert "missing.txt" in str(e.value)
        assert ws.is_dir()
    assert not ws.exists(), "close() removes the workspace it made"
    with pytest.raises(agentrun.AgentrunError):
        sb.run(["true"])


def test_sandbox_read_does_not_follow_a_planted_symlink_to_the_host(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    with agentrun.Sandbox() as sb:
        sb.run(["ln", "-s", str(secret), "link"])
        assert os.path.islink(sb.workspace / "link")
        try:
            got = sb.read("link")
        except agentrun.AgentrunError as e:
            got = str(e)
        assert "host secret" not in got


def test_sandbox_settings_apply_to_every_run(tmp_path):
    with agentrun.Sandbox(env={"A": "1"}, timeout=1) as sb:
        assert sb.run(["sh", "-c", "echo $A$B"], env={"B": "2"}).stdout == "12\n"
        with pytest.raises(agentrun.TimeoutError):
            sb.run(["sleep", "60"])
        assert sb.run(["sleep", "2"], timeout=30).exit_code == 0


def test_sandbox_given_a_workspace_keeps_it(tmp_path):
    with agentrun.Sandbox(workspace=tmp_path) as sb:
        sb.write("kept.txt", "k")
    assert (tmp_path / "kept.txt").read_text() == "k"


def test_sandbox_goes_through_the_daemon_when_one_answers(daemon):
    before = daemon.served()
    with agentrun.Sandbox() as sb:
        sb.write("x.py", "print('warm', 1 + 1)")
        assert sb.run(["python3", "x.py"]).stdout == "warm 2\n"
        assert sb.read("x.py") == "print('warm', 1 + 1)"
    assert daemon.served() >= before + 3, daemon.logs()


def test_an_interrupted_run_leaves_nothing_running():
    import subprocess
    import sys

    script = (
        "import os, signal, threading, agentrun\n"
        "threading.Timer(2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "try:\n"
        "    agentrun.run(['sleep', '987.25'])\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.stdout == "interrupted\n", p
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", "sleep 987.25"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the sandboxed sleep outlived the interrupted run"
        time.sleep(0.1)
