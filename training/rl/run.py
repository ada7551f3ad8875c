"""What every RL backend shares before and after training: input checks, the run directory
(``astra-rl.json``: the config's fingerprint, so that resuming into a different config is
refused), the checkpoint to resume from, and the final checkpoint converted for serving."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from training.rl.config import RLConfig

RUN_FILE = "astra-rl.json"
FINAL_DIR = "final"


@dataclass
class PreparedRun:
    tokenizer: Any
    serving: str
    checkpoint: Path | None


def check_inputs(cfg: RLConfig) -> None:
    from training.sft.common import check_model

    check_model(cfg.model)
    for p in [*cfg.train_files, *cfg.heldout_files]:
        if not Path(p).is_file():
            raise ConfigError(
                f"arena records not found: {p}",
                hint="ASTRA-RL-1k records or our arena files (eval/arenas/data/*.jsonl)",
            )


def prepare(cfg: RLConfig) -> PreparedRun:
    """Check the inputs, then create or re-open the run directory."""
    from training.sft.common import last_complete_checkpoint, prepare_run_dir
    from training.template import load_tokenizer, serving_template

    check_inputs(cfg)
    tokenizer = load_tokenizer(cfg.model)
    serving = serving_template(tokenizer)
    resume = prepare_run_dir(cfg, RUN_FILE, "astra-train rl")
    ckpt = last_complete_checkpoint(cfg.output_dir) if resume else None
    return PreparedRun(tokenizer, serving, ckpt)


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
