"""The base of every eval's ``summary.json`` record: the fields every reader reads, with the
types the evals write them in, checked strictly (``"50"`` is not a number, ``null`` is not a
dictionary); a field a reader does not read may hold anything (it is kept, untyped).

Each eval's own summary type subclasses it beside its record type, in its package
(``BFCLSummary`` in :mod:`eval.bfcl.runner`, ``ArenaSummary`` in :mod:`eval.arenas.runner`,
…), and its kind names it (:attr:`eval.run.EvalKind.summary`). An eval's ``summarize``
computes its figures as one; :func:`eval.runner.run_eval` writes them
(:meth:`EvalSummary.written`, then the run's total, completeness, time and model). The
run-directory readers (:mod:`eval.rundir`: the report, comparisons) validate a summary against
its kind's type before they use it; one that does not validate is not used (the figures are
computed from the records instead)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class EvalSummary(BaseModel):
    """What the report reads of every eval summary (a field it does not read may be
    anything)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    total: int | None = None
    complete: bool | None = None
    wall_s: float | None = None

    def written(self) -> dict[str, Any]:
        """The fields set (an eval's figures: those its ``summarize`` computed), in order, as
        ``summary.json`` holds them."""
        return self.model_dump(exclude_unset=True)
