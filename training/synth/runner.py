"""The one teacher-stage runner: a :class:`TeacherStage` spec in, ``stats.json`` out.

Every stage that asks the teacher (``confirm``, ``check-chains``, ``tasks``, ``interact``,
``judge``, ``decompose``, ``env-code``) has the same skeleton, and it lives here once: a
:class:`~astra_agent.model.ChatModel` on the endpoint (checked first), a
:class:`~training.synth.teacher.Teacher`, the run's fingerprint (inputs, the stage's parameters,
the teacher's sampling and templates), the output directory (:class:`StageRun`: refusal,
resume, journal), the units run concurrently (:func:`run_units`), the stats with the teacher's
tokens, the final write. A stage reads its inputs, says what one unit does, and counts what it
kept — see :func:`run_teacher_stage`; ``synth/tools/judge.py`` is the shortest example.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from astra_agent.errors import ConfigError
from astra_agent.model import ChatModel, ModelConfig
from training.synth.stage import (
    Progress,
    Provenance,
    Rejection,
    Shard,
    StageRun,
    StageStats,
    UnitProcess,
    open_run,
    provenance,
    run_units,
)
from training.synth.teacher import Teacher, TeacherConfig, TeacherRejected, TokenCount
from training.synth.teacher import teacher_provenance as teacher_info

R = TypeVar("R", bound=BaseModel)
S = TypeVar("S", bound="TeacherStageStats")
U = TypeVar("U")
K = TypeVar("K", bound=str)


def _is_path(annotation: Any) -> bool:
    """``Path``, ``Path | None``, ``list[Path]``: a stage's input files or directories."""
    return annotation is Path or any(_is_path(a) for a in get_args(annotation))


class RunConfig(BaseModel):
    """What every stage run takes. A stage adds its inputs (``Path`` fields: the bytes of the
    files read are fingerprinted) and its parameters: every other field that is not one of
    ``KNOBS`` (how the run goes, not what it gives); they are fingerprinted and kept in
    ``stats.json``."""

    model_config = ConfigDict(extra="forbid")
    KNOBS: ClassVar[frozenset[str]] = frozenset({"out", "resume", "overwrite"})

    out: Path
    resume: bool = Field(
        False, description="continue an interrupted run in --out (same inputs and parameters)"
    )
    overwrite: bool = Field(False, description="replace the outputs of an earlier run in --out")

    def params(self) -> dict[str, Any]:
        """What the results depend on (a teacher stage's run adds the teacher's part)."""
        fields = type(self).model_fields.items()
        own = {k for k, f in fields if k not in self.KNOBS and not _is_path(f.annotation)}
        return self.model_dump(mode="json", include=own)


class StageConfig(RunConfig):
    """A run over units that can be split between machines (``shard``)."""

    KNOBS = RunConfig.KNOBS | {"shard"}
    shard: str | None = Field(
        None, description="only the units whose key hashes to i, given as i/N (0-based)"
    )

    @model_validator(mode="after")
    def _shard(self) -> StageConfig:
        Shard.parse(self.shard)
        return self

    def params(self) -> dict[str, Any]:
        return {**super().params(), "shard": self.shard}

    def holds(self, key: str) -> bool:
        """Whether the unit ``key`` is this shard's."""
        return Shard.parse(self.shard).holds(key)


