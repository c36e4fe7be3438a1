//! The five tools: their names, JSON schemas and descriptions (written for a model: what the
//! tool does, what persists, what the sandbox allows), and their arguments parsed into a
//! [`ToolCall`] with clear errors.

use std::time::Duration;

use serde_json::{json, Map, Value};

/// One call, its arguments checked.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCall {
    RunPython {
        code: String,
        timeout: Option<Duration>,
    },
    RunShell {
        command: String,
        timeout: Option<Duration>,
    },
    WriteFile {
        path: String,
        content: String,
    },
    ReadFile {
        path: String,
        /// First line (1-based).
        offset: Option<u64>,
        /// Most lines.
        limit: Option<u64>,
    },
    ListFiles {
        path: String,
    },
}

impl ToolCall {
    /// The tool's name.
    pub fn name(&self) -> &'static str {
        match self {
            ToolCall::RunPython { .. } => "run_python",
            ToolCall::RunShell { .. } => "run_shell",
            ToolCall::WriteFile { .. } => "write_file",
            ToolCall::ReadFile { .. } => "read_file",
            ToolCall::ListFiles { .. } => "list_files",
        }
    }

    /// Parses a call of tool `name` with `args`; `Err` says what is wrong in one line.
    pub fn parse(name: &str, args: &Map<String, Value>) -> Result<ToolCall, ToolError> {
        let known: &[&str] = match name {
            "run_python" => &["code", "timeout"],
            "run_shell" => &["command", "timeout"],
            "write_file" => &["path", "content"],
            "read_file" => &["path", "offset", "limit"],
            "list_files" => &["path"],
            _ => return Err(ToolError::UnknownTool(name.into())),
        };
        if let Some(k) = args.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ToolError::UnknownArgument {
                tool: name.into(),
                arg: k.clone(),
                known: known.join(", "),
            });
        }
        let tool = || name.to_owned();
        let string = |key: &'static str| match args.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(ToolError::NotAString { tool: tool(), key }),
            None => Err(ToolError::Required { tool: tool(), key }),
        };
        let path = || {
            let p = string("path")?;
            if p.is_empty() {
                return Err(ToolError::EmptyPath(tool()));
            }
            if p.contains('\0') {
                return Err(ToolError::NulInPath(tool()));
            }
            Ok(p)
        };
        let count = |key: &'static str| match args.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Ok(Some(n)),
                _ => Err(ToolError::NotACount { tool: tool(), key }),
            },
        };
        Ok(match name {
            "run_python" => ToolCall::RunPython {
                code: non_blank(name, "code", string("code")?)?,
                timeout: timeout(name, args)?,
            },
            "run_shell" => ToolCall::RunShell {
                command: non_blank(name, "command", string("command")?)?,
                timeout: timeout(name, args)?,
            },
            "write_file" => ToolCall::WriteFile {
                path: path()?,
                content: string("content")?,
            },
            "read_file" => ToolCall::ReadFile {
                path: path()?,
                offset: count("offset")?,
                limit: count("limit")?,
            },
            _ => ToolCall::ListFiles { path: path()? },
        })
    }
}

