//! Agent frameworks using agentrun through MCP with no glue code, each with a scripted model
//! (no LLM) emitting the tool calls:
//! - LangGraph: langchain-mcp-adapters' `load_mcp_tools` in a graph with a prebuilt
//!   `ToolNode` (tests/mcp/langgraph_agent.py);
//! - Google ADK: an `LlmAgent` with an `McpToolset` (`StdioConnectionParams`) run by a
//!   `Runner` (tests/mcp/adk_agent.py);
//! - CrewAI: crewai-tools' `MCPServerAdapter` giving an `Agent` its tools in a `Crew`
//!   (tests/mcp/crewai_agent.py).
//!
//! Each: code runs and its output comes back (and a session keeps its globals); a write
//! outside the workspace and a network call come back denied with the rule and a reason the
//! model can act on; an escalation answered yes and no (LangGraph and ADK answer MCP
//! elicitations; CrewAI's MCP clients cannot, so there an escalation is refused with "needs
//! approval"). Nothing is left on the host after any of them.

use agentrun_e2e::mcp::*;
use agentrun_e2e::*;

fn ci_with(ws: &tempfile::TempDir) -> [String; 4] {
    [
        "--profile".into(),
        "code-interpreter".into(),
        "--workspace".into(),
        ws.path().display().to_string(),
    ]
}

/// Runs `scenario` of `client` under `--profile code-interpreter --workspace WS`.
fn run_in_workspace(client: Client, scenario: &str) -> tempfile::TempDir {
    let Some(_lock) = setup() else {
        return workspace();
    };
    let env = McpEnv::new();
    let ws = workspace();
    let a = ci_with(&ws);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    env.run(client, scenario, &a);
    assert!(!std::path::Path::new("/etc/agentrun-mcp-evil").exists());
    ws
}

fn run_plain(client: Client, scenario: &str) {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    env.run(client, scenario, &[]);
}

#[test]
fn langgraph_tool_node_runs_code() {
    let ws = run_in_workspace(LANGGRAPH, "runs");
    if is_root() {
        assert_eq!(
            std::fs::read_to_string(ws.path().join("report.md")).unwrap(),
            "# hi\n"
        );
    }
}

#[test]
fn langgraph_denials_reach_the_model() {
    run_in_workspace(LANGGRAPH, "denials");
}

#[test]
fn langgraph_escalation_answered_yes() {
    run_plain(LANGGRAPH, "escalate_yes");
}

#[test]
fn langgraph_escalation_answered_no() {
    run_plain(LANGGRAPH, "escalate_no");
}

#[test]
fn adk_mcp_toolset_runs_code() {
    run_in_workspace(ADK, "runs");
}

#[test]
fn adk_denials_reach_the_model() {
    run_in_workspace(ADK, "denials");
}

#[test]
fn adk_escalation_answered_yes() {
    run_plain(ADK, "escalate_yes");
}

#[test]
fn adk_escalation_answered_no() {
    run_plain(ADK, "escalate_no");
}

#[test]
fn crewai_mcp_adapter_runs_code() {
    run_in_workspace(CREWAI, "runs");
}

#[test]
fn crewai_denials_reach_the_model() {
    run_in_workspace(CREWAI, "denials");
}

/// CrewAI cannot answer an elicitation: the escalated connection is refused, saying so.
#[test]
fn crewai_escalation_without_elicitation_is_refused() {
    run_plain(CREWAI, "escalate_unasked");
}
