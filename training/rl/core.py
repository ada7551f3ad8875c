"""The RL algorithm core, as pure functions: GRPO advantages, the batch-level token-mean
clipped policy loss, and Adaptive Batch Filling. No verl or TRL import: both backends call
these, and a test cross-checks them against ``verl.trainer.ppo.core_algos``.

ASTRA's method (arXiv 2601.21558): GRPO without KL and entropy terms; every response token
of the batch weighs the same (token-mean over the whole batch, not per sequence); and
*Adaptive Batch Filling*: a group of rollouts of one prompt is kept only if its rewards vary
(std > δ); surplus valid groups are buffered for later steps; rollouts go on until the batch
holds its target number of valid groups.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from astra_agent.errors import AstraError

# ---------------------------------------------------------------------------- advantages


def group_advantages(
    rewards: Sequence[float],
    groups: Sequence[Hashable],
    *,
    eps: float = 1e-6,
    scale: Literal["std", "none"] = "std",
) -> list[float]:
    """GRPO: each reward minus its group's mean, divided by the group's standard deviation
    (unbiased, as torch and verl compute it) plus ``eps``; ``scale="none"`` skips the division
    (Dr. GRPO). A group of one gets advantage equal to its reward (mean 0, std 1), as in verl."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards for {len(groups)} group labels")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        values = [float(rewards[i]) for i in idx]
        if len(values) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i, v in zip(idx, values, strict=True):
            out[i] = (v - mean) / (std + eps) if scale == "std" else v - mean
    return out


# ---------------------------------------------------------------------------- loss


@dataclass(frozen=True)
class LossStats:
    """What one loss evaluation saw: tokens in the loss, the share of them whose ratio was
    clipped, the mean approximate KL (old → new), the mean ratio."""

    tokens: int
    clip_fraction: float
    approx_kl: float
    ratio_mean: float


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The clipped policy-gradient loss averaged over every masked token of the batch.

    ``logp``/``old_logp``/``mask``: (batch, tokens); ``advantages``: (batch,) or (batch,
    tokens). Per token: ``max(-A·r, -A·clip(r, 1-clip_low, 1+clip_high))`` with ``r =
    exp(logp - old_logp)`` (the log-ratio clamped to ±20, as verl does); with ``dual_clip = c``
    a negative-advantage token's loss is also capped at ``-A·c`` (dual-clip PPO, verl's
    default c = 3). The sum over masked tokens is divided by ``num_tokens``: the masked tokens
    of the *whole* batch when this call sees one micro-batch of it (default: this call's).
    No KL term, no entropy term.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    mask = mask.to(logp.dtype)
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(loss1, loss2)
    if dual_clip is not None:
        capped = torch.minimum(per_token, -advantages * dual_clip)
        per_token = torch.where(advantages < 0, capped, per_token)
    count = float(mask.sum())
    denom = float(num_tokens) if num_tokens is not None else max(count, 1.0)
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        n = max(count, 1.0)
        stats = LossStats(
            tokens=int(count),
            clip_fraction=float(((loss2 > loss1).to(mask.dtype) * mask).sum() / n),
            approx_kl=float((-log_ratio * mask).sum() / n),
            ratio_mean=float((ratio * mask).sum() / n),
        )
    return loss, stats


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probability of each target under ``logits`` ((batch, T, vocab) → (batch, T)),
    computed in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return torch.gather(logp, -1, targets.unsqueeze(-1)).squeeze(-1)


# ---------------------------------------------------------------------------- ABF


class BatchFillingStalled(AstraError):
    """Adaptive Batch Filling gave up: round after round, no group's rewards varied."""


def reward_std(rewards: Sequence[float]) -> float:
    """Population standard deviation of a group's rewards (what δ is compared with)."""
    if not rewards:
        return 0.0
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))


@dataclass
class Group:
    """One prompt's rollouts: ``rewards`` (one per rollout) and whatever the caller carries
    with them (``payload``: trajectories, tokens). ``step`` is the step it was sampled in."""

    key: str
    rewards: list[float]
    payload: Any = None
    step: int = 0

    @property
    def std(self) -> float:
        return reward_std(self.rewards)


