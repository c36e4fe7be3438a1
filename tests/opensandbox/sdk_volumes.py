"""OpenSandbox `volumes` with the official SDK (sync and async): host volumes under the
daemon's --volume-root, named (`pvc`) volumes kept by agentrun, subPath, readOnly, ownership,
and every way out of a root refused. Run as `sdk_e2e.py volumes:SCENARIO` by
tests/tests/opensandbox_volumes.rs.

Environment (besides sdk_e2e's): OSB_VOLUME_ROOT (the daemon's --volume-root, a fresh dir the
test made, holding `seed/hello.txt` and `owned/` owned by 1234:1234), OSB_OUTSIDE (a host
directory outside it, holding `secret.txt`), OSB_SUFFIX (unique per test run: named volumes
of this run are `*-OSB_SUFFIX`).
"""

import asyncio
import json
import os
import subprocess
import time

import httpx
from opensandbox import Sandbox, SandboxSync
from opensandbox.models.filesystem import WriteEntry
from opensandbox.models.sandboxes import PVC, Host, Volume

from sdk_e2e import (
    BASE,
    async_config,
    check,
    expect_api_error,
    lifecycle_headers,
    sync_config,
)

ROOT = os.environ.get("OSB_VOLUME_ROOT", "")
OUTSIDE = os.environ.get("OSB_OUTSIDE", "")
SUFFIX = os.environ.get("OSB_SUFFIX", "x")


def agentrun(*args):
    out = subprocess.run([os.environ["OSB_AGENTRUN"], *args], capture_output=True, text=True, timeout=60)
    return out.returncode, out.stdout, out.stderr


def volume_ls():
    code, out, err = agentrun("volume", "ls", "--json")
    check(code == 0, f"agentrun volume ls: {code} {err}")
    return {v["name"]: v for v in json.loads(out)}


def run(sbx, cmd):
    ex = sbx.commands.run(cmd)
    out = "\n".join(m.text for m in ex.logs.stdout)
    err = "\n".join(m.text for m in ex.logs.stderr)
    return ex.exit_code, out, err


def raw_create(volumes):
    """POST /v1/sandboxes with these volumes as JSON, past the SDK's own checks."""
    body = {
        "image": {"uri": "host"},
        "entrypoint": ["sleep", "infinity"],
        "timeout": 600,
        "resourceLimits": {},
        "volumes": volumes,
    }
    return httpx.post(f"{BASE}/sandboxes", json=body, headers=lifecycle_headers(), timeout=60)


def sandbox_count():
    r = httpx.get(f"{BASE}/sandboxes", headers=lifecycle_headers(), timeout=30)
    return r.json()["pagination"]["totalItems"]


