"""Multi-turn RL with verifiable rewards (``astra-train rl``).

The algorithm core (:mod:`training.rl.core`: GRPO advantages, the batch-level token-mean loss,
Adaptive Batch Filling) is pure; rollouts are the one episode loop with a token-level policy
(:mod:`training.rl.policy`, :mod:`training.rl.rollout`) in pooled arena sandboxes
(:mod:`training.rl.pool`); backends: TRL on one machine (:mod:`training.rl.trl`), verl on a
cluster (:mod:`training.rl.verl`).
"""

from training.rl.config import RLConfig
from training.rl.core import (
    AdaptiveBatchFiller,
    BatchFillingStalled,
    Group,
    group_advantages,
    policy_loss,
)
from training.rl.generate import HFGenerator, Sample, Sampling, TokenGenerator
from training.rl.policy import TokenPolicy
from training.rl.rollout import Episode, RolloutSettings, rollout_episode, rollout_group

__all__ = [
    "AdaptiveBatchFiller",
    "BatchFillingStalled",
    "Episode",
    "Group",
    "HFGenerator",
    "RLConfig",
    "RolloutSettings",
    "Sample",
    "Sampling",
    "TokenGenerator",
    "TokenPolicy",
    "group_advantages",
    "policy_loss",
    "rollout_episode",
    "rollout_group",
]