@dataclass
class FillStats:
    """One step of Adaptive Batch Filling: groups sampled this step, kept as valid (std > δ),
    dropped because their rewards did not vary, taken from the buffer of earlier steps,
    dropped from the buffer as too old, left in the buffer for later steps; rollout rounds."""

    step: int = 0
    sampled: int = 0
    valid: int = 0
    dropped_flat: int = 0
    from_buffer: int = 0
    dropped_stale: int = 0
    buffered: int = 0
    rounds: int = 0
    mean_reward_sampled: float = 0.0
    _reward_sum: float = field(default=0.0, repr=False)
    _reward_n: int = field(default=0, repr=False)

    def as_dict(self) -> dict[str, float | int]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


class AdaptiveBatchFiller:
    """ASTRA's Adaptive Batch Filling, independent of any trainer.

    Per step: :meth:`begin` (buffered groups older than ``max_age`` steps are dropped, the rest
    count toward the batch), then :meth:`add` rolled-out groups until :attr:`needed` is 0,
    then :meth:`take` the batch: ``target_groups`` valid groups, oldest first; valid groups
    beyond it stay buffered for the next steps. A group is valid when the population std of
    its rewards exceeds ``delta``. After ``max_flat_rounds`` consecutive rounds that added no
    valid group, :meth:`add` raises :class:`BatchFillingStalled` instead of rolling out
    forever.
    """

    def __init__(
        self,
        target_groups: int,
        *,
        delta: float = 0.0,
        max_age: int = 2,
        max_flat_rounds: int = 8,
        max_buffer: int | None = None,
    ) -> None:
        if target_groups < 1:
            raise ValueError("target_groups must be ≥ 1")
        self.target_groups = target_groups
        self.delta = delta
        self.max_age = max_age
        self.max_flat_rounds = max_flat_rounds
        self.max_buffer = max_buffer if max_buffer is not None else 4 * target_groups
        self.buffer: list[Group] = []
        self.stats = FillStats()
        self._flat_rounds = 0
        self._fresh: list[Group] = []

    def begin(self, step: int) -> FillStats:
        """Start a step: drop stale buffered groups; the rest count toward this batch."""
        self.stats = FillStats(step=step)
        keep = [g for g in self.buffer if step - g.step <= self.max_age]
        self.stats.dropped_stale = len(self.buffer) - len(keep)
        self.buffer = keep
        self.stats.from_buffer = 0
        self._fresh = []
        self._flat_rounds = 0
        return self.stats

    @property
    def needed(self) -> int:
        """Valid groups still missing from this step's batch."""
        return max(0, self.target_groups - len(self.buffer) - len(self._fresh))

    def is_valid(self, group: Group) -> bool:
        return group.std > self.delta

    def add(self, groups: Sequence[Group]) -> int:
        """One round of rollouts; returns how many of its groups were valid."""
        s = self.stats
        s.rounds += 1
        s.sampled += len(groups)
        valid = [g for g in groups if self.is_valid(g)]
        for g in groups:
            s._reward_sum += sum(g.rewards)
            s._reward_n += len(g.rewards)
        s.mean_reward_sampled = s._reward_sum / s._reward_n if s._reward_n else 0.0
        s.valid += len(valid)
        s.dropped_flat += len(groups) - len(valid)
        self._fresh.extend(valid)
        self._flat_rounds = 0 if valid else self._flat_rounds + 1
        if self._flat_rounds >= self.max_flat_rounds and self.needed:
            raise BatchFillingStalled(
                f"Adaptive Batch Filling: {self._flat_rounds} rounds in a row produced no group "
                f"whose rewards vary (std > δ={self.delta:g}); {self.needed} of "
                f"{self.target_groups} groups still missing at step {s.step}",
                hint="the policy solves every task always or never: use tasks of mixed "
                "difficulty, a larger group size or temperature, or raise abf.max_flat_rounds",
            )
        return len(valid)

    def take(self) -> list[Group]:
        """This step's batch (``target_groups`` valid groups, or fewer if rollouts stopped
        early); surplus valid groups are buffered, at most ``max_buffer`` (oldest dropped)."""
        pool = sorted(self.buffer, key=lambda g: g.step) + self._fresh
        batch, rest = pool[: self.target_groups], pool[self.target_groups :]
        self.stats.from_buffer = sum(1 for g in batch if g in self.buffer)
        overflow = max(0, len(rest) - self.max_buffer)
        self.stats.dropped_stale += overflow
        self.buffer = rest[overflow:]
        self._fresh = []
        self.stats.buffered = len(self.buffer)
        return batch
