"""``astra-eval``: run an eval (BFCL-V3 multi-turn, τ²-bench, the RL arenas, general ability),
compare two runs, report on runs. The commands and their flags live here; what each eval shows
(its summary table, its running score) comes from its kind (:mod:`eval.kinds`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from astra_agent.config import load_config
from astra_agent.console import cli_errors, console, err_console
from astra_agent.errors import ConfigError
from astra_agent.options import comma_names, common_callback, config_flags
from eval.arenas.kind import ARENAS
from eval.arenas.runner import ArenaEvalConfig
from eval.bfcl.kind import BFCL
from eval.bfcl.runner import BFCLConfig
from eval.general.kind import GENERAL
from eval.general.runner import GeneralEvalConfig
from eval.run import EvalKind
from eval.runner import ProgressEvent
from eval.tau2.kind import TAU2
from eval.tau2.runner import Tau2Config

app = typer.Typer(
    name="astra-eval",
    help="Evaluate models: BFCL-V3 multi-turn, τ²-bench, the RL arenas (sandboxed Python tools) "
    "and general ability.\n\n"
    "Example: astra-eval arenas --data eval/arenas/data/heldout.jsonl --out runs/arenas",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
common_callback(app, "astra-eval")
arenas_app = typer.Typer(
    help="RL arenas in the ASTRA-RL format: run a model on them, or validate a task file.\n\n"
    "Example: astra-eval arenas --data eval/arenas/data/heldout.jsonl --out runs/arenas",
    no_args_is_help=False,
)
app.add_typer(arenas_app, name="arenas")
bfcl_app = typer.Typer(
    help="BFCL-V3 multi-turn (official data and checker semantics): run a model, re-score a "
    "run with the official checker (parity), or score official result files (score).\n\n"
    "Example: astra-eval bfcl --base-url http://127.0.0.1:8000/v1 --concurrency 16 --out runs/bfcl"
)
app.add_typer(bfcl_app, name="bfcl")
ENV_PREFIX = "ASTRA_EVAL_"


RUN_FLAGS = ("out", "concurrency", "resume", "retry_errors", "max_connection_failures")


@contextmanager
def _progress(label: str, score: Callable[[Any], str]) -> Iterator[Callable[[Any], None]]:
    """The progress bar of a long eval: done/total (known before the first entry runs),
    elapsed, and the running score (``score(records)``)."""
    bar = Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[score]}"),
        console=err_console,
    )
    with bar:
        job = bar.add_task(label, total=None, score="")
        last = [0.0]  # when the score was last computed: at most twice a second (O(records))

        def hook(event: ProgressEvent[Any]) -> None:
            now = time.monotonic()
            final = event.total is not None and event.done >= event.total
            if event.records and (final or now - last[0] >= 0.5):
                last[0] = now
                bar.update(job, score=score(list(event.records)))
            bar.update(job, total=event.total, completed=event.done)

        yield hook


C = TypeVar("C", bound=BaseModel)
S = TypeVar("S")


def run_eval_command(
    kind: EvalKind,
    config: type[C],
    overrides: dict[str, Any],
    evaluate: Callable[[C, Callable[[Any], None]], Coroutine[Any, Any, S]],
) -> C:
    """Load an eval's config (flags over ``ASTRA_EVAL_*`` variables), run the eval under the
    progress bar (with the kind's running score) and show its summary (the kind's table);
    returns the config. An eval's command is its flags and this call (``astra-eval
    arenas``'s is the model)."""
    cfg = load_config(config, None, overrides, env_prefix=ENV_PREFIX)
    with _progress(kind.name, kind.progress or (lambda records: "")) as hook:
        summary = asyncio.run(evaluate(cfg, hook))
    kind.show(summary)
    return cfg


@arenas_app.callback(invoke_without_command=True)
@cli_errors
@config_flags(
    ArenaEvalConfig,
    ("data", *RUN_FLAGS, "limit", "limits.max_steps", "unsafe_no_sandbox"),
    helps={"limits.max_steps": "model calls per task"},
    endpoint=True,
)
def arenas(ctx: typer.Context, *, overrides: dict[str, Any]) -> None:
    """Run every task through the agent loop and score it with ASTRA's reward.

    Example: astra-eval arenas --data eval/arenas/data/heldout.jsonl --base-url
    http://127.0.0.1:8000/v1 --concurrency 8 --out runs/arenas [--resume]
    """
    if ctx.invoked_subcommand is not None:
        return
    if overrides.get("data") is None:
        raise typer.BadParameter("--data FILE is required (or use `arenas validate FILE`)")
    from eval.arenas.runner import evaluate_arenas

    cfg = run_eval_command(ARENAS, ArenaEvalConfig, overrides, evaluate_arenas)
    console.print(f"results: {cfg.out}/results.jsonl, summary: {cfg.out}/summary.json")


