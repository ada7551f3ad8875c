"""Stage B.4–B.5, env-code: for each decomposed question, the tools of its environment,
written by the teacher and proven in the sandbox, then merged.

One unit is one :class:`~training.synth.envs.records.Decomposition`. For each sub-question
that needs a tool (``needs_tool`` not false), concurrently, the teacher writes a tool
(``prompts/env_code.v1.jinja``): an OpenAI function schema, a standard-library Python function
of that name holding its mock data, and the reference arguments of the call that answers the
sub-question (from the sub-question or the earlier answers it depends on). The tool is kept
only when :func:`~training.synth.envs.sandboxed.check_tool` accepts it — it compiles, imports
the standard library only, loads and runs in the bubblewrap sandbox within the limits without
trying what the sandbox refuses (even inside ``try/except``), leaving a thread running or
printing more than ``sandbox.max_printed_chars``, and the reference call's output contains the
sub-answer (and, with ``probe``, the same call made blind — the task's values in its arguments
replaced, in a fresh state — does not, whatever the tool's signature). Otherwise the teacher
is asked again with the failure (the sandbox's message, or "does not contain the
sub-answer"), at most ``max_retries`` more times; then the record is
rejected with that failure's reason (one rejection per failing sub-question, id
``<record>/<sub-question>``, the last reply kept). A reply that is not the requested JSON in
``teacher.max_attempts`` tries rejects it as ``env_code:<problem>``; a record with no step
that needs a tool as ``no_tool_step``.

Then the tools are merged (:mod:`training.synth.envs.merge`, ``merge``: ``teacher`` — the
rule, then the teacher's proposals; ``rule``; ``off``) and their names made unique. A merge
that fails its checks is dropped (``merge_failed``, the record is kept).

Output (``OUT``): ``envs.jsonl`` (:class:`EnvRecord`: the tools with their sources, the
reference steps in dependency order with their outputs), ``rejections.jsonl``,
``stats.json`` (:class:`EnvCodeStats`). ``astra-train synth arenas`` turns it into arena
records.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.sandbox import SandboxLimits
from training.synth.envs.merge import MERGE, merge_by_rule, merge_by_teacher, unique_names
from training.synth.envs.records import Decomposition, SubQuestion
from training.synth.envs.sandboxed import (
    NAME_PATTERN,
    Call,
    EnvStep,
    EnvTool,
    Failure,
    check_tool,
    cut,
    require_sandbox,
)
from training.synth.inputs import read_stage_output
from training.synth.runner import (
    StageContext,
    TeacherStage,
    TeacherStageConfig,
    TeacherStageStats,
    gather,
    run_teacher_stage,
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

STAGE = "env_code"
ENVS_FILE = "envs.jsonl"
ENV_CODE = "env_code"  # the prompt template
PROMPTS = (ENV_CODE, MERGE)
DECOMPOSE_STAGE = "decompose"
DECOMPOSITIONS_FILE = "decompositions.jsonl"
MergeMode = Literal["teacher", "rule", "off"]


class ToolDraft(BaseModel):
    """What the teacher returns for one sub-question."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(min_length=1, max_length=2000)
    parameters: dict[str, Any]
    code: str = Field(min_length=1, max_length=60_000)
    arguments: dict[str, Any]


class EnvRecord(BaseModel):
    """The environment of one decomposed question."""

    model_config = ConfigDict(extra="ignore")

    id: str  # the decomposition's id
    domain: str
    question: str
    answer: str
    tools: list[EnvTool]
    steps: list[EnvStep]  # the reference chain, in dependency order
    reasoning: list[str] = Field(default_factory=list)  # sub-questions answered without a tool
    provenance: Provenance | None = None


class CheckLimits(SandboxLimits):
    """The sandbox's limits while a tool is checked: a mock-data lookup that needs seconds is
    broken, so the time limits are shorter than an episode's."""

    wall_seconds_per_call: float = Field(
        5.0, gt=0, le=600, allow_inf_nan=False, description="seconds a checked tool call may take"
    )
    load_seconds_per_tool: float = Field(5.0, gt=0, le=600, allow_inf_nan=False)
    # A tool returns its result; what it prints (at load or per call) beyond this is refused.
    max_printed_chars: int = Field(8192, ge=0)


