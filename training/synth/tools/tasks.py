"""Stage 4, tasks: for each tool chain, user questions that need the chain, judged and filtered.

Per chain and per mode — ``diverse`` (free wording), ``constrained`` (concrete constraints the
answer must respect), ``persona`` (written as an invented person) — the teacher writes one
question that asks for the outcome without naming a tool (``prompts/tasks.v1.jinja``). Then,
cheapest first, a question is rejected when it

``names_tool``
    names a tool of its chain: an identifier-like name (``get_weather``, ``fileSearch``,
    ``v2.lookup``) anywhere as a word, a plain-word name (``search``) only where it is used
    as a name (```search```, ``search(``, "the search tool/function/API");
``contaminated``
    is too close to a BFCL-V3 multi-turn user question (Jaccard estimate ≥
    ``decontam_threshold``, default 0.5), read from the installed ``bfcl-eval`` data;
``near_duplicate``
    is too close to a question already kept (≥ ``dedup_threshold``, default 0.7), of any
    chain or mode, an interrupted run's included;
``low_score``
    scores under a threshold by the teacher's judge (``prompts/tasks_judge.v1.jinja``):
    tool-selection difficulty, uniqueness, question quality and realism, 1–5 each. Defaults:
    each at least 3 (``min_scores``) and their mean at least 3.5 (``min_mean``).
    ``stats.json`` holds each score's distribution over everything judged (kept and
    rejected) so that the thresholds can be calibrated on a first run;
``tasks:<problem>`` / ``tasks_judge:<problem>``
    no usable reply from the teacher in ``max_attempts`` tries (``not_json``, ``schema``,
    ``truncated``, ``too_long``, ``too_deep``, ``empty``; the raw reply is kept).

Similarity is :mod:`training.synth.text`'s MinHash over word shingles. Under concurrency,
which of two near-duplicates is kept depends on which is judged first.

Input: ``synth chains`` output directories (or ``chains.jsonl`` files) and the ``synth pool``
output the chains' tool ids come from. Output (``OUT``): ``tasks.jsonl`` (:class:`TaskRecord`,
id ``<chain>:<mode>``), ``rejections.jsonl``, ``stats.json`` (:class:`TaskStats`: counts by
mode, teacher tokens by prompt, score distributions).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from astra_agent.errors import ConfigError
from training.synth.runner import (
    ScoreReply,
    ScoreStats,
    StageContext,
    TeacherStage,
    TeacherStageConfig,
    TeacherStageStats,
    fill_thresholds,
    gather,
    parse_thresholds,
    run_teacher_stage,
    score_reply,
    score_rows,
    score_stats,
)
from training.synth.stage import (
    Progress,
    Provenance,
    Rejection,
    StageRun,
    UnitOutcome,
    tally,
)
from training.synth.teacher import TeacherRejected
from training.synth.text import NearDuplicates, quote, signature, similarity
from training.synth.tools.chains import PersonaQuestion, Question, ToolChain, read_chains
from training.synth.tools.pool import PoolInputs, ToolRecord, not_in_pool, read_tools, tool_view

STAGE = "tasks"
TASKS_FILE = "tasks.jsonl"
GENERATE, JUDGE = "tasks", "tasks_judge"  # the prompt templates
PROMPTS = (GENERATE, JUDGE)
TaskMode = Literal["diverse", "constrained", "persona"]
MODES: tuple[TaskMode, ...] = get_args(TaskMode)
ScoreName = Literal["tool_selection_difficulty", "uniqueness", "question_quality", "realism"]
SCORES: tuple[ScoreName, ...] = get_args(ScoreName)


# ------------------------------------------------------------------ what the teacher returns


JudgeScores = score_reply("JudgeScores", SCORES)


# ------------------------------------------------------------------ records, config, stats


class TaskRecord(BaseModel):
    """One kept question."""

    model_config = ConfigDict(extra="ignore")

    id: str  # "<chain id>:<mode>"
    chain: str
    mode: TaskMode
    question: str
    persona: str | None = None
    tools: list[str]  # pool ids, in call order (the records are in the pool)
    domain: str = ""
    scores: dict[str, int] = Field(default_factory=dict)
    judge_reason: str = ""
    provenance: Provenance | None = None


class TasksConfig(TeacherStageConfig):
    """``astra-train synth tasks``. Thresholds: every score at least ``min_scores`` (3 each by
    default; a name left out keeps its default) and the four's mean at least ``min_mean``."""

    chains: list[Path] = Field(
        min_length=1, description="`synth chains` outputs or JSONL files (repeatable)"
    )
    pool: PoolInputs
    modes: list[TaskMode] = Field(default_factory=lambda: list(MODES), min_length=1)
    min_scores: dict[ScoreName, int] = Field(default_factory=dict)
    min_mean: float = Field(3.5, ge=1, le=5, description="keep a mean of the four scores ≥ this")
    dedup_threshold: float = Field(
        0.7, gt=0, le=1, description="near-duplicate at this Jaccard estimate"
    )
    decontaminate: bool = Field(True, description="drop questions close to BFCL multi-turn")
    decontam_threshold: float = Field(
        0.5, gt=0, le=1, description="too close to BFCL at this Jaccard estimate"
    )
    shingle: int = Field(3, ge=1, le=8, description="words per shingle")

    @field_validator("modes")
    @classmethod
    def _unique(cls, modes: list[TaskMode]) -> list[TaskMode]:
        return list(dict.fromkeys(modes))

    @model_validator(mode="after")
    def _thresholds(self) -> TasksConfig:
        self.min_scores = fill_thresholds(self.min_scores, SCORES, 3, "min_scores")
        return self


