"""Verifiable RL environments (issue #10, B): decomposed questions, then sandboxed code."""

from training.synth.envs.records import Decomposition, SubQuestion, parallel_groups

__all__ = ["Decomposition", "SubQuestion", "parallel_groups"]
