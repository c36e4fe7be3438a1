"""Behaviours of upstream OpenSandbox that its SDK e2e tests rely on, checked with the official
SDK (opensandbox==1.1.1, opensandbox-code-interpreter==1.1.1) against agentrun.
See docs/opensandbox-compat.md.

Run by tests/tests/opensandbox_compat.rs as `sdk_e2e.py compat:SCENARIO`.
"""

import asyncio
import threading
import time

from opensandbox import Sandbox, SandboxSync
from opensandbox.models.execd import ExecutionHandlers
from opensandbox.models.execd_sync import ExecutionHandlersSync
from sdk_e2e import async_config, check, sync_config

# A cell that runs for 20 s unless interrupted.
LONG = "import time\nfor i in range(100):\n    print(i)\n    time.sleep(0.2)\n"
ROUNDS = 5


def code_interrupt_sync():
    """An interrupt stops the running execution (KeyboardInterrupt, as a Jupyter kernel's) and
    the context lives on, with its globals, however early it arrives: here from the `init`
    handler, the first moment a client knows the execution's id (upstream's
    test_code_interpreter_e2e*::test_08_code_execution_interrupt)."""
    from code_interpreter import CodeInterpreterSync
    from code_interpreter.models.code import SupportedLanguage

    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        ci = CodeInterpreterSync.create(sandbox=sbx, skip_health_check=True)
        ctx = ci.codes.create_context(SupportedLanguage.PYTHON)
        check(ci.codes.run("kept = 41", context=ctx).error is None, "setting a global")
        for n in range(ROUNDS):
            ids = []

            def on_init(init):
                ids.append(init.id)
                ci.codes.interrupt(init.id)

            started = time.monotonic()
            r = ci.codes.run(LONG, context=ctx, handlers=ExecutionHandlersSync(on_init=on_init))
            took = time.monotonic() - started
            check(ids and r.id == ids[0], f"round {n}: init {ids} vs execution {r.id}")
            check(r.error is not None and r.error.name == "KeyboardInterrupt", f"round {n}: error {r.error}")
            check(took < 10, f"round {n}: the interrupted run took {took:.1f} s")
            after = ci.codes.run("kept + 1", context=ctx)
            check(after.error is None and [x.text for x in after.result] == ["42"], f"round {n}: after: {after}")
        # An interrupt of an idle context changes nothing.
        ci.codes.interrupt(ctx.id)
        time.sleep(0.2)
        after = ci.codes.run("kept + 1", context=ctx)
        check(after.error is None and [x.text for x in after.result] == ["42"], f"idle interrupt: {after}")
    finally:
        sbx.kill()


async def code_interrupt_async():
    from code_interpreter import CodeInterpreter
    from code_interpreter.models.code import SupportedLanguage

    sbx = await Sandbox.create("host", connection_config=async_config())
    try:
        ci = await CodeInterpreter.create(sandbox=sbx, skip_health_check=True)
        ctx = await ci.codes.create_context(SupportedLanguage.PYTHON)
        check((await ci.codes.run("kept = 41", context=ctx)).error is None, "setting a global")
        for n in range(ROUNDS):
            ids = []

            async def on_init(init):
                ids.append(init.id)
                await ci.codes.interrupt(init.id)

            started = time.monotonic()
            r = await ci.codes.run(LONG, context=ctx, handlers=ExecutionHandlers(on_init=on_init))
            took = time.monotonic() - started
            check(ids and r.id == ids[0], f"round {n}: init {ids} vs execution {r.id}")
            check(r.error is not None and r.error.name == "KeyboardInterrupt", f"round {n}: error {r.error}")
            check(took < 10, f"round {n}: the interrupted run took {took:.1f} s")
            after = await ci.codes.run("kept + 1", context=ctx)
            check(after.error is None and [x.text for x in after.result] == ["42"], f"round {n}: after: {after}")
    finally:
        await sbx.kill()


