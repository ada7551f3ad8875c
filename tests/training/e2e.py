"""What the end-to-end training tests share: the CLIs run as a user runs them, stage timing,
and one SFT run of the random tiny model (a session fixture in conftest.py) that both the SFT
proof and the RL proof start from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SFT_RECIPE = REPO / "training" / "recipes" / "sft-tiny-cpu.yaml"
RL_RECIPE = REPO / "training" / "recipes" / "rl-tiny-cpu.yaml"
# What evaluations share: greedy decoding, and a bound on each reply. The trained model's
# turns are < 100 tokens; the untrained one would otherwise babble to the context limit.
EVAL_ENV = {"ASTRA_EVAL_MODEL__MAX_TOKENS": "256"}
# The SFT run keeps a checkpoint every 200 steps: the RL proof starts from one (600) that
# solves the training tasks greedily but only part of the time when sampling at temperature 1.
SFT_KEEP = {"ASTRA_TRAIN_SAVE_TOTAL_LIMIT": "5", "ASTRA_TRAIN_SAVE_STEPS": "200"}


def cli(
    module: str, *args: str, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **EVAL_ENV, **(env or {})},
    )
    assert out.returncode == 0, f"{module} {args}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


class Stages:
    """Wall time of each stage, in order."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}

    def run(self, name: str) -> _Timer:
        return _Timer(self, name)


class _Timer:
    def __init__(self, stages: Stages, name: str) -> None:
        self.stages, self.name = stages, name

    def __enter__(self) -> None:
        self.t0 = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.stages.wall[self.name] = round(time.monotonic() - self.t0, 1)


@dataclass
class SFTRun:
    """The random tiny checkpoint, its SFT data and run directory, and what they took."""

    random: Path
    data: Path
    run: Path
    stdout: str
    stats: dict[str, Any]
    metrics: list[dict[str, Any]]
    stages: Stages = field(default_factory=Stages)


def run_sft(root: Path, train_results: Path) -> SFTRun:
    """``astra-serve tiny --random`` → ``astra-train data sft`` → ``astra-train sft`` (the
    README's Retrain commands) into ``root``."""
    stages = Stages()
    random, data, run = root / "random-fp32", root / "sft-data", root / "sft-run"
    with stages.run("build random tiny"):
        cli("serving", "tiny", str(random), "--random", "--seed", "0")
    with stages.run("data sft"):
        cli("training.cli", "data", "sft", str(train_results), "--out", str(data),
            "--tokenizer", str(random))  # fmt: skip
    with stages.run("sft (TRL, CPU)"):
        out = cli("training.cli", "sft", "--config", str(SFT_RECIPE), "--model", str(random),
                  "--train-file", str(data / "sft.parquet"), "--output-dir", str(run),
                  env=SFT_KEEP)  # fmt: skip
    stats = json.loads((data / "stats.json").read_text())
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return SFTRun(random, data, run, out.stdout, stats, metrics, stages)


def serve_and_score(checkpoint: Path, data: Path, work: Path) -> dict[str, Any]:
    """``checkpoint`` served by vLLM-CPU and scored greedily by ``astra-eval arenas`` on the
    tasks of ``data``: the summary."""
    from serving.server import VLLMServer
    from tests.conftest import tiny_serve_config

    with VLLMServer(tiny_serve_config(checkpoint, log_file=work / "vllm.log")) as srv:
        res = work / "eval"
        cli("eval", "arenas", "--data", str(data), "--base-url", srv.base_url,
            "--out", str(res), "--temperature", "0")  # fmt: skip
        summary: dict[str, Any] = json.loads((res / "summary.json").read_text())
    return summary
