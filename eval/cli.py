"""``astra-eval``: score models on the RL arenas (and, coming, BFCL-V3 multi-turn)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from astra_agent.config import load_config
from astra_agent.console import cli_errors, console, err_console, setup_logging
from astra_agent.model import DEFAULT_BASE_URL

app = typer.Typer(
    name="astra-eval",
    help="Evaluate models: RL arenas (sandboxed Python environments); BFCL-V3 is coming.\n\n"
    "Example: astra-eval arenas --data eval/arenas/data/heldout.jsonl --out runs/arenas",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
arenas_app = typer.Typer(help="RL arenas in the ASTRA-RL format.", no_args_is_help=False)
app.add_typer(arenas_app, name="arenas")


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    setup_logging(verbose)


@arenas_app.callback(invoke_without_command=True)
@cli_errors
def arenas(
    ctx: typer.Context,
    data: Annotated[Path | None, typer.Option(help="Tasks: JSONL or parquet.")] = None,
    base_url: Annotated[str, typer.Option(envvar=["ASTRA_BASE_URL", "OPENAI_BASE_URL"])] = (
        DEFAULT_BASE_URL
    ),
    model: Annotated[str | None, typer.Option(envvar="ASTRA_MODEL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar=["ASTRA_API_KEY", "OPENAI_API_KEY"])] = None,
    concurrency: Annotated[int, typer.Option(help="Tasks at once.")] = 4,
    limit: Annotated[int | None, typer.Option(help="Only the first N tasks.")] = None,
    out: Annotated[Path, typer.Option(help="Results directory.")] = Path("runs/arenas"),
    resume: Annotated[bool, typer.Option(help="Continue the results in --out.")] = False,
    temperature: Annotated[float | None, typer.Option()] = None,
    max_steps: Annotated[int | None, typer.Option(help="Model calls per task (20).")] = None,
    unsafe_no_sandbox: Annotated[
        bool, typer.Option(help="Run tool code WITHOUT isolation (trusted code only).")
    ] = False,
) -> None:
    """Run every task through the agent loop and score it with ASTRA's reward.

    Example: astra-eval arenas --data eval/arenas/data/heldout.jsonl --base-url
    http://127.0.0.1:8000/v1 --concurrency 8 --out runs/arenas [--resume]
    """
    if ctx.invoked_subcommand is not None:
        return
    if data is None:
        raise typer.BadParameter("--data FILE is required (or use `arenas validate FILE`)")
    from eval.arenas.runner import ArenaEvalConfig, evaluate_arenas

    model_cfg: dict[str, Any] = {
        "base_url": base_url,
        "model": model,
        "api_key": api_key,
        "temperature": temperature,
    }
    cfg = load_config(
        ArenaEvalConfig,
        None,
        {
            "data": data,
            "out": out,
            "concurrency": concurrency,
            "limit": limit,
            "resume": resume,
            "unsafe_no_sandbox": unsafe_no_sandbox,
            "model": {k: v for k, v in model_cfg.items() if v is not None},
            "limits": {"max_steps": max_steps} if max_steps else {},
        },
        env_prefix="ASTRA_EVAL_",
    )
    with Progress(
        TextColumn("[bold]arenas"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[score]}"),
        console=err_console,
    ) as bar:
        job = bar.add_task("arenas", total=limit, score="")

        def progress(rec: dict[str, Any], running: dict[str, Any]) -> None:
            bar.update(
                job,
                completed=running["tasks"],
                score=(
                    f"reward {running['mean_reward']:.3f}  solved {running['fully_solved']:.0%}"
                ),
            )

        summary = asyncio.run(evaluate_arenas(cfg, progress))
    table = Table(title=f"arenas: {summary['tasks']} tasks, model {summary.get('model')}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "mean_reward",
        "fully_solved",
        "mean_recall",
        "mean_precision",
        "tool_calls_per_task",
        "wall_s",
    ):
        table.add_row(key, str(summary.get(key)))
    table.add_row("errors", ", ".join(f"{k}={v}" for k, v in summary["errors"].items()) or "none")
    table.add_row("terminations", ", ".join(f"{k}={v}" for k, v in summary["terminations"].items()))
    console.print(table)
    console.print(f"results: {cfg.out}/results.jsonl, summary: {cfg.out}/summary.json")


@arenas_app.command("validate")
@cli_errors
def validate(
    file: Annotated[Path, typer.Argument(help="Tasks: JSONL or parquet.")],
    unsafe_no_sandbox: Annotated[bool, typer.Option(help="No isolation (trusted code).")] = False,
) -> None:
    """Check every task: fields, schemas vs sources, and its reference chain in the sandbox
    (every gold answer reached). Exit 1 if any task fails.

    Example: astra-eval arenas validate eval/arenas/data/train.jsonl
    """
    from eval.arenas.runner import validate_arenas

    report, failures, warnings = asyncio.run(
        validate_arenas(file, unsafe_no_sandbox=unsafe_no_sandbox)
    )
    for p in report.problems:
        style = "red" if p.severity == "error" else "yellow"
        err_console.print(f"[{style}]{p.severity}:[/] {escape(str(p))}")
    for w in warnings:
        err_console.print(f"[yellow]warning:[/] {escape(w)}")
    for f in failures:
        err_console.print(f"[red]error:[/] {escape(f)}")
    bad = len(report.errors) + len(failures)
    console.print(
        f"{report.records} records: {len(report.tasks)} loaded, "
        f"{len(report.tasks) - len({f.split(' (')[0] for f in failures})} validated "
        f"in the sandbox, {bad} problem(s), {len(warnings)} warning(s)"
    )
    if bad:
        raise typer.Exit(1)


@app.command()
def bfcl() -> None:
    """BFCL-V3 multi-turn evaluation (coming: see the project's issues)."""
    err_console.print("astra-eval bfcl is not built yet.")
    raise typer.Exit(2)