def routes():
    """Upstream's server mounts every route at `/` and `/v1`, agentrun too (lifecycle and the
    server proxy); the upstream routes agentrun does not serve answer 501 with a JSON error
    saying why (diagnostics, server-side pools, execd's /pty)."""
    import httpx

    from sdk_e2e import BASE, lifecycle_headers

    root = BASE[: -len("/v1")]
    h = lifecycle_headers()
    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        a = httpx.get(f"{root}/v1/sandboxes/{sbx.id}", headers=h)
        b = httpx.get(f"{root}/sandboxes/{sbx.id}", headers=h)
        check(a.status_code == b.status_code == 200 and a.json()["id"] == b.json()["id"] == sbx.id, f"/ and /v1: {a.text} {b.text}")
        r = httpx.get(f"{root}/sandboxes/{sbx.id}/proxy/44772/ping", headers=h)
        check(r.status_code == 200, f"server proxy at the root: {r.status_code} {r.text}")
        # Snapshots are served at the root too (tests/opensandbox/sdk_snapshots.py has the rest).
        r = httpx.get(f"{root}/snapshots/x", headers=h)
        check(r.status_code == 404 and r.json()["code"] == "SNAPSHOT::NOT_FOUND", f"/snapshots/x: {r.status_code} {r.text}")
        for method, path in [
            ("GET", f"/v1/sandboxes/{sbx.id}/diagnostics/logs"), ("GET", f"/sandboxes/{sbx.id}/diagnostics/events"),
            ("GET", "/v1/pools"), ("POST", "/v1/pools"), ("PUT", "/pools/p"),
        ]:
            r = httpx.request(method, f"{root}{path}", headers=h)
            check(r.status_code == 501 and r.json()["code"] == "NOT_SUPPORTED" and r.json()["message"], f"{method} {path}: {r.status_code} {r.text}")
        ep = sbx.get_endpoint(44772)
        for method, path in [("POST", "/pty"), ("GET", "/pty/s1"), ("GET", "/pty/s1/ws")]:
            r = httpx.request(method, f"http://{ep.endpoint}{path}", headers=ep.headers)
            check(r.status_code == 501 and "PTY" in r.json()["message"], f"{method} {path}: {r.status_code} {r.text}")
        r = httpx.get(f"{root}/v1/no-such-route", headers=h)
        check(r.status_code == 404 and r.json()["code"] == "NOT_FOUND", f"unknown: {r.status_code} {r.text}")
    finally:
        sbx.kill()


def cwd_expansion():
    """`cwd` is expanded as upstream's execd expands it: `$VAR`/`${VAR}` from the sandbox's
    environment and the command's `envs`, then `~` as `$HOME`; an unset variable is a 400."""
    from opensandbox.models.execd import RunCommandOpts

    from sdk_e2e import expect_api_error

    sbx = SandboxSync.create("host", connection_config=sync_config(), env={"DATA": "/tmp/data"})
    try:
        check(sbx.commands.run("mkdir -p /tmp/data/sub").exit_code == 0, "mkdir")
        for cwd, envs, want in [
            ("~", None, "/root"),
            ("~/sub", {"HOME": "/tmp/data"}, "/tmp/data/sub"),
            ("$DATA", None, "/tmp/data"),
            ("${DATA}/sub", None, "/tmp/data/sub"),
            ("$W/sub", {"W": "/tmp/data"}, "/tmp/data/sub"),
            ("/tmp/data", None, "/tmp/data"),
        ]:
            ex = sbx.commands.run("pwd", opts=RunCommandOpts(working_directory=cwd, envs=envs))
            check(ex.text == want, f"cwd {cwd!r}: {ex.text!r} {ex.logs.stderr}")
        e = expect_api_error(lambda: sbx.commands.run("pwd", opts=RunCommandOpts(working_directory="$NOPE/x")), 400)
        check("NOPE" in str(e), f"unset variable: {e}")
        session = sbx.commands.create_session(working_directory="~")
        check(sbx.commands.run_in_session(session, "pwd").text == "/root", "session cwd ~")
        check(sbx.commands.run_in_session(session, "pwd", working_directory="$DATA").text == "/tmp/data", "run_in_session cwd $DATA")
    finally:
        sbx.kill()


