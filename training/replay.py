"""The arena SFT corpus: each task's reference chain replayed through the real episode loop.

The scripted replay model (:func:`eval.arenas.replay_script`, served by a real
:class:`~astra_agent.testing.scripted_server.ScriptedServer` on loopback) calls each task's
reference tools in order; the tools run in the sandboxed arena and
:func:`eval.arenas.evaluate_arenas` writes one scored record per task, its ``Trajectory``
included: ``OUT/results.jsonl`` is what ``astra-train data sft`` reads.

    python -m training.replay --data eval/arenas/data/train.jsonl --out runs/replay
    astra-train data sft runs/replay/results.jsonl --out runs/sft-data --tokenizer TINY_DIR
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from astra_agent.arena import load_arena_file
from astra_agent.console import cli_errors, console
from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import ScriptedServer
from eval.arenas import DATA_DIR, ArenaEvalConfig, evaluate_arenas, replay_script
from eval.arenas.runner import ArenaSummary
from eval.results import RESULTS

TRAIN_TASKS = DATA_DIR / "train.jsonl"


async def replay_arenas(
    data: Path = TRAIN_TASKS,
    out: Path = Path("runs/replay"),
    *,
    concurrency: int = 4,
    unsafe_no_sandbox: bool = False,
    reasoning: bool = True,
) -> tuple[Path, ArenaSummary]:
    """Replay every task of ``data`` into ``out``; return ``(OUT/results.jsonl, summary)``.

    A task whose replay does not reach reward 1.0 would teach a wrong chain: that is a
    ConfigError naming it (its reference chain is broken), not a silently worse corpus.
    ``reasoning`` off: the replies carry no reasoning (for a model that does not think).
    """
    tasks = load_arena_file(data).tasks
    if not any(t.reference for t in tasks):
        raise ConfigError(f"{data} has no task with a reference chain to replay")
    with ScriptedServer(replay_script(tasks, reasoning=reasoning)) as srv:
        cfg = ArenaEvalConfig(
            data=data,
            out=out,
            concurrency=concurrency,
            unsafe_no_sandbox=unsafe_no_sandbox,
            model={"base_url": srv.base_url, "temperature": 0.0},
        )
        summary = await evaluate_arenas(cfg)
    if summary.fully_solved != 1.0:
        raise ConfigError(
            f"the replay of {data} did not solve every task (fully_solved "
            f"{summary.fully_solved}, errors {summary.errors})",
            hint=f"run `astra-eval arenas validate {data}` to find the broken reference chains",
        )
    return out / RESULTS, summary


app = typer.Typer(add_completion=False)


@app.command()
@cli_errors
def main(
    data: Annotated[Path, typer.Option(help="Arena tasks (JSONL or parquet).")] = TRAIN_TASKS,
    out: Annotated[Path, typer.Option(help="Results directory (fresh).")] = Path("runs/replay"),
    concurrency: Annotated[int, typer.Option(help="Tasks at once.")] = 4,
    unsafe_no_sandbox: Annotated[
        bool, typer.Option(help="Run tool code WITHOUT isolation (trusted code only).")
    ] = False,
) -> None:
    """Write the SFT corpus of arena tasks replayed through the real loop (OUT/results.jsonl).

    Example: python -m training.replay --data eval/arenas/data/train.jsonl --out runs/replay
    """
    path, summary = asyncio.run(
        replay_arenas(data, out, concurrency=concurrency, unsafe_no_sandbox=unsafe_no_sandbox)
    )
    console.print(f"{summary.tasks} trajectories (all solved) written to {path}")


if __name__ == "__main__":
    app()
