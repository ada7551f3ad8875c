"""The records the environment stages read and write: a main question decomposed into a chain
of sub-questions, each answered by one step, some of them in parallel; and the answer check
made on them (:func:`contains_answer`: does a text contain an answer, up to case, spaces and
punctuation).

A :class:`Decomposition` is valid only when its sub-questions have unique ids and each
``depends_on`` names sub-questions listed *before* it (so there is no cycle: the list is a
topological order). :func:`structure_problem` says what is wrong with a list that is not (the
decomposition stage turns it into a rejection reason); :func:`topological_order` puts an
acyclic list in order; :func:`parallel_groups` gives the layers that can run at once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

ID_PATTERN = r"^[A-Za-z0-9_.\-]{1,32}$"
_PUNCT = re.compile(r"(?<!\d)\.|\.(?!\d)|[^\w.]|_")


def compact(text: str) -> str:
    """Text for "does it contain the answer" checks: case-folded, without spaces or
    punctuation (a decimal point between digits kept): "12.5 kg" and "12.5kg." compare equal."""
    return _PUNCT.sub("", text.casefold())


def contains_answer(text: str, answer: str) -> bool:
    """Does ``text`` (a final answer, a tool's output) contain ``answer``, up to case, spaces
    and punctuation?"""
    return bool(compact(answer)) and compact(answer) in compact(text)


class SubQuestion(BaseModel):
    """One step of the chain."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(pattern=ID_PATTERN)  # "q1", "q2", ...
    question: str = Field(min_length=1)
    answer: str = Field(min_length=1)  # the sub-answer: a short string the tool output contains
    depends_on: list[str] = Field(default_factory=list)  # ids whose answers this one needs
    needs_tool: bool | None = None  # set by the necessity stage
    necessity_reason: str | None = None


def structure_problem(subs: Sequence[SubQuestion]) -> tuple[str, str] | None:
    """What makes ``subs`` not a dependency DAG, as (reason code, detail), or None.

    Codes: ``duplicate_id``, ``unknown_dependency`` (a ``depends_on`` naming no sub-question),
    ``cycle`` (a sub-question depending on itself, directly or through others)."""
    seen: set[str] = set()
    for s in subs:
        if s.id in seen:
            return "duplicate_id", f"sub-question id {s.id!r} appears twice"
        seen.add(s.id)
    for s in subs:
        unknown = [d for d in s.depends_on if d not in seen]
        if unknown:
            return "unknown_dependency", f"{s.id} depends on unknown {', '.join(unknown)}"
    cycle = _find_cycle(subs)
    if cycle:
        return "cycle", "dependency cycle " + " → ".join(cycle)
    return None


def _find_cycle(subs: Sequence[SubQuestion]) -> list[str]:
    """One cycle (``[a, b, a]``) of the dependency graph, or ``[]``."""
    deps = {s.id: list(dict.fromkeys(s.depends_on)) for s in subs}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for root in deps:
        if state.get(root):
            continue
        path: list[str] = [root]
        stack = [iter(deps[root])]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(deps.get(nxt, ())))
    return []


def topological_order(subs: Sequence[SubQuestion]) -> list[SubQuestion]:
    """``subs`` (a DAG: :func:`structure_problem` is None) reordered so that every
    sub-question comes after those it depends on; otherwise the given order is kept."""
    done: set[str] = set()
    out: list[SubQuestion] = []
    left = list(subs)
    while left:
        ready = next(s for s in left if set(s.depends_on) <= done)
        out.append(ready)
        done.add(ready.id)
        left.remove(ready)
    return out


def layers(subs: Sequence[SubQuestion]) -> list[list[str]]:
    """Topological layers of a DAG: layer 0 depends on nothing, layer k on layers < k (at
    least one of them k-1). Within a layer, the list's order."""
    level: dict[str, int] = {}
    for s in topological_order(subs):
        level[s.id] = 1 + max((level[d] for d in s.depends_on), default=-1)
    groups: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for s in subs:
        groups[level[s.id]].append(s.id)
    return groups


def sinks(subs: Sequence[SubQuestion]) -> list[str]:
    """The sub-questions no other depends on (the chain's last steps)."""
    needed = {d for s in subs for d in s.depends_on}
    return [s.id for s in subs if s.id not in needed]


class Decomposition(BaseModel):
    """A main question, its final answer and the chain of sub-questions that answers it."""

    model_config = ConfigDict(extra="ignore")

    id: str  # stable id of the record
    domain: str
    question: str  # the main question
    answer: str  # its final answer
    subquestions: list[SubQuestion] = Field(min_length=1)
    scores: dict[str, float] = Field(default_factory=dict)  # verification scores
    provenance: dict[str, Any] = Field(default_factory=dict)  # a stage.Provenance's dump

    @model_validator(mode="after")
    def _structure(self) -> Decomposition:
        problem = structure_problem(self.subquestions)
        if problem is not None:
            raise ValueError(f"{problem[0]}: {problem[1]}")
        seen: set[str] = set()
        for s in self.subquestions:
            later = [d for d in s.depends_on if d not in seen]
            if later:
                raise ValueError(f"{s.id} depends on {', '.join(later)}, listed after it")
            seen.add(s.id)
        return self

    def sub(self, sid: str) -> SubQuestion:
        """The sub-question of id ``sid`` (KeyError if none)."""
        for s in self.subquestions:
            if s.id == sid:
                return s
        raise KeyError(sid)


def parallel_groups(d: Decomposition) -> list[list[str]]:
    """The sub-question ids of ``d`` in topological layers: each layer's sub-questions can be
    answered at once (in parallel), once the layers before it are answered."""
    return layers(d.subquestions)
