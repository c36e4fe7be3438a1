"""File API scenarios of the official SDK (run as `sdk_e2e.py files:SCENARIO`): owners and
modes (names from the sandbox's own /etc/passwd and /etc/group, ids as the sandbox sees them),
and line-based reading (`offset`/`limit`), with the sync and the async clients.

Environment, besides sdk_e2e.py's: OSB_HOST_FILE (a host file, root-owned, mode 600, that no
chown or chmod may reach).
"""

import asyncio
import json
import os
import socket
import time

import httpx

from opensandbox import Sandbox, SandboxSync
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.filesystem import SetPermissionEntry, WriteEntry

from sdk_e2e import BASE, async_config, check, expect_api_error, lifecycle_headers, sync_config


def stat(sbx, path):
    """`%U %G %a` of `path` as the sandbox sees it."""
    ex = sbx.commands.run(f"stat -c '%U %G %a' {path}")
    check(ex.exit_code == 0, f"stat {path}: {ex.logs.stderr}")
    return ex.text


def ids(sbx, path):
    return sbx.commands.run(f"stat -c '%u %g' {path}").text


def info_of(fs, path):
    i = fs.get_file_info([path])[path]
    return (i.owner, i.group, i.mode)


def owners():
    host_file = os.environ["OSB_HOST_FILE"]
    host_stat = os.stat(host_file)
    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        fs = sbx.files
        # Names from the image's tables.
        fs.write_files([WriteEntry(path="/tmp/own/a.txt", data="a", mode=640, owner="nobody", group="nogroup")])
        check(stat(sbx, "/tmp/own/a.txt") == "nobody nogroup 640", f"inside: {stat(sbx, '/tmp/own/a.txt')}")
        check(ids(sbx, "/tmp/own/a.txt") == "65534 65534", "ids inside")
        check(info_of(fs, "/tmp/own/a.txt") == ("nobody", "nogroup", 640), f"info {info_of(fs, '/tmp/own/a.txt')}")
        check(fs.read_file("/tmp/own/a.txt") == "a", "content")
        # A user and a group added to the sandbox's own tables (its processes cannot write
        # /etc, the file API can).
        fs.write_files(
            [
                WriteEntry(path="/etc/passwd", data=fs.read_file("/etc/passwd") + "alice:x:1234:1234::/tmp:/bin/sh\n", mode=644),
                WriteEntry(path="/etc/group", data=fs.read_file("/etc/group") + "crew:x:4321:\n", mode=644),
            ]
        )
        check(sbx.commands.run("id -un 1234").text == "alice", "alice seen inside")
        fs.write_files([WriteEntry(path="/tmp/own/alice.txt", data="x\n", mode=600, owner="alice", group="crew")])
        check(stat(sbx, "/tmp/own/alice.txt") == "alice crew 600", f"alice: {stat(sbx, '/tmp/own/alice.txt')}")
        check(info_of(fs, "/tmp/own/alice.txt") == ("alice", "crew", 600), "alice's info")
        # She really owns it: she can write it, another user cannot read it.
        ex = sbx.commands.run("echo more >> /tmp/own/alice.txt && cat /tmp/own/alice.txt", opts=RunCommandOpts(uid=1234, gid=1234))
        check(ex.exit_code == 0 and ex.text == "x\nmore", f"alice writes her file: {ex.text!r} {ex.logs.stderr}")
        ex = sbx.commands.run("cat /tmp/own/alice.txt", opts=RunCommandOpts(uid=1000, gid=1000))
        check(ex.exit_code != 0, "uid 1000 reads alice's 600 file")
        # Straight into /tmp (sticky), over a file another user owns, and into the workspace.
        for p in ["/tmp/direct.txt", "/tmp/own/alice.txt", "/workspace/w.txt"]:
            fs.write_files([WriteEntry(path=p, data="d", mode=644, owner="nobody", group="nogroup")])
            check(stat(sbx, p) == "nobody nogroup 644" and fs.read_file(p) == "d", f"{p}: {stat(sbx, p)}")
        fs.write_files([WriteEntry(path="/tmp/own/alice.txt", data="x\n", mode=600, owner="alice", group="crew")])
        # Numeric ids as they are, including ids no table names.
        fs.write_files([WriteEntry(path="/tmp/own/n.txt", data="n", mode=644, owner="2000", group="3000")])
        check(ids(sbx, "/tmp/own/n.txt") == "2000 3000", f"numeric: {ids(sbx, '/tmp/own/n.txt')}")
        check(info_of(fs, "/tmp/own/n.txt") == ("2000", "3000", 644), f"numeric info {info_of(fs, '/tmp/own/n.txt')}")
        # The mode is set after the owner: set-id bits stay.
        fs.write_files([WriteEntry(path="/tmp/own/suid", data="#!/bin/sh\n", mode=4750, owner="alice", group="crew")])
        check(stat(sbx, "/tmp/own/suid") == "alice crew 4750", f"suid: {stat(sbx, '/tmp/own/suid')}")
        # set_permissions: only the owner, then only the group; the other stays.
        fs.set_permissions([SetPermissionEntry(path="/tmp/own/a.txt", owner="alice", mode=604)])
        check(stat(sbx, "/tmp/own/a.txt") == "alice nogroup 604", f"owner only: {stat(sbx, '/tmp/own/a.txt')}")
        fs.set_permissions([SetPermissionEntry(path="/tmp/own/a.txt", group="crew", mode=640)])
        check(stat(sbx, "/tmp/own/a.txt") == "alice crew 640", f"group only: {stat(sbx, '/tmp/own/a.txt')}")
        # Neither: the mode alone changes, on a file another sandbox user owns.
        fs.set_permissions([SetPermissionEntry(path="/tmp/own/n.txt", mode=600)])
        check(ids(sbx, "/tmp/own/n.txt") == "2000 3000" and stat(sbx, "/tmp/own/n.txt").endswith(" 600"), "mode only")
        # Directories too (the one named, not the parents made for it).
        fs.create_directories([WriteEntry(path="/tmp/own/d/e", mode=750, owner="alice", group="nogroup")])
        check(stat(sbx, "/tmp/own/d/e") == "alice nogroup 750", f"dir: {stat(sbx, '/tmp/own/d/e')}")
        check(stat(sbx, "/tmp/own/d") == "root root 750", f"parent: {stat(sbx, '/tmp/own/d')}")
        fs.set_permissions([SetPermissionEntry(path="/tmp/own/d/e", owner="root", group="root", mode=700)])
        check(stat(sbx, "/tmp/own/d/e") == "root root 700", "dir back to root")

        # Errors: a clear 400 naming what is wrong, and nothing written or changed.
        for owner, group, word in [("nosuchuser", None, "nosuchuser"), (None, "nosuchgroup", "nosuchgroup"), ("70000", None, "70000")]:
            e = expect_api_error(
                lambda: fs.write_files([WriteEntry(path="/tmp/own/bad.txt", data="b", owner=owner, group=group)]),
                400,
                "INVALID_FILE_METADATA",
            )
            check(word in str(e.error.message), f"message names {word}: {e.error.message}")
            check(sbx.commands.run("test -e /tmp/own/bad.txt").exit_code == 1, f"{word}: a file was left")
            check(sbx.commands.run("ls -A /tmp/own | grep -c agentrun").text == "0", "no partial upload left")
        e = expect_api_error(
            lambda: fs.set_permissions(
                [SetPermissionEntry(path="/tmp/own/a.txt", owner="nobody", mode=777), SetPermissionEntry(path="/tmp/own/n.txt", owner="ghost")]
            ),
            400,
            "INVALID_FILE_METADATA",
        )
        check("ghost" in e.error.message, f"set_permissions names ghost: {e.error.message}")
        check(stat(sbx, "/tmp/own/a.txt") == "alice crew 640", "a failed set_permissions changed a file")
        expect_api_error(lambda: fs.set_permissions([SetPermissionEntry(path="/tmp/own/missing", owner="root")]), 404)

        # Never outside the sandbox: a symlink to a host path, .. in the path, host-owned files.
        ex = sbx.commands.run(f"ln -s {host_file} /tmp/own/link && ln -s / /tmp/own/root")
        check(ex.exit_code == 0, f"links: {ex.logs.stderr}")
        for p in ["/tmp/own/link", "/../../../.." + host_file, "/tmp/own/root" + host_file, "/proc/self/root" + host_file, "/proc/1/root" + host_file]:
            try:
                fs.set_permissions([SetPermissionEntry(path=p, owner="nobody", group="nogroup", mode=777)])
            except SandboxException:
                pass
        after = os.stat(host_file)
        check(
            (after.st_uid, after.st_gid, after.st_mode) == (host_stat.st_uid, host_stat.st_gid, host_stat.st_mode),
            f"host file changed: {after}",
        )
        e = expect_api_error(
            lambda: fs.set_permissions([SetPermissionEntry(path="/proc/sys/kernel/hostname", owner="nobody", mode=777)]), 403
        )
        # Names are never read from the host's tables.
        inside = {l.split(":")[0] for l in fs.read_file("/etc/passwd").splitlines()}
        host_only = [l.split(":")[0] for l in open("/etc/passwd") if l.split(":")[0] not in inside]
        check(host_only, "the host has users the sandbox does not")
        expect_api_error(
            lambda: fs.write_files([WriteEntry(path="/tmp/own/h.txt", data="h", owner=host_only[0])]), 400, "INVALID_FILE_METADATA"
        )
    finally:
        sbx.kill()


