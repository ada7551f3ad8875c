"""``astra-eval bfcl``: BFCL-V3 multi-turn inference through ``run_episode``, scored with the
official semantics, one JSONL record per entry, resumable, concurrent.

Per entry: one BFCLEnvironment (the backend instances live for the whole entry); per turn, the
user message (or, at a miss_func held-out turn, the held-out functions with the official
message) and up to 20 model steps; a turn that needs more ends the entry (force-terminated).

The loop runs with the official harness's semantics (``OFFICIAL_CALLS``): every call goes to
the backends unchecked (an unknown name fails there with the official wording, and a held-out
function called before it is offered runs, as it does there); a step whose calls do not decode
ends the turn with none of them run; tool results reach the model whole (long_context).

The single-turn categories (non-live, live) are one request each (:mod:`eval.bfcl.single`),
scored by :func:`eval.bfcl.ast_check.single_turn_verdict`. The summary holds the accuracy per
category, the multi-turn overall (``overall``: the figure agent-RL papers quote), and the
leaderboard's groups and overall scores of V4 and V3 (:mod:`eval.bfcl.overall`).
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.errors import ConfigError, ServerError
from astra_agent.model import ChatModel, EndpointError
from astra_agent.runio import write_text_atomic
from astra_agent.trajectory import Trajectory
from eval.bfcl import single
from eval.bfcl.ast_check import single_turn_verdict
from eval.bfcl.backend import OFFICIAL_CALLS, STEP_LIMIT, BFCLEnvironment, decode_step
from eval.bfcl.categories import LIVE, MEMORY, MULTI_TURN, RUNNABLE, half_of, resolve
from eval.bfcl.checker import check_entry
from eval.bfcl.memory import MemoryEntry, MemoryRunner, load_memory
from eval.bfcl.official import CATEGORIES, PINNED, Entry, load_category
from eval.bfcl.overall import Score, overall
from eval.bfcl.single import SingleEntry, count_single, load_single
from eval.results import ErrorKind, EvalRecord
from eval.runner import EvalSpec, ProgressHook, RunConfig, run_eval
from eval.summaries import EvalSummary

NAME = "bfcl"  # the eval kind (eval/kinds.py)
HELD_OUT_MESSAGE = "I have updated some more functions you can choose from. What about now?"
PUBLISHED = {  # paper Table 1, function-calling mode through vLLM, temperature 0.6
    "ASTRA-14B": {
        "base": 67.0,
        "miss_func": 56.0,
        "miss_param": 48.5,
        "long_context": 61.0,
        "overall": 58.13,
    },
    "ASTRA-32B": {
        "base": 76.5,
        "miss_func": 65.5,
        "miss_param": 48.5,
        "long_context": 66.5,
        "overall": 64.25,
    },
    "Qwen3-14B": {"overall": 44.50},
    "Qwen3-32B": {"overall": 49.63},
}


class BFCLConfig(RunConfig):
    out: Path = Field(Path("runs/bfcl"), description="results directory (checked writable)")
    concurrency: int = Field(8, ge=1, description="entries at once")
    categories: list[str] = Field(
        default_factory=lambda: list(CATEGORIES),
        description="categories and groups (eval/bfcl/categories.py); default: multi-turn",
    )
    ids: list[str] | None = None
    limit: int | None = Field(None, ge=1, description="first N entries per category")
    half: Literal["selection", "report"] | None = Field(
        None,
        description="only the entries of one fixed half (by a hash of the id): choose "
        "settings on selection, report on report",
    )
    tool_timeout_s: float = Field(60.0, gt=0)

    def fingerprint(self) -> dict[str, Any]:
        """What the results depend on besides the model and sampling."""
        cats = sorted(resolve(self.categories))  # a group and its categories are one run
        fp: dict[str, Any] = {"categories": cats, "ids": self.ids, "limit": self.limit}
        if self.half is not None:  # absent when unset: runs made before the field resume
            fp["half"] = self.half
        return fp


class BFCLRecord(EvalRecord):
    """One entry's result: the verdict, the decoded calls and raw responses per turn and step
    (the official result format), the trajectory. An entry whose inference failed is invalid
    with ``error_type`` ``multi_turn:inference_error`` (single-turn: ``inference_error``) and
    ``error_kind`` ``inference``. A single-turn entry keeps its reply in the official result
    format (``result``) and the calls decoded from it (``calls``); the checker's messages are
    in ``details["errors"]``. A failed multi-turn entry names its first failing turn and, in
    ``details``, the state difference or the missing results."""

    category: str
    valid: bool
    error_type: str | None = None
    failed_turn: int | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    decoded: list[list[list[str]]] = Field(default_factory=list)
    responses: list[list[Any]] = Field(default_factory=list)
    trajectory: Trajectory | None = None
    result: Any = None
    calls: list[dict[str, Any]] | None = None


class BFCLScore(BaseModel):
    """An aggregate score (%): the categories it is made of and those that did not run."""

    value: float
    parts: list[str]
    missing: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, score: Score) -> BFCLScore:
        return cls(value=round(score.value, 2), parts=list(score.parts), missing=score.missing)


class BFCLSummary(EvalSummary):
    """``overall``: the multi-turn overall (the mean of the four, partial over fewer; None when
    no multi-turn category ran); ``v4``/``v3``: the leaderboard's overall scores and their
    groups, each partial where a category it is made of did not run."""

    entries: int | None = None
    accuracy: dict[str, float] = Field(default_factory=dict)
    overall: float | None = None
    overall_partial: bool = True
    v4_groups: dict[str, BFCLScore] = Field(default_factory=dict)
    v4_overall: BFCLScore | None = None
    v3_groups: dict[str, BFCLScore] = Field(default_factory=dict)
    v3_overall: BFCLScore | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    errors: dict[str, int] = Field(default_factory=dict)
    inference_errors: int | None = None


AnyEntry = Entry | SingleEntry | MemoryEntry


def category_entries(category: str) -> tuple[AnyEntry, ...]:
    if category in MULTI_TURN:
        return load_category(category)
    if category in MEMORY:
        return load_memory(category)
    return load_single(category)


def select(cfg: BFCLConfig) -> list[AnyEntry]:
    """The entries to run; an unknown category, group or id, a category that cannot run here,
    or none at all, is an error before anything runs."""
    cats = resolve(cfg.categories)
    entries: list[AnyEntry] = []
    for c in cats:
        cat = [e for e in category_entries(c) if cfg.half is None or half_of(e.id) == cfg.half]
        entries += cat[: cfg.limit] if cfg.limit else cat
    if cfg.ids:
        known = {e.id for c in RUNNABLE for e in category_entries(c)}
        unknown = sorted(set(cfg.ids) - known)
        if unknown:
            raise ConfigError(f"unknown BFCL id(s): {', '.join(unknown[:5])}")
        entries = [e for e in entries if e.id in set(cfg.ids)]
        left_out = sorted(set(cfg.ids) - {e.id for e in entries})
        if left_out:  # an id of another category, or past --limit: it would not run
            raise ConfigError(
                f"BFCL id(s) not in the selected entries: {', '.join(left_out[:5])} "
                f"(categories {', '.join(cats)}"
                + (f", first {cfg.limit} of each)" if cfg.limit else ")"),
                hint="add their categories to --categories (or raise --limit)",
            )
    return entries


async def run_memory(entry: MemoryEntry, model: ChatModel, memory: MemoryRunner) -> BFCLRecord:
    """One memory question, after its scenario's prerequisite conversations (run once per
    run, :class:`eval.bfcl.memory.MemoryRunner`); scored on its final answer."""
    o = await memory.run(entry, model)
    return BFCLRecord(
        id=entry.id,
        category=entry.category,
        valid=o.valid,
        error_type=o.error_type,
        details=o.details,
        responses=o.responses,
        trajectory=o.trajectory,
        error=o.error,
        error_kind=o.error_kind,
        endpoint_failure=o.endpoint_failure,
    )


async def run_single(entry: SingleEntry, model: ChatModel) -> BFCLRecord:
    """One single-turn entry: its request, its reply in the official format, the verdict. A
    failure to get a reply is an inference error (never a wrong answer)."""
    try:
        result = await single.infer(entry, model)
    except ServerError as exc:
        return BFCLRecord(
            id=entry.id,
            category=entry.category,
            valid=False,
            error_type="inference_error",
            error=f"inference error: {exc}",
            error_kind="inference",
            endpoint_failure=exc.kind if isinstance(exc, EndpointError) else "other",
        )
    v = single_turn_verdict(entry.category, entry.functions, entry.ground_truth, result)
    return BFCLRecord(
        id=entry.id,
        category=entry.category,
        valid=v.valid,
        error_type=v.error_type,
        details={"errors": list(v.errors)} if v.errors else {},
        result=result,
        calls=v.decoded,
    )


@dataclass
class _Turns:
    """What one entry's inference produced so far (kept when it fails midway)."""

    traj: Trajectory | None = None
    responses: list[list[Any]] = field(default_factory=list)  # raw, per turn and step
    decoded: list[list[list[str]]] = field(default_factory=list)  # as the official decoder


