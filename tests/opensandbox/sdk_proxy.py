"""The server-side proxy (`ConnectionConfig(use_server_proxy=True)`): every endpoint is
`{server}/v1/sandboxes/{id}/proxy/{port}`, behind the API key; the server puts the sandbox's
own token in itself, and never forwards a credential into the sandbox.

Scenarios (run by tests/tests/opensandbox_proxy.rs through `sdk_e2e.py proxy:NAME`, against a
daemon started with `--api-key $OSB_API_KEY`, but no_key):
  sync   the sync SDK through the proxy: commands (streamed), files, background logs,
         egress policy get/patch, a user's HTTP server and a WebSocket on a sandbox port,
         a Python code context
  async  the same with the async SDK (but code)
  no_key against a daemon without a key (loopback): open as /v1 is, tokens still put in
  auth   what the proxy route refuses: no key, a wrong key, a token instead of the key
         (401), no such sandbox (404), bad ports (400), nothing listening (502)
"""

import asyncio
import socket
import time

import httpx
import websockets.sync.client
from opensandbox import Sandbox, SandboxSync
from opensandbox.config import ConnectionConfig, ConnectionConfigSync
from opensandbox.exceptions import SandboxException
from opensandbox.models.execd import ExecutionHandlers, RunCommandOpts
from opensandbox.models.execd_sync import ExecutionHandlersSync
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

from sdk_e2e import API_KEY, DOMAIN, check

EXECD_PORT = 44772
EGRESS_PORT = 18080
USER_PORT = 8000
CREDENTIALS = {"open-sandbox-api-key", "x-execd-access-token", "opensandbox-egress-auth"}


def proxy_sync_config(api_key=API_KEY):
    return ConnectionConfigSync(domain=DOMAIN, api_key=api_key, protocol="http", use_server_proxy=True)


def proxy_async_config(api_key=API_KEY):
    return ConnectionConfig(domain=DOMAIN, api_key=api_key, protocol="http", use_server_proxy=True)


def policy():
    return NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="pypi.org")])


def key_headers():
    return {"OPEN-SANDBOX-API-KEY": API_KEY}


