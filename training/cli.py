"""``astra-train``: the researchers' commands — ``data`` (SFT data from trajectories), ``synth``
(tool-grounded SFT data and verifiable environments from MCP tool graphs), ``sft`` and ``rl``
(TRL on one machine, verl on a cluster), and ``table2`` (base → SFT → RL measured on arenas the
model never saw)."""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from astra_agent.config import load_config
from astra_agent.console import cli_errors, console, err_console
from astra_agent.options import common_callback, config_flags
from training.data_cli import data_app
from training.rl.config import RLConfig
from training.sft.config import SFTConfig
from training.synth.cli import synth_app
from training.table2.cli import table2_app

# TRL's trainers send a usage record to huggingface.co from a background thread at start-up;
# training here reads and writes local files only, so that is off unless the user sets it.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

app = typer.Typer(
    name="astra-train",
    help="Train ASTRA: trajectories → SFT data → SFT → multi-turn RL (TRL on one machine, "
    "verl on a cluster).\n\n"
    "Example: astra-train sft --config training/recipes/sft-tiny-cpu.yaml --output-dir runs/sft\n\n"
    "Example: astra-train rl --config training/recipes/rl-tiny-cpu.yaml --output-dir runs/rl\n\n"
    "Example: astra-train synth pool --mcp-config mcp.json --out synth/pool\n\n"
    "Example: astra-train table2 run --config training/recipes/table2-smollm2-cpu.yaml",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
common_callback(app, "astra-train")
app.add_typer(data_app, name="data")
app.add_typer(synth_app, name="synth")  # data synthesis: tool pool → graph → chains
app.add_typer(table2_app, name="table2")  # base → SFT → RL measured on unseen arenas

if TYPE_CHECKING:
    from training.metrics import RLStep
    from training.rl.trl import RLResult
    from training.run import FinishedRun
    from training.sft.trl import SFTResult
    from training.verl_job import VerlJob

ENV_PREFIX = "ASTRA_TRAIN_"
_STOPPED_BY: list[int] = []  # the signals that stopped the running command (SIGINT, SIGTERM)


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a scheduler's stop, `kill`) takes Ctrl-C's path: while a rollout runs on an
    ``asyncio.Runner``, the Runner's own SIGINT handler cancels its task (the rollout's tasks
    unwind, none left to fail on a closed sandbox pool) and then raises KeyboardInterrupt;
    elsewhere Python's default raises it at once."""
    _STOPPED_BY.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not _on_stop_signal:
        handler(signal.SIGINT, frame)
        return
    raise KeyboardInterrupt


