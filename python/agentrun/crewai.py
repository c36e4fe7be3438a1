"""A CrewAI tool: `AgentrunCodeInterpreterTool`, a drop-in for crewai-tools'
`CodeInterpreterTool` that runs the agent's code in an agentrun sandbox instead of Docker.

Same name, description, arguments (`code`, `libraries_used`) and output text as
CodeInterpreterTool; the sandbox is configured with the shape of the sandlock proposal's
`execution_backend` for CrewAI: `readable_paths`, `writable_paths`, `memory`, plus agentrun's
`profile`, `image`, `workspace`, `allow_hosts` and `timeout`.

`libraries_used` is not pip-installed (the sandbox has no network unless `allow_hosts` says
so): the libraries must be in the image (the `code-interpreter` profile with the `host` image
uses the host's Python and its packages).

Needs `crewai` (pip install agentrun[crewai]).
"""

from __future__ import annotations

from typing import Any, List, Optional, Type, Union

from crewai.tools import BaseTool
from pydantic import BaseModel, Field

from ._tools import CodeSettings, run_code

__all__ = ["AgentrunCodeInterpreterTool", "CodeInterpreterSchema"]


class CodeInterpreterSchema(BaseModel):
    """The tool's input, as CodeInterpreterTool's."""

    code: str = Field(
        ...,
        description="Python3 code used to be interpreted in the sandbox. ALWAYS PRINT the final result and the output of the code",
    )
    libraries_used: List[str] = Field(
        default_factory=list,
        description="List of libraries used in the code with proper installing names separated by commas. Example: numpy,pandas,beautifulsoup4",
    )


class AgentrunCodeInterpreterTool(BaseTool):
    """Runs Python3 code in an agentrun sandbox (a fresh one per call)."""

    name: str = "Code Interpreter"
    description: str = "Interprets Python3 code strings with a final print statement."
    args_schema: Type[BaseModel] = CodeInterpreterSchema
    code: Optional[str] = None
    image: Optional[str] = None
    profile: Optional[str] = "code-interpreter"
    workspace: Optional[str] = None
    readable_paths: List[str] = Field(default_factory=list)
    writable_paths: List[str] = Field(default_factory=list)
    allow_hosts: List[str] = Field(default_factory=list)
    memory: Union[str, int, None] = None
    timeout: Optional[float] = 60.0

    def _run(self, **kwargs: Any) -> str:
        code = kwargs.get("code", self.code)
        if not code:
            return "No code provided to execute."
        return run_code(
            code,
            CodeSettings(
                image=self.image,
                profile=self.profile,
                workspace=self.workspace,
                readable_paths=list(self.readable_paths),
                writable_paths=list(self.writable_paths),
                allow_hosts=list(self.allow_hosts),
                memory=self.memory,
                timeout=self.timeout,
            ),
        )
