"""Shared fixtures and helpers for the training tests: the tiny tokenizer, the arena trajectory
corpus and its SFT data, the random tiny checkpoint, `astra-train` run in-process, and a
synthesis stage killed mid-run."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from astra_agent import console as console_mod
from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import ScriptedServer
from eval.arenas import DATA_DIR
from serving.tiny import TinySpec, build_tiny_checkpoint
from tests.conftest import kill_after_records, shared_once
from tests.training.e2e import RLStart, SFTRun, rl_start, run_sft
from tests.training.verl_tq import local_transfer_queue
from training.cli import app as train_app
from training.replay import replay_arenas
from training.synth.stage import JOURNAL

ARENA_TRAIN = DATA_DIR / "train.jsonl"
ARENA_HELDOUT = DATA_DIR / "heldout.jsonl"
RECIPES = Path(__file__).resolve().parents[2] / "training" / "recipes"  # the shipped recipes


def drop_checkpoints(run: Path) -> None:
    """Remove a finished training run's resumable checkpoints, kept by a module's fixture for
    its tests: their optimizer state is 1.6 GB of the real 135M model's 2.3 GB, and CI's disk
    is shared. Its ``final/`` and ``final-bf16/`` stay."""
    for checkpoint in run.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)


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


C = TypeVar("C", bound=BaseModel)
S = TypeVar("S")


def resume_killed_stage(
    run: Callable[[C], Coroutine[Any, Any, S]],
    cfg: C,
    name: str,
    srv: ScriptedServer,
    *,
    other: dict[str, Any] | None = None,
) -> tuple[S, int]:
    """After :func:`kill_stage_midway`: ``run(cfg)`` refuses the unfinished ``name`` run, and
    (with ``other``) a resume under other parameters; then the run resumes. Returns its stats
    and how many requests the resumed run sent to the teacher ``srv``."""
    with pytest.raises(ConfigError, match=f"unfinished {name} run"):
        asyncio.run(run(cfg))
    if other is not None:
        with pytest.raises(ConfigError, match="other inputs or parameters"):
            asyncio.run(run(cfg.model_copy(update={"resume": True, **other})))
    before = len(srv.requests)
    stats = asyncio.run(run(cfg.model_copy(update={"resume": True})))
    return stats, len(srv.requests) - before


def check_verl_resume(
    prepare: Callable[[Any], Any], make_cfg: Callable[..., Any], tmp_path: Path, iteration: str
) -> None:
    """A verl job (SFT or RL: ``prepare(make_cfg(tmp_path, **changes))``) beside a checkpoint
    of iteration ``iteration`` resumes it under a config that differs only outside the
    fingerprint. Another config is refused, as a TRL run refuses it (starting over included:
    its run directory is another's); so is resuming verl's checkpoints under a model of the
    same content at another path, unless told to start over, which sets them aside."""
    prepare(make_cfg(tmp_path))
    ckpt = tmp_path / "out" / "checkpoints"
    ckpt.mkdir()
    (ckpt / "latest_checkpointed_iteration.txt").write_text(iteration)
    prepare(make_cfg(tmp_path, save_steps=7))  # not in the fingerprint: fine
    with pytest.raises(ConfigError, match=r"holds a run of a different config: learning_rate"):
        prepare(make_cfg(tmp_path, learning_rate=1e-4))
    with pytest.raises(ConfigError, match="different config"):
        prepare(make_cfg(tmp_path, learning_rate=1e-4, resume=False))
    moved = tmp_path / "elsewhere"  # no model here either: the same content, another path
    with pytest.raises(ConfigError, match=r"holds checkpoints of a different config: model"):
        prepare(make_cfg(tmp_path, model=moved))
    prepare(make_cfg(tmp_path, model=moved, resume=False))  # start over: fine
    earlier = tmp_path / "out" / "previous-1" / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert earlier.read_text() == iteration and not ckpt.exists()


def check_verl_run_file(
    prepare: Callable[[Any], Any], make_cfg: Callable[..., Any], tmp_path: Path, kind: str
) -> None:
    """A verl job (SFT or RL) writes the run file a TRL run writes, so that ``astra-eval``
    reads its directory as a training run of ``kind``; a rerun of the same config leaves it
    as it is. Another config is refused, as a TRL run refuses it, except by RL, whose run
    that saved nothing takes it (as RL's TRL backend does)."""
    from eval.rundir import load_run

    cfg = make_cfg(tmp_path)
    prepare(cfg)
    run_file = tmp_path / "out" / cfg.RUN_FILE
    first = run_file.read_bytes()
    run = load_run(tmp_path / "out")
    assert run.kind == kind and run.config == cfg.fingerprint()
    prepare(make_cfg(tmp_path, save_steps=7))  # not in the fingerprint: the same run
    assert run_file.read_bytes() == first
    other = make_cfg(tmp_path, learning_rate=1e-4, resume=False)
    if kind == "rl":
        prepare(other)
        assert load_run(tmp_path / "out").config == other.fingerprint()
        return
    with pytest.raises(ConfigError, match="holds a run of a different config: learning_rate"):
        prepare(other)
    assert run_file.read_bytes() == first


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
def random_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with random weights (seed 0): what the SFT tests train."""
    spec = TinySpec(seed=0, behavior="random")
    return build_tiny_checkpoint(tmp_path_factory.mktemp("rand-tiny") / "fp32", spec)


@pytest.fixture(scope="session")
def arena_parquet(
    arena_runs: dict[str, Path], random_tiny: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The 24 training arena trajectories through `astra-train data sft`."""
    out = tmp_path_factory.mktemp("sft-data")
    args = ["data", "sft", str(arena_runs["train"]), "--out", str(out)]
    res = CliRunner().invoke(train_app, [*args, "--tokenizer", str(random_tiny)])
    assert res.exit_code == 0, res.output
    return out / "sft.parquet"


def train_in_process(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``astra-train ARGS`` in-process: (exit code, stdout + stderr); an exception other than
    the CLI's exit is raised."""
    res = CliRunner().invoke(train_app, list(args), env=env)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output


def wait_for_checkpoint(path: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait until the training run ``proc`` has written ``path`` (a file of a checkpoint)."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        assert proc.poll() is None, "the run ended before the checkpoint was written"
        assert time.monotonic() < deadline, f"no {path} after {timeout_s} s"
        time.sleep(0.05)


@pytest.fixture
def wide_consoles(monkeypatch: pytest.MonkeyPatch) -> None:
    """One message, one line: the CLI's consoles are not wrapped at 80 columns here."""
    monkeypatch.setattr(console_mod.err_console, "_width", 400)
    monkeypatch.setattr(console_mod.console, "_width", 400)


@pytest.fixture
def torch_threads_kept() -> Iterator[None]:
    """In-process training runs set torch's threads (``trl.threads``): the session gets its
    own back after each test."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def sft_tiny(arena_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> SFTRun:
    """One SFT run of the random tiny model on the 24 training arena trajectories (the shipped
    tiny recipe cut to ``e2e.SFT_STEPS``, checkpoints every 100 from 400 kept): the SFT proof
    evaluates its final checkpoint, the RL proofs start from an intermediate one. Run once for
    all xdist workers."""
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
