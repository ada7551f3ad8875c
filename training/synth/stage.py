"""What every synthesis stage shares: its output directory, provenance, rejections and resume.

A stage reads its inputs, cuts the work into *units* (a server, a tool's outgoing edges, one
chain) and commits each finished unit as one line of ``OUT/.journal.jsonl`` (the unit's records
and rejections together, appended whole: a killed run never leaves half a unit behind). At the
end the outputs are written from the journal under temporary names and renamed into place,
``stats.json`` last: its presence marks the run complete and carries its fingerprint (what the
run depends on: the inputs' bytes, the parameters, the format). ``--resume`` continues an
unfinished run with the same fingerprint, skipping committed units; a complete one is left as
it is. Without ``--overwrite`` or ``--resume`` a directory that already holds outputs is
refused.

Every record carries a :class:`Provenance`: the stage, the run's fingerprint (``stats.json``
beside it holds the inputs and parameters), the code version and the ids of the records it was
made from.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field, ValidationError

from astra_agent.claim import Claim, Refusal, one_line
from astra_agent.errors import AstraError, ConfigError, ServerError
from astra_agent.options import version
from astra_agent.runio import (
    append_jsonl,
    drop_torn_tail,
    dumps_json,
    file_sha256,
    jsonl_lines,
    write_lines_atomic,
)
from astra_agent.watch import EndpointWatch
from eval.runner import run_workers
from training.synth.teacher import TeacherRejected, TokenCount, track_usage

log = logging.getLogger(__name__)

FORMAT = 1
JOURNAL = ".journal.jsonl"
RUN_STATE = ".run.json"
STATS = "stats.json"
REJECTIONS = "rejections.jsonl"
Progress = Callable[[int, int], None]  # (units done, units in all)

R = TypeVar("R", bound=BaseModel)
S = TypeVar("S", bound="StageStats")
K = TypeVar("K")


class SynthError(AstraError):
    """A synthesis run produced nothing usable (every input rejected, every server failed)."""


class Provenance(BaseModel):
    """Where a record comes from."""

    stage: str
    run: str  # the run's fingerprint; stats.json beside the record holds inputs and parameters
    code_version: str
    inputs: list[str] = Field(default_factory=list)  # ids of the records this one was made from
    detail: dict[str, Any] = Field(default_factory=dict)  # this record's own parameters
    # stages that ask a teacher: the templates (name → "name.vN"), the teacher (served model
    # and sampling) and when the record was made
    prompts: dict[str, str] = Field(default_factory=dict)
    teacher: dict[str, Any] | None = None
    created: str = ""


class Rejection(BaseModel):
    """Something a stage could not use, and why (``reason`` is a fixed code)."""

    stage: str
    source: str  # "file:line", a server's name, a tool's id
    id: str = ""
    reason: str
    detail: str = ""
    raw: str | None = None  # the teacher's reply that was refused (cut), where there was one
    scores: dict[str, float] = Field(default_factory=dict)  # a judge's scores, where judged


class InputFile(BaseModel):
    path: str
    sha256: str


class StageStats(BaseModel):
    """``stats.json``: common to every stage; each stage adds its own counts."""

    stage: str
    format: int = FORMAT
    fingerprint: str = ""
    code_version: str = ""
    inputs: list[InputFile] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)
    records: int = 0
    rejections: dict[str, int] = Field(default_factory=dict)
    resumed_units: int = 0  # units taken from an earlier, interrupted run
    finished: str = ""

    def summary(self) -> list[tuple[str, Any]]:
        """The rows of the stage's summary table (the CLI adds the rest: teacher tokens,
        resumed units, rejections)."""
        return [("records", self.records)]

    def warning(self) -> str | None:
        """What to warn about after the run (nothing was kept), if anything."""
        return None


def fingerprint(stage: str, inputs: list[InputFile], params: Mapping[str, Any]) -> str:
    keep = {
        "stage": stage,
        "format": FORMAT,
        "inputs": [i.sha256 for i in inputs],
        "params": dict(params),
    }
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def _other_run(old: Any, new: Any) -> list[str]:
    """A stage's fingerprints differ as a whole (a digest): both named."""
    return [] if old == new else [f"fingerprint {old}, this run {new}"]


_CODE_VERSION: str | None = None


def code_version() -> str:
    """The package version and a digest of the stages' code (this module, the runner, the
    shared text helpers, ``synth/tools``, ``synth/envs``)."""
    global _CODE_VERSION
    if _CODE_VERSION is None:
        h = hashlib.sha256()
        root = Path(__file__).parent
        stages = [*sorted((root / "tools").glob("*.py")), *sorted((root / "envs").glob("*.py"))]
        for path in [Path(__file__), root / "runner.py", root / "text.py", *stages]:
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
        _CODE_VERSION = f"{version()}+synth.{h.hexdigest()[:10]}"
    return _CODE_VERSION


