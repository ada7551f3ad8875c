"""Benchmarks on top of the runtime: BFCL-V3 multi-turn, RL arenas, reports."""
