"""Stage 1, the tool pool: every tool of a set of MCP servers, one normalized record each.

Two sources. An ``mcpServers`` config (the file ``astra-agent`` reads): its servers are
started and their tools listed through :class:`~astra_agent.mcp_env.MCPEnvironment`; a server
that fails to start or to list its tools is named in ``rejections.jsonl`` (``server_failed``,
with its error and stderr tail, and in ``stats.json``) and the run goes on with the others (a
failed server is never marked done, so resuming an interrupted run tries it again). Or a JSONL
of server descriptions, one server per line, in ASTRA's ``mcp_servers.jsonl`` shape::

    {"base_info": {"group_info": {"server_name": "...", "server_title": "...",
                                  "server_description": "...", "domain": "..."},
                   "tool_list": [{"name": "...", "description": "...", "parameters": {...}}]}}

(also nested under ``"mcp_info"``, as ASTRA's graph stage writes it), or a flat shape:
``{"name"|"server_name"|"server", "description", "domain"|"category", "tools"|"tool_list"}``.
A tool's input schema is read from ``inputSchema``, ``input_schema`` or ``parameters``, an
OpenAI ``{"type": "function", "function": {...}}`` wrapper is unwrapped, and what it returns
from ``outputSchema``/``output_schema`` and ``output_description``/``returns`` (hints for the
graph; optional).

Output (``OUT``): ``pool.jsonl``, one :class:`ToolRecord` per tool (id ``server/tool``);
``rejections.jsonl`` with a reason per thing left out (``not_json``, ``not_a_server``,
``no_server_name``, ``no_tools``, ``no_tool_name``, ``bad_input_schema``, ``duplicate_tool``,
``server_failed``); ``stats.json`` (counts by server and domain, the failed servers).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.config import read_text
from astra_agent.errors import ConfigError, ServerError
from astra_agent.mcp_config import MCPConfig, load_mcp_config
from astra_agent.mcp_env import MCPEnvironment
from training.synth.inputs import json_lines, read_records, read_stage_output
from training.synth.runner import StageConfig
from training.synth.stage import (
    Progress,
    Provenance,
    Rejection,
    StageRun,
    StageStats,
    SynthError,
    open_run,
    provenance,
    read_stats,
    tally,
)

log = logging.getLogger(__name__)

STAGE = "pool"
POOL_FILE = "pool.jsonl"
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class ToolRecord(BaseModel):
    """One tool of the pool."""

    model_config = ConfigDict(extra="ignore")

    id: str  # "server/tool"
    server: str
    name: str
    domain: str = ""
    description: str = ""
    server_description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: dict(EMPTY_SCHEMA))
    output_schema: dict[str, Any] | None = None
    output_description: str = ""
    annotations: dict[str, Any] = Field(default_factory=dict)  # MCP's hints (readOnlyHint…)
    provenance: Provenance | None = None


class PoolConfig(StageConfig):
    """``astra-train synth pool``: exactly one of ``mcp_config`` and ``servers``."""

    mcp_config: Path | None = Field(
        None, description="an mcpServers config (JSON/YAML): its servers are started and listed"
    )
    servers: Path | None = Field(
        None, description="a JSONL of server descriptions (ASTRA's mcp_servers.jsonl shape)"
    )
    domain: str = Field("", description="domain of the servers of --mcp-config (it names none)")
    shard: str | None = Field(
        None, description="only the servers whose name hashes to i, given as i/N (0-based)"
    )


class PoolStats(StageStats):
    servers: int = 0
    servers_failed: dict[str, str] = Field(default_factory=dict)
    tools: int = 0
    with_output_schema: int = 0
    by_server: dict[str, int] = Field(default_factory=dict)
    by_domain: dict[str, int] = Field(default_factory=dict)

    def summary(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [
            ("servers", self.servers),
            ("tools", self.tools),
            ("with output hints", self.with_output_schema),
        ]
        return rows + [(f"  domain {d or '(none)'}", n) for d, n in self.by_domain.items()]


@dataclass
class ServerEntry:
    """A server as a source describes it: its tools still raw."""

    name: str
    source: str  # "file:line" or "mcp:<config>"
    description: str = ""
    domain: str = ""
    tools: list[Any] = field(default_factory=list)


# ------------------------------------------------------------------ reading servers JSONL


def _reject(source: str, rid: str, reason: str, detail: str = "") -> Rejection:
    return Rejection(stage=STAGE, source=source, id=rid, reason=reason, detail=detail)


def _text(*values: Any) -> str:
    return next((v.strip() for v in values if isinstance(v, str) and v.strip()), "")


def server_entry(data: Any, source: str) -> ServerEntry | Rejection:
    """One line of a servers JSONL: ASTRA's shape (``base_info``, maybe under ``mcp_info``)
    or the flat one."""
    if not isinstance(data, dict):
        return _reject(source, "", "not_a_server", f"a JSON {type(data).__name__}, not an object")
    base = (data.get("mcp_info") or {}).get("base_info") if "mcp_info" in data else None
    base = base if isinstance(base, dict) else data.get("base_info")
    info: dict[str, Any]
    if isinstance(base, dict):
        group = base.get("group_info")
        info = group if isinstance(group, dict) else {}
        tools = base.get("tool_list")
    else:
        info, tools = data, data.get("tools", data.get("tool_list"))
    name = _text(
        info.get("server_name"), info.get("name"), info.get("server"), info.get("server_title")
    )
    if not name:
        return _reject(
            source, "", "no_server_name", "none of server_name, name, server, server_title"
        )
    if not isinstance(tools, list):
        return _reject(source, name, "no_tools", "no tool list (tool_list or tools)")
    return ServerEntry(
        name=name,
        source=source,
        description=_text(info.get("server_description"), info.get("description")),
        domain=_text(info.get("domain"), info.get("category")),
        tools=tools,
    )


def read_servers(path: Path) -> tuple[list[ServerEntry], list[Rejection]]:
    """The servers of a JSONL file (lines of one server name merged, in file order)."""
    text = read_text(path, "servers file")
    servers: dict[str, ServerEntry] = {}
    rejected: list[Rejection] = []
    for n, data in json_lines(text, path, STAGE, rejected):
        got = server_entry(data, f"{path}:{n}")
        if isinstance(got, Rejection):
            rejected.append(got)
        elif got.name in servers:
            servers[got.name].tools += got.tools
        else:
            servers[got.name] = got
    return list(servers.values()), rejected


# ------------------------------------------------------------------ normalizing tools


def _schema_problem(schema: Any) -> str | None:
    """What makes ``schema`` unusable as a tool's input schema (None: nothing)."""
    if not isinstance(schema, dict):
        return f"a JSON {type(schema).__name__}, not an object schema"
    kind = schema.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        return f"type {kind!r}, not 'object'"
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        return f"properties is a JSON {type(props).__name__}, not an object"
    for key, sub in props.items():
        if not isinstance(sub, dict | bool):
            return f"property {key!r} has a JSON {type(sub).__name__} as its schema"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return "required is not a list of names"
    return None


