"""What the framework tools share: running a Python snippet with the tool's settings and
rendering the result as the text an LLM reads. The framework modules (crewai, langchain,
adk) are thin wrappers over `run_code`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union

from ._core import AgentrunError, StrPath, TimeoutError, run


@dataclass
class CodeSettings:
    """The sandbox a tool runs code in (each field maps to `agentrun.run`'s keyword)."""

    image: Optional[str] = None
    profile: Optional[StrPath] = None
    workspace: Optional[StrPath] = None
    readable_paths: List[StrPath] = field(default_factory=list)
    writable_paths: List[StrPath] = field(default_factory=list)
    allow_hosts: List[str] = field(default_factory=list)
    memory: Union[str, int, None] = None
    timeout: Optional[float] = 60.0
    python: str = "python3"


def run_code(code: str, s: CodeSettings) -> str:
    """Runs `python3 -c code` in a fresh sandbox; the text an agent sees: the output on
    success, else the error (CodeInterpreterTool's wording, so prompts written for it work)."""
    try:
        r = run(
            [s.python, "-c", code],
            image=s.image,
            profile=s.profile,
            workspace=s.workspace,
            readable=s.readable_paths,
            writable=s.writable_paths,
            allow_hosts=s.allow_hosts or None,
            memory=s.memory,
            timeout=s.timeout,
        )
    except TimeoutError as e:
        return f"Something went wrong while running the code: \ntimed out after {e.timeout:g}s\n{e.stdout}{e.stderr}"
    except AgentrunError as e:
        return f"Something went wrong while running the code: \nagentrun: {e.message}"
    if r.exit_code != 0:
        return f"Something went wrong while running the code: \n{r.stdout}{r.stderr}"
    return r.stdout
