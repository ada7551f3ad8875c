"""Stage 3, tool chains: paths of 2–5 tools through the graph, sampled by weighted walks.

Each attempt starts from one of the least-covered tools that has an edge (ties broken by the
seeded generator), picks a length in ``[min_length, max_length]`` and grows the chain at
either end — forward along an edge out of its last tool, or backward along an edge into its
first — choosing among the extensions with weight ``edge score / (1 + times the new tool was
used)``, so that unused tools are preferred. A tool appears at most once in a chain, no chain
is repeated, and a chain shorter than ``min_length`` is dropped. Attempt ``k`` draws from
``Random(f"{seed}:{k}")`` and the coverage counts of the chains before it: the same seed gives
the same chains, also across ``--resume``.

When the attempts (``max_attempts``, default 20 × count) end short of ``count``, the chains not
yet taken are enumerated (up to :data:`ENUMERATION_CAP`) and the missing ones drawn from them:
a graph that holds fewer distinct chains than asked gives all it has (``stats.possible``).

Output (``OUT``): ``chains.jsonl`` (:class:`ToolChain` with its edges and their scores),
``rejections.jsonl`` (graph lines that are not JSON or not records, edges naming unknown tools,
duplicates), ``stats.json`` (length histogram, coverage: the tools in no chain, split into
those that have no edge at all and those the count left out).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from training.synth.inputs import StageInput, read_stage_output
from training.synth.runner import RunConfig
from training.synth.stage import (
    Progress,
    Provenance,
    Rejection,
    StageRun,
    StageStats,
    SynthError,
    open_run,
    provenance,
    tally,
)
from training.synth.tools.graph import (
    EDGES_FILE,
    NODES_FILE,
    GraphNode,
    ToolEdge,
    read_graph_dir,
)

T = TypeVar("T")
STAGE = "chains"
CHAINS_FILE = "chains.jsonl"
ENUMERATION_CAP = 100_000


class ToolChain(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str  # from the tools, stable across runs
    tools: list[str]
    edges: list[str]
    scores: list[float]
    score: float  # the product of the edge scores
    servers: list[str]
    domain: str = ""  # when every tool has the same
    provenance: Provenance | None = None


# the reply to the ``tasks`` template (check-chains asks it too, to back-translate)
class Question(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=10, max_length=2000)


class PersonaQuestion(Question):
    persona: str = Field(min_length=3, max_length=500)


class ChainConfig(RunConfig):
    """``astra-train synth chains``."""

    graph: list[Path] = Field(
        min_length=1, description="a `synth graph` --out (repeatable: the shards of a graph)"
    )
    count: int = Field(
        100, ge=1, description="distinct chains to sample (fewer if the graph holds fewer)"
    )
    seed: int = Field(0, description="random seed (same seed, same chains)")
    min_length: int = Field(2, ge=2, description="tools per chain, at least")
    max_length: int = Field(5, ge=2, le=16, description="tools per chain, at most")
    max_attempts: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _lengths(self) -> ChainConfig:
        if self.min_length > self.max_length:
            raise ValueError("min_length is larger than max_length")
        return self


class ChainStats(StageStats):
    requested: int = 0
    chains: int = 0
    attempts: int = 0
    from_enumeration: int = 0
    possible: int | None = None  # distinct chains in the graph, when it was enumerated
    lengths: dict[int, int] = Field(default_factory=dict)
    tools: int = 0
    covered: int = 0
    no_edge: list[str] = Field(default_factory=list)  # in no chain possible
    not_covered: list[str] = Field(default_factory=list)  # could be, are not

    def summary(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [("chains", f"{self.chains} of {self.requested} asked")]
        if self.possible is not None:
            rows.append(("  distinct chains possible", self.possible))
        rows += [(f"  of {n} tools", k) for n, k in self.lengths.items()]
        return [
            *rows,
            ("tools covered", f"{self.covered} of {self.tools}"),
            ("tools without any edge", len(self.no_edge)),
            ("tools left out by the count", len(self.not_covered)),
        ]


@dataclass
class Graph:
    """Nodes and edges as the sampler walks them (adjacency sorted: the walk is seeded)."""

    nodes: dict[str, GraphNode]
    edges: dict[tuple[str, str], ToolEdge]
    out: dict[str, list[str]] = field(default_factory=dict)
    into: dict[str, list[str]] = field(default_factory=dict)
    linked: list[str] = field(default_factory=list)  # tools with an edge: each is on a chain

    def __post_init__(self) -> None:
        for a, b in sorted(self.edges):
            self.out.setdefault(a, []).append(b)
            self.into.setdefault(b, []).append(a)
        self.linked = sorted(set(self.out) | set(self.into))


class Uses:
    """How many chains each tool is in, with the least-used tools at hand in O(1)."""

    def __init__(self, tools: Sequence[str]) -> None:
        self.count = dict.fromkeys(tools, 0)
        self._levels: dict[int, list[str]] = {0: list(tools)} if tools else {}
        self._pos = {t: i for i, t in enumerate(tools)}

    def get(self, tool: str) -> int:
        return self.count.get(tool, 0)

    def least(self) -> list[str]:
        return self._levels[min(self._levels)] if self._levels else []

    def add(self, tool: str) -> None:
        if tool not in self.count:
            return
        level = self.count[tool]
        bucket, i = self._levels[level], self._pos[tool]
        bucket[i] = bucket[-1]
        self._pos[bucket[i]] = i
        bucket.pop()
        if not bucket:
            del self._levels[level]
        self.count[tool] = level + 1
        up = self._levels.setdefault(level + 1, [])
        self._pos[tool] = len(up)
        up.append(tool)


def read_graphs(dirs: Sequence[Path]) -> tuple[Graph, list[Rejection]]:
    """The union of graph directories (the shards of one graph), with what was unusable."""
    nodes: dict[str, GraphNode] = {}
    edges: dict[tuple[str, str], ToolEdge] = {}
    rejected: list[Rejection] = []
    pending: list[tuple[str, ToolEdge]] = []
    for d in dirs:
        pending += read_graph_dir(d, STAGE, nodes, rejected)[1]
    for where, e in pending:
        key = (e.source, e.target)
        if e.source not in nodes or e.target not in nodes:
            why = "the edge names a tool that no nodes.jsonl lists"
            rejected.append(
                Rejection(stage=STAGE, source=where, id=e.id, reason="unknown_tool", detail=why)
            )
        elif key in edges:
            rejected.append(Rejection(stage=STAGE, source=where, id=e.id, reason="duplicate_edge"))
        elif e.confirmed is not False and e.score > 0 and e.source != e.target:
            edges[key] = e
    return Graph(nodes, edges), rejected


# ------------------------------------------------------------------ sampling


def _pick(rng: random.Random, options: list[tuple[float, T]]) -> T:
    total = sum(w for w, _ in options)
    x = rng.random() * total
    for w, item in options:
        x -= w
        if x < 0:
            return item
    return options[-1][1]


def walk(
    graph: Graph, rng: random.Random, uses: Uses, min_len: int, max_len: int
) -> list[str] | None:
    """One chain grown around a least-used tool, or None (it could not reach ``min_len``)."""
    least = uses.least()
    if not least:
        return None
    chain = [least[rng.randrange(len(least))]]
    length = rng.randint(min_len, max_len)
    while len(chain) < length:
        head, tail = chain[0], chain[-1]
        options: list[tuple[float, tuple[bool, str]]] = []
        for b in graph.out.get(tail, []):
            if b not in chain:
                options.append((graph.edges[(tail, b)].score / (1 + uses.get(b)), (True, b)))
        for a in graph.into.get(head, []):
            if a not in chain:
                options.append((graph.edges[(a, head)].score / (1 + uses.get(a)), (False, a)))
        if not options:
            break
        forward, tool = _pick(rng, options)
        chain = [*chain, tool] if forward else [tool, *chain]
    return chain if len(chain) >= min_len else None


def enumerate_chains(
    graph: Graph, min_len: int, max_len: int, skip: set[tuple[str, ...]], limit: int
) -> tuple[list[tuple[str, ...]], bool]:
    """Simple paths of ``min_len``–``max_len`` tools not in ``skip``, in a fixed order, at most
    ``limit``; and whether that is all of them."""
    found: list[tuple[str, ...]] = []

    def grow(path: list[str]) -> bool:
        if len(path) >= min_len and tuple(path) not in skip:
            found.append(tuple(path))
            if len(found) >= limit:
                return False
        if len(path) < max_len:
            for b in graph.out.get(path[-1], []):
                if b not in path and not grow([*path, b]):
                    return False
        return True

    complete = all(grow([a]) for a in sorted(graph.out))
    return found, complete


def make_chain(
    graph: Graph, tools: Sequence[str], run_id: str, detail: dict[str, Any]
) -> ToolChain:
    edges = [graph.edges[pair] for pair in pairwise(tools)]
    scores = [e.score for e in edges]
    domains = {graph.nodes[t].domain for t in tools}
    digest = hashlib.sha1("\n".join(tools).encode()).hexdigest()[:12]
    return ToolChain(
        id=f"chain-{digest}",
        tools=list(tools),
        edges=[e.id for e in edges],
        scores=scores,
        score=round(math.prod(scores), 4),
        servers=list(dict.fromkeys(graph.nodes[t].server for t in tools)),
        domain=domains.pop() if len(domains) == 1 else "",
        provenance=provenance(
            STAGE, run_id, [e.id for e in edges], detail={**detail, "scores": scores}
        ),
    )


# ------------------------------------------------------------------ the stage


def sample_chains(cfg: ChainConfig, progress: Progress | None = None) -> ChainStats:
    """Sample ``cfg.count`` distinct chains from the graph directories into ``cfg.out``."""
    graph, rejected = read_graphs(cfg.graph)
    if not graph.edges:
        raise SynthError(
            f"the graph has no edge ({len(graph.nodes)} tools): no chain can be made",
            hint="lower `synth graph --min-score`, or add tools of the same domain",
        )
    run, stats = open_run(
        cfg.out, STAGE, output=CHAINS_FILE, record_type=ToolChain, stats=ChainStats,
        inputs=[d / name for d in cfg.graph for name in (NODES_FILE, EDGES_FILE)],
        params=cfg.params(), overwrite=cfg.overwrite, resume=cfg.resume,
        requested=cfg.count,
    )  # fmt: skip
    if run.complete:
        return stats
    sampler = _Sampler(graph, cfg, run, stats, progress)
    sampler.walks()
    if len(sampler.order) < cfg.count:
        sampler.fill()
    _coverage(stats, graph, sampler.taken)
    return run.finish(stats, sampler.order, rejections=rejected)


class _Sampler:
    def __init__(
        self,
        graph: Graph,
        options: ChainConfig,
        run: StageRun[ToolChain],
        stats: ChainStats,
        progress: Progress | None,
    ) -> None:
        self.graph, self.options, self.run = graph, options, run
        self.stats, self.progress = stats, progress
        self.order: list[str] = []  # units, in sampling order
        self.taken: list[tuple[str, ...]] = []
        self.seen: set[tuple[str, ...]] = set()
        self.uses = Uses(graph.linked)
        # resume: the units of an interrupted run, in the order they were made
        self.resumed = sorted(run.units)

    def _take(self, unit: str, tools: Sequence[str], detail: dict[str, Any]) -> None:
        if not self.run.done(unit):
            self.run.commit(unit, [make_chain(self.graph, tools, self.run.fingerprint, detail)], [])
        self.order.append(unit)
        self.taken.append(tuple(tools))
        self.seen.add(tuple(tools))
        for t in tools:
            self.uses.add(t)
        if self.progress is not None:
            self.progress(len(self.order), self.options.count)

    def _replay(self, prefix: str) -> int:
        """Take the resumed units of one phase again (state as it was); the next index."""
        nxt = 0
        for unit in (u for u in self.resumed if u.startswith(prefix)):
            chain = self.run.records(unit)[0]
            self._take(unit, chain.tools, {})
            nxt = int(unit.removeprefix(prefix)) + 1
        return nxt

    def walks(self) -> None:
        """Walk until ``count`` chains, the attempt budget, or a run of failed attempts long
        enough to say the walks are mostly finding chains already taken."""
        o = self.options
        budget = o.max_attempts or 20 * o.count
        patience = max(100, 2 * len(self.graph.linked))
        attempt, misses = self._replay("walk-"), 0
        while len(self.order) < o.count and attempt < budget and misses < patience:
            rng = random.Random(f"{o.seed}:{attempt}")
            chain = walk(self.graph, rng, self.uses, o.min_length, o.max_length)
            if chain is not None and tuple(chain) not in self.seen:
                detail = {"seed": o.seed, "attempt": attempt, "method": "walk"}
                self._take(f"walk-{attempt:09d}", chain, detail)
                misses = 0
            else:
                misses += 1
            attempt += 1
        self.stats.attempts = attempt

    def fill(self) -> None:
        o = self.options
        walked = set(self.seen)
        rest, complete = enumerate_chains(
            self.graph, o.min_length, o.max_length, walked, ENUMERATION_CAP
        )
        if complete:
            self.stats.possible = len(walked) + len(rest)
        random.Random(f"{o.seed}:fill").shuffle(rest)
        start = self._replay("fill-")
        for k in range(start, min(len(rest), o.count - len(walked))):
            self._take(
                f"fill-{k:09d}", rest[k], {"seed": o.seed, "index": k, "method": "enumeration"}
            )
        self.stats.from_enumeration = len(self.order) - len(walked)


def _coverage(stats: ChainStats, graph: Graph, chains: Sequence[tuple[str, ...]]) -> None:
    used = {t for c in chains for t in c}
    linked = set(graph.linked)
    stats.chains = len(chains)
    stats.lengths = tally((len(c) for c in chains), int)
    stats.tools = len(graph.nodes)
    stats.covered = len(used)
    stats.no_edge = sorted(set(graph.nodes) - linked)
    stats.not_covered = sorted(linked - used)


def read_chains(paths: Sequence[Path], stage: str) -> StageInput[ToolChain]:
    """Chains of ``synth chains`` directories (checked complete) or JSONL files, each id once
    (a repeated one is rejected as ``duplicate_chain``); and the files read."""
    return read_stage_output(
        paths, ToolChain, stage=stage, producer=STAGE, file=CHAINS_FILE, duplicate="duplicate_chain"
    )