/// Why a tool call's name or arguments are refused (one line for the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    #[error("{tool}: unknown argument {arg:?} (it takes {known})")]
    UnknownArgument {
        tool: String,
        arg: String,
        known: String,
    },
    #[error("{tool}: {key} must be a string")]
    NotAString { tool: String, key: &'static str },
    #[error("{tool}: {key} is required")]
    Required { tool: String, key: &'static str },
    #[error("{0}: path is empty")]
    EmptyPath(String),
    #[error("{0}: path contains a NUL byte")]
    NulInPath(String),
    #[error("{tool}: {key} must be an integer of at least 1")]
    NotACount { tool: String, key: &'static str },
    #[error("{tool}: {key} is empty")]
    Blank { tool: String, key: &'static str },
    #[error("{0}: timeout must be a number of seconds, more than 0 and at most 86400")]
    Timeout(String),
}

fn non_blank(tool: &str, key: &'static str, s: String) -> Result<String, ToolError> {
    if s.trim().is_empty() {
        Err(ToolError::Blank {
            tool: tool.into(),
            key,
        })
    } else {
        Ok(s)
    }
}

fn timeout(tool: &str, args: &Map<String, Value>) -> Result<Option<Duration>, ToolError> {
    match args.get("timeout") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(s) if s > 0.0 && s.is_finite() && s <= 86_400.0 => {
                Ok(Some(Duration::from_secs_f64(s)))
            }
            _ => Err(ToolError::Timeout(tool.into())),
        },
    }
}

/// A tool as `tools/list` shows it. No output schema is declared: the result is a JSON
/// object in both the text and `structuredContent` (its fields are in docs/mcp.md), because
/// a declared `outputSchema` makes the MCP Python SDK validate every result with
/// `jsonschema.validate`, which checks the schema itself each time: about 4 ms a call here,
/// eight times the rest of a `run_python` round trip.
pub struct ToolInfo {
    pub name: &'static str,
    pub title: &'static str,
    pub description: String,
    pub input_schema: Value,
    pub read_only: bool,
}

/// The tools, described for a model. `sandbox` says what the sandbox is (its persistence,
/// workspace and network), appended to each description.
pub fn list(sandbox: &str) -> Vec<ToolInfo> {
    let timeout = json!({"type": "number", "description": "Seconds before the run is stopped (default: the server's; at most the profile's limit)."});
    vec![
        ToolInfo {
            name: "run_python",
            title: "Run Python",
            description: format!(
                "Run Python 3 code in an isolated sandbox and return its stdout, stderr and exit code \
                 (0: ran to the end; 1: an exception, whose traceback is in stderr). The value of a \
                 last bare expression is printed, as in a notebook. {sandbox}"
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "Python source to run."},
                    "timeout": timeout,
                },
                "required": ["code"],
                "additionalProperties": false
            }),
            read_only: false,
        },
        ToolInfo {
            name: "run_shell",
            title: "Run a shell command",
            description: format!(
                "Run a shell command line (bash, or sh when the image has no bash) in an isolated \
                 sandbox and return its stdout, stderr and exit code. Each call starts a new shell: \
                 files persist between calls, the working directory and variables do not. {sandbox}"
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line."},
                    "timeout": timeout,
                },
                "required": ["command"],
                "additionalProperties": false
            }),
            read_only: false,
        },
        ToolInfo {
            name: "write_file",
            title: "Write a file",
            description: format!(
                "Create or replace a text file in the sandbox (parent directories are made). A \
                 relative path is taken from the working directory. {sandbox}"
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path inside the sandbox."},
                    "content": {"type": "string", "description": "The whole new content (UTF-8)."}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
            read_only: false,
        },
        ToolInfo {
            name: "read_file",
            title: "Read a file",
            description: format!(
                "Read a text file in the sandbox, whole or a range of lines. {sandbox}"
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path inside the sandbox."},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1 = the first line)."},
                    "limit": {"type": "integer", "minimum": 1, "description": "Most lines to return."}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
            read_only: true,
        },
        ToolInfo {
            name: "list_files",
            title: "List a directory",
            description: format!(
                "List a directory in the sandbox: each entry's name, type (file, dir, symlink, \
                 other) and size in bytes. {sandbox}"
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory path inside the sandbox."}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
            read_only: true,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn calls_parse_and_bad_ones_say_why() {
        assert_eq!(
            ToolCall::parse(
                "run_python",
                &args(json!({"code": "print(1)", "timeout": 2.5}))
            ),
            Ok(ToolCall::RunPython {
                code: "print(1)".into(),
                timeout: Some(Duration::from_millis(2500))
            })
        );
        assert_eq!(
            ToolCall::parse("read_file", &args(json!({"path": "a", "offset": 2}))),
            Ok(ToolCall::ReadFile {
                path: "a".into(),
                offset: Some(2),
                limit: None
            })
        );
        for (name, a, why) in [
            ("run_python", json!({}), "code is required"),
            ("run_python", json!({"code": "  "}), "code is empty"),
            ("run_python", json!({"code": 1}), "code must be a string"),
            (
                "run_shell",
                json!({"command": "x", "timeout": -1}),
                "timeout must be",
            ),
            (
                "run_shell",
                json!({"command": "x", "timeout": "5"}),
                "timeout must be",
            ),
            (
                "read_file",
                json!({"path": "a", "limit": 0}),
                "limit must be",
            ),
            ("write_file", json!({"path": "a"}), "content is required"),
            (
                "write_file",
                json!({"path": "", "content": ""}),
                "path is empty",
            ),
            ("list_files", json!({"path": "a\u{0}b"}), "NUL"),
            (
                "list_files",
                json!({"path": "a", "x": 1}),
                "unknown argument \"x\"",
            ),
            ("rm_rf", json!({}), "unknown tool"),
        ] {
            let e = ToolCall::parse(name, &args(a)).unwrap_err().to_string();
            assert!(e.contains(why), "{name}: {e}");
        }
    }

    #[test]
    fn every_tool_has_a_schema_and_a_description() {
        let tools = list("S.");
        assert_eq!(
            tools.iter().map(|t| t.name).collect::<Vec<_>>(),
            [
                "run_python",
                "run_shell",
                "write_file",
                "read_file",
                "list_files"
            ]
        );
        for t in &tools {
            assert!(t.description.ends_with("S."), "{}", t.name);
            assert_eq!(t.input_schema["type"], "object");
            assert!(t.input_schema["required"].as_array().is_some());
        }
    }
}