def normalize_tool(raw: Any, server: ServerEntry, run: str) -> ToolRecord | Rejection:
    """A raw tool of ``server`` → a :class:`ToolRecord`, or the reason it cannot be one."""
    if isinstance(raw, dict) and isinstance(raw.get("function"), dict):
        raw = raw["function"]
    if not isinstance(raw, dict):
        what = f"a tool that is a JSON {type(raw).__name__}"
        return _reject(server.source, server.name, "no_tool_name", what)
    name = _text(raw.get("name"))
    if not name:
        return _reject(server.source, server.name, "no_tool_name")
    tid = f"{server.name}/{name}"
    schema = next((raw[k] for k in ("inputSchema", "input_schema", "parameters") if k in raw), None)
    schema = dict(EMPTY_SCHEMA) if schema is None or schema == {} else schema
    problem = _schema_problem(schema)
    if problem:
        return _reject(server.source, tid, "bad_input_schema", problem)
    schema = {"type": "object", "properties": {}, **schema}
    output = next((raw[k] for k in ("outputSchema", "output_schema") if k in raw), None)
    if output is not None and not isinstance(output, dict):
        log.warning("%s: output schema is not an object; dropped", tid)
        output = None
    annotations = raw.get("annotations")
    return ToolRecord(
        id=tid,
        server=server.name,
        name=name,
        domain=server.domain,
        description=_text(raw.get("description")),
        server_description=server.description,
        input_schema=schema,
        output_schema=output or None,
        output_description=_text(raw.get("output_description"), raw.get("returns")),
        annotations=annotations if isinstance(annotations, dict) else {},
        provenance=provenance(STAGE, run, [server.source]),
    )