class TeacherStageConfig(StageConfig):
    """What every teacher stage takes: a stage's, the endpoint and the teacher."""

    KNOBS = StageConfig.KNOBS | {"concurrency", "model", "teacher", "max_connection_failures"}
    concurrency: int = Field(8, ge=1, description="units at once")
    model: ModelConfig = Field(default_factory=ModelConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    max_connection_failures: int = Field(5, ge=1)


class TeacherStageStats(StageStats):
    """``stats.json`` of a teacher stage: the common part, the teacher and its tokens."""

    teacher: dict[str, Any] = Field(default_factory=dict)
    tokens: dict[str, TokenCount] = Field(default_factory=dict)  # by prompt ("tasks.v1")
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class StageContext(Generic[R]):
    """What a stage's unit work is built from, once the run is open."""

    stage: str
    cfg: TeacherStageConfig
    model: ChatModel
    teacher: Teacher
    run: StageRun[R]
    run_id: str
    info: dict[str, Any]  # the teacher as provenance records it
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def refs(self, names: Iterable[str]) -> dict[str, str]:
        """The templates' refs by name (``tasks`` → ``tasks.v1``)."""
        return {name: self.teacher.prompt(name).ref for name in names}

    def provenance(
        self,
        inputs: Sequence[str],
        *,
        prompts: Mapping[str, str] | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> Provenance:
        return provenance(
            self.stage,
            self.run_id,
            inputs,
            prompts=dict(prompts or {}),
            teacher=self.info,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            detail=dict(detail or {}),
        )

    def kept(self) -> Iterable[R]:
        """The records of the units an interrupted run committed."""
        return (r for unit in self.run.units for r in self.run.records(unit))


Extra = Mapping[str, Iterable[BaseModel]]  # more output files: name → records


@dataclass(frozen=True)
class TeacherStage(Generic[U, R, S]):
    """One teacher stage, for :func:`run_teacher_stage`.

    ``start`` builds the unit work once the run is open (it may be async, and register
    ``ctx.closers``); ``count`` fills the stage's own stats from the records of ``order`` (the
    teacher's tokens are the runner's) and may return ``extra`` output files."""

    name: str
    units: Sequence[tuple[str, U]]
    inputs: Sequence[Path]  # the files read
    prompts: tuple[str, ...]  # the templates asked (their hashes are fingerprinted)
    output: str
    record: type[R]
    stats: type[S]
    start: Callable[[StageContext[R]], UnitProcess[U, R] | Awaitable[UnitProcess[U, R]]]
    count: Callable[[S, StageRun[R], list[str]], Extra | None]
    stats_fields: Mapping[str, Any] = field(default_factory=dict)
    rejected: Sequence[Rejection] = ()  # of reading the inputs
    writes: str | None = None  # the stage the directory holds for later stages (default name)
    extra_outputs: tuple[str, ...] = ()
    agent: bool = False  # the model acts as an agent (the config says if calls are recovered)


async def run_teacher_stage(
    cfg: TeacherStageConfig, spec: TeacherStage[U, R, S], progress: Progress | None = None
) -> S:
    """Check the endpoint, open ``cfg.out`` (or find the same run complete there), run the
    units not committed yet, count, and write the outputs and ``stats.json``."""
    model = ChatModel(cfg.model) if spec.agent else ChatModel(cfg.model, recover_calls=False)
    closers: list[Callable[[], Awaitable[None]]] = []
    try:
        served = await model.check_model()
        teacher = Teacher(model, cfg.teacher)
        info = teacher_info(cfg.model, served)
        params = {**cfg.params(), "teacher": info}
        if spec.prompts:
            params |= teacher.fingerprint(spec.prompts)
        run, stats = open_run(
            cfg.out, spec.name, output=spec.output, record_type=spec.record, stats=spec.stats,
            inputs=spec.inputs, params=params, overwrite=cfg.overwrite, resume=cfg.resume,
            extra_outputs=spec.extra_outputs, writes=spec.writes, teacher=info,
            **spec.stats_fields,
        )  # fmt: skip
        if run.complete:
            return stats
        ctx = StageContext(spec.name, cfg, model, teacher, run, run.fingerprint, info, closers)
        process = spec.start(ctx)
        if inspect.isawaitable(process):
            process = await process
        await run_units(
            run, spec.units, process, concurrency=cfg.concurrency,
            max_connection_failures=cfg.max_connection_failures, progress=progress,
        )  # fmt: skip
    finally:
        for close in closers:
            await close()
        await model.close()
    order = [k for k, _ in spec.units]
    extra = spec.count(stats, run, order)
    stats.tokens = usage_totals(run)
    stats.prompt_tokens = sum(t.prompt_tokens for t in stats.tokens.values())
    stats.completion_tokens = sum(t.completion_tokens for t in stats.tokens.values())
    return run.finish(stats, order, rejections=spec.rejected, extra=extra)


# ------------------------------------------------------------------ small shared pieces


async def gather(coros: Iterable[Awaitable[Any]]) -> list[Any]:
    """All of them, to the end; then an exception is raised: an endpoint failure before a
    :class:`TeacherRejected` (a failed endpoint is never recorded as a rejection)."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    errors.sort(key=lambda e: isinstance(e, TeacherRejected))  # an endpoint failure first
    if errors:
        raise errors[0]
    return results


def parse_thresholds(values: Sequence[str], names: Sequence[str], flag: str, noun: str) -> Any:
    """``--min-score``-like values: ``N`` (every name) or ``name=N``, later ones winning."""
    out: dict[str, int] = {}
    for value in values:
        name, _, number = value.rpartition("=")
        if name and name not in names:
            raise ConfigError(f"{flag} {value!r}: no {noun} {name!r}", hint=", ".join(names))
        try:
            n = int(number)
        except ValueError:
            raise ConfigError(f"{flag} {value!r}: write N or NAME=N (1-5)") from None
        out |= dict.fromkeys([name] if name else list(names), n)
    return out


def fill_thresholds(
    given: Mapping[K, int], names: Sequence[K], default: int, key: str
) -> dict[K, int]:
    """A threshold for each of ``names`` (``default`` for one not ``given``), each 1..5."""
    out = {name: given.get(name, default) for name in names}
    if not all(1 <= v <= 5 for v in out.values()):
        raise ValueError(f"{key} must be within 1..5")
    return out


def usage_totals(run: StageRun[Any]) -> dict[str, TokenCount]:
    """Teacher tokens of every committed unit (an earlier, interrupted run's too), by prompt."""
    totals: dict[str, TokenCount] = {}
    for unit in run.units.values():
        for ref, count in unit.usage.items():
            totals.setdefault(ref, TokenCount()).add(count)
    return dict(sorted(totals.items()))


class ScoreReply(BaseModel):
    """A judge's reply: scores 1-5 by name (see :func:`score_reply`), and why."""

    model_config = ConfigDict(extra="forbid")
    if TYPE_CHECKING:  # declared last by score_reply: the order in which errors are listed
        reason: str

    def scores(self) -> dict[Any, int]:
        return {name: value for name, value in self if name != "reason"}


def score_reply(name: str, scores: Sequence[str]) -> type[ScoreReply]:
    """The reply model of a judge that scores ``scores``, 1-5 each (in this order), and says why."""
    fields: dict[str, Any] = {s: (int, Field(ge=1, le=5)) for s in scores}
    fields["reason"] = (str, Field("", max_length=2000))
    return create_model(name, __base__=ScoreReply, **fields)


class ScoreStats(BaseModel):
    """One score's distribution over everything judged, and over what was kept."""

    judged: int = 0
    mean: float | None = None
    histogram: dict[str, int] = Field(default_factory=dict)  # value → count, judged
    kept: int = 0
    kept_mean: float | None = None


def score_rows(scores: Mapping[str, ScoreStats]) -> list[tuple[str, Any]]:
    """Summary rows: each score's mean over everything judged and over what was kept."""
    return [(f"{n}: mean judged / kept", f"{s.mean} / {s.kept_mean}") for n, s in scores.items()]


def score_stats(
    judged: Iterable[Mapping[str, float]], kept: Iterable[Mapping[str, float]]
) -> dict[str, ScoreStats]:
    """Per score name: histogram and mean of ``judged`` (kept and rejected alike: what a user
    calibrates thresholds on) and the mean of ``kept``."""
    out: dict[str, ScoreStats] = {}
    for scores in judged:
        for name, value in scores.items():
            s = out.setdefault(name, ScoreStats())
            label = f"{value:g}"
            s.histogram[label] = s.histogram.get(label, 0) + 1
            s.mean = ((s.mean or 0.0) * s.judged + value) / (s.judged + 1)
            s.judged += 1
    for scores in kept:
        for name, value in scores.items():
            s = out.setdefault(name, ScoreStats())
            s.kept_mean = ((s.kept_mean or 0.0) * s.kept + value) / (s.kept + 1)
            s.kept += 1
    for s in out.values():
        s.histogram = dict(sorted(s.histogram.items(), key=lambda kv: float(kv[0])))
        s.mean = None if s.mean is None else round(s.mean, 3)
        s.kept_mean = None if s.kept_mean is None else round(s.kept_mean, 3)
    return dict(sorted(out.items()))
