#!/usr/bin/env python3
"""Times CrewAI's CodeInterpreterTool.run('print(1)') against a Docker API socket, and within
it each HTTP request docker-py sends and the tool's `docker info` subprocess (issue 30):
  cit_breakdown.py SOCKET [RUNS]
with hack/test's .venv/test python (crewai-tools, docker-py); the daemon must serve the image
`code-interpreter:latest` (hack/bench.d/matrix.sh makes it). Prints the p50 of the whole call
and of each part (n/run: how often the part comes in one call), after 2 warm-up calls."""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sock = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 20
os.environ["DOCKER_HOST"] = "unix://" + sock
for k, v in (("CREWAI_DISABLE_TELEMETRY", "true"), ("CREWAI_TRACING_ENABLED", "false"),
             ("OTEL_SDK_DISABLED", "true")):
    os.environ[k] = v
os.chdir(tempfile.mkdtemp(prefix="cit-"))

import requests.adapters  # noqa: E402

log = []
_send = requests.adapters.HTTPAdapter.send
_run = subprocess.run


def send(self, req, *a, **kw):
    t = time.perf_counter()
    r = _send(self, req, *a, **kw)
    path = re.sub(r"/v1\.\d+", "", req.path_url.split("?")[0])
    path = re.sub(r"[0-9a-f]{12,}", "{id}", path)
    log.append((req.method + " " + path, (time.perf_counter() - t) * 1e3))
    return r


def run(argv, *a, **kw):
    t = time.perf_counter()
    r = _run(argv, *a, **kw)
    log.append(("subprocess " + " ".join(argv), (time.perf_counter() - t) * 1e3))
    return r


def timed(owner, name, label):
    """Wraps owner.name to log its whole time as `label` (it contains requests logged too)."""
    inner = getattr(owner, name)

    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            log.append((label, (time.perf_counter() - t) * 1e3))
    setattr(owner, name, wrapper)


requests.adapters.HTTPAdapter.send = send
subprocess.run = run
import docker  # noqa: E402
import docker.models.containers  # noqa: E402

timed(docker.models.containers.Container, "exec_run", "(whole) Container.exec_run")
from crewai_tools import CodeInterpreterTool  # noqa: E402
import crewai_tools.tools.code_interpreter_tool.code_interpreter_tool as cit  # noqa: E402

timed(cit, "docker_from_env", "(whole) docker.from_env")

tool = CodeInterpreterTool(unsafe_mode=False)
total, parts = [], {}
for i in range(runs + 2):
    log.clear()
    t = time.perf_counter()
    out = tool.run(code="print(1)", libraries_used=[])
    dt = (time.perf_counter() - t) * 1e3
    assert out.strip() == "1", out
    if i >= 2:
        total.append(dt)
        for k, v in log:
            parts.setdefault(k, []).append(v)
print("total p50 %.1f ms" % statistics.median(total))
acc = 0.0
for k, v in parts.items():
    if not k.startswith("(whole)"):
        acc += statistics.median(v) * len(v) / len(total)
    print("  %-50s n/run %.0f p50 %.2f ms" % (k, len(v) / len(total), statistics.median(v)))
print("  sum of parts (without the wholes) %.1f ms (the rest: the tool's own Python)" % acc)
