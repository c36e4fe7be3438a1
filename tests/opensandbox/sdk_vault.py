"""Credential vault scenarios (`sdk_e2e.py vault:NAME`) with the official SDK 1.1.1's
`sandbox.credential_vault`, after upstream's tests/python/tests/test_credential_vault_e2e.py:
every auth type injected by the egress proxy, runtime replacement, sanitized state.

The target is the test's TLS server (`VAULT_TLS_PORT` on 127.0.0.1, its CA given to the
daemon with --egress-upstream-ca) and its plain-HTTP twin (`VAULT_HTTP_PORT`). For each
request it answers JSON: the case (first path segment) and the SHA-256 of every auth header
it got, never a value. The sandbox dumps its environment and files: no secret.
"""

import hashlib
import json
import os
import shlex

from opensandbox import SandboxSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import (
    Credential,
    CredentialBinding,
    CredentialProxyConfig,
    NetworkPolicy,
    NetworkRule,
)

from sdk_e2e import check, sync_config

TLS = int(os.environ.get("VAULT_TLS_PORT", "0"))
PLAIN = int(os.environ.get("VAULT_HTTP_PORT", "0"))
SECRETS = {
    "bearer-token": "vault-bearer-token-" + os.environ.get("VAULT_NONCE", "x"),
    "basic-token": "dXNlcjpwYXNz",
    "api-key-token": "vault-api-key-token-" + os.environ.get("VAULT_NONCE", "x"),
    "client-id": "vault-client-id-" + os.environ.get("VAULT_NONCE", "x"),
    "client-secret": "vault-client-secret-" + os.environ.get("VAULT_NONCE", "x"),
}


def h(v):
    return hashlib.sha256(v.encode()).hexdigest()


def binding(name, path, auth, scheme="https", port=None):
    return CredentialBinding(
        name=name,
        match={
            "schemes": [scheme],
            "ports": [port or TLS],
            "hosts": ["127.0.0.1"],
            "methods": ["GET"],
            "paths": [path],
        },
        auth=auth,
    )


def curl(sbx, url, flags="", prefix=""):
    ex = sbx.commands.run(f"{prefix} curl -sS --max-time 20 {flags} {shlex.quote(url)}")
    check(ex.error is None, f"curl {url}: {ex.error} {ex.logs.stderr}")
    out = "".join(p.text for p in ex.logs.stdout)
    return json.loads(out)


def expect_status(fn, status):
    try:
        fn()
    except Exception as e:  # the SDK wraps httpx errors
        text = repr(e) + str(getattr(e, "__cause__", ""))
        check(str(status) in text, f"expected HTTP {status}, got {text}")
        return
    check(False, f"expected HTTP {status}, got success")


