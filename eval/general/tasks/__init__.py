"""The lm-eval tasks that ship with the harness (YAML configs and their data), found by
``astra-eval general`` without ``--include-path``: ``astra_arith``."""

from pathlib import Path

TASKS_DIR = Path(__file__).parent

__all__ = ["TASKS_DIR"]
