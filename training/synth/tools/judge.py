"""Stage 6, trajectory judging: the teacher scores each episode, and the good ones are kept.

Per trajectory the teacher reads the request, the tools offered (and the chain the request was
written for, from the interaction metadata), every step — reasoning, calls with arguments and
results — and the final answer (``prompts/trajectory_judge.v1.jinja``), and scores seven
criteria, 1–5 each, after the paper's: ``call_conciseness``, ``answer_relevance``,
``answer_faithfulness`` (to the tool results), ``call_success``, ``plan_quality``,
``result_use`` (of earlier results) and ``query_understanding``. ``overall`` is their mean,
computed here. A trajectory is kept when ``overall`` ≥ ``min_score`` (default 3.5) and every
criterion ≥ its ``min_each`` (default 2: one "poor" rejects it). ``stats.json`` holds each
score's distribution over everything judged, kept and rejected, to calibrate them on.

Input: ``synth interact`` output directories or Trajectory JSONL files. Output (``OUT``):
``trajectories.jsonl`` — the kept :class:`~astra_agent.trajectory.Trajectory` records, whose
``metadata`` gains ``scores`` (the seven and ``overall``), ``judge_reason``,
``provenance`` (this stage's; the interaction's moves to ``interact_provenance``) — which
``astra-train data sft`` reads as it is; ``rejections.jsonl``: ``low_score`` (with the
scores), ``trajectory_judge:<problem>`` (no usable reply in ``max_attempts`` tries; raw kept),
``not_a_trajectory`` (no user message), ``unfinished`` (not ended by the model's answer),
``duplicate_trajectory``, ``not_json`` / ``bad_record``; ``stats.json`` (:class:`JudgeStats`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from astra_agent.trajectory import Trajectory
from training.synth.inputs import read_stage_output
from training.synth.runner import (
    ScoreStats,
    StageContext,
    TeacherStage,
    TeacherStageConfig,
    TeacherStageStats,
    fill_thresholds,
    parse_thresholds,
    run_teacher_stage,
    score_reply,
    score_rows,
    score_stats,
)
from training.synth.stage import (
    Progress,
    Rejection,
    StageRun,
    UnitOutcome,
)
from training.synth.text import cut_text

STAGE = "judge"
JUDGE = "trajectory_judge"  # the prompt template
TRAJECTORIES_FILE = "trajectories.jsonl"
INTERACTIONS_FILE = "interactions.jsonl"
Dimension = Literal[
    "call_conciseness",
    "answer_relevance",
    "answer_faithfulness",
    "call_success",
    "plan_quality",
    "result_use",
    "query_understanding",
]
DIMENSIONS: tuple[Dimension, ...] = get_args(Dimension)


TrajectoryScores = score_reply("TrajectoryScores", DIMENSIONS)  # what the judge answers


def overall(scores: dict[Dimension, int]) -> float:
    return round(sum(scores[d] for d in DIMENSIONS) / len(DIMENSIONS), 3)


class JudgeConfig(TeacherStageConfig):
    """``astra-train synth judge``. Kept: overall ≥ ``min_score`` and each criterion ≥ its
    ``min_each`` (2 for a name left out)."""

    interactions: list[Path] = Field(
        min_length=1, description="`synth interact` outputs or JSONL (repeatable)"
    )
    min_score: float = Field(3.5, ge=1, le=5, description="overall (the mean) at least this")
    min_each: dict[Dimension, int] = Field(default_factory=dict)
    result_chars: int = Field(1_500, ge=100, description="of each tool result, shown")
    reasoning_chars: int = Field(1_500, ge=0, description="of each step's reasoning, shown")

    @model_validator(mode="after")
    def _thresholds(self) -> JudgeConfig:
        self.min_each = fill_thresholds(self.min_each, DIMENSIONS, 2, "min_each")
        return self


parse_min_each = partial(parse_thresholds, names=DIMENSIONS, flag="--min-each", noun="criterion")


class JudgeStats(TeacherStageStats):
    trajectories: int = 0  # read (this shard's)
    judged: int = 0
    kept: int = 0
    thresholds: dict[str, Any] = Field(default_factory=dict)
    scores: dict[str, ScoreStats] = Field(default_factory=dict)  # the seven and "overall"

    def summary(self) -> list[tuple[str, Any]]:
        rows = [("trajectories", self.trajectories), ("judged", self.judged), ("kept", self.kept)]
        return rows + score_rows(self.scores)

    def warning(self) -> str | None:
        return None if self.kept else "no trajectory was kept"


# ------------------------------------------------------------------ what the judge reads


def _cut(text: str, limit: int) -> str:
    return cut_text(" ".join(text.split()), limit)


def transcript(traj: Trajectory, result_chars: int, reasoning_chars: int) -> dict[str, Any]:
    """The prompt's variables for one trajectory: question, tools, chain, steps, answer."""
    results = {m.get("tool_call_id"): m.get("content") for m in traj.messages
               if m.get("role") == "tool"}  # fmt: skip
    status = {e.call_id: e.status for e in traj.events}
    question = next(str(m.get("content") or "") for m in traj.messages if m.get("role") == "user")
    steps, calls = [], []
    for m in traj.messages:
        if m.get("role") != "assistant":
            continue
        step: dict[str, Any] = {
            "reasoning": _cut(str(m.get("reasoning_content") or ""), reasoning_chars),
            "content": _cut(str(m.get("content") or ""), result_chars),
            "calls": [],
        }
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            ok = status.get(call.get("id")) == "ok"
            result = results.get(call.get("id"))
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
            step["calls"].append({
                "name": fn.get("name"), "arguments": fn.get("arguments") or "{}",
                "result": _cut(text or "(no result)", result_chars), "failed": not ok,
            })  # fmt: skip
            calls.append({"name": fn.get("name"), "ok": ok})
        steps.append(step)
    tools = [t.get("function", t) for t in traj.tools]
    return {
        "question": question,
        "tools": [{"name": t.get("name", ""), "description": t.get("description") or ""}
                  for t in tools],
        "chain": [str(n) for n in traj.metadata.get("chain_names") or []],
        "steps": steps,
        "final_answer": traj.final_answer,
        "calls_json": json.dumps(calls, ensure_ascii=False),
    }  # fmt: skip


