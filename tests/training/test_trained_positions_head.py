"""The LM head at the trained positions only (CPU): the SFT and RL updates train as before.

On CPU the SFT loss (``training.sft.trl.trained_token_loss``) and the RL log-probabilities
(``training.rl.trl.trained_logps``) run the LM head only where a token is trained, instead of
TRL's fused head over every position (bench/train_speed.py). These tests pin that nothing
else changed: a few seeded SFT steps give the same loss per micro-batch and the same weights
as TRL's own head (the code before the change) and as a plain torch loop (forward with the
labels, backward, clipping, AdamW) on the same micro-batches; the RL loss and its gradient
equal TRL's on a batch of two real episodes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.training.test_rl_trl import batch, make  # noqa: F401  (the fixture, the builder)
from training.rl.batch import StepBatch
from training.rl.trl import batch_tensors
from training.sft.config import SFTConfig
from training.sft.trl import TokenCounts, load_model, make_trainer, trl_args
from training.template import load_tokenizer

LR = 1e-3
STEPS = 3


def rows(n: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    """Token rows of 30-90 ids, each with one or two trained spans (the shape of chat data:
    prompt and tool tokens untrained, assistant turns trained)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(30, 90)
        mask = [0] * length
        for _ in range(rng.randint(1, 2)):
            start = rng.randint(5, length - 6)
            for j in range(start, min(length, start + rng.randint(3, 20))):
                mask[j] = 1
        out.append({"input_ids": [rng.randint(10, 1900) for _ in range(length)],
                    "assistant_masks": mask})  # fmt: skip
    return out


class Recorded(TokenCounts):
    """Token counts that also keep each micro-batch the trainer trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[dict[str, Any]] = []

    def add(self, inputs: dict[str, Any]) -> None:
        super().add(inputs)
        self.batches.append({k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()})


def sft(model_dir: Path, out: Path, micro: int) -> tuple[list[float], Any, Recorded]:
    """``STEPS`` steps of 2 sequences in micro-batches of ``micro`` (packed when 2) through
    our SFT trainer: the loss of each micro-batch, the model, the micro-batches."""
    cfg = SFTConfig.model_validate(
        {"model": model_dir, "train_files": [out / "unused.parquet"], "output_dir": out,
         "max_length": 256, "max_steps": STEPS, "learning_rate": LR, "lr_scheduler": "constant",
         "warmup_ratio": 0.0, "global_batch_size": 2, "micro_batch_size": micro,
         "packing": True, "trl": {"device": "cpu", "dtype": "float32"}}
    )  # fmt: skip
    counts = Recorded()
    args = trl_args(cfg, "cpu", save_strategy="no", logging_steps=1)
    trainer = make_trainer(
        cfg, load_model(cfg), load_tokenizer(model_dir), rows(), args, [], counts
    )
    losses: list[float] = []
    step = trainer.training_step

    def recorded(*a: Any, **kw: Any) -> Any:
        loss = step(*a, **kw)
        losses.append(float(loss))
        return loss

    trainer.training_step = recorded
    trainer.train()
    return losses, trainer.model, counts


def plain_loop(model: Any, batches: list[dict[str, Any]], per_step: int) -> list[float]:
    """Forward with the labels (transformers' own loss: the full logits, the labels shifted,
    the sum over the step's trained tokens), backward, gradient clipping at 1, AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    model.train()
    losses = []
    for s in range(0, len(batches), per_step):
        step = batches[s : s + per_step]
        n = sum(int((b["labels"][:, 1:] != -100).sum()) for b in step)
        for b in step:
            loss = model(**b, num_items_in_batch=n).loss
            loss.backward()
            losses.append(float(loss))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return losses


def close_weights(a: Any, b: Any, atol: float = 1e-4) -> bool:
    """Every weight within ``atol``: a tenth of AdamW's step of 1e-3 per update, for float
    noise in a gradient near 0 moves a weight by up to the whole step."""
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return all(torch.allclose(pa[k], pb[k], atol=atol) for k in pa)


@pytest.mark.parametrize("micro", [1, 2], ids=["one-sequence", "padding-free"])
def test_sft_steps_train_as_trls_head_and_as_a_plain_loop(
    random_tiny: Path, tmp_path: Path, micro: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, model, counts = sft(random_tiny, tmp_path / "ours", micro)
    assert len(ours) == STEPS * 2 // micro

    with monkeypatch.context() as m:  # the code before the change: TRL's head everywhere
        m.setattr("training.sft.trl.head_at_trained_positions", lambda *a: False)
        theirs, trl_model, trl_counts = sft(random_tiny, tmp_path / "trl", micro)
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6)
    assert len(counts.batches) == len(trl_counts.batches)
    assert close_weights(model, trl_model)

    cfg = SFTConfig.model_validate(
        {"model": random_tiny, "train_files": [tmp_path / "x.parquet"], "output_dir": tmp_path,
         "global_batch_size": 2, "micro_batch_size": micro}
    )  # fmt: skip
    plain = load_model(cfg)
    assert plain_loop(plain, counts.batches, 2 // micro) == pytest.approx(ours, rel=1e-5, abs=1e-6)
    assert close_weights(model, plain)
    assert not close_weights(model, load_model(cfg))  # the steps moved the weights


def test_a_micro_batch_that_trains_nothing_gives_a_zero_loss_with_a_gradient(
    random_tiny: Path,
) -> None:
    from training.sft.trl import trained_token_loss

    cfg = SFTConfig.model_validate(
        {"model": random_tiny, "train_files": ["x.parquet"], "output_dir": "o"}
    )
    model = load_model(cfg)
    ids = torch.arange(10, 40)[None]
    loss, stats = trained_token_loss(
        model, {"input_ids": ids, "labels": torch.full_like(ids, -100)}
    )
    loss.backward()
    assert loss.item() == 0.0 and stats == {"entropy": 0.0, "mean_token_accuracy": 0.0}
    assert model.lm_head.weight.grad is not None


def test_rl_loss_and_gradient_equal_trls_head(
    tmp_path: Path,
    tiny_fp32: Path,
    batch: StepBatch,  # noqa: F811
) -> None:
    """Both episodes in one micro-batch (prompts left-padded, responses right-padded, tool
    output inside the responses): the same loss and gradient as TRL's fused head."""
    from trl import GRPOTrainer

    trainer, runner = make(tmp_path, tiny_fp32, batch)
    try:
        inputs = batch_tensors(batch, pad_id=0)
        assert int(inputs["tool_mask"].sum()) < int(inputs["completion_mask"].sum())
        trainer.current_gradient_accumulation_steps = 1
        model = trainer.model
        grads = []
        for compute in (
            trainer._compute_loss,
            lambda m, i: GRPOTrainer._compute_loss(trainer, m, i),
        ):
            model.zero_grad()
            loss = compute(model, dict(inputs))
            loss.backward()
            grads.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
        (ours, g_ours), (theirs, g_theirs) = grads
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7) and ours != 0.0
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_ours, g_theirs, strict=True))
    finally:
        runner.close()