@arenas_app.command("validate")
@cli_errors
def validate(
    file: Annotated[Path, typer.Argument(help="Tasks: JSONL or parquet.")],
    unsafe_no_sandbox: Annotated[bool, typer.Option(help="No isolation (trusted code).")] = False,
) -> None:
    """Check every task: fields, schemas vs sources, and its reference chain in the sandbox
    (every gold answer reached; none reached blind, without the task's values; no tool code
    that tries what the sandbox refuses, leaves threads or floods output). Exit 1 if any fails.

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


def _set_names(overrides: dict[str, Any], key: str, text: str | None, example: str) -> None:
    """The names of the comma-separated flag ``--KEY`` (when given) into ``overrides[key]``;
    a flag that names none (``,``, blanks) or one name twice is a usage error."""
    if text is not None:
        overrides[key] = comma_names(text, f"--{key}", example)


@bfcl_app.callback(invoke_without_command=True)
@cli_errors
@config_flags(BFCLConfig, ("limit", "half", *RUN_FLAGS), endpoint=True)
def bfcl(
    ctx: typer.Context,
    categories: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated categories and groups: non_live, live, single_turn, "
            "multi_turn, all (every category that runs here), or names such as simple_python, "
            "live_simple, irrelevance, base (default: the four multi-turn categories).",
            show_default=False,
        ),
    ] = None,
    ids: Annotated[str | None, typer.Option(help="Comma-separated entry ids.")] = None,
    *,
    overrides: dict[str, Any],
) -> None:
    """Run BFCL (V4 data of the pinned bfcl-eval) against an OpenAI-compatible endpoint in
    function-calling mode: multi-turn through the agent loop, single-turn (non-live, live) one
    request an entry; score with the official semantics. Shows the accuracy per category, the
    multi-turn overall, and the V4 and V3 overall scores, each marked partial with what did not
    run. Categories that cannot run here (web search, memory, format sensitivity) are refused
    by name, with the reason.

    Example: astra-eval bfcl --base-url http://127.0.0.1:8000/v1 --concurrency 16 --out runs/bfcl

    Example: astra-eval bfcl --categories all --limit 20 --out runs/bfcl-all
    """
    if ctx.invoked_subcommand is not None:
        return
    from eval.bfcl.runner import evaluate_bfcl

    _set_names(overrides, "categories", categories, "base,miss_func")
    _set_names(overrides, "ids", ids, "multi_turn_base_0")
    cfg = run_eval_command(BFCL, BFCLConfig, overrides, evaluate_bfcl)
    console.print(f"results: {cfg.out}/results.jsonl, summary.json, leaderboard.csv")


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
            "(a virtualenv with bfcl-eval and all its pins; make setup: .venv-bfcl/bin/bfcl). "
            "Single-turn entries are always checked in that environment (default: "
            ".venv-bfcl under the working directory)."
        ),
    ] = None,
) -> None:
    """Re-score a run with the official decoder and checker (bfcl-eval) and export it in the
    official result-file format; exit 1 if any verdict differs.

    Example: astra-eval bfcl parity --out runs/bfcl --official-bfcl .venv-bfcl/bin/bfcl
    """
    from eval.bfcl.parity import comparable, compare, export_official, official_evaluate
    from eval.bfcl.runner import BFCLRecord
    from eval.results import RESULTS, read_results

    path = out / RESULTS
    if not path.is_file():
        raise ConfigError(f"no results at {path}")
    # Each id once (the later record of a --retry-errors run wins), as plain JSON.
    records = [r.model_dump(mode="json") for r in read_results(path, BFCLRecord).values()]
    files = export_official(records, out / "official", "astra")
    checks = [("the official checker", compare(records, official_bfcl))]
    if official_bfcl is not None:
        checks.append(("the official `bfcl evaluate`", official_evaluate(records, official_bfcl)))
    compared = len(comparable(records))
    skipped = len(records) - compared
    for what, diffs in checks:
        for d in diffs[:20]:
            err_console.print(f"[red]differs ({what}):[/] {d}")
        console.print(
            f"{compared} entries re-scored with {what}: "
            f"{compared - len(diffs)} agree, {len(diffs)} differ"
        )
    if skipped:
        console.print(
            f"{skipped} of {len(records)} entries not compared: recorded as inference errors "
            f"(rerun them with `astra-eval bfcl --out {out} --retry-errors`)"
        )
    console.print(f"official-format results: {', '.join(str(f) for f in files)}")
    if any(diffs for _, diffs in checks):
        raise typer.Exit(1)
    if not compared:
        raise ConfigError(f"no entry of {path} could be compared: all are inference errors")


@bfcl_app.command("score")
@cli_errors
def bfcl_score(
    result_dir: Annotated[
        Path,
        typer.Argument(
            help="Result files as `bfcl generate` writes them: "
            "<model>/multi_turn/BFCL_v4_multi_turn_<category>_result.json."
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Score directory, in the layout of `bfcl evaluate`.")
    ] = Path("score"),
) -> None:
    """Score the official pipeline's result files with our checker and write score files in
    the official layout (per-category score files, data_multi_turn.csv): `bfcl evaluate`,
    with our scorer. An overall over fewer than the four categories is marked partial.

    Example: astra-eval bfcl score bfcl_project/result --out bfcl_project/score
    """
    from eval.bfcl.score import score_official_results
    from eval.results import ensure_writable_dir

    ensure_writable_dir(out, "scores")
    summary = score_official_results(result_dir, out)
    cats = ("base", "miss_func", "miss_param", "long_context")
    table = Table(title=f"BFCL-V3 multi-turn, scored from {result_dir}")
    for col in ("model", "overall", *cats):
        table.add_column(col, justify="right")
    partial = []
    for model, s in summary["models"].items():
        acc = s["accuracy"]
        overall = f"{100 * s['overall']:.2f}"
        if set(acc) != set(cats):
            overall += " (partial)"
            partial.append(model)
        table.add_row(
            escape(model), overall, *(f"{100 * acc[c]:.2f}" if c in acc else "-" for c in cats)
        )
    console.print(table)
    if partial:
        console.print(
            f"partial overall for {', '.join(partial)}: categories without results count 0, "
            "as in `bfcl evaluate`"
        )
    console.print(f"scores: {summary['score_dir']}")


@app.command("tau2")
@cli_errors
@config_flags(
    Tau2Config,
    ("trials", "split", "limit", "message_limit", "max_steps", *RUN_FLAGS, "user.base_url",
     "user.model", "user.api_key"),
    flags={"user.base_url": "user_base_url", "user.model": "user_model",
           "user.api_key": "user_api_key"},
    helps={"user.base_url": "the user simulator's endpoint (default: the agent's)",
           "user.model": "the user simulator's served model (default: the first its endpoint "
           "lists)", "user.api_key": "the user simulator's API key (default: the agent's)"},
    endpoint=True,
)  # fmt: skip
def tau2(
    domains: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: retail, telecom, airline (default retail,telecom).",
            show_default=False,
        ),
    ] = None,
    tasks: Annotated[
        str | None, typer.Option(help="Comma-separated task ids (default: all).")
    ] = None,
    *,
    overrides: dict[str, Any],
) -> None:
    """τ²-bench (inspect_evals' tasks and scorers, run unchanged) against the endpoint, with the
    user simulator on a second one; pass^k per domain over --trials conversations per task, at
    temperature 0 unless --temperature is given (the paper: retail and telecom, 4 trials, user
    simulator GPT-5.1). Every run names its τ² data version and user simulator; --resume and
    `astra-eval compare` refuse runs where they differ.

    Example: astra-eval tau2 --base-url http://127.0.0.1:8000/v1 --user-base-url
    http://127.0.0.1:8001/v1 --domains retail,telecom --trials 4 --concurrency 8 --out runs/tau2
    """
    from eval.tau2.runner import evaluate_tau2

    _set_names(overrides, "domains", domains, "retail,telecom")
    _set_names(overrides, "tasks", tasks, "0,1")
    cfg = run_eval_command(TAU2, Tau2Config, overrides, evaluate_tau2)
    console.print(f"results: {cfg.out}/results.jsonl, summary: {cfg.out}/summary.json")


@app.command("compare")
@cli_errors
def compare_cmd(
    run_a: Annotated[Path, typer.Argument(help="The baseline run's directory (A).")],
    run_b: Annotated[Path, typer.Argument(help="The run compared with it (B), of the same eval.")],
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Also write the comparison as JSON here.")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --json file.")] = False,
    show: Annotated[int, typer.Option(min=0, help="Changed entries to list.")] = 20,
) -> None:
    """Compare two BFCL, arena or τ² runs entry by entry: fixed, broken, changed error type;
    paired tests (exact McNemar; Wilcoxon on the arena rewards; τ²: a sign test over tasks);
    per category/domain. τ² runs of another data version or user simulator are refused.

    Example: astra-eval compare runs/bfcl-base runs/bfcl-new --json runs/compare.json
    """
    from eval.compare import compare_runs, render_table, write_comparison

    if json_file is not None and json_file.exists() and not overwrite:
        raise ConfigError(f"{json_file} already exists", hint="pass --overwrite to replace it")
    comparison = compare_runs(run_a, run_b)
    for warning in comparison.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}")
    for table in render_table(comparison, show):
        console.print(table)
    if json_file is not None:
        write_comparison(comparison, json_file, overwrite=overwrite)
        console.print(f"comparison: {json_file}")


@app.command("general")
@cli_errors
@config_flags(
    GeneralEvalConfig,
    ("include_path", "limit", "concurrency", "model.max_tokens", "out", "overwrite",
     "retry_errors"),
    helps={"model.max_tokens": "tokens per reply, thinking included (default: each task's own)"},
    endpoint=True,
)  # fmt: skip
def general(
    tasks: Annotated[
        str | None,
        typer.Option(
            help="lm-eval generation tasks, comma-separated: ours (astra_arith), lm-eval's "
            "(gsm8k, aime24, …) or those under --include-path (default astra_arith).",
            show_default=False,
        ),
    ] = None,
    *,
    overrides: dict[str, Any],
) -> None:
    """Run lm-eval generation tasks (general ability: arithmetic, GSM8K, AIME) against the
    endpoint through lm-eval's chat-completions backend; the answer after </think> is scored.

    Example: astra-eval general --base-url http://127.0.0.1:8000/v1 --out runs/general
    """
    import logging

    from eval.general.runner import evaluate_general, quiet_lm_eval, require_lm_eval

    require_lm_eval()
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # --verbose shows lm-eval's logs
        quiet_lm_eval()
    _set_names(overrides, "tasks", tasks, "astra_arith,gsm8k")
    cfg = load_config(GeneralEvalConfig, None, overrides, env_prefix=ENV_PREFIX)
    err_console.print(f"general: {', '.join(cfg.tasks)} against {cfg.model.base_url}")
    summary = evaluate_general(cfg)
    GENERAL.show(summary)
    console.print(f"results: {cfg.out}/results.jsonl, summary: {cfg.out}/summary.json")


_RUN_HINT = "the problems above say what could not be read; pass runs that hold results"


@app.command("report")
@cli_errors
def report(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="Run directories of `astra-eval bfcl|arenas|general|tau2` or "
            "`astra-train sft|rl`.",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option(help="The HTML file to write.")] = Path("report.html"),
    overwrite: Annotated[bool, typer.Option(help="Replace --out if it exists.")] = False,
    title: Annotated[str | None, typer.Option(help="The page's title.")] = None,
) -> None:
    """One self-contained HTML report (charts, per-entry drill-downs; opens offline) over eval
    and training runs; several runs side by side, two of one eval compared entry by entry.

    Example: astra-eval report runs/bfcl runs/arenas runs/sft-tiny --out report.html
    """
    from eval.page import build_report, check_target
    from eval.rundir import load_run, unique_names

    check_target(out, overwrite)
    runs, failed = [], []
    for path, name in zip(run_dirs, unique_names(run_dirs), strict=True):
        try:
            run = load_run(path, name)
        except ConfigError as exc:
            failed.append(exc)
            err_console.print(f"[red]skipped:[/] {escape(exc.message)}")
            continue
        size = f"{len(run.records)} records" if run.is_eval else f"{len(run.metrics)} steps"
        if run.usable:
            runs.append(run)
            state = " [yellow](partial)[/]" if run.partial else ""
            console.print(f"loaded {escape(run.name)} ({run.kind}): {size}{state}", soft_wrap=True)
        else:
            failed.append(ConfigError(f"{path} ({run.kind}) holds nothing usable", hint=_RUN_HINT))
            err_console.print(f"[red]skipped:[/] {escape(run.name)} ({run.kind}): nothing usable")
        for problem in run.problems:
            err_console.print(f"  [yellow]{escape(problem)}[/]")
    if not runs:
        first = failed[0]
        raise ConfigError(f"nothing to report: {first.message}", hint=first.hint)
    path = build_report(runs, out, overwrite=overwrite, title=title)
    size_mb = path.stat().st_size / 1e6
    console.print(f"report: {path} ({size_mb:.1f} MB, {len(runs)} run(s))", soft_wrap=True)
