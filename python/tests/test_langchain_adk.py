"""agentrun.langchain and agentrun.adk inside their frameworks, with scripted models (no
LLM), as tests/mcp/langgraph_agent.py and adk_agent.py drive agentrun's MCP server: a
LangGraph graph (a chat model node, the prebuilt ToolNode) and an ADK LlmAgent run by a
Runner. Needs langgraph, langchain-core and google-adk (hack/test runs this file in
.venv/mcp)."""

import asyncio
import os

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types as gt
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentrun.adk import python_tool as adk_tool
from agentrun.langchain import python_tool as langchain_tool

CODES = [
    "print(sum(range(10)))",
    "open('/etc/agentrun-fw-evil', 'w').write('x')",
]


def test_langchain_tool_in_a_langgraph_graph():
    tool = langchain_tool(timeout=30)
    assert tool.name == "run_python"
    turns = [
        AIMessage(content="", tool_calls=[{"name": "run_python", "args": {"code": c},
                                           "id": f"call_{i}", "type": "tool_call"}])
        for i, c in enumerate(CODES)
    ] + [AIMessage(content="done")]
    model = GenericFakeChatModel(messages=iter(turns))

    def agent(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([tool]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    out = g.compile().invoke({"messages": [HumanMessage("run it")]})
    assert out["messages"][-1].content == "done"
    got = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
    assert got[0] == "45\n", got
    assert got[1].startswith("Something went wrong while running the code"), got
    assert not os.path.exists("/etc/agentrun-fw-evil")


class ScriptedLlm(BaseLlm):
    """Calls run_python with each code of `script`, one a turn, then says "done"."""

    model: str = "scripted"
    script: list = []

    @classmethod
    def supported_models(cls):
        return [r"scripted"]

    async def generate_content_async(self, llm_request, stream=False):
        answered = sum(1 for c in llm_request.contents for p in (c.parts or [])
                       if p.function_response is not None)
        if answered < len(self.script):
            part = gt.Part(function_call=gt.FunctionCall(
                name="run_python", args={"code": self.script[answered]}, id=f"call_{answered}"))
        else:
            part = gt.Part(text="done")
        yield LlmResponse(content=gt.Content(role="model", parts=[part]))


def test_adk_tool_in_an_adk_runner():
    async def go():
        agent = LlmAgent(name="coder", model=ScriptedLlm(script=CODES),
                         instruction="Run code.", tools=[adk_tool(timeout=30)])
        sessions = InMemorySessionService()
        runner = Runner(agent=agent, app_name="agentrun-pytest", session_service=sessions)
        session = await sessions.create_session(app_name="agentrun-pytest", user_id="u")
        responses, final = [], None
        async for ev in runner.run_async(user_id="u", session_id=session.id,
                                         new_message=gt.Content(role="user", parts=[gt.Part(text="go")])):
            for fr in ev.get_function_responses():
                responses.append((fr.name, fr.response))
            if ev.is_final_response() and ev.content and ev.content.parts:
                final = "".join(p.text or "" for p in ev.content.parts)
        return responses, final

    responses, final = asyncio.run(go())
    assert final == "done"
    assert [n for n, _ in responses] == ["run_python", "run_python"], responses
    assert responses[0][1] == {"output": "45\n"}, responses
    assert responses[1][1]["output"].startswith("Something went wrong while running the code"), responses
    assert not os.path.exists("/etc/agentrun-fw-evil")
