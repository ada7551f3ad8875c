"""What the SFT backends share beyond the run itself: the input checks (the training files,
each ``sft.parquet`` row) and the batch arithmetic. The run directory, checkpoints, the
finished run and the final save are :mod:`training.run`'s (RL shares them); the guard against
a run that diverges is :mod:`training.guard`'s; the metrics JSONL is :mod:`training.metrics`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from training.sft.config import SFTConfig

__all__ = ["check_sft_parquet", "check_train_files", "grad_accumulation", "world_size"]


def check_train_files(paths: list[Path]) -> None:
    for p in paths:
        if not Path(p).is_file():
            raise ConfigError(
                f"training data not found: {p}",
                hint="write it with `astra-train data sft IN... --out DIR`",
            )


def world_size() -> int:
    """Data-parallel processes (torchrun/accelerate set ``WORLD_SIZE``; 1 otherwise)."""
    raw = os.environ.get("WORLD_SIZE", "1")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def grad_accumulation(cfg: SFTConfig, world: int = 1) -> int:
    """Steps of accumulation so that micro × accumulation × world = the global batch."""
    per_step = cfg.micro_batch_size * world
    if cfg.global_batch_size % per_step:
        raise ConfigError(
            f"global_batch_size {cfg.global_batch_size} is not a multiple of micro_batch_size "
            f"{cfg.micro_batch_size} × {world} process(es) = {per_step}",
            hint="pick a global batch that micro batch × world size divides",
        )
    return cfg.global_batch_size // per_step


_SFT_COLUMNS = ("id", "source", "messages", "tools", "provenance")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _row_problem(rec: Mapping[str, Any]) -> tuple[str, str] | None:
    """(column, why) for the first cell of an ``sft.parquet`` row that ``read_sft_parquet``
    and the template cannot take; None for a sound row."""
    from training.data_schema import ROLES

    for column in ("id", "source"):
        if not isinstance(rec[column], str):
            return column, f"{_kind(rec[column])}, not a string"
    for column, want in (("messages", "array"), ("tools", "array"), ("provenance", "object")):
        raw = rec[column]
        if raw is None and column == "provenance":
            continue
        if not isinstance(raw, str):
            return column, f"{_kind(raw)}, not JSON text"
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return column, f"not JSON ({str(exc)[:120]})"
        if not isinstance(value, list if want == "array" else dict):
            return column, f"JSON {_kind(value)}, not a JSON {want}"
        if want == "array" and not all(isinstance(item, dict) for item in value):
            return column, "an item of the array is not a JSON object"
    messages = json.loads(rec["messages"])
    if not messages:
        return "messages", "no messages"
    for m in messages:
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            return "messages", f"a message has role {role!r}, not one of {sorted(ROLES)}"
    return None


def check_sft_parquet(paths: list[Path]) -> None:
    """Every row of the ``sft.parquet`` files must be one that ``read_sft_parquet`` and the
    training template take (its JSON columns JSON of the right shape, no null where a value is
    needed): a ConfigError naming the file, the row (0-based) and the column otherwise, before
    the run directory is written or anything is trained."""
    import pyarrow.parquet as pq

    for path in paths:
        try:
            table = pq.read_table(path, columns=list(_SFT_COLUMNS))
        except Exception as exc:  # pyarrow: ArrowInvalid, KeyError, OSError…
            raise ConfigError(f"{path} is not an `astra-train data sft` parquet: {exc}") from None
        for i, rec in enumerate(table.to_pylist()):
            problem = _row_problem(rec)
            if problem:
                column, why = problem
                raise ConfigError(
                    f"{path}: row {i} (id {rec['id']!r}), column {column!r}: {why}",
                    hint="rebuild the file with `astra-train data sft`, or fix that row",
                )
