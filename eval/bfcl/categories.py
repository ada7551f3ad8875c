"""BFCL's categories as this harness names them, the groups the leaderboard forms of them, and
the categories that cannot run here (refused by name, with the reason and what would make
them run).

Multi-turn categories keep their short names (``base``, ``miss_func``, …: the official name is
``multi_turn_<name>``, accepted too); every other category has its official name.

    >>> resolve(["non_live", "base"])[:2]
    ['simple_python', 'simple_java']
"""

from __future__ import annotations

import hashlib

from astra_agent.errors import ConfigError

MULTI_TURN = ("base", "miss_func", "miss_param", "long_context")
SIMPLE = ("simple_python", "simple_java", "simple_javascript")
NON_LIVE_AST = (*SIMPLE, "multiple", "parallel", "parallel_multiple")
NON_LIVE = (*NON_LIVE_AST, "irrelevance")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
LIVE = (*LIVE_AST, "live_irrelevance", "live_relevance")
SINGLE_TURN = NON_LIVE + LIVE
MEMORY = ("memory_kv", "memory_rec_sum")  # the memory backends that need no download
RUNNABLE = SINGLE_TURN + MULTI_TURN + MEMORY
RELEVANCE = ("irrelevance", "live_irrelevance", "live_relevance")  # no gold: call or no call

REFUSED = {
    "memory_vector": (
        "needs a sentence-embedding model downloaded from the model hub, which this machine "
        "cannot reach; it would run where the official pipeline can download it"
    ),
    "web_search_base": (
        "needs a SerpAPI key and the network (live web search); it would run with "
        "SERPAPI_API_KEY set on a machine with internet access, through the official pipeline"
    ),
    "web_search_no_snippet": (
        "needs a SerpAPI key and the network (live web search); it would run with "
        "SERPAPI_API_KEY set on a machine with internet access, through the official pipeline"
    ),
    "format_sensitivity": (
        "non-scoring and prompt mode only (the model writes calls as text in the prompt's "
        "format); this harness runs function-calling mode"
    ),
}
AGENTIC = (
    "web_search_base",
    "web_search_no_snippet",
    "memory_kv",
    "memory_vector",
    "memory_rec_sum",
)
GROUPS = {
    "non_live": NON_LIVE,
    "live": LIVE,
    "single_turn": SINGLE_TURN,
    "multi_turn": MULTI_TURN,
    "agentic": AGENTIC,  # memory_kv and memory_rec_sum run; the others are missing
    "memory": ("memory_kv", "memory_vector", "memory_rec_sum"),
    "all": RUNNABLE,  # every category that runs here (the others are reported as missing)
}
ALIASES = {f"multi_turn_{c}": c for c in MULTI_TURN}


def official_name(category: str) -> str:
    """The category's name in the official data files and score files."""
    return f"multi_turn_{category}" if category in MULTI_TURN else category


def _refusal(name: str) -> ConfigError:
    return ConfigError(
        f"BFCL category {name!r} cannot run here: {REFUSED[name].format(name=name)}",
        hint="leave it out (--categories all runs every category that can)",
    )


def resolve(names: list[str]) -> list[str]:
    """Category and group names → the categories to run, in the leaderboard's order, each
    once. An unknown name lists the valid ones; a category that cannot run here is refused
    with its reason; a group that holds none that can (``agentic``) is refused too."""
    if not names:
        raise ConfigError(f"no category given: choose from {', '.join(valid_names())}")
    chosen: set[str] = set()
    for raw in names:
        name = ALIASES.get(raw, raw)
        if name in GROUPS:
            runnable = [c for c in GROUPS[name] if c in RUNNABLE]
            if not runnable:
                raise _refusal(GROUPS[name][0])
            chosen.update(runnable)
        elif name in RUNNABLE:
            chosen.add(name)
        elif name in REFUSED:
            raise _refusal(name)
        else:
            raise ConfigError(
                f"unknown BFCL category or group {raw!r}: choose from {', '.join(valid_names())}"
            )
    return [c for c in RUNNABLE if c in chosen]


def valid_names() -> list[str]:
    return [*GROUPS, *RUNNABLE]


HALVES = ("selection", "report")
_HALF_SALT = "astra-bfcl-half-v1"  # fixed: an entry never changes half


def half_of(entry_id: str) -> str:
    """The fixed half an entry belongs to: ``selection`` (recipes are chosen on it) or
    ``report`` (scored once per published table): by the first byte of
    ``sha256("astra-bfcl-half-v1:" + id)``, even → selection, odd → report."""
    digest = hashlib.sha256(f"{_HALF_SALT}:{entry_id}".encode()).digest()
    return HALVES[digest[0] % 2]
