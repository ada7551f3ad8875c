"""Package exports loaded on first use (PEP 562's module ``__getattr__``): a package whose
modules import heavy stacks (torch, transformers) exports their names without importing them,
so that its light users (the CLIs, their ``--help``) do not pay for them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``name`` is imported from the module
    ``exports[name]`` when first asked for. Use: ``__getattr__ = lazy_exports(__name__, {...})``
    (with the same names imported under ``TYPE_CHECKING`` for type checkers)."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