parse_min_scores = partial(parse_thresholds, names=SCORES, flag="--min-score", noun="score")


class TaskStats(TeacherStageStats):
    chains: int = 0
    questions: int = 0
    by_mode: dict[str, int] = Field(default_factory=dict)
    scores: dict[str, ScoreStats] = Field(default_factory=dict)  # "overall": the four's mean
    bfcl_questions: int = 0  # the decontamination set

    def summary(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [("chains", self.chains), ("questions kept", self.questions)]
        rows += [(f"  {mode}", n) for mode, n in self.by_mode.items()]
        return rows + score_rows(self.scores)

    def warning(self) -> str | None:
        return None if self.questions else "no question was kept"


@cache
def bfcl_questions() -> tuple[tuple[str, str], ...]:
    """Every distinct user question of BFCL-V3 multi-turn: (``<entry id> turn <n>``, text)."""
    from eval.bfcl.official import CATEGORIES, load_category

    seen: dict[str, str] = {}
    for category in CATEGORIES:
        for entry in load_category(category):
            for turn, messages in enumerate(entry.question):
                for m in messages:
                    text = m.get("content")
                    if m.get("role") == "user" and isinstance(text, str) and text.strip():
                        seen.setdefault(text, f"{entry.id} turn {turn}")
    return tuple((label, text) for text, label in seen.items())


@cache
def bfcl_index(threshold: float, size: int) -> NearDuplicates:
    try:
        questions = bfcl_questions()
    except ConfigError as exc:
        raise ConfigError(
            f"decontamination needs the BFCL data: {exc.message}",
            hint="install bfcl-eval (make setup does), or pass --no-decontaminate",
        ) from None
    index = NearDuplicates(threshold)
    for label, text in questions:
        index.add(label, signature(text, size))
    return index


# ------------------------------------------------------------------ naming a tool

_IDENTIFIER = re.compile(r"[_.\-/0-9]|[a-z][A-Z]")


# The characters other than ASCII letters that ``re.IGNORECASE`` matches to an ASCII letter
# (İ ı ſ K, found by trying every code point; tests/training/test_synth_stage.py checks it).
_FOLDS_TO_ASCII = frozenset("\u0130\u0131\u017f\u212a")


def named_tool(question: str, tools: Sequence[ToolRecord]) -> str | None:
    """The first tool of ``tools`` the question names (see the module), or None."""
    # Both patterns of a name need the name itself in the question: where it cannot be there
    # (an ASCII name, and none of the few other characters that match an ASCII letter when
    # case is ignored), its patterns are neither compiled nor run.
    lowered = None if _FOLDS_TO_ASCII.intersection(question) else question.lower()
    for tool in tools:
        for name in dict.fromkeys((tool.name, tool.id)):
            if not name.strip():
                continue
            if lowered is not None and name.isascii() and name.lower() not in lowered:
                continue
            word, used = _name_patterns(name)
            if word is not None and word.search(question):
                return tool.name
            if used.search(question):
                return tool.name
    return None


@functools.lru_cache(maxsize=65536)
def _name_patterns(name: str) -> tuple[re.Pattern[str] | None, re.Pattern[str]]:
    """A tool name's two patterns, compiled once (a pool has more names than ``re``'s own
    cache holds: recompiling them was 11 % of the pipeline's CPU in bench/synth.py)."""
    n = re.escape(name)
    word = rf"(?<![\w.\-/]){n}(?![\w\-/]|\.\w)"
    used = rf"`{n}`|{word}\s*\(|\b(?:the\s+)?{n}\s+(?:tool|function|api|endpoint)\b"
    named = re.compile(word, re.IGNORECASE) if _IDENTIFIER.search(name) else None
    return named, re.compile(used, re.IGNORECASE)


# ------------------------------------------------------------------ the stage


@dataclass(frozen=True)
class _Draft:
    id: str
    mode: TaskMode
    question: str
    persona: str | None
    raw: str
    attempts: int
    sig: tuple[int, ...]


class TasksStage:
    """The per-chain work of the stage; its near-duplicate index lives across chains."""

    def __init__(
        self,
        cfg: TasksConfig,
        ctx: StageContext[TaskRecord],
        tools: Mapping[str, ToolRecord],
        bfcl: NearDuplicates | None,
    ) -> None:
        self.cfg, self.ctx, self.teacher, self.tools = cfg, ctx, ctx.teacher, tools
        self.bfcl = bfcl
        self.kept = NearDuplicates(cfg.dedup_threshold)
        self.prompts = ctx.refs(PROMPTS)
        for r in ctx.kept():  # an interrupted run's: near-duplicates of them are rejected
            self.kept.add(r.id, signature(r.question, self.cfg.shingle))

    def _reject(self, chain: ToolChain, rid: str, reason: str, detail: str, **kw: Any) -> Rejection:
        return Rejection(stage=STAGE, source=chain.id, id=rid, reason=reason, detail=detail, **kw)

    async def process(self, key: str, chain: ToolChain) -> UnitOutcome[TaskRecord]:
        if why := not_in_pool(chain.tools, self.tools):
            return UnitOutcome(rejections=[self._reject(chain, key, "unknown_tool", why)])
        tools = [self.tools[t] for t in chain.tools]
        view = tool_view(tools)
        drafts = await gather(self._draft(chain, view, mode) for mode in self.cfg.modes)
        rejections = [d for d in drafts if isinstance(d, Rejection)]
        screened: list[_Draft] = []
        for d in drafts:
            if isinstance(d, _Draft):
                problem = self._screen(chain, d, tools, screened)
                if problem is None:
                    screened.append(d)
                else:
                    rejections.append(problem)
        judged = await gather(self._judge(chain, view, d) for d in screened)
        records: list[TaskRecord] = []
        for d, verdict in zip(screened, judged, strict=True):
            if isinstance(verdict, Rejection):
                rejections.append(verdict)
                continue
            # no await from here to the commit: the index and the journal stay in step
            dup = self.kept.query(d.sig)
            if dup is not None:
                detail = f"similarity {dup[1]:.2f} with {dup[0]}: {quote(d.question)}"
                rejections.append(self._reject(chain, d.id, "near_duplicate", detail, raw=d.raw))
                continue
            self.kept.add(d.id, d.sig)
            records.append(self._record(chain, d, verdict))
        return UnitOutcome(records, rejections)

    async def _draft(
        self, chain: ToolChain, view: tuple[list[dict[str, Any]], str], mode: TaskMode
    ) -> _Draft | Rejection:
        rid = f"{chain.id}:{mode}"
        schema = PersonaQuestion if mode == "persona" else Question
        try:
            answer = await self.teacher.ask(
                GENERATE, schema, mode=mode, tools=view[0], tools_json=view[1]
            )
        except TeacherRejected as exc:
            return self._reject(chain, rid, exc.code, exc.detail, raw=exc.raw_text)
        q = answer.value
        persona = q.persona if isinstance(q, PersonaQuestion) else None
        text = q.question.strip()
        sig = signature(text, self.cfg.shingle)
        return _Draft(rid, mode, text, persona, answer.raw, answer.attempts, sig)

    def _screen(
        self, chain: ToolChain, d: _Draft, tools: Sequence[ToolRecord], earlier: Sequence[_Draft]
    ) -> Rejection | None:
        """The cheap checks, before the judge: a tool named, BFCL, a near-duplicate."""
        name = named_tool(d.question, tools)
        if name is not None:
            detail = f"names the tool {name!r}: {quote(d.question)}"
            return self._reject(chain, d.id, "names_tool", detail, raw=d.raw)
        hit = self.bfcl.query(d.sig) if self.bfcl is not None else None
        if hit is not None:
            detail = f"similarity {hit[1]:.2f} with BFCL {hit[0]}: {quote(d.question)}"
            return self._reject(chain, d.id, "contaminated", detail, raw=d.raw)
        dup = self.kept.query(d.sig)
        for e in earlier:
            sim = similarity(d.sig, e.sig)
            if sim >= self.cfg.dedup_threshold and (dup is None or sim > dup[1]):
                dup = (e.id, sim)
        if dup is not None:
            detail = f"similarity {dup[1]:.2f} with {dup[0]}: {quote(d.question)}"
            return self._reject(chain, d.id, "near_duplicate", detail, raw=d.raw)
        return None

    async def _judge(
        self, chain: ToolChain, view: tuple[list[dict[str, Any]], str], d: _Draft
    ) -> ScoreReply | Rejection:
        question_json = json.dumps(d.question, ensure_ascii=False)
        try:
            answer = await self.teacher.ask(
                JUDGE, JudgeScores, tools=view[0], tools_json=view[1], question_json=question_json
            )
        except TeacherRejected as exc:
            detail = f"{exc.detail}; question: {quote(d.question)}"
            return self._reject(chain, d.id, exc.code, detail, raw=exc.raw_text)
        scores = answer.value.scores()
        low = [f"{n} {v} < {self.cfg.min_scores[n]}" for n, v in scores.items()
               if v < self.cfg.min_scores[n]]  # fmt: skip
        mean = sum(scores.values()) / len(scores)
        if mean < self.cfg.min_mean:
            low.append(f"mean {mean:.2f} < {self.cfg.min_mean:g}")
        if low:
            detail = f"{'; '.join(low)}: {quote(d.question)}"
            return self._reject(
                chain, d.id, "low_score", detail, raw=answer.raw, scores=dict(scores)
            )
        return answer.value

    def _record(self, chain: ToolChain, d: _Draft, verdict: ScoreReply) -> TaskRecord:
        return TaskRecord(
            id=d.id,
            chain=chain.id,
            mode=d.mode,
            question=d.question,
            persona=d.persona,
            tools=list(chain.tools),
            domain=chain.domain,
            scores=verdict.scores(),
            judge_reason=verdict.reason,
            provenance=self.ctx.provenance(
                [chain.id], prompts=self.prompts, detail={"attempts": d.attempts}
            ),
        )


# ------------------------------------------------------------------ the run


async def synth_tasks(cfg: TasksConfig, progress: Progress | None = None) -> TaskStats:
    """Questions for the chains of ``cfg.chains`` (this shard's) into ``cfg.out``."""
    chains = read_chains(cfg.chains, STAGE)
    tools, pool_files = read_tools(cfg.pool, STAGE)
    bfcl = bfcl_index(cfg.decontam_threshold, cfg.shingle) if cfg.decontaminate else None
    selected = [(c.id, c) for _, c in chains.records if cfg.holds(c.id)]
    spec = TeacherStage(
        name=STAGE, units=selected, inputs=[*chains.files, *pool_files],
        prompts=PROMPTS, output=TASKS_FILE, record=TaskRecord, stats=TaskStats,
        start=lambda ctx: TasksStage(cfg, ctx, tools, bfcl).process, count=_count,
        rejected=chains.rejected, stats_fields={
            "chains": len(selected), "bfcl_questions": len(bfcl) if bfcl is not None else 0},
    )  # fmt: skip
    return await run_teacher_stage(cfg, spec, progress)


def _count(stats: TaskStats, run: StageRun[TaskRecord], order: Sequence[str]) -> None:
    records = [r for unit in order for r in run.records(unit)]
    judged: list[dict[str, float]] = [dict(r.scores) for r in records]
    judged += [dict(x.scores) for u in order if u in run.units for x in run.units[u].rejections]
    for scores in judged:
        if scores:
            scores["overall"] = sum(scores.values()) / len(scores)
    kept = [{**r.scores, "overall": sum(r.scores.values()) / len(r.scores)} for r in records]
    stats.questions = len(records)
    stats.by_mode = tally(r.mode for r in records)
    stats.scores = score_stats(judged, kept)
