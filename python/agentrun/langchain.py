"""A LangChain tool over `agentrun.run`: `python_tool(...)` returns a `StructuredTool`
named `run_python` that runs its `code` argument in a fresh sandbox and returns the output
(or the error) as text. Needs `langchain-core` (pip install agentrun[langchain])."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import StructuredTool

from ._tools import CodeSettings, run_code

__all__ = ["python_tool"]


def python_tool(**settings: Any) -> StructuredTool:
    """A `run_python(code)` tool; `settings` are `CodeSettings` fields (profile, image,
    workspace, readable_paths, writable_paths, allow_hosts, memory, timeout)."""
    s = CodeSettings(**settings)

    def run_python(code: str) -> str:
        """Run Python 3 code in a sandbox and return what it printed. Always print the result."""
        return run_code(code, s)

    return StructuredTool.from_function(run_python)
