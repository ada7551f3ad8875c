"""Stage 2b, the teacher's confirmation of the tool graph: is "B can consume what A returns" so?

``synth graph`` proposes edges from the schemas alone; here the teacher reads them in batches
(``--batch``, 8 edges a prompt, ``prompts/edge_confirm.v1.jinja``: both tools' descriptions,
parameters and returns, each edge's matched parameters and the proposer's reason) and answers
one verdict per edge, ``{"edge": n, "consumes": bool, "reason": "…"}``. The judge plugs into
:func:`~training.synth.tools.graph.confirm_edges`; a batch is one unit of the run (resumable,
concurrent, its teacher tokens counted). A reply whose verdicts are not one per edge, numbered
1..n (any order), is a schema error: asked again, at most ``max_attempts`` calls in all.

Input: ``synth graph`` directories (the shards of one graph) and the pool the graph was built
from (``--pool``; by default the pool files the graph's ``stats.json`` names, checked by their
sha256). Output (``OUT``): a graph directory that ``synth chains --graph`` reads as it is —
``edges.jsonl`` holds every input edge (this shard's) with ``confirmed`` true or false and
``judge_reason`` (the teacher's reason; for an edge that was not judged, why), ``nodes.jsonl``
(degrees over the confirmed edges), ``rejections.jsonl``: ``judge_no`` (the teacher's
reason), ``edge_confirm:<problem>`` (no usable reply for the batch; raw kept),
``unknown_tool`` (an edge's tool is not in the pool), ``judge_failed``, ``duplicate_edge``,
``not_json`` / ``bad_record``; ``stats.json`` (:class:`ConfirmStats`, ``stage: graph`` so that
later stages take the directory for a graph, ``check: confirm``). ``synth chains`` walks only
the edges not marked ``confirmed: false``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from astra_agent.errors import ConfigError, ServerError
from astra_agent.runio import file_sha256
from training.synth.runner import (
    StageContext,
    TeacherStage,
    TeacherStageConfig,
    TeacherStageStats,
    run_teacher_stage,
)
from training.synth.stage import (
    Progress,
    Rejection,
    StageRun,
    SynthError,
    UnitOutcome,
    check_out,
    read_stats,
)
from training.synth.teacher import TeacherRejected
from training.synth.text import cut_text
from training.synth.tools.graph import (
    EDGES_FILE,
    NODES_FILE,
    EdgeQuestion,
    GraphNode,
    GraphStats,
    ToolEdge,
    Verdict,
    confirm_edges,
    count_graph,
    graph_nodes,
    read_graph_dir,
)
from training.synth.tools.graph import STAGE as GRAPH_STAGE
from training.synth.tools.pool import ToolRecord, read_tools

STAGE = "confirm"
CONFIRM = "edge_confirm"  # the prompt template


# ------------------------------------------------------------------ what the teacher returns


class EdgeVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    edge: int = Field(ge=1)
    consumes: bool
    reason: str = Field("", max_length=2000)


class EdgeVerdicts(BaseModel):
    """The reply for a batch; :func:`verdicts_schema` adds the check that it fits the batch."""

    model_config = ConfigDict(extra="forbid")

    verdicts: list[EdgeVerdict] = Field(max_length=1000)


@cache
def verdicts_schema(n: int) -> type[EdgeVerdicts]:
    """:class:`EdgeVerdicts` for a batch of ``n`` edges: one verdict per edge, 1..n."""

    class BatchVerdicts(EdgeVerdicts):
        @model_validator(mode="after")
        def _one_per_edge(self) -> BatchVerdicts:
            got = sorted(v.edge for v in self.verdicts)
            if got != list(range(1, n + 1)):
                shown = ", ".join(map(str, got[:20])) or "none"
                raise ValueError(
                    f"give exactly one verdict per link, numbered 1 to {n} (got {shown})"
                )
            return self

    BatchVerdicts.__name__ = BatchVerdicts.__qualname__ = f"EdgeVerdicts{n}"
    return BatchVerdicts


# ------------------------------------------------------------------ config, stats


class ConfirmConfig(TeacherStageConfig):
    """``astra-train synth confirm``."""

    graph: list[Path] = Field(
        min_length=1, description="`synth graph` outputs (shards) (repeatable)"
    )
    pool: list[Path] = Field(
        default_factory=list,
        description="the graph's `synth pool` (default: from its stats) (repeatable)",
    )
    batch: int = Field(8, ge=1, le=64, description="edges per prompt")
    concurrency: int = Field(4, ge=1, description="batches at once")


class ConfirmStats(GraphStats, TeacherStageStats):
    """``stats.json``: a graph's (over the confirmed edges) and the confirmation's counts."""

    check: str = STAGE
    pools: list[str] = Field(default_factory=list)  # the pool files the tools came from
    proposed: int = 0  # edges read (this shard's)
    confirmed: int = 0
    refused: int = 0  # the teacher said no
    unjudged: int = 0  # no usable verdict (failed batches, unknown tools)
    batches: int = 0
    failed_batches: int = 0

    def summary(self) -> list[tuple[str, Any]]:
        return [
            ("edges proposed", self.proposed),
            ("  confirmed", self.confirmed),
            ("  refused by the teacher", self.refused),
            ("  not judged", self.unjudged),
            ("batches (failed)", f"{self.batches} ({self.failed_batches})"),
            ("tools without a confirmed edge", len(self.isolated)),
        ]

    def warning(self) -> str | None:
        return "no edge was confirmed" if self.proposed and not self.confirmed else None


# ------------------------------------------------------------------ inputs


@dataclass
class GraphInput:
    edges: list[tuple[str, ToolEdge]]  # (file:line, edge), each id once
    nodes: dict[str, GraphNode]
    rejected: list[Rejection]
    files: list[Path]
    pools: list[Path]  # the pool files the graphs' stats name


def read_graph_dirs(dirs: Sequence[Path]) -> GraphInput:
    """Edges and nodes of graph directories (``synth graph`` or ``synth confirm`` outputs)."""
    got = GraphInput([], {}, [], [], [])
    seen: set[str] = set()
    for d in dirs:
        stats, edges = read_graph_dir(d, STAGE, got.nodes, got.rejected)
        named = stats.get("pools") or [i.get("path") for i in stats.get("inputs") or []]
        got.pools += [Path(p) for p in named if isinstance(p, str)]
        got.files += [d / NODES_FILE, d / EDGES_FILE]
        for where, edge in edges:
            if edge.id in seen:
                got.rejected.append(
                    Rejection(stage=STAGE, source=where, id=edge.id, reason="duplicate_edge")
                )
            else:
                seen.add(edge.id)
                got.edges.append((where, edge))
    return got


def default_pools(graph: GraphInput, graphs: Sequence[Path]) -> list[Path]:
    """The pool files the graphs were built from, unchanged since (else a ConfigError)."""
    recorded: dict[str, Any] = {}
    for d in graphs:
        stats = read_stats(d, GRAPH_STAGE)
        recorded |= {i["path"]: i.get("sha256") for i in stats.get("inputs") or []
                     if isinstance(i, dict) and "path" in i}  # fmt: skip
    out = []
    for p in dict.fromkeys(graph.pools):
        if not p.is_file() or (recorded.get(str(p)) not in (None, file_sha256(p))):
            what = "changed since" if p.is_file() else "is not there"
            raise ConfigError(
                f"the graph was built from {p}, which {what}",
                hint="pass the pool the graph was built from with --pool",
            )
        out.append(p)
    if not out:
        raise ConfigError("the graph's stats.json names no pool", hint="pass --pool")
    return out


def edge_view(questions: Sequence[EdgeQuestion]) -> dict[str, Any]:
    """The prompt's variables for a batch: its tools (each once) and its numbered edges."""
    tools: dict[str, ToolRecord] = {}
    for q in questions:
        tools.setdefault(q.source.id, q.source)
        tools.setdefault(q.target.id, q.target)
    shown = []
    for t in tools.values():
        returns = t.output_description or (json.dumps(t.output_schema) if t.output_schema else "")
        shown.append({
            "id": t.id,
            "description": " ".join(t.description.split()) or "(no description)",
            "parameters": cut_text(json.dumps(t.input_schema, ensure_ascii=False)),
            "returns": cut_text(" ".join(returns.split())),
        })  # fmt: skip
    edges = [
        {"n": n, "source": q.edge.source, "target": q.edge.target,
         "params": list(dict.fromkeys(m.param for m in q.edge.matches)), "reason": q.edge.reason}
        for n, q in enumerate(questions, start=1)
    ]  # fmt: skip
    return {"tools": shown, "edges": edges, "edges_json": json.dumps(edges, ensure_ascii=False)}


