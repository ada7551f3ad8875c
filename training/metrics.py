"""The step records of ``astra-train``'s TRL backends and their file: ``OUTPUT_DIR/metrics.jsonl``
holds one :class:`SFTStep` per logging step of SFT, or one :class:`RLStep` per optimizer step of
RL, each appended whole by :class:`MetricsLog` (and written nowhere else).

A line is the record's fields flat, in their order, as ``json.dumps`` writes them. The report
(:mod:`eval.report.curves`) reads these files by that format, without importing ``training``
(``eval`` never does): the names it reads are these records' fields, which a test checks.
verl's backends write verl's own metrics instead (its file logger, its names).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.runio import append_jsonl, drop_torn_tail, read_json_lines, write_lines_atomic

METRICS_FILE = "metrics.jsonl"


class StepRecord(BaseModel):
    """One line of ``metrics.jsonl``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # counts whose running sums ``MetricsLog`` adds as ``NAME_total``
    TOTALLED: ClassVar[tuple[str, ...]] = ()

    step: int

    def row(self) -> dict[str, Any]:
        """The line's fields, flat, in the order they are written."""
        return self.model_dump()

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        """The record of a line (:meth:`row` read back)."""
        return cls.model_validate(row)

    def to_json_line(self) -> str:
        return json.dumps(self.row(), ensure_ascii=False) + "\n"


class SFTStep(StepRecord):
    """A logging step of SFT: TRL's log of it, the tokens the trainer processed since the last
    logging step (all, padding, trained), their rates, and their running totals."""

    TOTALLED: ClassVar[tuple[str, ...]] = ("tokens", "trained_tokens", "padding_tokens")

    loss: float
    learning_rate: float | None
    grad_norm: float | None
    tokens: int
    padding_tokens: int
    trained_tokens: int
    tokens_per_s: float
    trained_tokens_per_s: float
    epoch: float | None
    elapsed_s: float
    tokens_total: int | None = None  # set by MetricsLog.append
    trained_tokens_total: int | None = None
    padding_tokens_total: int | None = None


class Heldout(BaseModel):
    """The held-out tasks, once each at temperature 0, with the training reward."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eval_reward: float
    eval_solved: float
    eval_tasks: int


class ABFStats(BaseModel):
    """A step's Adaptive Batch Filling (``training.rl.core.FillStats``, as written)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int
    sampled: int
    valid: int
    dropped_flat: int
    from_buffer: int
    dropped_stale: int
    buffered: int
    rounds: int
    mean_reward_sampled: float


class Rollouts(BaseModel):
    """What a step's batch was made of: its episodes' rewards, solved share, errors (and why:
    each reason's first 160 characters, counted), tokens, re-render checks and times; the mean
    reward of every group sampled for it; ABF."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reward_mean: float
    solved: float
    episode_errors: int
    episode_error_reasons: dict[str, int] = Field(default_factory=dict)  # absent in old runs
    sampled_tokens: int
    response_tokens: int
    prompt_tokens: int
    rerender_mismatches: int
    rerender_checked: int
    model_s: float
    tools_s: float
    turns_mean: float
    reward_mean_sampled: float
    abf: ABFStats
    rollout_s: float
    # ASTRA's reward and its parts whatever the run trains on (``reward`` picks one: the
    # paper's ablation), and the tool calls an episode made; absent in older runs
    f1_mean: float | None = None
    recall_mean: float | None = None
    precision_mean: float | None = None
    calls_mean: float | None = None


ABLATION_KEYS = ("f1_mean", "recall_mean", "precision_mean", "calls_mean")


class Update(BaseModel):
    """TRL's log of a step's optimizer update, and its time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    loss: float | None
    grad_norm: float | None
    learning_rate: float | None
    clip_fraction: float | None
    logp_gap: float | None
    update_s: float | None


class RLStep(StepRecord):
    """An optimizer step of RL: the held-out evaluation that preceded it (every
    ``eval_every`` steps), its rollouts, its update; written flat."""

    heldout: Heldout | None = None
    rollouts: Rollouts
    update: Update

    def row(self) -> dict[str, Any]:
        held = self.heldout.model_dump() if self.heldout else {}
        rollouts = self.rollouts.model_dump()
        if not rollouts["episode_error_reasons"]:  # a step without errors: its line as before
            del rollouts["episode_error_reasons"]
        for key in ABLATION_KEYS:  # a line of an older run: as it was written
            if rollouts[key] is None:
                del rollouts[key]
        return {"step": self.step, **held, **rollouts, **self.update.model_dump()}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        def part(model: type[BaseModel]) -> dict[str, Any]:
            return {k: row[k] for k in model.model_fields if k in row}

        known = {"step", *Heldout.model_fields, *Rollouts.model_fields, *Update.model_fields}
        if unknown := sorted(set(row) - known):
            raise ValueError(f"not fields of an RL step: {', '.join(unknown)}")
        held = part(Heldout)
        return cls(
            step=row.get("step"),
            heldout=Heldout.model_validate(held) if held else None,
            rollouts=Rollouts.model_validate(part(Rollouts)),
            update=Update.model_validate(part(Update)),
        )


S = TypeVar("S", bound=StepRecord)


class MetricsLog(Generic[S]):
    """``OUTPUT_DIR/metrics.jsonl``: one record per logging step, each appended whole.

    On resume from step S the records after S (written after the checkpoint, so about to be
    redone) are dropped first: the file then holds each step once, and the running totals go on
    from the last kept record."""

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = path
        self.totals: dict[str, float] = {}
        if resume_step is None:
            path.unlink(missing_ok=True)
            return
        drop_torn_tail(path)
        kept = [r for r in self.read(path) if int(r.get("step", 0)) <= resume_step]
        write_lines_atomic(path, (json.dumps(r) + "\n" for r in kept))
        if kept:
            self.totals = {k: v for k, v in kept[-1].items() if k.endswith("_total")}

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """The lines as written (a torn last one left out)."""
        if not path.is_file():
            return []
        return read_json_lines(path)

    def append(self, record: S) -> S:
        """Add ``record`` with the running sums of its ``TOTALLED`` counts."""
        totals = {
            f"{key}_total": self.totals.get(f"{key}_total", 0) + getattr(record, key)
            for key in record.TOTALLED
        }
        self.totals.update(totals)
        record = record.model_copy(update=totals)
        append_jsonl(self.path, record, fsync=False)
        return record
