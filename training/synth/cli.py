"""``astra-train synth``: the data-synthesis stages, one subcommand each, in pipeline order.

Each stage's options are its config model's fields, declared once there (type, default,
description) and made into flags by :func:`~astra_agent.options.config_flags`; ``--set`` reaches
every other key. Explicit here: the inputs and ``--out``, and the flags whose command-line form
is not the config's (comma-separated ``--modes``, repeatable ``--min-score NAME=N``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from astra_agent.config import load_config
from astra_agent.console import cli_errors, console, err_console
from astra_agent.errors import ConfigError
from astra_agent.options import ENDPOINT_FLAGS, comma_names, config_flags
from training.synth.envs.build import ArenaConfig, build_arenas
from training.synth.envs.code import EnvCodeConfig, synth_env_code
from training.synth.envs.decompose import DecomposeConfig, synth_decompose
from training.synth.envs.decompose import parse_min_scores as parse_verify_scores
from training.synth.runner import RunConfig, TeacherStageConfig, TeacherStageStats
from training.synth.stage import StageStats
from training.synth.tools.chains import ChainConfig, sample_chains
from training.synth.tools.check_chains import CheckChainsConfig, synth_check_chains
from training.synth.tools.confirm import ConfirmConfig, synth_confirm
from training.synth.tools.graph import GraphConfig, build_graph
from training.synth.tools.interact import InteractConfig, synth_interact
from training.synth.tools.judge import JudgeConfig, parse_min_each, synth_judge
from training.synth.tools.pool import PoolConfig, build_pool
from training.synth.tools.tasks import TasksConfig, parse_min_scores, synth_tasks

synth_app = typer.Typer(
    name="synth",
    help="Synthesize SFT and RL data, stage by stage. Tool chains: pool → graph → chains → "
    "confirm → check-chains → tasks → interact → judge (SFT trajectories); environments: "
    "decompose → env-code → arenas (RL arena records). Each stage writes JSONL with "
    "provenance, rejections.jsonl (a reason for everything left out) and stats.json into its "
    "--out, and can be resumed; ASTRA_SYNTH_<STAGE>_* variables, --set and the flags set its "
    "options.\n\n"
    "Example: astra-train synth pool --mcp-config mcp.json --out synth/pool && "
    "astra-train synth graph --pool synth/pool --out synth/graph && "
    "astra-train synth chains --graph synth/graph --count 1000 --seed 0 --out synth/chains",
    no_args_is_help=True,
)


@synth_app.callback()
def _group() -> None:
    """Synthesize tool-use SFT data and RL environments, stage by stage."""


OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Output directory of this stage.")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML/JSON.")]
RUN_FLAGS = ("concurrency", "shard", "resume", "overwrite")
# Config fields whose flag is named otherwise (the rest: the field's own name, kebab-cased).
_RENAMED = {"sandbox.wall_seconds_per_call": "call_timeout", "min_scores": "min_score"}
_FLAGGED: dict[type[BaseModel], set[str]] = {}  # per config model: the fields with a flag


def _flags(
    model: type[BaseModel], fields: str, *, unit: str = "", per: str = ""
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``config_flags`` for a stage: its ``fields`` (space-separated); a teacher stage's add the
    teacher's attempts (one call per ``per``) and the endpoint; a run over units (``unit``,
    what --concurrency counts) adds the run's flags it has."""
    names, helps = fields.split(), {"concurrency": f"{unit} at once"}
    if teacher := issubclass(model, TeacherStageConfig):
        names.append("teacher.max_attempts")
    if per:
        helps["teacher.max_attempts"] = f"teacher calls per {per}, retries included"
    if issubclass(model, RunConfig):
        names += [name for name in RUN_FLAGS if name in model.model_fields]
    _FLAGGED[model] = {*names, *(f"model.{k}" for k in ENDPOINT_FLAGS if teacher)}
    return config_flags(model, names, flags=_RENAMED, helps=helps, endpoint=teacher)


