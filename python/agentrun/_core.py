"""The package's whole contact with agentrun: it runs the `agentrun` binary's `exec` command.

This module owns finding the binary, turning keyword arguments into `agentrun exec` flags,
running it, and turning its exit code and its one-line `agentrun: ...` message into a
`Result` or a typed exception. Nothing here assumes root: the binary decides how it sandboxes
(through the daemon whose socket it finds, or a one-run sandbox when none answers).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "AgentrunError",
    "BinaryNotFoundError",
    "SandboxError",
    "PolicyDeniedError",
    "TimeoutError",
    "Result",
    "Sandbox",
    "find_binary",
    "run",
]

StrPath = Union[str, "os.PathLike[str]"]
Command = Union[str, Sequence[StrPath]]

# Exit codes of `agentrun exec` (DESIGN.md, Conventions).
EXIT_TIMED_OUT = 124
EXIT_AGENTRUN_FAILED = 125
EXIT_DENIED = 126

# How long past its own `--timeout` the binary gets before this process kills it.
_BACKSTOP_GRACE = 15.0


class AgentrunError(Exception):
    """Base of every error this package raises.

    `message` is agentrun's own one-line message (the `agentrun: ` prefix removed) when the
    binary gave one; `exit_code`, `stdout` and `stderr` are those of the failed run (`None`
    when the binary did not run).
    """

    def __init__(
        self,
        message: str,
        *,
        exit_code: Optional[int] = None,
        stdout: str = "",
        stderr: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


class BinaryNotFoundError(AgentrunError):
    """No `agentrun` binary: not installed with this package, not on PATH, or `AGENTRUN_BIN`
    names a file that is not there."""


class SandboxError(AgentrunError):
    """agentrun could not run the command (exit 125): bad input such as an unknown profile or
    image, a bad size or duration, or the host lacks what a sandbox needs. The message is the
    CLI's one line."""


class PolicyDeniedError(AgentrunError):
    """The profile's policy refused the request before anything ran (exit 126 with agentrun's
    `denied` line)."""


class TimeoutError(AgentrunError):  # noqa: A001 (agentrun.TimeoutError, as subprocess has its own)
    """The run outlived its `timeout` and was killed. `stdout`/`stderr` hold what it wrote
    before."""

    def __init__(self, message: str, *, timeout: float, stdout: str = "", stderr: str = "",
                 exit_code: Optional[int] = None) -> None:
        super().__init__(message, exit_code=exit_code, stdout=stdout, stderr=stderr)
        self.timeout = timeout


