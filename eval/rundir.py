"""Run directories as readers (the report, comparisons) find them: which kind of run a directory
holds, and what is in it — read without changing anything, half-written runs included.

Five kinds, told apart by the files their writers leave:

* ``bfcl``, ``arenas``, ``general`` (``astra-eval``): ``config.json`` (the fingerprint),
  ``results.jsonl`` (one record per entry; the later of two with one id wins), ``summary.json``
  (written at the end of a run);
* ``sft``, ``rl`` (``astra-train``): ``astra-sft.json`` / ``astra-rl.json`` (the fingerprint),
  ``metrics.jsonl`` (one record per logged step; verl's file logger writes ``verl/metrics.jsonl``
  as ``{"step", "data"}``), ``final/`` once training finished.

A run that is still going, or was killed, is read as far as it goes: a torn last line is left
out, a missing ``summary.json`` is computed from the records, and :attr:`Run.problems` says
what was missing (:attr:`Run.partial` marks it). Nothing here writes to a run directory (the
eval's own reader cuts a torn tail; this one may be reading a run that is still appending).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pydantic import BaseModel, ValidationError

from astra_agent.errors import ConfigError
from eval.results import CONFIG, RESULTS, SUMMARY

log = logging.getLogger(__name__)

RunKind = Literal["bfcl", "arenas", "general", "sft", "rl"]
KINDS: tuple[RunKind, ...] = get_args(RunKind)
EVAL_KINDS: tuple[RunKind, ...] = ("bfcl", "arenas", "general")
TRAINING_KINDS: tuple[RunKind, ...] = ("sft", "rl")
# The training writers' file names (training/ is not imported: it imports eval).
RUN_FILES: dict[RunKind, str] = {"sft": "astra-sft.json", "rl": "astra-rl.json"}
METRICS = "metrics.jsonl"
FINAL_DIR = "final"
_HINT = (
    "pass directories written by `astra-eval bfcl|arenas|general` (config.json, "
    "results.jsonl, summary.json) or `astra-train sft|rl` (astra-sft.json or astra-rl.json, "
    "metrics.jsonl)"
)
_FIRST_LINE_LIMIT = 64 << 20  # detection reads one record at most this long


@dataclass(frozen=True)
class Run:
    """One run directory as read: ``records`` for eval kinds (one per id, as plain JSON),
    ``metrics`` for training kinds (one per logged step); ``partial`` when the run is not
    complete or parts of it could not be read (``problems`` says which)."""

    path: Path
    name: str
    kind: RunKind
    summary: dict[str, Any] | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] | None = None  # config.json, or the astra-*.json fingerprint
    partial: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def is_eval(self) -> bool:
        return self.kind in EVAL_KINDS

    @property
    def model(self) -> str:
        """The model the run evaluated or trained ("" where not recorded)."""
        if self.summary and self.summary.get("model"):
            return str(self.summary["model"])
        fingerprint = (self.config or {}).get("fingerprint", self.config or {})
        return str(fingerprint.get("model") or "") if isinstance(fingerprint, dict) else ""


# ------------------------------------------------------------------ detection


def detect_kind(path: Path) -> RunKind:
    """The kind of run ``path`` holds; a ConfigError (with a hint) when it does not exist, is
    not a directory or holds none of our runs' files."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"run directory not found: {path}", hint=_HINT)
    if not path.is_dir():
        raise ConfigError(f"{path} is a file, not a run directory", hint=_HINT)
    kind = _kind_of(path)
    if kind is None:
        raise ConfigError(
            f"{path} is not a run directory of astra-eval or astra-train: it holds none of "
            f"{SUMMARY}, {RESULTS}, {CONFIG}, {', '.join(RUN_FILES.values())}, {METRICS} "
            "(or they are not readable as ours)",
            hint=_HINT,
        )
    return kind


