"""The directory of one experiment: claimed by its config's fingerprint (``experiment.json``),
the stages' paths in it, and the child processes that write them (``OUT/logs``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from astra_agent.claim import Claim, Refusal
from astra_agent.config import deep_merge, read_mapping
from astra_agent.errors import AstraError, ConfigError
from astra_agent.runio import write_text_atomic
from eval.arenas import DATA_DIR
from serving.server import REPO_ROOT
from training.run import CONVERTED_DIR
from training.table2.config import ExperimentConfig

HELDOUT = DATA_DIR / "heldout.jsonl"  # the hand-written held-out arenas
MODELS = ("base", "sft", "rl")  # the models compared, in order


EXPERIMENT = "experiment.json"


_OTHER_EXPERIMENT = Refusal(
    "{dir} holds an experiment of another config: {differences}",
    hint="rerun with the config it was started with, or pick a new --out",
)


class Experiment:
    """The directory of one experiment and the stages' paths in it."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg, self.out = cfg, cfg.out.resolve()

    def path(self, *parts: str) -> Path:
        return self.out.joinpath(*parts)

    def model_dir(self, stage: str) -> Path:
        """The bf16 checkpoint each compared model is served from."""
        if stage == "base":
            return self.cfg.model.resolve() if self.cfg.model else self.path("base-model")
        return self.path(stage, CONVERTED_DIR)

    def split_file(self, split: str) -> Path:
        return HELDOUT if split == "heldout" else self.path("arenas", f"{split}.jsonl")

    def eval_dir(self, stage: str, split: str) -> Path:
        return self.path("eval", f"{stage}-{split}")

    def ablation_dir(self, reward: str) -> Path:
        """The reward ablation's RL run that trains on ``reward``."""
        return self.path("ablation", reward)

    def open(self) -> None:
        """Create OUT with the config's fingerprint (``experiment.json``), or check it against
        the one there."""
        claim = Claim(self.out, EXPERIMENT, self.cfg.fingerprint(), _OTHER_EXPERIMENT)
        claim.check_place("out", hint="name a directory")
        if not claim.check():
            claim.write()

    def need(self, path: Path, stage: str) -> Path:
        """``path``, an input of a later stage; missing: a ConfigError naming its stage."""
        if not path.exists():
            raise ConfigError(
                f"{path} is missing: it is written by the {stage!r} stage",
                hint=f"run it first: astra-train table2 run --config ... --stages {stage}",
            )
        return path

    def run(self, stage: str, *args: str, env: dict[str, str] | None = None) -> None:
        """``python -m ARGS`` as a child process, its output in ``OUT/logs/STAGE.log``."""
        log = self.path("logs", f"{stage}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as f:
            f.write(f"\n$ python -m {' '.join(args)}\n")
            f.flush()
            code = _supervised([sys.executable, "-m", *args], f, {**(env or {})})
        if code:
            tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
            raise AstraError(
                f"stage {stage}: `python -m {' '.join(args[:3])} …` exited {code}:\n{tail}",
                hint=f"the whole output is in {log}; rerun the same command to continue",
            )

    def recipe(self, name: str, base: Path, over: dict[str, Any]) -> Path:
        """The recipe ``base`` with ``over`` merged in, as ``OUT/recipes/NAME.yaml``."""
        path = self.path("recipes", f"{name}.yaml")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, yaml.safe_dump(deep_merge(read_mapping(base), over)))
        return path


def _supervised(command: list[str], log: Any, env: dict[str, str]) -> int:
    """Run ``command`` with its output in ``log``; its exit status. It dies with this process
    (a ``kill -9`` of the experiment leaves no stage training on); on Ctrl-C or any error here
    it gets SIGTERM (TRL runs stop cleanly, checkpoints whole), then SIGKILL after a minute."""
    from astra_agent.procs import dies_with, stop_group

    proc = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "160", **env},
        preexec_fn=dies_with(os.getpid()),
    )
    try:
        return proc.wait()
    except BaseException:
        stop_group(proc, grace_s=60.0)
        raise
