"""The registry of eval kinds: the one place that names them. Each eval package's ``kind.py``
builds its :class:`eval.evalkind.EvalKind`; a new eval is its package plus one line here (its
import) and its name in :data:`REGISTRY`, whose order is the report's order of sections."""

from __future__ import annotations

from astra_agent.errors import ConfigError
from eval.arenas.kind import ARENAS
from eval.bfcl.kind import BFCL
from eval.evalkind import EvalKind
from eval.general.kind import GENERAL
from eval.tau2.kind import TAU2

REGISTRY: tuple[EvalKind, ...] = (BFCL, ARENAS, GENERAL, TAU2)
KINDS: dict[str, EvalKind] = {k.name: k for k in REGISTRY}
NAMES: tuple[str, ...] = tuple(KINDS)
COMPARABLE: tuple[EvalKind, ...] = tuple(k for k in REGISTRY if k.pairing is not None)


def get_kind(name: str) -> EvalKind:
    """The eval kind called ``name``; a ConfigError naming the known ones otherwise."""
    kind = KINDS.get(name)
    if kind is None:
        raise ConfigError(
            f"unknown eval kind {name!r}: this astra-eval knows {', '.join(NAMES)}",
            hint="a run directory of a newer astra-eval, or an eval kind not in eval/kinds.py",
        )
    return kind


def guess_order() -> tuple[EvalKind, ...]:
    """The kinds in the order an old run directory (no ``kind`` in config.json) is matched
    against their fields: those marked ``first`` before the rest."""
    return tuple(sorted(REGISTRY, key=lambda k: not k.guess.first))
