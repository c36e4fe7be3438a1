"""agentrun: run untrusted, AI-generated code in kernel-enforced sandboxes, from Python.

The package drives the `agentrun` binary that its wheel installs on PATH:

    >>> import agentrun
    >>> agentrun.run(["python3", "-c", "print(6 * 7)"]).stdout
    '42\\n'

- `run(cmd, ...)`: one command in a fresh sandbox, a `Result(exit_code, stdout, stderr)`.
- `Sandbox(...)`: runs, file writes and reads that share a workspace directory.
- Errors: `AgentrunError` and its subclasses `BinaryNotFoundError`, `SandboxError`,
  `PolicyDeniedError`, `TimeoutError`.
- Framework tools: `agentrun.crewai` (a CodeInterpreterTool drop-in), `agentrun.langchain`,
  `agentrun.adk` (each imports its framework only when imported).
"""

from ._core import (
    AgentrunError,
    BinaryNotFoundError,
    PolicyDeniedError,
    Result,
    Sandbox,
    SandboxError,
    TimeoutError,
    find_binary,
    run,
)

try:
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("agentrun")
    except PackageNotFoundError:  # run from a source tree
        __version__ = "0+unknown"
except ImportError:  # pragma: no cover
    __version__ = "0+unknown"

__all__ = [
    "AgentrunError",
    "BinaryNotFoundError",
    "PolicyDeniedError",
    "Result",
    "Sandbox",
    "SandboxError",
    "TimeoutError",
    "find_binary",
    "run",
    "__version__",
]