def _server_records(server: ServerEntry, run: str) -> tuple[list[ToolRecord], list[Rejection]]:
    kept: dict[str, ToolRecord] = {}
    rejected: list[Rejection] = []
    for raw in server.tools:
        got = normalize_tool(raw, server, run)
        if isinstance(got, Rejection):
            rejected.append(got)
        elif got.id in kept:
            twice = f"server {server.name!r} lists {got.name!r} more than once"
            rejected.append(_reject(server.source, got.id, "duplicate_tool", twice))
        else:
            kept[got.id] = got
    return list(kept.values()), rejected


# ------------------------------------------------------------------ listing live servers


def _output_schemas(env: MCPEnvironment) -> dict[tuple[str, str], tuple[Any, Any]]:
    """(server, tool) → (output schema, annotations) as the servers listed them.

    The environment's public listing (:class:`ToolSpec`) carries what the model sees, not
    what a tool returns; the graph wants that too, so it is read from the listed MCP tools."""
    out: dict[tuple[str, str], tuple[Any, Any]] = {}
    for name, server in getattr(env, "_servers", {}).items():
        for tool in getattr(server, "tools", []):
            annotations = getattr(tool, "annotations", None)
            if annotations is not None and hasattr(annotations, "model_dump"):
                annotations = annotations.model_dump(by_alias=True, exclude_none=True)
            out[(name, tool.name)] = (getattr(tool, "output_schema", None), annotations)
    return out


async def list_servers(
    config: MCPConfig, source: str, domain: str = ""
) -> tuple[list[ServerEntry], dict[str, str]]:
    """Start ``config``'s servers together, list their tools, stop them: the servers that
    answered (tools as raw dicts) and, by name, why each of the others failed."""
    env = MCPEnvironment(config)
    try:
        await env.start()
    except ServerError as exc:  # every server failed
        failures = dict(env.failures) or dict.fromkeys(config.enabled(), str(exc))
        return [], failures
    try:
        specs = await env.list_tools()
        routes = env.routes()
        extra = _output_schemas(env)
    finally:
        await env.close()
    entries = {
        n: ServerEntry(name=n, source=source, domain=domain)
        for n in config.enabled()
        if n not in env.failures
    }
    for spec in specs:
        server, own = routes[spec.name]
        output, annotations = extra.get((server, own), (None, None))
        raw = {"name": own, "description": spec.description, "inputSchema": spec.parameters}
        if output is not None:
            raw["outputSchema"] = output
        if annotations:
            raw["annotations"] = annotations
        entries[server].tools.append(raw)
    return list(entries.values()), dict(env.failures)


# ------------------------------------------------------------------ the stage


def _stats_counts(stats: PoolStats, records: list[ToolRecord]) -> None:
    stats.by_server = tally(r.server for r in records)
    stats.by_domain = tally((r.domain for r in records), str)
    stats.with_output_schema = sum(
        r.output_schema is not None or bool(r.output_description) for r in records
    )
    stats.tools = len(records)


def build_pool(cfg: PoolConfig, progress: Progress | None = None) -> PoolStats:
    """Build ``cfg.out/pool.jsonl`` from an ``mcpServers`` config or a servers JSONL (exactly
    one of them); see the module's docstring for what is written. Synchronous: it runs the MCP
    servers' event loop itself (from async code, call it in a worker thread)."""
    if (cfg.mcp_config is None) == (cfg.servers is None):
        raise ConfigError("give either --mcp-config or --servers (one of them)")
    source = cfg.mcp_config or cfg.servers
    assert source is not None
    config = load_mcp_config(source) if cfg.mcp_config is not None else None
    params = {"source": "mcp" if config else "servers", **cfg.params()}
    run, stats = open_run(
        cfg.out, STAGE, output=POOL_FILE, record_type=ToolRecord, stats=PoolStats,
        inputs=[source], params=params, overwrite=cfg.overwrite, resume=cfg.resume,
        fsync=True,
    )  # fmt: skip
    if run.complete:
        return stats
    if config is not None:
        order, rejected = _from_mcp(run, cfg, config, stats, progress)
    else:
        order, rejected = _from_servers(run, cfg, source, stats, progress)
    records = [r for name in order for r in run.records(name)]
    _stats_counts(stats, records)
    if not records:
        failed = "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in stats.servers_failed.items())
        raise SynthError(
            f"no tool in the pool ({len(rejected)} rejection(s) before the tools"
            + (f"; failed servers: {failed}" if failed else "")
            + ")",
            hint="check the servers (astra-agent tools --config FILE) or the input file",
        )
    return run.finish(stats, order, rejections=rejected)