def _kind_of(path: Path) -> RunKind | None:
    for kind, name in RUN_FILES.items():
        if (path / name).is_file():
            return kind
    summary = _json_file(path / SUMMARY)
    config = _json_file(path / CONFIG)
    fp = config.get("fingerprint") if isinstance(config, dict) else None
    return (
        (_kind_from_keys(summary, summary=True) if isinstance(summary, dict) else None)
        or (_kind_from_fingerprint(fp) if isinstance(fp, dict) else None)
        or _kind_from_keys(_first_record(path / RESULTS) or {}, summary=False)
        or _training_kind(_first_record(path / METRICS) or {})
    )


def _eval_kind(value: Any) -> RunKind | None:
    return cast(RunKind, value) if value in EVAL_KINDS else None


def _kind_from_keys(obj: dict[str, Any], *, summary: bool) -> RunKind | None:
    """The kind a summary or a first record shows by its fields."""
    if _eval_kind(obj.get("kind")):
        return _eval_kind(obj.get("kind"))
    if summary:
        if "accuracy" in obj and "overall" in obj:
            return "bfcl"
        if "mean_reward" in obj or ("data" in obj and "skipped_records" in obj):
            return "arenas"
        if isinstance(obj.get("tasks"), dict):
            return "general"
        return None
    if "category" in obj and "valid" in obj:
        return "bfcl"
    if "task_id" in obj and "reward" in obj:
        return "arenas"
    if "task" in obj and "id" in obj:
        return "general"
    return None


def _kind_from_fingerprint(fp: dict[str, Any]) -> RunKind | None:
    """config.json's fingerprint: what each eval's results depend on."""
    if _eval_kind(fp.get("kind")):
        return _eval_kind(fp.get("kind"))
    if "categories" in fp:
        return "bfcl"
    if "data_sha256" in fp:
        return "arenas"
    if "tasks" in fp:
        return "general"
    return None


def _training_kind(first: dict[str, Any]) -> RunKind | None:
    """A metrics.jsonl without its run file: RL steps carry rewards, SFT steps a loss."""
    if "abf" in first or "reward_mean" in first:
        return "rl"
    return "sft" if "loss" in first else None


def _json_file(path: Path) -> Any:
    """A JSON file's value, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None


def _first_record(path: Path) -> dict[str, Any] | None:
    """The first JSON object of a JSONL file (None: missing, empty or not ours)."""
    try:
        with path.open("rb") as f:
            for raw in f:
                if len(raw) > _FIRST_LINE_LIMIT:
                    return None
                if raw.strip():
                    obj = json.loads(raw.decode("utf-8"))
                    return obj if isinstance(obj, dict) else None
    except (OSError, ValueError):
        return None
    return None


# ------------------------------------------------------------------ JSONL, tolerantly


@dataclass
class _Lines:
    """What a JSONL file held: the JSON objects, and the lines left out by reason."""

    objects: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # line number, obj
    bad: dict[str, list[int]] = field(default_factory=dict)  # reason → line numbers
    torn: bool = False

    def skip(self, reason: str, n: int) -> None:
        self.bad.setdefault(reason, []).append(n)

    def problems(self, name: str) -> list[str]:
        out = []
        if self.torn:
            out.append(
                f"{name}: the last line is cut off (a run still writing, or killed "
                "mid-write): left out"
            )
        for reason, lines in self.bad.items():
            shown = ", ".join(map(str, lines[:5])) + (", …" if len(lines) > 5 else "")
            what = "line" if len(lines) == 1 else f"{len(lines)} lines"
            out.append(f"{name}: {what} {reason} (line {shown}): skipped")
        return out


def _read_lines(path: Path) -> _Lines:
    """Every line of ``path`` that holds a JSON object; a final line without its newline that
    does not parse is a torn tail, any other bad line is skipped with its reason."""
    data = path.read_bytes()
    raw_lines = data.split(b"\n")
    out = _Lines()
    for n, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        tail = n == len(raw_lines)  # the bytes after the last newline
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if tail:
                out.torn = True
            else:
                out.skip("is not UTF-8 text", n)
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            if tail:
                out.torn = True
            else:
                out.skip("is not JSON", n)
            continue
        if isinstance(obj, dict):
            out.objects.append((n, obj))
        else:
            out.skip("is not a JSON object", n)
    return out


# Fields every record of a kind has (a cheap check on each record; the record classes
# validate only where figures must be computed from the records).
_REQUIRED: dict[RunKind, tuple[str, ...]] = {
    "bfcl": ("category", "valid"),
    "arenas": ("task_id", "reward", "fully_solved"),
    "general": ("task",),
}


def _read_records(path: Path, kind: RunKind) -> tuple[list[dict[str, Any]], list[str]]:
    """Records by id, as written (the later of two with one id wins, in the order of first
    appearance), and the problems: lines left out, records without the kind's fields."""
    if not path.is_file():
        return [], []
    lines = _read_lines(path)
    records: dict[str, dict[str, Any]] = {}
    for n, obj in lines.objects:
        if not isinstance(obj.get("id"), str):
            lines.skip("has no string id", n)
            continue
        missing = [k for k in _REQUIRED[kind] if k not in obj]
        if missing:
            lines.skip(f"lacks the {kind} record fields ({', '.join(missing)})", n)
            continue
        records[obj["id"]] = obj
    return list(records.values()), lines.problems(path.name)


