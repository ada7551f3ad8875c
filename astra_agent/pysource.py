"""``ast.parse`` that CPython 3.11.7 cannot trip over.

CPython 3.11 before 3.11.8 checks, after building the Python AST objects, that its recursion
counter came back to where it started, and raises ``SystemError: AST constructor recursion
depth mismatch`` when it did not. Python code that runs *during* the conversion — a finalizer
or weakref callback the garbage collector calls while the objects are allocated — moves that
counter, so a valid source fails at random (seen in CI: a shipped arena record, in a process
where Ray and many threads had left objects to collect). The collector is paused for the
conversion; nothing else changes.
"""

from __future__ import annotations

import ast
import gc
from typing import Any


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> Any:
    """``ast.parse(source, filename, mode)`` (a ``Module``, or an ``Expression`` for mode
    ``eval``) with the garbage collector paused meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename, mode)
    finally:
        if enabled:
            gc.enable()