# ------------------------------------------------------------------ the stage


def _judgeable(traj: Trajectory) -> tuple[str, str] | None:
    if not any(m.get("role") == "user" for m in traj.messages):
        return "not_a_trajectory", "no user message"
    if traj.termination != "stop":
        return "unfinished", f"termination {traj.termination}"
    return None


class JudgeStage:
    def __init__(self, cfg: JudgeConfig, ctx: StageContext[Trajectory]) -> None:
        self.cfg, self.ctx = cfg, ctx

    async def process(self, key: str, item: tuple[str, Trajectory]) -> UnitOutcome[Trajectory]:
        source, traj = item
        view = transcript(traj, self.cfg.result_chars, self.cfg.reasoning_chars)
        answer = await self.ctx.teacher.ask(JUDGE, TrajectoryScores, **view)
        scores = answer.value.scores()
        mean = overall(scores)
        low = [f"{d} {v} < {self.cfg.min_each[d]}" for d, v in scores.items()
               if v < self.cfg.min_each[d]]  # fmt: skip
        if mean < self.cfg.min_score:
            low.append(f"overall {mean:g} < {self.cfg.min_score:g}")
        all_scores: dict[str, float] = {str(k): v for k, v in scores.items()}
        all_scores["overall"] = mean
        if low:
            why = "; ".join(low)
            reject = Rejection(stage=STAGE, source=source, id=traj.id, reason="low_score",
                               detail=why, raw=answer.raw, scores=all_scores)  # fmt: skip
            return UnitOutcome(rejections=[reject])
        meta = dict(traj.metadata)
        if "provenance" in meta:
            meta["interact_provenance"] = meta.pop("provenance")
        detail = {"attempts": answer.attempts, "source": source}
        prov = self.ctx.provenance([traj.id], prompts={JUDGE: answer.prompt.ref}, detail=detail)
        meta |= {
            "scores": all_scores,
            "judge_reason": answer.value.reason,
            "provenance": prov.model_dump(mode="json"),
        }
        return UnitOutcome([traj.model_copy(update={"metadata": meta})])


async def synth_judge(cfg: JudgeConfig, progress: Progress | None = None) -> JudgeStats:
    """Judge the trajectories of ``cfg.interactions`` (this shard's) into ``cfg.out``."""
    got = read_stage_output(
        cfg.interactions, Trajectory, stage=STAGE, producer="interact", file=INTERACTIONS_FILE,
        duplicate="duplicate_trajectory", check=_judgeable, say_where=True,
    )  # fmt: skip
    selected = [(t.id, (src, t)) for src, t in got.records if cfg.holds(t.id)]
    spec = TeacherStage(
        name=STAGE, units=selected, inputs=got.files, prompts=(JUDGE,),
        output=TRAJECTORIES_FILE, record=Trajectory, stats=JudgeStats,
        start=lambda ctx: JudgeStage(cfg, ctx).process, count=_count, rejected=got.rejected,
        stats_fields={"trajectories": len(selected), "thresholds": {
            "min_score": cfg.min_score, "min_each": dict(cfg.min_each)}},
    )  # fmt: skip
    return await run_teacher_stage(cfg, spec, progress)


def _count(stats: JudgeStats, run: StageRun[Trajectory], order: Sequence[str]) -> None:
    records = [r for unit in order for r in run.records(unit)]
    kept = [dict(r.metadata["scores"]) for r in records]
    judged = kept + [dict(x.scores) for u in order if u in run.units
                     for x in run.units[u].rejections if x.scores]  # fmt: skip
    stats.kept, stats.judged = len(records), len(judged)
    stats.scores = score_stats(judged, kept)