def vault():
    check(TLS and PLAIN, "VAULT_TLS_PORT and VAULT_HTTP_PORT")
    sbx = SandboxSync.create(
        "host",
        connection_config=sync_config(),
        network_policy=NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="127.0.0.1")]),
        credential_proxy=CredentialProxyConfig(enabled=True),
    )
    print("SANDBOX", sbx.id)
    try:
        cv = sbx.credential_vault
        state = cv.create(
            credentials=[Credential(name=n, source={"value": v}) for n, v in SECRETS.items()],
            bindings=[
                binding("bearer", "/bearer", {"type": "bearer", "credential": "bearer-token"}),
                binding("basic", "/basic", {"type": "basic", "credential": "basic-token"}),
                binding("api-key", "/api-key", {"type": "apiKey", "name": "X-Api-Key", "credential": "api-key-token"}),
                binding("custom-headers", "/custom-headers", {"type": "customHeaders", "headers": [
                    {"name": "X-Client-Id", "credential": "client-id"},
                    {"name": "X-Client-Secret", "credential": "client-secret"}]}),
                binding("plain-bearer", "/plain", {"type": "bearer", "credential": "bearer-token"},
                        scheme="http", port=PLAIN),
            ],
        )
        payload = state.model_dump_json(by_alias=True)
        for s in SECRETS.values():
            check(s not in payload, "a secret in the create answer")
        check(state.revision == 1, f"revision {state.revision}")
        check({b.auth.type for b in state.bindings if b.auth} == {"bearer", "basic", "apiKey", "customHeaders"},
              f"auth types {[b.auth for b in state.bindings]}")

        want = {
            "bearer": {"authorization": h("Bearer " + SECRETS["bearer-token"])},
            "basic": {"authorization": h("Basic " + SECRETS["basic-token"])},
            "api-key": {"x-api-key": h(SECRETS["api-key-token"])},
            "custom-headers": {"x-client-id": h(SECRETS["client-id"]),
                               "x-client-secret": h(SECRETS["client-secret"])},
        }
        for case, headers in want.items():
            r = curl(sbx, f"https://127.0.0.1:{TLS}/{case}")
            check(r["case"] == case and r["headers"] == headers, f"{case}: {r}")
        r = curl(sbx, f"http://127.0.0.1:{PLAIN}/plain")
        check(r["headers"] == {"authorization": h("Bearer " + SECRETS["bearer-token"])}, f"plain: {r}")
        # A client that ignores the trust environment (env -i) reads the image's system
        # bundle, where the sandbox's CA is too.
        r = curl(sbx, f"https://127.0.0.1:{TLS}/bearer",
                 prefix='env -i HTTPS_PROXY="$HTTPS_PROXY" PATH=/usr/bin:/bin')
        check(r["headers"] == want["bearer"], f"without the trust environment: {r}")
        # OpenSSL's hashed directory alone (capath): the CA filed there from the host.
        py = ("import ssl, sys, urllib.request; c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); "
              "c.load_verify_locations(capath='/etc/ssl/certs'); "
              "print(urllib.request.urlopen(sys.argv[1], timeout=20, context=c).read().decode())")
        ex = sbx.commands.run('env -i HTTPS_PROXY="$HTTPS_PROXY" PATH=/usr/bin:/bin python3 -c '
                              + shlex.quote(py) + " " + shlex.quote(f"https://127.0.0.1:{TLS}/bearer"))
        check(ex.error is None, f"capath: {ex.error} {ex.logs.stderr}")
        r = json.loads("".join(p.text for p in ex.logs.stdout))
        check(r["headers"] == want["bearer"], f"capath alone: {r}")
        # Not bound: nothing added.
        r = curl(sbx, f"https://127.0.0.1:{TLS}/unbound")
        check(r["headers"] == {}, f"unbound path: {r}")

        # Runtime replacement: the next request carries the new value.
        rotated = "vault-bearer-rotated-" + os.environ.get("VAULT_NONCE", "x")
        state = cv.patch(expected_revision=1, credentials={
            "replace": [{"name": "bearer-token", "source": {"value": rotated}}]})
        check(state.revision == 2, f"revision after patch {state.revision}")
        r = curl(sbx, f"https://127.0.0.1:{TLS}/bearer")
        check(r["headers"] == {"authorization": h("Bearer " + rotated)}, f"rotated: {r}")
        expect_status(lambda: cv.patch(expected_revision=1, credentials={"delete": ["basic-token"]}), 409)
        expect_status(lambda: cv.create(credentials=[], bindings=[]), 409)

        # Sanitized reads.
        creds = cv.list_credentials()
        check(sorted(c.name for c in creds) == sorted(SECRETS), f"credentials {creds}")
        check(cv.get_credential("bearer-token").revision == 2, "bearer-token revision")
        check(len(cv.list_bindings()) == 5, "bindings")
        check(cv.get_binding("api-key").auth.name == "X-Api-Key", "api-key binding")
        expect_status(lambda: cv.get_credential("nope"), 404)
        got = cv.get().model_dump_json(by_alias=True)
        for s in list(SECRETS.values()) + [rotated]:
            check(s not in got, "a secret in the state")

        # What the sandbox can see.
        ex = sbx.commands.run("env; cat /proc/[0-9]*/environ | tr '\\0' '\\n'; cat /run/agentrun-egress/ca.pem; grep -c 'PRIVATE KEY' /run/agentrun-egress/*.pem")
        dump = "".join(p.text for p in ex.logs.stdout)
        check("SSL_CERT_FILE=/run/agentrun-egress/ca-bundle.pem" in dump, "trust env")
        for s in list(SECRETS.values()) + [rotated]:
            check(s not in dump, "a secret in the sandbox")
        check("PRIVATE KEY" not in dump, "a key in the sandbox")

        # Bodies that do not parse: 400, and the answer never quotes the input (serde's
        # messages can: `invalid type: string "..."`).
        import httpx

        ep = sbx.get_endpoint(18080)
        leak = "raw-secret-in-a-bad-body-" + os.environ.get("VAULT_NONCE", "x")
        for method, body in [
            ("POST", {"credentials": [{"name": "x", "source": leak}], "bindings": []}),
            ("PATCH", {"credentials": {"add": [{"name": "x", "source": {"value": 7, "type": leak}}]}}),
            ("PATCH", {"credentials": {"add": [{"name": "x", "source": {"type": leak, "value": leak}}]}}),
        ]:
            r = httpx.request(method, f"http://{ep.endpoint}/credential-vault", json=body, headers=ep.headers)
            check(r.status_code in (400, 409), f"{method} bad body: {r.status_code} {r.text}")
            check(leak not in r.text, f"{method} bad body quoted: {r.text}")
        check(leak not in cv.get().model_dump_json(by_alias=True), "a bad body changed the vault")

        # A fork intercepts too (its copied environment points at a CA bundle: the file is
        # there), with an empty vault: credentials are never copied.
        from sdk_e2e import BASE, lifecycle_headers

        r = httpx.post(f"{BASE}/sandboxes/{sbx.id}/fork", json={"count": 1}, headers=lifecycle_headers(), timeout=120)
        check(r.status_code == 201, f"fork: {r.status_code} {r.text}")
        copy_id = r.json()["sandboxes"][0]["id"]
        copy = SandboxSync.connect(copy_id, connection_config=sync_config())
        try:
            ex = copy.commands.run("test -s /run/agentrun-egress/ca-bundle.pem && echo bundle; env | grep -c SSL_CERT_FILE")
            out = "\n".join(p.text for p in ex.logs.stdout)
            check(out.split() == ["bundle", "1"], f"the copy's trust files: {out!r}")
            expect_status(lambda: copy.credential_vault.get(), 404)
            r = curl(copy, f"https://127.0.0.1:{TLS}/bearer", "-k")
            check(r["headers"] == {}, f"a copy injected: {r}")
        finally:
            copy.kill()
            copy.close()

        cv.delete()
        expect_status(lambda: cv.get(), 404)
        # Nothing bound: a plain tunnel again (the sandbox meets the real certificate,
        # which only the daemon was told to trust: -k).
        r = curl(sbx, f"https://127.0.0.1:{TLS}/bearer", "-k")
        check(r["headers"] == {}, f"after delete: {r}")
    finally:
        sbx.kill()
        sbx.close()