@contextmanager
def _bar(what: str) -> Iterator[Callable[[int, int], None]]:
    bar = Progress(
        TextColumn(f"[bold]{what}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
    )
    with bar:
        job = bar.add_task(what, total=None)

        def hook(done: int, total: int) -> None:
            bar.update(job, completed=done, total=total or None)

        yield hook


def _stage(
    stage: str,
    model: type[RunConfig],
    run: Callable[..., Any],
    what: str,
    overrides: dict[str, Any],
    config: Path | None,
    out: Path,
    **given: Any,
) -> None:
    """Load a stage's config (``given``: the flags config_flags does not make), run the stage
    (``run``, synchronous or async) with a progress bar over ``what``, and print its summary."""
    cfg = _load(model, stage, overrides, config, out=out, **given)
    with _bar(what) as hook:
        stats = run(cfg, hook)
        if inspect.iscoroutine(stats):
            stats = asyncio.run(stats)
    _summary(f"{stage} → {cfg.out}", stats)


def _flag_of(
    loc: tuple[Any, ...], overrides: Mapping[str, Any], flagged: Iterable[str]
) -> str | None:
    """The flag (of the fields ``flagged``, or ``--set``) that set the value at ``loc``, or
    None where neither did (config, env)."""
    value: Any = overrides
    name = None
    for part in loc:
        if not isinstance(value, dict):
            break  # inside a flag's value (an item of a list)
        if value.get(part) is None:
            return None
        value, name = value[part], str(part)
    if name is None:
        return None
    dotted = ".".join(map(str, loc))
    key = next((k for k in flagged if dotted == k or dotted.startswith(k + ".")), None)
    if key is None:
        return f"--set {dotted}"
    return "--" + _RENAMED.get(key, key.rpartition(".")[2]).replace("_", "-")


def _load(
    model: type[BaseModel],
    stage: str,
    overrides: dict[str, Any],
    config: Path | None = None,
    **given: Any,
) -> Any:
    """``load_config`` (file < ASTRA_SYNTH_<STAGE>_* < --set < flags, ``given`` among the
    flags); a bad flag value is refused in one line that names the flag."""
    overrides = overrides | {k: v for k, v in given.items() if v is not None}
    env_prefix = f"ASTRA_SYNTH_{stage.upper().replace('-', '_')}_"
    try:
        return load_config(model, config, overrides, env_prefix=env_prefix)
    except ConfigError as exc:
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            for err in cause.errors():
                flag = _flag_of(tuple(err["loc"]), overrides, _FLAGGED[model] | given.keys())
                if flag is not None:
                    shown = repr(err.get("input"))
                    shown = shown if len(shown) <= 80 else shown[:80] + "…"
                    shown = f"={shown}" if flag.startswith("--set") else f" {shown}"
                    raise ConfigError(f"{flag}{shown}: {err['msg']}") from None
            if [err["loc"] for err in cause.errors()] == [()]:  # one check across fields
                raise ConfigError(cause.errors()[0]["msg"].removeprefix("Value error, ")) from None
        raise


def _summary(title: str, stats: StageStats) -> None:
    """The stage's table (its rows, the teacher's tokens, resumed units, rejections), the
    servers that failed, and a warning where nothing was kept."""
    table = Table(title=title, show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    for label, value in stats.summary():
        table.add_row(label, str(value))
    if isinstance(stats, TeacherStageStats):
        tokens = f"{stats.prompt_tokens:,} prompt + {stats.completion_tokens:,} completion"
        table.add_row("teacher tokens", tokens)
    if stats.resumed_units:
        table.add_row("resumed units", str(stats.resumed_units))
    for reason, n in stats.rejections.items():
        table.add_row(f"rejected: {reason}", str(n), style="red")
    console.print(table)
    for name, why in getattr(stats, "servers_failed", {}).items():
        err_console.print(f"[red]server {name!r} failed:[/] {why.splitlines()[0]}", highlight=False)
    if warning := stats.warning():
        err_console.print(f"[yellow]warning:[/] {warning}: see rejections.jsonl")


# ------------------------------------------------------------------ tool chains (A)


@synth_app.command("pool")
@cli_errors
@_flags(PoolConfig, "mcp_config servers domain")
def pool(out: OutOpt, overrides: dict[str, Any], config: ConfigOpt = None) -> None:
    """The tool pool: every tool of MCP servers, one record each.

    Writes OUT/pool.jsonl (id server/tool, schemas, output hints, provenance),
    rejections.jsonl and stats.json. A server that fails to start is named and skipped.

    Example: astra-train synth pool --mcp-config mcp.json --domain workspace --out synth/pool

    Example: astra-train synth pool --servers mcp_servers.jsonl --out synth/pool --shard 0/4
    """
    _stage("pool", PoolConfig, build_pool, "servers", overrides, config, out)


@synth_app.command("graph")
@cli_errors
@_flags(GraphConfig, "pool min_score across_domains")
def graph(out: OutOpt, overrides: dict[str, Any], config: ConfigOpt = None) -> None:
    """The tool graph: edges "B can consume what A returns", from the schemas.

    Writes OUT/edges.jsonl (each edge with its score, matches and reason), nodes.jsonl,
    rejections.jsonl and stats.json.

    Example: astra-train synth graph --pool synth/pool --out synth/graph --min-score 0.6
    """
    _stage("graph", GraphConfig, build_graph, "tools", overrides, config, out)


@synth_app.command("chains")
@cli_errors
@_flags(ChainConfig, "graph count seed min_length max_length")
def chains(out: OutOpt, overrides: dict[str, Any], config: ConfigOpt = None) -> None:
    """Tool chains: distinct paths of 2-5 tools, by seeded weighted walks over the graph.

    Writes OUT/chains.jsonl (tools, edges and their scores), rejections.jsonl and stats.json
    (lengths, coverage: the tools in no chain). Unused tools are preferred.

    Example: astra-train synth chains --graph synth/graph --count 1000 --seed 7 --out synth/chains
    """
    _stage("chains", ChainConfig, sample_chains, "chains", overrides, config, out)


@synth_app.command("confirm")
@cli_errors
@_flags(ConfirmConfig, "graph pool batch", unit="batches", per="batch")
def confirm(out: OutOpt, overrides: dict[str, Any], config: ConfigOpt = None) -> None:
    """Graph → a confirmed graph: the teacher reads the proposed edges in batches and says,
    per edge, whether B really consumes what A returns (with a reason). OUT is a graph
    directory for `synth chains --graph`: edges.jsonl with confirmed true/false and the
    teacher's reason (chains walk only confirmed edges), nodes.jsonl, rejections.jsonl
    (refused edges, unusable replies with their raw text), stats.json (tokens). Flags and
    ASTRA_SYNTH_CONFIRM_* variables override --config.

    Example: astra-train synth confirm --graph synth/graph --out synth/graph-confirmed
    --base-url http://127.0.0.1:8000/v1 --model teacher --batch 8 && astra-train synth
    chains --graph synth/graph-confirmed --count 1000 --out synth/chains
    """
    _stage("confirm", ConfirmConfig, synth_confirm, "batches", overrides, config, out)


@synth_app.command("check-chains")
@cli_errors
@_flags(
    CheckChainsConfig,
    "chains pool votes vote_threshold back_translate max_offered seed",
    unit="chains",
)
def check_chains(out: OutOpt, overrides: dict[str, Any], config: ConfigOpt = None) -> None:
    """Chains → checked chains: per chain a teacher vote (a sensible task a real user would
    want?), then a back-translation (the teacher writes a request for the chain; a second
    call sees only the request and the tools of the chain's servers, shuffled, and must name
    the chain's tools in order: exact match). OUT is a chains directory for `synth tasks
    --chains`; rejections.jsonl (vote_no, back_translation_mismatch with predicted and
    expected, unusable replies with their raw text), stats.json (kept share, tokens). Flags
    and ASTRA_SYNTH_CHECK_CHAINS_* variables override --config.

    Example: astra-train synth check-chains --chains synth/chains --pool synth/pool --out
    synth/chains-checked --base-url http://127.0.0.1:8000/v1 --model teacher && astra-train
    synth tasks --chains synth/chains-checked --pool synth/pool --out synth/tasks
    """
    _stage("check-chains", CheckChainsConfig, synth_check_chains, "chains", overrides, config, out)


@synth_app.command("tasks")
@cli_errors
@_flags(
    TasksConfig,
    "chains pool min_mean dedup_threshold decontaminate decontam_threshold",
    unit="chains",
)
def tasks(
    out: OutOpt,
    overrides: dict[str, Any],
    config: ConfigOpt = None,
    modes: Annotated[
        str | None, typer.Option(help="Comma-separated: diverse,constrained,persona (all).")
    ] = None,
    min_score: Annotated[
        list[str] | None,
        typer.Option(help="Keep scores ≥ N: N for all four or NAME=N (repeatable; default 3)."),
    ] = None,
) -> None:
    """Chains → OUT/tasks.jsonl: per chain and mode a teacher-written question that needs
    the chain without naming a tool, judged (1-5 on four scores) and filtered (named tools,
    low scores, near-duplicates, BFCL overlap); rejections.jsonl, stats.json (tokens, score
    distributions). Flags and ASTRA_SYNTH_TASKS_* variables override --config.

    Example: astra-train synth tasks --chains synth/chains --pool synth/pool --out synth/tasks
    --base-url http://127.0.0.1:8000/v1 --min-score realism=4 --concurrency 16
    """
    listed = None if modes is None else comma_names(modes, "--modes", "diverse,persona")
    scores = None if min_score is None else parse_min_scores(min_score)
    given = {"modes": listed, "min_scores": scores}
    _stage("tasks", TasksConfig, synth_tasks, "chains", overrides, config, out, **given)


@synth_app.command("interact")
@cli_errors
@_flags(
    InteractConfig,
    "tasks pool mcp_config simulate offer failure_rate seed max_steps",
    unit="episodes",
    per="simulated result",
)
def interact(out: OutOpt, overrides: dict[str, Any], config: ConfigOpt = None) -> None:
    """Tasks → OUT/interactions.jsonl: per task one episode of the teacher as the agent, over
    live MCP servers (--mcp-config) or tools the teacher plays (--simulate), with failures
    injected; Trajectory records (SFT-ready) with the task, chain, environment and injected
    failures in metadata; rejections.jsonl (limits, errors, no call, no chain tool called),
    stats.json (calls, recoveries, tokens). Flags and ASTRA_SYNTH_INTERACT_* variables
    override --config.

    Example: astra-train synth interact --tasks synth/tasks --pool synth/pool --out
    synth/interact --base-url http://127.0.0.1:8000/v1 --mcp-config mcp.json --simulate
    --failure-rate 0.2 --concurrency 16
    """
    _stage("interact", InteractConfig, synth_interact, "tasks", overrides, config, out)


@synth_app.command("judge")
@cli_errors
@_flags(JudgeConfig, "interactions min_score", unit="trajectories", per="trajectory")
def judge(
    out: OutOpt,
    overrides: dict[str, Any],
    config: ConfigOpt = None,
    min_each: Annotated[
        list[str] | None,
        typer.Option(help="Keep each criterion ≥ N: N for all or NAME=N (repeatable; 2)."),
    ] = None,
) -> None:
    """Interactions → OUT/trajectories.jsonl: each trajectory scored 1-5 by the teacher on
    call conciseness, answer relevance, answer faithfulness, call success, plan quality,
    use of tool results and query understanding, kept above the thresholds, the scores in
    metadata; ready for `astra-train data sft`. rejections.jsonl, stats.json (score
    distributions, tokens). Flags and ASTRA_SYNTH_JUDGE_* variables override --config.

    Example: astra-train synth judge --interactions synth/interact --out synth/judged
    --base-url http://127.0.0.1:8000/v1 --min-score 4 --min-each call_success=3
    """
    each = None if min_each is None else parse_min_each(min_each)
    _stage("judge", JudgeConfig, synth_judge, "trajectories", overrides, config, out, min_each=each)


# ------------------------------------------------------------------ environments (B)


@synth_app.command("decompose")
@cli_errors
@_flags(
    DecomposeConfig,
    "domains taxonomy seeds per_domain min_steps max_steps min_overall dedup_threshold",
    unit="questions",
)
def decompose(
    out: OutOpt,
    overrides: dict[str, Any],
    config: ConfigOpt = None,
    min_score: Annotated[
        list[str] | None,
        typer.Option(help="Keep verify scores ≥ N: N for all four or NAME=N (repeatable; 3)."),
    ] = None,
) -> None:
    """Domains / seed questions → OUT/decompositions.jsonl: per question a teacher-written
    chain of 2-6 sub-questions with dependencies and short sub-answers, structurally checked
    (cycles, unknown dependencies, duplicates, a final answer not derived from the last
    steps), each step checked for tool necessity, and the whole verified (dependency,
    atomicity, forced serialization, completeness: 1-5 each, overall their mean);
    rejections.jsonl, stats.json (tokens, score distributions). Flags and
    ASTRA_SYNTH_DECOMPOSE_* variables override --config.

    Example: astra-train synth decompose --domains domains.txt --per-domain 20
    --out synth/decompose --base-url http://127.0.0.1:8000/v1 --min-overall 4.25
    """
    given = {"min_scores": None if min_score is None else parse_verify_scores(min_score)}
    _stage(
        "decompose", DecomposeConfig, synth_decompose, "questions", overrides, config, out, **given
    )


@synth_app.command("env-code")
@cli_errors
@_flags(
    EnvCodeConfig,
    "decompositions max_retries merge probe sandbox.wall_seconds_per_call sandboxes",
    unit="records",
)
def env_code(out: OutOpt, overrides: dict[str, Any], config: ConfigOpt = None) -> None:
    """Decompositions → OUT/envs.jsonl: per sub-question that needs a tool, a teacher-written
    tool (schema, standard-library Python with its mock data, reference arguments), proven in
    the bubblewrap sandbox (it compiles, loads, runs in time without network, processes or
    writes, and its output holds the sub-answer), retried with the sandbox's message; then
    same-intent tools merged and re-checked. rejections.jsonl, stats.json (rounds, merges,
    tokens). Flags and ASTRA_SYNTH_ENV_CODE_* variables override --config.

    Example: astra-train synth env-code --decompositions synth/decompose --out synth/envs
    --base-url http://127.0.0.1:8000/v1 --max-retries 3 --concurrency 16
    """
    _stage("env-code", EnvCodeConfig, synth_env_code, "records", overrides, config, out)


@synth_app.command("arenas")
@cli_errors
@_flags(ArenaConfig, "envs near far near_pool far_ratio heldout seed", unit="records")
def arenas(out: OutOpt, overrides: dict[str, Any], config: ConfigOpt = None) -> None:
    """Environments → ASTRA-RL arena records: each with distractors from other environments
    of its split (BM25 near and far bands, seeded), validated in the sandbox as `astra-eval
    arenas validate` does; OUT/train.jsonl, OUT/heldout.jsonl, OUT/arenas.jsonl (both),
    rejections.jsonl, stats.json. Flags and ASTRA_SYNTH_ARENAS_* variables override --config.

    Example: astra-train synth arenas --envs synth/envs --out synth/arenas --heldout 0.1
    --near 2 --far 1 --seed 0 && astra-eval arenas validate synth/arenas/train.jsonl
    """
    _stage("arenas", ArenaConfig, build_arenas, "records", overrides, config, out)
