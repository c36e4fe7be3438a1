"""The SDK's client-side sandbox pool (`opensandbox.pool`, opensandbox==1.1.1) against agentrun,
unchanged: sandboxes kept ready by the client, with the in-memory state store and with the
Redis one (`opensandbox.pool_redis`), sync and async. The flows are those of upstream's
tests/python/tests/test_sandbox_pool_e2e_{sync,async}.py: warm-up (with a preparer), acquire
(FAIL_FAST / DIRECT_CREATE, renewed to the caller's timeout), refill, a stale idle id falling
back, resize and release (the remote sandboxes are killed), shutdown and restart, and with
Redis two pool nodes sharing one namespace (one primary warms, either node acquires, a resize
on one applies to both, the primary lock fails over).

Run by tests/tests/opensandbox_pool.rs as `sdk_e2e.py pool:SCENARIO`. The Redis scenarios
need OSB_REDIS_URL (a redis-server the Rust test starts on a loopback port and kills after).
"""

import asyncio
import os
import time
import uuid
from datetime import datetime, timedelta, timezone

from opensandbox import Sandbox, SandboxSync
from opensandbox.exceptions import (
    PoolAcquireFailedException,
    PoolEmptyException,
    PoolNotRunningException,
)
from opensandbox.manager import SandboxManager
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.pool import (
    AcquirePolicy,
    InMemoryAsyncPoolStateStore,
    InMemoryPoolStateStore,
    PoolCreationSpec,
    PoolState,
    SandboxPoolAsync,
    SandboxPoolSync,
)
from opensandbox.sync.manager import SandboxManagerSync
from sdk_e2e import async_config, check, sync_config

LOCK_TTL = timedelta(seconds=4)
BORROW = timedelta(minutes=5)
WAIT = 90  # seconds for one eventual condition (debug build, 2 shared cores)


def _tag(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _spec(tag):
    return PoolCreationSpec(
        image="host",
        entrypoint=["tail", "-f", "/dev/null"],
        metadata={"tag": tag, "suite": "pool"},
        env={"POOL_E2E": "true"},
    )


def _pool_args(name, owner, store, tag, max_idle, **kw):
    return dict(
        pool_name=name,
        owner_id=owner,
        max_idle=max_idle,
        state_store=store,
        creation_spec=_spec(tag),
        primary_lock_ttl=LOCK_TTL,
        drain_timeout=timedelta(milliseconds=300),
        warmup_concurrency=1,
        **kw,
    )


def sync_pool(name, owner, store, tag, max_idle, **kw):
    return SandboxPoolSync(connection_config=sync_config(), **_pool_args(name, owner, store, tag, max_idle, **kw))


def async_pool(name, owner, store, tag, max_idle, **kw):
    return SandboxPoolAsync(connection_config=async_config(), **_pool_args(name, owner, store, tag, max_idle, **kw))


def eventually(what, cond, secs=WAIT):
    deadline = time.monotonic() + secs
    last = None
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except Exception as e:  # a transient error is retried, reported if it persists
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last!r})" if last else ""))


async def eventually_async(what, cond, secs=WAIT):
    deadline = time.monotonic() + secs
    last = None
    while time.monotonic() < deadline:
        try:
            if await cond():
                return
        except Exception as e:
            last = e
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last!r})" if last else ""))


def tagged(mgr, tag):
    """The ids of the live sandboxes the server lists with metadata tag=TAG."""
    infos = mgr.list_sandbox_infos(SandboxFilter(metadata={"tag": tag}, page_size=50)).sandbox_infos
    return {i.id for i in infos}


async def tagged_async(mgr, tag):
    infos = (await mgr.list_sandbox_infos(SandboxFilter(metadata={"tag": tag}, page_size=50))).sandbox_infos
    return {i.id for i in infos}


def check_renewed(expires_at, what):
    """The pool renews a sandbox it hands out to the caller's timeout (BORROW)."""
    left = expires_at - datetime.now(timezone.utc)
    check(timedelta(minutes=4) < left <= BORROW + timedelta(seconds=5), f"{what}: expires in {left}")


