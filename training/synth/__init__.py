"""Data synthesis: tool pool → tool graph → tool chains (→ tasks → trajectories, to come)."""

from training.synth.stage import Provenance, Rejection, Shard, StageStats, SynthError

__all__ = ["Provenance", "Rejection", "Shard", "StageStats", "SynthError"]
