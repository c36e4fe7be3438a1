"""agentrun.crewai.AgentrunCodeInterpreterTool inside a real CrewAI `Crew`, driven by a
scripted LLM (a crewai BaseLLM subclass that answers in CrewAI's ReAct text: no model), as
tests/mcp/crewai_agent.py does. Needs crewai (hack/test runs this file in .venv/test)."""

import json
import os
from typing import Any

from crewai import Agent, Crew, Task
from crewai.agents.parser import AgentAction
from crewai.llms.base_llm import BaseLLM

from agentrun.crewai import AgentrunCodeInterpreterTool


class ScriptedLLM(BaseLLM):
    """Calls the tool with each input of `script`, one a turn, then gives a final answer."""

    script: list = []
    turn: int = 0

    def call(self, messages, tools=None, callbacks=None, available_functions=None,
             from_task=None, from_agent=None, response_model=None, **kw: Any) -> str:
        i = self.turn
        self.turn += 1
        if i < len(self.script):
            return ("Thought: I should run code.\n"
                    "Action: Code Interpreter\n"
                    f"Action Input: {json.dumps(self.script[i])}")
        return "Thought: I now know the final answer\nFinal Answer: done"

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192


def run_crew(tool, script):
    observed = []

    def step(s):
        if isinstance(s, AgentAction):
            observed.append(s.result)

    agent = Agent(role="coder", goal="run code", backstory="careful", tools=[tool],
                  llm=ScriptedLLM(model="scripted", script=script), step_callback=step,
                  max_iter=len(script) + 2, allow_delegation=False, verbose=False)
    task = Task(description="Run the code.", expected_output="done", agent=agent)
    result = Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
    assert str(result).strip() == "done"
    assert len(observed) == len(script), observed
    return observed


def test_the_tool_is_a_code_interpreter_drop_in():
    from crewai_tools import CodeInterpreterTool

    ours, theirs = AgentrunCodeInterpreterTool(), CodeInterpreterTool()
    assert ours.name == theirs.name
    assert set(ours.args_schema.model_json_schema()["properties"]) == set(
        theirs.args_schema.model_json_schema()["properties"])


def test_a_crew_runs_code_in_the_sandbox(tmp_path):
    readable = tmp_path / "in"
    writable = tmp_path / "out"
    readable.mkdir()
    writable.mkdir()
    (readable / "n.txt").write_text("20\n")
    tool = AgentrunCodeInterpreterTool(readable_paths=[str(readable)],
                                       writable_paths=[str(writable)], memory="256M")
    out = run_crew(tool, [
        {"code": "import math\nprint('crew', math.factorial(5))", "libraries_used": []},
        {"code": f"n = int(open('{readable}/n.txt').read())\nopen('{writable}/r.txt', 'w').write(str(n + 1))\nprint('wrote')",
         "libraries_used": []},
        {"code": f"open('{readable}/evil.txt', 'w').write('x')", "libraries_used": []},
        {"code": "open('/etc/agentrun-crew-evil', 'w').write('x')", "libraries_used": []},
        {"code": "b = bytearray(600 * 1024 * 1024)\nprint('allocated')", "libraries_used": []},
    ])
    assert out[0].startswith("crew 120\n"), out[0]
    assert out[1].startswith("wrote\n"), out[1]
    assert (writable / "r.txt").read_text() == "21"
    assert out[2].startswith("Something went wrong while running the code"), out[2]
    assert not (readable / "evil.txt").exists()
    assert out[3].startswith("Something went wrong while running the code"), out[3]
    assert not os.path.exists("/etc/agentrun-crew-evil")
    assert "allocated" not in out[4] and out[4].startswith("Something went wrong"), out[4]
