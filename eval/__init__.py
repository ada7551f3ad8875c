"""Benchmarks on top of the runtime: BFCL-V3 multi-turn, RL arenas, τ²-bench, general ability,
reports — run by the one eval runner (items → ``async one(item)`` → typed record, resumable).
Each eval package's ``kind.py`` tells the readers of its runs what it is (:mod:`eval.kinds`)."""

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