async def owners_async():
    sbx = await Sandbox.create("host", connection_config=async_config())
    try:
        fs = sbx.files
        await fs.write_files([WriteEntry(path="/tmp/o/a.txt", data="a", mode=640, owner="nobody", group="nogroup")])
        ex = await sbx.commands.run("stat -c '%U %G %a' /tmp/o/a.txt")
        check(ex.text == "nobody nogroup 640", f"async inside: {ex.text!r}")
        i = (await fs.get_file_info(["/tmp/o/a.txt"]))["/tmp/o/a.txt"]
        check((i.owner, i.group, i.mode) == ("nobody", "nogroup", 640), f"async info {i}")
        await fs.set_permissions([SetPermissionEntry(path="/tmp/o/a.txt", owner="1500", mode=600)])
        ex = await sbx.commands.run("stat -c '%u %G %a' /tmp/o/a.txt")
        check(ex.text == "1500 nogroup 600", f"async set_permissions: {ex.text!r}")
        try:
            await fs.write_files([WriteEntry(path="/tmp/o/b.txt", data="b", owner="nosuchuser")])
            raise AssertionError("an unknown owner was accepted")
        except SandboxApiException as e:
            check(e.status_code == 400 and "nosuchuser" in e.error.message, f"async unknown owner: {e}")
        check((await sbx.commands.run("test -e /tmp/o/b.txt")).exit_code == 1, "async: a file was left")
    finally:
        await sbx.kill()


