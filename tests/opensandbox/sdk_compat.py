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


SCENARIOS = {
    "code_interrupt_sync": code_interrupt_sync,
    "code_interrupt_async": lambda: asyncio.run(code_interrupt_async()),
}
