"""CrewAI as a client of `agentrun mcp` (stdio): crewai-tools' MCPServerAdapter (mcpadapt)
with StdioServerParameters gives the agent its tools; a CrewAI Agent and Task run in a Crew
with a scripted LLM (a crewai BaseLLM subclass: no model) that answers in CrewAI's ReAct text
(Thought / Action / Action Input), one tool call a turn, then a Final Answer. The scenarios
assert the tool outputs the agent observed (its step callback) and the crew's result.

CrewAI's MCP clients (MCPServerAdapter/mcpadapt and the native `mcps=`) do not answer MCP
elicitations: an escalation is refused with "needs approval", which `escalate_unasked`
asserts.

Usage: crewai_agent.py SCENARIO (see common.py for the environment).
"""

import json
from typing import Any

from crewai import Agent, Crew, Task
from crewai.agents.parser import AgentAction
from crewai.llms.base_llm import BaseLLM
from crewai_tools import MCPServerAdapter

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


class ScriptedLLM(BaseLLM):
    """Answers each call with the next tool call of `script` in ReAct text, then a final
    answer."""

    script: list = []
    turn: int = 0

    def call(self, messages, tools=None, callbacks=None, available_functions=None,
             from_task=None, from_agent=None, response_model=None, **kw: Any) -> str:
        i = self.turn
        self.turn += 1
        if i < len(self.script):
            name, args = self.script[i]
            return (f"Thought: I should use the {name} tool.\n"
                    f"Action: {name}\n"
                    f"Action Input: {json.dumps(args)}")
        return "Thought: I now know the final answer\nFinal Answer: done"

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192


def run_crew(script):
    """Runs the crew; returns the tool outputs the agent observed, in order."""
    observed = []

    def step(s):
        if isinstance(s, AgentAction):
            observed.append((s.tool, s.result))

    with MCPServerAdapter(stdio_params(), connect_timeout=120) as tools:
        eq({t.name for t in tools}, sdk_client.TOOLS, "the adapter's tools")
        agent = Agent(
            role="coder",
            goal="run code in the sandbox",
            backstory="a careful engineer",
            tools=list(tools),
            llm=ScriptedLLM(model="scripted", script=script),
            step_callback=step,
            max_iter=len(script) + 2,
            allow_delegation=False,
            verbose=False,
        )
        task = Task(description="Use the sandbox tools.", expected_output="done", agent=agent)
        result = Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
    eq(str(result).strip(), "done", "the crew's result")
    eq([t for t, _ in observed], [n for n, _ in script], "a tool output per call")
    return [r for _, r in observed]


def obj(text):
    """The tool's JSON object from what the agent observed. CrewAI appends a reminder of its
    tools to every few observations ("You ONLY have access to the following tools..."):
    only that may follow the object."""
    check(isinstance(text, str), "a text output", text)
    try:
        o, end = json.JSONDecoder().raw_decode(text)
    except ValueError as e:
        raise AssertionError(f"the tool output is not a JSON object ({e}):\n{text}") from None
    rest = text[end:].strip()
    check(not rest or rest.startswith("You ONLY have access to the following tools"),
          "nothing but CrewAI's tool reminder after the object", text)
    return o


def runs():
    out = run_crew([
        ("run_python", {"code": "import math\nr = math.factorial(5)\nprint('crew', r)"}),
        ("run_python", {"code": "print(r + 1)"}),
        ("list_files", {"path": "/workspace"}),
    ])
    eq(obj(out[0])["stdout"], "crew 120\n", "the code's output comes back")
    eq(obj(out[1])["stdout"], "121\n", "globals persist in the session")
    check("host.txt" in {e["name"] for e in obj(out[2])["entries"]}, "the workspace lists", out[2])


def denials():
    out = run_crew([
        ("run_python", {"code": WRITE_OUTSIDE_CODE}),
        ("run_python", {"code": NET_CODE}),
        ("write_file", {"path": "/etc/agentrun-mcp-evil", "content": "x"}),
    ])
    check_write_outside_denied(obj(out[0]))
    check_net_denied(obj(out[1]))
    check(out[2].startswith("denied:") and "writes are allowed only under" in out[2], "the denial text", out[2])


def escalate_unasked():
    port = sdk_client.escalation_profile()
    out = run_crew([("run_python", {"code": sdk_client.ESC_CODE.format(port=port)})])
    o = obj(out[0])
    check("REFUSED" in o["stdout"], "refused", o)
    d = find_denial(o, "net.connect", f"127.0.0.1:{port}")
    check("needs approval" in d["reason"], "the reason says approval was needed", d)


if __name__ == "__main__":
    main({"runs": runs, "denials": denials, "escalate_unasked": escalate_unasked})