@contextmanager
def _stoppable(output_dir: Path) -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM stop a TRL run cleanly: the trainer unwinds (rollout server
    and sandboxes stopped on the way), checkpoints already saved stay whole. A shell starts a
    background job (`astra-train sft ... &`) with SIGINT ignored, and Python keeps it ignored:
    the default handler is restored here, as `astra-serve up` does. One line on stderr says
    what stopped the run and where a rerun resumes; the exit code is 128 + the signal
    (130, 143)."""
    from training.run import last_complete_checkpoint

    _STOPPED_BY.clear()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_stop_signal)
    try:
        yield
    except KeyboardInterrupt:
        if not _STOPPED_BY:  # Ctrl-C: Python's own handler raised it
            _STOPPED_BY.append(signal.SIGINT)
        signum = _STOPPED_BY[0]
        ckpt = last_complete_checkpoint(output_dir)
        resume = (
            f"the same command resumes from {ckpt}"
            if ckpt
            else "no checkpoint was saved yet: the same command starts over"
        )
        err_console.print(
            f"stopped by {signal.Signals(signum).name}: {resume}",
            soft_wrap=True, markup=False, highlight=False,
        )  # fmt: skip
        raise typer.Exit(128 + signum) from None
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _say_finished(done: FinishedRun, output_dir: Path) -> None:
    """A rerun of a finished run: what (if anything) it wrote, and where the model is."""
    if done.wrote:
        console.print(
            f"the run had finished at {done.checkpoint.name} ({done.steps} steps); "
            f"written from it: {', '.join(done.wrote)}"
        )
    else:
        console.print(
            f"{output_dir} holds a finished run ({done.steps} steps): nothing to do "
            "(--no-resume trains it again from the start)"
        )
    console.print(f"final model: {done.final}")
    if done.converted:
        console.print(f"converted for serving: {done.converted}")


def _say_verl(job: VerlJob) -> None:
    """What ``astra-train sft|rl`` with ``backend: verl`` wrote, and what it ran."""
    console.print(f"verl config: {job.config_file} (overrides: {job.overrides_file})")
    if not job.ran:
        console.print(f"launch it with: bash {job.launch_script}   (or set verl.run: true)")
    elif job.final:
        console.print(f"converted for serving: {job.final}")


def _say_trained(result: SFTResult | RLResult, output_dir: Path) -> None:
    """The end of a TRL run of ``sft`` or ``rl``: where the model and metrics are."""
    if result.rerun:
        _say_finished(result.rerun, output_dir)
        return
    if result.resumed_from:
        console.print(f"resumed from {result.resumed_from}")
    console.print(f"trained {result.steps} steps: {result.final}")
    if result.converted:
        console.print(f"converted for serving: {result.converted}")
    console.print(f"metrics: {output_dir}/metrics.jsonl")


@contextmanager
def _progress() -> Iterator[Any]:
    """A bar of optimizer steps (done/total, elapsed) and the last logged loss, shown from the
    first step on (a rerun of a finished run shows none)."""
    bar = Progress(
        TextColumn("[bold]sft"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[loss]}"),
        console=err_console,
    )
    job = bar.add_task("sft", total=None, loss="")

    def hook(step: int, total: int, loss: float | None) -> None:
        if not bar.live.is_started:
            bar.start()
        bar.update(job, completed=step, total=total or None)
        if loss is not None:
            bar.update(job, loss=f"loss {loss:.4f}")

    try:
        yield hook
    finally:
        if bar.live.is_started:
            bar.stop()


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Recipe (YAML or JSON).")]
SFT_FLAGS = (
    "output_dir", "model", "train_files", "backend", "max_steps", "epochs", "learning_rate",
    "global_batch_size", "micro_batch_size", "max_length", "save_steps", "seed", "resume",
)  # fmt: skip
RL_FLAGS = (
    "output_dir", "model", "train_files", "heldout_files", "backend", "steps", "group_size",
    "batch_groups", "learning_rate", "seed", "resume",
)  # fmt: skip


@app.command()
@cli_errors
@config_flags(
    SFTConfig,
    SFT_FLAGS,
    flags={"train_files": "train_file"},
    helps={"max_steps": "optimizer steps (overrides epochs)"},
)
def sft(config: ConfigOpt, overrides: dict[str, Any]) -> None:
    """Supervised fine-tuning from a recipe; ASTRA_TRAIN_* variables, --set and the flags
    override it (a default shown applies where the recipe sets nothing).

    Example: astra-train sft --config training/recipes/sft-tiny-cpu.yaml --output-dir runs/sft
    --max-steps 200 --set trl.threads=2
    """
    cfg = load_config(SFTConfig, config, overrides, env_prefix=ENV_PREFIX)
    if cfg.backend == "verl":
        from training.sft.verl import run_verl

        _say_verl(run_verl(cfg))
        return
    from training.sft.trl import run_trl

    with _stoppable(cfg.output_dir), _progress() as hook:
        result = run_trl(cfg, hook)
    _say_trained(result, cfg.output_dir)


def _rl_progress(step: int, total: int, rec: RLStep) -> None:
    r, abf = rec.rollouts, rec.rollouts.abf
    line = (
        f"rl step {step}/{total}  reward {r.reward_mean:.3f} "
        f"(sampled {r.reward_mean_sampled:.3f})  solved {r.solved:.2f}  "
        f"abf {abf.valid}/{abf.sampled} valid, buffered {abf.buffered}  "
        f"rollout {r.rollout_s:.1f}s update {rec.update.update_s or 0:.1f}s"
    )
    if rec.heldout is not None:
        line += f"  held-out {rec.heldout.eval_reward:.3f}"
    err_console.print(line, highlight=False)


@app.command()
@cli_errors
@config_flags(
    RLConfig,
    RL_FLAGS,
    flags={"train_files": "train_file", "heldout_files": "heldout_file"},
)
def rl(config: ConfigOpt, overrides: dict[str, Any]) -> None:
    """Multi-turn RL with verifiable rewards on arena tasks (GRPO, Adaptive Batch Filling,
    token-mean loss); ASTRA_TRAIN_* variables, --set and the flags override the recipe (a
    default shown applies where the recipe sets nothing).

    Example: astra-train rl --config training/recipes/rl-tiny-cpu.yaml --model runs/sft-tiny/final
    --output-dir runs/rl --steps 20 --set verl.device=cpu
    """
    cfg = load_config(RLConfig, config, overrides, env_prefix=ENV_PREFIX)
    if cfg.backend == "verl":
        from training.rl.verl import run_verl

        _say_verl(run_verl(cfg))
        return
    from training.rl.trl import run_trl

    # SIGTERM unwinds like Ctrl-C, so the rollout server and the sandboxes are stopped on the
    # way out instead of outliving the trainer
    with _stoppable(cfg.output_dir):
        result = run_trl(cfg, _rl_progress)
    if result.skipped_records and not result.rerun:
        console.print(f"skipped {len(result.skipped_records)} record(s) that failed to load")
    _say_trained(result, cfg.output_dir)


def main() -> None:
    """``astra-train`` as a process (its console script, ``python -m training.cli``).

    A run stopped by a signal has let go of what it held (rollout server, sandboxes, event
    loop) by the time it says so; what is left is the interpreter's exit, whose garbage
    collection walks every object torch, transformers and TRL made: 1.5 s on an idle machine,
    12 s beside two busy processes, 37 s beside thirty (a stopped ``rl`` run of the tiny
    model). A stopped process skips that walk (``gc.freeze``): its exit takes a fifth of the
    time, and what the exit does besides (threads joined, atexit handlers) is unchanged."""
    try:
        app()
    finally:
        if _STOPPED_BY:
            gc.freeze()


if __name__ == "__main__":
    main()
