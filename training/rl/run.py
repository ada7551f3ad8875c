"""What every RL backend shares before and after training: input checks, the run directory
(``astra-rl.json``: the config's fingerprint, so that resuming into a different config is
refused), the checkpoint to resume from, and the final checkpoint converted for serving.

Everything that can be refused is checked before the run directory is written (the batch
shape, the checkpoint, the records: loaded, bad ones skipped with their reasons), and a run
directory in which nothing was saved yet takes a new config instead of refusing it."""

from __future__ import annotations

import logging
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
    resume: bool = False
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
    from training.metrics import METRICS_FILE

    if not (out / RUN_FILE).is_file():
        return False
    for p in out.iterdir():
        if p.name.startswith(("checkpoint-", "previous-")) or p.name in (FINAL_DIR, "final-bf16"):
            return False
    metrics = out / METRICS_FILE
    return not (metrics.is_file() and metrics.read_text(encoding="utf-8", errors="replace").strip())


def _adoptable(cfg: RLConfig) -> bool:
    """Whether ``output_dir`` holds a run of another config (or a corrupt run file) that
    saved nothing: such a directory takes the new config (see :func:`open_run_dir`)."""
    from training.sft.common import run_differences

    out = cfg.output_dir
    if not _saved_nothing(out):
        return False
    try:
        return bool(run_differences(out / RUN_FILE, cfg))
    except ConfigError:
        return True  # a corrupt run file: replaced


def open_run_dir(cfg: RLConfig, run: PreparedRun) -> None:
    """Write the run directory for ``run`` (once the model has loaded: a refused input writes
    nothing). A run directory that saved nothing takes the new config's fingerprint: nothing
    of the old run can be lost, so a run that was refused or failed at its start (a model
    that does not load, a server that does not start, Adaptive Batch Filling stalled at step
    1) does not lock its directory to the config that failed. Starting over (``resume:
    false``) sets the earlier run's checkpoints aside."""
    from training.sft.common import prepare_run_dir, set_aside, write_run_file

    if _adoptable(cfg):
        log.warning(
            "%s holds a run of another config that saved nothing: it starts anew", cfg.output_dir
        )
        write_run_file(cfg, cfg.output_dir / RUN_FILE)
    prepare_run_dir(cfg, RUN_FILE, "astra-train rl")
    if not run.resume:
        set_aside(cfg.output_dir)


def prepare(cfg: RLConfig) -> PreparedRun:
    """Check everything that can be checked and find the checkpoint to resume from, reading
    only (:func:`open_run_dir` writes the run directory): a config or input that is refused
    writes nothing."""
    from training.rl.batch import load_tasks
    from training.sft.common import check_run_dir, last_complete_checkpoint
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
    resume = not _adoptable(cfg) and check_run_dir(cfg, RUN_FILE, "astra-train rl")
    ckpt = last_complete_checkpoint(cfg.output_dir) if resume else None
    return PreparedRun(tokenizer, serving, ckpt, resume, tasks, skipped, heldout)


def finish(cfg: RLConfig, trainer: Any, tokenizer: Any, serving: str) -> tuple[Path, Path | None]:
    """``final/`` (HF layout, the serving template) and, if enabled, its bf16 conversion."""
    from training.sft.common import convert_final, save_final

    trainer.check_weights()
    final = save_final(cfg.output_dir, trainer.save_model, tokenizer, serving)
    return final, convert_final(cfg, final)
