"""What the benchmarks share. The scripts run as ``python bench/NAME.py``, so this module is
imported as ``_common`` (the script's own folder is first on ``sys.path``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def run_limited(call: Callable[[], Awaitable[Any]], times: int, concurrency: int) -> None:
    """``call()`` ``times`` times, at most ``concurrency`` at a time."""
    sem = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with sem:
            await call()

    await asyncio.gather(*(limited() for _ in range(times)))


async def cpu_per_reply(call: Callable[[], Awaitable[Any]], calls: int, concurrency: int) -> float:
    """CPU ms of this process per reply, ``calls`` replies ``concurrency`` at a time."""
    cpu0 = time.process_time()
    await run_limited(call, calls, concurrency)
    return 1e3 * (time.process_time() - cpu0) / calls


def arena_rows(tokenizer_dir: Any, workdir: Any) -> list[dict[str, Any]]:
    """The 24 training arena trajectories (reference chains replayed through the real loop)
    tokenized with ``tokenizer_dir``'s tokenizer: ``{"input_ids", "assistant_masks"}`` rows."""
    import json
    import shutil

    from training.replay import TRAIN_TASKS, replay_arenas
    from training.template import load_tokenizer, tokenize

    shutil.rmtree(workdir / "replay", ignore_errors=True)
    results, _ = asyncio.run(replay_arenas(TRAIN_TASKS, workdir / "replay"))
    tok = load_tokenizer(tokenizer_dir)
    rows = []
    for line in results.read_text().splitlines():
        traj = json.loads(line)["trajectory"]
        t = tokenize(tok, traj["messages"], traj["tools"])
        rows.append({"input_ids": t.input_ids, "assistant_masks": t.loss_mask})
    return rows


def quiet_training(threads: int) -> None:
    """Torch on ``threads`` threads, no progress bars or library chatter: what the SFT
    benchmarks print is their own figures."""
    import os

    import torch
    from datasets import disable_progress_bars
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads)
    disable_progress_bars()
    hf_logging.set_verbosity_error()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
