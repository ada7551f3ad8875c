"""Stage 2, the tool graph: directed edges "B can consume what A returns", from the schemas.

Edges are proposed deterministically, for every pair of tools of one domain (across servers,
not only within one; ``across_domains`` pairs every tool with every other). Each parameter of B
is matched against what A returns; the best match is the edge's score, every match above
:data:`MATCH_FLOOR` is kept with its rule:

``key`` (1.0)
    B's parameter is a key of an entity (``flight_id``, ``userId``, ``entityNames``; a bare
    ``id`` is a key of B's own entity) that A yields: A lists, searches or creates it
    (``search_flights``), reads it without needing its key, or has an output field keyed to it
    (``booking_id``, ``id`` inside ``bookings[]``). Name keys (``*_name``) weigh 0.85; a key
    whose head noun agrees but whose qualifiers differ (``return_flight_id``) 0.9 of that.
``mention`` (0.9)
    B's parameter description names A ("the id returned by search_flights").
``field`` (0.8) / ``qualified`` (0.7)
    an output field of A has the parameter's name (``timezone`` ← ``timezone``), or one is the
    other with a qualifier (``source_timezone`` ← ``timezone``); the JSON types must agree.
    Generic names (``content``, ``message``, ``result``…) weigh 0.45.
``tokens`` (≤ 0.6)
    the parameter's name (or, at 0.75 of that, its description) in words that A is said to
    return, each word weighted by its rarity in the pool.

A match on an optional parameter weighs 0.9 of one on a required parameter. An edge is kept
when its score reaches ``min_score`` (0.5). The teacher's confirmation comes after:
:func:`confirm_edges`.

Output (``OUT``): ``edges.jsonl`` (:class:`ToolEdge`, id ``A->B``), ``nodes.jsonl``
(:class:`GraphNode`, every tool with its degrees), ``rejections.jsonl`` (pool lines that are
not JSON or not a tool, ``bad_schema``, ``duplicate_tool``), ``stats.json``.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.errors import ConfigError
from training.synth.inputs import read_records
from training.synth.runner import StageConfig
from training.synth.stage import (
    Progress,
    Provenance,
    Rejection,
    StageStats,
    SynthError,
    open_run,
    provenance,
    read_stats,
    tally,
)
from training.synth.tools.pool import POOL_FILE, ToolRecord, read_pool
from training.synth.tools.terms import (
    CREATORS,
    GENERIC,
    KEYS,
    STOP,
    Signature,
    signature,
    token_weights,
)
from training.synth.tools.terms import Field as SchemaField

STAGE = "graph"
EDGES_FILE = "edges.jsonl"
NODES_FILE = "nodes.jsonl"
MATCH_FLOOR = 0.3
OPTIONAL = 0.9
Rule = Literal["key", "mention", "field", "qualified", "tokens"]


class EdgeMatch(BaseModel):
    param: str  # B's parameter (dotted path)
    rule: Rule
    via: str  # what of A it matched: an output field, an entity, words
    score: float


class ToolEdge(BaseModel):
    """B (``target``) can consume what A (``source``) returns."""

    model_config = ConfigDict(extra="ignore")

    id: str  # "A->B"
    source: str
    target: str
    score: float
    reason: str
    matches: list[EdgeMatch]
    same_server: bool
    domain: str = ""
    confirmed: bool | None = None  # set by confirm_edges
    judge_reason: str = ""
    provenance: Provenance | None = None


class GraphNode(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    server: str
    name: str
    domain: str = ""
    out_degree: int = 0
    in_degree: int = 0


class GraphConfig(StageConfig):
    """``astra-train synth graph``."""

    pool: list[Path] = Field(
        min_length=1, description="a `synth pool` --out (repeatable: the shards of a pool)"
    )
    min_score: float = Field(0.5, ge=0.0, le=1.0, description="keep edges scoring at least this")
    across_domains: bool = Field(False, description="pair tools of different domains too")
    shard: str | None = Field(
        None, description="only the edges whose source hashes to i, given as i/N (0-based)"
    )


class GraphStats(StageStats):
    tools: int = 0
    edges: int = 0
    cross_server: int = 0
    by_rule: dict[str, int] = Field(default_factory=dict)  # of each edge's best match
    isolated: list[str] = Field(default_factory=list)  # tools with no edge in or out

    def summary(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [
            ("tools", self.tools),
            ("edges", self.edges),
            ("  across servers", self.cross_server),
        ]
        rows += [(f"  by {rule}", n) for rule, n in self.by_rule.items()]
        return [*rows, ("tools without any edge", len(self.isolated))]


# ------------------------------------------------------------------ matching


def compatible(want: str | None, got: str | None, items: str | None = None) -> bool:
    """Whether a value of JSON type ``got`` can fill a parameter of type ``want`` (``items``:
    the parameter's item type, when it is an array)."""
    if not want or not got or want == got:
        return True
    numbers = {"integer", "number"}
    if want in numbers and got in numbers:
        return True
    if want == "string" and got in numbers:  # an id printed as text
        return True
    return want == "array" and (items is None or compatible(items, got))


def _key_match(a: Signature, p: SchemaField) -> EdgeMatch | None:
    if not p.key_of:
        return None
    best = 0.0
    for entity in a.produces:
        if entity[-1] != p.key_of[-1]:  # head nouns must agree
            continue
        best = max(best, 1.0 if set(p.key_of) <= set(entity) else 0.9)
    if not best:
        return None
    what = " ".join(p.key_of)
    named = a.verb and a.entity and a.entity[-1] == p.key_of[-1]
    via = f"its {a.verb} yields {what} keys" if named else f"returns {what} keys"
    return EdgeMatch(param=p.path, rule="key", via=via, score=round(best * p.key_weight, 3))


def _field_match(a: Signature, p: SchemaField) -> EdgeMatch | None:
    best: EdgeMatch | None = None
    want = [t for t in p.tokens if t not in STOP]
    if len(want) == 1 and want[0] in KEYS:  # a bare id or name: only the key rule knows whose
        return None
    for f in a.outputs:
        got = [t for t in f.tokens if t not in STOP]
        if not got or not want or not compatible(p.type, f.type, p.items_type):
            continue
        generic = all(t in GENERIC for t in got) or all(t in GENERIC for t in want)
        if got == want:
            rule: Rule = "field"
            score = 0.45 if generic else 0.8
        elif want[-len(got) :] == got or got[-len(want) :] == want:
            rule, score = "qualified", 0.45 if generic else 0.7
        else:
            continue
        if best is None or score > best.score:
            best = EdgeMatch(param=p.path, rule=rule, via=f"output field {f.path!r}", score=score)
    return best


def _token_match(a: Signature, p: SchemaField, weights: Mapping[str, float]) -> EdgeMatch | None:
    def weight(t: str) -> float:  # generic words count half, in what is to be matched only
        return weights.get(t, 1.0) * (0.5 if t in GENERIC else 1.0)

    def share(tokens: Iterable[str]) -> tuple[float, list[str]]:
        mine = {t for t in tokens if t not in STOP}
        total = sum(weight(t) for t in mine)
        common = sorted(t for t in mine & a.returns if t not in GENERIC)
        return (sum(weight(t) for t in common) / total if total else 0.0), common

    bare_key = len(p.tokens) == 1 and p.tokens[0] in KEYS  # whose key: the words may say
    by_name, name_words = share(() if bare_key else p.tokens)
    by_text, text_words = share(p.words)
    score = round(0.6 * max(by_name, 0.75 * by_text), 3)
    if score < MATCH_FLOOR:
        return None
    shown = name_words if by_name >= 0.75 * by_text else text_words
    return EdgeMatch(param=p.path, rule="tokens", via=f"returns {', '.join(shown)}", score=score)


def defines(b: Signature, p: SchemaField) -> bool:
    """Whether ``p`` names a new entity of B's own (``create_entities``'s ``entities[].name``)
    rather than referring to an existing one."""
    return b.verb in CREATORS and p.key_of is not None and p.key_of[-1:] == b.entity[-1:]


def match_param(a: Signature, p: SchemaField, weights: Mapping[str, float]) -> EdgeMatch | None:
    """The best way ``p`` (a parameter of B) takes something A returns; None: none does."""
    found: list[EdgeMatch] = []
    if (m := _key_match(a, p)) is not None:
        found.append(m)
    if p.description and re.search(rf"(?<!\w){re.escape(a.name)}(?!\w)", p.description):
        found.append(EdgeMatch(param=p.path, rule="mention", via=f"names {a.name}", score=0.9))
    for m in (_field_match(a, p), _token_match(a, p, weights)):
        if m is not None:
            found.append(m)
    if not found:
        return None
    best = max(found, key=lambda m: m.score)
    if not p.required:
        best = best.model_copy(update={"score": round(best.score * OPTIONAL, 3)})
    return best if best.score >= MATCH_FLOOR else None


def propose_edge(
    a: Signature, b: Signature, weights: Mapping[str, float], min_score: float = 0.5
) -> ToolEdge | None:
    """The edge A → B if B can consume what A returns (score ≥ ``min_score``), else None."""
    if a.id == b.id:
        return None
    matches = [
        m for p in b.params if not defines(b, p) and (m := match_param(a, p, weights)) is not None
    ]
    if not matches:
        return None
    matches.sort(key=lambda m: (-m.score, m.param))
    best = matches[0]
    if best.score < min_score:
        return None
    return ToolEdge(
        id=f"{a.id}->{b.id}",
        source=a.id,
        target=b.id,
        score=best.score,
        reason=f"{b.name}.{best.param} ← {a.name} ({best.rule}: {best.via})",
        matches=matches,
        same_server=a.server == b.server,
        domain=a.domain if a.domain == b.domain else "",
    )


def propose_edges(
    tools: Sequence[ToolRecord], *, min_score: float = 0.5, across_domains: bool = False
) -> list[ToolEdge]:
    """Every edge among ``tools`` (a library entry point without any files; tools whose
    schemas cannot be read raise ValueError)."""
    sigs = sorted((signature(t) for t in tools), key=lambda s: s.id)
    weights = token_weights(sigs)
    edges = []
    for a in sigs:
        for b in sigs:
            same = across_domains or a.domain == b.domain
            if same and (e := propose_edge(a, b, weights, min_score)) is not None:
                edges.append(e)
    return edges


# ------------------------------------------------------------------ the stage


def _read_tools(pools: Sequence[Path]) -> tuple[list[ToolRecord], list[Signature], list[Rejection]]:
    tools: dict[str, ToolRecord] = {}
    sigs: list[Signature] = []
    rejected: list[Rejection] = []
    for directory in pools:
        kept, bad = read_pool(directory)
        rejected += bad
        for line, tool in kept:
            where = f"{directory / POOL_FILE}:{line}"
            if tool.id in tools:
                rejected.append(
                    Rejection(stage=STAGE, source=where, id=tool.id, reason="duplicate_tool")
                )
                continue
            try:
                sig = signature(tool)
            except (ValueError, TypeError, AttributeError) as exc:
                rejected.append(
                    Rejection(
                        stage=STAGE, source=where, id=tool.id, reason="bad_schema", detail=str(exc)
                    )
                )
                continue
            tools[tool.id] = tool
            sigs.append(sig)
    sigs.sort(key=lambda s: s.id)
    return [tools[s.id] for s in sigs], sigs, rejected


def build_graph(cfg: GraphConfig, progress: Progress | None = None) -> GraphStats:
    """Read the pool directories (several: the shards of a pool), write ``cfg.out`` (see the
    module's docstring); a tool whose schema cannot be read is rejected, the rest goes on."""
    inputs = [p / POOL_FILE for p in cfg.pool if (p / POOL_FILE).is_file()]
    tools, sigs, rejected = _read_tools(cfg.pool)
    if not sigs:
        raise SynthError(f"no readable tool in {', '.join(map(str, cfg.pool))}")
    run, stats = open_run(
        cfg.out, STAGE, output=EDGES_FILE, record_type=ToolEdge, stats=GraphStats, inputs=inputs,
        params=cfg.params(), overwrite=cfg.overwrite, resume=cfg.resume,
        extra_outputs=(NODES_FILE,),
    )  # fmt: skip
    if run.complete:
        return stats
    weights = token_weights(sigs)
    mine = [s for s in sigs if cfg.holds(s.id)]
    for i, a in enumerate(mine, start=1):
        if not run.done(a.id):
            run.commit(a.id, _edges_from(a, sigs, weights, cfg, run.fingerprint), [])
        if progress is not None:
            progress(i, len(mine))
    edges = [e for a in mine for e in run.records(a.id)]
    nodes = [GraphNode(id=t.id, server=t.server, name=t.name, domain=t.domain) for t in tools]
    nodes = graph_nodes(nodes, edges)
    count_graph(stats, nodes, edges)
    return run.finish(stats, [s.id for s in mine], rejections=rejected, extra={NODES_FILE: nodes})


def _edges_from(
    a: Signature,
    sigs: Sequence[Signature],
    weights: Mapping[str, float],
    cfg: GraphConfig,
    run_id: str,
) -> list[ToolEdge]:
    out = []
    for b in sigs:
        if not cfg.across_domains and a.domain != b.domain:
            continue
        edge = propose_edge(a, b, weights, cfg.min_score)
        if edge is not None:
            rules = sorted({m.rule for m in edge.matches})
            edge.provenance = provenance(STAGE, run_id, [a.id, b.id], detail={"rules": rules})
            out.append(edge)
    return out


def graph_nodes(nodes: Iterable[GraphNode], edges: Iterable[ToolEdge]) -> list[GraphNode]:
    """``nodes`` with their degrees over ``edges`` (an edge with an end that is not one of
    them counts for neither end)."""
    out = [n.model_copy(update={"in_degree": 0, "out_degree": 0}) for n in nodes]
    by_id = {n.id: n for n in out}
    for e in edges:
        if e.source in by_id and e.target in by_id:
            by_id[e.source].out_degree += 1
            by_id[e.target].in_degree += 1
    return out


def count_graph(stats: GraphStats, nodes: Sequence[GraphNode], edges: Sequence[ToolEdge]) -> None:
    """A graph's counts: tools, edges, edges across servers, best rules, isolated tools."""
    stats.tools, stats.edges = len(nodes), len(edges)
    stats.cross_server = sum(not e.same_server for e in edges)
    stats.by_rule = tally((e.matches[0].rule if e.matches else "none" for e in edges), str)
    stats.isolated = [n.id for n in nodes if not n.in_degree and not n.out_degree]


def read_graph_dir(
    directory: Path, stage: str, nodes: dict[str, GraphNode], rejected: list[Rejection]
) -> tuple[dict[str, Any], list[tuple[str, ToolEdge]]]:
    """A graph directory (``synth graph`` or ``synth confirm`` output, checked complete) read
    for ``stage``: its nodes into ``nodes`` (the first of an id), its lines that are not
    records into ``rejected``; its stats and its edges, each with its file:line."""
    stats = read_stats(directory, STAGE)
    got, bad = read_records(directory / NODES_FILE, GraphNode, stage)
    rejected += bad
    for _, node in got:
        nodes.setdefault(node.id, node)
    edges, bad = read_records(directory / EDGES_FILE, ToolEdge, stage)
    rejected += bad
    return stats, [(f"{directory / EDGES_FILE}:{n}", e) for n, e in edges]


# ------------------------------------------------------------------ the teacher's confirmation


@dataclass(frozen=True)
class EdgeQuestion:
    """One proposed edge, with both tools, as a judge sees it."""

    edge: ToolEdge
    source: ToolRecord
    target: ToolRecord


@dataclass(frozen=True)
class Verdict:
    yes: bool
    reason: str = ""


class EdgeJudge(Protocol):
    """Decides a batch of proposed edges: one :class:`Verdict` per question, in order.

    Plain functions and async functions both qualify (``confirm_edges`` awaits what returns an
    awaitable and runs a plain function in a worker thread, off the event loop)."""

    def __call__(
        self, batch: Sequence[EdgeQuestion]
    ) -> Sequence[Verdict] | Awaitable[Sequence[Verdict]]: ...


@dataclass(frozen=True)
class Confirmation:
    confirmed: list[ToolEdge]  # ``confirmed=True``, with the judge's reason
    rejected: list[Rejection]  # ``judge_no`` (the judge's reason) or ``judge_failed``


async def confirm_edges(
    edges: Sequence[ToolEdge],
    tools: Mapping[str, ToolRecord],
    judge: EdgeJudge,
    *,
    batch_size: int = 8,
    concurrency: int = 4,
) -> Confirmation:
    """Ask ``judge`` about ``edges`` in batches (at most ``concurrency`` batches at once):
    ``Verdict(yes, reason)`` per edge, ``yes`` when a realistic task calls the source tool first
    and passes part of its result to the target's parameters named in the edge's matches (the
    teacher's judge: :mod:`training.synth.tools.confirm`).

    Failures are data: a batch whose judge raises, or returns a different number of
    verdicts, is rejected edge by edge as ``judge_failed`` (with the cause); the other batches
    go on. Edges naming a tool missing from ``tools`` are ``judge_failed`` too. The result
    keeps the order of ``edges``.
    """
    if batch_size < 1 or concurrency < 1:
        raise ConfigError("batch_size and concurrency must be at least 1")
    known = [e for e in edges if e.source in tools and e.target in tools]
    missing = [e for e in edges if e.source not in tools or e.target not in tools]
    batches = [known[i : i + batch_size] for i in range(0, len(known), batch_size)]
    gate = asyncio.Semaphore(concurrency)

    async def ask(batch: list[ToolEdge]) -> list[Verdict] | str:
        questions = [EdgeQuestion(e, tools[e.source], tools[e.target]) for e in batch]
        async with gate:
            try:
                call = type(judge).__call__ if not inspect.isfunction(judge) else judge
                if inspect.iscoroutinefunction(judge) or inspect.iscoroutinefunction(call):
                    got = judge(questions)
                else:
                    got = await asyncio.to_thread(judge, questions)
                if inspect.isawaitable(got):
                    got = await got
            except Exception as exc:
                return f"the judge raised {type(exc).__name__}: {exc}"
        verdicts = list(got)
        if len(verdicts) != len(batch) or not all(isinstance(v, Verdict) for v in verdicts):
            return f"the judge returned {len(verdicts)} verdict(s) for {len(batch)} edge(s)"
        return verdicts

    answers = await asyncio.gather(*(ask(b) for b in batches))
    decided: dict[str, ToolEdge | Rejection] = {}
    for batch, answer in zip(batches, answers, strict=True):
        for i, edge in enumerate(batch):
            if isinstance(answer, str):
                decided[edge.id] = _judge_rejection(edge, "judge_failed", answer)
            elif answer[i].yes:
                decided[edge.id] = edge.model_copy(
                    update={"confirmed": True, "judge_reason": answer[i].reason}
                )
            else:
                decided[edge.id] = _judge_rejection(edge, "judge_no", answer[i].reason)
    for edge in missing:
        decided[edge.id] = _judge_rejection(edge, "judge_failed", "a tool of it is not given")
    ordered = [decided[e.id] for e in edges]
    return Confirmation(
        confirmed=[d for d in ordered if isinstance(d, ToolEdge)],
        rejected=[d for d in ordered if isinstance(d, Rejection)],
    )


def _judge_rejection(edge: ToolEdge, reason: str, detail: str) -> Rejection:
    return Rejection(stage="confirm", source=edge.source, id=edge.id, reason=reason, detail=detail)
