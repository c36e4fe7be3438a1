"""Fixtures of the agentrun package's tests.

Every test runs the real `agentrun` binary (found as the package finds it: AGENTRUN_BIN, the
wheel's script, PATH) with a private state directory, so runs are one-run sandboxes (cold)
unless a test starts its own daemon (`daemon`). With AGENTRUN_PYTEST_WARM=1 every run goes
through one daemon started for the session (warm). With AGENTRUN_PYTEST_WARM=external every
run goes through the daemon already answering where the binary finds one by default (no
AGENTRUN_STATE_DIR: e.g. a rootless user's `$XDG_RUNTIME_DIR/agentrun`), started and stopped
by the caller (hack/wheel-test); AGENTRUN_PYTEST_WARM_LOG names its log for failure messages.
Both warm modes check at the end that the daemon served the runs. Nothing is mocked: a host that cannot make sandboxes
fails these tests, it does not skip them.
"""

import json
import os
import subprocess
import tempfile
import time

import pytest

import agentrun


WARM = os.environ.get("AGENTRUN_PYTEST_WARM") in ("1", "external")
EXTERNAL = os.environ.get("AGENTRUN_PYTEST_WARM") == "external"


@pytest.fixture(scope="session")
def warm_daemon():
    """With AGENTRUN_PYTEST_WARM=1: one `agentrun serve` for the whole session, which every
    run goes through (checked at the end: it must have served the runs)."""
    if not WARM:
        yield None
        return
    if EXTERNAL:
        old = os.environ.pop("AGENTRUN_STATE_DIR", None)
        daemon = ExternalDaemon(agentrun.find_binary())
        yield daemon
        served = daemon.served() - daemon.before
        if old is not None:
            os.environ["AGENTRUN_STATE_DIR"] = old
        assert served >= daemon.tests, f"the daemon served {served} runs for {daemon.tests} tests"
        return
    d = tempfile.mkdtemp(prefix="agentrun-pytest-warm-")
    os.chmod(d, 0o700)
    old = os.environ.get("AGENTRUN_STATE_DIR")
    os.environ["AGENTRUN_STATE_DIR"] = d
    daemon = Daemon(agentrun.find_binary(), d)
    yield daemon
    served = daemon.served()
    daemon.stop()
    if old is None:
        os.environ.pop("AGENTRUN_STATE_DIR", None)
    else:
        os.environ["AGENTRUN_STATE_DIR"] = old
    subprocess.run(["rm", "-rf", "--one-file-system", d], check=False)
    assert served >= daemon.tests, f"the warm daemon served {served} runs for {daemon.tests} tests"


@pytest.fixture(autouse=True)
def state_dir(monkeypatch, warm_daemon):
    """A private AGENTRUN_STATE_DIR per test (no daemon answers there unless started); the
    session daemon's with AGENTRUN_PYTEST_WARM=1."""
    if warm_daemon is not None:
        warm_daemon.tests += 1
        if warm_daemon.state is None:
            monkeypatch.delenv("AGENTRUN_STATE_DIR", raising=False)
            yield None
            return
        monkeypatch.setenv("AGENTRUN_STATE_DIR", warm_daemon.state)
        yield warm_daemon.state
        return
    d = tempfile.mkdtemp(prefix="agentrun-pytest-")
    os.chmod(d, 0o700)
    monkeypatch.setenv("AGENTRUN_STATE_DIR", d)
    yield d
    subprocess.run(["rm", "-rf", "--one-file-system", d], check=False)


@pytest.fixture
def binary():
    return agentrun.find_binary()


class Daemon:
    def __init__(self, binary, state):
        self.binary = binary
        self.state = state
        self.tests = 0
        self.log = open(os.path.join(state, "serve.log"), "wb")
        self.proc = subprocess.Popen([binary, "serve", "--pool-size", "1"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"agentrun serve exited {self.proc.returncode}: {self.logs()}")
            if subprocess.run([binary, "pool", "status", "--json"], capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"agentrun serve did not answer in 60 s: {self.logs()}")

    def logs(self):
        with open(os.path.join(self.state, "serve.log"), "rb") as f:
            return f.read().decode(errors="replace")

    def served(self):
        """Runs the daemon served (pool hits + misses + unpooled)."""
        out = subprocess.run([self.binary, "pool", "status", "--json"], capture_output=True, check=True)
        s = json.loads(out.stdout)
        return sum(p.get("hits", 0) + p.get("misses", 0) for p in s.get("pools", [])) + s.get("unpooled", 0)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class ExternalDaemon(Daemon):
    """The daemon answering at the binary's default state dir, run by the caller: it must
    answer now; it is not stopped here."""

    def __init__(self, binary):
        self.binary = binary
        self.state = None
        self.tests = 0
        self.before = self.served()

    def logs(self):
        log = os.environ.get("AGENTRUN_PYTEST_WARM_LOG")
        if not log:
            return "(no AGENTRUN_PYTEST_WARM_LOG)"
        with open(log, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        pass


@pytest.fixture
def daemon(binary, state_dir, warm_daemon):
    if warm_daemon is not None:
        yield warm_daemon
        return
    d = Daemon(binary, state_dir)
    yield d
    d.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped test is a failed one here: no skip counts as a pass."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped:
        rep.outcome = "failed"
        rep.longrepr = f"skipped, which these tests never may: {rep.longrepr}"
