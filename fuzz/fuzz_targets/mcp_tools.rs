//! The MCP server's parsers of what it is sent (`crates/mcp`): a tool call's arguments
//! (`ToolCall::parse`, from a client), and what a sandbox's own processes write that the
//! server reads back: a run's output scanned for kernel refusals (`explain_output`) and the
//! `list_files` script's records (`parse_listing`). The first byte picks the parser.
//! Properties: an argument error is one line; every explained denial names an absolute path
//! or the network, a rule and a reason; a listing entry has a name, a type and a size.
#![no_main]

use agentrun_mcp::denials::explain_output;
use agentrun_mcp::files::parse_listing;
use agentrun_mcp::tools::ToolCall;
use agentrun_policy::Profile;
use libfuzzer_sys::fuzz_target;

const TOOLS: [&str; 5] = [
    "run_python",
    "run_shell",
    "write_file",
    "read_file",
    "list_files",
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    match pick % 3 {
        0 => {
            let Ok(serde_json::Value::Object(args)) = serde_json::from_slice(rest) else {
                return;
            };
            for tool in TOOLS {
                if let Err(e) = ToolCall::parse(tool, &args) {
                    let e = e.to_string();
                    assert!(!e.is_empty() && !e.contains('\n'), "{e:?}");
                }
            }
        }
        1 => {
            let text = String::from_utf8_lossy(rest);
            for name in ["strict", "default", "code-interpreter"] {
                let profile = Profile::builtin(name).expect("a built-in profile");
                for d in explain_output(&profile, &[&text]) {
                    assert!(
                        d.resource.starts_with('/') || d.resource == "network",
                        "{d:?}"
                    );
                    assert!(!d.rule_id.is_empty() && !d.reason.is_empty(), "{d:?}");
                }
            }
        }
        _ => {
            for e in parse_listing(rest) {
                assert!(
                    e["name"].is_string() && e["type"].is_string() && e["size"].is_u64(),
                    "{e}"
                );
            }
        }
    }
});
