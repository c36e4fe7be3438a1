"""LangGraph with langchain-mcp-adapters as a client of `agentrun mcp` (stdio).

A LangGraph graph (a chat model node, a prebuilt ToolNode, tools_condition) runs with a
scripted chat model (langchain_core's GenericFakeChatModel: no LLM) that emits AIMessage
tool_calls; the tools are agentrun's, loaded from an MCP session with `load_mcp_tools`. The
scenarios assert the ToolMessages the graph produced, as a model would read them.

Usage: langgraph_agent.py SCENARIO (see common.py for the environment).
"""

import json
import os

import anyio
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_mcp_adapters.callbacks import Callbacks
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
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
    server_command,
    server_env,
)


def client(on_elicitation=None):
    cmd, args = server_command()
    return MultiServerMCPClient(
        {"agentrun": {"transport": "stdio", "command": cmd, "args": args, "env": server_env()}},
        callbacks=Callbacks(on_elicitation=on_elicitation) if on_elicitation else None,
    )


def graph(tools, calls):
    """A graph whose scripted model makes `calls` (one tool call per turn), then answers."""
    turns = [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{i}", "type": "tool_call"}])
        for i, (name, args) in enumerate(calls)
    ] + [AIMessage(content="done")]
    model = GenericFakeChatModel(messages=iter(turns))

    def agent(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


async def run_agent(calls, on_elicitation=None):
    """Runs the graph; returns its ToolMessages in order."""
    c = client(on_elicitation)
    async with c.session("agentrun") as session:
        tools = await load_mcp_tools(session)
        eq({t.name for t in tools}, sdk_client.TOOLS, "tools loaded")
        app = graph(tools, calls)
        out = await app.ainvoke({"messages": [HumanMessage("use the sandbox")]})
    msgs = out["messages"]
    eq(msgs[-1].content, "done", "the model's final answer")
    tool_msgs = [m for m in msgs if isinstance(m, ToolMessage)]
    eq(len(tool_msgs), len(calls), "a ToolMessage per call")
    return tool_msgs


def obj_of(m: ToolMessage):
    """The tool's JSON object from a ToolMessage (its text; the artifact must agree)."""
    content = m.content
    if isinstance(content, list):
        content = "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
    obj = json.loads(content)
    art = m.artifact
    if art:
        sc = art.get("structured_content") if isinstance(art, dict) else getattr(art, "structured_content", None)
        if sc is not None:
            eq(sc, obj, "the artifact's structured content")
    return obj


def text(m: ToolMessage):
    c = m.content
    return c if isinstance(c, str) else "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in c)


async def runs():
    msgs = await run_agent([
        ("run_python", {"code": "x = 6 * 7\nprint('the answer is', x)"}),
        ("run_python", {"code": "print(x + 1)"}),
        ("write_file", {"path": "report.md", "content": "# hi\n"}),
        ("read_file", {"path": "/workspace/report.md"}),
    ])
    o = obj_of(msgs[0])
    eq(o["stdout"], "the answer is 42\n", "run_python output in the ToolMessage")
    eq(o["exit_code"], 0, "exit_code")
    eq(msgs[0].name, "run_python", "ToolMessage name")
    eq(msgs[0].tool_call_id, "call_0", "ToolMessage tool_call_id")
    eq(obj_of(msgs[1])["stdout"], "43\n", "globals persist in the session")
    eq(obj_of(msgs[2])["path"], "/workspace/report.md", "write_file")
    eq(obj_of(msgs[3])["content"], "# hi\n", "read_file")


async def denials():
    msgs = await run_agent([
        ("run_python", {"code": WRITE_OUTSIDE_CODE}),
        ("run_python", {"code": NET_CODE}),
        ("write_file", {"path": "/etc/agentrun-mcp-evil", "content": "x"}),
    ])
    check_write_outside_denied(obj_of(msgs[0]))
    check_net_denied(obj_of(msgs[1]))
    # A denied file tool: the model gets the error text (the adapter's handle_tool_errors).
    t = text(msgs[2])
    eq(msgs[2].status, "error", "the ToolMessage status")
    check(t.startswith("denied:") and "writes are allowed only under" in t, "the denial text", t)


async def escalate(answer, allowed):
    port = sdk_client.escalation_profile()
    asked = []

    async def on_elicitation(mcp_context, params, context):
        asked.append(params)
        return answer

    msgs = await run_agent([("run_python", {"code": sdk_client.ESC_CODE.format(port=port)})], on_elicitation)
    sdk_client.check_question(asked, port)
    o = obj_of(msgs[0])
    if allowed:
        eq(o["stdout"], "GOT upstream says hi\n", "the approved call went through")
    else:
        check("REFUSED" in o["stdout"], "refused", o)
        find_denial(o, "net.connect", f"127.0.0.1:{port}")


def escalate_yes():
    anyio.run(escalate, types.ElicitResult(action="accept", content={"approve": True}), True)


def escalate_no():
    anyio.run(escalate, types.ElicitResult(action="accept", content={"approve": False}), False)


if __name__ == "__main__":
    main({
        "runs": lambda: anyio.run(runs),
        "denials": lambda: anyio.run(denials),
        "escalate_yes": escalate_yes,
        "escalate_no": escalate_no,
    })