def host_volumes():
    """Host volumes: read-write (files land on the host, owned like the directory), read-only
    (a write fails with EROFS, through commands and the file API), subPath, and a file
    written on the host seen inside at once."""
    sbx = SandboxSync.create(
        "host",
        connection_config=sync_config(),
        volumes=[
            Volume(name="rw", host=Host(path=f"{ROOT}/rw"), mount_path="/mnt/rw"),
            Volume(name="ro", host=Host(path=f"{ROOT}/seed"), mount_path="/mnt/ro", read_only=True),
            Volume(name="sub", host=Host(path=ROOT), mount_path="/mnt/sub", sub_path="nested/deeper"),
            Volume(name="owned", host=Host(path=f"{ROOT}/owned"), mount_path="/mnt/owned"),
        ],
    )
    try:
        # rw: made on the host when missing; a write inside lands on the host.
        check(os.path.isdir(f"{ROOT}/rw"), "the missing host directory was made")
        code, out, err = run(sbx, "echo from-sandbox > /mnt/rw/out.txt && id -u && stat -c %u /mnt/rw/out.txt")
        check(code == 0 and out.split() == ["0", "0"], f"write to rw: {code} {out!r} {err!r}")
        check(open(f"{ROOT}/rw/out.txt").read() == "from-sandbox\n", "the file is on the host")
        st = os.stat(f"{ROOT}/rw/out.txt")
        check((st.st_uid, st.st_gid) == (0, 0), f"root-owned dir: the file is root's on the host: {st.st_uid}:{st.st_gid}")
        # The file API writes there too.
        sbx.files.write_files([WriteEntry(path="/mnt/rw/api.txt", data="via api")])
        check(open(f"{ROOT}/rw/api.txt").read() == "via api", "file API write lands on the host")
        # A host-side write is seen inside.
        with open(f"{ROOT}/rw/from-host.txt", "w") as f:
            f.write("host says hi")
        check(sbx.files.read_file("/mnt/rw/from-host.txt") == "host says hi", "host write seen inside")

        # ro: readable, never writable.
        code, out, _ = run(sbx, "cat /mnt/ro/hello.txt")
        check(code == 0 and out == "hello from the host", f"read ro: {out!r}")
        code, out, err = run(sbx, "touch /mnt/ro/new 2>&1; echo rc=$?")
        check("Read-only file system" in out and "rc=1" in out, f"write to ro: {out!r} {err!r}")
        code, out, err = run(sbx, "rm /mnt/ro/hello.txt 2>&1; echo rc=$?")
        check("Read-only file system" in out, f"rm on ro: {out!r}")
        try:
            sbx.files.write_files([WriteEntry(path="/mnt/ro/api.txt", data="x")])
            raise AssertionError("file API write to a read-only volume succeeded")
        except AssertionError:
            raise
        except Exception as e:  # the SDK's error for a failed upload
            check("api.txt" not in os.listdir(f"{ROOT}/seed"), f"nothing written: {e}")
        check(sorted(os.listdir(f"{ROOT}/seed")) == ["hello.txt"], "the ro dir is unchanged")

        # subPath: made inside the host path, mounted alone.
        check(os.path.isdir(f"{ROOT}/nested/deeper"), "subPath made")
        code, out, _ = run(sbx, "echo s > /mnt/sub/s.txt && ls /mnt/sub")
        check(out == "s.txt" and os.path.exists(f"{ROOT}/nested/deeper/s.txt"), f"subPath: {out!r}")

        # A directory owned by another host user: the sandbox's root writes as that owner.
        code, out, err = run(sbx, "stat -c %u:%g /mnt/owned && echo o > /mnt/owned/o.txt && stat -c %u /mnt/owned/o.txt")
        check(code == 0 and out.split() == ["0:0", "0"], f"owned dir inside: {out!r} {err!r}")
        st = os.stat(f"{ROOT}/owned/o.txt")
        check((st.st_uid, st.st_gid) == (1234, 1234), f"owned: the file is 1234:1234 on the host: {st.st_uid}:{st.st_gid}")

        # No setuid through a volume: mounts are nosuid inside.
        code, out, _ = run(sbx, "grep ' /mnt/rw ' /proc/self/mounts")
        check("nosuid" in out and "nodev" in out, f"mount options: {out!r}")
    finally:
        sbx.kill()


def host_refused():
    """Every host path outside the roots, and every way out of one, is a 400 naming why; no
    sandbox is left behind by a refused create, nothing is made outside."""
    before = sandbox_count()
    cases = [
        ([{"name": "a", "host": {"path": OUTSIDE}, "mountPath": "/m"}], "VOLUME::HOST_PATH_NOT_ALLOWED", ROOT),
        ([{"name": "a", "host": {"path": "/etc"}, "mountPath": "/m"}], "VOLUME::HOST_PATH_NOT_ALLOWED", ROOT),
        ([{"name": "a", "host": {"path": f"{ROOT}/../outside"}, "mountPath": "/m"}], "VOLUME::INVALID_HOST_PATH", None),
        ([{"name": "a", "host": {"path": f"{ROOT}/escape"}, "mountPath": "/m"}], "VOLUME::INVALID_PATH", "leads out"),
        ([{"name": "a", "host": {"path": f"{ROOT}/escape/made-outside"}, "mountPath": "/m"}], "VOLUME::INVALID_PATH", None),
        ([{"name": "a", "host": {"path": ROOT}, "mountPath": "/m", "subPath": "escape"}], "VOLUME::INVALID_PATH", None),
        ([{"name": "a", "host": {"path": ROOT}, "mountPath": "/m", "subPath": "../x"}], "VOLUME::INVALID_SUB_PATH", None),
        ([{"name": "a", "host": {"path": ROOT}, "mountPath": "/m", "subPath": "/etc"}], "VOLUME::INVALID_SUB_PATH", None),
        ([{"name": "a", "host": {"path": ROOT}, "mountPath": "relative"}], "VOLUME::INVALID_MOUNT_PATH", None),
        ([{"name": "a", "host": {"path": ROOT}, "mountPath": "/proc/x"}], "VOLUME::INVALID_MOUNT_PATH", None),
        ([{"name": "Bad", "host": {"path": ROOT}, "mountPath": "/m"}], "VOLUME::INVALID_NAME", None),
        ([{"name": "a", "mountPath": "/m"}], "VOLUME::INVALID_BACKEND", None),
        ([{"name": "a", "host": {"path": ROOT}, "mountPath": "/m"},
          {"name": "a", "host": {"path": ROOT}, "mountPath": "/n"}], "VOLUME::DUPLICATE_NAME", None),
        ([{"name": "a", "ossfs": {"bucket": "bkt", "endpoint": "e", "accessKeyId": "i", "accessKeySecret": "s"},
           "mountPath": "/m"}], "VOLUME::UNSUPPORTED_BACKEND", "ossfs"),
    ]
    for vols, code, needle in cases:
        r = raw_create(vols)
        check(r.status_code == 400, f"{vols}: {r.status_code} {r.text}")
        body = r.json()
        check(body["code"] == code, f"{vols}: code {body['code']} != {code}: {body}")
        if needle:
            check(needle in body["message"], f"{vols}: {needle!r} not in {body['message']!r}")
        check("\n" not in body["message"], f"one line: {body['message']!r}")
    check(not os.path.exists(f"{OUTSIDE}/made-outside"), "nothing was made outside the root")
    check(sandbox_count() == before, "a refused create leaves no sandbox")
    # The SDK's own create raises the API's error.
    expect_api_error(
        lambda: SandboxSync.create(
            "host",
            connection_config=sync_config(),
            volumes=[Volume(name="a", host=Host(path=OUTSIDE), mount_path="/m")],
        ),
        400,
        "VOLUME::HOST_PATH_NOT_ALLOWED",
    )


