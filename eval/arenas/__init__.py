"""RL arenas: evaluation over sandboxed Python environments in the ASTRA-RL format."""

from eval.arenas.replay import replay_script
from eval.arenas.runner import (
    ArenaEvalConfig,
    ArenaRecord,
    evaluate_arenas,
    summarize,
    validate_arenas,
)

DATA_DIR = __import__("pathlib").Path(__file__).with_name("data")

__all__ = [
    "DATA_DIR",
    "ArenaEvalConfig",
    "ArenaRecord",
    "evaluate_arenas",
    "replay_script",
    "summarize",
    "validate_arenas",
]
