"""The TRL backend's update: our token-mean loss inside TRL's GRPOTrainer.

A fixed batch of two real episodes (scripted tokens through the real loop and sandbox: one
solves the task, one does not) stands in for the rollouts, so that the update itself is what
is tested: the loss equals TRL's own ``dapo`` loss on the same tensors, the gradient
accumulated over micro-batches by the Trainer equals the gradient of one token mean over the
whole batch, and one optimizer step moves the log-probabilities the right way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from astra_agent.arena import ArenaEnvironment, load_arena_file
from eval.arenas import DATA_DIR
from tests.training.test_rl_policy import REPLIES, ScriptedTokens, settings
from training.rl.batch import StepBatch
from training.rl.config import RLConfig
from training.rl.core import group_advantages, policy_loss, token_logprobs
from training.rl.inference import HFInference
from training.rl.rollout import GroupResult, rollout_episode
from training.rl.trl import batch_tensors, build_trainer
from training.template import load_tokenizer


class FixedBatches:
    """A collector that returns the same prepared batch every step (a test double)."""

    def __init__(self, batch: StepBatch) -> None:
        self.batch = batch
        self.calls = 0

    async def collect(self, generator: Any, step: int) -> StepBatch:
        self.calls += 1
        return self.batch


@pytest.fixture(scope="module")
def batch(tiny_tokenizer_dir: Path) -> StepBatch:
    tok = load_tokenizer(tiny_tokenizer_dir)
    task = load_arena_file(DATA_DIR / "train.jsonl").tasks[0]

    async def episode(replies: list[str]) -> Any:
        async with ArenaEnvironment(task) as env:
            return await rollout_episode(task, ScriptedTokens(tok, replies), tok, env, settings())

    good = asyncio.run(episode(REPLIES))
    bad = asyncio.run(episode(["<think>\nNo idea.\n</think>\n\nI cannot tell."]))
    assert good.score > 0.5 and bad.score == 0.0  # F1: 2 of 2 solved in 4 calls
    adv = group_advantages([good.score, bad.score], [0, 0])
    return StepBatch(1, [GroupResult(task, [good, bad])], adv)


def make(tmp_path: Path, model_dir: Path, batch: StepBatch, **over: Any) -> Any:
    from transformers import AutoModelForCausalLM

    cfg = RLConfig.model_validate(
        {
            "model": model_dir, "train_files": [DATA_DIR / "train.jsonl"],
            "output_dir": tmp_path / "rl", "steps": 1, "group_size": 2, "batch_groups": 1,
            "micro_batch_size": 1, "learning_rate": 1e-2, "save_steps": 1000,
            "rollout": {"engine": "hf"}, "trl": {"device": "cpu"},
            "convert": {"enabled": False}, **over,
        }
    )  # fmt: skip
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tasks = load_arena_file(DATA_DIR / "train.jsonl").tasks
    runner = asyncio.Runner()
    trainer = build_trainer(
        cfg,
        model,
        tok,
        tasks,
        FixedBatches(batch),
        HFInference(model),
        runner,  # type: ignore[arg-type]
    )
    return trainer, runner


def sampled_logp(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of log-probs of each row's sampled tokens under ``model``."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits
    keep = inputs["completion_ids"].size(1)
    logp = token_logprobs(logits[:, -keep - 1 : -1], inputs["completion_ids"])
    return (logp * inputs["completion_mask"] * inputs["tool_mask"]).sum(1)


def test_our_loss_equals_trls_dapo_loss(tmp_path: Path, tiny_fp32: Path, batch: StepBatch) -> None:
    from trl import GRPOTrainer

    trainer, runner = make(tmp_path, tiny_fp32, batch)
    try:
        inputs = batch_tensors(batch, pad_id=0)
        trainer.current_gradient_accumulation_steps = 1  # the whole batch in one forward
        ours = trainer._compute_loss(trainer.model, inputs)
        theirs = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
        assert ours.item() != 0.0
    finally:
        runner.close()


def test_accumulated_gradient_is_the_batch_token_mean(
    tmp_path: Path, tiny_fp32: Path, batch: StepBatch
) -> None:
    """Two micro-batches of one episode each, through the Trainer's own training_step (TRL's
    generation buffer splits the step's batch; the Trainer scales, or not, for accumulation),
    give the gradient of one token mean over both."""
    trainer, runner = make(tmp_path, tiny_fp32, batch)
    try:
        model = trainer.model
        inputs = batch_tensors(batch, pad_id=0)
        assert trainer.args.gradient_accumulation_steps == 2
        trainer.current_gradient_accumulation_steps = 2
        model.zero_grad()
        for i in range(2):
            part = {k: (v[i : i + 1] if v.dim() else v) for k, v in inputs.items()}
            trainer.training_step(model, part, None)
        acc = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        keep = inputs["completion_ids"].size(1)
        logp = token_logprobs(model(input_ids=ids, attention_mask=attn).logits[:, -keep - 1 : -1],
                              inputs["completion_ids"])  # fmt: skip
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        loss, _ = policy_loss(logp, logp.detach(), inputs["advantages"], mask)
        loss.backward()
        whole = [p.grad for p in model.parameters() if p.grad is not None]
        assert len(acc) == len(whole)
        for a, w in zip(acc, whole, strict=True):
            assert torch.allclose(a, w, atol=1e-6, rtol=1e-4)
    finally:
        runner.close()


def test_one_step_raises_the_better_episode(
    tmp_path: Path, tiny_fp32: Path, batch: StepBatch
) -> None:
    trainer, runner = make(tmp_path, tiny_fp32, batch)
    try:
        inputs = batch_tensors(batch, pad_id=0)
        before = sampled_logp(trainer.model, inputs)
        trainer.train()
        after = sampled_logp(trainer.model, inputs)
        assert trainer.collector.calls == 1 and trainer.state.global_step == 1
        n = (inputs["completion_mask"] * inputs["tool_mask"]).sum(1)
        gain = (after - before) / n  # per sampled token
        assert after[0] > before[0]  # the rewarded episode became more likely …
        # … and more so than the other one (they share formatting tokens, which Adam's first,
        # sign-like step may raise in both)
        assert gain[0] > gain[1] + 1.0
    finally:
        runner.close()


@pytest.mark.parametrize(
    ("lr", "stopped"),
    [
        # step 1's update leaves weights near 1e6: step 2's gradient overflows (its loss, a
        # ratio of probabilities that is 1 on policy, stays finite)
        (1e6, "training diverged at step 2: the gradient norm is nan (not applied)"),
        # step 1's update, past float32's range, makes the weights infinite
        (1e39, "training diverged at step 1: its update made weights non-finite"),
    ],
    ids=["grad-norm", "weights"],
)
def test_a_diverging_update_stops_the_run_before_it_is_applied_or_saved(
    tmp_path: Path, tiny_fp32: Path, batch: StepBatch, lr: float, stopped: str
) -> None:
    """Our GRPO trainer on the same real batch every step, at a learning rate that makes the
    loss, the gradient or the weights overflow: TrainingDiverged at the first non-finite
    value, and every checkpoint it saved holds finite weights."""
    from safetensors.torch import load_file

    from training.guard import TrainingDiverged

    trainer, runner = make(
        tmp_path, tiny_fp32, batch, learning_rate=lr, max_grad_norm=1e9, steps=4, save_steps=1
    )
    try:
        with pytest.raises(TrainingDiverged) as caught:
            trainer.train()
        assert stopped in caught.value.message and "no final/ was written" in caught.value.message
        saved = sorted((tmp_path / "rl").glob("checkpoint-*"))
        assert [c.name for c in saved] == (["checkpoint-1"] if lr == 1e6 else [])
        for ckpt in saved:
            weights = load_file(str(ckpt / "model.safetensors"))
            assert all(bool(torch.isfinite(t).all()) for t in weights.values())
    finally:
        runner.close()
