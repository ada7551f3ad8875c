"""Run directories as readers (the report, comparisons) find them: which kind of run a directory
holds, and what is in it — read without changing anything, half-written runs included.

The eval kinds of :mod:`eval.kinds` and the two training kinds, told apart by the files their
writers leave:

* the eval kinds (``astra-eval``): ``config.json`` (the kind and the fingerprint; a run
  written before the kind was recorded is recognised by its fields:
  :class:`eval.run.Guess`), ``results.jsonl`` (one record per entry; the later of two
  with one id wins), ``summary.json`` (written at the end of a run);
* ``sft``, ``rl`` (``astra-train``): ``astra-sft.json`` / ``astra-rl.json`` (the fingerprint),
  ``metrics.jsonl`` (one record per logged step; verl's file logger writes a file per launch,
  ``verl-metrics/*.jsonl``, as ``{"step", "data"}``), ``final/`` once training finished
  (verl's: ``final-bf16/``, its converted last checkpoint).

A run that is still going, or was killed, is read as far as it goes: a torn last line is left
out, a missing ``summary.json`` is computed from the records, and :attr:`Run.problems` says
what was missing (:attr:`Run.partial` marks it). Nothing here writes to a run directory (the
eval's own reader cuts a torn tail; this one may be reading a run that is still appending).

A run directory may hold anything: files are read through :mod:`eval.runfiles` (regular files
only, bounded, symlink loops named), and what the report consumes is validated, strictly, before
it is used: each record against its eval's record class (fields this version does not know are
ignored), each metrics line for its step, each summary against its kind's model
(:attr:`eval.run.EvalKind.summary`). What does not validate is left out with a problem
naming the file and line, and the run is partial; :attr:`Run.usable` says whether anything is
left to show.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, cast

from pydantic import ConfigDict, ValidationError

from astra_agent.errors import ConfigError
from eval.kinds import KINDS as KINDS_BY_NAME
from eval.kinds import get_kind, guess_order, names
from eval.results import CONFIG, RESULTS, SUMMARY, EvalRecord
from eval.run import EvalKind, Run
from eval.runfiles import (
    JSON_LIMIT,
    JSONL_LIMIT,
    UnreadableFile,
    dir_problem,
    read_bounded,
    read_line,
    safe_resolve,
)

log = logging.getLogger(__name__)

RunKind = str  # an eval kind's name (eval.kinds) or a training kind
# The training writers' file names (training/ is not imported: it imports eval).
RUN_FILES: dict[RunKind, str] = {"sft": "astra-sft.json", "rl": "astra-rl.json"}
METRICS = "metrics.jsonl"
FINAL_DIR = "final"
VERL_METRICS_DIR = "verl-metrics"  # training.run.VERL_METRICS: a file per launch
VERL_FINAL_DIR = "final-bf16"  # what a verl run converts its last checkpoint into
_MAX_LAUNCHES = 1000


def _hint() -> str:
    return (
        f"pass directories written by `astra-eval {'|'.join(names())}` (config.json, "
        "results.jsonl, summary.json) or `astra-train sft|rl` (astra-sft.json or astra-rl.json, "
        "metrics.jsonl)"
    )


_FIRST_LINE_LIMIT = 64 << 20  # detection reads one record at most this long
_REASONS = 20  # reasons for skipped lines named per file; the rest are counted


# ------------------------------------------------------------------ detection


def detect_kind(path: Path) -> RunKind:
    """The kind of run ``path`` holds, by name; a ConfigError (with a hint) when it does not
    exist, is not a directory or holds none of our runs' files."""
    kind = _detect(Path(path))
    return kind.name if isinstance(kind, EvalKind) else kind


def _detect(path: Path) -> EvalKind | RunKind:
    """:func:`detect_kind`, an eval kind resolved (a training kind by its name)."""
    problem = dir_problem(path)
    if problem == "not found":
        raise ConfigError(f"run directory not found: {path}", hint=_hint())
    if problem:
        raise ConfigError(f"{path} is {problem}: not a run directory", hint=_hint())
    kind = _kind_of(path)
    if kind is None:
        raise ConfigError(
            f"{path} is not a run directory of astra-eval or astra-train: it holds none of "
            f"{SUMMARY}, {RESULTS}, {CONFIG}, {', '.join(RUN_FILES.values())}, {METRICS} "
            "(or they are not readable as ours)",
            hint=_hint(),
        )
    return kind


