"""The paper's Table 2 in miniature, as one resumable command: procedural arenas → reference
trajectories (``run_episode`` with the replay model) → ``astra-train data sft`` → ``astra-train
sft`` → ``astra-train rl`` (GRPO, Adaptive Batch Filling, token-mean loss, rollouts through the
real vLLM server) from the SFT checkpoint; base, SFT and SFT+RL each served by vLLM and scored by
``astra-eval arenas`` on the held-out splits a, b, c and the hand-written held-out set, and by
``astra-eval bfcl`` on a BFCL-V3 multi-turn slice; then the table (paired tests), the
comparisons and the HTML report.

Every stage runs the CLI a user runs, as a child process, its output in ``OUT/logs``. A stage
whose output is complete is skipped, so a rerun after ``kill -9`` continues where it stopped
(SFT and RL resume from their newest checkpoint, the evals from their results). A rerun with
another config in the same ``OUT`` is refused with the differences named.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from astra_agent.claim import Claim, Refusal
from astra_agent.config import deep_merge, read_mapping
from astra_agent.console import console
from astra_agent.errors import AstraError, ConfigError
from astra_agent.runio import write_text_atomic
from training.table2.arenagen import MANIFEST, GenSpec, write_arenas

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "training" / "recipes"
STAGE_MODELS = ("base", "sft", "rl")  # the models compared, in order
STAGES = (
    "arenas", "model", "replay", "data", "sft", "rl", "eval-base", "eval-sft", "eval-rl", "table",
)  # fmt: skip
SPLIT_NAMES = ("a", "b", "c", "heldout")
HELDOUT = REPO / "eval" / "arenas" / "data" / "heldout.jsonl"


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    splits: list[str] = Field(
        default_factory=lambda: list(SPLIT_NAMES),
        description="arena sets scored for each model: a, b, c (generated), heldout (ours)",
    )
    bfcl_limit: int = Field(10, ge=0, description="BFCL-V3 multi-turn entries (0: none)")
    bfcl_categories: str = Field("base", description="BFCL categories of the slice")
    concurrency: int = Field(16, ge=1, description="episodes at once against vLLM")
    max_tokens: int = Field(256, ge=16, description="tokens per reply")
    max_steps: int = Field(8, ge=1, description="model calls per arena task")

    @field_validator("splits")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        bad = [s for s in v if s not in SPLIT_NAMES]
        if bad or len(set(v)) != len(v) or not v:
            raise ValueError(f"splits must be distinct names of {SPLIT_NAMES}, got {v}")
        return v


class ExperimentConfig(BaseModel):
    """One experiment: where it writes, the base model, the arenas, the SFT and RL recipes
    (each a shipped recipe file with overrides) and the evaluation."""

    model_config = ConfigDict(extra="forbid")
    out: Path = Field(Path("runs/table2"), description="experiment directory")
    model: Path | None = Field(
        None, description="base HF checkpoint (default: SmolLM2-135M-Instruct from its GGUF)"
    )
    profile: str = Field("instruct-cpu", description="astra-serve profile of every model")
    serve: dict[str, Any] = Field(
        default_factory=dict,
        description="overrides of the profile for the eval servers, e.g. {engine: hf, device: "
        "cuda} where vLLM is not installed",
    )
    arenas: GenSpec = Field(default_factory=GenSpec)
    reasoning: bool = Field(False, description="reference trajectories carry reasoning")
    sft_recipe: Path = Field(RECIPES / "sft-smollm2-cpu.yaml", description="SFT recipe")
    sft: dict[str, Any] = Field(default_factory=dict, description="overrides of the SFT recipe")
    rl_recipe: Path = Field(RECIPES / "rl-smollm2-cpu.yaml", description="RL recipe")
    rl: dict[str, Any] = Field(default_factory=dict, description="overrides of the RL recipe")
    eval: EvalSettings = Field(default_factory=EvalSettings)

    @field_validator("serve")
    @classmethod
    def _serve_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        from serving.server import ServeConfig

        own = {"model", "port", "served_model_name", "log_file"}
        bad = sorted(k for k in v if k in own or k not in ServeConfig.model_fields)
        if bad:
            raise ValueError(
                f"{', '.join(bad)} cannot be set here: the experiment sets model, port, name "
                "and log; the rest must be astra-serve config fields"
            )
        return v

    def fingerprint(self) -> dict[str, Any]:
        """What the results depend on: all but where they go and how fast evals run (no
        ``serve`` when it is empty: experiments started before it existed still match)."""
        data = self.model_dump(
            mode="json", exclude={"out"} | ({"serve"} if not self.serve else set())
        )
        data["eval"].pop("concurrency")
        for key in ("sft_recipe", "rl_recipe"):
            data[key] = read_mapping(getattr(self, key))
        return data


def load_experiment(path: Path | None, overrides: dict[str, Any]) -> ExperimentConfig:
    from astra_agent.config import load_config

    return load_config(ExperimentConfig, path, overrides, env_prefix="ASTRA_TABLE2_")


# ------------------------------------------------------------------ the run directory


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
        return self.path(stage, "final-bf16")

    def split_file(self, split: str) -> Path:
        return HELDOUT if split == "heldout" else self.path("arenas", f"{split}.jsonl")

    def eval_dir(self, stage: str, split: str) -> Path:
        return self.path("eval", f"{stage}-{split}")

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
        command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        env={**os.environ, "COLUMNS": "160", **env}, preexec_fn=dies_with(os.getpid()),
    )  # fmt: skip
    try:
        return proc.wait()
    except BaseException:
        stop_group(proc, grace_s=60.0)
        raise


# ------------------------------------------------------------------ the stages


def stage_arenas(x: Experiment) -> None:
    write_arenas(x.path("arenas"), x.cfg.arenas)


def stage_model(x: Experiment) -> None:
    if x.cfg.model is not None:
        x.need(x.cfg.model / "config.json", "model")
        return
    if (x.path("base-model") / "config.json").is_file():
        return
    from serving.gguf import SMOLLM2, bundled_gguf, import_gguf

    import_gguf(bundled_gguf(SMOLLM2), x.path("base-model"), overwrite=True)


def stage_replay(x: Experiment) -> None:
    from training.replay import replay_arenas

    out = x.path("replay")
    if (out / "summary.json").is_file():
        return
    shutil.rmtree(out, ignore_errors=True)  # a killed replay: it takes seconds to redo
    data = x.need(x.path("arenas", "train.jsonl"), "arenas")
    asyncio.run(replay_arenas(data, out, concurrency=8, reasoning=x.cfg.reasoning))


def stage_data(x: Experiment) -> None:
    out = x.path("sft-data")
    if (out / "stats.json").is_file():
        return
    shutil.rmtree(out, ignore_errors=True)
    results = x.need(x.path("replay", "results.jsonl"), "replay")
    tokenizer = x.need(x.model_dir("base"), "model")
    x.run("data", "training.cli", "data", "sft", str(results), "--out", str(out),
          "--tokenizer", str(tokenizer))  # fmt: skip


def stage_sft(x: Experiment) -> None:
    if (x.model_dir("sft") / "config.json").is_file():
        return
    over = {
        "model": str(x.need(x.model_dir("base"), "model")),
        "train_files": [str(x.need(x.path("sft-data", "sft.parquet"), "data"))],
        "output_dir": str(x.path("sft")),
        **x.cfg.sft,
    }
    recipe = x.recipe("sft", x.cfg.sft_recipe, over)
    x.run("sft", "training.cli", "sft", "--config", str(recipe))


def stage_rl(x: Experiment) -> None:
    if (x.model_dir("rl") / "config.json").is_file():
        return
    over = {
        "model": str(x.need(x.path("sft", "final"), "sft")),
        "train_files": [str(x.need(x.path("arenas", "train.jsonl"), "arenas"))],
        "heldout_files": [],
        "eval_every": 0,
        "output_dir": str(x.path("rl")),
        **x.cfg.rl,
    }
    recipe = x.recipe("rl", x.cfg.rl_recipe, over)
    x.run("rl", "training.cli", "rl", "--config", str(recipe))


def stage_eval(x: Experiment, stage: str) -> None:
    """Serve the stage's model once; score it on each split and the BFCL slice."""
    from serving.server import VLLMServer, free_port, load_serve_config

    ev = x.cfg.eval
    todo = [s for s in ev.splits if not (x.eval_dir(stage, s) / "summary.json").is_file()]
    bfcl = x.eval_dir(stage, "bfcl")
    do_bfcl = ev.bfcl_limit > 0 and not (bfcl / "summary.json").is_file()
    if not todo and not do_bfcl:
        return
    model = x.need(x.model_dir(stage), stage if stage != "base" else "model")
    for s in todo:
        x.need(x.split_file(s), "arenas")
    cfg = load_serve_config(
        x.cfg.profile, **x.cfg.serve, model=model, port=free_port(), served_model_name=stage,
        log_file=x.path("logs", f"vllm-{stage}.log"),
    )  # fmt: skip
    common = ["--temperature", "0", "--concurrency", str(ev.concurrency),
              "--set", f"model.max_tokens={ev.max_tokens}"]  # fmt: skip
    with VLLMServer(cfg) as srv:
        for s in todo:
            out = x.eval_dir(stage, s)
            resume = ["--resume"] if out.exists() else []
            x.run(f"eval-{stage}", "eval", "arenas", "--data", str(x.split_file(s)),
                  "--out", str(out), "--base-url", srv.base_url, "--max-steps",
                  str(ev.max_steps), *common, *resume)  # fmt: skip
        if do_bfcl:
            resume = ["--resume"] if bfcl.exists() else []
            x.run(f"eval-{stage}", "eval", "bfcl", "--categories", ev.bfcl_categories,
                  "--limit", str(ev.bfcl_limit), "--out", str(bfcl),
                  "--base-url", srv.base_url, *common, *resume)  # fmt: skip


