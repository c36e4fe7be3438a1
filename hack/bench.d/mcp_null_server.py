"""A stdio MCP server that runs nothing: hack/bench mcp's floor row (the client and the stdio
transport alone).

    mcp_null_server.py [TOOLS_JSON]

Newline-delimited JSON-RPC on stdin/stdout, no SDK: answers `initialize`, `ping`,
`tools/list` (the tools in TOOLS_JSON, a `tools/list` result saved from another server, so
the client validates the same output schema; else one `run_python` without one) and every
`tools/call` at once with agentrun's result shape for `print(1)`; ignores notifications. The
time a call takes through it is what the client, the pipes and a JSON round trip cost, with
no sandbox and no interpreter behind the server.
"""
import json
import sys


def main():
    tools = {"tools": [{"name": "run_python", "inputSchema": {
        "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}]}
    if len(sys.argv) > 1:
        with open(sys.argv[1]) as f:
            tools = json.load(f)
    obj = {"stdout": "1\n", "stderr": "", "exit_code": 0, "timed_out": False, "denials": []}
    call = {"content": [{"type": "text", "text": json.dumps(obj)}], "structuredContent": obj,
            "isError": False}
    out = sys.stdout
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:
            continue
        method = msg["method"]
        if method == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"],
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": "null", "version": "0"}}
        elif method == "tools/list":
            result = tools
        elif method == "tools/call":
            result = call
        elif method == "ping":
            result = {}
        else:
            out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                                  "error": {"code": -32601, "message": f"no method {method}"}}) + "\n")
            out.flush()
            continue
        out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
