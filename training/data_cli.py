"""``astra-train data``: build training data (``sft``: trajectories → one SFT parquet)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from pydantic import ValidationError
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from astra_agent.console import cli_errors, console, err_console
from astra_agent.errors import ConfigError

if TYPE_CHECKING:  # training.data imports transformers: loaded when the command runs
    from training.data import DataStats

data_app = typer.Typer(
    name="data",
    help="Build training data from trajectories and SFT records.\n\n"
    "Example: astra-train data sft runs/arenas/results.jsonl --out data/sft "
    "--tokenizer checkpoints/tiny",
    no_args_is_help=True,
)


@data_app.callback()
def _group() -> None:
    """Build training data from trajectories and SFT records."""


def _summary(stats: DataStats, out: Path) -> Table:
    from training.data import counter_table

    table = Table(title=f"SFT data → {out}", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    for label, value in counter_table(stats):
        style = "red" if label.startswith("rejected") else None
        table.add_row(label, value, style=style)
    return table


@data_app.command("sft")
@cli_errors
def sft(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            help="Trajectory JSONL, astra-eval results.jsonl, ASTRA-SFT-1k (JSONL/parquet) "
            "or OpenAI {messages, tools} rows.",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")],
    tokenizer: Annotated[
        Path, typer.Option(help="Checkpoint dir whose tokenizer and chat template to use.")
    ],
    max_length: Annotated[int, typer.Option(help="Tokens per conversation at most.")] = 20480,
    overlong: Annotated[
        str, typer.Option(help="drop, or truncate at a turn boundary, what is longer.")
    ] = "drop",
    min_reward: Annotated[
        float | None, typer.Option(help="Reject records whose reward is below this.")
    ] = None,
    split_turns: Annotated[
        bool, typer.Option(help="One conversation per user turn (every turn trained).")
    ] = True,
    dedupe: Annotated[bool, typer.Option(help="Drop exact duplicate conversations.")] = True,
    overwrite: Annotated[bool, typer.Option(help="Replace a different build in --out.")] = False,
) -> None:
    """Trajectories → OUT/sft.parquet (messages, tools, id, source, provenance), stats.json and
    rejections.jsonl (each rejected record with its reason).

    Example: astra-train data sft traj.jsonl runs/arenas/results.jsonl --out data/sft
    --tokenizer checkpoints/tiny --max-length 8192 --overlong truncate --min-reward 0.8
    """
    if overlong not in ("drop", "truncate"):
        raise typer.BadParameter("choose drop or truncate", param_hint="--overlong")
    mode: Literal["drop", "truncate"] = "truncate" if overlong == "truncate" else "drop"
    from training.data import DataOptions, build_sft_data

    try:
        options = DataOptions(
            tokenizer=tokenizer,
            max_length=max_length,
            overlong=mode,
            min_reward=min_reward,
            split_turns=split_turns,
            dedupe=dedupe,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
        flag = "-".join(str(p) for p in first["loc"]).replace("_", "-")
        raise ConfigError(f"--{flag}: {msg}") from None
    bar = Progress(
        TextColumn("[bold]records"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
    )
    jobs: list[TaskID] = []

    def hook(done: int, total: int) -> None:
        if not jobs:  # started by the first record: an error before that prints alone
            bar.start()
            jobs.append(bar.add_task("records", total=total))
        bar.update(jobs[0], completed=done, total=total)

    try:
        stats = build_sft_data(inputs, out, options, hook, overwrite=overwrite)
    finally:
        if jobs:
            bar.stop()
    console.print(_summary(stats, out))
