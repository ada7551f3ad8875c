"""Stage B.1–B.3, decompose: main questions decomposed into chains of sub-questions, each step
checked for tool necessity, the whole verified by the teacher and filtered.

One unit is one main question: the k-th of ``per_domain`` for a domain (from ``--domains``,
a text file of one name a line or JSONL with ``name``/``description``; or ``--taxonomy``, a
JSON tree whose leaves become domains), or one seed question (``--seeds``, JSONL with
``question`` and optionally ``answer``, ``domain``, ``id``). Each unit takes three kinds of
teacher calls, cheapest checks first (a unit rejected early costs no later call):

1. ``decompose`` (``prompts/decompose.v1.jinja``): the main question, its final answer and
   2–6 sub-questions (``min_steps``–``max_steps``) with ids, short concrete sub-answers and
   ``depends_on``. Rejected, before any other call, when the chain has

   ``chain_length`` too few or too many steps; ``duplicate_id``; ``unknown_dependency``; a
   ``cycle``; ``duplicate_subquestion`` (two steps asking the same, up to case and
   punctuation); ``answer_not_derived`` (the final answer does not contain, up to case,
   spaces and punctuation, the answer of every last step — a step nothing depends on whose
   answer the final answer does not use is a step nothing needs); ``near_duplicate`` (the
   main question is too close to one already kept: MinHash Jaccard estimate ≥
   ``dedup_threshold``, 0.7 by default, as the tasks stage measures it).
2. ``necessity`` (``prompts/necessity.v1.jinja``), once per sub-question, concurrently: does
   it need a tool or external data, or can it be answered from the main question and the
   answers it depends on? Sets ``needs_tool`` / ``necessity_reason``. Rejected as
   ``unneeded_dependency`` when a step that another depends on needs no tool (a last step
   may be pure reasoning, e.g. arithmetic over earlier answers), ``no_tool_step`` when none
   needs one.
3. ``verify`` (``prompts/verify.v1.jinja``): dependency, atomicity, forced serialization and
   completeness, 1–5 each; ``overall`` is their mean. Rejected as ``low_score`` under the
   thresholds: each score at least ``min_scores`` (3 by default) and overall at least
   ``min_overall`` (4.0 by default: stricter than the tasks stage's 3.5, because one weak
   decomposition becomes a whole RL environment with a wrong reward). ``stats.json`` holds
   each score's distribution over everything judged, kept and rejected, to calibrate on.

A reply that is not the requested JSON in ``max_attempts`` tries rejects the unit as
``decompose:<problem>``, ``necessity:<problem>`` or ``verify:<problem>`` with the raw text.

Why one stage with three calls, not three stages: every call is a filter on the same record
(no fan-out), so the unit — one decomposition through all three — commits whole, resumes
whole, and its provenance names all three prompts; three stages would triple the directories
and fingerprints between steps that are never run apart. The cost: a new threshold re-runs
the stage (use the distributions of a small first run).

Output (``OUT``): ``decompositions.jsonl`` (:class:`~training.synth.envs.records.Decomposition`,
sub-questions in dependency order, id ``<domain slug>:<k>`` or ``seed:<id>``),
``rejections.jsonl``, ``stats.json`` (:class:`DecomposeStats`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from training.synth.envs.records import (
    ID_PATTERN,
    Decomposition,
    SubQuestion,
    compact,
    contains_answer,
    layers,
    sinks,
    structure_problem,
    topological_order,
)
from training.synth.envs.sources import Slot, read_sources
from training.synth.runner import (
    ScoreStats,
    StageContext,
    TeacherStage,
    TeacherStageConfig,
    TeacherStageStats,
    fill_thresholds,
    gather,
    parse_thresholds,
    run_teacher_stage,
    score_rows,
    score_stats,
)
from training.synth.stage import Progress, Rejection, StageRun, UnitOutcome, tally
from training.synth.teacher import TeacherRejected
from training.synth.text import NearDuplicates, signature

STAGE = "decompose"
DECOMPOSITIONS_FILE = "decompositions.jsonl"
DECOMPOSE, NECESSITY, VERIFY = "decompose", "necessity", "verify"  # the prompt templates
PROMPTS = (DECOMPOSE, NECESSITY, VERIFY)
ScoreName = Literal["dependency", "atomicity", "forced_serialization", "completeness"]
SCORES: tuple[ScoreName, ...] = get_args(ScoreName)
# what the k-th question of a domain is about (k modulo their number): variety per domain
FOCI = (
    "looking up one record by its id, then facts about what it points to",
    "comparing two items and acting on the better one",
    "a total or an average over a period",
    "a schedule, a deadline or an opening time",
    "a place, a route or a distance",
    "a price, a fee or a currency conversion",
    "who is responsible for something, and how to reach them",
    "the current status of a request, and what happens next",
)


# ------------------------------------------------------------------ what the teacher returns

TEXT = r"\S"  # not blank


class DraftStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=ID_PATTERN)
    question: str = Field(min_length=5, max_length=1000, pattern=TEXT)
    answer: str = Field(min_length=1, max_length=200, pattern=TEXT)
    depends_on: list[str] = Field(default_factory=list, max_length=12)


class DraftChain(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=10, max_length=2000, pattern=TEXT)
    answer: str = Field(min_length=1, max_length=1000, pattern=TEXT)
    subquestions: list[DraftStep] = Field(min_length=1, max_length=12)


class Necessity(BaseModel):
    model_config = ConfigDict(extra="forbid")

    needs_tool: bool
    reason: str = Field("", max_length=2000)


class VerifyScores(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dependency: int = Field(ge=1, le=5)
    atomicity: int = Field(ge=1, le=5)
    forced_serialization: int = Field(ge=1, le=5)
    completeness: int = Field(ge=1, le=5)
    reason: str = Field("", max_length=2000)

    def scores(self) -> dict[str, float]:
        out: dict[str, float] = {name: float(getattr(self, name)) for name in SCORES}
        out["overall"] = round(sum(out.values()) / len(SCORES), 3)
        return out


def _reject(source: str, rid: str, reason: str, detail: str = "", **kw: Any) -> Rejection:
    return Rejection(stage=STAGE, source=source, id=rid, reason=reason, detail=detail, **kw)


# ------------------------------------------------------------------ config, stats


class DecomposeConfig(TeacherStageConfig):
    """``astra-train synth decompose``: at least one of ``domains``, ``taxonomy``, ``seeds``."""

    domains: Path | None = Field(None, description="one domain a line, or JSONL name/description")
    taxonomy: Path | None = Field(None, description="a JSON tree; its leaves are domains")
    seeds: Path | None = Field(None, description="JSONL: question, answer?, domain?, id?")
    per_domain: int = Field(4, ge=1, le=10_000, description="questions per domain")
    min_steps: int = Field(2, ge=1, le=12, description="sub-questions, at least")
    max_steps: int = Field(6, ge=1, le=12, description="sub-questions, at most")
    min_scores: dict[ScoreName, int] = Field(default_factory=dict)
    min_overall: float = Field(4.0, ge=1, le=5, description="keep a mean of the four scores ≥ this")
    dedup_threshold: float = Field(
        0.7, gt=0, le=1, description="main questions near-duplicate at this Jaccard"
    )
    shingle: int = Field(3, ge=1, le=8, description="words per shingle")

    @model_validator(mode="after")
    def _check(self) -> DecomposeConfig:
        if not (self.domains or self.taxonomy or self.seeds):
            raise ValueError("name --domains, --taxonomy or --seeds")
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps {self.min_steps} > max_steps {self.max_steps}")
        self.min_scores = fill_thresholds(self.min_scores, SCORES, 3, "min_scores")
        return self


parse_min_scores = partial(parse_thresholds, names=SCORES, flag="--min-score", noun="score")


class DecomposeStats(TeacherStageStats):
    units: int = 0  # questions asked for: domain slots and seeds (this shard's)
    domains: int = 0
    seeds: int = 0
    decompositions: int = 0
    by_domain: dict[str, int] = Field(default_factory=dict)
    steps: dict[str, int] = Field(default_factory=dict)  # kept chains by number of steps
    depth: dict[str, int] = Field(default_factory=dict)  # by number of parallel layers
    with_parallel_steps: int = 0  # kept chains with a layer of two or more steps
    tool_steps: int = 0  # kept steps that need a tool
    reasoning_steps: int = 0  # kept steps that need none (last steps only)
    thresholds: dict[str, float] = Field(default_factory=dict)
    scores: dict[str, ScoreStats] = Field(default_factory=dict)  # the four and "overall"

    def summary(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [
            ("questions asked", self.units),
            ("decompositions kept", self.decompositions),
            ("  with parallel steps", self.with_parallel_steps),
        ]
        rows += [(f"  of {n} steps", k) for n, k in self.steps.items()]
        return rows + score_rows(self.scores)

    def warning(self) -> str | None:
        return None if self.decompositions else "no decomposition was kept"


# ------------------------------------------------------------------ checks (no teacher)


def chain_problem(
    question: str, answer: str, steps: Sequence[SubQuestion], min_steps: int, max_steps: int
) -> tuple[str, str] | None:
    """The first structural reason to reject a chain (see the module), or None."""
    if not min_steps <= len(steps) <= max_steps:
        return "chain_length", f"{len(steps)} steps, not {min_steps}-{max_steps}"
    problem = structure_problem(steps)
    if problem is not None:
        return problem
    asked: dict[str, str] = {}
    for s in steps:
        text = compact(s.question)
        if text in asked:
            return "duplicate_subquestion", f"{s.id} asks what {asked[text]} asks"
        asked[text] = s.id
    missing = [s for s in sinks(steps) if not contains_answer(answer, _by_id(steps, s).answer)]
    if missing:
        shown = ", ".join(f"{sid} ({_by_id(steps, sid).answer!r})" for sid in missing)
        return "answer_not_derived", f"the final answer {answer!r} does not contain {shown}"
    return None


def _by_id(steps: Sequence[SubQuestion], sid: str) -> SubQuestion:
    return next(s for s in steps if s.id == sid)


def necessity_problem(steps: Sequence[SubQuestion]) -> tuple[str, str] | None:
    """``unneeded_dependency`` / ``no_tool_step`` after the necessity calls, or None."""
    needed = {d: s.id for s in steps for d in s.depends_on}
    for s in steps:
        if s.id in needed and s.needs_tool is False:
            why = f": {s.necessity_reason}" if s.necessity_reason else ""
            return "unneeded_dependency", f"{s.id} (needed by {needed[s.id]}) needs no tool{why}"
    if not any(s.needs_tool for s in steps):
        return "no_tool_step", "no step needs a tool"
    return None


def low_scores(
    scores: Mapping[str, float], min_scores: Mapping[ScoreName, int], min_overall: float
) -> list[str]:
    """What is under a threshold (empty: kept)."""
    low = [f"{n} {scores[n]:g} < {v}" for n, v in min_scores.items() if scores[n] < v]
    if scores["overall"] < min_overall:
        low.append(f"overall {scores['overall']:g} < {min_overall:g}")
    return low


# ------------------------------------------------------------------ the stage


@dataclass(frozen=True)
class _Draft:
    question: str
    answer: str
    steps: list[SubQuestion]
    raw: str
    attempts: int


class DecomposeStage:
    """The per-unit work; the near-duplicate index of kept main questions lives across units."""

    def __init__(self, cfg: DecomposeConfig, ctx: StageContext[Decomposition]) -> None:
        self.cfg, self.ctx, self.teacher = cfg, ctx, ctx.teacher
        self.kept = NearDuplicates(cfg.dedup_threshold)
        self.prompts = ctx.refs(PROMPTS)
        for r in ctx.kept():  # an interrupted run's
            self.kept.add(r.id, signature(r.question, self.cfg.shingle))

    async def process(self, key: str, slot: Slot) -> UnitOutcome[Decomposition]:
        domain_json = slot.domain.model_dump_json()
        try:
            draft = await self._decompose(slot, domain_json)
        except TeacherRejected as exc:
            return self._no(slot, key, exc.code, exc.detail, raw=exc.raw_text)
        problem = chain_problem(
            draft.question, draft.answer, draft.steps, self.cfg.min_steps, self.cfg.max_steps
        ) or self._duplicate(draft.question)
        if problem is not None:
            return self._no(slot, key, *problem, raw=draft.raw)
        steps = topological_order(draft.steps)
        try:
            verdicts = await gather(self._necessity(draft, s, steps, domain_json) for s in steps)
        except TeacherRejected as exc:
            return self._no(slot, key, exc.code, exc.detail, raw=exc.raw_text)
        steps = [
            s.model_copy(update={"needs_tool": v.needs_tool, "necessity_reason": v.reason})
            for s, (v, _) in zip(steps, verdicts, strict=True)
        ]
        problem = necessity_problem(steps)
        if problem is not None:
            return self._no(slot, key, *problem, raw=draft.raw)
        try:
            answer = await self.teacher.ask(
                VERIFY, VerifyScores, domain_json=domain_json, question=draft.question,
                answer=draft.answer, steps=[s.model_dump() for s in steps], layers=layers(steps),
                decomposition_json=_chain_json(draft, steps),
            )  # fmt: skip
        except TeacherRejected as exc:
            return self._no(slot, key, exc.code, exc.detail, raw=exc.raw_text)
        scores = answer.value.scores()
        low = low_scores(scores, self.cfg.min_scores, self.cfg.min_overall)
        if low:
            return self._no(slot, key, "low_score", "; ".join(low), raw=answer.raw, scores=scores)
        # no await from here to the commit: the index and the journal stay in step
        problem = self._duplicate(draft.question)
        if problem is not None:
            return self._no(slot, key, *problem, raw=draft.raw)
        self.kept.add(key, signature(draft.question, self.cfg.shingle))
        attempts = {DECOMPOSE: draft.attempts, VERIFY: answer.attempts,
                    NECESSITY: [n for _, n in verdicts]}  # fmt: skip
        return UnitOutcome([self._record(key, slot, draft, steps, scores, attempts)])

    def _no(self, slot: Slot, key: str, reason: str, detail: str, **kw: Any) -> UnitOutcome[Any]:
        return UnitOutcome(rejections=[_reject(slot.source, key, reason, detail, **kw)])

    def _duplicate(self, question: str) -> tuple[str, str] | None:
        hit = self.kept.query(signature(question, self.cfg.shingle))
        if hit is None:
            return None
        return "near_duplicate", f"similarity {hit[1]:.2f} with {hit[0]}: {question[:160]!r}"

    async def _decompose(self, slot: Slot, domain_json: str) -> _Draft:
        seed = slot.seed.model_dump() if slot.seed else None
        seed_json = slot.seed.model_dump_json(exclude_none=True) if slot.seed else "null"
        answer = await self.teacher.ask(
            DECOMPOSE, DraftChain, domain=slot.domain.model_dump(), domain_json=domain_json,
            seed=seed, seed_json=seed_json,
            focus=FOCI[slot.index % len(FOCI)], index=slot.index,
            min_steps=self.cfg.min_steps, max_steps=self.cfg.max_steps,
        )  # fmt: skip
        v = answer.value
        steps = [
            SubQuestion(id=s.id, question=s.question.strip(), answer=s.answer.strip(),
                        depends_on=s.depends_on)
            for s in v.subquestions
        ]  # fmt: skip
        question = slot.seed.question if slot.seed else v.question
        final = slot.seed.answer if slot.seed and slot.seed.answer else v.answer
        return _Draft(question.strip(), final.strip(), steps, answer.raw, answer.attempts)

    async def _necessity(
        self, draft: _Draft, step: SubQuestion, steps: Sequence[SubQuestion], domain_json: str
    ) -> tuple[Necessity, int]:
        known = [s.model_dump() for s in steps if s.id in step.depends_on]
        view = step.model_dump(include={"id", "question", "depends_on"})
        answer = await self.teacher.ask(
            NECESSITY, Necessity, domain_json=domain_json, known=known,
            question_json=json.dumps(draft.question, ensure_ascii=False),
            step_json=json.dumps({**view, "answer": step.answer}, ensure_ascii=False),
        )  # fmt: skip
        return answer.value, answer.attempts

    def _record(
        self, key: str, slot: Slot, draft: _Draft, steps: list[SubQuestion],
        scores: dict[str, float], attempts: dict[str, Any],
    ) -> Decomposition:  # fmt: skip
        detail: dict[str, Any] = {"attempts": attempts}
        if slot.seed is None:
            detail |= {"index": slot.index, "focus": FOCI[slot.index % len(FOCI)]}
        source = slot.seed.key() if slot.seed else slot.domain.name
        prov = self.ctx.provenance([source], prompts=self.prompts, detail=detail)
        return Decomposition(
            id=key, domain=slot.domain.name, question=draft.question, answer=draft.answer,
            subquestions=steps, scores=scores, provenance=prov.model_dump(mode="json"),
        )  # fmt: skip


def _chain_json(draft: _Draft, steps: Sequence[SubQuestion]) -> str:
    view = [s.model_dump(exclude={"necessity_reason"}) for s in steps]
    chain = {"question": draft.question, "answer": draft.answer, "subquestions": view}
    return json.dumps(chain, ensure_ascii=False)


# ------------------------------------------------------------------ the run


async def synth_decompose(cfg: DecomposeConfig, progress: Progress | None = None) -> DecomposeStats:
    """Decompositions for the domains and seeds of ``cfg`` (this shard's) into ``cfg.out``."""
    slots, rejected, files = read_sources(
        domains=cfg.domains, taxonomy=cfg.taxonomy, seeds=cfg.seeds, per_domain=cfg.per_domain,
        stage=STAGE,
    )  # fmt: skip
    selected = [(k, s) for k, s in slots if cfg.holds(k)]
    spec = TeacherStage(
        name=STAGE, units=selected, inputs=files, prompts=PROMPTS,
        output=DECOMPOSITIONS_FILE, record=Decomposition, stats=DecomposeStats,
        start=lambda ctx: DecomposeStage(cfg, ctx).process, count=_count, rejected=rejected,
        stats_fields={
            "units": len(selected),
            "domains": len({s.domain.name for _, s in selected if s.seed is None}),
            "seeds": sum(s.seed is not None for _, s in selected),
            "thresholds": {**cfg.min_scores, "overall": cfg.min_overall},
        },
    )  # fmt: skip
    return await run_teacher_stage(cfg, spec, progress)


def _count(stats: DecomposeStats, run: StageRun[Decomposition], order: Sequence[str]) -> None:
    records = [r for unit in order for r in run.records(unit)]
    judged = [r.scores for r in records]
    judged += [x.scores for u in order if u in run.units for x in run.units[u].rejections]
    stats.scores = score_stats([s for s in judged if s], [r.scores for r in records])
    stats.decompositions = len(records)
    groups = [layers(r.subquestions) for r in records]
    stats.by_domain = tally(r.domain for r in records)
    stats.steps = tally((str(len(r.subquestions)) for r in records), int)
    stats.depth = tally((str(len(g)) for g in groups), int)
    stats.with_parallel_steps = sum(any(len(g) > 1 for g in gs) for gs in groups)
    steps = [s for r in records for s in r.subquestions]
    stats.tool_steps = sum(bool(s.needs_tool) for s in steps)
    stats.reasoning_steps = sum(s.needs_tool is False for s in steps)