def _kind_of(path: Path) -> EvalKind | RunKind | None:
    for kind, name in RUN_FILES.items():
        if (path / name).is_file():
            return kind
    config = _json_file(path / CONFIG)
    if isinstance(config, dict) and isinstance(config.get("kind"), str):
        return get_kind(config["kind"])  # recorded since runs name their kind
    # Written before runs named their kind: told by the fields of what is there.
    summary = _json_file(path / SUMMARY)
    fp = config.get("fingerprint") if isinstance(config, dict) else None
    return (
        (_kind_from_keys(summary, summary=True) if isinstance(summary, dict) else None)
        or (_kind_from_fingerprint(fp) if isinstance(fp, dict) else None)
        or _kind_from_keys(_first_record(path / RESULTS) or {}, summary=False)
        or _training_kind(_first_record(path / METRICS) or {})
    )


def _eval_kind(value: Any) -> EvalKind | None:
    return KINDS_BY_NAME.get(value) if isinstance(value, str) else None


def _kind_from_keys(obj: dict[str, Any], *, summary: bool) -> EvalKind | None:
    """The kind a summary or a first record shows by its fields."""
    if _eval_kind(obj.get("kind")):
        return _eval_kind(obj.get("kind"))
    for kind in guess_order():
        if (kind.guess.summary if summary else kind.guess.record)(obj):
            return kind
    return None


def _kind_from_fingerprint(fp: dict[str, Any]) -> EvalKind | None:
    """config.json's fingerprint: what each eval's results depend on."""
    if _eval_kind(fp.get("kind")):
        return _eval_kind(fp.get("kind"))
    return next((k for k in guess_order() if k.guess.fingerprint(fp)), None)


def _training_kind(first: dict[str, Any]) -> RunKind | None:
    """A metrics.jsonl without its run file: RL steps carry rewards, SFT steps a loss."""
    if "abf" in first or "reward_mean" in first:
        return "rl"
    return "sft" if "loss" in first else None


def _loads(raw: bytes) -> tuple[Any, str | None]:
    """JSON from bytes, or why not."""
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    except RecursionError:
        return None, "is JSON nested too deeply"
    except ValueError:
        return None, "is not JSON"


def _read_json(path: Path) -> tuple[Any, str | None]:
    """A JSON file's value and, where it could not be read, why: (None, None) when missing."""
    try:
        raw = read_bounded(path, JSON_LIMIT)
    except UnreadableFile as exc:
        return None, f"cannot be read ({exc.reason})"
    return (None, None) if raw is None else _loads(raw)


def _json_file(path: Path) -> Any:
    """A JSON file's value, or None when it is missing or unreadable."""
    return _read_json(path)[0]


def _first_record(path: Path) -> dict[str, Any] | None:
    """The first JSON object of a JSONL file (None: missing, empty or not ours)."""
    try:
        raw = read_line(path, _FIRST_LINE_LIMIT)
    except UnreadableFile:
        return None
    obj = _loads(raw)[0] if raw is not None else None
    return obj if isinstance(obj, dict) else None


# ------------------------------------------------------------------ JSONL, tolerantly


@dataclass
class _Lines:
    """What a JSONL file held: the JSON objects, and the lines left out by reason."""

    objects: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # line number, obj
    bad: dict[str, list[int]] = field(default_factory=dict)  # reason → line numbers
    torn: bool = False
    unreadable: str | None = None  # why the file could not be read at all

    def skip(self, reason: str, n: int) -> None:
        self.bad.setdefault(reason, []).append(n)

    def problems(self, name: str) -> list[str]:
        out = []
        if self.unreadable:
            out.append(f"{name} cannot be read ({self.unreadable}): left out")
        if self.torn:
            out.append(
                f"{name}: the last line is cut off (a run still writing, or killed "
                "mid-write): left out"
            )
        reasons = list(self.bad.items())
        for reason, lines in reasons[:_REASONS]:
            shown = ", ".join(map(str, lines[:5])) + (", …" if len(lines) > 5 else "")
            what = "line" if len(lines) == 1 else f"{len(lines)} lines"
            out.append(f"{name}: {what} {reason} (line {shown}): skipped")
        if rest := sum(len(lines) for _, lines in reasons[_REASONS:]):
            out.append(
                f"{name}: {rest} more line(s) skipped for {len(reasons) - _REASONS} other reasons"
            )
        return out


