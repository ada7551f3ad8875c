"""Tool-chain SFT data, its first stages: the tool pool, the tool graph, the chains."""

from training.synth.tools.chains import ChainOptions, ChainStats, ToolChain, sample_chains
from training.synth.tools.graph import (
    Confirmation,
    EdgeJudge,
    EdgeMatch,
    EdgeQuestion,
    GraphNode,
    GraphOptions,
    GraphStats,
    ToolEdge,
    Verdict,
    build_graph,
    confirm_edges,
    propose_edges,
)
from training.synth.tools.pool import PoolOptions, PoolStats, ToolRecord, build_pool

__all__ = [
    "ChainOptions",
    "ChainStats",
    "Confirmation",
    "EdgeJudge",
    "EdgeMatch",
    "EdgeQuestion",
    "GraphNode",
    "GraphOptions",
    "GraphStats",
    "PoolOptions",
    "PoolStats",
    "ToolChain",
    "ToolEdge",
    "ToolRecord",
    "Verdict",
    "build_graph",
    "build_pool",
    "confirm_edges",
    "propose_edges",
    "sample_chains",
]