def check_pooled_sync(sbx, mgr, marker):
    check(sbx.is_healthy(), f"{sbx.id} not healthy")
    r = sbx.commands.run("echo pooled-ok; echo $POOL_E2E")
    check(r.error is None and [m.text for m in r.logs.stdout] == ["pooled-ok", "true"], f"run: {r}")
    if marker:
        r = sbx.commands.run(f"cat {marker}")
        check([m.text for m in r.logs.stdout] == ["prepared"], f"preparer's marker: {r}")
    check_renewed(mgr.get_sandbox_info(sbx.id).expires_at, f"acquired {sbx.id}")


async def check_pooled_async(sbx, mgr, marker):
    check(await sbx.is_healthy(), f"{sbx.id} not healthy")
    r = await sbx.commands.run("echo pooled-ok; echo $POOL_E2E")
    check(r.error is None and [m.text for m in r.logs.stdout] == ["pooled-ok", "true"], f"run: {r}")
    if marker:
        r = await sbx.commands.run(f"cat {marker}")
        check([m.text for m in r.logs.stdout] == ["prepared"], f"preparer's marker: {r}")
    check_renewed((await mgr.get_sandbox_info(sbx.id)).expires_at, f"acquired {sbx.id}")


# --- in-memory store -------------------------------------------------------------------------


def memory_sync():
    tag = _tag("pool-mem-sync")
    name = f"pool-{tag}"
    marker = f"/tmp/{tag}-prepared"
    store = InMemoryPoolStateStore()
    mgr = SandboxManagerSync.create(sync_config())
    borrowed = []

    def prepare(sbx):
        check(sbx.commands.run(f"printf prepared > {marker}").error is None, "preparer's write")

    pool = sync_pool(name, f"owner-{tag}", store, tag, 2, warmup_sandbox_preparer=prepare)
    try:
        pool.start()
        # Warm-up: exactly max_idle sandboxes made on the server, all idle, none leaked.
        eventually(
            "the pool warms 2 idle",
            lambda: pool.snapshot().state == PoolState.HEALTHY and pool.snapshot().idle_count == 2,
        )
        idle = {e.sandbox_id for e in pool.snapshot_idle_entries()}
        check(idle == tagged(mgr, tag), f"idle {idle} != listed {tagged(mgr, tag)}")

        # Acquire one of them (FAIL_FAST): prepared, healthy, runs commands, renewed; the pool
        # makes another to get back to max_idle.
        sbx = pool.acquire(BORROW, AcquirePolicy.FAIL_FAST)
        borrowed.append(sbx)
        check(sbx.id in idle, f"acquired {sbx.id} is not one of the idle {idle}")
        check_pooled_sync(sbx, mgr, marker)
        eventually("the pool refills to 2 idle", lambda: pool.snapshot().idle_count == 2)
        check(len(tagged(mgr, tag)) == 3, f"listed {tagged(mgr, tag)}")

        # Resize to 0 and release: the idle sandboxes are killed on the server; the borrowed
        # one is the caller's and stays.
        pool.resize(0)
        check(pool.release_all_idle() >= 0, "release_all_idle")
        eventually(
            "idle released and killed",
            lambda: pool.snapshot().idle_count == 0 and tagged(mgr, tag) == {sbx.id},
        )
        try:
            pool.acquire(BORROW, AcquirePolicy.FAIL_FAST)
            raise AssertionError("FAIL_FAST on an empty pool did not raise")
        except PoolEmptyException:
            pass

        # A stale idle id (the sandbox is gone on the server): acquire drops it and falls back
        # to a direct create.
        store.put_idle(name, f"missing-{uuid.uuid4().hex}")
        direct = pool.acquire(BORROW, AcquirePolicy.DIRECT_CREATE)
        borrowed.append(direct)
        check(not direct.id.startswith("missing-"), f"acquired the stale id {direct.id}")
        check_pooled_sync(direct, mgr, None)
        check(pool.snapshot().idle_count == 0, "the stale id is still idle")

        # Shutdown, then acquire is refused; a restart with max_idle 1 warms again.
        pool.shutdown(graceful=True)
        check(pool.snapshot().state == PoolState.STOPPED, f"after shutdown: {pool.snapshot()}")
        try:
            pool.acquire(BORROW, AcquirePolicy.DIRECT_CREATE)
            raise AssertionError("acquire on a stopped pool did not raise")
        except PoolNotRunningException:
            pass
        pool.start()
        pool.resize(1)
        eventually(
            "the restarted pool warms",
            lambda: pool.snapshot().state == PoolState.HEALTHY and pool.snapshot().idle_count == 1,
        )
        entries = pool.snapshot_idle_entries()
        now = datetime.now(timezone.utc)
        check(all(e.sandbox_id and e.expires_at > now for e in entries), f"idle entries {entries}")
    finally:
        for s in borrowed:
            s.kill()
            s.close()
        pool.resize(0)
        pool.release_all_idle()
        pool.shutdown(graceful=False)
    eventually("nothing tagged is left on the server", lambda: not tagged(mgr, tag), secs=30)
    mgr.close()


