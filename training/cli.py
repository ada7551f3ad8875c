"""``astra-train``: SFT data from trajectories, and SFT with TRL (one machine) or verl (cluster)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from astra_agent.config import load_config
from astra_agent.console import cli_errors, console, err_console
from astra_agent.options import common_callback
from training.data_cli import data_app
from training.synth.cli import synth_app

app = typer.Typer(
    name="astra-train",
    help="Train ASTRA: trajectories → SFT data → SFT → multi-turn RL (TRL on one machine, "
    "verl on a cluster).\n\n"
    "Example: astra-train sft --config training/recipes/sft-tiny-cpu.yaml --output-dir runs/sft\n\n"
    "Example: astra-train rl --config training/recipes/rl-tiny-cpu.yaml --output-dir runs/rl\n\n"
    "Example: astra-train synth pool --mcp-config mcp.json --out synth/pool",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
common_callback(app, "astra-train")
app.add_typer(data_app, name="data")
app.add_typer(synth_app, name="synth")  # data synthesis: tool pool → graph → chains

ENV_PREFIX = "ASTRA_TRAIN_"


@contextmanager
def _progress() -> Iterator[Any]:
    """A bar of optimizer steps (done/total, elapsed) and the last logged loss."""
    bar = Progress(
        TextColumn("[bold]sft"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[loss]}"),
        console=err_console,
    )
    with bar:
        job = bar.add_task("sft", total=None, loss="")

        def hook(step: int, total: int, loss: float | None) -> None:
            bar.update(job, completed=step, total=total or None)
            if loss is not None:
                bar.update(job, loss=f"loss {loss:.4f}")

        yield hook


def _overrides(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None and v != []}


@app.command()
@cli_errors
def sft(
    config: Annotated[Path, typer.Option("--config", "-c", help="Recipe (YAML or JSON).")],
    output_dir: Annotated[Path | None, typer.Option(help="Run directory.")] = None,
    model: Annotated[Path | None, typer.Option(help="HF checkpoint to start from.")] = None,
    train_file: Annotated[
        list[Path] | None, typer.Option(help="Parquet of `astra-train data sft` (repeatable).")
    ] = None,
    backend: Annotated[str | None, typer.Option(help="trl or verl.")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Optimizer steps (over epochs).")] = None,
    epochs: Annotated[float | None, typer.Option(help="Passes over the data.")] = None,
    learning_rate: Annotated[float | None, typer.Option(help="Peak learning rate.")] = None,
    global_batch_size: Annotated[int | None, typer.Option(help="Sequences per step.")] = None,
    micro_batch_size: Annotated[int | None, typer.Option(help="Sequences per forward.")] = None,
    max_length: Annotated[int | None, typer.Option(help="Tokens per sequence.")] = None,
    save_steps: Annotated[int | None, typer.Option(help="Checkpoint every N steps.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    resume: Annotated[
        bool | None, typer.Option(help="Continue from the newest complete checkpoint.")
    ] = None,
) -> None:
    """Supervised fine-tuning from a recipe; flags and ASTRA_TRAIN_* variables override it.

    Example: astra-train sft --config training/recipes/sft-tiny-cpu.yaml --output-dir runs/sft
    --max-steps 200
    """
    from training.sft.config import SFTConfig

    cfg = load_config(
        SFTConfig,
        config,
        _overrides(
            output_dir=output_dir,
            model=model,
            train_files=train_file,
            backend=backend,
            max_steps=max_steps,
            epochs=epochs,
            learning_rate=learning_rate,
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            max_length=max_length,
            save_steps=save_steps,
            seed=seed,
            resume=resume,
        ),
        env_prefix=ENV_PREFIX,
    )
    if cfg.backend == "verl":
        from training.sft.verl import run_verl

        job = run_verl(cfg)
        console.print(f"verl config: {job.config_file} (overrides: {job.overrides_file})")
        if not job.ran:
            console.print(f"launch it with: bash {job.launch_script}   (or set verl.run: true)")
        elif job.final:
            console.print(f"converted for serving: {job.final}")
        return
    from training.sft.trl import run_trl

    with _progress() as hook:
        result = run_trl(cfg, hook)
    if result.resumed_from:
        console.print(f"resumed from {result.resumed_from}")
    console.print(f"trained {result.steps} steps: {result.final}")
    if result.converted:
        console.print(f"converted for serving: {result.converted}")
    console.print(f"metrics: {cfg.output_dir}/metrics.jsonl")


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _rl_progress(step: int, total: int, rec: dict[str, Any]) -> None:
    abf = rec.get("abf") or {}
    line = (
        f"rl step {step}/{total}  reward {rec.get('reward_mean', 0):.3f} "
        f"(sampled {rec.get('reward_mean_sampled', 0):.3f})  solved {rec.get('solved', 0):.2f}  "
        f"abf {abf.get('valid', 0)}/{abf.get('sampled', 0)} valid, "
        f"buffered {abf.get('buffered', 0)}  "
        f"rollout {rec.get('rollout_s', 0):.1f}s update {rec.get('update_s') or 0:.1f}s"
    )
    if "eval_reward" in rec:
        line += f"  held-out {rec['eval_reward']:.3f}"
    err_console.print(line, highlight=False)


@app.command()
@cli_errors
def rl(
    config: Annotated[Path, typer.Option("--config", "-c", help="Recipe (YAML or JSON).")],
    output_dir: Annotated[Path | None, typer.Option(help="Run directory.")] = None,
    model: Annotated[Path | None, typer.Option(help="HF checkpoint to start from.")] = None,
    train_file: Annotated[
        list[Path] | None, typer.Option(help="Arena records, JSONL or parquet (repeatable).")
    ] = None,
    heldout_file: Annotated[
        list[Path] | None, typer.Option(help="Held-out arena records (repeatable).")
    ] = None,
    backend: Annotated[str | None, typer.Option(help="trl or verl.")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimizer steps.")] = None,
    group_size: Annotated[int | None, typer.Option(help="Rollouts per prompt.")] = None,
    batch_groups: Annotated[int | None, typer.Option(help="Valid groups per step.")] = None,
    learning_rate: Annotated[float | None, typer.Option(help="Learning rate.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    resume: Annotated[
        bool | None, typer.Option(help="Continue from the newest complete checkpoint.")
    ] = None,
) -> None:
    """Multi-turn RL with verifiable rewards on arena tasks (GRPO, Adaptive Batch Filling,
    token-mean loss); flags and ASTRA_TRAIN_* variables override the recipe.

    Example: astra-train rl --config training/recipes/rl-tiny-cpu.yaml --model runs/sft-tiny/final
    --output-dir runs/rl --steps 20
    """
    from training.rl.config import RLConfig

    cfg = load_config(
        RLConfig,
        config,
        _overrides(
            output_dir=output_dir,
            model=model,
            train_files=train_file,
            heldout_files=heldout_file,
            backend=backend,
            steps=steps,
            group_size=group_size,
            batch_groups=batch_groups,
            learning_rate=learning_rate,
            seed=seed,
            resume=resume,
        ),
        env_prefix=ENV_PREFIX,
    )
    if cfg.backend == "verl":
        from training.rl.verl import run_verl

        job = run_verl(cfg)
        console.print(f"verl config: {job.config_file} (overrides: {job.overrides_file})")
        if not job.ran:
            console.print(f"launch it with: bash {job.launch_script}   (or set verl.run: true)")
        elif job.final:
            console.print(f"converted for serving: {job.final}")
        return
    from training.rl.trl import run_trl

    # SIGTERM (a scheduler's stop, `kill`) unwinds like Ctrl-C, so the rollout server and the
    # sandboxes are stopped on the way out instead of outliving the trainer
    signal.signal(signal.SIGTERM, _terminate)
    result = run_trl(cfg, _rl_progress)
    if result.resumed_from:
        console.print(f"resumed from {result.resumed_from}")
    if result.skipped_records:
        console.print(f"skipped {len(result.skipped_records)} record(s) that failed to load")
    console.print(f"trained {result.steps} steps: {result.final}")
    if result.converted:
        console.print(f"converted for serving: {result.converted}")
    console.print(f"metrics: {cfg.output_dir}/metrics.jsonl")


if __name__ == "__main__":
    app()
