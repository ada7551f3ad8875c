"""Tool-chain SFT data, its first stages: the tool pool, the tool graph, the chains."""

from training.synth.tools.chains import ChainConfig, ChainStats, ToolChain, sample_chains
from training.synth.tools.graph import (
    Confirmation,
    EdgeJudge,
    EdgeMatch,
    EdgeQuestion,
    GraphConfig,
    GraphNode,
    GraphStats,
    ToolEdge,
    Verdict,
    build_graph,
    confirm_edges,
    propose_edges,
)
from training.synth.tools.pool import PoolConfig, PoolStats, ToolRecord, build_pool

__all__ = [
    "ChainConfig",
    "ChainStats",
    "Confirmation",
    "EdgeJudge",
    "EdgeMatch",
    "EdgeQuestion",
    "GraphConfig",
    "GraphNode",
    "GraphStats",
    "PoolConfig",
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