async def memory_async():
    tag = _tag("pool-mem-async")
    name = f"pool-{tag}"
    marker = f"/tmp/{tag}-prepared"
    store = InMemoryAsyncPoolStateStore()
    mgr = await SandboxManager.create(async_config())
    borrowed = []

    async def prepare(sbx):
        check((await sbx.commands.run(f"printf prepared > {marker}")).error is None, "preparer's write")

    pool = async_pool(name, f"owner-{tag}", store, tag, 2, warmup_sandbox_preparer=prepare)

    async def idle_count():
        return (await pool.snapshot()).idle_count

    try:
        await pool.start()

        async def warm():
            s = await pool.snapshot()
            return s.state == PoolState.HEALTHY and s.idle_count == 2

        await eventually_async("the pool warms 2 idle", warm)
        idle = {e.sandbox_id for e in await pool.snapshot_idle_entries()}
        listed = await tagged_async(mgr, tag)
        check(idle == listed, f"idle {idle} != listed {listed}")

        sbx = await pool.acquire(BORROW, AcquirePolicy.FAIL_FAST)
        borrowed.append(sbx)
        check(sbx.id in idle, f"acquired {sbx.id} is not one of the idle {idle}")
        await check_pooled_async(sbx, mgr, marker)

        async def refilled():
            return await idle_count() == 2

        await eventually_async("the pool refills to 2 idle", refilled)
        check(len(await tagged_async(mgr, tag)) == 3, "3 sandboxes listed")

        await pool.resize(0)
        check(await pool.release_all_idle() >= 0, "release_all_idle")

        async def released():
            return await idle_count() == 0 and await tagged_async(mgr, tag) == {sbx.id}

        await eventually_async("idle released and killed", released)
        try:
            await pool.acquire(BORROW, AcquirePolicy.FAIL_FAST)
            raise AssertionError("FAIL_FAST on an empty pool did not raise")
        except PoolEmptyException:
            pass

        await store.put_idle(name, f"missing-{uuid.uuid4().hex}")
        direct = await pool.acquire(BORROW, AcquirePolicy.DIRECT_CREATE)
        borrowed.append(direct)
        check(not direct.id.startswith("missing-"), f"acquired the stale id {direct.id}")
        await check_pooled_async(direct, mgr, None)
        check(await idle_count() == 0, "the stale id is still idle")

        await pool.shutdown(graceful=True)
        check((await pool.snapshot()).state == PoolState.STOPPED, "stopped after shutdown")
        try:
            await pool.acquire(BORROW, AcquirePolicy.DIRECT_CREATE)
            raise AssertionError("acquire on a stopped pool did not raise")
        except PoolNotRunningException:
            pass
        await pool.start()
        await pool.resize(1)

        async def rewarmed():
            s = await pool.snapshot()
            return s.state == PoolState.HEALTHY and s.idle_count == 1

        await eventually_async("the restarted pool warms", rewarmed)
        now = datetime.now(timezone.utc)
        entries = await pool.snapshot_idle_entries()
        check(all(e.sandbox_id and e.expires_at > now for e in entries), f"idle entries {entries}")
    finally:
        for s in borrowed:
            await s.kill()
            await s.close()
        await pool.resize(0)
        await pool.release_all_idle()
        await pool.shutdown(graceful=False)

    async def none_left():
        return not await tagged_async(mgr, tag)

    await eventually_async("nothing tagged is left on the server", none_left, secs=30)
    await mgr.close()


