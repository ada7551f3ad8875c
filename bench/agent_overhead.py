"""Benchmark: the runtime's per-call overhead, and concurrent episodes per second.

1. A trivial MCP tool (the fixture's `echo`) called N times through the runtime (the episode
   loop's call path: name routing, JSON parsing, schema validation, the MCP environment,
   truncation) vs directly through the MCP SDK's `Client.call_tool` on the same server program,
   in the same run, batches interleaved. Target: ≤ 1.2× or under 1 ms added per call.
2. 32 concurrent episodes (one tool call, then an answer) against the scripted
   OpenAI-compatible server in its own process: episodes per second, against the same episodes
   run one by one; once with no model latency (pure runtime cost) and once with 50 ms per reply.

    .venv/bin/python bench/agent_overhead.py [--calls 2000] [--episodes 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from _common import run_limited
from mcp import Client, StdioServerParameters, stdio_client

from astra_agent.environment import ToolSpec
from astra_agent.episode import CallPolicy, EpisodeLimits, _run_call, run_episode
from astra_agent.function_env import FunctionEnvironment
from astra_agent.mcp_config import parse_mcp_config
from astra_agent.mcp_env import MCPEnvironment
from astra_agent.model import ChatModel, ModelConfig, ToolCall
from astra_agent.testing.scripted_server import in_subprocess

FIXTURE = [sys.executable, "-m", "astra_agent.testing.mcp_fixture"]


async def per_call(calls: int, batches: int) -> None:
    params = StdioServerParameters(command=FIXTURE[0], args=FIXTURE[1:])
    cfg = parse_mcp_config({"mcpServers": {"fx": {"command": FIXTURE[0], "args": FIXTURE[1:]}}})
    limits, policy = EpisodeLimits(), CallPolicy()
    with open("/dev/null", "w") as devnull:
        async with (
            Client(stdio_client(params, errlog=devnull), mode="legacy") as sdk,
            MCPEnvironment(cfg) as env,
        ):
            if True:
                tools = {t.name: t for t in await env.list_tools()}
                call = ToolCall("c", "echo", json.dumps({"text": "ping"}))
                for _ in range(50):  # warm both paths
                    await sdk.call_tool("echo", {"text": "ping"})
                    await _run_call(env, tools, call, limits, policy)
                sdk_t: list[float] = []
                ours_t: list[float] = []
                per = calls // batches
                for _ in range(batches):
                    t = time.perf_counter()
                    for _ in range(per):
                        await sdk.call_tool("echo", {"text": "ping"})
                    sdk_t.append((time.perf_counter() - t) / per)
                    t = time.perf_counter()
                    for _ in range(per):
                        out = await _run_call(env, tools, call, limits, policy)
                        assert out.status == "ok"
                    ours_t.append((time.perf_counter() - t) / per)
    s, o = statistics.median(sdk_t), statistics.median(ours_t)
    print(f"per call, median of {batches} batches of {per} (echo over stdio):")
    print(f"  MCP SDK Client.call_tool   {s * 1e3:8.3f} ms")
    print(f"  astra runtime call path    {o * 1e3:8.3f} ms")
    print(
        f"  ratio {o / s:.2f}x, added {max(0.0, o - s) * 1e3:.3f} ms per call "
        f"(target ≤ 1.2x or < 1 ms): {'met' if o / s <= 1.2 or o - s < 1e-3 else 'MISSED'}"
    )


async def episodes(n: int, concurrency: int, delay: float) -> None:
    """The scripted server runs in its own process, as a real endpoint would."""
    echo = ToolSpec("echo", "echo", {"type": "object", "properties": {"text": {"type": "string"}}})
    env = FunctionEnvironment([(echo, lambda text: text)])
    with in_subprocess(delay_s=delay) as (url, _):
        model = ChatModel(ModelConfig(base_url=url, model="scripted"))
        try:

            async def one() -> None:
                traj = await run_episode(model, env, [{"role": "user", "content": "go"}])
                assert traj.termination == "stop" and traj.steps == 2, traj.termination_detail

            for _ in range(8):
                await one()
            t = time.perf_counter()
            for _ in range(n // 8):
                await one()
            serial = (n // 8) / (time.perf_counter() - t)
            t = time.perf_counter()
            await run_limited(one, n, concurrency)
            conc = n / (time.perf_counter() - t)
        finally:
            await model.close()
    print(
        f"episodes against the scripted server (2 model calls + 1 tool call each), {n} episodes,"
        f" {delay * 1000:.0f} ms model latency:"
    )
    print(f"  one at a time        {serial:8.1f} episodes/s")
    print(f"  {concurrency} concurrent        {conc:8.1f} episodes/s   ({conc / serial:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    asyncio.run(per_call(args.calls, args.batches))
    asyncio.run(episodes(args.episodes, args.concurrency, 0.0))
    asyncio.run(episodes(args.episodes, args.concurrency, 0.05))


if __name__ == "__main__":
    main()
