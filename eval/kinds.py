"""The registry of eval kinds: the one place that names the built-in ones. Each eval package's
``kind.py`` builds its :class:`eval.run.EvalKind`; a new eval is its package plus one line here
(its import, and its place in :data:`KINDS`, whose order is the report's order of sections), or,
for an eval that lives outside this package, one :func:`register` call when it is imported.
Readers ask the registry when they need it (:func:`registry`, :func:`comparable`), so that a
kind registered later is seen by all of them."""

from __future__ import annotations

from astra_agent.errors import ConfigError
from eval.arenas.kind import ARENAS
from eval.bfcl.kind import BFCL
from eval.general.kind import GENERAL
from eval.run import TRAINING_KINDS, EvalKind
from eval.tau2.kind import TAU2

KINDS: dict[str, EvalKind] = {k.name: k for k in (BFCL, ARENAS, GENERAL, TAU2)}


def registry() -> tuple[EvalKind, ...]:
    """Every kind, in the report's order."""
    return tuple(KINDS.values())


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def comparable() -> tuple[EvalKind, ...]:
    """The kinds whose runs pair entry by entry (``astra-eval compare``)."""
    return tuple(k for k in KINDS.values() if k.pairing is not None)


def register(kind: EvalKind) -> EvalKind:
    """Add ``kind`` after the others (a ValueError if its name is taken, by an eval kind or a
    training kind); returns it, so that a package can write ``KIND = register(EvalKind(…))``."""
    if kind.name in KINDS or kind.name in TRAINING_KINDS:
        raise ValueError(f"an eval kind named {kind.name!r} is registered already")
    KINDS[kind.name] = kind
    return kind


def unregister(kind: EvalKind) -> None:
    """Remove ``kind`` (one :func:`register` added; a no-op where it is not there)."""
    if KINDS.get(kind.name) is kind:
        del KINDS[kind.name]


def get_kind(name: str) -> EvalKind:
    """The eval kind called ``name``; a ConfigError naming the known ones otherwise."""
    kind = KINDS.get(name)
    if kind is None:
        raise ConfigError(
            f"unknown eval kind {name!r}: this astra-eval knows {', '.join(KINDS)}",
            hint="a run directory of a newer astra-eval, or an eval kind not in eval/kinds.py",
        )
    return kind


def guess_order() -> tuple[EvalKind, ...]:
    """The kinds in the order an old run directory (no ``kind`` in config.json) is matched
    against their fields: those marked ``first`` before the rest."""
    return tuple(sorted(KINDS.values(), key=lambda k: not k.guess.first))