@dataclass(frozen=True)
class Shard:
    """``i/N``: this run does the units whose key hashes to ``i`` modulo ``N``."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str | None) -> Shard:
        if not text:
            return cls()
        try:
            i, n = (int(part) for part in text.split("/"))
        except ValueError:
            raise ConfigError(f"--shard {text!r}: write it as i/N, e.g. 0/4") from None
        if n < 1 or not 0 <= i < n:
            raise ConfigError(f"--shard {text!r}: needs N ≥ 1 and 0 ≤ i < N")
        return cls(i, n)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, key: str) -> bool:
        if self.count == 1:
            return True
        digest = hashlib.sha256(key.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index


def provenance(stage: str, run: str, inputs: Iterable[str], **fields: Any) -> Provenance:
    """A record's :class:`Provenance`, made by this code version."""
    return Provenance(
        stage=stage, run=run, code_version=code_version(), inputs=list(inputs), **fields
    )


def tally(keys: Iterable[K], order: Callable[[K], Any] | None = None) -> dict[K, int]:
    """How often each key occurs: in the order first seen, or sorted by ``order(key)``."""
    counts = Counter(keys)
    return dict(sorted(counts.items(), key=lambda kv: order(kv[0])) if order else counts)


def jsonl(records: Iterable[BaseModel]) -> Iterable[str]:
    for r in records:
        yield r.model_dump_json() + "\n"


def check_out(out: Path, inputs: Sequence[Path], flag: str) -> None:
    """Refuse an ``--out`` that is also one of the stage's inputs."""
    resolved = out.resolve()
    for p in inputs:
        if p.resolve() == resolved:
            raise ConfigError(f"--out {out} is also a {flag}", hint="write into another directory")


def read_stats(directory: Path, stage: str) -> dict[str, Any]:
    """The ``stats.json`` of a complete ``stage`` run in ``directory`` (an input of a later
    stage), or a ConfigError that says what the directory holds instead."""
    path = directory / STATS
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory", hint=f"name the --out of `{stage}`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        hint = f"run `astra-train synth {stage}` into it (or finish it with --resume)"
        raise ConfigError(f"{directory} holds no complete {stage} run", hint=hint) from None
    if not isinstance(data, dict) or data.get("stage") != stage:
        what = data.get("stage") if isinstance(data, dict) else None
        raise ConfigError(f"{directory} holds a {what or 'unknown'} run, not a {stage} run")
    return data


class _Unit(BaseModel):
    unit: str
    records: list[dict[str, Any]] = Field(default_factory=list)
    rejections: list[Rejection] = Field(default_factory=list)
    usage: dict[str, TokenCount] = Field(default_factory=dict)  # teacher tokens, by prompt