# A user's server inside the sandbox on USER_PORT: HTTP (echoes what it was sent) and a
# minimal WebSocket endpoint at /ws (answers each text message upper-cased), with nothing
# but the standard library.
USER_SERVER = r"""
import base64, hashlib, http.server, json, struct
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Set-Cookie", "agentrun_ui=planted; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))[::-1]
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def websocket(self):
        accept = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        r = self.rfile
        while True:
            head = r.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            out = data.decode().upper().encode()
            assert len(out) < 126
            self.wfile.write(bytes([0x81, len(out)]) + out)
            self.wfile.flush()
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""


def check_endpoints(sid, endpoints):
    """The lookup in server-proxy mode: `{server}/v1/sandboxes/{id}/proxy/{port}`, no
    headers (no token handed out)."""
    for port, ep in endpoints.items():
        want = f"{DOMAIN}/v1/sandboxes/{sid}/proxy/{port}"
        check(ep.endpoint == want, f"endpoint of {port}: {ep.endpoint!r} != {want!r}")
        check(not ep.headers, f"the lookup handed out headers in proxy mode: {ep.headers}")


def wait_user_server(url):
    deadline = time.monotonic() + 20
    while True:
        r = httpx.get(f"{url}/hello?x=1", headers={
            **key_headers(), "X-Execd-Access-Token": "t", "OPENSANDBOX-EGRESS-AUTH": "e",
            "Authorization": "Bearer other-app", "Cookie": "session=other-app", "X-App": "kept"})
        if r.status_code == 200:
            return r
        check(time.monotonic() < deadline and r.status_code == 502, f"user server {r.status_code} {r.text}")
        time.sleep(0.2)


def check_user_port(ep):
    """HTTP both ways and a WebSocket through the server proxy to the user's server; no
    credential reaches it."""
    url = f"http://{ep.endpoint}"
    r = wait_user_server(url)
    # Served at the server's (and dashboard's) origin: no cookie of the sandbox's, its
    # content confined to an opaque origin.
    check("set-cookie" not in r.headers, f"the sandbox's Set-Cookie reached the client: {r.headers}")
    check("sandbox" in r.headers.get_list("content-security-policy"), f"no CSP sandbox: {r.headers}")
    check(r.headers.get("x-content-type-options") == "nosniff", f"no nosniff: {r.headers}")
    seen = r.json()
    check(seen["path"] == "/hello?x=1", f"path {seen}")
    got = {k.lower() for k in seen["headers"]}
    check(not (got & CREDENTIALS), f"credentials forwarded to the user's port: {seen['headers']}")
    # The server's origin is shared by every sandbox: no cookie or Authorization crosses it.
    check(not (got & {"authorization", "cookie"}), f"shared-origin headers forwarded: {seen['headers']}")
    check({k.lower(): v for k, v in seen["headers"].items()}.get("x-app") == "kept", f"the app's own header: {seen['headers']}")
    r = httpx.post(f"{url}/echo", content=b"abc" * 100000, headers=key_headers())
    check(r.status_code == 201 and r.content == (b"abc" * 100000)[::-1], f"post {r.status_code} {len(r.content)}")
    check(httpx.get(f"{url}/hello").status_code == 401, "the user's port without the API key")
    with websockets.sync.client.connect(f"ws://{ep.endpoint}/ws", additional_headers=key_headers(), open_timeout=10) as ws:
        ws.send("hello proxy")
        check(ws.recv(timeout=10) == "HELLO PROXY", "websocket echo")
        ws.send("again")
        check(ws.recv(timeout=10) == "AGAIN", "websocket second message")


def sync():
    check(API_KEY, "the proxy scenarios need OSB_API_KEY (the daemon's --api-key)")
    cfg = proxy_sync_config()
    sbx = SandboxSync.create("host", connection_config=cfg, network_policy=policy())
    try:
        check_endpoints(sbx.id, {p: sbx.get_endpoint(p) for p in (EXECD_PORT, EGRESS_PORT, USER_PORT)})
        # Streamed: the first line reaches the handler while the command still runs.
        times = {}
        handlers = ExecutionHandlersSync(on_stdout=lambda m: times.setdefault(m.text, time.monotonic()))
        ex = sbx.commands.run("echo first; sleep 1.5; echo second", handlers=handlers)
        check([m.text for m in ex.logs.stdout] == ["first", "second"], f"output {ex.logs.stdout}")
        check(times["second"] - times["first"] > 1.0, f"not streamed: {times}")
        check(sbx.commands.run("echo e >&2; exit 3").exit_code == 3, "exit code")
        # Files both ways, one bigger than a download chunk.
        sbx.files.write_file("/tmp/a.txt", "through the server")
        check(sbx.files.read_file("/tmp/a.txt") == "through the server", "read back")
        big = bytes(range(256)) * 4096
        sbx.files.write_file("/tmp/big.bin", big)
        check(b"".join(sbx.files.read_bytes_stream("/tmp/big.bin")) == big, "big file streamed back")
        # A background command's logs.
        bg = sbx.commands.run("echo bg-line; sleep 100", opts=RunCommandOpts(background=True))
        deadline = time.monotonic() + 10
        while "bg-line" not in sbx.commands.get_background_command_logs(bg.id).content:
            check(time.monotonic() < deadline, "background logs")
            time.sleep(0.1)
        sbx.commands.interrupt(bg.id)
        # The egress API through the proxy (the server puts in the egress token).
        pol = sbx.get_egress_policy()
        check(pol.default_action == "deny" and [r.target for r in pol.egress] == ["pypi.org"], f"policy {pol}")
        sbx.patch_egress_rules([NetworkRule(action="allow", target="example.org")])
        pol = sbx.get_egress_policy()
        check([(r.action, r.target) for r in pol.egress] == [("allow", "example.org"), ("allow", "pypi.org")], f"patched {pol}")
        # A user's server on a port of the sandbox.
        sbx.files.write_file("/tmp/server.py", USER_SERVER)
        sbx.commands.run("python3 /tmp/server.py", opts=RunCommandOpts(background=True))
        check_user_port(sbx.get_endpoint(USER_PORT))
        # Code contexts (`/code`) through the proxy too.
        from code_interpreter.sync.code_interpreter import CodeInterpreterSync

        ci = CodeInterpreterSync.create(sandbox=sbx, skip_health_check=True)
        r = ci.codes.run("x = 40\nprint('hi')\nx + 2")
        check([m.text for m in r.logs.stdout] == ["hi"] and [res.text for res in r.result] == ["42"], f"code {r}")
        check(ci.codes.run("open('/tmp/a.txt').read()").result[0].text == "'through the server'", "code sees the files")
    finally:
        sbx.kill()


async def async_flow():
    check(API_KEY, "the proxy scenarios need OSB_API_KEY (the daemon's --api-key)")
    cfg = proxy_async_config()
    sbx = await Sandbox.create("host", connection_config=cfg, network_policy=policy())
    try:
        check_endpoints(sbx.id, {p: await sbx.get_endpoint(p) for p in (EXECD_PORT, EGRESS_PORT, USER_PORT)})
        times = {}

        async def on_stdout(m):
            times.setdefault(m.text, time.monotonic())

        ex = await sbx.commands.run("echo first; sleep 1.5; echo second", handlers=ExecutionHandlers(on_stdout=on_stdout))
        check([m.text for m in ex.logs.stdout] == ["first", "second"], f"output {ex.logs.stdout}")
        check(times["second"] - times["first"] > 1.0, f"not streamed: {times}")
        await sbx.files.write_file("/tmp/a.txt", "async through the server")
        check(await sbx.files.read_file("/tmp/a.txt") == "async through the server", "async read back")
        big = bytes(range(256)) * 4096
        await sbx.files.write_file("/tmp/big.bin", big)
        got = b"".join([c async for c in await sbx.files.read_bytes_stream("/tmp/big.bin")])
        check(got == big, "async big file streamed back")
        bg = await sbx.commands.run("echo bg-line; sleep 100", opts=RunCommandOpts(background=True))
        deadline = time.monotonic() + 10
        while "bg-line" not in (await sbx.commands.get_background_command_logs(bg.id)).content:
            check(time.monotonic() < deadline, "async background logs")
            await asyncio.sleep(0.1)
        await sbx.commands.interrupt(bg.id)
        pol = await sbx.get_egress_policy()
        check(pol.default_action == "deny" and [r.target for r in pol.egress] == ["pypi.org"], f"policy {pol}")
        await sbx.patch_egress_rules([NetworkRule(action="deny", target="pypi.org")])
        pol = await sbx.get_egress_policy()
        check([(r.action, r.target) for r in pol.egress] == [("deny", "pypi.org")], f"patched {pol}")
        await sbx.files.write_file("/tmp/server.py", USER_SERVER)
        await sbx.commands.run("python3 /tmp/server.py", opts=RunCommandOpts(background=True))
        ep = await sbx.get_endpoint(USER_PORT)
        await asyncio.to_thread(check_user_port, ep)
    finally:
        await sbx.kill()
        await sbx.close()


def auth():
    check(API_KEY, "the proxy scenarios need OSB_API_KEY (the daemon's --api-key)")
    # A wrong key: the SDK cannot even create.
    try:
        SandboxSync.create("host", connection_config=proxy_sync_config(api_key="wrong"))
        raise AssertionError("create with a wrong key through the proxy config must fail")
    except SandboxException:
        pass
    sbx = SandboxSync.create("host", connection_config=proxy_sync_config())
    try:
        base = f"http://{DOMAIN}/v1/sandboxes/{sbx.id}/proxy"
        ping = f"{base}/{EXECD_PORT}/ping"
        check(httpx.get(ping, headers=key_headers()).status_code == 200, "ping with the key")
        r = httpx.get(ping)
        check(r.status_code == 401 and r.json()["code"] == "MISSING_API_KEY", f"no key: {r.status_code} {r.text}")
        r = httpx.get(ping, headers={"OPEN-SANDBOX-API-KEY": "wrong"})
        check(r.status_code == 401 and r.json()["code"] == "INVALID_API_KEY", f"wrong key: {r.status_code} {r.text}")
        # The sandbox's own tokens are not a substitute for the key on this route.
        direct = SandboxSync.connect(sbx.id, connection_config=ConnectionConfigSync(domain=DOMAIN, api_key=API_KEY, protocol="http"))
        try:
            execd_headers = direct.get_endpoint(EXECD_PORT).headers
            egress_headers = direct.get_endpoint(EGRESS_PORT).headers
            check(execd_headers and egress_headers, "the direct lookup hands out the tokens")
            r = httpx.post(f"{base}/{EXECD_PORT}/command", json={"command": "echo pwned"}, headers=execd_headers)
            check(r.status_code == 401, f"execd token without the key: {r.status_code} {r.text}")
            r = httpx.get(f"{base}/{EGRESS_PORT}/policy", headers=egress_headers)
            check(r.status_code == 401, f"egress token without the key: {r.status_code} {r.text}")
        finally:
            direct.close()
        # The key is checked from the headers: the 401 comes though the body never does.
        host, port = DOMAIN.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as c:
            c.sendall(f"POST /v1/sandboxes/{sbx.id}/proxy/{EXECD_PORT}/files/upload HTTP/1.1\r\nHost: {DOMAIN}\r\n"
                      "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 1000000000\r\n\r\n--b".encode())
            head = c.recv(4096)
            check(head.startswith(b"HTTP/1.1 401"), f"unread body without the key: {head!r}")
        # No such sandbox: 404, with the key.
        r = httpx.get(f"http://{DOMAIN}/v1/sandboxes/no-such-sandbox/proxy/{EXECD_PORT}/ping", headers=key_headers())
        check(r.status_code == 404 and r.json()["code"] == "SANDBOX::NOT_FOUND", f"unknown sandbox: {r.status_code} {r.text}")
        r = httpx.get(f"http://{DOMAIN}/v1/sandboxes/no-such-sandbox/endpoints/{EXECD_PORT}",
                      params={"use_server_proxy": "true"}, headers=key_headers())
        check(r.status_code == 404, f"unknown sandbox's endpoint: {r.status_code} {r.text}")
        # Without the key even an unknown sandbox is a 401: nothing is told before the key.
        r = httpx.get(f"http://{DOMAIN}/v1/sandboxes/no-such-sandbox/proxy/{EXECD_PORT}/ping")
        check(r.status_code == 401, f"unknown sandbox without key: {r.status_code} {r.text}")
        # Bad ports, and nothing listening.
        for bad in ("0", "70000", "http"):
            r = httpx.get(f"{base}/{bad}/", headers=key_headers())
            check(r.status_code == 400 and set(r.json()) == {"code", "message"}, f"port {bad}: {r.status_code} {r.text}")
        r = httpx.get(f"{base}/8009/", headers=key_headers())
        check(r.status_code == 502 and "8009" in r.json()["message"], f"nothing listening: {r.status_code} {r.text}")
        # An execd path that does not exist: the JSON 404 of the API.
        r = httpx.get(f"{base}/{EXECD_PORT}/no-such-route", headers=key_headers())
        check(r.status_code == 404 and set(r.json()) == {"code", "message"}, f"no such route: {r.status_code} {r.text}")
        # A bad use_server_proxy value.
        r = httpx.get(f"http://{DOMAIN}/v1/sandboxes/{sbx.id}/endpoints/{EXECD_PORT}",
                      params={"use_server_proxy": "maybe"}, headers=key_headers())
        check(r.status_code == 400, f"use_server_proxy=maybe: {r.status_code} {r.text}")
    finally:
        sbx.kill()


def no_key():
    """A daemon without an API key (`--insecure-no-auth`): the proxy route is as open as `/v1`,
    and still puts the tokens in itself."""
    check(not API_KEY, "no_key runs against a daemon with --insecure-no-auth")
    sbx = SandboxSync.create("host", connection_config=proxy_sync_config(api_key=None))
    try:
        check_endpoints(sbx.id, {EXECD_PORT: sbx.get_endpoint(EXECD_PORT)})
        check(sbx.commands.run("echo open").text == "open", "a command without a key")
        r = httpx.get(f"http://{DOMAIN}/v1/sandboxes/no-such-sandbox/proxy/{EXECD_PORT}/ping")
        check(r.status_code == 404, f"unknown sandbox: {r.status_code} {r.text}")
    finally:
        sbx.kill()


SCENARIOS = {
    "sync": sync,
    "no_key": no_key,
    "async": lambda: asyncio.run(async_flow()),
    "auth": auth,
}