def _from_servers(
    run: StageRun[ToolRecord],
    cfg: PoolConfig,
    path: Path,
    stats: PoolStats,
    progress: Progress | None,
) -> tuple[list[str], list[Rejection]]:
    entries, rejected = read_servers(path)
    mine = [e for e in entries if cfg.holds(e.name)]
    stats.servers = len(mine)
    for i, entry in enumerate(mine, start=1):
        if not run.done(entry.name):
            records, why = _server_records(entry, run.fingerprint)
            run.commit(entry.name, records, why)
        if progress is not None:
            progress(i, len(mine))
    return [e.name for e in mine], rejected


def _from_mcp(
    run: StageRun[ToolRecord],
    cfg: PoolConfig,
    config: MCPConfig,
    stats: PoolStats,
    progress: Progress | None,
) -> tuple[list[str], list[Rejection]]:
    source = f"mcp:{cfg.mcp_config}"
    names = [n for n in config.enabled() if cfg.holds(n)]
    stats.servers = len(names)
    todo = [n for n in names if not run.done(n)]
    if progress is not None:
        progress(stats.resumed_units, len(names))
    rejected: list[Rejection] = []
    if todo:
        subset = config.model_copy(update={"servers": {n: config.servers[n] for n in todo}})
        entries, failures = asyncio.run(list_servers(subset, source, cfg.domain))
        for entry in entries:
            records, why = _server_records(entry, run.fingerprint)
            run.commit(entry.name, records, why)
        for name in todo:  # in config order
            if name in failures:
                stats.servers_failed[name] = failures[name]
                rejected.append(_reject(source, name, "server_failed", failures[name]))
        if progress is not None:
            progress(len(names), len(names))
    return names, rejected


def read_pool(directory: Path) -> tuple[list[tuple[int, ToolRecord]], list[Rejection]]:
    """The records of a pool directory's ``pool.jsonl`` with their line numbers; unreadable
    lines as rejections."""
    read_stats(directory, STAGE)
    return read_records(directory / POOL_FILE, ToolRecord, "graph")


# A later stage's input: the pool its chains' tools come from.
PoolInputs = Annotated[
    list[Path],
    Field(min_length=1, description="`synth pool` outputs or pool.jsonl files (repeatable)"),
]


def read_tools(paths: Sequence[Path], stage: str) -> tuple[dict[str, ToolRecord], list[Path]]:
    """The tools of ``synth pool`` directories or ``pool.jsonl`` files, by id (the first of
    an id; lines that are not tools are skipped); and the files read."""
    got = read_stage_output(paths, ToolRecord, stage=stage, producer=STAGE, file=POOL_FILE)
    return {t.id: t for _, t in got.records}, got.files


def not_in_pool(ids: Sequence[str], tools: Mapping[str, ToolRecord]) -> str | None:
    """Why a chain of ``ids`` cannot be used with ``tools``: those missing (None: none is)."""
    missing = [t for t in ids if t not in tools]
    return f"not in the pool: {', '.join(missing)}" if missing else None


def tool_view(tools: Sequence[ToolRecord]) -> tuple[list[dict[str, Any]], str]:
    """The tools as the prompts show them: a list, and the same as one line of JSON."""
    view = []
    for t in tools:
        item: dict[str, Any] = {"name": t.name, "description": t.description}
        item["parameters"] = t.input_schema
        if t.output_description or t.output_schema:
            item["returns"] = t.output_description or t.output_schema
        view.append(item)
    return view, json.dumps(view, ensure_ascii=False)
