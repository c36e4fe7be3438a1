"""Shared by the MCP client scenarios (tests/mcp/*.py), driven by tests/tests/mcp_*.rs.

The environment names the server under test:
  MCP_AGENTRUN      the agentrun binary
  MCP_ARGS          JSON list: the arguments after `agentrun mcp` (profile, workspace, ...)
  MCP_URL           (HTTP scenarios) http://127.0.0.1:PORT/mcp of `agentrun serve --mcp`
  MCP_API_KEY       (HTTP scenarios) its API key
  MCP_WORKSPACE     the host dir mounted at /workspace, when there is one
  MCP_UPSTREAM      (escalation, exfiltration) host:port of a loopback HTTP server
The whole environment (AGENTRUN_STATE_DIR, OTEL_*, AGENTRUN_AUDIT_DIR) is passed on to the
server: the MCP SDK's stdio client would otherwise give it only HOME, PATH and a few more.

A scenario prints `OK <name>` last; any failed check raises (non-zero exit, with the check's
message). Results a test's Rust side needs are printed as `KEY value` lines.
"""

import json
import os
import sys


def server_command():
    """(command, args) of `agentrun mcp` under test."""
    return os.environ["MCP_AGENTRUN"], ["mcp"] + json.loads(os.environ.get("MCP_ARGS", "[]"))


def server_env():
    return dict(os.environ)


def stdio_params():
    from mcp import StdioServerParameters

    cmd, args = server_command()
    return StdioServerParameters(command=cmd, args=args, env=server_env())


def check(cond, what, *context):
    if not cond:
        detail = "\n".join(repr(c) for c in context)
        raise AssertionError(f"{what}\n{detail}")


def eq(got, want, what):
    check(got == want, f"{what}: got {got!r}, want {want!r}")


def structured(result):
    """The JSON object of a tool result (mcp.types.CallToolResult): its structuredContent,
    which must equal the JSON in its one TextContent."""
    check(len(result.content) == 1, "one content item", result)
    item = result.content[0]
    eq(item.type, "text", "content type")
    text = item.text
    if result.isError and text.startswith("denied:"):
        # A denial's text is a line for the model; the object is in structuredContent.
        obj = result.structuredContent
        check(obj is not None, "a denial carries structuredContent", result)
        return obj
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if result.structuredContent is not None:
        if obj is not None:
            eq(obj, result.structuredContent, "text JSON == structuredContent")
        return result.structuredContent
    check(obj is not None, "the text is a JSON object", text)
    return obj


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


def expect_run(result, stdout=None, exit_code=0, timed_out=False):
    """A run_python/run_shell result that is not an error; returns its object."""
    check(not result.isError, "a run is never isError", result)
    obj = structured(result)
    for k in ("stdout", "stderr", "exit_code", "timed_out", "denials"):
        check(k in obj, f"run result has {k}", obj)
    if stdout is not None:
        eq(obj["stdout"], stdout, "stdout")
    if exit_code is not None:
        eq(obj["exit_code"], exit_code, f"exit_code (stderr {obj['stderr']!r})")
    eq(obj["timed_out"], timed_out, "timed_out")
    return obj


def expect_denied(result, action, resource=None, rule=None, reason_has=()):
    """A file tool refused by the policy: isError, the denial object, `denied:` text."""
    check(result.isError, "a denied file tool is isError", result)
    text = text_of(result)
    check(text.startswith("denied:"), "the text starts with denied:", text)
    obj = structured(result)
    eq(obj.get("error"), "denied", "error kind")
    eq(obj.get("action"), action, "action")
    if resource is not None:
        eq(obj.get("resource"), resource, "resource")
    if rule is not None:
        eq(obj.get("rule_id"), rule, "rule_id")
    check(obj.get("reason"), "a reason", obj)
    check(obj["reason"] in text, "the text includes the reason", text, obj)
    for r in reason_has:
        check(r in obj["reason"], f"the reason says {r!r}", obj)
    return obj


def find_denial(obj, action, resource_has=None):
    """The denial of `action` (on a resource containing resource_has) in a run's result."""
    for d in obj.get("denials", []):
        if d.get("action") == action and (resource_has is None or resource_has in d.get("resource", "")):
            for k in ("resource", "rule_id", "reason"):
                check(d.get(k), f"the denial has {k}", d)
            return d
    raise AssertionError(f"no {action} denial on {resource_has!r} in {obj!r}")


# A run_python payload that tries the network: the egress proxy (allowlist profiles) answers
# 403, a profile with no network has no route; either way the print tells which.
NET_CODE = """
import urllib.request
try:
    urllib.request.urlopen("http://example.com/", timeout=10)
    print("NET-REACHED")
except Exception as e:
    print("NET-BLOCKED", type(e).__name__, e)
"""

# A run_python payload writing outside the workspace.
WRITE_OUTSIDE_CODE = """
try:
    open("/etc/agentrun-mcp-evil", "w").write("x")
    print("WROTE")
except OSError as e:
    print("WRITE-DENIED", e)
"""


def check_net_denied(obj):
    check("NET-REACHED" not in obj["stdout"], "the network call did not go through", obj)
    check("NET-BLOCKED" in obj["stdout"], "the network call failed", obj)
    d = find_denial(obj, "net.connect")
    return d


def check_write_outside_denied(obj):
    check("WROTE" not in obj["stdout"], "the write outside did not happen", obj)
    check("WRITE-DENIED" in obj["stdout"], "the write outside failed", obj)
    d = find_denial(obj, "fs.write", "/etc")
    check("writes are allowed only under" in d["reason"], "the reason says where writes go", d)
    return d


def done(name):
    print(f"OK {name}", flush=True)


def main(scenarios):
    name = sys.argv[1]
    if name not in scenarios:
        sys.exit(f"unknown scenario {name!r}; known: {', '.join(sorted(scenarios))}")
    scenarios[name]()
    done(name)