async def _infer(entry: Entry, model: ChatModel, tool_timeout_s: float, out: _Turns) -> None:
    """Every turn of one entry through the loop, into ``out``."""
    env = BFCLEnvironment(entry)
    # The official harness quits once its step count exceeds the limit: 21 executing steps.
    limits = EpisodeLimits(
        max_steps=STEP_LIMIT + 1, tool_timeout_s=tool_timeout_s, max_tool_output_chars=None
    )
    try:
        for t, question in enumerate(entry.question):
            if str(t) in entry.missed_function:
                env.add_held_out(t)
            msgs = question or [{"role": "user", "content": HELD_OUT_MESSAGE}]
            start = len(out.traj.messages) if out.traj else 0
            out.traj = await run_episode(
                model, env, msgs, limits=limits, trajectory=out.traj,
                tools=await env.list_tools(), policy=OFFICIAL_CALLS,
            )  # fmt: skip
            raw, steps = _steps(out.traj.messages[start:])
            out.responses.append(raw)
            out.decoded.append(steps)
            if out.traj.termination in ("model_error", "max_steps"):
                break  # max_steps: the official harness stops the whole entry (force-terminated)
    finally:
        await env.close()  # its worker thread ends now, not when idle


async def run_entry(entry: Entry, model: ChatModel, tool_timeout_s: float) -> BFCLRecord:
    """Infer every turn of one entry; return its record (verdict included). A failure to run
    is recorded with its cause (``error_kind``), never raised."""
    turns = _Turns()
    error: str | None = None
    kind: ErrorKind | None = None
    try:
        await _infer(entry, model, tool_timeout_s, turns)
        if turns.traj is not None and turns.traj.termination == "model_error":
            error, kind = f"inference error: {turns.traj.termination_detail}", "inference"
    except Exception as exc:  # one entry's failure is recorded with its cause
        error, kind = f"{type(exc).__name__}: {exc}", "run"
    verdict = check_entry(entry, turns.decoded)
    return BFCLRecord(
        id=entry.id,
        category=entry.category,
        valid=verdict.valid and kind is None,
        error_type="multi_turn:inference_error" if kind == "inference" else verdict.error_type,
        failed_turn=verdict.turn,
        details=verdict.details,
        decoded=turns.decoded,
        responses=turns.responses,
        trajectory=turns.traj,
        error=error,
        error_kind=kind,
        endpoint_failure=turns.traj.model_failure if turns.traj and kind == "inference" else None,
    )


