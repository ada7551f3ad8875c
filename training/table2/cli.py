"""``astra-train table2``: the procedural arenas, and the base → SFT → RL experiment on them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from astra_agent.console import cli_errors, console
from astra_agent.options import comma_names, config_flags
from eval.arenas.procedural.generator import GenSpec
from training.table2.config import ExperimentConfig

table2_app = typer.Typer(
    help="The paper's Table 2 in miniature: base → SFT → RL on a real model, measured on arenas "
    "it never saw.\n\n"
    "Example: astra-train table2 run --config training/recipes/table2-smollm2-cpu.yaml\n\n"
    "Example: astra-train table2 generate --out runs/arenas-gen --seed 1",
    no_args_is_help=True,
)


@table2_app.command("generate")
@cli_errors
@config_flags(GenSpec, ("seed", "train_tasks", "eval_tasks", "signature_holdout_pct"))
def generate_cmd(
    out: Annotated[Path, typer.Option(help="Directory for train/a/b/c.jsonl and arenas.json.")],
    heldout_domains: Annotated[
        str | None,
        typer.Option(help="Comma-separated domains of split c (default: domains.yaml's)."),
    ] = None,
    *,
    overrides: dict[str, Any],
) -> None:
    """Write seeded procedural arenas: train.jsonl and the held-out splits a (new values),
    b (held-out chain signatures), c (unseen domains), in the ASTRA-RL record format that
    `astra-eval arenas validate` checks and the sandbox runs.

    Example: astra-train table2 generate --out runs/arenas-gen --train-tasks 400 --eval-tasks 60
    """
    from astra_agent.config import load_config
    from eval.arenas.procedural.generator import write_arenas

    if heldout_domains is not None:
        overrides["heldout_domains"] = comma_names(
            heldout_domains, "--heldout-domains", "astronomy,brewing"
        )
    spec = load_config(GenSpec, None, overrides, environ={})
    paths = write_arenas(out, spec)
    for split, path in paths.items():
        n = sum(1 for _ in path.open(encoding="utf-8"))
        console.print(f"{split:<6} {n:>6} tasks  {path}")


@table2_app.command("run")
@cli_errors
@config_flags(ExperimentConfig, ("out",), helps={"out": "experiment directory"})
def run_cmd(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Experiment config (YAML/JSON).")
    ] = None,
    stages: Annotated[
        str | None,
        typer.Option(help="Comma-separated stages to run (default: all, in order)."),
    ] = None,
    *,
    overrides: dict[str, Any],
) -> None:
    """Run the experiment (or some of its stages): arenas, model, replay, data, sft, rl,
    eval-base, eval-sft, eval-rl, ablation, table. A stage already complete is skipped; after a
    kill the same command continues; another config in the same --out is refused. The
    ablation stage runs only where ablation.rewards names rewards.

    Example: astra-train table2 run --config training/recipes/table2-smollm2-cpu.yaml

    Example: astra-train table2 run -c training/recipes/table2-smollm2-cpu.yaml --stages table

    Example (the reward ablation): astra-train table2 run -c
    training/recipes/table2-general-cpu.yaml --set "ablation.rewards=[f1, recall, precision]"
    --stages arenas,model,replay,data,sft,ablation,table
    """
    from training.table2.config import load_experiment
    from training.table2.experiment import run_experiment

    names = None if stages is None else comma_names(stages, "--stages", "eval-sft,table")
    cfg = load_experiment(config, overrides)
    walls = run_experiment(cfg, names)
    console.print(f"{len(walls)} stage(s) in {sum(walls.values()):.0f} s: {cfg.out}")