# --- Redis store -----------------------------------------------------------------------------


def redis_url():
    url = os.environ.get("OSB_REDIS_URL")
    check(url, "OSB_REDIS_URL is not set (the Rust test starts redis-server)")
    return url


def redis_sync():
    import redis
    from opensandbox.pool_redis import RedisPoolStateStore

    r = redis.Redis.from_url(redis_url(), decode_responses=True)
    prefix = f"opensandbox:e2e:{uuid.uuid4()}"
    tag = _tag("pool-redis-sync")
    name = f"redis-{tag}"
    owner_a, owner_b = f"owner-a-{tag}", f"owner-b-{tag}"
    store_a, store_b = RedisPoolStateStore(r, prefix), RedisPoolStateStore(r, prefix)
    lock_key = store_a._primary_lock_key(name)
    mgr = SandboxManagerSync.create(sync_config())
    borrowed = []
    pool_a = sync_pool(name, owner_a, store_a, tag, 2)
    pool_b = sync_pool(name, owner_b, store_b, tag, 2)
    try:
        pool_a.start()
        eventually("node a is primary", lambda: r.get(lock_key) == owner_a)
        pool_b.start()
        # Only the primary warms: the shared namespace holds max_idle, not 2 x max_idle.
        eventually("the shared pool warms 2 idle", lambda: pool_a.snapshot().idle_count == 2)
        check(pool_b.snapshot().idle_count == 2, "node b sees the shared idle")
        check(len(tagged(mgr, tag)) == 2, f"listed {tagged(mgr, tag)}")

        # Node b (secondary) acquires a sandbox node a warmed.
        idle = {e.sandbox_id for e in pool_a.snapshot_idle_entries()}
        sbx = pool_b.acquire(BORROW, AcquirePolicy.FAIL_FAST)
        borrowed.append(sbx)
        check(sbx.id in idle, f"acquired {sbx.id} not one of {idle}")
        check_pooled_sync(sbx, mgr, None)

        # A resize on the secondary is applied by the primary: the idle ones are killed.
        pool_b.resize(0)
        eventually(
            "the primary drains the shared idle",
            lambda: pool_a.snapshot().idle_count == 0 and tagged(mgr, tag) == {sbx.id},
        )
        try:
            pool_a.acquire(BORROW, AcquirePolicy.FAIL_FAST)
            raise AssertionError("FAIL_FAST on an empty pool did not raise")
        except PoolEmptyException:
            pass

        # A stale id in the shared store: FAIL_FAST fails (and drops it), DIRECT_CREATE works.
        store_a.put_idle(name, f"missing-{uuid.uuid4().hex}")
        try:
            pool_b.acquire(timedelta(seconds=30), AcquirePolicy.FAIL_FAST)
            raise AssertionError("FAIL_FAST on a stale idle id did not raise")
        except PoolAcquireFailedException:
            pass
        check(store_a.snapshot_counters(name).idle_count == 0, "the stale id is still idle")
        direct = pool_b.acquire(BORROW, AcquirePolicy.DIRECT_CREATE)
        borrowed.append(direct)
        check_pooled_sync(direct, mgr, None)

        # Failover: the primary stops; node b takes the lock and warms.
        pool_a.shutdown(graceful=False)
        pool_b.resize(1)
        eventually(
            "node b takes the primary lock and warms",
            lambda: r.get(lock_key) == owner_b and pool_b.snapshot().idle_count == 1,
        )
        check(len(tagged(mgr, tag)) == 3, f"listed {tagged(mgr, tag)}")
    finally:
        for s in borrowed:
            s.kill()
            s.close()
        for p in (pool_a, pool_b):
            p.resize(0)
            p.release_all_idle()
            p.shutdown(graceful=False)
    eventually("nothing tagged is left on the server", lambda: not tagged(mgr, tag), secs=30)
    mgr.close()
    for key in r.scan_iter(f"{prefix}:*"):
        r.delete(key)
    r.close()


