"""The leaderboard's aggregate scores from per-category accuracies: the groups and the overall
of BFCL V4 (the pinned release's ``bfcl evaluate``) and of BFCL V3 (its last release's formula,
applied to the pinned data).

As the official evaluator computes them (accuracies in %):

- **V4.** Non-live = the mean of simple (itself the mean of Python, Java and JavaScript),
  multiple, parallel and parallel multiple; Live = the four live AST categories weighted by
  their entry counts; Irrelevance = the mean of non-live and live irrelevance; Multi-turn =
  the mean of its four categories; Agentic = the mean of web search (base, no snippet) and
  memory (key-value, vector, recursive summary). Overall = 10 % Non-live + 10 % Live + 10 %
  Irrelevance + 30 % Multi-turn + 40 % Agentic. Live relevance is shown, not counted.
- **V3.** Non-live = the mean of simple, multiple, parallel, parallel multiple and
  irrelevance; Live = all six live categories (relevance and irrelevance included) weighted
  by their entry counts; Multi-turn as in V4. Overall = the mean of the three.

A category that did not run counts 0 (with its full entry count where counts weigh), as the
official evaluator counts it; every figure it enters is labelled partial, with the categories
missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from eval.bfcl.categories import AGENTIC, LIVE, LIVE_AST, MULTI_TURN, NON_LIVE_AST, SIMPLE

V4_WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "agentic": 40}


@dataclass
class Score:
    """One aggregate: its value (%), the categories it is made of, those of them missing."""

    value: float
    parts: tuple[str, ...]
    missing: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return bool(self.missing)


class _Scores:
    def __init__(self, accuracy: dict[str, float], counts: dict[str, int], sizes: dict[str, int]):
        self.accuracy, self.counts, self.sizes = accuracy, counts, sizes

    def cat(self, c: str) -> Score:
        return Score(self.accuracy.get(c, 0.0), (c,), [] if c in self.accuracy else [c])

    def count(self, c: str) -> int:
        return self.counts[c] if c in self.accuracy else self.sizes.get(c, 0)

    def mean(self, parts: list[Score]) -> Score:
        return _join(sum(p.value for p in parts) / len(parts), parts)

    def weighted(self, cats: tuple[str, ...]) -> Score:
        parts = [self.cat(c) for c in cats]
        total = sum(self.count(c) for c in cats)
        value = sum(p.value * self.count(c) for p, c in zip(parts, cats, strict=True))
        return _join(value / total if total else 0.0, parts)


def _join(value: float, parts: list[Score]) -> Score:
    return Score(
        value,
        tuple(c for p in parts for c in p.parts),
        [c for p in parts for c in p.missing],
    )


def _simple(s: _Scores) -> Score:
    return s.mean([s.cat(c) for c in SIMPLE])


def _non_live_ast(s: _Scores) -> list[Score]:
    return [_simple(s), *(s.cat(c) for c in NON_LIVE_AST if c not in SIMPLE)]


def v4_groups(s: _Scores) -> dict[str, Score]:
    web = s.mean([s.cat(c) for c in AGENTIC if c.startswith("web_search")])
    memory = s.mean([s.cat(c) for c in AGENTIC if c.startswith("memory")])
    return {
        "non_live": s.mean(_non_live_ast(s)),
        "live": s.weighted(LIVE_AST),
        "irrelevance": s.mean([s.cat("irrelevance"), s.cat("live_irrelevance")]),
        "multi_turn": s.mean([s.cat(c) for c in MULTI_TURN]),
        "agentic": s.mean([web, memory]),
    }


def v3_groups(s: _Scores) -> dict[str, Score]:
    return {
        "non_live": s.mean([*_non_live_ast(s), s.cat("irrelevance")]),
        "live": s.weighted(LIVE),
        "multi_turn": s.mean([s.cat(c) for c in MULTI_TURN]),
    }


def _overall(groups: dict[str, Score], weight: Callable[[str], float]) -> Score:
    total = sum(weight(g) for g in groups)
    value = sum(weight(g) * score.value for g, score in groups.items()) / total
    return _join(value, list(groups.values()))


@dataclass
class Overall:
    """What a summary shows: the groups and overall of V4 and of V3."""

    v4_groups: dict[str, Score]
    v4: Score
    v3_groups: dict[str, Score]
    v3: Score


def overall(accuracy: dict[str, float], counts: dict[str, int], sizes: dict[str, int]) -> Overall:
    """``accuracy``/``counts``: per category run (multi-turn by its short name); ``sizes``:
    every category's entry count in the data (the weight of one that did not run)."""
    s = _Scores(accuracy, counts, sizes)
    v4g, v3g = v4_groups(s), v3_groups(s)
    return Overall(
        v4g,
        _overall(v4g, lambda g: V4_WEIGHTS[g]),
        v3g,
        _overall(v3g, lambda g: 1.0),
    )
