"""Verifiable RL environments (pipeline B): main questions decomposed into sub-questions
(B.1–B.3, from the sources), environment code for them, merged and checked in the sandbox
(B.4–B.5), distractor tools (B.6), and arena records (B.6–B.7)."""

from training.synth.envs.records import Decomposition, SubQuestion, parallel_groups

__all__ = ["Decomposition", "SubQuestion", "parallel_groups"]
