"""What every RL backend shares before and after training: input checks, the run directory
(``astra-rl.json``: the config's fingerprint, so that resuming into a different config is
refused), the checkpoint to resume from, and the final checkpoint converted for serving.

Everything that can be refused is checked before the run directory is written (the batch
shape, the checkpoint, the records: loaded, bad ones skipped with their reasons), and a run
directory in which nothing was saved yet takes a new config instead of refusing it."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astra_agent.arena import ArenaTask
from astra_agent.errors import ConfigError
from training.rl.config import RLConfig

log = logging.getLogger(__name__)

RUN_FILE = "astra-rl.json"
FINAL_DIR = "final"


@dataclass
class PreparedRun:
    tokenizer: Any
    serving: str
    checkpoint: Path | None
    tasks: list[ArenaTask] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one reason per record not loaded
    heldout: list[ArenaTask] = field(default_factory=list)  # cut to eval_limit


def check_batch_shape(cfg: RLConfig) -> None:
    """The TRL backend trains a step's ``batch_groups × group_size`` episodes in micro-batches
    of ``micro_batch_size``: it must divide them (verl splits batches its own way)."""
    episodes = cfg.batch_groups * cfg.group_size
    if cfg.backend == "trl" and episodes % cfg.micro_batch_size:
        raise ConfigError(
            f"micro_batch_size={cfg.micro_batch_size} must divide the step's {episodes} "
            f"episodes (batch_groups × group_size = {cfg.batch_groups} × {cfg.group_size})",
            hint="pick a micro_batch_size that divides batch_groups × group_size",
        )


def check_inputs(cfg: RLConfig) -> None:
    """What can be checked without loading anything big: the batch shape, the checkpoint's
    files, the record files' existence."""
    from training.sft.common import check_model

    check_batch_shape(cfg)
    check_model(cfg.model)
    for what, paths in (("training", cfg.train_files), ("held-out", cfg.heldout_files)):
        for p in paths:
            if not Path(p).is_file():
                raise ConfigError(
                    f"{what} arena records not found: {p}"
                    if not Path(p).exists()
                    else f"{what} arena records: {p} is not a file",
                    hint="ASTRA-RL-1k records or our arena files (eval/arenas/data/*.jsonl)",
                )


def _saved_nothing(out: Path) -> bool:
    """``out`` holds a run directory in which nothing was trained or saved yet (a run that
    failed before its first checkpoint): no checkpoint, no final model, no metrics."""
    from training.sft.common import METRICS_FILE

    if not (out / RUN_FILE).is_file():
        return False
    for p in out.iterdir():
        if p.name.startswith(("checkpoint-", "previous-")) or p.name in (FINAL_DIR, "final-bf16"):
            return False
    metrics = out / METRICS_FILE
    return not (metrics.is_file() and metrics.read_text(encoding="utf-8", errors="replace").strip())


def _adopt(cfg: RLConfig) -> None:
    """A run directory that saved nothing takes the new config's fingerprint: nothing of the
    old run can be lost, so a run that was refused or failed at its start (a model that does
    not load, a server that does not start, Adaptive Batch Filling stalled at step 1) does not
    lock its directory to the config that failed."""
    out = cfg.output_dir
    if not _saved_nothing(out):
        return
    run_file = out / RUN_FILE
    try:
        old = json.loads(run_file.read_text(encoding="utf-8"))["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        old = None
    new = cfg.fingerprint()
    if old == new:
        return
    log.warning("%s holds a run of another config that saved nothing: it starts anew", out)
    tmp = out / f".{RUN_FILE}.tmp"
    payload = {"fingerprint": new, "digest": cfg.fingerprint_digest()}
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(run_file)


def prepare(cfg: RLConfig) -> PreparedRun:
    """Check everything that can be checked, then create or re-open the run directory: a
    config or input that is refused writes nothing."""
    from training.rl.batch import load_tasks
    from training.sft.common import last_complete_checkpoint, prepare_run_dir
    from training.template import load_tokenizer, serving_template

    check_inputs(cfg)
    tasks, skipped = load_tasks(list(cfg.train_files))
    heldout: list[ArenaTask] = []
    if cfg.heldout_files:
        heldout, bad = load_tasks(list(cfg.heldout_files), what="held-out")
        skipped += bad
        heldout = heldout[: cfg.eval_limit] if cfg.eval_limit else heldout
    tokenizer = load_tokenizer(cfg.model)
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        raise ConfigError(
            f"{cfg.model} has no chat template (are its tokenizer files missing?)",
            hint="use a checkpoint written by `astra-serve tiny`, `astra-train sft` or "
            "`astra-serve convert`",
        )
    serving = serving_template(tokenizer)
    if cfg.eval_every and not heldout:
        log.warning("eval_every=%d but no heldout_files: no held-out evaluation", cfg.eval_every)
    _adopt(cfg)
    resume = prepare_run_dir(cfg, RUN_FILE, "astra-train rl")
    if not resume:
        _set_aside(cfg.output_dir)
    ckpt = last_complete_checkpoint(cfg.output_dir) if resume else None
    return PreparedRun(tokenizer, serving, ckpt, tasks, skipped, heldout)


def _set_aside(out: Path) -> Path | None:
    """Starting over (``resume: false``) in a directory that holds an earlier run's
    checkpoints: they are moved to ``OUTPUT_DIR/previous-N/`` (with its final model and
    metrics), so that a later resume cannot pick them up as this run's (a kill at step 2
    would otherwise resume from the earlier run's last checkpoint), and nothing is deleted."""
    from training.sft.common import METRICS_FILE

    old = [
        p
        for p in out.iterdir()
        if (p.name.startswith("checkpoint-") and p.is_dir()) or p.name in (FINAL_DIR, "final-bf16")
    ]
    if not old:
        return None
    n = 1
    while (out / f"previous-{n}").exists():
        n += 1
    dest = out / f"previous-{n}"
    dest.mkdir()
    for p in [*old, out / METRICS_FILE]:
        if p.exists():
            p.rename(dest / p.name)
    log.warning("resume is off: the earlier run's checkpoints were moved to %s", dest)
    return dest


def finish(cfg: RLConfig, trainer: Any, tokenizer: Any, serving: str) -> tuple[Path, Path | None]:
    """``final/`` (HF layout, the serving template) and, if enabled, its bf16 conversion."""
    from serving.safetensors_io import swap_into_place

    final = cfg.output_dir / FINAL_DIR
    tmp = cfg.output_dir / f".{FINAL_DIR}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        trainer.save_model(str(tmp))
        tokenizer.chat_template = serving
        tokenizer.save_pretrained(str(tmp))
        swap_into_place(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    converted = None
    if cfg.convert.enabled:
        from serving.convert import convert_checkpoint

        target = cfg.convert.out or cfg.output_dir / "final-bf16"
        converted = convert_checkpoint(final, target, dtype=cfg.convert.dtype, overwrite=True).dst
    return final, converted