FIVE = "line1\nline2\nline3\nline4\nline5"


def lines():
    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        fs = sbx.files
        fs.write_files(
            [
                WriteEntry(path="/tmp/five.txt", data=FIVE),
                WriteEntry(path="/tmp/crlf.txt", data="a\r\nb\r\nc\n"),
                WriteEntry(path="/tmp/empty.txt", data=""),
            ]
        )
        for offset, limit, want in [
            (2, 2, "line2\nline3"),
            (4, None, "line4\nline5"),
            (None, 2, "line1\nline2"),
            (1, None, FIVE),
            (5, 10, "line5"),
            (6, None, ""),
            (100, 1, ""),
        ]:
            got = fs.read_file("/tmp/five.txt", offset=offset, limit=limit)
            check(got == want, f"offset {offset} limit {limit}: {got!r} != {want!r}")
        check(fs.read_file("/tmp/crlf.txt", offset=1) == "a\nb\nc", "CRLF lines")
        check(fs.read_file("/tmp/crlf.txt", offset=2, limit=1) == "b", "one CRLF line")
        check(fs.read_file("/tmp/empty.txt", offset=1) == "", "empty file")
        check(fs.read_bytes("/tmp/five.txt", limit=1) == b"line1", "bytes of a line")
        # Without offset/limit: the file as it is.
        check(fs.read_file("/tmp/five.txt") == FIVE, "whole file")
        # Bad values: 400; a missing file: 404 first.
        for offset, limit, name in [(0, None, "offset"), (-1, None, "offset"), (None, 0, "limit"), (1, -2, "limit")]:
            e = expect_api_error(lambda: fs.read_file("/tmp/five.txt", offset=offset, limit=limit), 400, "INVALID_REQUEST_BODY")
            check(f"'{name}'" in e.error.message, f"message names {name}: {e.error.message}")
        expect_api_error(lambda: fs.read_file("/tmp/missing.txt", offset=0), 404)
        e = expect_api_error(lambda: fs.read_bytes("/tmp/five.txt", range_header="bytes=0-3", offset=1), 400)
        check("mutually exclusive" in e.error.message, f"Range with offset: {e.error.message}")
    finally:
        sbx.kill()