def _steps(messages: list[dict[str, Any]]) -> tuple[list[Any], list[list[str]]]:
    """One turn's model steps: raw, in the official result format (a step's calls as
    ``[{name: arguments}]``, or its text), and decoded as the official evaluator decodes them
    (steps that do not decode, and the final answer, are dropped)."""
    raw: list[Any] = []
    decoded = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        if not m.get("tool_calls"):
            raw.append(m.get("content") or "")
            continue
        step = [{c["function"]["name"]: c["function"]["arguments"]} for c in m["tool_calls"]]
        raw.append(step)
        calls = decode_step(step)
        if calls:
            decoded.append(calls)
    return raw, decoded


@cache
def category_sizes() -> dict[str, int]:
    """Every live category's entry count in the data: the weight of one that did not run."""
    return {c: count_single(c) for c in LIVE}


def summarize(records: list[BFCLRecord]) -> BFCLSummary:
    """Accuracy per category (each id once); the multi-turn overall, ``overall`` (the mean of
    the four; over fewer it is not the leaderboard's, and says so: ``overall_partial``); the
    V4 and V3 groups and overall scores (:mod:`eval.bfcl.overall`)."""
    by_cat: dict[str, list[BFCLRecord]] = {}
    for r in records:
        by_cat.setdefault(r.category, []).append(r)
    acc = {
        c: round(100 * sum(r.valid for r in by_cat[c]) / len(by_cat[c]), 2)
        for c in RUNNABLE
        if c in by_cat
    }
    counts = {c: len(by_cat[c]) for c in acc}
    multi = [acc[c] for c in MULTI_TURN if c in acc]
    errors = Counter(r.error_type for r in records if not r.valid and r.error_type)
    scores = overall(acc, counts, category_sizes()) if acc else None
    return BFCLSummary(
        entries=len(records),
        accuracy=acc,
        overall=round(sum(multi) / len(multi), 2) if multi else None,
        overall_partial=len(multi) != len(MULTI_TURN),
        counts=counts,
        errors=dict(errors),
        inference_errors=sum(1 for r in records if r.error_kind is not None),
        v4_groups={g: BFCLScore.of(v) for g, v in scores.v4_groups.items()} if scores else {},
        v4_overall=BFCLScore.of(scores.v4) if scores else None,
        v3_groups={g: BFCLScore.of(v) for g, v in scores.v3_groups.items()} if scores else {},
        v3_overall=BFCLScore.of(scores.v3) if scores else None,
    )


