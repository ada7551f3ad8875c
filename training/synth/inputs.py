"""Reading an earlier stage's output: its JSONL records, each line that is not JSON or not a
record rejected with the reason (``not_json``, ``bad_record``), and the records of a stage's
output directories (checked complete) with checks and duplicates rejected as well."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from astra_agent.errors import ConfigError
from astra_agent.runio import jsonl_lines
from training.synth.stage import Rejection, read_stats

R = TypeVar("R", bound=BaseModel)


def read_records(
    path: Path, model: type[R], stage: str
) -> tuple[list[tuple[int, R]], list[Rejection]]:
    """The records of a JSONL output of an earlier stage: each line that is not JSON or not a
    ``model`` becomes a rejection (``not_json``, ``bad_record``), the others are kept."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    kept: list[tuple[int, R]] = []
    rejected: list[Rejection] = []
    for n, data in json_lines(text, path, stage, rejected):
        try:
            kept.append((n, model.model_validate(data)))
        except ValidationError as exc:
            err = exc.errors()[0]
            detail = f"{'.'.join(map(str, err['loc'])) or '<record>'}: {err['msg']}"
            rid = data.get("id", "") if isinstance(data, dict) else ""
            where = f"{path}:{n}"
            rejected.append(
                Rejection(
                    stage=stage, source=where, id=str(rid), reason="bad_record", detail=detail
                )
            )
    return kept, rejected


def json_lines(
    text: str, path: Path, stage: str, rejected: list[Rejection]
) -> Iterator[tuple[int, Any]]:
    """The JSON values of the lines of ``text`` (read from ``path``), with their line numbers;
    a line that is not JSON becomes a ``not_json`` rejection in ``rejected``."""
    for n, line in enumerate(jsonl_lines(text), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as exc:
            where = f"{path}:{n}"
            rejected.append(
                Rejection(stage=stage, source=where, reason="not_json", detail=str(exc))
            )
            continue
        yield n, data


@dataclass
class StageInput(Generic[R]):
    records: list[tuple[str, R]]  # (file:line, record), each id once
    rejected: list[Rejection]
    files: list[Path]  # the files read, in order


def read_stage_output(
    paths: Sequence[Path],
    model: type[R],
    *,
    stage: str,
    producer: str,
    file: str,
    duplicate: str | None = None,
    check: Callable[[R], tuple[str, str] | None] | None = None,
    say_where: bool = False,
) -> StageInput[R]:
    """The records of ``producer`` output directories (checked complete: their ``file``) or
    JSONL files, read for ``stage``. Lines that are not records are rejected (``not_json``,
    ``bad_record``), so are those ``check`` refuses (its reason and detail); a repeated id is
    rejected as ``duplicate`` (where it was first, with ``say_where``), or dropped when None."""
    got: StageInput[R] = StageInput([], [], [])
    kept: dict[str, tuple[str, R]] = {}
    for path in paths:
        if path.is_dir():
            read_stats(path, producer)
            path = path / file
        got.files.append(path)
        records, bad = read_records(path, model, stage)
        got.rejected += bad
        for line, rec in records:
            where, rid = f"{path}:{line}", str(rec.id)  # type: ignore[attr-defined]
            problem = check(rec) if check is not None else None
            if problem is None and rid in kept:
                if duplicate is None:
                    continue
                problem = (duplicate, f"also at {kept[rid][0]}" if say_where else "")
            if problem is not None:
                reason, detail = problem
                got.rejected.append(
                    Rejection(stage=stage, source=where, id=rid, reason=reason, detail=detail)
                )
            else:
                kept[rid] = (where, rec)
    got.records = list(kept.values())
    return got
