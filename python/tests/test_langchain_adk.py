"""agentrun.langchain and agentrun.adk: each tool runs its code in a sandbox. Needs
langchain-core and google-adk (hack/test runs this file in .venv/mcp)."""

import asyncio

from agentrun.adk import python_tool as adk_tool
from agentrun.langchain import python_tool as langchain_tool


def test_langchain_tool_runs_code():
    tool = langchain_tool(timeout=30)
    assert tool.name == "run_python"
    assert tool.invoke({"code": "print(sum(range(10)))"}) == "45\n"
    denied = tool.invoke({"code": "open('/etc/agentrun-lc-evil', 'w')"})
    assert denied.startswith("Something went wrong while running the code"), denied


def test_adk_tool_runs_code():
    tool = adk_tool(timeout=30)
    assert tool.name == "run_python"
    decl = tool._get_declaration()
    assert decl.name == "run_python" and "code" in str(decl), decl
    got = asyncio.run(tool.run_async(args={"code": "print(2 ** 10)"}, tool_context=None))
    assert got == {"output": "1024\n"}
