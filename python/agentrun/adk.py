"""A Google ADK tool over `agentrun.run`: `python_tool(...)` returns a `FunctionTool` named
`run_python` that runs its `code` argument in a fresh sandbox and returns
`{"output": text}`. Needs `google-adk` (pip install agentrun[adk])."""

from __future__ import annotations

from typing import Any, Dict

from google.adk.tools import FunctionTool

from ._tools import CodeSettings, run_code

__all__ = ["python_tool"]


def python_tool(**settings: Any) -> FunctionTool:
    """A `run_python(code)` tool; `settings` are `CodeSettings` fields (profile, image,
    workspace, readable_paths, writable_paths, allow_hosts, memory, timeout)."""
    s = CodeSettings(**settings)

    def run_python(code: str) -> Dict[str, str]:
        """Run Python 3 code in a sandbox and return what it printed. Always print the result."""
        return {"output": run_code(code, s)}

    return FunctionTool(run_python)