@dataclass(eq=False)
class StageRun(Generic[R]):
    """One stage's run in an output directory: checks, the journal, resume, the final write.

    ``complete`` is set when ``resume`` found the same run already finished (``stats`` then
    holds its stats.json); the stage has nothing to do.
    """

    out: Path
    _: KW_ONLY
    stage: str
    output: str
    record_type: type[R]
    fingerprint: str
    overwrite: InitVar[bool] = False
    resume: InitVar[bool] = False
    extra_outputs: InitVar[tuple[str, ...]] = ()
    fsync: bool = False
    units: dict[str, _Unit] = dataclass_field(default_factory=dict, init=False)
    complete: bool = dataclass_field(default=False, init=False)
    stats: dict[str, Any] = dataclass_field(default_factory=dict, init=False)

    def __post_init__(self, overwrite: bool, resume: bool, extra_outputs: tuple[str, ...]) -> None:
        if overwrite and resume:
            raise ConfigError("--overwrite and --resume exclude each other")
        self.names = (self.output, *extra_outputs, REJECTIONS, STATS, JOURNAL, RUN_STATE)
        self._prepare(overwrite, resume)

    # ------------------------------------------------------------------ start

    def _prepare(self, overwrite: bool, resume: bool) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out} is a file, not a directory")
        if overwrite:
            for name in self.names:
                (out / name).unlink(missing_ok=True)
        elif out.is_dir() and any(out.iterdir()):
            self._check_existing(resume)
            if self.complete:
                return
        state = {"stage": self.stage, "fingerprint": self.fingerprint, "code": code_version()}
        self._claim(RUN_STATE, done=False).write(state)

    def _claim(self, name: str, *, done: bool) -> Claim:
        """The claim of a complete run (``stats.json``) or an unfinished one (``.run.json``)."""
        what = "a complete" if done else "an unfinished"
        refusal = Refusal(
            f"{{dir}} holds {what} {self.stage} run of other inputs or parameters "
            "({differences})",
            hint="choose another --out, or pass --overwrite",
        )
        return Claim(self.out, name, self.fingerprint, refusal, "fingerprint", _other_run, one_line)

    def _check_existing(self, resume: bool) -> None:
        out = self.out
        for name, done in ((STATS, True), (RUN_STATE, False)):
            claim = self._claim(name, done=done)
            old = claim.recorded()
            if old is None:
                continue
            what = "a complete" if done else "an unfinished"
            stage = old.get("stage") if isinstance(old, dict) else None
            if stage != self.stage:
                raise ConfigError(
                    f"{out} holds {what} {stage or 'unknown'} run",
                    hint="choose another --out, or pass --overwrite",
                )
            if not resume:
                hint = (
                    "choose another --out, or pass --overwrite to replace it"
                    if done
                    else "pass --resume to continue it, or --overwrite to start over"
                )
                raise ConfigError(f"{out} holds {what} {self.stage} run", hint=hint)
            claim.refuse_other(old)
            if done:
                self.complete, self.stats = True, old
            else:
                self._load_journal(old.get("code"))
            return
        raise ConfigError(
            f"{out} is not empty and holds no {self.stage} run",
            hint="choose another --out, or pass --overwrite",
        )

    def _load_journal(self, code: str | None) -> None:
        path = self.out / JOURNAL
        if code != code_version():
            log.warning(
                "resuming a %s run made by code %s with %s", self.stage, code, code_version()
            )
        if drop_torn_tail(path):
            log.warning("%s: dropped a partial last unit (a killed writer)", path)
        if not path.is_file():
            return
        for n, line in enumerate(jsonl_lines(path.read_text(encoding="utf-8")), start=1):
            if not line.strip():
                continue
            try:
                unit = _Unit.model_validate_json(line)
            except ValidationError as exc:
                raise ConfigError(f"{path}:{n} is not a journal line: {exc}") from None
            self.units[unit.unit] = unit

    # ------------------------------------------------------------------ during the run

    def done(self, unit: str) -> bool:
        return unit in self.units

    def records(self, unit: str) -> list[R]:
        got = self.units.get(unit)
        return [self.record_type.model_validate(r) for r in got.records] if got else []

    def commit(
        self,
        unit: str,
        records: list[R],
        rejections: list[Rejection],
        usage: Mapping[str, TokenCount] | None = None,
    ) -> None:
        """Record a finished unit (one whole journal line) and the teacher tokens it took."""
        line = _Unit(
            unit=unit,
            records=[r.model_dump(mode="json") for r in records],
            rejections=rejections,
            usage=dict(usage or {}),
        )
        append_jsonl(self.out / JOURNAL, line, fsync=self.fsync)
        self.units[unit] = line

    # ------------------------------------------------------------------ the end

    def finish(
        self,
        stats: S,
        order: Iterable[str],
        *,
        rejections: Iterable[Rejection] = (),
        extra: Mapping[str, Iterable[BaseModel]] | None = None,
    ) -> S:
        """Write the outputs: the records of the units in ``order`` (others after them), the
        ``extra`` files, every rejection (the units' and ``rejections``) and, last, stats."""
        keys = list(dict.fromkeys([*order, *self.units]))
        units = [self.units[k] for k in keys if k in self.units]
        rejected = [r for u in units for r in u.rejections] + list(rejections)
        stats.records = sum(len(u.records) for u in units)
        stats.rejections = tally((r.reason for r in rejected), str)
        stats.finished = datetime.now(UTC).isoformat(timespec="seconds")

        def lines() -> Iterable[str]:
            for u in units:
                for r in u.records:
                    yield dumps_json(r, ensure_ascii=False) + "\n"

        write_lines_atomic(self.out / self.output, lines())
        for name, recs in (extra or {}).items():
            write_lines_atomic(self.out / name, jsonl(recs))
        write_lines_atomic(self.out / REJECTIONS, jsonl(rejected))
        write_lines_atomic(self.out / STATS, [stats.model_dump_json(indent=2) + "\n"])
        (self.out / JOURNAL).unlink(missing_ok=True)
        (self.out / RUN_STATE).unlink(missing_ok=True)
        return stats