@dataclass(frozen=True)
class Result:
    """What a finished run gave: its exit code and its whole output, decoded as UTF-8
    (invalid bytes replaced)."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0


def find_binary(binary: Optional[StrPath] = None) -> str:
    """The path of the `agentrun` binary to run.

    In order: `binary` if given; `$AGENTRUN_BIN`; the one this package's wheel installed
    beside the running interpreter (its scripts directory); the first `agentrun` on `PATH`.
    Raises `BinaryNotFoundError` when none is an executable file.
    """
    if binary is not None or os.environ.get("AGENTRUN_BIN"):
        path = os.fspath(binary) if binary is not None else os.environ["AGENTRUN_BIN"]
        where = "binary=" if binary is not None else "AGENTRUN_BIN="
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise BinaryNotFoundError(f"agentrun binary not found: {where}{path} is not an executable file")
    candidates = []
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.append(os.path.join(scripts, "agentrun"))
    candidates.append(os.path.join(os.path.dirname(sys.executable), "agentrun"))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    found = shutil.which("agentrun")
    if found:
        return found
    raise BinaryNotFoundError(
        "agentrun binary not found: install the agentrun wheel (pip install agentrun), put "
        "agentrun on PATH, or set AGENTRUN_BIN"
    )


def _seconds(timeout: Optional[float]) -> Optional[float]:
    if timeout is None:
        return None
    t = float(timeout)
    if not t > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return t


def _argv(
    binary: str,
    cmd: Command,
    *,
    image: Optional[str],
    profile: Optional[StrPath],
    workspace: Optional[StrPath],
    allow_hosts: Union[str, Iterable[str], None],
    memory: Union[str, int, None],
    timeout: Optional[float],
    env: Optional[Mapping[str, str]],
    readable: Iterable[StrPath],
    writable: Iterable[StrPath],
    workdir: Optional[str],
    no_daemon: bool,
) -> List[str]:
    argv: List[str] = [binary, "exec", "--no-prompt"]
    if image is not None:
        argv += ["--image", image]
    if profile is not None:
        argv += ["--profile", os.fspath(profile)]
    if workspace is not None:
        argv += ["--workspace", os.fspath(workspace)]
    if allow_hosts is not None:
        hosts = [allow_hosts] if isinstance(allow_hosts, str) else list(allow_hosts)
        for h in hosts:
            argv += ["--allow-host", h]
    if memory is not None:
        if isinstance(memory, bool) or (isinstance(memory, int) and memory <= 0):
            raise ValueError(f"memory must be a positive byte count or a size like '512M', got {memory!r}")
        argv += ["--memory", str(memory)]
    if timeout is not None:
        argv += ["--timeout", f"{timeout}"]
    for key, value in (env or {}).items():
        if not key or "=" in key:
            raise ValueError(f"environment variable name {key!r} is empty or has '='")
        argv += ["--env", f"{key}={value}"]
    for p in readable:
        argv += ["--ro", os.fspath(p)]
    for p in writable:
        argv += ["--rw", os.fspath(p)]
    if workdir is not None:
        argv += ["--cwd", workdir]
    if no_daemon:
        argv.append("--no-daemon")
    argv.append("--")
    if isinstance(cmd, str):
        argv += ["/bin/sh", "-c", cmd]
    else:
        parts = [os.fspath(c) for c in cmd]
        if not parts:
            raise ValueError("empty command")
        argv += parts
    return argv


def _agentrun_line(stderr: str) -> Optional[str]:
    """agentrun's own last `agentrun: ...` line of stderr, without the prefix."""
    for line in reversed(stderr.splitlines()):
        if line.startswith("agentrun: ") and not line.startswith("agentrun: warning: "):
            return line[len("agentrun: "):]
    return None


def _decode(b: Optional[bytes]) -> str:
    return (b or b"").decode("utf-8", errors="replace")


def _stop(proc: "subprocess.Popen[bytes]") -> Tuple[bytes, bytes]:
    """Stops the binary: SIGTERM first (it forwards it to the sandboxed command and tears the
    sandbox down), SIGKILL after 5 s. Returns what it wrote."""
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        proc.kill()
        out, err = proc.communicate()
    return out or b"", err or b""


