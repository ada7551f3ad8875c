"""What every SFT backend shares: input checks, the run directory's fingerprint, checkpoints to
resume from, the batch arithmetic and the metrics JSONL.

The output directory of a run holds ``astra-sft.json`` (the config's fingerprint: what must match
to resume), ``checkpoint-N/`` (complete once ``trainer_state.json`` is in it: the trainer writes it
last), ``metrics.jsonl`` (one line per logging step, each appended whole) and ``final/``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from astra_agent.errors import CheckpointError, ConfigError
from astra_agent.trajectory import append_jsonl, drop_torn_tail, jsonl_lines
from training.sft.config import SFTConfig

RUN_FILE = "astra-sft.json"
METRICS_FILE = "metrics.jsonl"
FINAL_DIR = "final"
log = logging.getLogger(__name__)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def check_model(path: Path) -> None:
    """``path`` must be a Hugging Face checkpoint with weights (a CheckpointError otherwise)."""
    from serving.checkpoint import open_hf_checkpoint

    open_hf_checkpoint(Path(path))


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


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            out += _diff(old.get(key, "<unset>"), new.get(key, "<unset>"), name)
        return out
    return [] if old == new else [f"{prefix} ({old!r} → {new!r})"]


def prepare_run_dir(cfg: Any, run_name: str = RUN_FILE, command: str = "astra-train sft") -> bool:
    """Create ``output_dir`` or check that it was made by the same config (``cfg``: an SFT or
    RL config, anything with ``output_dir``, ``resume`` and ``fingerprint()``); return whether
    a checkpoint should be resumed from. A different config: a ConfigError naming the keys."""
    out = cfg.output_dir
    run_file = out / run_name
    new = cfg.fingerprint()
    if run_file.is_file():
        try:
            old = json.loads(run_file.read_text(encoding="utf-8"))["fingerprint"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{run_file} is corrupt ({exc})", hint="pick a new --output-dir"
            ) from None
        changed = _diff(old, new)
        if changed:
            raise ConfigError(
                f"{out} holds a run of a different config: " + "; ".join(changed),
                hint="use the same config to resume, or pick a new --output-dir",
            )
        return cfg.resume
    if out.exists() and any(out.iterdir()):
        raise ConfigError(
            f"{out} is not empty and holds no {run_name}: not an `{command}` run",
            hint="pick a new --output-dir",
        )
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{run_name}.tmp"
    payload = {"fingerprint": new, "digest": cfg.fingerprint_digest()}
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.rename(run_file)
    return False


def last_complete_checkpoint(output_dir: Path) -> Path | None:
    """The newest ``checkpoint-N`` whose ``trainer_state.json`` (written last) is whole. The
    Trainer writes that file in place, so a ``kill -9`` while it is written leaves it torn:
    such a checkpoint is skipped (with a warning) for the one before it."""
    if not output_dir.is_dir():
        return None
    found = []
    for p in output_dir.iterdir():
        m = _CHECKPOINT.match(p.name)
        if m and p.is_dir() and (p / "trainer_state.json").is_file():
            found.append((int(m.group(1)), p))
    for _, p in sorted(found, reverse=True):
        try:
            checkpoint_step(p)
        except CheckpointError:
            log.warning("%s: trainer_state.json is torn (killed while saving?); skipped", p)
            continue
        return p
    return None


def checkpoint_step(checkpoint: Path) -> int:
    state = checkpoint / "trainer_state.json"
    try:
        return int(json.loads(state.read_text(encoding="utf-8"))["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{state} is unreadable ({exc})", hint="delete that checkpoint"
        ) from None


class MetricsLog:
    """``OUTPUT_DIR/metrics.jsonl``: one record per logging step, each appended whole.

    On resume from step S the records after S (written after the checkpoint, so about to be
    redone) are dropped first: the file then holds each step once, and the running totals go on
    from the last kept record."""

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = path
        self.totals: dict[str, float] = {}
        if resume_step is None:
            path.unlink(missing_ok=True)
            return
        drop_torn_tail(path)
        kept = [r for r in self.read(path) if int(r.get("step", 0)) <= resume_step]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        tmp.rename(path)
        if kept:
            self.totals = {k: v for k, v in kept[-1].items() if k.endswith("_total")}

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        if not path.is_file():
            return []
        return [json.loads(line) for line in jsonl_lines(path.read_text(encoding="utf-8")) if line]

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        """Add ``record`` (its ``*_total`` fields are running sums of the plain ones)."""
        for key in ("tokens", "trained_tokens", "padding_tokens"):
            if key in record:
                total = self.totals.get(f"{key}_total", 0) + record[key]
                self.totals[f"{key}_total"] = record[f"{key}_total"] = total
        append_jsonl(self.path, record, fsync=False)
        return record
