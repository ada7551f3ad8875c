"""The scripted teacher's rules for the tool-chain checks and the trajectory judge (tests).

``edge_confirm``: every proposed edge consumes; ``chain_vote``: every chain is sensible;
``back_translate``: a request is translated back by finding, in order of appearance, the first
clause of each offered tool's description (the clauses the scripted ``tasks`` rule writes its
questions from; of tools with the same clause, the first name in sorting order) — except where
the test's :class:`~training.testing.rules.ScriptedPlants` say otherwise.
``trajectory_judge``: ``call_success`` 5 when every call succeeded, 4 when each failed tool
later succeeded, else 2; ``call_conciseness`` 5 without repeated tools, else 4; the other
criteria 4.
"""

from __future__ import annotations

import re
from typing import Any

from training.synth.tools.judge import DIMENSIONS
from training.testing.rules import (
    CHAIN_LINE,
    REQUEST_LINE,
    ScriptedPlants,
    clause,
    json_line,
    rule,
)

EDGES_LINE = re.compile(r"^Edges \(JSON, numbered\): (.*)$", re.MULTILINE)
OFFERED_LINE = re.compile(r"^Tools offered \(JSON\): (.*)$", re.MULTILINE)
CALLS_LINE = re.compile(r"^Calls \(JSON, in order\): (.*)$", re.MULTILINE)


@rule("edge_confirm")
def confirm_reply(name: str, prompt_text: str, plants: ScriptedPlants) -> dict[str, Any]:
    edges = json_line(EDGES_LINE, prompt_text, "[]")
    verdicts = []
    for e in edges:
        ok = f"{e['source']}->{e['target']}" not in plants.refuse
        why = "its result supplies " if ok else "planted: it does not supply "
        verdicts.append({"edge": e["n"], "consumes": ok, "reason": why + ", ".join(e["params"])})
    if any(f"{e['source']}->{e['target']}" in plants.short for e in edges):
        verdicts = verdicts[:-1]
    return {"verdicts": verdicts}


@rule("chain_vote")
def vote_reply(name: str, prompt_text: str, plants: ScriptedPlants) -> dict[str, Any]:
    tools = json_line(CHAIN_LINE, prompt_text, "[]")
    if any(t["name"] in plants.garble for t in tools):
        return {"sensible": "perhaps", "reason": "planted"}
    out = [t["name"] for t in tools if t["name"] in plants.vote_no]
    if out:
        return {"sensible": False, "reason": f"planted: {out[0]} does not belong"}
    return {"sensible": True, "reason": "each step uses what the one before returns"}


@rule("back_translate")
def back_translate_reply(name: str, prompt_text: str, plants: ScriptedPlants) -> dict[str, Any]:
    question = json_line(REQUEST_LINE, prompt_text, '""')
    offered = json_line(OFFERED_LINE, prompt_text, "[]")
    for key, names in plants.predict.items():
        if key in question:
            return {"tools": list(names), "reason": "planted"}
    low = question.lower()
    found: dict[int, str] = {}
    for t in sorted(offered, key=lambda t: t["name"]):
        at = low.find(clause(str(t.get("description") or "")).lower())
        if at >= 0:
            found.setdefault(at, t["name"])
    return {"tools": [found[at] for at in sorted(found)], "reason": "found by rule"}


@rule("trajectory_judge")
def judge_reply(name: str, prompt_text: str, plants: ScriptedPlants) -> dict[str, Any]:
    calls = json_line(CALLS_LINE, prompt_text, "[]")
    failed = {c["name"] for c in calls if not c["ok"]}
    recovered = all(any(c["ok"] and c["name"] == n for c in calls) for n in failed)
    names = [c["name"] for c in calls]
    scores: dict[str, Any] = dict.fromkeys(DIMENSIONS, 4)
    scores["call_success"] = 5 if not failed else 4 if recovered else 2
    scores["call_conciseness"] = 5 if len(set(names)) == len(names) else 4
    return scores | {"reason": "scored by rule"}