def open_run(
    out: Path,
    stage: str,
    *,
    output: str,
    record_type: type[R],
    stats: type[S],
    inputs: Iterable[Path],
    params: Mapping[str, Any],
    overwrite: bool = False,
    resume: bool = False,
    extra_outputs: tuple[str, ...] = (),
    fsync: bool = False,
    writes: str | None = None,
    **fields: Any,
) -> tuple[StageRun[R], S]:
    """Open ``out`` for a ``stage`` run of the files ``inputs`` and ``params`` (its fingerprint:
    the files' bytes and the parameters), and its stats: the finished run's where
    ``run.complete`` (nothing is left to do), else new ones (``fields`` set, the units an
    interrupted run committed counted as resumed). ``writes``: the stage the directory holds
    for later stages, where it is not ``stage``."""
    files = [InputFile(path=str(p), sha256=file_sha256(p)) for p in inputs]
    run = StageRun(
        out, stage=writes or stage, output=output, record_type=record_type,
        fingerprint=fingerprint(stage, files, params), overwrite=overwrite, resume=resume,
        extra_outputs=extra_outputs, fsync=fsync,
    )  # fmt: skip
    if run.complete:
        return run, stats.model_validate(run.stats)
    return run, stats(
        stage=run.stage, fingerprint=run.fingerprint, code_version=code_version(),
        inputs=files, params=dict(params), resumed_units=len(run.units), **fields,
    )  # fmt: skip


# ------------------------------------------------------------------ units run concurrently

U = TypeVar("U")
UnitProcess = Callable[[str, U], Awaitable["UnitOutcome[R]"]]


@dataclass(frozen=True)
class UnitOutcome(Generic[R]):
    """What processing one unit gave: the records kept and the rejections (either may be
    empty; the unit is done either way)."""

    records: list[R] = dataclass_field(default_factory=list)
    rejections: list[Rejection] = dataclass_field(default_factory=list)


class UnitsFailed(ServerError):
    """Units could not be processed because the endpoint failed; the others are committed."""


@dataclass
class _Units(Generic[U, R]):
    run: StageRun[R]
    process: UnitProcess[U, R]
    total: int
    done: int
    watch: EndpointWatch  # units in a row the endpoint failed
    progress: Progress | None
    ran: int = 0
    failed: int = 0
    last_error: str = ""

    async def one(self, unit: tuple[str, U]) -> None:
        key, item = unit
        with track_usage() as usage:
            try:
                outcome = await self.process(key, item)
            except TeacherRejected as exc:
                reject = Rejection(
                    stage=self.run.stage, source=key, id=key, reason=exc.code,
                    detail=exc.detail, raw=exc.raw_text,
                )  # fmt: skip
                outcome = UnitOutcome(rejections=[reject])
            except ServerError as exc:  # the endpoint (EndpointError) or its replies failed
                self._endpoint_failed(key, exc)
                return
        self.watch.answered()
        self.run.commit(key, outcome.records, outcome.rejections, usage)
        self.ran += 1
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)

    def _endpoint_failed(self, key: str, exc: ServerError) -> None:
        """Never data: the unit stays undone (``--resume`` does it); N in a row stop the run."""
        self.failed += 1
        self.last_error = f"{key}: {exc.message}"
        log.warning("unit %s not done, the endpoint failed: %s", key, exc.message)
        if self.watch.failed():
            raise UnitsFailed(
                f"the endpoint failed {self.watch.in_a_row} units in a row (last: "
                f"{self.last_error}); "
                f"{self.done} of {self.total} units are committed",
                hint="rerun with --resume once the endpoint answers again",
            )


async def run_units(
    run: StageRun[R],
    units: Sequence[tuple[str, U]],
    process: UnitProcess[U, R],
    *,
    concurrency: int = 8,
    max_connection_failures: int = 5,
    progress: Progress | None = None,
) -> int:
    """Run ``process(key, item)`` over the units ``run`` has not committed yet, ``concurrency``
    at a time, and commit each whole (one journal line) with the teacher tokens it took
    (:func:`~training.synth.teacher.track_usage`); return how many this call processed.

    A :class:`~training.synth.teacher.TeacherRejected` escaping ``process`` rejects the whole
    unit (the raw reply kept). A failure of the endpoint (:class:`ServerError`) is never data:
    the unit stays undone, ``max_connection_failures`` in a row stop the run, and any such
    unit makes the call raise :class:`UnitsFailed` at the end (``--resume`` does them)."""
    keys = [k for k, _ in units]
    if len(set(keys)) != len(keys):
        raise ConfigError("unit keys are not unique")
    todo = [(k, item) for k, item in units if not run.done(k)]
    watch = EndpointWatch(max_connection_failures)
    state = _Units(run, process, len(units), len(units) - len(todo), watch, progress)
    if progress is not None:
        progress(state.done, state.total)
    await run_workers(todo, state.one, concurrency)
    if state.failed:
        raise UnitsFailed(
            f"{state.failed} unit(s) could not be done: the endpoint failed (last: "
            f"{state.last_error}); {state.done} of {state.total} units are committed",
            hint="rerun with --resume to do the rest",
        )
    return state.ran
