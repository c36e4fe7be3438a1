#!/usr/bin/env python3
"""Writes the hand-made seed inputs of every fuzz target into fuzz/corpus/<target>/.

Seeds are small valid inputs (plus a few near-misses) that show libFuzzer the formats: layer
tars (plain, gzip, zstd; whiteouts, links, xattrs, devices), `docker save` and OCI layout
archives with real digests, Dockerfiles, profiles, image names and API request bodies as the
Docker and OpenSandbox clients send them. Re-running it rewrites the seeds (named seed-*) and
leaves what fuzzing added alone. Standard library only.
"""
import gzip
import hashlib
import io
import json
import os
import struct
import sys
import tarfile

ROOT = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(ROOT, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def tar_bytes(entries, fmt=tarfile.GNU_FORMAT):
    """entries: (name, kind, payload, extra) with kind file|dir|sym|link|chr|fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, kind, payload, extra in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1_700_000_000
            ti.mode = extra.get("mode", 0o755 if kind == "dir" else 0o644)
            ti.uid = extra.get("uid", 0)
            ti.gid = extra.get("gid", 0)
            if "pax" in extra:
                ti.pax_headers = extra["pax"]
            data = None
            if kind == "file":
                ti.type = tarfile.REGTYPE
                data = payload.encode() if isinstance(payload, str) else payload
                ti.size = len(data)
            elif kind == "dir":
                ti.type = tarfile.DIRTYPE
            elif kind == "sym":
                ti.type = tarfile.SYMTYPE
                ti.linkname = payload
            elif kind == "link":
                ti.type = tarfile.LNKTYPE
                ti.linkname = payload
            elif kind == "chr":
                ti.type = tarfile.CHRTYPE
                ti.devmajor, ti.devminor = 1, 3
            elif kind == "fifo":
                ti.type = tarfile.FIFOTYPE
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def zstd_raw(data):
    """A zstd frame holding `data` in raw blocks (no compression: the stdlib has no zstd)."""
    out = bytearray(b"\x28\xb5\x2f\xfd")
    out.append(0xA0)  # single segment, 4-byte content size
    out += struct.pack("<I", len(data))
    blocks = [data[i:i + 65536] for i in range(0, len(data), 65536)] or [b""]
    for i, b in enumerate(blocks):
        last = 1 if i == len(blocks) - 1 else 0
        out += struct.pack("<I", (len(b) << 3) | (0 << 1) | last)[:3]
        out += b
    return bytes(out)


def sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


# --- layers ------------------------------------------------------------------------------
LAYER_BASIC = tar_bytes([
    ("bin/", "dir", None, {}),
    ("bin/tool", "file", "#!/bin/sh\necho hi\n", {"mode": 0o4755}),
    ("bin/alias", "sym", "tool", {}),
    ("bin/tool2", "link", "bin/tool", {}),
    ("etc/", "dir", None, {}),
    ("etc/motd", "file", "hello\n", {"uid": 1000, "gid": 1000}),
])
LAYER_WHITEOUTS = tar_bytes([
    ("etc/", "dir", None, {}),
    ("etc/.wh.motd", "file", "", {}),
    ("opt/", "dir", None, {}),
    ("opt/.wh..wh..opq", "file", "", {}),
    ("opt/new", "file", "n", {}),
    ("dev/null", "chr", None, {}),
    ("run/fifo", "fifo", None, {}),
])
LAYER_PAX = tar_bytes([
    ("usr/bin/ping", "file", "\x7fELF", {"pax": {
        "SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00",
        "SCHILY.xattr.user.note": "x",
        "SCHILY.xattr.trusted.evil": "y",
    }}),
    ("a/" + "long" * 40 + "/name", "file", "deep", {}),
], fmt=tarfile.PAX_FORMAT)
LAYER_ATTACKS = tar_bytes([
    ("evil", "sym", "/etc", {}),
    ("evil/passwd", "file", "root::0:0::/:/bin/sh\n", {}),
    ("../escape", "file", "x", {}),
    ("hard", "link", "/etc/shadow", {}),
    ("up", "link", "../x", {}),
])
for name, layer in [("basic.tar", LAYER_BASIC), ("whiteouts.tar", LAYER_WHITEOUTS),
                    ("pax.tar", LAYER_PAX), ("attacks.tar", LAYER_ATTACKS)]:
    put("layer_unpack", name, layer)
put("layer_unpack", "basic.tar.gz", gzip.compress(LAYER_BASIC, mtime=0))
put("layer_unpack", "whiteouts.tar.zst", zstd_raw(LAYER_WHITEOUTS))
put("layer_unpack", "empty", b"")

# --- image archives ----------------------------------------------------------------------
def image_config(diff_ids):
    return json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"], "WorkingDir": "/",
                   "ExposedPorts": {"80/tcp": {}}, "Labels": {"a": "b"}},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "seed"}],
    }, separators=(",", ":")).encode()


def docker_save(layers, tags):
    config = image_config([sha(l) for l in layers])
    files = [("c.json", config)]
    names = []
    for i, l in enumerate(layers):
        n = f"l{i}/layer.tar"
        files.append((n, l))
        names.append(n)
    manifest = json.dumps([{"Config": "c.json", "RepoTags": tags, "Layers": names}]).encode()
    files.append(("manifest.json", manifest))
    return tar_bytes([(n, "file", d, {}) for n, d in files])


def oci_layout(layers, name, nested=False, gz=False):
    blobs = {}

    def blob(b):
        blobs[hashlib.sha256(b).hexdigest()] = b
        return {"digest": sha(b), "size": len(b)}

    config = image_config([sha(l) for l in layers])
    layer_descs = []
    for l in layers:
        stored = gzip.compress(l, mtime=0) if gz else l
        mt = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gz else "")
        layer_descs.append(dict(blob(stored), mediaType=mt))
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": dict(blob(config), mediaType="application/vnd.oci.image.config.v1+json"),
        "layers": layer_descs,
    }).encode()
    mdesc = dict(blob(manifest), mediaType="application/vnd.oci.image.manifest.v1+json",
                 platform={"architecture": "amd64", "os": "linux"})
    top = mdesc
    if nested:
        inner = json.dumps({"schemaVersion": 2,
                            "mediaType": "application/vnd.oci.image.index.v1+json",
                            "manifests": [mdesc]}).encode()
        top = dict(blob(inner), mediaType="application/vnd.oci.image.index.v1+json")
    index = json.dumps({"schemaVersion": 2,
                        "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": [dict(top, annotations={
                            "io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": "1"})]}).encode()
    entries = [("oci-layout", "file", '{"imageLayoutVersion":"1.0.0"}', {}),
               ("index.json", "file", index, {}),
               ("blobs/", "dir", None, {}), ("blobs/sha256/", "dir", None, {})]
    entries += [(f"blobs/sha256/{h}", "file", b, {}) for h, b in blobs.items()]
    return tar_bytes(entries)


SMALL = tar_bytes([("hello", "file", "hi\n", {})])
put("image_archive", "docker-save.tar", docker_save([SMALL], ["seed/docker:1"]))
put("image_archive", "docker-save-2layers.tar", docker_save([SMALL, LAYER_WHITEOUTS], []))
put("image_archive", "oci.tar", oci_layout([SMALL], "docker.io/seed/oci:1"))
put("image_archive", "oci-nested-gz.tar", oci_layout([SMALL], "seed/nested:1", nested=True, gz=True))
put("image_archive", "oci.tar.gz", gzip.compress(oci_layout([SMALL], "seed/gz:1"), mtime=0))
# Regression: an index naming itself (stack overflow before the nesting bound).
_self = json.dumps({"schemaVersion": 2, "manifests": [{
    "mediaType": "application/vnd.oci.image.index.v1+json", "digest": "sha256:" + "a" * 64,
    "size": 1}]})
put("image_archive", "self-index.tar", tar_bytes([
    ("oci-layout", "file", '{"imageLayoutVersion":"1.0.0"}', {}), ("index.json", "file", _self, {}),
    ("blobs/sha256/" + "a" * 64, "file", _self, {})]))
put("image_archive", "docker-save-escape.tar", tar_bytes([
    ("manifest.json", "file", json.dumps([{"Config": "../../etc/passwd", "Layers": ["/etc/shadow"]}]), {}),
    ("link", "sym", "../..", {}),
]))

# --- image references --------------------------------------------------------------------
for i, n in enumerate([
    "busybox", "python:3.12-slim", "org/tool", "localhost:5000/busybox",
    "ghcr.io/org/sub/img:v1.2", "127.0.0.1:5000/agentrun/busybox:1.0",
    "busybox@sha256:" + "a" * 64, "docker.io/library/busybox:latest@sha256:" + "b" * 64,
    "[::1]:5000/x:y", "sha256:abcdef12", "UPPER/case", "a//b", "x:",
]):
    put("image_reference", f"{i:02}", n)

# --- Dockerfiles -------------------------------------------------------------------------
DOCKERFILES = {
    "basic": "FROM busybox\nRUN echo hi > /x\nCMD [\"cat\", \"/x\"]\n",
    "full": """ARG BASE=busybox
FROM ${BASE}
LABEL a=b "c d"="e f"
MAINTAINER someone
ENV A=1 B="two words" \\
    C=${A:-x}${B:+y}
WORKDIR /app/$A
COPY --chown=1000:1000 a b /app/
ADD --chown=0 ["ctx.tar", "/opt/"]
EXPOSE 80/tcp 53/udp
USER 1000:1000
STOPSIGNAL SIGTERM
ENTRYPOINT ["/bin/sh", "-c"]
RUN set -e; \\
    echo \\$HOME $HOME ${HOME} ${UNSET:-default}
CMD echo done
""",
    "multistage": "FROM a AS b\nFROM b\n",
    "unsupported": "FROM --platform=linux/amd64 x\nHEALTHCHECK CMD true\nONBUILD RUN x\n",
    "unicode": "FROM busybox\nLABEL é=ü\nRUN echo 'ü' \\\n  ≠\n",
}
for n, t in DOCKERFILES.items():
    put("dockerfile", n, t)

# --- profiles ----------------------------------------------------------------------------
bundles = os.path.join(ROOT, "..", "bundles")
for f in sorted(os.listdir(bundles)):
    if f.endswith(".toml"):
        with open(os.path.join(bundles, f), "rb") as fh:
            put("profile_toml", f, fh.read())
put("profile_toml", "edge.toml", """name = "edge"
[filesystem]
workspace = "ro"
readable = ["/usr", "/etc"]
writable = ["/workspace/out", "/tmp"]
hidden = ["/etc/shadow"]
rw_mounts = false
[network]
mode = "allowlist"
allow = ["pypi.org:443", "*.pythonhosted.org", "[::1]:8080", "127.0.0.1:80", "*"]
deny = ["evil.test"]
[resources]
memory = "64Mi"
cpus = 0.5
pids = 64
tmpfs_size = "16M"
nofile = 256
timeout = "1m30s"
output_cap = "1M"
[env]
defaults = { LANG = "C.UTF-8" }
allow = ["HOME", "_X1"]
[seccomp]
baseline = "default"
""")

# --- Docker API --------------------------------------------------------------------------
def sel(n, body):
    return bytes([n]) + (body.encode() if isinstance(body, str) else body)


CREATE = {
    "Image": "busybox", "Cmd": ["sh", "-c", "echo hi"], "Entrypoint": None, "Env": ["A=1", "B"],
    "WorkingDir": "/w", "User": "1000:1000", "Tty": True, "OpenStdin": True, "StdinOnce": True,
    "Labels": {"k": "v"}, "ExposedPorts": {"8000/tcp": {}, "53/udp": {}},
    "HostConfig": {"Binds": ["/tmp:/data:ro", "/srv:/srv"], "AutoRemove": True,
                   "Memory": 67108864, "NanoCpus": 500000000, "PidsLimit": 64,
                   "NetworkMode": "none", "PublishAllPorts": True,
                   "PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "0"}]},
                   "ConsoleSize": [40, 120]},
}
put("docker_api", "create", sel(0, json.dumps(CREATE)))
put("docker_api", "create-min", sel(0, '{"Image":"busybox","HostConfig":{"CpuQuota":50000,"CpuPeriod":100000,"PortBindings":{"80":null}}}'))
put("docker_api", "create-bad-ports", sel(0, '{"Image":"x","HostConfig":{"PortBindings":{"80/tcp":[{"HostIp":"0.0.0.0","HostPort":"1-2"}]},"Binds":["vol:/x"]}}'))
put("docker_api", "exec", sel(1, '{"Cmd":["sh","-c","id"],"Env":["A=1"],"WorkingDir":"/","User":"nobody","Tty":false,"AttachStdin":true,"ConsoleSize":[24,80]}'))
put("docker_api", "exec-empty", sel(1, '{"Cmd":[]}'))
put("docker_api", "build", sel(2, "t=seed%2Fimg%3A1&t=other&dockerfile=sub%2FDockerfile&buildargs=%7B%22A%22%3A%221%22%2C%22B%22%3Anull%7D&q=1&rm=1"))
put("docker_api", "build-remote", sel(2, "remote=https%3A%2F%2Fx&dockerfile=..%2F..%2Fetc%2Fshadow"))
put("docker_api", "target-kill", sel(3, "/v1.44/containers/abc/kill?signal=SIGKILL"))
put("docker_api", "target-archive", sel(3, "/v1.41/containers/abc/archive?path=%2Fetc%2F..%2Fx"))
put("docker_api", "target-image", sel(3, "/images/ghcr.io%2Forg%2Fimg%3A1/json?all=False"))
put("docker_api", "target-version", sel(3, "/v9.99/_ping"))

# --- docker cp (PUT archive) -------------------------------------------------------------
put("docker_archive_put", "basic.tar", tar_bytes([
    ("d/", "dir", None, {}), ("d/f", "file", "data", {"mode": 0o600}),
    ("d/l", "sym", "/etc/passwd", {}), ("d/h", "link", "d/f", {}),
]))
put("docker_archive_put", "escapes.tar", tar_bytes([
    ("up/owned", "file", "x", {}), ("abs/owned", "file", "x", {}),
    ("../../owned", "file", "x", {}), ("sub/l", "sym", "../../..", {}),
    ("sub/l/owned", "file", "x", {}), ("h", "link", "../../../etc/passwd", {}),
    ("dev", "chr", None, {}), ("fifo", "fifo", None, {}),
]))
put("docker_archive_put", "link-dest.tar", b"\x01" + tar_bytes([("x", "file", "y", {})])[1:])

# --- OpenSandbox API ---------------------------------------------------------------------
OS_CREATE = {
    "image": {"uri": "python:3.12-slim"}, "entrypoint": ["python3", "-m", "http.server"],
    "env": {"A": "1"}, "metadata": {"team": "ml", "example.com/x": "y"}, "timeout": 3600,
    "resourceLimits": {"cpu": "500m", "memory": "512Mi", "gpu": "0"},
    "resourceRequests": {"cpu": "1"},
    "networkPolicy": {"defaultAction": "deny", "egress": [
        {"action": "allow", "target": "pypi.org"}, {"action": "allow", "target": "*.github.com"}]},
    "platform": {"os": "linux", "arch": "amd64"}, "extensions": {"x": 1},
}
seeds = [
    (0, "create", json.dumps(OS_CREATE)),
    (0, "create-volumes", json.dumps({**OS_CREATE, "volumes": [
        {"name": "work", "host": {"path": "/srv/volumes/work"}, "mountPath": "/mnt/work"},
        {"name": "ro", "host": {"path": "/srv/volumes"}, "mountPath": "/mnt/ro", "readOnly": True, "subPath": "a/./b"},
        {"name": "data", "pvc": {"claimName": "shared", "createIfNotExists": False, "deleteOnSandboxTermination": True,
                                 "storageClass": None, "storage": "1Gi", "accessModes": ["ReadWriteOnce"]},
         "mountPath": "/data"},
        {"name": "bad", "host": {"path": "/srv/../etc"}, "mountPath": "/proc/x", "subPath": "../.."},
        {"name": "oss", "ossfs": {"bucket": "b"}, "mountPath": "/o"}]})),
    (0, "create-bad", '{"image":{"uri":"x","auth":{"u":"p"}},"entrypoint":[""],"snapshotId":"s","volumes":[{}]}'),
    (1, "renew", '{"expiresAt":"2027-01-15T08:00:00Z"}'),
    (1, "renew-offset", '{"expiresAt":"2027-01-15T08:00:00.123+05:30"}'),
    (2, "metadata", '{"team":null,"owner":"me","opensandbox.io/x":"y"}'),
    (3, "quantity", "1536Mi"),
    (3, "quantity-m", "250m"),
    (4, "command", '{"command":"echo hi","cwd":"/tmp","background":true,"timeout":1000,"uid":1000,"gid":1000,"envs":{"A":"1"}}'),
    (4, "command-argv", '{"argv":["ls","-l"],"gid":5}'),
    (5, "session", '{"cwd":"/w"}'),
    (5, "session-empty", "  \n"),
    (6, "in-session", '{"command":"cd /tmp && pwd","cwd":"/","timeout":5000}'),
    (7, "meta", '{"path":"/workspace/a.txt","owner":"root","group":"0","mode":644}'),
    (7, "meta-bad", '{"path":"rel/../../x","mode":999}'),
    (8, "perms", '{"/a":{"mode":755,"owner":"root"},"/b/../c":{"mode":4777}}'),
    (9, "move", '[{"src":"/a","dest":"/b"},{"src":"/../..","dest":"/x"}]'),
    (10, "replace", '{"/etc/hosts":{"old":"a","new":"b"},"/x":{"old":"","new":"c"}}'),
    (12, "glob", "**/*.{py,txt}"),
    (12, "glob-class", "[!a-z]?/*"),
    (13, "context", '{"language":"python","cwd":"/workspace"}'),
    (14, "code", '{"code":"print(1)","context":{"id":"abc","language":"python"}}'),
    (15, "policy", '{"defaultAction":"allow","egress":[{"action":"deny","target":"*.evil.test"},{"action":"allow","target":"Example.COM."}]}'),
    (15, "policy-empty", "{}"),
    (16, "patch", '[{"action":"deny","target":"pypi.org"},{"action":"allow","target":"*.x.y"}]'),
    (17, "delete", '["pypi.org","*.EVIL.test."]'),
]
for n, name, body in seeds:
    put("opensandbox_api", name, sel(n, body))
put("opensandbox_api", "range", bytes([11]) + struct.pack("<Q", 1000) + b"bytes=10-20")
put("opensandbox_api", "range-suffix", bytes([11]) + struct.pack("<Q", 1000) + b"bytes=-100")
put("opensandbox_api", "range-open", bytes([11]) + struct.pack("<Q", 0) + b"bytes=5-")

# mcp_tools: the first byte picks the parser (0 arguments, 1 run output, 2 a listing).
for name, body in [
    ("args-python", b'{"code":"print(1)","timeout":2.5}'),
    ("args-read", b'{"path":"../etc/passwd","offset":1,"limit":3}'),
    ("args-bad", b'{"path":"a\\u0000b","content":7,"x":null}'),
]:
    put("mcp_tools", name, bytes([0]) + body)
for name, body in [
    ("py-denied", b"Traceback:\nPermissionError: [Errno 13] Permission denied: '/etc/x'\n"),
    ("sh-denied", b"sh: 1: cannot create /usr/lib/a: Read-only file system\ncat: /root/.ssh/id: Permission denied"),
    ("no-net", b"urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>"),
]:
    put("mcp_tools", name, bytes([1]) + body)
put("mcp_tools", "listing", bytes([2]) + b"file\t12\ta.txt\0dir\t0\tsub dir\0symlink\t0\tl\tx\0")

# webguard: the first byte picks the input (0 a Host, 1 an Origin then NUL then a Host,
# 2 a key file, 3 Cookie header values, 4 X-Forwarded-Proto / Forwarded, 5 a Content-Type).
for name, data in [
    ("host-local", bytes([0]) + b"localhost:8080"),
    ("host-v6", bytes([0]) + b"[::1]:8080"),
    ("host-rebind", bytes([0]) + b"rebind.evil.test:8080"),
    ("origin-own", bytes([1]) + b"http://127.0.0.1:8080\0127.0.0.1:8080"),
    ("origin-null", bytes([1]) + b"null\0localhost"),
    ("key-ok", bytes([2]) + b"0123456789abcdef0123456789abcdef0123456789abcdef\n"),
    ("key-crlf", bytes([2]) + b"0123456789abcdef\r\n\n"),
    ("cookie", bytes([3]) + b"a=1; agentrun_ui=abc; agentrun_ui_login=def"),
    ("tls", bytes([4]) + b"https\0for=1.2.3.4;proto=\"https\""),
    ("ctype", bytes([5]) + b"application/json; charset=utf-8"),
]:
    put("webguard", name, data)


# credential_vault: the first byte is the length of the create body; the mutation follows.
def vault_seed(create, mutation):
    a = json.dumps(create).encode()
    b = json.dumps(mutation).encode()
    return bytes([min(len(a), 255)]) + a[:255] + b

_cv_create = {
    "credentials": [{"name": "k", "source": {"type": "inline", "value": "sk-seed-value-123456"}}],
    "bindings": [{"name": "b", "match": {"hosts": ["*.h.example"], "paths": ["/v1/*"]},
                  "auth": {"type": "apiKey", "name": "X-Key", "credential": "k"}}],
}
for name, create, mutation in [
    ("create-patch", _cv_create, {"expectedRevision": 1, "credentials": {"replace": [
        {"name": "c", "source": {"value": "rotated-value-abcdef"}}]}}),
    ("add-binding", {"credentials": [], "bindings": []}, {"bindings": {"add": [
        {"name": "q", "match": {"hosts": ["h.example"]}, "auth": {"type": "query", "name": "key", "credential": "c"}}]}}),
    ("placeholder", {"credentials": [], "bindings": []}, {"bindings": {"replace": [
        {"name": "b", "match": {"hosts": ["h.example"]}, "auth": {"type": "placeholder", "placeholder": "PLACEHOLDER", "credential": "c"}}]}}),
    ("delete-missing", {"credentials": [], "bindings": []}, {"credentials": {"delete": ["c"]}}),
    ("bad-value", {"credentials": [], "bindings": []}, {"credentials": {"replace": [
        {"name": "c", "source": {"value": "line\r\nX-Evil: secret-long-value"}}]}}),
]:
    put("credential_vault", name, vault_seed(create, mutation))

# http_rule: a rule line, then a request line `METHOD HOST PORT PATH`.
for name, data in [
    ("deny-delete", "DELETE api.example.com/repos/\nDELETE api.example.com 443 /repos/x"),
    ("any-header", "* *.example.com:8443 X-A=1\nGET a.example.com 8443 /"),
    ("v6", "GET [::1]:8080/v1\nGET ::1 8080 /v1/../x"),
    ("bad", "G(T api.example.com\nGET x 1 /"),
]:
    put("http_rule", name, data)

print(f"seeds written under {CORPUS}", file=sys.stderr)
