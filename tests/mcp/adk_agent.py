"""Google ADK as a client of `agentrun mcp` (stdio): an LlmAgent with an MCPToolset
(StdioConnectionParams), run through a Runner with an InMemorySessionService. The model is a
scripted BaseLlm (no LLM): it answers each turn with the next function_call of its script,
then a final text. The scenarios assert the function_response events the Runner yields.

Usage: adk_agent.py SCENARIO (see common.py for the environment).
"""

import json

import anyio
from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.mcp_tool import McpToolset, StdioConnectionParams
from google.genai import types as gt
from mcp import types

import sdk_client
from common import (
    NET_CODE,
    WRITE_OUTSIDE_CODE,
    check,
    check_net_denied,
    check_write_outside_denied,
    eq,
    find_denial,
    main,
    stdio_params,
)


class ScriptedLlm(BaseLlm):
    """Calls the tools of `script` in order (one per turn), then says "done"."""

    model: str = "scripted"
    script: list = []

    @classmethod
    def supported_models(cls):
        return [r"scripted"]

    async def generate_content_async(self, llm_request, stream=False):
        answered = sum(
            1 for c in llm_request.contents for p in (c.parts or []) if p.function_response is not None
        )
        if answered < len(self.script):
            name, args = self.script[answered]
            part = gt.Part(function_call=gt.FunctionCall(name=name, args=args, id=f"call_{answered}"))
        else:
            part = gt.Part(text="done")
        yield LlmResponse(content=gt.Content(role="model", parts=[part]))


async def run_agent(script, elicitation_callback=None):
    """Runs the agent; returns the function responses' payloads in order."""
    toolset = McpToolset(
        connection_params=StdioConnectionParams(server_params=stdio_params(), timeout=120),
        elicitation_callback=elicitation_callback,
    )
    try:
        tools = await toolset.get_tools()
        eq({t.name for t in tools}, sdk_client.TOOLS, "tools listed")
        agent = LlmAgent(
            name="coder",
            model=ScriptedLlm(script=script),
            instruction="Use the sandbox.",
            tools=[toolset],
        )
        sessions = InMemorySessionService()
        runner = Runner(agent=agent, app_name="agentrun-mcp-test", session_service=sessions)
        session = await sessions.create_session(app_name="agentrun-mcp-test", user_id="u")
        responses, final = [], None
        async for ev in runner.run_async(
            user_id="u",
            session_id=session.id,
            new_message=gt.Content(role="user", parts=[gt.Part(text="go")]),
        ):
            for fr in ev.get_function_responses():
                responses.append((fr.name, fr.response))
            if ev.is_final_response() and ev.content and ev.content.parts:
                final = "".join(p.text or "" for p in ev.content.parts)
        eq(final, "done", "the agent's final answer")
        eq([n for n, _ in responses], [n for n, _ in script], "a function response per call")
        return [r for _, r in responses]
    finally:
        await toolset.close()


def payload(resp):
    """(isError, the tool's JSON object) of a function response (a CallToolResult dump)."""
    sc = resp.get("structuredContent", resp.get("structured_content"))
    content = resp.get("content") or []
    text = "".join(c.get("text", "") for c in content if isinstance(c, dict))
    is_error = bool(resp.get("isError") or resp.get("is_error"))
    if sc is not None:
        return is_error, sc, text
    return is_error, json.loads(text), text


async def runs():
    r = await run_agent([
        ("run_python", {"code": "import platform\nv = 40 + 2\nprint('adk', v)"}),
        ("run_python", {"code": "print(v * 2)"}),
        ("run_shell", {"command": "echo from-shell; exit 5"}),
    ])
    err, o, _ = payload(r[0])
    check(not err, "not an error", r[0])
    eq(o["stdout"], "adk 42\n", "the code's output in the function response")
    eq(payload(r[1])[1]["stdout"], "84\n", "globals persist in the session")
    o = payload(r[2])[1]
    eq((o["stdout"], o["exit_code"]), ("from-shell\n", 5), "run_shell")


async def denials():
    r = await run_agent([
        ("run_python", {"code": WRITE_OUTSIDE_CODE}),
        ("run_python", {"code": NET_CODE}),
        ("write_file", {"path": "/etc/agentrun-mcp-evil", "content": "x"}),
    ])
    check_write_outside_denied(payload(r[0])[1])
    check_net_denied(payload(r[1])[1])
    err, o, text = payload(r[2])
    check(err, "a denied write_file is an error", r[2])
    eq(o.get("error"), "denied", "error kind")
    check(text.startswith("denied:") and "writes are allowed only under" in text, "the denial text", text)


async def escalate(answer, allowed):
    port = sdk_client.escalation_profile()
    cb, asked = sdk_client.elicitation(answer)
    r = await run_agent([("run_python", {"code": sdk_client.ESC_CODE.format(port=port)})], cb)
    sdk_client.check_question(asked, port)
    o = payload(r[0])[1]
    if allowed:
        eq(o["stdout"], "GOT upstream says hi\n", "the approved call went through")
    else:
        check("REFUSED" in o["stdout"], "refused", o)
        find_denial(o, "net.connect", f"127.0.0.1:{port}")


if __name__ == "__main__":
    main({
        "runs": lambda: anyio.run(runs),
        "denials": lambda: anyio.run(denials),
        "escalate_yes": lambda: anyio.run(escalate, types.ElicitResult(action="accept", content={"approve": True}), True),
        "escalate_no": lambda: anyio.run(escalate, types.ElicitResult(action="accept", content={"approve": False}), False),
    })
