"""Egress conformance scenarios (`sdk_e2e.py egress:NAME`), sync and async SDK.

- unresolved*: a name the policy allows that does not resolve is answered by agentrun's
  egress proxy like a forward proxy does, 502 Bad Gateway saying the name did not resolve;
  a denial stays 403 naming the rule. (Upstream's sidecar answers both with DNS NXDOMAIN:
  the client cannot tell them apart there; its blocked-event webhook can.)
- policy*: the egress sidecar's `/policy` as upstream's components/egress policy_server.go
  serves it: PATCH merges (incoming first, first per target wins, targets compared
  case-insensitively and kept as written, defaultAction untouched), DELETE removes by target
  (unknown targets: 200 with reason "no matching targets found"), `mode` is allow_all /
  deny_all / enforcing, PATCH and DELETE answers carry no policy.
"""

import shlex

import httpx
from opensandbox import Sandbox, SandboxSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

from sdk_e2e import FETCH, async_config, check, expect_api_error, fetch, sync_config, upstream

# Rules of the unresolved* sandboxes: ids networkPolicy.egress[i].
UNRESOLVED_RULES = [
    NetworkRule(action="deny", target="blocked.invalid"),
    NetworkRule(action="allow", target="allowed.invalid"),
    NetworkRule(action="allow", target="*.wild.invalid"),
    NetworkRule(action="allow", target="127.0.0.1"),
]