def without_proxy():
    """Without credentialProxy: an https binding is refused (412), an http one is served."""
    check(PLAIN, "VAULT_HTTP_PORT")
    sbx = SandboxSync.create(
        "host",
        connection_config=sync_config(),
        network_policy=NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="127.0.0.1")]),
    )
    try:
        cv = sbx.credential_vault
        creds = [Credential(name="t", source={"value": SECRETS["bearer-token"]})]
        expect_status(lambda: cv.create(credentials=creds, bindings=[
            binding("tls", "/bearer", {"type": "bearer", "credential": "t"})]), 412)
        expect_status(lambda: cv.get(), 404)
        cv.create(credentials=creds, bindings=[
            binding("plain", "/plain", {"type": "bearer", "credential": "t"}, scheme="http", port=PLAIN)])
        r = curl(sbx, f"http://127.0.0.1:{PLAIN}/plain")
        check(r["headers"] == {"authorization": h("Bearer " + SECRETS["bearer-token"])}, f"plain: {r}")
        env = "".join(p.text for p in sbx.commands.run("env").logs.stdout)
        check("SSL_CERT_FILE" not in env, "trust env without credentialProxy")
    finally:
        sbx.kill()
        sbx.close()


SCENARIOS = {"vault": vault, "without_proxy": without_proxy}