def set_env():
    """`commands.set_env` (the SDK appends to the file `$EXECD_ENVS` names) reaches every later
    command, session and code context; a command's own `envs` win; quotes and `$` survive."""
    from opensandbox.models.execd import RunCommandOpts

    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        sbx.commands.set_env("GREETING", "hello world")
        sbx.commands.set_env("TRICKY", "it's \"$HOME\" $5")
        sbx.commands.set_env("PATH_PLUS", "$HOME/bin")
        ex = sbx.commands.run('printf "%s|%s|%s" "$GREETING" "$TRICKY" "$PATH_PLUS"')
        # The SDK writes a value with a quote in double quotes, where `$NAME` is expanded when
        # the file is read (its own docstring says so); others single-quoted, literal.
        check(ex.text == 'hello world|it\'s "/root" $5|$HOME/bin', f"set_env seen: {ex.text!r} {ex.logs.stderr}")
        ex = sbx.commands.run('echo "$GREETING"', opts=RunCommandOpts(envs={"GREETING": "mine"}))
        check(ex.text == "mine", f"the command's envs win: {ex.text!r}")
        sbx.commands.set_env("GREETING", "again")
        check(sbx.commands.run('echo "$GREETING"').text == "again", "the last set_env wins")
        session = sbx.commands.create_session()
        check(sbx.commands.run_in_session(session, 'echo "$GREETING"').text == "again", "sessions see it")
    finally:
        sbx.kill()


async def set_env_async():
    sbx = await Sandbox.create("host", connection_config=async_config())
    try:
        await sbx.commands.set_env("ASYNC_VAR", "a b")
        ex = await sbx.commands.run('echo "$ASYNC_VAR"')
        check(ex.logs.stdout and ex.logs.stdout[0].text == "a b", f"async set_env: {ex.logs.stdout} {ex.logs.stderr}")
    finally:
        await sbx.kill()
        await sbx.close()


def access_renew():
    """`extensions["access.renew.extend.seconds"]`: traffic through the server proxy moves the
    expiry to at least now + that (upstream's renew on access); without it nothing moves;
    out-of-range values are a 400."""
    from datetime import timedelta

    import httpx
    from opensandbox.config import ConnectionConfigSync

    from sdk_e2e import API_KEY, BASE, DOMAIN, lifecycle_headers

    cfg = ConnectionConfigSync(domain=DOMAIN, api_key=API_KEY, protocol="http", use_server_proxy=True)
    ttl = timedelta(minutes=4)
    renewed = SandboxSync.create("host", connection_config=cfg, timeout=ttl,
                                 extensions={"access.renew.extend.seconds": "600"})
    plain = SandboxSync.create("host", connection_config=cfg, timeout=ttl)
    try:
        for sbx, moves in ((renewed, True), (plain, False)):
            info = sbx.get_info()
            nominal = info.created_at + ttl
            check(sbx.commands.run("echo hi").text == "hi", "a command through the server proxy")
            after = sbx.get_info().expires_at
            if moves:
                check(after > nominal + timedelta(seconds=300), f"renewed on access: {after} vs nominal {nominal}")
            else:
                check(abs((after - nominal).total_seconds()) < 2, f"no extension, no renewal: {after} vs {nominal}")
        body = {"image": {"uri": "host"}, "entrypoint": ["sleep", "infinity"], "timeout": 600, "resourceLimits": {}}
        for bad in ("299", "86401", "soon"):
            r = httpx.post(f"{BASE}/sandboxes", headers=lifecycle_headers(),
                           json={**body, "extensions": {"access.renew.extend.seconds": bad}})
            check(r.status_code == 400 and "access.renew.extend.seconds" in r.json()["message"], f"{bad}: {r.status_code} {r.text}")
    finally:
        renewed.kill()
        plain.kill()


SCENARIOS = {
    "access_renew": access_renew,
    "set_env": set_env,
    "set_env_async": lambda: asyncio.run(set_env_async()),
    "cwd_expansion": cwd_expansion,
    "routes": routes,
    "code_interrupt_sync": code_interrupt_sync,
    "code_interrupt_async": lambda: asyncio.run(code_interrupt_async()),
}