def _read_lines(path: Path) -> _Lines:
    """Every line of ``path`` that holds a JSON object; a final line without its newline that
    does not parse is a torn tail, any other bad line is skipped with its reason. A file that
    is missing holds nothing; one that cannot be read (not a regular file, too large, a
    symlink loop) says why."""
    out = _Lines()
    try:
        data = read_bounded(path, JSONL_LIMIT) or b""
    except UnreadableFile as exc:
        out.unreadable = exc.reason
        return out
    raw_lines = data.split(b"\n")
    for n, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        obj, why = _loads(raw)
        if why is not None:
            if n == len(raw_lines):  # the bytes after the last newline
                out.torn = True
            else:
                out.skip(why, n)
        elif isinstance(obj, dict):
            out.objects.append((n, obj))
        else:
            out.skip("is not a JSON object", n)
    return out


@cache
def record_class(kind: EvalKind) -> type[EvalRecord]:
    """The kind's record class as a reader takes it: fields it does not know are ignored (a
    newer writer's), every field it knows must have its type."""
    base = kind.record
    allow = base.model_config.get("extra") == "allow"  # GeneralRecord: its metrics
    config = ConfigDict(extra="allow" if allow else "ignore")
    return cast(type[EvalRecord], type(base.__name__, (base,), {"model_config": config}))


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _invalid(what: str, exc: ValidationError) -> str:
    """Why an object is not ``what``, in a few words (the same words for the same fault, so
    that lines with one fault are named together)."""
    errors = exc.errors()
    missing = [".".join(map(str, e["loc"])) for e in errors if e["type"] == "missing"]
    if len(missing) == len(errors):
        return f"lacks the {what} fields ({_cut(', '.join(missing), 200)})"
    first = next(e for e in errors if e["type"] != "missing")
    where = _cut(".".join(map(str, first["loc"])) or "the record", 120)
    more = f" and {len(errors) - 1} more" if len(errors) > 1 else ""
    article = "an" if what[0] in "aeiou" else "a"
    return f"is not {article} {what} ({where}: {first['msg']}{more})"


def _read_records(path: Path, kind: EvalKind) -> tuple[list[dict[str, Any]], list[str]]:
    """Records by id, as written (the later of two with one id wins, in the order of first
    appearance), each validated strictly against the kind's record class; and the problems:
    lines left out, records that do not validate."""
    lines = _read_lines(path)
    cls = record_class(kind)
    records: dict[str, dict[str, Any]] = {}
    for n, obj in lines.objects:
        try:
            cls.model_validate(obj, strict=True)
        except ValidationError as exc:
            lines.skip(_invalid(f"{kind.name} record", exc), n)
            continue
        records[obj["id"]] = obj
    return list(records.values()), lines.problems(path.name)


def typed_records(kind: EvalKind, records: list[dict[str, Any]]) -> tuple[list[Any], int]:
    """The records as the kind's record class (as :func:`record_class` reads it) and how many
    did not validate."""
    cls = record_class(kind)
    typed, bad = [], 0
    for r in records:
        try:
            typed.append(cls.model_validate(r))
        except ValidationError:
            bad += 1
    return typed, bad


# ------------------------------------------------------------------ summaries


def _valid_summary(kind: EvalKind, data: Any) -> tuple[dict[str, Any] | None, str | None]:
    """``summary.json`` as the report reads it (the fields it reads with their types, missing
    ones at their defaults), or why it is not one."""
    if not isinstance(data, dict):
        return None, f"is JSON {type(data).__name__}, not an object"
    try:
        summary = kind.summary.model_validate(data)
    except ValidationError as exc:
        return None, _invalid(f"{kind.name} summary", exc)
    return summary.model_dump(mode="python"), None