# ------------------------------------------------------------------ the stage


class ConfirmStage:
    def __init__(self, ctx: StageContext[ToolEdge], tools: Mapping[str, ToolRecord]) -> None:
        self.ctx, self.teacher, self.tools = ctx, ctx.teacher, tools
        self.ref = ctx.teacher.prompt(CONFIRM).ref

    async def process(self, key: str, unit: list[tuple[str, ToolEdge]]) -> UnitOutcome[ToolEdge]:
        trouble: list[BaseException] = []
        replies: list[tuple[str, int]] = []  # (raw, attempts)

        async def judge(batch: Sequence[EdgeQuestion]) -> list[Verdict]:
            schema = verdicts_schema(len(batch))
            try:
                answer = await self.teacher.ask(CONFIRM, schema, **edge_view(batch))
            except (TeacherRejected, ServerError) as exc:
                trouble.append(exc)
                raise
            replies.append((answer.raw, answer.attempts))
            ordered = sorted(answer.value.verdicts, key=lambda v: v.edge)
            return [Verdict(v.consumes, v.reason) for v in ordered]

        edges = [e for _, e in unit]
        known = [e for e in edges if e.source in self.tools and e.target in self.tools]
        got = await confirm_edges(known, self.tools, judge, batch_size=len(edges), concurrency=1)
        failed = trouble[0] if trouble else None
        if isinstance(failed, ServerError):
            raise failed  # the endpoint, not the data: the batch stays undone for --resume
        decided: dict[str, ToolEdge | Rejection] = {e.id: e for e in got.confirmed}
        decided |= {r.id: self._rejection(r, failed) for r in got.rejected}
        judged = {e.id for e in known}
        for _, e in unit:
            if e.id not in judged:
                why = "a tool of the edge is not in the pool"
                decided[e.id] = Rejection(
                    stage=STAGE, source="", id=e.id, reason="unknown_tool", detail=why
                )
        attempts = replies[0][1] if replies else 0
        records, rejections = [], []
        for where, edge in unit:
            d = decided[edge.id]
            if isinstance(d, Rejection):
                rejections.append(d.model_copy(update={"source": where}))
                reason = d.detail if d.reason == "judge_no" else f"not judged ({d.reason})"
                d = edge.model_copy(update={"confirmed": False, "judge_reason": reason})
            records.append(self._record(d, key, attempts))
        return UnitOutcome(records, rejections)

    def _rejection(self, r: Rejection, failed: BaseException | None) -> Rejection:
        """A teacher without a usable reply: its reason code and raw text, not graph's."""
        if r.reason == "judge_failed" and isinstance(failed, TeacherRejected):
            return r.model_copy(
                update={"reason": failed.code, "detail": failed.detail, "raw": failed.raw_text}
            )
        return r

    def _record(self, edge: ToolEdge, key: str, attempts: int) -> ToolEdge:
        before = edge.provenance.model_dump(mode="json") if edge.provenance else None
        detail = {"batch": key, "attempts": attempts, "proposed": before}
        prov = self.ctx.provenance([edge.id], prompts={CONFIRM: self.ref}, detail=detail)
        return edge.model_copy(update={"provenance": prov})


