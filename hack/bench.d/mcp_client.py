"""hack/bench mcp's client: the official MCP Python SDK (`mcp`, the version pinned in
hack/bench.d/mcp.sh) driving a stdio MCP server, the same code for every server.

    mcp_client.py latency --tool T --runs N --warmup W [--err FILE] -- SERVER [ARG...]
        One server process, one session: initialize, list_tools, W warm-up calls, then N calls
        of T(code="print(1)") back to back. Prints JSON: spawn_to_init_ms, spawn_to_first_ms
        (the first call's result, i.e. the server's cold start as a client sees it), per-call
        p50/p95/p99/min/max/mean (ms), and the last result's text.
    mcp_client.py load --tool T --clients K --secs S --warmup W [--err FILE] -- SERVER [ARG...]
        K clients, each its own process running its own server process and session (stdio
        is one server per client); each warms up (W calls), then all start together and
        call T back to back (closed loop) for S seconds. Prints JSON: calls, errors, calls/s
        (successful calls / time until the last call ended), p50/p99 (ms) over all calls.
    mcp_client.py cold --tool T -- SERVER [ARG...]
        Spawn, initialize, one call, shut down (stdin closed, the server's exit awaited, as the
        SDK does): for hyperfine (whole process, the client's own start included).
    mcp_client.py tools -- SERVER [ARG...]
        Prints the server's `tools/list` result as JSON (for hack/bench.d/mcp_null_server.py).
    mcp_client.py import
        Only imports the SDK and exits: the client's own floor in the hyperfine session.

A call counts as correct when the result is not an error and its output is `1`: the text
itself (sandlock-mcp answers stdout as text) or the `stdout` of the JSON object in the
text/structuredContent (agentrun's contract). The server's environment is this process's
(stdio_client's default would drop AGENTRUN_STATE_DIR and the like); its stderr goes to
--err (default /dev/null).
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

CODE = "print(1)"


def pct(lat, q):
    if not lat:
        return None
    s = sorted(lat)
    return round(s[min(len(s) - 1, int(round(q * (len(s) - 1))))] * 1000, 2)


def summary(lat):
    return {
        "p50_ms": pct(lat, 0.50), "p95_ms": pct(lat, 0.95), "p99_ms": pct(lat, 0.99),
        "min_ms": round(min(lat) * 1000, 2) if lat else None,
        "max_ms": round(max(lat) * 1000, 2) if lat else None,
        "mean_ms": round(sum(lat) / len(lat) * 1000, 2) if lat else None,
    }


def output_of(result):
    """The printed output of a call (str), or raises with what came back instead."""
    text = "".join(getattr(c, "text", "") for c in result.content or [])
    # mcp 1.x names them isError/structuredContent, mcp 2.x is_error/structured_content.
    if getattr(result, "isError", None) or getattr(result, "is_error", None):
        raise RuntimeError(f"tool error: {text[:300]}")
    obj = getattr(result, "structuredContent", getattr(result, "structured_content", None))
    if obj is None:
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
    if isinstance(obj, dict) and "stdout" in obj:
        if obj.get("exit_code", 0) != 0:
            raise RuntimeError(f"exit {obj.get('exit_code')}: {obj.get('stderr', '')[:300]}")
        return obj["stdout"]
    return text


class Server:
    """One stdio server process and its initialized session (an async context manager)."""

    def __init__(self, argv, err):
        self.argv, self.err = argv, err

    async def __aenter__(self):
        from contextlib import AsyncExitStack

        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        self.stack = AsyncExitStack()
        params = StdioServerParameters(command=self.argv[0], args=self.argv[1:], env=dict(os.environ))
        errf = self.stack.enter_context(open(self.err, "a"))
        self.t_spawn = time.perf_counter()
        read, write = await self.stack.enter_async_context(stdio_client(params, errlog=errf))
        self.session = await self.stack.enter_async_context(ClientSession(read, write))
        await self.session.initialize()
        self.t_init = time.perf_counter()
        return self

    async def __aexit__(self, *exc):
        await self.stack.aclose()

    async def call(self, tool):
        r = await self.session.call_tool(tool, {"code": CODE})
        out = output_of(r)
        if out.strip() != "1":
            raise RuntimeError(f"printed {out[:200]!r}, expected '1'")
        return out


async def latency(a):
    async with Server(a.server, a.err) as s:
        await s.call(a.tool)
        t_first = time.perf_counter()
        await s.session.list_tools()  # cached output schemas: no list_tools inside a timed call
        for _ in range(a.warmup):
            await s.call(a.tool)
        lat = []
        out = ""
        for _ in range(a.runs):
            t0 = time.perf_counter()
            out = await s.call(a.tool)
            lat.append(time.perf_counter() - t0)
    res = {"runs": a.runs, "warmup": a.warmup,
           "spawn_to_init_ms": round((s.t_init - s.t_spawn) * 1000, 1),
           "spawn_to_first_ms": round((t_first - s.t_spawn) * 1000, 1), **summary(lat),
           "output": out}
    print(json.dumps(res))


async def worker(a):
    """One load client: warms up, says `ready`, waits for `go DEADLINE` on stdin, runs."""
    lat, errors, first_error = [], 0, None
    async with Server(a.server, a.err) as s:
        await s.session.list_tools()
        for _ in range(a.warmup):
            await s.call(a.tool)
        print("ready", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        deadline = float(line.split()[1])
        t_start = time.time()
        while time.time() < deadline:
            t0 = time.perf_counter()
            try:
                await s.call(a.tool)
            except Exception as e:  # a failed call is counted, the loop goes on
                errors += 1
                first_error = first_error or f"{type(e).__name__}: {e}"[:300]
            lat.append(time.perf_counter() - t0)
        t_end = time.time()
    print(json.dumps({"lat": lat, "errors": errors, "first_error": first_error,
                      "t_start": t_start, "t_end": t_end}), flush=True)


def load(a):
    me = [sys.executable, os.path.abspath(__file__), "worker", "--tool", a.tool,
          "--warmup", str(a.warmup), "--err", a.err, "--", *a.server]
    procs = [subprocess.Popen(me, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(a.clients)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"mcp_client load: a client failed before the run (exit {p.wait()})")
        deadline = time.time() + 0.2 + a.secs
        for p in procs:
            p.stdin.write(f"go {deadline}\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=a.secs + 120)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lat = [x for r in results for x in r["lat"]]
    errors = sum(r["errors"] for r in results)
    elapsed = max(r["t_end"] for r in results) - min(r["t_start"] for r in results)
    ok = len(lat) - errors
    print(json.dumps({"clients": a.clients, "secs": round(elapsed, 2), "calls": len(lat),
                      "errors": errors, "calls_per_s": round(ok / elapsed, 1),
                      "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99),
                      "first_error": next((r["first_error"] for r in results if r["first_error"]), None)}))


async def tools(a):
    async with Server(a.server, a.err) as s:
        r = await s.session.list_tools()
    print(r.model_dump_json(by_alias=True, exclude_none=True))


async def cold(a):
    async with Server(a.server, a.err) as s:
        await s.call(a.tool)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["latency", "load", "worker", "cold", "tools", "import"])
    ap.add_argument("--tool", default="run_python")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--secs", type=float, default=10)
    ap.add_argument("--err", default=os.devnull)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    a.server = argv[cut + 1:]
    if a.mode == "import":
        import mcp.client.stdio  # noqa: F401  the same imports as a run, nothing else
        from mcp import ClientSession  # noqa: F401
        return
    if not a.server:
        ap.error("no server command")
    if a.mode == "load":
        load(a)
    else:
        asyncio.run({"latency": latency, "worker": worker, "cold": cold, "tools": tools}[a.mode](a))


if __name__ == "__main__":
    main()
