"""Each eval's ``summary.json`` as a record: the fields its readers read, with the types the
evals write them in, checked strictly (``"50"`` is not a number, ``null`` is not a dictionary);
a field they do not read may hold anything (it is kept, untyped).

BFCL's and the arenas' ``summarize`` compute their figures as one of these;
:func:`eval.runner.run_eval` writes them (:meth:`EvalSummary.written`, then the run's total,
completeness, time and model) and returns what it wrote as one, as ``evaluate_general`` does.
The run-directory readers (:mod:`eval.rundir`: the report, comparisons) validate a summary
against its kind's (:attr:`eval.evalkind.EvalKind.summary`) before they use it; one that does
not validate is not used (the figures are computed from the records instead)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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


class BFCLSummary(EvalSummary):
    entries: int | None = None
    accuracy: dict[str, float] = Field(default_factory=dict)
    overall: float | None = None
    overall_partial: bool = True
    counts: dict[str, int] = Field(default_factory=dict)
    errors: dict[str, int] = Field(default_factory=dict)
    inference_errors: int | None = None


class ArenaDomain(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    tasks: int | None = None
    mean_reward: float | None = None
    fully_solved: float | None = None


class ArenaSummary(EvalSummary):
    tasks: int | None = None
    mean_reward: float | None = None
    fully_solved: float | None = None
    mean_recall: float | None = None
    mean_precision: float | None = None
    tool_calls_per_task: float | None = None
    errors: dict[str, int] = Field(default_factory=dict)
    terminations: dict[str, int] = Field(default_factory=dict)
    domains: dict[str, ArenaDomain] = Field(default_factory=dict)


class GeneralSummary(EvalSummary):
    tasks: dict[str, dict[str, float]] = Field(default_factory=dict)
    published: dict[str, dict[str, Any]] = Field(default_factory=dict)
    samples: int | None = None
    scored: int | None = None
    errors: int | None = None
    errors_by_task: dict[str, int] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class Tau2Domain(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    tasks: int | None = None
    conversations: int | None = None
    scored: int | None = None
    errors: int | None = None
    mean_reward: float | None = None
    pass_hat_k: dict[str, float] = Field(default_factory=dict)  # "1".."trials"
    tasks_with_all_trials: int | None = None


class Tau2Summary(EvalSummary):
    conversations: int | None = None
    errors: int | None = None
    trials: int | None = None
    overall_pass_1: float | None = None
    domains: dict[str, Tau2Domain] = Field(default_factory=dict)
    data: dict[str, str] = Field(default_factory=dict)  # τ²'s data version (eval.tau2)
    user_simulator: dict[str, Any] = Field(default_factory=dict)  # its model and sampling
