"""``astra-train synth``: the data-synthesis stages, one subcommand each (pool, graph, chains)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from astra_agent.options import ApiKeyOpt, BaseUrlOpt, ModelOpt, TemperatureOpt, model_overrides
from training.synth.stage import StageStats

synth_app = typer.Typer(
    name="synth",
    help="Synthesize tool-use SFT data, stage by stage: tool pool → tool graph → tool chains. "
    "Each stage writes JSONL with provenance, rejections.jsonl (a reason for everything left "
    "out) and stats.json into its --out, and can be resumed.\n\n"
    "Example: astra-train synth pool --mcp-config mcp.json --out synth/pool && "
    "astra-train synth graph --pool synth/pool --out synth/graph && "
    "astra-train synth chains --graph synth/graph --count 1000 --seed 0 --out synth/chains",
    no_args_is_help=True,
)


@synth_app.callback()
def _group() -> None:
    """Synthesize tool-use SFT data, stage by stage."""


OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Output directory of this stage.")]
OverwriteOpt = Annotated[
    bool | None, typer.Option(help="Replace the outputs of an earlier run in --out.")
]
ResumeOpt = Annotated[
    bool | None,
    typer.Option(help="Continue an interrupted run in --out (same inputs and parameters)."),
]
ShardOpt = Annotated[
    str | None,
    typer.Option(help="i/N: do only the i-th of N shares of the work (0-based).", metavar="i/N"),
]


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


def _options(model: type[BaseModel], **values: Any) -> Any:
    try:
        return model.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "-".join(map(str, first["loc"])).replace("_", "-")
        raise ConfigError(f"--{flag or 'options'}: {first['msg']}") from None


def _given(**values: Any) -> dict[str, Any] | None:
    """The flags of a nested config section that were given (a value of 0 too), or None."""
    given = {k: v for k, v in values.items() if v is not None}
    return given or None


# Config fields whose flag is named otherwise (the rest: the field's own name, kebab-cased).
_FLAGS = {
    "sandbox.wall_seconds_per_call": "--call-timeout",
    "min_scores": "--min-score",
    "min_each": "--min-each",
}


def _flag_of(loc: tuple[Any, ...], overrides: dict[str, Any]) -> str | None:
    """The flag that set the value at ``loc``, or None where no flag did (config, env)."""
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
    alias = next((f for k, f in _FLAGS.items() if dotted == k or dotted.startswith(k + ".")), None)
    return alias or "--" + name.replace("_", "-")


def _load(
    model: type[BaseModel], config: Path | None, overrides: dict[str, Any], *, env_prefix: str
) -> Any:
    """``load_config``; a bad flag value is refused in one line that names the flag."""
    try:
        return load_config(model, config, overrides, env_prefix=env_prefix)
    except ConfigError as exc:
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            for err in cause.errors():
                flag = _flag_of(tuple(err["loc"]), overrides)
                if flag is not None:
                    shown = repr(err.get("input"))
                    shown = shown if len(shown) <= 80 else shown[:80] + "…"
                    raise ConfigError(f"{flag} {shown}: {err['msg']}") from None
        raise


def _summary(title: str, stats: StageStats, rows: list[tuple[str, Any]]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    for label, value in rows:
        table.add_row(label, str(value))
    if stats.resumed_units:
        table.add_row("resumed units", str(stats.resumed_units))
    for reason, n in stats.rejections.items():
        table.add_row(f"rejected: {reason}", str(n), style="red")
    console.print(table)


@synth_app.command("pool")
@cli_errors
def pool(
    out: OutOpt,
    mcp_config: Annotated[
        Path | None,
        typer.Option(help="An mcpServers config (JSON/YAML): its servers are started and listed."),
    ] = None,
    servers: Annotated[
        Path | None,
        typer.Option(help="A JSONL of server descriptions (ASTRA's mcp_servers.jsonl shape)."),
    ] = None,
    domain: Annotated[
        str | None, typer.Option(help="Domain of the servers of --mcp-config (it names none).")
    ] = None,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
    """The tool pool: every tool of MCP servers, one record each.

    Writes OUT/pool.jsonl (id server/tool, schemas, output hints, provenance),
    rejections.jsonl and stats.json. A server that fails to start is named and skipped.

    Example: astra-train synth pool --mcp-config mcp.json --domain workspace --out synth/pool

    Example: astra-train synth pool --servers mcp_servers.jsonl --out synth/pool --shard 0/4
    """
    from training.synth.tools.pool import PoolOptions, build_pool

    options = _options(PoolOptions, domain=domain, shard=shard)
    with _bar("servers") as hook:
        stats = build_pool(
            out,
            mcp_config=mcp_config,
            servers=servers,
            options=options,
            overwrite=bool(overwrite),
            resume=bool(resume),
            progress=hook,
        )
    rows: list[tuple[str, Any]] = [
        ("servers", stats.servers),
        ("tools", stats.tools),
        ("with output hints", stats.with_output_schema),
    ]
    rows += [(f"  domain {d or '(none)'}", n) for d, n in stats.by_domain.items()]
    _summary(f"tool pool → {out}", stats, rows)
    for name, why in stats.servers_failed.items():
        err_console.print(f"[red]server {name!r} failed:[/] {why.splitlines()[0]}", highlight=False)


@synth_app.command("graph")
@cli_errors
def graph(
    pool: Annotated[
        list[Path], typer.Option(help="A `synth pool` --out (repeatable: the shards of a pool).")
    ],
    out: OutOpt,
    min_score: Annotated[
        float | None, typer.Option(help="Keep edges scoring at least this (0-1; default 0.5).")
    ] = None,
    across_domains: Annotated[
        bool, typer.Option(help="Pair tools of different domains too.")
    ] = False,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
    """The tool graph: edges "B can consume what A returns", from the schemas.

    Writes OUT/edges.jsonl (each edge with its score, matches and reason), nodes.jsonl,
    rejections.jsonl and stats.json.

    Example: astra-train synth graph --pool synth/pool --out synth/graph --min-score 0.6
    """
    from training.synth.tools.graph import GraphOptions, build_graph

    options = _options(
        GraphOptions, min_score=min_score, across_domains=across_domains, shard=shard
    )
    with _bar("tools") as hook:
        stats = build_graph(
            pool, out, options, overwrite=bool(overwrite), resume=bool(resume), progress=hook
        )
    rows: list[tuple[str, Any]] = [
        ("tools", stats.tools),
        ("edges", stats.edges),
        ("  across servers", stats.cross_server),
    ]
    rows += [(f"  by {rule}", n) for rule, n in stats.by_rule.items()]
    rows.append(("tools without any edge", len(stats.isolated)))
    _summary(f"tool graph → {out}", stats, rows)


@synth_app.command("chains")
@cli_errors
def chains(
    graph: Annotated[
        list[Path], typer.Option(help="A `synth graph` --out (repeatable: the shards of a graph).")
    ],
    out: OutOpt,
    count: Annotated[
        int, typer.Option(help="Distinct chains to sample (fewer if the graph holds fewer).")
    ] = 100,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same chains).")] = 0,
    min_length: Annotated[int, typer.Option(help="Tools per chain, at least.")] = 2,
    max_length: Annotated[int, typer.Option(help="Tools per chain, at most.")] = 5,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
    """Tool chains: distinct paths of 2-5 tools, by seeded weighted walks over the graph.

    Writes OUT/chains.jsonl (tools, edges and their scores), rejections.jsonl and stats.json
    (lengths, coverage: the tools in no chain). Unused tools are preferred.

    Example: astra-train synth chains --graph synth/graph --count 1000 --seed 7 --out synth/chains
    """
    from training.synth.tools.chains import ChainOptions, sample_chains

    options = _options(
        ChainOptions, count=count, seed=seed, min_length=min_length, max_length=max_length
    )
    with _bar("chains") as hook:
        stats = sample_chains(
            graph, out, options, overwrite=bool(overwrite), resume=bool(resume), progress=hook
        )
    rows: list[tuple[str, Any]] = [("chains", f"{stats.chains} of {stats.requested} asked")]
    if stats.possible is not None:
        rows.append(("  distinct chains possible", stats.possible))
    rows += [(f"  of {n} tools", k) for n, k in stats.lengths.items()]
    rows += [
        ("tools covered", f"{stats.covered} of {stats.tools}"),
        ("tools without any edge", len(stats.no_edge)),
        ("tools left out by the count", len(stats.not_covered)),
    ]
    _summary(f"tool chains → {out}", stats, rows)


# ------------------------------------------------------------------ tasks (a teacher stage)


@synth_app.command("tasks")
@cli_errors
def tasks(
    out: OutOpt,
    chains: Annotated[
        list[Path] | None,
        typer.Option(help="A `synth chains` --out, or a chains JSONL (repeatable: shards)."),
    ] = None,
    pool: Annotated[
        list[Path] | None,
        typer.Option(help="The `synth pool` --out of the chains' tools (repeatable: shards)."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/JSON.")] = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    temperature: TemperatureOpt = None,
    modes: Annotated[
        str | None, typer.Option(help="Comma-separated: diverse,constrained,persona (all).")
    ] = None,
    min_score: Annotated[
        list[str] | None,
        typer.Option(help="Keep scores ≥ N: N for all four or NAME=N (repeatable; default 3)."),
    ] = None,
    min_mean: Annotated[float | None, typer.Option(help="Keep a mean ≥ this (3.5).")] = None,
    dedup_threshold: Annotated[
        float | None, typer.Option(help="Near-duplicate at this Jaccard estimate (0.7).")
    ] = None,
    decontaminate: Annotated[
        bool | None, typer.Option(help="Drop questions close to BFCL multi-turn (on).")
    ] = None,
    decontam_threshold: Annotated[
        float | None, typer.Option(help="Too close to BFCL at this Jaccard estimate (0.5).")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Teacher calls per question, retries included (3).")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="Chains at once (8).")] = None,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
    """Chains → OUT/tasks.jsonl: per chain and mode a teacher-written question that needs
    the chain without naming a tool, judged (1-5 on four scores) and filtered (named tools,
    low scores, near-duplicates, BFCL overlap); rejections.jsonl, stats.json (tokens, score
    distributions). Flags and ASTRA_SYNTH_TASKS_* variables override --config.

    Example: astra-train synth tasks --chains synth/chains --pool synth/pool --out synth/tasks
    --base-url http://127.0.0.1:8000/v1 --min-score realism=4 --concurrency 16
    """
    import asyncio

    from training.synth.tools.tasks import TasksConfig, parse_min_scores, synth_tasks

    overrides = {
        "out": out,
        "chains": chains,
        "pool": pool,
        "model": model_overrides(base_url, model, api_key, temperature),
        "modes": None if modes is None else [m.strip() for m in modes.split(",") if m.strip()],
        "min_scores": None if min_score is None else parse_min_scores(min_score),
        "teacher": _given(max_attempts=max_attempts),
        "resume": resume,
        "overwrite": overwrite,
        **{"min_mean": min_mean, "dedup_threshold": dedup_threshold, "shard": shard},
        **{"decontaminate": decontaminate, "decontam_threshold": decontam_threshold},
        "concurrency": concurrency,
    }
    cfg = _load(TasksConfig, config, overrides, env_prefix="ASTRA_SYNTH_TASKS_")
    with _bar("chains") as hook:
        stats = asyncio.run(synth_tasks(cfg, hook))
    rows: list[tuple[str, Any]] = [("chains", stats.chains), ("questions kept", stats.questions)]
    rows += [(f"  {mode}", n) for mode, n in stats.by_mode.items()]
    rows += [(f"{name}: mean judged / kept", f"{s.mean} / {s.kept_mean}")
             for name, s in stats.scores.items()]  # fmt: skip
    tokens = f"{stats.prompt_tokens:,} prompt + {stats.completion_tokens:,} completion"
    rows.append(("teacher tokens", tokens))
    _summary(f"tasks → {out}", stats, rows)
    if not stats.questions:
        err_console.print("[yellow]warning:[/] no question was kept: see rejections.jsonl")


# ------------------------------------------------------------------ decompose (environments)


@synth_app.command("decompose")
@cli_errors
def decompose(
    out: OutOpt,
    domains: Annotated[
        Path | None,
        typer.Option(help="Domains: one name a line, or JSONL with name and description."),
    ] = None,
    taxonomy: Annotated[
        Path | None, typer.Option(help="A JSON tree of domains and topics; its leaves are used.")
    ] = None,
    seeds: Annotated[
        Path | None,
        typer.Option(help="Seed questions to decompose: JSONL with question, answer?, domain?."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/JSON.")] = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    temperature: TemperatureOpt = None,
    per_domain: Annotated[int | None, typer.Option(help="Questions per domain (4).")] = None,
    min_steps: Annotated[int | None, typer.Option(help="Sub-questions, at least (2).")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Sub-questions, at most (6).")] = None,
    min_score: Annotated[
        list[str] | None,
        typer.Option(help="Keep verify scores ≥ N: N for all four or NAME=N (repeatable; 3)."),
    ] = None,
    min_overall: Annotated[
        float | None, typer.Option(help="Keep a mean of the four scores ≥ this (4.0).")
    ] = None,
    dedup_threshold: Annotated[
        float | None, typer.Option(help="Main questions near-duplicate at this Jaccard (0.7).")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Teacher calls per question, retries included (3).")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="Questions at once (8).")] = None,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
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
    import asyncio

    from training.synth.envs.decompose import DecomposeConfig, parse_min_scores, synth_decompose

    overrides = {
        "out": out,
        **{"domains": domains, "taxonomy": taxonomy, "seeds": seeds},
        "model": model_overrides(base_url, model, api_key, temperature),
        "min_scores": None if min_score is None else parse_min_scores(min_score),
        "teacher": _given(max_attempts=max_attempts),
        "resume": resume,
        "overwrite": overwrite,
        **{"per_domain": per_domain, "min_steps": min_steps, "max_steps": max_steps},
        **{"min_overall": min_overall, "dedup_threshold": dedup_threshold, "shard": shard},
        "concurrency": concurrency,
    }
    cfg = _load(DecomposeConfig, config, overrides, env_prefix="ASTRA_SYNTH_DECOMPOSE_")
    with _bar("questions") as hook:
        stats = asyncio.run(synth_decompose(cfg, hook))
    rows: list[tuple[str, Any]] = [
        ("questions asked", stats.units),
        ("decompositions kept", stats.decompositions),
        ("  with parallel steps", stats.with_parallel_steps),
    ]
    rows += [(f"  of {n} steps", k) for n, k in stats.steps.items()]
    rows += [(f"{name}: mean judged / kept", f"{s.mean} / {s.kept_mean}")
             for name, s in stats.scores.items()]  # fmt: skip
    tokens = f"{stats.prompt_tokens:,} prompt + {stats.completion_tokens:,} completion"
    rows.append(("teacher tokens", tokens))
    _summary(f"decompose → {out}", stats, rows)
    if not stats.decompositions:
        err_console.print("[yellow]warning:[/] no decomposition was kept: see rejections.jsonl")


# ------------------------------------------------------------------ interact, judge (tool chains)


@synth_app.command("interact")
@cli_errors
def interact(
    out: OutOpt,
    tasks: Annotated[
        list[Path] | None,
        typer.Option(help="A `synth tasks` --out, or a tasks JSONL (repeatable: shards)."),
    ] = None,
    pool: Annotated[
        list[Path] | None,
        typer.Option(help="The `synth pool` --out of the tasks' tools (repeatable: shards)."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/JSON.")] = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    temperature: TemperatureOpt = None,
    mcp_config: Annotated[
        Path | None, typer.Option(help="An mcpServers config: its servers' tools run live.")
    ] = None,
    simulate: Annotated[
        bool | None, typer.Option(help="The teacher plays the tools that cannot run live.")
    ] = None,
    offer: Annotated[
        str | None, typer.Option(help="Tools offered: servers (all of the chain's) or chain.")
    ] = None,
    failure_rate: Annotated[
        float | None, typer.Option(help="Share of calls made to fail, seeded (0.2).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the injected failures (0).")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Model calls per episode (16).")] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Teacher calls per simulated result, retries included (3).")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="Episodes at once (8).")] = None,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
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
    import asyncio

    from training.synth.tools.interact import InteractConfig, synth_interact

    overrides = {
        "out": out,
        "tasks": tasks,
        "pool": pool,
        "model": model_overrides(base_url, model, api_key, temperature),
        "teacher": _given(max_attempts=max_attempts),
        "resume": resume,
        "overwrite": overwrite,
        **{"mcp_config": mcp_config, "simulate": simulate, "offer": offer, "seed": seed},
        **{"failure_rate": failure_rate, "max_steps": max_steps, "shard": shard},
        "concurrency": concurrency,
    }
    cfg = _load(InteractConfig, config, overrides, env_prefix="ASTRA_SYNTH_INTERACT_")
    with _bar("tasks") as hook:
        stats = asyncio.run(synth_interact(cfg, hook))
    rows: list[tuple[str, Any]] = [("tasks", stats.tasks), ("trajectories", stats.trajectories)]
    rows += [(f"  {kind}", n) for kind, n in stats.by_environment.items()]
    rows += [("tool calls", stats.calls)]
    rows += [(f"  {status}", n) for status, n in stats.by_status.items()]
    rows += [("injected failures (recovered)", f"{stats.injected} ({stats.recovered})")]
    tokens = f"{stats.prompt_tokens:,} prompt + {stats.completion_tokens:,} completion"
    rows.append(("teacher tokens", tokens))
    _summary(f"interact → {out}", stats, rows)
    for name, why in stats.servers_failed.items():
        err_console.print(f"[red]server {name!r} failed:[/] {why.splitlines()[0]}", highlight=False)
    if not stats.trajectories:
        err_console.print("[yellow]warning:[/] no trajectory was kept: see rejections.jsonl")


@synth_app.command("judge")
@cli_errors
def judge(
    out: OutOpt,
    interactions: Annotated[
        list[Path] | None,
        typer.Option(help="A `synth interact` --out, or Trajectory JSONL (repeatable)."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/JSON.")] = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    temperature: TemperatureOpt = None,
    min_score: Annotated[
        float | None, typer.Option(help="Keep an overall (mean of the seven) ≥ this (3.5).")
    ] = None,
    min_each: Annotated[
        list[str] | None,
        typer.Option(help="Keep each criterion ≥ N: N for all or NAME=N (repeatable; 2)."),
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Teacher calls per trajectory, retries included (3).")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="Trajectories at once (8).")] = None,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
    """Interactions → OUT/trajectories.jsonl: each trajectory scored 1-5 by the teacher on
    call conciseness, answer relevance, answer faithfulness, call success, plan quality,
    use of tool results and query understanding, kept above the thresholds, the scores in
    metadata; ready for `astra-train data sft`. rejections.jsonl, stats.json (score
    distributions, tokens). Flags and ASTRA_SYNTH_JUDGE_* variables override --config.

    Example: astra-train synth judge --interactions synth/interact --out synth/judged
    --base-url http://127.0.0.1:8000/v1 --min-score 4 --min-each call_success=3
    """
    import asyncio

    from training.synth.tools.judge import JudgeConfig, parse_min_each, synth_judge

    overrides = {
        "out": out,
        "interactions": interactions,
        "model": model_overrides(base_url, model, api_key, temperature),
        "min_each": None if min_each is None else parse_min_each(min_each),
        "teacher": _given(max_attempts=max_attempts),
        "resume": resume,
        "overwrite": overwrite,
        **{"min_score": min_score, "shard": shard, "concurrency": concurrency},
    }
    cfg = _load(JudgeConfig, config, overrides, env_prefix="ASTRA_SYNTH_JUDGE_")
    with _bar("trajectories") as hook:
        stats = asyncio.run(synth_judge(cfg, hook))
    rows: list[tuple[str, Any]] = [
        ("trajectories", stats.trajectories),
        ("judged", stats.judged),
        ("kept", stats.kept),
    ]
    rows += [(f"{name}: mean judged / kept", f"{s.mean} / {s.kept_mean}")
             for name, s in stats.scores.items()]  # fmt: skip
    tokens = f"{stats.prompt_tokens:,} prompt + {stats.completion_tokens:,} completion"
    rows.append(("teacher tokens", tokens))
    _summary(f"judge → {out}", stats, rows)
    if not stats.kept:
        err_console.print("[yellow]warning:[/] no trajectory was kept: see rejections.jsonl")


# ------------------------------------------------------------------ env-code, arenas (environments)


@synth_app.command("env-code")
@cli_errors
def env_code(
    out: OutOpt,
    decompositions: Annotated[
        list[Path] | None,
        typer.Option(help="A `synth decompose` --out, or a decompositions JSONL (repeatable)."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/JSON.")] = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    temperature: TemperatureOpt = None,
    max_retries: Annotated[
        int | None, typer.Option(help="Sandbox rounds after the first, per tool (3).")
    ] = None,
    merge: Annotated[
        str | None,
        typer.Option(
            help="Merge same-intent tools: teacher (rule, then teacher), "
            "rule (identical schemas only) or off (default: the arena reward counts tools, "
            "so a merged tool serving k sub-questions caps the best reward below 1)."
        ),
    ] = None,
    probe: Annotated[
        bool | None, typer.Option(help="Refuse tools that return the answer for any argument.")
    ] = None,
    call_timeout: Annotated[
        float | None, typer.Option(help="Seconds a checked tool call may take (5).")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Teacher calls per question, JSON retries included (3).")
    ] = None,
    sandboxes: Annotated[int | None, typer.Option(help="Sandboxes at once (4).")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Records at once (8).")] = None,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
    """Decompositions → OUT/envs.jsonl: per sub-question that needs a tool, a teacher-written
    tool (schema, standard-library Python with its mock data, reference arguments), proven in
    the bubblewrap sandbox (it compiles, loads, runs in time without network, processes or
    writes, and its output holds the sub-answer), retried with the sandbox's message; then
    same-intent tools merged and re-checked. rejections.jsonl, stats.json (rounds, merges,
    tokens). Flags and ASTRA_SYNTH_ENV_CODE_* variables override --config.

    Example: astra-train synth env-code --decompositions synth/decompose --out synth/envs
    --base-url http://127.0.0.1:8000/v1 --max-retries 3 --concurrency 16
    """
    import asyncio

    from training.synth.envs.code import EnvCodeConfig, synth_env_code

    overrides = {
        "out": out,
        "decompositions": decompositions,
        "model": model_overrides(base_url, model, api_key, temperature),
        "teacher": _given(max_attempts=max_attempts),
        "sandbox": _given(wall_seconds_per_call=call_timeout),
        "resume": resume,
        "overwrite": overwrite,
        **{"max_retries": max_retries, "merge": merge, "probe": probe, "shard": shard},
        **{"sandboxes": sandboxes, "concurrency": concurrency},
    }
    cfg = _load(EnvCodeConfig, config, overrides, env_prefix="ASTRA_SYNTH_ENV_CODE_")
    with _bar("records") as hook:
        stats = asyncio.run(synth_env_code(cfg, hook))
    rows: list[tuple[str, Any]] = [
        ("decompositions", stats.decompositions),
        ("environments kept", stats.environments),
        ("reference calls", stats.tool_steps),
        ("tools (after merging)", stats.tools),
    ]
    rows += [(f"  merged by {how}", n) for how, n in stats.merged.items()]
    rows += [(f"tools proven in round {n}", k) for n, k in stats.rounds.items()]
    tokens = f"{stats.prompt_tokens:,} prompt + {stats.completion_tokens:,} completion"
    rows.append(("teacher tokens", tokens))
    _summary(f"env-code → {out}", stats, rows)
    if not stats.environments:
        err_console.print("[yellow]warning:[/] no environment was kept: see rejections.jsonl")


@synth_app.command("arenas")
@cli_errors
def arenas(
    out: OutOpt,
    envs: Annotated[
        list[Path] | None,
        typer.Option(help="A `synth env-code` --out, or an envs JSONL (repeatable: shards)."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/JSON.")] = None,
    near: Annotated[int | None, typer.Option(help="Distractors from the near band (2).")] = None,
    far: Annotated[int | None, typer.Option(help="Distractors from the far band (1).")] = None,
    near_pool: Annotated[
        int | None, typer.Option(help="The near band: the N most similar other tools (10).")
    ] = None,
    far_ratio: Annotated[
        float | None, typer.Option(help="The far band: BM25 score ≤ this × the best (0).")
    ] = None,
    heldout: Annotated[
        float | None, typer.Option(help="Share of the records held out, by id (0.1).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the split and the draws (0).")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Records validated at once (4).")] = None,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
    """Environments → ASTRA-RL arena records: each with distractors from other environments
    of its split (BM25 near and far bands, seeded), validated in the sandbox as `astra-eval
    arenas validate` does; OUT/train.jsonl, OUT/heldout.jsonl, OUT/arenas.jsonl (both),
    rejections.jsonl, stats.json. Flags and ASTRA_SYNTH_ARENAS_* variables override --config.

    Example: astra-train synth arenas --envs synth/envs --out synth/arenas --heldout 0.1
    --near 2 --far 1 --seed 0 && astra-eval arenas validate synth/arenas/train.jsonl
    """
    import asyncio

    from training.synth.envs.build import ArenaConfig, build_arenas

    overrides = {
        "out": out,
        "envs": envs,
        "resume": resume,
        "overwrite": overwrite,
        **{"near": near, "far": far, "near_pool": near_pool, "far_ratio": far_ratio},
        **{"heldout": heldout, "seed": seed, "concurrency": concurrency, "shard": shard},
    }
    cfg = _load(ArenaConfig, config, overrides, env_prefix="ASTRA_SYNTH_ARENAS_")
    with _bar("records") as hook:
        stats = asyncio.run(build_arenas(cfg, hook))
    rows: list[tuple[str, Any]] = [
        ("environments", stats.environments),
        ("arena records", stats.records),
        ("  train.jsonl", stats.train),
        ("  heldout.jsonl", stats.heldout),
    ]
    rows += [(f"distractors, {band} band", n) for band, n in stats.distractors.items()]
    rows.append(("records short of distractors", stats.short_of_distractors))
    _summary(f"arenas → {out}", stats, rows)
    if not stats.records:
        err_console.print("[yellow]warning:[/] no arena record was kept: see rejections.jsonl")


# ------------------------------------------------------------------ confirm, check-chains (teacher)


@synth_app.command("confirm")
@cli_errors
def confirm(
    out: OutOpt,
    graph: Annotated[
        list[Path] | None,
        typer.Option(help="A `synth graph` --out (repeatable: the shards of a graph)."),
    ] = None,
    pool: Annotated[
        list[Path] | None,
        typer.Option(help="The graph's `synth pool` --out (default: the pool its stats name)."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/JSON.")] = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    temperature: TemperatureOpt = None,
    batch: Annotated[int | None, typer.Option(help="Edges per teacher prompt (8).")] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Teacher calls per batch, retries included (3).")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="Batches at once (4).")] = None,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
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
    import asyncio

    from training.synth.tools.confirm import ConfirmConfig, synth_confirm

    overrides = {
        "out": out,
        "graph": graph,
        "pool": pool,
        "model": model_overrides(base_url, model, api_key, temperature),
        "teacher": _given(max_attempts=max_attempts),
        "resume": resume,
        "overwrite": overwrite,
        **{"batch": batch, "concurrency": concurrency, "shard": shard},
    }
    cfg = _load(ConfirmConfig, config, overrides, env_prefix="ASTRA_SYNTH_CONFIRM_")
    with _bar("batches") as hook:
        stats = asyncio.run(synth_confirm(cfg, hook))
    rows: list[tuple[str, Any]] = [
        ("edges proposed", stats.proposed),
        ("  confirmed", stats.confirmed),
        ("  refused by the teacher", stats.refused),
        ("  not judged", stats.unjudged),
        ("batches (failed)", f"{stats.batches} ({stats.failed_batches})"),
        ("tools without a confirmed edge", len(stats.isolated)),
    ]
    tokens = f"{stats.prompt_tokens:,} prompt + {stats.completion_tokens:,} completion"
    rows.append(("teacher tokens", tokens))
    _summary(f"confirm → {out}", stats, rows)
    if stats.proposed and not stats.confirmed:
        err_console.print("[yellow]warning:[/] no edge was confirmed: see rejections.jsonl")


@synth_app.command("check-chains")
@cli_errors
def check_chains(
    out: OutOpt,
    chains: Annotated[
        list[Path] | None,
        typer.Option(help="A `synth chains` --out, or a chains JSONL (repeatable: shards)."),
    ] = None,
    pool: Annotated[
        list[Path] | None,
        typer.Option(help="The `synth pool` --out of the chains' tools (repeatable: shards)."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/JSON.")] = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    temperature: TemperatureOpt = None,
    votes: Annotated[
        int | None, typer.Option(help="Teacher votes per chain, at --temperature (1).")
    ] = None,
    vote_threshold: Annotated[
        float | None, typer.Option(help="Share of yes votes a chain needs (0.5).")
    ] = None,
    back_translate: Annotated[
        bool | None, typer.Option(help="Request → tool sequence must give the chain back (on).")
    ] = None,
    max_offered: Annotated[
        int | None, typer.Option(help="Tools offered to back-translate, distractors too (32).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the distractors' draw (0).")] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Teacher calls per question, retries included (3).")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="Chains at once (8).")] = None,
    shard: ShardOpt = None,
    overwrite: OverwriteOpt = None,
    resume: ResumeOpt = None,
) -> None:
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
    import asyncio

    from training.synth.tools.check_chains import CheckChainsConfig, synth_check_chains

    overrides = {
        "out": out,
        "chains": chains,
        "pool": pool,
        "model": model_overrides(base_url, model, api_key, temperature),
        "teacher": _given(max_attempts=max_attempts),
        "resume": resume,
        "overwrite": overwrite,
        **{"votes": votes, "vote_threshold": vote_threshold, "back_translate": back_translate},
        **{"max_offered": max_offered, "seed": seed, "concurrency": concurrency, "shard": shard},
    }
    cfg = _load(CheckChainsConfig, config, overrides, env_prefix="ASTRA_SYNTH_CHECK_CHAINS_")
    with _bar("chains") as hook:
        stats = asyncio.run(synth_check_chains(cfg, hook))
    share = f"{stats.kept_share:.0%}" if stats.kept_share is not None else "-"
    rows: list[tuple[str, Any]] = [
        ("chains checked", stats.checked),
        ("  kept", f"{stats.kept} ({share})"),
        ("  voted out", stats.voted_out),
        ("  back-translation mismatch", stats.mismatched),
        ("votes yes / no", f"{stats.votes_yes} / {stats.votes_no}"),
    ]
    tokens = f"{stats.prompt_tokens:,} prompt + {stats.completion_tokens:,} completion"
    rows.append(("teacher tokens", tokens))
    _summary(f"check-chains → {out}", stats, rows)
    if stats.checked and not stats.kept:
        err_console.print("[yellow]warning:[/] no chain was kept: see rejections.jsonl")
