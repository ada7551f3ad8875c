"""Benchmark: the model client's CPU per reply, against a bare aiohttp POST of the same body.

Every eval, synthesis stage and HTTP rollout goes through ``ChatModel.complete``; at high
concurrency its CPU bounds the whole pipeline. Measured here, in one run, against the
scripted OpenAI-compatible server in a process of its own (so this process's CPU is the
client's alone), with a request of 20 tools and a 1,200-character user message (a reply of
one tool call with its reasoning):

* ``ChatModel.complete``: the harness's client (body building, the Qwen3 contract, retries,
  error kinds, reply parsing);
* the OpenAI SDK's ``post`` on its aiohttp transport, the body posted as built: what
  ``ChatModel`` used before (the baseline of the change);
* a bare aiohttp POST of the same body + ``json.loads`` (what the transport itself costs).

Rounds alternate the three, so that drift of the machine hits each alike; the medians are
printed, with the ratios. Target: ``ChatModel.complete`` within 1.5× of the bare POST. Also
the cost of making and closing one client (the SDK built an SSL context each time, for
plain-http endpoints too).

    .venv/bin/python bench/client.py [--calls 400] [--rounds 5] [--concurrency 1,64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import aiohttp
from _common import cpu_per_reply

from astra_agent.model import ChatModel, ModelConfig, prepare_messages
from astra_agent.testing.scripted_server import in_subprocess

MODEL = "scripted"


def tools(n: int = 20) -> list[dict[str, Any]]:
    props = {
        "query": {"type": "string", "description": "What to look up, in plain words."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": "At most."},
        "region": {"type": "string", "enum": ["eu", "us", "apac"], "description": "Where."},
    }
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i:02d}",
                "description": f"Tool number {i}: looks things up and returns a short answer.",
                "parameters": {"type": "object", "properties": props, "required": ["query"]},
            },
        }
        for i in range(n)
    ]


TOOLS = tools()
MESSAGES = [{"role": "user", "content": ("Find the cheapest route and book it. " * 40)[:1200]}]


async def measure(url: str, calls: int, rounds: int, concurrency: int) -> dict[str, float]:
    import openai
    from openai.types.chat import ChatCompletion

    cfg = ModelConfig(base_url=url, model=MODEL)
    model = ChatModel(cfg)
    # the body ChatModel sends, for the other two clients
    body = model._body(MODEL, prepare_messages(MESSAGES), TOOLS, stream=False)
    sdk = openai.AsyncOpenAI(
        base_url=url,
        api_key="EMPTY",
        max_retries=0,
        http_client=openai.DefaultAioHttpClient(timeout=600.0),
    )
    session = aiohttp.ClientSession()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer EMPTY"}

    async def ours() -> None:
        turn = await model.complete(MESSAGES, TOOLS)
        assert turn.tool_calls and turn.reasoning

    async def via_sdk() -> None:
        r = await sdk.post("/chat/completions", cast_to=ChatCompletion, body=body)
        assert r.choices[0].message.tool_calls

    async def bare() -> None:
        data = json.dumps(body).encode()
        async with session.post(f"{url}/chat/completions", data=data, headers=headers) as r:
            reply = json.loads(await r.read())
        assert reply["choices"][0]["message"]["tool_calls"]

    clients = {"ChatModel.complete": ours, "OpenAI SDK post": via_sdk, "bare aiohttp": bare}
    out: dict[str, list[float]] = {k: [] for k in clients}
    try:
        for fn in clients.values():  # warm-up: connections, imports
            await cpu_per_reply(fn, 16, concurrency)
        for _ in range(rounds):
            for name, fn in clients.items():
                out[name].append(await cpu_per_reply(fn, calls, concurrency))
    finally:
        await model.close()
        await sdk.close()
        await session.close()
    return {k: statistics.median(v) for k, v in out.items()}


async def construction(url: str, n: int) -> dict[str, float]:
    """Wall ms to make and close one client (ChatModel opens its connection pool at its first
    request, the SDK's client when it is made)."""
    import openai

    async def ours() -> None:
        await ChatModel(ModelConfig(base_url=url, model=MODEL)).close()

    async def via_sdk() -> None:
        client = openai.AsyncOpenAI(
            base_url=url,
            api_key="EMPTY",
            max_retries=0,
            http_client=openai.DefaultAioHttpClient(timeout=600.0),
        )
        await client.close()

    out = {}
    for name, fn in (("ChatModel", ours), ("OpenAI SDK client", via_sdk)):
        await fn()
        t0 = time.perf_counter()
        for _ in range(n):
            await fn()
        out[name] = 1e3 * (time.perf_counter() - t0) / n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=400, help="replies per client per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", default="1,64", help="comma-separated")
    args = ap.parse_args()
    body_chars = len(json.dumps({"messages": MESSAGES, "tools": TOOLS}))
    print(f"request: 20 tools, a 1,200-character message ({body_chars:,} characters of JSON)")
    with in_subprocess() as (url, _):
        for conc in (int(c) for c in args.concurrency.split(",")):
            res = asyncio.run(measure(url, args.calls, args.rounds, conc))
            bare = res["bare aiohttp"]
            print(f"\nclient CPU per reply, {conc} at a time (median of {args.rounds} rounds):")
            for name, ms in res.items():
                print(f"  {name:20s} {ms:6.3f} ms   {ms / bare:5.2f}× bare")
            sdk, ours = res["OpenAI SDK post"], res["ChatModel.complete"]
            print(f"  ChatModel.complete uses {sdk / ours:.2f}× less CPU than the SDK's post")
        made = asyncio.run(construction(url, 20))
        print("\nmaking and closing one client (wall):")
        for name, ms in made.items():
            print(f"  {name:20s} {ms:6.2f} ms")


if __name__ == "__main__":
    main()
