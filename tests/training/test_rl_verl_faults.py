"""``astra-train rl`` on verl (CPU) killed mid-run: no Ray, verl worker or vLLM process outlives
it, and the rerun resumes from verl's newest checkpoint (or refuses another config).

The run is the scripted tiny model (every episode scores 0, so Adaptive Batch Filling is off:
plain GRPO over zero advantages, which still takes every step of verl's machinery); its
processes are recorded just before ``kill -9``: the launch script's ``main_ppo``, Ray's own
daemons and workers, our rollout server actor and its vLLM child.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import descendants_alive
from tests.training.conftest import ARENA_TRAIN

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _config(model: Path, run: Path, **kw: Any) -> dict[str, Any]:
    return {
        "backend": "verl",
        "model": str(model),
        "train_files": [str(ARENA_TRAIN)],
        "output_dir": str(run),
        "steps": 2,
        "group_size": 2,
        "batch_groups": 2,
        "save_steps": 1,
        "abf": {"enabled": False},
        "rollout": {"max_turns": 4, "max_prompt_tokens": 4096, "max_response_tokens": 1024},
        "verl": {"device": "cpu", "gpus_per_node": 1, "run": True},
        **kw,
    }


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "training.cli", "rl", "--config", str(config)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"no {path} in {timeout_s} s"
        time.sleep(0.5)


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _alive(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.append(f"{pid} {_cmdline(pid)[:120]}")
    return out


def test_kill_9_leaves_no_process_and_the_rerun_resumes(tiny_fp32: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = tmp_path / "rl.yaml"
    config.write_text(yaml.safe_dump(_config(tiny_fp32, run)))
    log = tmp_path / "first.log"
    proc = _start(config, log)
    _wait_for(run / "checkpoints" / "latest_checkpointed_iteration.txt", proc, 600, log)
    family = descendants_alive(proc.pid)
    names = " ".join(_cmdline(p) for p in family)
    assert "main_ppo" in names and "raylet" in names and "vllm" in names, names
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _alive(family) == []

    # another config into the same run: refused, with the reason, before anything starts
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(_config(tiny_fp32, run, learning_rate=1e-3)))
    refused = subprocess.run(
        [sys.executable, "-m", "training.cli", "rl", "--config", str(other)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "different config" in refused.stdout + refused.stderr

    # the same config: verl resumes from its newest checkpoint and finishes the run
    log2 = tmp_path / "second.log"
    rerun = _start(config, log2)
    assert rerun.wait(timeout=900) == 0, log2.read_text(errors="replace")[-3000:]
    steps = [
        int(json.loads(x)["data"]["training/global_step"])
        for x in (run / "verl" / "metrics.jsonl").read_text().splitlines()
        if x.strip()
    ]
    assert steps[-1] == 2 and steps.count(2) == 1
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (run / "final-bf16" / "config.json").is_file()