async def lines_async():
    sbx = await Sandbox.create("host", connection_config=async_config())
    try:
        fs = sbx.files
        await fs.write_file("/tmp/five.txt", FIVE)
        for offset, limit, want in [(2, 2, "line2\nline3"), (4, None, "line4\nline5"), (None, 2, "line1\nline2"), (9, None, "")]:
            got = await fs.read_file("/tmp/five.txt", offset=offset, limit=limit)
            check(got == want, f"async offset {offset} limit {limit}: {got!r}")
        try:
            await fs.read_file("/tmp/five.txt", offset=0)
            raise AssertionError("offset 0 was accepted")
        except SandboxApiException as e:
            check(e.status_code == 400 and "'offset'" in e.error.message, f"async offset 0: {e}")
    finally:
        await sbx.kill()


def _http_response(sock):
    """One HTTP/1.1 response read off `sock` (Content-Length bodies): (status line, body);
    (None, b"") when the server closed the connection first."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            return None, data
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next((int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length"), 0)
    while len(body) < length:
        got = sock.recv(65536)
        if not got:
            break
        body += got
    return lines[0], body


def upload_keeps_the_connection():
    """An upload whose last bytes (the CRLF after the closing boundary, which the SDKs send)
    come in a segment of their own leaves the connection usable: the next request on it is
    answered. Before the fix the server answered 200 at the closing boundary and closed the
    connection when the CRLF was not there yet, after an answer that did not say `Connection:
    close`, and a client reusing it (every SDK does) failed with "Server disconnected without
    sending a response" (issue 36). The pause before the tail only makes the old failure sure
    (the server has answered by then); the fixed server reads the tail before answering, so
    the test passes whatever the timing."""
    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        ep = httpx.get(f"{BASE}/sandboxes/{sbx.id}/endpoints/44772", headers=lifecycle_headers()).json()
        hostport, _, prefix = ep["endpoint"].partition("/")
        host, port = hostport.rsplit(":", 1)
        prefix = "/" + prefix if prefix else ""
        extra = "".join(f"{k}: {v}\r\n" for k, v in ep.get("headers", {}).items())
        b = "agentrunboundary"
        meta = json.dumps({"path": "/tmp/tail.txt", "mode": 644})
        body = (f"--{b}\r\nContent-Disposition: form-data; name=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{meta}\r\n"
                f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"tail.txt\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\ntail\r\n--{b}--\r\n").encode()
        head = (f"POST {prefix}/files/upload HTTP/1.1\r\nHost: {hostport}\r\n{extra}"
                f"Content-Type: multipart/form-data; boundary={b}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection((host, int(port)), timeout=20) as s:
            s.sendall(head + body[:-2])
            time.sleep(0.3)
            s.sendall(body[-2:])
            status, _ = _http_response(s)
            check(status is not None and " 200 " in status + " ", f"upload answered {status!r}")
            try:
                s.sendall((f"GET {prefix}/files/download?path=/tmp/tail.txt HTTP/1.1\r\nHost: {hostport}\r\n{extra}\r\n").encode())
                status, got = _http_response(s)
            except OSError as e:
                status, got = None, repr(e)
            check(status is not None, "the server closed the connection after the upload's answer")
            check(" 200 " in status + " " and got == b"tail", f"download on the same connection: {status!r} {got!r}")
        # The SDK's own sequence, many times: upload then a command on the pooled connection.
        for i in range(20):
            sbx.files.write_files([WriteEntry(path=f"/tmp/k{i}.txt", data=str(i), mode=644)])
            check(sbx.commands.run(f"cat /tmp/k{i}.txt").text == str(i), f"command {i} after an upload")
    finally:
        sbx.kill()


SCENARIOS = {
    "upload_keeps_the_connection": upload_keeps_the_connection,
    "owners": owners,
    "owners_async": lambda: asyncio.run(owners_async()),
    "lines": lines,
    "lines_async": lambda: asyncio.run(lines_async()),
}
