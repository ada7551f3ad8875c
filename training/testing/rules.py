"""The scripted teacher's rule book: a rule per prompt template, registered by name.

A rule takes the template's name, the prompt's text and the test's :class:`ScriptedPlants`, and
returns the good answer (a JSON object; :class:`~training.testing.teacher.ScriptedTeacher`
shapes it). The modules of this package register theirs with :func:`rule` when the package is
imported; nothing here is part of a stage, or of the stages' code version.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CHAIN_LINE = re.compile(r"^Tool chain \(JSON, in call order\): (.*)$", re.MULTILINE)
REQUEST_LINE = re.compile(r"^Request \(JSON string\): (.*)$", re.MULTILINE)


@dataclass(frozen=True)
class ScriptedPlants:
    """Where the rules of the teacher's checks depart from the rule book. ``refuse``: edges
    (``A->B``, pool ids) it says no to; ``short``: edges whose batch gets one verdict too few
    (every attempt); ``vote_no``: tool names, a chain holding one is voted out; ``garble``:
    tool names, the vote on a chain holding one is of the wrong type (every attempt);
    ``predict``: a back-translation answer (tool names) for a request containing the key."""

    refuse: frozenset[str] = frozenset()
    short: frozenset[str] = frozenset()
    vote_no: frozenset[str] = frozenset()
    garble: frozenset[str] = frozenset()
    predict: Mapping[str, Sequence[str]] = field(default_factory=dict)


Rule = Callable[[str, str, ScriptedPlants], dict[str, Any]]  # (template, prompt, plants) → answer
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Register the decorated function as the rule of the templates ``names``."""

    def register(fn: Rule) -> Rule:
        for name in names:
            if name in RULES:
                raise ValueError(f"two scripted rules for the template {name!r}")
            RULES[name] = fn
        return fn

    return register


def clause(description: str) -> str:
    """A tool description's first sentence, lower-cased at its start: what questions say."""
    first = re.split(r"(?<=[.!?])\s", description.strip(), maxsplit=1)[0].rstrip(".!? ")
    return (first[:1].lower() + first[1:]) if first else "work through the data"


def last_line(pattern: re.Pattern[str], text: str) -> str:
    """The last line the pattern matches: the template's own lines come after the tools'
    descriptions, which could hold anything."""
    found = pattern.findall(text)
    return str(found[-1]) if found else ""


def json_line(pattern: re.Pattern[str], text: str, default: str) -> Any:
    return json.loads(last_line(pattern, text) or default)
