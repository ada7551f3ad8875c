"""What the readers of run directories hold (:mod:`eval.rundir` reads them; the report, the
comparisons and the Table 2 table use them): a run as read (:class:`Run`), and the kind of eval
it was read as (:class:`EvalKind`, one per eval package, built in its ``kind.py`` and listed in
:mod:`eval.kinds`, the one place that names them).

A kind knows its record and summary types, how to summarise records when a run wrote no
summary, how to recognise an old run directory that does not say its kind (:class:`Guess`),
each record's score, how two runs pair and are tested (:class:`eval.stats.Pairing`; None: not
comparable), its report section and its CLI table. Its package holds all of that (the summary
beside the record type, ``report.py`` with its section and entry view); the readers never name
a kind and never guess one from a record's fields: a loaded run carries its kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eval.report.blocks import Block, Page, Section
    from eval.results import EvalRecord
    from eval.stats import Pairing
    from eval.summaries import EvalSummary

# The training writers' kinds (astra-train; not plugins: eval/rundir.py reads them).
TRAINING_KINDS: tuple[str, ...] = ("sft", "rl")


@dataclass(frozen=True)
class Run:
    """One run directory as read: ``records`` for eval kinds (one per id, as plain JSON),
    ``metrics`` for training kinds (one per logged step); ``partial`` when the run is not
    complete or parts of it could not be read (``problems`` says which). An eval run carries
    its kind (``eval_kind``, detected once when it was read); ``kind`` is its name."""

    path: Path
    name: str
    kind: str
    summary: dict[str, Any] | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] | None = None  # config.json, or the astra-*.json fingerprint
    partial: bool = False
    problems: list[str] = field(default_factory=list)
    eval_kind: EvalKind | None = None  # the eval kind it was read as (None: a training run)

    @property
    def is_eval(self) -> bool:
        return self.kind not in TRAINING_KINDS

    @property
    def usable(self) -> bool:
        """Is there anything to show: records or a summary (evals), logged steps (training)?"""
        return bool(self.records or self.summary) if self.is_eval else bool(self.metrics)

    @property
    def model(self) -> str:
        """The model the run evaluated or trained ("" where not recorded)."""
        if self.summary and self.summary.get("model"):
            return str(self.summary["model"])
        fingerprint = (self.config or {}).get("fingerprint", self.config or {})
        return str(fingerprint.get("model") or "") if isinstance(fingerprint, dict) else ""


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
# A record (plain JSON, validated against the kind's record type) → its score in 0..1, or None
# where it has none (an error: the entry got no verdict).
Score = Callable[[dict[str, Any]], float | None]


@dataclass(frozen=True)
class EvalKind:
    """One eval, as the readers of its runs see it.

    ``name`` is the kind (config.json's ``kind``, the ``astra-eval`` command); ``title`` its
    name in the report; ``counted_by`` the summary field that counts its entries. ``record``
    and ``summary`` are its record and ``summary.json`` types; ``summarize(records, raw,
    fingerprint)`` computes a summary from the typed records (and the plain ones) of a run
    that wrote none. ``section`` builds its report section; ``compare_blocks`` adds to the
    report's comparison of two of its runs (from the comparison's JSON). ``show`` prints its
    CLI table of a summary; ``progress`` the running score on the progress bar. ``score`` is a
    record's score (a verdict as 1/0, a reward) for the readers that tabulate entries across
    kinds (the report's grid, the Table 2 table); ``solved`` whether a record fully solved its
    entry (None: a score of 1)."""

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
    progress: Callable[[list[Any]], str] | None = None
    score: Score | None = None  # None: its records have no score of their own
    solved: Callable[[dict[str, Any]], bool] | None = None

    def is_solved(self, record: dict[str, Any]) -> bool:
        """Did ``record`` fully solve its entry (False where it has no score)."""
        if self.solved is not None:
            return self.solved(record)
        return self.score is not None and self.score(record) == 1.0
