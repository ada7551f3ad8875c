"""The paper's Table 2 in miniature, as one resumable command: procedural arenas → reference
trajectories (``run_episode`` with the replay model) → ``astra-train data sft`` → ``astra-train
sft`` → ``astra-train rl`` (GRPO, Adaptive Batch Filling, token-mean loss, rollouts through the
real vLLM server) from the SFT checkpoint; base, SFT and SFT+RL each served by vLLM and scored by
``astra-eval arenas`` on the held-out splits a, b, c and the hand-written held-out set, and by
``astra-eval bfcl`` on a BFCL slice (``eval.bfcl_categories``, the first ``bfcl_limit`` of each
category, of one fixed half with ``bfcl_half``); then the table (paired tests; a row per BFCL
group), the comparisons and the HTML report.

Every stage runs the CLI a user runs, as a child process, its output in ``OUT/logs``. A stage
whose output is complete is skipped, so a rerun after ``kill -9`` continues where it stopped
(SFT and RL resume from their newest checkpoint, the evals from their results). A rerun with
another config in the same ``OUT`` is refused with the differences named.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astra_agent.console import console
from astra_agent.errors import ConfigError
from eval.arenas.procedural import write_arenas
from training.run import CONVERTED_DIR, FINAL_DIR
from training.table2.config import ExperimentConfig
from training.table2.directory import MODELS, Experiment
from training.table2.table import write_table

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
    x.run(
        "data",
        "training.cli",
        "data",
        "sft",
        str(results),
        "--out",
        str(out),
        "--tokenizer",
        str(tokenizer),
    )


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


def _rl_from_sft(x: Experiment, name: str, out: Path, **extra: Any) -> None:
    """``astra-train rl`` from the SFT checkpoint on the training arenas into ``out`` (done when
    its converted checkpoint is there; a killed run resumes from its newest checkpoint)."""
    if (out / CONVERTED_DIR / "config.json").is_file():
        return
    over = {
        "model": str(x.need(x.path("sft", FINAL_DIR), "sft")),
        "train_files": [str(x.need(x.path("arenas", "train.jsonl"), "arenas"))],
        "heldout_files": [],
        "eval_every": 0,
        "output_dir": str(out),
        **x.cfg.rl,
        **extra,
    }
    recipe = x.recipe(name, x.cfg.rl_recipe, over)
    x.run(name, "training.cli", "rl", "--config", str(recipe))


def stage_rl(x: Experiment) -> None:
    _rl_from_sft(x, "rl", x.path("rl"))


def stage_ablation(x: Experiment) -> None:
    """One RL run per reward of ``ablation.rewards``, each as ``rl`` but for its reward (and
    ``ablation.steps``)."""
    ab = x.cfg.ablation
    steps = {"steps": ab.steps} if ab.steps else {}
    for reward in ab.rewards:
        _rl_from_sft(x, f"ablation-{reward}", x.ablation_dir(reward), reward=reward, **steps)


def stage_eval(x: Experiment, stage: str) -> None:
    """Serve the stage's model once; score it on each split and the BFCL slice."""
    from serving.server import ModelServer, free_port, load_serve_config

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
        x.cfg.profile,
        **x.cfg.serve,
        model=model,
        port=free_port(),
        served_model_name=stage,
        log_file=x.path("logs", f"vllm-{stage}.log"),
    )
    common = [
        "--temperature",
        "0",
        "--concurrency",
        str(ev.concurrency),
        "--set",
        f"model.max_tokens={ev.max_tokens}",
    ]
    with ModelServer(cfg) as srv:
        for s in todo:
            out = x.eval_dir(stage, s)
            resume = ["--resume"] if out.exists() else []
            x.run(
                f"eval-{stage}",
                "eval",
                "arenas",
                "--data",
                str(x.split_file(s)),
                "--out",
                str(out),
                "--base-url",
                srv.base_url,
                "--max-steps",
                str(ev.max_steps),
                *common,
                *resume,
            )
        if do_bfcl:
            resume = ["--resume"] if bfcl.exists() else []
            x.run(
                f"eval-{stage}",
                "eval",
                "bfcl",
                "--categories",
                ev.bfcl_categories,
                "--limit",
                str(ev.bfcl_limit),
                "--out",
                str(bfcl),
                "--base-url",
                srv.base_url,
                *(["--half", ev.bfcl_half] if ev.bfcl_half else []),
                *common,
                *resume,
            )


def stage_table(x: Experiment) -> None:
    write_table(x)


RUNNERS: dict[str, Callable[[Experiment], None]] = {
    "arenas": stage_arenas,
    "model": stage_model,
    "replay": stage_replay,
    "data": stage_data,
    "sft": stage_sft,
    "rl": stage_rl,
    **{f"eval-{m}": functools.partial(stage_eval, stage=m) for m in MODELS},
    "ablation": stage_ablation,
    "table": stage_table,
}
STAGES = tuple(RUNNERS)  # in the order they run


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
