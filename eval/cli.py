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
from astra_agent.errors import ConfigError
from astra_agent.model import DEFAULT_BASE_URL, ModelConfig

app = typer.Typer(
    name="astra-eval",
    help="Evaluate models: BFCL-V3 multi-turn and the RL arenas (sandboxed Python tools).\n\n"
    "Example: astra-eval arenas --data eval/arenas/data/heldout.jsonl --out runs/arenas",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
arenas_app = typer.Typer(help="RL arenas in the ASTRA-RL format.", no_args_is_help=False)
app.add_typer(arenas_app, name="arenas")


def _progress(label: str) -> Progress:
    """The progress bar of a long eval: done/total, elapsed, and the running score."""
    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[score]}"),
        console=err_console,
    )


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
    with _progress("arenas") as bar:
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


bfcl_app = typer.Typer(help="BFCL-V3 multi-turn (official data and checker semantics).")
app.add_typer(bfcl_app, name="bfcl")


@bfcl_app.callback(invoke_without_command=True)
@cli_errors
def bfcl(
    ctx: typer.Context,
    base_url: Annotated[str, typer.Option(envvar=["ASTRA_BASE_URL", "OPENAI_BASE_URL"])] = (
        DEFAULT_BASE_URL
    ),
    model: Annotated[str | None, typer.Option(envvar="ASTRA_MODEL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar=["ASTRA_API_KEY", "OPENAI_API_KEY"])] = None,
    categories: Annotated[str, typer.Option(help="Comma-separated.")] = (
        "base,miss_func,miss_param,long_context"
    ),
    ids: Annotated[str | None, typer.Option(help="Comma-separated entry ids.")] = None,
    limit: Annotated[int | None, typer.Option(help="First N entries per category.")] = None,
    concurrency: Annotated[int, typer.Option(help="Entries at once.")] = 8,
    temperature: Annotated[float, typer.Option(help="The paper used 0.6.")] = 0.6,
    out: Annotated[Path, typer.Option(help="Results directory.")] = Path("runs/bfcl"),
    resume: Annotated[bool, typer.Option(help="Continue the results in --out.")] = False,
) -> None:
    """Run BFCL-V3 multi-turn through the agent loop; score with the official semantics.

    Example: astra-eval bfcl --base-url http://127.0.0.1:8000/v1 --concurrency 16 --out runs/bfcl
    """
    if ctx.invoked_subcommand is not None:
        return
    from eval.bfcl.runner import PUBLISHED, BFCLConfig, evaluate_bfcl

    cfg = BFCLConfig(
        out=out,
        concurrency=concurrency,
        limit=limit,
        resume=resume,
        categories=[c.strip() for c in categories.split(",") if c.strip()],
        ids=[i.strip() for i in ids.split(",")] if ids else None,
        model=ModelConfig(base_url=base_url, model=model, api_key=api_key, temperature=temperature),
    )
    with _progress("bfcl") as bar:
        job = bar.add_task("bfcl", total=None, score="")

        def progress(rec: dict[str, Any], running: dict[str, Any]) -> None:
            acc = "  ".join(f"{c} {a:.1f}" for c, a in running["accuracy"].items())
            bar.update(job, completed=running["entries"], score=acc)

        summary = asyncio.run(evaluate_bfcl(cfg, progress))
    table = Table(title=f"BFCL-V3 multi-turn: {summary['entries']} entries, {summary['model']}")
    for col in ("model", "overall", "base", "miss_func", "miss_param", "long_context"):
        table.add_column(col, justify="right")
    acc = summary["accuracy"]
    table.add_row(
        f"{summary['model']} (measured)",
        f"{summary['overall']:.2f}",
        *(
            f"{acc[c]:.2f}" if c in acc else "-"
            for c in ("base", "miss_func", "miss_param", "long_context")
        ),
    )
    for name, row in PUBLISHED.items():
        table.add_row(
            f"{name} (published)",
            f"{row['overall']:.2f}",
            *(
                f"{row[c]:.2f}" if c in row else "-"
                for c in ("base", "miss_func", "miss_param", "long_context")
            ),
        )
    console.print(table)
    if summary["errors"]:
        console.print("failures: " + ", ".join(f"{k}={v}" for k, v in summary["errors"].items()))
    console.print(f"results: {out}/results.jsonl, summary.json, leaderboard.csv")


@bfcl_app.command("parity")
@cli_errors
def bfcl_parity(
    out: Annotated[Path, typer.Option(help="A results directory of `astra-eval bfcl`.")] = Path(
        "runs/bfcl"
    ),
    official_bfcl: Annotated[
        Path | None,
        typer.Option(
            help="Also score the run with the official `bfcl evaluate` of this executable "
            "(a virtualenv with bfcl-eval and all its pins; make setup: .venv-bfcl/bin/bfcl)."
        ),
    ] = None,
) -> None:
    """Re-score a run with the official decoder and checker (bfcl-eval) and export it in the
    official result-file format; exit 1 if any verdict differs.

    Example: astra-eval bfcl parity --out runs/bfcl --official-bfcl .venv-bfcl/bin/bfcl
    """
    import json

    from eval.bfcl.parity import compare, export_official, official_evaluate

    path = out / "results.jsonl"
    if not path.is_file():
        raise ConfigError(f"no results at {path}")
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    files = export_official(records, out / "official", "astra")
    checks = [("the official checker", compare(records))]
    if official_bfcl is not None:
        checks.append(("the official `bfcl evaluate`", official_evaluate(records, official_bfcl)))
    for what, diffs in checks:
        for d in diffs[:20]:
            err_console.print(f"[red]differs ({what}):[/] {d}")
        console.print(
            f"{len(records)} entries re-scored with {what}: "
            f"{len(records) - len(diffs)} agree, {len(diffs)} differ"
        )
    console.print(f"official-format results: {', '.join(str(f) for f in files)}")
    if any(diffs for _, diffs in checks):
        raise typer.Exit(1)