async def redis_async():
    import redis.asyncio as aioredis
    from opensandbox.pool_redis import AsyncRedisPoolStateStore

    r = aioredis.Redis.from_url(redis_url(), decode_responses=True)
    prefix = f"opensandbox:e2e:{uuid.uuid4()}"
    tag = _tag("pool-redis-async")
    name = f"redis-{tag}"
    owner_a, owner_b = f"owner-a-{tag}", f"owner-b-{tag}"
    store_a, store_b = AsyncRedisPoolStateStore(r, prefix), AsyncRedisPoolStateStore(r, prefix)
    lock_key = store_a._primary_lock_key(name)
    mgr = await SandboxManager.create(async_config())
    borrowed = []
    pool_a = async_pool(name, owner_a, store_a, tag, 2)
    pool_b = async_pool(name, owner_b, store_b, tag, 2)

    async def idle(pool, n):
        return (await pool.snapshot()).idle_count == n

    try:
        await pool_a.start()

        async def a_primary():
            return await r.get(lock_key) == owner_a

        await eventually_async("node a is primary", a_primary)
        await pool_b.start()
        await eventually_async("the shared pool warms 2 idle", lambda: idle(pool_a, 2))
        check(await idle(pool_b, 2), "node b sees the shared idle")
        check(len(await tagged_async(mgr, tag)) == 2, "2 sandboxes listed")

        ids = {e.sandbox_id for e in await pool_a.snapshot_idle_entries()}
        sbx = await pool_b.acquire(BORROW, AcquirePolicy.FAIL_FAST)
        borrowed.append(sbx)
        check(sbx.id in ids, f"acquired {sbx.id} not one of {ids}")
        await check_pooled_async(sbx, mgr, None)

        await pool_b.resize(0)

        async def drained():
            return await idle(pool_a, 0) and await tagged_async(mgr, tag) == {sbx.id}

        await eventually_async("the primary drains the shared idle", drained)
        try:
            await pool_a.acquire(BORROW, AcquirePolicy.FAIL_FAST)
            raise AssertionError("FAIL_FAST on an empty pool did not raise")
        except PoolEmptyException:
            pass

        await store_a.put_idle(name, f"missing-{uuid.uuid4().hex}")
        try:
            await pool_b.acquire(timedelta(seconds=30), AcquirePolicy.FAIL_FAST)
            raise AssertionError("FAIL_FAST on a stale idle id did not raise")
        except PoolAcquireFailedException:
            pass
        check((await store_a.snapshot_counters(name)).idle_count == 0, "the stale id is still idle")
        direct = await pool_b.acquire(BORROW, AcquirePolicy.DIRECT_CREATE)
        borrowed.append(direct)
        await check_pooled_async(direct, mgr, None)

        await pool_a.shutdown(graceful=False)
        await pool_b.resize(1)

        async def failed_over():
            return await r.get(lock_key) == owner_b and await idle(pool_b, 1)

        await eventually_async("node b takes the primary lock and warms", failed_over)
        check(len(await tagged_async(mgr, tag)) == 3, "3 sandboxes listed")
    finally:
        for s in borrowed:
            await s.kill()
            await s.close()
        for p in (pool_a, pool_b):
            await p.resize(0)
            await p.release_all_idle()
            await p.shutdown(graceful=False)

    async def none_left():
        return not await tagged_async(mgr, tag)

    await eventually_async("nothing tagged is left on the server", none_left, secs=30)
    await mgr.close()
    async for key in r.scan_iter(f"{prefix}:*"):
        await r.delete(key)
    await r.aclose()


SCENARIOS = {
    "memory_sync": memory_sync,
    "memory_async": lambda: asyncio.run(memory_async()),
    "redis_sync": redis_sync,
    "redis_async": lambda: asyncio.run(redis_async()),
}