async def named_volumes():
    """Named volumes (async SDK): made on first use, kept across sandboxes, held (not
    removable) while a sandbox uses them, subPath, readOnly, createIfNotExists=false,
    deleteOnSandboxTermination; a symlink planted by one sandbox cannot lead the next out."""
    keep, temp, missing = f"keep-{SUFFIX}", f"temp-{SUFFIX}", f"missing-{SUFFIX}"
    cfg = async_config()
    a = await Sandbox.create(
        "host",
        connection_config=cfg,
        volumes=[
            Volume(name="data", pvc=PVC(claim_name=keep), mount_path="/data"),
            Volume(name="scratch", pvc=PVC(claim_name=temp, delete_on_sandbox_termination=True), mount_path="/scratch"),
        ],
    )
    try:
        ex = await a.commands.run("echo persisted > /data/p.txt && mkdir -p /data/sub/dir && echo deep > /data/sub/dir/d.txt && ln -s /etc /data/esc && echo t > /scratch/t && echo ok")
        check(ex.logs.stdout and ex.logs.stdout[-1].text == "ok", f"writes: {ex.logs.stdout} {ex.logs.stderr}")
        vols = volume_ls()
        check(keep in vols and temp in vols, f"both made: {list(vols)}")
        check(vols[keep]["in_use"] and vols[keep]["created_by"] == "api", f"held: {vols[keep]}")
        data = vols[keep]["mountpoint"]
        check(open(f"{data}/p.txt").read() == "persisted\n", "the named volume's files are on the host")
        code, _, err = agentrun("volume", "rm", keep)
        check(code != 0 and "in use" in err, f"rm while in use: {code} {err!r}")
    finally:
        await a.kill()
        await a.close()

    # The sandbox went: the volume made for it with deleteOnSandboxTermination goes too.
    deadline = time.monotonic() + 20
    while temp in volume_ls():
        check(time.monotonic() < deadline, f"{temp} still there after its sandbox went")
        await asyncio.sleep(0.2)
    check(keep in volume_ls(), f"{keep} is kept")

    b = await Sandbox.create(
        "host",
        connection_config=cfg,
        volumes=[
            Volume(name="data", pvc=PVC(claim_name=keep, create_if_not_exists=False), mount_path="/data", read_only=True),
            Volume(name="deep", pvc=PVC(claim_name=keep), mount_path="/deep", sub_path="sub/dir"),
        ],
    )
    try:
        ex = await b.commands.run("cat /data/p.txt; ls /deep; touch /data/x 2>&1; echo rc=$?")
        out = [m.text for m in ex.logs.stdout]
        check(out[0] == "persisted" and out[1] == "d.txt", f"kept across sandboxes: {out}")
        check(any("Read-only file system" in l for l in out) and out[-1] == "rc=1", f"readOnly: {out}")
    finally:
        await b.kill()
        await b.close()

    # A symlink the first sandbox planted in the volume does not lead a subPath out of it.
    r = raw_create([{"name": "d", "pvc": {"claimName": keep}, "mountPath": "/d", "subPath": "esc"}])
    check(r.status_code == 400 and r.json()["code"] == "VOLUME::INVALID_PATH", f"symlink subPath: {r.status_code} {r.text}")
    r = raw_create([{"name": "d", "pvc": {"claimName": keep}, "mountPath": "/d", "subPath": "esc/shadow"}])
    check(r.status_code == 400, f"symlink subPath, deeper: {r.status_code} {r.text}")
    check(not os.path.exists("/etc/shadow/x"), "nothing made through the symlink")
    # createIfNotExists=false on a volume that does not exist.
    r = raw_create([{"name": "d", "pvc": {"claimName": missing, "createIfNotExists": False}, "mountPath": "/d"}])
    check(r.status_code == 400 and r.json()["code"] == "VOLUME::PVC_NOT_FOUND", f"missing: {r.status_code} {r.text}")
    check(missing in r.json()["message"], r.text)
    check(missing not in volume_ls(), "not made")

    # Released: removable now; inspect says where and who.
    code, out, err = agentrun("volume", "inspect", keep)
    info = json.loads(out)[0]
    check(code == 0 and not info["in_use"] and info["size_bytes"] > 0, f"inspect: {code} {out} {err}")
    code, out, err = agentrun("volume", "rm", keep)
    check(code == 0 and out.strip() == keep, f"rm: {code} {out!r} {err!r}")
    check(keep not in volume_ls() and not os.path.exists(data), "removed with its files")


