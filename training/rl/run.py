"""What every RL backend checks and loads before training: the batch shape, the inputs, the
tasks and the tokenizer; the run directory (``astra-rl.json``: the config's fingerprint, so
that resuming into a different config is refused), the checkpoint to resume from and the final
save are the :class:`~training.run.TrainingRun`'s, opened here.

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
from training.run import TrainingRun, check_model

log = logging.getLogger(__name__)

RUN_FILE = RLConfig.RUN_FILE


@dataclass
class PreparedRun:
    tokenizer: Any
    serving: str
    run: TrainingRun  # the run directory, read (``run.begin()`` writes it)
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


def prepare(cfg: RLConfig) -> PreparedRun:
    """Check everything that can be checked and find the checkpoint to resume from, reading
    only (``PreparedRun.run.begin()`` writes the run directory): a config or input that is
    refused writes nothing."""
    from training.rl.batch import load_tasks
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
    run = TrainingRun.open(cfg, adopt_unsaved=True)
    return PreparedRun(tokenizer, serving, run, tasks, skipped, heldout)
