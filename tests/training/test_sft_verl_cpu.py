"""verl's own SFT trainer, for real, on CPU: ``astra-train sft`` with ``backend: verl``,
``verl.device: cpu`` and ``verl.run: true`` launches ``verl.trainer.sft_trainer`` under torchrun
with the platform plugin ``training.verl_cpu``, on the tiny Qwen3 model, reading our parquet
through ``AstraSFTDataset``.

It takes real optimizer steps (the loss falls), writes a checkpoint that verl's merger converts,
and agrees with the TRL backend step by step: same rows, same initial weights, one global batch
of all rows per step (so the order of rows does not matter), same AdamW and clipping. Measured
on the 2-core runner: the losses are equal to float32 rounding (first step 7.697024, |Δ| ≤ 5e-7;
all four steps |Δ| ≤ 1e-6, relative ≤ 1.5e-7), though verl packs the three rows into one
padding-free micro batch and TRL runs them one by one with gradient accumulation. The other two
tests are quick: what ``verl.device: cpu`` adds to the generated job, and the GPU refusal.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from astra_agent.errors import ConfigError
from eval.rundir import load_run
from tests.training.test_sft_verl import TOOLS, conversation, make_cfg, write_ours
from training import verl_cpu
from training.sft.config import SFTConfig
from training.sft.trl import run_trl
from training.sft.verl import prepare_verl, run_verl, verl_overrides
from training.template import load_tokenizer, tokenize
from training.verl_cpu import cpu_overrides

STEPS = 4
HI: list[dict[str, Any]] = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
]


def _cfg(model: Path, parquet: Path, out: Path, backend: str) -> SFTConfig:
    return SFTConfig.model_validate(
        {
            "backend": backend,
            "model": model,
            "train_files": [parquet],
            "output_dir": out,
            "max_length": 1024,
            "max_steps": STEPS,
            "learning_rate": 1e-3,
            "lr_scheduler": "constant",
            "warmup_ratio": 0,
            "global_batch_size": 3,  # every row in every step: the row order cannot matter
            "micro_batch_size": 1,
            "packing": backend == "verl",  # verl: one padding-free micro batch of 3 rows
            "save_steps": STEPS,
            "trl": {"threads": 1},
            "convert": {"enabled": backend == "verl"},  # verl's checkpoint → verl's merger
            "verl": {"device": "cpu", "gpus_per_node": 1, "run": True},
        }
    )


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_device_cpu_adds_the_plugin_to_the_generated_job(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, verl={"device": "cpu", "gpus_per_node": 1})
    job = prepare_verl(cfg)  # composes the overrides with verl's schema: every key known
    assert job.overrides_file.read_text().splitlines()[-len(cpu_overrides()) :] == cpu_overrides()
    script = job.launch_script.read_text()
    assert "export VERL_USE_EXTERNAL_MODULES=training.verl_compat,training.verl_cpu" in script
    assert "export VERL_PLATFORM=cpu" in script
    # a run directory of its own: the CPU job's run refuses another config, as a TRL run's does
    cuda = prepare_verl(make_cfg(tmp_path, output_dir=tmp_path / "cuda", verl={"gpus_per_node": 1}))
    assert "VERL_PLATFORM" not in cuda.launch_script.read_text()
    assert not set(cpu_overrides()) & set(cuda.overrides_file.read_text().splitlines())
    with pytest.raises(ConfigError, match="torchrun launcher only"):
        verl_overrides(make_cfg(tmp_path, verl={"device": "cpu", "launcher": "ray"}))


def test_the_plugin_refuses_a_machine_with_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.plugin.platform.platform_manager import PlatformRegistry

    before = PlatformRegistry.get("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="CPU tests and CI only"):
        verl_cpu.register()
    assert PlatformRegistry.get("cpu") is before  # nothing registered


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="verl.device: cpu refuses GPU machines")
def test_verl_sft_trainer_runs_on_cpu_and_matches_trl(
    tmp_path: Path, random_fp32: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = load_tokenizer(random_fp32)
    rows = [
        (conversation(), TOOLS),
        (conversation(reasoning=False, parallel=False), TOOLS[:1]),
        (HI, []),
    ]
    parquet = write_ours(tmp_path / "train.parquet", rows, tok)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    lines: list[str] = []
    job = run_verl(_cfg(random_fp32, parquet, tmp_path / "verl", "verl"), echo=lines.append)
    overrides = job.overrides_file.read_text().splitlines()
    assert overrides[-len(cpu_overrides()) :] == cpu_overrides()
    assert "export VERL_PLATFORM=cpu" in job.launch_script.read_text()

    # real optimizer steps: the loss falls at every step
    records = [json.loads(line) for line in job.metrics_file.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), "\n".join(lines[-40:])
    verl_loss = [r["data"]["train/loss"] for r in records]
    assert all(b < a for a, b in itertools.pairwise(verl_loss)), verl_loss
    assert verl_loss[-1] < verl_loss[0] - 0.5
    num_tokens = sum(tokenize(tok, m, t).num_tokens for m, t in rows)
    assert records[0]["data"]["train/global_tokens"] == num_tokens  # our rows, all of them

    # a checkpoint verl can resume from, converted by verl's merger for serving
    ckpt = job.checkpoint_dir
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
    assert (ckpt / f"global_step_{STEPS}" / "model_world_size_1_rank_0.pt").is_file()
    assert job.ran and job.final is not None and (job.final / "config.json").is_file()

    # astra-eval reads the run directory as it reads a TRL SFT run
    run = load_run(tmp_path / "verl")
    assert run.kind == "sft" and run.summary["verl"] and run.summary["finished"], run.problems
    assert [m["step"] for m in run.metrics] == list(range(1, STEPS + 1)) and not run.problems
    assert [m["train/loss"] for m in run.metrics] == verl_loss

    # the TRL backend on the same rows, initial weights and schedule
    result = run_trl(_cfg(random_fp32, parquet, tmp_path / "trl", "trl"))
    trl_records = [
        json.loads(x) for x in (tmp_path / "trl" / "metrics.jsonl").read_text().splitlines()
    ]
    trl_loss = [r["loss"] for r in trl_records]
    assert len(trl_loss) == STEPS and trl_records[0]["tokens"] == num_tokens
    assert verl_loss[0] == pytest.approx(trl_loss[0], rel=1e-5, abs=1e-6)  # seen: |Δ| ≤ 5e-7
    assert verl_loss == pytest.approx(trl_loss, rel=1e-4)  # seen: |Δ| ≤ 1e-6

    # the checkpoint holds the trained weights: TRL's final ones, to bf16 rounding
    start, trl_final, verl_final = (
        _weights(random_fp32),
        _weights(result.final),
        _weights(job.final),
    )
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(start[name], trl_final[name], rtol=2**-7, atol=1e-6)
    for key, value in trl_final.items():
        torch.testing.assert_close(verl_final[key], value, rtol=2**-7, atol=1e-6, msg=key)