async def synth_confirm(cfg: ConfirmConfig, progress: Progress | None = None) -> ConfirmStats:
    """The teacher's verdict on every edge of ``cfg.graph`` (this shard's) into ``cfg.out``."""
    check_out(cfg.out, cfg.graph, "--graph")
    graph = read_graph_dirs(cfg.graph)
    pools = cfg.pool or default_pools(graph, cfg.graph)
    tools, pool_files = read_tools(pools, STAGE)
    mine = sorted(
        ((w, e) for w, e in graph.edges if cfg.holds(e.source)),
        key=lambda we: (we[1].source, we[1].target),
    )
    if not graph.nodes:
        raise SynthError(f"no tool in the graph {', '.join(map(str, cfg.graph))}")
    units = [(f"batch-{i // cfg.batch:06d}", mine[i : i + cfg.batch])
             for i in range(0, len(mine), cfg.batch)]  # fmt: skip
    spec = TeacherStage(
        name=STAGE, units=units, inputs=[*graph.files, *pool_files],
        prompts=(CONFIRM,), output=EDGES_FILE, record=ToolEdge, stats=ConfirmStats,
        writes=GRAPH_STAGE, extra_outputs=(NODES_FILE,), rejected=graph.rejected,
        start=lambda ctx: ConfirmStage(ctx, tools).process,
        count=lambda stats, run, order: {NODES_FILE: _count(stats, run, order, graph.nodes)},
        stats_fields={"pools": [str(p) for p in pool_files], "proposed": len(mine),
                      "batches": len(units)},
    )  # fmt: skip
    return await run_teacher_stage(cfg, spec, progress)


def _count(
    stats: ConfirmStats, run: StageRun[ToolEdge], order: Sequence[str], nodes: dict[str, GraphNode]
) -> list[GraphNode]:
    edges = [e for unit in order for e in run.records(unit)]
    kept = [e for e in edges if e.confirmed]
    rejected = [r for unit in order for r in run.units[unit].rejections]
    stats.confirmed = len(kept)
    stats.refused = sum(r.reason == "judge_no" for r in rejected)
    stats.unjudged = len(edges) - stats.confirmed - stats.refused
    stats.failed_batches = sum(
        any(r.reason.startswith(f"{CONFIRM}:") or r.reason == "judge_failed"
            for r in run.units[unit].rejections)
        for unit in order
    )  # fmt: skip
    out = graph_nodes(nodes.values(), kept)
    count_graph(stats, out, kept)
    return out