def overall_label(accuracy: Iterable[str], partial: bool) -> str:
    """How the multi-turn overall is named: partial over fewer than four categories (the
    multi-turn ones of ``accuracy``)."""
    if not partial:
        return "overall"
    multi = [c for c in accuracy if c in MULTI_TURN]
    return f"partial overall ({', '.join(multi) or 'no multi-turn category'})"


def write_leaderboard(out: Path, summary: BFCLSummary) -> None:
    """``leaderboard.csv``: the measured row (marked when its overall is partial) above the
    published ones."""
    cols = ["Model", "Multi Turn Overall Acc", "Base", "Miss Func", "Miss Param", "Long Context"]
    acc = summary.accuracy
    name = str(summary.model)
    if summary.overall_partial:
        name += f" [{overall_label(acc, True)}]"
    text = io.StringIO(newline="")
    w = csv.writer(text)
    w.writerow(cols)
    overall_cell = "" if summary.overall is None else summary.overall
    w.writerow([name, overall_cell, *(acc.get(c, "") for c in CATEGORIES)])
    for model, row in PUBLISHED.items():
        w.writerow([f"{model} (published)", row["overall"], *(row.get(c, "") for c in CATEGORIES)])
    write_text_atomic(out / "leaderboard.csv", text.getvalue())


async def evaluate_bfcl(
    cfg: BFCLConfig, progress: ProgressHook[BFCLRecord] | None = None
) -> BFCLSummary:
    """Run the selected entries (append one whole record per entry, resume), write
    summary.json and leaderboard.csv."""
    entries = select(cfg)
    # Memory questions share their scenario's prerequisite conversations, kept under the run
    memory = MemoryRunner(
        cfg.out / "memory",
        cfg.tool_timeout_s,
        expected=[e for e in entries if isinstance(e, MemoryEntry)],
    )
    # The official harness scores the server's tool_calls as returned: no recovery from text.
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"recover_calls": False})})

    def summary_of(records: list[BFCLRecord]) -> BFCLSummary:
        return summarize(records).model_copy(update={"bfcl_eval": PINNED, "published": PUBLISHED})

    spec = EvalSpec(
        items=entries,
        key=lambda e: e.id,
        one=lambda e, model: (
            run_single(e, model)
            if isinstance(e, SingleEntry)
            else run_memory(e, model, memory)
            if isinstance(e, MemoryEntry)
            else run_entry(e, model, cfg.tool_timeout_s)
        ),
        record=BFCLRecord,
        fingerprint=cfg.fingerprint(),
        summarize=summary_of,
        kind=NAME,
    )
    summary, _ = await run_eval(cfg, spec, progress)
    write_leaderboard(cfg.out, summary)
    return summary