def typed_records(kind: RunKind, records: list[dict[str, Any]]) -> tuple[list[Any], int]:
    """The records that validate as the kind's record class (BFCLRecord, ArenaRecord; general
    runs have none: plain dicts) and how many did not."""
    cls: type[BaseModel]
    if kind == "bfcl":
        from eval.bfcl.runner import BFCLRecord

        cls = BFCLRecord
    elif kind == "arenas":
        from eval.arenas.runner import ArenaRecord

        cls = ArenaRecord
    else:
        return list(records), 0
    typed, bad = [], 0
    for r in records:
        try:
            typed.append(cls.model_validate(r))
        except ValidationError:
            bad += 1
    return typed, bad


# ------------------------------------------------------------------ loading


def load_run(path: Path, name: str | None = None) -> Run:
    """Read the run in ``path`` (:func:`detect_kind` first; its errors propagate)."""
    path = Path(path)
    kind = detect_kind(path)
    label = name or default_name(path)
    if kind in EVAL_KINDS:
        return _load_eval(path, kind, label)
    return _load_training(path, kind, label)


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Several runs, each named uniquely (:func:`unique_names`)."""
    return [load_run(p, n) for p, n in zip(paths, unique_names(paths), strict=True)]


def default_name(path: Path) -> str:
    return Path(path).resolve().name or str(path)


def unique_names(paths: Iterable[Path]) -> list[str]:
    """A label per path: its directory name, with its parent's where two share a name, and a
    number where they are still the same (one directory given twice)."""
    resolved = [Path(p).resolve() for p in paths]
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


def _load_eval(path: Path, kind: RunKind, name: str) -> Run:
    problems: list[str] = []
    config = _json_file(path / CONFIG)
    if (path / CONFIG).is_file() and not isinstance(config, dict):
        problems.append(f"{CONFIG} is not readable JSON: the run's fingerprint is unknown")
        config = None
    records, read_problems = _read_records(path / RESULTS, kind)
    problems += read_problems
    summary = _json_file(path / SUMMARY)
    if (path / SUMMARY).is_file() and not isinstance(summary, dict):
        problems.append(f"{SUMMARY} is not readable JSON: figures computed from the records")
    summary = summary if isinstance(summary, dict) else None
    partial = bool(read_problems)
    if not records and not summary:
        problems.append(f"no records yet: {RESULTS} is missing or empty")
        partial = True
    elif summary is None:
        summary = _summarize(kind, records, config, problems)
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
            f"{SUMMARY} covers {was} entries, {RESULTS} holds {len(records)} (a run resumed or "
            f"still going): figures computed from {RESULTS}"
        )
        partial = True
    if summary is not None and summary.get("complete") is False:
        total = summary.get("total")
        problems.append(f"the run is incomplete: {len(records)} of {total} entries recorded")
        partial = True
    return Run(path, name, kind, summary, records, [], config, partial, problems)


_COUNTED_BY = {"bfcl": "entries", "arenas": "tasks", "general": "samples"}


def _count(kind: RunKind, summary: dict[str, Any]) -> int | None:
    """How many entries a summary covers (None: it does not say)."""
    value = summary.get(_COUNTED_BY[kind])
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _summarize(
    kind: RunKind, records: list[dict[str, Any]], config: Any, problems: list[str]
) -> dict[str, Any]:
    """A summary computed from the records, as the eval's own would be (without the figures
    only the run knew: wall time, total); records that do not validate are left out (and
    said so in ``problems``)."""
    typed, bad = typed_records(kind, records)
    if bad:
        problems.append(f"{bad} record(s) do not validate as {kind} records: left out")
    fp = config.get("fingerprint", {}) if isinstance(config, dict) else {}
    model = fp.get("model") if isinstance(fp, dict) else None
    known = {"model": model} if model else {}
    if kind == "bfcl":
        from eval.bfcl.runner import PUBLISHED, summarize

        return {**summarize(typed), "published": PUBLISHED, **known}
    if kind == "arenas":
        from eval.arenas.runner import summarize as summarize_arenas

        return {**summarize_arenas(typed), **known}
    return {"kind": "general", **general_summary(records), **known}


def general_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task, the mean of each numeric field of its records (booleans as 0/1)."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r in records:
        task = str(r.get("task", "(none)"))
        metrics = sums.setdefault(task, {})
        for key, value in r.items():
            if key in ("id", "task", "index") or isinstance(value, str):
                continue
            if isinstance(value, bool | int | float):
                metrics.setdefault(key, []).append(float(value))
    tasks = {
        task: {k: round(sum(v) / len(v), 4) for k, v in metrics.items() if v}
        for task, metrics in sorted(sums.items())
    }
    return {"tasks": tasks, "samples": len(records)}


def _load_training(path: Path, kind: RunKind, name: str) -> Run:
    problems: list[str] = []
    run_file = path / RUN_FILES[kind]
    raw = _json_file(run_file)
    config = raw.get("fingerprint") if isinstance(raw, dict) else None
    if not isinstance(config, dict):
        config = None
        if not run_file.is_file():
            problems.append(f"{run_file.name} is missing: the run's config is unknown")
        else:
            what = "has no fingerprint" if isinstance(raw, dict) else "is not readable JSON"
            problems.append(f"{run_file.name} {what}: the run's config is unknown")
    metrics, verl = _read_metrics(path, problems)
    steps = [m["step"] for m in metrics if isinstance(m.get("step"), int | float)]
    last = int(max(steps)) if steps else None
    planned = _planned_steps(kind, config)
    finished = (path / FINAL_DIR).is_dir()
    if not finished:
        of = f" of {planned}" if planned else ""
        problems.append(
            f"no {FINAL_DIR}/ model: training stopped or still running "
            f"(last logged step {last if last is not None else '-'}{of})"
        )
    summary = {"last_step": last, "planned_steps": planned, "finished": finished, "verl": verl}
    return Run(path, name, kind, summary, [], metrics, config, bool(problems), problems)


def _read_metrics(path: Path, problems: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """``metrics.jsonl`` (or verl's ``verl/metrics.jsonl``, flattened) and whether it was
    verl's; what could not be read goes to ``problems``."""
    metrics_file = path / METRICS
    verl = not metrics_file.is_file() and (path / "verl" / METRICS).is_file()
    if verl:
        metrics_file = path / "verl" / METRICS
    metrics: list[dict[str, Any]] = []
    if metrics_file.is_file():
        lines = _read_lines(metrics_file)
        metrics = [_flat_step(obj) for _, obj in lines.objects]
        problems += lines.problems(METRICS)
    if not metrics:
        problems.append(f"no metrics yet: {METRICS} is missing or empty")
    return metrics, verl


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
