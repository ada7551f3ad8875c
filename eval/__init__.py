"""Benchmarks on top of the runtime: BFCL-V3 multi-turn, RL arenas, reports — all run by the one
eval runner (items → ``async one(item)`` → typed record, resumable)."""

from eval.results import ErrorKind, EvalRecord, RunMeta, read_results
from eval.runner import (
    EndpointDied,
    EvalSpec,
    ProgressEvent,
    RunConfig,
    RunResult,
    run_eval,
    run_items,
)

__all__ = [
    "EndpointDied",
    "ErrorKind",
    "EvalRecord",
    "EvalSpec",
    "ProgressEvent",
    "RunConfig",
    "RunMeta",
    "RunResult",
    "read_results",
    "run_eval",
    "run_items",
]
