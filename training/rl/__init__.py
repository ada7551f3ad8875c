"""Multi-turn RL with verifiable rewards (``astra-train rl``).

The algorithm core (:mod:`training.rl.core`: GRPO advantages, the batch-level token-mean loss,
Adaptive Batch Filling) is pure; rollouts are the one episode loop with a token-level policy
(:mod:`training.rl.policy`, :mod:`training.rl.rollout`) in pooled arena sandboxes
(:mod:`training.rl.pool`); backends: TRL on one machine (:mod:`training.rl.trl`), verl on a
cluster (:mod:`training.rl.verl`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from astra_agent.lazy import lazy_exports

# Loaded on first use: the CLI reads RLConfig without paying for torch and transformers.
_EXPORTS = {
    "RLConfig": "training.rl.config",
    "AdaptiveBatchFiller": "training.rl.core",
    "BatchFillingStalled": "training.rl.core",
    "Group": "training.rl.core",
    "group_advantages": "training.rl.core",
    "policy_loss": "training.rl.core",
    "TokenGenerator": "training.rl.generate",
    "TokenPolicy": "training.rl.policy",
    "Episode": "training.rl.rollout",
    "RolloutSettings": "training.rl.rollout",
    "rollout_episode": "training.rl.rollout",
    "rollout_group": "training.rl.rollout",
}

if TYPE_CHECKING:
    from training.rl.config import RLConfig
    from training.rl.core import (
        AdaptiveBatchFiller,
        BatchFillingStalled,
        Group,
        group_advantages,
        policy_loss,
    )
    from training.rl.generate import TokenGenerator
    from training.rl.policy import TokenPolicy
    from training.rl.rollout import Episode, RolloutSettings, rollout_episode, rollout_group


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "AdaptiveBatchFiller",
    "BatchFillingStalled",
    "Episode",
    "Group",
    "RLConfig",
    "RolloutSettings",
    "TokenGenerator",
    "TokenPolicy",
    "group_advantages",
    "policy_loss",
    "rollout_episode",
    "rollout_group",
]