# ------------------------------------------------------------------ loading


def load_run(path: Path, name: str | None = None) -> Run:
    """Read the run in ``path`` (:func:`detect_kind` first; its errors propagate)."""
    path = Path(path)
    kind = _detect(path)
    label = name or default_name(path)
    if isinstance(kind, EvalKind):
        return _load_eval(path, kind, label)
    return _load_training(path, kind, label)


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Several runs, each named uniquely (:func:`unique_names`)."""
    return [load_run(p, n) for p, n in zip(paths, unique_names(paths), strict=True)]


def default_name(path: Path) -> str:
    return safe_resolve(path).name or str(path)


def unique_names(paths: Iterable[Path]) -> list[str]:
    """A label per path: its directory name, with its parent's where two share a name, and a
    number where they are still the same (one directory given twice)."""
    resolved = [safe_resolve(p) for p in paths]
    base = [p.name or str(p) for p in resolved]
    names = [
        f"{p.parent.name}/{n}" if base.count(n) > 1 and p.parent.name else n
        for p, n in zip(resolved, base, strict=True)
    ]
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} #{seen[n]}")
    return out


def _load_eval(path: Path, kind: EvalKind, name: str) -> Run:
    problems: list[str] = []
    config, why = _read_json(path / CONFIG)
    if why or (config is not None and not isinstance(config, dict)):
        problems.append(
            f"{CONFIG} {why or 'is not a JSON object'}: the run's fingerprint is unknown"
        )
    config = config if isinstance(config, dict) else None
    records, read_problems = _read_records(path / RESULTS, kind)
    problems += read_problems
    raw, why = _read_json(path / SUMMARY)
    summary = None
    if raw is not None:
        summary, why = _valid_summary(kind, raw)
    if why:
        problems.append(f"{SUMMARY} {why}: figures computed from the records")
    partial = bool(read_problems) or why is not None
    if not records and not summary:
        problems.append(f"no records yet: {RESULTS} is missing or empty")
        partial = True
    elif summary is None:
        summary = _summarize(kind, records, config, problems)
        if not why:
            problems.append(
                f"no {SUMMARY} (the run did not finish): figures computed from the "
                f"{len(records)} records in {RESULTS}"
            )
        partial = True
    elif records and (was := _count(kind, summary)) is not None and was != len(records):
        summary = {**summary, **_summarize(kind, records, config, problems)}
        if isinstance(summary.get("total"), int):
            summary["complete"] = len(records) >= summary["total"]
        problems.append(
            f"{SUMMARY} covers {was} entries, {RESULTS} holds {len(records)} (a run resumed, "
            f"still going, or records left out): figures computed from {RESULTS}"
        )
        partial = True
    if summary is not None and summary.get("complete") is False:
        total = summary.get("total")
        problems.append(f"the run is incomplete: {len(records)} of {total} entries recorded")
        partial = True
    return Run(path, name, kind.name, summary, records, [], config, partial, problems, kind)


def _count(kind: EvalKind, summary: dict[str, Any]) -> int | None:
    """How many entries a summary covers (None: it does not say)."""
    value = summary.get(kind.counted_by)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _summarize(
    kind: EvalKind, records: list[dict[str, Any]], config: Any, problems: list[str]
) -> dict[str, Any]:
    """A summary computed from the records, as the eval's own would be (without the figures
    only the run knew: wall time, total); records that do not validate are left out (and
    said so in ``problems``)."""
    typed, bad = typed_records(kind, records)
    if bad:
        problems.append(f"{bad} record(s) do not validate as {kind.name} records: left out")
    fp = config.get("fingerprint", {}) if isinstance(config, dict) else {}
    model = fp.get("model") if isinstance(fp, dict) else None
    known = {"model": model} if model else {}
    fingerprint = fp if isinstance(fp, dict) else {}
    return {**kind.summarize(typed, records, fingerprint), **known}


def _load_training(path: Path, kind: RunKind, name: str) -> Run:
    problems: list[str] = []
    run_file = path / RUN_FILES[kind]
    raw, why = _read_json(run_file)
    config = raw.get("fingerprint") if isinstance(raw, dict) else None
    if not isinstance(config, dict):
        config = None
        if raw is None and why is None:
            problems.append(f"{run_file.name} is missing: the run's config is unknown")
        else:
            what = why or ("has no fingerprint" if isinstance(raw, dict) else "is not an object")
            problems.append(f"{run_file.name} {what}: the run's config is unknown")
    metrics, verl = _read_metrics(path, problems)
    last = int(max(m["step"] for m in metrics)) if metrics else None
    planned = _planned_steps(kind, config)
    final = VERL_FINAL_DIR if verl else FINAL_DIR
    finished = (path / FINAL_DIR).is_dir() or (path / final).is_dir()
    if not finished:
        of = f" of {planned}" if planned else ""
        problems.append(
            f"no {final}/ model: training stopped or still running "
            f"(last logged step {last if last is not None else '-'}{of})"
        )
    summary = {"last_step": last, "planned_steps": planned, "finished": finished, "verl": verl}
    return Run(path, name, kind, summary, [], metrics, config, bool(problems), problems)


def _step(obj: dict[str, Any]) -> str | None:
    """Why a metrics line is not a logged step (None: it is one)."""
    step = obj.get("step")
    if isinstance(step, bool) or not isinstance(step, int | float):
        return "has no step number" if step is None else "has a step that is not a number"
    return None if math.isfinite(step) and step >= 0 else "has a step that is not finite"


def _read_metrics(path: Path, problems: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """``metrics.jsonl``, or else verl's (flattened): one file per launch in ``verl-metrics/``,
    read in name order (launch order), a later launch (resumed from an earlier checkpoint)
    replacing the earlier launches' lines from its first step on (runs written before that
    layout have ``verl/metrics.jsonl``); and whether they were verl's. Each line must be a step
    (a finite ``step``); what could not be read goes to ``problems``."""
    lines = _read_lines(path / METRICS)
    files = [(METRICS, lines)]
    if not (lines.objects or lines.bad or lines.unreadable or lines.torn):
        verl_files = [
            (f"{VERL_METRICS_DIR}/{f.name}", _read_lines(f)) for f in _verl_metric_files(path)
        ]
        if not verl_files:
            old = _read_lines(path / "verl" / METRICS)
            verl_files = [(f"verl/{METRICS}", old)] if old.objects or old.bad else []
        files = verl_files or files
    verl = files[0][0] != METRICS
    metrics: list[dict[str, Any]] = []
    for name, got in files:
        steps = []
        for n, obj in got.objects:
            flat = _flat_step(obj)
            if why := _step(flat):
                got.skip(why, n)
            else:
                steps.append(flat)
        if steps:  # a later launch logs again the steps after its checkpoint: its lines win
            metrics = [m for m in metrics if m["step"] < steps[0]["step"]] + steps
        problems += got.problems(name)
    if not metrics:
        problems.append(f"no metrics yet: {METRICS} is missing or empty")
    return metrics, verl


def _verl_metric_files(path: Path) -> list[Path]:
    folder = path / VERL_METRICS_DIR
    try:
        return sorted(f for f in folder.iterdir() if f.suffix == ".jsonl")[:_MAX_LAUNCHES]
    except OSError:  # none, or not a folder
        return []


def _flat_step(obj: dict[str, Any]) -> dict[str, Any]:
    """verl's file logger writes ``{"step": N, "data": {...}}``: flatten it."""
    if isinstance(obj.get("data"), dict) and set(obj) <= {"step", "data"}:
        return {"step": obj.get("step"), **obj["data"]}
    return obj


def _planned_steps(kind: RunKind, config: dict[str, Any] | None) -> int | None:
    if not config:
        return None
    value = config.get("steps" if kind == "rl" else "max_steps")
    return value if isinstance(value, int) and value > 0 else None