async def host_volumes_async():
    """The async SDK mounts host volumes the same way (read-only here)."""
    sbx = await Sandbox.create(
        "host",
        connection_config=async_config(),
        volumes=[Volume(name="seed", host=Host(path=f"{ROOT}/seed"), mount_path="/seed", read_only=True)],
    )
    try:
        ex = await sbx.commands.run("cat /seed/hello.txt; echo; (echo x > /seed/y) 2>&1; echo rc=$?")
        out = [m.text for m in ex.logs.stdout]
        check(out[0] == "hello from the host" and out[-1] == "rc=1", f"async host ro: {out} {ex.logs.stderr}")
        check(any("Read-only file system" in l for l in out), f"EROFS: {out}")
        check(sorted(os.listdir(f"{ROOT}/seed")) == ["hello.txt"], "unchanged")
    finally:
        await sbx.kill()
        await sbx.close()


def named_volumes_sync():
    """The sync SDK with a named volume made by `agentrun volume create --owner`: files a
    sandbox writes land owned by that owner on the host, and are there for the next sandbox."""
    name = f"owned-{SUFFIX}"
    code, _, err = agentrun("volume", "create", name, "--owner", "1234:1234")
    check(code == 0, f"volume create: {err}")
    data = volume_ls()[name]["mountpoint"]
    vol = [Volume(name="o", pvc=PVC(claim_name=name, create_if_not_exists=False), mount_path="/o")]
    a = SandboxSync.create("host", connection_config=sync_config(), volumes=vol)
    try:
        code, out, err = run(a, "echo one > /o/f.txt && stat -c %u /o/f.txt")
        check(code == 0 and out == "0", f"write: {out!r} {err!r}")
    finally:
        a.kill()
    st = os.stat(f"{data}/f.txt")
    check((st.st_uid, st.st_gid) == (1234, 1234), f"owned by the volume's owner: {st.st_uid}:{st.st_gid}")
    b = SandboxSync.create("host", connection_config=sync_config(), volumes=vol)
    try:
        check(b.files.read_file("/o/f.txt") == "one\n", "seen by the next sandbox")
    finally:
        b.kill()
    deadline = time.monotonic() + 20
    while True:
        code, out, err = agentrun("volume", "rm", name)
        if code == 0:
            break
        check("in use" in err and time.monotonic() < deadline, f"rm: {err}")
        time.sleep(0.2)


def left_running():
    """A sandbox holding a named volume made with deleteOnSandboxTermination, and one holding
    a kept volume, left running for the daemon's shutdown (the test checks after it)."""
    for claim, temp in ((f"gone-{SUFFIX}", True), (f"kept-{SUFFIX}", False)):
        sbx = SandboxSync.create(
            "host",
            connection_config=sync_config(),
            volumes=[Volume(name="v", pvc=PVC(claim_name=claim, delete_on_sandbox_termination=temp), mount_path="/v")],
        )
        check(run(sbx, "echo x > /v/x")[0] == 0, "write")
        check(volume_ls()[claim]["in_use"], f"{claim} held")


SCENARIOS = {
    "left_running": left_running,
    "host_volumes_async": lambda: asyncio.run(host_volumes_async()),
    "named_volumes_sync": named_volumes_sync,
    "host_volumes": host_volumes,
    "host_refused": host_refused,
    "named_volumes": lambda: asyncio.run(named_volumes()),
}