class EnvCodeConfig(TeacherStageConfig):
    """``astra-train synth env-code``."""

    KNOBS = TeacherStageConfig.KNOBS | {"sandboxes"}

    decompositions: list[Path] = Field(
        min_length=1,
        description="`synth decompose` outputs or decompositions JSONL files (repeatable)",
    )
    max_retries: int = Field(3, ge=0, description="sandbox rounds after the first, per tool")
    # Off by default: the arena reward (ASTRA's) counts solved *tools*, so a merged tool that
    # serves k sub-questions is one required tool but k calls, and a model that does everything
    # right scores 2T/(T+S) < 1 (T tools, S reference calls). Merge for tool-pool realism only.
    merge: MergeMode = Field(
        "off",
        description="merge same-intent tools: teacher (rule, then teacher), rule (identical "
        "schemas only) or off (the arena reward counts tools, so a merged tool serving k "
        "sub-questions caps the best reward below 1)",
    )
    probe: bool = Field(True, description="refuse tools that give the answer without the task")
    sandbox: CheckLimits = Field(default_factory=CheckLimits)
    sandboxes: int = Field(4, ge=1, description="sandboxes running at once")
    feedback_chars: int = Field(6000, ge=200, description="of the rejected attempt, sent back")


class EnvCodeStats(TeacherStageStats):
    decompositions: int = 0
    environments: int = 0
    tool_steps: int = 0  # reference calls over the kept environments
    tools: int = 0  # after merging
    merged: dict[str, int] = Field(default_factory=dict)  # merges made, by "rule" / "teacher"
    rounds: dict[str, int] = Field(default_factory=dict)  # sandbox rounds a kept tool took

    def summary(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [
            ("decompositions", self.decompositions),
            ("environments kept", self.environments),
            ("reference calls", self.tool_steps),
            ("tools (after merging)", self.tools),
        ]
        rows += [(f"  merged by {how}", n) for how, n in self.merged.items()]
        return rows + [(f"tools proven in round {n}", k) for n, k in self.rounds.items()]

    def warning(self) -> str | None:
        return None if self.environments else "no environment was kept"


# ------------------------------------------------------------------ the stage


@dataclass
class _Written:
    tool: EnvTool
    step: EnvStep
    rounds: int


class EnvCodeStage:
    """The per-record work of the stage."""

    def __init__(self, cfg: EnvCodeConfig, ctx: StageContext[EnvRecord]) -> None:
        self.cfg, self.ctx, self.teacher = cfg, ctx, ctx.teacher
        self.prompts = ctx.refs(PROMPTS)
        self.slots = asyncio.Semaphore(cfg.sandboxes)

    async def check(self, tool: EnvTool, calls: Sequence[Call]) -> list[str] | Failure:
        return await check_tool(
            tool.name, tool.source, tool.parameters, calls,
            limits=self.cfg.sandbox, probe=self.cfg.probe,
            max_printed=self.cfg.sandbox.max_printed_chars, slots=self.slots,
        )  # fmt: skip

    def _reject(self, d: Decomposition, rid: str, reason: str, detail: str, **kw: Any) -> Rejection:
        return Rejection(stage=STAGE, source=d.id, id=rid, reason=reason, detail=detail, **kw)

    async def process(self, key: str, d: Decomposition) -> UnitOutcome[EnvRecord]:
        subs = [s for s in d.subquestions if s.needs_tool is not False]
        if not subs:
            why = "no sub-question needs a tool"
            return UnitOutcome(rejections=[self._reject(d, d.id, "no_tool_step", why)])
        answers = {s.id: s.answer for s in d.subquestions}
        written = await gather(
            self._write(d, s, {dep: answers[dep] for dep in s.depends_on}) for s in subs
        )
        failed = [w for w in written if isinstance(w, Rejection)]
        if failed:
            return UnitOutcome(rejections=failed)
        done: list[_Written] = written
        tools, steps = [w.tool for w in done], [w.step for w in done]
        rejections: list[Rejection] = []
        notes: list[str] = []
        rounds = 0
        if self.cfg.merge != "off":
            tools, notes = await merge_by_rule(tools, steps, self.check)
        tools = unique_names(tools, steps)
        if self.cfg.merge == "teacher" and len(tools) >= 2:
            try:
                outcome = await merge_by_teacher(
                    self.teacher, tools, steps, self.check,
                    rounds=self.cfg.max_retries + 1, feedback_chars=self.cfg.feedback_chars,
                )  # fmt: skip
            except TeacherRejected as exc:
                rejections.append(self._reject(d, f"{d.id}:merge", exc.code, exc.detail,
                                               raw=exc.raw_text))  # fmt: skip
            else:
                tools, steps, rounds = outcome.tools, outcome.steps, outcome.rounds
                notes += outcome.failures
        for note in notes:
            rejections.append(self._reject(d, f"{d.id}:merge", "merge_failed", note))
        record = self._record(d, tools, steps, {w.step.subquestion: w.rounds for w in done})
        if record.provenance is not None:
            record.provenance.detail["merge_rounds"] = rounds
        return UnitOutcome([record], rejections)

    async def _write(
        self, d: Decomposition, sub: SubQuestion, inputs: dict[str, str]
    ) -> _Written | Rejection:
        """One tool for ``sub``: ask, check, ask again with the failure (bounded)."""
        rounds = self.cfg.max_retries + 1
        rid = f"{d.id}/{sub.id}"
        sub_json = json.dumps(
            {"id": sub.id, "question": sub.question, "answer": sub.answer,
             "depends_on": sub.depends_on}, ensure_ascii=False,
        )  # fmt: skip
        previous = error = raw = ""
        failure = Failure("no_answer", "not tried")
        for n in range(1, rounds + 1):
            try:
                answer = await self.teacher.ask(
                    ENV_CODE, ToolDraft, domain=d.domain, main_question=d.question, sub=sub,
                    inputs=inputs, sub_json=sub_json,
                    inputs_json=json.dumps(inputs, ensure_ascii=False),
                    attempt=n, attempts=rounds, previous=previous, error=error,
                )  # fmt: skip
            except TeacherRejected as exc:
                return self._reject(d, rid, exc.code, exc.detail, raw=exc.raw_text)
            draft, raw = answer.value, answer.raw
            tool = EnvTool(
                name=draft.name,
                description=draft.description,
                parameters=draft.parameters,
                source=draft.code,
                serves=[sub.id],
            )
            step = EnvStep(
                subquestion=sub.id, question=sub.question, tool=draft.name,
                arguments=draft.arguments, answer=sub.answer,
            )  # fmt: skip
            result = await self.check(tool, [step.call()])
            if not isinstance(result, Failure):
                step.output = result[0]
                return _Written(tool, step, n)
            failure = result
            previous = cut(draft.model_dump_json(), self.cfg.feedback_chars)
            error = failure.message
        detail = f"{sub.id}, after {rounds} tries: {failure.message}"
        keep = self.teacher.config.keep_raw_chars
        return self._reject(d, rid, failure.reason, detail, raw=cut(raw, keep))

    def _record(
        self, d: Decomposition, tools: list[EnvTool], steps: list[EnvStep], rounds: dict[str, int]
    ) -> EnvRecord:
        return EnvRecord(
            id=d.id,
            domain=d.domain,
            question=d.question,
            answer=d.answer,
            tools=tools,
            steps=steps,
            reasoning=[s.id for s in d.subquestions if s.needs_tool is False],
            provenance=self.ctx.provenance([d.id], prompts=self.prompts, detail={"rounds": rounds}),
        )


# ------------------------------------------------------------------ the run


async def synth_env_code(cfg: EnvCodeConfig, progress: Progress | None = None) -> EnvCodeStats:
    """Environments for the decompositions of ``cfg.decompositions`` (this shard's)."""
    require_sandbox()
    got = read_stage_output(
        cfg.decompositions, Decomposition, stage=STAGE, producer=DECOMPOSE_STAGE,
        file=DECOMPOSITIONS_FILE, duplicate="duplicate_record",
    )  # fmt: skip
    selected = [(d.id, d) for _, d in got.records if cfg.holds(d.id)]
    spec = TeacherStage(
        name=STAGE, units=selected, inputs=got.files, prompts=PROMPTS,
        output=ENVS_FILE, record=EnvRecord, stats=EnvCodeStats,
        start=lambda ctx: EnvCodeStage(cfg, ctx).process, count=_count, rejected=got.rejected,
        stats_fields={"decompositions": len(selected)},
    )  # fmt: skip
    return await run_teacher_stage(cfg, spec, progress)


def _count(stats: EnvCodeStats, run: StageRun[EnvRecord], order: list[str]) -> None:
    kept = [r for unit in order for r in run.records(unit)]
    stats.environments = len(kept)
    stats.tool_steps = sum(len(r.steps) for r in kept)
    stats.tools = sum(len(r.tools) for r in kept)
    stats.merged = tally(t.merged for r in kept for t in r.tools if t.merged)
    rounds = [r.provenance.detail.get("rounds", {}) if r.provenance else {} for r in kept]
    stats.rounds = tally((str(n) for rs in rounds for n in rs.values()), int)
