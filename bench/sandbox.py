"""Benchmark: a trivial tool through the persistent sandboxed worker, against calling the same
function in-process and against a fresh sandboxed process per call, in the same run; and
``reset()`` (a fresh episode forked from the pristine template) against a fresh sandbox.

Targets: p50 under 5 ms per sandboxed call, ``reset()`` under 50 ms.

    .venv/bin/python bench/sandbox.py [--calls 1000] [--fresh-calls 100] [--resets 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time

from astra_agent.sandbox import Sandbox, SandboxLimits, bwrap_command

SOURCE = "def add(a, b):\n    return {'sum': a + b}\n"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3


async def persistent(n: int) -> list[float]:
    out = []
    async with Sandbox({"add": SOURCE}, SandboxLimits()) as sb:
        for i in range(20):
            await sb.call("add", {"a": i, "b": 1})
        for i in range(n):
            t = time.perf_counter()
            r = await sb.call("add", {"a": i, "b": 1})
            out.append(time.perf_counter() - t)
            assert r.ok and r.value == {"sum": i + 1}
    return out


def in_process(n: int) -> list[float]:
    ns: dict = {}
    exec(compile(SOURCE, "<tool add>", "exec"), ns)
    fn, out = ns["add"], []
    for i in range(n):
        t = time.perf_counter()
        value = fn(**json.loads(json.dumps({"a": i, "b": 1})))
        json.dumps(value)
        out.append(time.perf_counter() - t)
    return out


def fresh(n: int) -> list[float]:
    """A new bubblewrap + Python per call: load, call, exit."""
    cmd = bwrap_command({"limits": {}, "uid": 65534 if os.geteuid() == 0 else None})
    out = []
    for i in range(n):
        req = json.dumps({"op": "load", "seq": 1, "tools": {"add": SOURCE}}) + "\n"
        req += json.dumps({"op": "call", "seq": 2, "name": "add", "args": {"a": i, "b": 1}})
        t = time.perf_counter()
        r = subprocess.run(cmd, input=req + "\n", capture_output=True, text=True, check=True)
        out.append(time.perf_counter() - t)
        assert json.loads(r.stdout.splitlines()[-1])["value"] == {"sum": i + 1}
    return out


async def resets(n: int) -> tuple[list[float], list[float]]:
    """reset() of a live sandbox, and the baseline: a new sandbox per episode (start, close)."""
    warm, cold = [], []
    async with Sandbox({"add": SOURCE}, SandboxLimits()) as sb:
        for i in range(n):
            await sb.call("add", {"a": i, "b": 1})
            t = time.perf_counter()
            await sb.reset()
            warm.append(time.perf_counter() - t)
    for _ in range(max(1, n // 5)):
        t = time.perf_counter()
        async with Sandbox({"add": SOURCE}, SandboxLimits()):
            pass
        cold.append(time.perf_counter() - t)
    return warm, cold


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--fresh-calls", type=int, default=100)
    ap.add_argument("--resets", type=int, default=100)
    args = ap.parse_args()
    warm, cold = asyncio.run(resets(args.resets))
    rows = [
        ("in-process function call", in_process(args.calls)),
        ("persistent sandboxed worker", asyncio.run(persistent(args.calls))),
        ("fresh sandboxed process per call", fresh(args.fresh_calls)),
        ("reset() (fork of the template)", warm),
        ("new sandbox per episode", cold),
    ]
    print(f"{'path':<36}{'calls':>7}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for name, xs in rows:
        print(
            f"{name:<36}{len(xs):>7}{pct(xs, 0.5):>10.3f}{pct(xs, 0.99):>10.3f}"
            f"{statistics.mean(xs) * 1e3:>10.3f}"
        )
    p50 = pct(rows[1][1], 0.5)
    print(
        f"persistent worker vs fresh process: p50 {pct(rows[2][1], 0.5) / p50:.0f}x faster; "
        f"target p50 < 5 ms: {'met' if p50 < 5 else 'MISSED'} ({p50:.3f} ms)"
    )
    r50 = pct(warm, 0.5)
    print(
        f"reset() vs new sandbox: p50 {pct(cold, 0.5) / r50:.0f}x faster; "
        f"target reset p50 < 50 ms: {'met' if r50 < 50 else 'MISSED'} ({r50:.3f} ms)"
    )


if __name__ == "__main__":
    main()