# A CONNECT through the sandbox's proxy: prints the proxy's status line and body.
CONNECT = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(f"CONNECT {sys.argv[1]} HTTP/1.1\r\nHost: {sys.argv[1]}\r\n\r\n".encode())
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
head, _, body = data.decode().partition("\r\n\r\n")
print(head.splitlines()[0], "|", body.strip())
"""


def connect_cmd(target):
    return f"python3 -c {shlex.quote(CONNECT)} {shlex.quote(target)}"


def fetch_cmd(url):
    return f"python3 -c {shlex.quote(FETCH)} {shlex.quote(url)}"


def check_unresolved_answers(got, up):
    """`got(kind, what)` runs a fetch (kind "get": a URL) or a CONNECT (kind "connect":
    host:port) in the sandbox and returns what it printed."""
    # Allowed by name, no such name: 502, the reason in the body; never a 403.
    r = got("get", "http://allowed.invalid/x")
    check(r.startswith("status 502 ") and "cannot resolve allowed.invalid" in r, f"allowed, unresolved: {r!r}")
    check("denied" not in r and "rule" not in r, f"an unresolved name is not a denial: {r!r}")
    r = got("connect", "allowed.invalid:443")
    check(r.startswith("HTTP/1.1 502 Bad Gateway |") and "cannot resolve allowed.invalid" in r, f"CONNECT, unresolved: {r!r}")
    # Allowed by a wildcard, no such name: the same.
    r = got("get", "http://deep.sub.wild.invalid/")
    check(r.startswith("status 502 ") and "cannot resolve deep.sub.wild.invalid" in r, f"wildcard, unresolved: {r!r}")
    # Denied (by a rule, by the default): 403 naming the rule, whether or not the name exists.
    r = got("get", "http://blocked.invalid/x")
    check(r.startswith("status 403 ") and "denied by rule networkPolicy.egress[0]" in r, f"denied: {r!r}")
    r = got("connect", "blocked.invalid:443")
    check(r.startswith("HTTP/1.1 403 Forbidden |") and "networkPolicy.egress[0]" in r, f"CONNECT denied: {r!r}")
    r = got("get", "http://other.invalid/x")
    check(r.startswith("status 403 ") and "denied by rule network.default" in r, f"default deny: {r!r}")
    # The proxy does lead out for what resolves.
    r = got("get", f"http://{up}/reachable")
    check(r == "status 200 upstream says /reachable", f"allowed upstream: {r!r}")


def unresolved():
    up, _ = upstream()
    sbx = SandboxSync.create("host", connection_config=sync_config(), network_policy=NetworkPolicy(
        default_action="deny", egress=UNRESOLVED_RULES))
    print("SANDBOX", sbx.id)
    try:
        def got(kind, what):
            ex = sbx.commands.run(fetch_cmd(what) if kind == "get" else connect_cmd(what))
            check(ex.exit_code == 0, f"{kind} {what}: exit {ex.exit_code} {ex.logs.stderr}")
            return ex.text

        check_unresolved_answers(got, up)
    finally:
        sbx.kill()


async def unresolved_async_flow():
    up, _ = upstream()
    sbx = await Sandbox.create("host", connection_config=async_config(), network_policy=NetworkPolicy(
        default_action="deny", egress=UNRESOLVED_RULES))
    print("SANDBOX", sbx.id)
    try:
        results = {}
        for kind, what in [
            ("get", "http://allowed.invalid/x"),
            ("connect", "allowed.invalid:443"),
            ("get", "http://deep.sub.wild.invalid/"),
            ("get", "http://blocked.invalid/x"),
            ("connect", "blocked.invalid:443"),
            ("get", "http://other.invalid/x"),
            ("get", f"http://{up}/reachable"),
        ]:
            ex = await sbx.commands.run(fetch_cmd(what) if kind == "get" else connect_cmd(what))
            check(ex.exit_code == 0, f"{kind} {what}: exit {ex.exit_code}")
            results[(kind, what)] = ex.text
        check_unresolved_answers(lambda kind, what: results[(kind, what)], up)
    finally:
        await sbx.kill()
        await sbx.close()


def pairs(pol):
    return [(r.action, r.target) for r in pol.egress]


# The policy scenario's steps, shared by the sync and async runs: (what is done, the SDK
# call as (method, argument), the expected rules after it).
PATCHES = [
    (
        "incoming rules first, the first per target wins, targets compared case-insensitively and kept as written",
        [NetworkRule(action="deny", target="pypi.ORG"), NetworkRule(action="allow", target="*.A.test"),
         NetworkRule(action="allow", target="X.test"), NetworkRule(action="deny", target="x.TEST")],
        [("deny", "pypi.ORG"), ("allow", "*.A.test"), ("allow", "X.test")],
    ),
    (
        "a wildcard is its own target",
        [NetworkRule(action="deny", target="b.a.test"), NetworkRule(action="deny", target="*.a.test")],
        [("deny", "b.a.test"), ("deny", "*.a.test"), ("deny", "pypi.ORG"), ("allow", "X.test")],
    ),
]
DELETES = [
    ("by target, case-insensitively; unknown targets ignored", ["PYPI.org", "nope.test"],
     [("deny", "b.a.test"), ("deny", "*.a.test"), ("allow", "X.test")]),
    ("a domain does not remove its wildcard", ["a.test"], None),
    ("a wildcard removes only its own rule", ["*.A.TEST"], [("deny", "b.a.test"), ("allow", "X.test")]),
]


def policy_checks_raw(url, headers, up_target, fetch_status):
    """The sidecar's answers on the wire (httpx, the sandbox's egress endpoint), after the SDK
    steps: `fetch_status()` is the status line of a fetch of the upstream in the sandbox."""
    r = httpx.get(url, headers=headers)
    check(r.status_code == 200, f"GET {r.status_code} {r.text}")
    check(r.json() == {"status": "ok", "mode": "enforcing", "enforcementMode": "proxy", "policy": {
        "defaultAction": "deny", "egress": [{"action": "deny", "target": "b.a.test"}, {"action": "allow", "target": "X.test"}]}},
        f"GET body {r.text}")
    # PATCH answers the status without the policy; the change is in force at once.
    r = httpx.patch(url, json=[{"action": "allow", "target": up_target}], headers=headers)
    check(r.status_code == 200 and r.json() == {"status": "ok", "mode": "enforcing", "enforcementMode": "proxy"},
          f"PATCH {r.status_code} {r.text}")
    check(fetch_status() == "status 200", "allowed by the patch")
    r = httpx.patch(url, json=[{"action": "deny", "target": up_target}], headers=headers)
    check(r.status_code == 200, f"PATCH deny {r.status_code} {r.text}")
    check(fetch_status() == "status 403", "denied by the second patch (it replaced the allow)")
    # DELETE of targets not in the policy: 200, nothing changes, the reason says so.
    r = httpx.request("DELETE", url, json=["nope.test", ""], headers=headers)
    check(r.status_code == 200 and r.json() == {"status": "ok", "mode": "enforcing", "enforcementMode": "proxy",
                                                "reason": "no matching targets found"}, f"DELETE unknown {r.status_code} {r.text}")
    # Every rule removed: deny_all, defaultAction kept.
    r = httpx.request("DELETE", url, json=[up_target, "b.a.test", "x.test"], headers=headers)
    check(r.status_code == 200 and r.json() == {"status": "ok", "mode": "deny_all", "enforcementMode": "proxy"},
          f"DELETE all {r.status_code} {r.text}")
    r = httpx.get(url, headers=headers)
    check(r.json()["policy"] == {"defaultAction": "deny", "egress": []}, f"after DELETE all {r.text}")
    # Refused (400, one-line JSON error), nothing changed: an empty list, a body that is not
    # a list (PATCH never changes defaultAction), an invalid target, no body.
    for method, body in [
        ("PATCH", []),
        ("PATCH", {"defaultAction": "allow", "egress": []}),
        ("PATCH", [{"action": "allow", "target": "10.0.0.0/8"}]),
        ("PATCH", [{"action": "maybe", "target": "a.test"}]),
        ("DELETE", []),
        ("DELETE", {"targets": ["a.test"]}),
        ("PATCH", None),
        ("DELETE", None),
    ]:
        r = httpx.request(method, url, json=body, headers=headers) if body is not None else httpx.request(method, url, headers=headers)
        check(r.status_code == 400 and r.json()["code"] == "INVALID_PARAMETER" and "\n" not in r.json()["message"],
              f"{method} {body!r}: {r.status_code} {r.text}")
    r = httpx.get(url, headers=headers)
    check(r.json()["policy"] == {"defaultAction": "deny", "egress": []} and r.json()["mode"] == "deny_all", f"after refusals {r.text}")
    # POST and PUT replace the whole policy (upstream's handlePost), in force at once.
    for method in ("POST", "PUT"):
        r = httpx.request(method, url, json={"defaultAction": "deny", "egress": [{"action": "allow", "target": up_target}]}, headers=headers)
        check(r.status_code == 200 and r.json() == {"status": "ok", "mode": "enforcing", "enforcementMode": "proxy"},
              f"{method} {r.status_code} {r.text}")
        check(fetch_status() == "status 200", f"allowed by the {method}")
        r = httpx.get(url, headers=headers)
        check(r.json()["policy"] == {"defaultAction": "deny", "egress": [{"action": "allow", "target": up_target}]}, f"after {method}: {r.text}")
    # An empty body resets it to deny-all.
    r = httpx.post(url, content=b"", headers=headers)
    check(r.status_code == 200 and r.json() == {"status": "ok", "mode": "deny_all", "enforcementMode": "proxy",
                                                "reason": "policy reset to default deny-all"}, f"reset {r.status_code} {r.text}")
    check(fetch_status() == "status 403", "denied after the reset")
    for body in ([{"action": "allow", "target": "a.test"}], {"defaultAction": "maybe"}, {"egress": [{"action": "allow", "target": "10.0.0.0/8"}]}):
        r = httpx.put(url, json=body, headers=headers)
        check(r.status_code == 400 and "\n" not in r.json()["message"], f"PUT {body!r}: {r.status_code} {r.text}")
    r = httpx.get(url, headers=headers)
    check(r.json()["policy"] == {"defaultAction": "deny", "egress": []}, f"after refused PUTs {r.text}")


def policy():
    up, _ = upstream()
    cfg = sync_config()
    sbx = SandboxSync.create("host", connection_config=cfg, network_policy=NetworkPolicy(
        default_action="deny", egress=[NetworkRule(action="allow", target="PyPI.org")]))
    allow_all = SandboxSync.create("host", connection_config=cfg, network_policy=NetworkPolicy(default_action="allow"))
    print("SANDBOX", sbx.id)
    try:
        pol = sbx.get_egress_policy()
        check(pol.default_action == "deny" and pairs(pol) == [("allow", "PyPI.org")], f"created {pol}")
        for what, rules, want in PATCHES:
            sbx.patch_egress_rules(rules)
            pol = sbx.get_egress_policy()
            check(pol.default_action == "deny" and pairs(pol) == want, f"{what}: {pairs(pol)}")
        for what, targets, want in DELETES:
            before = pairs(sbx.get_egress_policy())
            sbx.delete_egress_rules(targets)
            pol = sbx.get_egress_policy()
            check(pol.default_action == "deny" and pairs(pol) == (want if want is not None else before), f"{what}: {pairs(pol)}")
        e = expect_api_error(lambda: sbx.patch_egress_rules([]), 400)
        check("at least one rule" in str(e), f"{e}")
        expect_api_error(lambda: sbx.delete_egress_rules([]), 400)

        ep = sbx.get_endpoint(18080)
        url = f"http://{ep.endpoint}/policy"
        policy_checks_raw(url, ep.headers, "127.0.0.1",
                          lambda: " ".join(fetch(sbx, f"http://{up}/p").split()[:2]))

        # defaultAction allow without rules: allow_all; a rule makes it enforcing, and the
        # default stays allow.
        ep = allow_all.get_endpoint(18080)
        r = httpx.get(f"http://{ep.endpoint}/policy", headers=ep.headers)
        check(r.json()["mode"] == "allow_all" and r.json()["policy"] == {"defaultAction": "allow", "egress": []}, f"allow_all {r.text}")
        allow_all.patch_egress_rules([NetworkRule(action="deny", target="a.test")])
        r = httpx.get(f"http://{ep.endpoint}/policy", headers=ep.headers)
        check(r.json()["mode"] == "enforcing" and r.json()["policy"]["defaultAction"] == "allow", f"allow + rule {r.text}")
    finally:
        sbx.kill()
        allow_all.kill()


async def expect_api_error_async(coro, status):
    try:
        await coro
    except SandboxApiException as e:
        check(e.status_code == status, f"status {e.status_code} != {status}: {e}")
        return e
    raise AssertionError(f"expected an API error {status}")


async def policy_async_flow():
    up, _ = upstream()
    sbx = await Sandbox.create("host", connection_config=async_config(), network_policy=NetworkPolicy(
        default_action="deny", egress=[NetworkRule(action="allow", target="PyPI.org")]))
    print("SANDBOX", sbx.id)
    try:
        pol = await sbx.get_egress_policy()
        check(pol.default_action == "deny" and pairs(pol) == [("allow", "PyPI.org")], f"created {pol}")
        for what, rules, want in PATCHES:
            await sbx.patch_egress_rules(rules)
            pol = await sbx.get_egress_policy()
            check(pol.default_action == "deny" and pairs(pol) == want, f"{what}: {pairs(pol)}")
        for what, targets, want in DELETES:
            before = pairs(await sbx.get_egress_policy())
            await sbx.delete_egress_rules(targets)
            pol = await sbx.get_egress_policy()
            check(pol.default_action == "deny" and pairs(pol) == (want if want is not None else before), f"{what}: {pairs(pol)}")
        e = await expect_api_error_async(sbx.patch_egress_rules([]), 400)
        check("at least one rule" in str(e), f"{e}")
        await expect_api_error_async(sbx.delete_egress_rules([]), 400)

        ep = await sbx.get_endpoint(18080)
        # The raw checks block (httpx sync): the in-sandbox fetch goes through a sync client
        # of the same sandbox.
        same = SandboxSync.connect(sbx.id, connection_config=sync_config())
        try:
            policy_checks_raw(f"http://{ep.endpoint}/policy", ep.headers, "127.0.0.1",
                              lambda: " ".join(fetch(same, f"http://{up}/p").split()[:2]))
        finally:
            same.close()
    finally:
        await sbx.kill()
        await sbx.close()


def run(coro_fn):
    import asyncio

    return lambda: asyncio.run(coro_fn())


SCENARIOS = {
    "unresolved": unresolved,
    "unresolved_async": run(unresolved_async_flow),
    "policy": policy,
    "policy_async": run(policy_async_flow),
}