def stage_table(x: Experiment) -> None:
    from training.table2.table import write_table

    write_table(x)


RUNNERS: dict[str, Callable[[Experiment], None]] = {
    "arenas": stage_arenas,
    "model": stage_model,
    "replay": stage_replay,
    "data": stage_data,
    "sft": stage_sft,
    "rl": stage_rl,
    "eval-base": lambda x: stage_eval(x, "base"),
    "eval-sft": lambda x: stage_eval(x, "sft"),
    "eval-rl": lambda x: stage_eval(x, "rl"),
    "table": stage_table,
}


def run_experiment(cfg: ExperimentConfig, stages: list[str] | None = None) -> dict[str, float]:
    """Run ``stages`` (default: all, in order); each one's wall time, also appended to
    ``OUT/timings.jsonl``."""
    chosen = stages or list(STAGES)
    unknown = [s for s in chosen if s not in STAGES]
    if unknown:
        raise ConfigError(f"unknown stage(s) {unknown}", hint=f"stages: {', '.join(STAGES)}")
    x = Experiment(cfg)
    x.open()
    walls: dict[str, float] = {}
    for stage in [s for s in STAGES if s in chosen]:
        console.print(f"[bold]{stage}[/] …")
        t0 = time.monotonic()
        RUNNERS[stage](x)
        walls[stage] = round(time.monotonic() - t0, 1)
        console.print(f"[green]{stage}[/] done in {walls[stage]:.1f} s")
        with x.path("timings.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps({"stage": stage, "wall_s": walls[stage], "at": time.time()}) + "\n")
    return walls


__all__ = ["MANIFEST", "STAGES", "Experiment", "ExperimentConfig", "run_experiment"]
