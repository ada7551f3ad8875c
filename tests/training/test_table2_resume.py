"""``astra-train table2 run`` killed with ``kill -9`` in the middle of its SFT stage: the stage's
trainer dies with it (no run left training on), and the same command continues from the
newest checkpoint instead of starting over. The tiny random checkpoint stands in for the real
model here (seconds, not minutes); the real model's run is the CI slice in
test_real_model_training.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.conftest import RECIPES, wait_for_checkpoint
from tests.training.e2e import REPO, cli

pytestmark = pytest.mark.integration

STAGES = "arenas,model,replay,data,sft"


def _config(tmp_path: Path, model: Path) -> Path:
    cfg = {
        "out": str(tmp_path / "x"),
        "model": str(model),
        "reasoning": True,
        "arenas": {"seed": 0, "train_tasks": 8, "eval_tasks": 2},
        "sft_recipe": str(RECIPES / "sft-tiny-cpu.yaml"),
        "sft": {"max_steps": 40, "save_steps": 4, "save_total_limit": 3, "logging_steps": 1},
    }
    path = tmp_path / "table2.json"
    path.write_text(json.dumps(cfg))
    return path


def _trainers(out: Path) -> list[int]:
    """Live processes whose command line names the experiment's SFT recipe."""
    mark = str(out / "recipes" / "sft.yaml").encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_killed_experiment_leaves_no_trainer_and_continues(
    random_tiny: Path, tmp_path: Path
) -> None:
    config = _config(tmp_path, random_tiny)
    out = tmp_path / "x"
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.cli", "table2", "run", "-c", str(config),
         "--stages", STAGES],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    wait_for_checkpoint(out / "sft" / "checkpoint-8" / "trainer_state.json", proc, 600)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while _trainers(out) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _trainers(out), "the SFT stage's trainer outlived the killed experiment"
    killed_at = len((out / "sft" / "metrics.jsonl").read_text().splitlines())
    assert 8 <= killed_at < 40
    res = cli("training.cli", "table2", "run", "-c", str(config), "--stages", STAGES)
    steps = [
        json.loads(x)["step"] for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps[-1] == 40 and (out / "sft" / "final-bf16" / "config.json").is_file()
    assert steps.count(1) == 1, "the rerun started the SFT over instead of resuming it"
    assert "arenas done" in res.stdout and "sft done" in res.stdout
    timings = [json.loads(x)["stage"] for x in (out / "timings.jsonl").read_text().splitlines()]
    assert timings.count("sft") == 1 and timings.count("arenas") == 2  # the killed run's sft: none
