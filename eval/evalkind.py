"""What an eval kind is to the readers of its runs (:mod:`eval.rundir`, :mod:`eval.compare`,
the report, the CLI): an :class:`EvalKind`, one per eval package (``eval/<name>/kind.py``),
listed in :mod:`eval.kinds`, the one place that names them.

A kind knows its record and summary types, how to summarise records when a run wrote no
summary, how to recognise an old run directory that does not say its kind (:class:`Guess`),
how two runs pair and are tested (:class:`eval.stats.Pairing`; None: not comparable), its
report section and its CLI table. The readers (over :class:`eval.run.Run`) loop over the
registry or look a kind up; none of them names one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eval.run import Run

if TYPE_CHECKING:
    from eval.report.blocks import Block, Page, Section
    from eval.results import EvalRecord
    from eval.stats import Pairing
    from eval.summaries import EvalSummary

Shape = Callable[[dict[str, Any]], bool]


def nothing(obj: dict[str, Any]) -> bool:
    return False


@dataclass(frozen=True)
class Guess:
    """How a run directory written before runs named their kind (config.json's ``kind``) is
    recognised: by the fields of its summary, of its config.json fingerprint, or of its first
    record. ``first``: tried before the other kinds (its fields overlap theirs)."""

    summary: Shape = nothing
    fingerprint: Shape = nothing
    record: Shape = nothing
    first: bool = False


Summarize = Callable[[list[Any], list[dict[str, Any]], dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class EvalKind:
    """One eval, as the readers of its runs see it.

    ``name`` is the kind (config.json's ``kind``, the ``astra-eval`` command); ``title`` its
    name in the report; ``counted_by`` the summary field that counts its entries. ``record``
    and ``summary`` are its record and ``summary.json`` types; ``summarize(records, raw,
    fingerprint)`` computes a summary from the typed records (and the plain ones) of a run
    that wrote none. ``section`` builds its report section; ``compare_blocks`` adds to the
    report's comparison of two of its runs (from the comparison's JSON). ``show`` prints its
    CLI table of a summary; ``score`` the running score on the progress bar."""

    name: str
    title: str
    counted_by: str
    record: type[EvalRecord]
    summary: type[EvalSummary]
    summarize: Summarize
    section: Callable[[list[Run], Page], Section]
    show: Callable[[Any], None]
    guess: Guess = field(default_factory=Guess)
    pairing: Pairing | None = None  # None: its runs are not compared entry by entry
    compare_blocks: Callable[[dict[str, Any]], list[Block]] | None = None
    score: Callable[[list[Any]], str] | None = None
