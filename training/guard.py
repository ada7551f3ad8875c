"""The guard against a run that diverges, shared by the TRL backends (SFT and RL): the first
non-finite loss, gradient norm or weight stops the run with :class:`TrainingDiverged` (exit
1), before the optimizer applies it and before a checkpoint or ``final/`` holds it; a start
checkpoint that holds one is refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from astra_agent.errors import AstraError, ConfigError
from training.run import FINAL_DIR, last_complete_checkpoint


class TrainingDiverged(AstraError):
    """The loss, the gradient norm or the weights became non-finite (NaN or ±inf): the run
    stops there, before the optimizer applies it and before a checkpoint or ``final/``
    holds it."""


def nonfinite_parameters(model: Any) -> list[str]:
    """The names of ``model``'s parameters that hold a NaN or an infinity."""
    import torch

    named = list(model.named_parameters())
    if not named:
        return []
    finite = torch.stack([torch.isfinite(p.detach()).all() for _, p in named]).tolist()
    return [name for (name, _), ok in zip(named, finite, strict=True) if not ok]


def _names(bad: list[str]) -> str:
    return ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")


def check_start_weights(model: Any, path: Path) -> Any:
    """``model`` (loaded from ``path``) if its weights are all finite; a ConfigError naming
    the tensors that hold a NaN or an infinity otherwise (the run would diverge at step 1)."""
    bad = nonfinite_parameters(model)
    if bad:
        raise ConfigError(
            f"{path} holds weights that are not finite (NaN or inf): {_names(bad)}",
            hint="start from a sound checkpoint (a diverged run's last checkpoint is not one)",
        )
    return model


def diverged(trainer: Any, step: int, what: str) -> TrainingDiverged:
    """The error for a run stopped at ``step`` because ``what`` is not finite."""
    last = last_complete_checkpoint(Path(trainer.args.output_dir))
    kept = f"{last.name} is the last checkpoint" if last else "no checkpoint was saved"
    args = trainer.args
    return TrainingDiverged(
        f"training diverged at step {step}: {what}; {kept}; no {FINAL_DIR}/ was written",
        hint=f"lower learning_rate (now {args.learning_rate:g}) or max_grad_norm (now "
        f"{args.max_grad_norm:g}); a rerun resumes from the last checkpoint: pass --no-resume "
        "or a new --output-dir to start over",
    )


class FiniteGuard:
    """Mixed into a transformers ``Trainer`` subclass (first among its bases): the run stops
    with :class:`TrainingDiverged` at the first non-finite loss of a micro-batch or gradient
    norm (before the optimizer step applies it), and no checkpoint is saved with non-finite
    weights (an update can overflow them with finite gradients). The Trainer's own NaN filter
    would log such a loss as the mean of earlier ones, and train on. ``_get_grad_norm`` is
    where transformers 5's Trainer turns the norm it clipped into the one it logs, just before
    the optimizer step; the divergence tests fail should it move."""

    args: Any
    state: Any
    model: Any
    _finite_at = -1  # the step whose weights were last found finite

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        loss = super().training_step(model, inputs, *args, **kwargs)  # type: ignore[misc]
        value = float(loss)
        if not math.isfinite(value):
            raise diverged(self, self.state.global_step + 1, f"the loss is {value}")
        return loss

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        norm = super()._get_grad_norm(model, grad_norm)  # type: ignore[misc]
        if norm is not None and not math.isfinite(float(norm)):
            step = self.state.global_step + 1
            raise diverged(self, step, f"the gradient norm is {float(norm)} (not applied)")
        return norm

    def check_weights(self) -> None:
        """TrainingDiverged if the model's weights are not all finite (once per step)."""
        step = self.state.global_step
        if self._finite_at == step:
            return
        bad = nonfinite_parameters(self.model)
        if bad:
            raise diverged(self, step, f"its update made weights non-finite ({_names(bad)})")
        self._finite_at = step

    def _save_checkpoint(self, model: Any, trial: Any) -> Any:
        self.check_weights()
        return super()._save_checkpoint(model, trial)  # type: ignore[misc]
