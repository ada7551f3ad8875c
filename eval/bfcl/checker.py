"""Scoring with the official multi-turn semantics, on our own execution (no ``eval``).

Per turn (after executing the model's calls, then the ground truth's on separate instances):
a turn whose ground truth is empty is not checked; an empty model turn where calls were due
fails (``multi_turn:empty_turn_model_response``); every public attribute of every instance must
equal the ground truth's (``multi_turn:instance_state_mismatch``); the ground truth's results
of the turn must be a sub-multiset of all the model's results so far
(``multi_turn:execution_response_mismatch``). A turn count that differs is
``multi_turn:force_terminated``. An entry passes only if every turn does.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from eval.bfcl.backend import execute_calls, method_table, new_instances
from eval.bfcl.official import Entry


@dataclass
class TurnVerdict:
    valid: bool
    turn: int | None = None
    error_type: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _public_state(instance: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(instance).items() if not k.startswith("_")}


def _readable(value: Any, limit: int = 2000) -> Any:
    """JSON as is where possible, else its repr (cut): a readable, storable diff."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "…"


def check_entry(entry: Entry, model_turns: list[list[list[str]]]) -> TurnVerdict:
    """``model_turns[turn][step]`` = decoded call strings of that step (official format)."""
    gt = entry.ground_truth
    if len(model_turns) != len(gt):
        return TurnVerdict(
            False,
            None,
            "multi_turn:force_terminated",
            {"model_turns": len(model_turns), "ground_truth_turns": len(gt)},
        )
    model, truth = new_instances(entry), new_instances(entry)
    model_table, truth_table = method_table(model), method_table(truth)
    all_results: list[str] = []
    for t, (steps, gt_calls) in enumerate(zip(model_turns, gt, strict=True)):
        for step in steps:
            all_results += execute_calls(model_table, step)
        gt_results = execute_calls(truth_table, gt_calls)
        if not gt_calls:
            continue
        if not steps or all(not s for s in steps):
            return TurnVerdict(False, t, "multi_turn:empty_turn_model_response")
        for cls in entry.involved_classes:
            a, b = _public_state(model[cls]), _public_state(truth[cls])
            if a != b:
                diff = {
                    k: {"model": _readable(a.get(k)), "ground_truth": _readable(b.get(k))}
                    for k in sorted(set(a) | set(b))
                    if a.get(k) != b.get(k)
                }
                return TurnVerdict(
                    False,
                    t,
                    "multi_turn:instance_state_mismatch",
                    {"class": cls, "differences": diff},
                )
        missing = Counter(gt_results) - Counter(all_results)
        if missing:
            return TurnVerdict(
                False,
                t,
                "multi_turn:execution_response_mismatch",
                {"missing_items": list(missing.elements())},
            )
    return TurnVerdict(True)
