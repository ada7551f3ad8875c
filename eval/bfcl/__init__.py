"""BFCL-V3 multi-turn, on the official data and backend classes of the pinned ``bfcl-eval``
release (installed without its dependencies). Groundwork: data, environment, scoring."""

from eval.bfcl.backend import BFCLEnvironment, execute_calls, parse_call
from eval.bfcl.checker import TurnVerdict, check_entry
from eval.bfcl.official import CATEGORIES, Entry, load_category, openai_tools
from eval.bfcl.runner import BFCLConfig, BFCLRecord, evaluate_bfcl

__all__ = [
    "CATEGORIES",
    "BFCLConfig",
    "BFCLEnvironment",
    "BFCLRecord",
    "Entry",
    "TurnVerdict",
    "check_entry",
    "evaluate_bfcl",
    "execute_calls",
    "load_category",
    "openai_tools",
    "parse_call",
]
