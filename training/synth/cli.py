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
OverwriteOpt = Annotated[bool, typer.Option(help="Replace the outputs of an earlier run in --out.")]
ResumeOpt = Annotated[
    bool, typer.Option(help="Continue an interrupted run in --out (same inputs and parameters).")
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
    overwrite: OverwriteOpt = False,
    resume: ResumeOpt = False,
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
            overwrite=overwrite,
            resume=resume,
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
    overwrite: OverwriteOpt = False,
    resume: ResumeOpt = False,
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
        stats = build_graph(pool, out, options, overwrite=overwrite, resume=resume, progress=hook)
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
    overwrite: OverwriteOpt = False,
    resume: ResumeOpt = False,
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
            graph, out, options, overwrite=overwrite, resume=resume, progress=hook
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
    overwrite: OverwriteOpt = False,
    resume: ResumeOpt = False,
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
        "modes": [m.strip() for m in modes.split(",") if m.strip()] if modes else None,
        "min_scores": parse_min_scores(min_score) if min_score else None,
        "teacher": {"max_attempts": max_attempts} if max_attempts else None,
        "resume": resume or None,
        "overwrite": overwrite or None,
        **{"min_mean": min_mean, "dedup_threshold": dedup_threshold, "shard": shard},
        **{"decontaminate": decontaminate, "decontam_threshold": decontam_threshold},
        "concurrency": concurrency,
    }
    cfg = load_config(TasksConfig, config, overrides, env_prefix="ASTRA_SYNTH_TASKS_")
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