def _exec_raw(argv: List[str], *, stdin: Union[bytes, str, None],
              timeout: Optional[float]) -> Tuple[int, bytes, str]:
    """Runs the binary; returns (exit code, stdout bytes, stderr text). Raises
    `TimeoutError` when the run outlived `timeout`, `SandboxError`/`PolicyDeniedError` on
    agentrun's own failures."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except FileNotFoundError as e:
        raise BinaryNotFoundError(f"agentrun binary not found: {argv[0]}: {e.strerror}") from None
    except PermissionError as e:
        raise BinaryNotFoundError(f"agentrun binary not executable: {argv[0]}: {e.strerror}") from None
    backstop = None if timeout is None else timeout + _BACKSTOP_GRACE
    try:
        out, err = proc.communicate(data, timeout=backstop)
    except subprocess.TimeoutExpired:
        # The binary did not end at its own --timeout.
        out, err = _stop(proc)
        assert timeout is not None
        raise TimeoutError(
            f"timed out after {timeout:g}s (agentrun did not stop it; killed)",
            timeout=timeout,
            stdout=_decode(out),
            stderr=_decode(err),
        ) from None
    except BaseException:  # KeyboardInterrupt and the like: the run must not outlive us
        _stop(proc)
        raise
    stderr = _decode(err)
    code = proc.returncode
    if code < 0:  # the binary itself was killed by a signal
        code = 128 - code
    line = _agentrun_line(stderr)
    if code == EXIT_TIMED_OUT and timeout is not None and line is not None and line.startswith("timed out"):
        # agentrun's own "timed out after ..." line: a command exiting 124 by itself is a Result.
        raise TimeoutError(line, timeout=timeout, stdout=_decode(out), stderr=stderr, exit_code=code)
    if code == EXIT_AGENTRUN_FAILED and line is not None:
        raise SandboxError(line, exit_code=code, stdout=_decode(out), stderr=stderr)
    if code == EXIT_DENIED and line is not None:
        raise PolicyDeniedError(line, exit_code=code, stdout=_decode(out), stderr=stderr)
    return code, out or b"", stderr


def _exec(argv: List[str], *, stdin: Union[bytes, str, None], timeout: Optional[float]) -> Result:
    code, out, err = _exec_raw(argv, stdin=stdin, timeout=timeout)
    return Result(code, _decode(out), err)


def run(
    cmd: Command,
    *,
    image: Optional[str] = None,
    profile: Optional[StrPath] = None,
    workspace: Optional[StrPath] = None,
    allow_hosts: Union[str, Iterable[str], None] = None,
    memory: Union[str, int, None] = None,
    timeout: Optional[float] = None,
    env: Optional[Mapping[str, str]] = None,
    readable: Iterable[StrPath] = (),
    writable: Iterable[StrPath] = (),
    workdir: Optional[str] = None,
    stdin: Union[bytes, str, None] = None,
    no_daemon: bool = False,
    binary: Optional[StrPath] = None,
) -> Result:
    """Runs `cmd` in a fresh sandbox (`agentrun exec`) and returns its `Result`.

    `cmd` is an argv list, or a string run by `/bin/sh -c` inside the sandbox.

    Keyword arguments map to `agentrun exec` flags:

    - `image` (`--image`): `host` (default: the host's programs, read-only) or an image
      reference agentrun pulls.
    - `profile` (`--profile`): a built-in profile name (`default`, `strict`,
      `code-interpreter`, ...) or the path of a TOML profile.
    - `workspace` (`--workspace`): a host directory mounted read-write at `/workspace`.
    - `allow_hosts` (`--allow-host`, repeated): `HOST[:PORT]` or `*.DOMAIN[:PORT]` the egress
      proxy lets through, on top of the profile's rules.
    - `memory` (`--memory`): a byte count or a size such as `"512M"`.
    - `timeout` (`--timeout`): seconds; the sandbox is killed then and `TimeoutError` raised.
    - `env` (`--env KEY=VALUE`, repeated): variables set in the sandbox.
    - `readable` / `writable` (`--ro` / `--rw`): extra host paths (`HOST[:SANDBOX]`) mounted
      read-only / read-write.
    - `workdir` (`--cwd`), `no_daemon` (`--no-daemon`: a one-run sandbox even when a
      daemon answers), `stdin` (bytes or text fed to the command).

    `binary` picks the `agentrun` binary (see `find_binary`). The command's own non-zero exit
    is a `Result`, not an exception; agentrun's failures raise `SandboxError` (bad input,
    exit 125), `PolicyDeniedError` (exit 126) or `TimeoutError`.
    """
    t = _seconds(timeout)
    argv = _argv(
        find_binary(binary), cmd, image=image, profile=profile, workspace=workspace,
        allow_hosts=allow_hosts, memory=memory, timeout=t, env=env, readable=readable,
        writable=writable, workdir=workdir, no_daemon=no_daemon,
    )
    return _exec(argv, stdin=stdin, timeout=t)


class Sandbox:
    """A sandbox whose files last across runs: every `run`, `write` and `read` is one
    `agentrun exec` with the same settings and the same workspace directory mounted at
    `/workspace`.

    Each call is a fresh sandbox (a pooled one, through the daemon's local socket, when
    `agentrun serve` runs; a one-run sandbox otherwise): files under `/workspace` persist
    between calls, processes and anything written elsewhere do not. `write` and `read` run
    inside the sandbox too (`cat`), so the profile's rules apply to them and a symlink the
    sandboxed code planted cannot make this process touch a host file.

    Without `workspace`, a private temporary directory is made and removed by `close()`.
    Use it as a context manager::

        with agentrun.Sandbox(profile="code-interpreter") as sb:
            sb.write("data.csv", "a,b\\n1,2\\n")
            print(sb.run(["python3", "-c", "print(open('data.csv').read())"]).stdout)
    """

    def __init__(
        self,
        *,
        image: Optional[str] = None,
        profile: Optional[StrPath] = None,
        workspace: Optional[StrPath] = None,
        allow_hosts: Union[str, Iterable[str], None] = None,
        memory: Union[str, int, None] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        readable: Iterable[StrPath] = (),
        writable: Iterable[StrPath] = (),
        no_daemon: bool = False,
        binary: Optional[StrPath] = None,
    ) -> None:
        self._binary = find_binary(binary)
        self._owned: Optional[str] = None
        if workspace is None:
            # mkdtemp's mode is 0700: the sandbox's root is the directory's owner (root's
            # agentrun: an idmapped mount; a user's: the user itself), so nobody else needs in.
            self._owned = tempfile.mkdtemp(prefix="agentrun-sandbox-")
            workspace = self._owned
        self.workspace = Path(workspace)
        self._opts = dict(
            image=image, profile=profile, workspace=self.workspace,
            allow_hosts=None if allow_hosts is None else (
                [allow_hosts] if isinstance(allow_hosts, str) else list(allow_hosts)),
            memory=memory, env=dict(env or {}), readable=list(readable),
            writable=list(writable), no_daemon=no_daemon,
        )
        self._timeout = _seconds(timeout)
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise AgentrunError("the sandbox is closed")

    def run(
        self,
        cmd: Command,
        *,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[bytes, str, None] = None,
        workdir: Optional[str] = None,
    ) -> Result:
        """Runs `cmd` (argv list, or a string for `/bin/sh -c`) in the sandbox. `timeout`
        (default: the sandbox's) and `env` (added to the sandbox's) apply to this run."""
        self._check_open()
        t = _seconds(timeout) if timeout is not None else self._timeout
        merged = dict(self._opts["env"])  # type: ignore[arg-type]
        merged.update(env or {})
        opts = dict(self._opts)
        opts["env"] = merged
        argv = _argv(self._binary, cmd, timeout=t, workdir=workdir, **opts)  # type: ignore[arg-type]
        return _exec(argv, stdin=stdin, timeout=t)

    def run_python(self, code: str, *, timeout: Optional[float] = None) -> Result:
        """Runs `python3 -c code` in the sandbox."""
        return self.run(["python3", "-c", code], timeout=timeout)

    def write(self, path: str, data: Union[bytes, str]) -> None:
        """Writes `data` to `path` in the sandbox (relative paths are under `/workspace`).
        Only `/workspace` outlives the call. Raises `AgentrunError` with the sandbox's error
        when the write fails (a denied or missing directory)."""
        r = self.run(["/bin/sh", "-c", 'cat > "$1"', "agentrun-write", path], stdin=data)
        if r.exit_code != 0:
            raise AgentrunError(f"write {path}: {r.stderr.strip()}", exit_code=r.exit_code,
                                stdout=r.stdout, stderr=r.stderr)

    def read_bytes(self, path: str) -> bytes:
        """The bytes of `path` in the sandbox (relative paths are under `/workspace`).
        Raises `AgentrunError` with the sandbox's error when it cannot be read."""
        self._check_open()
        argv = _argv(self._binary, ["cat", "--", path], timeout=self._timeout, workdir=None,
                     **self._opts)  # type: ignore[arg-type]
        code, out, err = _exec_raw(argv, stdin=None, timeout=self._timeout)
        if code != 0:
            raise AgentrunError(f"read {path}: {err.strip()}", exit_code=code,
                                stdout=_decode(out), stderr=err)
        return out

    def read(self, path: str) -> str:
        """The text of `path` in the sandbox, decoded as UTF-8."""
        return self.read_bytes(path).decode("utf-8", errors="replace")

    def close(self) -> None:
        """Ends the sandbox: removes the workspace directory if this object made it.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owned is not None:
            shutil.rmtree(self._owned, ignore_errors=True)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
