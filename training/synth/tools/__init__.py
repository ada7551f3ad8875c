"""Tool-grounded SFT data (pipeline A), every stage: the tool pool (1), the tool graph and its
confirmation (2, 2b), tool chains and their checks (3, 3b), tasks (4), interaction through the
one episode loop (5, with its environments) and trajectory judging (6). The commonly used
records and builders are re-exported here."""

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
