"""Shared fixtures and helpers for the training tests: the tiny tokenizer, the arena trajectory
corpus, and a synthesis stage killed mid-run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eval.arenas import DATA_DIR
from tests.conftest import kill_after_records, shared_once
from tests.training.e2e import RLStart, SFTRun, rl_start, run_sft
from tests.training.verl_tq import local_transfer_queue
from training.replay import replay_arenas
from training.synth.stage import JOURNAL

ARENA_TRAIN = DATA_DIR / "train.jsonl"
ARENA_HELDOUT = DATA_DIR / "heldout.jsonl"


def kill_stage_midway(args: list[str], out: Path, at_least: int, units: int, torn: str) -> int:
    """Run the synthesis stage ``astra-train ARGS`` (writing to ``out``) as a process and
    ``kill -9`` it once its journal holds ``at_least`` units, which must be mid-run (fewer than
    all ``units``); then leave a record of unit ``torn`` cut mid-write, as a kill can. Returns
    how many units the killed run finished."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "200"},
    )
    done = kill_after_records(proc, out / JOURNAL, at_least, timeout_s=60)
    assert at_least <= done < units
    with (out / JOURNAL).open("a") as f:
        f.write(f'{{"unit": "{torn}", "records": [{{"id": "torn')
    return done


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tiny_fp32: Path) -> Path:
    """A checkpoint dir holding the tiny tokenizer and the serving chat template."""
    return tiny_fp32


@pytest.fixture(scope="session")
def arena_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``astra-eval arenas`` results (trajectories + rewards) of the replayed reference chains
    through the real loop (``training.replay``): {"train": results.jsonl of the 24 training
    tasks, "heldout": the 12 held-out ones}."""

    def build(root: Path) -> dict[str, Any]:
        return {
            "train": str(asyncio.run(replay_arenas(ARENA_TRAIN, root / "train"))[0]),
            "heldout": str(asyncio.run(replay_arenas(ARENA_HELDOUT, root / "heldout"))[0]),
        }

    return {k: Path(v) for k, v in shared_once(tmp_path_factory, "arena-corpus", build).items()}


@pytest.fixture(scope="session")
def arena_corpus(arena_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One results.jsonl with the records of the 24 training and 12 held-out arena tasks."""
    out = tmp_path_factory.mktemp("arena-all") / "results.jsonl"
    text = arena_runs["train"].read_text() + arena_runs["heldout"].read_text()
    out.write_text(text)
    return out


@pytest.fixture(scope="session")
def sft_tiny(arena_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> SFTRun:
    """One SFT run of the random tiny model on the 24 training arena trajectories (the shipped
    tiny recipe cut to ``e2e.SFT_STEPS``, checkpoints every 200 kept): the SFT proof evaluates
    its final checkpoint, the RL proofs start from an intermediate one. Run once for all xdist
    workers."""
    record = shared_once(
        tmp_path_factory, "sft-tiny", lambda root: run_sft(root, arena_runs["train"]).to_json()
    )
    return SFTRun.from_json(record)


@pytest.fixture(scope="session")
def rl_start_point(sft_tiny: SFTRun, tmp_path_factory: pytest.TempPathFactory) -> RLStart:
    """Where both RL proofs start: an intermediate checkpoint of ``sft_tiny`` and the training
    tasks chosen by probing it (``e2e.rl_start``). Run once for all xdist workers."""
    record = shared_once(
        tmp_path_factory, "rl-start", lambda root: rl_start(sft_tiny, ARENA_TRAIN, root).to_json()
    )
    return RLStart.from_json(record)


@pytest.fixture(scope="module")
def verl_ray() -> Iterator[Any]:
    """A local Ray with TransferQueue on it (``verl_tq.local_transfer_queue``) for a module of
    tests of verl's real components (shut down after it: its daemons would otherwise idle
    through the rest of the suite); yields the ``transfer_queue`` module."""
    with local_transfer_queue() as tq:
        yield tq
