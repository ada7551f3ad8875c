"""A scripted teacher for the synthesis stages: deterministic answers to every prompt template.

:class:`ScriptedTeacher` is a script for :class:`~astra_agent.testing.ScriptedServer` (a fake
model over real HTTP): a function of the request body. It finds the template by the marker
line the templates emit first (``[astra-synth:tasks.v1]``), reads what it needs from the
prompt's machine-readable lines (``Tool chain (JSON, in call order): …``, ``Mode: …``,
``Request (JSON string): …``) and answers by rule:

``tasks``
    a question built from the tools' descriptions, worded differently per mode (never naming
    a tool), and a persona in persona mode;
``tasks_judge``
    tool-selection difficulty ``min(5, 2 + tools in the chain)``, 4 for the other scores.

The other templates' rules are registered by name (:mod:`training.testing.rules`), a
chat request that offers tools is answered by :func:`~training.testing.agent.scripted_agent`
(the teacher as the agent of an episode), and an unknown template with HTTP 400. For tests,
``checks`` plants answers of the chain checks' rules, and ``output`` switches every reply (or
a :class:`Plant`'s, for one chain and mode) to a tolerated shape (``fenced``, ``think``,
``prose``) or a malformed / hostile one (see :data:`OutputKind`) for the first ``times``
attempts of each question (a retry is a request with more than one user message); a plant can
also put its own question or scores in. ``delay_s`` slows every reply (kill tests).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from astra_agent.testing.scripted_server import Reply, ScriptedServer
from training.testing.agent import scripted_agent
from training.testing.rules import (
    CHAIN_LINE,
    REQUEST_LINE,
    RULES,
    ScriptedPlants,
    clause,
    json_line,
    last_line,
)

MARKER = re.compile(r"^\[astra-synth:(?P<name>[a-z0-9_]+)\.v(?P<version>[0-9]+)\]")
MODE_LINE = re.compile(r"^Mode: (\w+)$", re.MULTILINE)
MODES = ("diverse", "constrained", "persona")

# fenced / think / prose: usable (the parser tolerates them); the others are not.
OutputKind = Literal[
    "fenced",
    "think",
    "prose",
    "not_json",
    "truncated",
    "unclosed_think",
    "length",
    "empty",
    "huge",
    "deep",
    "nested",
    "wrong_types",
    "extra_keys",
]
PERSONAS = (
    "a logistics coordinator at a small shipping firm",
    "a graduate student preparing a conference trip",
    "a freelance accountant closing the quarter",
    "a nurse planning shifts for a busy ward",
    "a high-school teacher organising a field day",
    "a site reliability engineer on call this weekend",
)


@dataclass(frozen=True)
class Plant:
    """A special answer for the chain whose first tool is named ``tool`` (in ``mode``, or in
    every mode): its own ``question``, judge ``scores`` (merged over the rule's) or an
    ``output`` shape for the first ``times`` attempts (of ``template``'s questions only, when
    given: ``tasks`` or ``tasks_judge``)."""

    tool: str
    mode: str | None = None
    template: str | None = None
    question: str | None = None
    scores: dict[str, int] | None = None
    output: OutputKind | None = None
    times: int = 1_000_000


def _series(clauses: Sequence[str]) -> str:
    if len(clauses) == 1:
        return clauses[0]
    return ", then ".join(clauses[:-1]) + f", and finally {clauses[-1]}"


def scripted_question(tools: Sequence[dict[str, Any]], mode: str) -> tuple[str, str | None]:
    """The rule's question (and persona) for a chain of tools in ``mode``."""
    clauses = [clause(str(t.get("description") or "")) for t in tools] or ["help me out"]
    digest = hashlib.sha256("\n".join(clauses).encode()).digest()
    if mode == "constrained":
        first = clauses[0][:1].upper() + clauses[0][1:]
        return (
            f"Keep to at most three results from the last seven days. {first}, then "
            f"{clauses[-1]}, with exact figures.",
            None,
        )
    if mode == "persona":
        persona = PERSONAS[digest[0] % len(PERSONAS)]
        question = f"Speaking as {persona}: I need to {_series(clauses)}. How did it go?"
        return question, f"I am {persona}."
    return (f"Here is what I am after today: {_series(clauses)}. What do I end up with?", None)


def scripted_scores(tools: Sequence[dict[str, Any]]) -> dict[str, int]:
    return {
        "tool_selection_difficulty": min(5, 2 + len(tools)),
        "uniqueness": 4,
        "question_quality": 4,
        "realism": 4,
    }


def shaped(good: dict[str, Any], kind: OutputKind | None) -> tuple[str, str]:
    """``good`` (the right answer) as a reply of shape ``kind``: (content, finish reason)."""
    text = json.dumps(good, ensure_ascii=False)
    match kind:
        case None:
            return text, "stop"
        case "fenced":
            return f"```json\n{json.dumps(good, indent=2)}\n```", "stop"
        case "think":
            return f"<think>The tools come first; then the JSON.</think>\n\n{text}", "stop"
        case "prose":
            return f"Here is the JSON you asked for:\n{text}\nI hope this helps!", "stop"
        case "not_json":
            return "Sure! It would be something about the weather, I think.", "stop"
        case "truncated":
            return text[: len(text) // 2], "stop"
        case "unclosed_think":
            return "<think>First I should look at the tools, then", "stop"
        case "length":
            return text[: len(text) - 3], "length"
        case "empty":
            return "", "stop"
        case "huge":
            return json.dumps({**good, "padding": "x" * 300_000}), "stop"
        case "deep":  # past the JSON decoder's recursion limit
            return '{"question": ' + "[" * 20_000 + "]" * 20_000 + "}", "stop"
        case "nested":  # readable, but deeper than the teacher's max_depth
            return json.dumps({**good, "more": _nest(40)}), "stop"
        case "wrong_types":
            return json.dumps(
                {k: [v] if isinstance(v, str) else str(v) for k, v in good.items()}
            ), "stop"
        case "extra_keys":
            return json.dumps({**good, "confidence": "high"}), "stop"
    raise ValueError(f"unknown output kind {kind!r}")


def _nest(depth: int) -> Any:
    node: Any = 1
    for _ in range(depth):
        node = [node]
    return node


def _prompt(body: dict[str, Any]) -> tuple[str, int]:
    """The first user message's text and how many user messages there are (the attempt)."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    content = users[0].get("content") if users else ""
    return (content if isinstance(content, str) else ""), len(users)


@dataclass
class ScriptedTeacher:
    """The script (see the module). Call it with a request body; it returns a Reply."""

    output: OutputKind | None = None
    times: int = 1_000_000
    plants: Sequence[Plant] = field(default_factory=tuple)
    delay_s: float = 0.0
    checks: ScriptedPlants = field(default_factory=ScriptedPlants)

    def __call__(self, body: dict[str, Any]) -> Reply:
        text, attempt = _prompt(body)
        marker = MARKER.match(text)
        if marker is None and body.get("tools"):
            return scripted_agent(body)  # the teacher as the agent of an episode
        if marker is None or marker["name"] not in ("tasks", "tasks_judge", *RULES):
            return Reply(status=400, delay_s=self.delay_s)
        if marker["name"] in RULES:
            good = RULES[marker["name"]](marker["name"], text, self.checks)
            content, finish = shaped(good, self.output if attempt <= self.times else None)
            return Reply(content=content, finish_reason=finish, delay_s=self.delay_s)
        tools = json_line(CHAIN_LINE, text, "[]")
        if marker["name"] == "tasks":
            mode = last_line(MODE_LINE, text)
            good, plant = self._question(tools, mode)
        else:
            question = json_line(REQUEST_LINE, text, '""')
            good, plant = self._judge(tools, question)
        kind, times = None, 0
        if plant and plant.output and plant.template in (None, marker["name"]):
            kind, times = plant.output, plant.times
        if kind is None:
            kind, times = self.output, self.times
        content, finish = shaped(good, kind if attempt <= times else None)
        return Reply(content=content, finish_reason=finish, delay_s=self.delay_s)

    def _plant(self, tools: Sequence[dict[str, Any]], mode: str) -> Plant | None:
        first = tools[0].get("name") if tools else None
        return next((p for p in self.plants if p.tool == first and p.mode in (None, mode)), None)

    def _question(
        self, tools: list[dict[str, Any]], mode: str
    ) -> tuple[dict[str, Any], Plant | None]:
        plant = self._plant(tools, mode)
        question, persona = scripted_question(tools, mode)
        if plant and plant.question:
            question = plant.question
        good: dict[str, Any] = {"question": question}
        if mode == "persona":
            good = {"persona": persona or "I am a busy person.", **good}
        return good, plant

    def _judge(
        self, tools: list[dict[str, Any]], question: str
    ) -> tuple[dict[str, Any], Plant | None]:
        scores: dict[str, Any] = scripted_scores(tools)
        for mode in MODES:  # which mode wrote it: the rule's question, or a plant's
            plant = self._plant(tools, mode)
            if question in (scripted_question(tools, mode)[0], plant and plant.question):
                break
        else:
            plant = None
        if plant and plant.scores:
            scores |= plant.scores
        return {**scores, "reason": "scored by rule"}, plant


script = ScriptedTeacher()  # for `python -m astra_agent.testing.scripted_server --script`


def scripted_teacher_server(
    teacher: ScriptedTeacher | None = None, model: str = "scripted-teacher"
) -> ScriptedServer:
    """A ScriptedServer answering as ``teacher`` (``with`` starts and stops it)."""
    return ScriptedServer(teacher or ScriptedTeacher(), model=model)
