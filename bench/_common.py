"""What the benchmarks share. The scripts run as ``python bench/NAME.py``, so this module is
imported as ``_common`` (the script's own folder is first on ``sys.path``)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
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


def arena_rows(
    tokenizer_dir: Any, workdir: Any, *, in_task_order: bool = False
) -> list[dict[str, Any]]:
    """The 24 training arena trajectories (reference chains replayed through the real loop)
    tokenized with ``tokenizer_dir``'s tokenizer: ``{"input_ids", "assistant_masks"}`` rows, in
    the order the replay finished them, or with ``in_task_order`` in the tasks' file order
    (the same rows in every run)."""
    import json
    import shutil

    from training.replay import TRAIN_TASKS, replay_arenas
    from training.template import load_tokenizer, tokenize

    shutil.rmtree(workdir / "replay", ignore_errors=True)
    results, _ = asyncio.run(replay_arenas(TRAIN_TASKS, workdir / "replay"))
    tok = load_tokenizer(tokenizer_dir)
    rows = []
    records = [json.loads(line) for line in results.read_text().splitlines()]
    if in_task_order:
        records.sort(key=lambda r: r["index"])
    for record in records:
        traj = record["trajectory"]
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


def sft_parser(doc: str | None, *, steps: int, workdir: Path) -> argparse.ArgumentParser:
    """The SFT benchmarks' common flags (``--steps``, ``--threads``, ``--workdir``); a benchmark
    adds its own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=workdir)
    return ap


def sft_trainer(
    model_dir: Path,
    rows: list[dict[str, Any]],
    out: Path,
    settings: dict[str, Any],
    *,
    steps: int,
    callbacks: Sequence[Any] = (),
    logging_steps: int = 10**6,
    counts: Any = None,
) -> tuple[Any, Any]:
    """An ``SFTTrainer`` on CPU of ``rows`` for ``steps`` steps that saves nothing, built as
    ``astra-train sft`` builds it, and its ``TokenCounts`` (``counts``, or new ones).
    ``settings``: the config fields the benchmark compares or fixes, over a base every SFT
    benchmark shares, so that their figures time the same thing."""
    from training.sft.config import SFTConfig
    from training.sft.trl import TokenCounts, load_model, make_trainer, trl_args
    from training.template import load_tokenizer

    cfg = SFTConfig.model_validate(
        {
            "model": model_dir,
            "train_files": [out / "unused.parquet"],
            "output_dir": out,
            "max_length": 8192,
            "max_steps": steps,
            "save_steps": 10**6,
            **settings,
        }
    )
    counts = TokenCounts() if counts is None else counts
    args = trl_args(cfg, "cpu", save_strategy="no", logging_steps=logging_steps)
    model = load_model(cfg)
    trainer = make_trainer(
        cfg, model, load_tokenizer(model_dir), rows, args, list(callbacks), counts
    )
    return trainer, counts


def train_sft(
    model_dir: Path,
    rows: list[dict[str, Any]],
    out: Path,
    settings: dict[str, Any],
    *,
    steps: int,
    callbacks: Sequence[Any] = (),
    logging_steps: int = 10**6,
    counts: Any = None,
) -> tuple[Any, Any, float]:
    """One run of :func:`sft_trainer`: the trainer, its ``TokenCounts`` and the wall seconds of
    ``train()`` alone."""
    trainer, counts = sft_trainer(
        model_dir, rows, out, settings, steps=steps, callbacks=callbacks,
        logging_steps=logging_steps, counts=counts,
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer.train()
    return trainer, counts, time.perf_counter() - t0


def load_average() -> float:
    """The 1-minute load average."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_model() -> str:
    """The CPU's model name (``lscpu``'s, else /proc/cpuinfo's) and whether it has AMX or
    AVX512-BF16: bf16 speeds differ by several times between these machines."""
    import re
    import subprocess

    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    found = re.search(r"Model name:\s*(.+)", text)
    with open("/proc/cpuinfo") as f:
        info = f.read()
    if not found:
        found = re.search(r"model name\s*:\s*(.+)", info)
    flags = [f for f in ("amx_bf16", "avx512_bf16", "avx2") if re.search(rf"\b{f}\b", info)]
    name = found.group(1).strip() if found else "unknown CPU"
    return f"{name} ({', '.join(flags) or 'no AVX2'})"


def print_load_average() -> None:
    """The 1-minute load average, printed last: a busy machine explains slow figures."""
    print(f"load average at the end: {load_average()}")
