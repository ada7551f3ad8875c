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

from eval.bfcl.backend import Namespace, execute_calls, new_instances
from eval.bfcl.official import Entry


@dataclass
class TurnVerdict:
    valid: bool
    turn: int | None = None
    error_type: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _public_state(instance: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(instance).items() if not k.startswith("_")}


_MISSING = "<attribute missing>"


def _state_differences(model: Any, truth: Any) -> dict[str, Any]:
    """The ground truth's public attributes whose value differs in the model's instance (the
    official check looks at the ground truth's attributes only)."""
    mine = _public_state(model)
    return {
        k: {"model": _readable(mine.get(k, _MISSING)), "ground_truth": _readable(v)}
        for k, v in _public_state(truth).items()
        if k not in mine or mine[k] != v
    }


def _is_empty(steps: list[list[str]]) -> bool:
    """The official test for a turn without calls: no step, or one step without calls."""
    return not steps or (len(steps) == 1 and not steps[0])


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
    # Each side under its own instance names, as the official checker keeps them apart.
    model_ns = Namespace.of(model, f"astra_eval_{entry.id}")
    truth_ns = Namespace.of(truth, f"astra_ground_truth_eval_{entry.id}")
    all_results: list[str] = []
    for t, (steps, gt_calls) in enumerate(zip(model_turns, gt, strict=True)):
        for step in steps:
            all_results += execute_calls(model_ns, step)
        gt_results = execute_calls(truth_ns, gt_calls)
        if not gt_calls:
            continue
        if _is_empty(steps):
            return TurnVerdict(False, t, "multi_turn:empty_turn_model_response")
        for cls in entry.involved_classes:
            diff = _state_differences(model[cls], truth[cls])
            if diff:
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
